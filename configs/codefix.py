"""Code repair in sandboxed workspaces (PATR's software-engineering task, at CPU size).

Each episode is a tiny Python module with one injected bug (`tree_rl.envs.codefix.gen`): the agent
reads files, replaces text, runs the visible tests and submits; the reward is 1 when every hidden
test passes (the resolve rate). The workspace is real state on the host: a tree branch forks it
(`tree_rl.envs.codefix`, `tree_rl.envs.sandbox`).

Run:
  python -m experiments.train --config=configs/codefix.py:algo=patr --workdir=runs/cf
Smoke:
  python -m experiments.train --config=configs/codefix.py:algo=tree_grpo,smoke --workdir=runs/cf_smoke
algo: a name in `tree_rl.algorithms` (grpo, tree_grpo, patr, ...);
model: tiny | small | hf (with hf_path=...) | qwen3-4b (PATR's SWE shape, random weights; 50 turns,
32K-token trajectories: the long-context setting `experiments.aot` compiles).
"""

from configs.common import apply_algo, apply_model, apply_smoke, paper_scale
from tree_rl.config import base_config, lock, parse_arg


def get_config(arg=None):
  args = parse_arg(arg, algo="patr", model="tiny", hf_path="", smoke=False)
  c = base_config()
  c.env.name, c.env.preset = "codefix", "default"
  # read, test, replace, test, submit and one spare turn; PATR: B0=4, M=2, scored every turn
  c.rollout.max_turns = 6
  c.rollout.initial_branches, c.rollout.expand_children, c.rollout.score_every = 4, 2, 1
  c.rollout.group_size = 8
  apply_model(c, args.model, args.hf_path)
  if paper_scale(args.model):
    _swe_scale(c)
  else:
    # the longest action, a one-line replace, takes up to ~180 byte-level tokens (23% of the
    # tasks' fixes are longer than 128)
    c.rollout.max_tokens_per_turn = 192
    c.rollout.prompts_per_step = 4
    c.rollout.max_branches = 8
    c.sampler.num_pages = 8192
    c.sampler.attention = "reference"
    c.sampler.obs_chunk = 128
    # tree-packed learner rows as long as the longest trajectory (224 + 6 x (192 + 256) = 2,912
    # tokens): per-leaf rows padded to a power of two were [32+, 4096] with dense attention, and
    # a first trial run peaked at 14 GB
    c.learner.packed = True
    c.learner.row_tokens, c.learner.microbatch_rows, c.learner.microbatches = 2944, 4, 1
    c.warmstart.steps, c.warmstart.batch_size = 150, 8
    c.train.num_steps, c.train.eval_every = 8, 4
    c.train.eval_prompts, c.train.eval_samples = 32, 2
    c.checkpoint.every_steps = 4
  apply_algo(c, args.algo)
  c.warmstart.max_len = 1024          # an expert episode: ~660 tokens on average
  if args.smoke:
    apply_smoke(c)
    # two turns of 32 tokens: the expert's read and test fit (its fix would not: noise off), so
    # the demos run the sandbox's tests in every smoke
    c.rollout.max_turns, c.rollout.max_tokens_per_turn = 2, 32
    c.warmstart.epsilon = 0.0
    c.warmstart.max_len = 768
    if c.learner.row_tokens:   # the longest trajectory: 224 + 2 x (32 + 256) = 800 tokens
      c.learner.row_tokens = 832
    c.train.num_test_tasks = 4
  return lock(c)


def _swe_scale(c):
  """PATR's software-engineering setting (Qwen3-4B, batch 8, K=13, 50 turns, 32K-token
  trajectories): 384 tokens per reply make the longest trajectory 224 + 50 x (384 + 256) =
  32,224 tokens; the learner packs micro-batches of one 32,256-token row per data shard, with
  256-token attention blocks (32-token blocks would unroll 1,008 key-block groups per layer)."""
  c.rollout.max_turns, c.rollout.score_every = 50, 13
  c.rollout.prompts_per_step = 8
  c.rollout.max_tokens_per_turn = 384
  c.learner.packed = True
  c.learner.attention_block = 256
  c.learner.row_tokens, c.learner.microbatch_rows, c.learner.microbatches = 32256, 8, 1
