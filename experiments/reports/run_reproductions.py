"""Run report sweeps with one warm start per seed, then build the report.

    python -m experiments.reports.run_reproductions --parallel 2 -- --config.train.num_steps=12
    python -m experiments.reports.run_reproductions --sweep frozenlake_reproduction \
        --sweep frozenlake_ablations --seeds 0 1

The methods of one seed (over every `--sweep` given) start from the same warm-start checkpoint:
the warm start depends on the seed and `config.warmstart` only, so the first method's run
computes it (runs keep their step-0 checkpoint) and the others resume from a copy of it (and of
its step-0 eval row), which continues exactly as a run from scratch would (resume is bitwise
exact); a run directory of an earlier invocation that still holds its warm start gives it too,
and a run that saved no checkpoint yet gets it. Runs that reached the `train.num_steps` their config
and the `--config.` arguments after `--` plan (by their workdir or their summary in `--summaries`)
are skipped, so a stopped reproduction continues where it stopped when run again; raising
`train.num_steps` resumes a finished run from its last checkpoint where its workdir is kept (a
run known only by its summary is rerun from the seed's warm start). Only the step count is
compared: other changes resume a finished run under the new config. Seeds run in
parallel processes; arguments after `--` are added to every run (e.g. a shorter schedule).
Finally each finished run's summary is written into `--summaries` (`summaries.py`, committed
with the report) and `make_report` builds the report from that directory.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import shutil
import subprocess
import sys

from experiments import sweeps
from experiments.sweeps import build
from experiments.reports import make_report, summaries


def _train(run, root, extra, log):
  cmd = [sys.executable, "-m", "experiments.train", *run.train_args(root), *extra,
         "--config.logging.progress_bar=false"]
  with open(log, "w") as f:
    subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, check=True)


def _has_warm_start(workdir: str) -> bool:
  """Whether `workdir` holds a step-0 checkpoint (runs keep their computed warm start)."""
  return os.path.isdir(os.path.join(workdir, "checkpoints", "0"))


def _has_checkpoint(workdir: str) -> bool:
  path = os.path.join(workdir, "checkpoints")
  return os.path.isdir(path) and any(name.isdigit() for name in os.listdir(path))


def _seed_share(src: str, dst: str):
  """Give `dst` the warm start of `src`: its step-0 checkpoint and step-0 eval row."""
  os.makedirs(os.path.join(dst, "checkpoints"), exist_ok=True)
  shutil.copytree(os.path.join(src, "checkpoints", "0"), os.path.join(dst, "checkpoints", "0"))
  with open(os.path.join(src, "metrics.jsonl")) as f:
    first = next(line for line in f if json.loads(line)["step"] == 0)
  with open(os.path.join(dst, "metrics.jsonl"), "w") as f:
    f.write(first)


def _done(run, root: str, extra: list[str], summaries_dir: str) -> bool:
  """Whether `run` ran the `train.num_steps` its config and `extra` plan now, by its workdir or
  by its summary in `summaries_dir` (written by an earlier invocation)."""
  num_steps = int(build.build(run, root, extra).train.num_steps)
  return summaries.finished(run.workdir(root), num_steps) or bool(
      summaries_dir and summaries.summary_steps(
          os.path.join(summaries_dir, f"{run.name}.json")) >= num_steps)


def run_seed(runs: list, root: str, extra: list[str], summaries_dir: str = "",
             others: list = ()):
  """Train one seed's runs in order, skipping those that ran their planned steps (`_done`, so
  a reproduction spreads over several invocations); the first of them or of `others` (the
  seed's runs not picked) whose workdir holds a warm start (step 0), or else the first one
  trained, gives it to the rest."""
  source = next((run.workdir(root) for run in [*runs, *others]
                 if _has_warm_start(run.workdir(root))), None)
  for run in runs:
    workdir = run.workdir(root)
    if _done(run, root, extra, summaries_dir):
      continue
    if source is not None and not _has_checkpoint(workdir):   # nothing of its own to resume
      _seed_share(source, workdir)
    os.makedirs(workdir, exist_ok=True)
    _train(run, root, extra, os.path.join(workdir, "train.log"))
    if source is None and _has_warm_start(workdir):
      source = workdir
    print(f"done {run.sweep}/{run.name}", flush=True)


def main(argv=None):
  argv = sys.argv[1:] if argv is None else argv
  extra = argv[argv.index("--") + 1:] if "--" in argv else []
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--sweep", action="append", help="a report sweep (repeatable; default "
                  "frozenlake_methods); runs of one seed share one warm start across them")
  ap.add_argument("--seeds", type=int, nargs="*", help="these seeds, a sweep's own or more (a "
                  "reproduction extended to more seeds; default: each sweep's)")
  ap.add_argument("--entries", nargs="*", help="only these entries of the sweeps (default: all), "
                  "e.g. the cheaper arms first when time is short")
  ap.add_argument("--root", default="runs/sweeps")
  ap.add_argument("--parallel", type=int, default=1, help="seeds run at once")
  ap.add_argument("--summaries", default="experiments/reports/frozenlake_runs",
                  help="where the per-run summaries go (the report is built from them)")
  ap.add_argument("--out_dir", default="experiments/reports")
  ap.add_argument("--name", default=None, help="the report's name (make_report --name; default: "
                  "the env's, e.g. frozenlake)")
  args = ap.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
  names = args.sweep or ["frozenlake_methods"]
  known = {e for name in names for e in sweeps.get(name).entries}
  unknown = sorted(set(args.entries or ()) - known)
  if unknown:
    ap.error(f"--entries {unknown} are not entries of {names}; known: {sorted(known)}")
  by_seed, others = {}, {}
  for name in names:
    for run in sweeps.get(name).runs(args.seeds):
      picked = args.entries is None or run.entry in args.entries
      (by_seed if picked else others).setdefault(run.seed, []).append(run)
  with concurrent.futures.ThreadPoolExecutor(args.parallel) as pool:
    for f in [pool.submit(run_seed, runs, args.root, extra, args.summaries, others.get(seed, []))
              for seed, runs in by_seed.items()]:
      f.result()
  for name in names:
    if os.path.isdir(os.path.join(args.root, name)):    # a sweep none of whose runs were picked has none
      summaries.write_summaries(os.path.join(args.root, name), args.summaries)
  make_report.main(["--summaries", args.summaries, "--out_dir", args.out_dir]
                   + (["--name", args.name] if args.name else []))


if __name__ == "__main__":
  main()
