"""PretrainedTokenizer: the reference token ids of all-MiniLM-L6-v2, truncation with special tokens,
padding, pickling."""
from __future__ import annotations

import pickle

import numpy as np
import pytest

from tests.pretrained.tiny_bert import tiny_tokenizer
from tests.shared_data import shared_path
from transformer.errors import ConfigError
from transformer.pretrained import PretrainedTokenizer, pad_batch
from transformer.pretrained.bert import load_bert


@pytest.fixture
def tokenizer(tmp_path) -> PretrainedTokenizer:
  tiny_tokenizer().save(str(tmp_path / "tokenizer.json"))
  return PretrainedTokenizer.from_file(tmp_path / "tokenizer.json", max_length=6)


def test_ids_equal_the_reference_tokenisation():
  """all-MiniLM-L6-v2's tokenizer.json gives Hugging Face transformers' ids, sentence by sentence."""
  model_dir = shared_path("models", "all-MiniLM-L6-v2")
  reference = np.load(model_dir / "reference" / "embeddings.npz")
  _, _, tokenizer = load_bert(model_dir)
  assert tokenizer.max_length == 256  # sentence_bert_config.json's max_seq_length
  ids = tokenizer.encode_batch([str(sentence) for sentence in reference["sentences"]])
  for row, (mask, expected) in enumerate(zip(reference["attention_mask"], reference["input_ids"])):
    np.testing.assert_array_equal(ids[row], expected[mask == 1], err_msg=str(reference["sentences"][row]))
  padded = pad_batch(ids, tokenizer.pad_id)
  np.testing.assert_array_equal(padded, reference["input_ids"])  # padding with [PAD] = 0 to the longest


def test_special_tokens_wrap_the_text_and_count_towards_max_length(tokenizer):
  cls, sep, unk = (tokenizer.token_to_id(token) for token in ("[CLS]", "[SEP]", "[UNK]"))
  ids = tokenizer.encode("The FIRE near")  # uncased
  np.testing.assert_array_equal(ids, [cls, tokenizer.token_to_id("the"), tokenizer.token_to_id("fire"),
                                      tokenizer.token_to_id("near"), sep])
  assert ids.dtype == np.int32
  long = tokenizer.encode("the big small river road is on fire")
  assert len(long) == 6 and long[0] == cls and long[-1] == sep  # truncated, the end marker kept
  assert tokenizer.decode(long) == "the big small river"
  np.testing.assert_array_equal(tokenizer.encode("zebra"), [cls, unk, sep])
  np.testing.assert_array_equal(tokenizer.encode(""), [cls, sep])


def test_pad_batch_pads_to_the_longest_or_a_given_length():
  sequences = [np.array([5, 6, 7]), np.array([8])]
  np.testing.assert_array_equal(pad_batch(sequences, 0), [[5, 6, 7], [8, 0, 0]])
  np.testing.assert_array_equal(pad_batch(sequences, 9, length=4), [[5, 6, 7, 9], [8, 9, 9, 9]])
  with pytest.raises(ValueError, match="3 tokens, more than length=2"):
    pad_batch(sequences, 0, length=2)


def test_pickles_with_its_settings(tokenizer):
  restored = pickle.loads(pickle.dumps(tokenizer))
  assert restored.max_length == 6 and restored.pad_id == tokenizer.pad_id
  text = "the fires near the river road"
  np.testing.assert_array_equal(restored.encode(text), tokenizer.encode(text))


def test_too_short_max_length_is_refused(tmp_path):
  tiny_tokenizer().save(str(tmp_path / "tokenizer.json"))
  with pytest.raises(ConfigError, match="max_length=2"):
    PretrainedTokenizer.from_file(tmp_path / "tokenizer.json", max_length=2)
