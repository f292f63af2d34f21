"""Sweep runs -> the exact locked configs `experiments.train` would build, and their checks.

`build(run, extra=...)` parses the run's own command-line arguments, then the `--config.` ones of
`extra`, with the same absl config flag as `experiments.train` (the config file's
`get_config(arg)` plus each `--config.` override), so a run that builds here starts the same way
there. `check(run)` adds `tree_rl.validation` with the rollout's KV page pool (the engine is
built from the env; no model, no data).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import pathlib
from typing import Any, Iterable, Sequence

from experiments.sweeps.core import Run, Sweep, format_value

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGE_ROUNDING = 1024


class SweepError(ValueError):
  """A sweep run that cannot start; the message is one line naming the run and the field."""


def _one_line(e: BaseException) -> str:
  inner = e.args[0] if len(e.args) == 1 and isinstance(e.args[0], BaseException) else e
  text = str(inner.args[0]) if isinstance(inner, KeyError) and inner.args else str(inner)
  return " ".join(text.replace("\\n", " ").split())


def _hint(e: BaseException) -> str:
  """The text after a KeyError's quoted key, e.g. `Did you mean "temperature" ...?`."""
  inner = e.args[0] if len(e.args) == 1 and isinstance(e.args[0], BaseException) else e
  lines = str(inner.args[0] if inner.args else "").splitlines()
  return " ".join(" ".join(lines[1:]).split())


def _resolve(config_arg: str) -> str:
  """The config argument with its file path made absolute (relative paths: the repo root)."""
  path, sep, arg = config_arg.partition(":")
  if not os.path.isabs(path) and not os.path.exists(path):
    path = str(ROOT / path)
  return path + sep + arg


