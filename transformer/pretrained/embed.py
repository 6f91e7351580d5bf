"""Sentence embeddings from a pretrained BERT-family encoder, computed as sentence-transformers does.

    python -m transformer.pretrained.embed --model=DIR --input=FILE --output=OUT.npy

writes one embedding per line of ``FILE`` (UTF-8; the final newline ends the last line, an empty line is
embedded as an empty text) as a float32 ``[lines, hidden]`` array: the mean of the encoder's last hidden
states over the line's tokens ([CLS] and [SEP] included), L2-normalised (sentence-transformers' ``Pooling``
(mean) and ``Normalize`` modules, as all-MiniLM-L6-v2 uses them). Lines longer than ``--max_length`` tokens
are truncated (default: the model's ``sentence_bert_config.json``, else its position table).
"""
from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from transformer.errors import ConfigError, InputFileError, MissingDataError
from transformer.nn.config import ModelConfig
from transformer.nn.models import Encoder, mean_pool
from transformer.pretrained.bert import Params, load_bert
from transformer.pretrained.tokenizer import PretrainedTokenizer, pad_batch

# Batches are padded to a multiple of this many tokens, so that few distinct shapes get compiled.
LENGTH_MULTIPLE = 16
# As torch.nn.functional.normalize: an all-zero vector stays zero instead of becoming NaN.
NORM_EPSILON = 1e-12


def sentence_embeddings(config: ModelConfig, params: Params, tokens: jax.Array) -> jax.Array:
  """``[batch, length]`` int tokens (``config.pad_id`` = padding) -> ``[batch, d_model]`` float32
  unit-length embeddings: encoder states averaged over real tokens, then L2-normalised."""
  encoded = Encoder(config.replace(deterministic=True)).apply({"params": params}, tokens)
  pooled = mean_pool(encoded.astype(jnp.float32), tokens != config.pad_id)
  norm = jnp.linalg.norm(pooled, axis=-1, keepdims=True)
  return pooled / jnp.maximum(norm, NORM_EPSILON)


def embed_texts(config: ModelConfig, params: Params, tokenizer: PretrainedTokenizer, texts: Sequence[str],
                batch_size: int = 64, progress: Callable[[int, int], None] | None = None) -> np.ndarray:
  """float32 ``[len(texts), d_model]`` sentence embeddings, row ``i`` for ``texts[i]``.

  Texts are embedded in order of length (less padding), ``batch_size`` at a time; ``progress(done, total)``
  is called after each batch.
  """
  if batch_size < 1:
    raise ConfigError(f"batch_size={batch_size} must be a positive integer.")
  sequences = tokenizer.encode_batch(texts)
  order = np.argsort([len(sequence) for sequence in sequences], kind="stable")
  embeddings = np.zeros((len(texts), config.d_model), np.float32)
  embed = jax.jit(sentence_embeddings, static_argnums=0)
  for start in range(0, len(order), batch_size):
    rows = order[start:start + batch_size]
    batch = [sequences[row] for row in rows]
    length = -(-max(len(sequence) for sequence in batch) // LENGTH_MULTIPLE) * LENGTH_MULTIPLE
    tokens = pad_batch(batch, tokenizer.pad_id, length)
    # Full float32 matmuls on every backend (GPUs default to TF32), as the reference implementation.
    with jax.default_matmul_precision("highest"):
      embeddings[rows] = np.asarray(embed(config, params, tokens))
    if progress is not None:
      progress(start + len(rows), len(texts))
  return embeddings


def read_lines(path: str | os.PathLike) -> list[str]:
  """The lines of a UTF-8 text file, split on ``\\n`` only (a trailing ``\\r`` is dropped).

  Raises:
    MissingDataError: no such file.
    InputFileError: the file is not UTF-8 (naming the line).
  """
  path = pathlib.Path(path)
  if not path.is_file():
    raise MissingDataError(f"input file {path} does not exist; give a UTF-8 text file, one sentence per line.")
  data = path.read_bytes()
  try:
    text = data.decode("utf-8")
  except UnicodeDecodeError as error:
    line = data[:error.start].count(b"\n") + 1
    raise InputFileError(f"{path}, line {line}: not UTF-8 ({error.reason} at byte {error.start}); save the "
                         f"file as UTF-8.") from error
  lines = text.split("\n")
  if lines and not lines[-1]:
    lines.pop()  # the final newline ends the last line; it does not start an empty one
  return [line.removesuffix("\r") for line in lines]


def _print_progress(every_seconds: float = 5.0) -> Callable[[int, int], None]:
  """A ``progress`` that prints ``embedded done/total lines`` to stderr, at most every ``every_seconds``."""
  start = last = time.monotonic()

  def report(done: int, total: int) -> None:
    nonlocal last
    now = time.monotonic()
    if done == total or now - last >= every_seconds:
      last = now
      rate = done / max(now - start, 1e-9)
      print(f"embedded {done}/{total} lines ({rate:.0f} lines/s)", file=sys.stderr, flush=True)

  return report


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m transformer.pretrained.embed", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
  parser.add_argument("--model", required=True, help="model directory: config.json, model.safetensors, "
                      "tokenizer.json")
  parser.add_argument("--input", required=True, help="UTF-8 text file, one sentence per line")
  parser.add_argument("--output", required=True, help=".npy file to write, float32 [lines, hidden]")
  parser.add_argument("--batch_size", type=int, default=64, help="sentences per batch")
  parser.add_argument("--max_length", type=int, default=None,
                      help="tokens per sentence, [CLS] and [SEP] included (default: the model's own)")
  args = parser.parse_args(argv)
  try:
    config, params, tokenizer = load_bert(args.model, args.max_length)
    texts = read_lines(args.input)
    embeddings = embed_texts(config, params, tokenizer, texts, args.batch_size,
                             progress=_print_progress() if len(texts) > args.batch_size else None)
  except (ConfigError, MissingDataError, InputFileError) as error:
    print(f"error: {error}", file=sys.stderr)
    return 1
  output = pathlib.Path(args.output)
  output.parent.mkdir(parents=True, exist_ok=True)
  np.save(output, embeddings)
  print(f"wrote {output}: {embeddings.shape[0]} embeddings of {embeddings.shape[1]} floats", file=sys.stderr)
  return 0


if __name__ == "__main__":
  sys.exit(main())
