"""Several train steps per compiled call (``config.steps_per_call``): the same results as one step per call,
bit for bit (metrics.jsonl, parameters, checkpoints), also across a resume; bad settings are one clear error."""
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.train.conftest import tiny_config
from transformer.data.prefetch import BatchGroups, stack_batches
from transformer.errors import ConfigError
from transformer.inference import load_params
from transformer.train import run
from transformer.train.loop import call_sizes
from transformer.train.config import OptimizerConfig
from transformer.train.state import make_optimizer
from transformer.train.mesh import make_strategy
from transformer.train.state import TrainState
from transformer.train.step import make_train_step
from transformer.train.workdir import RunDirectory, read_metrics

# 22 steps: five calls of 4, then 2 single steps (22 is no multiple of 4); a log every 8 steps and a
# checkpoint every 4, so that checkpoints at 4 and 12 hold half a logging window.
RUN = dict(num_train_steps=22, log_every=8, eval_every=24, checkpoint_every=4, keep_checkpoints=20)


def _records(workdir):
  """metrics.jsonl without its timings (which differ between any two runs)."""
  return RunDirectory(str(workdir)).metrics().without_timing()


def _assert_trees_equal(actual, desired):
  # zip would stop at the shorter tree: a missing or extra leaf (or one moved) must fail, not be skipped.
  assert jax.tree.structure(actual) == jax.tree.structure(desired), (
      f"tree structures differ:\n{jax.tree.structure(actual)}\n{jax.tree.structure(desired)}")
  for (path, a), d in zip(jax.tree_util.tree_leaves_with_path(actual), jax.tree.leaves(desired)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(d), err_msg=jax.tree_util.keystr(path))


@pytest.fixture(scope="module")
def one_step_per_call(tmp_path_factory):
  """The tiny run with one step per call (a checkpoint every 2 steps, to resume from anywhere)."""
  workdir = tmp_path_factory.mktemp("one_step_per_call")
  return workdir, run(tiny_config(**{**RUN, "checkpoint_every": 2}), str(workdir))


