"""Shared pieces of the experiment configs: algorithm presets and the smoke shrink."""

# algo -> (rollout method, advantage estimator, loss aggregation); GRPO and RLOO are chains with
# their estimator. Aggregation is each method's own: GRPO and PATR (and Tree-Random, its control)
# average per trajectory, then per group, then over prompts (PATR's 1/G sum_i 1/|tau_i| sum_t,
# so a prompt that grew 6 leaves weighs as much as one with 4); the public Tree-GRPO code trains
# with verl's token mean over the batch.
ALGOS = {
    "grpo": ("chain", "grpo", "traj_mean_group_mean"),
    "rloo": ("chain", "rloo", "traj_mean_group_mean"),
    "chain": ("chain", "grpo", "traj_mean_group_mean"),
    "tree_grpo": ("tree_grpo", "tree_grpo", "token_mean"),
    "patr": ("patr", "grpo", "traj_mean_group_mean"),
    "tree_random": ("tree_random", "grpo", "traj_mean_group_mean"),
}


def apply_algo(c, algo: str):
  if algo not in ALGOS:
    raise KeyError(f"unknown algo {algo!r}; known: {sorted(ALGOS)}")
  c.rollout.method, c.learner.advantage, c.learner.aggregation = ALGOS[algo]


def apply_model(c, model: str, hf_path: str):
  c.model.preset = model
  c.model.hf_path = hf_path
  if model == "hf":
    c.tokenizer.kind = "hf"
    c.warmstart.enabled = False   # a pretrained checkpoint needs no warm start
    c.sampler.kv_dtype = "bfloat16"


def apply_smoke(c):
  """Shrink everything for a run of a minute or two on a CPU: 2 prompts, 2 turns of 8 tokens,
  2 RL steps, a few SFT steps, tiny task splits."""
  c.rollout.prompts_per_step = 2
  c.rollout.max_turns = 2
  c.rollout.max_tokens_per_turn = 8
  c.rollout.group_size = 2
  c.rollout.initial_branches = 2
  c.rollout.max_branches = 4
  c.rollout.score_every = 1
  c.sampler.num_pages = 1024
  c.sampler.kv_dtype = "float32"
  c.sampler.attention = "reference"  # fewest compiled shapes
  c.train.num_steps = 2
  c.train.eval_every = 2
  c.train.eval_prompts = 2
  c.train.eval_samples = 2
  c.train.num_train_tasks = 32
  c.train.num_test_tasks = 8
  c.warmstart.steps = 4
  c.warmstart.num_demos = 16
  c.warmstart.batch_size = 4
  c.warmstart.max_len = 128
  c.warmstart.eval_every = 1000
  c.warmstart.target_success = 1.0   # no early-stopping checks
  c.checkpoint.every_steps = 1
  c.logging.progress_bar = False
