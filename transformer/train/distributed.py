"""Multi-host start-up: ``jax.distributed.initialize`` from explicit values or the environment."""
from __future__ import annotations

import logging
import os

import jax

from transformer.errors import ConfigError

log = logging.getLogger(__name__)


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None) -> bool:
  """Join a multi-process run; returns True if ``jax.distributed`` was initialised.

  Sources, first match wins:
  1. explicit arguments (``--coordinator_address``, ``--num_processes``, ``--process_id``);
  2. ``TRANSFORMER_COORDINATOR_ADDRESS`` / ``TRANSFORMER_NUM_PROCESSES`` / ``TRANSFORMER_PROCESS_ID``;
  3. a cluster JAX detects itself: SLURM with more than one task, or a multi-host TPU VM (``TPU_WORKER_HOSTNAMES``
     with several hosts), where ``jax.distributed.initialize()`` needs no arguments.
  Otherwise this is a single-process run and nothing happens.
  """
  env = os.environ
  coordinator_address = coordinator_address or env.get("TRANSFORMER_COORDINATOR_ADDRESS")
  if num_processes is None and env.get("TRANSFORMER_NUM_PROCESSES"):
    num_processes = int(env["TRANSFORMER_NUM_PROCESSES"])
  if process_id is None and env.get("TRANSFORMER_PROCESS_ID"):
    process_id = int(env["TRANSFORMER_PROCESS_ID"])
  if coordinator_address:
    if num_processes is None or process_id is None:
      raise ConfigError("a coordinator address needs num_processes and process_id too "
                       "(flags --num_processes/--process_id or TRANSFORMER_NUM_PROCESSES/TRANSFORMER_PROCESS_ID).")
    jax.distributed.initialize(coordinator_address, num_processes, process_id)
  elif int(env.get("SLURM_NTASKS", "1")) > 1 or len(env.get("TPU_WORKER_HOSTNAMES", "").split(",")) > 1:
    jax.distributed.initialize()
  else:
    return False
  log.info("process %d of %d, %d local / %d global devices", jax.process_index(), jax.process_count(),
           jax.local_device_count(), jax.device_count())
  return True
