"""Config files, `key=value` arguments, command-line overrides and their errors."""

import json
import os
import re
import subprocess
import sys

import pytest

from configs import frozenlake, toolcall
from experiments.sweeps import build as sweep_build
from experiments.sweeps.core import Run
from tree_rl import algorithms
from tree_rl.config import parse_arg

# algo -> (rollout method, advantage estimator, loss aggregation)
ALGOS = {a.name: (a.method, a.estimator, a.aggregation) for a in algorithms.all_algorithms()}
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


@pytest.mark.parametrize("path", ["configs/frozenlake.py", "configs/toolcall.py", "configs/codefix.py"])
@pytest.mark.parametrize("algo", sorted(ALGOS))
@pytest.mark.parametrize("variant", ["model=tiny", "model=small", "smoke"])
def test_every_config_builds_and_validates(path, algo, variant):
  """Each family x algo x model/smoke is a locked config that passes the full pre-compute
  validation (names, budgets and the KV page pool of its rollout)."""
  config = sweep_build.check(Run("configs", "x", 0, f"{path}:algo={algo},{variant}", ()))
  assert (config.rollout.method, config.learner.advantage, config.learner.aggregation) == ALGOS[algo]
  with pytest.raises(AttributeError):
    config.rollout.not_a_field = 1


@pytest.mark.parametrize("algo", sorted(ALGOS))
def test_the_frozenlake_testbed_builds_and_validates(algo):
  """The testbed's longer trajectories (local view lines) still fit the learner rows."""
  config = sweep_build.check(Run("configs", "x", 0, f"configs/frozenlake.py:algo={algo},testbed", ()))
  assert config.env.local_view and config.env.goal_hint and config.train.num_steps >= 100   # the issue: at least 100 RL steps


@pytest.mark.parametrize("algo", ["grpo", "tree_grpo"])
def test_the_toolcall_testbed_builds_and_validates(algo):
  config = sweep_build.check(Run("configs", "x", 0, f"configs/toolcall.py:algo={algo},testbed", ()))
  assert config.train.num_steps >= 100 and config.warmstart.target_success < 1


def test_the_toolcall_testbed_keeps_the_expert_demos_whole():
  import jax
  from tree_rl.envs.toolcall import ToolCallEnv
  from tree_rl.models.tokenizers import make_tokenizer
  from tree_rl.warmstart.demos import DemoGenerator
  from tree_rl.warmstart.experts import make_expert
  from tree_rl.envs.toolcall.qa import kb_of, scaled_config
  c = toolcall.get_config("algo=grpo,testbed")
  w = c.warmstart
  tok = make_tokenizer()
  env = ToolCallEnv(tok, kb=kb_of(scaled_config(int(c.env.data_seed), int(c.env.kb_scale))))
  gen = DemoGenerator(env, tok, make_expert("toolcall", env, w.epsilon), max_len=w.max_len,
                      loss_on_noise=w.loss_on_noise)
  demos = gen(jax.random.key(1), 512)
  assert not demos.truncated.any() and (demos.length > 512).any()   # 512 would cut some


def test_parse_arg_booleans_parse_as_command_line_flags_do():
  assert parse_arg("flag=false", flag=True).flag is False
  assert parse_arg("flag=1", flag=False).flag is True
  for bad in ("on", "maybe", "yes"):   # the command line rejects these for boolean fields too
    with pytest.raises(ValueError, match=f"flag='{bad}'.*Non-boolean argument to boolean flag"):
      parse_arg(f"flag={bad}", flag=False)


def test_cli_bad_config_argument_is_one_clear_line():
  proc = _train_cli("--config=configs/frozenlake.py:algo=chain,smoke=on", "--print_config")
  assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
  assert "smoke='on'" in proc.stderr and "Non-boolean argument" in proc.stderr


