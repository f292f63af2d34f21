"""One stepping interface for device and host environments (chosen once, by `stepper_for`).

The engine's turn calls the same hooks for every env, in this order:

    handles, states, toks, lens = stepper.start(env_states, layout)   # roots' episodes
    tree = stepper.place(tree, handles)                 # the roots' states name their handles
    rows = stepper.fork(handles, plan, drop)            # where the children's KV pages fork
    hosted = stepper.act(handles, rows, decoded)        # after the decode, before the commit
    step = stepper.step(key, parents, plan, prompt_ids, toks, lens, hosted)   # in the commit's jit
    stepper.release(handles, flat_mask); stepper.close(handles)

A device env (`TokenEnv`) steps in `step`, on device; its hooks on handles do nothing (it has
none: `handles` is None). A host env (`HostEnv`) keeps a handle per node (`HostNodes`): it is
forked, stepped on the host in `act` and released at those points, and `step` only turns the
host's results into device states.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from tree_rl.compile_cache import to_device
from tree_rl.envs.base import pytree_hash
from tree_rl.envs.host import is_host_env
from tree_rl.rollout.host_nodes import HostNodes
from tree_rl.rollout.rows import node_keys


@struct.dataclass
class EnvStep:
  """A turn's env results on the plan's rows [W, ...]."""

  state: object          # env states of the children
  reward: jax.Array      # float [W]
  done: jax.Array        # bool [W]
  obs: jax.Array         # int32 [W, obs_capacity] observation tokens
  obs_len: jax.Array     # int32 [W]
  action: jax.Array      # int32 [W] action hash (equal actions hash equal)
  tool_calls: jax.Array  # int32 [W]


class EnvStepper:
  """A device env (`TokenEnv`): stepped on device inside the commit; no handles."""

  can_warm_up = True   # a warm-up turn leaves nothing behind

  def __init__(self, env, params, eot: int):
    self.env, self.params, self.eot = env, params, int(eot)
    state, _ = jax.eval_shape(lambda: env.reset(jax.random.key(0), params))
    self.state_example = state   # shapes and dtypes
    ptok, _ = jax.eval_shape(lambda s: env.initial_prompt_tokens(s, params), state)
    otok, _ = jax.eval_shape(lambda s: env.observation_tokens(s, True, params), state)
    self.prompt_capacity, self.obs_capacity = ptok.shape[0], otok.shape[0]

  def start(self, env_states, layout):
    """-> (handles, env states, prompt tokens, lengths); tokens None: rendered on device."""
    del layout
    return None, env_states, None, None

  def place(self, tree, handles):
    del handles
    return tree

  def fork(self, handles, plan, drop):
    del handles, plan, drop

  def act(self, handles, rows, out):
    del handles, rows, out

  def release(self, handles, flat) -> None:
    del handles, flat

  def close(self, handles) -> None:
    del handles

  def step(self, key, parents, plan, prompt_ids, toks, lens, hosted) -> EnvStep:
    """Parse each reply, step its parent's state and render the observation (jittable)."""
    del hosted
    env, params = self.env, self.params
    last = jnp.take_along_axis(toks, jnp.maximum(lens - 1, 0)[:, None], axis=1)[:, 0]
    closed = (lens > 0) & (last == self.eot)
    action = jax.vmap(env.parse_action)(toks, lens)
    keys = node_keys(key, prompt_ids, plan.child)
    state, _, reward, done, _ = jax.vmap(lambda k, s, a: env.step(k, s, a, params))(
        keys, parents, action)
    obs, obs_len = jax.vmap(lambda s, c: env.observation_tokens(s, c, params))(state, closed)
    return EnvStep(state=state, reward=reward, done=done, obs=obs, obs_len=obs_len,
                   action=jax.vmap(pytree_hash)(action),
                   tool_calls=jnp.asarray(jax.vmap(env.tool_calls)(parents, state), jnp.int32))


class HostEnvStepper(EnvStepper):
  """A host env (`HostEnv`): a handle per node, forked, stepped and released on the host at the
  turn boundary (`HostNodes`); `step` writes the host's results as device states."""

  can_warm_up = False   # a turn acts on real workspaces: the first real turns build the programs

  def __init__(self, env, params, eot: int):
    self.env, self.params, self.eot = env, params, int(eot)
    self.state_example = env.state_example()
    self.prompt_capacity, self.obs_capacity = int(env.prompt_capacity), int(env.obs_capacity)

  def start(self, env_states, layout):
    tasks = np.asarray(jax.device_get(env_states.task))
    handles, toks, lens, keys = HostNodes.start(self.env, tasks, layout.capacity,
                                                layout.num_trees)
    return handles, env_states.replace(key=to_device(keys)), toks, lens

  def place(self, tree, handles):
    return tree.replace(env_state=tree.env_state.replace(
        handle=to_device(handles.handles, np.int32)))

  def fork(self, handles, plan, drop):
    return handles.fork(plan, drop)

  def act(self, handles, rows, out):
    return handles.step(rows, out, self.eot, self.obs_capacity)

  def release(self, handles, flat) -> None:
    handles.release(np.asarray(jax.device_get(flat)).reshape(handles.handles.shape))

  def close(self, handles) -> None:
    handles.close()

  def step(self, key, parents, plan, prompt_ids, toks, lens, hosted) -> EnvStep:
    del key, plan, prompt_ids, toks, lens
    return EnvStep(state=self.env.child_state(parents, hosted), reward=hosted.reward,
                   done=hosted.done, obs=hosted.obs, obs_len=hosted.obs_len,
                   action=hosted.action, tool_calls=hosted.tool_calls)


def stepper_for(env, params, eot: int) -> EnvStepper:
  """The stepper of `env` (a `TokenEnv` or a `HostEnv`) under `params`."""
  return (HostEnvStepper if is_host_env(env) else EnvStepper)(env, params, eot)
