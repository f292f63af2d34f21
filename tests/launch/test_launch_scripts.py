"""launch/local.sh, tpu_pod.sh and slurm_gpu.sh: DRY_RUN commands, real runs against fake tools,
and one-line failures when a tool is missing. No network, no training."""

import json
import shlex
import sys
import tarfile

from launch_helpers import BASH, REPO, read_log, recorder, run_script, tool_dir

TRAIN_ARGS = ["--config=configs/frozenlake.py:algo=patr", "--workdir=runs/x",
              "--config.rollout.expand_children=3", "--config.scorer.judge_template=it's {trajectory}"]
ECHO_PYTHON = (f"#!{sys.executable}\n"
               "import json, os, sys\n"
               "print(json.dumps({'cwd': os.getcwd(), 'argv': sys.argv[1:]}))\n")
TPU_ENV = {"TPU_NAME": "rl-pod", "ZONE": "us-central2-b", "PROJECT": "proj",
           "ACCELERATOR_TYPE": "v4-16", "RUNTIME_VERSION": "rt-1"}
GCLOUD_TPU = ["gcloud", "compute", "tpus", "tpu-vm"]
LOC = ["--zone=us-central2-b", "--project=proj"]
REMOTE_RUN = ("cd tree_rl && .venv/bin/python -m experiments.train "
              + shlex.join(TRAIN_ARGS + ["--config.mesh.distributed=true"]))


def _one_error_line(proc, *needles):
  assert proc.returncode != 0
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
  for needle in needles:
    assert needle in lines[0]


# ------------------------------------------------------------------------------------ local.sh

def test_local_dry_run_prints_the_train_command(tmp_path):
  proc = run_script("launch/local.sh", TRAIN_ARGS, path=tool_dir(tmp_path, ["dirname"]),
                    env={"DRY_RUN": "1", "PYTHON": "py3"})
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout == shlex.join(["py3", "-m", "experiments.train", *TRAIN_ARGS]) + "\n"
  assert shlex.split(proc.stdout) == ["py3", "-m", "experiments.train", *TRAIN_ARGS]


def test_local_default_python_is_the_repo_venv(tmp_path):
  proc = run_script("launch/local.sh", ["--config=x"], path=tool_dir(tmp_path, ["dirname"]),
                    env={"DRY_RUN": "1"})
  venv = REPO / ".venv" / "bin" / "python"
  want = ".venv/bin/python" if venv.exists() else "python3"
  assert proc.stdout.split()[0] == want


def test_local_runs_from_the_repo_root_with_every_argument(tmp_path):
  path = tool_dir(tmp_path, ["dirname"], {"fakepy": ECHO_PYTHON})
  proc = run_script("launch/local.sh", TRAIN_ARGS, path=path, env={"PYTHON": "fakepy"}, cwd=tmp_path)
  assert proc.returncode == 0, proc.stderr
  out = json.loads(proc.stdout)
  assert out == {"cwd": str(REPO), "argv": ["-m", "experiments.train", *TRAIN_ARGS]}


def test_local_missing_python_is_one_line(tmp_path):
  proc = run_script("launch/local.sh", TRAIN_ARGS, path=tool_dir(tmp_path, ["dirname"]),
                    env={"PYTHON": "no-such-python"})
  _one_error_line(proc, "no-such-python", "not found")
  assert proc.stdout == ""


# ---------------------------------------------------------------------------------- tpu_pod.sh

def test_pod_without_gcloud_fails_before_anything(tmp_path):
  proc = run_script("launch/tpu_pod.sh", TRAIN_ARGS, path=tool_dir(tmp_path, ["dirname"]),
                    env=TPU_ENV)
  _one_error_line(proc, "gcloud not found on PATH")
  assert proc.stdout == ""


def test_pod_needs_tpu_name_and_zone(tmp_path):
  path = tool_dir(tmp_path, ["dirname"])
  _one_error_line(run_script("launch/tpu_pod.sh", TRAIN_ARGS, path=path, env={"ZONE": "z"}),
                  "TPU_NAME")
  _one_error_line(run_script("launch/tpu_pod.sh", TRAIN_ARGS, path=path, env={"TPU_NAME": "t"}),
                  "ZONE")


