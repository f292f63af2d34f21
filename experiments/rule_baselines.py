"""Rule baselines on a config's FrozenLake evaluation maps, overall and per map side.

    python -m experiments.rule_baselines --config=configs/frozenlake.py
    python -m experiments.rule_baselines --config=configs/frozenlake.py --maps=maps.json --episodes=16

Rules (`tree_rl.envs.frozenlake.rules`): `hint` plays the goal hint's first direction word,
`random` a random move that stays on the map (both blind to holes), `expert` the shortest safe
path. A learned policy that reads the grid has to beat the first two on every side. Prints one
JSON line per rule (success rate overall and per side, over `--episodes` episodes per map for
the random rule) and a table.
"""

import json

from absl import app, flags
from ml_collections import config_flags

from tree_rl.config import exit_on_bad_input, parse_flags_or_exit

_CONFIG = config_flags.DEFINE_config_file("config", "configs/frozenlake.py", "Experiment config file.")
_MAPS = flags.DEFINE_string("maps", "", "A JSON file of maps instead of the held-out split "
                            "(config.env.eval_maps).")
_EPISODES = flags.DEFINE_integer("episodes", 8, "Episodes per map of the random rule.")
_SEED = flags.DEFINE_integer("seed", 0, "Key of the random rule.")


def main(argv):
  del argv
  import jax
  import numpy as np

  from tree_rl import tasks
  from tree_rl.envs.frozenlake.rules import RULES, success
  from tree_rl.models import build_tokenizer
  from tree_rl.validation import validate

  config = _CONFIG.value
  if _MAPS.value:
    config.env.eval_maps = _MAPS.value
  validate(config)
  task_set = tasks.build(config, build_tokenizer(config.tokenizer, config.model.hf_path))
  env, states = task_set.test_env, task_set.test_states
  name, labels = env.eval_groups(states)
  rows = []
  for rule in RULES:
    won = success(env, states, rule, jax.random.key(_SEED.value),
                  _EPISODES.value if rule == "random" else 1)
    row = {"rule": rule, "maps": int(won.shape[0]), "episodes_per_map": int(won.shape[1]),
           "success": float(won.mean())}
    row.update({f"success/{name}_{g}": float(won[labels == g].mean()) for g in np.unique(labels)})
    rows.append(row)
    print(json.dumps(row), flush=True)
  groups = [k for k in rows[0] if k.startswith("success/")]
  print(f"{'rule':<8}{'all':>7}" + "".join(f"{k.split('/')[1]:>9}" for k in groups))
  for r in rows:
    print(f"{r['rule']:<8}{r['success']:>7.3f}" + "".join(f"{r[k]:>9.3f}" for k in groups))
  print(f"maps per {name}: " + ", ".join(f"{g}: {int((labels == g).sum())}" for g in np.unique(labels)))


if __name__ == "__main__":
  app.run(exit_on_bad_input(main), flags_parser=parse_flags_or_exit)
