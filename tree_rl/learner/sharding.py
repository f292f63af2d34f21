"""Device mesh from the config and logical-axis rules for parameters and batches."""

from __future__ import annotations

import os
from typing import Any, Sequence

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P


def maybe_initialize_distributed(mesh_cfg) -> None:
  """`jax.distributed.initialize` from `config.mesh` when `mesh.distributed` is set (once), and
  the watch for a lost process (`tree_rl.hosts.watch_peers`)."""
  if not mesh_cfg.distributed:
    return
  if jax.distributed.is_initialized():
    return
  # CPU devices need a collectives implementation across processes (GPUs and TPUs bring theirs).
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  kwargs = {}
  if mesh_cfg.coordinator_address:
    kwargs["coordinator_address"] = mesh_cfg.coordinator_address
  if mesh_cfg.num_processes > 0:
    kwargs["num_processes"] = mesh_cfg.num_processes
  if mesh_cfg.process_id >= 0:
    kwargs["process_id"] = mesh_cfg.process_id
  kwargs = _detect_unset(kwargs)
  if (kwargs.get("process_id") == 0 and kwargs.get("num_processes", 1) > 1
      and kwargs.get("coordinator_address")):
    # process 0 hosts the coordination service in a child process, so that losing process 0
    # stops the others with a line naming it (tree_rl.coordination)
    from tree_rl import coordination
    service = coordination.start(kwargs["coordinator_address"], kwargs["num_processes"],
                                 recoverable=bool(jax.config.jax_enable_recoverability))
    try:
      with coordination.service_started_by(service):
        jax.distributed.initialize(**kwargs)
    except BaseException:
      service.kill()
      raise
  else:
    jax.distributed.initialize(**kwargs)
  # One collective while every process is here: the CPU collectives' context is set up now,
  # not at a first collective that processes reach far apart (gloo gives up after 30 s).
  from jax.experimental import multihost_utils
  multihost_utils.sync_global_devices("tree_rl: jax.distributed initialized")
  from tree_rl import hosts
  hosts.watch_peers()   # a lost process stops the others with one line naming it


def _detect_unset(kwargs: dict) -> dict:
  """`kwargs` with the coordinator address, process count and id (and local devices) that
  `jax.distributed.initialize` would detect from the cluster (TPU VM, SLURM, ...) filled in,
  as it detects them; what it cannot detect stays unset (initialize then says so)."""
  from jax._src import clusters
  keys = ("coordinator_address", "num_processes", "process_id", "local_device_ids")
  given = [kwargs.get(k) for k in keys]
  if given[-1] is None and os.environ.get("JAX_LOCAL_DEVICE_IDS"):
    given[-1] = [int(i) for i in os.environ["JAX_LOCAL_DEVICE_IDS"].split(",")]
  given[0] = given[0] or os.environ.get("JAX_COORDINATOR_ADDRESS")
  found = clusters.ClusterEnv.auto_detect_unset_distributed_params(*given, None, 300)
  return {k: v for k, v in zip(keys, found) if v is not None}


def resolve_mesh_shape(shape: Sequence[int], num_devices: int) -> tuple[int, ...]:
  """Replace one -1 by whatever makes the product equal `num_devices`."""
  shape = tuple(int(s) for s in shape)
  if shape.count(-1) > 1 or any(s == 0 or s < -1 for s in shape):
    raise ValueError(f"mesh.shape={shape}: use positive sizes and at most one -1")
  known = int(np.prod([s for s in shape if s != -1]))
  if -1 in shape:
    if num_devices % known:
      raise ValueError(f"mesh.shape={shape} does not divide {num_devices} devices")
    shape = tuple(num_devices // known if s == -1 else s for s in shape)
  if int(np.prod(shape)) != num_devices:
    raise ValueError(f"mesh.shape={shape} needs {int(np.prod(shape))} devices, have {num_devices}")
  return shape


def make_mesh(mesh_cfg, devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A mesh over all (global) devices with `mesh.axis_names` and `mesh.shape`."""
  devices = list(devices if devices is not None else jax.devices())
  names = tuple(mesh_cfg.axis_names)
  shape = resolve_mesh_shape(mesh_cfg.shape, len(devices))
  if len(names) != len(shape):
    raise ValueError(f"mesh.axis_names={names} and mesh.shape={shape} differ in length")
  try:  # topology-aware device order on TPU/GPU
    return jax.make_mesh(shape, names, devices=devices,
                         axis_types=(jax.sharding.AxisType.Auto,) * len(names))
  except Exception:  # other topologies: plain order, grouped by process
    arr = np.array(sorted(devices, key=lambda d: (d.process_index, d.id))).reshape(shape)
    return Mesh(arr, names)


def _rules(rules) -> dict[str, tuple[str, ...]]:
  out = {}
  for name, axes in rules:
    if axes is None:
      axes = ()
    elif isinstance(axes, str):
      axes = (axes,)
    out[name] = tuple(axes)
  return out


def logical_to_spec(axes: Sequence[str | None], shape: Sequence[int], rules, mesh: Mesh) -> P:
  """PartitionSpec for one array: each logical axis maps to its rule's mesh axes, dropping mesh
  axes already used or of size 1, and replicating a dim its mesh axes do not divide."""
  table = _rules(rules)
  used: set[str] = set()
  spec = []
  for name, dim in zip(axes, shape):
    mesh_axes = [a for a in table.get(name, ()) if a not in used and mesh.shape[a] > 1]
    size = int(np.prod([mesh.shape[a] for a in mesh_axes])) if mesh_axes else 1
    if not mesh_axes or dim % size:
      spec.append(None)
      continue
    used.update(mesh_axes)
    spec.append(mesh_axes[0] if len(mesh_axes) == 1 else tuple(mesh_axes))
  return P(*spec)


def param_shardings(state: nnx.State, rules, mesh: Mesh) -> Any:
  """NamedShardings for `nnx.to_pure_dict(state)`, from each Param's `axes` metadata."""
  is_var = lambda x: isinstance(x, nnx.Variable)
  variables = jax.tree.leaves(state, is_leaf=is_var)
  pure = nnx.to_pure_dict(state)
  leaves, treedef = jax.tree.flatten(pure)
  out = []
  for var, leaf in zip(variables, leaves):
    axes = getattr(var, "axes", None) or (None,) * leaf.ndim
    out.append(NamedSharding(mesh, logical_to_spec(axes, leaf.shape, rules, mesh)))
  return jax.tree.unflatten(treedef, out)


def batch_spec(rules, mesh: Mesh, ndim: int, batch_size: int) -> P:
  """Leading (batch) dim over the 'batch' rule's mesh axes, the rest replicated."""
  axes = [a for a in _rules(rules).get("batch", ()) if mesh.shape[a] > 1]
  size = int(np.prod([mesh.shape[a] for a in axes])) if axes else 1
  if batch_size % size:
    raise ValueError(f"batch of {batch_size} rows does not split over mesh axes {axes} "
                     f"({size} shards); use a multiple of {size}")
  lead = None if not axes else (axes[0] if len(axes) == 1 else tuple(axes))
  return P(lead, *([None] * (ndim - 1)))