def test_pod_dry_run_prints_every_step(tmp_path):
  env = {**TPU_ENV, "DRY_RUN": "1", "TMPDIR": str(tmp_path)}
  proc = run_script("launch/tpu_pod.sh", TRAIN_ARGS, path=tool_dir(tmp_path, ["dirname"]), env=env)
  assert proc.returncode == 0, proc.stderr
  lines = proc.stdout.splitlines()
  tarball = str(tmp_path / "tree_rl-rl-pod.tgz")
  describe = GCLOUD_TPU + ["describe", "rl-pod", *LOC, "--format=value(state)"]
  create = GCLOUD_TPU + ["create", "rl-pod", *LOC, "--accelerator-type=v4-16", "--version=rt-1"]
  repo = shlex.quote(str(REPO))
  assert lines[0] == f"{shlex.join(describe)} || {shlex.join(create)}"
  assert lines[1] == (f"git -C {repo} ls-files -z --cached --others --exclude-standard | tar -C {repo} "
                      f"--null --ignore-failed-read -T - -czf {shlex.quote(tarball)}")
  assert lines[2] == shlex.join(GCLOUD_TPU + ["scp", tarball, "rl-pod:tree_rl.tgz", *LOC, "--worker=all"])
  setup = shlex.split(lines[3])
  assert setup[:-1] == GCLOUD_TPU + ["ssh", "rl-pod", *LOC, "--worker=all"]
  assert setup[-1].startswith("--command=mkdir -p tree_rl && tar -xzf tree_rl.tgz -C tree_rl && cd tree_rl")
  assert setup[-1].endswith(".venv/bin/pip install --quiet -e '.[tpu]'")
  assert shlex.split(lines[4]) == GCLOUD_TPU + ["ssh", "rl-pod", *LOC, "--worker=all",
                                                f"--command={REMOTE_RUN}"]
  assert len(lines) == 5
  # The remote command hands train exactly the arguments given, plus distributed=true.
  assert shlex.split(REMOTE_RUN.split("experiments.train ", 1)[1]) == TRAIN_ARGS + [
      "--config.mesh.distributed=true"]


def test_pod_dry_run_skip_setup_and_delete(tmp_path):
  env = {**TPU_ENV, "DRY_RUN": "1", "SKIP_SETUP": "1", "DELETE_AFTER": "1"}
  proc = run_script("launch/tpu_pod.sh", TRAIN_ARGS, path=tool_dir(tmp_path, ["dirname"]), env=env)
  lines = proc.stdout.splitlines()
  assert len(lines) == 3 and " describe " in lines[0]
  assert shlex.split(lines[1])[-1] == f"--command={REMOTE_RUN}"
  assert lines[2] == shlex.join(GCLOUD_TPU + ["delete", "rl-pod", *LOC, "--quiet"])


def test_pod_creates_a_missing_slice_then_sets_up_and_runs(tmp_path):
  log = tmp_path / "gcloud.jsonl"
  path = tool_dir(tmp_path, ["dirname"], {"gcloud": recorder(log, {"describe": 1})})
  env = {**TPU_ENV, "CODE": "git", "GIT_URL": "https://example.invalid/tree_rl.git", "GIT_REF": "v1"}
  proc = run_script("launch/tpu_pod.sh", TRAIN_ARGS, path=path, env=env)
  assert proc.returncode == 0, proc.stderr
  calls = read_log(log)
  assert [c[3] for c in calls] == ["describe", "create", "ssh", "ssh"]
  assert calls[1] == ["compute", "tpus", "tpu-vm", "create", "rl-pod", *LOC,
                      "--accelerator-type=v4-16", "--version=rt-1"]
  setup = calls[2][-1]
  assert "git clone --quiet https://example.invalid/tree_rl.git tree_rl" in setup
  assert "checkout --quiet --detach origin/v1" in setup
  assert calls[3] == ["compute", "tpus", "tpu-vm", "ssh", "rl-pod", *LOC, "--worker=all",
                      f"--command={REMOTE_RUN}"]


def test_pod_deletes_the_slice_after_a_failed_run(tmp_path):
  log = tmp_path / "gcloud.jsonl"
  path = tool_dir(tmp_path, ["dirname"], {"gcloud": recorder(log, {"--worker=all": 5})})
  env = {**TPU_ENV, "SKIP_SETUP": "1", "DELETE_AFTER": "1"}
  proc = run_script("launch/tpu_pod.sh", TRAIN_ARGS, path=path, env=env)
  assert proc.returncode == 5
  calls = read_log(log)
  assert [c[3] for c in calls] == ["describe", "describe", "ssh", "delete"]
  assert calls[-1] == ["compute", "tpus", "tpu-vm", "delete", "rl-pod", *LOC, "--quiet"]


def test_pod_reuses_a_slice_and_copies_the_checkout(tmp_path):
  log = tmp_path / "gcloud.jsonl"
  path = tool_dir(tmp_path, ["dirname", "git", "tar", "gzip"], {"gcloud": recorder(log)})
  proc = run_script("launch/tpu_pod.sh", TRAIN_ARGS, path=path,
                    env={**TPU_ENV, "TMPDIR": str(tmp_path)})
  assert proc.returncode == 0, proc.stderr
  calls = read_log(log)
  assert [c[3] for c in calls] == ["describe", "describe", "scp", "ssh", "ssh"]  # reused: no create
  tarball = tmp_path / "tree_rl-rl-pod.tgz"
  assert calls[2][4:6] == [str(tarball), "rl-pod:tree_rl.tgz"]
  names = set(tarfile.open(tarball).getnames())
  assert {"experiments/train.py", "launch/tpu_pod.sh", "setup.py"} <= names
  assert not any(n.startswith((".venv/", ".git/", "runs/")) for n in names)


