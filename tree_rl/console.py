"""What a run prints: library logging at WARNING unless asked, and one start-up block."""

from __future__ import annotations

import jax


def quiet_libraries() -> None:
  """Library logs (orbax, TFDS, absl, jax) at WARNING unless `--verbosity` / `-v` was given."""
  from absl import flags, logging

  if not (flags.FLAGS.is_parsed() and flags.FLAGS["verbosity"].present):
    logging.set_verbosity(logging.WARNING)


def startup_block(config, workdir: str, *, num_params: int, mesh=None, rollout_mesh=None,
                  resumed_from: str | None = None) -> str:
  """A few lines: devices and meshes, model size, method, data, workdir, and what resumes."""
  r, lc, e = config.rollout, config.learner, config.env
  devices = jax.devices()
  kinds = sorted({d.device_kind for d in devices})
  text = lambda m: " x ".join(f"{n}={s}" for n, s in m.shape.items()) if m is not None else "none"  # noqa: E731
  lines = [
      f"devices   {len(devices)} x {', '.join(kinds)} ({jax.process_count()} process(es)); "
      f"mesh {text(mesh)}; rollouts per process {text(rollout_mesh)}",
      f"model     {config.model.preset}{' ' + config.model.hf_path if config.model.hf_path else ''}: "
      f"{num_params / 1e6:.2f}M parameters, {config.model.dtype}",
      f"method    {r.method}, advantage {lc.advantage}, loss aggregation {lc.aggregation}, "
      f"lr {lc.learning_rate:g}, temperature {r.temperature:g}",
      f"env       {e.name} ({e.preset}), {r.prompts_per_step} prompts x {config.train.num_steps} steps",
      f"workdir   {workdir}" + (f" (resumed from {resumed_from})" if resumed_from else " (fresh start)"),
  ]
  return "\n".join(lines)


class _NoBar:
  def update(self, n=1):
    del n

  def set_postfix(self, **kw):
    del kw

  def close(self):
    pass


def progress(show: bool, total: int, desc: str, *, initial: int = 0, leave: bool = True,
             unit="step"):
  """A tqdm bar when `show` (`config.logging.progress_bar`), else one that does nothing."""
  if not show:
    return _NoBar()
  from tqdm import tqdm
  return tqdm(total=total, initial=initial, desc=desc, unit=unit, leave=leave, dynamic_ncols=True)


def write(text: str) -> None:
  """Print a line without breaking an active progress bar, flushed at once (a run's log file
  shows its warm-start checks and notices as they happen, not when a buffer fills)."""
  import sys

  from tqdm import tqdm
  tqdm.write(text, file=sys.stdout)
  sys.stdout.flush()
