"""One language of a parallel-text dataset as language-model data: sentences, a SentencePiece tokenizer, ids.

    data = load_monolingual_data("multi30k", "en-de", "en", source_dir="../shared/data/multi30k", vocab_size=4000)
    data.train.target(0)  # int32 ids of the first English training sentence, ending with EOS

The sentences sit on the ``target`` side of ``batching.TokenizedExamples`` (sources are empty), so
``batching.TokenBatcher`` buckets and batches them by token count as it does translation pairs.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Callable, Mapping, Sequence

from etils import epath
import numpy as np

from transformer.data import batching, tokenizers
from transformer.data.translation import prepare_dataset, read_split_text, training_examples
from transformer.errors import ConfigError

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class MonolingualData:
  """Tokenized sentences of one language.

  Attributes:
    language: its code, e.g. ``"en"``.
    tokenizer: SentencePiece trained on the language's training sentences.
    train: the non-empty training sentences, as targets (ids ending with EOS) with empty sources; made on first
      use, memory-mapped from the tokenized cache (``translation.training_examples``), else tokenized and cached.
    eval: split name -> every sentence of the split (empty ones too), in file order, as ``train``.
    eval_text: split name -> the raw sentences, aligned with ``eval``.
    pieces_per_word: SentencePiece pieces per whitespace-separated training word (EOS not counted); with ``train``.
    tokenize_training_sentences: makes or reads ``(train, {language: pieces_per_word})``, once.
  """
  language: str
  tokenizer: tokenizers.SentencePieceTokenizer
  eval: Mapping[str, batching.TokenizedExamples]
  eval_text: Mapping[str, list[str]]
  tokenize_training_sentences: Callable[[], tuple[batching.TokenizedExamples, Mapping[str, float]]] = (
      dataclasses.field(repr=False, compare=False))

  @functools.cached_property
  def _training(self) -> tuple[batching.TokenizedExamples, Mapping[str, float]]:
    return self.tokenize_training_sentences()

  @property
  def train(self) -> batching.TokenizedExamples:
    return self._training[0]

  @property
  def pieces_per_word(self) -> float:
    return self._training[1][self.language]


def sentences_as_targets(ids: Sequence[np.ndarray]) -> batching.TokenizedExamples:
  """Token sequences ``[length_i]`` as the targets of examples without sources."""
  return batching.TokenizedExamples.from_sequences([np.zeros([0], np.int32)] * len(ids), ids)


def chunk_long_sequences(examples: batching.TokenizedExamples,
                         max_length: int) -> tuple[batching.TokenizedExamples, int]:
  """``(examples with each target longer than max_length cut into consecutive pieces, how many were cut)``.

  The pieces of a target are ``max_length`` tokens each, the last one the rest (its EOS included), in order,
  where the target was: the flat tokens are unchanged, only the offsets gain the cuts. Sources (empty for
  sentences as targets) stay empty. Without a long target, ``examples`` itself.
  """
  lengths = examples.target_lengths
  long = lengths > max_length
  if not long.any():
    return examples, 0
  pieces = -(-lengths // max_length)  # [num_examples] ceil; 0 for an empty target, which stays one example
  pieces = np.maximum(pieces, 1)
  # Each piece's length: max_length, except the last piece of a target, which holds the rest.
  piece_lengths = np.full(int(pieces.sum()), max_length, np.int64)
  last = np.cumsum(pieces) - 1
  piece_lengths[last] = lengths - (pieces - 1) * max_length
  offsets = np.concatenate([[0], np.cumsum(piece_lengths)])
  sources = np.repeat(examples.source_lengths, pieces)
  if sources.any():
    raise ValueError("chunk_long_sequences cuts targets of examples without sources (sentences as targets).")
  chunked = batching.TokenizedExamples(examples.source_tokens, np.zeros(len(piece_lengths) + 1, np.int64),
                                       examples.target_tokens, offsets)
  return chunked, int(long.sum())


def load_monolingual_data(name: str, pair: str, language: str, *, data_dir: epath.PathLike | None = None,
                          source_dir: epath.PathLike | None = None, vocab_size: int = 8000,
                          eval_splits: Sequence[str] = ("validation",),
                          tokenizer_options: tokenizers.SentencePieceOptions | None = None) -> MonolingualData:
  """Prepares the dataset (as ``translation.prepare_dataset``), trains or loads SentencePiece on the training
  sentences of ``language`` (a side of ``pair``), and tokenizes the ``eval_splits`` sentences (the training ones on
  first use of ``train``).

  The tokenizer is the one a non-shared translation vocabulary of ``language`` uses (same cache entry).
  """
  if language not in pair.split("-"):
    raise ConfigError(f"language {language!r} (config.task.language) is not a side of the pair {pair!r}; choose one "
                      f"of {pair.split('-')}.")
  builder, _, _ = prepare_dataset(name, pair, data_dir=data_dir, source_dir=source_dir)

  @functools.cache
  def train_text() -> list[str]:
    return [text for text in read_split_text(builder, "train", [language])[language] if text]

  options = dataclasses.replace(tokenizer_options or tokenizers.SentencePieceOptions(), vocab_size=vocab_size)
  tokenizer = tokenizers.load_or_train_sentencepiece(epath.Path(builder.data_dir) / "sentencepiece", language,
                                                     train_text, options)
  eval_text = {split: read_split_text(builder, split, [language])[language] for split in eval_splits}
  return MonolingualData(
      language=language, tokenizer=tokenizer,
      eval={split: sentences_as_targets(tokenizer.encode_batch(texts)) for split, texts in eval_text.items()},
      eval_text=eval_text,
      tokenize_training_sentences=functools.partial(
          training_examples, builder, [language], [tokenizer], "non-empty sentences",
          functools.partial(_tokenize_sentences, name, language, tokenizer, train_text)))


def _tokenize_sentences(name: str, language: str, tokenizer: tokenizers.SentencePieceTokenizer,
                        train_text: Callable[[], list[str]]) -> tuple[batching.TokenizedExamples, dict[str, float]]:
  """``(train, {language: pieces_per_word})`` of ``MonolingualData``: the non-empty training sentences, tokenized."""
  texts = train_text()
  train = sentences_as_targets(tokenizer.encode_batch(texts))
  words = sum(len(text.split()) for text in texts)
  pieces_per_word = (train.target_tokens.size - len(train)) / max(words, 1)
  logger.info("%s/%s: %d training sentences, %.3f pieces per word", name, language, len(train), pieces_per_word)
  return train, {language: pieces_per_word}
