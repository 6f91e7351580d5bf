"""Checkpoints: exact resume after SIGKILL, a final save on SIGTERM, fallback from a corrupt checkpoint."""
import asyncio
import gc
import json
import logging
import os
import signal
import sys
import time

import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from tests.train.conftest import TINY_FLAGS, finish, start_launch
from transformer.errors import MissingDataError
from transformer.train import run
from transformer.train.checkpoint import Checkpointer, CheckpointRestoreError
from transformer.train.workdir import RunDirectory

LONG_RUN = TINY_FLAGS + ["--config.num_train_steps=400", "--config.checkpoint_every=50", "--config.log_every=10",
                         "--config.eval_every=200", "--config.async_checkpointing=True"]


def launch(workdir, extra=(), wait=True):
  process = start_launch("--config=experiments/synthetic.py:copy", f"--workdir={workdir}", *LONG_RUN, *extra)
  if wait:
    output, = finish(process, timeout=300)
    assert process.returncode == 0, output
    return output
  return process


def wait_for_checkpoint(workdir, step, process, timeout=120):
  path = os.path.join(workdir, "checkpoints", str(step))
  deadline = time.time() + timeout
  while not os.path.isdir(path):
    assert process.poll() is None, process.stdout.read()
    assert time.time() < deadline, "no checkpoint appeared"
    time.sleep(0.02)


def metrics_without_timing(workdir):
  return RunDirectory(str(workdir)).metrics().without_timing()


def final_params(workdir, step=400):
  restored = ocp.StandardCheckpointer().restore(os.path.join(workdir, "checkpoints", str(step), "state"))
  return restored["params"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("uninterrupted"))
  launch(workdir)
  return workdir


def assert_identical_runs(workdir, reference):
  assert metrics_without_timing(workdir) == metrics_without_timing(reference)  # bitwise: floats compared exactly
  reference_params = final_params(reference)
  for name, value in ocp.tree.to_flat_dict(final_params(workdir)).items():
    np.testing.assert_array_equal(value, ocp.tree.to_flat_dict(reference_params)[name])


@pytest.mark.slow
def test_sigkill_then_rerun_is_bit_identical(tmp_path, uninterrupted):
  workdir = str(tmp_path)
  process = launch(workdir, wait=False)
  wait_for_checkpoint(workdir, 100, process)
  process.send_signal(signal.SIGKILL)
  process.wait()
  killed = time.time()
  steps = sorted(int(s) for s in os.listdir(os.path.join(workdir, "checkpoints")) if s.isdigit())
  assert steps and steps[-1] < 400, "the run was not interrupted mid-training"
  output = launch(workdir)
  assert "resumed from step" in output
  assert_identical_runs(workdir, uninterrupted)
  # The job's goodput counts from the first launch's process start, the gap until the rerun included.
  first, second = RunDirectory(workdir).launches()
  goodput = RunDirectory(workdir).read_json("goodput.json")
  assert goodput["job_started"] == pytest.approx(first["process_started"], abs=0.01)
  assert goodput["seconds"]["launch"] > 0 and goodput["seconds"]["redone"] > 0
  assert goodput["seconds"]["between_launches"] >= second["process_started"] - killed - 0.05
  assert goodput["total_seconds"] <= time.time() - first["process_started"]


@pytest.mark.slow
def test_sigterm_saves_a_checkpoint_then_resumes_identically(tmp_path, uninterrupted):
  workdir = str(tmp_path)
  process = launch(workdir, wait=False)
  wait_for_checkpoint(workdir, 50, process)
  time.sleep(0.3)  # land between checkpoints
  process.send_signal(signal.SIGTERM)
  output, = finish(process, timeout=120)
  assert process.returncode == 0, output
  assert "SIGTERM: saved a checkpoint at step" in output
  saved = int(output.split("SIGTERM: saved a checkpoint at step ")[1].split(";")[0])
  assert os.path.isdir(os.path.join(workdir, "checkpoints", str(saved)))
  launch(workdir)
  assert_identical_runs(workdir, uninterrupted)


@pytest.mark.slow
def test_corrupt_latest_checkpoint_falls_back_with_a_warning(make_config, tmp_path, caplog):
  run(make_config(), str(tmp_path))  # checkpoints at 10 and 20
  state_dir = tmp_path / "checkpoints" / "20" / "state"
  for path in state_dir.rglob("*"):
    if path.is_file():
      path.write_bytes(b"garbage")
  with caplog.at_level(logging.WARNING):
    resumed = run(make_config(num_train_steps=30), str(tmp_path))
  # One line for the damaged step: what failed, where it was moved, what is used instead.
  damaged, = [r.getMessage() for r in caplog.records if r.name == "transformer.train.checkpoint"]
  assert damaged.startswith(f"cannot restore checkpoint step 20 in {tmp_path}/checkpoints (")
  assert "; moved the damaged checkpoint to 20.damaged-" in damaged
  assert damaged.endswith(f"; restored step 10 in {tmp_path}/checkpoints instead")
  assert resumed.step == 30
  with open(tmp_path / "metrics.jsonl") as f:
    steps = [json.loads(line)["step"] for line in f]
  assert steps == sorted(steps) and steps.count(15) == 1  # lines after step 10 were rewritten, not duplicated


