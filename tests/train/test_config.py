"""transformer/train/config.py: one model section per config and its validation."""
import dataclasses

import pytest

from transformer.errors import ConfigError
from transformer.nn import ModelConfig, RNNConfig
from transformer.train.config import DECIDED_ELSEWHERE
from transformer.train.config import base_config, set_model, validate_config


def test_the_model_section_holds_the_named_models_fields_and_defaults():
  for model_name, config_class in (("transformer", ModelConfig), ("rnn", RNNConfig)):
    config = base_config(model_name)
    expected = {field.name: field.default for field in dataclasses.fields(config_class)
                if field.name not in DECIDED_ELSEWHERE}
    assert config.model_name == model_name and config.model.to_dict() == expected
  assert "num_classes" not in base_config("transformer").model  # the classifier's fields: its own config
  assert base_config("encoder_classifier").model.pooling == "mean"
  config = set_model(base_config("transformer"), "rnn")
  assert config.model_name == "rnn" and config.model.cell == "gru" and "d_model" not in config.model
  with pytest.raises(AttributeError, match="num_heads"):  # locked: a field the model lacks is an error
    config.model.num_heads = 4
  with pytest.raises(ConfigError, match="Did you mean 'transformer'"):
    base_config("transfomer")


def test_validation_checks_the_model_section_before_any_data():
  config = base_config("rnn")
  validate_config(config)
  config.model.hidden_dim = 7  # RNNConfig's own check, as a ConfigError
  with pytest.raises(ConfigError, match=r"RNNConfig\.hidden_dim=7\b"):
    validate_config(config)
  config = base_config("transformer")
  config.model_name = "rnn"  # a name without its section
  with pytest.raises(ConfigError, match=r"config\.model_name='rnn'.*config\.model .*'transformer'"):
    validate_config(config)
  config.model_name = "lstm"
  with pytest.raises(ConfigError, match=r"config\.model_name='lstm'"):
    validate_config(config)



def test_a_seq2seq_task_refuses_a_model_that_is_not_seq2seq():
  from tests.train.conftest import load_experiment_config
  from transformer.train.config import build_task
  config = set_model(load_experiment_config("synthetic", "copy"), "encoder_classifier")
  with pytest.raises(ConfigError, match=r"config\.model_name='encoder_classifier'.*'synthetic'"):
    build_task(config).model_config()


def test_a_workdir_of_another_model_is_refused_and_a_field_added_since_compares_as_its_default(tmp_path):
  """model_config.json of a run: another model is refused naming the field; a field the code added since the
  run was saved compares as its default. (Runs of older formats: tests/train/test_convert_run.py.)"""
  import json

  from transformer.train.workdir import write_format
  from transformer.train.workdir import check_workdir_model as _check_workdir_model
  model_config = ModelConfig(d_model=64, num_heads=4)
  saved = dataclasses.asdict(model_config)
  write_format(str(tmp_path))
  (tmp_path / "model_config.json").write_text(json.dumps(saved))
  _check_workdir_model(str(tmp_path), model_config, has_checkpoints=True, write=False)
  # Rematerialisation recomputes the same layers (docs/training.md): a resumed run may turn it on.
  _check_workdir_model(str(tmp_path), model_config.replace(remat="dots"), has_checkpoints=True, write=False)
  with pytest.raises(ConfigError, match="d_model: 64 -> 128"):
    _check_workdir_model(str(tmp_path), model_config.replace(d_model=128), has_checkpoints=True, write=False)
  with pytest.raises(ConfigError, match="d_model: 64 -> None"):
    _check_workdir_model(str(tmp_path), RNNConfig(), has_checkpoints=True, write=False)
  # A field added since (here kernels, num_token_types, embedding_norm are left out) compares as its default.
  for added in ("kernels", "num_token_types", "embedding_norm"):
    del saved[added]
  (tmp_path / "model_config.json").write_text(json.dumps(saved))
  _check_workdir_model(str(tmp_path), model_config, has_checkpoints=True, write=False)
  with pytest.raises(ConfigError, match="num_token_types: 0 -> 2"):
    _check_workdir_model(str(tmp_path), model_config.replace(num_token_types=2), has_checkpoints=True,
                         write=False)


@pytest.mark.parametrize("field, value, message", [("method", "nucleus", "method"), ("top_p", 0.0, "top_p"),
                                                   ("temperature", -1.0, "temperature"),
                                                   ("finish_rule", "flax", "finish_rule"),
                                                   ("seed", 2 ** 62, "seed must be an integer in")])
def test_bad_decode_settings_are_config_errors(field, value, message):
  config = base_config()
  config.decode[field] = value
  with pytest.raises(ConfigError, match=f"config.decode: .*{message}"):
    validate_config(config)


@pytest.mark.parametrize("overrides, message", [
    ({"seed": -1}, r"config.seed must be an integer in \[0, 2\*\*62\), got -1"),
    ({"data_seed": 2 ** 62}, r"config.data_seed must be an integer in \[0, 2\*\*62\) \(or -1: use seed\)"),
    ({"fsdp": True}, "config.fsdp=True shards parameters over a mesh's data axis: set --config.parallelism=mesh"),
    ({"axis_rules": "vocab=gpu"}, r"config.axis_rules='vocab=gpu': 'vocab=gpu' is not NAME=AXIS .* one of data, "
                                  "model, none"),
    ({"axis_rules": "embed=data,hidden=model"}, r"'hidden=model' is not NAME=AXIS with NAME a logical axis \(layers, vocab"),
    ({"optimizer.b1": 1.5}, r"config.optimizer.b1=1.5 is outside \[0, 1\)"),
    ({"optimizer.b2": -0.1}, r"config.optimizer.b2=-0.1 is outside \[0, 1\)"),
    ({"optimizer.eps": 0.0}, "config.optimizer.eps must be > 0"),
    ({"optimizer.grad_clip_norm": -1.0}, "must be >= 0 .0 turns either off"),
    # (was: no trace and no word)
    ({"profile_steps": 5, "profile_start": 1000}, "config.profile_start=1000 is not before "
                                                 "config.num_train_steps=1000: the trace would never start"),
])
def test_bad_run_settings_name_the_field(overrides, message):
  config = base_config()
  for key, value in overrides.items():
    section, _, field = key.rpartition(".")
    (config[section] if section else config)[field] = value
  with pytest.raises(ConfigError, match=message):
    validate_config(config)