@pytest.fixture(scope="module")
def four_steps_per_call(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("four_steps_per_call")
  return workdir, run(tiny_config(**RUN, steps_per_call=4), str(workdir))


@pytest.mark.slow
def test_four_steps_per_call_log_and_save_what_one_step_per_call_does(one_step_per_call, four_steps_per_call):
  (one_dir, one), (four_dir, four) = one_step_per_call, four_steps_per_call
  assert four.step == 22
  assert four.train_step_compilations == 2  # the 4-step call, and the single step of the last two steps
  assert [r["step"] for r in read_metrics(str(four_dir)) if "train/loss" in r] == [8, 16, 22]
  assert _records(four_dir) == _records(one_dir)  # exactly: train and eval metrics, learning rates
  _assert_trees_equal(four.state, one.state)  # parameters, Adam's moments, step, key
  for step in (12, 22):  # the checkpoints on disk hold the same parameters
    _assert_trees_equal(load_params(str(four_dir), checkpoint=step).params,
                        load_params(str(one_dir), checkpoint=step).params)


@pytest.mark.slow
@pytest.mark.parametrize("saved_by,from_step", [("four", 12), ("one", 10)])
def test_a_run_resumed_with_four_steps_per_call_equals_the_uninterrupted_run(
    one_step_per_call, four_steps_per_call, tmp_path, saved_by, from_step):
  """Resumed from a checkpoint in the middle of a logging window: of a run of 4 steps per call, or of one step
  per call at step 10, no multiple of 4 (single steps up to 12, then calls of 4)."""
  source = {"four": four_steps_per_call, "one": one_step_per_call}[saved_by][0]
  resumed_dir = tmp_path / "resumed"
  shutil.copytree(source, resumed_dir)
  for step in (resumed_dir / "checkpoints").iterdir():
    if step.name.isdigit() and int(step.name) > from_step:
      shutil.rmtree(step)  # as if killed after the save at from_step
  resumed = run(tiny_config(**RUN, steps_per_call=4, accept_changes="steps_per_call"), str(resumed_dir))
  assert resumed.step == 22
  reference_dir, reference = one_step_per_call
  assert _records(resumed_dir) == _records(reference_dir)
  _assert_trees_equal(resumed.state, reference.state)


@pytest.mark.slow
def test_vmapped_seeds_with_four_steps_per_call_equal_one_step_per_call(tmp_path):
  """Replicas (vmap) inside the scan: each seed's logged means and parameters are those of one step per call."""
  settings = dict(num_train_steps=8, log_every=4, eval_every=8, checkpoint_every=8, num_seeds=2)
  one = run(tiny_config(**settings), str(tmp_path / "one"))
  four = run(tiny_config(**settings, steps_per_call=4), str(tmp_path / "four"))
  assert _records(tmp_path / "four") == _records(tmp_path / "one")
  assert "train/loss/seed_1" in _records(tmp_path / "four")[0]
  _assert_trees_equal(four.state.params, one.state.params)


class _DropoutTask:
  """loss = sum((dropout(x) A - y)^2) * scale: the step's key and a swept setting (``scale``) both matter."""

  def loss_and_metrics(self, model, params, batch, rng, scale=1.0):
    keep = jax.random.bernoulli(rng, 0.5, batch["x"].shape)
    loss = jnp.sum((jnp.where(keep, batch["x"], 0.0) @ params["kernel"] - batch["y"]) ** 2) * scale
    weight = jnp.asarray(batch["y"].shape[0], jnp.float32)
    return loss, weight, {"loss": (loss, weight)}


@pytest.mark.slow
@pytest.mark.parametrize("parallelism,num_replicas", [("jit", 1), ("jit", 2), ("mesh", 1)])
def test_a_scanned_call_is_the_same_steps_on_every_strategy_that_scans(parallelism, num_replicas):
  """Strategy level: four calls of the step against one call of four (vmapped replicas with their own swept
  settings; a mesh of 8 devices), with dropout: the keys, parameters and metrics agree exactly."""
  optimizer = make_optimizer(OptimizerConfig(learning_rate=0.1, schedule="constant", warmup_steps=0), 10)
  train_step = make_train_step(_DropoutTask(), None, optimizer)
  settings = {"scale": (1.0, 3.0)} if num_replicas > 1 else None

  def create(key):
    params = {"kernel": jax.random.normal(key, (4, 3))}
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=optimizer.init(params),
                      rng=jax.random.fold_in(key, 1))

  keys = jax.random.split(jax.random.PRNGKey(0), num_replicas) if num_replicas > 1 else jax.random.PRNGKey(0)
  data = np.random.default_rng(0)
  batches = [{"x": data.normal(size=(8, 4)).astype(np.float32), "y": data.normal(size=(8, 3)).astype(np.float32)}
             for _ in range(4)]
  results = []
  for steps_per_call in (1, 4):
    strategy = make_strategy(parallelism, num_replicas, settings=settings)
    state = strategy.create_state(create, keys)
    step = strategy.compile_train_step(train_step, steps_per_call)
    if steps_per_call == 1:
      metrics = []
      for batch in batches:
        state, one = step(state, strategy.put_batch(batch))
        metrics.append(one)
      metrics = jax.tree.map(lambda *steps: np.stack(steps), *metrics)
    else:
      state, metrics = step(state, strategy.put_batches(stack_batches(batches)))
    results.append((strategy.fetch(state), strategy.fetch(metrics)))
  _assert_trees_equal(results[1], results[0])
  assert not np.array_equal(results[0][1]["loss"][0][0], results[0][1]["loss"][0][1])  # the steps differ