@pytest.mark.slow
def test_all_checkpoints_corrupt_refuses_to_start_from_scratch(make_config, tmp_path):
  run(make_config(), str(tmp_path))
  for path in (tmp_path / "checkpoints").rglob("*"):
    if path.is_file() and "state" in str(path):
      path.write_bytes(b"garbage")
  with pytest.raises(CheckpointRestoreError, match="Refusing to start from scratch"):
    run(make_config(num_train_steps=30), str(tmp_path))


@pytest.mark.slow
def test_workdir_of_another_model_is_refused(make_config, tmp_path):
  run(make_config(num_train_steps=10), str(tmp_path))
  with pytest.raises(ValueError, match="different model .*d_model: 32 -> 64"):
    run(make_config(model__d_model=64), str(tmp_path))


@pytest.mark.slow
def test_restore_from_starts_from_another_runs_parameters(make_config, tmp_path):
  pretrained = run(make_config(num_train_steps=10), str(tmp_path / "pretrained"))
  # A different seed: the initialisation must come from the checkpoint, not from the seed.
  finetuned = run(make_config(num_train_steps=1, checkpoint_every=1, eval_every=1, seed=1,
                              restore_from=str(tmp_path / "pretrained")), str(tmp_path / "finetuned"))
  assert finetuned.step == 1
  # One Adam step moves each parameter by at most about the learning rate.
  before = ocp.tree.to_flat_dict(pretrained.state.params)
  after = ocp.tree.to_flat_dict(finetuned.state.params)
  assert max(float(np.max(np.abs(np.asarray(after[k]) - np.asarray(before[k])))) for k in before) < 1e-2
  fresh = run(make_config(num_train_steps=1, checkpoint_every=1, eval_every=1, seed=1), str(tmp_path / "fresh"))
  fresh_params = ocp.tree.to_flat_dict(fresh.state.params)
  assert max(float(np.max(np.abs(np.asarray(fresh_params[k]) - np.asarray(before[k])))) for k in before) > 1e-1


@pytest.mark.slow
def test_keeps_the_last_checkpoints_and_the_best(make_config, tmp_path):
  run(make_config(num_train_steps=20, checkpoint_every=5, eval_every=5, keep_checkpoints=2,
                  best_metric="eval/loss", best_mode="min"), str(tmp_path))
  with open(tmp_path / "metrics.jsonl") as f:
    evals = [json.loads(line) for line in f if "eval/loss" in line]
  best = min(evals, key=lambda r: r["eval/loss"])["step"]
  kept = sorted(int(s) for s in os.listdir(tmp_path / "checkpoints") if s.isdigit())
  assert kept == sorted({best, 15, 20})  # one folder: the latest two and the best, by orbax's policies
  checkpointer = Checkpointer(str(tmp_path), best_metric="eval/loss", best_mode="min")
  assert checkpointer.best_step() == best
  checkpointer.close()


@pytest.mark.slow
def test_eval_with_averaged_checkpoints_uses_the_mean_parameters(make_config, tmp_path):
  run(make_config(num_train_steps=20, checkpoint_every=5, keep_checkpoints=3), str(tmp_path))
  averaged = run(make_config(average_checkpoints=3), str(tmp_path), mode="eval")
  assert averaged.step == 20
  with open(tmp_path / "average_last_3" / "eval_results.json") as f:
    assert json.load(f)["averaged_steps"] == [10, 15, 20]
  # config.json stays the training configuration (reports read it), not the evaluation's.
  assert json.loads((tmp_path / "config.json").read_text())["average_checkpoints"] == 0
  kept = [ocp.tree.to_flat_dict(final_params(str(tmp_path), step)) for step in (10, 15, 20)]
  mean = ocp.tree.to_flat_dict(averaged.state.params)
  for name in mean:
    np.testing.assert_allclose(np.asarray(mean[name]), np.mean([np.asarray(k[name]) for k in kept], axis=0),
                               rtol=1e-5, atol=1e-6)
  with pytest.raises(MissingDataError, match=r"has only 3 checkpoint\(s\) \(steps 10, 15, 20\): give "
                                            r"--config.average_checkpoints=3 or fewer, or train with "
                                            r"config.keep_checkpoints >= 4 \(this run keeps 3\)"):
    run(make_config(average_checkpoints=4), str(tmp_path), mode="eval")
  # A run that already keeps enough: the fix is to train longer, not to raise keep_checkpoints.
  with pytest.raises(MissingDataError, match=r"or train longer, until 4 checkpoints exist"):
    run(make_config(average_checkpoints=4, keep_checkpoints=5), str(tmp_path), mode="eval")


