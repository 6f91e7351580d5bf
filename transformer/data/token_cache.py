"""A tokenized training split on disk: tokenized once, then memory-mapped by every process that reads it.

A multi-process run plans each epoch from every example's length but builds only its own rows, so no process
needs the whole split's tokens in memory, nor the text they come from. The first reader (process 0 in
``Task.prepare_data``, or a single-process run on first use) tokenizes and writes, into ``folder``:

* ``<name>.<key>.<array>.npy``, each array of ``batching.TokenizedExamples``: ``source_tokens`` int32
  ``[source tokens]``, ``source_offsets`` int64 ``[num_examples + 1]``, and the same for the targets;
* ``<name>.<key>.json`` last, once the arrays are whole: the settings that decide them, their sizes, and the
  figures computed alongside (``stats``, e.g. pieces per word).

``<key>`` is the fingerprint of the settings (the tokenizers' fingerprints, the split and its size, what is kept,
``FORMAT_VERSION``): other settings name other files, so a cache is never reused for them. Later readers
``np.load(mmap_mode="r")`` the arrays: lengths come from the offsets, and a batch's gather reads only the pages
of its rows. An entry that does not match its record (a file cut short or missing, another shape) is named in one
warning line and written again; a folder that cannot be written (read-only, full) is named in one warning line,
and each process then tokenizes for itself, as before the cache.
"""
from __future__ import annotations

import json
import logging
import os
from typing import Any, Callable, Mapping

import numpy as np

from transformer.data import batching, files
from transformer.errors import WorkdirError

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1  # raise when what the files hold changes: older caches then miss instead of misleading
DTYPES = {"source_tokens": np.int32, "source_offsets": np.int64, "target_tokens": np.int32,
          "target_offsets": np.int64}  # TokenizedExamples' own, so that loading copies nothing

Tokenize = Callable[[], tuple[batching.TokenizedExamples, dict]]


def load_or_tokenize(folder: str | os.PathLike, name: str, settings: Mapping[str, Any],
                     tokenize: Tokenize) -> tuple[batching.TokenizedExamples, dict]:
  """``tokenize()``'s ``(examples, stats)``, read memory-mapped from ``folder`` when an earlier call with the same
  ``name`` and ``settings`` (JSON values) wrote them; else made by ``tokenize`` and written there.

  ``stats``: a small JSON-serialisable dict computed with the examples (it is kept in the record).
  """
  settings = json.loads(json.dumps({**settings, "format": FORMAT_VERSION}))  # as the record reads back (tuples: lists)
  stem = os.path.join(folder, f"{name}.{files.fingerprint(json.dumps(settings, sort_keys=True).encode())}")
  if os.path.exists(stem + ".json"):
    try:
      cached = _read(stem, settings)
      logger.info("%s: tokenized training examples memory-mapped from %s.*.npy", name, stem)
      return cached
    except ValueError as error:
      logger.warning("%s; tokenizing again", error)
  examples, stats = tokenize()
  try:
    _write(stem, settings, examples, stats)
  except (OSError, WorkdirError) as error:  # a read-only or full data dir: the cache only saves work
    logger.warning("%s: the tokenized training examples cannot be cached in %s (%s); every process tokenizes the "
                   "text itself", name, folder, error)
  else:
    logger.info("%s: tokenized training examples cached in %s.*.npy for the other processes and later runs", name,
                stem)
  return examples, stats


def _read(stem: str, settings: Mapping[str, Any]) -> tuple[batching.TokenizedExamples, dict]:
  """The cached ``(examples, stats)`` of ``stem``, arrays memory-mapped; ValueError naming the file that does not
  match the record ``<stem>.json``."""
  try:
    with open(stem + ".json", encoding="utf-8") as file:
      record = json.load(file)
    sizes = {"source_tokens": record["tokens"]["source"], "target_tokens": record["tokens"]["target"],
             "source_offsets": record["examples"] + 1, "target_offsets": record["examples"] + 1}
    stats = record["stats"]
  except (OSError, ValueError, KeyError, TypeError) as error:
    raise ValueError(f"the tokenized-examples record {stem}.json cannot be read ({error})") from None
  if record.get("settings") != settings:
    raise ValueError(f"the tokenized-examples record {stem}.json was written for other settings")
  arrays = {}
  for array, dtype in DTYPES.items():
    path = f"{stem}.{array}.npy"
    try:
      arrays[array] = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError, EOFError) as error:
      raise ValueError(f"the tokenized examples {path} cannot be read ({error})") from None
    if arrays[array].dtype != dtype or arrays[array].shape != (sizes[array],):
      raise ValueError(f"the tokenized examples {path} hold {arrays[array].dtype} {list(arrays[array].shape)}, "
                       f"not the {np.dtype(dtype)} [{sizes[array]}] of their record")
  for side in ("source", "target"):  # reads one page at each end, not the arrays
    offsets = arrays[f"{side}_offsets"]
    if offsets[0] != 0 or offsets[-1] != sizes[f"{side}_tokens"]:
      raise ValueError(f"the tokenized examples {stem}.{side}_offsets.npy do not span their "
                       f"{sizes[f'{side}_tokens']} tokens")
  return batching.TokenizedExamples(**arrays), stats


def _write(stem: str, settings: Mapping[str, Any], examples: batching.TokenizedExamples, stats: dict) -> None:
  """The arrays of ``examples``, then the record that makes them a cache entry, each file replaced whole; named per
  process, since processes that find no cache (their own disks) may write the same entry at once."""
  os.makedirs(os.path.dirname(stem), exist_ok=True)
  for array in DTYPES:
    with files.replacing(f"{stem}.{array}.npy", binary=True, per_process=True) as file:
      np.save(file, getattr(examples, array), allow_pickle=False)
  record = {"settings": settings, "examples": len(examples),
            "tokens": {"source": int(examples.source_tokens.size), "target": int(examples.target_tokens.size)},
            "stats": stats}
  with files.replacing(stem + ".json", per_process=True, encoding="utf-8") as file:
    json.dump(record, file, indent=2)
