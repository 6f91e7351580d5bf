"""``transformer.load``: a trained run back from its workdir decodes as the training system's evaluation did,
restores the chosen or averaged checkpoints exactly, and scores pairs as a teacher-forced pass does."""
import dataclasses
import re

import jax
import numpy as np
import pytest

from tests.train.conftest import load_experiment_config, tiny_config
from transformer import load, load_params, read_run_config
from transformer import ops
from transformer.errors import ConfigError
from transformer.inference import Classifier, LanguageModel, Translator
from transformer.train import run
from transformer.train.workdir import RunDirectory, read_metrics, write_format

STEPS, EVERY = 300, 100
SETTINGS = {"num_train_steps": STEPS, "eval_every": EVERY, "checkpoint_every": EVERY, "log_every": EVERY,
            "keep_checkpoints": 3, "best_metric": "eval/exact_match", "best_mode": "max"}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """``(workdir, config, run output)`` of the tiny copy task trained a few hundred steps in-process."""
  workdir = tmp_path_factory.mktemp("copy")
  config = tiny_config(**SETTINGS)
  return str(workdir), config, run(config, str(workdir))


def _eval_history(workdir) -> dict[int, float]:
  return {record["step"]: record["eval/exact_match"] for record in read_metrics(workdir)
          if "eval/exact_match" in record}


def _exact_match(model, batches) -> float:
  """Sequence exact match of ``model.decode`` over the eval batches, as ``Seq2SeqTask.evaluate`` counts it."""
  matches = count = 0
  for batch in batches:
    target = np.asarray(batch["target"])
    decoded = model.decode(batch["source"], max_length=target.shape[1])
    for row, tokens in zip(target, decoded):
      real = row[row != 0]
      if real.size:  # all-padding rows fill the last batch and have no weight
        count += 1
        matches += int(np.array_equal(tokens, real))
  return matches / count


@pytest.mark.slow
def test_the_three_line_example_decodes_as_the_training_evaluation(trained):
  workdir, config, output = trained
  model = load(workdir)  # the best checkpoint by eval/exact_match
  history = _eval_history(workdir)
  best_step = max(history, key=history.get)
  assert model.step == best_step and history[best_step] > 0.5  # learned: the comparison below is not vacuous
  batches = model.task.eval_batches(config.eval_batch_size)
  assert _exact_match(model, batches) == pytest.approx(history[best_step])

  latest = load(workdir, checkpoint="latest")
  assert latest.step == STEPS
  for restored, final in zip(jax.tree.leaves(latest.params), jax.tree.leaves(output.state.params)):
    np.testing.assert_array_equal(restored, np.asarray(final))
  # Token for token what the run's own evaluation decodes with its final parameters.
  source, target = batches[0]["source"], np.asarray(batches[0]["target"])
  expected = np.asarray(latest.task.decode_batch(latest.model_config, output.state.params, source, target.shape[1]))
  for tokens, row in zip(latest.decode(source, max_length=target.shape[1]), expected):
    np.testing.assert_array_equal(tokens, row[: len(tokens)])
    assert np.all(row[len(tokens):] == 0)


@pytest.mark.slow
def test_average_last_is_the_mean_of_the_checkpoints(trained):
  workdir, _, _ = trained
  averaged = load_params(workdir, average_last=3)
  assert averaged.steps == [100, 200, 300]
  kept = [load_params(workdir, checkpoint=step).params for step in averaged.steps]
  for mean, *each in zip(jax.tree.leaves(averaged.params), *map(jax.tree.leaves, kept)):
    np.testing.assert_allclose(mean, np.mean(each, axis=0), rtol=1e-5, atol=1e-6)
  assert load(workdir, average_last=2).steps == [200, 300]


