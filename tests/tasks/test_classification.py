"""The classification task: F1, precision and recall against hand-worked counts, metrics of batches summed into
the metrics of the split, and the task end to end through ``run`` on a hand-made Kaggle CSV with a tiny random
BERT: pretrained weights in place (and kept when frozen), the test split scored, a valid Kaggle submission,
``load(...).classify``, and the missing model folder as one clear error."""
from __future__ import annotations

import csv
import dataclasses
import hashlib
import os
import shutil

import jax
import numpy as np
import pytest

from experiments import disaster_tweets as experiment, disaster_tweets_results
from tests.pretrained.tiny_bert import write_tiny_bert
from transformer import load
from transformer.data.classification import fixed_batches
from transformer.errors import MissingDataError
from transformer.nn import EncoderClassifier, unboxed
from transformer.train.config import build_task
from transformer.tasks.classification import read_probabilities
from transformer.tasks.metrics import binary_metrics, confusion_counts
from transformer.train import run
from transformer.train.workdir import read_metrics

# Disaster tweets mention fire, flood, burn or rain; the others do not (words of the tiny BERT's vocabulary).
DISASTER = ["fire near the road", "flood on the river", "big fire !", "the river is burning", "rain and flood",
            "a fire is on the road", "burn , burn", "floods near a small road", "big rain on the river",
            "fire fire"]
CALM = ["the road is big", "a small river", "the river is small .", "big road , small road", "a road",
        "on the road", "the big river is near", "small roads", "near a river", "the road is on a river",
        "a big river", "the small road ."]
TEST_TWEETS = {7: "fire on the river", 8: "a small road", 11: "the flood is near", 12: "big roads ."}


def write_csv(path, header, rows):
  with open(path, "w", newline="", encoding="utf-8") as file:
    writer = csv.writer(file, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)


def write_tweets(source) -> None:
  """The hand-made Disaster Tweets set in its CSV layout: ``train.csv`` (each tweet twice, labelled) and
  ``test.csv`` (``TEST_TWEETS``), in the folder ``source``."""
  rows = [[index + 100, "", "", text, label]
          for index, (text, label) in enumerate([(t, 1) for t in DISASTER] * 2 + [(t, 0) for t in CALM] * 2)]
  write_csv(source / "train.csv", ["id", "keyword", "location", "text", "target"], rows)
  write_csv(source / "test.csv", ["id", "keyword", "location", "text"],
            [[tweet_id, "", "", text] for tweet_id, text in TEST_TWEETS.items()])


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
  """``(config, paths)``: the experiment's ``tiny`` variant on a hand-made CSV and a tiny random BERT."""
  root = tmp_path_factory.mktemp("classification")
  source = root / "raw"
  source.mkdir()
  write_tweets(source)
  _, tensors = write_tiny_bert(root / "bert")
  config = experiment.get_config("tiny")
  config.task.update({"source_dir": str(source), "data_dir": str(root / "tfds"), "pretrained_dir": str(root / "bert"),
                      "max_length": 12})
  config.update({"batch_size": 8, "eval_batch_size": 4, "num_seeds": 2, "num_train_steps": 6, "eval_every": 3,
                 "checkpoint_every": 3, "log_every": 3, "quiet": True, "tensorboard": False})
  config.optimizer.learning_rate = 0.05
  return config, root, tensors


@pytest.mark.slow
def test_summed_batch_metrics_are_the_metrics_of_the_split(tiny):
  config, _, _ = tiny
  config = config.copy_and_resolve_references()
  config.num_seeds = 1
  task = build_task(config)
  model_config = task.model_config()
  model = EncoderClassifier(model_config.replace(deterministic=True))
  data = task.splits["train"]
  params = unboxed(model.init(jax.random.PRNGKey(3), data.tokens[:2])["params"])
  # A bias between the two middle margins splits the predictions between the classes, so no ratio below is
  # empty, and leaves no example on the boundary, where batching's rounding could flip its prediction.
  logits = np.asarray(model.apply({"params": params}, data.tokens))
  margins = np.unique(logits[:, 1] - logits[:, 0])  # sorted; the data repeat some texts
  middle = len(margins) // 2
  params["classifier"]["bias"] = params["classifier"]["bias"].at[1].add(-(margins[middle - 1] + margins[middle]) / 2)
  batches = fixed_batches(data.tokens, data.labels, 5)  # the last batch carries zero-weight padding rows
  sums = {}
  for batch in batches:
    _, _, metrics = task.loss_and_metrics(model, params, batch, None)
    for name, (total, weight) in metrics.items():
      sums[name] = sums.get(name, 0.0) + np.asarray([total, weight], np.float64)
  predictions = np.asarray(model.apply({"params": params}, data.tokens)).argmax(-1)
  expected = binary_metrics(confusion_counts(predictions, data.labels))
  counts = confusion_counts(predictions, data.labels)
  assert counts["tp"] and counts["fp"] + counts["fn"]  # neither an empty nor a perfect score
  for name in ("f1", "precision", "recall", "accuracy"):
    assert sums[name][0] / sums[name][1] == pytest.approx(expected[name]), name