# -------------------------------------------------------------------------------- slurm_gpu.sh

SLURM_ENV = {"SLURM_JOB_ID": "1234", "SLURM_JOB_NODELIST": "node-[a-b]", "SLURM_NTASKS": "2",
             "SLURM_SUBMIT_DIR": str(REPO), "PYTHON": "py3"}
FAKE_SCONTROL = "#!/bin/sh\n[ \"$1 $2 $3\" = 'show hostnames node-[a-b]' ] || exit 3\necho node-a\necho node-b\n"
PER_TASK = 'exec "$@" --config.mesh.process_id="$SLURM_PROCID"'


def _srun_line(port):
  return shlex.join(["srun", "--kill-on-bad-exit=1", "bash", "-c", PER_TASK, "train", "py3", "-m",
                     "experiments.train", *TRAIN_ARGS, "--config.mesh.distributed=true",
                     f"--config.mesh.coordinator_address=node-a:{port}",
                     "--config.mesh.num_processes=2"])


def test_slurm_outside_a_job_submits_itself(tmp_path):
  proc = run_script("launch/slurm_gpu.sh", TRAIN_ARGS, path=tool_dir(tmp_path, ["dirname"]),
                    env={"DRY_RUN": "1"})
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout == shlex.join(["sbatch", "launch/slurm_gpu.sh", *TRAIN_ARGS]) + "\n"
  log = tmp_path / "sbatch.jsonl"
  path = tool_dir(tmp_path, [], {"sbatch": recorder(log)})
  proc = run_script("launch/slurm_gpu.sh", TRAIN_ARGS, path=path, cwd=tmp_path)
  assert proc.returncode == 0, proc.stderr
  assert read_log(log) == [["launch/slurm_gpu.sh", *TRAIN_ARGS]]


def test_slurm_without_sbatch_is_one_line(tmp_path):
  proc = run_script("launch/slurm_gpu.sh", TRAIN_ARGS, path=tool_dir(tmp_path, ["dirname"]))
  _one_error_line(proc, "sbatch not found on PATH")


def test_slurm_job_dry_run_prints_srun_with_the_mesh_flags(tmp_path):
  path = tool_dir(tmp_path, ["head"], {"scontrol": FAKE_SCONTROL})
  env = {**SLURM_ENV, "DRY_RUN": "1"}
  proc = run_script("launch/slurm_gpu.sh", TRAIN_ARGS, path=path, env=env)
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout == _srun_line(20000 + 1234 % 20000) + "\n"
  proc = run_script("launch/slurm_gpu.sh", TRAIN_ARGS, path=path, env={**env, "COORDINATOR_PORT": "5555"})
  assert proc.stdout == _srun_line(5555) + "\n"


def test_slurm_job_without_scontrol_or_srun_is_one_line(tmp_path):
  proc = run_script("launch/slurm_gpu.sh", TRAIN_ARGS, path=tool_dir(tmp_path, ["head"]), env=SLURM_ENV)
  _one_error_line(proc, "scontrol not found on PATH")
  (tmp_path / "with_scontrol").mkdir()
  path = tool_dir(tmp_path / "with_scontrol", ["head"], {"scontrol": FAKE_SCONTROL})
  proc = run_script("launch/slurm_gpu.sh", TRAIN_ARGS, path=path, env=SLURM_ENV)
  _one_error_line(proc, "srun not found on PATH")


def test_slurm_job_outside_the_repo_is_one_line(tmp_path):
  path = tool_dir(tmp_path, ["head"], {"scontrol": FAKE_SCONTROL})
  proc = run_script("launch/slurm_gpu.sh", TRAIN_ARGS, path=path,
                    env={**SLURM_ENV, "SLURM_SUBMIT_DIR": str(tmp_path)})
  _one_error_line(proc, "not the tree_rl repository")


def test_slurm_each_task_gets_its_own_process_id(tmp_path):
  fake_srun = (f"#!{BASH}\n"
               "while [[ $1 == --* ]]; do shift; done\n"
               "for i in 0 1; do SLURM_PROCID=$i \"$@\" || exit; done\n")
  path = tool_dir(tmp_path, ["head", "bash"], {"scontrol": FAKE_SCONTROL, "srun": fake_srun,
                                              "fakepy": ECHO_PYTHON})
  proc = run_script("launch/slurm_gpu.sh", TRAIN_ARGS, path=path,
                    env={**SLURM_ENV, "PYTHON": "fakepy"}, cwd=tmp_path)
  assert proc.returncode == 0, proc.stderr
  outs = [json.loads(line) for line in proc.stdout.splitlines()]
  mesh = ["--config.mesh.distributed=true", "--config.mesh.coordinator_address=node-a:21234",
          "--config.mesh.num_processes=2"]
  assert [o["argv"] for o in outs] == [
      ["-m", "experiments.train", *TRAIN_ARGS, *mesh, f"--config.mesh.process_id={i}"] for i in (0, 1)]
  assert {o["cwd"] for o in outs} == {str(REPO)}