@functools.lru_cache(maxsize=None)
def _config_module(path: str):
  if not os.path.exists(path):
    raise SweepError(f"config file {path!r} not found")
  spec = importlib.util.spec_from_file_location("_sweep_config_" + pathlib.Path(path).stem, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def load_config(config_arg: str):
  """`get_config(arg)` of `path.py:arg`, imported from the file (a locked ConfigDict)."""
  path, _, arg = _resolve(config_arg).partition(":")
  return _config_module(path).get_config(arg or None)


def get_field(config, key: str) -> Any:
  node = config
  for part in key.split("."):
    node = node[part]
  return node


def base_values(config_arg: str, keys: Iterable[str]) -> dict[str, Any]:
  config = load_config(config_arg)
  return {k: get_field(config, k) for k in keys}


def one_trajectory_tokens(config_arg: str) -> int:
  """Generated tokens one trajectory can take: max_turns x max_tokens_per_turn."""
  r = load_config(config_arg).rollout
  return int(r.max_turns) * int(r.max_tokens_per_turn)


def _check_keys(run: Run, config) -> None:
  for key, _ in run.overrides:
    try:
      get_field(config, key)
    except (KeyError, AttributeError) as e:
      hint = _hint(e)
      raise SweepError(f"{run.sweep}/{run.name}: unknown config field --config.{key}"
                       + (f" ({hint})" if hint else "")) from None


def _config_key(arg: str) -> str | None:
  """`a.b` for a config override `--config.a.b=1`, `-config.a.b 1` or `--noconfig.a.b`."""
  name = arg.split("=", 1)[0].lstrip("-")
  name = name[2:] if name.startswith("noconfig.") else name
  return name[len("config."):] if name.startswith("config.") else None


def config_args(argv: Sequence[str]) -> list[str]:
  """The config overrides in `argv` (with the value that follows one written without `=`); the
  entry point's other flags (`--compile_cache`, ...) are left out."""
  out, i = [], 0
  while i < len(argv):
    arg = argv[i]
    if _config_key(arg) is not None:
      takes_next = ("=" not in arg and not arg.lstrip("-").startswith("noconfig.")
                    and i + 1 < len(argv) and not argv[i + 1].startswith("-"))
      out.extend(argv[i:i + 1 + takes_next])
      i += takes_next
    i += 1
  return out


def build(run: Run, root: str = "runs/sweeps", extra: Sequence[str] = ()):
  """The locked config of `python -m experiments.train <run.train_args(root)> <extra>` (only
  the `--config.` overrides of `extra` are read)."""
  extra = config_args(extra)
  from absl import flags
  from ml_collections import config_flags

  where = f"{run.sweep}/{run.name}"
  try:
    base = load_config(run.config)
  except SweepError:
    raise
  except Exception as e:  # noqa: BLE001 - the config file's own error, as one line
    raise SweepError(f"{where}: --config={run.config}: {_one_line(e)}") from None
  _check_keys(run, base)
  args = run.train_args(root)
  argv = ["experiments.train", f"--config={_resolve(run.config)}", *args[1:], *extra]
  values = flags.FlagValues()
  holder = config_flags.DEFINE_config_file("config", None, "config", flag_values=values,
                                           lock_config=True, sys_argv=argv)
  flags.DEFINE_string("workdir", "", "workdir", flag_values=values)
  try:
    values(argv)
  except Exception as e:  # noqa: BLE001 - absl / ml_collections parse errors, as one line
    raise SweepError(f"{where}: {_one_line(e)}") from None
  config = holder.value
  later = {k for k in map(_config_key, extra) if k}   # extra args come later and win
  for key, want in run.overrides:
    if key in later:
      continue
    got = get_field(config, key)
    if not isinstance(want, str) or isinstance(got, str):
      if format_value(got) != format_value(want):
        raise SweepError(f"{where}: --config.{key}={format_value(want)} parsed as {got!r}")
  return config


def _without_seed(config) -> str:
  d = json.loads(config.to_json_best_effort())
  d.pop("seed", None)
  return json.dumps(d, sort_keys=True)


_ENGINES: dict[str, tuple] = {}


def _engine_parts(config):
  """(engine, layout) of a config's rollout; runs that differ only in the seed share them."""
  key = _without_seed(config)
  if key not in _ENGINES:
    _ENGINES[key] = _make_engine_parts(config)
  return _ENGINES[key]


def _make_engine_parts(config):
  from tree_rl import envs
  from tree_rl.models import build_tokenizer
  from tree_rl.rollout import build as rollout_build

  tokenizer = build_tokenizer(config.tokenizer, config.model.hf_path)
  env = envs.from_config(config, tokenizer)
  _, engine, layout = rollout_build.make_training_engine(config, env, tokenizer)
  return engine, layout


def pages_needed(config) -> int:
  """KV pages the rollout can need on one data shard holding every prompt: the bound
  `tree_rl.validation` checks before training with one shard (with D shards it checks a D-th,
  so a pool sized by this holds on any machine)."""
  from tree_rl.rollout.capacity import pages_needed as needed
  engine, layout = _engine_parts(config)
  return needed(engine, layout, int(config.sampler.page_size))


def check(run: Run, root: str = "runs/sweeps"):
  """Build the run's config and validate it as training would before any compute."""
  from tree_rl.validation import validate

  config = build(run, root)
  where = f"{run.sweep}/{run.name}"
  try:
    validate(config)
    if config.model.preset != "hf":   # an HF tokenizer needs the checkpoint directory
      engine, layout = _engine_parts(config)
      validate(config, engine=engine, layout=layout)
  except Exception as e:  # noqa: BLE001 - ConfigError and the builders' errors, as one line
    raise SweepError(f"{where}: {_one_line(e)}") from None
  return config


def check_all(runs: Iterable[Run], root: str = "runs/sweeps") -> list:
  return [check(r, root) for r in runs]


EQUAL_BUDGET_TOLERANCE = 0.10


def planned_cost(config, unit: str) -> float | None:
  """Planned rollout cost per prompt of a built config in `unit` (`tree_rl.rollout.budget`)."""
  from tree_rl import envs
  from tree_rl.rollout.budget import planned_cost as planned

  caps = {}
  if "max_calls" in envs.entry(config.env.name).config_fields:
    caps["max_calls"] = int(config.env.max_calls)
  if unit == "computed" and config.model.preset != "hf":
    engine, _ = _engine_parts(config)
    caps.update(prompt_tokens=engine.prompt_capacity, obs_tokens=engine.obs_capacity)
  return planned(config.rollout, unit, **caps)


def check_equal_budget(sweep: Sweep, configs: dict | None = None) -> dict:
  """Fail (one line naming the entries) when the entries of an `equal_budget` group differ by
  more than 10% in planned cost per prompt, in the first entry's `rollout.budget_unit`.
  configs: {entry: built config} to check (default: build every grouped entry, first seed);
  entries missing from it are skipped. Returns {entry: planned cost}."""
  costs = {}
  for group in sweep.equal_budget:
    built = {e: (configs[e] if configs is not None else build(sweep.run(e, sweep.seeds[0])))
             for e in group if configs is None or e in configs}
    if not built:
      continue
    unit = next(iter(built.values())).rollout.budget_unit
    plan = {e: planned_cost(c, unit) for e, c in built.items()}
    known = {e: v for e, v in plan.items() if v is not None}
    costs.update(known)
    if known and max(known.values()) > (1 + EQUAL_BUDGET_TOLERANCE) * min(known.values()):
      listed = ", ".join(f"{e}={v:,.0f}" for e, v in known.items())
      raise SweepError(f"{sweep.name}: equal-budget entries differ by more than "
                       f"{EQUAL_BUDGET_TOLERANCE:.0%} in planned cost ({unit} per prompt): {listed}")
  return costs


def fit_pages(sweep: Sweep) -> Sweep:
  """Raise `sampler.num_pages` (rounded up to PAGE_ROUNDING) in the entries whose rollout needs
  more KV pages than their config has; the others are left as they are."""
  entries = {}
  for name in sweep.entries:
    config = build(sweep.run(name, sweep.seeds[0]))
    entry = dict(sweep.entries[name])
    if config.model.preset != "hf":
      need = pages_needed(config)
      if need > int(config.sampler.num_pages):
        entry["sampler.num_pages"] = -(-need // PAGE_ROUNDING) * PAGE_ROUNDING
    entries[name] = entry
  return sweep.replace(entries=entries)


__all__ = ["SweepError", "base_values", "build", "check", "check_all", "check_equal_budget",
           "fit_pages", "load_config", "one_trajectory_tokens", "pages_needed", "planned_cost"]
