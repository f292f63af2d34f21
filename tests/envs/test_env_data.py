"""TFDS builders: build into a temporary dir as array_record, read back with tfds.data_source."""

import sys

import jax
import numpy as np
import pytest

from tree_rl.envs import frozenlake as fl
from tree_rl.envs import toolcall as tc
from tree_rl.envs.frozenlake.maps import FrozenLakeMaps, FrozenLakeMapsConfig, load_frozenlake_maps
from tree_rl.envs.toolcall.kb import generate_kb
from tree_rl.envs.toolcall.qa import ToolcallQa, ToolcallQaConfig, load_kb, scaled_config


def test_frozenlake_maps_build_and_read(tmp_path):
  config = FrozenLakeMapsConfig(name="small", preset="rllm", num_train=40, num_test=8, seed=42)
  builder = FrozenLakeMaps(data_dir=str(tmp_path), config=config)
  builder.download_and_prepare(file_format="array_record")
  assert "tensorflow" not in sys.modules
  env = fl.FrozenLake("rllm")
  states = load_frozenlake_maps(str(tmp_path), "test", env, config="small")
  assert states.tiles.shape == (8, 9, 9)
  # the stored maps are the generator's maps for the same keys
  keys = jax.random.split(jax.random.fold_in(jax.random.key(42), 1), 8)
  tiles, size, start, goal = jax.jit(jax.vmap(lambda k: fl.generate_map(k, env.default_params, 9)))(keys)
  np.testing.assert_array_equal(states.tiles, tiles)
  np.testing.assert_array_equal(states.pos, start)
  d = np.asarray(jax.jit(jax.vmap(fl.distance_to_goal))(states))
  assert np.all((d >= 1) & (d <= 8))
  train = load_frozenlake_maps(str(tmp_path), "train", env, config="small")
  assert train.tiles.shape[0] == 40 and not np.array_equal(train.tiles[:8], states.tiles)
  # a second builder on the same dir reuses the files: same maps across runs
  again = load_frozenlake_maps(str(tmp_path), "test", env, config="small")
  np.testing.assert_array_equal(again.tiles, states.tiles)


def test_toolcall_qa_build_and_read(tmp_path, builtin_tok):
  config = ToolcallQaConfig(name="small", seed=3, num_people=12, num_cities=6, num_countries=3,
                            num_companies=4, num_test=10)
  ToolcallQa(data_dir=str(tmp_path), config=config).download_and_prepare(file_format="array_record")
  assert "tensorflow" not in sys.modules
  kb = load_kb(str(tmp_path), config="small")
  ref = generate_kb(3, 12, 6, 3, 4, 10)
  assert kb.facts == ref.facts and kb.test == ref.test and kb.train == ref.train
  env = tc.ToolCallEnv(builtin_tok, split="test", kb=kb)
  assert env.num_questions == 10


def test_a_scaled_toolcall_kb_has_scale_times_the_entities_and_the_same_held_out_size(tmp_path):
  one, two = scaled_config(5), scaled_config(5, 2)
  assert (one.name, two.name) == ("seed5", "seed5_x2")
  assert (two.num_people, two.num_cities, two.num_countries, two.num_companies, two.num_test) == (
      2 * one.num_people, 2 * one.num_cities, 2 * one.num_countries, 2 * one.num_companies,
      one.num_test)
  ToolcallQa(data_dir=str(tmp_path), config=two).download_and_prepare(file_format="array_record")
  kb, ref = load_kb(str(tmp_path), config="seed5_x2"), generate_kb(5, 120, 60, 20, 40)
  assert kb.facts == ref.facts and kb.train == ref.train and len(kb.test) == 100
  # every relation has one fact per subject entity: twice the entities, twice the facts
  assert len(kb.facts) == 2 * len(generate_kb(5).facts)
  with pytest.raises(ValueError, match="scale must be an integer >= 1"):
    scaled_config(5, 0)


def test_a_job_waits_while_another_prepares_the_data_dir(tmp_path):
  """Two jobs sharing a data directory never prepare one TFDS set at once: while another job
  holds the directory's preparation lock, tasks.build waits and writes nothing; once it is
  released, the build prepares the maps and loads them."""
  import fcntl
  import threading

  from configs import frozenlake
  from tree_rl import tasks
  from tree_rl.models import build_tokenizer

  config = frozenlake.get_config("algo=chain,smoke")
  config.env.data_dir = str(tmp_path)
  built = {}
  with open(tmp_path / ".tree_rl_prepare.lock", "a") as other_job:
    fcntl.flock(other_job, fcntl.LOCK_EX)
    worker = threading.Thread(
        target=lambda: built.update(t=tasks.build(config, build_tokenizer(config.tokenizer))))
    worker.start()
    worker.join(timeout=3.0)
    assert worker.is_alive() and not (tmp_path / "frozen_lake_maps").exists()
    fcntl.flock(other_job, fcntl.LOCK_UN)
  worker.join(timeout=300)
  assert not worker.is_alive()
  assert built["t"].test_states.tiles.shape[0] == int(config.train.num_test_tasks or 100)