def test_calls_end_where_the_actions_are_due_and_groups_follow_them():
  assert list(call_sizes(0, 22, 4)) == [4, 4, 4, 4, 4, 1, 1]
  assert list(call_sizes(10, 22, 4)) == [1, 1, 4, 4, 1, 1]  # resumed at 10: single steps up to 12
  assert list(call_sizes(0, 8, 1)) == [1] * 8

  class Counting:
    def __init__(self):
      self.position = 0

    def __next__(self):
      if self.position == 5:
        raise StopIteration
      self.position += 1
      return {"x": np.full((2, 3), self.position)}

    def get_state(self):
      return self.position

  groups = BatchGroups(Counting(), [2, 2, 2])
  drawn = [([int(batch["x"][0, 0]) for batch in group], groups.get_state()) for group in groups]
  assert drawn == [([1, 2], 2), ([3, 4], 4), ([5], 5)]  # a short group where the data ends
  assert stack_batches([{"x": np.zeros((2, 3))}, {"x": np.ones((2, 3))}])["x"].shape == (2, 2, 3)
  assert stack_batches([{"x": np.zeros((2, 3))}, {"x": np.ones((2, 4))}]) is None  # bucketed: not stacked


@pytest.mark.parametrize("overrides,message", [
    ({"steps_per_call": 0}, r"config\.steps_per_call\b"),
    ({"steps_per_call": -2}, r"config\.steps_per_call\b"),
    ({"steps_per_call": 4, "log_every": 6}, r"config.log_every=6 is not a multiple of config.steps_per_call=4 "
                                             r".*set config.log_every to a multiple of 4, e.g. 8"),
    ({"steps_per_call": 4, "log_every": 4, "eval_every": 10}, r"config.eval_every=10 is not a multiple .*e.g. 12"),
    ({"steps_per_call": 5, "log_every": 5, "eval_every": 10, "checkpoint_every": 12},
     r"config.checkpoint_every=12 is not a multiple of config.steps_per_call=5 .*e.g. 15"),
    ({"steps_per_call": 5, "log_every": 5, "parallelism": "pmap"},
     r"config\.steps_per_call=5\b.*config\.parallelism"),
])
def test_a_bad_steps_per_call_is_one_clear_error(tmp_path, overrides, message):
  with pytest.raises(ConfigError, match=message):
    run(tiny_config(**overrides), str(tmp_path))
  assert not (tmp_path / "config.json").exists()  # refused before anything is written


def _fetch(tree):
  return jax.tree.map(np.asarray, tree)


def test_the_window_folds_stacked_steps_as_if_added_one_by_one_and_names_the_first_nonfinite():
  from transformer.errors import TrainingDiverged
  from transformer.train.loop import MetricsWindow
  losses = np.float32([0.1, 0.2, 0.3, 0.4, 0.7, np.nan, 0.5])
  one_by_one, stacked = MetricsWindow(_fetch), MetricsWindow(_fetch)
  for step, loss in enumerate(losses, start=1):
    one_by_one.add({"loss": (jnp.float32(loss), jnp.float32(1.0))}, step, tokens=3)
  stacked.add({"loss": (jnp.asarray(losses[:4]), jnp.ones(4, jnp.float32))}, 4, tokens=12, stacked=4)
  stacked.add({"loss": (jnp.asarray(losses[4:6]), jnp.ones(2, jnp.float32))}, 6, tokens=6, stacked=2)
  stacked.add({"loss": (jnp.float32(losses[6]), jnp.float32(1.0))}, 7, tokens=3)
  for window in (one_by_one, stacked):
    with pytest.raises(TrainingDiverged, match="training diverged at step 6:"):
      window.check_finite()
  first, second = stacked.read(), one_by_one.read()
  assert first[1:3] == second[1:3] == (7, 21)  # steps and tokens
  _assert_trees_equal(first[0], second[0])
  one_by_one, stacked = MetricsWindow(_fetch), MetricsWindow(_fetch)
  finite = losses[:4]
  for step, loss in enumerate(finite, start=1):
    one_by_one.add({"loss": (jnp.float32(loss), jnp.float32(1.0))}, step, tokens=3)
  stacked.add({"loss": (jnp.asarray(finite), jnp.ones(4, jnp.float32))}, 4, tokens=12, stacked=4)
  _assert_trees_equal(stacked.read()[0], one_by_one.read()[0])  # bit for bit: the same additions
