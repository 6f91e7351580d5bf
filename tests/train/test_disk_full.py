"""A full disk: one ``WorkdirError`` line naming the workdir and the space a checkpoint needs, no half-written
checkpoint left behind, the latest intact one kept and resumed from bit-identically.

The real thing is a tiny tmpfs (mounted when this process may, as root in CI; skipped otherwise); the check
before a save is also tested with a faked free-space figure, and the metric writers with ``/dev/full``.
"""
import contextlib
import errno
import os
import resource
import shutil
import subprocess
import sys
import uuid

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from tests.train.conftest import REPO, TINY_FLAGS, finish, start_launch
from transformer.data.files import format_bytes, is_disk_full, is_file_too_large, is_write_refused, write_atomically
from transformer.errors import WorkdirError
from transformer.train.checkpoint import Checkpointer
from transformer.train.workdir import RunDirectory
from transformer.train.writers import MetricWriter


def random_state(arrays=8, size=4096):
  """``arrays`` float32 vectors of random (incompressible) values: 16 KiB each by default."""
  return {f"w{i}": jnp.asarray(np.random.default_rng(i).standard_normal(size, dtype=np.float32))
          for i in range(arrays)}


def allocated(directory):
  """Bytes the files under ``directory`` take on disk, as ``du`` counts them."""
  return sum(os.stat(os.path.join(root, name)).st_blocks * 512 for root, _, names in os.walk(directory)
             for name in names)


def leftovers(directory):
  """Orbax temporary directories anywhere under ``directory`` (a save that never completed)."""
  return [os.path.join(root, d) for root, dirs, _ in os.walk(directory) for d in dirs if "orbax-checkpoint-tmp" in d]


@contextlib.contextmanager
def tiny_filesystem(path, size):
  """A tmpfs of ``size`` (``600k``) mounted at ``path``; skips the test where mounting is not allowed."""
  os.makedirs(path, exist_ok=True)
  mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                           capture_output=True, text=True)
  if mounted.returncode != 0:
    pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.strip()[:80]}): needs root")
  try:
    yield str(path)
  finally:
    subprocess.run(["umount", "-l", str(path)], check=False)


def test_disk_full_errors_are_recognised():
  assert is_disk_full(OSError(28, "No space left on device"))
  # tensorstore's error carries the reason only in its text
  assert is_disk_full(ValueError('RESOURCE_EXHAUSTED: Failed writing: "/x/d/1": Failed to write 3738 bytes to file 7: '
                                 "No space left on device [os_error_code='28']"))
  try:
    try:
      raise OSError(122, "Disk quota exceeded")
    except OSError as quota:
      raise RuntimeError("save failed") from quota
  except RuntimeError as chained:
    assert is_disk_full(chained)
  assert not is_disk_full(ValueError("RESOURCE_EXHAUSTED: out of memory"))
  assert not is_disk_full(OSError(13, "Permission denied"))
  # The file-size limit (ulimit -f): refused like a full disk, but not said to be one.
  too_large = ValueError('OUT_OF_RANGE: Error writing "opt_state" in OCDBT database: Failed to write 731172 bytes to '
                         "file 8: File too large [os_error_code='27']")
  assert is_file_too_large(too_large) and is_file_too_large(OSError(errno.EFBIG, "File too large"))
  assert is_write_refused(too_large) and not is_disk_full(too_large)
  assert not is_write_refused(OSError(13, "Permission denied"))


