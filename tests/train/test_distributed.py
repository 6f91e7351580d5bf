"""Multi-process training with jax.distributed on localhost: two CPU processes train in lock step."""
import os
import socket

import pytest

from tests.train.conftest import TINY_FLAGS, finish, start_launch


def free_port():
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


@pytest.mark.slow
def test_two_processes_train_in_lock_step(tmp_path):
  port = free_port()
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"  # 2 processes x 2 devices
  # No persistent compilation cache (tests/conftest.py shares one across the session): each process
  # compiles its programs itself, as on a first multi-host run, instead of one loading an executable
  # that an earlier test or session wrote while the other compiles.
  env["JAX_ENABLE_COMPILATION_CACHE"] = "false"
  processes = [start_launch("--config=experiments/synthetic.py:copy", f"--workdir={tmp_path}/shared",
                            f"--coordinator_address=localhost:{port}", "--num_processes=2",
                            f"--process_id={process_id}", "--config.parallelism=mesh", *TINY_FLAGS, env=env)
               for process_id in range(2)]
  outputs = finish(*processes, timeout=180)  # about 10 s when healthy
  for process, output in zip(processes, outputs):
    assert process.returncode == 0, output
  assert "devices: 4 x cpu, processes: 2" in outputs[0]
  # Every process holds the full (replicated) parameters; their checksums, printed by each, must agree.
  checksums = [line for output in outputs for line in output.splitlines() if line.startswith("params checksum")]
  assert len(checksums) == 2 and checksums[0].split(":")[1] == checksums[1].split(":")[1], checksums
