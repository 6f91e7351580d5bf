"""The tokenized training split is cached once and memory-mapped after: the same examples as tokenizing the text,
no tokenizing on a later read, a new entry for other tokenizers or settings, and a damaged entry written again."""
from __future__ import annotations

import errno
import logging
import mmap
import os

import numpy as np
import pytest

from transformer.data import batching, monolingual, parallel_text, token_cache, translation

ARRAYS = tuple(token_cache.DTYPES)


def is_memory_mapped(array: np.ndarray) -> bool:
  while array is not None:
    if isinstance(array, (np.memmap, mmap.mmap)):
      return True
    array = getattr(array, "base", None)
  return False


def assert_same_examples(found: batching.TokenizedExamples, expected: batching.TokenizedExamples) -> None:
  for array in ARRAYS:
    assert getattr(found, array).dtype == getattr(expected, array).dtype
    np.testing.assert_array_equal(getattr(found, array), getattr(expected, array))


def refuse_to_tokenize(*args, **kwargs):
  raise AssertionError("tokenized the text although the cache holds it")


def cache_records(data_dir) -> list[str]:
  return sorted(path.name for path in data_dir.rglob("tokenized/*.json"))


def test_translation_reads_the_cached_pairs_memory_mapped_instead_of_tokenizing(raw_root, tmp_path, monkeypatch):
  load = lambda: translation.load_translation_data("iwslt15_en_vi", "en-vi", data_dir=os.fspath(tmp_path / "tfds"),
                                                   source_dir=raw_root / "iwslt15_en_vi", vocab_size=40,
                                                   shared_vocab=False, eval_splits=["validation"])
  fresh = load()
  tokenized = fresh.train  # tokenized here, and written
  assert not is_memory_mapped(tokenized.source_tokens)
  monkeypatch.setattr(translation, "_tokenize_training_pairs", refuse_to_tokenize)
  read_split = parallel_text.read_prepared_split
  monkeypatch.setattr(parallel_text, "read_prepared_split",  # nor is the training text read
                      lambda builder, split: refuse_to_tokenize() if split == "train" else read_split(builder, split))
  cached = load()
  assert_same_examples(cached.train, tokenized)
  assert cached.pieces_per_word == fresh.pieces_per_word
  assert all(is_memory_mapped(getattr(cached.train, array)) for array in ARRAYS)


def test_language_model_reads_the_cached_sentences_memory_mapped_instead_of_tokenizing(raw_root, tmp_path,
                                                                                       monkeypatch):
  load = lambda: monolingual.load_monolingual_data("multi30k", "en-de", "de", data_dir=os.fspath(tmp_path / "tfds"),
                                                   source_dir=raw_root / "multi30k", vocab_size=48)
  fresh = load()
  tokenized = fresh.train
  monkeypatch.setattr(monolingual, "_tokenize_sentences", refuse_to_tokenize)
  cached = load()
  assert_same_examples(cached.train, tokenized)  # its empty sources too
  assert cached.pieces_per_word == fresh.pieces_per_word > 1.0
  assert is_memory_mapped(cached.train.target_tokens)


def test_other_tokenizers_or_direction_make_a_new_entry_not_the_old_one(raw_root, tmp_path, caplog):
  caplog.set_level(logging.INFO, "transformer.data.translation")
  data_dir = tmp_path / "tfds"
  load = lambda pair, vocab_size: translation.load_translation_data(
      "multi30k", pair, data_dir=os.fspath(data_dir), source_dir=raw_root / "multi30k", vocab_size=vocab_size,
      eval_splits=["validation"])
  first = load("en-de", 64).train
  assert len(cache_records(data_dir)) == 1
  for pair, vocab_size in (("en-de", 48), ("de-en", 64)):
    caplog.clear()
    data = load(pair, vocab_size)
    other = data.train
    assert any("training pairs..." in record.getMessage() for record in caplog.records)  # tokenized, not reused
    expected = translation._tokenize(data.source_tokenizer, data.target_tokenizer, pair.split("-"),
                                     translation.read_split_text(translation.prepare_dataset(
                                         "multi30k", pair, data_dir=os.fspath(data_dir))[0], "train",
                                                                 pair.split("-")))
    assert_same_examples(other, expected)
  assert len(cache_records(data_dir)) == 3
  np.testing.assert_array_equal(load("en-de", 64).train.target_tokens, first.target_tokens)


