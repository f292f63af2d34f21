"""Entry point: `python -m experiments.train --config=configs/frozenlake.py:smoke --workdir=runs/x`.

Any config field can be overridden with --config.section.field=value. Until the RL loop lands,
this runs a smoke generation of the configured model (random weights for tiny/small) and says so.
"""

import json
import os
import time

from absl import app, flags, logging
from ml_collections import config_flags

from tree_rl.config import parse_flags_or_exit

_CONFIG = config_flags.DEFINE_config_file("config", "configs/frozenlake.py", "Experiment config file.")
_WORKDIR = flags.DEFINE_string("workdir", "runs/default", "Directory for checkpoints and logs.")
_PRINT_CONFIG = flags.DEFINE_bool("print_config", False, "Print the resolved config as JSON and exit.")


def smoke_generation(config, workdir: str, new_tokens: int = 24) -> dict:
  """Greedy generation from the configured model with a dense jitted loop."""
  import jax
  import jax.numpy as jnp
  from flax import nnx

  from tree_rl.models import build_model, build_tokenizer

  tokenizer = build_tokenizer(config)
  model, model_cfg = build_model(config, tokenizer, seed=config.seed)
  prompt = tokenizer.encode_chat([{"role": "user", "content": "You are on a frozen lake.\nP__\n_O_\n__G\nMove:"}])
  total = len(prompt) + new_tokens
  graphdef, params = nnx.split(model)

  @jax.jit
  def generate(params, tokens):
    model = nnx.merge(graphdef, params)
    def body(t, tokens):
      next_token = jnp.argmax(model(tokens)[:, t - 1], axis=-1).astype(jnp.int32)
      return tokens.at[:, t].set(next_token)
    return jax.lax.fori_loop(len(prompt), total, body, tokens)

  tokens = jnp.zeros((1, total), jnp.int32).at[0, :len(prompt)].set(jnp.asarray(prompt))
  start = time.perf_counter()
  out = jax.block_until_ready(generate(params, tokens))
  seconds = time.perf_counter() - start
  result = {"model_params": model_cfg.num_params, "prompt_tokens": len(prompt), "new_tokens": new_tokens,
            "seconds_incl_compile": round(seconds, 3),
            "generated_text": tokenizer.decode(out[0, len(prompt):].tolist())}
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, "smoke_generation.json"), "w") as f:
    json.dump(result, f, indent=2)
  return result


def main(argv):
  del argv
  config = _CONFIG.value
  if _PRINT_CONFIG.value:
    print(config.to_json_best_effort(indent=2))
    return
  logging.info("config:\n%s", config)
  print("The RL loop is not built yet: running a smoke generation of the configured model.")
  print(json.dumps(smoke_generation(config, _WORKDIR.value), indent=2))


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags_or_exit)
