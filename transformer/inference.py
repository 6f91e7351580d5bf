"""The one public way to get a trained model back and use it, from a notebook or a script:

    from transformer import load
    model = load("runs/m30k")                        # a Translator: config, tokenizer, best parameters
    model.translate(["A man rides a bike ."])         # also model.decode(...), .score(...), .attention_weights(...)
    load("runs/tweets").classify(["Forest fire near La Ronge"]).names  # a Classifier: ["disaster"]

``load`` returns the model type of the run's task, with only that task's methods: ``SequenceModel`` (token ids
in and out: the synthetic tasks), ``Translator`` (text), ``Classifier``, ``Forecaster``, ``LanguageModel``.
A method another type has fails at once, naming the type and what it offers.
"""
from __future__ import annotations

from typing import Any

import ml_collections
import numpy as np

from transformer.errors import ConfigError
from transformer.train.config import RunConfig
from transformer.train import LoadedParams, load_params, read_run_config


class TrainedModel:
  """A trained model: its run's ``run_config`` (``RunConfig``), ``model_config``, ``params`` (host arrays) and ``task``.

  Attributes:
    steps: the restored step, or the averaged steps (oldest first); ``step`` is the newest of them.
    workdir: the run's directory.
  """

  def __init__(self, loaded: LoadedParams, workdir: str):
    self.run_config: RunConfig = loaded.run_config
    self.model_config = loaded.model_config
    self.params: Any = loaded.params
    self.task = loaded.task
    self.steps: list[int] = loaded.steps
    self.workdir = workdir

  @property
  def step(self) -> int:
    return self.steps[-1]

  def __repr__(self) -> str:
    return (f"{type(self).__name__}({self.workdir!r}, task={self.run_config.task.name!r}, "
            f"{type(self.model_config).__name__}, steps={self.steps})")

  def __getattr__(self, name: str):  # only for names the instance lacks: a method of another model type
    offered = {kind.__name__: kind.METHODS for kind in MODEL_TYPES.values()}
    if "run_config" in self.__dict__ and any(name in methods for methods in offered.values()):
      raise AttributeError(f"a {type(self).__name__} (the run in {self.__dict__.get('workdir')!r} trained "
                           f"config.task.name={self.run_config.task.name!r}) has no {name}; it offers "
                           f"{', '.join(self.METHODS)}.")
    raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

  METHODS: tuple[str, ...] = ()

  def _check_token_ids(self, sequences, what: str, vocab_size: int | None) -> None:
    """A ValueError naming the ids of ``sequences`` (token id sequences; text is left to the tokenizer) that lie
    outside ``[0, vocab_size)``: the model would embed them as some other row (JAX clamps the index), silently."""
    if vocab_size is None or isinstance(sequences, str):
      return
    for index, sequence in enumerate(sequences):
      if isinstance(sequence, str):
        continue
      tokens = np.asarray(sequence)
      if not tokens.size or not np.issubdtype(tokens.dtype, np.integer):
        continue  # the task says what it takes
      outside = np.unique(tokens[(tokens < 0) | (tokens >= vocab_size)])
      if outside.size:
        raise ValueError(f"{what} {index} holds token ids {outside[:10].tolist()} outside the vocabulary "
                         f"[0, {vocab_size}) of the model in {self.workdir!r}; give ids from the run's own "
                         "tokenizer or data.")

  @staticmethod
  def _texts(texts, method: str, what: str) -> list[str]:
    """``texts`` as a list; a single string is refused: ``list("A man .")`` would be one text per character.
    Every method that takes texts takes a list and returns one result per text, so its result type never
    depends on how it was called."""
    if isinstance(texts, (str, bytes)):
      raise ValueError(f"{method} takes a list of {what}, got one string {texts[:40]!r}; wrap it in a list: "
                       f"{method}([{texts[:20]!r}]) returns a list of one.")
    if not isinstance(texts, (list, tuple)):
      raise ValueError(f"{method} takes a list of {what} (str), got {type(texts).__name__}.")
    for index, text in enumerate(texts):
      if not isinstance(text, str):
        raise ValueError(f"{method} takes a list of {what} (str); item {index} is {text!r} "
                         f"({type(text).__name__}). Token ids go to decode or score instead.")
    return list(texts)

  def _vocab_sizes(self) -> tuple[int | None, int | None]:
    """The (source, target) vocabulary sizes of a model that reads tokens; None where it reads none."""
    source = getattr(self.model_config, "vocab_size", None)
    return source, getattr(self.model_config, "output_vocab_size", source)


