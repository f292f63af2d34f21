"""Guess the number: a secret digit, one guess a turn, answered higher or lower (a device env).

    dynamics    the pure-JAX game
    env         `GuessNumber`, the token env the engine drives (text and reply parsing)
    tasks       the train / held-out episodes
    heuristic   the process score (how far the answers narrowed the secret)

The smallest complete device env: docs/extending.md walks through it.
"""

from tree_rl.envs.registry import register

register("guessnumber", "tree_rl.envs.guessnumber.env:GuessNumber",
         fields=dict(max_secret=9),   # the secret is drawn from 0..max_secret (one digit)
         ranges=dict(max_secret="int [1 9]"),
         config_fields=("preset", "max_secret"),
         tasks="tree_rl.envs.guessnumber.tasks:task_set",
         heuristic="tree_rl.envs.guessnumber.heuristic:narrowed")
