"""The training configuration every experiment starts from, and its validation.

Experiments (``experiments/*.py``) call ``base_config()`` and change what differs. Every field can be
overridden from the command line: ``--config.num_train_steps=300 --config.model.num_heads=4``.
"""
from __future__ import annotations

import dataclasses
import os
import tempfile

import ml_collections

from transformer.nn import ModelConfig, RNNConfig
from transformer.train.optimizer import SCHEDULES
from transformer.train.parallel import PARALLELISMS

MODES = ("train", "eval", "predict", "translate")


def _model_section(config_class) -> ml_collections.ConfigDict:
  """A model dataclass's fields and defaults, less those the data or the mode decides."""
  decided_elsewhere = ("vocab_size", "target_vocab_size", "pad_id", "bos_id", "eos_id", "deterministic", "decode")
  section = ml_collections.ConfigDict({f.name: f.default for f in dataclasses.fields(config_class)
                                       if f.name not in decided_elsewhere})
  section.lock()
  return section


def base_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  config.task = ml_collections.ConfigDict({"name": ""})  # which task (transformer.tasks.TASKS) and its data
  # Model hyper-parameters: the fields of transformer.nn.ModelConfig (defaults: the paper's base model).
  # The task fills in what the data decides (vocabulary size, special ids).
  config.model = _model_section(ModelConfig)
  config.architecture = "transformer"  # "transformer" (config.model) or "rnn" (config.rnn, seq2seq tasks)
  # RNN encoder-decoder baselines (transformer.nn.RNNConfig): GRU/LSTM with Bahdanau or Luong attention.
  config.rnn = _model_section(RNNConfig)

  config.seed = 0  # seed of parameters and dropout (and of the data order unless data_seed is set)
  config.data_seed = -1  # seed of the data order; -1: use seed
  config.num_seeds = 1  # >1: replicas with seeds seed, seed+1, ... trained in one program by jax.vmap (jit only)
  config.batch_size = 64  # global batch (examples), over all devices and hosts
  config.grad_accum_steps = 1  # micro-batches per optimizer step (batch_size must divide by it)
  config.num_train_steps = 1000
  config.label_smoothing = 0.0  # 0.1 in the paper
  # Word dropout of seq2seq tasks (ops.token_dropout): the probability of replacing a source token, or a
  # decoder input token (the labels stay whole), by the unknown token. 0 in the paper.
  config.source_token_dropout = 0.0
  config.target_token_dropout = 0.0

  config.optimizer = ml_collections.ConfigDict()
  config.optimizer.learning_rate = 1e-3  # peak learning rate
  config.optimizer.schedule = "inverse_sqrt"  # one of SCHEDULES
  config.optimizer.warmup_steps = 100
  config.optimizer.b1 = 0.9  # Adam betas and epsilon as in the paper
  config.optimizer.b2 = 0.98
  config.optimizer.eps = 1e-9
  config.optimizer.weight_decay = 0.0  # decoupled (AdamW)
  config.optimizer.grad_clip_norm = 0.0  # global-norm clipping; 0 disables

  config.parallelism = "jit"  # jit | pmap | mesh
  config.fsdp = False  # with parallelism=mesh: shard parameters and optimizer state over devices

  config.log_every = 50  # steps between metrics.jsonl lines
  config.eval_every = 500  # steps between evaluations (and at the end)
  config.eval_batch_size = 256
  config.checkpoint_every = 200  # steps between checkpoints (and at the end, and on SIGTERM)
  config.keep_checkpoints = 3  # periodic checkpoints kept
  config.best_metric = ""  # e.g. "eval/exact_match": also keep the best checkpoint by this metric
  config.best_mode = "max"  # max | min
  config.async_checkpointing = True
  config.average_checkpoints = 0  # eval/predict/translate: mean parameters of the last N periodic checkpoints
  # (Vaswani et al. 2017 averaged the last 5; outputs go to WORKDIR/average_last_N) instead of the best; 0 = off
  config.restore_from = ""  # a checkpoint directory of another run to start from (fine-tuning: params only)
  # Train: allow starting from step 0 in a workdir that holds an earlier run's metrics or best/ but no
  # checkpoint to resume from (its files are moved to WORKDIR/previous-<time>/); off, such a start is refused.
  config.restart = False
  # A step with a non-finite loss or gradient norm: False stops the run (TrainingDiverged, non-zero exit);
  # True skips its update (counted in train/skipped_steps) and trains on.
  config.skip_nonfinite_steps = False
  config.translate_input = ""  # --mode=translate reads this file ("" = standard input)
  config.translate_output = ""  # and writes this file ("" = standard output)
  config.quiet = False  # no progress bar
  config.tensorboard = True
  return config


def validate_config(config: ml_collections.ConfigDict, workdir: str | None = None, mode: str = "train") -> None:
  """Reject bad values before anything is compiled, with a message naming the field and the fix."""
  def require(condition, message):
    if not condition:
      raise ValueError(message)

  require(mode in MODES, f"--mode={mode!r} is not supported; choose one of {list(MODES)}.")
  for name in ("batch_size", "num_train_steps", "log_every", "eval_every", "checkpoint_every",
               "keep_checkpoints", "grad_accum_steps", "num_seeds", "eval_batch_size"):
    value = config[name]
    require(isinstance(value, int) and value >= 1,
            f"config.{name} must be a positive integer, got {value!r}.")
  require(isinstance(config.average_checkpoints, int) and config.average_checkpoints >= 0,
          f"config.average_checkpoints must be an integer >= 0 (0 = use the best checkpoint), got "
          f"{config.average_checkpoints!r}.")
  require(config.batch_size % config.grad_accum_steps == 0,
          f"config.batch_size={config.batch_size} must be divisible by config.grad_accum_steps="
          f"{config.grad_accum_steps}.")
  require(config.parallelism in PARALLELISMS,
          f"config.parallelism={config.parallelism!r} is not supported; choose one of {list(PARALLELISMS)}.")
  require(config.num_seeds == 1 or config.parallelism == "jit",
          "config.num_seeds > 1 (vmap over seeds) needs config.parallelism='jit'.")
  require(config.optimizer.schedule in SCHEDULES,
          f"config.optimizer.schedule={config.optimizer.schedule!r} is not supported; choose one of "
          f"{list(SCHEDULES)}.")
  require(config.optimizer.learning_rate > 0,
          f"config.optimizer.learning_rate must be > 0, got {config.optimizer.learning_rate}.")
  require(config.optimizer.warmup_steps >= 0, "config.optimizer.warmup_steps must be >= 0.")
  for name in ("label_smoothing", "source_token_dropout", "target_token_dropout"):
    require(0.0 <= config[name] < 1.0, f"config.{name}={config[name]} is outside [0, 1).")
  require(config.best_mode in ("max", "min"), f"config.best_mode={config.best_mode!r}: choose 'max' or 'min'.")
  if workdir is not None:
    require(not os.path.exists(workdir) or os.path.isdir(workdir),
            f"--workdir={workdir!r} is a file, not a directory; choose a directory (it is created if missing).")
    try:
      os.makedirs(workdir, exist_ok=True)
      # A uniquely named probe: several processes of one multi-host run check the same workdir at once.
      with tempfile.TemporaryFile(dir=workdir):
        pass
    except OSError as error:
      raise ValueError(f"--workdir={workdir!r} is not writable ({error.strerror}); choose a directory you "
                       f"can write to.") from None
  if config.restore_from:
    require(os.path.isdir(config.restore_from),
            f"config.restore_from={config.restore_from!r} is not a directory; give the workdir of the run to "
            f"start from.")
