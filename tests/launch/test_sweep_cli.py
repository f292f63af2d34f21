"""launch/sweep.py: the exact commands it prints for each target, that it runs exactly those,
and that it refuses bad sweeps and overrides before printing or running anything."""

import json
import os
import shlex
import subprocess
import sys

from configs import frozenlake
from experiments import sweeps
from launch_helpers import REPO

BASE = "--config=configs/frozenlake.py:algo=patr"


def sweep_cli(*args, env=None):
  return subprocess.run([sys.executable, "launch/sweep.py", *args], capture_output=True, text=True,
                        cwd=REPO, env={**os.environ, **(env or {})}, timeout=300)


def patr_expand_train_args(seed, m, root="runs/sweeps"):
  return (f"{BASE} --workdir={root}/patr_expand/M{m}_seed{seed} "
          f"--config.rollout.expand_children={m} --config.seed={seed}")


def test_local_dry_run_prints_one_command_per_run_in_seed_order():
  proc = sweep_cli("patr_expand", "--dry-run")
  assert proc.returncode == 0, proc.stderr
  want = [f"launch/local.sh {patr_expand_train_args(s, m)}" for s in (0, 1, 2) for m in (2, 3)]
  assert proc.stdout.splitlines() == want


def test_pod_and_slurm_dry_runs_wrap_the_same_commands():
  pod = sweep_cli("patr_expand", "--dry-run", "--target", "pod", "--seeds", "0,5")
  assert pod.returncode == 0, pod.stderr
  assert pod.stdout.splitlines() == [
      f"launch/tpu_pod.sh {patr_expand_train_args(0, 2)}",
      f"SKIP_SETUP=1 launch/tpu_pod.sh {patr_expand_train_args(0, 3)}",
      f"SKIP_SETUP=1 launch/tpu_pod.sh {patr_expand_train_args(5, 2)}",
      f"SKIP_SETUP=1 launch/tpu_pod.sh {patr_expand_train_args(5, 3)}"]
  slurm = sweep_cli("patr_expand", "--dry-run", "--target", "slurm", "--only", "M3_seed1",
                    "--sbatch-args", "--partition=gpu --time=2:00:00", "--workdir-root", "out dir")
  assert slurm.returncode == 0, slurm.stderr
  train = shlex.join([BASE, "--workdir=out dir/patr_expand/M3_seed1",
                      "--config.rollout.expand_children=3", "--config.seed=1"])
  assert slurm.stdout.splitlines() == [
      "sbatch --job-name=patr_expand.M3_seed1 '--output=out dir/patr_expand/M3_seed1.%j.out' "
      f"--partition=gpu --time=2:00:00 launch/slurm_gpu.sh {train}"]
  assert "'--workdir=out dir/patr_expand/M3_seed1'" in slurm.stdout


def test_patr_ablation_dry_run_has_entries_times_seeds_commands():
  proc = sweep_cli("patr_ablation", "--dry-run")
  assert proc.returncode == 0, proc.stderr
  lines = proc.stdout.splitlines()
  assert len(lines) == len(sweeps.get("patr_ablation").entries) * 3 == 30
  assert f"launch/local.sh {BASE} --workdir=runs/sweeps/patr_ablation/M3_seed1 " \
         "--config.rollout.expand_children=3 --config.seed=1" in lines
  assert "launch/local.sh --config=configs/frozenlake.py:algo=tree_random " \
         "--workdir=runs/sweeps/patr_ablation/random_seed2 --config.seed=2" in lines
  assert f"launch/local.sh {BASE} --workdir=runs/sweeps/patr_ablation/drop_pruned_seed0 " \
         "--config.rollout.keep_pruned=false --config.seed=0" in lines
  assert f"launch/local.sh {BASE} --workdir=runs/sweeps/patr_ablation/best_n_seed0 " \
         "--config.rollout.keep_best=4 --config.seed=0" in lines


def test_budget_curve_commands_carry_the_budget_in_generated_tokens():
  r = frozenlake.get_config().rollout
  one = r.max_turns * r.max_tokens_per_turn
  proc = sweep_cli("budget_curve", "--dry-run", "--only", "_b4_", "--seeds", "1")
  assert proc.returncode == 0, proc.stderr
  lines = proc.stdout.splitlines()
  assert [shlex.split(line)[2] for line in lines] == [
      f"--workdir=runs/sweeps/budget_curve/{a}_b4_seed1"
      for a in ("grpo", "tree_grpo", "patr", "tree_random", "dapo", "gigpo", "arpo")]
  for line in lines:
    assert f"--config.rollout.budget={4 * one} --config.rollout.budget_unit=generated" in line
  assert lines[0] == (f"launch/local.sh --config=configs/frozenlake.py:algo=grpo "
                      f"--workdir=runs/sweeps/budget_curve/grpo_b4_seed1 --config.rollout.group_size=4 "
                      f"--config.rollout.budget={4 * one} --config.rollout.budget_unit=generated "
                      "--config.seed=1")


