"""Host metrics (``transformer.tasks.metrics``), each checked on a hand-worked example or against an independent
recomputation."""
import math

import numpy as np
import pytest

from transformer.tasks.metrics import (best_threshold, binary_metrics, bleu_by_reference_length, confusion_counts,
                                       corpus_bleu, error_sums, f1_bootstrap_interval, forecast_metrics,
                                       metrics_from_sums)


def test_bleu_of_the_reference_against_itself_is_100():
  references = ["Ein Mann fährt Fahrrad .", "Zwei Hunde spielen im Schnee ."]
  assert corpus_bleu(references, references)[0] == pytest.approx(100.0)
  assert corpus_bleu(references, references, tokenize="none", lowercase=True)[0] == pytest.approx(100.0)
  assert corpus_bleu(["Ein Hund"] * 2, references)[0] < 20.0
  by_length = bleu_by_reference_length(references, references)
  assert sum(group["sentences"] for group in by_length.values()) == len(references)
  assert all(group["bleu"] == pytest.approx(100.0) and group["length_ratio"] == 1.0 for group in by_length.values())
  with pytest.raises(ValueError, match="one per reference"):
    bleu_by_reference_length(references[:1], references)


def test_binary_metrics_of_a_hand_worked_example():
  predictions = [1, 1, 1, 0, 0, 0, 0]
  labels = [1, 0, 0, 1, 0, 0, 0]
  counts = confusion_counts(predictions, labels)
  assert counts == {"tp": 1, "fp": 2, "fn": 1, "tn": 3}
  metrics = binary_metrics(counts)
  # precision 1/3, recall 1/2, F1 their harmonic mean 2 * (1/6) / (5/6) = 0.4, accuracy 4/7.
  assert metrics == pytest.approx({"precision": 1 / 3, "recall": 1 / 2, "f1": 0.4, "accuracy": 4 / 7})
  assert binary_metrics(confusion_counts([0, 0], [0, 1])) == {"f1": 0.0, "precision": 0.0, "recall": 0.0,
                                                              "accuracy": 0.5}


def test_best_threshold_of_a_hand_worked_example():
  probabilities = np.array([0.2, 0.9, 0.3, 0.8, 0.4, 0.7])
  labels = np.array([0, 1, 0, 0, 1, 1])
  # Predicting the k most probable as positive: F1 2/4, 2/5, 4/6, 6/7, 6/8, 6/9; the best (k = 4) lies
  # between 0.4 and 0.3.
  threshold = best_threshold(probabilities, labels)
  assert threshold == pytest.approx(0.35)
  assert binary_metrics(confusion_counts(probabilities >= threshold, labels))["f1"] == pytest.approx(6 / 7)
  # Ties: the threshold cannot fall inside a run of equal probabilities.
  assert best_threshold(np.array([0.6, 0.6, 0.1]), np.array([1, 0, 0])) == pytest.approx(0.35)


def test_f1_bootstrap_interval_is_the_percentiles_of_resampled_f1():
  rng = np.random.default_rng(3)
  labels = rng.integers(0, 2, size=200)
  predictions = np.where(rng.random(200) < 0.8, labels, 1 - labels)  # 80% right
  low, high = f1_bootstrap_interval(predictions, labels, samples=500, seed=7)
  # The same resamples scored one at a time through confusion_counts and binary_metrics.
  rows = np.random.default_rng(7).integers(0, 200, size=(500, 200))
  scores = [binary_metrics(confusion_counts(predictions[row], labels[row]))["f1"] for row in rows]
  assert (low, high) == pytest.approx(tuple(np.percentile(scores, [2.5, 97.5])))
  point = binary_metrics(confusion_counts(predictions, labels))["f1"]
  assert low < point < high
  # Four times the examples (the same ones repeated): about half the width, around the same F1.
  wider = high - low
  low4, high4 = f1_bootstrap_interval(np.tile(predictions, 4), np.tile(labels, 4), samples=500, seed=7)
  assert 0.4 * wider < high4 - low4 < 0.6 * wider
  assert f1_bootstrap_interval(labels, labels) == (1.0, 1.0)
  with pytest.raises(ValueError, match="at least one example"):
    f1_bootstrap_interval([], [])


def test_metrics_by_hand_and_against_plain_numpy():
  predictions = np.array([[1.0, 2.0], [3.0, np.nan], [5.0, 8.0]])
  targets = np.array([[2.0, 2.0], [3.0, 9.0], [np.nan, 4.0]])
  mask = np.array([[True, True], [True, False], [False, True]])
  got = forecast_metrics(predictions, targets, mask)
  np.testing.assert_allclose(got["mae"], [(1 + 0) / 2, (0 + 4) / 2])
  np.testing.assert_allclose(got["rmse"], [math.sqrt(1 / 2), math.sqrt(16 / 2)])
  np.testing.assert_array_equal(got["count"], [2, 2])

  rng = np.random.default_rng(0)
  predictions, targets = rng.normal(size=(2, 50, 5)) * 30 + 100
  mask = rng.random((50, 5)) < 0.8
  sums = [error_sums(predictions[i:i + 7], targets[i:i + 7], mask[i:i + 7])
          for i in range(0, 50, 7)]  # summed over batches, divided once
  combined = metrics_from_sums(
      {name: sum(part[name] for part in sums) for name in sums[0]})
  for horizon in range(5):
    chosen = mask[:, horizon]
    errors = predictions[chosen, horizon] - targets[chosen, horizon]
    assert combined["mae"][horizon] == pytest.approx(np.mean(np.abs(errors)))
    assert combined["rmse"][horizon] == pytest.approx(np.sqrt(np.mean(errors ** 2)))
  with pytest.raises(ValueError, match="NaN"):
    error_sums(np.array([[np.nan]]), np.array([[1.0]]), np.array([[True]]))
