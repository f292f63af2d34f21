#!/usr/bin/env python3
"""Expand a named sweep (experiments/sweeps) into one `experiments.train` command per run, and
run the commands here, on a TPU pod slice, or through Slurm.

  launch/sweep.py --list                                  # the sweeps, their entries and seeds
  launch/sweep.py patr_ablation --dry-run                 # print the commands, run nothing
  launch/sweep.py patr_ablation                           # here, one run after another
  launch/sweep.py budget_curve --per-accelerator          # here, one run per local GPU at a time
  launch/sweep.py patr_ablation --target pod              # each run through launch/tpu_pod.sh
  launch/sweep.py patr_ablation --target slurm            # each run: sbatch launch/slurm_gpu.sh

Run `r` of sweep `S` writes to WORKDIR_ROOT/S/r (r = ENTRY_seedN). Every run's config is built
with the flags `experiments.train` parses and validated (names, budgets, the KV page pool, and
for equal-budget sweeps planned costs within 10% across the compared entries, `--set`s included)
before anything runs or prints; a bad override fails with one line naming the run and field.
Commands run from the repository root, so relative paths are relative to it.
"""

from __future__ import annotations

import argparse
import importlib
import os
import pathlib
import posixpath
import shlex
import shutil
import subprocess
import sys
import threading

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

try:
  importlib.import_module("tree_rl.validation")   # the project's dependencies are importable
  from experiments import sweeps
  from experiments.sweeps.build import SweepError, check_all, check_equal_budget
  from experiments.sweeps.core import Run
except ModuleNotFoundError as e:
  sys.exit(f"error: {e}: run with the project's interpreter, e.g. .venv/bin/python launch/sweep.py ...")

LOCAL, POD, SLURM = "launch/local.sh", "launch/tpu_pod.sh", "launch/slurm_gpu.sh"
BASH = shutil.which("bash") or "bash"


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("name", nargs="?", help="sweep name (see --list)")
  p.add_argument("--list", action="store_true", help="list the sweeps and exit")
  p.add_argument("--target", choices=("local", "pod", "slurm"), default="local")
  p.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
  how = p.add_mutually_exclusive_group()
  how.add_argument("--parallel", type=int, default=1, metavar="N",
                   help="local: N runs at a time (logs in WORKDIR.log)")
  how.add_argument("--per-accelerator", action="store_true",
                   help="local: one run per GPU at a time, pinned with CUDA_VISIBLE_DEVICES")
  p.add_argument("--devices", default="",
                 help="--per-accelerator: GPU ids, e.g. 0,1 (default: CUDA_VISIBLE_DEVICES or nvidia-smi)")
  p.add_argument("--workdir-root", default="runs/sweeps")
  p.add_argument("--seeds", default="", help="comma-separated seeds (default: the sweep's)")
  p.add_argument("--only", action="append", default=[], metavar="SUBSTR",
                 help="keep runs whose name (ENTRY_seedN) contains SUBSTR; repeatable")
  p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                 help="one more --config.FIELD=VALUE on every run (e.g. train.num_steps=2); repeatable")
  p.add_argument("--sbatch-args", default="", help="slurm: extra sbatch options, e.g. '--partition=gpu'")
  args = p.parse_args(argv)
  if not args.list and not args.name:
    p.error("a sweep name is needed (see --list)")
  if args.target != "local" and (args.parallel != 1 or args.per_accelerator):
    p.error("--parallel / --per-accelerator are for --target local")
  if args.parallel < 1:
    p.error("--parallel must be >= 1")
  return args


def with_sets(run: Run, sets: dict[str, str]) -> Run:
  overrides = {k: v for k, v in run.overrides if k != "seed"}
  overrides.update(sets)
  return Run(run.sweep, run.entry, run.seed, run.config, (*overrides.items(), ("seed", run.seed)))


def parse_sets(items: list[str]) -> dict[str, str]:
  sets = {}
  for item in items:
    key, eq, value = item.partition("=")
    key = key.removeprefix("--").removeprefix("config.")
    if not eq or not key:
      raise SweepError(f"--set {item!r}: expected FIELD=VALUE, e.g. train.num_steps=2")
    if key == "seed":
      raise SweepError("--set seed=...: use --seeds")
    sets[key] = value
  return sets


def select_runs(args) -> list[Run]:
  sweep = sweeps.get(args.name)
  seeds = [int(s) for s in args.seeds.split(",") if s.strip()] or None
  runs = sweep.runs(seeds)
  if args.only:
    runs = [r for r in runs if any(s in r.name for s in args.only)]
    if not runs:
      raise SweepError(f"--only {args.only} matches no run of {args.name}")
  sets = parse_sets(args.set)
  return [with_sets(r, sets) for r in runs] if sets else runs


