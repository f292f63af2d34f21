"""The code-repair tasks of `gen` as a TFDS dataset, so every run sees the same tasks.

    builder = Codefix(data_dir=d, config="default")            # 2,000 train / 100 test, seed 42
    builder.download_and_prepare(file_format="array_record")
    tasks = load_codefix(d, "test")                              # list[CodefixTask], task_id order

Example i of a split is task i of `generate(seed, num_train, num_test)[split]`; the workspace
(`files`) is stored as one JSON text.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import tensorflow_datasets as tfds

from tree_rl.data.builder_utils import LocalBuilder
from tree_rl.envs.codefix.gen import CodefixTask, generate

_TEXT_FIELDS = ("name", "bug", "path", "buggy", "fixed", "visible_tests", "hidden_tests")


@dataclasses.dataclass
class CodefixConfig(tfds.core.BuilderConfig):
  seed: int = 42
  num_train: int = 2000
  num_test: int = 100


class Codefix(LocalBuilder):
  """Buggy modules with visible and hidden tests: task_id, the CodefixTask text fields, files (JSON)."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "First release."}
  BUILDER_CONFIGS = [CodefixConfig(name="default")]

  def _info(self):
    features = {"task_id": np.int32, "files": tfds.features.Text()}
    features.update({k: tfds.features.Text() for k in _TEXT_FIELDS})
    return self.dataset_info_from_configs(
        features=tfds.features.FeaturesDict(features), disable_shuffling=True,
        description="Tiny Python modules with one injected bug each, visible and hidden tests.")

  def _split_generators(self, dl_manager):
    c = self.builder_config
    tasks = generate(c.seed, c.num_train, c.num_test)
    return {s: self._generate_examples(tasks[s]) for s in ("train", "test")}

  def _generate_examples(self, tasks: list[CodefixTask]):
    for t in tasks:
      row = {k: getattr(t, k) for k in _TEXT_FIELDS}
      yield t.task_id, {"task_id": t.task_id, "files": json.dumps(t.files), **row}


def _text(x) -> str:
  return x.decode("utf-8") if isinstance(x, bytes) else str(x)


def load_codefix(directory: str, split: str, config: str = "default") -> list[CodefixTask]:
  """The tasks of a prepared split, in task_id order."""
  source = tfds.data_source(f"codefix/{config}", data_dir=directory, split=split)
  rows = [source[i] for i in range(len(source))]
  tasks = [CodefixTask(task_id=int(r["task_id"]), files=json.loads(_text(r["files"])),
                       **{k: _text(r[k]) for k in _TEXT_FIELDS}) for r in rows]
  return sorted(tasks, key=lambda t: t.task_id)
