"""The typed run: the ``ConfigDict`` every experiment starts from (``base_config``), resolved once into a
frozen ``RunConfig`` (``validate_config``), with the replicas one program trains and the optimizer's settings.

The replicas one compiled program trains with ``jax.vmap``: seeds, and the variants of ``config.sweep``.

The run description: a run's whole configuration as one frozen, typed ``RunConfig``, resolved once.

It lives with training, which takes the whole of it; a task gets only its part (``RunConfig.task_settings``: the
model, the task section, decoding, the loss settings), so ``transformer.tasks`` names none of training's choices.

``RunConfig.from_config(config)`` is the one reader of the ``ml_collections.ConfigDict`` that experiments write
and the command line overrides: it builds the model's config (``transformer.nn``; the fields the data decides
at their defaults, filled in by the task), the task's config (``transformer.tasks.configs``), the decode and
optimizer settings, and parses the replicas (``num_seeds`` times the variants of ``sweep``); every check runs
there, and a bad value is a ``ConfigError`` naming the field and the fix. Training, evaluation, prediction,
translation, restoring and ``transformer.load`` take the ``RunConfig``; nothing below it reads raw keys. The entry
points that also accept a ``ConfigDict`` (``transformer.train.run``, ``build_task``, ``load_params``/``load`` with
``config=``) resolve it here first.

The fields and defaults of ``RunConfig``, ``OptimizerConfig`` and ``DecodeSettings`` are the defaults of every
experiment: ``transformer.train.base_config`` builds its ``ConfigDict`` from them. ``record`` keeps the values
as given, which a run writes to its ``config.json`` once.

The ``ConfigDict`` every experiment starts from (``base_config``), resolved into a ``RunConfig`` by
``validate_config`` (older runs' configs: ``convert_run``).

Experiments (``experiments/*.py``) call ``base_config(model_name)`` and change what differs. Every field can be
overridden from the command line: ``--config.num_train_steps=300 --config.model.num_heads=4``. ``config.model``
holds the fields of the one model ``config.model_name`` names (``transformer.nn.MODELS``), so an override of
a field that model lacks fails at once, with a "did you mean" suggestion.
"""
from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import os
import re
import tempfile
from typing import Mapping

import ml_collections

from transformer.decode import DecodeSettings
from transformer.effects import Effect, field_effects, setting
from transformer.errors import ConfigError, WorkdirError
from transformer.nn import ACTIVATION_AXES, LOGICAL_AXES, MODELS, ModelConfig, model_spec
from transformer.nn.config import ModelSettings, ValidatedConfig, check_field_types
from transformer.tasks import Task, TaskSettings, make_task
from transformer.tasks.configs import TaskConfig, task_config

# Fields whose variants can share one vmapped program: they enter the train step as per-replica numbers
# (the model's own fields change its code or shapes, so their variants are separate runs).
SWEEPABLE = ("optimizer.learning_rate", "optimizer.warmup_steps", "label_smoothing")
SCHEDULE_FIELDS = ("optimizer.learning_rate", "optimizer.warmup_steps")  # swept: a schedule per variant


