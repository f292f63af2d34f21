"""Robustness of the main job's RL: from the shipped warm start, RL seeds 0..N-1 (`train.rl_seed`;
the warm start and the held-out evaluation's episodes are the same for every seed), each under
the machine's own floats and under perturbed ones (a stated XLA_FLAGS setting that changes
XLA:CPU's code generation, hence the floats of every step).

    python -m experiments.bench_main_job --seeds=10

Prints per seed and setting the held-out greedy / sampled success and pass@2 before and after
RL, each gain, and the minimum gain of each; the goal the main job is held to (sampled +5
points or more, greedy at most 1 point lower, pass@2 not lower) is checked on every row. One
worker process per float setting runs its seeds one after the other on shared compiled
programs; the JSON (--out) holds every row and each run's final params digest (equal digests
across settings would mean the perturbation changed no float).
"""

import json
import os
import platform
import subprocess
import sys
import tempfile
import time

from absl import app, flags

_SEEDS = flags.DEFINE_integer("seeds", 10, "RL seeds first_seed..first_seed+seeds-1.")
_FIRST = flags.DEFINE_integer("first_seed", 0, "The first RL seed.")
_CONFIG_ARG = flags.DEFINE_string("config_arg", "configs/frozenlake.py",
                                  "The main job's config (file[:args]).")
_OVERRIDES = flags.DEFINE_multi_string("override", [], "Config overrides field=value (repeatable).")
_SETTINGS = flags.DEFINE_list("settings", ["native", "sse4"], "Float settings to run (see SETTINGS).")
_OUT = flags.DEFINE_string("out", "", "Write the JSON here too.")
_WORKER = flags.DEFINE_string("worker", "", "Internal: run one setting's seeds, print JSON rows.")
_ROWS = flags.DEFINE_string("rows", "", "Internal: the worker also appends each row here as it finishes.")
_TABULATE = flags.DEFINE_list("tabulate", [], "Only print the table and summary of these rows files.")

# name -> XLA_FLAGS added for that setting. sse4: XLA:CPU generates code for SSE4.2 only (128-bit
# lanes, no FMA), as on a host without AVX: other vectorised reductions and fusions, other floats
# (on an AVX-512 host, capping at AVX2 left a test program's floats bit-identical; SSE4.2 did not).
SETTINGS = {"native": "", "sse4": "--xla_cpu_max_isa=SSE4_2"}
METRICS = (("greedy", "eval/greedy_success"), ("sampled", "eval/sampled_success"),
           ("pass@2", "eval/pass_at_2"))
# The goal: sampled +0.05 or more, greedy at most 0.01 lower, pass@2 not lower.
GOAL = {"sampled": 0.05, "greedy": -0.01, "pass@2": 0.0}
TOL = 1e-9   # the metrics are fractions of 100 or 200 episodes: compare beside rounding


def _worker(setting: str) -> None:
  import hashlib
  import shutil

  import jax
  import numpy as np

  from tree_rl import compile_cache, train
  compile_cache.enable(None)
  config = _load_config(_CONFIG_ARG.value, _OVERRIDES.value)
  parts = train.build_parts(config)
  root = tempfile.mkdtemp(prefix="bench_main_job_")
  try:
    for seed in range(_FIRST.value, _FIRST.value + _SEEDS.value):
      config.train.rl_seed = seed
      workdir = os.path.join(root, f"seed{seed}")
      t = time.perf_counter()
      summary = train.train_and_evaluate(config, workdir, parts=parts)
      seconds = time.perf_counter() - t
      _, params = train.restore_params(parts.train_step, workdir)
      h = hashlib.sha256()
      for leaf in jax.tree.leaves(params):
        h.update(np.asarray(leaf).tobytes())
      row = {"setting": setting, "seed": seed, "seconds": round(seconds, 1),
             "params_sha256": h.hexdigest()[:16]}
      for name, key in METRICS:
        row[f"{name}_before"] = summary["eval_before"][key]
        row[f"{name}_after"] = summary["eval_after"][key]
      print("ROW " + json.dumps(row), flush=True)
      if _ROWS.value:
        with open(_ROWS.value, "a") as f:
          f.write(json.dumps(row) + "\n")
  finally:
    parts.tasks.close()
    shutil.rmtree(root, ignore_errors=True)


