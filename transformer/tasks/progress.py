"""Progress display: the training loop's tqdm bar (``progress_bar``) and its log line for a log file
(``log_line``), and ``Progress`` for long host-side loops (decoding a split). On a terminal a bar; when stderr
is a file, lines in the log instead of the bar's escape codes.
"""
from __future__ import annotations

import logging
import sys
import time

import tqdm

log = logging.getLogger(__name__)


def progress_bar(total: int, initial: int, quiet: bool):
  """tqdm bar with step, loss, throughput and ETA; silent when quiet or when stderr is not a terminal."""
  return tqdm.tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True,
                   disable=quiet or not sys.stderr.isatty())


def log_line(step: int, total: int, metrics: dict, seconds_per_step: float | None, window_steps: int = 0) -> str:
  """One progress line for logs written to a file (where the tqdm bar is off), e.g.
  ``step 100/4000 (2%): loss 6.5280, 1135 tokens/s, 0.37 steps/s, 0.0123 TFLOP/s per device, ETA 2h56m`` (and
  ``MFU 41.2%`` after the TFLOP/s where the device's peak is known); with skipped non-finite
  steps in the window (``train/skipped_steps`` of its ``window_steps``) ``..., 3 of 50 steps skipped``.
  ``seconds_per_step``: the pace of steps that did not compile (None, a window that only compiled: no ETA)."""
  eta = ""
  if seconds_per_step is not None:
    hours, minutes = divmod(int(max(total - step, 0) * seconds_per_step // 60), 60)
    eta = f", ETA {hours}h{minutes:02d}m"
  skipped = metrics.get("train/skipped_steps", 0)
  cost = (f", {metrics['train/tflops_per_device']:.3g} TFLOP/s per device" if "train/tflops_per_device" in metrics
          else "") + (f", MFU {100 * metrics['train/mfu']:.1f}%" if "train/mfu" in metrics else "")
  return (f"step {step}/{total} ({100 * step / max(total, 1):.0f}%): loss {metrics['train/loss']:.4f}, "
          f"{metrics['train/tokens_per_second']:.0f} tokens/s, {metrics['train/steps_per_second']:.2f} steps/s"
          + cost + eta + (f", {skipped:g} of {window_steps} steps skipped" if skipped else ""))


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
