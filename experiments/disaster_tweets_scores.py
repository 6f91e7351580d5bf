"""Disaster Tweets' scores: each seed's probabilities of a run, the metrics the results page shows from them, and
the files that keep them beside the page (``predictions/<variant>.<split>.csv``), from which
``experiments.disaster_tweets_results.recompute`` (and ``python -m experiments.verify``) computes them again.
"""
from __future__ import annotations

import os

import numpy as np

from experiments import launching
from transformer import load, read_run_config
from transformer.tasks.classification import read_probabilities, write_probabilities
from transformer.tasks.metrics import (POSITIVE_CLASS, best_threshold, binary_metrics, confusion_counts,
                                       f1_bootstrap_interval)
from transformer.train.workdir import MetricsLog

METRICS = ("f1", "precision", "recall", "accuracy")
PREDICTIONS = "predictions"  # beside the page: <variant>.<split>.csv, each seed's probabilities
SPLITS = ("test", "validation")  # the test split scored; the validation split, on which thresholds are chosen


def score_run(workdir: str) -> dict:
  """Each seed's probabilities of "disaster" on the test and validation splits (every seed's best checkpoint,
  ``load(workdir, replica=i)``), what ``score_probabilities`` makes of them, and what its metrics.jsonl says."""
  config = read_run_config(workdir)
  splits = dict(zip(SPLITS, (config.task.test_split, config.task.eval_split)))
  probabilities = {name: {"seeds": []} for name in SPLITS}
  for replica in range(config.num_seeds):
    model = load(workdir, replica=replica)
    for name, split in splits.items():
      data = model.task.splits[split]
      probabilities[name].update(ids=data.ids, labels=data.labels)
      probabilities[name]["seeds"].append(
          model.task.split_probabilities(model.model_config, model.params, split)[:, POSITIVE_CLASS])
  metrics = launching.run_metrics(workdir)
  return {"config": config, "probabilities": probabilities, "step": model.step, "records": list(metrics.records),
          **score_probabilities(probabilities), "validation_f1": dict(metrics.values("eval/f1")).get(model.step),
          "last_step": metrics.last_step, "wall_seconds": metrics.progress[1]}


def log_values(log: MetricsLog) -> dict:
  """The row's values its training log gives, which ``experiments.verify`` recomputes from the committed log: the
  last step, the wall time, and the evaluation of best validation F1 (``config.best_metric``), whose step is the
  checkpoint the seeds were scored at (``chosen_step``, from the checkpoint itself) and its logged F1."""
  best = log.best("eval/f1")
  return {"steps": log.last_step, "wall_seconds": log.progress[1], "chosen_step": best["step"],
          "validation_f1": best["eval/f1"]}


def score_probabilities(probabilities: dict) -> dict:
  """Per seed, the test confusion counts and metrics ("disaster" where its probability is above 0.5), its
  validation F1 so (what chose the checkpoint), the threshold that maximises its validation F1 and the test
  metrics at that threshold (``tuned_``); and the
  seeds' mean probability as one model (what --mode=predict submits to Kaggle) with its F1's bootstrap
  interval. ``probabilities``: split (``SPLITS``) -> ``{"labels", "seeds": [float32 [n] per seed]}``."""
  test, validation = (probabilities[name] for name in SPLITS)
  seeds = []
  for test_seed, validation_seed in zip(test["seeds"], validation["seeds"]):
    counts = confusion_counts((test_seed > 0.5).astype(np.int32), test["labels"])
    threshold = best_threshold(validation_seed, validation["labels"])
    tuned = binary_metrics(confusion_counts((test_seed >= threshold).astype(np.int32), test["labels"]))
    validation_f1 = binary_metrics(confusion_counts((validation_seed > 0.5).astype(np.int32), validation["labels"]))
    seeds.append({**counts, **binary_metrics(counts), "threshold": threshold, "validation_f1": validation_f1["f1"],
                  **{f"tuned_{name}": value for name, value in tuned.items()}})
  ensemble_predictions = (np.mean(np.asarray(test["seeds"], np.float32), axis=0) > 0.5).astype(np.int32)
  ensemble = {**binary_metrics(confusion_counts(ensemble_predictions, test["labels"])),
              "f1_interval": f1_bootstrap_interval(ensemble_predictions, test["labels"])}
  return {"seeds": seeds, "ensemble": ensemble}


def predictions_path(folder: str, variant: str, split: str) -> str:
  return os.path.join(folder, PREDICTIONS, f"{variant}.{split}.csv")


def write_predictions(folder: str, variant: str, probabilities: dict) -> None:
  """``folder/predictions/<variant>.<split>.csv`` of each split (``classification.write_probabilities``)."""
  os.makedirs(os.path.join(folder, PREDICTIONS), exist_ok=True)
  for split, written in probabilities.items():
    write_probabilities(predictions_path(folder, variant, split), written["ids"], written["labels"],
                        written["seeds"])


def read_predictions(folder: str, variant: str) -> dict | None:
  """What ``write_predictions`` wrote (``score_probabilities``' argument, without ids); None if a file is missing."""
  paths = {split: predictions_path(folder, variant, split) for split in SPLITS}
  if not all(os.path.exists(path) for path in paths.values()):
    return None
  read = {split: read_probabilities(path) for split, path in paths.items()}
  return {split: {"labels": labels, "seeds": list(seeds)} for split, (_, labels, seeds) in read.items()}


def score_values(scored: dict) -> dict:
  """What the row's metric columns and its confusion matrix show, from ``score_probabilities``."""
  seeds = scored["seeds"]
  return {**{name: summary([s[name] for s in seeds]) for name in (*METRICS, "tuned_f1")},
          "threshold": float(np.mean([s["threshold"] for s in seeds])),
          "validation_f1": float(np.mean([s["validation_f1"] for s in seeds])),  # eval/f1: the seeds' mean
          "ensemble_f1": float(scored["ensemble"]["f1"]),
          "ensemble_interval": [float(bound) for bound in scored["ensemble"]["f1_interval"]],
          "confusion": {name: int(sum(s[name] for s in seeds)) for name in ("tn", "fp", "fn", "tp")}}


def summary(values) -> dict:
  """Mean and sample standard deviation over seeds (``std`` None for one seed), as a record keeps them."""
  return {"mean": float(np.mean(values)), "std": float(np.std(values, ddof=1)) if len(values) > 1 else None}
