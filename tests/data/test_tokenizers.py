"""SentencePiece: fixed special ids, EOS handling, round trip, caching, pickling."""
from __future__ import annotations

import hashlib
import json
import pickle

import numpy as np
import pytest
import sentencepiece

from data_fixtures import sentence_pairs
from transformer.data import tokenizers
from transformer.errors import InputFileError

OPTIONS = tokenizers.SentencePieceOptions(vocab_size=48)


@pytest.fixture(scope="module")
def english():
  return [pair[0] for pair in sentence_pairs(80, seed=7)]


@pytest.fixture(scope="module")
def tokenizer(english):
  return tokenizers.train_sentencepiece(english, OPTIONS)


def test_special_ids_are_the_ones_the_model_assumes(tokenizer):
  assert (tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id, tokenizer.unk_id) == (0, 1, 2, 3)
  assert tokenizer.vocab_size == OPTIONS.vocab_size


def test_encode_appends_eos_and_round_trips(tokenizer, english):
  for sentence in english[:20]:
    ids = tokenizer.encode(sentence)
    assert ids.dtype == np.int32 and ids[-1] == tokenizers.EOS_ID
    assert tokenizers.EOS_ID not in ids[:-1].tolist() and 0 not in ids.tolist()
    assert tokenizer.decode(ids) == sentence
  assert tokenizer.encode("a dog", add_eos=False)[-1] != tokenizers.EOS_ID


def test_decode_drops_specials_and_stops_at_eos(tokenizer):
  ids = tokenizer.encode("the red ball")
  model_output = np.concatenate([[tokenizers.BOS_ID], ids, tokenizer.encode("a cat"), [0, 0]])
  assert tokenizer.decode(model_output) == "the red ball"
  padded = np.zeros([2, 12], np.int32)
  padded[0, :len(ids)] = ids
  assert tokenizer.decode_batch(padded) == ["the red ball", ""]


def test_tokenizer_pickles(tokenizer):
  copy = pickle.loads(pickle.dumps(tokenizer))
  assert copy.encode("a small dog").tolist() == tokenizer.encode("a small dog").tolist()


def test_sample_is_capped_reproducible_and_skips_empty_lines():
  sentences = [f"s{i}" if i % 10 else "" for i in range(1000)]
  sample = tokenizers.sample_sentences(sentences, 100, seed=3)
  assert len(sample) == 100 and "" not in sample
  assert sample == tokenizers.sample_sentences(sentences, 100, seed=3)
  assert sample != tokenizers.sample_sentences(sentences, 100, seed=4)


def test_cache_is_reused_without_retraining(english, tmp_path, monkeypatch):
  first = tokenizers.load_or_train_sentencepiece(tmp_path, "en", english, OPTIONS)
  record = json.loads((tmp_path / first.path.split("/")[-1].replace(".model", ".json")).read_text())
  assert record["options"]["vocab_size"] == OPTIONS.vocab_size
  assert record["num_sentences"] == len(english)
  assert record["fingerprint"] == first.fingerprint == hashlib.sha256(first.model_proto).hexdigest()[:12]
  assert record["sentencepiece_version"] == sentencepiece.__version__

  def no_training(*args, **kwargs):
    raise AssertionError("retrained although the model is cached")
  monkeypatch.setattr(tokenizers, "train_sentencepiece", no_training)
  calls = []
  second = tokenizers.load_or_train_sentencepiece(
      tmp_path, "en", lambda: calls.append(1) or english, OPTIONS)
  assert calls == []  # the training text is not even read
  assert second.path == first.path and second.model_proto == first.model_proto


def test_other_options_give_another_cached_model(english, tmp_path):
  first = tokenizers.load_or_train_sentencepiece(tmp_path, "en", english, OPTIONS)
  other = tokenizers.load_or_train_sentencepiece(
      tmp_path, "en", english, tokenizers.SentencePieceOptions(vocab_size=40))
  assert other.path != first.path and other.vocab_size == 40


def test_too_large_vocabulary_is_a_clear_error(english):
  with pytest.raises(ValueError, match="Vocabulary size too high"):
    tokenizers.train_sentencepiece(english[:5], tokenizers.SentencePieceOptions(vocab_size=5000))


@pytest.mark.parametrize("keep", [0.5, 0.0])
def test_a_truncated_cached_model_names_the_file_and_how_to_make_it_again(english, tmp_path, keep):
  """A ``.model`` cut short (a full disk, a copy interrupted) was SentencePiece's ``RuntimeError`` traceback
  (``ParseFromArray``); an empty one a misleading line about special ids."""
  cached = tokenizers.load_or_train_sentencepiece(tmp_path, "en", english, OPTIONS)
  with open(cached.path, "wb") as f:
    f.write(cached.model_proto[:int(len(cached.model_proto) * keep)])
  with pytest.raises(InputFileError) as raised:
    tokenizers.load_or_train_sentencepiece(tmp_path, "en", english, OPTIONS)
  message = str(raised.value)
  assert "\n" not in message
  assert f"{cached.path} is not a readable SentencePiece model (" in message
  assert "Delete it and run again to train it anew" in message and "WORKDIR/tokenizers/" in message
