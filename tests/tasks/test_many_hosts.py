"""Tasks on many hosts: ``train_iterator(batch_size, seed)`` gives global batches that the processes' rows
(``HostShard``) put back together, and the all-zero filler rows of ``pad_rows`` weigh nothing in any task's loss
or metrics (so evaluation batches can be padded to split over processes and devices)."""
from __future__ import annotations

import types

import jax
import numpy as np
import pytest

from tests.tasks.test_forecasting import small_config as forecasting_config
from tests.train.conftest import load_experiment_config
from transformer.data.classification import fixed_batches
from transformer.data.hosts import HostShard, host_rows, pad_rows
from transformer.nn import ClassifierConfig, EncoderClassifier, ModelConfig, TransformerLM
from transformer.train.config import build_task
from transformer.tasks.classification import ClassificationTask
from transformer.tasks.language_model import LanguageModelTask

TINY_MODEL = {"d_model": 16, "num_heads": 2, "d_ff": 32, "num_encoder_layers": 1, "num_decoder_layers": 1}


def synthetic_task():
  config = load_experiment_config("synthetic", "copy")
  for name, value in TINY_MODEL.items():
    config.model[name] = value
  config.task.num_eval_examples = 5
  return build_task(config)


def forecasting_task():
  return build_task(forecasting_config())


@pytest.mark.parametrize("make_task", [synthetic_task, forecasting_task])
def test_a_tasks_global_batches_are_the_processes_rows_joined(make_task):
  task = make_task()
  iterator = task.train_iterator(batch_size=8, seed=1)
  expected = [next(iterator) for _ in range(3)]
  shards = [HostShard(task.train_iterator(batch_size=8, seed=1), i, 2) for i in range(2)]
  for want in expected:
    rows = [next(shard) for shard in shards]
    for name in want:
      np.testing.assert_array_equal(np.concatenate([row[name] for row in rows]), want[name])


def _check_filler_rows_weigh_nothing(loss_and_metrics, model, init_inputs, batch, multiple=8):
  """The loss, weight and every metric's (sum, weight) of ``batch`` are those of ``pad_rows(batch, multiple)``."""
  padded = pad_rows(batch, multiple)
  assert len(next(iter(padded.values()))) > len(next(iter(batch.values())))
  params = model.init(jax.random.key(0), *init_inputs)["params"]
  plain, filled = (loss_and_metrics(model, params, b, None) for b in (batch, padded))
  pairs = [(plain[0], filled[0]), (plain[1], filled[1])]
  pairs += [(plain[2][name][part], filled[2][name][part]) for name in plain[2] for part in range(2)]
  for want, got in pairs:
    assert np.isfinite(got)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  assert float(plain[1]) > 0
  for process in range(2):  # and the padded batch splits into equal shares
    assert len(host_rows(padded, process, 2)[next(iter(padded))]) == multiple // 2


@pytest.mark.slow
def test_filler_rows_weigh_nothing_in_the_synthetic_and_translation_loss():
  task = synthetic_task()  # Seq2SeqTask.loss_and_metrics, as translation: target 0 (PAD) is masked
  model = task.build_model(task.model_config().replace(deterministic=True))
  batch = task.eval_batches(5)[0]
  _check_filler_rows_weigh_nothing(task.loss_and_metrics, model, task.init_inputs(batch), batch)


@pytest.mark.slow
def test_filler_rows_weigh_nothing_in_the_forecasting_loss():
  task = forecasting_task()  # an all-zero target_mask row scores nothing
  model = task.build_model(task.model_config().replace(deterministic=True))
  batch = task.eval_batches(5)[0]
  assert np.asarray(batch["target_mask"]).any()
  _check_filler_rows_weigh_nothing(task.loss_and_metrics, model, task.init_inputs(batch), batch)


# Language model and classification: their own loss_and_metrics, on a tiny model instead of the task's data.
STUB_TASK = types.SimpleNamespace(label_smoothing=lambda swept=None: 0.1)


def _token_rows(rows, length, seed):
  rng = np.random.default_rng(seed)
  lengths = rng.integers(2, length + 1, rows)
  return np.where(np.arange(length) < lengths[:, None], rng.integers(3, 20, (rows, length)), 0).astype(np.int32)


@pytest.mark.slow
def test_filler_rows_weigh_nothing_in_the_language_model_loss():
  model = TransformerLM(ModelConfig(vocab_size=20, deterministic=True, **TINY_MODEL))
  batch = {"tokens": _token_rows(5, 6, seed=0)}
  _check_filler_rows_weigh_nothing(
      lambda *args: LanguageModelTask.loss_and_metrics(STUB_TASK, *args), model, (batch["tokens"],), batch)


@pytest.mark.slow
def test_filler_rows_weigh_nothing_in_the_classification_loss():
  model = EncoderClassifier(ClassifierConfig(vocab_size=20, deterministic=True, **TINY_MODEL))
  batch = fixed_batches(_token_rows(5, 6, seed=1), np.array([0, 1, 1, 0, 1], np.int32), batch_size=5)[0]
  _check_filler_rows_weigh_nothing(
      lambda *args: ClassificationTask.loss_and_metrics(STUB_TASK, *args), model, (batch["tokens"],), batch)
