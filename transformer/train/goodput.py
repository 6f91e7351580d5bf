"""Goodput: the share of a run's time spent on steps that count, the rest split by where it went.

MaxText measures goodput from a cluster's event log (``ml-goodput-measurement``, which reads Google Cloud
Logging); here the loop times its own phases, so the figure needs no cloud service:

- ``startup``: from the session's start to the first step (restore, data, the first placements);
- ``compile``: calls of the train step that traced a new program (their time is almost all compilation);
- ``data``: the loop waiting for its next batches (drawn and placed on the device ahead of their step);
- ``evaluate`` and ``checkpoint``: the loop's evaluation and saves (waits for asynchronous saves included);
- ``profile``: starting and stopping a ``config.profile_steps`` trace (writing it);
- ``step``: the rest of the loop, the productive part;
- ``redone``: steps trained again after a kill, an estimate: the steps logged past the checkpoint a run
  resumed from, at the run's mean step time (that session's time after its last checkpoint was never saved,
  so it is added here, not taken from ``step``).

Sums carry over resumes in the checkpoint (``saved``); ``goodput.json`` in the workdir holds the latest.
"""
from __future__ import annotations

import contextlib
import json
import time

from transformer.data.files import write_atomically
from transformer.train.run_directory import GOODPUT, RunDirectory

PHASES = ("step", "compile", "data", "startup", "evaluate", "checkpoint", "profile", "redone")
LOOP_PHASES = ("step", "compile", "data", "evaluate", "checkpoint")  # logged per window as time/<phase>


class Goodput:
  """Seconds per phase, summed over the run's sessions, and the steps they trained."""

  def __init__(self, saved: dict | None = None):
    saved = saved or {}
    self.seconds = {phase: float(saved.get("seconds", {}).get(phase, 0.0)) for phase in PHASES}
    self.steps = int(saved.get("steps", 0))
    self._loop_start = None
    self._timed = 0.0  # seconds of this session's loop spent in the other phases
    self._window_start = {}  # the sums at the last logging step

  def add(self, phase: str, seconds: float) -> None:
    self.seconds[phase] += seconds
    if self._loop_start is not None:
      self._timed += seconds

  @contextlib.contextmanager
  def timed(self, phase: str):
    start = time.perf_counter()
    try:
      yield
    finally:
      self.add(phase, time.perf_counter() - start)

  def start_loop(self, session_start: float) -> None:
    """The first step is about to run: the time since ``session_start`` (``perf_counter``) was start-up."""
    self.add("startup", time.perf_counter() - session_start)
    self._loop_start, self._timed = time.perf_counter(), 0.0
    self._window_start = dict(self.seconds)

  def window(self) -> dict[str, float]:
    """``{"time/<phase>": seconds}`` of each of ``LOOP_PHASES`` since the last call (the first: since the loop
    started): where a logging window's time went."""
    now = self.saved(0)["seconds"]
    window = {f"time/{phase}": now[phase] - self._window_start.get(phase, 0.0) for phase in LOOP_PHASES}
    self._window_start = now
    return window

  def redone(self, steps: int) -> None:
    """``steps`` trained before a kill and lost with it, at the mean step time of the run so far."""
    if steps > 0 and self.steps:
      self.add("redone", steps * self.seconds["step"] / self.steps)

  def saved(self, steps_trained: int) -> dict:
    """The sums up to now (the loop's untimed rest counted as ``step``), for a checkpoint's ``extra``."""
    seconds = dict(self.seconds)
    if self._loop_start is not None:
      seconds["step"] += time.perf_counter() - self._loop_start - self._timed
    return {"seconds": seconds, "steps": self.steps + steps_trained}

  def summary(self, steps_trained: int) -> tuple[dict, str]:
    """``(record, line)``: the phases, their total and the goodput share; one line for the end of a run."""
    record = self.saved(steps_trained)
    total = sum(record["seconds"].values())
    record.update(total_seconds=total, goodput=record["seconds"]["step"] / total if total > 0 else 0.0)
    parts = ", ".join(f"{'productive steps' if phase == 'step' else phase} {record['seconds'][phase]:.1f} s"
                      for phase in PHASES if record["seconds"][phase])
    return record, f"goodput: {100 * record['goodput']:.1f}% of {total:.1f} s ({parts})"


def write_goodput(workdir: str, record: dict) -> None:
  write_atomically(RunDirectory(workdir).path(GOODPUT), json.dumps(record, indent=2, sort_keys=True))