def test_a_non_finite_evaluation_never_becomes_the_best(tmp_path, caplog):
  checkpointer = Checkpointer(str(tmp_path), asynchronous=False, repair=True, best_metric="eval/loss", best_mode="min")
  state = {"w": jnp.ones(4)}
  with caplog.at_level(logging.WARNING):
    checkpointer.save(1, state, {}, {"eval/loss": float("nan")})  # no finite evaluation yet: no best
    assert checkpointer.best_step() is None
    checkpointer.save(2, state, {}, {"eval/loss": 2.0})
    for step, value in ((3, float("nan")), (4, float("-inf")), (5, float("inf"))):  # none replaces step 2
      checkpointer.save(step, state, {}, {"eval/loss": value})
      assert checkpointer.best_step() == 2
  assert "step 4 is not kept as the best checkpoint: its eval/loss is -inf" in caplog.text
  checkpointer.save(6, state, {}, {"eval/loss": 1.0})
  assert checkpointer.best_step() == 6
  assert checkpointer.steps() == [4, 5, 6]  # the latest three, the best among them; step 2 is no longer kept
  checkpointer.close()


def test_reads_finishing_after_orbax_closed_their_event_loop_print_nothing(tmp_path, monkeypatch):
  """A failed restore leaves tensorstore reads running after orbax closed their event loop; each one that
  finishes later calls ``loop.call_soon_threadsafe`` and printed an "Event loop is closed" traceback through
  ``sys.unraisablehook``."""
  import tensorstore as ts
  printed = []
  monkeypatch.setattr(sys, "unraisablehook", lambda unraisable: printed.append(str(unraisable.exc_value)))
  Checkpointer(str(tmp_path))  # installs the filter, as every run does
  promise, future = ts.Promise.new()

  async def read():
    await future

  loop = asyncio.new_event_loop()
  task = loop.create_task(read())
  loop.run_until_complete(asyncio.sleep(0))  # the read is now waiting on the tensorstore future
  loop.close()
  promise.set_result(b"data")  # the read finishes: its callback finds the loop closed
  del task

  class Unrelated:
    def __del__(self):
      raise ValueError("an unrelated error in a finaliser")

  Unrelated()
  gc.collect()
  assert printed == ["an unrelated error in a finaliser"]  # other ignored exceptions are still printed


def truncate_data_files(state_dir):
  """Cut every data file of a checkpoint's state to half its length (a copy interrupted midway)."""
  for root, _, names in os.walk(state_dir):
    if os.path.basename(root) == "d":
      for name in names:
        path = os.path.join(root, name)
        os.truncate(path, os.path.getsize(path) // 2)


@pytest.mark.slow
def test_damaged_checkpoints_print_one_warning_line_each(tmp_path):
  flags = ["--config=experiments/synthetic.py:copy", f"--workdir={tmp_path}", *TINY_FLAGS,
           "--config.best_metric=eval/loss", "--config.best_mode=min"]
  output, = finish(start_launch(*flags), timeout=300)
  truncate_data_files(tmp_path / "checkpoints" / "20" / "state")
  process = start_launch(*flags, "--config.num_train_steps=30")
  output, = finish(process, timeout=300)
  assert process.returncode == 0, output
  assert "Traceback" not in output and "Event loop is closed" not in output, output[-3000:]
  lines = output.replace(str(tmp_path), "WORKDIR").splitlines()  # the test's own name holds "damaged"
  about_step_20 = [line for line in lines if "step 20 in" in line or "damaged" in line]
  assert len(about_step_20) == 1, output
  assert all("cannot restore checkpoint step 20 in" in line for line in about_step_20), about_step_20
  assert "resumed from step 10" in output


def test_prepare_compiles_the_save_path_so_the_first_save_compiles_nothing(tmp_path):
  """A preemption's save must fit the scheduler's grace window: the fingerprint program is compiled at start
  (``Checkpointer.prepare``), not at the first save."""
  from transformer.train import checkpoint
  state = {"w": jnp.ones((3, 5)), "b": jnp.zeros(7, jnp.int32)}  # shapes no other test fingerprints
  checkpointer = Checkpointer(str(tmp_path), asynchronous=False)
  compiled = checkpoint._fingerprint_leaves._cache_size()
  checkpointer.prepare(state)
  assert checkpoint._fingerprint_leaves._cache_size() == compiled + 1
  checkpointer.save(1, state, {}, None)
  assert checkpoint._fingerprint_leaves._cache_size() == compiled + 1
  checkpointer.close()
