"""Metrics computed on the host from a whole split's outputs (numpy, sacreBLEU), as the papers and leaderboards
report them: corpus BLEU and BLEU by reference length (translation); confusion counts, F1, its bootstrap
interval and the F1-best threshold (binary classification); MAE and RMSE per horizon (forecasting).

Metrics summed over batches on the device are in ``transformer.ops.losses``.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

POSITIVE_CLASS = 1  # the class whose precision, recall and F1 the binary metrics give


def _sacrebleu(hypotheses: list[str], references: list[str], tokenize: str, lowercase: bool = False):
  """``(metric, score)``: sacreBLEU's corpus BLEU of one reference per hypothesis."""
  import sacrebleu  # the "data" extra
  # tokenize="none" scores text tokenised on purpose (IWSLT'15): force=True silences the detokenise warnings.
  metric = sacrebleu.BLEU(tokenize=tokenize, lowercase=lowercase, force=tokenize == "none")
  return metric, metric.corpus_score(hypotheses, [references])


def corpus_bleu(hypotheses: list[str], references: list[str], tokenize: str = "13a",
                lowercase: bool = False) -> tuple[float, str]:
  """sacreBLEU corpus BLEU and its signature (e.g. ``nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0``)."""
  metric, score = _sacrebleu(hypotheses, references, tokenize, lowercase)
  return score.score, str(metric.get_signature())


# Reference lengths in words that start a new group of bleu_by_reference_length: 0-9, 10-19, 20-39, 40+.
REFERENCE_LENGTH_EDGES = (10, 20, 40)


def bleu_by_reference_length(hypotheses: list[str], references: list[str], tokenize: str = "13a",
                             edges: tuple[int, ...] = REFERENCE_LENGTH_EDGES) -> dict[str, dict]:
  """Corpus BLEU of the sentences grouped by their reference's length in words (whitespace-separated).

  Returns ``{"0-9": {"sentences": n, "bleu": b, "length_ratio": hypothesis words / reference words}, ...,
  "40+": {...}}`` (sacreBLEU's tokens for the ratio); a group without sentences is left out. Where a model
  loses BLEU (e.g. on long sentences) is what this shows and the corpus BLEU hides.
  """
  if len(hypotheses) != len(references):
    raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references; give one per reference.")
  bounds = [0, *edges, None]
  groups = {}
  for low, high in zip(bounds[:-1], bounds[1:]):
    chosen = [i for i, reference in enumerate(references)
              if low <= len(reference.split()) and (high is None or len(reference.split()) < high)]
    if not chosen:
      continue
    _, score = _sacrebleu([hypotheses[i] for i in chosen], [references[i] for i in chosen], tokenize)
    groups[f"{low}+" if high is None else f"{low}-{high - 1}"] = {
        "sentences": len(chosen), "bleu": score.score,
        "length_ratio": score.sys_len / score.ref_len if score.ref_len else float("nan")}
  return groups


def confusion_counts(predictions, labels) -> dict[str, int]:
  """True/false positives/negatives of binary ``predictions`` against ``labels`` (1 = positive)."""
  predictions, labels = np.asarray(predictions) == POSITIVE_CLASS, np.asarray(labels) == POSITIVE_CLASS
  return {"tp": int(np.sum(predictions & labels)), "fp": int(np.sum(predictions & ~labels)),
          "fn": int(np.sum(~predictions & labels)), "tn": int(np.sum(~predictions & ~labels))}


def binary_metrics(counts: dict[str, int]) -> dict[str, float]:
  """Accuracy, and precision, recall and F1 of the positive class, from ``confusion_counts``; a ratio whose
  denominator is 0 is 0 (no positive predicted: precision 0)."""
  tp, fp, fn, tn = (counts[name] for name in ("tp", "fp", "fn", "tn"))

  def ratio(numerator, denominator):
    return numerator / denominator if denominator else 0.0

  return {"f1": ratio(2 * tp, 2 * tp + fp + fn), "precision": ratio(tp, tp + fp), "recall": ratio(tp, tp + fn),
          "accuracy": ratio(tp + tn, tp + fp + fn + tn)}


