"""Starting a run on a cluster: URL workdirs, a workdir each host has alone, SLURM without srun, the multi-host
flags and their environment variables, and processes that never join all end in one line, never a hang."""
import os
import random
import socket

import jax
import pytest

from tests.train.conftest import TINY_FLAGS, finish, start_launch
from tests.train.test_multihost import free_port
from transformer.errors import ClusterError, ConfigError, WorkdirError
from transformer.train import modes, multihost
from transformer.train.config import check_workdir, refuse_url_workdir

CLUSTER_VARIABLES = ("SLURM_", "TPU_WORKER_HOSTNAMES", "TRANSFORMER_COORDINATOR", "TRANSFORMER_NUM_PROCESSES",
                     "TRANSFORMER_PROCESS_ID", "TRANSFORMER_LOCAL_DEVICE_IDS", "TRANSFORMER_INITIALIZATION_TIMEOUT",
                     "TRANSFORMER_PEER_TIMEOUT", "JAX_COORDINATOR", "JAX_LOCAL_DEVICE_IDS")


def without_cluster(environ) -> dict:
  return {k: v for k, v in environ.items() if not k.startswith(CLUSTER_VARIABLES)}


@pytest.fixture
def joins(monkeypatch):
  """The keyword arguments of every ``jax.multihost.initialize`` call, which does nothing here."""
  for name in list(os.environ):
    if name.startswith(CLUSTER_VARIABLES):
      monkeypatch.delenv(name)
  monkeypatch.setattr(multihost, "_peer_timeout", None)
  calls = []
  monkeypatch.setattr(jax.distributed, "initialize", lambda *args, **kwargs: calls.append(
      dict(zip(("coordinator_address", "num_processes", "process_id"), args), **kwargs)))
  return calls


# --- URL workdirs -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("workdir,fix", [
    ("gs://bucket/run", "mount the bucket (e.g. with gcsfuse) and pass the mount path, e.g. --workdir=/mnt/bucket/run"),
    ("s3://bucket/run", "--workdir=/mnt/bucket/run"), ("file:///tmp/run", "give the path itself, --workdir=/tmp/run")])
