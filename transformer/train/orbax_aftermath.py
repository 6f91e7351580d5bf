"""What a failed orbax save or restore leaves behind, silenced: each is a copy of the error ``Checkpointer``
raises or reports in one line (its worker threads' log records, "Event loop is closed" from reads finishing
after orbax closed their loop, coroutines never awaited)."""
from __future__ import annotations

import gc
import logging
import os
import sys
import threading
import time
import warnings

from transformer.data.files import is_disk_full


def _is_closed_loop_error(error: BaseException | None) -> bool:
  return isinstance(error, RuntimeError) and str(error) == "Event loop is closed"


class _OrbaxAftermathFilter(logging.Filter):
  """Drops the log records that a failed orbax save or restore leaves behind in its worker threads, each a
  copy of the error that ``Checkpointer`` raises or reports in one line: asyncio's "Task (or Future)
  exception was never retrieved" / "Task was destroyed but it is pending" for orbax's tasks, and orbax's own
  tracebacks of a full disk (it logs one per background thread, then raises the same error in
  ``wait_until_finished``)."""

  def filter(self, record: logging.LogRecord) -> bool:
    if record.name == "asyncio":
      message = str(record.msg)
      first_line = message.split("\n", 1)[0]
      leftover = first_line.endswith(("exception was never retrieved", "was destroyed but it is pending!"))
      return not (leftover and ("orbax" in message or (record.exc_info and is_disk_full(record.exc_info[1]))))
    from_orbax = f"{os.sep}orbax{os.sep}checkpoint{os.sep}" in (record.pathname or "")
    return not (from_orbax and record.exc_info and is_disk_full(record.exc_info[1]))


_aftermath_filter = _OrbaxAftermathFilter()


def quiet_orbax_aftermath() -> None:
  """Silence what a failed orbax save or restore prints after the error itself (idempotent).

  Orbax runs each save or restore on a fresh event loop and closes it as soon as the first tensorstore read
  or write fails; the other reads and writes of that checkpoint still finish later and call
  ``loop.call_soon_threadsafe`` on the closed loop. Each such call prints a "RuntimeError: Event loop is
  closed" traceback through ``sys.unraisablehook`` (hundreds for one damaged checkpoint) long after the
  checkpoint was skipped. Nothing can be done on a closed loop, so those, and only those, are dropped.
  """
  if getattr(sys.unraisablehook, "_drops_closed_loop_errors", False):
    return
  previous = sys.unraisablehook

  def hook(unraisable):
    if not _is_closed_loop_error(unraisable.exc_value):
      previous(unraisable)

  hook._drops_closed_loop_errors = True
  sys.unraisablehook = hook
  for name in ("absl", "asyncio"):
    logger = logging.getLogger(name)
    if _aftermath_filter not in logger.filters:
      logger.addFilter(_aftermath_filter)


def join_orbax_workers(timeout: float = 60.0) -> None:
  """Wait (up to ``timeout`` seconds in all) for orbax's worker threads to end.

  When one write of an asynchronous save fails, orbax raises at once, while its other writes of that
  checkpoint go on in their own threads (and recreate the temporary directory a cleanup just removed, or fail
  at interpreter exit with more tracebacks). Orbax keeps no handle to them for a caller, so they are found by
  their class's module."""
  deadline = time.monotonic() + timeout
  for thread in threading.enumerate():
    if thread is not threading.current_thread() and type(thread).__module__.startswith("orbax."):
      # The base class's join: orbax's own re-raises the thread's error, which is being reported already.
      threading.Thread.join(thread, max(deadline - time.monotonic(), 0))


def collect_orbax_leftovers() -> None:
  """Collect now the coroutines a failed orbax operation created and never awaited (the writes or reads
  after the one that failed), so that their "coroutine ... was never awaited" warnings, copies of the error
  already reported, are dropped here instead of printed at exit. Call it once the error is no longer
  referenced (outside its ``except`` block): its traceback keeps them alive."""
  with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=r"coroutine .* was never awaited", category=RuntimeWarning)
    gc.collect()
