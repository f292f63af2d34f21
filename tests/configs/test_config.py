"""Config files, `key=value` arguments, command-line overrides and their errors."""

import json
import subprocess
import sys

import pytest

from configs import frozenlake
from configs.common import ALGOS
from experiments.sweeps import build as sweep_build
from experiments.sweeps.core import Run
from tree_rl.config import parse_arg

SECTIONS = {"model", "tokenizer", "env", "sampler", "rollout", "learner", "mesh", "checkpoint", "logging"}


def test_sections_and_arguments():
  c = frozenlake.get_config("algo=tree_grpo,model=small,smoke")
  assert SECTIONS <= set(c.keys())
  assert c.rollout.method == "tree_grpo" and c.model.preset == "small"
  assert c.rollout.prompts_per_step == 2  # the smoke shrink
  assert frozenlake.get_config().rollout.prompts_per_step > 2


def test_parse_arg_types_and_unknown_key():
  args = parse_arg("n=3,x=0.5,flag,name=abc", n=1, x=1.0, flag=False, name="")
  assert (args.n, args.x, args.flag, args.name) == (3, 0.5, True, "abc")
  with pytest.raises(KeyError, match="known: .*'n'"):
    parse_arg("m=3", n=1)


def test_locked_config_rejects_new_fields():
  c = frozenlake.get_config()
  with pytest.raises(AttributeError, match="temperature"):
    c.rollout.temperatur = 0.3
  c.rollout.temperature = 0.3  # existing fields stay writable


def _train_cli(*args):
  return subprocess.run([sys.executable, "-m", "experiments.train", *args], capture_output=True,
                        text=True, timeout=120)


def test_command_line_override():
  proc = _train_cli("--config=configs/frozenlake.py:algo=chain", "--config.rollout.temperature=0.25",
                    "--config.sampler.page_size=8", "--print_config")
  assert proc.returncode == 0, proc.stderr
  c = json.loads(proc.stdout)
  assert (c["rollout"]["method"], c["rollout"]["temperature"], c["sampler"]["page_size"]) == ("chain", 0.25, 8)


def test_cli_unknown_override_is_one_clear_line():
  proc = _train_cli("--config=configs/frozenlake.py:smoke", "--config.rollout.temperatur=0.5")
  assert proc.returncode == 2
  assert "Did you mean \"temperature\"" in proc.stderr
  assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("path", ["configs/frozenlake.py", "configs/toolcall.py"])
@pytest.mark.parametrize("algo", sorted(ALGOS))
@pytest.mark.parametrize("variant", ["model=tiny", "model=small", "smoke"])
def test_every_config_builds_and_validates(path, algo, variant):
  """Each family x algo x model/smoke is a locked config that passes the full pre-compute
  validation (names, budgets and the KV page pool of its rollout)."""
  config = sweep_build.check(Run("configs", "x", 0, f"{path}:algo={algo},{variant}", ()))
  assert (config.rollout.method, config.learner.advantage) == ALGOS[algo]
  with pytest.raises(AttributeError):
    config.rollout.not_a_field = 1
