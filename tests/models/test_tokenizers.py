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


def greedy_longest_match(text, pieces, byte_offset):
  """The built-in encoding written out: at each position the longest piece, else the UTF-8
  bytes of one character."""
  ids = {p: i for i, p in enumerate(pieces)}
  longest = max(map(len, pieces))
  out, i = [], 0
  while i < len(text):
    for n in range(min(longest, len(text) - i), 0, -1):
      if text[i:i + n] in ids:
        out.append(ids[text[i:i + n]])
        i += n
        break
    else:
      out.extend(byte_offset + b for b in text[i].encode("utf-8"))
      i += 1
  return out


_TOK = BuiltinTokenizer()
_PIECES = [p for p in _TOK._pieces if isinstance(p, str)]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(_PIECES), st.text(max_size=3)), max_size=12))
def test_builtin_encoding_is_greedy_longest_match_and_transformers_agrees(parts):
  text = "".join(parts)
  want = greedy_longest_match(text, _PIECES, len(_PIECES))
  assert _TOK.encode(text) == want
  assert _HF.encode(text, add_special_tokens=False) == want
  assert _TOK.decode(want) == text


_HF = _TOK.hf_tokenizer()


@pytest.mark.parametrize("beside", [None, "qwen2"])
def test_builtin_saves_as_a_tokenizer_transformers_loads(tmp_path, beside):
  """Alone, and beside an exported model's config.json (which makes AutoTokenizer pick the
  model type's tokenizer class)."""
  import json as _json
  from transformers import AutoTokenizer
  _TOK.hf_tokenizer().save_pretrained(str(tmp_path))
  if beside:
    (tmp_path / "config.json").write_text(_json.dumps({"model_type": beside}))
  loaded = AutoTokenizer.from_pretrained(str(tmp_path), local_files_only=True)
  for text in ("Move Up or Left? é ∆", "a  b\t\n\n\nc", "P_O\n__G"):
    assert loaded.encode(text, add_special_tokens=False) == _TOK.encode(text)
    assert loaded.decode(_TOK.encode(text)) == text
  text = "<|im_start|>user\nYou are on a frozen lake. Move Up || Left é<|im_end|>\n"
  assert loaded.encode(text, add_special_tokens=False) == _TOK.encode(text)
  msgs = [{"role": "user", "content": "Question: who?"}]
  assert loaded.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) == \
      _TOK.render_chat(msgs)
  assert loaded.eos_token_id == _TOK.eos_id and loaded.pad_token_id == _TOK.pad_id
  assert loaded.convert_tokens_to_ids("<|im_end|>") == _TOK.end_of_turn_id
