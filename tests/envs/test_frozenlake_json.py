"""FrozenLake maps given as JSON: parsed by hand-checked rules, equal to the prepared split they
were written from, and every malformed file refused with one line naming the map."""

import json

import jax
import numpy as np
import pytest

from tree_rl.envs.frozenlake.maps import FrozenLakeMaps, FrozenLakeMapsConfig, load_frozenlake_maps
from tree_rl.envs.frozenlake.json_maps import (MapsFileError, load_json_maps, parse_maps, read_maps,
                                          rows_of)
from tree_rl.envs import frozenlake as fl

F, H, G, X = fl.FROZEN, fl.HOLE, fl.GOAL, fl.PAD


def test_maps_parse_into_padded_tiles_with_start_goal_and_shortest_path():
  m = parse_maps([{"rows": ["SFFH", "FHFG", "FFFH", "HFFF"]}, {"rows": ["SFH", "HFG"]}], 5)
  want0 = [[F, F, F, H, X], [F, H, F, G, X], [F, F, F, H, X], [H, F, F, F, X], [X] * 5]
  want1 = [[F, F, H, X, X], [H, F, G, X, X]] + [[X] * 5] * 3
  np.testing.assert_array_equal(m["tiles"], [want0, want1])
  np.testing.assert_array_equal(m["nrow"], [4, 2])
  np.testing.assert_array_equal(m["ncol"], [4, 3])
  np.testing.assert_array_equal(m["start"], [[0, 0], [0, 0]])
  np.testing.assert_array_equal(m["goal"], [[1, 3], [1, 2]])
  # by hand: right, right, down, right (4); right, down, right (3)
  np.testing.assert_array_equal(m["shortest_path"], [4, 3])


def test_a_prepared_split_written_as_json_loads_as_the_same_states(tmp_path):
  config = FrozenLakeMapsConfig(name="json", preset="rllm_small", num_train=8, num_test=24, seed=3)
  FrozenLakeMaps(data_dir=str(tmp_path), config=config).download_and_prepare(
      file_format="array_record")
  env = fl.FrozenLake("rllm_small")
  split = load_frozenlake_maps(str(tmp_path), "test", env, config="json")
  maps = [{"rows": rows_of(t, int(n), int(c), s)}
          for t, n, c, s in zip(split.tiles, split.nrow, split.ncol, split.start)]
  path = tmp_path / "maps.json"
  path.write_text(json.dumps(maps))
  got = load_json_maps(str(path), env)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(split)):
    np.testing.assert_array_equal(a, b)
  # the host search agrees with the env's own (jitted, bitmask) breadth-first search
  dist = np.asarray(jax.jit(jax.vmap(fl.distance_to_goal))(split))
  np.testing.assert_array_equal(read_maps(str(path), env.max_size)["shortest_path"], dist)


@pytest.mark.parametrize("maps, message", [
    ([], "expected a non-empty list"),
    ({"rows": ["SG"]}, "expected a non-empty list"),
    ([{"rows": ["SG"]}, {"grid": ["SG"]}], r"map 1: expected \{\"rows\": \[\.\.\.\]\} and nothing else"),
    ([{"rows": ["SG"], "name": "x"}], r"map 0: expected .* and nothing else, got \['name', 'rows'\]"),
    ([{"rows": []}], "map 0: rows must be a non-empty list of strings"),
    ([{"rows": ["SFF", "FG"]}], r"map 0: rows differ in length \(\[3, 2\]\)"),
    ([{"rows": ["SFX", "FFG"]}], r"map 0: unknown letters \['X'\]"),
    ([{"rows": ["sfg"]}], "unknown letters"),
    ([{"rows": ["SFS", "FFG"]}], r"map 0: needs exactly one S \(start\), found 2"),
    ([{"rows": ["SFF", "FFF"]}], r"map 0: needs exactly one G \(goal\), found 0"),
    ([{"rows": ["SFFFFF", "FFFFFG"]}], "map 0: a 2x6 map exceeds this env's largest side 5"),
    ([{"rows": ["SH", "HG"]}], "map 0: the goal is unreachable from the start"),
])
def test_malformed_maps_are_refused_with_one_line_naming_the_map(maps, message):
  with pytest.raises(MapsFileError, match=message) as e:
    parse_maps(maps, 5)
  assert "\n" not in str(e.value)


def test_unreadable_files_are_refused(tmp_path):
  with pytest.raises(MapsFileError, match="not found"):
    read_maps(str(tmp_path / "missing.json"), 5)
  bad = tmp_path / "bad.json"
  bad.write_text('[{"rows": ["SG"]}')
  with pytest.raises(MapsFileError, match="is not valid JSON"):
    read_maps(str(bad), 5)
