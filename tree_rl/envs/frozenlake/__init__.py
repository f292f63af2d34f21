"""FrozenLake: a grid walk to the goal around holes, as a token env (rLLM and RAGEN presets).

    dynamics    the pure-JAX lake: map generation, BFS distances, the transition
    text        observations as text and tokens, replies parsed to moves
    env         `FrozenLake`, the token env the engine drives
    maps        the fixed map sets (TFDS `frozen_lake_maps`); json_maps: maps given as JSON
    tasks       the train / held-out task set
    heuristic   the process score (BFS progress); judge: the judge's plan / move prompt
    expert      the warm start's demonstrator (BFS moves); rules: rule baselines
    checks      config checks

Everything the rest of tree_rl needs is named in the one `register` below.
"""

from tree_rl.envs.frozenlake.dynamics import *  # noqa: F401,F403 (the dynamics' public names)
from tree_rl.envs.frozenlake.env import PRESETS, FrozenLake
from tree_rl.envs.registry import register

register("frozenlake", FrozenLake,
         fields=dict(
             goal_hint=False,   # observations also say where the goal is ("Goal: 2 Down, 1 Right.")
             local_view=False,  # observations end with what each move leads onto ("O:Down" ...)
             grid=True,         # observations draw the map as text (off: status, hint, steps and
                                # local view only: short observations over long episodes)
             eval_maps="",      # a JSON file of maps to evaluate on instead of the held-out split
                                # ([{"rows": ["SFFH", ...]}, ...] in gymnasium letters; json_maps)
         ),
         policy_fields=("goal_hint", "local_view", "grid"),
         config_fields=("preset", "goal_hint", "local_view", "grid"),
         tasks="tree_rl.envs.frozenlake.tasks:task_set",
         heuristic="tree_rl.envs.frozenlake.heuristic:progress",
         judge="tree_rl.envs.frozenlake.judge:JUDGE",
         expert="tree_rl.envs.frozenlake.expert:FrozenLakeExpert",
         checks="tree_rl.envs.frozenlake.checks:check")
