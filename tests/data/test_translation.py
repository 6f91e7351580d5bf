"""load_translation_data end to end on the tiny Multi30k and IWSLT fixtures."""
from __future__ import annotations

import logging
import os

import numpy as np
import pytest

from data_fixtures import IWSLT_SIZES, MULTI30K_SIZES
from transformer.data import batching, tokenizers, translation
from transformer.errors import ConfigError, InputFileError


def test_multi30k_both_directions_share_prepared_data_and_tokenizer(raw_root, tmp_path):
  data_dir = os.fspath(tmp_path / "tfds")
  data = translation.load_translation_data(
      "multi30k", "en-de", data_dir=data_dir, source_dir=raw_root, vocab_size=64)
  assert (data.source_language, data.target_language) == ("en", "de")
  assert data.source_tokenizer is data.target_tokenizer
  assert data.source_tokenizer.vocab_size == 64
  assert data.dataset_dir.startswith(data_dir)  # tokenizer cached next to the prepared data
  assert data.source_tokenizer.path.startswith(os.path.join(data.dataset_dir, "sentencepiece"))
  assert len(data.train) == MULTI30K_SIZES["train"]
  assert set(data.eval) == set(data.split_sizes) - {"train"}
  for split, examples in data.eval.items():
    assert len(examples) == len(data.eval_reference_text[split]) == data.split_sizes[split]
    for i in range(len(examples)):  # ids, source text and reference line up
      source, target = examples[i]
      assert data.source_tokenizer.decode(source) == data.eval_source_text[split][i]
      assert data.target_tokenizer.decode(target) == data.eval_reference_text[split][i]
      assert source.dtype == np.int32 and source[-1] == target[-1] == tokenizers.EOS_ID

  reverse = translation.load_translation_data(
      "multi30k", "de-en", data_dir=data_dir, source_dir=raw_root / "missing-but-unused",
      vocab_size=64, eval_splits=["validation"])  # already prepared: no source needed
  assert reverse.source_tokenizer.path == data.source_tokenizer.path  # cached, not retrained
  assert reverse.eval_source_text["validation"] == data.eval_reference_text["validation"]
  assert list(reverse.eval) == ["validation"]
  batches = list(batching.TokenBatcher(reverse.train, max_tokens=1024, max_length=128)
                 .iterator(num_epochs=1))
  assert sum(int((b["source"][:, 0] != 0).sum()) for b in batches) == len(reverse.train)


def test_iwslt_separate_vocabularies(raw_root, tmp_path):
  data = translation.load_translation_data(
      "iwslt15_en_vi", "en-vi", data_dir=os.fspath(tmp_path / "tfds"),
      source_dir=raw_root / "iwslt15_en_vi", vocab_size=40, shared_vocab=False)
  assert data.source_tokenizer is not data.target_tokenizer
  assert data.split_sizes == {"train": IWSLT_SIZES["train.10k"],
                              "validation": IWSLT_SIZES["tst2012"], "test": IWSLT_SIZES["tst2013"]}
  assert os.path.basename(data.source_tokenizer.path).startswith("en.")
  assert os.path.basename(data.target_tokenizer.path).startswith("vi.")
  # pieces per word, recounted from the raw training text with the tokenizers themselves (EOS not counted)
  for language, tokenizer in (("en", data.source_tokenizer), ("vi", data.target_tokenizer)):
    text = translation.read_split_text(translation.prepare_dataset(
        "iwslt15_en_vi", "en-vi", data_dir=os.fspath(tmp_path / "tfds"))[0], "train", ("en", "vi"))[language]
    pieces = sum(len(tokenizer.encode(sentence)) - 1 for sentence in text)
    words = sum(len(sentence.split()) for sentence in text)
    assert data.pieces_per_word[language] == pytest.approx(pieces / words)
    assert data.pieces_per_word[language] > 1.0  # a 40-piece vocabulary cannot keep words whole


def test_unknown_pair_or_split_is_a_clear_error(raw_root, tmp_path):
  with pytest.raises(ValueError, match="choose one of .*'de-en'"):
    translation.prepare_dataset("multi30k", "en-vi", data_dir=os.fspath(tmp_path))
  with pytest.raises(ConfigError, match="no split"):
    translation.load_translation_data("iwslt15_en_vi", "vi-en", data_dir=os.fspath(tmp_path),
                                      source_dir=raw_root, vocab_size=40, eval_splits=["tst2013"])


def test_training_pairs_are_tokenized_only_when_used(raw_root, tmp_path, caplog):
  """Evaluating or translating needs the tokenizer and the eval splits, not 29,000 tokenized training pairs."""
  caplog.set_level(logging.INFO, "transformer.data.translation")
  data = translation.load_translation_data("multi30k", "en-de", data_dir=os.fspath(tmp_path / "tfds"),
                                           source_dir=raw_root, vocab_size=64, eval_splits=["validation"])
  assert len(data.eval["validation"]) == data.split_sizes["validation"] > 0
  assert not any("training pairs" in record.getMessage() for record in caplog.records)
  assert len(data.train) == MULTI30K_SIZES["train"]  # on first use
  assert [record.getMessage() for record in caplog.records if "training pairs" in record.getMessage()] == [
      f"multi30k: tokenizing {MULTI30K_SIZES['train']} training pairs..."]
  assert data.pieces_per_word["en"] > 0 and len(data.train) == MULTI30K_SIZES["train"]  # computed once
  assert sum("training pairs" in record.getMessage() for record in caplog.records) == 1


def test_truncated_prepared_data_names_the_file_and_how_to_prepare_it_again(raw_root, tmp_path):
  """A prepared split or cached tokenizer cut short was a Riegeli or SentencePiece ``RuntimeError`` traceback."""
  data_dir = os.fspath(tmp_path / "tfds")
  data = translation.load_translation_data("multi30k", "en-de", data_dir=data_dir, source_dir=raw_root,
                                           vocab_size=64, eval_splits=["validation"])
  builder = translation.prepare_dataset("multi30k", "en-de", data_dir=data_dir)[0]
  [validation] = builder.info.splits["validation"].filepaths
  whole = validation.read_bytes()
  validation.write_bytes(whole[:len(whole) // 2])
  with pytest.raises(InputFileError) as raised:
    translation.load_translation_data("multi30k", "en-de", data_dir=data_dir, vocab_size=64,
                                      eval_splits=["validation"])
  message = str(raised.value)
  assert "\n" not in message
  assert "multi30k: the prepared validation split cannot be read (" in message
  assert f"{validation} is truncated or damaged" in message and f"rm -r {builder.data_dir}" in message

  validation.write_bytes(whole)
  model = data.source_tokenizer.path
  with open(model, "r+b") as f:
    f.truncate(len(data.source_tokenizer.model_proto) // 3)
  with pytest.raises(InputFileError, match=f"{model} is not a readable SentencePiece model"):
    translation.load_translation_data("multi30k", "en-de", data_dir=data_dir, vocab_size=64,
                                      eval_splits=["validation"])