@dataclasses.dataclass(frozen=True)
class Replicas:
  """The replicas one program trains (``jax.vmap``): ``num_seeds`` seeds of each variant of ``sweep``
  (``field -> values``, zipped). Replica ``r`` is variant ``r // num_seeds`` with seed ``seed + r % num_seeds``,
  so every variant sees the same seeds."""
  num_seeds: int = 1
  sweep: tuple[tuple[str, tuple[float, ...]], ...] = ()
  text: str = ""  # config.sweep as written, for messages

  @classmethod
  def parse(cls, text: str, num_seeds: int) -> Replicas:
    """``text``: ``"optimizer.learning_rate=1e-3,3e-3;label_smoothing=0,0.1"`` gives two variants, the first with
    learning rate 1e-3 and no label smoothing; ``""``, none.

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
      raise ConfigError(f"config.sweep={text!r}: its fields are zipped into variants, so they need as many "
                        f"values each; got {lengths}.")
    return cls(num_seeds, tuple(sweep.items()), text)

  @property
  def swept(self) -> dict[str, tuple[float, ...]]:
    return dict(self.sweep)

  @property
  def num_variants(self) -> int:
    return len(self.sweep[0][1]) if self.sweep else 1

  @property
  def count(self) -> int:
    """Replicas trained in one program: ``num_variants * num_seeds``."""
    return self.num_variants * self.num_seeds

  @property
  def sweeps_schedule(self) -> bool:
    """Whether the learning-rate schedule differs between variants (``SCHEDULE_FIELDS`` swept)."""
    return any(field in SCHEDULE_FIELDS for field in self.swept)

  def variant_names(self) -> list[str]:
    """Each variant by its values, as printed: ``variant_0 (optimizer.learning_rate=0.002, label_smoothing=0)``
    (its metrics keep the ``/variant_0`` suffix); none without a sweep."""
    return [f"variant_{index} (" + ", ".join(f"{field}={values[index]:g}" for field, values in self.sweep) + ")"
            for index in range(self.num_variants)] if self.sweep else []

  def seed_offsets(self) -> list[int]:
    """Each replica's seed, less the run's ``seed``."""
    return [replica % self.num_seeds for replica in range(self.count)]

  def settings(self) -> dict[str, tuple]:
    """What each replica's train and eval steps get as ``settings``, one value per replica: ``variant`` (its
    index, when the schedule is swept: the step picks that variant's learning rate) and the swept
    ``label_smoothing``. ``{}`` without a sweep."""
    values = {}
    if self.sweeps_schedule:
      values["variant"] = tuple(index for index in range(self.num_variants) for _ in range(self.num_seeds))
    if "label_smoothing" in self.swept:
      values["label_smoothing"] = tuple(value for value in self.swept["label_smoothing"]
                                        for _ in range(self.num_seeds))
    return values


SCHEDULES = ("inverse_sqrt", "cosine", "constant")  # built by make_schedule
OPTIMIZERS = ("adamw", "adafactor")  # built by transformer.train.state.make_optimizer


@dataclasses.dataclass(frozen=True)
class OptimizerConfig(ValidatedConfig):
  """``config.optimizer``: Adam or Adafactor with a warmup schedule (``transformer.train.state.make_optimizer``)."""
  # "adamw": Adam, with decoupled weight decay when weight_decay > 0 (the paper's Adam at 0); "adafactor": optax's
  # Adafactor (Shazeer & Stern 2018; T5X's and MaxText's default): factored second moments and no first moment,
  # its state a fraction of Adam's two moments; its steps are relative to each parameter's scale, so its
  # learning rate is not Adam's (T5X: 1e-2); b1, b2 and eps are Adam's only.
  name: str = "adamw"
  learning_rate: float = 1e-3  # peak learning rate
  schedule: str = "inverse_sqrt"  # one of SCHEDULES
  warmup_steps: int = 100
  b1: float = 0.9  # Adam betas and epsilon as in the paper
  b2: float = 0.98
  eps: float = 1e-9
  weight_decay: float = 0.0  # decoupled (AdamW; Adafactor's too): parameters shrink by learning rate * this each step
  grad_clip_norm: float = 0.0  # global-norm clipping; 0 disables
  # Parameter path prefixes that are not trained, e.g. ("encoder/embedding",) keeps a pretrained table fixed.
  frozen_params: tuple[str, ...] = ()

  def __post_init__(self):
    object.__setattr__(self, "frozen_params", tuple(self.frozen_params or ()))
    if self.name not in OPTIMIZERS:
      raise ConfigError(f"config.optimizer.name={self.name!r} is not supported; choose one of {list(OPTIMIZERS)}.")
    if self.schedule not in SCHEDULES:
      raise ConfigError(f"config.optimizer.schedule={self.schedule!r} is not supported; choose one of "
                        f"{list(SCHEDULES)}.")
    if not self.learning_rate > 0:
      raise ConfigError(f"config.optimizer.learning_rate must be > 0, got {self.learning_rate}.")
    if self.warmup_steps < 0:
      raise ConfigError("config.optimizer.warmup_steps must be >= 0.")
    for name in ("b1", "b2"):  # decay rates of Adam's moment averages
      if not 0.0 <= getattr(self, name) < 1.0:
        raise ConfigError(f"config.optimizer.{name}={getattr(self, name)} is outside [0, 1) (the paper: b1 0.9, "
                          "b2 0.98).")
    if not self.eps > 0:
      raise ConfigError(f"config.optimizer.eps must be > 0 (it keeps Adam's step finite), got {self.eps}.")
    if not self.weight_decay >= 0 or not self.grad_clip_norm >= 0:
      raise ConfigError(f"config.optimizer.weight_decay={self.weight_decay} and grad_clip_norm={self.grad_clip_norm} "
                        "must be >= 0 (0 turns either off).")


MAX_SEED = 2 ** 62  # seeds below it fit numpy's and JAX's seeding with room for every replica's offset
PARALLELISMS = ("jit", "pmap", "mesh")  # built by transformer.train.mesh.make_strategy
HOSTS_AXIS, DATA_AXIS, MODEL_AXIS = "hosts", "data", "model"  # the axes of every run's mesh (transformer.train.mesh)
# The rule table: each parameter's logical axis names (transformer.nn.LOGICAL_AXES) -> the mesh axis that splits
# that axis (None: kept whole). The model axis (config.tensor_parallelism devices; 1 by default, which splits
# nothing) takes the heads, the feed-forward width and the vocabulary, as Megatron-LM's tensor parallelism does.
# A scanned stack's "layers" axis stays whole, as MaxText's: every device steps through every layer.
AXIS_RULES = {"vocab": MODEL_AXIS, "heads": MODEL_AXIS, "kv_heads": MODEL_AXIS, "mlp": MODEL_AXIS,
              **{name: None for name in LOGICAL_AXES if name not in ("vocab", "heads", "kv_heads", "mlp")}}
# config.fsdp=True: these also split over the data axis, so each device holds 1/devices of every weight matrix
# and its optimizer moments (the model width, as MaxText's "embed" -> "fsdp"; an RNN's state and a window).
FSDP_RULES = {"embed": DATA_AXIS, "rnn_state": DATA_AXIS, "window": DATA_AXIS}
# Activations (transformer.nn.ACTIVATION_AXES), constrained where the model is traced under the mesh: the batch
# over hosts and data, as MeshStrategy splits its batches; positions and the model width whole (FSDP's "embed" is
# the parameters' width, never the activations'). The heads, feed-forward width and vocabulary follow their
# parameters' rules (ACTIVATION_FOLLOWS), so "vocab=none" keeps the logits whole as well, unless the table names
# the activation axis itself ("activation_vocab=model").
ACTIVATION_RULES = {"activation_batch": (HOSTS_AXIS, DATA_AXIS), "activation_length": None, "activation_embed": None}
ACTIVATION_FOLLOWS = {"activation_heads": "heads", "activation_kv_heads": "kv_heads", "activation_mlp": "mlp",
                      "activation_vocab": "vocab"}

Rules = tuple[tuple[str, str | tuple[str, ...] | None], ...]  # flax's (logical axis, mesh axes) pairs


def logical_axis_rules(fsdp: bool = False, overrides: str = "") -> Rules:
  """The rule table of a run: ``AXIS_RULES``, with ``FSDP_RULES`` under ``fsdp``, then ``overrides``
  (``config.axis_rules``: ``"NAME=AXIS[,NAME=AXIS]"``, NAME a parameter's or an activation's logical axis, AXIS
  one of data, model, none), then the activations' rules (``ACTIVATION_RULES``, ``ACTIVATION_FOLLOWS``) where the
  overrides do not name them, as flax's ``logical_axis_rules`` pairs.

  Raises:
    ConfigError: an unknown logical axis or mesh axis, or a malformed pair.
  """
  rules = {**AXIS_RULES, **(FSDP_RULES if fsdp else {})}
  for pair in filter(None, (part.strip() for part in overrides.split(","))):
    name, _, axis = (part.strip() for part in pair.partition("="))
    _require((name in LOGICAL_AXES or name in ACTIVATION_AXES) and axis in (DATA_AXIS, MODEL_AXIS, "none"),
             f"config.axis_rules={overrides!r}: {pair!r} is not NAME=AXIS with NAME a logical axis "
             f"({', '.join((*LOGICAL_AXES, *ACTIVATION_AXES))}) and AXIS one of {DATA_AXIS}, {MODEL_AXIS}, none.")
    rules[name] = None if axis == "none" else axis
  activations = {**ACTIVATION_RULES, **{name: rules[follows] for name, follows in ACTIVATION_FOLLOWS.items()}}
  return tuple({**rules, **{name: axis for name, axis in activations.items() if name not in rules}}.items())


SECTIONS = ("model", "task", "optimizer", "decode")  # the ConfigDict's sections, each its own dataclass
# What a section's fields change when they declare nothing (transformer.effects): decoding only evaluates.
SECTION_EFFECTS = {"decode": Effect.EVALUATION}
# Model fields the task fills in from the data (vocabulary, special ids) or the mode switches: not in config.model.
DECIDED_ELSEWHERE = ("vocab_size", "target_vocab_size", "pad_id", "bos_id", "eos_id", "deterministic", "decode")


@dataclasses.dataclass(frozen=True)
class RunConfig:
  """A run's configuration, typed and checked: the sections as dataclasses, the top-level fields as given.

  Each field declares what changing it does (``transformer.effects.Effect``, in its metadata; ``effects``
  gathers them over the sections): the rules for resuming with other settings and the settings a reproducing
  command leaves out derive from it.

  Attributes:
    model: the ``config.model_name`` model's config with ``config.model``'s values; the fields the data decides
      (vocabulary, special ids) are at their defaults until the task fills them in (``Task.model_config``).
    record_text: the configuration's values as given, as JSON text: what the run's ``config.json`` holds
      (``record`` parses it).
  """
  model: ModelSettings = dataclasses.field(default_factory=ModelConfig)
  task: TaskConfig = TaskConfig()
  optimizer: OptimizerConfig = OptimizerConfig()
  decode: DecodeSettings = DecodeSettings()
  model_name: str = "transformer"  # which model (transformer.nn.MODELS); config.model holds its fields

  # --- What is trained: seeds, data, steps and the loss
  seed: int = 0  # seed of parameters and dropout (and of the data order unless data_seed is set)
  data_seed: int = -1  # seed of the data order; -1: use seed
  num_seeds: int = 1  # >1: replicas with seeds seed, seed+1, ... trained in one program by jax.vmap (not pmap)
  # Variants in the same program (not pmap): "FIELD=V1,V2,...[;FIELD=...]" over SWEEPABLE fields, e.g.
  # "optimizer.learning_rate=1e-3,3e-3"; fields in one sweep are zipped. Each variant trains num_seeds replicas.
  sweep: str = ""
  batch_size: int = 64  # global batch (examples), over all devices and hosts
  grad_accum_steps: int = 1  # micro-batches per optimizer step (batch_size must divide by it)
  num_train_steps: int = 1000
  label_smoothing: float = 0.0  # 0.1 in the paper
  # Word dropout of seq2seq tasks (ops.token_dropout): the probability of replacing a source token, or a
  # decoder input token (the labels stay whole), by the unknown token. 0 in the paper.
  source_token_dropout: float = 0.0
  target_token_dropout: float = 0.0
  restore_from: str = ""  # another run's workdir: start from its latest parameters (fine-tuning: params only)
  # A step with a non-finite loss or gradient norm: False stops the run (TrainingDiverged, non-zero exit);
  # True skips its update (counted in train/skipped_steps) and trains on.
  skip_nonfinite_steps: bool = False
  # With skip_nonfinite_steps: stop (TrainingDiverged) when more than this share of a logging window's steps
  # were skipped: a run that skips most of its steps is not training.
  max_skipped_share: float = 0.5

  # --- Devices: how the same training is laid out
  # jit: a mesh of this process's first device; mesh: of every device of every process; pmap: classic data parallel
  parallelism: str = setting("jit", Effect.LAYOUT)
  fsdp: bool = setting(False, Effect.LAYOUT)  # with parallelism=mesh: shard parameters and optimizer state over devices
  # With parallelism=mesh: devices along the mesh's model axis, which splits attention heads, feed-forward
  # width and vocabulary (AXIS_RULES); the batch is split over the rest.
  tensor_parallelism: int = setting(1, Effect.LAYOUT)
  # With parallelism=mesh: a hybrid mesh, FSDP and tensor parallelism within each process's devices and data
  # parallelism across processes (the hosts axis), so parameters are gathered over a host's own links only.
  hybrid_mesh: bool = setting(False, Effect.LAYOUT)
  # Changes to the rule table (AXIS_RULES, FSDP_RULES, ACTIVATION_RULES), "NAME=AXIS[,NAME=AXIS]", e.g. "vocab=none"
  # keeps the vocabulary (and the logits' vocabulary) whole on every device of the model axis.
  axis_rules: str = setting("", Effect.LAYOUT)
  # Steps per compiled call (a lax.scan; same results); log_every, eval_every, checkpoint_every are multiples of it
  steps_per_call: int = setting(1, Effect.BOOKKEEPING)

  # --- Schedule of the loop's actions
  log_every: int = setting(50, Effect.BOOKKEEPING)  # steps between metrics.jsonl lines
  eval_every: int = setting(500, Effect.BOOKKEEPING)  # steps between evaluations (and at the end)
  # More evaluators, each with its own split and period: "SPLIT:EVERY[;SPLIT:EVERY]", e.g. "test:2000" logs the
  # loss metrics of the test split as test/<name> every 2,000 steps (and at the end), beside eval_every's.
  evaluators: str = setting("", Effect.EVALUATION)
  checkpoint_every: int = setting(200, Effect.BOOKKEEPING)  # steps between checkpoints (and at the end, and on SIGTERM)
  # Also save once this many seconds have passed since the last save (0: off), checked at each log step (where
  # the loop waits for the device anyway; process 0's clock decides for all): a slow step costs at most this much
  # work, whatever the step time.
  checkpoint_every_seconds: float = setting(0.0, Effect.BOOKKEEPING)
  # profile_steps > 0: a jax.profiler trace of the steps after profile_start (WORKDIR/profile: TensorBoard's
  # profile tab or Perfetto); profile_start leaves compilation and the first steps out.
  profile_start: int = setting(10, Effect.BOOKKEEPING)
  profile_steps: int = setting(0, Effect.BOOKKEEPING)

  # --- Evaluation
  eval_batch_size: int = setting(256, Effect.BOOKKEEPING)
  # e.g. "eval/exact_match": also keep the best checkpoint by this metric
  best_metric: str = setting("", Effect.EVALUATION)
  best_mode: str = setting("max", Effect.EVALUATION)  # max | min
  # eval/predict/translate: mean parameters of the last N checkpoints (Vaswani et al. 2017 averaged the
  # last 5; outputs go to WORKDIR/average_last_N) instead of the best; 0 = off
  average_checkpoints: int = setting(0, Effect.BOOKKEEPING)

  # --- Checkpointing and the workdir
  keep_checkpoints: int = setting(3, Effect.BOOKKEEPING)  # the latest checkpoints kept (and the best, besides)
  async_checkpointing: bool = setting(True, Effect.BOOKKEEPING)
  # Train: allow starting from step 0 in a workdir that holds an earlier run's metrics but no
  # checkpoint to resume from (its files are moved to WORKDIR/previous-<time>/); off, such a start is refused.
  restart: bool = setting(False, Effect.BOOKKEEPING)
  # Resuming (or evaluating) with settings that change a run's results is refused; "field,field" (e.g.
  # "optimizer.learning_rate") accepts those changes, recorded in WORKDIR/config_history.jsonl.
  accept_changes: str = setting("", Effect.BOOKKEEPING)

  # --- Output
  translate_input: str = setting("", Effect.LOCAL)  # --mode=translate reads this file ("" = standard input)
  translate_output: str = setting("", Effect.LOCAL)  # and writes this file ("" = standard output)
  quiet: bool = setting(False, Effect.LOCAL)  # no progress bar
  tensorboard: bool = setting(True, Effect.LOCAL)
  record_text: str = dataclasses.field(default="{}", compare=False, repr=False)

  @property
  def record(self) -> dict:
    """The configuration's values as given, as JSON values (nested dicts): a new copy at each call."""
    return json.loads(self.record_text)

  @classmethod
  def scalar_fields(cls) -> tuple[dataclasses.Field, ...]:
    """The top-level fields of the ``ConfigDict`` that are plain values (not sections)."""
    return tuple(field for field in dataclasses.fields(cls) if field.name not in SECTIONS + ("record_text",))

  def effects(self) -> dict[str, Effect]:
    """``{"a.b": Effect}`` of every field of this run's configuration, sections included (``task.source_dir``)."""
    effects = {name: effect for name, effect in field_effects(RunConfig).items()
               if name not in SECTIONS + ("record_text",)}
    for name in SECTIONS:
      effects.update(field_effects(type(getattr(self, name)), f"{name}.",
                                   SECTION_EFFECTS.get(name, Effect.RESULTS)))
    return effects

  def fields_with(self, *kinds: Effect) -> tuple[str, ...]:
    """The fields (``"task.data_dir"``) whose effect is one of ``kinds``: ``fields_with(Effect.LOCAL)`` are the
    settings a command reproducing the run leaves out."""
    return tuple(name for name, effect in self.effects().items() if effect in kinds)

  @classmethod
  def from_config(cls, config) -> RunConfig:
    """Resolve and check a ``ConfigDict`` (or nested mapping); a field it lacks takes its default, so a run saved
    before a field existed keeps the behaviour it had.

    Raises:
      ConfigError: an unknown field (with a "did you mean"), a bad value, or settings that do not go together.
    """
    values = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    record = config.to_json_best_effort() if hasattr(config, "to_json_best_effort") else json.dumps(values)
    names = [field.name for field in cls.scalar_fields()]
    for name in values:
      if name not in names + list(SECTIONS):
        close = difflib.get_close_matches(name, names, n=1)
        raise ConfigError(f"config has no field {name!r}." + (f" Did you mean {close[0]!r}?" if close else ""))
    for name in SECTIONS:
      _require(isinstance(values.get(name, {}), Mapping),
               f"config.{name} must be a section of fields (e.g. config.{name}.<field>), got {values.get(name)!r}.")
    check_field_types(cls, {name: values[name] for name in names if name in values}, "config")
    model_name = values.get("model_name", "transformer")
    task_section = values.get("task", {"name": ""})
    return cls(model=_model_config(model_name, values.get("model", {})),
               task=task_config(task_section) if task_section.get("name") else TaskConfig.from_dict(task_section),
               optimizer=_section(OptimizerConfig, values.get("optimizer", {}), "optimizer"),
               decode=_section(DecodeSettings, values.get("decode", {}), "decode"),
               record_text=json.dumps(json.loads(record), sort_keys=True),
               **{name: values[name] for name in names if name in values})

  def __post_init__(self):
    self.replicas  # pylint: disable=pointless-statement  # parse (and check) config.sweep once, here
    for name in ("batch_size", "num_train_steps", "log_every", "eval_every", "checkpoint_every", "keep_checkpoints",
                 "grad_accum_steps", "num_seeds", "eval_batch_size", "tensor_parallelism"):
      value = getattr(self, name)
      _require(isinstance(value, int) and not isinstance(value, bool) and value >= 1,
               f"config.{name} must be a positive integer, got {value!r}.")
    _require(isinstance(self.checkpoint_every_seconds, (int, float)) and not isinstance(
        self.checkpoint_every_seconds, bool) and self.checkpoint_every_seconds >= 0,
             f"config.checkpoint_every_seconds must be a number of seconds >= 0 (0: off), got "
             f"{self.checkpoint_every_seconds!r}.")
    _require(isinstance(self.average_checkpoints, int) and self.average_checkpoints >= 0,
             "config.average_checkpoints must be an integer >= 0 (0 = use the best checkpoint), got "
             f"{self.average_checkpoints!r}.")
    # Seeds feed numpy's generators (non-negative only) and JAX keys (64-bit); replicas add their index.
    for name, value in (("seed", self.seed), ("data_seed", self.order_seed)):
      _require(isinstance(value, int) and not isinstance(value, bool) and 0 <= value < MAX_SEED,
               f"config.{name} must be an integer in [0, 2**62){' (or -1: use seed)' if name == 'data_seed' else ''}, "
               f"got {getattr(self, name)!r}.")
    _require(self.batch_size % self.grad_accum_steps == 0,
             f"config.batch_size={self.batch_size} must be divisible by config.grad_accum_steps="
             f"{self.grad_accum_steps}.")
    _require(self.parallelism in PARALLELISMS,
             f"config.parallelism={self.parallelism!r} is not supported; choose one of {list(PARALLELISMS)}.")
    _require(not self.fsdp or self.parallelism == "mesh",
             "config.fsdp=True shards parameters over a mesh's data axis: set --config.parallelism=mesh (or fsdp=False).")
    _require(not self.hybrid_mesh or self.parallelism == "mesh",
             "config.hybrid_mesh=True lays a mesh out over hosts: set --config.parallelism=mesh (or hybrid_mesh=False).")
    _require(self.tensor_parallelism == 1 or self.parallelism == "mesh",
             f"config.tensor_parallelism={self.tensor_parallelism} splits layers over a mesh's model axis: set "
             "--config.parallelism=mesh (or tensor_parallelism=1).")
    self._check_heads_stay_whole()
    self._check_steps_per_call()
    self._check_replicas()
    self.extra_evaluators  # pylint: disable=pointless-statement  # parse (and check) config.evaluators once
    _require(isinstance(self.profile_steps, int) and self.profile_steps >= 0 and self.profile_start >= 0,
             f"config.profile_steps={self.profile_steps!r} and config.profile_start={self.profile_start!r} must be "
             "integers >= 0 (profile_steps 0: no trace).")
    _require(not self.profile_steps or self.profile_start < self.num_train_steps,
             f"config.profile_start={self.profile_start} is not before config.num_train_steps={self.num_train_steps}: "
             "the trace would never start. Lower profile_start, or set profile_steps=0 for no trace.")
    for name in ("label_smoothing", "source_token_dropout", "target_token_dropout"):
      _require(0.0 <= getattr(self, name) < 1.0, f"config.{name}={getattr(self, name)} is outside [0, 1).")
    _require(0.0 < self.max_skipped_share <= 1.0, f"config.max_skipped_share={self.max_skipped_share} is outside "
             "(0, 1].")
    _require(self.best_mode in ("max", "min"), f"config.best_mode={self.best_mode!r}: choose 'max' or 'min'.")
    _require(not self.restore_from or os.path.isdir(self.restore_from),
             f"config.restore_from={self.restore_from!r} is not a directory; give the workdir of the run to start "
             "from.")

  @functools.cached_property
  def logical_axis_rules(self) -> Rules:
    """The run's rule table (``logical_axis_rules`` of ``fsdp`` and ``axis_rules``)."""
    return logical_axis_rules(self.fsdp, self.axis_rules)

  @functools.cached_property
  def replicas(self) -> Replicas:
    return Replicas.parse(self.sweep, self.num_seeds)

  def task_settings(self) -> TaskSettings:
    """What the task of this run reads of it."""
    return TaskSettings(model_name=self.model_name, model=self.model, task=self.task, decode=self.decode,
                        label_smoothing=self.label_smoothing, source_token_dropout=self.source_token_dropout,
                        target_token_dropout=self.target_token_dropout, eval_batch_size=self.eval_batch_size,
                        order_seed=self.order_seed, quiet=self.quiet, num_replicas=self.replicas.count)

  @functools.cached_property
  def extra_evaluators(self) -> tuple[tuple[str, int], ...]:
    """``config.evaluators`` as ``(split, every)`` pairs, checked."""
    pairs = []
    for part in filter(None, (part.strip() for part in self.evaluators.split(";"))):
      split, _, every = part.partition(":")
      split = split.strip()
      try:
        every = int(every)
      except ValueError:
        every = 0
      _require(bool(split) and every >= 1, f"config.evaluators={self.evaluators!r}: write each evaluator as "
               "SPLIT:EVERY with a positive number of steps, e.g. 'test:2000'.")
      _require(split not in ("train", "eval", "time") and split not in [name for name, _ in pairs],
               f"config.evaluators={self.evaluators!r}: {split!r} is named twice or is a metric prefix of its own "
               "(train, eval, time); name each split once.")
      _require(every % self.steps_per_call == 0, f"config.evaluators={self.evaluators!r}: every {every} is not a "
               f"multiple of config.steps_per_call={self.steps_per_call} (actions run between compiled calls).")
      pairs.append((split, every))
    return tuple(pairs)

  @property
  def order_seed(self) -> int:
    """The seed of the data order: ``data_seed``, or ``seed`` when it is -1."""
    return self.seed if self.data_seed < 0 else self.data_seed

  @property
  def accepted_changes(self) -> set[str]:
    """The fields ``accept_changes`` ("field,field") names."""
    return {field.strip() for field in self.accept_changes.split(",") if field.strip()}

  def variant_optimizers(self) -> list[OptimizerConfig]:
    """Each variant's optimizer settings: ``optimizer`` with the variant's swept values (one without a sweep)."""
    variants = []
    for index in range(self.replicas.num_variants):
      changes = {field.partition(".")[2]: values[index] for field, values in self.replicas.sweep
                 if field.startswith("optimizer.")}
      if "warmup_steps" in changes:
        changes["warmup_steps"] = int(changes["warmup_steps"])
      variants.append(self.optimizer.replace(**changes))
    return variants

  def _check_steps_per_call(self) -> None:
    """A positive integer that the actions' periods divide, on a strategy that scans."""
    value = self.steps_per_call
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
      raise ConfigError(f"config.steps_per_call must be a positive integer (train steps per compiled call; 1 = one "
                        f"step per call), got {value!r}.")
    for name in ("log_every", "eval_every", "checkpoint_every"):
      period = getattr(self, name)
      if period % value:
        raise ConfigError(f"config.{name}={period} is not a multiple of config.steps_per_call={value} (actions "
                          f"run between compiled calls); set config.{name} to a multiple of {value}, e.g. "
                          f"{-(-period // value) * value}, or choose a steps_per_call that divides it.")
    if value > 1 and self.parallelism == "pmap":
      raise ConfigError(f"config.steps_per_call={value} works with config.parallelism 'jit' or 'mesh', not 'pmap'; "
                        "choose one of those, or steps_per_call=1.")

  def _check_heads_stay_whole(self) -> None:
    """A model axis that splits attention heads must not cut through one: the heads (and the key/value heads of
    grouped-query attention) must be a multiple of ``tensor_parallelism`` where the rules split them."""
    rules, devices = dict(self.logical_axis_rules), self.tensor_parallelism
    heads = getattr(self.model, "num_heads", None)
    if devices == 1 or heads is None:
      return
    for name, field, count in (("heads", "num_heads", heads),
                               ("kv_heads", "num_kv_heads", getattr(self.model, "num_kv_heads", None) or heads)):
      _require(rules.get(name) != MODEL_AXIS or count % devices == 0,
               f"config.tensor_parallelism={devices} would split inside an attention head: config.model.{field}="
               f"{count} is not a multiple of it. Choose a tensor_parallelism that divides {count}, or keep those "
               f"heads whole on every device of the model axis with --config.axis_rules='{name}=none'.")

  def _check_replicas(self) -> None:
    swept = self.replicas.swept
    _require(self.num_seeds == 1 or self.parallelism != "pmap",
             "config.num_seeds > 1 (vmap over seeds) needs config.parallelism 'jit' or 'mesh', not 'pmap'.")
    _require(not swept or self.parallelism != "pmap",
             f"config.sweep={self.sweep!r} (vmap over variants) needs config.parallelism 'jit' or 'mesh', not 'pmap'.")
    for value in swept.get("optimizer.learning_rate", ()):
      _require(value > 0, f"config.sweep={self.sweep!r}: every learning rate must be > 0, got {value:g}.")
    for value in swept.get("optimizer.warmup_steps", ()):
      _require(value >= 0 and value == int(value),
               f"config.sweep={self.sweep!r}: warmup steps must be whole numbers >= 0, got {value:g}.")
    for value in swept.get("label_smoothing", ()):
      _require(0.0 <= value < 1.0, f"config.sweep={self.sweep!r}: label_smoothing={value:g} is outside [0, 1).")


