#!/usr/bin/env bash
# Run experiments.train on every worker of a Cloud TPU VM slice (multi-host: each worker runs
# one process, `--config.mesh.distributed=true` makes train call jax.distributed.initialize,
# which finds the other workers itself). Each worker rolls out its share of every step's prompts
# over all its chips (sampler.data_shards=0) and the learner shards the global batch over the
# slice. Every argument passes through to experiments.train:
#
#   TPU_NAME=rl-v4 ZONE=us-central2-b ACCELERATOR_TYPE=v4-16 \
#     launch/tpu_pod.sh --config=configs/frozenlake.py:algo=patr --workdir=runs/fl
#
# Steps: reuse the slice if `describe` finds it, else create it; copy this checkout to every
# worker (scp of the tracked and untracked-not-ignored files, or a git clone); make a venv there
# and `pip install -e '.[tpu]'`; run the command on all workers (output streams back).
# Environment:
#   TPU_NAME           slice name (required)
#   ZONE               zone (required)
#   PROJECT            GCP project (default: gcloud's configured project)
#   ACCELERATOR_TYPE   for create, e.g. v4-16, v5litepod-16 (default v4-8)
#   RUNTIME_VERSION    TPU VM image for create (default tpu-ubuntu2204-base)
#   CREATE_FLAGS       more `tpu-vm create` flags, e.g. "--spot"
#   CODE               scp (default) | git
#   GIT_URL, GIT_REF   CODE=git: repository the workers clone and the ref they check out (default main)
#   REMOTE_DIR         checkout directory on the workers, relative to home (default tree_rl)
#   REMOTE_PYTHON      interpreter that makes the workers' venv; must be Python 3.11 or 3.12
#                      (setup.py), e.g. python3.11 on images whose python3 is older (default python3)
#   REMOTE_ENV         variables for the run on the workers, e.g. "LIBTPU_INIT_ARGS=... XLA_FLAGS=..."
#   SKIP_SETUP=1       skip the copy and install (the slice already has this code installed)
#   DELETE_AFTER=1     delete the slice when the script ends (also after a failed run)
#   DRY_RUN=1          print the commands instead of running them (gcloud is not called)
# Multi-host runs write checkpoints from every worker: for anything beyond a quick test give a
# --workdir all workers share, e.g. a Filestore/NFS or gcsfuse mount (train writes its workdir
# with plain file operations, so not a gs:// URL).
set -euo pipefail

die() { echo "error: $*" >&2; exit 1; }
# show: print a command quoted like Python's shlex.join (copy-paste safe).
q() { if [[ $1 =~ ^[A-Za-z0-9@%+=:,./_-]+$ ]]; then printf '%s' "$1"; else printf "'%s'" "${1//\'/\'\"\'\"\'}"; fi; }
show() { local a s=""; for a in "$@"; do s+="${s:+ }$(q "$a")"; done; echo "$s"; }
run() { if [[ "$DRY" == 1 ]]; then show "$@"; else "$@"; fi; }

