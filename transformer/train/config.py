"""The training configuration every experiment starts from and its validation (older runs' configs: ``convert_run``).

Experiments (``experiments/*.py``) call ``base_config(model_name)`` and change what differs. Every field can be
overridden from the command line: ``--config.num_train_steps=300 --config.model.num_heads=4``. ``config.model``
holds the fields of the one model ``config.model_name`` names (``transformer.nn.MODELS``), so an override of
a field that model lacks fails at once, with a "did you mean" suggestion.
"""
from __future__ import annotations

import copy
import dataclasses
import os
import tempfile

import ml_collections
import optax

from transformer.errors import ConfigError
from transformer.nn import MODELS, model_spec
from transformer.tasks.configs import decode_settings, task_config
from transformer.train.optimizer import SCHEDULES, make_optimizer, make_schedule
from transformer.train.parallel import PARALLELISMS

MODES = ("train", "eval", "predict", "translate")
# Fields whose variants can share one vmapped program: they enter the train step as per-replica numbers
# (the model's own fields change its code or shapes, so their variants are separate runs).
SWEEPABLE = ("optimizer.learning_rate", "optimizer.warmup_steps", "label_smoothing")
SCHEDULE_FIELDS = ("optimizer.learning_rate", "optimizer.warmup_steps")  # swept: a schedule per variant
# Model fields the task fills in from the data (vocabulary, special ids) or the mode switches: not in config.model.
DECIDED_ELSEWHERE = ("vocab_size", "target_vocab_size", "pad_id", "bos_id", "eos_id", "deterministic", "decode")


def set_field(config, path: str, value) -> None:
  """``config["a"]["b"] = value`` for ``path`` ``"a.b"`` (a ``ConfigDict`` or nested dicts); a missing section or
  field of a locked ``ConfigDict`` raises as indexing does."""
  *parents, leaf = path.split(".")
  for parent in parents:
    config = config[parent]
  config[leaf] = value


def model_section(model_name: str) -> ml_collections.ConfigDict:
  """``config.model`` of ``model_name``: its hyper-parameter dataclass's fields and defaults, locked (an unknown
  field is an error), less those the data or the mode decides."""
  section = ml_collections.ConfigDict({field.name: field.default
                                       for field in dataclasses.fields(model_spec(model_name).config)
                                       if field.name not in DECIDED_ELSEWHERE})
  section.lock()
  return section


def set_model(config: ml_collections.ConfigDict, model_name: str) -> ml_collections.ConfigDict:
  """Make ``config`` train ``model_name``: ``config.model_name`` and a fresh ``config.model`` of its defaults."""
  config.model_name = model_name
  config.model = model_section(model_name)
  return config


def decode_section() -> ml_collections.ConfigDict:
  """``config.decode``: how evaluation, ``--mode=translate``/``predict`` and ``TrainedModel.decode`` search
  (``transformer.decode.DecodeSettings``)."""
  return ml_collections.ConfigDict({
      "method": "greedy",  # greedy | beam | sample
      "beam_size": 4,  # beam: hypotheses kept
      "length_penalty": 0.6,  # beam: GNMT alpha (0 ranks by log probability)
      # beam: "within_beam" (an EOS finishes only within the top beam_size; beam 1 = greedy) or "any" (flax, t5x)
      "finish_rule": "within_beam",
      "temperature": 1.0,  # sample: 0 = greedy
      "top_k": 0,  # sample: keep the k likeliest tokens (0 = all)
      "top_p": 1.0,  # sample: keep the nucleus of this probability mass (1 = all)
      "num_samples": 1,  # sample: draws per input; the likeliest is output
      "seed": 0,  # sample: the PRNG key's seed (same seed, same samples)
  })


def optimizer_section() -> ml_collections.ConfigDict:
  """``config.optimizer``: Adam with a warmup schedule (``make_optimizer``)."""
  return ml_collections.ConfigDict({
      "learning_rate": 1e-3,  # peak learning rate
      "schedule": "inverse_sqrt",  # one of SCHEDULES
      "warmup_steps": 100,
      "b1": 0.9,  # Adam betas and epsilon as in the paper
      "b2": 0.98,
      "eps": 1e-9,
      "weight_decay": 0.0,  # decoupled (AdamW)
      "grad_clip_norm": 0.0,  # global-norm clipping; 0 disables
      # Parameter path prefixes that are not trained, e.g. ("encoder/embedding",) keeps a pretrained table fixed.
      "frozen_params": (),
  })


