"""The Disaster Tweets config and results script: every variant is a valid config, and the results page's
commands and statistics are what the runs recorded; a committed row is only replaced by a run at least as long,
and the committed page is rewritten from its records alone."""
import json
import shlex
import shutil

import numpy as np
import pytest

from experiments import disaster_tweets, disaster_tweets_results as results, record_store
from transformer.errors import ConfigError
from transformer.tasks.metrics import binary_metrics, confusion_counts
from transformer.train.config import validate_config
from transformer.train.workdir import write_format


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
  write_format(str(tmp_path))  # a run's record: its format and config.json
  (tmp_path / "config.json").write_text(config.to_json_best_effort())
  assert shlex.split(results.training_command("minilm_finetune", str(tmp_path))) == [
      "python", "launch.py", "--config=experiments/disaster_tweets.py:minilm_finetune", "--workdir=WORKDIR",
      "--config.num_train_steps=123", "--config.optimizer.frozen_params=('encoder/embedding',)"]
  assert results.training_command("static_scratch") == (
      "python launch.py --config=experiments/disaster_tweets.py:static_scratch --workdir=WORKDIR")


def test_mean_and_sample_standard_deviation():
  from experiments.disaster_tweets_scores import summary
  assert summary([0.80, 0.82, 0.84]) == pytest.approx({"mean": 0.82, "std": 0.02})
  assert results.mean_std(summary([0.80, 0.82, 0.84])) == "0.820 ± 0.020"
  assert results.mean_std(summary([0.8123])) == "0.812 (1 seed)"


@pytest.fixture
def committed(tmp_path, monkeypatch):
  """A copy of the committed page standing in for it (tests never write the real one)."""
  copy = tmp_path / "committed"
  shutil.copytree(results.COMMITTED_DIR, copy)
  monkeypatch.setattr(results, "COMMITTED_DIR", str(copy))
  return copy


def test_the_committed_page_and_its_confusion_matrices_are_rewritten_from_its_records_alone(tmp_path, committed):
  before = {name: (committed / name).read_bytes() for name in ("RESULTS.md", "confusion_matrices.png")}
  for name in before:  # deleted, so that only files written again from the records can match
    (committed / name).unlink()
  results.main(["--from_records", "--update_committed", f"--workdir_root={tmp_path / 'none'}"])
  assert {name: (committed / name).read_bytes() for name in before} == before


def fake_run(root, variant: str, steps: int, monkeypatch) -> None:
  """A workdir holding a run's config and metrics, and score_run's answer for it (no model is loaded)."""
  workdir = root / variant
  workdir.mkdir(parents=True)
  write_format(str(workdir))
  config = disaster_tweets.get_config(variant)
  config.num_train_steps = steps
  (workdir / "config.json").write_text(config.to_json_best_effort())
  (workdir / "metrics.jsonl").write_text(json.dumps({"step": steps, "train/loss": 0.5, "eval/f1": 0.7}) + "\n")
  seeds = [{"tp": 200, "fp": 50, "fn": 127, "tn": 384, "threshold": 0.5, "f1": f1,
            "precision": 0.8, "recall": 0.6, "accuracy": 0.77, "tuned_f1": f1, "validation_f1": 0.7}
           for f1 in (0.69, 0.71)]
  probabilities = {split: {"ids": np.array([1, 2]), "labels": np.array([1, 0]),
                           "seeds": [np.array([0.9, 0.2], np.float32)] * 2} for split in ("test", "validation")}
  monkeypatch.setattr(results, "score_run", lambda workdir: {
      "config": config, "seeds": seeds, "ensemble": {"f1": 0.7, "f1_interval": (0.66, 0.74)}, "step": steps,
      "records": [{"step": steps, "train/loss": 0.5, "eval/f1": 0.7}], "probabilities": probabilities,
      "validation_f1": 0.7, "last_step": steps, "wall_seconds": 60.0})


