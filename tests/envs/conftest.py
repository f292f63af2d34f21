"""Tokenizers for the env tests: the built-in one and a small byte-level BPE saved as an HF dir."""

import pytest
from tokenizers import Tokenizer as RawTokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from tree_rl.models.tokenizers import BuiltinTokenizer, make_tokenizer

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
  raw = RawTokenizer(models.BPE(unk_token=None))
  raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  raw.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  raw.train_from_iterator(CORPUS * 20, trainer)
  fast = PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="<|endoftext|>")
  fast.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
  path = str(tmp_path_factory.mktemp("hf_tok"))
  fast.save_pretrained(path)
  return make_tokenizer("hf", path)
