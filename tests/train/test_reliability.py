"""Faults a careful user meets, each reproduced on the tiny synthetic task: damaged, deleted or altered
checkpoints, two runs on one workdir, divergence, interrupted writes (docs/reliability.md lists them)."""
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest

from tests.train.conftest import REPO, TINY_FLAGS, finish, start_launch, tiny_config
from transformer.errors import CheckpointRestoreError, ConfigError, MissingDataError, TrainingDiverged, UserError, WorkdirError
from transformer.train import run
from transformer.train.checkpoint import Checkpointer
from transformer.train.state import TrainState
from transformer.train.step import make_train_step
from transformer.train.workdir import lock_workdir
from transformer.train.workdir import read_metrics

BEST = {"best_metric": "eval/loss", "best_mode": "min"}


def step_dirs(directory):
  return sorted(int(name) for name in os.listdir(directory) if name.isdigit())


def damage(checkpoint_dir):
  """Overwrite every file of a checkpoint's state, as a truncated or half-copied checkpoint looks."""
  for root, _, files in os.walk(os.path.join(checkpoint_dir, "state")):
    for name in files:
      with open(os.path.join(root, name), "wb") as f:
        f.write(b"garbage")


def leftovers(workdir):
  """Orbax temporary directories anywhere under the workdir (a save that never completed)."""
  return [os.path.join(root, d) for root, dirs, _ in os.walk(workdir) for d in dirs if "orbax-checkpoint-tmp" in d]


@pytest.fixture(scope="module")
def trained_with_best(tmp_path_factory):
  """20 steps with checkpoints at 10 and 20, the best (lowest eval loss) at 20."""
  workdir = str(tmp_path_factory.mktemp("trained"))
  run(tiny_config(**BEST), workdir)
  assert step_dirs(os.path.join(workdir, "checkpoints")) == [10, 20]
  checkpointer = Checkpointer(workdir, best_metric=BEST["best_metric"], best_mode=BEST["best_mode"])
  assert checkpointer.best_step() == 20
  checkpointer.close()
  return workdir


@pytest.fixture
def workdir(trained_with_best, tmp_path):
  """A private copy of ``trained_with_best`` to damage."""
  copy = str(tmp_path / "run")
  shutil.copytree(trained_with_best, copy)
  return copy


# 1. A resume that falls back must be able to finish, also when the lost step is the best.

@pytest.mark.slow
@pytest.mark.parametrize("fault", ["damaged", "deleted"])
def test_the_latest_and_best_checkpoint_lost_resumes_from_the_one_before_and_reruns(workdir, fault, caplog):
  latest = os.path.join(workdir, "checkpoints", "20")
  damage(latest) if fault == "damaged" else shutil.rmtree(latest)
  with caplog.at_level(logging.WARNING):
    assert run(tiny_config(**BEST, num_train_steps=30), workdir).step == 30
    assert run(tiny_config(**BEST, num_train_steps=40), workdir).step == 40  # and every rerun after it
  names = os.listdir(os.path.join(workdir, "checkpoints"))
  if fault == "damaged":  # moved aside with a clear suffix, not deleted, and the move is logged
    assert [n for n in names if n.startswith("20.damaged-")], names
    assert "moved the damaged checkpoint" in caplog.text
  assert not leftovers(workdir)
  steps = [r["step"] for r in read_metrics(workdir)]
  assert steps == sorted(steps) and len(steps) == len(set((r["step"], tuple(r)) for r in read_metrics(workdir)))


def test_saving_a_step_already_kept_replaces_it(tmp_path):
  state = {"w": jnp.arange(4.0)}
  first = Checkpointer(str(tmp_path), asynchronous=False, best_metric="eval/loss", repair=True)
  first.save(10, state, {"note": "first"}, {"eval/loss": 1.0})
  first.close()
  again = Checkpointer(str(tmp_path), asynchronous=False, best_metric="eval/loss", repair=True)
  again.save(10, {"w": jnp.arange(4.0) + 1}, {"note": "again"}, {"eval/loss": 0.5})
  abstract = jax.eval_shape(lambda: state)
  for best in (False, True):
    step, restored, extra = again.restore(abstract, best=best)
    assert step == 10 and extra["note"] == "again"
    np.testing.assert_array_equal(restored["w"], np.arange(4.0) + 1)


# 2. Deleted checkpoints: never truncate metrics a surviving checkpoint covers; never start over silently.

@pytest.mark.slow
def test_checkpoints_of_another_model_are_refused_not_moved_aside(workdir):
  with pytest.raises(ValueError, match="different model .*d_model: 32 -> 64"):
    run(tiny_config(**BEST, model__d_model=64), workdir)
  assert step_dirs(os.path.join(workdir, "checkpoints")) == [10, 20]


