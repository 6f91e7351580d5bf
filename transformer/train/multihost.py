"""Several processes as one run: joining (``initialize``), the watch on lost peers, preemption at one step.

A multi-process run's watch on its peers: a lost or failed process stops the others in one line.

JAX's coordination service already notices a process that stops sending heartbeats (``--peer_timeout``, passed
to ``jax.distributed.initialize`` as ``heartbeat_timeout_seconds``), but it then aborts every other process from
C++ with a stack and no word on what to do. This watch runs beside it, on the same service's key-value store:
every process marks itself alive a few times per timeout, and a peer whose mark has not moved for half the
timeout (before JAX's own abort), or that marked itself failed, makes every survivor print one line naming it and
the command that resumes, then leave at once. Leaving is the only safe move: the survivors' collectives and
orbax's barriers wait for the lost process and cannot be interrupted from Python.

Multi-host start-up: ``jax.distributed.initialize`` from explicit values or the environment.

Every setting comes from its flag (``--coordinator_address``, ``--num_processes``, ``--process_id``,
``--local_device_ids``, ``--initialization_timeout``, ``--peer_timeout``), else from the environment variable
``TRANSFORMER_<FLAG NAME IN CAPITALS>``, else from its default. Without a coordinator address, a cluster that JAX
detects itself (SLURM with more than one task, a multi-host TPU VM) is joined.

Process 0 killed: its coordination service goes with it, and JAX aborts every other process from a C++ thread
within a second, before any Python code can speak. So each process of a multi-process run is watched by a parent
(``supervise``: launch.py runs itself again as its child) that turns that abort into one line and status 75.

Every process compiles the same programs: source locations are left out of them. With jax 0.12 (XLA:CPU's gloo
collectives, those of a CPU run), processes whose programs for one collective differ only in the Python stack
recorded as each operation's location do not meet in it: a ``broadcast_one_to_all`` that process 0 calls from one
line and the others from another (``modes._build_task_once``) left every process waiting in it for good, where jax
0.10 and 0.11 went on. A checkout at another path on each host records other file names, the same difference.
So ``_join`` sets ``jax_traceback_in_locations_limit`` to 0 before anything is compiled (checked by
``test_multihost.test_collective_from_other_lines_completes``); lost: each operation's Python line in XLA's dumps
and profiles of a multi-process run.

JAX does not raise when the other processes fail to join in time: it aborts the process from C++ with a stack.
A watchdog thread stops this process first, with one ``error: ...`` line and exit status 1.

SIGTERM and Ctrl-C during training: checkpoint, then stop — every process of a run at the same step.

One process: a signal sets a flag that the loop reads between steps. Several processes: each acting on its own
flag would leave the others waiting in a collective or in orbax's save barrier (a cluster signals its hosts
seconds apart, or only one). So SIGTERM is left to JAX's preemption notifier (installed by
``jax.distributed.initialize``, which also hears a scheduler's preemption notice), Ctrl-C is passed on to it as
a SIGTERM, and the loop asks ``multihost_utils.reached_preemption_sync_point(step)`` after each call: the
coordination service picks one step that every process reaches, and every process saves it and stops.
"""
from __future__ import annotations

import atexit
import faulthandler
import json
import logging
import os
import re
import select
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Callable, Sequence

import jax
from jax.experimental import multihost_utils

from transformer.errors import ClusterError, ConfigError

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

  Each beat is two requests to the coordination service, one write and one directory read of every mark: N
  processes send 2N per interval (O(N)), not a read of each peer's key by each process (O(N^2)).

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

  def _marks(self) -> dict[int, str]:
    """Every process's latest mark, ``process -> mark``, in one read (processes that have not marked: absent)."""
    return {int(key.rsplit("/", 1)[-1]): value for key, value in self._client.key_value_dir_get(_PREFIX.rstrip("/"))}

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
      try:
        marks = self._marks()
      except Exception:  # the service is going: nothing more to wait for
        break
      pending -= {peer for peer, mark in marks.items() if mark in (_DONE, _FAILED, _LEFT)}
      time.sleep(0.05)
    time.sleep(0.5)

  def _run(self) -> None:
    seen = {peer: (None, time.monotonic()) for peer in range(self.count) if peer != self.me}
    beat = 0
    while not self._stop.wait(self.interval):
      beat += 1
      try:
        self._mark(str(beat))
        marks = self._marks()
      except Exception as error:  # the coordination service lives in process 0
        if self._stop.is_set():
          return
        self._report(0, f"the coordinator (process 0) does not answer ({type(error).__name__})")
        return
      now = time.monotonic()
      for peer in list(seen):
        mark = marks.get(peer)
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