def _load_config(arg: str, overrides: list[str]):
  """The config file's get_config(args) with `field=value` overrides (the types of the fields)."""
  import importlib.util

  path, _, args = arg.partition(":")
  if not os.path.exists(path):
    import configs
    path = os.path.join(os.path.dirname(configs.__file__), os.path.basename(path))
  spec = importlib.util.spec_from_file_location("bench_config", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = module.get_config(args or None)
  for item in overrides:
    key, _, value = item.partition("=")
    section, field = key.split(".")
    old = config[section][field]
    config[section][field] = (value.lower() in ("1", "true")) if isinstance(old, bool) else type(old)(value)
  return config


def _run_setting(setting: str) -> list[dict]:
  env = dict(os.environ)
  env["XLA_FLAGS"] = " ".join(filter(None, [env.get("XLA_FLAGS", ""), SETTINGS[setting]]))
  cmd = [sys.executable, "-m", "experiments.bench_main_job", f"--worker={setting}",
         f"--seeds={_SEEDS.value}", f"--first_seed={_FIRST.value}", f"--config_arg={_CONFIG_ARG.value}"]
  cmd += [f"--override={o}" for o in _OVERRIDES.value]
  if _OUT.value:   # each row as it finishes, beside the final JSON (a long run shows progress)
    cmd.append(f"--rows={_OUT.value}.{setting}.rows.jsonl")
  proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  rows = [json.loads(line[4:]) for line in proc.stdout.splitlines() if line.startswith("ROW ")]
  if proc.returncode != 0:
    tail = " ".join(proc.stderr.strip().splitlines()[-1:])
    raise SystemExit(f"bench_main_job: the {setting!r} worker failed (exit {proc.returncode}): {tail}")
  return rows


def gains(row: dict) -> dict:
  return {name: row[f"{name}_after"] - row[f"{name}_before"] for name, _ in METRICS}


def meets_goal(row: dict) -> bool:
  g = gains(row)
  return all(g[name] >= GOAL[name] - TOL for name in GOAL)


def table(rows: list[dict]) -> str:
  head = (f"{'setting':<8}{'seed':>5}  " + "  ".join(f"{n + ' b->a':>17}" for n, _ in METRICS)
          + f"{'goal':>6}{'s':>7}")
  lines = [head, "-" * len(head)]
  for r in rows:
    cells = "  ".join(f"{r[f'{n}_before']:.3f}->{r[f'{n}_after']:.3f} {gains(r)[n]:+.3f}".rjust(17)
                      for n, _ in METRICS)
    seconds = f"{r['seconds']:.0f}" if r.get("seconds") is not None else "-"
    lines.append(f"{r['setting']:<8}{r['seed']:>5}  {cells}{('met' if meets_goal(r) else 'MISS'):>6}"
                 f"{seconds:>7}")
  for name, _ in METRICS:
    values = [gains(r)[name] for r in rows]
    lines.append(f"{name:<8} gain: min {min(values):+.3f}, mean {sum(values) / len(values):+.3f}, "
                 f"max {max(values):+.3f}")
  met = sum(meets_goal(r) for r in rows)
  lines.append(f"goal (sampled >= +0.05, greedy >= -0.01, pass@2 >= 0) met on {met} of {len(rows)} runs")
  return "\n".join(lines)


def main(argv):
  del argv
  if _WORKER.value:
    _worker(_WORKER.value)
    return
  unknown = [s for s in _SETTINGS.value if s not in SETTINGS]
  if unknown:
    raise SystemExit(f"--settings: unknown {unknown}; known: {sorted(SETTINGS)}")
  import jax
  t = time.perf_counter()
  rows = []
  if _TABULATE.value:   # rows of earlier runs (e.g. settings run as separate commands)
    for path in _TABULATE.value:
      with open(path) as f:
        rows += [json.loads(line) for line in f if line.strip()]
  for setting in [] if _TABULATE.value else _SETTINGS.value:
    rows += _run_setting(setting)
  summary = {
      "command": "python -m experiments.bench_main_job " + " ".join(sys.argv[1:]),
      "config": _CONFIG_ARG.value, "overrides": _OVERRIDES.value,
      "settings": {s: SETTINGS[s] for s in sorted({r["setting"] for r in rows})}, "rows": rows,
      "min_gain": {n: min(gains(r)[n] for r in rows) for n, _ in METRICS},
      "goal_met": all(meets_goal(r) for r in rows),
      "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "jax": jax.__version__,
                  "python": platform.python_version()},
      "seconds": round(time.perf_counter() - t, 1)}
  print(table(rows))
  print(json.dumps(summary))
  if _OUT.value:
    with open(_OUT.value, "w") as f:
      json.dump(summary, f, indent=2)


if __name__ == "__main__":
  app.run(main)