def test_data_fingerprint_is_the_size_and_sha256_of_the_raw_files(tiny):
  """What a run records of its data (``Task.data_fingerprint``): the bytes of both CSV files it was prepared from."""
  config, root, _ = tiny
  expected = {}
  for name in ("test.csv", "train.csv"):
    data = (root / "raw" / name).read_bytes()
    expected[f"disaster_tweets/{name}"] = f"size={len(data)} sha256={hashlib.sha256(data).hexdigest()}"
  assert build_task(config.copy_and_resolve_references()).data_fingerprint() == expected


def test_classify_names_each_label_and_still_unpacks_as_a_pair(tiny):
  """``classify`` gave class ids only; its pair now also names them (``disaster``), and unpacks as before."""
  config = tiny[0].copy_and_resolve_references()
  config.num_seeds = 1
  task = build_task(config)
  model_config = task.model_config()
  params = unboxed(EncoderClassifier(model_config).init(jax.random.key(0), np.ones((1, 8), np.int32))["params"])
  params["classifier"]["bias"] = np.array([0.0, 50.0], np.float32)  # every text a disaster
  classified = task.classify_texts(model_config, params, ["forest fire near the town", "a calm day"])
  labels, probabilities = classified
  assert task.label_names == ("not_disaster", "disaster")
  assert classified.names == ["disaster", "disaster"] and labels.tolist() == [1, 1]
  assert classified.labels is labels and classified.probabilities is probabilities and probabilities.shape == (2, 2)


def _param(tree, path):
  for key in path.split("/"):
    tree = tree[key]
  return np.asarray(tree)


@pytest.mark.slow
@pytest.mark.parametrize("init", ["embedding", "encoder"])
def test_train_eval_predict_and_classify_end_to_end(tiny, tmp_path, init):
  config, _, tensors = tiny
  config = config.copy_and_resolve_references()
  config.task.pretrained_init = init
  frozen = init == "embedding"
  if frozen:
    config.optimizer.frozen_params = ("encoder/embedding",)
  else:  # the whole tiny BERT, fine-tuned
    config.model.dropout_rate = 0.0
  workdir = str(tmp_path / init)
  output = run(config, workdir)
  evaluations = [record for record in read_metrics(workdir) if "eval/f1" in record]
  assert [record["step"] for record in evaluations] == [3, 6]
  assert all(0.0 <= record[f"eval/{name}/seed_1"] <= 1.0 for record in evaluations
             for name in ("f1", "precision", "recall", "accuracy"))

  table = tensors["embeddings.word_embeddings.weight"]
  final = output.state.params  # [seeds, ...]
  embedding = _param(final, "encoder/embedding/embedding")
  if frozen:  # both seeds still hold the pretrained table exactly; their heads trained apart
    np.testing.assert_array_equal(embedding, np.broadcast_to(table, embedding.shape))
    kernel = _param(final, "classifier/kernel")
    assert not np.allclose(kernel[0], kernel[1])
  else:  # started from the checkpoint (close to it after 6 small steps), then trained
    assert not np.array_equal(embedding[0], table)
    assert np.abs(embedding[0] - table).max() < 0.5 * np.abs(table).max()

  evaluated = run(config, workdir, mode="eval").metrics
  for name in ("f1", "precision", "recall", "accuracy"):
    assert 0.0 <= evaluated[f"test/{name}/seed_0"] <= 1.0
  assert sum(evaluated[f"test/{name}/seed_0"] for name in ("tp", "fp", "fn", "tn")) == 4  # 10% of each class
  # Every seed's probabilities of the test and eval splits, beside the checkpoints: the test metrics again.
  ids, labels, probabilities = read_probabilities(f"{workdir}/test_predictions.csv")
  assert len(ids) == 4 and probabilities.shape == (config.num_seeds, 4)
  for index, seed in enumerate(probabilities):
    counts = confusion_counts((seed > 0.5).astype(np.int32), labels)
    assert {name: evaluated[f"test/{name}/seed_{index}"] for name in counts} == counts
  assert read_probabilities(f"{workdir}/validation_predictions.csv")[2].shape[0] == config.num_seeds
  # The seeds as one model: the argmax of their mean probability, each seed loaded on its own.
  seeds = [load(workdir, replica=i) for i in range(config.num_seeds)]
  mean = np.mean([seed.task.split_probabilities(seed.model_config, seed.params, "test") for seed in seeds], axis=0)
  expected = confusion_counts(mean.argmax(-1), seeds[0].task.splits["test"].labels)
  assert {name: evaluated[f"test/ensemble/{name}"] for name in expected} == expected
  assert evaluated["test/ensemble/f1"] == pytest.approx(binary_metrics(expected)["f1"])
  scored = disaster_tweets_results.score_run(workdir)  # the results page's path to the same numbers
  assert scored["ensemble"]["f1"] == pytest.approx(evaluated["test/ensemble/f1"])
  assert [seed["f1"] for seed in scored["seeds"]] == pytest.approx(
      [evaluated[f"test/f1/seed_{i}"] for i in range(config.num_seeds)])

  run(config, workdir, mode="predict")
  with open(f"{workdir}/submission.csv", newline="") as file:
    submission = list(csv.reader(file))
  assert submission[0] == ["id", "target"]
  assert [int(row[0]) for row in submission[1:]] == list(TEST_TWEETS)
  assert {row[1] for row in submission[1:]} <= {"0", "1"}

  model = load(workdir, replica=1)
  texts = list(TEST_TWEETS.values()) + ["fire", ""]
  labels, probabilities = classified = model.classify(texts)
  assert labels.shape == (6,) and probabilities.shape == (6, 2)
  assert classified.names == [("not_disaster", "disaster")[label] for label in labels]
  with pytest.raises(ValueError, match="classify takes a list of texts, got one string 'fire'"):
    model.classify("fire")  # once one label per character
  np.testing.assert_allclose(probabilities.sum(-1), 1.0, rtol=1e-5)
  # The same as the module applied to the tokenizer's ids of one text at a time (no padding).
  classifier = EncoderClassifier(dataclasses.replace(model.model_config, deterministic=True))
  for text, label, probability in zip(texts, labels, probabilities):
    tokens = model.task.tokenizer.encode(text)[None]
    expected = jax.nn.softmax(classifier.apply({"params": model.params}, tokens))[0]
    np.testing.assert_allclose(probability, expected, rtol=1e-4, atol=1e-6)
    assert label == int(np.argmax(expected))


