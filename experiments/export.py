"""Export a run's policy as a Hugging Face checkpoint (config.json, safetensors, tokenizer).

    python -m experiments.export --workdir=runs/default [--step=16] --out=runs/default/hf

The run's own config.json is used; transformers loads `--out` with AutoModelForCausalLM and
AutoTokenizer.
"""

import json

from absl import app, flags

from tree_rl.config import exit_on_bad_input, parse_flags_or_exit

_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory holding checkpoints/ and config.json.",
                               required=True)
_OUT = flags.DEFINE_string("out", None, "Directory to write the HF checkpoint to.", required=True)
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step (default: the latest).")


def main(argv):
  del argv
  from tree_rl.export import export_hf
  print(json.dumps(export_hf(_WORKDIR.value, _OUT.value, _STEP.value)), flush=True)


if __name__ == "__main__":
  app.run(exit_on_bad_input(main), flags_parser=parse_flags_or_exit)
