"""The run description: ``RunConfig.from_config`` reads the ``ConfigDict`` once into typed, frozen settings."""
import dataclasses
import json
import re

import pytest

from tests.train.conftest import load_experiment_config
from transformer.decode import DecodeSettings
from transformer.effects import Effect
from transformer.errors import ConfigError
from transformer.nn import ModelConfig, RNNConfig
from transformer.train.config import build_task
from transformer.tasks.configs import SyntheticConfig
from transformer.train.config import OptimizerConfig
from transformer.train.config import Replicas
from transformer.train.config import RunConfig
from transformer.train.config import base_config, set_model


def test_the_base_config_is_the_run_configs_defaults():
  run = RunConfig.from_config(base_config())
  for field in RunConfig.scalar_fields():
    assert getattr(run, field.name) == field.default, field.name
  assert run.model == ModelConfig() and run.optimizer == OptimizerConfig() and run.decode == DecodeSettings()
  assert type(RunConfig.from_config(set_model(base_config(), "rnn")).model) is RNNConfig


def test_sections_are_typed_and_the_whole_is_frozen():
  run = RunConfig.from_config(load_experiment_config("synthetic", "copy"))
  assert isinstance(run.task, SyntheticConfig) and run.task.kind == "copy"
  assert isinstance(run.optimizer.frozen_params, tuple)
  with pytest.raises(dataclasses.FrozenInstanceError):
    run.batch_size = 1  # type: ignore[misc]


def test_the_record_is_the_config_as_json_values():
  config = load_experiment_config("synthetic", "copy")
  config.optimizer.frozen_params = ("encoder/embedding",)
  run = RunConfig.from_config(config)
  assert run.record == json.loads(config.to_json_best_effort())
  assert run.record["optimizer"]["frozen_params"] == ["encoder/embedding"]


# The wording is not the point here: each case checks the error's type and that it names the field (and the
# section); the "Did you mean" suggestions keep their sentence, since the suggestion is the point.
@pytest.mark.parametrize("field,value,message", [
    ("batch_sise", 8, "config has no field 'batch_sise'. Did you mean 'batch_size'?"),
    ("batch_size", 0, "config.batch_size"),
    ("parallelism", "pjit", "config.parallelism='pjit'"),
    ("sweep", "model.d_model=64,128", "config.sweep='model.d_model=64,128'"),
    ("sweep", "optimizer.learning_rate=1e-3,x", "config.sweep='optimizer.learning_rate=1e-3,x'"),
    ("steps_per_call", 3, "config.steps_per_call=3"),
    ("label_smoothing", "0.1", "config.label_smoothing='0.1'"),
    ("batch_size", True, "config.batch_size=True"),
    ("task", "synthetic", "config.task"),
])
def test_a_bad_top_level_value_fails_when_resolved_naming_the_field(field, value, message):
  values = load_experiment_config("synthetic", "copy").to_dict()
  values[field] = value
  with pytest.raises(ConfigError, match=re.escape(message)):
    RunConfig.from_config(values)


@pytest.mark.parametrize("section,field,value,message", [
    ("optimizer", "schedule", "linear", "config.optimizer.schedule"),
    ("optimizer", "learning_rate", "3e-4", "config.optimizer: OptimizerConfig.learning_rate"),
    ("model", "d_modle", 64, "config.model: ModelConfig has no field 'd_modle'. Did you mean 'd_model'?"),
    ("task", "name", 3, "config.task.name"),
    ("decode", "temperature", None, "config.decode.temperature"),
    ("model", "dropout_rate", "0.1", "ModelConfig.dropout_rate"),
    ("task", "max_length", "12", "config.task: SyntheticConfig.max_length"),
    ("optimizer", "learnig_rate", 1e-3, "config.optimizer: OptimizerConfig has no field 'learnig_rate'. Did you mean "
                                        "'learning_rate'?"),
    ("decode", "beam_sise", 4, "config.decode has no field 'beam_sise'"),
    ("task", "max_lenght", 4, "config.task: SyntheticConfig has no field 'max_lenght'. Did you mean 'max_length'?"),
])
def test_a_bad_section_value_names_its_section(section, field, value, message):
  values = load_experiment_config("synthetic", "copy").to_dict()
  values[section][field] = value
  with pytest.raises(ConfigError, match=re.escape(message)):
    RunConfig.from_config(values)