def base_config(model_name: str = "transformer") -> ml_collections.ConfigDict:
  """The defaults every experiment starts from, with the model ``model_name`` (a key of ``transformer.nn.MODELS``;
  its defaults: for "transformer", the paper's base model)."""
  config = ml_collections.ConfigDict()
  config.task = ml_collections.ConfigDict({"name": ""})  # which task (transformer.tasks.TASKS) and its data
  # Which model (transformer.nn.MODELS) and its hyper-parameters; the task fills in what the data decides.
  set_model(config, model_name)

  config.seed = 0  # seed of parameters and dropout (and of the data order unless data_seed is set)
  config.data_seed = -1  # seed of the data order; -1: use seed
  config.num_seeds = 1  # >1: replicas with seeds seed, seed+1, ... trained in one program by jax.vmap (jit only)
  # Variants in the same program (jit only): "FIELD=V1,V2,...[;FIELD=...]" over SWEEPABLE fields, e.g.
  # "optimizer.learning_rate=1e-3,3e-3"; fields in one sweep are zipped. Each variant trains num_seeds replicas.
  config.sweep = ""
  config.batch_size = 64  # global batch (examples), over all devices and hosts
  config.grad_accum_steps = 1  # micro-batches per optimizer step (batch_size must divide by it)
  config.num_train_steps = 1000
  config.label_smoothing = 0.0  # 0.1 in the paper
  # Word dropout of seq2seq tasks (ops.token_dropout): the probability of replacing a source token, or a
  # decoder input token (the labels stay whole), by the unknown token. 0 in the paper.
  config.source_token_dropout = 0.0
  config.target_token_dropout = 0.0

  config.optimizer = optimizer_section()

  config.parallelism = "jit"  # jit | pmap | mesh
  config.fsdp = False  # with parallelism=mesh: shard parameters and optimizer state over devices

  config.log_every = 50  # steps between metrics.jsonl lines
  config.eval_every = 500  # steps between evaluations (and at the end)
  config.eval_batch_size = 256
  config.checkpoint_every = 200  # steps between checkpoints (and at the end, and on SIGTERM)
  # Steps per compiled call (a lax.scan; same results); log_every, eval_every, checkpoint_every are multiples of it
  config.steps_per_call = 1
  config.keep_checkpoints = 3  # periodic checkpoints kept
  config.best_metric = ""  # e.g. "eval/exact_match": also keep the best checkpoint by this metric
  config.best_mode = "max"  # max | min
  config.async_checkpointing = True
  config.average_checkpoints = 0  # eval/predict/translate: mean parameters of the last N periodic checkpoints
  # (Vaswani et al. 2017 averaged the last 5; outputs go to WORKDIR/average_last_N) instead of the best; 0 = off
  config.restore_from = ""  # another run's workdir: start from its latest parameters (fine-tuning: params only)
  # Train: allow starting from step 0 in a workdir that holds an earlier run's metrics or best/ but no
  # checkpoint to resume from (its files are moved to WORKDIR/previous-<time>/); off, such a start is refused.
  config.restart = False
  # A step with a non-finite loss or gradient norm: False stops the run (TrainingDiverged, non-zero exit);
  # True skips its update (counted in train/skipped_steps) and trains on.
  config.skip_nonfinite_steps = False
  # With skip_nonfinite_steps: stop (TrainingDiverged) when more than this share of a logging window's steps
  # were skipped: a run that skips most of its steps is not training.
  config.max_skipped_share = 0.5
  # Resuming (or evaluating) with settings that change a run's results is refused; "field,field" (e.g.
  # "optimizer.learning_rate") accepts those changes, recorded in WORKDIR/config_history.jsonl.
  config.accept_changes = ""
  config.decode = decode_section()
  config.translate_input = ""  # --mode=translate reads this file ("" = standard input)
  config.translate_output = ""  # and writes this file ("" = standard output)
  config.quiet = False  # no progress bar
  config.tensorboard = True
  return config