@pytest.mark.slow
def test_metrics_without_any_checkpoint_refuse_to_start_over_unless_restart(workdir):
  run(tiny_config(**BEST, num_train_steps=30), workdir)  # past the second checkpoint: one surely committed
  metrics = open(os.path.join(workdir, "metrics.jsonl")).read()
  shutil.rmtree(os.path.join(workdir, "checkpoints"))
  with pytest.raises(WorkdirError, match=r"holds metrics.jsonl of an earlier run \(metrics up to step 30\) but no "
                                         r"checkpoint.*--config.restart=True") as error:
    run(tiny_config(**BEST), workdir)
  assert "\n" not in str(error.value)
  assert open(os.path.join(workdir, "metrics.jsonl")).read() == metrics  # untouched
  assert run(tiny_config(**BEST, restart=True), workdir).step == 20
  assert run(tiny_config(**BEST, restart=True), workdir).step == 20  # restart=True again: resumes, moves nothing
  previous, = [name for name in os.listdir(workdir) if name.startswith("previous-")]
  assert open(os.path.join(workdir, previous, "metrics.jsonl")).read() == metrics
  assert read_metrics(workdir)[0]["step"] == 5  # the new run's own lines


@pytest.mark.slow
def test_a_raised_checkpoint_every_does_not_hide_the_checkpoints_an_earlier_run_committed(workdir):
  """The earlier run's own checkpoint_every decides whether its metrics prove a committed checkpoint (was: a
  command with --config.checkpoint_every=50 started over, rewriting metrics.jsonl and config.json)."""
  run(tiny_config(**BEST, num_train_steps=30), workdir)
  record = {name: open(os.path.join(workdir, name)).read() for name in ("metrics.jsonl", "config.json")}
  shutil.rmtree(os.path.join(workdir, "checkpoints"))
  with pytest.raises(WorkdirError, match="no checkpoint to resume from"):
    run(tiny_config(**BEST, num_train_steps=30, checkpoint_every=50, optimizer__learning_rate=0.05), workdir)
  assert {name: open(os.path.join(workdir, name)).read() for name in record} == record


@pytest.mark.slow
def test_starting_over_an_earlier_record_takes_its_settings(workdir):
  """Checkpoints deleted where the metrics end at exactly twice checkpoint_every (no proof that one was
  committed: starting over loses nothing), and another learning rate (was: trained from step 0 and rewrote
  metrics.jsonl and config.json with the new value)."""
  record = {name: open(os.path.join(workdir, name)).read() for name in ("metrics.jsonl", "config.json")}
  shutil.rmtree(os.path.join(workdir, "checkpoints"))
  with pytest.raises(ConfigError, match=r"was trained with other settings: optimizer.learning_rate"):
    run(tiny_config(**BEST, checkpoint_every=50, optimizer__learning_rate=0.05), workdir)
  assert {name: open(os.path.join(workdir, name)).read() for name in record} == record
  assert run(tiny_config(**BEST), workdir).step == 20  # the run's own settings start it over


@pytest.mark.slow
def test_a_checkpoint_copied_from_another_run_is_refused_in_every_mode(workdir, tmp_path):
  """Another run of the same architecture (another seed) copied into the workdir: resuming, evaluating and
  loading refuse it in one line (was: "resumed from step 20" on the other run's trajectory, and its numbers
  reported as this run's); with config.restart it is moved aside like a damaged one."""
  from transformer.inference import load
  other = str(tmp_path / "other")
  run(tiny_config(**BEST, seed=7, num_train_steps=10), other)
  shutil.rmtree(os.path.join(workdir, "checkpoints"))
  shutil.copytree(os.path.join(other, "checkpoints", "10"), os.path.join(workdir, "checkpoints", "20"))
  eval_results = os.path.join(workdir, "eval_results.json")
  for mode in ("train", "eval"):
    with pytest.raises(WorkdirError, match=r"checkpoint step 20 in .* belongs to another run .*copied from another "
                                           r"workdir") as error:
      run(tiny_config(**BEST, num_train_steps=40), workdir, mode)
    assert "\n" not in str(error.value)
  assert not os.path.exists(eval_results)
  with pytest.raises(WorkdirError, match="belongs to another run"):
    load(workdir)
  assert step_dirs(os.path.join(workdir, "checkpoints")) == [20]  # refused, not moved
  assert run(tiny_config(**BEST, restart=True), workdir).step == 20  # config.restart: moved aside, trained anew
  previous, = [name for name in os.listdir(workdir) if name.startswith("previous-")]
  assert [name for name in os.listdir(os.path.join(workdir, previous, "checkpoints")) if ".damaged-" in name]


