"""The task interface: everything that differs between experiments, behind one small API.

The training system (``transformer.train``) asks a task for its model, its data and the loss of a batch;
it never looks inside batches. A new experiment is a config, plus a task only if its data or loss is new.
"""
from __future__ import annotations

import abc
import dataclasses
from typing import Any, Iterator, Protocol, Sequence, runtime_checkable

import flax.linen as nn
import numpy as np

from transformer.data.prefetch import ResumableIterator
from transformer.decode import DecodeSettings
from transformer.errors import ConfigError
from transformer.nn import ModelConfig
from transformer.nn.config import ModelSettings
from transformer.tasks.configs import TaskConfig

Batch = dict[str, Any]  # name -> numpy array with a leading batch axis
Metrics = dict[str, tuple[Any, Any]]  # name -> (sum, weight): summed over batches and devices, divided once


@dataclasses.dataclass(frozen=True)
class TaskSettings:
  """What a task reads of its run (``transformer.train.config.RunConfig.task_settings``): the model, the task
  section, decoding and the loss's settings; nothing of how training runs (devices, checkpoints, schedules)."""
  model_name: str
  model: ModelSettings  # config.model_name's config; the fields the data decides at their defaults
  task: TaskConfig
  decode: DecodeSettings = DecodeSettings()
  label_smoothing: float = 0.0
  source_token_dropout: float = 0.0
  target_token_dropout: float = 0.0
  eval_batch_size: int = 256
  order_seed: int = 0  # the seed of the data order (and of generated evaluation data)
  quiet: bool = False  # no progress bars
  num_replicas: int = 1  # seeds times variants trained at once: the leading axis of vmapped parameters


class Task(abc.ABC):
  """One experiment's data, model and loss, built from its ``TaskSettings``: ``self.settings``; its task section is
  ``self.task_config``, an instance of ``task_config_class`` (the task's dataclass in ``transformer.tasks.configs``)."""
  task_config_class: type[TaskConfig] = TaskConfig

  def __init__(self, settings: TaskSettings):
    if not isinstance(settings.task, self.task_config_class):
      raise ConfigError(f"{type(self).__name__} needs config.task of {self.task_config_class.__name__}, got "
                        f"config.task.name={settings.task.name!r}.")
    self.settings = settings
    self.task_config = settings.task

  @abc.abstractmethod
  def model_config(self) -> ModelConfig:
    """The model's hyper-parameters (``config.model`` plus what the data decides, e.g. vocab size)."""

  @abc.abstractmethod
  def build_model(self, model_config: ModelConfig) -> nn.Module:
    """The Flax module; the same call with ``model_config.replace(deterministic=True)`` builds eval models."""

  @abc.abstractmethod
  def train_iterator(self, batch_size: int, seed: int) -> ResumableIterator:
    """Endless GLOBAL training batches (``batch_size`` is the global batch), the same on every process; the
    training loop takes each process's rows (``data.hosts.HostShard``). Its state is thus the same on every
    process and resumes on any process count. An iterator that is ``data.hosts.BuildsHostRows`` (token batches:
    ``PrefetchIterator(BatchIterator(...))``) is asked to build only those rows; any other is built whole."""

  @abc.abstractmethod
  def eval_batches(self, batch_size: int) -> list[Batch]:
    """The validation set as a list of batches of identical shapes (padding rows have zero weight, as have the
    all-zero filler rows of ``data.hosts.pad_rows``)."""

  @abc.abstractmethod
  def init_inputs(self, batch: Batch) -> tuple:
    """Positional inputs of ``model.init`` / ``model.apply`` for a batch."""

  def trained_tokenizers(self) -> dict:
    """name -> tokenizer (with ``fingerprint``, ``model_proto``, ``path``) that this task trains from its data,
    e.g. ``{"source": ..., "target": ...}``, or the files of a pretrained model that it reads text with
    (``data.files.KeptFile``); none by default. Another host can train another model from the same text and
    options, and a folder can change, so a run records these and refuses to resume or load with different
    ones."""
    return {}

  def placeholder_inputs(self) -> tuple:
    """Inputs of ``model.init`` that give the parameters their shapes, for restoring a checkpoint without
    reading training data: by default those of the first validation batch."""
    return self.init_inputs(self.eval_batches(1)[0])

  @abc.abstractmethod
  def loss_and_metrics(self, model: nn.Module, params, batch: Batch, dropout_rng) -> tuple[Any, Any, Metrics]:
    """``(loss_sum, weight_sum, metrics)`` of one batch; the loss minimised is ``loss_sum / weight_sum``
    over the global batch, e.g. the number of non-padding target tokens. A task whose loss is label-smoothed
    also takes ``label_smoothing=None`` (a replica's value of ``config.sweep``, maybe traced) and reads it
    through ``self.label_smoothing``, which falls back to the config's."""

  def label_smoothing(self, swept=None):
    """The label smoothing of the loss: a replica's swept value (``config.sweep``) if given, else the run's."""
    return self.settings.label_smoothing if swept is None else swept

  def prepare_data(self, training: bool = True) -> None:
    """Write now what the task prepares on disk on first use (a TFDS data set, trained tokenizers, with
    ``training`` the tokenized training split), for a multi-process run's process 0 to do before the others read
    it; by default nothing (data made in memory)."""

  def data_fingerprint(self) -> dict[str, str]:
    """``{"<dataset>/<file>": "size=... sha256=..."}`` of the source files the task's data was prepared from,
    which a run records and its later commands compare; {} for data made in memory (synthetic tasks)."""
    return {}

  def count_tokens(self, batch: Batch) -> int:
    """Units of work in a batch, for the ``tokens_per_second`` log: by default the non-padding tokens (nonzero
    entries of the batch's 2-D integer arrays); tasks on other data count what suits them."""
    return int(sum(np.count_nonzero(x) for x in batch.values()
                   if np.ndim(x) == 2 and np.issubdtype(np.asarray(x).dtype, np.integer)))

  def derived_metrics(self, metrics: dict[str, float]) -> dict[str, float]:
    """Metrics that are functions of the averaged ones (``{"eval/nll": ...}`` -> ``{"eval/perplexity": ...}``),
    which a sum over batches cannot give; by default none."""
    return {}

  # Host-side evaluation beyond the loss (e.g. decoding) comes in three parts: the units of work, one output per
  # unit, the score of all outputs. Across processes every process runs all three on every unit, in lockstep:
  # the jitted passes inside (``transformer.nn.split_rows``) split each unit's rows over every process's devices.

  def evaluation_batches(self, batches: list[Batch]) -> Sequence:
    """What the host-side evaluation goes through, one unit at a time, of the validation set ``batches``
    (``eval_batches``): by default nothing (the loss metrics say everything)."""
    return []

  def evaluate_batches(self, model_config: ModelConfig, params, batches: Sequence) -> list:
    """One output per unit of ``batches`` (some of ``evaluation_batches``), each a function of its unit alone:
    host values (hypotheses by example index, per-example flags, forecasts) that ``score_outputs`` reads."""
    return [None for _ in batches]

  def score_outputs(self, outputs: list) -> tuple[dict, list[str]]:
    """``(metrics, example lines to print)`` of the outputs of every unit of ``evaluation_batches``, in order."""
    return {}, []

  def evaluate(self, model_config: ModelConfig, params, batches: list[Batch]) -> tuple[dict, list[str]]:
    """Host-side evaluation beyond the loss: ``(metrics, example lines to print)``, the three parts in turn. A task
    may override this instead; with several processes, every process runs it, with the same batches."""
    units = self.evaluation_batches(batches)
    return self.score_outputs(self.evaluate_batches(model_config, params, units))


