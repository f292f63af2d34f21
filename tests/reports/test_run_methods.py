"""The report runner's schedule: one warm start per seed across sweeps, runs that reached their
planned steps skipped (a reproduction spread over several invocations), the others resumed from the first
trained run's step-0 checkpoint and eval row."""

import json
import os

import pytest

from experiments.reports import run_reproductions as runner
from experiments.reports import summaries
from experiments.sweeps import build
from experiments.sweeps.core import Sweep

FL = "configs/frozenlake.py:algo=patr"


def _fake_train(trained):
  """Records what each run found in its workdir when it started, then writes a finished run."""
  def train(run, root, extra, log):
    workdir = run.workdir(root)
    marker = os.path.join(workdir, "checkpoints", "0", "marker")
    metrics = os.path.join(workdir, "metrics.jsonl")
    found = (open(marker).read() if os.path.exists(marker) else None,
             [json.loads(line) for line in open(metrics)] if os.path.exists(metrics) else None)
    trained.append((run.name, *found))
    if found[0] is None:
      os.makedirs(os.path.dirname(marker), exist_ok=True)
      with open(marker, "w") as f:
        f.write(run.name)
    with open(metrics, "a") as f:
      if found[1] is None:
        f.write(json.dumps({"step": 0, "eval/sampled_success": 0.5, "from": run.name}) + "\n")
      f.write(json.dumps({"step": 1, "loss": 0.1, "from": run.name}) + "\n")
    with open(os.path.join(workdir, "summary.json"), "w") as f:   # ran the steps it planned
      json.dump({"step": _planned(run, root, extra)}, f)
  return train


def _planned(run, root, extra=()):
  return int(build.build(run, root, extra).train.num_steps)


def test_one_warm_start_per_seed_and_summarized_runs_skipped(tmp_path, monkeypatch):
  main = Sweep("main", FL, {"a": {}, "b": {}}, seeds=(0,))
  more = Sweep("more", FL, {"c": {}}, seeds=(0,))
  runs = main.runs() + more.runs()
  summaries = tmp_path / "summaries"
  summaries.mkdir()
  root = str(tmp_path / "runs")
  steps = _planned(main.run("a", 0), root)   # a finished in an earlier invocation:
  (summaries / "a_seed0.json").write_text(json.dumps({"steps": steps}))
  trained = []
  monkeypatch.setattr(runner, "_train", _fake_train(trained))
  runner.run_seed(runs, root, [], str(summaries))
  # b computes the warm start (a is skipped), c starts from b's step-0 checkpoint and eval row
  # only (not its RL steps)
  b_row = {"step": 0, "eval/sampled_success": 0.5, "from": "b_seed0"}
  assert trained == [("b_seed0", None, None), ("c_seed0", "b_seed0", [b_row])]
  assert not os.path.exists(main.run("a", 0).workdir(root))
  trained.clear()
  runner.run_seed(runs, root, [], str(summaries))   # everything done: nothing trains
  assert trained == []


def test_a_run_stopped_early_is_resumed_and_not_summarized(tmp_path, monkeypatch):
  sweep = Sweep("main", FL, {"a": {}}, seeds=(0,))
  root = str(tmp_path / "runs")
  a = sweep.run("a", 0).workdir(root)
  os.makedirs(a)
  with open(os.path.join(a, "summary.json"), "w") as f:   # a SIGTERM at step 2 writes one too
    json.dump({"step": 2, "stopped_early": True}, f)
  assert summaries.finished_runs(os.path.join(root, "main")) == []
  trained = []
  monkeypatch.setattr(runner, "_train", _fake_train(trained))
  runner.run_seed(sweep.runs(), root, [])
  assert [name for name, *_ in trained] == ["a_seed0"]
  assert summaries.finished_runs(os.path.join(root, "main")) == [a]


def test_a_finished_run_whose_config_now_plans_more_steps_resumes(tmp_path, monkeypatch):
  """Raising `train.num_steps` extends finished runs: the runner compares the steps a run (or
  its summary from an earlier invocation) reached with what its config plans now."""
  sweep = Sweep("main", FL, {"a": {"train.num_steps": 3}, "b": {"train.num_steps": 3}},
                seeds=(0,))
  root, out = str(tmp_path / "runs"), tmp_path / "summaries"
  a = sweep.run("a", 0).workdir(root)
  os.makedirs(a)
  with open(os.path.join(a, "summary.json"), "w") as f:   # finished when 2 steps were planned
    json.dump({"step": 2, "stopped_early": False}, f)
  out.mkdir()
  (out / "b_seed0.json").write_text(json.dumps({"steps": 2}))
  assert summaries.finished(a) and not summaries.finished(a, 3)
  trained = []
  monkeypatch.setattr(runner, "_train", _fake_train(trained))
  runner.run_seed(sweep.runs(), root, [], str(out))
  assert [name for name, *_ in trained] == ["a_seed0", "b_seed0"]
  trained.clear()
  runner.run_seed(sweep.runs(), root, [], str(out))                 # both reached 3 steps now
  assert trained == []
  # the `--config.` args after `--` count too; the entry point's other flags are passed on
  runner.run_seed(sweep.runs(), root, ["--compile_cache=", "--config.train.num_steps", "4"],
                  str(out))
  assert [name for name, *_ in trained] == ["a_seed0", "b_seed0"]


