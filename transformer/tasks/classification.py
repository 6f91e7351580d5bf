"""Text classification (Kaggle's Disaster Tweets) with an ``EncoderClassifier``: from scratch or from BERT.

Texts are tokenised by a pretrained model's own WordPiece tokenizer (``tokenizer.json`` of
``config.task.pretrained_dir``), for every variant, so the models differ only in what they learn. A run keeps
copies of that ``tokenizer.json`` and of the model's ``config.json`` (``WORKDIR/tokenizers/``), so that
``transformer.load`` classifies with no pretrained folder at hand.
``config.task.pretrained_init`` says what starts from the checkpoint:

- ``"none"``: nothing; ``config.model`` is the whole model (its ``vocab_size`` and ``pad_id`` are the
  tokenizer's).
- ``"embedding"``: the token table (``encoder/embedding``); ``d_model`` is the checkpoint's, the rest
  ``config.model`` (e.g. no layers: mean-pooled embeddings and a linear head). Freeze the table with
  ``config.optimizer.frozen_params=("encoder/embedding",)``.
- ``"encoder"``: the whole BERT encoder; its architecture is the checkpoint's (``config.json``), and
  ``config.model`` gives only the head and the training fields (``HEAD_FIELDS``).

``config.task``: ``transformer.tasks.configs.ClassificationConfig`` (the data set, the pretrained model and what
starts from it, the text length and length buckets, the splits).

Batches: ``{"tokens": int32 [batch, length], "label": int32 [batch], "weight": float32 [batch]}`` (weight 0 marks
padding rows). Metrics are sums over examples, so they are exact over the whole split (and per seed when
seeds are vmapped): ``accuracy``, and for class 1 (``disaster``) ``f1``, ``precision`` and ``recall``.
"""
from __future__ import annotations

import csv
import dataclasses
import functools
import os

import jax
import jax.numpy as jnp
import numpy as np

from transformer import ops
from transformer.data.classification import ShuffledBatches, fixed_batches
from transformer.data.files import KeptFile, replacing, write_atomically
from transformer.errors import ConfigError, MissingDataError
from transformer.nn import ClassifierConfig, EncoderClassifier, split_rows
from transformer.tasks.base import Task
from transformer.tasks.configs import ClassificationConfig
from transformer.tasks.metrics import POSITIVE_CLASS, binary_metrics, confusion_counts

MODEL_NAME = "encoder_classifier"
MODELS_ENV_VAR = "TRANSFORMER_MODELS_DIR"
# Where the default checkpoint comes from, for the message when it is absent.
HUGGING_FACE_IDS = {"all-MiniLM-L6-v2": "sentence-transformers/all-MiniLM-L6-v2"}
# config.model fields a pretrained encoder takes from the config (the rest are the checkpoint's).
HEAD_FIELDS = ("num_classes", "pooling", "dropout_rate", "attention_dropout_rate", "feed_forward_dropout_rate",
               "dtype", "attention_implementation", "attention_chunk_size", "float32_attention_logits", "remat")
# The pretrained folder's files that reading text needs (name -> file): kept in the run's record, a run's own copies
# let a loaded run classify without the folder (``ClassificationTask.use_recorded_tokenizers``).
TEXT_FILES = {"config": "config.json", "tokenizer": "tokenizer.json"}
SUBMISSION_FILE = "submission.csv"
PROBABILITIES_FILE = "{split}_predictions.csv"  # what --mode=eval writes per split: see write_probabilities
LENGTH_MULTIPLE = 8  # texts classified outside the data sets are padded to a multiple of this (fewer shapes)


def model_dir(task_config) -> str:
  """The pretrained model folder: ``config.task.pretrained_dir``, else ``$TRANSFORMER_MODELS_DIR/<name>``.

  Raises:
    MissingDataError: neither is set, or the folder is absent (naming where to download the model).
  """
  name = task_config.pretrained_model
  where = HUGGING_FACE_IDS.get(name, name)
  hint = (f"download the Hugging Face model {where} (config.json, model.safetensors, tokenizer.json) and set "
          f"--config.task.pretrained_dir=FOLDER or ${MODELS_ENV_VAR} to the folder holding {name}/.")
  folder = task_config.pretrained_dir or (os.path.join(os.environ[MODELS_ENV_VAR], name)
                                          if os.environ.get(MODELS_ENV_VAR) else "")
  if not folder:
    raise MissingDataError(f"no pretrained model folder: config.task.pretrained_dir is empty and "
                           f"${MODELS_ENV_VAR} is unset; {hint}")
  if not os.path.isdir(folder):
    raise MissingDataError(f"the pretrained model folder {folder} does not exist; {hint}")
  return folder


