"""FrozenLake (rLLM rules, not slippery): tree rollouts for a pretrained or a from-scratch policy.

`model=hf` (a local Qwen-style checkpoint, `hf_path=...`) is the papers' setting: rLLM maps of
side 2..9 (`env.preset=rllm`), no goal hint, PATR's table (B0=4, M=2, K=5, 10 turns, alpha 0.5,
Theta 6, lr 1e-6, clip 0.28, KL 0.001, temperature 1, 64 prompts x 400 steps), 512 tokens per
turn; `model=qwen2.5-0.5b|qwen2.5-3b` is the same setting at PATR's model shapes with random
weights (what `experiments.aot` compiles for a TPU slice). `model=tiny|small` (from scratch, warm-started on expert demos) is scaled for a 2-core CPU:
maps of side 2..5 (`env.preset=rllm_small`) and observations that also name the goal's offset
(`env.goal_hint`: the 0.46M-parameter tiny model does not learn to locate the goal in the grid
text within CPU budgets; with the hint it learns to move towards it in ~300 SFT steps).

Run:
  python -m experiments.train --config=configs/frozenlake.py:algo=patr,model=tiny --workdir=runs/fl
The reproduction's testbed (`testbed`: observations that also list each move's cell, a longer
warm start and 200 RL steps; docs/measurements.md, "testbed"):
  python -m experiments.train --config=configs/frozenlake.py:algo=chain,testbed --workdir=runs/tb
The long-horizon testbed (`testbed_long`: maps of side 5..7 with a path of 4..16 moves, 16
turns, observations without the grid, PATR scoring every 4 turns):
  python -m experiments.train --config=configs/frozenlake.py:algo=patr,testbed_long --workdir=runs/tl
Smoke (a minute or two on a CPU):
  python -m experiments.train --config=configs/frozenlake.py:algo=tree_grpo,smoke --workdir=runs/fl_smoke
algo: a name in `tree_rl.algorithms` (grpo, tree_grpo, patr, ...);  model: tiny | small | hf (with hf_path=...)
| qwen2.5-0.5b | qwen2.5-1.5b | qwen2.5-3b | qwen2.5-7b | qwen3-4b.
Any field can be overridden, e.g. --config.rollout.temperature=0.7
"""

from configs.common import apply_algo, apply_model, apply_smoke, paper_learner, paper_scale
from tree_rl.config import base_config, lock, parse_arg


def get_config(arg=None):
  args = parse_arg(arg, algo="patr", model="tiny", hf_path="", smoke=False, testbed=False,
                   testbed_long=False)
  c = base_config()
  c.env.name = "frozenlake"
  # PATR's FrozenLake rollout: B0=4 branches, M=2 children, scored every K=5 steps, 10 turns;
  # the GRPO baseline samples 8 per prompt.
  c.rollout.max_turns = 10
  c.rollout.initial_branches, c.rollout.expand_children, c.rollout.score_every = 4, 2, 5
  c.rollout.prune_alpha, c.rollout.prune_repeat = 0.5, 6
  c.rollout.group_size = 8
  apply_model(c, args.model, args.hf_path)
  if paper_scale(args.model):
    c.env.preset, c.env.goal_hint = "rllm", False   # the papers' maps; the agent reads the grid
    paper_learner(c, 345 + 10 * (512 + 272))   # prompt + 10 turns of reply and observation
    # PATR's schedule (B0=4, top-2 expanded into M=2 at turn 5 of 10) starts 6 branches: a cap
    # of 8 never binds, and the KV pool sized for 8 live branches instead of 16 fits a v5e chip
    c.rollout.max_branches = 8
  else:
    _cpu_scale(c)
    if args.testbed_long:
      _testbed_long(c)
    elif args.testbed:
      _testbed(c)
    elif not args.smoke and args.model == "tiny":
      _main_job(c)
  apply_algo(c, args.algo)
  if args.smoke:
    apply_smoke(c)
  return lock(c)