def _stop_this_process(peer: int | None, why: str) -> None:
  who = "a peer process" if peer is None else f"process {peer} of {jax.process_count()}"
  os.write(2, (f"\nerror: {who} {why}; process {jax.process_index()} stops too. "
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


def _flat_settings(tree: dict, prefix: str = "") -> dict:
  out = {}
  for name, value in tree.items():
    out.update(_flat_settings(value, f"{prefix}{name}.") if isinstance(value, dict) else {prefix + name: value})
  return out


def check_same_settings(record: dict, timeout_seconds: int = 300) -> None:
  """Every process of a run must be given the same settings: process 0 publishes its config (``record``, the
  resolved ``RunConfig.record``) on the coordination service, and each other process compares its own.

  Different settings were silent or fatal further on: another ``num_train_steps`` hung every process in a
  collective for good, another seed or learning rate trained models that differ, another ``d_ff`` aborted in a
  gloo collective mismatch. Nothing to check in a single-process run.

  Raises:
    ConfigError: this process's settings differ from process 0's; the message names the first field that
      differs (process 0 then stops too, naming this process).
  """
  client = _client()
  if jax.process_count() == 1 or client is None:
    return
  key, mine = "transformer/settings", json.dumps(record, sort_keys=True)
  if jax.process_index() == 0:
    client.key_value_set(key, mine)
    return
  reference = client.blocking_key_value_get(key, timeout_seconds * 1000)
  if reference == mine:
    return
  theirs, ours = _flat_settings(json.loads(reference)), _flat_settings(json.loads(mine))
  field = min(name for name in set(theirs) | set(ours) if theirs.get(name, "absent") != ours.get(name, "absent"))
  raise ConfigError(
      f"process {jax.process_index()} of {jax.process_count()} was given other settings than process 0: "
      f"{field}: {theirs.get(field, 'absent')!r} (process 0) -> {ours.get(field, 'absent')!r} (this process). "
      "Give every process the same command (the same --config flags and config file).")


# What a collective raises when the process at the other end of its connection is gone (killed, its host lost).
_PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "Socket closed")


def leave_after_error(message: str, error: BaseException | None = None) -> None:
  """This process stops with an error of its own: print ``message``, tell the peers (they stop at once, naming
  it), and leave without JAX's shutdown barrier, which would wait for processes stuck waiting for this one.
  An ``error`` of a collective whose peer is gone (a ``kill -9`` during a save) is no error of this process's:
  the lost peer's line and status (``PEER_LOST_EXIT_STATUS``) instead of a traceback, before the watch would
  have noticed. Returns at once in a single-process run."""
  if _watch is None:
    return
  text = str(error) if error is not None else ""
  if isinstance(error, jax.errors.JaxRuntimeError) and any(sign in text for sign in _PEER_GONE):
    peer = 1 - jax.process_index() if jax.process_count() == 2 else None
    first = text.strip().splitlines()[0].split(": [")[0][:120]
    _stop_this_process(peer, f"is gone: a collective with it failed ({first})")
  print(message, file=sys.stderr, flush=True)
  _watch.finish(failed=True)
  _watch.await_peers()
  sys.stdout.flush()
  os._exit(1)


log = logging.getLogger(__name__)

DEFAULT_INITIALIZATION_TIMEOUT = 300  # seconds: JAX's own default
DEFAULT_PEER_TIMEOUT = 100  # seconds: JAX's default heartbeat_timeout_seconds
ABORT_MARGIN = 10  # seconds JAX's own deadline is set after the watchdog's, so that our line, not its abort, is seen
SRUN_VARIABLES = ("SLURM_STEP_NODELIST", "SLURM_STEP_ID")  # srun sets them for each task; sbatch and salloc do not

_peer_timeout: int | None = None  # the heartbeat timeout in effect, once this process has joined a run


def peer_timeout() -> int | None:
  """Seconds without heartbeats after which a process is taken as lost and the survivors stop; None in a
  single-process run."""
  return _peer_timeout


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, *, local_device_ids: str | Sequence[int] | None = None,
               initialization_timeout: int | None = None, peer_timeout: int | None = None) -> bool:
  """Join a multi-process run; returns True if ``jax.distributed`` was initialised.

  Sources, first match wins:
  1. explicit arguments (``--coordinator_address``, ``--num_processes``, ``--process_id``);
  2. ``TRANSFORMER_COORDINATOR_ADDRESS`` / ``TRANSFORMER_NUM_PROCESSES`` / ``TRANSFORMER_PROCESS_ID``;
  3. a cluster JAX detects itself: SLURM with more than one task (each started by ``srun``), or a multi-host TPU
     VM (``TPU_WORKER_HOSTNAMES`` with several hosts).
  Otherwise this is a single-process run and nothing happens.

  Args:
    local_device_ids: the devices this process drives, e.g. ``"0,1"`` (default: JAX's choice).
    initialization_timeout: seconds to wait for every process to join (default 300).
    peer_timeout: seconds without heartbeats after which a process is taken as lost (default 100).

  Raises:
    ConfigError: a setting is malformed, or a coordinator address comes without the process count and index.
    ClusterError: SLURM tasks not started by ``srun``, or the processes did not all join in time.
  """
  global _peer_timeout, _launched_at
  _launched_at = float(os.environ.get(LAUNCHED_AT) or 0) or process_started_at()  # a supervisor's start if any
  coordinator_address = _setting(coordinator_address, "coordinator_address", _address)
  num_processes = _setting(num_processes, "num_processes", _integer(minimum=1))
  process_id = _setting(process_id, "process_id", _integer(minimum=0))
  local_device_ids = _setting(local_device_ids, "local_device_ids", _device_ids)
  wait = _setting(initialization_timeout, "initialization_timeout", _integer(1, " of seconds"),
                  DEFAULT_INITIALIZATION_TIMEOUT)
  heartbeat = _setting(peer_timeout, "peer_timeout", _integer(1, " of seconds"), DEFAULT_PEER_TIMEOUT)
  if coordinator_address:
    _check_process_numbers(num_processes, process_id)
  elif _in_detected_cluster():
    _require_srun()
    coordinator_address, num_processes, process_id, local_device_ids = _detect_cluster(local_device_ids, wait)
  else:
    return False
  _join(coordinator_address, num_processes, process_id, local_device_ids, wait, heartbeat)
  _peer_timeout = heartbeat
  watch_peers(heartbeat)
  log.info("process %d of %d, %d local / %d global devices", jax.process_index(), jax.process_count(),
           jax.local_device_count(), jax.device_count())
  return True


