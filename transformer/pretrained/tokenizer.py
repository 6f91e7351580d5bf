"""A pretrained model's own tokenizer: a Hugging Face ``tokenizer.json`` run by the ``tokenizers`` library.

For BERT that is WordPiece after BERT's normaliser (lowercasing for uncased models), with ``[CLS] ... [SEP]``
added around each text, so the ids are exactly those the checkpoint was trained on. Padding and truncation
settings stored in the file are replaced: texts are truncated to ``max_length`` tokens (special tokens
included) and batches are padded by :func:`pad_batch` to their longest text.
"""
from __future__ import annotations

import os
from typing import Iterable, Sequence

import numpy as np
import tokenizers

from transformer.errors import ConfigError


class PretrainedTokenizer:
  """Text -> int32 ids with a ``tokenizer.json``; picklable (carries the JSON text).

  Args:
    tokenizer_json: the text of a ``tokenizer.json`` file.
    max_length: the most tokens of an encoded text, special tokens included (longer texts lose their end).
    pad_id: the id that pads batches (the model's ``pad_token_id``).
    path: where the JSON was read from, if anywhere (informational).
  """

  def __init__(self, tokenizer_json: str, max_length: int, pad_id: int = 0,
               path: str | os.PathLike | None = None):
    if max_length < 3:
      raise ConfigError(f"PretrainedTokenizer: max_length={max_length} leaves no room for a text between "
                       f"the special tokens; use at least 3.")
    self._json = tokenizer_json
    self.max_length = max_length
    self.pad_id = pad_id
    self.path = None if path is None else os.fspath(path)
    self._tokenizer = tokenizers.Tokenizer.from_str(tokenizer_json)
    self._tokenizer.no_padding()
    self._tokenizer.enable_truncation(max_length)

  @classmethod
  def from_file(cls, path: str | os.PathLike, max_length: int, pad_id: int = 0) -> PretrainedTokenizer:
    with open(path, encoding="utf-8") as file:
      return cls(file.read(), max_length, pad_id, path=path)

  @property
  def vocab_size(self) -> int:
    return self._tokenizer.get_vocab_size()

  def token_to_id(self, token: str) -> int | None:
    return self._tokenizer.token_to_id(token)

  def encode(self, text: str) -> np.ndarray:
    """int32 ``[length]`` ids of ``text`` with the model's special tokens, ``length <= max_length``."""
    return self.encode_batch([text])[0]

  def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
    """One int32 ``[length_i]`` array per text (the library's threads do the work)."""
    return [np.asarray(encoding.ids, np.int32) for encoding in self._tokenizer.encode_batch(list(texts))]

  def decode(self, ids: Iterable[int]) -> str:
    """Text of ``[length]`` ids, special and padding tokens dropped."""
    return self._tokenizer.decode([int(token) for token in np.asarray(ids).reshape(-1)],
                                  skip_special_tokens=True)

  def __getstate__(self):
    return {"tokenizer_json": self._json, "max_length": self.max_length, "pad_id": self.pad_id,
            "path": self.path}

  def __setstate__(self, state):
    self.__init__(**state)

  def __repr__(self):
    return (f"PretrainedTokenizer(vocab_size={self.vocab_size}, max_length={self.max_length}, "
            f"path={self.path!r})")


def pad_batch(sequences: Sequence[np.ndarray], pad_id: int, length: int | None = None) -> np.ndarray:
  """``[batch, length]`` int32: each sequence followed by ``pad_id`` up to ``length`` (default: the longest).

  Raises:
    ValueError: a sequence is longer than ``length``.
  """
  longest = max((len(sequence) for sequence in sequences), default=0)
  length = longest if length is None else length
  if longest > length:
    raise ValueError(f"pad_batch: a sequence has {longest} tokens, more than length={length}.")
  batch = np.full((len(sequences), length), pad_id, np.int32)
  for row, sequence in enumerate(sequences):
    batch[row, :len(sequence)] = sequence
  return batch
