"""The format of a saved run: which shape its ``config.json`` and ``model_config.json`` have.

A run records ``FORMAT`` (``{"format_version": N}``) when it starts, beside its ``config.json``. The code
reads runs of ``FORMAT_VERSION`` only; a run of another format (or none: saved before the marker existed) is
refused in one line that names the converter, ``python -m transformer.train.convert_run WORKDIR``, which
holds all knowledge of older shapes. Raise ``FORMAT_VERSION`` (and teach the converter the step) when a change
of the code makes saved runs unreadable as they are.
"""
from __future__ import annotations

import json
import os
import shlex

from transformer.data.files import write_atomically
from transformer.errors import WorkdirError
from transformer.train.run_directory import FORMAT, RunDirectory

FORMAT_VERSION = 2  # 1: model_name and decode in config.json (no marker); 0: architecture/rnn sections
CONVERT_COMMAND = "python -m transformer.train.convert_run"


def read_format(workdir: str) -> int | None:
  """The format version ``workdir``'s marker records; None when it has none (a run saved before markers).

  Raises:
    WorkdirError: the marker is not the JSON this module writes.
  """
  directory = RunDirectory(workdir)
  if not os.path.isfile(directory.path(FORMAT)):
    return None
  try:
    version = directory.read_json(FORMAT)["format_version"]
  except (WorkdirError, KeyError) as error:
    version = error
  if not isinstance(version, int) or isinstance(version, bool):
    raise WorkdirError(f"{directory.path(FORMAT)} is not a run-format marker ({version!r}); it is written by the "
                       f'training run as {{"format_version": {FORMAT_VERSION}}}. Was it edited?')
  return version


def write_format(workdir: str, version: int = FORMAT_VERSION) -> None:
  """Record that ``workdir``'s run is saved in format ``version``."""
  write_atomically(RunDirectory(workdir).path(FORMAT), json.dumps({"format_version": version}) + "\n")


def require_current_format(workdir: str) -> None:
  """Refuse a run this code cannot read as it is saved.

  Raises:
    WorkdirError: ``workdir`` has no marker or another format; the message names the command that converts it.
  """
  version = read_format(workdir)
  if version == FORMAT_VERSION:
    return
  if version is not None and version > FORMAT_VERSION:
    raise WorkdirError(f"{workdir} is saved in run format {version}, newer than this code's "
                       f"{FORMAT_VERSION} ({FORMAT}); update the code to read it.")
  found = f"run format {version}" if version is not None else f"an older run format (no {FORMAT})"
  raise WorkdirError(f"{workdir} is saved in {found}; this code reads format {FORMAT_VERSION}. Convert it once "
                     f"with: {CONVERT_COMMAND} {shlex.quote(workdir)}")