def small_examples() -> batching.TokenizedExamples:
  rng = np.random.default_rng(0)
  return batching.TokenizedExamples.from_sequences(
      [rng.integers(3, 50, length, dtype=np.int32) for length in rng.integers(1, 20, 40)],
      [rng.integers(3, 50, length, dtype=np.int32) for length in rng.integers(1, 20, 40)])


def counting_tokenizer(examples):
  calls = []

  def tokenize():
    calls.append(1)
    return examples, {"en": 1.25}
  return tokenize, calls


def test_a_changed_setting_misses_the_cache(tmp_path):
  examples = small_examples()
  tokenize, calls = counting_tokenizer(examples)
  for settings in ({"tokenizers": ("aaa",)}, {"tokenizers": ("aaa",)}, {"tokenizers": ("bbb",)}):  # tuples: JSON lists
    token_cache.load_or_tokenize(tmp_path, "train.en-de", settings, tokenize)
  assert len(calls) == 2


@pytest.mark.parametrize("damage", ["truncate tokens", "remove offsets", "garble record", "other sizes"])
def test_a_damaged_entry_is_named_in_one_line_and_written_again(tmp_path, caplog, damage):
  examples = small_examples()
  tokenize, calls = counting_tokenizer(examples)
  token_cache.load_or_tokenize(tmp_path, "train.en-de", {"split": "train"}, tokenize)
  [record] = tmp_path.glob("*.json")
  stem = str(record)[:-len(".json")]
  if damage == "truncate tokens":
    path = f"{stem}.target_tokens.npy"
    os.truncate(path, os.path.getsize(path) - 8)
  elif damage == "remove offsets":
    os.remove(f"{stem}.source_offsets.npy")
  elif damage == "garble record":
    record.write_text(record.read_text()[:20])
  else:
    np.save(f"{stem}.source_tokens.npy", np.zeros([3], np.int32))
  caplog.set_level(logging.WARNING, "transformer.data.token_cache")
  rebuilt, stats = token_cache.load_or_tokenize(tmp_path, "train.en-de", {"split": "train"}, tokenize)
  assert len(calls) == 2 and stats == {"en": 1.25}
  [warning] = [record.getMessage() for record in caplog.records]
  assert "\n" not in warning and stem in warning and warning.endswith("tokenizing again")
  cached, _ = token_cache.load_or_tokenize(tmp_path, "train.en-de", {"split": "train"}, tokenize)
  assert len(calls) == 2  # whole again
  assert_same_examples(cached, examples)
  assert not [path for path in os.listdir(tmp_path) if ".tmp" in path]


@pytest.mark.parametrize("pack", [False, True])
def test_memory_mapped_examples_batch_as_those_in_memory(tmp_path, pack):
  """Read-only mapped arrays: the batcher only gathers from them, and gets the same batches."""
  examples = small_examples()
  token_cache.load_or_tokenize(tmp_path, "train.en-de", {}, lambda: (examples, {}))
  mapped, _ = token_cache.load_or_tokenize(tmp_path, "train.en-de", {}, refuse_to_tokenize)
  assert not mapped.target_tokens.flags.writeable
  for process_index in range(2):  # each of 2 processes gathers only its rows
    iterators = []
    for data in (examples, mapped):
      iterators.append(batching.TokenBatcher(data, max_tokens=64, max_length=32, seed=3, pack=pack)
                       .iterator(num_epochs=2))
      iterators[-1].build_host_rows(process_index, 2)
    for expected, found in zip(*iterators, strict=True):
      assert expected.keys() == found.keys()
      for name in expected:
        np.testing.assert_array_equal(found[name], expected[name])


def test_a_data_dir_that_cannot_be_written_gives_the_examples_and_one_warning(tmp_path, caplog, monkeypatch):
  """A shared, read-only prepared dataset (or a full disk) costs the saving, not the run."""
  def read_only(*args, **kwargs):
    raise OSError(errno.EROFS, "Read-only file system")
  monkeypatch.setattr(np, "save", read_only)
  caplog.set_level(logging.WARNING, "transformer.data.token_cache")
  examples = small_examples()
  found, stats = token_cache.load_or_tokenize(tmp_path, "train.en-de", {}, lambda: (examples, {"en": 1.0}))
  assert found is examples and stats == {"en": 1.0}
  [warning] = [record.getMessage() for record in caplog.records]
  assert "cannot be cached" in warning and "Read-only file system" in warning and "\n" not in warning
  assert not list(tmp_path.glob("*.json")) and not [path for path in os.listdir(tmp_path) if ".tmp" in path]
