"""FrozenLake maps given as JSON in gymnasium's letters, to evaluate on any map set.

    [{"rows": ["SFFH", "FHFG", "FFFH", "HFFF"]}, {"rows": ["SF", "HG"]}]

S start, F frozen, H hole, G goal; a map is a rectangle of at most the env's `max_size` per side
(rows of equal length), with one start, one goal and a path between them that avoids holes.
`read_maps` checks every map and fails on the first bad one with one line naming it;
`load_json_maps` returns the maps as one batched, freshly reset `FrozenLakeState`, like
`load_frozenlake_maps` for a prepared split. Nothing here builds a program but the state's
one batched initialisation.
"""

from __future__ import annotations

import collections
import json

import jax
import numpy as np

from tree_rl.compile_cache import light_jit
from tree_rl.envs.frozenlake.dynamics import FROZEN, GOAL, HOLE, PAD

LETTERS = {"S": FROZEN, "F": FROZEN, "H": HOLE, "G": GOAL}


class MapsFileError(ValueError):
  """A maps file that cannot be read as FrozenLake maps."""


def read_maps(path: str, max_size: int) -> dict[str, np.ndarray]:
  """The maps of JSON file `path` as host arrays: tiles [N, max_size, max_size] int32 (PAD
  outside each map), nrow [N], ncol [N], start [N, 2], goal [N, 2], shortest_path [N] (moves)."""
  try:
    with open(path) as f:
      maps = json.load(f)
  except FileNotFoundError:
    raise MapsFileError(f"maps file {path} not found") from None
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise MapsFileError(f"maps file {path} is not valid JSON ({e})") from None
  return parse_maps(maps, max_size, where=f"maps file {path}")


def parse_maps(maps, max_size: int, where: str = "maps") -> dict[str, np.ndarray]:
  """`read_maps` for an already decoded JSON value (a list of {"rows": [...]})."""
  if not isinstance(maps, list) or not maps:
    raise MapsFileError(f'{where}: expected a non-empty list of {{"rows": [...]}} maps, '
                        f"got {type(maps).__name__}" + (" (empty)" if maps == [] else ""))
  out = collections.defaultdict(list)
  for i, m in enumerate(maps):
    grid, start, goal = _grid(m, max_size, f"{where}, map {i}")
    dist = shortest_path(grid, start, goal)
    if dist < 0:
      raise MapsFileError(f"{where}, map {i}: the goal is unreachable from the start "
                          "(every path crosses a hole)")
    tiles = np.full((max_size, max_size), PAD, np.int32)
    tiles[:grid.shape[0], :grid.shape[1]] = grid
    for name, value in (("tiles", tiles), ("nrow", grid.shape[0]), ("ncol", grid.shape[1]),
                        ("start", start), ("goal", goal), ("shortest_path", dist)):
      out[name].append(value)
  return {k: np.asarray(v, np.int32) for k, v in out.items()}


def _grid(m, max_size: int, where: str):
  """(tiles [R, C], start, goal) of one map, checked."""
  if not isinstance(m, dict) or set(m) != {"rows"}:
    keys = sorted(m) if isinstance(m, dict) else type(m).__name__
    raise MapsFileError(f'{where}: expected {{"rows": [...]}} and nothing else, got {keys}')
  rows = m["rows"]
  if (not isinstance(rows, list) or not rows or not all(isinstance(r, str) for r in rows)):
    raise MapsFileError(f"{where}: rows must be a non-empty list of strings, got {rows!r}")
  if len({len(r) for r in rows}) != 1:
    raise MapsFileError(f"{where}: rows differ in length ({[len(r) for r in rows]})")
  nrow, ncol = len(rows), len(rows[0])
  if max(nrow, ncol) > max_size:
    raise MapsFileError(f"{where}: a {nrow}x{ncol} map exceeds this env's largest side "
                        f"{max_size} (config.env.preset)")
  bad = sorted({c for r in rows for c in r} - set(LETTERS))
  if bad:
    raise MapsFileError(f"{where}: unknown letters {bad} (use S start, F frozen, H hole, G goal)")
  found = {c: [(r, col) for r, row in enumerate(rows) for col, x in enumerate(row) if x == c]
           for c in "SG"}
  for c, name in (("S", "start"), ("G", "goal")):
    if len(found[c]) != 1:
      raise MapsFileError(f"{where}: needs exactly one {c} ({name}), found {len(found[c])}")
  grid = np.array([[LETTERS[c] for c in r] for r in rows], np.int32)
  return grid, np.array(found["S"][0], np.int32), np.array(found["G"][0], np.int32)


def shortest_path(grid: np.ndarray, start, goal) -> int:
  """Fewest moves from `start` to `goal` on `grid` [R, C] without entering a hole (breadth-first
  search on the host); -1 when there is no such path."""
  nrow, ncol = grid.shape
  dist = {tuple(start): 0}
  queue = collections.deque([tuple(start)])
  while queue:
    r, c = queue.popleft()
    if (r, c) == tuple(goal):
      return dist[(r, c)]
    for nr, nc in ((r + 1, c), (r - 1, c), (r, c + 1), (r, c - 1)):
      if 0 <= nr < nrow and 0 <= nc < ncol and grid[nr, nc] != HOLE and (nr, nc) not in dist:
        dist[(nr, nc)] = dist[(r, c)] + 1
        queue.append((nr, nc))
  return -1


def rows_of(tiles, nrow: int, ncol: int, start) -> list[str]:
  """A map's gymnasium rows from padded tiles, its shape and start (the inverse of `read_maps`,
  e.g. to hand a prepared split to another framework)."""
  letters = {FROZEN: "F", HOLE: "H", GOAL: "G"}
  rows = [[letters[int(t)] for t in np.asarray(tiles)[r, :ncol]] for r in range(nrow)]
  rows[int(start[0])][int(start[1])] = "S"
  return ["".join(r) for r in rows]


def load_json_maps(path: str, env):
  """The maps of `path` as one batched, freshly reset state of FrozenLake `env`."""
  m = read_maps(path, env.max_size)
  return light_jit(jax.vmap(env.init_state))(m["tiles"], m["nrow"], m["ncol"], m["start"])