_launched_at = None  # when a process that ``initialize`` ran in started: a launch of launch.py


def launched_at() -> float | None:
  """When this launch's process started (epoch seconds): the start of its goodput ``launch`` phase (imports,
  the ``jax.distributed`` join); None for a run started inside a Python session, where no launch is counted."""
  return _launched_at


def process_started_at() -> float | None:
  """When this process started (epoch seconds, to 10 ms): its start in clock ticks since boot (``/proc``) and
  the machine's uptime; None where there is no ``/proc``."""
  try:
    with open("/proc/self/stat") as f:
      start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime; fields after the name
    with open("/proc/uptime") as f:
      uptime = float(f.read().split()[0])
    return time.time() - (uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
  except (OSError, ValueError, IndexError):
    return None


def _setting(value, name: str, parse: Callable, default=None):
  """``value`` (the flag ``--name``) if given, else the variable ``TRANSFORMER_<NAME>``, else ``default``."""
  variable = f"TRANSFORMER_{name.upper()}"
  if value is not None and value != "":
    return parse(value, f"--{name}")
  if os.environ.get(variable):
    return parse(os.environ[variable], variable)
  return default


def _address(value, source: str) -> str:
  host, _, port = str(value).rpartition(":")
  if not host or not port.isdigit():
    raise ConfigError(f"{source}={value!r} is not HOST:PORT; give process 0's host and a free port, e.g. "
                      "10.0.0.1:1234.")
  return str(value)


def _integer(minimum: int, unit: str = "") -> Callable:
  def parse(value, source: str) -> int:
    try:
      number = int(str(value).strip())
    except ValueError:
      number = None
    if number is None or number < minimum:
      raise ConfigError(f"{source}={value!r} must be a whole number{unit}, at least {minimum}.")
    return number
  return parse


def _device_ids(value, source: str) -> list[int]:
  """``"0,1"`` or ``[0, 1]`` -> ``[0, 1]``."""
  parts = value.split(",") if isinstance(value, str) else list(value)
  try:
    ids = [int(str(part).strip()) for part in parts]
  except ValueError:
    ids = []
  if not ids or min(ids) < 0 or len(set(ids)) < len(ids):
    raise ConfigError(f"{source}={value!r} must list distinct device indices separated by commas, e.g. 0,1.")
  return ids


def _check_process_numbers(num_processes: int | None, process_id: int | None) -> None:
  if num_processes is None or process_id is None:
    raise ConfigError("a coordinator address needs num_processes and process_id too "
                      "(flags --num_processes/--process_id or TRANSFORMER_NUM_PROCESSES/TRANSFORMER_PROCESS_ID).")
  if process_id >= num_processes:
    raise ConfigError(f"process_id={process_id} must be below num_processes={num_processes}: the processes are "
                      f"numbered 0 to {num_processes - 1}.")


def _in_detected_cluster() -> bool:
  env = os.environ
  return int(env.get("SLURM_NTASKS") or 1) > 1 or len(env.get("TPU_WORKER_HOSTNAMES", "").split(",")) > 1


def _require_srun() -> None:
  """A SLURM allocation of several tasks whose processes srun did not start (an sbatch script that runs python
  itself) would wait for tasks that never come."""
  tasks = int(os.environ.get("SLURM_NTASKS") or 1)
  missing = [name for name in SRUN_VARIABLES if name not in os.environ]
  if tasks > 1 and missing:
    raise ClusterError(f"the SLURM allocation has SLURM_NTASKS={tasks} tasks but this process was not started by "
                       f"srun ({', '.join(missing)} unset): run `srun python launch.py ...` (one task per host, "
                       "see docs/slurm/train.sbatch), or unset SLURM_NTASKS for a single-process run.")


def _detect_cluster(local_device_ids, wait: int) -> tuple:
  """(coordinator, process count, process index, local device ids) as ``jax.distributed.initialize()`` finds
  them in the environment, so that the joining line can name them."""
  from jax._src import clusters  # pylint: disable=import-outside-toplevel  # JAX's own detection
  found = clusters.ClusterEnv.auto_detect_unset_distributed_params(
      os.environ.get("JAX_COORDINATOR_ADDRESS"), None, None, local_device_ids, None, wait)
  if None in found[:3]:
    raise ClusterError("the environment names several processes (SLURM_NTASKS or TPU_WORKER_HOSTNAMES) but JAX "
                       "found no complete cluster description in it; give --coordinator_address, --num_processes "
                       "and --process_id.")
  return found


def _join(coordinator_address: str, num_processes: int, process_id: int, local_device_ids, wait: int,
          heartbeat: int) -> None:
  print(f"process {process_id} of {num_processes}: joining coordinator {coordinator_address}, waiting up to "
        f"{wait} s for the others (--initialization_timeout)", flush=True)
  not_joined = ClusterError(
      f"process {process_id}: the {num_processes} processes did not all join coordinator {coordinator_address} "
      f"within {wait} s. Check that all {num_processes} were started with the same coordinator address and "
      "--num_processes, that process 0 runs on the coordinator's host, and that its port is open to every host; "
      "a slow start needs a larger --initialization_timeout.")
  # Before anything is compiled: the programs of all processes then match whatever line each collective is called
  # from (see the module's docstring; jax 0.12 stalled otherwise).
  jax.config.update("jax_traceback_in_locations_limit", 0)
  watchdog = threading.Timer(wait, _exit_with, args=(not_joined,))
  watchdog.daemon = True
  watchdog.start()
  try:
    jax.distributed.initialize(coordinator_address, num_processes, process_id, local_device_ids=local_device_ids,
                               initialization_timeout=wait + ABORT_MARGIN, heartbeat_timeout_seconds=heartbeat)
  except RuntimeError as error:  # JAX versions that raise on the deadline instead of aborting
    if "DEADLINE_EXCEEDED" not in str(error):
      raise
    raise not_joined from None
  finally:
    watchdog.cancel()


def _exit_with(error: ClusterError) -> None:
  """From the watchdog thread: the main thread waits in C++, where no exception can reach it."""
  sys.stderr.write(f"error: {error}\n")
  sys.stderr.flush()
  os._exit(1)  # pylint: disable=protected-access


SUPERVISED = "TRANSFORMER_SUPERVISED"  # set in the child that a supervising launch.py runs
LAUNCHED_AT = "TRANSFORMER_LAUNCHED_AT"  # and when the supervisor started (epoch seconds): the launch began there
# Signals a supervisor passes to its child; the terminal's (Ctrl-C) already reach both, being one process group.
_FORWARDED = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
              signal.SIGABRT}
