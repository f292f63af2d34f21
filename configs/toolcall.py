"""Multi-hop QA with a search tool (the stand-in for the papers' retrieval agents).

`model=hf` gets the papers' RL setting (lr 1e-6, clip 0.28, KL 0.001, temperature 1, 512 tokens
per turn; configs/common.py); `model=tiny|small` replies with a few tokens per turn.

Run:
  python -m experiments.train --config=configs/toolcall.py:algo=tree_grpo,model=tiny --workdir=runs/qa
Smoke:
  python -m experiments.train --config=configs/toolcall.py:algo=patr,smoke --workdir=runs/qa_smoke
algo: grpo | rloo | chain | tree_grpo | patr | tree_random | dapo | gigpo | arpo;  model: tiny | small | hf (with hf_path=...).
"""

from configs.common import apply_algo, apply_model, apply_smoke
from tree_rl.config import base_config, lock, parse_arg


def get_config(arg=None):
  args = parse_arg(arg, algo="tree_grpo", model="tiny", hf_path="", smoke=False)
  c = base_config()
  c.env.name, c.env.preset = "toolcall", "default"
  c.rollout.max_turns = 6    # up to 3 hops of search, then the answer
  apply_model(c, args.model, args.hf_path)
  if args.model != "hf":
    c.rollout.max_tokens_per_turn = 24          # <search>a few words</search> or <answer>name</answer>
    c.sampler.num_pages = 8192                  # patr / tree_random / grpo need up to 8,144 pages here
  apply_algo(c, args.algo)
  c.warmstart.max_len = 512                     # the question prompt alone is ~200 tokens
  if args.smoke:
    apply_smoke(c)
    c.warmstart.max_len = 384
  return lock(c)
