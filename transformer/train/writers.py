"""Metric outputs: ``metrics.jsonl`` (one JSON object per logging step) and TensorBoard."""
from __future__ import annotations

import errno
import json
import logging
import math
import os
import shutil

from transformer.errors import WorkdirError
from transformer.train import run_directory

log = logging.getLogger(__name__)


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


def format_bytes(count: float) -> str:
  """``452 KiB``, ``1.3 GiB``: sizes in messages, in the units ``df -h`` and ``du -h`` print."""
  for unit in ("bytes", "KiB", "MiB"):
    if count < 1024:
      return f"{count:.0f} {unit}" if unit != "MiB" else f"{count:.1f} {unit}"
    count /= 1024
  return f"{count:.1f} GiB"


def disk_full_error(path: str, needed: int, what: str) -> WorkdirError:
  """The one-line error for a write to ``path`` that found its disk full: names the directory, the space the
  write needed and what is free now."""
  directory = os.path.dirname(os.path.abspath(path))
  try:
    free = format_bytes(shutil.disk_usage(directory).free)
  except OSError:
    free = "an unknown amount"
  return WorkdirError(f"no space left on the disk of {directory} to write {what} ({path}, about "
                      f"{format_bytes(needed)}; {free} free): free some space there (or move the workdir to a larger "
                      "disk) and rerun the same command.")


def write_atomically(path: str, data: str | bytes) -> None:
  """Readers (and a crash mid-write) see the old file or the whole new one, never a partial write.

  Raises:
    WorkdirError: the disk is full; the old file is kept and no ``.tmp`` file is left.
  """
  try:
    with open(path + ".tmp", "wb" if isinstance(data, bytes) else "w") as f:
      f.write(data)
    os.replace(path + ".tmp", path)
  except OSError as error:
    if not is_disk_full(error):
      raise
    try:
      os.remove(path + ".tmp")
    except OSError:
      pass
    raise disk_full_error(path, len(data.encode() if isinstance(data, str) else data),
                          os.path.basename(path)) from None


class MetricWriter:
  """Appends ``{"step": ..., name: value}`` lines to ``workdir/metrics.jsonl`` and TensorBoard scalars.

  On resume, lines for steps after the restored checkpoint (written before a crash) are dropped, so the
  file of a resumed run equals that of an uninterrupted one.
  """

  def __init__(self, workdir: str, resume_step: int = 0, enabled: bool = True, tensorboard: bool = True):
    self.enabled = enabled
    self.path = os.path.join(workdir, run_directory.METRICS)
    self._tensorboard = None
    if not enabled:
      return
    if os.path.exists(self.path):
      kept = [record for record in run_directory.read_records(self.path, ("step",))
              if record["step"] <= resume_step]
      write_atomically(self.path, "".join(json.dumps(record) + "\n" for record in kept))  # a crash loses no line
    if tensorboard:
      from tensorboardX import SummaryWriter  # imported lazily: optional at read time
      self._tensorboard = SummaryWriter(os.path.join(workdir, run_directory.TENSORBOARD))

  def write(self, step: int, metrics: dict) -> None:
    if not self.enabled:
      return
    record = {"step": int(step), **{k: float(v) for k, v in metrics.items()}}
    line = json.dumps(record) + "\n"
    try:
      with open(self.path, "a") as f:
        f.write(line)
    except OSError as error:  # a half-written line is dropped on resume (see run_directory.read_records)
      if not is_disk_full(error):
        raise
      raise disk_full_error(self.path, len(line), f"the metrics of step {step}") from None
    if self._tensorboard is not None:
      for name, value in metrics.items():
        if math.isfinite(float(value)):
          self._tensorboard.add_scalar(name, float(value), step)
      self._tensorboard.flush()

  def close(self) -> None:
    if self._tensorboard is not None:
      self._tensorboard.close()


def _format_value(value: float) -> str:
  text = f"{value:.4f}"
  return text.rstrip("0").rstrip(".") if "." in text else text


def results_table(metrics: dict) -> str:
  """Metrics named ``<split>/<name>`` (``eval/bleu``, ``test/f1``) as a text table, one row per metric and one
  column per split, e.g.::

      metric  eval    test_2016_flickr
      bleu    38.12   39.86
      loss    1.9021

  Values that are not numbers (signatures, nested dicts) and per-seed copies (``f1/seed_0``) are left out:
  the results JSON file has them."""
  columns, rows = [], {}
  for key, value in metrics.items():
    split, _, name = key.partition("/")
    if not name or "/" in name or isinstance(value, bool) or not isinstance(value, (int, float)):
      continue
    if split not in columns:
      columns.append(split)
    rows.setdefault(name, {})[split] = _format_value(float(value))
  table = [["metric", *columns]] + [[name, *(row.get(split, "") for split in columns)]
                                    for name, row in sorted(rows.items())]
  widths = [max(len(line[i]) for line in table) for i in range(len(table[0]))]
  return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip() for line in table)