@pytest.mark.slow
def test_a_resume_that_fails_to_start_records_no_change(workdir):
  """A resume with a raised num_train_steps that fails before training (a metrics line without a step) wrote
  the change to the history, so the original command was refused afterwards; now the history is written once the
  run goes on."""
  path = os.path.join(workdir, "metrics.jsonl")
  metrics = open(path).read()
  with open(path, "w") as f:
    f.write('{"train/loss": 1.0}\n' + metrics)
  with pytest.raises(WorkdirError, match="metrics.jsonl"):
    run(tiny_config(**BEST, num_train_steps=30), workdir)
  assert not os.path.exists(os.path.join(workdir, "config_history.jsonl"))
  with open(path, "w") as f:
    f.write(metrics)
  assert run(tiny_config(**BEST), workdir).step == 20  # the original command: not refused


@pytest.mark.slow
def test_checkpoints_without_their_record_are_not_resumed(workdir):
  """config.json deleted, then a command with another learning rate (was: resumed, a new config.json written
  with the new value and no history line)."""
  os.remove(os.path.join(workdir, "config.json"))
  with pytest.raises(WorkdirError, match="holds checkpoints but not config.json"):
    run(tiny_config(**BEST, num_train_steps=30, optimizer__learning_rate=0.05), workdir)
  assert not os.path.exists(os.path.join(workdir, "config.json"))


def test_a_run_killed_before_its_first_checkpoint_committed_starts_over_without_asking(tmp_path):
  with open(tmp_path / "metrics.jsonl", "w") as f:  # a run killed at step 17 while saving step 10 leaves this
    f.writelines(json.dumps({"step": step, "train/loss": 9.0}) + "\n" for step in (5, 10, 15))
  os.makedirs(tmp_path / "checkpoints" / "10.orbax-checkpoint-tmp-1234")
  assert run(tiny_config(num_train_steps=10), str(tmp_path)).step == 10
  assert [r["step"] for r in read_metrics(str(tmp_path))] == [5, 10, 10]  # its own lines: train, eval
  assert os.listdir(tmp_path / "checkpoints") == ["10"]  # the leftover was cleaned up


# 3. One training run per workdir.

HOLD_LOCK = ("import sys, time; from transformer.train.workdir import lock_workdir; "
             "lock_workdir(sys.argv[1]); print('locked', flush=True); time.sleep(600)")


def test_a_second_run_is_refused_and_a_killed_holder_does_not_block(tmp_path):
  holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(tmp_path)], cwd=REPO, stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "JAX_PLATFORMS": "cpu"})
  try:
    assert holder.stdout.readline().strip() == "locked"
    with pytest.raises(WorkdirError, match=f"in use by another training run \\(pid {holder.pid} on host "):
      lock_workdir(str(tmp_path))
  finally:
    holder.kill()  # SIGKILL: no chance to clean up
    holder.wait()
  lock = lock_workdir(str(tmp_path))  # the OS released the dead process's lock
  assert json.loads((tmp_path / "train.lock").read_text())["pid"] == os.getpid()
  lock.release()
  assert not (tmp_path / "train.lock").exists()  # a run that ends leaves no lock file behind
  assert lock_workdir(str(tmp_path), mode="eval") is None  # readers take no lock


def test_a_folder_holding_no_run_is_refused_and_a_failed_start_leaves_nothing(tmp_path, monkeypatch):
  """A non-empty folder that is no run's workdir is refused unless config.restart asks (was: config.json,
  best/, checkpoints/ and tensorboard/ written among its files); a start that fails before training leaves no
  workdir and no lock behind."""
  (tmp_path / "README.md").write_text("a project's file")
  with pytest.raises(WorkdirError, match=r"holds files that are no run's \(README.md\)"):
    run(tiny_config(), str(tmp_path))
  assert os.listdir(tmp_path) == ["README.md"]
  from transformer.tasks.synthetic import SyntheticTask

  def no_data(self):
    raise MissingDataError("no data here")
  monkeypatch.setattr(SyntheticTask, "model_config", no_data)
  with pytest.raises(MissingDataError):
    run(tiny_config(), str(tmp_path / "new"))
  assert not (tmp_path / "new").exists()


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["eval", "predict"])
def test_a_read_only_workdir_is_refused_before_any_work(trained_with_best, monkeypatch, mode):
  """Eval and predict write their results into the workdir: a read-only one is named at once (was: OSError
  [Errno 30] after all the decoding). Root writes anywhere here, so the read-only file system is simulated."""
  import errno
  import tempfile
  from transformer.train import workdir as workdir_module

  def read_only(*args, **kwargs):
    raise OSError(errno.EROFS, "Read-only file system")
  monkeypatch.setattr(workdir_module.tempfile, "TemporaryFile", read_only)
  monkeypatch.setattr("transformer.train.modes.build_task", lambda run: pytest.fail("work began"))
  with pytest.raises(WorkdirError, match="is not writable \\(Read-only file system\\)"):
    run(tiny_config(**BEST), trained_with_best, mode)
  assert tempfile.TemporaryFile is read_only  # the module's own tempfile is the one patched


