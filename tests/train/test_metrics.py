"""JSONL + TensorBoard metrics and the curve plot."""

import glob
import os

from tree_rl.metrics import MetricsWriter, plot_curves, read_jsonl


def test_jsonl_tensorboard_and_plot(tmp_path):
  w = MetricsWriter(str(tmp_path))
  w.write(0, {"train/loss": 1.5, "eval/success": 0.25, "note": "skipped"})
  w.write(1, {"train/loss": float("nan")})
  w.close()
  rows = read_jsonl(w.path)
  assert rows == [{"step": 0, "train/loss": 1.5, "eval/success": 0.25}, {"step": 1, "train/loss": "nan"}]
  assert glob.glob(os.path.join(str(tmp_path), "tensorboard", "events.out.tfevents.*"))
  png = os.path.join(str(tmp_path), "curves.png")
  plot_curves(rows, ["train/loss", "eval/success"], png)
  with open(png, "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_resume_drops_rows_after_the_checkpoint(tmp_path):
  w = MetricsWriter(str(tmp_path), tensorboard=False)
  for step in range(6):
    w.write(step, {"rollout/success_rate": step / 10})
  w.truncate_after(3)          # resumed from checkpoint 3: steps 4 and 5 are written again
  w.write(4, {"rollout/success_rate": 0.9})
  assert [(r["step"], r["rollout/success_rate"]) for r in read_jsonl(w.path)] == [
      (0, 0.0), (1, 0.1), (2, 0.2), (3, 0.3), (4, 0.9)]


def test_a_cut_last_row_is_dropped_on_resume_and_a_fresh_start_logs_each_step_once(tmp_path, capsys):
  w = MetricsWriter(str(tmp_path), tensorboard=False)
  for step in range(3):
    w.write(step, {"rollout/success_rate": step / 10})
  with open(w.path, "a") as f:
    f.write('{"step": 3, "rollout/succ')          # a killed (or disk-full) append
  w.truncate_after(2)
  assert "dropped a cut last line" in capsys.readouterr().out
  w.write(3, {"rollout/success_rate": 0.3})
  assert [r["step"] for r in read_jsonl(w.path)] == [0, 1, 2, 3]
  # a run killed before its first checkpoint starts afresh: its rows go, each step is logged once
  w.truncate_after(-1)
  w.write(0, {"eval/greedy_success": 0.5})
  assert [r["step"] for r in read_jsonl(w.path)] == [0]


def test_a_damaged_middle_row_is_named_not_silently_dropped(tmp_path):
  import pytest
  w = MetricsWriter(str(tmp_path), tensorboard=False)
  w.write(0, {"a": 1.0})
  with open(w.path, "a") as f:
    f.write("garbage\n")
  w.write(1, {"a": 2.0})
  with pytest.raises(ValueError, match="line 2 is not JSON"):
    w.truncate_after(1)
