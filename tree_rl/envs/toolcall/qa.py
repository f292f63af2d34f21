"""The tool-call env's knowledge base and question splits as a TFDS dataset.

Splits: `kb` (the facts, in fact-id order), `train` and `test` (questions). `load_kb` rebuilds the
`KnowledgeBase` the env takes (`ToolCallEnv(tok, kb=load_kb(d))`).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow_datasets as tfds

from tree_rl.data.builder_utils import LocalBuilder

from tree_rl.envs.toolcall.kb import KnowledgeBase, Question, generate_kb


@dataclasses.dataclass
class ToolcallQaConfig(tfds.core.BuilderConfig):
  seed: int = 42
  num_people: int = 60
  num_cities: int = 30
  num_countries: int = 10
  num_companies: int = 20
  num_test: int = 100
  min_hops: int = 1
  max_hops: int = 3


def kb_of(c: ToolcallQaConfig) -> KnowledgeBase:
  """The KnowledgeBase a builder config generates (what the prepared dataset stores)."""
  return generate_kb(c.seed, c.num_people, c.num_cities, c.num_countries, c.num_companies,
                     c.num_test, c.min_hops, c.max_hops)


def scaled_config(seed: int, scale: int = 1) -> ToolcallQaConfig:
  """The builder config of the KB generated from `seed` with every entity count times `scale`
  (named `seed{seed}`, or `seed{seed}_x{scale}`); the held-out split stays `num_test` questions."""
  if int(scale) < 1:
    raise ValueError(f"the toolcall KB scale must be an integer >= 1, got {scale}")
  config = ToolcallQaConfig(name=f"seed{seed}" + (f"_x{scale}" if scale > 1 else ""), seed=seed)
  for field in ("num_people", "num_cities", "num_countries", "num_companies"):
    setattr(config, field, getattr(config, field) * scale)
  return config


class ToolcallQa(LocalBuilder):
  """Facts ("text") and questions ("question", "answer", "hops", "needed", "queries")."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "First release."}
  BUILDER_CONFIGS = [ToolcallQaConfig(name="default")]

  def _info(self):
    return self.dataset_info_from_configs(
        features=tfds.features.FeaturesDict({
            "text": tfds.features.Text(),        # fact (kb split) or question
            "answer": tfds.features.Text(),
            "hops": np.int32,
            "needed": tfds.features.Tensor(shape=(3,), dtype=np.int32),   # fact ids, -1 padded
            "queries": tfds.features.Text(),     # one search query per hop, newline separated
        }),
        disable_shuffling=True,
        description="Synthetic multi-hop QA over a generated knowledge base.")

  def _kb(self) -> KnowledgeBase:
    return kb_of(self.builder_config)

  def _split_generators(self, dl_manager):
    kb = self._kb()
    return {"kb": self._generate_examples(kb, "kb"), "train": self._generate_examples(kb, "train"),
            "test": self._generate_examples(kb, "test")}

  def _generate_examples(self, kb: KnowledgeBase, split: str):
    if split == "kb":
      for i, f in enumerate(kb.facts):
        yield i, {"text": f, "answer": "", "hops": 0, "needed": np.full((3,), -1, np.int32), "queries": ""}
      return
    for i, q in enumerate(kb.split(split)):
      needed = np.full((3,), -1, np.int32)
      needed[:len(q.needed)] = q.needed
      yield i, {"text": q.text, "answer": q.answer, "hops": q.hops, "needed": needed,
                "queries": "\n".join(q.queries)}


def load_kb(data_dir: str, config: str = "default") -> KnowledgeBase:
  """The KnowledgeBase stored in a prepared dataset (entities are not stored: {})."""
  def rows(split):
    src = tfds.data_source(f"toolcall_qa/{config}", data_dir=data_dir, split=split)
    return [src[i] for i in range(len(src))]

  def text(x):
    return x.decode("utf-8") if isinstance(x, bytes) else str(x)

  facts = tuple(text(r["text"]) for r in rows("kb"))
  qs = {s: tuple(Question(text(r["text"]), text(r["answer"]), int(r["hops"]),
                          tuple(int(n) for n in r["needed"] if n >= 0),
                          tuple(text(r["queries"]).split("\n"))) for r in rows(s))
        for s in ("train", "test")}
  return KnowledgeBase(facts, {}, qs["train"], qs["test"])