_SI_KERNEL = 0x80  # siginfo's si_code of a signal the kernel sent (a terminal's Ctrl-C), not a kill() of a process
# JAX's C++ log lines about its distributed service (the first of them starts what is held back): W/E/F, MMDD.
_SERVICE_LINE = re.compile(rb"^[WEF]\d{4} [^\n]*(?:coordination service|distributed service)", re.MULTILINE)
_ERROR_LINE = re.compile(rb"^error: ", re.MULTILINE)  # the one line a run stops with (errors.exit_on_user_error)
_HOLD_SECONDS = 5  # JAX aborts within milliseconds of its first such line; a child alive after this goes on


def needs_supervisor(coordinator_address: str | None) -> bool:
  """Whether this launch.py is one of several processes (``initialize`` would join a run) and not yet the child
  of a supervisor: see :func:`supervise`."""
  if os.environ.get(SUPERVISED):
    return False
  return bool(coordinator_address or os.environ.get("TRANSFORMER_COORDINATOR_ADDRESS") or _in_detected_cluster())


def supervise(workdir: str | None, process_id: int | None = None, num_processes: int | None = None) -> int:
  """Run this command again as a child and watch it; returns its exit status (or dies by its signal).

  When process 0 is killed, its coordination service goes with it and JAX aborts every other process from a C++
  thread within a second (``Terminating process because the JAX distributed service detected fatal errors``, a
  stack, SIGABRT), before any Python code of theirs can speak; the callback jaxlib offers instead aborts with
  ``std::bad_cast`` (jaxlib 0.10.2). So a parent does it: the child's stdout is its own, signals sent to the
  parent reach the child, and the child's stderr passes through, except that from JAX's first line about its
  distributed service on it is held back. If the child then dies by SIGABRT, the parent prints one line naming
  the lost coordinator and the command that resumes, keeps the held text in a file the line names, and returns
  ``PEER_LOST_EXIT_STATUS``; otherwise (or if the child lives on for ``_HOLD_SECONDS``) the held text is passed
  on as it was. A child that said its own ``error:`` line first (a collective with process 0 failed before JAX
  aborted it) keeps it as the one line: the parent then only keeps the held text in the file.
  """
  signal.pthread_sigmask(signal.SIG_BLOCK, _FORWARDED)  # taken with sigtimedwait below, with who sent them
  parent, prctl = os.getpid(), _die_with_parent_call()

  def in_child():
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _FORWARDED)
    prctl()
    if os.getppid() != parent:  # the parent died before prctl took effect
      os._exit(1)

  launched = {LAUNCHED_AT: str(process_started_at())} if process_started_at() else {}  # goodput's launch phase
  child = subprocess.Popen([sys.executable, *sys.orig_argv[1:]], env={**os.environ, SUPERVISED: "1", **launched},
                           stderr=subprocess.PIPE, preexec_fn=in_child)
  held, said = _relay_stderr(child)
  status = child.wait()
  if held and status in (-signal.SIGABRT, 128 + signal.SIGABRT):
    line = _coordinator_lost_line(held, workdir, process_id, num_processes)  # keeps the held text in its file
    if not said:
      _write_stderr(line.encode())
    return PEER_LOST_EXIT_STATUS
  _write_stderr(held)
  return _exit_as(status)


