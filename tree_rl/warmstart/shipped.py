"""Warm-start policies shipped with the package, so a run starts RL from the same weights on
every machine (XLA:CPU gives other floats on other hosts, and the SFT that made them is
sensitive to its floats).

A policy is a directory `tree_rl/warmstart/policies/<name>/`: a Hugging Face checkpoint
(config.json + model.safetensors, read by `models.hf_io`, never unpickled) and manifest.json:
the weights file's sha256, the tokenizer fingerprint, the settings the policy was trained for
(model preset, env name / preset / the env's `policy_fields`), its held-out numbers and the
command that regenerates it. `load` checks all of them and refuses a mismatch with one line.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

import jax
from flax import nnx

from tree_rl import envs
from tree_rl.models.hf_io import CheckpointError, load_hf_checkpoint, save_hf_checkpoint

POLICIES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "policies")
WEIGHTS, MANIFEST = "model.safetensors", "manifest.json"
# The config fields every policy is bound to (and its env's `policy_fields`): another value
# would run it on observations or a model it was not trained for.
BOUND = ("model.preset", "model.param_dtype", "env.name", "env.preset")


class ShippedPolicyError(CheckpointError):
  """A shipped warm-start policy that is missing, changed, or made for another setting."""


def known() -> list[str]:
  """Names of the shipped policies."""
  if not os.path.isdir(POLICIES):
    return []
  return sorted(d for d in os.listdir(POLICIES) if os.path.isfile(os.path.join(POLICIES, d, MANIFEST)))


def policy_dir(name: str) -> str:
  return os.path.join(POLICIES, name)


def sha256_file(path: str) -> str:
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      h.update(block)
  return h.hexdigest()


def bound_fields(config) -> tuple[str, ...]:
  """`BOUND` and the `policy_fields` of the env `config.env.name` registers, as `env.<field>`."""
  return BOUND + tuple(f"env.{f}" for f in envs.entry(config.env.name).policy_fields)


def bound_settings(config) -> dict[str, Any]:
  """{field: value} of the bound fields of `config`."""
  out = {}
  for key in bound_fields(config):
    section, field = key.split(".")
    out[key] = config[section][field]
  return out


def read_manifest(name: str) -> dict[str, Any]:
  path = os.path.join(policy_dir(name), MANIFEST)
  if not os.path.isfile(path):
    raise ShippedPolicyError(f"config.warmstart.policy={name!r}: no shipped policy of that name "
                             f"(known: {known()})")
  try:
    with open(path) as f:
      manifest = json.load(f)
    manifest["sha256"], manifest["tokenizer"], manifest["settings"]   # noqa: B018
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise ShippedPolicyError(f"{path} is not a warm-start manifest ({e})") from None
  return manifest


def load(name: str, config, tokenizer, model: nnx.Module) -> tuple[dict, dict[str, Any]]:
  """(pure-dict params shaped like `model`'s, manifest) of shipped policy `name`, after checking
  the weights' sha256, the tokenizer fingerprint, the bound settings and every shape."""
  manifest = read_manifest(name)
  directory = policy_dir(name)
  weights = os.path.join(directory, WEIGHTS)
  redo = f"regenerate it with `{manifest.get('command', '?')}` or run the SFT instead " \
         f"(--config.warmstart.from_scratch=true)"
  if not os.path.isfile(weights):
    raise ShippedPolicyError(f"shipped warm-start policy {name!r} lacks {WEIGHTS}: {redo}")
  digest = sha256_file(weights)
  if digest != manifest["sha256"]:
    raise ShippedPolicyError(
        f"shipped warm-start policy {name!r}: {WEIGHTS} has sha256 {digest[:16]}..., its manifest "
        f"says {manifest['sha256'][:16]}... (changed, truncated or a git-lfs pointer): {redo}")
  if manifest["tokenizer"] != tokenizer.fingerprint():
    raise ShippedPolicyError(
        f"shipped warm-start policy {name!r} was trained with tokenizer {manifest['tokenizer']}, "
        f"this run's is {tokenizer.fingerprint()}: its token ids would mean other tokens; {redo}")
  ours = bound_settings(config)
  differ = [f"config.{k}={ours[k]!r} (policy: {manifest['settings'].get(k)!r})"
            for k in ours if manifest["settings"].get(k) != ours[k]]
  if differ:
    raise ShippedPolicyError(f"shipped warm-start policy {name!r} was trained for another setting: "
                             f"{', '.join(differ)}; set config.warmstart.policy='' or "
                             f"--config.warmstart.from_scratch=true")
  loaded, _ = load_hf_checkpoint(directory)
  params = nnx.to_pure_dict(nnx.state(loaded, nnx.Param))
  want = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  shapes = lambda t: jax.tree.map(lambda a: (tuple(a.shape), str(a.dtype)), t)  # noqa: E731
  if shapes(params) != shapes(want):
    raise ShippedPolicyError(f"shipped warm-start policy {name!r} does not have the shapes of "
                             f"config.model.preset={config.model.preset!r}: {redo}")
  return params, manifest


def save(directory: str, model: nnx.Module, model_config, tokenizer, config,
         extra: dict[str, Any]) -> dict[str, Any]:
  """Write `model` as a shipped policy into `directory` (config.json, model.safetensors,
  manifest.json with `extra` merged in); returns the manifest."""
  save_hf_checkpoint(model, model_config, directory)
  manifest = {"sha256": sha256_file(os.path.join(directory, WEIGHTS)),
              "tokenizer": tokenizer.fingerprint(), "settings": bound_settings(config),
              "params": int(sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param))))}
  manifest.update(extra)
  with open(os.path.join(directory, MANIFEST), "w") as f:
    json.dump(manifest, f, indent=2)
    f.write("\n")
  return manifest
