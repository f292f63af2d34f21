"""Shared TFDS builder pieces."""

import inspect

import tensorflow_datasets as tfds
from etils import epath


@tfds.core.utils.classproperty
@classmethod
def _code_path(cls):
  """The builder's source file, found without `importlib_resources` (which TFDS would import)."""
  return epath.Path(inspect.getfile(cls))
