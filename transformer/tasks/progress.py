"""Progress of a task's long host-side loops (decoding a split): on a terminal a bar; when stderr is a file, lines in
the log instead of the bar's escape codes. The training loop's own bar and line are ``transformer.train.writers``'.
"""
from __future__ import annotations

import logging
import sys
import time

import tqdm

log = logging.getLogger(__name__)


class Progress:
  """Progress of a long host-side loop (decoding a split): on a terminal a tqdm bar, removed when done; when
  stderr is a file, a log line every ``interval_seconds`` (none for a loop that ends sooner), so that a log
  shows progress without the bar's escape codes. ``quiet`` shows neither."""

  def __init__(self, description: str, total: int, unit: str = "sentences", quiet: bool = False,
               interval_seconds: float = 10.0):
    self.description, self.total, self.unit = description, total, unit
    self.done = 0
    self.lines = 0  # log lines written
    self._logged = 0  # the count the last of them gave
    self._quiet, self._interval = quiet, interval_seconds
    self._bar = None
    if not quiet and sys.stderr.isatty():
      self._bar = tqdm.tqdm(total=total, desc=description, unit=f" {unit}", leave=False, dynamic_ncols=True)
    self._last = time.monotonic()

  def update(self, count: int) -> None:
    self.done += count
    if self._bar is not None:
      self._bar.update(count)
    elif not self._quiet and time.monotonic() - self._last >= self._interval:
      self._log()

  def _log(self) -> None:
    log.info("%s: %d/%d %s (%.0f%%)", self.description, self.done, self.total, self.unit,
             100 * self.done / max(self.total, 1))
    self.lines += 1
    self._logged = self.done
    self._last = time.monotonic()

  def close(self) -> None:
    if self._bar is not None:
      self._bar.close()
    elif self.lines and self._logged != self.done:
      self._log()  # a loop that logged says that it finished
