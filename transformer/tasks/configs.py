"""Each task's ``config.task`` section as a frozen dataclass, validated when built (``ConfigError`` naming the field,
the bad value and the fix), as ``transformer.nn``'s model configs are.

``RunConfig.from_config`` builds it once (``task_config``), as the run's ``task``, which the task reads
(``Task.task_config``): a misspelt field of a config file or of the Python API (``config.task.max_lenght = 64``; the
command line refuses a field the section lacks) fails before any data is read, with "did you mean 'max_length'".
A default is what the code took for a field the section lacks (runs saved before the field existed), else the
experiments' value; a run's ``config.json`` keeps the section as it was given.

This module imports none of the tasks' data dependencies (TFDS, SentencePiece), so validating a config needs none.
"""
from __future__ import annotations

import dataclasses
import difflib

from transformer.data.synthetic import KINDS
from transformer.effects import Effect, setting
from transformer.errors import ConfigError
from transformer.nn.config import ValidatedConfig

TOKENIZER_TYPES = ("unigram", "bpe")  # the SentencePiece model types this codebase trains
CLASSIFICATION_DATASETS = ("disaster_tweets",)
PRETRAINED_INITS = ("none", "embedding", "encoder")  # what a classifier takes from its pretrained checkpoint
FORECASTING_DATASETS = ("beijing_pm25", "synthetic")
FORECASTING_LOSSES = ("mae", "mse")


@dataclasses.dataclass(frozen=True)
class TaskConfig(ValidatedConfig):
  """The fields every ``config.task`` has; a task's own config adds its fields."""
  name: str = ""  # the task, a key of transformer.tasks.TASKS

  @classmethod
  def from_dict(cls, values):
    """Build from ``config.task`` (a mapping), rejecting unknown fields; errors name the section."""
    try:
      return super().from_dict(values)
    except ConfigError as error:
      raise ConfigError(f"config.task: {error}") from None

  def check_non_negative_int(self, name: str) -> None:
    value = getattr(self, name)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
      raise ConfigError(f"{type(self).__name__}.{name} must be an integer >= 0, got {value!r}.")

  def as_tuple(self, name: str, convert=lambda value: value) -> None:
    """Store the sequence field ``name`` as a tuple (a saved run's ``config.json`` gives lists)."""
    object.__setattr__(self, name, tuple(convert(value) for value in getattr(self, name)))


@dataclasses.dataclass(frozen=True)
class SyntheticConfig(TaskConfig):
  """``config.task`` of the synthetic sequence tasks (``transformer.tasks.synthetic``)."""
  name: str = "synthetic"
  kind: str = "copy"  # what the target is: the source copied, reversed or sorted (one of KINDS)
  num_symbols: int = 10  # distinct symbols, ids FIRST_SYMBOL.. (0 pad, 1 BOS, 2 EOS)
  min_length: int = 1  # shortest source, in symbols
  max_length: int = 12  # longest source, in symbols (targets add EOS)
  num_eval_examples: int = setting(512, Effect.EVALUATION)  # validation sequences (a seed stream of their own)

  def __post_init__(self):
    self.check_choice("kind", KINDS)
    for name in ("num_symbols", "min_length", "max_length", "num_eval_examples"):
      self.check_positive_int(name)
    if self.min_length > self.max_length:
      raise ConfigError(f"SyntheticConfig.min_length={self.min_length} is above max_length={self.max_length}; "
                        "set min_length <= max_length.")