def test_a_url_workdir_is_refused_in_train_and_read_modes(workdir, fix, tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  with pytest.raises(WorkdirError, match="is a URL") as train:
    check_workdir(workdir)
  with pytest.raises(WorkdirError, match="is a URL") as evaluate:
    modes._require_a_run(workdir, "eval")  # pylint: disable=protected-access
  assert fix in str(train.value) and str(evaluate.value) == str(train.value)
  assert os.listdir(tmp_path) == []  # no local folder named "gs:"


def test_a_local_path_with_a_colon_is_not_a_url(tmp_path):
  for local in ("run:2", "c:/runs"):  # a colon, but no "scheme://"
    refuse_url_workdir(str(tmp_path / local))  # raises on a URL (test above)
  check_workdir(str(tmp_path / "run:2"))
  assert (tmp_path / "run:2").is_dir()  # created as the local folder it names


# --- SLURM and the multi-host settings --------------------------------------------------------------------------

def test_a_slurm_allocation_without_srun_is_refused_at_once(joins, monkeypatch):
  """An sbatch script that runs python itself: SLURM_NTASKS=4 but none of the variables srun sets per task."""
  for name, value in {"SLURM_JOB_ID": "1234", "SLURM_NTASKS": "4", "SLURM_PROCID": "0", "SLURM_LOCALID": "0",
                      "SLURM_JOB_NODELIST": "node[001-004]"}.items():
    monkeypatch.setenv(name, value)
  with pytest.raises(ClusterError) as refused:
    multihost.initialize()
  assert "srun" in str(refused.value) and "SLURM_NTASKS=4" in str(refused.value)
  assert "SLURM_STEP_NODELIST" in str(refused.value) and joins == []


def test_srun_tasks_join_the_coordinator_slurm_names(joins, monkeypatch, capsys):
  for name, value in {"SLURM_JOB_ID": "4097", "SLURM_NTASKS": "4", "SLURM_PROCID": "2", "SLURM_LOCALID": "1",
                      "SLURM_STEP_NODELIST": "node[001-004]", "SLURM_STEP_ID": "0"}.items():
    monkeypatch.setenv(name, value)
  assert multihost.initialize()
  port = 61440 + 4097 % 4096  # JAX's SlurmCluster: the job id picks a port in [61440, 65535]
  assert joins[0]["coordinator_address"] == f"node001:{port}" and joins[0]["num_processes"] == 4
  assert joins[0]["process_id"] == 2 and joins[0]["local_device_ids"] == [1]
  assert f"process 2 of 4: joining coordinator node001:{port}, waiting up to 300 s" in capsys.readouterr().out


def test_one_slurm_task_is_a_single_process_run(joins, monkeypatch):
  monkeypatch.setenv("SLURM_NTASKS", "1")
  assert not multihost.initialize() and joins == [] and multihost.peer_timeout() is None


@pytest.mark.parametrize("flag,value", [
    ("local_device_ids", "0,a"), ("local_device_ids", "-1"), ("local_device_ids", "0,0"), ("local_device_ids", ","),
    ("peer_timeout", -5), ("peer_timeout", 0), ("initialization_timeout", -1), ("initialization_timeout", "soon")])
def test_a_bad_multi_host_value_is_one_line_naming_the_flag(joins, flag, value):
  with pytest.raises(ConfigError, match=f"--{flag}="):
    multihost.initialize("localhost:1234", 2, 0, **{flag: value})
  assert joins == []


def test_a_bad_environment_value_names_the_variable(joins, monkeypatch):
  monkeypatch.setenv("TRANSFORMER_LOCAL_DEVICE_IDS", "gpu0")
  with pytest.raises(ConfigError, match="TRANSFORMER_LOCAL_DEVICE_IDS="):
    multihost.initialize("localhost:1234", 2, 0)


def test_a_process_id_outside_the_run_is_refused(joins):
  with pytest.raises(ConfigError, match="numbered 0 to 1"):
    multihost.initialize("localhost:1234", 2, 2)


def test_defaults_are_jaxs(joins):
  assert multihost.initialize("localhost:1234", 2, 1)
  assert joins[0]["heartbeat_timeout_seconds"] == 100 and joins[0]["local_device_ids"] is None
  assert joins[0]["initialization_timeout"] == 300 + multihost.ABORT_MARGIN  # the watchdog stops us at 300
  assert multihost.peer_timeout() == 100


def test_environment_variables_set_what_flags_leave_unset(joins, monkeypatch):
  for name, value in {"COORDINATOR_ADDRESS": "10.0.0.1:99", "NUM_PROCESSES": "3", "PROCESS_ID": "2",
                      "LOCAL_DEVICE_IDS": "2,3", "INITIALIZATION_TIMEOUT": "40", "PEER_TIMEOUT": "50"}.items():
    monkeypatch.setenv(f"TRANSFORMER_{name}", value)
  assert multihost.initialize()
  assert joins[-1] == dict(coordinator_address="10.0.0.1:99", num_processes=3, process_id=2, local_device_ids=[2, 3],
                           initialization_timeout=40 + multihost.ABORT_MARGIN, heartbeat_timeout_seconds=50)
  assert multihost.peer_timeout() == 50
  assert multihost.initialize("localhost:7", 2, 1, local_device_ids="0,1", initialization_timeout=20,
                                peer_timeout=7)
  assert joins[-1] == dict(coordinator_address="localhost:7", num_processes=2, process_id=1, local_device_ids=[0, 1],
                           initialization_timeout=20 + multihost.ABORT_MARGIN, heartbeat_timeout_seconds=7)
  assert multihost.peer_timeout() == 7


def test_a_deadline_that_jax_raises_becomes_one_line(joins, monkeypatch):
  def deadline(*args, **kwargs):
    raise RuntimeError("DEADLINE_EXCEEDED: Deadline Exceeded RPC: /xla.coordination.CoordinationService/RegisterTask")
  monkeypatch.setattr(jax.distributed, "initialize", deadline)
  with pytest.raises(ClusterError, match="the 3 processes did not all join coordinator localhost:1234 within 300 s"):
    multihost.initialize("localhost:1234", 3, 1)


# --- processes on localhost -------------------------------------------------------------------------------------

def two_process_env() -> dict:
  env = without_cluster({k: v for k, v in os.environ.items() if k != "XLA_FLAGS"})
  env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"  # 2 processes x 2 devices
  env["JAX_ENABLE_COMPILATION_CACHE"] = "false"  # as in test_multihost.py: each process compiles for itself
  return env


@pytest.mark.slow
def test_others_that_never_join_end_in_one_line(tmp_path):
  """JAX aborts from C++ at its deadline; the watchdog's line comes first."""
  process = start_launch("--config=experiments/synthetic.py:copy", f"--workdir={tmp_path}/run",
                         f"--coordinator_address=localhost:{free_port()}", "--num_processes=2", "--process_id=1",
                         "--initialization_timeout=2", "--config.parallelism=mesh", *TINY_FLAGS, env=two_process_env())
  output, = finish(process, timeout=60)
  assert process.returncode == 1, output
  assert "error: process 1: the 2 processes did not all join coordinator localhost:" in output, output
  assert "Traceback" not in output and "Check failure" not in output, output


@pytest.mark.slow
def test_a_workdir_each_process_has_alone_is_refused_by_every_process(tmp_path):
  port = free_port()
  processes = [start_launch("--config=experiments/synthetic.py:copy", f"--workdir={tmp_path}/host{process_id}/run",
                            f"--coordinator_address=localhost:{port}", "--num_processes=2",
                            f"--process_id={process_id}", "--config.parallelism=mesh", *TINY_FLAGS,
                            env=two_process_env())
               for process_id in range(2)]
  outputs = finish(*processes, timeout=240)
  for process, output in zip(processes, outputs):
    assert process.returncode == 1, output
    errors = [line for line in output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "is not shared between the processes" in errors[0], output
    assert "process 1 does not see" in errors[0] and "same shared folder" in errors[0], output
    assert "Traceback" not in output, output
  assert not [name for name in os.listdir(tmp_path / "host0" / "run") if name.startswith(".shared-workdir-")]


def slurm_job_id() -> tuple[int, int]:
  """A job id whose SLURM coordinator port (JAX: 61440 + job id % 4096) is free here, and that port."""
  for port in random.sample(range(61440, 65536), 100):
    with socket.socket() as probe:
      try:
        probe.bind(("", port))
      except OSError:
        continue
    return 4096 * 100 + port - 61440, port
  pytest.skip("no free port in 61440-65535 for a simulated SLURM job")


@pytest.mark.slow
def test_srun_tasks_on_localhost_train_in_lock_step(tmp_path):
  """Two ``python launch.py`` with the environment ``srun --ntasks=2`` gives its tasks on one node, and no
  coordinator flags: JAX's own SLURM detection (jax/_src/clusters/slurm_cluster.py) joins them."""
  job_id, port = slurm_job_id()
  processes = []
  for task in range(2):
    env = dict(two_process_env(), SLURM_JOB_ID=str(job_id), SLURM_NTASKS="2", SLURM_PROCID=str(task),
               SLURM_LOCALID=str(task), SLURM_NODEID="0", SLURM_STEP_ID="0", SLURM_STEP_NODELIST="localhost",
               SLURM_STEP_NUM_NODES="1", SLURM_JOB_NODELIST="localhost")
    processes.append(start_launch("--config=experiments/synthetic.py:copy", f"--workdir={tmp_path}/shared",
                                  "--config.parallelism=mesh", *TINY_FLAGS, env=env))
  outputs = finish(*processes, timeout=400)  # about 15 s when healthy
  for task, (process, output) in enumerate(zip(processes, outputs)):
    assert process.returncode == 0, output
    assert f"process {task} of 2: joining coordinator localhost:{port}" in output, output
  assert "devices: 4 x cpu, processes: 2" in outputs[0]
  checksums = [line for output in outputs for line in output.splitlines() if line.startswith("params checksum")]
  assert len(checksums) == 2 and checksums[0].split(":")[1] == checksums[1].split(":")[1], checksums
