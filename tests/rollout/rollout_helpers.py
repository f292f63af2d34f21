"""Shared set-up for the rollout engine tests: a tiny model steered towards FrozenLake moves."""

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from tree_rl.config import base_config
from tree_rl.models.config import tiny
from tree_rl.models.transformer import Transformer


def steered_model(tok, transitions, scale=0.7, seed=0, attn_scale=10.0):
  """The tiny shape (untied head) with random layers, unit-scale embeddings and an output head
  that makes token a likely followed by each of transitions[a] (logit margin about 8), so
  random sampling produces valid moves while the layers keep the logits context dependent."""
  cfg = dataclasses.replace(tiny(tok.vocab_size), tie_word_embeddings=False)
  model = Transformer(cfg, rngs=nnx.Rngs(seed))
  emb = jax.random.normal(jax.random.key(seed + 1), model.embed[...].shape)
  model.embed[...] = emb
  for layer in model.layers:  # make attention matter: the context moves the logits
    layer.attn.o_kernel[...] = attn_scale * layer.attn.o_kernel[...]
    layer.attn.v_kernel[...] = attn_scale * layer.attn.v_kernel[...]
  head = 0.02 * jax.random.normal(jax.random.key(seed + 2), model.lm_head[...].shape)
  for a, targets in transitions.items():
    u = emb[a] / jnp.sqrt(jnp.mean(emb[a] ** 2)) / emb.shape[1]
    for b in targets:
      head = head.at[:, b].add(scale * u * jnp.sqrt(emb.shape[1]) * 1.0)
  model.lm_head[...] = head * 1.0
  return model


def moves_model(tok, seed=0):
  nl, down, right, eot = (tok.encode(s)[0] for s in ("\n", "Down", "Right", "<|im_end|>"))
  return steered_model(tok, {nl: (down, right), down: (eot,), right: (eot,)}, scale=8.0, seed=seed)


def rollout_config(**overrides):
  """Small shapes shared by the method tests: 4 branches per prompt for every method."""
  c = base_config()
  r = c.rollout
  r.max_turns, r.max_tokens_per_turn = 3, 6
  r.group_size = 4
  r.num_trees, r.expand_nodes, r.expand_iterations = 2, 2, 1
  r.initial_branches, r.expand_children, r.score_every, r.expand_top_k = 2, 2, 1, 1
  r.max_branches, r.prune_repeat = 4, 2
  for k, v in overrides.items():
    r[k] = v
  return c


CAPACITY = 20   # node slots per prompt: the largest need of the methods above (tree_grpo)


def toolcall_model(tok):
  """Steered towards `<search></search>` and `<answer></answer>` replies."""
  ids = {s: tok.encode(s)[0] for s in ("\n", "<search>", "</search>", "<answer>", "</answer>",
                                       "<|im_end|>")}
  return steered_model(tok, {ids["\n"]: (ids["<search>"], ids["<answer>"]),
                             ids["<search>"]: (ids["</search>"],),
                             ids["<answer>"]: (ids["</answer>"],),
                             ids["</search>"]: (ids["<|im_end|>"],),
                             ids["</answer>"]: (ids["<|im_end|>"],)}, scale=8.0, attn_scale=1.0)