DRY=${DRY_RUN:-0}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
[[ -n "${TPU_NAME:-}" ]] || die "TPU_NAME is not set (the TPU VM slice to create or reuse)"
[[ -n "${ZONE:-}" ]] || die "ZONE is not set (the slice's zone, e.g. us-central2-b)"
[[ $# -gt 0 ]] || die "no experiments.train arguments given (e.g. --config=configs/frozenlake.py --workdir=runs/x)"
if [[ "$DRY" != 1 ]]; then
  command -v gcloud >/dev/null 2>&1 || die "gcloud not found on PATH (install the Google Cloud SDK: https://cloud.google.com/sdk/docs/install)"
fi
ACCELERATOR_TYPE=${ACCELERATOR_TYPE:-v4-8}
RUNTIME_VERSION=${RUNTIME_VERSION:-tpu-ubuntu2204-base}
CODE=${CODE:-scp}
REMOTE_DIR=${REMOTE_DIR:-tree_rl}
REMOTE_PYTHON=${REMOTE_PYTHON:-python3}
LOC=(--zone="$ZONE")
if [[ -n "${PROJECT:-}" ]]; then LOC+=(--project="$PROJECT"); fi
TPU=(gcloud compute tpus tpu-vm)
on_all() { run "${TPU[@]}" ssh "$TPU_NAME" "${LOC[@]}" --worker=all --command="$1"; }

# 1. the slice: reuse or create
describe=("${TPU[@]}" describe "$TPU_NAME" "${LOC[@]}" --format=value\(state\))
read -r -a extra <<< "${CREATE_FLAGS:-}"
create=("${TPU[@]}" create "$TPU_NAME" "${LOC[@]}" --accelerator-type="$ACCELERATOR_TYPE"
        --version="$RUNTIME_VERSION" "${extra[@]}")
if [[ "$DRY" == 1 ]]; then
  echo "$(show "${describe[@]}") || $(show "${create[@]}")"
elif "${describe[@]}" >/dev/null 2>&1; then
  echo "reusing TPU VM $TPU_NAME ($("${describe[@]}"))" >&2
else
  "${create[@]}"
fi
delete=("${TPU[@]}" delete "$TPU_NAME" "${LOC[@]}" --quiet)
if [[ "${DELETE_AFTER:-0}" == 1 && "$DRY" != 1 ]]; then
  trap '"${delete[@]}"' EXIT
fi

# 2. the code and its install on every worker
if [[ "${SKIP_SETUP:-0}" != 1 ]]; then
  case "$CODE" in
    scp)
      tarball="${TMPDIR:-/tmp}/tree_rl-$TPU_NAME.tgz"
      if [[ "$DRY" == 1 ]]; then
        echo "git -C $(q "$ROOT") ls-files -z --cached --others --exclude-standard | tar -C $(q "$ROOT") --null --ignore-failed-read -T - -czf $(q "$tarball")"
      else
        command -v git >/dev/null 2>&1 || die "git not found on PATH (CODE=scp lists the checkout's files with git)"
        git -C "$ROOT" ls-files -z --cached --others --exclude-standard \
          | tar -C "$ROOT" --null --ignore-failed-read -T - -czf "$tarball"
      fi
      run "${TPU[@]}" scp "$tarball" "$TPU_NAME:$REMOTE_DIR.tgz" "${LOC[@]}" --worker=all
      fetch="mkdir -p $REMOTE_DIR && tar -xzf $REMOTE_DIR.tgz -C $REMOTE_DIR"
      ;;
    git)
      [[ -n "${GIT_URL:-}" ]] || die "CODE=git needs GIT_URL (the repository the workers clone)"
      ref=${GIT_REF:-main}
      q_ref=$(q "$ref")
      fetch="(test -d $REMOTE_DIR/.git || git clone --quiet $(q "$GIT_URL") $REMOTE_DIR) && git -C $REMOTE_DIR fetch --quiet origin && { git -C $REMOTE_DIR checkout --quiet --detach origin/$q_ref 2>/dev/null || git -C $REMOTE_DIR checkout --quiet --detach $q_ref; }"
      ;;
    *) die "CODE=$CODE: use scp or git" ;;
  esac
  check_py="$REMOTE_PYTHON -c 'import sys; sys.exit(0 if sys.version_info[:2] in ((3, 11), (3, 12)) else \"error: tree_rl needs Python 3.11 or 3.12 on the workers: set REMOTE_PYTHON\")'"
  on_all "$fetch && cd $REMOTE_DIR && $check_py && (test -x .venv/bin/python || $REMOTE_PYTHON -m venv .venv) && .venv/bin/pip install --quiet -e '.[tpu]'"
fi

# 3. the run, one process per worker
args=$(show "$@" --config.mesh.distributed=true)
on_all "cd $REMOTE_DIR && ${REMOTE_ENV:+$REMOTE_ENV }.venv/bin/python -m experiments.train $args"

if [[ "${DELETE_AFTER:-0}" == 1 && "$DRY" == 1 ]]; then
  show "${delete[@]}"
fi
