"""Every experiment's ``tiny`` variant on the real data of the docs (``<shared>/data``, skipped without it), as a
newcomer runs it: the data prepared, the tokenizer trained, a first training batch within the model's vocabulary;
the language model's also trains two steps and evaluates. Multi30k's tiny runs end to end in
``test_smoke_variants.py::test_multi30k_tiny_trains_evaluates_predicts_and_translates_with_a_clean_log``."""
import math

import numpy as np
import pytest

from tests.shared_data import shared_path
from tests.train.conftest import load_experiment_config
from transformer.train.config import build_task
from transformer.train import run

# experiment -> the folder of <shared>/data its tiny variant reads (beijing_pm25's tiny generates its series).
SOURCES = {"iwslt15_en_vi": "iwslt15_en_vi", "language_model": "multi30k", "disaster_tweets": "disaster_tweets",
           "beijing_pm25": "beijing_pm25"}
TOKEN_KEYS = ("tokens", "source", "target")


def _tiny_on_real_data(experiment, tmp_path):
  config = load_experiment_config(experiment, "tiny")
  config.task.source_dir = str(shared_path("data", SOURCES[experiment]))
  config.task.data_dir = str(tmp_path / "tfds")
  if "pretrained_dir" in config.task:  # the tokenizer of every Disaster Tweets variant
    config.task.pretrained_dir = str(shared_path("models", config.task.pretrained_model))
  config.quiet, config.tensorboard = True, False
  return config


@pytest.mark.slow
@pytest.mark.parametrize("experiment", sorted(SOURCES))
def test_the_tiny_variant_builds_on_the_real_data(experiment, tmp_path):
  config = _tiny_on_real_data(experiment, tmp_path)
  task = build_task(config)
  model_config = task.model_config()
  batch = next(iter(task.train_iterator(config.batch_size, seed=0)))
  for key in TOKEN_KEYS:
    if key in batch:
      tokens = np.asarray(batch[key])
      assert np.any(tokens != model_config.pad_id) and tokens.max() < model_config.vocab_size, key
  if "inputs" in batch:
    assert np.isfinite(batch["inputs"]).all()

  if experiment == "language_model":  # the issue's case: its vocabulary once fit only the tests' made-up text
    assert model_config.vocab_size == config.task.vocab_size
    config.num_train_steps = config.eval_every = config.checkpoint_every = config.log_every = 2
    config.task.num_eval_prompts = 0  # the continuations' compilations: test_language_model.py covers them
    metrics = run(config, str(tmp_path / "run")).metrics  # reuses the prepared data and the tokenizer
    assert math.isfinite(metrics["eval/perplexity"]) and metrics["eval/perplexity"] > 1.0
