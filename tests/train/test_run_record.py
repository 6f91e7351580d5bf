"""A run's record is never rewritten: changed settings are refused or recorded, read-only modes write nothing,
and the loop waits for the device only in its actions."""
import json
import os

import jax
import numpy as np
import pytest

from tests.train.conftest import tiny_config
from transformer.data.batching import TokenBatcher
from transformer.data.prefetch import prefetch_to_device
from transformer.errors import ConfigError, TrainingDiverged, WorkdirError
from transformer.train import read_run_config, run
from transformer.train.workdir import RunDirectory, read_metrics


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """A finished tiny run (20 steps) and the bytes of its config.json."""
  workdir = str(tmp_path_factory.mktemp("trained"))
  run(tiny_config(), workdir)
  with open(os.path.join(workdir, "config.json"), "rb") as f:
    return workdir, f.read()


def _config_bytes(workdir):
  with open(os.path.join(workdir, "config.json"), "rb") as f:
    return f.read()


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("overrides,named", [
    ({"optimizer__learning_rate": 1e-2}, "optimizer.learning_rate: 0.002 -> 0.01"),
    ({"seed": 7, "batch_size": 32}, "batch_size: 16 -> 32; seed: 0 -> 7"),
    ({"task__kind": "reverse"}, "task.kind: 'copy' -> 'reverse'"),
])
def test_a_command_with_other_settings_than_the_run_is_refused_naming_each(trained, mode, overrides, named):
  workdir, config_json = trained
  with pytest.raises(ConfigError, match=f"was trained with other settings: {named}.*accept_changes="):
    run(tiny_config(**overrides, num_train_steps=40), workdir, mode)
  assert _config_bytes(workdir) == config_json  # the record is never rewritten


@pytest.mark.slow
def test_extending_a_run_and_accepted_changes_go_to_its_history(tmp_path):
  workdir = str(tmp_path)
  run(tiny_config(num_train_steps=10), workdir)
  config_json = _config_bytes(workdir)
  run(tiny_config(num_train_steps=15), workdir)  # raising num_train_steps is allowed
  run(tiny_config(num_train_steps=20, optimizer__learning_rate=3e-3, accept_changes="optimizer.learning_rate"),
      workdir)
  assert _config_bytes(workdir) == config_json
  with open(os.path.join(workdir, "config_history.jsonl")) as f:
    history = [json.loads(line) for line in f]
  assert history == [
      {"step": 10, "field": "num_train_steps", "old": 10, "new": 15},
      {"step": 15, "field": "num_train_steps", "old": 15, "new": 20},
      {"step": 15, "field": "optimizer.learning_rate", "old": 0.002, "new": 0.003}]
  effective = read_run_config(workdir)  # what eval and load() see: the record with its history applied
  assert effective.num_train_steps == 20 and effective.optimizer.learning_rate == 0.003
  assert max(record["step"] for record in read_metrics(workdir)) == 20
  with pytest.raises(ConfigError, match="num_train_steps: 20 -> 10"):  # shortening a cosine schedule changes it
    run(tiny_config(num_train_steps=10, optimizer__learning_rate=3e-3), workdir)


@pytest.mark.slow
def test_a_changed_setting_is_judged_by_its_declared_effect(tmp_path):
  """Evaluation and layout settings are taken and recorded, bookkeeping and local ones taken silently."""
  workdir = str(tmp_path)
  run(tiny_config(num_train_steps=10), workdir)
  run(tiny_config(num_train_steps=12, best_mode="min", parallelism="mesh", log_every=4, quiet=True), workdir)
  with open(os.path.join(workdir, "config_history.jsonl")) as f:
    history = [(change["field"], change["old"], change["new"]) for change in map(json.loads, f)]
  assert history == [("best_mode", "max", "min"), ("num_train_steps", 10, 12), ("parallelism", "jit", "mesh")]


def test_a_saved_config_takes_a_commands_overrides_and_nothing_else(trained):
  workdir, _ = trained
  command = tiny_config(num_train_steps=99, seed=5)
  command.decode.beam_size = 3
  config = RunDirectory(workdir).config_dict(overrides_from=command, fields=["decode.beam_size"])
  assert config.decode.beam_size == 3
  assert config.num_train_steps == 20 and config.seed == 0  # the run's, not this command's other values


@pytest.mark.parametrize("mode", ["eval", "predict", "translate"])
@pytest.mark.parametrize("state", ["missing", "empty"])
def test_read_only_modes_write_nothing_where_there_is_no_run(tmp_path, mode, state):
  workdir = tmp_path / "run"
  if state == "empty":
    workdir.mkdir()
  with pytest.raises(WorkdirError, match="does not exist" if state == "missing" else "holds no checkpoint"):
    run(tiny_config(), str(workdir), mode, **({"lines": ["1 2"]} if mode == "translate" else {}))
  assert (not workdir.exists()) if state == "missing" else not any(workdir.iterdir())


