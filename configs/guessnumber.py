"""Guess the number (tree_rl/envs/guessnumber): a secret digit, one guess a turn, answered
higher or lower; binary search finds it in at most 4 guesses. The example device env of
docs/extending.md. No warm-start expert is registered, so the policy starts from its init.

Run:
  python -m experiments.train --config=configs/guessnumber.py:algo=patr --workdir=runs/guess
Smoke (a minute on a CPU):
  python -m experiments.train --config=configs/guessnumber.py:algo=grpo,smoke \
      --workdir=runs/guess_smoke
algo: a name in `tree_rl.algorithms`;  model: tiny | small | hf (with hf_path=...).
"""

from configs.common import apply_algo, apply_model, apply_smoke, paper_scale
from tree_rl.config import base_config, lock, parse_arg


def get_config(arg=None):
  args = parse_arg(arg, algo="patr", model="tiny", hf_path="", smoke=False)
  c = base_config()
  c.env.name, c.env.preset = "guessnumber", "default"
  c.rollout.max_turns = 5                # the secret is one of 10: 4 guesses suffice
  c.rollout.score_every = 2              # PATR scores its branches after guesses 2 and 4
  apply_model(c, args.model, args.hf_path)
  if not paper_scale(args.model):
    c.rollout.max_tokens_per_turn = 4    # a digit and the end of the turn
  c.warmstart.enabled = False            # no expert registered
  apply_algo(c, args.algo)
  if args.smoke:
    apply_smoke(c)
  return lock(c)