def test_a_save_that_cannot_fit_is_refused_before_it_writes(tmp_path, monkeypatch):
  checkpointer = Checkpointer(str(tmp_path), asynchronous=False, repair=True)
  checkpointer.save(1, random_state(), {"step": 1})
  size = allocated(tmp_path / "checkpoints" / "1")
  free = shutil.disk_usage(tmp_path)._replace(free=size // 2)
  monkeypatch.setattr(shutil, "disk_usage", lambda path: free)
  with pytest.raises(WorkdirError) as error:
    checkpointer.save(2, random_state(), {"step": 2})
  message = str(error.value)
  assert "\n" not in message  # launch.py prints it as one line
  assert message.startswith(f"no space left on the disk of {tmp_path} to save checkpoint step 2: it needs about "
                            f"{format_bytes(size)} and {format_bytes(size // 2)} "
                            "are free")
  assert "resume from the latest intact checkpoint, step 1" in message
  assert checkpointer.steps() == [1] and not leftovers(tmp_path)
  checkpointer.close()


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_a_save_that_runs_out_of_space_leaves_only_intact_checkpoints(tmp_path, monkeypatch, capfd, asynchronous):
  # The check before the save passes (another process fills the disk meanwhile): orbax itself runs out.
  monkeypatch.setattr(Checkpointer, "_check_space", lambda self, step: None)
  with tiny_filesystem(tmp_path / "disk", "600k") as disk:
    workdir = os.path.join(disk, "run")
    checkpointer = Checkpointer(workdir, keep=10, asynchronous=asynchronous, repair=True, best_metric="loss")
    state = random_state()  # 128 KiB: the first steps fit, not all nine
    saved = 0
    with pytest.raises(WorkdirError, match=f"no space left on the disk of {workdir} to save checkpoint step"):
      for step in range(1, 10):
        checkpointer.save(step, state, {"step": step}, {"loss": 10.0 - step})
        saved = step
      checkpointer.wait()
    checkpointer.close()
    assert saved >= 1 and not leftovers(workdir)
    output = capfd.readouterr()
    assert "Traceback" not in output.out + output.err, output.err[-3000:]
    # What is left restores and matches its checksums: every kept checkpoint is intact.
    reader = Checkpointer(workdir, asynchronous=False, best_metric="loss")
    kept = reader.steps()
    assert kept, "the first checkpoint fits the disk and must survive"
    for step in kept:
      restored_step, restored, extra = reader.restore(jax.eval_shape(lambda: state), step=step)
      assert restored_step == step and extra == {"step": step}
      np.testing.assert_array_equal(restored["w0"], state["w0"])
    reader.close()


def test_a_full_disk_while_writing_metrics_is_one_error_and_leaves_the_old_file(tmp_path):
  if not os.path.exists("/dev/full"):
    pytest.skip("no /dev/full")
  path = tmp_path / "config.json"
  path.write_text('{"old": 1}')
  os.symlink("/dev/full", str(path) + ".tmp")  # every write to the temporary file fails with ENOSPC
  with pytest.raises(WorkdirError, match=f"no space left on the disk of {tmp_path} to write config.json"):
    write_atomically(str(path), '{"new": 2}')
  assert path.read_text() == '{"old": 1}' and not os.path.lexists(str(path) + ".tmp")

  writer = MetricWriter(str(tmp_path), tensorboard=False)
  os.symlink("/dev/full", tmp_path / "metrics.jsonl")
  with pytest.raises(WorkdirError, match=rf"to write the metrics of step 5 \({tmp_path}/metrics.jsonl"):
    writer.write(5, {"train/loss": 1.0})


LAUNCH_FLAGS = ["--config=experiments/synthetic.py:copy", *TINY_FLAGS, "--config.num_train_steps=40",
                "--config.async_checkpointing=True"]


@pytest.mark.slow
def test_launch_on_a_full_disk_prints_one_line_and_the_rerun_resumes_bit_identically(tmp_path):
  reference = str(tmp_path / "reference")
  process = start_launch(*LAUNCH_FLAGS, f"--workdir={reference}")
  output, = finish(process, timeout=300)
  assert process.returncode == 0, output
  # 1 MiB holds two checkpoints of the tiny model (about 450 KiB each), not the third (step 30).
  with tiny_filesystem(tmp_path / f"disk-{uuid.uuid4().hex[:6]}", "1m") as disk:
    workdir = os.path.join(disk, "run")
    process = start_launch(*LAUNCH_FLAGS, f"--workdir={workdir}")
    output, = finish(process, timeout=300)
    assert process.returncode == 1, output
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(f"error: no space left on the disk of {workdir}"), output
    assert "Traceback" not in output and "Event loop is closed" not in output, output
    assert not leftovers(workdir)
    kept = sorted(int(name) for name in os.listdir(os.path.join(workdir, "checkpoints")) if name.isdigit())
    assert kept and kept[-1] < 40
    assert f"resume from the latest intact checkpoint, step {kept[-1]}" in errors[0]

    subprocess.run(["mount", "-o", "remount,size=16m", disk], check=True)  # the user frees space
    process = start_launch(*LAUNCH_FLAGS, f"--workdir={workdir}")
    output, = finish(process, timeout=300)
    assert process.returncode == 0, output
    assert f"resumed from step {kept[-1]}" in output

    def records(directory):
      return RunDirectory(str(directory)).metrics().without_timing()

    assert records(workdir) == records(reference)
    resumed = ocp.StandardCheckpointer().restore(os.path.join(workdir, "checkpoints", "40", "state"))["params"]
    expected = ocp.StandardCheckpointer().restore(os.path.join(reference, "checkpoints", "40", "state"))["params"]
    for name, value in ocp.tree.to_flat_dict(expected).items():
      np.testing.assert_array_equal(ocp.tree.to_flat_dict(resumed)[name], value)


def test_a_full_disk_at_the_lock_is_one_line_and_leaves_no_lock_file(tmp_path, monkeypatch):
  """(was: a traceback from lock_workdir and a 0-byte train.lock)"""
  from transformer.train import workdir as workdir_module

  def full(*args):
    raise OSError(errno.ENOSPC, "No space left on device")
  monkeypatch.setattr(workdir_module.os, "pwrite", full)
  with pytest.raises(WorkdirError, match=f"no space left on the disk of {tmp_path} to write the training lock"):
    workdir_module.lock_workdir(str(tmp_path))
  assert not (tmp_path / "train.lock").exists()


def _limit_file_size(limit: int):
  """A ``preexec_fn``: files of the child may not grow past ``limit`` bytes (``ulimit -f``). Python ignores
  SIGXFSZ, so a write past it fails with EFBIG instead of killing the process."""
  return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))


