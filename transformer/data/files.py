"""Writing files whole: a new content replaces the old only once it is all on disk, and a full disk is one line;
reading the tab-separated tables written so (``read_table``), a damaged line named by its file and number.

Every layer that writes a file a user keeps (a run's record, predictions, translations, results pages) goes
through :func:`write_atomically` or :func:`replacing`: the content goes to ``<path>.tmp`` in the same folder and
``os.replace`` puts it in place, so a crash, a kill or a full disk midway leaves the old file whole. A full disk
(``ENOSPC``, ``EDQUOT``, or tensorstore's text of them) becomes :func:`disk_full_error`, one ``WorkdirError``
naming the folder, the size and the free space; a file over the process's file-size limit (``ulimit -f``:
``EFBIG``, Python ignores the SIGXFSZ that would otherwise kill the process) is refused the same way, in one line
naming the limit (:func:`write_refused_error`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import os
import resource
import shutil
from typing import IO, Callable, Iterator, TypeVar

from transformer.errors import InputFileError, WorkdirError

Row = TypeVar("Row")


def is_disk_full(error: BaseException) -> bool:
  """Whether ``error`` (or an error it was raised from) says the disk or the user's quota is full: an
  ``OSError`` with ENOSPC or EDQUOT, or tensorstore's ``RESOURCE_EXHAUSTED`` text, which carries only the
  message (``No space left on device [os_error_code='28']``)."""
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
      return True
    text = str(error)
    if "No space left on device" in text or "Disk quota exceeded" in text or f"os_error_code='{errno.ENOSPC}'" in text:
      return True
    error = error.__cause__ or error.__context__
  return False


def is_file_too_large(error: BaseException) -> bool:
  """Whether ``error`` (or an error it was raised from) is a write past the process's file-size limit
  (``ulimit -f``): an ``OSError`` with EFBIG, or tensorstore's text of it (``File too large
  [os_error_code='27']``)."""
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    if isinstance(error, OSError) and error.errno == errno.EFBIG:
      return True
    if "File too large" in str(error) or f"os_error_code='{errno.EFBIG}'" in str(error):
      return True
    error = error.__cause__ or error.__context__
  return False


def is_write_refused(error: BaseException) -> bool:
  """Whether the system refused a write for want of room: a full disk or quota (``is_disk_full``), or the
  process's file-size limit (``is_file_too_large``). Each is one line (``write_refused_error``), never a
  traceback."""
  return is_disk_full(error) or is_file_too_large(error)


def file_size_limit() -> str:
  """The soft file-size limit of this process (``ulimit -f``), e.g. ``200 KiB``."""
  limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
  return "none" if limit == resource.RLIM_INFINITY else format_bytes(limit)


def file_too_large_error(path: str, what: str, then: str = "rerun the same command") -> WorkdirError:
  """The one-line error for a write to ``path`` past the process's file-size limit."""
  return WorkdirError(f"cannot write {what} ({path}): a file would exceed this process's file-size limit "
                      f"(ulimit -f: {file_size_limit()}). Raise it (ulimit -f unlimited), then {then}.")


def write_refused_error(error: BaseException, path: str, needed: int, what: str,
                        at_least: bool = False) -> WorkdirError:
  """The one-line error of a write ``is_write_refused`` says the system refused: ``file_too_large_error`` or
  ``disk_full_error``."""
  if is_file_too_large(error):
    return file_too_large_error(path, what)
  return disk_full_error(path, needed, what, at_least)


def format_bytes(count: float) -> str:
  """``452 KiB``, ``1.3 GiB``: sizes in messages, in the units ``df -h`` and ``du -h`` print."""
  for unit in ("bytes", "KiB", "MiB"):
    if count < 1024:
      return f"{count:.0f} {unit}" if unit != "MiB" else f"{count:.1f} {unit}"
    count /= 1024
  return f"{count:.1f} GiB"


def disk_full_error(path: str, needed: int, what: str, at_least: bool = False) -> WorkdirError:
  """The one-line error for a write to ``path`` that found its disk full: names the directory, the space the
  write needed (``at_least``: more than ``needed``, what a streamed write had written) and what is free now."""
  directory = os.path.dirname(os.path.abspath(path))
  try:
    free = format_bytes(shutil.disk_usage(directory).free)
  except OSError:
    free = "an unknown amount"
  size = f"more than {format_bytes(needed)}" if at_least else f"about {format_bytes(needed)}"
  return WorkdirError(f"no space left on the disk of {directory} to write {what} ({path}, {size}; {free} free): "
                      "free some space there (or move the workdir to a larger disk) and rerun the same command.")


