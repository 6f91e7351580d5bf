"""A preemption inside the grace window: SIGTERM to every process of a run, and the seconds until each has saved
its checkpoint and exited.

    python -m benchmarks.preemption                 # the tiny synthetic model and Multi30k's transformer_small, 2 processes each
    python -m benchmarks.preemption --smoke         # the tiny model, 1 process

For each configuration, ``--processes`` launch.py processes (``jax.distributed`` on localhost, one CPU device each,
FSDP over the mesh, asynchronous saves: the documented multi-host recipe) train a long run; once process 0 has
logged step ``--after_step``, every process gets SIGTERM at once, as a scheduler's preemption notice does. The
table gives the seconds from the signal to the last process's exit (every process agrees on one step through the
coordination service, saves it, waits for the write and exits), split at the moment process 0 reached the agreed
step (its log line), the step saved and the state's size on disk.
Schedulers allow a fixed grace window between SIGTERM and SIGKILL (SLURM's ``KillWait`` and GKE's
``terminationGracePeriodSeconds`` default to 30 s); the run's own need is about the smallest state's exit time plus
the extra seconds per GB of state, which the notes give from the two sizes measured.

Multi30k's model needs its data (``$TRANSFORMER_DATA_DIR/multi30k``, see the README); without it that row is left
out with a note.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from benchmarks import common
from experiments.record_store import REPO, host_description

# (label, --config, overrides): the tiny model as the multi-process tests run it, and a model with a real state.
CONFIGS = (
    ("synthetic tiny", "experiments/synthetic.py:tiny", ()),
    ("Multi30k transformer_small", "experiments/multi30k.py:transformer_small", ()),
)
# No evaluation or periodic save near the signal: what is timed is the agreed step, its save and the exit.
LONG_RUN = ("--config.num_train_steps=100000", "--config.checkpoint_every=100000", "--config.eval_every=100000",
            "--config.log_every=1",
            "--config.quiet=False", "--config.parallelism=mesh", "--config.fsdp=True",
            "--config.async_checkpointing=True")


def add_arguments(parser):
  parser.add_argument("--processes", type=common.positive_int, default=None,
                      help="launch.py processes of each run (default 2; --smoke 1)")
  parser.add_argument("--after_step", type=common.positive_int, default=None,
                      help="the step process 0 logs before the signal (default 20; --smoke 3)")
  parser.add_argument("--start_timeout_s", type=common.positive_float, default=900.0,
                      help="seconds a run may take to reach --after_step (start-up, data, compilation)")


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def _directory_bytes(path: str) -> int:
  return sum(os.path.getsize(os.path.join(folder, name)) for folder, _, names in os.walk(path) for name in names)


class LaunchRefused(RuntimeError):
  """launch.py refused the run before training (its ``error: ...`` line)."""


def preempt(config: str, overrides, processes: int, after_step: int, workdir: str, start_timeout: float) -> dict:
  """Train ``config`` on ``processes`` processes in ``workdir``, SIGTERM all once process 0 logged ``after_step``:
  ``{"exit_seconds": [per process], "step": saved, "state_bytes": of that checkpoint}``.

  Raises:
    LaunchRefused: launch.py refused the run (e.g. its data is missing).
    RuntimeError: a process exited before the signal, did not exit within 10 minutes of it, or exited non-zero
      (its output's last lines in the message).
  """
  port = _free_port()
  env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=1", "JAX_PLATFORMS": "cpu"}
  logs = [os.path.join(workdir + ".logs", f"process_{i}.log") for i in range(processes)]
  os.makedirs(workdir + ".logs", exist_ok=True)
  cluster = ([f"--coordinator_address=localhost:{port}", f"--num_processes={processes}"] if processes > 1 else [])
  running = []
  for i, log in enumerate(logs):
    with open(log, "w") as out:
      running.append(subprocess.Popen(
          [sys.executable, "launch.py", f"--config={config}", f"--workdir={workdir}", *LONG_RUN, *overrides,
           *(cluster + [f"--process_id={i}"] if processes > 1 else [])],
          cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT))

  def output(i: int) -> str:
    with open(logs[i]) as f:
      return f.read()

  def fail(why: str):
    refusals = [line for i in range(processes) for line in output(i).splitlines() if line.startswith("error: ")]
    if refusals:  # launch.py refused the run in one line (its data missing, ...): nothing to measure
      raise LaunchRefused(refusals[0])
    for process in running:
      if process.poll() is None:
        process.kill()
    tails = "\n".join(f"--- process {i}:\n" + "\n".join(output(i).splitlines()[-15:]) for i in range(processes))
    raise RuntimeError(f"{config}: {why}\n{tails}")

  deadline = time.monotonic() + start_timeout
  while f"step {after_step}/" not in output(0):
    if any(process.poll() is not None for process in running):
      fail("a process exited before the signal")
    if time.monotonic() > deadline:
      fail(f"no step {after_step} within {start_timeout:.0f} s")
    time.sleep(0.05)
  signalled, signalled_at = time.monotonic(), time.time()
  for process in running:
    process.send_signal(signal.SIGTERM)
  exited = [None] * processes
  while any(seconds is None for seconds in exited):
    for i, process in enumerate(running):
      if exited[i] is None and process.poll() is not None:
        exited[i] = time.monotonic() - signalled
    if time.monotonic() - signalled > 600:
      fail("still running 10 minutes after SIGTERM")
    time.sleep(0.01)
  if any(process.returncode for process in running):
    fail(f"exit statuses {[process.returncode for process in running]}")
  saved = [name for name in os.listdir(os.path.join(workdir, "checkpoints")) if name.isdigit()]
  step = max(map(int, saved))
  synced = _sync_point_at(output(0))
  if synced is not None and synced < signalled_at - 12 * 3600:  # the log's time of day is past midnight
    synced += 24 * 3600
  return {"exit_seconds": exited, "step": step, "sync_seconds": None if synced is None else synced - signalled_at,
          "state_bytes": _directory_bytes(os.path.join(workdir, "checkpoints", str(step)))}


# absl's line as JAX logs reaching the agreed step: "W1207 02:22:11.507296 ... Reached preemption sync point".
_SYNC_LINE = re.compile(r"^[IWE]\d{4} (\d\d):(\d\d):(\d\d\.\d+) .*Reached preemption sync point", re.MULTILINE)


def _sync_point_at(output: str) -> float | None:
  """When process 0 reached the agreed step (epoch seconds, from its log line's local time of day today); None
  for one process, which agrees with nobody (its loop stops at the step it is in)."""
  line = _SYNC_LINE.search(output)
  if line is None:
    return None
  hours, minutes, seconds = line.groups()
  midnight = time.mktime(time.localtime()[:3] + (0, 0, 0, 0, 0, -1))
  return midnight + int(hours) * 3600 + int(minutes) * 60 + float(seconds)


def main(argv=None) -> common.Report:
  args = common.parse_args(__doc__.splitlines()[0], argv, add_arguments)
  machine = host_description()
  processes = args.processes or (1 if args.smoke else 2)
  after_step = args.after_step or (3 if args.smoke else 20)
  report = common.Report("preemption", "SIGTERM to every process: seconds until each has saved and exited",
                         ["model", "processes", "state on disk (MB)", "step saved", "SIGTERM -> last exit (s)",
                          "SIGTERM -> agreed step reached (s)", "agreed step -> last exit (s)"])
  measured = []
  for label, config, overrides in CONFIGS[:1] if args.smoke else CONFIGS:
    if common.out_of_time(args):
      report.notes.append(f"Left out (--time_budget_s spent): {label}.")
      continue
    folder = tempfile.mkdtemp(prefix="preemption-")
    try:
      result = preempt(config, overrides, processes, after_step, os.path.join(folder, "run"), args.start_timeout_s)
    except LaunchRefused as refusal:
      report.notes.append(f"Left out: {label}, refused by launch.py: {refusal}")
      continue
    finally:
      shutil.rmtree(folder, ignore_errors=True)
    megabytes = result["state_bytes"] / 2 ** 20
    last_exit, sync = max(result["exit_seconds"]), result["sync_seconds"]
    after_sync = None if sync is None else last_exit - sync
    report.rows.append([label, processes, megabytes, result["step"], last_exit, sync, after_sync])
    measured.append((megabytes, last_exit if after_sync is None else after_sync))
    print(f"{label}: {megabytes:.1f} MB saved at step {result['step']}, exits "
          f"{', '.join(f'{s:.2f}' for s in result['exit_seconds'])} s after SIGTERM", flush=True)
  if len(measured) >= 2:
    (small_mb, small_s), (large_mb, large_s) = measured[0], measured[-1]
    per_gb = (large_s - small_s) / max((large_mb - small_mb) / 1024, 1e-9)
    report.ratios["agreed step -> exit, largest state / smallest"] = large_s / small_s
    report.notes.append(
        f"Grace window: the step in progress at the signal (a batch shape met for the first time compiles then), "
        f"plus about {small_s:.1f} s from the agreed step to the exit for a state of no size, plus {per_gb:.0f} s "
        f"per GB of state (the two rows' difference over their sizes': the fingerprints, orbax's copy to the host "
        f"and the write to this disk). Scale the per-GB figure by your storage's write speed against this one's.")
  elif measured:
    report.ratios["SIGTERM -> exit, the part after the agreed step"] = measured[0][1] / max(report.rows[0][4], 1e-9)
  report.notes += [
      f"Each run: {' '.join(LONG_RUN)}; one CPU device per process; the signal once process 0 logged step "
      f"{after_step}, to every process at once.",
      f"Host load: 1-minute load average {os.getloadavg()[0]:.1f} at the end on {os.cpu_count()} cores; above the "
      "core count, other jobs shared the cores and every time here is longer than on an idle host.",
  ]
  return common.finish(report, args, argv, machine)


if __name__ == "__main__":
  main(sys.argv[1:])