def _require(condition: bool, message: str) -> None:
  if not condition:
    raise ConfigError(message)


def _section(cls, values: Mapping, name: str):
  """``config.<name>`` as its dataclass ``cls``; errors name the section and how to set a field."""
  try:
    return cls.from_dict(values) if issubclass(cls, ValidatedConfig) else _from_mapping(cls, values, name)
  except ConfigError as error:
    message = str(error)
    raise ConfigError(message if message.startswith(f"config.{name}") else f"config.{name}: {message}") from None


def _from_mapping(cls, values: Mapping, name: str):
  """A plain frozen dataclass (``DecodeSettings``, which knows nothing of configs) from a mapping."""
  fields = [field.name for field in dataclasses.fields(cls)]
  unknown = sorted(set(values) - set(fields))
  if unknown:
    raise ConfigError(f"config.{name} has no field {unknown[0]!r}; its fields are {fields}.")
  check_field_types(cls, values, f"config.{name}")
  try:
    return cls(**values)
  except ValueError as error:
    raise ConfigError(f"config.{name}: {error} Set it with --config.{name}.<field>=...") from None


def model_fields(model_name: str) -> tuple[str, ...]:
  """The fields of ``config.model`` for ``model_name``: its config dataclass's, less ``DECIDED_ELSEWHERE``."""
  return tuple(field.name for field in dataclasses.fields(model_spec(model_name).config)
               if field.name not in DECIDED_ELSEWHERE)