# 4. Altered checkpoint data is detected by its checksum, not restored silently.

def test_altered_checkpoint_data_fails_its_checksum_and_falls_back(tmp_path, caplog):
  checkpointer = Checkpointer(str(tmp_path), asynchronous=False, repair=True)
  for step in (1, 2):
    checkpointer.save(step, {"w": jnp.full((8,), float(step))}, {"step": step})
  # Rewrite step 2's arrays with other values: every file reads back fine, only the data differs.
  writer = ocp.StandardCheckpointer()
  writer.save(str(tmp_path / "altered"), {"w": jnp.full((8,), 7.0)})
  writer.wait_until_finished()
  shutil.rmtree(tmp_path / "checkpoints" / "2" / "state")
  os.rename(tmp_path / "altered", tmp_path / "checkpoints" / "2" / "state")
  with caplog.at_level(logging.WARNING):
    step, state, extra = checkpointer.restore(jax.eval_shape(lambda: {"w": jnp.zeros(8)}))
  assert step == 1 and extra == {"step": 1}
  np.testing.assert_array_equal(state["w"], np.ones(8))
  assert "checksum mismatch" in caplog.text
  assert [n for n in os.listdir(tmp_path / "checkpoints") if n.startswith("2.damaged-")]


def flip_bits(state_dir, count=16, seed=0):
  """Flip ``count`` random bits of the largest data file of a checkpoint's state (a bad disk or copy)."""
  files = [os.path.join(root, name) for root, _, names in os.walk(state_dir) for name in names
           if os.sep + "d" + os.sep in os.path.join(root, name)]
  path = max(files, key=os.path.getsize)
  raw = bytearray(open(path, "rb").read())
  rng = np.random.default_rng(seed)
  for position in rng.integers(0, len(raw), count):
    raw[position] ^= 1 << int(rng.integers(0, 8))
  open(path, "wb").write(bytes(raw))


def flip_bits_that_orbax_restores(state_dir, scratch):
  """Flip 16 bits of ``state_dir`` with the first seed whose flips orbax restores without an error, as
  different values (most seeds; the others hit compressed-frame headers, which orbax reports)."""
  original = ocp.StandardCheckpointer().restore(state_dir)
  for seed in range(20):
    trial = os.path.join(scratch, f"seed{seed}")
    shutil.copytree(state_dir, trial)
    flip_bits(trial, seed=seed)
    try:
      altered = ocp.StandardCheckpointer().restore(trial)
    except Exception:  # noqa: BLE001 (a flip orbax notices itself)
      continue
    if not all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(altered), jax.tree.leaves(original))):
      flip_bits(state_dir, seed=seed)
      return
  pytest.fail("no seed gave flips that orbax restores silently")


@pytest.mark.slow
def test_flipped_bits_in_a_checkpoint_are_caught_by_its_checksum(workdir, trained_with_best, tmp_path, caplog):
  """16 flipped bits in the latest checkpoint's data, which orbax alone restores without a word: the resumed
  run falls back to step 10 and ends exactly as the uninterrupted run (it replays the same steps)."""
  flip_bits_that_orbax_restores(os.path.join(workdir, "checkpoints", "20", "state"), str(tmp_path / "checkpoints"))
  with caplog.at_level(logging.WARNING):
    resumed = run(tiny_config(**BEST, num_train_steps=20), workdir)
  assert caplog.text.count("checksum mismatch") == 1
  assert "restored step 10" in caplog.text and resumed.step == 20
  untouched = Checkpointer(trained_with_best)
  reference = untouched.restore(jax.eval_shape(lambda: resumed.state))
  untouched.close()
  for got, want in zip(jax.tree.leaves(resumed.state.params), jax.tree.leaves(reference[1].params)):
    np.testing.assert_array_equal(got, want)


