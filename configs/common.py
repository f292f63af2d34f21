"""Shared pieces of the experiment configs: the algorithm presets (`tree_rl.algorithms`), the
model presets and the smoke shrink."""

from tree_rl import algorithms

# Updates per RL step (`train.minibatches`, one epoch): each baseline takes its public scripts'
# (`Algorithm.updates`; docs/methods.md names the files). The reproduction's own methods
# take one, as rLLM's FrozenLake script (the framework of PATR's runs) does: 32 prompts,
# mini-batches of 64. Tree-GRPO's scripts take 8 for tree and chain alike (64 x GPUs prompts in
# mini-batches of 8 x GPUs); here GRPO, Tree-GRPO, PATR and Tree-Random share one learner
# setting, so their comparisons vary the rollout alone (`--config.train.minibatches=8` gives
# Tree-GRPO's).
# The CPU presets (8 prompts a step, learning rates measured at one update a step) give the
# baselines 2 updates: the least under which clipping acts at all (after the first). Not measured
# against the testbeds' learning curves (docs/methods.md). The baselines take their
# recipes' one epoch everywhere (the FrozenLake main job's two epochs are the reproduction's
# methods' setting: the baselines' 2 mini-batches make as many updates).
CPU_UPDATES = 2


def apply_algo(c, algo: str):
  """The algorithm's rollout method, estimator, aggregation, recipe and updates per step
  (`tree_rl.algorithms`); call it after `apply_model` (the papers' RL setting would otherwise
  overwrite DAPO's clipping and KL; the updates follow the model: the algorithm's at paper
  scale, at most `CPU_UPDATES` otherwise)."""
  a = algorithms.get(algo)
  a.apply(c)
  if a.updates:
    c.train.minibatches = a.updates if paper_scale(c.model.preset) else min(a.updates, CPU_UPDATES)
    c.train.ppo_epochs = 1


# The papers' RL setting for a pretrained policy (the PATR paper's FrozenLake setting:
# Qwen2.5-0.5B, lr 1e-6, clip 0.28, KL 0.001, temperature 1, batch 64, 400 steps).
PAPER_RL = {
    "learner.learning_rate": 1e-6, "learner.clip_low": 0.28, "learner.clip_high": 0.28,
    "learner.kl_coef": 0.001, "rollout.temperature": 1.0, "rollout.prompts_per_step": 64,
    "train.num_steps": 400,
}
# From-scratch tiny / small policies on a CPU: lr 1e-3 is what the FrozenLake RL runs measured
# (docs/measurements.md, "RL loop"; 1e-6 does not move a 0.46M-parameter policy).
FROM_SCRATCH_RL = {"learner.learning_rate": 1e-3}
# Tokens per agent turn for a pretrained agent's thought + action (the tiny policies reply with a
# word or two, and their configs set less).
HF_REPLY_TOKENS = 512


def apply(c, values: dict):
  """Set dotted fields `{"section.field": value}`."""
  for key, value in values.items():
    section, field = key.split(".")
    c[section][field] = value


def paper_scale(model: str) -> bool:
  """Whether `model` is a pretrained-size policy (`hf`, or a published shape such as
  `qwen2.5-0.5b`), which gets the papers' setting rather than the CPU one."""
  from tree_rl.models.config import PUBLISHED
  return model == "hf" or model in PUBLISHED


def apply_model(c, model: str, hf_path: str):
  """Per-model defaults: `hf` and the published shapes (`qwen2.5-0.5b` ... `qwen3-4b`, random
  weights: what `experiments.aot` and dry runs size) get the papers' setting; tiny / small what
  the CPU runs measured. Their KV pool is sized to the rollout's worst case
  (sampler.num_pages=0); a published shape computes and stores its weights in bfloat16 (the
  learner keeps float32 master weights) and renders text with the builtin tokenizer, whose
  vocabulary fits inside the model's."""
  c.model.preset = model
  c.model.hf_path = hf_path
  if paper_scale(model):
    if model == "hf":
      c.tokenizer.kind = "hf"
    else:
      c.model.dtype = c.model.param_dtype = "bfloat16"
    c.warmstart.enabled = False   # a pretrained checkpoint needs no warm start
    c.sampler.kv_dtype = "bfloat16"
    c.sampler.num_pages = 0
    # the learner's weights and AdamW state split over every device (FSDP); rows too
    c.mesh.shape = (1, -1, 1)
    c.rollout.max_tokens_per_turn = HF_REPLY_TOKENS
    apply(c, PAPER_RL)
  else:
    c.sampler.kv_dtype = "float32" if model == "tiny" else c.sampler.kv_dtype
    apply(c, FROM_SCRATCH_RL)


def paper_learner(c, longest: int):
  """The learner of a pretrained-size policy: fixed-shape tree-packed micro-batches of 8 rows
  (one per chip of an 8-chip slice) as long as the longest trajectory, `longest` tokens,
  rounded up to the 256-token attention block (finer blocks unroll a key-block group per two
  blocks and layer: thousands at these lengths); one program every step."""
  c.learner.packed = True
  c.learner.attention_block = 256
  c.learner.row_tokens = -(-int(longest) // 256) * 256
  c.learner.microbatch_rows, c.learner.microbatches = 8, 1
  # the [rows, tokens, 151,936] float32 logits in chunks (5 GB a row at 8K tokens otherwise);
  # matmul outputs kept, attention recomputed per key-block group in the backward pass
  # (docs/scaling.md: what each costs)
  c.learner.logits_chunk = 1024
  c.learner.remat = "dots"


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
  c.rollout.max_draws = 2      # dynamic sampling: the smoke policy wins nothing to keep
  c.sampler.num_pages = 1024
  c.sampler.kv_dtype = "float32"
  c.sampler.attention = "reference"  # fewest compiled shapes
  if c.learner.row_tokens:   # fixed learner rows sized for 2 short turns
    c.learner.row_tokens, c.learner.microbatch_rows = 512, 2
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