@pytest.mark.parametrize("override, message", [
    (("sampler", "page_size", 0), "config.sampler.page_size=0 must be an integer >= 1"),
    (("sampler", "num_pages", -1), "config.sampler.num_pages=-1 must be an integer >= 0"),
    (("sampler", "kv_dtype", "int8"), "config.sampler.kv_dtype='int8'"),
    (("sampler", "obs_chunk", -1), "config.sampler.obs_chunk=-1 must be an integer >= 0"),
    (("sampler", "attention", "flash"), "config.sampler.attention='flash'"),
    (("rollout", "top_p", 0.0), "config.rollout.top_p=0.0 must be a finite number in (0, 1]"),
    (("rollout", "top_p", 1.5), "config.rollout.top_p=1.5 must be a finite number in (0, 1]"),
    (("rollout", "top_k", -1), "config.rollout.top_k=-1 must be an integer >= 0"),
    (("rollout", "prompts_per_step", 0), "config.rollout.prompts_per_step=0 must be an integer >= 1"),
    (("env", "kb_scale", 0), "config.env.kb_scale=0 must be an integer >= 1"),
    (("train", "rl_seed", -2), "config.train.rl_seed=-2 must be an integer in [-1, 2147483648)"),
    (("rollout", "temperature", 0.0), "config.rollout.temperature=0.0 must be a finite number in (0, 100]"),
    (("rollout", "top_k", 5), "config.rollout.top_k=5: training refuses top-k / top-p"),
    (("rollout", "top_p", 0.9), "config.rollout.top_p=0.9: training refuses top-k / top-p"),
    (("model", "hf_path", "/nonexistent"), "config.model.hf_path='/nonexistent' is not a local"),
    (("learner", "episode_stats", "rows"), "learner.episode_stats='rows'; known: ('step_rows'"),
    (("learner", "dual_clip", 0.5), "learner.dual_clip=0.5 must be 0"),
    (("rollout", "draw_factor", 0), "config.rollout.draw_factor=0 must be an integer >= 1"),
])
def test_every_field_is_checked_before_compute_naming_it(override, message):
  from tree_rl.validation import ConfigError, validate
  c = frozenlake.get_config("algo=chain,smoke" + (",model=hf" if override[0] == "model" else ""))
  section, field, value = override
  c[section][field] = value
  with pytest.raises(ConfigError, match=re.escape(message)):
    validate(c)


@pytest.mark.parametrize("field, value", [("hard_turn_weight", 2.0), ("hard_fraction", 0.5)])
def test_demo_weights_without_an_expert_hard_are_refused_before_compute(field, value):
  from tree_rl.validation import ConfigError, validate
  c = toolcall.get_config("algo=chain,smoke")   # ToolCallExpert has no hard(state)
  c.warmstart[field] = value
  with pytest.raises(ConfigError, match=rf"need an expert with hard\(state\); env 'toolcall'"
                                        rf"'s ToolCallExpert has none"):
    validate(c)
  f = frozenlake.get_config("algo=chain,smoke")   # FrozenLakeExpert has one
  f.warmstart[field] = value
  validate(f)


@pytest.mark.parametrize("seed", [-1, 2**31])
def test_a_seed_outside_the_key_range_is_refused(seed):
  from tree_rl.validation import ConfigError, validate
  c = frozenlake.get_config("algo=chain,smoke")
  c.seed = seed
  with pytest.raises(ConfigError, match=rf"config\.seed={seed} must be an integer in \[0, 2147483648\)"):
    validate(c)


@pytest.mark.parametrize("unit, budget, floor", [
    ("env_steps", 1, "(2: "), ("tool_calls", 1, "(2: ")])
def test_budgets_below_one_trajectory_are_refused_in_every_unit(unit, budget, floor):
  from tree_rl.validation import ConfigError, validate
  c = frozenlake.get_config("algo=chain,smoke")   # 2 turns per episode
  c.rollout.budget, c.rollout.budget_unit = budget, unit
  with pytest.raises(ConfigError, match=rf"budget={budget} {unit} .*{floor.replace('(', chr(92) + '(')}"):
    validate(c)
  c.rollout.budget = 2
  validate(c)


