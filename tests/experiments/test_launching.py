"""experiments/launching.py: a command parsed as launch.py parses it, and a folder without metrics is one line."""
import argparse
import math

import pytest

from experiments import launching, pages
from tests.train.conftest import load_experiment_config
from transformer.errors import UserError
from transformer.train.workdir import MetricsLog


def test_launch_config_parses_a_command_as_launch_py_does():
  config = launching.launch_config(["--config=experiments/multi30k.py:gru_bahdanau", "--workdir=W",
                                   "--config.num_train_steps=7", "--config.task.length_penalty_candidates=(1.0,2.0)"])
  assert (config.num_train_steps, tuple(config.task.length_penalty_candidates)) == (7, (1.0, 2.0))
  assert config.model.cell == "gru"  # the variant's own settings
  assert launching.launch_config(["--config=experiments/multi30k.py:gru_bahdanau"]).num_train_steps != 7  # no leak


def test_a_folder_without_metrics_and_a_negative_count_are_one_line_errors(tmp_path):
  with pytest.raises(UserError, match=f"{tmp_path} holds no metrics.jsonl: give the workdir of a training run"):
    launching.run_metrics(str(tmp_path))
  (tmp_path / "metrics.jsonl").write_text('{"step": 10, "train/loss": 1.5}\n')
  assert launching.run_metrics(str(tmp_path)).records == ({"step": 10, "train/loss": 1.5},)
  # How far a run got and how long it took: the last record that times it (evaluations are not timed).
  log = MetricsLog(({"step": 5, "wall_seconds": 1.0}, {"step": 10, "wall_seconds": 2.5}, {"step": 12, "eval/f1": 0.7}))
  assert log.progress == (10, 2.5) and log.last_step == 12
  assert MetricsLog().progress[0] == 0 and math.isnan(MetricsLog().progress[1])
  assert pages.non_negative_int("0") == 0 and pages.non_negative_int("5") == 5
  for bad in ("-3", "2.5", "x"):
    with pytest.raises(argparse.ArgumentTypeError, match=f"must be an integer >= 0, got {bad}"):
      pages.non_negative_int(bad)


def test_a_reproducing_command_leaves_out_exactly_the_settings_declared_local():
  """Paths and display are left out of every page's commands because their fields say so (Effect.LOCAL)."""
  assert set(launching.LOCAL_SETTINGS) == {"quiet", "tensorboard", "translate_input", "translate_output",
                                           "task.source_dir", "task.data_dir", "task.pretrained_dir"}
  config = load_experiment_config("synthetic", "copy")
  run = load_experiment_config("synthetic", "copy")
  run.update({"quiet": True, "tensorboard": False, "seed": 3})
  assert launching.config_overrides(config, run) == ["--config.seed=3"]