@pytest.mark.slow
def test_an_edited_data_position_is_caught_by_its_checksum(workdir, trained_with_best, caplog):
  """The ``extra`` item (data position, metrics window) has its own checksum: a position edited by hand in both
  step 20 falls back to step 10, and the run ends as the uninterrupted one (was: resumed the edited position
  without a word, and diverged from it)."""
  path = os.path.join(workdir, "checkpoints", "20", "extra", "metadata")
  with open(path) as f:
    extra = json.load(f)
  extra["iterator"] = {**extra["iterator"], "index": extra["iterator"]["index"] + 3}
  with open(path, "w") as f:
    json.dump(extra, f)
  with caplog.at_level(logging.WARNING):
    resumed = run(tiny_config(**BEST, num_train_steps=20), workdir)
  assert caplog.text.count("data position or metrics window") == 1 and "restored step 10" in caplog.text
  untouched = Checkpointer(trained_with_best)
  reference = untouched.restore(jax.eval_shape(lambda: resumed.state))
  untouched.close()
  for got, want in zip(jax.tree.leaves(resumed.state.params), jax.tree.leaves(reference[1].params)):
    np.testing.assert_array_equal(got, want)


RECORD_DAMAGE = {  # file -> what is written there, and the mode that meets it
    "run_format.json": ('{"format_version": "2"}', "train"),
    "config_history.jsonl": ('garbage\n{"step": 10, "field": "num_train_steps", "old": 20, "new": 20}\n', "train"),
    "model_config.json": ("[]", "train"),
    "data_fingerprint.json": ("{not json", "train"),
    "config.json": ("null", "eval"),
    "metrics.jsonl": ('{"train/loss": 1.0}\n{"step": 20, "train/loss": 1.0}\n', "train"),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(RECORD_DAMAGE))
def test_a_damaged_record_file_is_one_line_naming_it(workdir, name):
  text, mode = RECORD_DAMAGE[name]
  with open(os.path.join(workdir, name), "w") as f:
    f.write(text)
  with pytest.raises(UserError, match=re.escape(name)) as error:
    run(tiny_config(**BEST, num_train_steps=30), workdir, mode)
  assert "\n" not in str(error.value)


@pytest.mark.parametrize("name", ["checkpoints", "train.lock"])
def test_a_run_file_of_the_wrong_kind_is_one_line_naming_it(tmp_path, name):
  """``checkpoints`` a file (was: a traceback, then training to the first save) or ``train.lock`` a folder."""
  if name == "checkpoints":
    (tmp_path / name).write_text("")
  else:
    (tmp_path / name).mkdir()
  with pytest.raises(WorkdirError, match=re.escape(name)):
    run(tiny_config(), str(tmp_path))


# 5. Divergence stops the run (or, when asked, its steps are skipped); a non-finite state is never saved.

@pytest.mark.slow
def test_divergence_stops_with_the_step_and_keeps_the_last_finite_checkpoint(tmp_path):
  config = tiny_config(optimizer__learning_rate=1e30, optimizer__warmup_steps=0, checkpoint_every=1,
                       log_every=1, **BEST)
  with pytest.raises(TrainingDiverged, match=r"training diverged at step (\d+): the loss or gradient norm is "
                                             r"not finite") as error:
    run(config, str(tmp_path))
  diverged = int(str(error.value).split("step ")[1].split(":")[0])
  kept = step_dirs(tmp_path / "checkpoints")
  assert kept and kept[-1] == diverged - 1
  for step in kept:
    params = ocp.StandardCheckpointer().restore(str(tmp_path / "checkpoints" / str(step) / "state"))["params"]
    assert all(np.all(np.isfinite(leaf)) for leaf in jax.tree.leaves(params)), step


class _SquareTask:
  """loss = sum((w * x)^2): an input holding infinity gives a non-finite loss and gradient."""

  def loss_and_metrics(self, model, params, batch, rng):
    loss = jnp.sum((params["w"] * batch["x"]) ** 2)
    weight = jnp.asarray(batch["x"].size, jnp.float32)
    return loss, weight, {"loss": (loss, weight)}


@pytest.mark.parametrize("skip", [False, True])
def test_a_nonfinite_step_is_skipped_only_when_asked(skip):
  optimizer = optax.adam(0.1)
  params = {"w": jnp.ones(3)}
  state = TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=optimizer.init(params),
                     rng=jax.random.PRNGKey(0))
  step = jax.jit(make_train_step(_SquareTask(), None, optimizer, skip_nonfinite_steps=skip))
  state, _ = step(state, {"x": jnp.ones(3)}, jax.random.PRNGKey(1))
  after_good = state
  state, metrics = step(state, {"x": jnp.array([1.0, np.inf, 1.0])}, jax.random.PRNGKey(2))
  assert int(state.step) == 2  # the step is consumed either way
  if skip:  # nothing applied: parameters and optimizer state as after the good step, metrics zeroed
    for got, want in zip(jax.tree.leaves((state.params, state.opt_state)),
                         jax.tree.leaves((after_good.params, after_good.opt_state))):
      np.testing.assert_array_equal(got, want)
    assert [float(v) for v in metrics["skipped_steps"]] == [1.0, 0.0]
    assert [float(v) for v in metrics["loss"]] == [0.0, 0.0]
  else:
    assert not np.all(np.isfinite(state.params["w"])) and "skipped_steps" not in metrics