def test_tool_call_budget_floor_is_the_env_call_limit():
  from configs import toolcall
  from tree_rl.validation import ConfigError, validate
  c = toolcall.get_config("algo=chain")
  c.rollout.budget_unit, c.env.max_calls = "tool_calls", 3   # 6 turns, at most 3 calls
  c.rollout.budget = 2
  with pytest.raises(ConfigError, match="config.env.max_calls=3"):
    validate(c)
  c.rollout.budget = 3
  validate(c)


def test_removed_page_table_knob_is_refused():
  proc = _train_cli("--config=configs/frozenlake.py:smoke", "--config.sampler.max_pages_per_seq=1",
                    "--print_config")
  assert proc.returncode == 2 and "max_pages_per_seq" in proc.stderr and "Traceback" not in proc.stderr


def test_cli_config_error_is_one_line_exit_2_and_writes_nothing(tmp_path):
  workdir = tmp_path / "run"
  proc = _train_cli("--config=configs/frozenlake.py:smoke", "--config.sampler.page_size=0",
                    f"--workdir={workdir}")
  assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
  assert proc.stderr.strip().splitlines()[-1].startswith(
      "error: ConfigError: config.sampler.page_size=0 must be an integer >= 1")
  assert not workdir.exists()


def test_model_hf_gets_the_papers_frozenlake_setting():
  """PATR's FrozenLake table (Qwen2.5-0.5B), written out here: rLLM maps 2..9 without a hint,
  B0=4, M=2, K=5, 10 turns, alpha 0.5, Theta 6, lr 1e-6, clip 0.28, KL 0.001, temperature 1,
  batch 64, 400 steps; GRPO's group of 8; replies long enough for thought + action."""
  c = frozenlake.get_config("algo=patr,model=hf,hf_path=ckpt")
  got = {k: c[k.split(".")[0]][k.split(".")[1]] for k in (
      "env.preset", "env.goal_hint", "rollout.initial_branches", "rollout.expand_children",
      "rollout.score_every", "rollout.max_turns", "rollout.prune_alpha", "rollout.prune_repeat",
      "learner.learning_rate", "learner.clip_low", "learner.clip_high", "learner.kl_coef",
      "rollout.temperature", "rollout.prompts_per_step", "train.num_steps",
      "rollout.max_tokens_per_turn", "warmstart.enabled", "tokenizer.kind")}
  assert got == {
      "env.preset": "rllm", "env.goal_hint": False, "rollout.initial_branches": 4,
      "rollout.expand_children": 2, "rollout.score_every": 5, "rollout.max_turns": 10,
      "rollout.prune_alpha": 0.5, "rollout.prune_repeat": 6, "learner.learning_rate": 1e-6,
      "learner.clip_low": 0.28, "learner.clip_high": 0.28, "learner.kl_coef": 0.001,
      "rollout.temperature": 1.0, "rollout.prompts_per_step": 64, "train.num_steps": 400,
      "rollout.max_tokens_per_turn": 512, "warmstart.enabled": False, "tokenizer.kind": "hf"}
  assert frozenlake.get_config("algo=grpo,model=hf").rollout.group_size == 8
  qa = toolcall.get_config("algo=patr,model=hf")
  assert (qa.learner.learning_rate, qa.rollout.max_tokens_per_turn) == (1e-6, 512)


# Each baseline's learner as its public scripts and configs set it, written out here (sources in
# docs/methods.md): (KL, clip low / high, dual clip, entropy bonus, aggregation, updates
# per step at paper scale).
BASELINES = {
    "dapo": (0.0, 0.2, 0.28, 10.0, 0.0, "token_mean", 16),
    "arpo": (0.0, 0.2, 0.2, 3.0, 0.0, "token_mean", 8),
    "gigpo": (0.01, 0.2, 0.2, 0.0, 0.001, "token_mean", 8),
    "patr": (0.001, 0.28, 0.28, 0.0, 0.0, "traj_mean_group_mean", 1),
}


