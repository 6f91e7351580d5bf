"""SIGTERM and Ctrl-C during training: checkpoint, then stop — every process of a run at the same step.

One process: a signal sets a flag that the loop reads between steps. Several processes: each acting on its own
flag would leave the others waiting in a collective or in orbax's save barrier (a cluster signals its hosts
seconds apart, or only one). So SIGTERM is left to JAX's preemption notifier (installed by
``jax.distributed.initialize``, which also hears a scheduler's preemption notice), Ctrl-C is passed on to it as
a SIGTERM, and the loop asks ``multihost_utils.reached_preemption_sync_point(step)`` after each call: the
coordination service picks one step that every process reaches, and every process saves it and stops.
"""
from __future__ import annotations

import os
import signal
import sys

import jax
from jax.experimental import multihost_utils

INTERRUPTED_EXIT_STATUS = 130  # what a shell reports for a process stopped by SIGINT (128 + 2)


def _say(text: bytes) -> None:
  """Write to stderr from a signal handler; a closed pipe (``... | tee log`` whose tee the same Ctrl-C stopped)
  must not raise inside the handler and lose the save."""
  try:
    sys.stdout.flush()
    os.write(2, text)
  except OSError:
    pass


class Preemption:
  """``stop_at(step)``, asked after every compiled call with the step reached, says whether to checkpoint and
  stop there; ``requested`` names why (e.g. ``"SIGTERM"``). A second Ctrl-C stops the process at once, with one
  line and exit status 130: without waiting for the save under way, whose temporary directory the next start
  clears away."""

  def __init__(self):
    self.requested = None  # the name of the signal received, e.g. "SIGTERM"
    self.synchronised = jax.process_count() > 1
    self._previous = {}

  def __enter__(self):
    # With several processes SIGTERM stays with JAX's notifier: a Python handler would replace it.
    signals = (signal.SIGINT,) if self.synchronised else (signal.SIGTERM, signal.SIGINT)
    try:
      self._previous = {number: signal.signal(number, self._handle) for number in signals}
    except ValueError:  # not the main thread: no signal handling
      self._previous = {}
    return self

  def _handle(self, signum, frame):
    if self.requested and signum == signal.SIGINT:
      # os._exit, not an exception: unwinding through orbax's and XLA's threads printed dozens of tracebacks
      # and could crash; the latest committed checkpoint is intact either way.
      _say(b"\nSIGINT again: stopped at once; the latest committed checkpoint is kept, rerun to resume.\n")
      os._exit(INTERRUPTED_EXIT_STATUS)
    self.requested = signal.Signals(signum).name
    every = " (every process, at a step they all reach)" if self.synchronised else ""
    # Said at once, not at the step's end: a Ctrl-C that seems ignored gets pressed again, losing the save.
    _say(f"\n{self.requested} received: stopping after this step{every}, with a checkpoint"
         f"{' (Ctrl-C again stops at once)' if signum == signal.SIGINT else ''}.\n".encode())
    if self.synchronised:
      os.kill(os.getpid(), signal.SIGTERM)  # to JAX's notifier, which tells the other processes

  def stop_at(self, step: int) -> bool:
    """Whether to checkpoint and stop after ``step``; with several processes, True on all of them at once."""
    if not self.synchronised:
      return self.requested is not None
    if not multihost_utils.reached_preemption_sync_point(step):
      return False
    self.requested = self.requested or "SIGTERM or a preemption notice to one of the processes"
    return True

  def __exit__(self, *exc):
    for number, previous in self._previous.items():
      signal.signal(number, previous)
