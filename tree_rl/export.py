"""A trained policy as a Hugging Face checkpoint: config.json + safetensors + the tokenizer.

    export_hf("runs/x", "runs/x/hf")   # the latest checkpoint; step=N for another

transformers loads the result with `AutoModelForCausalLM.from_pretrained(out)` and
`AutoTokenizer.from_pretrained(out)`: a from-scratch run's built-in tokenizer is saved as a
`PreTrainedTokenizerFast` with its chat template, a `model=hf` run's tokenizer as it was loaded.
"""

from __future__ import annotations

import jax

from tree_rl.config import eval_config
from tree_rl.learner.train_step import make_train_step
from tree_rl.models import build_model, build_tokenizer
from tree_rl.models.hf_io import save_hf_checkpoint


def export_hf(workdir: str, out: str, step: int | None = None, config=None) -> dict:
  """Write the policy saved at `step` (default the latest) in `workdir` to `out`; returns
  {step, out, params}. `config` defaults to the run's saved config.json."""
  from tree_rl.train import model_with, restore_params

  config = config if config is not None else eval_config(workdir)
  tokenizer = build_tokenizer(config.tokenizer, config.model.hf_path)
  model, model_config = build_model(config.model, tokenizer, seed=int(config.seed))
  step, params = restore_params(make_train_step(config, model), workdir, step, tokenizer)
  save_hf_checkpoint(model_with(model, params), model_config, out)
  tokenizer.hf_tokenizer().save_pretrained(out)
  return {"step": step, "out": out, "params": int(sum(p.size for p in jax.tree.leaves(params)))}
