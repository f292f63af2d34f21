"""Numeric config ranges: declared for every numeric field, held by every shipped config, and a
value outside one refused before compute, also under --print_config."""

import math
import os
import subprocess
import sys

import pytest

from configs import codefix, frozenlake, toolcall
from tree_rl import algorithms
from tree_rl.config import RANGES, _flat, base_config, describe, range_errors
from tree_rl.validation import ConfigError, validate


def test_every_numeric_field_declares_its_range():
  numeric = {k for k, v in _flat(base_config()).items()
             if isinstance(v, (int, float)) and not isinstance(v, bool)}
  assert numeric == set(RANGES)
  assert range_errors(base_config()) == []


@pytest.mark.parametrize("module", [frozenlake, toolcall, codefix])
def test_shipped_configs_are_in_range(module):
  for algo in algorithms.names():
    for extra in ("", ",smoke"):
      assert range_errors(module.get_config(f"algo={algo}{extra}")) == [], (module, algo, extra)


def test_range_words():
  assert describe("int [1 _)") == "an integer >= 1"
  assert describe("num (0 _)") == "a finite number > 0"
  assert describe("num (0 1]") == "a finite number in (0, 1]"


# the overrides an adversarial pass found accepted, and the edges of each kind of range
NONSENSE = [
    ("learner", "learning_rate", math.inf), ("learner", "learning_rate", 0.0),
    ("learner", "adam_eps", math.inf), ("learner", "kl_coef", math.inf), ("learner", "b1", -math.inf),
    ("learner", "adv_eps", math.inf), ("learner", "adv_eps", -math.inf), ("learner", "adv_eps", -1.0),
    ("learner", "entropy_coef", 1e308), ("learner", "clip_low", 1.0), ("learner", "b2", math.nan),
    ("rollout", "temperature", 1e308), ("rollout", "prune_repeat", -7),
    ("rollout", "prune_alpha", math.nan), ("scorer", "judge_scale", -1.0),
    ("scorer", "judge_lambda", 1.5), ("warmstart", "epsilon", -0.1),
    ("warmstart", "target_success", 2.0), ("train", "eval_chunk", -1), ("mesh", "process_id", -2),
    ("checkpoint", "keep", 0), ("logging", "every_steps", 0), ("env", "top_k", 0),
]


@pytest.mark.parametrize("section,field,value", NONSENSE)
def test_out_of_range_values_are_refused_naming_the_field(section, field, value):
  c = frozenlake.get_config("algo=chain,smoke")
  c[section][field] = value
  with pytest.raises(ConfigError, match=rf"^(config\.)?{section}\.{field}\b") as e:
    validate(c)   # the range check, or an earlier check of that field
  assert "\n" not in str(e.value)


@pytest.mark.parametrize("section,field,value,message", [
    ("env", "split", "nope", "config.env.split='nope'; known: ['test', 'train']"),
    ("warmstart", "attention", "", "config.warmstart.attention=''; known:"),
])
def test_unknown_names_are_refused(section, field, value, message):
  c = frozenlake.get_config("algo=chain,smoke")
  c[section][field] = value
  with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("(", r"\(")):
    validate(c)


def test_cli_refuses_a_bad_value_under_print_config_and_an_unknown_preset_in_one_line(tmp_path):
  args = [sys.executable, "-m", "experiments.train", "--config=configs/frozenlake.py:algo=chain,smoke"]
  proc = subprocess.run(args + ["--print_config", "--config.learner.learning_rate=inf"],
                        capture_output=True, text=True, timeout=120)
  assert proc.returncode == 2 and proc.stdout == "", proc.stdout
  assert ("error: ConfigError: config.learner.learning_rate=inf must be a finite number in (0, 1]"
          in proc.stderr.splitlines()), proc.stderr
  workdir = tmp_path / "run"
  proc = subprocess.run(args + ["--config.env.preset=", f"--workdir={workdir}"],
                        capture_output=True, text=True, timeout=120)
  assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
  assert ("error: ConfigError: unknown frozenlake preset '' (config.env.preset); known: "
          "['long', 'ragen', 'rllm', 'rllm_small']") in proc.stderr.splitlines()
  assert not os.path.exists(workdir)
