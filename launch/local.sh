#!/usr/bin/env bash
# Run experiments.train on this machine (CPU, the local GPUs or the local TPU chips; rollouts
# and the learner shard over all local devices by default); every argument passes through:
#
#   launch/local.sh --config=configs/frozenlake.py:algo=patr --workdir=runs/fl --config.seed=1
#
# Runs from the repository root (relative --workdir paths are relative to it).
# Environment:
#   PYTHON                  interpreter (default: the repo's .venv/bin/python if present, else python3)
#   DRY_RUN=1               print the command instead of running it
#   CUDA_VISIBLE_DEVICES    GPUs this run may use (launch/sweep.py --per-accelerator sets one per run)
#   JAX_PLATFORMS           e.g. cpu to stay on the CPU with accelerators present
#   XLA_FLAGS               e.g. --xla_force_host_platform_device_count=8 (8 CPU devices for a mesh)
#   XLA_PYTHON_CLIENT_MEM_FRACTION / XLA_PYTHON_CLIENT_PREALLOCATE   GPU memory JAX takes up front
set -euo pipefail

die() { echo "error: $*" >&2; exit 1; }
# show: print a command quoted like Python's shlex.join (copy-paste safe).
q() { if [[ $1 =~ ^[A-Za-z0-9@%+=:,./_-]+$ ]]; then printf '%s' "$1"; else printf "'%s'" "${1//\'/\'\"\'\"\'}"; fi; }
show() { local a s=""; for a in "$@"; do s+="${s:+ }$(q "$a")"; done; echo "$s"; }

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
cmd=("$PYTHON" -m experiments.train "$@")
if [[ "${DRY_RUN:-0}" == 1 ]]; then
  show "${cmd[@]}"
  exit 0
fi
command -v "$PYTHON" >/dev/null 2>&1 || die "python interpreter '$PYTHON' not found (set PYTHON=... or create .venv: see README)"
exec "${cmd[@]}"
