"""Round trips for the built-in and the HF tokenizer wrappers (no downloads)."""


import pytest
from hypothesis import given, settings, strategies as st

from tree_rl.models import BuiltinTokenizer, HFTokenizer, make_tokenizer

from local_hf_tokenizer import save_local_hf_tokenizer

TEXTS = ["You are on a frozen lake.\nP_O\n_G_\nUp",
         "<search>capital of France</search> then <answer>Paris</answer>",
         "unicode: é, 漢字, emoji 🙂 and tabs\t end", ""]


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_builtin_round_trip_any_text(text):
  tok = BuiltinTokenizer()
  ids = tok.encode(text)
  assert all(0 <= i < tok.vocab_size for i in ids)
  assert tok.decode(ids) == text


def test_builtin_words_are_single_tokens_and_chat():
  tok = BuiltinTokenizer()
  assert len(tok.encode("Up")) == 1 and len(tok.encode("<answer>")) == 1
  chat = tok.encode_chat([{"role": "user", "content": "hi"}])
  assert tok.decode(chat) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
  assert chat.count(tok.end_of_turn_id) == 1
  assert set(tok.stop_ids) == {tok.eos_id, tok.end_of_turn_id}


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
  return save_local_hf_tokenizer(TEXTS, str(tmp_path_factory.mktemp("hf_tok")), vocab_size=400)


def test_hf_round_trip_and_chat(hf_dir):
  tok = make_tokenizer("hf", hf_dir)
  assert isinstance(tok, HFTokenizer)
  for text in TEXTS:
    assert tok.decode(tok.encode(text)) == text
  assert tok.end_of_turn_id == tok._tok.convert_tokens_to_ids("<|im_end|>")
  rendered = tok.render_chat([{"role": "user", "content": "go Up"}])
  assert rendered == BuiltinTokenizer().render_chat([{"role": "user", "content": "go Up"}])


def test_unknown_tokenizer_kind():
  with pytest.raises(ValueError, match="builtin, hf"):
    make_tokenizer("sentencepiece")
  with pytest.raises(ValueError, match="tokenizer.path"):
    make_tokenizer("hf", "")


def test_ids_outside_the_vocabulary_raise_in_both_tokenizers(hf_dir):
  for tok in (BuiltinTokenizer(), make_tokenizer("hf", hf_dir)):
    for bad in ([-300], [-1], [tok.vocab_size], [5, tok.vocab_size + 7]):
      with pytest.raises(ValueError, match=r"outside the vocabulary \[0, "):
        tok.decode(bad)
  builtin = BuiltinTokenizer()
  assert builtin.decode([builtin.vocab_size - 1]) == ""   # an unused (padding) id: no text
