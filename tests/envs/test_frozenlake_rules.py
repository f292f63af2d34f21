"""Rule baselines on FrozenLake: the hint rule walks into a hole the grid shows, the random
rule wins as often as the hand-computed probability, the expert wins every reachable map."""

import jax
import numpy as np
import pytest

from tree_rl.envs.frozenlake.json_maps import parse_maps
from tree_rl.envs import frozenlake as fl
from tree_rl.envs.frozenlake.rules import success


def _states(env, rows_list):
  m = parse_maps([{"rows": r} for r in rows_list], env.max_size)
  return jax.vmap(env.init_state)(m["tiles"], m["nrow"], m["ncol"], m["start"])


def test_the_hint_rule_is_blind_to_holes_and_the_expert_is_not():
  env = fl.FrozenLake("rllm_small", max_turns=6)
  states = _states(env, [["SF", "FG"],            # clear: Down, Right
                         ["SF", "HG"],            # the hint's Down falls in the hole
                         ["SFF", "HFF", "FFG"]])  # Down into the hole again
  key = jax.random.key(0)
  np.testing.assert_array_equal(success(env, states, "hint", key)[:, 0], [True, False, False])
  np.testing.assert_array_equal(success(env, states, "expert", key)[:, 0], [True, True, True])
  # the local rule steps around the hole next to it: Right, Down (and Right, Down, Down)
  np.testing.assert_array_equal(success(env, states, "local", key)[:, 0], [True, True, True])


def test_the_local_rule_sees_only_its_neighbours():
  # Map 1: Down; below is a hole, so Right; Down; Right onto the goal (the hint rule falls in).
  # Map 2: Down, Down, Down along the left column; then the hint's Right is a hole, Down the
  # edge, so Up, and the hint's Down again: it paces until the moves run out. The expert takes
  # the right column around the holes (7 moves).
  env = fl.FrozenLake("rllm_small", max_turns=8)
  states = _states(env, [["SFF", "FFF", "HFG"],
                         ["SFFF", "FHHF", "FFHF", "FHGF"]])
  key = jax.random.key(0)
  np.testing.assert_array_equal(success(env, states, "local", key)[:, 0], [True, False])
  np.testing.assert_array_equal(success(env, states, "expert", key)[:, 0], [True, True])


def test_random_moves_win_as_often_as_computed_by_hand():
  # "SF/HG": from S, Right or Down (the hole), 1/2 each; from the top right, Left or Down (the
  # goal), 1/2 each. Right, Down wins: 1/4; within 3 turns nothing else does (Right, Left, Right
  # ends one move short), so the rate at a 3-turn limit is 1/4.
  env = fl.FrozenLake("rllm_small", max_turns=3)
  won = success(env, _states(env, [["SF", "HG"]]), "random", jax.random.key(1), episodes=4000)
  assert won.shape == (1, 4000)
  assert abs(won.mean() - 0.25) < 0.025, won.mean()
  # a corridor: every move that stays on the map leads on or back; "SG" wins in one move
  env1 = fl.FrozenLake("rllm_small", max_turns=1)
  assert success(env1, _states(env1, [["SG"]]), "random", jax.random.key(2), episodes=64).all()


def test_an_unknown_rule_is_refused():
  env = fl.FrozenLake("rllm_small")
  with pytest.raises(ValueError, match="unknown rule 'greedy'"):
    success(env, _states(env, [["SG"]]), "greedy", jax.random.key(0))


def test_the_baselines_command_reports_each_rule_per_side(tmp_path):
  import json
  import subprocess
  import sys
  from pathlib import Path
  maps = [["SF", "FG"], ["SF", "HG"], ["SFF", "HFF", "FFG"], ["SFF", "FFF", "FFG"]]
  (tmp_path / "maps.json").write_text(json.dumps([{"rows": r} for r in maps]))
  proc = subprocess.run(
      [sys.executable, "-m", "experiments.rule_baselines", f"--maps={tmp_path / 'maps.json'}",
       f"--config.env.data_dir={tmp_path / 'tfds'}", "--config.train.num_train_tasks=8",
       "--config.train.num_test_tasks=8"],
      cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-2000:]
  rows = {r["rule"]: r for r in map(json.loads, (line for line in proc.stdout.splitlines()
                                                  if line.startswith("{")))}
  # hint: wins the clear maps (one of each side), falls in the holes of the others
  assert rows["hint"]["maps"] == 4 and rows["hint"]["success"] == 0.5
  assert rows["hint"]["success/side_2"] == 0.5 and rows["hint"]["success/side_3"] == 0.5
  assert rows["expert"]["success"] == 1.0 and rows["random"]["episodes_per_map"] == 8


def test_outcomes_are_tallied_per_mode_side_turn_and_first_view():
  """`experiments.frozenlake_outcomes.tally` on hand-built episodes: map 0 (side 2) has the hint
  move into a hole and the next one safe ("O_"), map 1 (side 3) the hint move safe and the next
  one a hole ("_O")."""
  import types
  from experiments.frozenlake_outcomes import tally
  env = fl.FrozenLake("rllm_small")
  start = _states(env, [["SF", "HG"], ["SHF", "FFF", "FFG"]])
  # map 0 "SF/HG": the goal is Down-Right (Down listed first), Down is the hole; map 1: Down
  # safe, Right a hole
  # columns [prompt, leaf]: leaf 0 greedy, leaves 1-2 sampled
  final = types.SimpleNamespace(
      won=np.array([[0, 1, 0], [1, 0, 0]], bool), fell=np.array([[1, 0, 0], [0, 1, 0]], bool),
      steps=np.array([[1, 2, 8], [4, 2, 3]]), turns=np.array([[1, 2, 8], [4, 2, 10]]))
  e = {"final": final, "valid": np.array([[1, 1, 1], [1, 1, 0]], bool),
       "greedy": np.array([[1, 0, 0], [1, 0, 0]], bool)}
  out = tally(e, start, np.array([2, 3]), max_steps=8, max_turns=10)
  assert out["outcomes"]["greedy"] == {"all/fell": 1, "all/won": 1, "side_2/fell": 1,
                                       "side_3/won": 1}
  assert out["outcomes"]["sampled"] == {"all/fell": 1, "all/out_of_moves": 1, "all/won": 1,
                                        "side_2/out_of_moves": 1, "side_2/won": 1,
                                        "side_3/fell": 1}   # [1, 2] is not valid: left out
  assert out["falls_by_turn"] == {"greedy": {1: 1}, "sampled": {2: 1}}
  assert out["greedy_first_move_falls_by_view"] == {"O_": 1}
  assert out["maps_by_view"] == {"O_": 1, "_O": 1}
