"""FrozenLake (rLLM setup): a tiny from-scratch policy trained with tree rollouts.

Run:
  python -m experiments.train --config=configs/frozenlake.py:algo=patr,model=tiny --workdir=runs/fl
Smoke (about a minute on a CPU):
  python -m experiments.train --config=configs/frozenlake.py:smoke --workdir=runs/fl_smoke
Any field can be overridden, e.g. --config.rollout.temperature=0.7
"""

from tree_rl.config import base_config, lock, parse_arg


def get_config(arg=None):
  args = parse_arg(arg, algo="patr", model="tiny", hf_path="", smoke=False)
  c = base_config()
  c.rollout.method = args.algo
  c.model.preset = args.model
  c.model.hf_path = args.hf_path
  if args.model == "hf":
    c.tokenizer.kind = "hf"
  if args.smoke:
    c.rollout.prompts_per_step = 2
    c.rollout.max_tokens_per_turn = 16
    c.sampler.num_pages = 256
  return lock(c)