@pytest.mark.slow
def test_skipping_nonfinite_steps_trains_on_and_counts_them(tmp_path):
  output = run(tiny_config(optimizer__learning_rate=1e30, optimizer__warmup_steps=0, skip_nonfinite_steps=True,
                          max_skipped_share=1.0), str(tmp_path))
  assert output.step == 20
  assert all(np.all(np.isfinite(leaf)) for leaf in jax.tree.leaves(output.state.params))
  counts = [r["train/skipped_steps"] for r in read_metrics(str(tmp_path)) if "train/skipped_steps" in r]
  assert len(counts) == 4 and all(c == int(c) and 0 <= c <= 5 for c in counts) and sum(counts) > 0


# 9. Interrupted writes, a file as workdir, damaged best checkpoint at evaluation.

@pytest.mark.slow
def test_a_half_written_last_metrics_line_is_skipped_with_a_warning(workdir, caplog):
  path = os.path.join(workdir, "metrics.jsonl")
  complete = len(open(path).read().splitlines())
  with open(path, "a") as f:
    f.write('{"step": 25, "train/lo')  # a crash in the middle of writing a line
  with caplog.at_level(logging.WARNING):
    assert run(tiny_config(**BEST, num_train_steps=30), workdir).step == 30
  assert f"half-written last line {complete + 1} of {path}" in caplog.text
  steps = [r["step"] for r in read_metrics(workdir)]
  assert steps == sorted(steps) and steps.count(25) == 1


@pytest.mark.slow
def test_a_damaged_metrics_line_before_the_last_is_an_error(workdir):
  path = os.path.join(workdir, "metrics.jsonl")
  lines = open(path).read().splitlines()
  lines[2] = lines[2][:10]
  open(path, "w").write("\n".join(lines) + "\n")
  with pytest.raises(WorkdirError, match=f"{path} line 3 is not a JSON record"):
    read_metrics(workdir)


def test_a_workdir_that_is_a_file_is_refused_in_one_line(tmp_path):
  (tmp_path / "file").write_text("")
  with pytest.raises(ValueError, match="is a file, not a directory"):
    run(tiny_config(), str(tmp_path / "file"))


@pytest.mark.slow
def test_eval_with_a_damaged_best_checkpoint_uses_the_latest_good_one(workdir, caplog):
  damage(os.path.join(workdir, "checkpoints", "20"))
  with caplog.at_level(logging.WARNING):
    output = run(tiny_config(**BEST), workdir, mode="eval")
  assert output.step == 10
  assert "the best checkpoint is damaged; using the latest good checkpoint, step 10" in caplog.text
  assert step_dirs(os.path.join(workdir, "checkpoints")) == [10, 20]  # evaluation never moves a checkpoint


@pytest.mark.slow
def test_all_checkpoints_damaged_is_a_project_error_in_one_line(workdir):
  for step in step_dirs(os.path.join(workdir, "checkpoints")):
    damage(os.path.join(workdir, "checkpoints", str(step)))
  with pytest.raises(CheckpointRestoreError, match="none could be restored") as error:
    run(tiny_config(**BEST, num_train_steps=30), workdir)
  assert isinstance(error.value, ValueError) and "\n" not in str(error.value)  # launch.py prints it as one line
  assert "--config.restart=True" in str(error.value)
  with pytest.raises(CheckpointRestoreError, match="no model of this run can be read: train it again"):
    run(tiny_config(**BEST), workdir, mode="eval")  # evaluation cannot restart a run: it says what can
  # Nothing is moved while none restores (a changed config fails them all alike); restart=True moves them.
  assert step_dirs(os.path.join(workdir, "checkpoints")) == [10, 20]
  assert run(tiny_config(**BEST, restart=True), workdir).step == 20
  previous, = [name for name in os.listdir(workdir) if name.startswith("previous-")]
  assert sorted(os.listdir(os.path.join(workdir, previous, "checkpoints")))[0].startswith("10.damaged-")


# Through launch.py: signals, two processes, exit codes.

LAUNCH = ["--config=experiments/synthetic.py:copy", *TINY_FLAGS, "--config.num_train_steps=200",
          "--config.checkpoint_every=50", "--config.log_every=10", "--config.eval_every=100"]


