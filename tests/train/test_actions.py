"""The loop's periodic actions: their schedules, what they hand each other, the profiler trace, where each
logging window's time went, and evaluators of their own split and period."""
import glob
import os

import jax
import numpy as np
import pytest

from tests.tasks.test_classification import tiny  # noqa: F401  # pylint: disable=unused-import  # a fixture
from tests.train.conftest import load_experiment_config, tiny_config
from transformer.errors import ConfigError
from transformer.train import run
from transformer.train import actions
from transformer.train.actions import PREEMPT, Every, Profile, Tick, due_actions
from transformer.train.loop import LOOP_PHASES
from transformer.train.workdir import RunDirectory


def test_every_is_due_on_its_period_at_the_end_on_stop_and_after_the_actions_it_follows():
  save = Every("checkpoint", 4, lambda tick, outputs: None, on_stop=True, after=("eval",))
  assert [step for step in range(1, 13) if save.due(Tick(step, last=False), {})] == [4, 8, 12]
  assert save.due(Tick(5, last=True), {})
  assert save.due(Tick(5, last=False), {PREEMPT: "SIGTERM"})
  assert save.due(Tick(5, last=False), {"eval": {"eval/loss": 1.0}})
  assert not save.due(Tick(5, last=False), {PREEMPT: None, "eval": None})
  never = Every("stop", 0, lambda tick, outputs: None, at_last=False, on_stop=True)
  assert not any(never.due(Tick(step, last=step == 8), {}) for step in range(1, 9))


def test_a_wall_clock_makes_a_save_due_at_the_first_log_step_past_its_seconds_then_counts_from_that_save(monkeypatch):
  now = [100.0]
  monkeypatch.setattr(actions.time, "monotonic", lambda: now[0])
  save = Every("checkpoint", 1000, lambda tick, outputs: None, clock=actions.WallClock(30, every_steps=5))
  due = []
  for step in range(1, 41):
    now[0] += 4.0  # 4 s a step
    if save.due(Tick(step, last=False), {}):
      due.append(step)
  assert due == [10, 20, 30, 40]  # 30 s pass at step 8; the next log step is 10; then 40 s between log steps 10 and 20
  assert not any(Every("checkpoint", 1000, lambda tick, outputs: None, clock=actions.WallClock(0, 5)).due(
      Tick(step, last=False), {}) for step in range(1, 20))  # 0: off


def test_a_save_for_any_reason_restarts_the_clock(monkeypatch):
  now = [0.0]
  monkeypatch.setattr(actions.time, "monotonic", lambda: now[0])
  save = Every("checkpoint", 10, lambda tick, outputs: None, clock=actions.WallClock(30, every_steps=1))
  due = []
  for step in range(1, 31):
    now[0] += 2.5
    if save.due(Tick(step, last=False), {}):
      due.append(step)
  assert due == [10, 20, 30]  # every periodic save comes before 30 s have passed since the one before


def test_actions_run_in_order_each_reading_what_those_before_it_returned():
  seen = []
  actions = [Every("eval", 2, lambda tick, outputs: {"eval/loss": tick.step}, phase="evaluate"),
             Every("checkpoint", 10, lambda tick, outputs: seen.append(outputs.get("eval")) or "saved",
                   phase="checkpoint", after=("eval",))]
  def run_due(tick):  # as the loop does
    outputs = {}
    for action in due_actions(actions, tick, outputs):
      outputs[action.name] = action.run(tick, outputs)
    return outputs
  assert run_due(Tick(3, last=False)) == {}
  assert run_due(Tick(4, last=False)) == {"eval": {"eval/loss": 4}, "checkpoint": "saved"}
  assert seen == [{"eval/loss": 4}]


def test_the_profile_traces_its_steps_only():
  states, calls = [], []
  profile = Profile("/unused", start=3, steps=2, ready=lambda: states)
  due = [step for step in range(1, 10) if profile.due(Tick(step, last=step == 9), {})
         and (calls.append(step) or True) and not _toggle(profile)]
  assert due == [3, 5]  # starts after step 3, stops after step 5: steps 4 and 5 traced
  assert not Profile("/unused", start=3, steps=0, ready=list).due(Tick(3, last=False), {})


def _toggle(profile):
  """What the profile's call does to its state, without starting jax.profiler."""
  profile.tracing, profile.done = (True, False) if not profile.tracing else (False, True)
  return False


