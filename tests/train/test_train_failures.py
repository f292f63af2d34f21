"""The RL loop's failure handling: exact resume after SIGKILL, NaN updates, impossible configs,
deterministic evaluation."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import frozenlake
from tree_rl.checkpointing import Checkpointer
from tree_rl.learner import advantages
from tree_rl.metrics import read_jsonl
from tree_rl.train import build_parts, train_and_evaluate
from tree_rl.validation import ConfigError

from loop_helpers import ROOT, checkpoint_params, max_abs_diff, smoke


def test_nan_update_is_skipped_reported_and_never_saved(tmp_path, data_dir, capsys):
  @advantages.register("nan_for_test")
  def nan_for_test(rewards, prompt_ids, tree_ids, valid, *, eps=1e-6):
    return jnp.full(rewards.shape, jnp.nan)

  config = smoke(frozenlake, "chain", data_dir, **{"learner.advantage": "nan_for_test",
                                                    "train.num_steps": 1, "train.eval_every": 1})
  summary = train_and_evaluate(config, str(tmp_path))
  assert "update(s) skipped" in capsys.readouterr().out
  rows = read_jsonl(os.path.join(str(tmp_path), "metrics.jsonl"))
  assert rows[-1]["learner/skipped"] == 1
  before, after = checkpoint_params(str(tmp_path), 0), checkpoint_params(str(tmp_path), 1)
  for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert np.all(np.isfinite(np.asarray(b)))
  # Same weights, same evaluation key: evaluation is deterministic.
  assert summary["eval_after"] == summary["eval_before"]


def test_impossible_configs_fail_fast(tmp_path, data_dir):
  c = smoke(frozenlake, "patr", data_dir, **{"rollout.budget": 5})
  with pytest.raises(ConfigError, match=r"rollout.budget.*max_turns.*max_tokens_per_turn"):
    build_parts(c)
  c = smoke(frozenlake, "patr", data_dir, **{"sampler.num_pages": 16})
  with pytest.raises(ConfigError, match=r"sampler.num_pages=16 is too small.*prompts_per_step"):
    build_parts(c)
  c = smoke(frozenlake, "patr", data_dir, **{"learner.advantage": "no_such"})
  with pytest.raises(ConfigError, match=r"no_such.*tree_grpo"):
    build_parts(c)
  c = smoke(frozenlake, "patr", data_dir, **{"train.minibatches": 3})
  with pytest.raises(ConfigError, match="train.minibatches"):
    build_parts(c)
  c = smoke(frozenlake, "patr", data_dir, **{"rollout.method": "beam"})
  with pytest.raises(ConfigError, match="beam"):
    build_parts(c)
  c = smoke(frozenlake, "patr", data_dir, **{"learner.row_tokens": 256})
  with pytest.raises(ConfigError, match=r"learner.row_tokens=256 is shorter than the longest "
                                        r"trajectory this rollout can make \(443 tokens"):
    build_parts(c)
  c = smoke(frozenlake, "patr", data_dir, **{"learner.microbatches": 2})
  with pytest.raises(ConfigError, match=r"learner.microbatches=2 and learner.row_tokens=512"):
    build_parts(c)
  assert not os.listdir(str(tmp_path))  # nothing was written


def _cli(workdir, data_dir, steps):
  # The smoke policy wins no episode (zero advantages): the entropy bonus gives every update a
  # non-zero gradient that depends on the sampled tokens, so the weights, the AdamW moments and
  # the rollout keys all have to be restored exactly.
  return [sys.executable, "-m", "experiments.train", "--config=configs/frozenlake.py:algo=tree_grpo,smoke",
          f"--workdir={workdir}", f"--config.env.data_dir={data_dir}",
          f"--config.train.num_steps={steps}", "--config.train.eval_every=100",
          "--config.learner.entropy_coef=0.01"]


def test_sigkill_then_resume_equals_uninterrupted(tmp_path, data_dir):
  env = dict(os.environ, XLA_FLAGS="", PYTHONPATH=ROOT)
  straight, killed = str(tmp_path / "straight"), str(tmp_path / "killed")
  first = subprocess.run(_cli(straight, data_dir, 3), cwd=ROOT, env=env, check=True,
                         capture_output=True, text=True, timeout=900)
  # A quiet console: the start-up block, no library INFO lines, no TFDS download banner.
  out = first.stdout + first.stderr
  assert "devices   1 x cpu" in first.stdout and "(fresh start)" in first.stdout, first.stdout
  assert not re.search(r"^I\d{4} ", out, re.M) and "Downloading and preparing" not in out, out[:3000]
  # One metric name in JSONL and TensorBoard: only letters, digits and _ . / -; tool calls only
  # where the env has tools (FrozenLake has none).
  keys = {k for r in read_jsonl(os.path.join(straight, "metrics.jsonl")) for k in r}
  assert "eval/pass_at_2" in keys and all(re.fullmatch(r"[\w./-]+", k) for k in keys), keys
  assert not any(k.endswith("_tool_calls") for k in keys)
  proc = subprocess.Popen(_cli(killed, data_dir, 3), cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
  step1 = os.path.join(killed, "checkpoints", "1")
  deadline = time.time() + 900
  while not os.path.exists(step1) and proc.poll() is None and time.time() < deadline:
    time.sleep(0.2)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  steps = Checkpointer(os.path.join(killed, "checkpoints")).all_steps()
  assert 1 in steps and 3 not in steps, steps
  resumed = subprocess.run(_cli(killed, data_dir, 3), cwd=ROOT, env=env, check=True,
                           capture_output=True, text=True, timeout=900)
  assert "resumed from step 1 of" in resumed.stdout
  a, b = checkpoint_params(straight, 3), checkpoint_params(killed, 3)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  # step 3 changed the weights: the equality above is not vacuous
  assert max_abs_diff(a, checkpoint_params(straight, 2)) > 0
  with open(os.path.join(killed, "summary.json")) as f, open(os.path.join(straight, "summary.json")) as g:
    assert json.load(f)["eval_after"] == json.load(g)["eval_after"]


def test_a_fresh_start_after_a_failed_first_save_logs_step_0_once(tmp_path, data_dir, monkeypatch):
  config = smoke(frozenlake, "chain", data_dir, **{"train.num_steps": 1, "train.eval_every": 1})
  real_save = Checkpointer.save

  def killed_save(self, step, *args, **kwargs):   # the process dies inside its first save
    raise KeyboardInterrupt("killed during the first save")

  monkeypatch.setattr(Checkpointer, "save", killed_save)
  with pytest.raises(KeyboardInterrupt):
    train_and_evaluate(config, str(tmp_path))
  assert [r["step"] for r in read_jsonl(os.path.join(str(tmp_path), "metrics.jsonl"))] == [0]
  monkeypatch.setattr(Checkpointer, "save", real_save)
  train_and_evaluate(config, str(tmp_path))      # no checkpoint: the run starts afresh
  assert [r["step"] for r in read_jsonl(os.path.join(str(tmp_path), "metrics.jsonl"))] == [0, 1]