@pytest.mark.slow
def test_checkpoint_choices_and_their_errors(trained, tmp_path):
  workdir, _, _ = trained
  assert load_params(workdir, checkpoint=200).step == 200
  with pytest.raises(ValueError, match=r"no checkpoint of step 150; its checkpoints are steps \[100, 200"):
    load_params(workdir, checkpoint=150)
  with pytest.raises(ValueError, match="give 'best', 'latest' or a step number"):
    load_params(workdir, checkpoint="newest")
  with pytest.raises(ValueError, match="cannot be combined"):
    load_params(workdir, checkpoint=200, average_last=2)
  with pytest.raises(ValueError, match="holds no config.json"):
    load(str(tmp_path))


@pytest.mark.slow
def test_score_is_the_teacher_forced_log_probability(trained):
  """``score`` of pairs batched with padding equals each pair's log-likelihood computed alone with
  ``jax.nn.log_softmax``; the copy a trained model has learned is far likelier than a wrong target."""
  workdir, _, _ = trained
  model = load(workdir)
  sources = [np.array([3, 4, 5, 6]), np.array([7, 3])]
  targets = [np.array([3, 4, 5, 6, 2]), np.array([7, 3, 2])]
  scores = model.score(sources, targets)
  network = model.task.build_model(model.model_config.replace(deterministic=True))
  for source, target, score in zip(sources, targets, scores):
    logits = network.apply({"params": model.params}, source[None], target[None])[0]
    expected = np.asarray(jax.nn.log_softmax(logits))[np.arange(len(target)), target].sum()
    assert score == pytest.approx(float(expected), abs=1e-4)
  wrong = model.score(sources, [np.array([6, 5, 4, 3, 2]), np.array([3, 7, 2])])
  assert np.all(scores > wrong)
  assert model.score([], []).shape == (0,) and model.decode([]) == [] and model.attention_weights([], []) == []
  with pytest.raises(ValueError, match="2 sources for 1 targets"):
    model.score(sources, targets[:1])
  # Consistent with the loss the run trains: the mean per-token NLL of a pair is -score / its length.
  logits = network.apply({"params": model.params}, sources[0][None], targets[0][None])
  nll = float(np.mean(ops.softmax_cross_entropy(logits, targets[0][None])))
  assert -scores[0] / len(targets[0]) == pytest.approx(nll, abs=1e-4)


@pytest.mark.slow
def test_what_a_task_cannot_do_is_named(trained):
  workdir, config, _ = trained
  model = load(workdir)
  assert type(model).__name__ == "SequenceModel"
  with pytest.raises(AttributeError, match=r"a SequenceModel \(the run in .* trained config.task.name='synthetic'\) "
                                           r"has no translate; it offers decode, predict, score, attention_weights"):
    model.translate(["a b c"])
  with pytest.raises(ValueError, match="1-D sequence of token ids"):
    model.decode(["a b c"])
  with pytest.raises(ValueError, match=r"--mode=translate needs a task that translates text.*'synthetic'"):
    run(config, workdir, mode="translate", lines=["a b c"])


@pytest.mark.slow
def test_token_ids_outside_the_vocabulary_are_named(trained):
  """JAX clamps an embedding index, so an id past the vocabulary would be read as the last row, silently."""
  workdir, _, _ = trained
  model = load(workdir)
  vocab = model.model_config.vocab_size
  with pytest.raises(ValueError, match=rf"source 1 holds token ids \[{vocab + 86}\] outside the vocabulary "
                                       rf"\[0, {vocab}\)"):
    model.decode([[3, 4], [vocab + 86, 5]])
  with pytest.raises(ValueError, match=rf"target 0 holds token ids \[-1, {vocab}\] outside the vocabulary"):
    model.score([[3, 4]], [[vocab, -1, 2]])
  with pytest.raises(ValueError, match=r"source 0 holds token ids \[-3\]"):
    model.attention_weights(np.array([[-3, 4]]), [[3, 2]])


