"""Periodic actions of the training loop, in the manner of CLU's ``periodic_actions``.

After each compiled call the loop makes a ``Tick`` (the step reached, whether it is the last) and runs, in
order, the actions due at it. An action's result goes into the tick's ``outputs`` under its name, where the
actions after it read it: the checkpoint is due after any evaluation (the best copy needs its metrics) and
when the preemption check asked to stop. No action hands another anything through the trainer's attributes.
The time each spends is its phase in the run's goodput (``loop.Goodput``).
"""
from __future__ import annotations

import dataclasses
import os
import time
from typing import Any, Callable, Protocol

import jax
import numpy as np
from jax.experimental import multihost_utils


@dataclasses.dataclass(frozen=True)
class Tick:
  """A point of the loop between compiled calls: ``step`` trained so far, ``last`` when it is the run's end."""
  step: int
  last: bool


class Action(Protocol):
  """One periodic action: ``name`` keys its result in a tick's outputs and names its phase (goodput)."""
  name: str
  phase: str

  def due(self, tick: Tick, outputs: dict[str, Any]) -> bool: ...

  def run(self, tick: Tick, outputs: dict[str, Any]) -> Any: ...


class WallClock:
  """Due once ``seconds`` have passed since ``reset`` (0: never), asked only at steps that are multiples of
  ``every_steps`` (the log steps, where the host waits for the device anyway). On several processes process 0's
  clock decides for all (``broadcast_one_to_all``), so every process acts at the same step."""

  def __init__(self, seconds: float, every_steps: int):
    self.seconds, self.every_steps = float(seconds), every_steps
    self.reset()

  def reset(self) -> None:
    self.since = time.monotonic()

  def due(self, step: int) -> bool:
    if not self.seconds or step % self.every_steps:
      return False
    passed = time.monotonic() - self.since >= self.seconds
    if jax.process_count() > 1:
      passed = bool(multihost_utils.broadcast_one_to_all(np.asarray(passed)))
    return passed


@dataclasses.dataclass(frozen=True)
class Every:
  """``run(tick, outputs)`` every ``period`` steps (0: never by period), when its ``clock`` is due, at the last
  step (``at_last``), when the preemption check asked to stop (``on_stop``), and after any action named in
  ``after`` returned a result in the same tick. ``run`` is the trainer's own method, which the loop calls itself
  (no wrapper between)."""
  name: str
  period: int
  run: Callable[[Tick, dict], Any]
  phase: str = "step"
  at_last: bool = True
  on_stop: bool = False
  after: tuple[str, ...] = ()
  clock: WallClock | None = None

  def due(self, tick: Tick, outputs: dict[str, Any]) -> bool:
    timed = self.clock is not None and self.clock.due(tick.step)  # asked at every tick: a collective
    due = bool(timed or (self.period and tick.step % self.period == 0) or (self.at_last and tick.last)
               or (self.on_stop and outputs.get(PREEMPT)) or any(outputs.get(name) for name in self.after))
    if due and self.clock is not None:
      self.clock.reset()  # the seconds count from the last run, whatever made it due
    return due


PREEMPT = "preempt"  # the preemption check's result: the signal that asked to stop ("SIGTERM"), else None


@dataclasses.dataclass(frozen=True)
class PreemptionCheck:
  """Every tick: whether a signal asks the run to stop here (``Preemption.stop_at``, the same answer on every
  process at the same step); the signal's name, or None."""
  preemption: Any
  name: str = PREEMPT
  phase: str = "step"

  def due(self, tick: Tick, outputs: dict[str, Any]) -> bool:
    return True

  def run(self, tick: Tick, outputs: dict[str, Any]) -> str | None:
    return self.preemption.requested if self.preemption.stop_at(tick.step) else None


class Profile:
  """A trace of steps ``start + 1 .. start + steps`` (``config.profile_start``, ``config.profile_steps``) with
  ``jax.profiler`` into ``folder``: TensorBoard's profile tab (``tensorboard --logdir folder``) and Perfetto
  (``perfetto_trace.json.gz``, ui.perfetto.dev) open it. The trace starts at the first tick at or after
  ``start`` and stops, after the state is ready (so that the traced steps ran), at the first tick at or after
  ``start + steps``, at the run's end, or when it stops early. ``steps`` 0: never."""
  name = "profile"
  phase = "profile"

  def __init__(self, folder: str, start: int, steps: int, ready: Callable[[], Any]):
    self.folder, self.start, self.steps, self.ready = folder, start, steps, ready
    self.tracing = self.done = False

  def due(self, tick: Tick, outputs: dict[str, Any]) -> bool:
    if not self.steps or self.done:
      return False
    if self.tracing:
      return tick.step >= self.start + self.steps or tick.last or bool(outputs.get(PREEMPT))
    return tick.step >= self.start and not tick.last

  def run(self, tick: Tick, outputs: dict[str, Any]) -> str | None:
    jax.block_until_ready(self.ready())  # the steps before the start out of the trace, those in it done
    if not self.tracing:
      os.makedirs(self.folder, exist_ok=True)
      jax.profiler.start_trace(self.folder, create_perfetto_trace=True)
      self.tracing = True
      return None
    jax.profiler.stop_trace()
    self.tracing, self.done = False, True
    return self.folder

  def close(self) -> None:
    """Stop a trace still running (the loop ended by an error): the profiler is global to the process."""
    if self.tracing:
      jax.profiler.stop_trace()
      self.tracing = False


def due_actions(actions: list, tick: Tick, outputs: dict[str, Any]):
  """The ``actions`` due at ``tick``, in order: each is asked once those before it have put their results in
  ``outputs`` (the caller runs each, ``outputs[action.name] = action.run(tick, outputs)``, timed as its phase)."""
  for action in actions:
    if action.due(tick, outputs):
      yield action