def test_a_kept_warm_start_of_an_earlier_sitting_is_shared_with_runs_not_yet_saved(tmp_path, monkeypatch):
  sweep = Sweep("main", FL, {"a": {}, "b": {}, "c": {}}, seeds=(0,))
  root = str(tmp_path / "runs")
  a, b = sweep.run("a", 0).workdir(root), sweep.run("b", 0).workdir(root)
  os.makedirs(os.path.join(a, "checkpoints", "0"))          # a finished, its warm start kept
  open(os.path.join(a, "checkpoints", "0", "marker"), "w").write("a_seed0")
  open(os.path.join(a, "metrics.jsonl"), "w").write(json.dumps({"step": 0, "from": "a"}) + "\n")
  with open(os.path.join(a, "summary.json"), "w") as f:
    json.dump({"step": _planned(sweep.run("a", 0), root)}, f)
  os.makedirs(os.path.join(b, "checkpoints"))               # b died before its first checkpoint
  trained = []
  monkeypatch.setattr(runner, "_train", _fake_train(trained))
  runner.run_seed(sweep.runs(), root, [])
  row = [{"step": 0, "from": "a"}]
  assert trained == [("b_seed0", "a_seed0", row), ("c_seed0", "a_seed0", row)]
  # a run not picked this time (`--entries`) gives its kept warm start to those picked
  trained.clear()
  d = Sweep("x", FL, {"d": {}}, seeds=(0,)).run("d", 0)
  runner.run_seed([d], root, [], others=[sweep.run("a", 0)])
  assert trained == [("d_seed0", "a_seed0", row)]


def test_entries_pick_arms_and_an_unknown_one_is_one_clear_error(monkeypatch, capsys):
  picked, sources = [], []
  def run_seed(runs, root, extra, summaries_dir, others):
    picked.extend(r.name for r in runs)
    sources.extend(r.name for r in others)   # the seed's other runs may hold its warm start
  monkeypatch.setattr(runner, "run_seed", run_seed)
  monkeypatch.setattr(runner.summaries, "write_summaries", lambda *a: None)
  monkeypatch.setattr(runner.make_report, "main", lambda *a: None)
  runner.main(["--sweep", "frozenlake_reproduction", "--seeds", "1", "2",
               "--entries", "tree_grpo_quarter", "grpo"])
  assert sorted(picked) == ["grpo_seed1", "grpo_seed2", "tree_grpo_quarter_seed1",
                            "tree_grpo_quarter_seed2"]
  assert sorted(sources) == sorted(f"{m}_seed{s}" for m in ("tree_grpo", "tree_random", "patr")
                                   for s in (1, 2))
  # seeds past the sweep's own (0-4) extend it: the tool-call arms to 10 seeds
  picked.clear()
  runner.main(["--sweep", "toolcall_reproduction", "--seeds", "5", "9", "--entries", "grpo"])
  assert sorted(picked) == ["grpo_seed5", "grpo_seed9"]
  with pytest.raises(SystemExit):
    runner.main(["--sweep", "frozenlake_reproduction", "--entries", "tree_grpo_quartr"])
  assert "--entries ['tree_grpo_quartr'] are not entries" in capsys.readouterr().err


def test_a_sweep_with_no_picked_runs_is_not_summarized(tmp_path, monkeypatch):
  """`--entries patr` over both report sweeps trains nothing of the ablations: their root never
  exists, and the runner summarizes only the sweeps that ran (it died there before)."""
  root = tmp_path / "runs"
  def run_seed(runs, root_dir, extra, summaries_dir, others):
    for r in runs:
      os.makedirs(r.workdir(root_dir), exist_ok=True)
  summarized = []
  monkeypatch.setattr(runner, "run_seed", run_seed)
  monkeypatch.setattr(runner.summaries, "write_summaries", lambda runs, out: summarized.append(runs))
  monkeypatch.setattr(runner.make_report, "main", lambda *a: None)
  runner.main(["--root", str(root), "--sweep", "frozenlake_reproduction", "--sweep",
               "frozenlake_ablations", "--seeds", "1", "--entries", "patr"])
  assert summarized == [str(root / "frozenlake_reproduction")]