def test_a_file_past_the_size_limit_is_one_error_and_keeps_the_old_file(tmp_path):
  path = tmp_path / "predictions.txt"
  path.write_text("old\n")
  code = ("from transformer.data.files import write_atomically\n"
          "from transformer.errors import WorkdirError\n"
          "try:\n"
          f"  write_atomically({str(path)!r}, 'x' * 100_000)\n"
          "except WorkdirError as error:\n"
          "  print(error)\n")
  result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                          preexec_fn=_limit_file_size(16 * 1024))
  assert result.stdout.startswith(f"cannot write predictions.txt ({path}): a file would exceed this process's "
                                  "file-size limit (ulimit -f: 16 KiB)"), result.stdout + result.stderr
  assert path.read_text() == "old\n" and not os.path.exists(f"{path}.tmp")


@pytest.mark.slow
def test_a_file_size_limit_during_a_save_is_one_line_and_the_rerun_resumes(tmp_path):
  """``ulimit -f`` hit by a checkpoint (was: 675 lines with 53 tracebacks and a ``.orbax-checkpoint-tmp`` left)."""
  workdir = str(tmp_path / "run")
  flags = ["--config=experiments/synthetic.py:copy", *TINY_FLAGS, f"--workdir={workdir}"]
  output, = finish(start_launch(*flags), timeout=300)  # checkpoints 10 and 20, under any limit
  assert "done: step 20 of 20" in output, output
  # Every checkpoint has files of 20 KiB and more (the largest about 200 KiB); the record files are a few KiB.
  process = start_launch(*flags, "--config.num_train_steps=40", "--config.async_checkpointing=True",
                         preexec_fn=_limit_file_size(16 * 1024))
  output, = finish(process, timeout=300)
  assert process.returncode == 1, output
  errors = [line for line in output.splitlines() if line.startswith("error:")]
  assert len(errors) == 1 and "file-size limit (ulimit -f: 16 KiB)" in errors[0], output
  assert "resume from the latest intact checkpoint, step 20" in errors[0]
  assert "Traceback" not in output and "Event loop is closed" not in output and len(output.splitlines()) < 40, output
  assert not leftovers(workdir), output
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["10", "20"]

  process = start_launch(*flags, "--config.num_train_steps=40")  # the limit raised: the same command resumes
  output, = finish(process, timeout=300)
  assert process.returncode == 0 and "resumed from step 20" in output and "done: step 40 of 40" in output, output
