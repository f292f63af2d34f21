"""The shipped warm-start policy of the main job: it is in the package, its weights match its
digest, it is refused (one line) when changed or used with another tokenizer or setting, and
its held-out greedy success is the README's."""

import os
import shutil

import jax
import numpy as np
import pytest
from flax import nnx

import configs.frozenlake
from tree_rl import tasks
from tree_rl.evaluation import Evaluator
from tree_rl.models import build_model, build_tokenizer
from tree_rl.rollout import capacity
from tree_rl.train import eval_key, model_with
from tree_rl.validation import ConfigError, validate
from tree_rl.warmstart import shipped

NAME = "frozenlake_tiny"

def _config():
  return configs.frozenlake.get_config()


def test_the_main_job_starts_from_the_shipped_policy_and_its_file_is_in_the_package():
  c = _config()
  assert c.warmstart.policy == NAME and not c.warmstart.from_scratch
  assert NAME in shipped.known()
  weights = os.path.join(shipped.policy_dir(NAME), shipped.WEIGHTS)
  manifest = shipped.read_manifest(NAME)
  # the file's own bytes against the recorded digest (a git-lfs pointer or a truncated copy fails)
  assert shipped.sha256_file(weights) == manifest["sha256"]
  assert 1_000_000 < os.path.getsize(weights) < 4_000_000
  # smoke and testbed runs keep their own SFT
  assert configs.frozenlake.get_config("smoke").warmstart.policy == ""
  assert configs.frozenlake.get_config("testbed").warmstart.policy == ""


def _copy(tmp_path, monkeypatch):
  root = tmp_path / "policies"
  shutil.copytree(shipped.policy_dir(NAME), root / NAME)
  monkeypatch.setattr(shipped, "POLICIES", str(root))
  return root / NAME


def test_a_changed_weights_file_is_refused_in_one_line(tmp_path, monkeypatch):
  c = _config()
  tok = build_tokenizer(c.tokenizer, c.model.hf_path)
  model, _ = build_model(c.model, tok)
  directory = _copy(tmp_path, monkeypatch)
  data = bytearray((directory / shipped.WEIGHTS).read_bytes())
  data[-5] ^= 0x01   # one bit of one weight
  (directory / shipped.WEIGHTS).write_bytes(bytes(data))
  with pytest.raises(shipped.ShippedPolicyError, match="has sha256 .* its manifest says") as e:
    shipped.load(NAME, c, tok, model)
  assert "\n" not in str(e.value) and "make_warmstart" in str(e.value)


def test_another_tokenizer_or_setting_is_refused(tmp_path, monkeypatch):
  c = _config()
  tok = build_tokenizer(c.tokenizer, c.model.hf_path)
  model, _ = build_model(c.model, tok)

  class Other:
    def fingerprint(self):
      return "0123456789abcdef"

  with pytest.raises(shipped.ShippedPolicyError, match="trained with tokenizer"):
    shipped.load(NAME, c, Other(), model)
  c.env.local_view = True
  with pytest.raises(shipped.ShippedPolicyError, match=r"config.env.local_view=True \(policy: False\)"):
    shipped.load(NAME, c, tok, model)
  # refused before any compute too, unless the SFT is asked for
  with pytest.raises(ConfigError, match=r"made for another setting: config.env.local_view=True"):
    validate(c)
  c.warmstart.from_scratch = True
  validate(c)
  c.warmstart.from_scratch = False
  c.env.local_view = False
  c.warmstart.policy = "nope"
  with pytest.raises(shipped.ShippedPolicyError, match="no shipped policy of that name"):
    shipped.load("nope", c, tok, model)


def _readme_before_greedy() -> float:
  """The main job's greedy success before RL as the README's table states it."""
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  with open(os.path.join(root, "README.md")) as f:
    main_job = f.read().split("\n## The main job\n", 1)[-1]
  lines = [line for line in main_job.splitlines() if line.startswith("eval/greedy_success ")]
  assert lines, "the README's main-job table has no eval/greedy_success row"
  return float(lines[0].split()[1])


def test_the_shipped_policy_loads_and_its_heldout_greedy_success_is_the_documented_one():
  c = _config()
  tok = build_tokenizer(c.tokenizer, c.model.hf_path)
  model, _ = build_model(c.model, tok)
  params, manifest = shipped.load(NAME, c, tok, model)
  init = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  assert jax.tree.structure(params) == jax.tree.structure(init)
  assert not np.array_equal(np.asarray(params["embed"]),
                            np.asarray(init["embed"]))   # not the random init
  task_set = tasks.build(c, tok)
  try:
    evaluator = Evaluator(c, task_set.test_env, task_set.test_states, tok)
    policy = model_with(model, params)
    cache = capacity.config_cache(c.sampler, policy, evaluator.rollouts(), mesh=None)
    metrics, _ = evaluator(cache, eval_key(c))
  finally:
    task_set.close()
  assert evaluator.num_prompts == 100
  assert metrics["eval/greedy_success"] == pytest.approx(_readme_before_greedy(), abs=1e-9)
  assert metrics["eval/greedy_success"] == pytest.approx(manifest["heldout"]["eval/greedy_success"])
