"""TFDS builders (array_record files, read with `tfds.data_source`; no TensorFlow needed)."""

from tree_rl.data.codefix import Codefix, CodefixConfig, CodefixTask, load_codefix