def test_a_missing_workdir_and_one_before_its_first_checkpoint_are_named(tmp_path):
  with pytest.raises(ValueError, match="'.*nowhere' does not exist: give the --workdir of a run"):
    load(str(tmp_path / "nowhere"))
  # A run that has started (its format and config.json written, no checkpoint saved yet).
  config = tiny_config(**{**SETTINGS, "checkpoint_every": 50})
  write_format(str(tmp_path))
  (tmp_path / "config.json").write_text(config.to_json_best_effort(indent=2, sort_keys=True))
  (tmp_path / "checkpoints").mkdir()
  for checkpoint in ("best", "latest", 100):
    with pytest.raises(ValueError, match=r"holds no checkpoint yet: its run writes the first at step 50 "
                                         r"\(config.checkpoint_every\)"):
      load(str(tmp_path), checkpoint=checkpoint)


@pytest.mark.slow
def test_a_max_length_below_one_is_named(trained):
  """``max_length=-1`` once reached the decoding cache, sized by it: a TypeError from deep inside JAX."""
  workdir, _, _ = trained
  model = load(workdir)
  for max_length in (-1, 0):
    with pytest.raises(ValueError, match=rf"max_length must be an integer >= 1 .*got {max_length}"):
      model.decode([[3, 4, 5]], max_length=max_length)
  assert len(model.decode([[3, 4, 5]], max_length=np.int64(2))[0]) <= 2


@pytest.mark.slow
def test_another_tasks_config_is_refused_naming_both_tasks(trained):
  """A forecasting config on a copy run looked up its best_metric eval/mae in this run's checkpoints:
  ``KeyError: 'eval/mae'``."""
  workdir, _, _ = trained
  other = load_experiment_config("beijing_pm25", "tiny")
  with pytest.raises(ConfigError, match=r"the config is of config.task.name='forecasting', but the run trained "
                                        r"config.task.name='synthetic'"):
    load(workdir, config=other)
  assert load(workdir, config=read_run_config(workdir)).step == load(workdir).step  # the run's own: loads


@pytest.mark.slow
def test_a_config_of_the_same_task_with_another_best_metric_loads_the_runs_own_best(trained):
  """(was: ``KeyError: 'eval/loss'`` from orbax, which ranked the checkpoints by a metric they do not carry)"""
  workdir, _, _ = trained
  config = RunDirectory(workdir).config_dict()
  config.best_metric, config.best_mode = "eval/loss", "min"
  assert load(workdir, config=config).step == load(workdir).step


class _RecordingTask:
  """Stands in for a task: records what each text method receives."""

  def __init__(self):
    self.received = []

  def translate_lines(self, model_config, params, lines, beam_size=None, length_penalty=None):
    self.received.append(lines)
    return [line.upper() for line in lines]

  classify_texts = continue_texts = translate_lines


@pytest.mark.slow
@pytest.mark.parametrize("kind, method", [(Translator, "translate"), (Classifier, "classify"),
                                          (LanguageModel, "continue_texts")])
def test_a_single_string_is_refused_not_read_as_one_text_per_character(trained, kind, method):
  """``translate("A man .")`` once returned seven translations, one per character; every text method takes a
  list and returns one result per text."""
  workdir, _, _ = trained
  restored = load_params(workdir)
  task = _RecordingTask()
  model = kind(dataclasses.replace(restored, task=task), workdir)
  with pytest.raises(ValueError, match=rf"{method} takes a list of .*, got one string 'A man \.'; wrap it in a "
                                       rf"list: {method}\(\['A man \.'\]\)"):
    getattr(model, method)("A man .")
  for bad, named in ((None, "got NoneType"), ([1, 2], "item 0 is 1 (int)")):  # was: AttributeError, TypeError
    with pytest.raises(ValueError, match=rf"{method} takes a list of .* \(str\).*{re.escape(named)}"):
      getattr(model, method)(bad)
  assert task.received == []
  assert getattr(model, method)(("A man .",)) == ["A MAN ."] and task.received == [["A man ."]]
