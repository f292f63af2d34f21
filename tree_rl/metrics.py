"""Metrics to a JSONL log and TensorBoard event files (tensorboardX: no TensorFlow), and curve plots."""

from __future__ import annotations

import json
import math
import os
from typing import Iterable, Mapping


def _scalar(value):
  try:
    value = float(value)
  except (TypeError, ValueError):
    return None
  return value


class NullWriter:
  """A `MetricsWriter` that writes nothing (the processes other than 0 of a multi-host job)."""

  def write(self, step, metrics):
    del step, metrics

  def truncate_after(self, step):
    del step

  def close(self):
    pass


class MetricsWriter:
  """`write(step, {"train/loss": ..., "eval/success": ...})` appends one JSON line per call."""

  def __init__(self, workdir: str, tensorboard: bool = True, filename: str = "metrics.jsonl"):
    os.makedirs(workdir, exist_ok=True)
    self.path = os.path.join(workdir, filename)
    self._tb = None
    if tensorboard:
      from tensorboardX import SummaryWriter
      self._tb = SummaryWriter(logdir=os.path.join(workdir, "tensorboard"))

  def write(self, step: int, metrics: Mapping[str, object]):
    scalars = {k: v for k, v in ((k, _scalar(v)) for k, v in metrics.items()) if v is not None}
    row = json.dumps({"step": int(step), **{k: (v if math.isfinite(v) else str(v))
                                            for k, v in scalars.items()}}) + "\n"
    # One append of the whole row: a reader sees whole rows, a kill leaves at most a cut last one.
    fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
      os.write(fd, row.encode())
    finally:
      os.close(fd)
    if self._tb is not None:
      for k, v in scalars.items():
        self._tb.add_scalar(k, v, int(step))
      self._tb.flush()

  def truncate_after(self, step: int):
    """Drop the JSONL rows of steps after `step` (a run resumed from checkpoint `step` writes
    them again; -1 for a run starting afresh), so the log holds each step once. A cut last row
    (a killed or disk-full append) is dropped too, saying so."""
    if not os.path.exists(self.path):
      return
    with open(self.path) as f:
      lines = f.read().split("\n")
    rows = []
    for i, line in enumerate(lines):
      if not line.strip():
        continue
      try:
        rows.append((json.loads(line), line))
      except ValueError:
        if i < len(lines) - 1 and any(x.strip() for x in lines[i + 1:]):
          raise ValueError(f"{self.path} line {i + 1} is not JSON and not the last line: the log "
                           f"was edited or damaged; fix or remove that line") from None
        print(f"{self.path}: dropped a cut last line ({len(line)} characters, a killed write)",
              flush=True)
    keep = [line + "\n" for row, line in rows if row["step"] <= step]
    if len(keep) < len(rows) and step < 0:
      print(f"{self.path}: dropped {len(rows)} row(s) of an earlier attempt that saved no "
            f"checkpoint", flush=True)
    with open(self.path, "w") as f:
      f.writelines(keep)

  def close(self):
    if self._tb is not None:
      self._tb.close()


def read_jsonl(path: str) -> list[dict]:
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def plot_curves(rows: Iterable[dict], keys: Iterable[str], path: str, title: str = ""):
  """One panel per key (value against step) written to a PNG (a bare Figure: the caller's
  matplotlib backend, e.g. a notebook's inline one, is left alone)."""
  from matplotlib.figure import Figure
  rows, keys = list(rows), [k for k in keys]
  fig = Figure(figsize=(4 * len(keys), 3))
  axes = fig.subplots(1, len(keys), squeeze=False)
  for ax, key in zip(axes[0], keys):
    points = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float))]
    if points:
      ax.plot(*zip(*points), marker="o" if len(points) < 30 else None)
    ax.set_title(key)
    ax.set_xlabel("step")
  if title:
    fig.suptitle(title)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
