"""notebooks/custom_advantage.ipynb: its estimator cell on its own, and the whole notebook executed."""

import json
import os

import jax
import jax.numpy as jnp
import nbformat
import numpy as np
import pytest
from nbclient import NotebookClient

from tree_rl.checkpointing import Checkpointer
from tree_rl.learner import advantages
from tree_rl.metrics import read_jsonl

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NOTEBOOK = os.path.join(ROOT, "notebooks", "custom_advantage.ipynb")
NUM_STEPS = 2
# The notebook's example (prompts 7, 7, 7, 3, 3, 3; trees 0, 0, 1, 0, 1, 1; last slot padding),
# worked out by hand: slot 0 = (1 - 0.5) + (1 - 0), slot 1 = (0 - 1) + (0 - 1), slot 2 = 1 - 0.5
# (alone in its tree), slot 3 = 0 - 1, slot 4 = 1 - 0, padding 0.
HAND = [1.5, -2.0, 0.5, -1.0, 1.0, 0.0]


def _notebook():
  return nbformat.read(NOTEBOOK, as_version=4)


def _estimator(monkeypatch):
  """The function defined by the notebook's `estimator` cell (not added to the registry here)."""
  cells = [c for c in _notebook().cells if "estimator" in c.metadata.get("tags", [])]
  assert len(cells) == 1
  monkeypatch.setattr(advantages, "register", lambda name, **kw: (lambda fn: fn))
  namespace = {}
  exec(compile(cells[0].source, "estimator_cell", "exec"), namespace)
  return namespace["tree_loo"]


def _loo_reference(rewards, prompts, trees, valid):
  """Independent reference: for each valid slot, the mean of the other valid slots of its prompt
  and of its tree (prompt and tree both equal), each subtracted when such slots exist."""
  n = len(rewards)
  out = np.zeros(n)
  for i in range(n):
    if not valid[i]:
      continue
    for same in (prompts == prompts[i], (prompts == prompts[i]) & (trees == trees[i])):
      mask = same & valid & (np.arange(n) != i)
      if mask.any():
        out[i] += rewards[i] - rewards[mask].mean()
  return out


def test_estimator_cell_hand_values(monkeypatch):
  fn = jax.jit(_estimator(monkeypatch))
  got = fn(jnp.array([1.0, 0.0, 1.0, 0.0, 1.0, 0.5]), jnp.array([7, 7, 7, 3, 3, 3]),
           jnp.array([0, 0, 1, 0, 1, 1]), jnp.array([True] * 5 + [False]))
  np.testing.assert_allclose(np.asarray(got), HAND, atol=1e-6)


def test_estimator_cell_random_groups(monkeypatch):
  fn = jax.jit(_estimator(monkeypatch))
  rng = np.random.default_rng(0)
  for _ in range(5):
    n = 24
    rewards = rng.random(n).astype(np.float32)
    prompts = rng.integers(100, 104, n)
    trees = rng.integers(0, 3, n)
    valid = rng.random(n) > 0.2
    got = fn(jnp.asarray(rewards), jnp.asarray(prompts), jnp.asarray(trees), jnp.asarray(valid))
    np.testing.assert_allclose(np.asarray(got), _loo_reference(rewards, prompts, trees, valid),
                               atol=1e-5)


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
  """The notebook run end to end from the repository root on a temp TFDS dir and output dir."""
  out_dir = str(tmp_path_factory.mktemp("notebook_out"))
  env = dict(os.environ, TREE_RL_DATA_DIR=str(tmp_path_factory.mktemp("tfds")),
             TREE_RL_OUT_DIR=out_dir, TREE_RL_NUM_STEPS=str(NUM_STEPS), JAX_PLATFORMS="cpu")
  env.pop("XLA_FLAGS", None)  # one host device, as a plain notebook kernel has
  nb = _notebook()
  # The kernelspec's "python" resolves to this interpreter (sys.executable) in jupyter_client.
  client = NotebookClient(nb, kernel_name="python3", timeout=1200,
                          resources={"metadata": {"path": ROOT}})
  client.execute(env=env)
  return nb, out_dir


def _stream_text(nb) -> str:
  return "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                 for o in c.get("outputs", []) if o.output_type == "stream")


def _printed_list(text: str, label: str) -> list:
  lines = [l for l in text.splitlines() if l.startswith(label + ":")]
  assert len(lines) == 1, (label, text)
  return json.loads(lines[0][len(label) + 1:])


def test_notebook_example_matches_hand_values(executed):
  text = _stream_text(executed[0])
  np.testing.assert_allclose(_printed_list(text, "example tree_loo"), HAND, atol=1e-6)
  np.testing.assert_allclose(_printed_list(text, "example numpy"), HAND, atol=1e-6)


def test_notebook_trains_both_estimators(executed):
  _, out_dir = executed
  for name in ("tree_loo", "tree_grpo"):
    workdir = os.path.join(out_dir, name)
    rows = [r for r in read_jsonl(os.path.join(workdir, "metrics.jsonl")) if "learner/loss" in r]
    assert [r["step"] for r in rows] == list(range(1, NUM_STEPS + 1))
    for r in rows:
      assert r["rollout/trajectories"] > 0 and r["learner/skipped"] == 0
      assert np.isfinite(r["learner/loss"]) and 0.0 <= r["rollout/success_rate"] <= 1.0
    ckpt = Checkpointer(os.path.join(workdir, "checkpoints"))
    config = json.loads(ckpt.read(NUM_STEPS)[1]["config"])
    ckpt.close()
    assert config["learner"]["advantage"] == name
    assert config["rollout"]["method"] == "tree_grpo"


def test_notebook_plots_both_runs(executed):
  nb, out_dir = executed
  path = os.path.join(out_dir, "tree_loo_vs_tree_grpo.png")
  with open(path, "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  images = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
            if o.output_type == "display_data" and "image/png" in o.get("data", {})]
  assert len(images) == 1
