"""Entry point: `python -m experiments.train --config=configs/frozenlake.py:algo=patr --workdir=runs/x`.

Any config field can be overridden with --config.section.field=value; --print_config shows the
resolved config. Runs (or resumes) `tree_rl.train.train_and_evaluate` and prints eval success
before and after RL.
"""

import json

from absl import app, flags
from ml_collections import config_flags

from tree_rl import compile_cache
from tree_rl.config import exit_on_bad_input, parse_flags_or_exit

_CACHE = compile_cache.define_flag()
_CONFIG = config_flags.DEFINE_config_file("config", "configs/frozenlake.py", "Experiment config file.")
_WORKDIR = flags.DEFINE_string("workdir", "runs/default", "Directory for checkpoints and logs.")
_PRINT_CONFIG = flags.DEFINE_bool("print_config", False, "Print the resolved config as JSON and exit.")


def summary_table(summary: dict) -> str:
  before, after = summary.get("eval_before", {}), summary.get("eval_after", {})
  keys = sorted(k for k in after if k.startswith("eval/"))
  lines = [f"{'eval metric':<34}{'before RL':>12}{'after RL':>12}", "-" * 58]
  for k in keys:
    b = before.get(k)
    lines.append(f"{k:<34}{(f'{b:.3f}' if b is not None else '-'):>12}{after[k]:>12.3f}")
  lines.append(f"RL steps: {summary['step']}" + (" (stopped early)" if summary["stopped_early"] else ""))
  return "\n".join(lines)


def main(argv):
  del argv
  config = _CONFIG.value
  if _PRINT_CONFIG.value:
    from tree_rl.validation import validate
    validate(config)   # a config that cannot run is refused here too, as one line
    print(config.to_json_best_effort(indent=2))
    return
  # Multi-host: jax.distributed.initialize before anything touches a device.
  from tree_rl.learner.sharding import maybe_initialize_distributed
  maybe_initialize_distributed(config.mesh)   # and the watch for a lost process
  compile_cache.enable(_CACHE.value)
  from tree_rl.train import train_and_evaluate
  summary = train_and_evaluate(config, _WORKDIR.value)
  import jax
  if jax.process_index() == 0:
    print(summary_table(summary))
    print(json.dumps(summary))


if __name__ == "__main__":
  app.run(exit_on_bad_input(main), flags_parser=parse_flags_or_exit)