def fingerprint(data: bytes) -> str:
  """SHA-256 (first 12 hex digits) of ``data``: two files with one fingerprint hold the same bytes."""
  return hashlib.sha256(data).hexdigest()[:12]


@dataclasses.dataclass(frozen=True)
class KeptFile:
  """A small file a run keeps its own copy of (``Task.trained_tokenizers``, ``WORKDIR/tokenizers/``), e.g. a
  pretrained model's ``tokenizer.json``: its bytes (``model_proto``, the name SentencePiece tokenizers give
  theirs) and the ``path`` they were read from."""
  model_proto: bytes
  path: str

  @classmethod
  def read(cls, path: str | os.PathLike) -> KeptFile:
    with open(path, "rb") as file:
      return cls(file.read(), os.fspath(path))

  @property
  def fingerprint(self) -> str:
    return fingerprint(self.model_proto)


def _remove(path: str) -> int:
  """Removes ``path`` if it is there; returns the bytes it held (0 if none)."""
  try:
    size = os.path.getsize(path)
    os.remove(path)
    return size
  except OSError:
    return 0


@contextlib.contextmanager
def replacing(path: str, binary: bool = False, size: int | None = None, per_process: bool = False,
              **open_arguments) -> Iterator[IO]:
  """A file to write the new content of ``path`` into, for content written piece by piece (predictions of
  batch after batch, CSV rows): it is ``path + ".tmp"``, which replaces ``path`` only when the block ends
  without an error. Any error midway (a full disk, an exception while the content is made) leaves the old
  ``path`` whole and no temporary file.

  Args:
    binary: open in ``"wb"`` mode, else ``"w"``; ``open_arguments`` go to ``open`` (``encoding``, ``newline``).
    size: the bytes of the whole content, when known, for the error's message (else: more than those written).
    per_process: name the temporary file for this process (``<path>.tmp<pid>``), for a file that several
      processes may write at once with the same content (a shared cache): each replaces ``path`` whole.

  Raises:
    WorkdirError: the disk is full, or the file passes the file-size limit (``write_refused_error``).
  """
  temporary = path + (f".tmp{os.getpid()}" if per_process else ".tmp")
  try:
    with open(temporary, "wb" if binary else "w", **open_arguments) as file:
      yield file
    os.replace(temporary, path)
  except BaseException as error:
    written = _remove(temporary)
    if isinstance(error, Exception) and is_write_refused(error):
      raise write_refused_error(error, path, written if size is None else size, os.path.basename(path),
                                at_least=size is None) from None
    raise


def write_atomically(path: str, data: str | bytes) -> None:
  """Readers (and a crash mid-write) see the old file or the whole new one, never a partial write; text is
  written as UTF-8.

  Raises:
    WorkdirError: the disk is full, or the file passes the file-size limit; the old file is kept and no
      ``.tmp`` file is left.
  """
  size = len(data.encode() if isinstance(data, str) else data)
  with replacing(path, size=size, **({"binary": True} if isinstance(data, bytes) else {"encoding": "utf-8"})) as file:
    file.write(data)


def read_table(path: str, columns: tuple[str, ...], parse_row: Callable[[list[str]], Row], what: str) -> list[Row]:
  """The rows of a tab-separated table whose first line names ``columns``: ``parse_row(cells)`` of each further line.

  Raises:
    InputFileError: the first line is not ``columns`` (the file is no ``what``), or a line has other columns or a
      cell ``parse_row`` refuses with a ValueError; the message names the file and the line.
  """
  with open(path, encoding="utf-8") as f:
    lines = f.read().splitlines()
  if not lines or tuple(lines[0].split("\t")) != columns:
    raise InputFileError(f"{path} is not a file of {what}: its first line should be {chr(9).join(columns)!r}.")
  rows = []
  for number, line in enumerate(lines[1:], start=2):
    cells = line.split("\t")
    try:
      if len(cells) != len(columns):
        raise ValueError
      rows.append(parse_row(cells))
    except ValueError:
      raise InputFileError(f"{path} line {number} is damaged: {line[:60]!r} should be {len(columns)} tab-separated "
                           f"columns ({', '.join(columns)}); restore the file, or write it again from its "
                           "run.") from None
  return rows
