"""Evaluating a saved policy: the same checkpoint and seed give the same numbers twice, and they
equal the eval rows the training loop logged for those steps."""

import os

import pytest

from configs import frozenlake
from tree_rl.metrics import read_jsonl
from tree_rl.train import evaluate_checkpoint, train_and_evaluate

from loop_helpers import smoke


def test_eval_of_a_checkpoint_is_reproducible_and_matches_the_log(tmp_path, data_dir):
  workdir = str(tmp_path)
  config = smoke(frozenlake, "chain", data_dir, **{"train.eval_prompts": 8})
  train_and_evaluate(config, workdir)
  logged = {r["step"]: r for r in read_jsonl(os.path.join(workdir, "metrics.jsonl"))
            if "eval/greedy_success" in r}
  assert sorted(logged) == [0, 2]
  for step in (0, 2):
    first, second = (evaluate_checkpoint(config, workdir, step) for _ in range(2))
    assert first == second
    assert first["step"] == step
    assert {k: v for k, v in first.items() if k.startswith("eval/")} == \
        {k: v for k, v in logged[step].items() if k.startswith("eval/")}
  assert evaluate_checkpoint(config, workdir)["step"] == 2   # the latest by default
  with pytest.raises(FileNotFoundError, match="no checkpoint step 7 .*saved steps: \\[0, 1, 2\\]"):
    evaluate_checkpoint(config, workdir, 7)
