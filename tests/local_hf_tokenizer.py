"""A small byte-level BPE trained with the `tokenizers` library and saved as an HF tokenizer
directory (with a ChatML template): the HF tokenizer path, tested without any download."""

from tokenizers import Tokenizer as RawTokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def save_local_hf_tokenizer(corpus, path: str, vocab_size: int) -> str:
  raw = RawTokenizer(models.BPE(unk_token=None))
  raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  raw.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  raw.train_from_iterator(list(corpus) * 20, trainer)
  fast = PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="<|endoftext|>")
  fast.chat_template = CHATML
  fast.save_pretrained(path)
  return path