def _relay_stderr(child: subprocess.Popen) -> tuple[bytes, bool]:
  """Pass the child's stderr on, and the signals sent to this process to the child, until it ends. Returns the
  text held back from JAX's first distributed-service line on (empty when none came, or when the child lived on
  ``_HOLD_SECONDS`` after it), and whether the child showed an ``error:`` line of its own."""
  pipe = child.stderr.fileno()
  held, held_since, said = b"", 0.0, False
  while True:
    while (received := signal.sigtimedwait(_FORWARDED, 0)) is not None:
      if received.si_code != _SI_KERNEL:
        child.send_signal(received.si_signo)
    if select.select([pipe], [], [], 0.1)[0]:
      chunk = os.read(pipe, 1 << 16)
      if not chunk:
        return held, said
      start = None if held else _SERVICE_LINE.search(chunk)
      if start:
        held_since = time.monotonic()
      split = start.start() if start else (0 if held else len(chunk))
      _write_stderr(chunk[:split])
      held += chunk[split:]
      said = said or _ERROR_LINE.search(chunk, 0, split) is not None  # shown, not held: a held one goes to the file
    elif child.poll() is not None:  # exited, and nothing left to read (a grandchild may keep the pipe open)
      return held, said
    if held and child.poll() is None and time.monotonic() - held_since > _HOLD_SECONDS:
      _write_stderr(held)
      held = b""


