"""The parent that watches each process of a multi-process run (``multihost.supervise``): JAX's C++ abort over a
lost coordinator becomes one line and status 75, and everything else (output, exit statuses, signals) passes
through as without it. A fake child stands for launch.py here; the real kill of process 0 is in
test_multihost.py."""
import fcntl
import os
import pty
import signal
import subprocess
import sys
import termios
import time

import pytest

from tests.train.conftest import REPO

pytestmark = pytest.mark.slow  # each test starts a parent that imports JAX: about 4 s apiece on 2 cores

# A script that supervises itself: the child (SUPERVISED set) plays the part given on its command line.
SCRIPT = f"""
import os, signal, sys, time
sys.path.insert(0, {REPO!r})
if not os.environ.get("TRANSFORMER_SUPERVISED"):
  from transformer.train import multihost
  sys.exit(multihost.supervise(sys.argv[2], process_id=1, num_processes=2))
part = sys.argv[1]
print("child stdout", flush=True)
os.write(2, b"child stderr\\n")
if part == "own-line-then-service-abort":  # its collective with process 0 failed first (jax 0.12), then JAX aborts
  os.write(2, b"\\nerror: process 0 of 2 is gone: a collective with it failed (Gloo AllGather failed); process 1 "
           b"stops too. The last checkpoint is kept: restart every process with the same command to resume: "
           b"python launch.py\\n")
  part = "service-abort"
if part == "service-line-then-own-line-then-abort":  # held from the service line on, so the child's line is too
  os.write(2, b"W1207 01:31:35.063498    8151 preemption_sync_manager.cc:147] no preemption notice from coordination service\\n")
  os.write(2, b"error: process 0 of 2 is gone: a collective with it failed\\n")
  part = "service-abort"
if part == "service-abort":  # as jaxlib 0.10.2 writes it when process 0 is killed
  os.write(2, {b"W1207 01:31:35.063498    8151 preemption_sync_manager.cc:147] Failed to retrieve preemption notice from coordination service: UNAVAILABLE: Socket closed"!r} + b"\\n")
  os.write(2, {b"F1207 01:31:35.063625    8151 client.h:80] Terminating process because the JAX distributed service detected fatal errors. This most likely indicates that another task died. absl::Status: UNAVAILABLE: Failed to send RPC to coordination service. Either the leader task was preempted/died/restarted unexpectedly or this task is experiencing network issues."!r} + b"\\n*** Check failure stack trace: ***\\n    @     0x7f6e1ef040ee  xla::CoordinationServiceAgent::SetError()\\n")
  os.abort()
elif part == "service-line-then-exit":  # a line about the service, but no abort: passed on as written
  os.write(2, b"W1207 01:31:35.063498    8151 preemption_sync_manager.cc:147] no preemption notice from coordination service\\n")
  sys.exit(0)
elif part.startswith("exit-"):
  sys.exit(int(part[5:]))
elif part.startswith("signal-"):
  os.kill(os.getpid(), int(part[7:]))
elif part == "count-sigint":
  received = []
  signal.signal(signal.SIGINT, lambda *_: received.append(1))
  open(sys.argv[2] + "/child.pid", "w").write(str(os.getpid()))
  deadline = time.monotonic() + 60
  while not received and time.monotonic() < deadline:
    time.sleep(0.05)
  time.sleep(2)  # a forwarded copy would come within milliseconds
  print(f"child got {{len(received)}} SIGINT", flush=True)
elif part == "wait":
  signal.signal(signal.SIGTERM, lambda *_: (print("child got SIGTERM", flush=True), sys.exit(0)))
  signal.signal(signal.SIGINT, lambda *_: (print("child got SIGINT", flush=True), sys.exit(0)))
  open(sys.argv[2] + "/child.pid", "w").write(str(os.getpid()))
  time.sleep(120)
"""