def f1_bootstrap_interval(predictions, labels, confidence: float = 0.95, samples: int = 2000,
                          seed: int = 0) -> tuple[float, float]:
  """The percentile bootstrap interval of F1 over the examples: how much the score would move on another test
  set of the same size from the same distribution (resampled with replacement, ``samples`` times)."""
  predictions, labels = np.asarray(predictions) == POSITIVE_CLASS, np.asarray(labels) == POSITIVE_CLASS
  if not len(labels):
    raise ValueError("f1_bootstrap_interval needs at least one example.")
  rows = np.random.default_rng(seed).integers(0, len(labels), size=(samples, len(labels)))
  tp = np.sum(predictions[rows] & labels[rows], axis=1)
  wrong = np.sum(predictions[rows] != labels[rows], axis=1)  # fp + fn
  f1 = np.where(2 * tp + wrong > 0, 2 * tp / np.maximum(2 * tp + wrong, 1), 0.0)
  tail = (1 - confidence) / 2 * 100
  low, high = np.percentile(f1, [tail, 100 - tail])
  return float(low), float(high)


def best_threshold(positive_probabilities, labels) -> float:
  """The threshold ``t`` that maximises F1 when ``probability >= t`` predicts the positive class: the midpoint
  below the best-scoring probability (0.5 when no threshold beats predicting none)."""
  probabilities = np.asarray(positive_probabilities, np.float64)
  positives = np.asarray(labels) == POSITIVE_CLASS
  order = np.argsort(-probabilities, kind="stable")
  true_positives = np.cumsum(positives[order])  # predicting the k + 1 most probable as positive
  predicted = np.arange(1, len(order) + 1)
  f1 = 2 * true_positives / (predicted + positives.sum())
  # Only the last of a run of equal probabilities is a threshold one can draw.
  distinct = np.append(probabilities[order][1:] != probabilities[order][:-1], True)
  if not len(order) or not np.any(distinct & (true_positives > 0)):
    return 0.5
  best = int(np.argmax(np.where(distinct, f1, -1.0)))
  below = probabilities[order][best + 1] if best + 1 < len(order) else 0.0
  return float((probabilities[order][best] + below) / 2)


def error_sums(predictions: np.ndarray, targets: np.ndarray,
               mask: np.ndarray) -> dict[str, np.ndarray]:
  """Per-horizon sums of absolute and squared errors over the entries where ``mask``.

  Sums add over batches (and devices); :func:`metrics_from_sums` divides once. Unmasked entries
  may hold anything, NaN included.

  Args:
    predictions, targets: ``[windows, num_horizons]``, in the unit the metrics are wanted in.
    mask: bool ``[windows, num_horizons]``.

  Returns:
    ``{"absolute_error": [H], "squared_error": [H], "count": [H]}``, float64.

  Raises:
    ValueError: a scored prediction or target is not finite.
  """
  mask = np.asarray(mask, bool)
  predictions = np.asarray(predictions, np.float64)
  targets = np.asarray(targets, np.float64)
  if not (np.all(np.isfinite(predictions[mask])) and np.all(np.isfinite(targets[mask]))):
    raise ValueError("error_sums: a prediction or target where mask is True is NaN or infinite.")
  errors = np.where(mask, predictions - targets, 0.0)
  return {"absolute_error": np.abs(errors).sum(axis=0),
          "squared_error": (errors ** 2).sum(axis=0),
          "count": mask.sum(axis=0).astype(np.float64)}


def metrics_from_sums(sums: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
  """``{"mae": [H], "rmse": [H], "count": [H]}`` from :func:`error_sums`' (summed) output.

  A horizon with nothing scored gets NaN.
  """
  count = np.asarray(sums["count"], np.float64)
  with np.errstate(invalid="ignore", divide="ignore"):
    mae = np.where(count > 0, sums["absolute_error"] / count, np.nan)
    rmse = np.where(count > 0, np.sqrt(sums["squared_error"] / count), np.nan)
  return {"mae": mae, "rmse": rmse, "count": count}


def forecast_metrics(predictions: np.ndarray, targets: np.ndarray,
                     mask: np.ndarray) -> dict[str, np.ndarray]:
  """MAE and RMSE per horizon over the entries where ``mask`` (shapes as :func:`error_sums`)."""
  return metrics_from_sums(error_sums(predictions, targets, mask))


__all__ = ["POSITIVE_CLASS", "REFERENCE_LENGTH_EDGES", "best_threshold", "binary_metrics", "bleu_by_reference_length",
           "confusion_counts", "corpus_bleu", "error_sums", "f1_bootstrap_interval", "forecast_metrics",
           "metrics_from_sums"]