# Capabilities only some tasks have. The training system checks for them (``isinstance(task, TranslatesText)``)
# and names the mode and the task when one is missing, instead of every task carrying stubs that refuse.


@runtime_checkable
class TranslatesText(Protocol):
  """A task that turns raw source text into target text (``--mode=translate``, ``TrainedModel.translate``)."""

  def translate_lines(self, model_config: ModelConfig, params, lines: list[str], beam_size: int | None = None,
                      length_penalty: float | None = None) -> list[str]:
    """One output line per input line; an empty (or blank) line gives an empty line without decoding."""


@runtime_checkable
class WritesTestOutputs(Protocol):
  """A task with held-out test splits that ``--mode=eval`` scores and writes beside the checkpoints."""

  def write_test_outputs(self, model_config: ModelConfig, params, output_dir: str, eval_metrics: dict) -> dict:
    """Score the test splits and write their outputs into ``output_dir``; metrics by split.
    ``eval_metrics``: what ``evaluate`` just measured on the eval split (``eval/<name>``), for reuse."""


@runtime_checkable
class WritesPredictions(Protocol):
  """A task whose ``--mode=predict`` writes a predictions file: one line or row per example of its unlabelled
  inputs (a Kaggle submission, forecasts), beside the checkpoints."""

  def write_predictions(self, model_config: ModelConfig, params, output_dir: str) -> str:
    """Write the predictions into ``output_dir``; returns the path of the file written."""


@runtime_checkable
class UsesRecordedTokenizers(Protocol):
  """A task that trains its tokenizers on its data, or reads a pretrained model's (``trained_tokenizers``), and can
  take a run's recorded copies instead (``transformer.load``), so that a trained model reads and writes text
  without its prepared data or the pretrained folder."""

  def use_recorded_tokenizers(self, paths: dict[str, str]) -> None:
    """``paths``: name (of ``trained_tokenizers``) -> the run's model file; the data, read later if at all, must
    hold the same models."""


@runtime_checkable
class StartsFromPretrained(Protocol):
  """A task whose model starts from pretrained weights (a BERT encoder, an embedding table): a fresh training
  run replaces those of its initial parameters (not a resumed run, nor one with ``config.restore_from``)."""

  def pretrained_params(self) -> dict:
    """A partial parameter tree of the model (e.g. ``{"encoder": ...}``): host arrays of the same paths and
    shapes as the fresh parameters they replace; the rest keep their initialisation."""
