"""TFDS builders (array_record files, read with `tfds.data_source`; no TensorFlow needed)."""