class SequenceModel(TrainedModel):
  """A sequence-to-sequence model (the synthetic tasks; translation adds text): ``decode`` (alias
  ``predict``), ``score``, ``attention_weights``. Token ids in, token ids out."""

  METHODS = ("decode", "predict", "score", "attention_weights")

  def decode(self, sources, max_length: int | None = None, beam_size: int | None = None,
             length_penalty: float | None = None) -> list[np.ndarray]:
    """Each source (a 1-D int sequence, or text for tasks with a tokenizer) decoded with the run's
    ``config.decode`` (or greedily for ``beam_size`` 1, by beam search for more) into a 1-D int32 array up to
    and including EOS. ``max_length`` None: room for 1.5 times the longest source plus 10 tokens.
    Raises a ValueError naming any token id outside the model's vocabulary, or a ``max_length`` below 1."""
    self._check_token_ids(sources, "source", self._vocab_sizes()[0])
    return self.task.decode_sequences(self.model_config, self.params, sources, max_length, beam_size,
                                      length_penalty)

  predict = decode

  def score(self, sources, targets) -> np.ndarray:
    """float64 ``[n]``: ``log P(target | source)`` of each pair under teacher forcing (EOS included); the
    per-token negative log-likelihood is ``-score / len(target tokens)``. Text or token ids, as ``decode``."""
    self._check_token_ids(sources, "source", self._vocab_sizes()[0])
    self._check_token_ids(targets, "target", self._vocab_sizes()[1])
    return self.task.score(self.model_config, self.params, sources, targets)

  def attention_weights(self, sources, targets) -> list[dict[tuple[str, int | None], np.ndarray]]:
    """Teacher-forced attention weights of each (source, target) pair: ``(kind, layer)`` -> float32
    ``[heads, q_length, kv_length]``, padding cropped, where ``kind`` is ``encoder_self``, ``decoder_self``,
    ``cross`` (``alignment`` for an RNN's attention, layer None). Text or token ids, as ``decode``."""
    self._check_token_ids(sources, "source", self._vocab_sizes()[0])
    self._check_token_ids(targets, "target", self._vocab_sizes()[1])
    return self.task.attention_weights(self.model_config, self.params, sources, targets)


class Translator(SequenceModel):
  """A translation model: ``translate`` (text in, text out), and ``SequenceModel``'s methods on token ids or
  text."""

  METHODS = ("translate",) + SequenceModel.METHODS

  def translate(self, lines: list[str], beam_size: int | None = None,
                length_penalty: float | None = None) -> list[str]:
    """Translate a list of raw sentences, one output per input (an empty one for a blank line; a single string
    is refused, not read as one sentence per character); beam search of ``beam_size`` ranked with the GNMT
    ``length_penalty`` (default: the run's ``config.decode``). The sentences are batched as evaluation batches
    them, in buckets of source widths, and each has room for 1.5 times its bucket's width plus 10 tokens, so
    decoding compiles once per bucket (``decode`` sizes the room by the longest source given instead)."""
    lines = self._texts(lines, "translate", "source sentences")
    return self.task.translate_lines(self.model_config, self.params, lines, beam_size, length_penalty)