def test_a_saved_config_lacking_a_field_added_since_takes_its_default():
  values = load_experiment_config("synthetic", "copy").to_dict()
  del values["steps_per_call"], values["optimizer"]["grad_clip_norm"], values["decode"]["top_p"]
  run = RunConfig.from_config(values)
  assert (run.steps_per_call, run.optimizer.grad_clip_norm, run.decode.top_p) == (1, 0.0, 1.0)
  assert RunConfig.from_config({}).optimizer == OptimizerConfig()  # missing sections too


def test_replicas_are_parsed_once_seeds_within_variants():
  replicas = Replicas.parse("optimizer.learning_rate=1e-3,3e-3;label_smoothing=0,0.1", num_seeds=2)
  assert (replicas.num_variants, replicas.count, replicas.sweeps_schedule) == (2, 4, True)
  assert replicas.seed_offsets() == [0, 1, 0, 1]
  assert replicas.settings() == {"variant": (0, 0, 1, 1), "label_smoothing": (0.0, 0.0, 0.1, 0.1)}
  assert Replicas.parse("label_smoothing=0,0.1", 1).settings() == {"label_smoothing": (0.0, 0.1)}
  assert Replicas.parse("", 3).count == 3 and Replicas.parse("", 3).settings() == {}
  with pytest.raises(ConfigError, match="zipped into variants"):
    Replicas.parse("optimizer.learning_rate=1e-3,3e-3;label_smoothing=0", 1)


def test_each_variant_has_its_own_optimizer_settings():
  config = load_experiment_config("synthetic", "copy")
  config.sweep = "optimizer.learning_rate=1e-3,3e-3;optimizer.warmup_steps=10,20"
  variants = RunConfig.from_config(config).variant_optimizers()
  assert [(v.learning_rate, v.warmup_steps) for v in variants] == [(1e-3, 10), (3e-3, 20)]
  assert all(isinstance(v.warmup_steps, int) and v.b2 == config.optimizer.b2 for v in variants)


def test_a_task_reads_the_typed_run_only():
  """A task built from a run whose record (the raw values) is empty gives the same model and data."""
  run = RunConfig.from_config(load_experiment_config("synthetic", "copy"))
  bare = dataclasses.replace(run, record_text="{}")
  task, bare_task = build_task(run), build_task(bare)
  assert bare_task.model_config() == task.model_config()
  batch, bare_batch = task.eval_batches(8)[0], bare_task.eval_batches(8)[0]
  assert all((batch[name] == bare_batch[name]).all() for name in batch)


def test_every_field_declares_its_effect_and_the_rules_follow_from_it():
  """The effects decide which settings a command reproducing a run leaves out, and which a resume accepts."""
  run = RunConfig.from_config(load_experiment_config("multi30k", "transformer_small"))
  effects = run.effects()
  assert set(run.fields_with(Effect.LOCAL)) == {"quiet", "tensorboard", "translate_input", "translate_output",
                                                "task.source_dir", "task.data_dir"}
  assert effects["decode.beam_size"] is Effect.EVALUATION  # the decode section's own default
  assert effects["model.remat"] is Effect.LAYOUT and effects["parallelism"] is Effect.LAYOUT
  assert effects["optimizer.learning_rate"] is Effect.RESULTS and effects["model.num_encoder_layers"] is Effect.RESULTS
  assert effects["task.bleu_tokenize"] is Effect.EVALUATION and effects["log_every"] is Effect.BOOKKEEPING
  assert set(effects) >= {f"model.{name}" for name in run.record["model"]}  # every recorded field is judged
  assert not Effect.RESULTS.accepted and Effect.LAYOUT.accepted and not Effect.BOOKKEEPING.recorded


def test_the_record_cannot_be_changed_through_the_run():
  run = RunConfig.from_config(load_experiment_config("synthetic", "copy"))
  run.record["num_train_steps"] = 1
  assert run.record["num_train_steps"] == run.num_train_steps != 1
  assert isinstance(RunConfig().model, ModelConfig)  # a run always has a model: the default transformer's


def test_a_model_section_saved_before_a_field_existed_takes_its_default():
  """A run's config.json from before config.model.remat existed still reads (as the code then behaved)."""
  config = load_experiment_config("synthetic", "copy").to_dict()
  del config["model"]["remat"]
  assert RunConfig.from_config(config).model.remat == "none"
  config["model"]["remta"] = "full"  # a misspelt field is still named
  with pytest.raises(ConfigError, match="remta"):
    RunConfig.from_config(config)
