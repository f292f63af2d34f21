"""Shared TFDS builder pieces: a base for the data sets this package generates locally."""

import inspect
import logging

import tensorflow_datasets as tfds
from etils import epath


class LocalBuilder(tfds.core.GeneratorBasedBuilder):
  """A builder whose data is generated here (no download): one line when it is first prepared,
  instead of TFDS's "Downloading and preparing dataset Unknown size ..." banner."""

  @tfds.core.utils.classproperty
  @classmethod
  def code_path(cls):
    """The builder's source file, found without `importlib_resources` (which TFDS would import)."""
    return epath.Path(inspect.getfile(cls))

  def _log_download_bytes(self) -> None:
    print(f"generating {self.name} ({self.builder_config.name}) in {self.data_dir}", flush=True)

  def _log_download_done(self) -> None:
    pass


class _DropCustomConfigNotice:
  """Drops TFDS's "Using custom data configuration" warning: our sized configs are custom by
  design (tasks.py builds one per split size)."""

  def filter(self, record) -> bool:
    return not str(record.msg).startswith("Using custom data configuration")


logging.getLogger("absl").addFilter(_DropCustomConfigNotice())