@dataclasses.dataclass(frozen=True)
class SentencePieceTextConfig(TaskConfig):
  """Fields of the tasks on TFDS text tokenised by a SentencePiece model trained on it (translation, language
  model); batches of similar lengths, sized in tokens (``transformer.data.batching.TokenBatcher``)."""
  dataset: str = "multi30k"  # a key of transformer.data.translation.BUILDERS
  pair: str = "en-de"  # one of the dataset's language pairs, "<source>-<target>"
  # raw files; "" = $TRANSFORMER_DATA_DIR/<dataset>, else the official download
  source_dir: str = setting("", Effect.LOCAL)
  # TFDS data dir of the prepared data and tokenizer; "" = $TFDS_DATA_DIR or ~/tensorflow_datasets
  data_dir: str = setting("", Effect.LOCAL)
  vocab_size: int = 8000  # SentencePiece pieces, specials included (trained on the training split)
  tokenizer_type: str = "unigram"  # SentencePiece model type, one of TOKENIZER_TYPES
  max_tokens: int = 4096  # tokens per batch (each side for translation), padding included
  max_length: int = 128  # training filter (longer sentences are dropped); evaluation keeps every sentence whole
  batch_size_multiple: int = 8  # batch sizes divisible by this (devices)
  # True: every batch [max_tokens // max_length, max_length], one compiled shape instead of one per length
  # bucket, at the cost of padding (for accelerators, where compiling a step per bucket is slow).
  fixed_batch_shape: bool = False
  # True: training examples packed whole into rows of max_length positions (data/packing.py): one compiled
  # shape and almost no padding; attention and positions stay within each example. Evaluation is unpacked.
  pack: bool = False
  # With pack: processes that plan (pack) the next epochs at once, each in a worker, for when one thread packs an
  # epoch slower than the steps consume it (many hosts: benchmarks/host_data.py); 0: one background thread.
  plan_workers: int = setting(0, Effect.LAYOUT)
  # With pack: S > 1 deals each epoch into S streams packed apart, each into its own rows of every batch, so that a
  # process plans only its own streams (1/n of the epoch; a multiple of the process count). Another plan than 1's.
  pack_streams: int = 1
  eval_split: str = setting("validation", Effect.EVALUATION)  # evaluated during training (checkpoint selection)

  def __post_init__(self):
    self.check_choice("tokenizer_type", TOKENIZER_TYPES)
    self.check_non_negative_int("plan_workers")
    for name in ("vocab_size", "max_tokens", "max_length", "batch_size_multiple", "pack_streams"):
      self.check_positive_int(name)


@dataclasses.dataclass(frozen=True)
class TranslationConfig(SentencePieceTextConfig):
  """``config.task`` of machine translation (``transformer.tasks.translation``)."""
  name: str = "translation"
  shared_vocab: bool = True  # one SentencePiece model for both languages
  test_splits: tuple[str, ...] = setting((), Effect.EVALUATION)  # scored by --mode=eval only
  # --mode=eval decodes the tests with the GNMT alpha of these that scores the highest BLEU on eval_split;
  # () = config.decode.length_penalty.
  length_penalty_candidates: tuple[float, ...] = setting((), Effect.EVALUATION)
  # sacreBLEU tokenizer: "13a" on detokenised text, "none" for pre-tokenised references (IWSLT's)
  bleu_tokenize: str = setting("13a", Effect.EVALUATION)
  # BLEU during training on this prefix of eval_split; 0 = all of it
  num_eval_sentences: int = setting(0, Effect.EVALUATION)

  def __post_init__(self):
    super().__post_init__()
    self.as_tuple("test_splits")
    self.as_tuple("length_penalty_candidates", float)
    self.check_non_negative_int("num_eval_sentences")
    if any(alpha < 0 for alpha in self.length_penalty_candidates):
      raise ConfigError(f"TranslationConfig.length_penalty_candidates={self.length_penalty_candidates} has a "
                        "negative alpha; GNMT's length penalty takes alpha >= 0 (0 ranks by log probability).")


@dataclasses.dataclass(frozen=True)
class LanguageModelConfig(SentencePieceTextConfig):
  """``config.task`` of language modelling on one side of a parallel corpus (``transformer.tasks.language_model``)."""
  name: str = "language_model"
  language: str = "en"  # the side of ``pair`` modelled
  vocab_size: int = 4000
  max_tokens: int = 2048
  max_length: int = 64  # also the longest continuation by default
  # True: a training sentence longer than max_length is cut into pieces of max_length tokens (every token kept;
  # a piece after the first starts without its sentence's context); False: it is dropped, as runs recorded
  # before this field were trained (see experiments/language_model.py).
  chunk_long_sentences: bool = False
  # continuations shown at each evaluation, of the first eval sentences (0: none)
  num_eval_prompts: int = setting(3, Effect.EVALUATION)
  prompt_words: int = setting(4, Effect.EVALUATION)  # the words of each such sentence that prompt its continuation

  def __post_init__(self):
    super().__post_init__()
    for name in ("num_eval_prompts", "prompt_words"):
      self.check_non_negative_int(name)


