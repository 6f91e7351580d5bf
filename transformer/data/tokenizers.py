"""SentencePiece tokenizers: trained on a training split, cached on disk, fixed special ids.

The model code assumes ``pad_id=0``, ``bos_id=1``, ``eos_id=2``; every tokenizer made here has
exactly these, plus ``unk_id=3`` (checked when a model is loaded). ``encode`` appends EOS (the
target a decoder must learn to end with; ``shift_right`` in ``ops`` prepends the BOS), ``decode``
stops at the first EOS and drops PAD and BOS, so it reads model output as it comes.

Training is capped (``max_sentences``, drawn reproducibly from the split), so it takes seconds
to tens of seconds, and its result is cached by :func:`load_or_train_sentencepiece` under a name
that carries every option, so a changed option trains a new model instead of reusing a stale one.
"""
from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import logging
import os
import pathlib
import re
import time
from typing import Callable, Iterable, Sequence

import numpy as np
import sentencepiece as spm

from transformer.data import files
from transformer.errors import ConfigError, InputFileError

PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3
SPECIAL_PIECES = {PAD_ID: "<pad>", BOS_ID: "<s>", EOS_ID: "</s>", UNK_ID: "<unk>"}

logger = logging.getLogger(__name__)


class SentencePieceTokenizer:
  """Text <-> int32 ids with a SentencePiece model; picklable (carries the model bytes).

  Args:
    model_proto: the serialized SentencePiece model (the bytes of a ``.model`` file).
    path: where it was loaded from, if anywhere (informational).
  """

  pad_id, bos_id, eos_id, unk_id = PAD_ID, BOS_ID, EOS_ID, UNK_ID

  def __init__(self, model_proto: bytes, path: str | os.PathLike | None = None):
    self._model_proto = bytes(model_proto)
    self.path = None if path is None else os.fspath(path)
    self._processor = spm.SentencePieceProcessor(model_proto=self._model_proto)
    found = {"pad": self._processor.pad_id(), "bos": self._processor.bos_id(),
             "eos": self._processor.eos_id(), "unk": self._processor.unk_id()}
    wanted = {"pad": PAD_ID, "bos": BOS_ID, "eos": EOS_ID, "unk": UNK_ID}
    if found != wanted:
      raise ValueError(f"SentencePiece model {self.path or ''} has special ids {found}; this "
                       f"codebase needs {wanted}. Train it with train_sentencepiece().")

  @classmethod
  def from_file(cls, path: str | os.PathLike) -> SentencePieceTokenizer:
    """The tokenizer of a ``.model`` file.

    Raises:
      InputFileError: the file is empty or no SentencePiece model (truncated by a full disk or a copy cut short),
        naming it and how to make it again.
    """
    model_proto = pathlib.Path(path).read_bytes()
    try:
      if not model_proto:
        raise RuntimeError("the file is empty")
      return cls(model_proto, path=path)
    except RuntimeError as error:  # SentencePiece's parse error of a cut protobuf
      reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
      reason = reason if len(reason) <= 120 else reason[:117] + "..."
      raise InputFileError(
          f"{path} is not a readable SentencePiece model ({reason}): it is truncated or damaged. Delete it and run "
          f"again to train it anew from the training data; for a trained run, copy the run's own model back from "
          f"WORKDIR/tokenizers/ instead (a retrained model can cut text into other pieces).") from None

  @property
  def vocab_size(self) -> int:
    return self._processor.get_piece_size()

  @property
  def model_proto(self) -> bytes:
    return self._model_proto

  @property
  def fingerprint(self) -> str:
    """SHA-256 (first 12 hex digits) of the serialised model: two tokenizers with one fingerprint encode alike.
    The cache key cannot promise that: the same options and text trained on another host can give another model."""
    return files.fingerprint(self._model_proto)

  def encode(self, text: str, *, add_eos: bool = True) -> np.ndarray:
    """int32 ``[length]`` ids of ``text``, ending with EOS when ``add_eos``."""
    return self.encode_batch([text], add_eos=add_eos)[0]

  def encode_batch(self, texts: Sequence[str], *, add_eos: bool = True) -> list[np.ndarray]:
    """One int32 ``[length_i]`` array per text (SentencePiece's own threads do the work)."""
    ids = self._processor.encode(list(texts), add_eos=add_eos, num_threads=os.cpu_count() or 1)
    return [np.asarray(sequence, np.int32) for sequence in ids]

  def decode(self, ids: Iterable[int]) -> str:
    """Text of ``ids`` up to the first EOS, PAD and BOS dropped.

    Args:
      ids: ``[length]`` ints, e.g. one row of a decoder's output.
    """
    kept = []
    for token in np.asarray(ids, np.int64).reshape(-1).tolist():
      if token == EOS_ID:
        break
      if token not in (PAD_ID, BOS_ID):
        kept.append(token)
    return self._processor.decode(kept)

  def decode_batch(self, ids: Iterable[Iterable[int]]) -> list[str]:
    """One text per row of ``ids`` (``[batch, length]`` array or list of sequences)."""
    return [self.decode(row) for row in ids]

  def __getstate__(self):
    return {"model_proto": self._model_proto, "path": self.path}

  def __setstate__(self, state):
    self.__init__(state["model_proto"], path=state["path"])

  def __repr__(self):
    return f"SentencePieceTokenizer(vocab_size={self.vocab_size}, path={self.path!r})"