def _exit_as(status: int) -> int:
  """The child's exit ``status`` as this process's: the same status, or death by the same signal, as a shell or a
  scheduler would have seen the child's."""
  if status >= 0:
    return status
  faulthandler.disable()
  if -status != signal.SIGKILL:  # the one signal whose action cannot be set, nor needs to be
    signal.signal(-status, signal.SIG_DFL)
  signal.pthread_sigmask(signal.SIG_UNBLOCK, {-status})
  os.kill(os.getpid(), -status)
  return 128 - status


def _die_with_parent_call() -> Callable[[], None]:
  """A call for the child (before exec) that kills it when its parent dies: ``kill -9`` of the process a user
  or a scheduler started must stop the run (process 0's coordination service with it), as without a parent."""
  if not sys.platform.startswith("linux"):
    return lambda: None
  import ctypes  # pylint: disable=import-outside-toplevel
  libc = ctypes.CDLL(None, use_errno=True)
  return lambda: libc.prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG


def _write_stderr(data: bytes) -> None:
  while data:
    try:
      data = data[os.write(2, data):]
    except OSError:  # stderr's reader is gone: the child's output is read on, and dropped, so that it never blocks
      return


def _coordinator_lost_line(held: bytes, workdir: str | None, process_id, num_processes) -> str:
  """The one line for a child JAX aborted over its distributed service, naming the file that keeps ``held``."""
  if process_id is None:  # for the line only: the child checks and reports malformed values
    process_id = os.environ.get("TRANSFORMER_PROCESS_ID") or os.environ.get("SLURM_PROCID")
  num_processes = num_processes or os.environ.get("TRANSFORMER_NUM_PROCESSES") or os.environ.get("SLURM_NTASKS")
  who = f"process {process_id}" if process_id is not None else "this process"
  name = f"jax_abort_process_{process_id if process_id is not None else os.getpid()}.log"
  from transformer.train.workdir import RUN_MARKERS  # pylint: disable=import-outside-toplevel
  in_run = workdir and any(os.path.exists(os.path.join(workdir, marker)) for marker in RUN_MARKERS)
  path = os.path.join(workdir if in_run else tempfile.gettempdir(), name)  # not one to make a folder no run's
  try:
    with open(path, "wb") as f:
      f.write(held)
  except OSError as error:
    path = f"not kept: {error.strerror}"
  status = re.search(rb"absl::Status: ([^\n]*)", held)
  status = status.group(1).decode(errors="replace") if status else ""
  of = f" of {num_processes}" if num_processes else ""
  task = re.search(r"/task:(\d+)", status)  # the service names a process it lost as a task
  if str(process_id) != "0" and (not status or "coordination service" in status):  # the service itself is gone
    lost = f"process 0{of} (the coordinator: it hosts JAX's coordination service) is gone, killed or its host lost"
  elif task:
    lost = f"process {task.group(1)}{of} is gone (JAX's distributed service: {status.split('. ')[0][:160]})"
  else:
    lost = f"JAX's distributed service reported a fatal error ({status.split('. ')[0][:160]})"
  return (f"\nerror: {lost}; {who} stops too (JAX's own report: {path}). The last checkpoint is kept: restart "
          f"every process with the same command to resume: {resume_command()}\n")


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
