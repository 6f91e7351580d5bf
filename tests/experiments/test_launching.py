"""experiments/launching.py: a command parsed as launch.py parses it, and a folder without metrics is one line."""
import argparse

import pytest

from experiments import launching, pages
from transformer.errors import UserError


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
  assert launching.run_metrics(str(tmp_path)) == [{"step": 10, "train/loss": 1.5}]
  assert pages.non_negative_int("0") == 0 and pages.non_negative_int("5") == 5
  for bad in ("-3", "2.5", "x"):
    with pytest.raises(argparse.ArgumentTypeError, match=f"must be an integer >= 0, got {bad}"):
      pages.non_negative_int(bad)
