#!/usr/bin/env bash
#SBATCH --job-name=tree_rl
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --time=24:00:00
# Run experiments.train as one process per GPU host of a Slurm job (each process drives all the
# GPUs of its node: its share of every step's prompts rolled out over them, sampler.data_shards=0);
# every argument passes through to experiments.train. Submit from the
# repository root (the job runs there; relative --workdir paths are relative to it):
#
#   sbatch --nodes=2 launch/slurm_gpu.sh --config=configs/frozenlake.py:algo=patr --workdir=runs/fl
#   launch/slurm_gpu.sh --config=...      # outside a job: submits itself with sbatch
#
# Inside the job: the coordinator is the first host of the allocation
# (`scontrol show hostnames $SLURM_JOB_NODELIST | head -1`), and every task gets
# --config.mesh.distributed=true --config.mesh.coordinator_address=HOST:PORT
# --config.mesh.num_processes=$SLURM_NTASKS --config.mesh.process_id=$SLURM_PROCID.
# The #SBATCH lines above are defaults; sbatch options on the command line win.
# Environment:
#   PYTHON            interpreter on the nodes (default: the repo's .venv/bin/python if present, else python3)
#   COORDINATOR_PORT  port of process 0 (default 20000 + SLURM_JOB_ID % 20000)
#   SRUN_ARGS         more srun options, e.g. "--cpu-bind=none"
#   DRY_RUN=1         print the sbatch / srun command instead of running it
#   SLURM_*           set by Slurm inside the job (SLURM_JOB_ID, SLURM_JOB_NODELIST, SLURM_NTASKS,
#                     SLURM_SUBMIT_DIR; SLURM_PROCID per task)
set -euo pipefail

die() { echo "error: $*" >&2; exit 1; }
# show: print a command quoted like Python's shlex.join (copy-paste safe).
q() { if [[ $1 =~ ^[A-Za-z0-9@%+=:,./_-]+$ ]]; then printf '%s' "$1"; else printf "'%s'" "${1//\'/\'\"\'\"\'}"; fi; }
show() { local a s=""; for a in "$@"; do s+="${s:+ }$(q "$a")"; done; echo "$s"; }
need() { command -v "$1" >/dev/null 2>&1 || die "$1 not found on PATH ($2)"; }

if [[ -z "${SLURM_JOB_ID:-}" ]]; then
  # Outside a job: submit this script from the repository root.
  ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  cd "$ROOT"
  cmd=(sbatch launch/slurm_gpu.sh "$@")
  if [[ "${DRY_RUN:-0}" == 1 ]]; then show "${cmd[@]}"; exit 0; fi
  need sbatch "submit from a Slurm login node, or run launch/local.sh on one machine"
  exec "${cmd[@]}"
fi

# Inside the job: sbatch runs a copy of this script from the spool, so the repository is the
# submit directory.
ROOT=${SLURM_SUBMIT_DIR:-$PWD}
[[ -f "$ROOT/experiments/train.py" ]] || die "$ROOT is not the tree_rl repository: submit from its root (cd tree_rl && sbatch launch/slurm_gpu.sh ...)"
cd "$ROOT"
[[ -n "${SLURM_JOB_NODELIST:-}" ]] || die "SLURM_JOB_NODELIST is not set (run inside an sbatch job)"
[[ -n "${SLURM_NTASKS:-}" ]] || die "SLURM_NTASKS is not set (run inside an sbatch job)"
need scontrol "the Slurm client tools are needed inside the job"
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
hosts=$(scontrol show hostnames "$SLURM_JOB_NODELIST") || die "scontrol show hostnames $SLURM_JOB_NODELIST failed"
HOST=$(head -1 <<< "$hosts")
[[ -n "$HOST" ]] || die "scontrol show hostnames $SLURM_JOB_NODELIST printed no host"
PORT=${COORDINATOR_PORT:-$((20000 + SLURM_JOB_ID % 20000))}
read -r -a extra <<< "${SRUN_ARGS:-}"
# Each task appends its own SLURM_PROCID: `bash -c` expands it in the task, not here.
cmd=(srun --kill-on-bad-exit=1 "${extra[@]}"
     bash -c 'exec "$@" --config.mesh.process_id="$SLURM_PROCID"' train
     "$PYTHON" -m experiments.train "$@"
     --config.mesh.distributed=true --config.mesh.coordinator_address="$HOST:$PORT"
     --config.mesh.num_processes="$SLURM_NTASKS")
if [[ "${DRY_RUN:-0}" == 1 ]]; then show "${cmd[@]}"; exit 0; fi
need srun "the Slurm client tools are needed inside the job"
command -v "$PYTHON" >/dev/null 2>&1 || die "python interpreter '$PYTHON' not found on ${HOSTNAME:-this node} (set PYTHON=... or create .venv: see README)"
exec "${cmd[@]}"
