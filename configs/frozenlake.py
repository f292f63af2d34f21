"""FrozenLake (rLLM setup: maps 2..9, not slippery): a from-scratch policy trained with tree rollouts.

Run:
  python -m experiments.train --config=configs/frozenlake.py:algo=patr,model=tiny --workdir=runs/fl
Smoke (a minute or two on a CPU):
  python -m experiments.train --config=configs/frozenlake.py:algo=tree_grpo,smoke --workdir=runs/fl_smoke
algo: grpo | rloo | chain | tree_grpo | patr | tree_random;  model: tiny | small | hf (with hf_path=...).
Any field can be overridden, e.g. --config.rollout.temperature=0.7
"""

from configs.common import apply_algo, apply_model, apply_smoke
from tree_rl.config import base_config, lock, parse_arg


def get_config(arg=None):
  args = parse_arg(arg, algo="patr", model="tiny", hf_path="", smoke=False)
  c = base_config()
  c.env.name, c.env.preset = "frozenlake", "rllm"
  apply_algo(c, args.algo)
  apply_model(c, args.model, args.hf_path)
  # The tiny from-scratch policy replies with one move word: 16 tokens per turn is ample.
  c.rollout.max_tokens_per_turn = 16
  c.sampler.kv_dtype = "float32" if args.model == "tiny" else c.sampler.kv_dtype
  # Scaled for a 2-core CPU (the papers: batch 64, 400 steps): 4 prompts x 16 steps, eval on 32
  # held-out maps every 8 steps, PATR with the paper's B0=4 and a cap of 8 branches.
  c.rollout.prompts_per_step = 4
  c.rollout.initial_branches = 4
  c.rollout.max_branches = 8
  c.rollout.group_size = 4
  c.sampler.num_pages = 8192
  c.sampler.attention = "reference"   # fewest compiled shapes on CPU; "auto" on accelerators
  # Per-leaf rows: their memory is bounded by (leaves x longest path); packed rows of 10-turn PATR
  # trees ran out of host memory once in the block-sparse attention (see the issue notes).
  c.learner.packed = False
  c.learner.learning_rate = 1e-3      # the papers' 1e-6 is for 0.5B+ pretrained policies; this is a 0.45M from-scratch one
  c.train.num_steps = 16
  c.train.eval_every = 8
  c.train.eval_prompts = 32
  c.train.eval_samples = 2
  c.checkpoint.every_steps = 4
  if args.smoke:
    apply_smoke(c)
  return lock(c)