def test_a_run_keeps_the_pretrained_text_files_and_loads_without_the_folder(tiny, tmp_path, monkeypatch):
  """The tiny variant (trained from scratch, reading text with the pretrained model's tokenizer) trained with
  $TRANSFORMER_MODELS_DIR loads and classifies without it: the run keeps the folder's config.json and
  tokenizer.json. A run that kept none (trained before they were kept) still loads with the folder."""
  config, root, _ = tiny
  config = config.copy_and_resolve_references()
  config.task.pretrained_dir = ""
  config.update({"num_seeds": 1, "num_train_steps": 3})
  models = tmp_path / "models"
  shutil.copytree(root / "bert", models / config.task.pretrained_model)
  monkeypatch.setenv("TRANSFORMER_MODELS_DIR", str(models))
  workdir = str(tmp_path / "run")
  run(config, workdir)
  assert sorted(name.split(".")[0] for name in os.listdir(f"{workdir}/tokenizers")) == ["config", "tokenizer"]
  texts = ["fire near the road", "a small river"]
  expected = load(workdir).classify(texts).probabilities

  shutil.move(str(models), str(tmp_path / "elsewhere"))
  monkeypatch.delenv("TRANSFORMER_MODELS_DIR")
  np.testing.assert_array_equal(load(workdir).classify(texts).probabilities, expected)

  shutil.rmtree(f"{workdir}/tokenizers")  # a run from before
  with pytest.raises(MissingDataError, match="TRANSFORMER_MODELS_DIR is unset"):
    load(workdir)
  shutil.move(str(tmp_path / "elsewhere"), str(models))
  monkeypatch.setenv("TRANSFORMER_MODELS_DIR", str(models))
  np.testing.assert_array_equal(load(workdir).classify(texts).probabilities, expected)


def test_a_missing_model_folder_names_where_to_get_the_model(tiny, monkeypatch):
  config, root, _ = tiny
  config = config.copy_and_resolve_references()
  config.task.pretrained_dir = ""
  monkeypatch.delenv("TRANSFORMER_MODELS_DIR", raising=False)
  with pytest.raises(MissingDataError, match="sentence-transformers/all-MiniLM-L6-v2"):
    build_task(config).model_config()
  config.task.pretrained_dir = str(root / "nowhere")
  with pytest.raises(MissingDataError, match="nowhere does not exist.*sentence-transformers/all-MiniLM-L6-v2"):
    build_task(config).model_config()
