"""The Disaster Tweets config and results script: every variant is a valid config, and the results page's
commands and statistics are what the runs recorded."""
import pytest

from experiments import disaster_tweets, disaster_tweets_results as results
from transformer.errors import ConfigError
from transformer.train.config import validate_config


@pytest.mark.parametrize("variant", disaster_tweets.VARIANTS)
def test_every_variant_is_a_valid_config(variant):
  config = disaster_tweets.get_config(variant)
  validate_config(config)
  assert config.best_metric == "eval/f1" and config.task.pretrained_dir == "" and config.task.source_dir == ""


def test_an_unknown_variant_names_the_known_ones():
  with pytest.raises(ConfigError, match="static_scratch"):
    disaster_tweets.get_config("static")


def test_the_recorded_command_rebuilds_the_runs_settings(tmp_path):
  config = disaster_tweets.get_config("minilm_finetune")
  config.num_train_steps = 123
  config.task.pretrained_dir = "/somewhere/on/this/machine"  # a path, not a setting: not in the command
  config.optimizer.frozen_params = ("encoder/embedding",)
  (tmp_path / "config.json").write_text(config.to_json_best_effort())
  assert results.overrides("minilm_finetune", str(tmp_path)) == [
      "--config.num_train_steps=123", "--config.optimizer.frozen_params=('encoder/embedding',)"]


def test_mean_and_sample_standard_deviation():
  assert results.mean_std([0.80, 0.82, 0.84]) == "0.820 ± 0.020"
  assert results.mean_std([0.8123]) == "0.812 (1 seed)"
