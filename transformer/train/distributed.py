"""Multi-host start-up: ``jax.distributed.initialize`` from explicit values or the environment.

Every setting comes from its flag (``--coordinator_address``, ``--num_processes``, ``--process_id``,
``--local_device_ids``, ``--initialization_timeout``, ``--peer_timeout``), else from the environment variable
``TRANSFORMER_<FLAG NAME IN CAPITALS>``, else from its default. Without a coordinator address, a cluster that JAX
detects itself (SLURM with more than one task, a multi-host TPU VM) is joined.

JAX does not raise when the other processes fail to join in time: it aborts the process from C++ with a stack.
A watchdog thread stops this process first, with one ``error: ...`` line and exit status 1.
"""
from __future__ import annotations

import logging
import os
import sys
import threading
from typing import Callable, Sequence

import jax

from transformer.errors import ClusterError, ConfigError
from transformer.train.peers import watch_peers

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
  global _peer_timeout
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