def _model_config(model_name: str, values: Mapping):
  """``config.model`` as the dataclass of ``model_name``, which must be that model's section (it is built with the
  model: ``transformer.train.config.set_model``), with values the dataclass accepts."""
  config_class = model_spec(model_name).config
  # Which models' sections hold exactly these fields (the others' configs imported only when this one's differ).
  holds = [model_name] if set(model_fields(model_name)) == set(values) else [
      name for name in MODELS if set(model_fields(name)) == set(values)]
  unknown = sorted(set(values) - set(model_fields(model_name)))
  if values and not holds and unknown:  # a misspelt field rather than another model's section
    raise ConfigError(f"config.model: {config_class.unknown_field_message(unknown[0])}")
  # A section of fewer fields and none unknown: a run saved before fields were added (they take their defaults).
  if values and holds and model_name not in holds:
    raise ConfigError(
        f"config.model_name={model_name!r}, but config.model holds the fields of "
        f"{holds[0] if holds else 'another model'!r}. The model section is built with the model: choose an "
        "experiment variant of that model (or call set_model in the config file) rather than overriding "
        "--config.model_name.")
  try:  # the dataclass's own checks (choices, sizes, rates), before any data is loaded
    return config_class.from_dict(values)
  except ConfigError:
    raise
  except ValueError as error:  # a check that raises a plain ValueError still names a config.model value
    raise ConfigError(str(error)) from error