def supervised(tmp_path, part):
  script = tmp_path / "script.py"
  script.write_text(SCRIPT)
  env = {k: v for k, v in os.environ.items() if k != "TRANSFORMER_SUPERVISED"}
  return subprocess.Popen([sys.executable, str(script), part, str(tmp_path)], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize("run_workdir", [True, False], ids=["in-the-workdir", "no-run-yet"])
def test_jax_aborting_over_a_lost_coordinator_is_one_line_and_status_75(tmp_path, run_workdir):
  """(was: JAX's F-line, a C++ stack and status 134). The report is kept in a run's workdir, else in the temp
  folder: a file of ours must not make a folder without a run's files look like one that is no run's."""
  if run_workdir:
    (tmp_path / "launches.jsonl").touch()
  process = supervised(tmp_path, "service-abort")
  out, err = process.communicate(timeout=60)
  assert process.returncode == 75 and out == "child stdout\n", err
  lines = err.splitlines()
  assert lines[0] == "child stderr", err
  line, = [line for line in lines if line.startswith("error: ")]
  assert line.startswith("error: process 0 of 2 (the coordinator: it hosts JAX's coordination service) is gone")
  assert ("process 1 stops too" in line and "restart every process with the same command to resume: python"
          in line), line
  assert "Check failure" not in err and "F1207" not in err and "W1207" not in err, err
  report = line.split("JAX's own report: ")[1].split(")")[0]
  assert (os.path.dirname(report) == str(tmp_path)) == run_workdir
  with open(report) as f:
    kept = f.read()
  assert kept.startswith("W1207") and "Check failure stack trace" in kept
  if not run_workdir:
    os.remove(report)


@pytest.mark.parametrize("part, shown", [("own-line-then-service-abort", "a collective with it failed"),
                                         ("service-line-then-own-line-then-abort", "(the coordinator")])
def test_one_error_line_whether_the_child_said_its_own_before_jax_aborted_it_or_not(tmp_path, part, shown):
  """(was: two error lines, the child's and then the parent's, when a collective noticed the lost coordinator
  before JAX's service did; then none, when the child's line came after JAX's first line and was held back with
  it). The line shown is the child's if it was shown, else the parent's; JAX's report is in the file."""
  (tmp_path / "launches.jsonl").touch()
  process = supervised(tmp_path, part)
  _, err = process.communicate(timeout=60)
  assert process.returncode == 75, err
  line, = [line for line in err.splitlines() if line.startswith("error: ")]
  assert shown in line and "Check failure" not in err, err
  assert "Check failure stack trace" in (tmp_path / "jax_abort_process_1.log").read_text()


@pytest.mark.parametrize("part, status", [("exit-0", 0), ("exit-1", 1), ("exit-130", 130),
                                          ("signal-9", -9), ("signal-6", -6), ("service-line-then-exit", 0)])
def test_output_and_exit_statuses_pass_through(tmp_path, part, status):
  """An abort without JAX's service lines, a kill, any exit status: as the child's own."""
  process = supervised(tmp_path, part)
  out, err = process.communicate(timeout=60)
  assert process.returncode == status and out == "child stdout\n", err
  assert err.startswith("child stderr\n") and "error:" not in err, err
  if part == "service-line-then-exit":
    assert "no preemption notice from coordination service" in err


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_the_parent_reaches_the_child(tmp_path, signum):
  process = supervised(tmp_path, "wait")
  _wait_for(tmp_path / "child.pid")
  process.send_signal(signum)
  out, _ = process.communicate(timeout=60)
  assert process.returncode == 0 and f"child got {signal.Signals(signum).name}" in out


def test_a_ctrl_c_at_the_terminal_reaches_the_child_once(tmp_path):
  """The terminal signals its whole foreground process group, parent and child: the parent passes on only the
  signals sent to it alone, so the child sees one Ctrl-C, not the two that stop a run without its save."""
  master, terminal = pty.openpty()

  def control_terminal():  # the new session's terminal: its foreground group is the parent's and the child's
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)

  script = tmp_path / "script.py"
  script.write_text(SCRIPT)
  env = {k: v for k, v in os.environ.items() if k != "TRANSFORMER_SUPERVISED"}
  process = subprocess.Popen([sys.executable, str(script), "count-sigint", str(tmp_path)], env=env, stdin=terminal,
                             stdout=subprocess.PIPE, stderr=terminal, text=True, start_new_session=True,
                             preexec_fn=control_terminal)
  os.close(terminal)
  try:
    _wait_for(tmp_path / "child.pid")
    os.write(master, b"\x03")  # Ctrl-C
    out, _ = process.communicate(timeout=60)
  finally:
    os.close(master)
  assert process.returncode == 0 and "child got 1 SIGINT" in out, out


def test_kill_9_of_the_parent_kills_the_child(tmp_path):
  """``kill -9`` of the process a user or scheduler started stops the run, process 0's service with it."""
  process = supervised(tmp_path, "wait")
  child = int(_wait_for(tmp_path / "child.pid"))
  process.kill()
  process.communicate(timeout=60)
  deadline = time.monotonic() + 10
  while _alive(child) and time.monotonic() < deadline:
    time.sleep(0.1)
  assert not _alive(child)


def _wait_for(path, timeout=60):
  deadline = time.monotonic() + timeout
  while not (path.exists() and path.read_text()):
    assert time.monotonic() < deadline, f"no {path}"
    time.sleep(0.1)
  return path.read_text()


def _alive(pid) -> bool:
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().split(")")[-1].split()[0] != "Z"  # a zombie has exited
  except FileNotFoundError:
    return False
