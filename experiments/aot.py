"""Compile one RL step of a config for a TPU topology (or N virtual CPUs) without the hardware.

    python -m experiments.aot --config=configs/frozenlake.py:algo=patr,model=qwen2.5-0.5b \\
        --topology=v5e-8
    python -m experiments.aot --config=configs/toolcall.py:algo=tree_grpo,model=qwen2.5-7b \\
        --topology=v5p-8 --phases=learner --config.mesh.shape='(1,4,1)'

Prints one JSON line per program, a summary line (`"kind": "summary"`: fits, hbm_peak_gib,
learner_flops_ratio, decode_bytes_ratio, step_estimate_s, ...) and a table. TPU topologies need
the compiler: pip install -e '.[aot]'. The default backend stays the CPU.
"""

import os
import sys


def _early_environment(argv):
  """Before JAX starts: N host devices for `cpu-N`, libtpu's variables for a TPU slice."""
  topo = next((a.split("=", 1)[1] for a in argv if a.startswith("--topology=")), "v5e-8")
  from tree_rl.aot import chips, topology
  if topo.startswith(("h100-", "h200-")):
    return   # this host's GPUs: the CUDA backend, no libtpu
  if topo.startswith("cpu-"):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               f" --xla_force_host_platform_device_count={topo[4:]}").strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
  else:
    try:
      topology.quiet_libtpu(chips.topology(topo))
    except KeyError:
      topology.quiet_libtpu()


_early_environment(sys.argv)

import json  # noqa: E402

from absl import app, flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from tree_rl.config import exit_on_bad_input, parse_flags_or_exit  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", "configs/frozenlake.py", "Experiment config file.")
_TOPOLOGY = flags.DEFINE_string("topology", "v5e-8", "v5e-8, v5e-16, v5e-256, v5p-8, v5p-64, "
                                "v6e-8, v4-8, ..., a libtpu name (v5e:2x2) or cpu-N.")
_PHASES = flags.DEFINE_list("phases", ["rollout", "learner", "eval"],
                            "Which programs to compile: rollout, learner, eval.")
_ONLY = flags.DEFINE_string("only", "", "Compile only programs whose name contains this.")
_COMPARISONS = flags.DEFINE_bool("comparisons", True, "Also compile the paths printed for "
                                 "comparison only (0 calls per step: the gathered decode window "
                                 "beside the window kernel, the block-sparse learner attention "
                                 "beside the flash kernel).")


def main(argv):
  del argv
  from tree_rl.aot import analysis, chips, programs, step, topology
  topo = chips.topology(_TOPOLOGY.value)
  devices = topology.devices(topo)
  config = _CONFIG.value
  sp = programs.StepPrograms(config, devices, comparisons=_COMPARISONS.value)
  try:
    todo = [p for p in sp.programs(tuple(_PHASES.value)) if _ONLY.value in p.name]
    results = []
    for p in todo:
      r = analysis.compile_program(p)
      results.append(r)
      print(json.dumps(r.record(topo)), flush=True)
    resident = programs.resident_bytes(sp)
    s = sp.shape
    rollout_tokens = s.prompts * s.rollouts * s.trajectories * s.turns * s.max_new
    line = step.summary(results, topo, config.model.preset, resident, rollout_tokens)
    line["config"] = {"method": config.rollout.method, "prompts": s.prompts * s.rollouts,
                      "prompts_per_rollout": s.prompts,
                      "turns": s.turns, "max_new": s.max_new,
                      "trajectories_per_prompt": s.trajectories,
                      "trajectory_tokens": s.trajectory_tokens,
                      "mesh": dict(sp.train_step.mesh.shape),
                      "rollout_mesh": dict(sp.rollout_mesh.shape)}
    print(json.dumps(line), flush=True)
    print(step.table(results, topo, resident))
  finally:
    sp.close()


if __name__ == "__main__":
  app.run(exit_on_bad_input(main), flags_parser=parse_flags_or_exit)