class Classification(tuple):
  """What ``classify`` returns: the pair ``(labels int32 [n], probabilities float32 [n, num_classes])``, unpacked
  as before label names were added, with ``labels``, ``probabilities`` and ``names`` (each text's label name,
  e.g. ``"disaster"``) by name."""

  def __new__(cls, labels: np.ndarray, probabilities: np.ndarray, label_names: tuple[str, ...]):
    classified = super().__new__(cls, (labels, probabilities))
    classified.names = [label_names[label] for label in labels.tolist()]
    return classified

  @property
  def labels(self) -> np.ndarray:
    return self[0]

  @property
  def probabilities(self) -> np.ndarray:
    return self[1]


@dataclasses.dataclass
class Split:
  """One split, tokenised: ``tokens`` int32 ``[n, length]``, ``labels`` int32 ``[n]`` (-1 unknown), ``ids``."""
  ids: np.ndarray
  texts: list[str]
  tokens: np.ndarray
  labels: np.ndarray


class ClassificationTask(Task):
  """Sequence classification with cross entropy; see the module docstring for ``config.task``."""
  task_config_class = ClassificationConfig
  task_config: ClassificationConfig

  def __init__(self, settings):
    super().__init__(settings)
    if settings.model_name != MODEL_NAME:
      raise ConfigError(f"config.model_name={settings.model_name!r}: the classification task trains "
                        f"{MODEL_NAME!r}.")

  _kept: dict = {}  # name (of TEXT_FILES) -> the run's copy of the file, set by use_recorded_tokenizers

  def use_recorded_tokenizers(self, paths: dict[str, str]) -> None:
    """Read text with the run's own copies of the pretrained folder's ``config.json`` and ``tokenizer.json``
    (``WORKDIR/tokenizers/``, ``trained_tokenizers``): a loaded run then needs no pretrained folder. A run that
    kept none (trained before they were kept) reads the folder."""
    if set(TEXT_FILES) <= set(paths):
      self._kept = {name: paths[name] for name in TEXT_FILES}
      self.__dict__.pop("text_side", None)

  def _text_paths(self) -> dict[str, str]:
    """name (of ``TEXT_FILES``) -> the file read: the run's copy, else the pretrained folder's."""
    if self._kept:
      return self._kept
    from transformer.pretrained.bert import check_model_dir  # imports safetensors
    folder = check_model_dir(model_dir(self.task_config))
    return {name: os.path.join(folder, file) for name, file in TEXT_FILES.items()}

  def trained_tokenizers(self) -> dict:
    """The pretrained folder's ``config.json`` and ``tokenizer.json`` (``TEXT_FILES``), which every variant reads
    text with: a run keeps copies of them and refuses to resume or load with different ones."""
    return {name: KeptFile.read(path) for name, path in self._text_paths().items()}

  @functools.cached_property
  def text_side(self):
    """``(encoder ModelConfig, tokenizer)`` of the pretrained model (``load_bert_text``): no weights read."""
    from transformer.pretrained import load_bert_text  # imports tokenizers
    paths = self._text_paths()
    return load_bert_text(paths["config"], paths["tokenizer"], max_length=self.task_config.max_length)

  @property
  def tokenizer(self):
    return self.text_side[1]

  def model_config(self) -> ClassifierConfig:
    encoder_config, tokenizer = self.text_side
    model, init = self.settings.model, self.task_config.pretrained_init
    if init == "encoder":
      return ClassifierConfig.from_encoder(encoder_config, **{name: getattr(model, name) for name in HEAD_FIELDS})
    fields = {"vocab_size": encoder_config.vocab_size, "pad_id": tokenizer.pad_id}
    if init == "embedding":
      fields["d_model"] = encoder_config.d_model
    config = model.replace(**fields)
    if config.positional_encoding == "learned" and config.max_length < self.task_config.max_length:
      raise ConfigError(f"config.model.max_length={config.max_length} is below config.task.max_length="
                        f"{self.task_config.max_length}; the position table needs a row per token.")
    return config

  def build_model(self, model_config) -> EncoderClassifier:
    return EncoderClassifier(model_config)

  def pretrained_params(self) -> dict:
    """What ``pretrained_init`` takes from the checkpoint (the loop puts it in place of fresh parameters)."""
    init = self.task_config.pretrained_init
    if init == "none":
      return {}
    from transformer.pretrained import load_bert  # imports safetensors and tokenizers
    encoder_params = load_bert(model_dir(self.task_config), max_length=self.task_config.max_length)[1]
    if init == "encoder":
      return {"encoder": encoder_params}
    return {"encoder": {"embedding": encoder_params["embedding"]}}  # "embedding"

  # ----- data

  @functools.cached_property
  def _prepared_data(self):
    """The prepared TFDS builder of ``config.task.dataset`` (``disaster_tweets``, the one data set of
    ``configs.CLASSIFICATION_DATASETS``; prepared on first use; refused when its raw files changed since, see
    ``transformer.data.source_files``)."""
    from transformer.data import disaster_tweets  # TFDS: the "data" extra
    task = self.task_config
    builder = disaster_tweets.Builder(data_dir=task.data_dir or None, file_format="array_record",
                                      source_dir=task.source_dir or None)
    builder.download_and_prepare()
    return builder

  def prepare_data(self, training: bool = True) -> None:
    del training  # the prepared data set is all there is
    self._prepared_data  # pylint: disable=pointless-statement

  def data_fingerprint(self) -> dict[str, str]:
    """``"disaster_tweets/<file>"`` -> size and SHA-256 of the raw files the prepared data was built from
    (``transformer.data.source_files.data_fingerprint``): a run records it and compares it at eval."""
    from transformer.data import source_files
    return source_files.data_fingerprint(self._prepared_data)

  @functools.cached_property
  def splits(self) -> dict[str, Split]:
    """Every split of the data set, tokenised and padded to one length (the longest text of all)."""
    from transformer.data.parallel_text import read_prepared_split  # TFDS: the "data" extra
    builder = self._prepared_data
    raw = {}
    for split in builder.info.splits:
      rows = read_prepared_split(builder, split)
      raw[split] = ([int(row["id"]) for row in rows], [row["text"].decode("utf-8") for row in rows],
                    [int(row["label"]) for row in rows])
    encoded = {split: self.tokenizer.encode_batch(texts) for split, (_, texts, _) in raw.items()}
    length = max(len(tokens) for split_tokens in encoded.values() for tokens in split_tokens)
    from transformer.pretrained import pad_batch
    return {split: Split(np.asarray(ids, np.int64), texts, pad_batch(encoded[split], self.tokenizer.pad_id, length),
                         np.asarray(labels, np.int32))
            for split, (ids, texts, labels) in raw.items()}

  def train_iterator(self, batch_size, seed):
    train = self.splits["train"]
    return ShuffledBatches(train.tokens, train.labels, batch_size, seed, self.tokenizer.pad_id,
                           self.task_config.bucket_length_multiple)

  def eval_batches(self, batch_size, split: str | None = None):
    data = self.splits[split or self.task_config.eval_split]
    return fixed_batches(data.tokens, data.labels, batch_size)

  def init_inputs(self, batch):
    return (batch["tokens"],)

  def placeholder_inputs(self):
    # Parameter shapes do not depend on the text length: no data needs reading to restore a checkpoint.
    return (np.ones((1, 2), np.int32),)

  # ----- loss and metrics

  def loss_and_metrics(self, model, params, batch, dropout_rng, label_smoothing=None):
    logits = model.apply({"params": params}, batch["tokens"],
                         rngs={"dropout": dropout_rng} if dropout_rng is not None else None)
    weights = batch["weight"]
    labels = batch["label"]
    losses = ops.softmax_cross_entropy(logits, labels, self.label_smoothing(label_smoothing))
    loss_sum, weight_sum = ops.weighted_sum(losses, weights)
    predicted = jnp.argmax(logits, axis=-1)
    # Each metric is a ratio of sums over examples, so summing over batches (and not averaging) is exact.
    true_positive = jnp.sum(weights * ((predicted == POSITIVE_CLASS) & (labels == POSITIVE_CLASS)))
    predicted_positive = jnp.sum(weights * (predicted == POSITIVE_CLASS))
    actual_positive = jnp.sum(weights * (labels == POSITIVE_CLASS))
    metrics = {
        "loss": (loss_sum, weight_sum),
        "accuracy": (jnp.sum(weights * (predicted == labels)), weight_sum),
        "f1": (2 * true_positive, predicted_positive + actual_positive),
        "precision": (true_positive, predicted_positive),
        "recall": (true_positive, actual_positive),
    }
    return loss_sum, weight_sum, metrics

  # ----- inference

  def probabilities(self, model_config, params, tokens: np.ndarray) -> np.ndarray:
    """float32 ``[n, num_classes]`` class probabilities of ``[n, length]`` token ids (any ``n``), in batches of
    ``config.eval_batch_size``. ``params``: one model's parameters."""
    batch_size = self.settings.eval_batch_size
    predict = _probability_function(model_config.replace(deterministic=True))
    outputs = []
    for start in range(0, len(tokens), batch_size):
      chunk = tokens[start:start + batch_size]
      padded = np.concatenate([chunk, np.zeros((batch_size - len(chunk), chunk.shape[1]), chunk.dtype)])
      outputs.append(np.asarray(predict(params, padded))[:len(chunk)])
    if not outputs:
      return np.zeros((0, model_config.num_classes), np.float32)
    return np.concatenate(outputs)

  @property
  def label_names(self) -> tuple[str, ...]:
    """The name of each class id, from the data set's builder (nothing is read): ``not_disaster``, ``disaster``."""
    from transformer.data import disaster_tweets  # TFDS: the "data" extra; the one data set of the task
    return tuple(disaster_tweets.LABEL_NAMES)

  def classify_texts(self, model_config, params, texts: list[str]) -> Classification:
    """``(labels int32 [n], probabilities float32 [n, num_classes])`` of raw texts, with ``.names``: each text's
    label name (``label_names``)."""
    texts = list(texts)
    if any(not isinstance(text, str) for text in texts):
      raise TypeError("classify takes a list of strings (one text each).")
    encoded = self.tokenizer.encode_batch(texts)
    longest = max((len(tokens) for tokens in encoded), default=1)
    from transformer.pretrained import pad_batch
    tokens = pad_batch(encoded, self.tokenizer.pad_id, -(-longest // LENGTH_MULTIPLE) * LENGTH_MULTIPLE)
    probabilities = self.probabilities(model_config, params, tokens)
    return Classification(probabilities.argmax(-1).astype(np.int32), probabilities, self.label_names)

  def split_counts(self, model_config, params, split: str, threshold: float | None = None) -> dict[str, int]:
    """``confusion_counts`` of the model's predictions on a labelled split (e.g. ``"test"``): the most probable
    class, or with ``threshold`` the positive class where its probability is at least that."""
    probabilities = self.split_probabilities(model_config, params, split)
    predictions = (probabilities.argmax(-1) if threshold is None
                   else (probabilities[:, POSITIVE_CLASS] >= threshold).astype(np.int32))
    return confusion_counts(predictions, self.splits[split].labels)

  def split_probabilities(self, model_config, params, split: str) -> np.ndarray:
    """float32 ``[n, num_classes]``: the class probabilities of a split's examples, in its order."""
    return self.probabilities(model_config, params, self.splits[split].tokens)

  def ensemble_probabilities(self, model_config, params, tokens: np.ndarray) -> np.ndarray:
    """float32 ``[n, num_classes]``: the mean over the seeds of a vmapped run (``params`` with a replica axis)
    of each seed's class probabilities; one seed's own for a run of one."""
    return np.mean([self.probabilities(model_config, replica, tokens) for replica in replica_params(params)],
                   axis=0)

  def write_test_outputs(self, model_config, params, output_dir, eval_metrics):
    """``--mode=eval``: the test split's confusion counts and metrics (a vmapped run: their mean over seeds, each
    seed's under ``<name>/seed_i``, and the seeds' mean probability's under ``ensemble/<name>``); each seed's
    probabilities of the test and the eval split written as ``<split>_predictions.csv`` (``write_probabilities``),
    what a threshold chosen on the eval split and the test metrics can be computed again from."""
    del eval_metrics
    test, replicas = self.task_config.test_split, replica_params(params)
    probabilities = {split: [self.probabilities(model_config, replica, self.splits[split].tokens)
                             for replica in replicas]
                     for split in dict.fromkeys((test, self.task_config.eval_split))}
    for split, seeds in probabilities.items():
      write_probabilities(os.path.join(output_dir, PROBABILITIES_FILE.format(split=split)), self.splits[split].ids,
                          self.splits[split].labels, [seed[:, POSITIVE_CLASS] for seed in seeds])
    labels = self.splits[test].labels
    per_seed = [{**counts, **binary_metrics(counts)}
                for counts in (confusion_counts(seed.argmax(-1), labels) for seed in probabilities[test])]
    if len(replicas) == 1:
      return {test: per_seed[0]}
    # As the eval metrics of a vmapped run: the mean over seeds, and each seed's under /seed_i.
    results = {name: float(np.mean([seed[name] for seed in per_seed])) for name in per_seed[0]}
    results.update({f"{name}/seed_{index}": value for index, seed in enumerate(per_seed)
                    for name, value in seed.items()})
    # The seeds as one model (their mean probability), the predictor that --mode=predict submits.
    counts = confusion_counts(np.mean(probabilities[test], axis=0).argmax(-1), labels)
    results.update({f"ensemble/{name}": value for name, value in {**counts, **binary_metrics(counts)}.items()})
    return {test: results}

  def write_predictions(self, model_config, params, output_dir) -> str:
    """``--mode=predict``: Kaggle's ``submission.csv`` (``id,target``) for every tweet of ``test.csv``; the
    replicas of a vmapped run vote by their mean probability."""
    data = self.splits["kaggle_test"]
    probabilities = self.ensemble_probabilities(model_config, params, data.tokens)
    path = os.path.join(output_dir, SUBMISSION_FILE)
    _write_rows(path, ["id", "target"], zip(data.ids, probabilities.argmax(-1)))
    return path


def replica_params(params) -> list:
  """The parameter trees of each seed: ``params`` of a ``num_seeds > 1`` run carry a leading replica axis
  (the classifier's kernel, ``[d_model, num_classes]`` alone, then has three axes)."""
  if np.ndim(params["classifier"]["kernel"]) == 2:
    return [params]
  count = np.shape(params["classifier"]["kernel"])[0]
  return [jax.tree.map(lambda leaf, i=i: leaf[i], params) for i in range(count)]


@functools.lru_cache(maxsize=8)
def _probability_function(model_config):
  model = EncoderClassifier(model_config)
  return jax.jit(lambda params, tokens: split_rows(
      lambda rows: jax.nn.softmax(model.apply({"params": params}, rows), axis=-1), tokens))


def write_probabilities(path: str, ids, labels, seeds: list[np.ndarray]) -> None:
  """A CSV of one split: per example its ``id``, ``target`` (its label) and each seed's probability of class 1
  (``seed_0``, ...), then ``ensemble``, the seeds' mean. Probabilities are float32, written with the 9 significant
  digits that give each back exactly (``read_probabilities``), so that metrics computed again from the file
  are those of the run."""
  seeds = np.asarray(seeds, np.float32)  # [seeds, examples]
  ensemble = np.mean(seeds, axis=0)
  lines = [",".join(["id", "target", *(f"seed_{index}" for index in range(len(seeds))), "ensemble"])]
  for row, (example_id, label) in enumerate(zip(ids, labels)):
    lines.append(",".join([str(int(example_id)), str(int(label)),
                           *(f"{value:.9g}" for value in (*seeds[:, row], ensemble[row]))]))
  write_atomically(path, "\n".join(lines) + "\n")


def read_probabilities(path: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """``(ids int64 [n], labels int32 [n], seeds float32 [num_seeds, n])`` of a ``write_probabilities`` file (the
  ensemble column is the seeds' mean, left out)."""
  with open(path, encoding="utf-8", newline="") as f:
    rows = list(csv.reader(f))
  header = rows[0] if rows else []
  if header[:2] != ["id", "target"] or header[-1:] != ["ensemble"] or len(header) < 4:
    raise ValueError(f"{path} is not a file of per-seed probabilities: its header should be "
                     f"'id,target,seed_0,...,ensemble', found {','.join(header)!r}.")
  table = np.array(rows[1:], dtype=object).reshape(-1, len(header))
  seeds = table[:, 2:-1].astype(np.float64).astype(np.float32).T
  return table[:, 0].astype(np.int64), table[:, 1].astype(np.int32), seeds


def _write_rows(path, header, rows):
  with replacing(path, newline="", encoding="utf-8") as file:  # a full disk midway keeps the old file whole
    writer = csv.writer(file, lineterminator="\n")
    writer.writerow(header)
    writer.writerows([[int(value) if isinstance(value, (np.integer, int)) else float(value) for value in row]
                      for row in rows])
