"""Evaluating a saved policy: the same checkpoint and seed give the same numbers twice, and they
equal the eval rows the training loop logged for those steps."""

import json
import os
import subprocess
import sys

import pytest

import numpy as np

from configs import frozenlake
from tree_rl import tasks
from tree_rl.envs.frozenlake.json_maps import rows_of
from tree_rl.metrics import read_jsonl
from tree_rl.models import build_tokenizer
from tree_rl.train import evaluate_checkpoint, train_and_evaluate

from loop_helpers import ROOT, smoke


def _evaluate_cli(*args):
  return subprocess.run([sys.executable, "-m", "experiments.evaluate", *args], cwd=ROOT,
                        capture_output=True, text=True, timeout=600)


def test_eval_of_a_checkpoint_is_reproducible_and_matches_the_log(tmp_path, data_dir):
  workdir = str(tmp_path)
  config = smoke(frozenlake, "chain", data_dir, **{"train.eval_prompts": 8})
  train_and_evaluate(config, workdir)
  logged = {r["step"]: r for r in read_jsonl(os.path.join(workdir, "metrics.jsonl"))
            if "eval/greedy_success" in r}
  assert sorted(logged) == [0, 2]
  for step in (0, 2):
    first, second = (evaluate_checkpoint(config, workdir, step) for _ in range(2))
    assert first == second
    assert first["step"] == step
    assert {k: v for k, v in first.items() if k.startswith("eval/")} == \
        {k: v for k, v in logged[step].items() if k.startswith("eval/")}
  assert evaluate_checkpoint(config, workdir)["step"] == 2   # the latest by default
  with pytest.raises(FileNotFoundError, match="no checkpoint step 7 .*saved steps: \\[0, 1, 2\\]"):
    evaluate_checkpoint(config, workdir, 7)

  # The command line, without --config, evaluates with the run's saved config (not the file's
  # defaults: configs/frozenlake.py is PATR on other maps), and refuses one that differs.
  proc = _evaluate_cli(f"--workdir={workdir}", "--steps=2")
  assert proc.returncode == 0, proc.stderr[-2000:]
  got = json.loads(proc.stdout.strip().splitlines()[-1])
  assert {k: v for k, v in got.items() if k.startswith("eval/")} == \
      {k: v for k, v in logged[2].items() if k.startswith("eval/")}
  proc = _evaluate_cli(f"--workdir={workdir}", "--config=configs/frozenlake.py:algo=patr,smoke")
  assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
  assert "rollout.method='patr' (run: 'chain')" in proc.stderr
  proc = _evaluate_cli(f"--workdir={workdir}", "--config.rollout.temperature=0.5")
  assert proc.returncode == 2 and "rollout.temperature=0.5 (run: 1.0)" in proc.stderr

  # --maps: the held-out maps written as gymnasium JSON give the logged numbers again (the same
  # maps, in the same order, so the same keys); a malformed file is refused in one line
  held_out = tasks.build(config, build_tokenizer(config.tokenizer)).test_states
  maps = [{"rows": rows_of(*(np.asarray(x)[i] for x in (held_out.tiles, held_out.nrow,
                                                         held_out.ncol, held_out.start)))}
          for i in range(8)]
  (tmp_path / "maps.json").write_text(json.dumps(maps))
  proc = _evaluate_cli(f"--workdir={workdir}", "--steps=2", f"--maps={tmp_path / 'maps.json'}")
  assert proc.returncode == 0, proc.stderr[-2000:]
  got = json.loads(proc.stdout.strip().splitlines()[-1])
  assert got["maps"] == str(tmp_path / "maps.json")
  assert {k: v for k, v in got.items() if k.startswith("eval/")} == \
      {k: v for k, v in logged[2].items() if k.startswith("eval/")}
  (tmp_path / "bad.json").write_text(json.dumps(maps[:1] + [{"rows": ["SH", "HG"]}]))
  proc = _evaluate_cli(f"--workdir={workdir}", f"--maps={tmp_path / 'bad.json'}")
  assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
  assert "config.env.eval_maps: maps file" in proc.stderr and \
      "map 1: the goal is unreachable from the start" in proc.stderr


  # Export: an HF checkpoint + tokenizer that transformers loads and that generates the sampler's
  # greedy tokens.
  out = str(tmp_path / "hf")
  proc = subprocess.run([sys.executable, "-m", "experiments.export", f"--workdir={workdir}",
                         "--step=2", f"--out={out}"], cwd=ROOT, capture_output=True, text=True,
                        timeout=600)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert json.loads(proc.stdout.strip().splitlines()[-1])["step"] == 2
  _greedy_matches_transformers(config, workdir, out)


def _greedy_matches_transformers(config, workdir, out, new=8):
  import jax
  import jax.numpy as jnp
  import torch
  from transformers import AutoModelForCausalLM, AutoTokenizer

  from tree_rl import sampling
  from tree_rl.learner.train_step import make_train_step
  from tree_rl.models import build_model, build_tokenizer
  from tree_rl.train import model_with, restore_params

  tok = build_tokenizer(config.tokenizer, config.model.hf_path)
  model, _ = build_model(config.model, tok)
  _, params = restore_params(make_train_step(config, model), workdir, 2)
  policy = model_with(model, params)
  hf_tok = AutoTokenizer.from_pretrained(out, local_files_only=True)
  hf = AutoModelForCausalLM.from_pretrained(out, local_files_only=True, dtype=torch.float32)
  msgs = [{"role": "user", "content": "You are on a frozen lake. Move Up or Left?"}]
  ids = tok.encode_chat(msgs)
  assert hf_tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) == \
      tok.render_chat(msgs)
  assert hf_tok.encode(tok.render_chat(msgs), add_special_tokens=False) == ids
  cache = sampling.init_cache(policy, max_seqs=1, num_pages=8, max_pages_per_seq=8, kv_dtype="float32")
  slot = jnp.zeros((1,), jnp.int32)
  cache, _ = sampling.prefill(cache, slot, jnp.asarray([ids], jnp.int32), jnp.asarray([len(ids)]))
  _, got = sampling.decode(cache, slot, jax.random.key(0), max_new=new, temperature=0.0)
  ours = [int(t) for t in got.tokens[0] if t >= 0]
  with torch.no_grad():
    full = hf.generate(torch.tensor([ids]), max_new_tokens=len(ours), do_sample=False,
                       eos_token_id=None, pad_token_id=tok.pad_id)
  assert full[0, len(ids):].tolist() == ours