def wait_for(path, process, timeout=120):
  deadline = time.time() + timeout
  while not os.path.exists(path):
    assert process.poll() is None, process.stdout.read()
    assert time.time() < deadline, f"{path} did not appear"
    time.sleep(0.02)


@pytest.mark.slow
def test_sigint_saves_a_checkpoint_and_the_rerun_finishes(tmp_path):
  process = start_launch(*LAUNCH, f"--workdir={tmp_path}")
  wait_for(tmp_path / "checkpoints" / "50", process)
  process.send_signal(signal.SIGINT)
  output, = finish(process, timeout=120)
  assert process.returncode == 130, output  # saved but not finished: `launch.py ... && next` must not go on
  saved = int(output.split("SIGINT: saved a checkpoint at step ")[1].split(";")[0])
  assert saved in step_dirs(tmp_path / "checkpoints")
  rerun = start_launch(*LAUNCH, f"--workdir={tmp_path}")
  output, = finish(rerun, timeout=300)
  assert rerun.returncode == 0 and f"resumed from step {saved}" in output, output


@pytest.mark.slow
def test_sigint_through_a_closed_pipe_still_saves_and_exits_130(tmp_path):
  """``launch.py ... 2>&1 | tee log`` and Ctrl-C: tee stops too, so every later write finds the pipe closed (was:
  BrokenPipeError inside the signal handler, no checkpoint)."""
  process = start_launch(*LAUNCH, f"--workdir={tmp_path}")
  wait_for(tmp_path / "checkpoints" / "50", process)
  process.stdout.close()  # the reader goes away before the signal, as tee does
  process.send_signal(signal.SIGINT)
  assert process.wait(timeout=120) == 130
  saved = max(step_dirs(tmp_path / "checkpoints"))
  assert 50 < saved < 200, saved  # the step it stopped at was saved, before the run's end
  rerun = start_launch(*LAUNCH, f"--workdir={tmp_path}")
  output, = finish(rerun, timeout=300)
  assert rerun.returncode == 0 and f"resumed from step {saved}" in output, output


@pytest.mark.slow
def test_two_runs_on_one_workdir_the_second_refuses_then_a_rerun_after_kill_works(tmp_path):
  # The first run is far too long to finish while the second starts (a finished run would only be reported);
  # the rerun after the kill trains 50 steps past the last checkpoint.
  long_run = [flag for flag in LAUNCH if not flag.startswith("--config.num_train_steps=")]
  first = start_launch(*long_run, "--config.num_train_steps=1000000", f"--workdir={tmp_path}")
  wait_for(tmp_path / "checkpoints" / "50", first)
  second = start_launch(*long_run, "--config.num_train_steps=1000000", f"--workdir={tmp_path}")
  output, = finish(second, timeout=120)
  assert second.returncode != 0 and "Traceback" not in output
  assert f"error: --workdir={os.path.realpath(tmp_path)} is in use by another training run (pid {first.pid} on host" \
      in output, output
  first.send_signal(signal.SIGKILL)
  first.wait()
  last = max(step_dirs(tmp_path / "checkpoints"))
  rerun = start_launch(*long_run, f"--config.num_train_steps={last + 50}", "--config.accept_changes=num_train_steps",
                       f"--workdir={tmp_path}")
  output, = finish(rerun, timeout=300)
  assert rerun.returncode == 0 and f"resumed from step {last}" in output, output


@pytest.mark.slow
def test_divergence_and_unrestorable_checkpoints_exit_non_zero_in_one_line(tmp_path):
  diverging = start_launch(*LAUNCH, f"--workdir={tmp_path}", "--config.optimizer.learning_rate=1e30",
                           "--config.optimizer.warmup_steps=0", "--config.checkpoint_every=1")
  output, = finish(diverging, timeout=300)
  assert diverging.returncode != 0 and "Traceback" not in output
  assert "error: training diverged at step " in output, output
  for step in step_dirs(tmp_path / "checkpoints"):
    damage(tmp_path / "checkpoints" / str(step))
  resumed = start_launch(*LAUNCH, f"--workdir={tmp_path}", "--config.optimizer.learning_rate=1e30",
                         "--config.optimizer.warmup_steps=0")  # the run's own settings: others are refused
  output, = finish(resumed, timeout=300)
  assert resumed.returncode != 0 and "Traceback" not in output
  assert "error: checkpoints exist but none could be restored" in output, output