@pytest.mark.parametrize("algo", sorted(BASELINES))
@pytest.mark.parametrize("module", [frozenlake, toolcall])
def test_each_baseline_takes_its_references_learner(module, algo):
  kl, low, high, dual, ent, agg, updates = BASELINES[algo]
  for model in ("hf", "tiny"):
    c = module.get_config(f"algo={algo},model={model}")
    lc = c.learner
    assert (lc.kl_coef, lc.clip_low, lc.clip_high, lc.dual_clip, lc.entropy_coef,
            lc.aggregation) == (kl, low, high, dual, ent, agg), model
    # the CPU presets give the baselines 2 updates a step (8 prompts)
    assert c.train.minibatches == (updates if model == "hf" else min(updates, 2))
    if algo != "patr":   # the baselines' recipes take one epoch (PATR's is the env config's)
      assert c.train.ppo_epochs == 1
  assert module.get_config(f"algo={algo},model=hf").learner.learning_rate == 1e-6


@pytest.mark.parametrize("module", [frozenlake, toolcall])
def test_from_scratch_models_get_the_cpu_measured_learning_rate(module):
  for model in ("tiny", "small"):
    c = module.get_config(f"algo=patr,model={model}")
    # the FrozenLake main job (tiny, from its shipped warm start) measured its own: 1e-4
    lr = 1e-4 if module is frozenlake and model == "tiny" else 1e-3
    assert c.learner.learning_rate == lr and c.rollout.max_tokens_per_turn <= 24


def test_a_saved_config_round_trips_and_eval_overrides_are_limited_to_eval_fields(tmp_path):
  from tree_rl.config import differences, eval_config, from_json
  run = frozenlake.get_config("algo=tree_grpo,smoke")
  (tmp_path / "config.json").write_text(run.to_json_best_effort(indent=2))
  saved = from_json((tmp_path / "config.json").read_text())
  assert differences(run, saved) == [] and saved.mesh.shape == run.mesh.shape
  assert differences(eval_config(str(tmp_path)), run) == []
  other = frozenlake.get_config("algo=patr")                 # a different file config
  other.train.eval_samples = 7
  got = eval_config(str(tmp_path), other, overrides=["train.eval_samples"])
  assert differences(got, run) == ["train.eval_samples"] and got.train.eval_samples == 7
  with pytest.raises(ValueError, match=r"learner\.advantage='grpo' \(run: 'tree_grpo'\).* and \d+ more"):
    eval_config(str(tmp_path), other)
  other = frozenlake.get_config("algo=patr,smoke")
  with pytest.raises(ValueError, match=r"rollout\.method='patr' \(run: 'tree_grpo'\)"):
    eval_config(str(tmp_path), other)
  with pytest.raises(FileNotFoundError, match="not a training run|config.json not found"):
    eval_config(str(tmp_path / "nope"))


def test_configs_and_entry_points_work_outside_the_repository_root(tmp_path):
  """The installed package brings configs/ and experiments/: a notebook elsewhere imports them,
  and `--config=configs/frozenlake.py` finds the shipped file when the directory has none."""
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
  run = lambda *a: subprocess.run([sys.executable, *a], cwd=str(tmp_path), env=env,  # noqa: E731
                                  capture_output=True, text=True, timeout=300)
  proc = run("-c", "import configs.frozenlake as f; print(f.get_config('algo=grpo').rollout.method)")
  assert proc.returncode == 0 and proc.stdout.strip() == "chain", proc.stderr[-2000:]
  proc = run("-m", "experiments.train", "--config=configs/frozenlake.py:algo=tree_grpo,smoke",
             "--print_config")
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert json.loads(proc.stdout)["rollout"]["method"] == "tree_grpo"