@pytest.mark.slow
def test_a_profiled_run_writes_a_trace_and_trains_as_one_without(tmp_path):
  plain = run(tiny_config(num_train_steps=12, log_every=4, eval_every=12), str(tmp_path / "plain"))
  profiled = run(tiny_config(num_train_steps=12, log_every=4, eval_every=12, profile_start=4, profile_steps=4),
                 str(tmp_path / "profiled"))
  traces = glob.glob(str(tmp_path / "profiled" / "profile" / "plugins" / "profile" / "*" / "*"))
  assert any(path.endswith(".xplane.pb") for path in traces)  # TensorBoard's profile tab
  assert any(path.endswith("perfetto_trace.json.gz") for path in traces)  # ui.perfetto.dev
  assert not os.path.exists(tmp_path / "plain" / "profile")
  assert (RunDirectory(str(tmp_path / "profiled")).metrics().without_timing()
          == RunDirectory(str(tmp_path / "plain")).metrics().without_timing())
  for trained, reference in zip(jax.tree.leaves(profiled.state.params), jax.tree.leaves(plain.state.params)):
    np.testing.assert_array_equal(np.asarray(trained), np.asarray(reference))


def test_each_logging_window_says_where_its_time_went(tmp_path):
  run(tiny_config(num_train_steps=12, log_every=4, eval_every=8, checkpoint_every=4), str(tmp_path))
  logged = [record for record in RunDirectory(str(tmp_path)).metrics().records if "train/loss" in record]
  assert [record["step"] for record in logged] == [4, 8, 12]
  for record in logged:
    assert all(record[f"time/{phase}"] >= 0.0 for phase in LOOP_PHASES)
  assert logged[0]["time/compile"] > 0.0 and logged[1]["time/compile"] == 0.0  # compiled once, in the first
  assert logged[2]["time/evaluate"] > 0.0 and logged[1]["time/checkpoint"] > 0.0
  for previous, record in zip(logged, logged[1:]):  # the phases add up to the window's wall time
    window = record["wall_seconds"] - previous["wall_seconds"]
    assert sum(record[f"time/{phase}"] for phase in LOOP_PHASES) == pytest.approx(window, rel=0.05, abs=0.05)


@pytest.mark.parametrize("evaluators,field", [("test", "evaluators"), ("test:0", "evaluators"),
                                              ("eval:10", "evaluators"), ("a:10;a:20", "evaluators")])
def test_a_badly_written_evaluator_is_one_clear_error(tmp_path, evaluators, field):
  with pytest.raises(ConfigError, match=f"config.{field}"):
    run(tiny_config(evaluators=evaluators), str(tmp_path))


def test_an_evaluator_on_a_task_without_splits_is_one_clear_error(tmp_path):
  with pytest.raises(ConfigError, match="evaluates only its own eval split"):
    run(tiny_config(evaluators="test:10"), str(tmp_path))


@pytest.mark.slow
def test_an_evaluator_scores_its_split_on_its_own_period(tiny, tmp_path):  # noqa: F811
  config, _, _ = tiny
  config = config.copy_and_resolve_references()
  config.update({"evaluators": "test:2", "num_train_steps": 4, "eval_every": 3, "checkpoint_every": 4})
  run(config, str(tmp_path / "run"))
  metrics = RunDirectory(str(tmp_path / "run")).metrics()
  assert [step for step, _ in metrics.values("test/loss")] == [2, 4]
  assert [step for step, _ in metrics.values("eval/loss")] == [3, 4]
  assert [step for step, _ in metrics.values("test/loss/seed_1")] == [2, 4]  # every replica's, as eval's
  # The same training evaluating the test split as its eval split: the same numbers (evaluating trains nothing).
  config.update({"evaluators": "", "eval_every": 2})
  config.task.eval_split = "test"
  run(config, str(tmp_path / "test_as_eval"))
  as_eval = RunDirectory(str(tmp_path / "test_as_eval")).metrics()
  for name in ("loss", "loss/seed_0", "loss/seed_1"):
    assert metrics.values(f"test/{name}") == as_eval.values(f"eval/{name}")


def test_an_evaluator_of_a_split_the_task_lacks_is_one_clear_error(tiny, tmp_path):  # noqa: F811
  config, _, _ = tiny
  config = config.copy_and_resolve_references()
  config.evaluators = "tset:2"
  with pytest.raises(ConfigError, match="has no split 'tset'"):
    run(config, str(tmp_path / "run"))
  assert not (tmp_path / "run").exists()  # refused before its first step: the workdir it created is gone


@pytest.mark.slow
def test_a_forecaster_evaluates_its_test_windows_on_their_own_period(tmp_path):
  config = load_experiment_config("beijing_pm25", "tiny")
  config.update({"num_train_steps": 4, "eval_every": 4, "checkpoint_every": 4, "log_every": 2,
                 "evaluators": "test:2", "quiet": True, "tensorboard": False})
  run(config, str(tmp_path))
  metrics = RunDirectory(str(tmp_path)).metrics()
  assert [step for step, _ in metrics.values("test/loss")] == [2, 4]
  assert [step for step, _ in metrics.values("eval/loss")] == [4]
  assert metrics.values("test/loss")[-1][1] != metrics.values("eval/loss")[-1][1]  # other windows, another loss
