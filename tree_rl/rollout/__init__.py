"""Tree rollouts: one engine, rollout methods (chain, tree_grpo, patr, tree_random), process
scorers and budget accounting.

    engine = Engine(env, tokenizer, max_turns=..., max_tokens_per_turn=...)
    method = methods.get(config.rollout.method)(config.rollout)
    out, cache = run(engine, method, cache, env_states, key, scorer=scorers.build(config.scorer, env=env))
"""

from tree_rl.rollout import budget, methods, routing, scorers, sequences, tree
from tree_rl.rollout.budget import Budget
from tree_rl.rollout.driver import RolloutOutput, run
from tree_rl.rollout.engine import Engine, Layout, RolloutError
from tree_rl.rollout.tree import Tree