@dataclasses.dataclass(frozen=True)
class ClassificationConfig(TaskConfig):
  """``config.task`` of text classification (``transformer.tasks.classification``)."""
  name: str = "classification"
  dataset: str = "disaster_tweets"  # one of CLASSIFICATION_DATASETS
  source_dir: str = setting("", Effect.LOCAL)  # folder of Kaggle's train.csv and test.csv; "" = $TRANSFORMER_DATA_DIR
  data_dir: str = setting("", Effect.LOCAL)  # TFDS data dir; "" = $TFDS_DATA_DIR or ~/tensorflow_datasets
  # a Hugging Face BERT model folder; "" = $TRANSFORMER_MODELS_DIR/<pretrained_model>
  pretrained_dir: str = setting("", Effect.LOCAL)
  pretrained_model: str = "all-MiniLM-L6-v2"  # its folder's name; its tokenizer tokenises every variant
  # What starts from the checkpoint, one of PRETRAINED_INITS: "none" (nothing), "embedding" (the token table)
  # or "encoder" (the whole encoder, whose architecture is the checkpoint's).
  pretrained_init: str = "none"
  max_length: int = 64  # tokens per text, [CLS] and [SEP] included; longer texts lose their end
  # 0: every training batch padded to the longest text of the data; else texts of similar lengths batched
  # together, each batch padded to a multiple of this (the experiments: 16).
  bucket_length_multiple: int = 0
  eval_split: str = setting("validation", Effect.EVALUATION)  # evaluated during training (checkpoint selection)
  test_split: str = setting("test", Effect.EVALUATION)  # scored by --mode=eval

  def __post_init__(self):
    self.check_choice("dataset", CLASSIFICATION_DATASETS)
    self.check_choice("pretrained_init", PRETRAINED_INITS)
    self.check_positive_int("max_length")
    self.check_non_negative_int("bucket_length_multiple")


@dataclasses.dataclass(frozen=True)
class ForecastingConfig(TaskConfig):
  """``config.task`` of hourly forecasting (``transformer.tasks.forecasting``); the window length is the
  model's (``config.model.input_length``)."""
  name: str = "forecasting"
  # One of FORECASTING_DATASETS: "synthetic" is a generated series with a daily cycle, for tests and smoke runs.
  dataset: str = "beijing_pm25"
  source_dir: str = setting("", Effect.LOCAL)  # folder of the raw CSV; "" = $TRANSFORMER_DATA_DIR/beijing_pm25
  data_dir: str = setting("", Effect.LOCAL)  # TFDS data folder; "" = $TFDS_DATA_DIR or ~/tensorflow_datasets
  horizons: tuple[int, ...] = (1, 6, 12, 24, 48, 72, 96)  # hours ahead forecast (the dataset's HORIZONS)
  loss: str = "mae"  # of the standardised log1p(pm2.5), one of FORECASTING_LOSSES
  # True: the forecast is the model's output plus the last input hour's pm2.5 (persistence + a learned change).
  residual: bool = False
  synthetic_hours: int = 0  # length of the "synthetic" series (the experiments: 4000)

  def __post_init__(self):
    self.check_choice("dataset", FORECASTING_DATASETS)
    self.check_choice("loss", FORECASTING_LOSSES)
    self.as_tuple("horizons", int)
    if not self.horizons or min(self.horizons) < 1:
      raise ConfigError(f"ForecastingConfig.horizons={list(self.horizons)} must be a non-empty list of hours >= 1.")
    self.check_non_negative_int("synthetic_hours")
    if self.dataset == "synthetic" and self.synthetic_hours < 1:
      raise ConfigError("ForecastingConfig.dataset='synthetic' generates synthetic_hours hours, got "
                        f"{self.synthetic_hours}; set config.task.synthetic_hours (e.g. 4000).")


# name -> the dataclass of its config.task (the keys are those of transformer.tasks.TASKS).
TASK_CONFIGS = {"synthetic": SyntheticConfig, "translation": TranslationConfig, "forecasting": ForecastingConfig,
                "classification": ClassificationConfig, "language_model": LanguageModelConfig}


def task_config_class(name: str) -> type[TaskConfig]:
  """The config dataclass of the task ``name``; a ``ConfigError`` naming the tasks for an unknown one."""
  if not isinstance(name, str) or name not in TASK_CONFIGS:
    close = difflib.get_close_matches(str(name), TASK_CONFIGS, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise ConfigError(f"config.task.name={name!r} is not a known task; choose one of {sorted(TASK_CONFIGS)}.{hint}")
  return TASK_CONFIGS[name]


def task_config(task_section) -> TaskConfig:
  """The typed config of a ``config.task`` section, by its ``name``."""
  return task_config_class(task_section["name"]).from_dict(task_section)