def _cpu_scale(c):
  """The from-scratch policy on a 2-core CPU (docs/measurements.md measures each choice)."""
  c.env.preset, c.env.goal_hint = "rllm_small", True
  # The tiny from-scratch policy replies with one move word: 16 tokens per turn is ample.
  c.rollout.max_tokens_per_turn = 16
  # The papers: batch 64, 400 steps; here 8 prompts x 16 steps, PATR with a cap of 8 branches,
  # eval on the 100 held-out maps every 8 steps.
  c.rollout.prompts_per_step = 8
  c.rollout.max_branches = 8
  c.sampler.num_pages = 8192
  c.sampler.attention = "reference"   # fewest compiled shapes on CPU; "auto" on accelerators
  # float32 KV: XLA's CPU backend converts a bfloat16 pool to float32 and back around every
  # write (the whole pool, each prefill and decode); accelerators write bfloat16 natively.
  c.sampler.kv_dtype = "float32"
  # Observations of these maps (with the hint) are 51 tokens on average and at most 88 (capacity
  # 118): 88-token chunks prefill every one in one call. Held-out eval prefill: 97,948 executed
  # tokens for 40,121 real and 2.5-2.6 s, against 106,140 and 2.7 s with 80-token chunks (a
  # second call for the few longer ones); 64-token chunks and the whole capacity were slower.
  c.sampler.obs_chunk = 88
  # Fixed-shape learner micro-batches of 4 rows x 1536 tokens (the longest trajectory these maps
  # allow), tree-packed (each node once, block-sparse ancestor attention): executed tokens below
  # the per-leaf ones, memory bounded by the micro-batch, one shape every step. Measured against
  # root-to-leaf rows (packed=False) in docs/measurements.md: 3.3 s vs 5.7 s per steady step.
  c.learner.packed = True
  c.learner.row_tokens, c.learner.microbatch_rows, c.learner.microbatches = 1536, 4, 1
  # Warm start: imitate an expert that plays a random move 20% of the time (the noisy moves are
  # trained on too), and stop once the greedy policy wins half of 256 train maps in two checks
  # running (on average). The result plays the right move most often but samples many wrong
  # ones: it completes episodes, is far from solved, and RL has room to sharpen it. SFT lr 1e-3
  # and checks on 256 maps are the testbed's lessons: at 3e-3 checks swing, and a check on 64
  # maps (sd about 0.055) stops on a lucky spike.
  c.warmstart.epsilon = 0.2
  c.warmstart.loss_on_noise = True
  c.warmstart.steps = 600             # at most; the goal hint is picked up after ~200-300 steps
  c.warmstart.learning_rate = 1e-3
  c.warmstart.target_success = 0.5
  c.warmstart.eval_prompts = 256
  c.warmstart.stop_window = 2
  c.warmstart.eval_every = 50
  c.train.num_steps = 16
  c.train.eval_every = 8
  c.train.eval_prompts = 100
  c.train.eval_samples = 2
  c.checkpoint.every_steps = 4


def _main_job(c):
  """The main job (docs/measurements.md, "the main job across RL seeds", measures these choices)."""
  # RL starts from the shipped warm start, the same weights on every machine (the SFT's result
  # depends on the machine's floats); --config.warmstart.from_scratch=true runs the SFT of
  # _cpu_scale instead, `python -m experiments.make_warmstart` regenerates the file.
  c.warmstart.policy = "frozenlake_tiny"
  # 24 RL steps at lr 1e-4, 16 prompts a step in two rollouts of 8 (the KV pool of one), two
  # updates on each step's rollouts. From this warm start, 16 steps at lr 3e-4 cost RL seed 2
  # three points of greedy success (0.75 -> 0.72, also with KL 0.01); at lr 1e-4, 16 steps
  # left seed 7 at +4.5 sampled points, 24 steps gave it +13 (and seed 2 +15.5, greedy kept).
  # 1e-3 halved an earlier policy on some machines.
  c.learner.learning_rate = 1e-4
  c.train.num_steps = 24
  c.rollout.prompts_per_step = 16
  c.rollout.prompts_per_rollout = 8
  c.train.ppo_epochs = 2
  # The shipped policy's SFT checks every 10 steps (stop on the mean of two checks >= 0.5, the
  # best check's params kept): greedy success on train maps jumps from 0.13 to 0.74 within 10
  # steps, so checks every 50 returned a policy whose held-out pass@2 already sat at the hint
  # rule's 0.75 (greedy 0.73, sampled 0.64), which RL could not raise on every seed. The
  # earlier stop keeps the hint-following greedy policy with a noisier sampler (held-out greedy
  # 0.75, sampled 0.52, pass@2 0.66): RL sharpens it.
  c.warmstart.eval_every = 10


