"""The one public way to get a trained model back and use it, from a notebook or a script:

    from transformer import load
    model = load("runs/m30k")                        # config, tokenizer and best (or averaged) parameters
    model.translate(["A man rides a bike ."])         # also model.score(...), model.attention_weights(...)
    load("runs/tweets").classify(["Forest fire near La Ronge"])  # (labels, probabilities)

What a model can do depends on its task: ``TrainedModel`` delegates to the task's methods (``translate_lines``,
``decode_sequences``, ``score``, ``attention_weights``, ``classify_texts``, ``forecast``, ``continue_texts``), so a
new task adds its own by giving its task the method and ``TrainedModel`` a one-line delegate.
"""
from __future__ import annotations

from typing import Any

import ml_collections
import numpy as np

from transformer.train import RestoredParams, load_params, read_run_config


class TrainedModel:
  """A trained model: its run's ``config``, ``model_config``, ``params`` (host arrays) and ``task``.

  Attributes:
    steps: the restored step, or the averaged steps (oldest first); ``step`` is the newest of them.
    workdir: the run's directory.
  """

  def __init__(self, restored: RestoredParams, workdir: str):
    self.config: ml_collections.ConfigDict = restored.config
    self.model_config = restored.model_config
    self.params: Any = restored.params
    self.task = restored.task
    self.steps: list[int] = restored.steps
    self.workdir = workdir

  @property
  def step(self) -> int:
    return self.steps[-1]

  def __repr__(self) -> str:
    return (f"TrainedModel({self.workdir!r}, task={self.config.task.name!r}, "
            f"{type(self.model_config).__name__}, steps={self.steps})")

  def _task_method(self, name: str, what: str):
    method = getattr(self.task, name, None)
    if method is None:
      raise TypeError(f"model.{what} needs a task that has {name}; the run in {self.workdir!r} trained "
                      f"config.task.name={self.config.task.name!r} ({type(self.task).__name__}), which has not.")
    return method

  def translate(self, lines: list[str], beam_size: int | None = None,
                length_penalty: float | None = None) -> list[str]:
    """Translate raw sentences, one output per input (an empty one for a blank line); beam search of
    ``beam_size`` ranked with the GNMT ``length_penalty`` (default: the run's ``config.decode``)."""
    return self._task_method("translate_lines", "translate")(self.model_config, self.params, list(lines), beam_size,
                                                              length_penalty)

  def decode(self, sources, max_length: int | None = None, beam_size: int | None = None,
             length_penalty: float | None = None) -> list[np.ndarray]:
    """Token ids in, token ids out (any sequence-to-sequence task): each source (a 1-D int sequence, or text
    for tasks with a tokenizer) decoded with the run's ``config.decode`` (or greedily for ``beam_size`` 1, by
    beam search for more) into a 1-D int32 array up to and including EOS. ``max_length`` None: room for 1.5 times the longest source plus 10 tokens."""
    return self._task_method("decode_sequences", "decode")(self.model_config, self.params, sources, max_length,
                                                            beam_size, length_penalty)

  predict = decode

  def score(self, sources, targets) -> np.ndarray:
    """float64 ``[n]``: ``log P(target | source)`` of each pair under teacher forcing (EOS included); the
    per-token negative log-likelihood is ``-score / len(target tokens)``. Text or token ids, as ``decode``."""
    return self._task_method("score", "score")(self.model_config, self.params, sources, targets)

  def attention_weights(self, sources, targets) -> list[dict[tuple[str, int | None], np.ndarray]]:
    """Teacher-forced attention weights of each (source, target) pair: ``(kind, layer)`` -> float32
    ``[heads, q_length, kv_length]``, padding cropped, where ``kind`` is ``encoder_self``, ``decoder_self``,
    ``cross`` (``alignment`` for an RNN's attention, layer None). Text or token ids, as ``decode``."""
    return self._task_method("attention_weights", "attention_weights")(self.model_config, self.params, sources,
                                                                        targets)

  def forecast(self, window) -> np.ndarray:
    """Forecasts in ug/m3 (a forecasting task), one per horizon of ``config.task.horizons``, from raw hourly
    rows (a dict of the columns ``read_csv`` returns, the last row the forecast origin) or from prepared
    feature windows ``[input_length, num_features]`` / ``[windows, input_length, num_features]``; see
    ``ForecastingTask.forecast``."""
    return self._task_method("forecast", "forecast")(self.model_config, self.params, window)

  def continue_texts(self, prompts: list[str], max_new_tokens: int | None = None) -> list[str]:
    """Greedy continuations of text prompts (a language model), without the prompt; see
    ``LanguageModelTask.continue_texts``."""
    return self._task_method("continue_texts", "continue texts")(self.model_config, self.params, list(prompts),
                                                                 max_new_tokens)

  def classify(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Classify raw texts: ``(labels int32 [n], probabilities float32 [n, num_classes])``."""
    return self._task_method("classify_texts", "classify")(self.model_config, self.params, list(texts))


def load(workdir: str, checkpoint: str | int = "best", average_last: int = 0, replica: int = 0,
         config: ml_collections.ConfigDict | None = None) -> TrainedModel:
  """The model trained in ``workdir`` (by ``launch.py`` / ``transformer.train.run``), ready to use.

  Args:
    checkpoint: ``"best"`` (the checkpoint kept by the run's ``best_metric``, else the latest),
      ``"latest"`` or a step number.
    average_last: > 0: the mean parameters of the last ``average_last`` periodic checkpoints instead.
    replica: which replica of a run of several: variant ``replica // num_seeds`` of ``config.sweep``, seed
      ``config.seed + replica % num_seeds``.
    config: build the task and model from this configuration instead of the run's ``config.json``
      (``read_run_config``), e.g. with the data moved elsewhere.
  """
  return TrainedModel(load_params(workdir, checkpoint, average_last, replica, config), workdir)


__all__ = ["TrainedModel", "load", "load_params", "read_run_config"]