def parse_sweep(text: str) -> dict[str, tuple[float, ...]]:
  """``config.sweep`` as ``field -> values``: ``"optimizer.learning_rate=1e-3,3e-3;label_smoothing=0,0.1"``
  gives two variants, the first with learning rate 1e-3 and no label smoothing. ``""``: no sweep, ``{}``.

  Raises:
    ConfigError: a field not in ``SWEEPABLE``, a value that is not a number, or fields of unequal lengths.
  """
  sweep = {}
  for part in filter(None, (part.strip() for part in text.split(";"))):
    field, _, values = part.partition("=")
    field = field.strip()
    if field not in SWEEPABLE:
      raise ConfigError(f"config.sweep={text!r}: {field!r} cannot be swept in one program; choose from "
                        f"{list(SWEEPABLE)} (other fields change the model's code or shapes: run each variant "
                        "on its own).")
    try:
      sweep[field] = tuple(float(value) for value in values.split(","))
    except ValueError:
      raise ConfigError(f"config.sweep={text!r}: the values of {field} must be numbers separated by commas, "
                        f"e.g. {field}=0.001,0.003.") from None
  lengths = {field: len(values) for field, values in sweep.items()}
  if len(set(lengths.values())) > 1:
    raise ConfigError(f"config.sweep={text!r}: its fields are zipped into variants, so they need as many values "
                      f"each; got {lengths}.")
  return sweep


def num_variants(config) -> int:
  """How many variants ``config.sweep`` holds (1 without a sweep)."""
  sweep = parse_sweep(config.get("sweep", ""))
  return len(next(iter(sweep.values()))) if sweep else 1


def num_replicas(config) -> int:
  """Replicas trained in one program: ``num_variants(config) * config.num_seeds``. Replica ``r`` is variant
  ``r // num_seeds`` with seed ``config.seed + r % num_seeds``, so every variant sees the same seeds."""
  return num_variants(config) * config.num_seeds


def variant_configs(config) -> list[ml_collections.ConfigDict]:
  """Each variant's config: ``config`` with the variant's values of the swept fields (``[config]`` without a
  sweep)."""
  sweep = parse_sweep(config.get("sweep", ""))
  variants = []
  for index in range(num_variants(config)):
    variant = copy.deepcopy(config)
    for field, values in sweep.items():
      section, _, name = field.rpartition(".")
      target = variant[section] if section else variant
      target[name] = type(target[name])(values[index])  # warmup steps stay an int
    variants.append(variant)
  return variants


def sweeps_schedule(config) -> bool:
  """Whether the learning-rate schedule differs between variants (``SCHEDULE_FIELDS`` swept)."""
  return any(field in SCHEDULE_FIELDS for field in parse_sweep(config.get("sweep", "")))


def replica_values(config) -> dict[str, tuple]:
  """What each replica's train and eval steps get as ``settings``, one value per replica: ``variant`` (its
  index, when the schedule is swept: the step picks that variant's learning rate) and the swept
  ``label_smoothing``. ``{}`` without a sweep."""
  sweep = parse_sweep(config.get("sweep", ""))
  values = {}
  if sweeps_schedule(config):
    values["variant"] = tuple(index for index in range(num_variants(config)) for _ in range(config.num_seeds))
  if "label_smoothing" in sweep:
    values["label_smoothing"] = tuple(value for value in sweep["label_smoothing"] for _ in range(config.num_seeds))
  return values


def run_optimizer(config) -> optax.GradientTransformation:
  """The optimizer of a run: ``make_optimizer`` of ``config.optimizer``; when the schedule is swept, at a
  constant rate of 1 instead, and the train step multiplies each replica's updates by its variant's rate
  (``run_schedules``): Adam's update is linear in its rate, decoupled weight decay included."""
  return make_optimizer(config.optimizer, config.num_train_steps,
                        constant_rate=1.0 if sweeps_schedule(config) else None)


def run_schedules(config) -> list:
  """The learning-rate schedule of each variant (one without a sweep), as ``make_schedule`` builds it."""
  return [make_schedule(variant.optimizer, variant.num_train_steps) for variant in variant_configs(config)]