@pytest.mark.slow
def test_a_step_that_logs_nothing_never_waits_for_the_device(tmp_path, monkeypatch):
  """No array is read to the host in the loop except inside its actions (log, evaluate, save): a per-step
  fetch (of metrics, or of a finiteness flag) would be counted. (``jax.transfer_guard`` does not guard reads
  on the CPU backend, so the test counts them where every read goes through: ``ArrayImpl._value``.)"""
  from jax._src import array as jax_array
  from transformer.train import loop
  reads, in_step = [], [False]
  value = jax_array.ArrayImpl._value
  def counted(self):
    if in_step[0]:
      reads.append(self.shape)
    return value.fget(self)
  monkeypatch.setattr(jax_array.ArrayImpl, "_value", property(counted))
  # Inside ``train``, only the actions and the phases before and after the loop may read.
  for name in ("log", "evaluate", "checkpoint", "_open_outputs", "_compile", "_evaluators", "_finish"):
    def action(self, *args, _action=getattr(loop.Trainer, name), **kwargs):
      in_step[0] = False
      try:
        return _action(self, *args, **kwargs)
      finally:
        in_step[0] = True
    monkeypatch.setattr(loop.Trainer, name, action)
  def steps_only(self, _train=loop.Trainer.train):
    in_step[0] = True
    try:
      return _train(self)
    finally:
      in_step[0] = False
  monkeypatch.setattr(loop.Trainer, "train", steps_only)
  output = run(tiny_config(log_every=10), str(tmp_path))
  assert output.step == 20 and reads == []
  assert [r["step"] for r in read_metrics(str(tmp_path)) if "train/loss" in r] == [10, 20]


def test_prefetched_batches_are_the_iterators_in_order_with_the_position_after_each():
  examples = [(np.arange(1, 2 + i % 5), np.arange(1, 3 + i % 3)) for i in range(40)]
  batcher = TokenBatcher(examples, max_tokens=32, max_length=16, seed=3)
  reference = batcher.iterator()
  expected = []
  for _ in range(12):
    batch = next(reference)
    expected.append((batch, reference.get_state()))
  placed = prefetch_to_device(batcher.iterator(), lambda batch: jax.device_put(batch), size=2)
  for (want, want_state), (host, device, state) in zip(expected, placed):
    assert state == want_state
    for name in want:
      np.testing.assert_array_equal(host[name], want[name])
      np.testing.assert_array_equal(np.asarray(device[name]), want[name])


@pytest.mark.slow
def test_a_run_skipping_most_of_its_steps_stops_and_shows_them(tmp_path, capsys):
  config = tiny_config(optimizer__learning_rate=1e30, optimizer__warmup_steps=0, skip_nonfinite_steps=True,
                       quiet=False)
  with pytest.raises(TrainingDiverged, match=r"training stopped at step 5: \d of the last 5 steps were skipped"):
    run(config, str(tmp_path))
  line = [line for line in capsys.readouterr().out.splitlines() if line.startswith("step 5/20")][0]
  assert "steps skipped" in line
  record = read_metrics(str(tmp_path))[0]
  assert record["train/skipped_steps"] > 2.5  # (a window of only skipped steps: tests/train/test_loop.py)


@pytest.mark.slow
def test_a_run_refuses_data_other_than_its_own_unless_accepted(tmp_path, monkeypatch):
  from transformer.tasks.synthetic import SyntheticTask
  workdir = str(tmp_path)
  monkeypatch.setattr(SyntheticTask, "data_fingerprint", lambda self: {"copy/train.csv": "size=10 sha256=aa"})
  run(tiny_config(num_train_steps=10), workdir)
  assert json.loads((tmp_path / "data_fingerprint.json").read_text()) == {"copy/train.csv": "size=10 sha256=aa"}
  monkeypatch.setattr(SyntheticTask, "data_fingerprint", lambda self: {"copy/train.csv": "size=9 sha256=bb"})
  for mode in ("train", "eval"):
    with pytest.raises(ConfigError, match=r"was trained on other data: copy/train.csv \(size=10 sha256=aa then, "
                                          r"size=9 sha256=bb now\).*accept_changes=data"):
      run(tiny_config(num_train_steps=20), workdir, mode)
  run(tiny_config(num_train_steps=20, accept_changes="data"), workdir)
  history = [json.loads(line) for line in (tmp_path / "config_history.jsonl").read_text().splitlines()]
  assert {"step": 10, "field": "data", "old": {"copy/train.csv": "size=10 sha256=aa"},
          "new": {"copy/train.csv": "size=9 sha256=bb"}} in history
  assert read_run_config(workdir).num_train_steps == 20  # the data change is no config field
  # The run went on with the new data: later commands compare with it, and need no accept_changes again.
  assert json.loads((tmp_path / "data_fingerprint.json").read_text()) == {"copy/train.csv": "size=9 sha256=bb"}
  run(tiny_config(num_train_steps=20), workdir, "eval")


def test_a_misspelt_accepted_change_is_refused_with_the_field_meant(trained):
  workdir, config_json = trained
  with pytest.raises(ConfigError, match="accept_changes.*'optimizer.learning_rat'.*did you mean 'optimizer.learning_rate'"):
    run(tiny_config(optimizer__learning_rate=1e-2, accept_changes="optimizer.learning_rat"), workdir)
  assert _config_bytes(workdir) == config_json


def test_a_bogus_accepted_change_is_refused_on_a_fresh_run_too(tmp_path):
  """It would be stored in the new run's record and refused only at its first resume."""
  with pytest.raises(ConfigError, match="accept_changes names 'bogus', which is no config field"):
    run(tiny_config(accept_changes="bogus"), str(tmp_path / "run"))
  assert not (tmp_path / "run").exists()


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["missing", "null"])
def test_a_record_without_its_optimizer_section_still_refuses_another_learning_rate(tmp_path, damage):
  """A section the record lacks (or holds null) means its defaults, so a command's other value is a change
  (was: accepted without a word, and not written to the history)."""
  workdir = str(tmp_path)
  run(tiny_config(num_train_steps=10), workdir)
  record = json.loads((tmp_path / "config.json").read_text())
  if damage == "missing":
    del record["optimizer"]
  else:
    record["optimizer"] = None
  (tmp_path / "config.json").write_text(json.dumps(record))
  with pytest.raises(ConfigError, match=r"optimizer.learning_rate: 0.001 -> 0.05"):
    run(tiny_config(num_train_steps=20, optimizer__learning_rate=0.05), workdir)