def local_devices(args) -> list[str]:
  if args.devices:
    return [d.strip() for d in args.devices.split(",") if d.strip()]
  visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
  if visible:
    return [d.strip() for d in visible.split(",") if d.strip()]
  try:
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=True).stdout
  except (OSError, subprocess.CalledProcessError):
    out = ""
  devices = [str(i) for i, line in enumerate(out.splitlines()) if line.startswith("GPU ")]
  if not devices:
    raise SweepError("--per-accelerator found no GPU (nvidia-smi -L); pass --devices 0,1,... "
                     "or use --parallel N")
  return devices


def commands(args, runs: list[Run]) -> list[tuple[str, str]]:
  """(slot, shell command) per run; runs of one slot go one after another."""
  root = args.workdir_root
  out = []
  for i, run in enumerate(runs):
    train = shlex.join(run.train_args(root))
    if args.target == "pod":
      out.append(("pod", ("SKIP_SETUP=1 " if i else "") + f"{POD} {train}"))
    elif args.target == "slurm":
      job = f"{run.sweep}.{run.name}"
      log = posixpath.join(root, run.sweep, f"{run.name}.%j.out")
      extra = shlex.split(args.sbatch_args)
      out.append(("slurm", shlex.join(["sbatch", f"--job-name={job}", f"--output={log}", *extra,
                                       SLURM]) + f" {train}"))
    elif args.per_accelerator:
      devices = args.devices_list
      d = devices[i % len(devices)]
      log = shlex.quote(run.workdir(root) + ".log")
      out.append((d, f"CUDA_VISIBLE_DEVICES={shlex.quote(d)} {LOCAL} {train} > {log} 2>&1"))
    elif args.parallel > 1:
      log = shlex.quote(run.workdir(root) + ".log")
      out.append((str(i % args.parallel), f"{LOCAL} {train} > {log} 2>&1"))
    else:
      out.append(("local", f"{LOCAL} {train}"))
  return out


def execute(cmds: list[tuple[str, str]]) -> list[str]:
  """Run the commands (bash, from the repository root); slots run in parallel. -> failures."""
  failed, lock, total = [], threading.Lock(), len(cmds)
  numbered = list(enumerate(cmds, 1))

  def slot_loop(slot):
    for n, (s, cmd) in numbered:
      if s != slot:
        continue
      with lock:
        print(f"[{n}/{total}] {cmd}", file=sys.stderr, flush=True)
      rc = subprocess.run(cmd, shell=True, executable=BASH, cwd=ROOT).returncode
      if rc != 0:
        with lock:
          failed.append(f"exit {rc}: {cmd}")
          print(f"[{n}/{total}] failed with exit {rc}", file=sys.stderr, flush=True)

  slots = list(dict.fromkeys(s for s, _ in cmds))
  if len(slots) == 1:
    slot_loop(slots[0])
  else:
    threads = [threading.Thread(target=slot_loop, args=(s,), daemon=True) for s in slots]
    for t in threads:
      t.start()
    for t in threads:
      t.join()
  return failed


def list_sweeps() -> None:
  for name in sweeps.names():
    s = sweeps.get(name)
    print(f"{name:<30} {len(s.entries):>3} entries x {len(s.seeds)} seeds  {s.description}")
    print(f"{'':<30} {' '.join(s.entries)}")


def main(argv=None) -> int:
  args = parse_args(argv)
  os.chdir(ROOT)
  try:
    if args.list:
      list_sweeps()
      return 0
    runs = select_runs(args)
    configs = check_all(runs, args.workdir_root)
    check_equal_budget(sweeps.get(args.name), {r.entry: c for r, c in zip(runs, configs)})
    args.devices_list = local_devices(args) if args.per_accelerator else []
  except (KeyError, SweepError) as e:
    message = e.args[0] if isinstance(e, KeyError) and e.args else e
    print(f"error: {message}", file=sys.stderr)
    return 2
  cmds = commands(args, runs)
  if args.dry_run:
    for _, cmd in cmds:
      print(cmd)
    return 0
  if args.target == "slurm" or args.parallel > 1 or args.per_accelerator:
    os.makedirs(posixpath.join(args.workdir_root, args.name), exist_ok=True)
  print(f"{args.name}: {len(cmds)} runs ({args.target})", file=sys.stderr)
  try:
    failed = execute(cmds)
  except KeyboardInterrupt:
    print("interrupted: no further runs started", file=sys.stderr)
    return 130
  print(f"{args.name}: {len(cmds) - len(failed)} of {len(cmds)} runs succeeded", file=sys.stderr)
  for f in failed:
    print(f"  {f}", file=sys.stderr)
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