def _testbed(c):
  """The CPU testbed for the reproduction: observations also list what each move leads onto
  (`env.local_view`, four 4-token lines that end the message), so the tiny policy can learn to
  step around the hole the hint points into (the hint-following rule wins 75% of the held-out
  maps, a rule reading only the local view 95%); the warm start trains on demos that mostly
  start next to a hole, until its greedy policy wins 80% of the train maps, and RL runs long
  enough for the curves to flatten (docs/measurements.md, "testbed", measures each choice)."""
  c.env.local_view = True
  c.learner.row_tokens = 1824        # the longest trajectory grows by 10 x 16 local-view tokens
  # 4096 demos (each a fresh map): the target is reached 2-4x sooner than with 512. 90% of them
  # start next to a hole, on either side of the hint (53% do as generated): with half of them
  # drawn where the hint's move is the hole, the policy learned "a hole in view: take the second
  # move"; with the natural mix it copies the hint.
  c.warmstart.num_demos = 4096
  c.warmstart.hard_fraction = 0.9
  # The noisy moves are trained on too: the sampled policy then tries the other moves (0.58
  # sampled against 0.75 greedy) and chain GRPO gains 14 sampled points in 60 steps; without
  # them RL only sharpens the greedy policy it starts from.
  c.warmstart.loss_on_noise = True
  # 2000 steps at SFT lr 1e-3 (cosine): at the default 3e-3 a seed's checks fell from 0.80 to
  # 0.61 (the hint rule's score) as training went on, and at 1000 steps some seeds never met the
  # target; at 1e-3 they rose steadily (docs/measurements.md, "testbed, 200 RL steps")
  c.warmstart.steps = 2000
  c.warmstart.learning_rate = 1e-3
  # checks on 256 train maps: on 64 (sd of a check about 0.055) a seed stopped at step 250 on a
  # lucky 0.81 with a policy at the hint rule's level (0.73 held-out), and RL then converged to
  # the hint rule
  c.warmstart.eval_prompts = 256
  c.warmstart.target_success = 0.8
  c.warmstart.eval_every = 250       # a check costs more than 100 SFT steps here
  # a seed whose checks never met the target (seed 0: 0.73-0.76 to step 2000, the hint rule's
  # level, 0.75 held-out) starts over from a fresh init; the seeds that meet it are unchanged
  c.warmstart.attempts = 3
  # 1e-3 turned the policy deterministic within 40 steps (sampled = greedy) or unstable
  c.learner.learning_rate = 3e-4
  # sampled success still rose past step 100 on some seeds and flattened by about 160
  c.train.num_steps = 200
  c.train.eval_every = 20
  c.train.eval_samples = 4



def _testbed_long(c):
  """The long-horizon testbed: episodes long enough for PATR's scoring and Tree-GRPO's
  mid-episode expansions to matter, and a warm start with room above it. Maps of side 5..7
  whose shortest safe path takes 4..16 moves (`env.preset=long`, 5.8 on average); on the
  held-out maps the hint rule wins under half and the local-view rule about two thirds
  (`experiments.rule_baselines`; docs/envs.md). The policy reads the hint and the local view,
  not the grid, so observations leave the grid out (45 tokens instead of about 100 on a 7x7).
  Otherwise the testbed's choices (`_testbed`), with the differences below."""
  _testbed(c)
  c.env.preset = "long"
  c.env.grid = False
  c.rollout.max_turns = 16
  # PATR: B0=4 branches, the top 2 expanded into M=2 children at every K=4 turns, at most 8
  c.rollout.initial_branches, c.rollout.expand_children, c.rollout.score_every = 4, 2, 4
  c.rollout.expand_top_k = 2
  c.rollout.max_branches = 8
  # observations are at most 45 tokens (one chunk); the longest trajectory the learner sizes
  # for (16 tokens a reply, observations at their 59-token capacity) is 1332 tokens
  c.sampler.obs_chunk = 48
  c.learner.row_tokens = 1344
  # the warm start stops early, on the first check (every 25 steps) at 0.55 greedy on train
  # maps. One check, not two running: on 256 maps a check's sd is about 0.03, so one check 4 sd
  # above the hint rule's plateau reads the params it checks, not luck. The replies of turns
  # taken next to a hole weigh 3 (half of a demo's turns; the hint's move is a hole on 16%):
  # with weight 1 the policy copies the hint (checks at 0.36-0.45, the hint rule's level, to
  # SFT step 550 on seed 1 and 400 on seed 3; seeds 0 and 2 left it at steps 300), with weight 3
  # seed 1 met the target at step 100 (docs/measurements.md)
  c.warmstart.max_len = 768          # a demo: the prompt and up to 16 turns of 47 tokens
  c.warmstart.hard_turn_weight = 3.0
  c.warmstart.target_success = 0.55
  c.warmstart.stop_window = 1
  c.warmstart.eval_every = 25
  c.warmstart.attempts = 2
  c.train.num_steps = 120