def test_tokenizers_are_recorded_on_a_fresh_workdir_and_checked_once_it_holds_checkpoints(tmp_path):
  """``check_tokenizers`` on its own: a training run without checkpoints (re)records every tokenizer, replacing
  a stale model of the same name; with checkpoints a differing fingerprint is refused and nothing is written;
  a tokenizer the run did not record (a run from before they were kept) is not refused."""
  import dataclasses as dc

  from transformer.train.workdir import check_tokenizers, recorded_tokenizers

  @dc.dataclass
  class Tokenizer:
    fingerprint: str
    model_proto: bytes
    path: str = "/data/sentencepiece/en-de.model"

  workdir = str(tmp_path)
  check_tokenizers(workdir, {"source": Tokenizer("aaa", b"a"), "target": Tokenizer("bbb", b"b")},
                   has_checkpoints=False, write=True)
  assert recorded_tokenizers(workdir) == {"source": "aaa", "target": "bbb"}
  check_tokenizers(workdir, {"source": Tokenizer("ccc", b"c")}, has_checkpoints=False, write=True)
  assert recorded_tokenizers(workdir) == {"source": "ccc", "target": "bbb"}  # aaa replaced, not kept beside
  assert (tmp_path / "tokenizers" / "source.ccc.model").read_bytes() == b"c"

  with pytest.raises(WorkdirError, match=r"another target tokenizer \(fingerprint bbb\).*\(ddd\).*"
                                         r"cp \S+/tokenizers/target\.bbb\.model /data/sentencepiece/en-de\.model"):
    check_tokenizers(workdir, {"source": Tokenizer("ccc", b"c"), "target": Tokenizer("ddd", b"d")},
                     has_checkpoints=True, write=True)
  assert recorded_tokenizers(workdir) == {"source": "ccc", "target": "bbb"}
  check_tokenizers(workdir, {"source": Tokenizer("ccc", b"c"), "text": Tokenizer("eee", b"e")},
                   has_checkpoints=True, write=False)
  assert recorded_tokenizers(workdir) == {"source": "ccc", "target": "bbb"}  # read-only modes write nothing


@pytest.mark.slow
def test_a_second_sigint_stops_at_once_in_one_line_with_status_130(tmp_path):
  long_run = [flag for flag in LAUNCH if not flag.startswith("--config.num_train_steps=")]
  for attempt in range(3):  # a loaded host can let the first stop finish before the second signal is sent
    workdir = tmp_path / f"attempt{attempt}"
    process = start_launch(*long_run, "--config.num_train_steps=1000000", f"--workdir={workdir}")
    wait_for(workdir / "checkpoints" / "50", process)
    process.send_signal(signal.SIGINT)
    # The second signal only after the first was handled: two arriving before Python runs a handler are one.
    seen = ""
    for line in iter(process.stdout.readline, ""):
      seen += line
      if "SIGINT received: stopping after this step" in line:
        break
    if process.poll() is None:
      break
    finish(process, timeout=120)
  process.send_signal(signal.SIGINT)
  output, = finish(process, timeout=120)
  output = seen + output
  assert "(Ctrl-C again stops at once)" in seen, output
  assert process.returncode == 130, output
  assert "Traceback" not in output and "KeyboardInterrupt" not in output, output
  assert output.count("SIGINT again: stopped at once") == 1, output
  rerun = start_launch(*long_run, "--config.num_train_steps=60", "--config.accept_changes=num_train_steps",
                       f"--workdir={workdir}")
  output, = finish(rerun, timeout=300)
  assert rerun.returncode == 0 and "resumed from step" in output, output
  assert not [name for name in os.listdir(workdir / "checkpoints") if "tmp" in name]


@pytest.mark.slow
@pytest.mark.parametrize("flag,message", [
    ("--config.translate_input=/nonexistent/in.txt", "error: config.translate_input='/nonexistent/in.txt' does not "
                                                     "exist"),
    ("--config.translate_output=/nonexistent/out.txt", "error: config.translate_output='/nonexistent/out.txt': its "
                                                       "folder /nonexistent does not exist"),
])
def test_translate_files_are_checked_before_anything_is_decoded(tmp_path, flag, message):
  source = tmp_path / "in.txt"
  source.write_text("1 2 3\n")
  process = start_launch(*LAUNCH, f"--workdir={tmp_path / 'run'}", "--mode=translate",
                         f"--config.translate_input={source}", flag)
  output, = finish(process, timeout=120)
  assert process.returncode == 1 and "Traceback" not in output, output
  assert message in output and not (tmp_path / "run").exists(), output


def test_a_restore_error_is_named_in_one_line_without_tensorstores_pointer_to_its_details():
  from transformer.train.checkpoint import _one_line
  error = Exception("Encountered error while reading array index: (slice(0, 64, 1),). See full TensorStore details: "
                    "<bound method pybind11_detail_function_record_v1_system_libstdcpp_gxx_abi_1xxx_use_cxx11_>\nmore")
  assert _one_line(error) == "Exception: Encountered error while reading array index: (slice(0, 64, 1),)."