def build_task(run_config) -> Task:
  """The task of ``run_config`` (a ``RunConfig``, or a ``ConfigDict`` it is resolved from), built from its
  ``task_settings``: a clear error for an unknown task name or a missing extra."""
  run_config = run_config if isinstance(run_config, RunConfig) else RunConfig.from_config(run_config)
  return make_task(run_config.task_settings())


MODES = ("train", "eval", "predict", "translate")


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
  defaults = model_spec(model_name).config()
  section = ml_collections.ConfigDict({name: getattr(defaults, name) for name in model_fields(model_name)})
  section.lock()
  return section


def set_model(config: ml_collections.ConfigDict, model_name: str) -> ml_collections.ConfigDict:
  """Make ``config`` train ``model_name``: ``config.model_name`` and a fresh ``config.model`` of its defaults."""
  config.model_name = model_name
  config.model = model_section(model_name)
  return config


def base_config(model_name: str = "transformer") -> ml_collections.ConfigDict:
  """The defaults every experiment starts from (``RunConfig``'s fields, where each is documented), with the model
  ``model_name`` (a key of ``transformer.nn.MODELS``; its defaults: for "transformer", the paper's base model)."""
  config = ml_collections.ConfigDict({field.name: field.default for field in RunConfig.scalar_fields()})
  config.task = ml_collections.ConfigDict({"name": ""})  # which task (transformer.tasks.TASKS) and its data
  set_model(config, model_name)  # the task fills in what the data decides
  config.optimizer = ml_collections.ConfigDict(dataclasses.asdict(OptimizerConfig()))
  config.decode = ml_collections.ConfigDict(dataclasses.asdict(DecodeSettings()))
  return config


