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
from transformer.train.config import validate_config
from transformer.train.run_format import write_format


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
  assert results.summary([0.80, 0.82, 0.84]) == pytest.approx({"mean": 0.82, "std": 0.02})
  assert results.mean_std(results.summary([0.80, 0.82, 0.84])) == "0.820 ± 0.020"
  assert results.mean_std(results.summary([0.8123])) == "0.812 (1 seed)"


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
  seeds = [{"tp": 200, "fp": 50, "fn": 127, "tn": 384, "step": steps, "threshold": 0.5, "f1": f1,
            "precision": 0.8, "recall": 0.6, "accuracy": 0.77, "tuned_f1": f1} for f1 in (0.69, 0.71)]
  monkeypatch.setattr(results, "score_run", lambda workdir: {
      "config": config, "seeds": seeds, "ensemble": {"f1": 0.7, "f1_interval": (0.66, 0.74)},
      "records": [{"step": steps, "train/loss": 0.5, "eval/f1": 0.7}], "test_ids": np.array([1, 2]),
      "test_labels": np.array([1, 0]), "test_probabilities": [np.array([0.9, 0.2])] * 2, "validation_f1": 0.7,
      "last_step": steps, "wall_seconds": 60.0})


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
  assert (committed / "predictions" / "minilm_finetune.csv").exists()


def test_per_seed_predictions_recompute_the_tables_f1_and_the_page_says_where_they_are(tmp_path):
  """predictions/<variant>.csv holds each seed's test probabilities, from which a row's F1 is recomputed; a
  variant scored before they were kept is named with the command that makes them."""
  import csv

  import numpy as np
  from transformer.tasks.metrics import binary_metrics, confusion_counts
  labels = np.array([1, 0, 1, 1, 0])
  probabilities = [np.array([0.9, 0.2, 0.4, 0.7, 0.6]), np.array([0.8, 0.1, 0.6, 0.3, 0.4])]
  path = results.write_predictions(str(tmp_path), "static_scratch", np.array([11, 12, 15, 20, 31]), labels,
                                   probabilities)
  assert path == "predictions/static_scratch.csv"
  with open(tmp_path / path) as f:
    rows = list(csv.DictReader(f))
  assert [row["id"] for row in rows] == ["11", "12", "15", "20", "31"] and list(rows[0]) == [
      "id", "target", "seed_0", "seed_1"]
  for seed, seed_probabilities in enumerate(probabilities):  # the F1 the table reports for that seed
    # the probabilities themselves, to the 6 decimals written, not only which side of 0.5 they fall
    np.testing.assert_allclose([float(row[f"seed_{seed}"]) for row in rows], seed_probabilities, rtol=0,
                               atol=5e-7, err_msg=f"seed_{seed}")
    recomputed = [int(float(row[f"seed_{seed}"]) > 0.5) for row in rows]
    assert recomputed == list((seed_probabilities > 0.5).astype(int))
    assert binary_metrics(confusion_counts(recomputed, [int(row["target"]) for row in rows]))["f1"] == (
        binary_metrics(confusion_counts(np.stack([1 - seed_probabilities, seed_probabilities], -1).argmax(-1),
                                        labels))["f1"])
  section = results.predictions_section(str(tmp_path), {"static_scratch": "python launch.py A",
                                                        "minilm_finetune": "python launch.py B"})
  assert "- `static_scratch`: `predictions/static_scratch.csv`" in section
  assert ("- `minilm_finetune`: not committed (scored before this script kept predictions, and the run's workdir "
          "is gone): train it with `python launch.py B`, then this script writes `predictions/minilm_finetune.csv`"
          ) in section


def test_the_page_names_the_seed_experiments_published_f1_and_why_it_is_another_test():
  section = results.published_section()
  assert "| Seed experiment: mean-pooled static embeddings | 0.752 |" in section
  assert "| Seed experiment: fine-tuned BERT | 0.825 |" in section
  assert "Kaggle's `test.csv`, whose labels Kaggle keeps hidden" in section and "other models" in section
