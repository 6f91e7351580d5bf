"""The raw files a prepared dataset is built from: their fingerprints, checked on every reuse.

A prepared TFDS dataset is a cache of its raw files (a Kaggle CSV, the UCI file, ...). The builders record the
fingerprint (size and SHA-256) of every raw file they read in the prepared data's metadata
(:data:`METADATA_KEY`), and :func:`check_prepared` compares it with the raw files in the source folder each
time the prepared data is reused: a file changed since (cut for a quick test, then restored) is one
:class:`InputFileError` line naming both fingerprints and the fix, never a silent reuse of the old rows.
:func:`data_fingerprint` is what a run records of the data it trained on.

A file that is not the published release (a known size and SHA-256, :class:`Release`) is accepted, with one
WARNING line naming how it differs (rows, date range: :func:`warn_unless_release`); an empty split is one
:class:`InputFileError` line (:func:`check_nonempty_splits`).
"""
from __future__ import annotations

import dataclasses
import hashlib
import logging
from typing import Callable, Mapping

from etils import epath
import tensorflow_datasets as tfds

from transformer.errors import InputFileError

logger = logging.getLogger(__name__)

# Key of the prepared data's metadata (``metadata.json`` beside ``dataset_info.json``): file name ->
# {"size": bytes, "sha256": hex digest} of every raw file the data was built from.
METADATA_KEY = "source_fingerprints"
_CHUNK_BYTES = 1 << 20


@dataclasses.dataclass(frozen=True)
class FileFingerprint:
  """Size in bytes and SHA-256 (hex) of a file's bytes: equal fingerprints, equal files."""
  size: int
  sha256: str

  @classmethod
  def of(cls, path: epath.PathLike) -> FileFingerprint:
    digest, size = hashlib.sha256(), 0
    with epath.Path(path).open("rb") as file:
      while chunk := file.read(_CHUNK_BYTES):
        digest.update(chunk)
        size += len(chunk)
    return cls(size, digest.hexdigest())

  def to_json(self) -> dict:
    return {"size": self.size, "sha256": self.sha256}

  @classmethod
  def from_json(cls, data: Mapping) -> FileFingerprint:
    return cls(int(data["size"]), str(data["sha256"]))

  def __str__(self) -> str:
    """What a message shows: ``"987,712 bytes, sha256 61111c6dc31e"`` (12 hex digits tell files apart)."""
    return f"{self.size:,} bytes, sha256 {self.sha256[:12]}"


@dataclasses.dataclass(frozen=True)
class Release:
  """A published raw file: its fingerprint and what it holds, to say how another file differs from it.

  Attributes:
    fingerprint: the published size and SHA-256.
    source: where the digest was published (named in the warning).
    contents: what the release holds, in the words the warning compares with (rows, time span).
  """
  fingerprint: FileFingerprint
  source: str
  contents: str


def fingerprint_files(paths: Mapping[str, epath.PathLike]) -> dict[str, FileFingerprint]:
  """file name -> fingerprint of each of ``paths`` (file name -> path)."""
  return {name: FileFingerprint.of(path) for name, path in paths.items()}


def record(builder: tfds.core.DatasetBuilder, fingerprints: Mapping[str, FileFingerprint]) -> None:
  """Saves ``fingerprints`` with the data being prepared (``builder.info.metadata``, a ``MetadataDict``)."""
  builder.info.metadata[METADATA_KEY] = {name: fingerprint.to_json() for name, fingerprint in fingerprints.items()}


def recorded(builder: tfds.core.DatasetBuilder) -> dict[str, FileFingerprint]:
  """file name -> fingerprint recorded by the prepared data of ``builder``; empty when none is."""
  metadata = builder.info.metadata or {}
  return {name: FileFingerprint.from_json(value) for name, value in metadata.get(METADATA_KEY, {}).items()}


def check_prepared(builder: tfds.core.DatasetBuilder, paths: Mapping[str, epath.PathLike]) -> None:
  """Refuses prepared data built from other raw files than ``paths`` (file name -> path) now hold.

  Refusing, not rebuilding, is deliberate: TFDS fixes the prepared data's folder when the builder is made,
  before the source is known (``manual_dir`` comes later), so a rebuild could only replace the folder in
  place, under any run reading it at the same time (seeds of one sweep share the data_dir); and a silent
  rebuild leaves the runs trained on the old rows looking comparable with the new ones. One line saying
  which file changed and which folder to remove costs one command.

  Raises:
    InputFileError: naming the file, both fingerprints, the prepared folder and the fix.
  """
  before = recorded(builder)
  changed = []
  for name, path in paths.items():
    now = FileFingerprint.of(path)
    if name in before and before[name] != now:
      changed.append(f"{path} is now {now}, the prepared data was built from {before[name]}")
  if changed:
    raise InputFileError(
        f"{builder.name}: the raw files changed since {builder.data_dir} was prepared: {'; '.join(changed)}. "
        f"Remove that folder to prepare the data again from the files now there (rm -r {builder.data_dir}), "
        f"or put the old files back.")


def data_fingerprint(builder: tfds.core.DatasetBuilder) -> dict[str, str]:
  """``"<dataset>/<file>"`` -> ``"size=<bytes> sha256=<hex>"`` of every raw file the prepared data of
  ``builder`` was built from: what a run records of the data it trained on; equal dicts, equal raw files."""
  return {f"{builder.name}/{name}": f"size={fingerprint.size} sha256={fingerprint.sha256}"
          for name, fingerprint in sorted(recorded(builder).items())}


def warn_unless_release(dataset: str, path: epath.PathLike, fingerprint: FileFingerprint, release: Release,
                        describe: Callable[[], str]) -> bool:
  """Logs one WARNING line when ``fingerprint`` is not the release's; returns whether it is the release.

  Args:
    describe: what the file holds, in the terms of ``release.contents`` (rows, date range); only called for
      a file that differs.
  """
  if fingerprint == release.fingerprint:
    return True
  logger.warning("%s: %s is not the published release (%s; the release, per %s: %s): it holds %s, the "
                 "release %s.", dataset, path, fingerprint, release.source, release.fingerprint, describe(),
                 release.contents)
  return False


def check_nonempty_splits(dataset: str, counts: Mapping[str, int], source: str, rule: str) -> None:
  """Refuses to prepare a split without examples (TFDS would fail with an ``AssertionError``).

  Args:
    counts: split -> number of examples.
    source: what was read, e.g. the file and what it holds.
    rule: how examples are assigned to splits.

  Raises:
    InputFileError: naming the empty splits, the source and the rule.
  """
  empty = [split for split, count in counts.items() if count == 0]
  if empty:
    raise InputFileError(f"{dataset}: no example for split(s) {', '.join(empty)} in {source}; {rule}. Use the "
                         f"complete file.")
