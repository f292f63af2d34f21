"""The tool-call env's config checks, run before anything is built."""

from __future__ import annotations


def check(env_config) -> list[str]:
  """Problems with the tool-call fields of `config.env`: the KB scale and the question split."""
  out = []
  if int(env_config.kb_scale) < 1:
    out.append(f"config.env.kb_scale must be >= 1 (the toolcall KB's entity counts times it), "
               f"got {env_config.kb_scale}")
  if env_config.split not in ("train", "test"):
    out.append(f"config.env.split={env_config.split!r}; known: ['test', 'train']")
  return out