class Classifier(TrainedModel):
  """A text classifier: ``classify``."""

  METHODS = ("classify",)

  def classify(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Classify a list of raw texts (a single string is refused): ``(labels int32 [n], probabilities float32
    [n, num_classes])``, a pair that also has ``.labels``, ``.probabilities`` and ``.names``, each text's label
    name (``not_disaster``, ``disaster``; ``task.label_names`` lists them by id)."""
    return self.task.classify_texts(self.model_config, self.params, self._texts(texts, "classify", "texts"))


class Forecaster(TrainedModel):
  """A time-series forecaster: ``forecast``."""

  METHODS = ("forecast",)

  def forecast(self, window) -> np.ndarray:
    """Forecasts in ug/m3, one per horizon of ``config.task.horizons``, from raw hourly rows (a dict of the
    columns ``read_csv`` returns, the last row the forecast origin) or from prepared feature windows
    ``[input_length, num_features]`` / ``[windows, input_length, num_features]``; see
    ``ForecastingTask.forecast``."""
    return self.task.forecast(self.model_config, self.params, window)


class LanguageModel(TrainedModel):
  """A decoder-only language model: ``continue_texts``, ``score``, ``perplexity``."""

  METHODS = ("continue_texts", "score", "perplexity")

  def score(self, texts: list[str]) -> np.ndarray:
    """float64 ``[n]``: ``log P(text)`` of each text (natural log, its end-of-sentence piece included), as
    ``--mode=eval`` writes for the validation sentences."""
    texts = self._texts(texts, "score", "texts")
    return self.task.score_texts(self.model_config, self.params, texts)[0]

  def perplexity(self, texts: list[str]) -> float:
    """exp of the mean negative log-likelihood per piece over ``texts`` (EOS included), as ``eval/perplexity``
    over the validation split."""
    texts = self._texts(texts, "perplexity", "texts")
    log_probs, pieces = self.task.score_texts(self.model_config, self.params, texts)
    return float(np.exp(-np.sum(log_probs) / max(int(np.sum(pieces)), 1)))

  def continue_texts(self, prompts: list[str], max_new_tokens: int | None = None) -> list[str]:
    """Continuations of a list of text prompts (a single string is refused), without the prompt; see
    ``LanguageModelTask.continue_texts``."""
    prompts = self._texts(prompts, "continue_texts", "prompts")
    return self.task.continue_texts(self.model_config, self.params, prompts, max_new_tokens)


# The model type of each task class (by name: importing the task modules would need their extras).
MODEL_TYPES = {"TranslationTask": Translator, "Seq2SeqTask": SequenceModel, "ClassificationTask": Classifier,
               "ForecastingTask": Forecaster, "LanguageModelTask": LanguageModel}


def model_type(task) -> type[TrainedModel]:
  """The ``TrainedModel`` subclass for ``task``: that of the nearest class in its MRO that has one."""
  for cls in type(task).__mro__:
    if cls.__name__ in MODEL_TYPES:
      return MODEL_TYPES[cls.__name__]
  return TrainedModel


def load(workdir: str, checkpoint: str | int = "best", average_last: int = 0, replica: int = 0,
         config: ml_collections.ConfigDict | RunConfig | None = None) -> TrainedModel:
  """The model trained in ``workdir`` (by ``launch.py`` / ``transformer.train.run``), ready to use: a
  ``Translator``, ``SequenceModel``, ``Classifier``, ``Forecaster`` or ``LanguageModel`` by its task. Only the
  parameters are read (``load_params``): no optimizer is built and its state stays on disk. A run saved by older
  code is refused naming its converter (``python -m transformer.train.convert_run WORKDIR``).

  Args:
    checkpoint: ``"best"`` (the checkpoint kept by the run's ``best_metric``, else the latest),
      ``"latest"`` or a step number.
    average_last: > 0: the mean parameters of the last ``average_last`` periodic checkpoints instead.
    replica: which replica of a run of several: variant ``replica // num_seeds`` of ``config.sweep``, seed
      ``config.seed + replica % num_seeds``.
    config: build the task and model from this configuration instead of the run's ``config.json``
      (``read_run_config``), e.g. with the data moved elsewhere.
  """
  if config is not None:
    _check_same_task(workdir, config)
  loaded = load_params(workdir, checkpoint, average_last, replica, config)
  return model_type(loaded.task)(loaded, workdir)


def _check_same_task(workdir: str, config: ml_collections.ConfigDict | RunConfig) -> None:
  """A ConfigError unless ``config`` is of the task and model the run in ``workdir`` trained: another task's
  config would build another model and look up its own metrics (``best_metric``) in this run's checkpoints."""
  given = config if isinstance(config, RunConfig) else RunConfig.from_config(config)
  trained = read_run_config(workdir)
  for field, ours, theirs in (("task.name", given.task.name, trained.task.name),
                              ("model_name", given.model_name, trained.model_name)):
    if ours != theirs:
      raise ConfigError(f"load({workdir!r}, config=...): the config is of config.{field}={ours!r}, but the run "
                        f"trained config.{field}={theirs!r}; give a config of that run (e.g. read_run_config("
                        f"{workdir!r}) with the paths changed), or leave config out to use the run's own.")


__all__ = ["Classifier", "Forecaster", "LanguageModel", "SequenceModel", "TrainedModel", "Translator", "load",
           "load_params", "read_run_config"]