@dataclasses.dataclass(frozen=True)
class SentencePieceOptions:
  """How a SentencePiece model is trained; every field is part of the cache key."""
  vocab_size: int = 8000  # pieces, the 4 specials included
  model_type: str = "unigram"  # "unigram" or "bpe" (also "char", "word")
  # Fraction of characters the model must cover; 1.0 suits small alphabets (en, de, vi, ...).
  character_coverage: float = 1.0
  # Cap on training sentences, drawn reproducibly by `seed`: bounds training time (~100k lines
  # train in well under a minute on 2 cores) while keeping the vocabulary representative.
  max_sentences: int = 100_000
  seed: int = 0

  def fingerprint(self) -> str:
    text = json.dumps(dataclasses.asdict(self), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def sample_sentences(sentences: Sequence[str], max_sentences: int, seed: int = 0) -> list[str]:
  """Up to ``max_sentences`` non-empty sentences, a reproducible random subset in original order."""
  sentences = [sentence for sentence in sentences if sentence]
  if len(sentences) <= max_sentences:
    return sentences
  chosen = np.random.default_rng(seed).choice(len(sentences), max_sentences, replace=False)
  return [sentences[index] for index in np.sort(chosen)]


def train_sentencepiece(sentences: Sequence[str],
                        options: SentencePieceOptions = SentencePieceOptions(),
                        model_path: str | os.PathLike | None = None) -> SentencePieceTokenizer:
  """Trains a model on (a capped sample of) ``sentences``; writes it to ``model_path`` if given.

  Raises:
    ConfigError: ``vocab_size`` is too large for the text, or smaller than its characters and the specials.
    ValueError: any other failure of SentencePiece's training.
  """
  sample = sample_sentences(sentences, options.max_sentences, options.seed)
  if not sample:
    raise ValueError("train_sentencepiece: no non-empty sentence to train on.")
  spm.set_random_generator_seed(options.seed)
  model = io.BytesIO()
  try:
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sample), model_writer=model,
        vocab_size=options.vocab_size, model_type=options.model_type,
        character_coverage=options.character_coverage,
        input_sentence_size=options.max_sentences, shuffle_input_sentence=False,
        pad_id=PAD_ID, bos_id=BOS_ID, eos_id=EOS_ID, unk_id=UNK_ID,
        pad_piece=SPECIAL_PIECES[PAD_ID], bos_piece=SPECIAL_PIECES[BOS_ID],
        eos_piece=SPECIAL_PIECES[EOS_ID], unk_piece=SPECIAL_PIECES[UNK_ID],
        num_threads=os.cpu_count() or 1, minloglevel=2)
  except RuntimeError as error:
    _raise_if_vocab_size_does_not_fit(str(error), options.vocab_size, len(sample))
    raise ValueError(f"SentencePiece training on {len(sample)} sentences with {options} failed: "
                     f"{error}") from error
  tokenizer = SentencePieceTokenizer(model.getvalue())
  if model_path is not None:
    _write_atomically(pathlib.Path(model_path), tokenizer.model_proto)
    tokenizer.path = os.fspath(model_path)
  return tokenizer


