"""A multi-process run's watch on its peers: a lost or failed process stops the others in one line.

JAX's coordination service already notices a process that stops sending heartbeats (``--peer_timeout``, passed
to ``jax.distributed.initialize`` as ``heartbeat_timeout_seconds``), but it then aborts every other process from
C++ with a stack and no word on what to do. This watch runs beside it, on the same service's key-value store:
every process marks itself alive a few times per timeout, and a peer whose mark has not moved for half the
timeout (before JAX's own abort), or that marked itself failed, makes every survivor print one line naming it and
the command that resumes, then leave at once. Leaving is the only safe move: the survivors' collectives and
orbax's barriers wait for the lost process and cannot be interrupted from Python.
"""
from __future__ import annotations

import atexit
import os
import shlex
import sys
import threading
import time

import jax

PEER_LOST_EXIT_STATUS = 75  # EX_TEMPFAIL: nothing is wrong with this process; rerunning all of them resumes
_PREFIX = "transformer/peers/"
_DONE, _FAILED, _LEFT = "done", "failed", "left"  # "left": stopped because a peer was lost or failed

_watch = None  # the running PeerWatch, if any


def _client():
  """JAX's distributed runtime client (orbax reaches it the same way); None outside a multi-process run."""
  from jax._src import distributed  # pylint: disable=import-outside-toplevel
  return distributed.global_state.client


def resume_command() -> str:
  """The command this process was started with: rerunning it on every process resumes the run."""
  return " ".join(shlex.quote(part) for part in ["python", *sys.argv])


class PeerWatch:
  """A daemon thread: marks this process alive every ``timeout / 10`` seconds and checks the others' marks.

  ``lost(process, why)`` is called once, from the thread, when a peer is lost or failed; by default it prints
  one line and ends this process with ``PEER_LOST_EXIT_STATUS``.
  """

  def __init__(self, timeout: float, lost=None):
    self.timeout = float(timeout)
    self.interval = max(0.2, self.timeout / 10)
    self.me, self.count = jax.process_index(), jax.process_count()
    self.lost = lost or _stop_this_process
    self._client = _client()
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, name="peer-watch", daemon=True)

  def start(self) -> "PeerWatch":
    self._mark("0")
    self._thread.start()
    return self

  def _mark(self, value: str) -> None:
    self._client.key_value_set(f"{_PREFIX}{self.me}", value, allow_overwrite=True)

  def finish(self, failed: bool = False) -> None:
    """Stop watching; tell the peers this process left on purpose (``failed``: with an error of its own)."""
    self._stop.set()
    try:
      self._mark(_FAILED if failed else _DONE)
    except Exception:  # the service is gone (process 0 left first): nobody is left to tell
      pass

  def await_peers(self, lost: int | None = None) -> None:
    """In process 0, before it leaves early: it hosts the coordination service, and a peer still talking to
    the service when it goes is aborted from C++ (exit -6, a stack) instead of leaving in its own line. Waits
    until every peer but the ``lost`` one has marked itself done, failed or left (each sees this process's mark
    within one interval), at most two intervals, then a moment for them to exit."""
    if self.me != 0:
      return
    pending, deadline = set(range(self.count)) - {self.me, lost}, time.monotonic() + 2 * self.interval + 1
    if not pending:
      return
    while pending and time.monotonic() < deadline:
      for peer in list(pending):
        try:
          if self._client.key_value_try_get(f"{_PREFIX}{peer}") in (_DONE, _FAILED, _LEFT):
            pending.discard(peer)
        except Exception:  # no mark yet
          pass
      time.sleep(0.05)
    time.sleep(0.5)

  def _run(self) -> None:
    seen = {peer: (None, time.monotonic()) for peer in range(self.count) if peer != self.me}
    beat = 0
    while not self._stop.wait(self.interval):
      beat += 1
      try:
        self._mark(str(beat))
        marks = {peer: self._client.key_value_try_get(f"{_PREFIX}{peer}") for peer in seen}
      except Exception as error:  # the coordination service lives in process 0
        if self._stop.is_set():
          return
        self._report(0, f"the coordinator (process 0) does not answer ({type(error).__name__})")
        return
      now = time.monotonic()
      for peer, mark in marks.items():
        if mark == _DONE:
          seen.pop(peer)
        elif mark == _FAILED:
          self._report(peer, "stopped with an error (its output says which)")
          return
        elif mark != seen[peer][0]:
          seen[peer] = (mark, now)
        elif now - seen[peer][1] > self.timeout / 2:
          self._report(peer, f"has not answered for {now - seen[peer][1]:.0f} s (killed, hung or its host lost)")
          return
      if not seen:
        return

  def _report(self, peer: int, why: str) -> None:
    if not self._stop.is_set():
      self.lost(peer, why)


def _stop_this_process(peer: int, why: str) -> None:
  os.write(2, (f"\nerror: process {peer} of {jax.process_count()} {why}; process {jax.process_index()} stops too. "
               f"The last checkpoint is kept: restart every process with the same command to resume: "
               f"{resume_command()}\n").encode())
  if _watch is not None:
    try:
      _watch._mark(_LEFT)
    except Exception:  # the lost peer was process 0: its service is gone
      pass
    _watch.await_peers(lost=peer)
  os._exit(PEER_LOST_EXIT_STATUS)  # the collectives under way wait for the lost process and cannot be cancelled


def watch_peers(timeout: float) -> PeerWatch | None:
  """Start watching the other processes of a multi-process run (nothing for one process); a normal exit tells
  the peers this process is done, so that one finishing first is not taken for lost."""
  global _watch
  if jax.process_count() == 1 or _client() is None:
    return None
  _watch = PeerWatch(timeout).start()
  atexit.register(_watch.finish)
  return _watch


def leave_after_error(message: str) -> None:
  """This process stops with an error of its own: print ``message``, tell the peers (they stop at once, naming
  it), and leave without JAX's shutdown barrier, which would wait for processes stuck waiting for this one.
  Returns at once in a single-process run."""
  if _watch is None:
    return
  print(message, file=sys.stderr, flush=True)
  _watch.finish(failed=True)
  _watch.await_peers()
  sys.stdout.flush()
  os._exit(1)
