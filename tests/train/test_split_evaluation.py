"""Evaluation shared by processes: each evaluates its share of a task's evaluation batches, the outputs of all are
gathered, and every process scores them into exactly the metrics (and examples) of one process evaluating all.

The processes are simulated in one: each share is evaluated here, and the gather hands every process the others'
outputs after a pickle round trip, as ``gather_objects`` sends them.
"""
import pickle

import jax
import numpy as np
import pytest

from tests.data.data_fixtures import write_multi30k
from tests.tasks.test_forecasting import small_config as forecasting_config
from tests.tasks.test_translation import tiny_translation_config
from tests.train.conftest import tiny_config
from transformer.tasks import forecasting
from transformer.train.config import build_task
from transformer.train.multihost import gather_objects, interleave, process_share, split_over_processes


def test_one_process_gathers_its_own_object_without_communicating():
  payload = {"hypotheses": [(3, "ein Hund")], "forecast": np.arange(4.0)}
  assert gather_objects(payload)[0] is payload and len(gather_objects(payload)) == 1


@pytest.mark.parametrize("process_count", [1, 2, 3, 5])
@pytest.mark.parametrize("count", [0, 1, 4, 7])
def test_interleaving_the_shares_restores_the_items_order(count, process_count):
  items = list(range(count))
  shares = [process_share(items, index, process_count) for index in range(process_count)]
  assert sorted(sum(shares, [])) == items  # every item in exactly one share
  assert [len(share) for share in shares] == sorted((len(share) for share in shares), reverse=True)
  assert max(map(len, shares)) - min(map(len, shares)) <= 1  # balanced
  assert interleave(shares) == items


def test_a_lazy_sequence_is_shared_by_index():
  assert process_share(range(10), 1, 3) == [1, 4, 7]


def test_one_process_computes_everything_and_never_gathers():
  def no_gather(share):
    raise AssertionError("one process needs no collective")
  assert split_over_processes(lambda items: [x * x for x in items], [1, 2, 3], 0, 1, gather=no_gather) == [1, 4, 9]


def test_a_function_giving_the_wrong_number_of_results_is_refused():
  with pytest.raises(ValueError, match="gave 1 results for 2 items"):
    split_over_processes(lambda items: items[:1], [1, 2, 3], 0, 2, gather=lambda share: [share, share])


def _evaluations_on_each_process(task, model_config, params, batches, process_count):
  """``(metrics, examples)`` that each of ``process_count`` processes computes as ``make_evaluator`` does."""
  units = task.evaluation_batches(batches)

  def evaluate(share):
    return task.evaluate_batches(model_config, params, share)

  shares = [evaluate(process_share(units, index, process_count)) for index in range(process_count)]
  results = []
  for index in range(process_count):
    def gather(mine, index=index):  # what gather_objects returns there: every share, the others pickled
      return [mine if other == index else pickle.loads(pickle.dumps(share)) for other, share in enumerate(shares)]
    results.append(task.score_outputs(split_over_processes(evaluate, units, index, process_count, gather)))
  return results


def _check_shared_equals_whole(task, model_config, params, batches, process_counts=(2, 3)):
  whole = task.evaluate(model_config, params, batches)
  assert whole[0] or whole[1]  # something was measured or shown
  for process_count in process_counts:
    for metrics, examples in _evaluations_on_each_process(task, model_config, params, batches, process_count):
      assert metrics == whole[0]  # exactly, not approximately
      assert examples == whole[1]
  return whole


def _random_params(task, model_config, batch):
  model = task.build_model(model_config)
  return model.init(jax.random.key(0), *task.init_inputs(batch))["params"]


@pytest.mark.slow
def test_synthetic_exact_match_of_shares_is_that_of_the_whole_set(monkeypatch):
  task = build_task(tiny_config(task__num_eval_examples=30))
  model_config = task.model_config()
  batches = task.eval_batches(8)  # 4 batches, the last padded with 2 all-padding rows
  params = _random_params(task, model_config, batches[0])
  _check_shared_equals_whole(task, model_config, params, batches)

  # A decoder right on some sequences only, so that exact match is neither 0 nor 1.
  def half_right(model_config, params, source, max_length, beam_size=None, length_penalty=None):
    target = next(batch["target"] for batch in batches if batch["source"] is source)
    return np.where((np.arange(len(target)) % 3 == 0)[:, None], target, 0)
  monkeypatch.setattr(task, "decode_batch", half_right)
  metrics, _ = _check_shared_equals_whole(task, model_config, params, batches)
  assert 0 < metrics["exact_match"] < 1


@pytest.fixture(scope="module")
def translation_task(tmp_path_factory):
  sizes = {"train": 120, "val": 22, "test_2016_flickr": 2, "test_2017_flickr": 2, "test_2017_mscoco": 2,
           "test_2018_flickr": 2}
  raw_dir = write_multi30k(tmp_path_factory.mktemp("raw") / "multi30k", sizes=sizes)
  # Length buckets of 8-token batches: several batches of several shapes to share.
  config = tiny_translation_config(raw_dir, tmp_path_factory.mktemp("tfds"), **{
      "task.fixed_batch_shape": False, "task.max_tokens": 64, "task.batch_size_multiple": 1,
      "task.num_eval_sentences": 19})
  return build_task(config)


@pytest.mark.slow
def test_translation_bleu_of_shares_is_that_of_the_whole_set(translation_task, monkeypatch):
  task = translation_task
  model_config = task.model_config()
  batches = task.eval_batches(0)
  units = task.evaluation_batches(batches)
  assert len(units) >= 4 and len({batch["source"].shape for batch in units}) > 1
  params = _random_params(task, model_config, batches[0])
  metrics, _ = _check_shared_equals_whole(task, model_config, params, batches)
  assert set(metrics) == {"bleu", "bleu_lowercase"}
  # The whole evaluation is what BLEU on the eval split's first num_eval_sentences gives.
  assert metrics == {k: v for k, v in task.bleu(model_config, params, "validation", 19)[0].items()
                     if k in metrics}

  # A decoder giving the reference with its second token dropped on every other sentence: a corpus BLEU that
  # is neither 0 nor 100 and that any misplaced hypothesis would change.
  def near_references(model_config, params, source, max_length, beam_size=None, length_penalty=None):
    batch = next(b for b in units if b["source"] is source)
    target = np.asarray(batch["target"]).copy()
    odd = np.asarray(batch["index"]) % 2 == 1
    target[odd, 1:-1] = target[odd, 2:]
    return target
  monkeypatch.setattr(task, "decode_batch", near_references)
  metrics, _ = _check_shared_equals_whole(task, model_config, params, batches)
  assert 10 < metrics["bleu"] < 100


@pytest.mark.slow
def test_forecasting_rmse_of_shares_is_that_of_the_whole_split(monkeypatch):
  monkeypatch.setattr(forecasting, "PREDICT_BATCH_SIZE", 32)  # several batches of validation windows
  task = build_task(forecasting_config())
  model_config = task.model_config()
  batches = task.eval_batches(64)
  assert len(task.evaluation_batches(batches)) >= 3
  params = _random_params(task, model_config, batches[0])
  _check_shared_equals_whole(task, model_config, params, batches)