def validate_config(config: ml_collections.ConfigDict, workdir: str | None = None, mode: str = "train") -> None:
  """Reject bad values before anything is compiled, with a message naming the field and the fix."""
  def require(condition, message):
    if not condition:
      raise ConfigError(message)

  require(mode in MODES, f"--mode={mode!r} is not supported; choose one of {list(MODES)}.")
  _validate_model(config)
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
  _validate_steps_per_call(config)
  sweep = parse_sweep(config.get("sweep", ""))
  require(config.num_seeds == 1 or config.parallelism == "jit",
          "config.num_seeds > 1 (vmap over seeds) needs config.parallelism='jit'.")
  require(not sweep or config.parallelism == "jit",
          f"config.sweep={config.sweep!r} (vmap over variants) needs config.parallelism='jit'.")
  for value in sweep.get("optimizer.learning_rate", ()):
    require(value > 0, f"config.sweep={config.sweep!r}: every learning rate must be > 0, got {value:g}.")
  for value in sweep.get("optimizer.warmup_steps", ()):
    require(value >= 0 and value == int(value),
            f"config.sweep={config.sweep!r}: warmup steps must be whole numbers >= 0, got {value:g}.")
  for value in sweep.get("label_smoothing", ()):
    require(0.0 <= value < 1.0, f"config.sweep={config.sweep!r}: label_smoothing={value:g} is outside [0, 1).")
  require(config.optimizer.schedule in SCHEDULES,
          f"config.optimizer.schedule={config.optimizer.schedule!r} is not supported; choose one of "
          f"{list(SCHEDULES)}.")
  require(config.optimizer.learning_rate > 0,
          f"config.optimizer.learning_rate must be > 0, got {config.optimizer.learning_rate}.")
  require(config.optimizer.warmup_steps >= 0, "config.optimizer.warmup_steps must be >= 0.")
  for name in ("label_smoothing", "source_token_dropout", "target_token_dropout"):
    require(0.0 <= config[name] < 1.0, f"config.{name}={config[name]} is outside [0, 1).")
  require(0.0 < config.get("max_skipped_share", 0.5) <= 1.0,
          f"config.max_skipped_share={config.get('max_skipped_share')} is outside (0, 1].")
  require(config.best_mode in ("max", "min"), f"config.best_mode={config.best_mode!r}: choose 'max' or 'min'.")
  if "decode" in config:
    decode_settings(config)  # a ConfigError naming the config.decode field
  if config.task.name:  # the task's typed config: a misspelt or bad config.task field fails here, naming it
    task_config(config.task)
  if workdir is not None:
    _validate_workdir(workdir)
  if config.restore_from:
    require(os.path.isdir(config.restore_from),
            f"config.restore_from={config.restore_from!r} is not a directory; give the workdir of the run to "
            f"start from.")


def _validate_steps_per_call(config: ml_collections.ConfigDict) -> None:
  """``config.steps_per_call``: a positive integer that the actions' periods divide, on a strategy that scans."""
  value = config.get("steps_per_call", 1)
  if not isinstance(value, int) or isinstance(value, bool) or value < 1:
    raise ConfigError(f"config.steps_per_call must be a positive integer (train steps per compiled call; 1 = one "
                      f"step per call), got {value!r}.")
  for name in ("log_every", "eval_every", "checkpoint_every"):
    if config[name] % value:
      raise ConfigError(f"config.{name}={config[name]} is not a multiple of config.steps_per_call={value} (actions "
                        f"run between compiled calls); set config.{name} to a multiple of {value}, e.g. "
                        f"{-(-config[name] // value) * value}, or choose a steps_per_call that divides it.")
  if value > 1 and config.parallelism == "pmap":
    raise ConfigError(f"config.steps_per_call={value} works with config.parallelism 'jit' or 'mesh', not 'pmap'; "
                      "choose one of those, or steps_per_call=1.")


def _validate_workdir(workdir: str) -> None:
  """The workdir of a training run: a directory (created if missing) this process can write to."""
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    raise ConfigError(f"--workdir={workdir!r} is a file, not a directory; choose a directory (it is created if "
                      "missing).")
  try:
    os.makedirs(workdir, exist_ok=True)
    # A uniquely named probe: several processes of one multi-host run check the same workdir at once.
    with tempfile.TemporaryFile(dir=workdir):
      pass
  except OSError as error:
    raise ConfigError(f"--workdir={workdir!r} is not writable ({error.strerror}); choose a directory you "
                      f"can write to.") from None


def _validate_model(config: ml_collections.ConfigDict) -> None:
  """``config.model`` must be the section of ``config.model_name``, with values its dataclass accepts."""
  spec = model_spec(config.model_name)
  fields = set(config.model.keys())
  if fields != set(model_section(config.model_name).keys()):
    holds = [name for name in MODELS if set(model_section(name).keys()) == fields]
    raise ConfigError(
        f"config.model_name={config.model_name!r}, but config.model holds the fields of "
        f"{holds[0] if holds else 'another model'!r}. The model section is built with the model: choose an "
        "experiment variant of that model (or call set_model in the config file) rather than overriding "
        "--config.model_name.")
  try:  # the dataclass's own checks (choices, sizes, rates), before any data is loaded
    spec.config.from_dict(config.model)
  except ConfigError:
    raise
  except ValueError as error:  # a check that raises a plain ValueError still names a config.model value
    raise ConfigError(str(error)) from error
