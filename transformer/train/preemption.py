"""SIGTERM and Ctrl-C during training: checkpoint, then stop."""
from __future__ import annotations

import os
import signal
import sys

INTERRUPTED_EXIT_STATUS = 130  # what a shell reports for a process stopped by SIGINT (128 + 2)


class Preemption:
  """Turns SIGTERM and SIGINT (Ctrl-C) into a flag the loop checks between steps, so that it checkpoints
  before exiting; one line says so at once. A second Ctrl-C stops the process at once, with one line and exit status 130: without
  waiting for the save under way, whose temporary directory the next start clears away."""

  SIGNALS = (signal.SIGTERM, signal.SIGINT)

  def __init__(self):
    self.requested = None  # the name of the signal received, e.g. "SIGTERM"
    self._previous = {}

  def __enter__(self):
    try:
      self._previous = {number: signal.signal(number, self._handle) for number in self.SIGNALS}
    except ValueError:  # not the main thread: no signal handling
      self._previous = {}
    return self

  def _handle(self, signum, frame):
    if self.requested and signum == signal.SIGINT:
      # os._exit, not an exception: unwinding through orbax's and XLA's threads printed dozens of tracebacks
      # and could crash; the latest committed checkpoint is intact either way.
      sys.stdout.flush()
      os.write(2, b"\nSIGINT again: stopped at once; the latest committed checkpoint is kept, rerun to resume.\n")
      os._exit(INTERRUPTED_EXIT_STATUS)
    self.requested = signal.Signals(signum).name
    # Said at once, not at the step's end: a Ctrl-C that seems ignored gets pressed again, losing the save.
    os.write(2, f"\n{self.requested} received: stopping after this step, with a checkpoint"
                f"{' (Ctrl-C again stops at once)' if signum == signal.SIGINT else ''}.\n".encode())

  def __exit__(self, *exc):
    for number, previous in self._previous.items():
      signal.signal(number, previous)