def _raise_if_vocab_size_does_not_fit(message: str, vocab_size: int, num_sentences: int) -> None:
  """A ``ConfigError`` naming the bound when SentencePiece's ``message`` says the vocabulary does not fit the text."""
  too_high = re.search(r"Vocabulary size too high \(\d+\)\. Please set it to a value <= (\d+)", message)
  if too_high:
    raise ConfigError(f"Vocabulary size too high: SentencePiece makes at most {too_high[1]} pieces of these "
                      f"{num_sentences} sentences, not {vocab_size}; set config.task.vocab_size to at most "
                      f"{too_high[1]}.")
  # Every character of the text is a piece of its own (character_coverage 1.0), and so is each special.
  too_low = re.search(r"Vocabulary size is smaller than required_chars\. \d+ vs (\d+)", message)
  if too_low:
    raise ConfigError(f"Vocabulary size too low: SentencePiece needs at least {too_low[1]} pieces for these "
                      f"{num_sentences} sentences (one per character, {len(SPECIAL_PIECES)} special), not "
                      f"{vocab_size}; set config.task.vocab_size to at least {too_low[1]}.")


def load_or_train_sentencepiece(
    cache_dir: str | os.PathLike, name: str,
    sentences: Sequence[str] | Callable[[], Sequence[str]],
    options: SentencePieceOptions = SentencePieceOptions()) -> SentencePieceTokenizer:
  """Loads ``<cache_dir>/<name>.<model_type><vocab_size>.<fingerprint>.model``, else trains it.

  Args:
    cache_dir: folder for the model (created if needed), e.g. next to the prepared dataset.
    name: what the model is for, e.g. ``"en-de"`` (shared) or ``"en"``; part of the file name.
    sentences: the training text, or a function returning it (only called when training).
    options: training options; all of them are in the cache key.

  Returns:
    The tokenizer; ``tokenizer.path`` is the model file. A ``.json`` beside it records the
    options, the number of training sentences, the training time, the model's fingerprint and the
    sentencepiece version that trained it.
  """
  cache_dir = pathlib.Path(cache_dir)
  stem = f"{name}.{options.model_type}{options.vocab_size}.{options.fingerprint()}"
  model_path = cache_dir / f"{stem}.model"
  if model_path.exists():
    logger.info("SentencePiece %s: reusing %s", name, model_path)
    return SentencePieceTokenizer.from_file(model_path)
  sample = sample_sentences(sentences() if callable(sentences) else sentences,
                            options.max_sentences, options.seed)
  logger.info("SentencePiece %s: training vocab %d on %d sentences (cached for later runs)...", name,
              options.vocab_size, len(sample))
  start = time.perf_counter()
  cache_dir.mkdir(parents=True, exist_ok=True)
  tokenizer = train_sentencepiece(sample, options, model_path)
  seconds = time.perf_counter() - start
  record = {"options": dataclasses.asdict(options), "name": name,
            "num_sentences": len(sample),
            "training_seconds": round(seconds, 3), "vocab_size": tokenizer.vocab_size,
            # Not in the cache key (a cached model stays in use across upgrades), but versions train differently.
            "sentencepiece_version": spm.__version__, "fingerprint": tokenizer.fingerprint}
  _write_atomically(cache_dir / f"{stem}.json", json.dumps(record, indent=2).encode())
  logger.info("SentencePiece %s: trained vocab %d on %d sentences in %.1f s -> %s", name,
              tokenizer.vocab_size, record["num_sentences"], seconds, model_path)
  return tokenizer


def _write_atomically(path: pathlib.Path, data: bytes) -> None:
  """Readers see the old file or the whole new one, never a partial write."""
  temporary = path.with_name(f"{path.name}.tmp{os.getpid()}")
  temporary.write_bytes(data)
  os.replace(temporary, path)