def test_a_committed_row_is_replaced_only_by_a_run_at_least_as_long(tmp_path, committed, monkeypatch):
  recorded = record_store.RecordStore(str(committed))["minilm_finetune"]["steps"]
  fake_run(tmp_path / "runs", "minilm_finetune", recorded - 1, monkeypatch)
  before = (committed / "RESULTS.md").read_bytes()
  with pytest.raises(SystemExit) as exited:
    results.main([f"--workdir_root={tmp_path / 'runs'}", "--update_committed"])
  assert (f"row 'minilm_finetune' records a run of {recorded} training steps, the new one trained {recorded - 1}"
          in str(exited.value)) and "--force" in str(exited.value)
  assert (committed / "RESULTS.md").read_bytes() == before
  text = results.main([f"--workdir_root={tmp_path / 'runs'}", "--update_committed", "--force"])
  assert ("| minilm_finetune | 2 | 0.700 ± 0.014 | 0.800 ± 0.000 | 0.600 ± 0.000 | 0.770 ± 0.000 | "
          "0.700 ± 0.014 (0.50) | 0.700 (0.660-0.740) |") in text
  assert f"| {recorded - 1} of {recorded - 1} |" in text and "| static_scratch | 3 |" in text  # the others kept
  assert (committed / "predictions" / "minilm_finetune.test.csv").exists()
  assert (committed / "predictions" / "minilm_finetune.validation.csv").exists()
  # Another run over the committed row: the page says what its headline cells were and are now.
  assert "- `minilm_finetune`: rerun on " in text and "test F1 (disaster) was 0.792 ± 0.004, now 0.700 ± 0.014" in text


def test_per_seed_predictions_give_back_the_rows_numbers_and_the_page_says_where_they_are(tmp_path):
  """predictions/<variant>.<split>.csv hold each seed's probabilities to the float32 digit: read back, they give
  the row's every test metric, threshold and ensemble interval exactly; a variant without them is named with the
  command that makes them."""
  from experiments import disaster_tweets_scores as scores
  rng = np.random.default_rng(0)
  probabilities = {split: {"ids": np.arange(40) + 100, "labels": rng.integers(0, 2, 40),
                           "seeds": [rng.random(40).astype(np.float32) for _ in range(3)]} for split in scores.SPLITS}
  scores.write_predictions(str(tmp_path), "static_scratch", probabilities)
  read = scores.read_predictions(str(tmp_path), "static_scratch")
  for split in scores.SPLITS:
    np.testing.assert_array_equal(np.asarray(read[split]["seeds"]), np.asarray(probabilities[split]["seeds"]))
    np.testing.assert_array_equal(read[split]["labels"], probabilities[split]["labels"])
  expected = scores.score_values(scores.score_probabilities(probabilities))
  assert results.recompute(str(tmp_path), "static_scratch", {}) == expected
  # The rule: "disaster" where the probability is above 0.5, the argmax of the two classes' probabilities.
  test = probabilities["test"]
  f1s = [binary_metrics(confusion_counts(np.stack([1 - seed, seed], -1).argmax(-1), test["labels"]))["f1"]
         for seed in test["seeds"]]
  assert expected["f1"] == pytest.approx(scores.summary(f1s))
  validation = probabilities["validation"]  # the validation F1 that chose the step, as eval/f1 logs it
  assert expected["validation_f1"] == pytest.approx(np.mean([
      binary_metrics(confusion_counts(np.stack([1 - seed, seed], -1).argmax(-1), validation["labels"]))["f1"]
      for seed in validation["seeds"]]))
  assert results.recompute(str(tmp_path), "minilm_finetune", {}) is None
  section = results.predictions_section(str(tmp_path), {"static_scratch": "python launch.py A",
                                                        "minilm_finetune": "python launch.py B"})
  assert ("- `static_scratch`: `predictions/static_scratch.test.csv`, `predictions/static_scratch.validation.csv`"
          in section)
  assert ("- `minilm_finetune`: not committed (the run's workdir is gone): train it with `python launch.py B`, "
          "then this script writes `predictions/minilm_finetune.test.csv`") in section


def test_the_page_names_the_seed_experiments_published_f1_and_why_it_is_another_test():
  section = results.published_section()
  assert "| Seed experiment: mean-pooled static embeddings | 0.752 |" in section
  assert "| Seed experiment: fine-tuned BERT | 0.825 |" in section
  assert "Kaggle's `test.csv`, whose labels Kaggle keeps hidden" in section and "other models" in section