def validate_config(config: ml_collections.ConfigDict, workdir: str | None = None, mode: str = "train") -> RunConfig:
  """The run description of ``config`` (``RunConfig.from_config``: every value checked before anything is
  compiled, a message naming the field and the fix); ``workdir``: a training run's, checked to be writable."""
  if mode not in MODES:
    raise ConfigError(f"--mode={mode!r} is not supported; choose one of {list(MODES)}.")
  run_config = RunConfig.from_config(config)
  if workdir is not None:
    check_workdir(workdir)
  return run_config


def check_workdir(workdir: str) -> None:
  """The workdir of a training run: a local path (``refuse_url_workdir``) to a directory (created if missing)
  this process can write to."""
  refuse_url_workdir(workdir)
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


def refuse_url_workdir(workdir: str) -> None:
  """Every mode reads and writes the workdir with ``os`` and ``open``, which take ``gs://bucket/run`` for a local
  folder named ``gs:``: refuse any ``scheme://`` workdir before anything is written.

  Raises:
    WorkdirError: ``workdir`` is a URL; the message names the fix (mount the bucket, pass the mount path).
  """
  scheme, separator, rest = workdir.partition("://")
  if not separator or not re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]*", scheme):
    return
  fix = (f"give the path itself, --workdir={rest}" if scheme.lower() == "file" else
         f"mount the bucket (e.g. with gcsfuse) and pass the mount path, e.g. --workdir=/mnt/{rest}")
  raise WorkdirError(f"--workdir={workdir!r} is a URL, but the workdir is read and written as local files: {fix}.")
