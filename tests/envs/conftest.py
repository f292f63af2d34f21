"""Tokenizers for the env tests: the built-in one and a small byte-level BPE saved as an HF dir."""

import pytest

from tree_rl.models.tokenizers import BuiltinTokenizer, make_tokenizer

from local_hf_tokenizer import save_local_hf_tokenizer

CORPUS = [
    "You are on a frozen lake grid. Reach the goal G without falling into a hole O.",
    "_ _ O\nP _ G\n_ O _\nRemaining steps: 7", "Invalid action. You did not move.",
    "<answer>Left || Up</answer> Move Up, Down, Left or Right.",
    "<search>capital of Veltor</search> <information>Fact: Veltor's capital is Brisa.</information>",
    "Question: who founded the company that employs Ana Kor?",
]


@pytest.fixture(scope="session")
def builtin_tok():
  return BuiltinTokenizer()


@pytest.fixture(scope="session")
def hf_tok(tmp_path_factory):
  path = save_local_hf_tokenizer(CORPUS, str(tmp_path_factory.mktemp("hf_tok")), vocab_size=600)
  return make_tokenizer("hf", path)