def test_parallel_local_runs_pin_devices_and_log_to_files():
  gpus = sweep_cli("patr_expand", "--dry-run", "--per-accelerator", "--devices", "0,3", "--seeds", "0")
  assert gpus.returncode == 0, gpus.stderr
  assert gpus.stdout.splitlines() == [
      f"CUDA_VISIBLE_DEVICES={d} launch/local.sh {patr_expand_train_args(0, m)} "
      f"> runs/sweeps/patr_expand/M{m}_seed0.log 2>&1" for d, m in (("0", 2), ("3", 3))]
  cpus = sweep_cli("patr_expand", "--dry-run", "--parallel", "2", "--seeds", "0")
  assert cpus.stdout.splitlines() == [
      f"launch/local.sh {patr_expand_train_args(0, m)} > runs/sweeps/patr_expand/M{m}_seed0.log 2>&1"
      for m in (2, 3)]


def test_set_adds_an_override_to_every_run():
  proc = sweep_cli("patr_expand", "--dry-run", "--seeds", "0", "--set", "train.num_steps=2")
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout.splitlines() == [
      f"launch/local.sh {BASE} --workdir=runs/sweeps/patr_expand/M{m}_seed0 "
      f"--config.rollout.expand_children={m} --config.train.num_steps=2 --config.seed=0"
      for m in (2, 3)]


def test_bad_names_and_overrides_fail_before_printing_anything():
  unknown = sweep_cli("patr_expnd", "--dry-run")
  assert unknown.returncode == 2 and unknown.stdout == ""
  assert unknown.stderr.startswith("error: unknown sweep 'patr_expnd'; known: [")
  typo = sweep_cli("patr_expand", "--dry-run", "--set", "rollout.temperatur=0.5")
  assert typo.returncode == 2 and typo.stdout == ""
  assert typo.stderr.strip() == ("error: patr_expand/M2_seed0: unknown config field "
                                 "--config.rollout.temperatur (Did you mean \"temperature\" "
                                 "instead of \"temperatur\"?)")
  impossible = sweep_cli("patr_expand", "--set", "rollout.budget=10")   # not even a dry run
  assert impossible.returncode == 2 and impossible.stdout == ""
  assert "less than one trajectory" in impossible.stderr
  wrong_target = sweep_cli("patr_expand", "--dry-run", "--target", "pod", "--parallel", "2")
  assert wrong_target.returncode == 2 and "for --target local" in wrong_target.stderr


def test_list_names_every_sweep():
  proc = sweep_cli("--list")
  assert proc.returncode == 0, proc.stderr
  listed = [line.split()[0] for line in proc.stdout.splitlines() if not line.startswith(" ")]
  assert listed == sweeps.names()


def test_local_target_runs_exactly_the_printed_commands(tmp_path):
  fake = tmp_path / "fakepy"
  fake.write_text(f"#!{sys.executable}\n"
                  "import json, sys\n"
                  f"open({str(tmp_path / 'calls.jsonl')!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n"
                  "sys.exit(3 if '--config.rollout.expand_children=3' in sys.argv else 0)\n")
  fake.chmod(0o755)
  root = str(tmp_path / "sweeps")
  args = ("patr_expand", "--seeds", "0,1", "--workdir-root", root)
  printed = sweep_cli(*args, "--dry-run").stdout.splitlines()
  proc = sweep_cli(*args, env={"PYTHON": str(fake)})
  assert proc.returncode == 1                         # the M3 runs failed
  assert "2 of 4 runs succeeded" in proc.stderr
  calls = [json.loads(l) for l in open(tmp_path / "calls.jsonl")]
  assert [["launch/local.sh", *c[2:]] for c in calls] == [shlex.split(p) for p in printed]
  assert all(c[:2] == ["-m", "experiments.train"] for c in calls)
  # In parallel every run writes its log beside its workdir.
  (tmp_path / "calls.jsonl").unlink()
  proc = sweep_cli(*args, "--parallel", "2", env={"PYTHON": str(fake)})
  assert proc.returncode == 1
  assert len(open(tmp_path / "calls.jsonl").readlines()) == 4
  assert sorted(os.listdir(os.path.join(root, "patr_expand"))) == [
      "M2_seed0.log", "M2_seed1.log", "M3_seed0.log", "M3_seed1.log"]
