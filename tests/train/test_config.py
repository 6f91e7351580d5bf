"""transformer/train/config.py: one model section per config, its validation, and old configs' migration."""
import dataclasses

import pytest

from transformer.errors import ConfigError
from transformer.nn import ModelConfig, RNNConfig
from transformer.train.config import (DECIDED_ELSEWHERE, base_config, decode_section, set_model, upgrade_config,
                                       validate_config)


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
  with pytest.raises(ConfigError, match="RNNConfig.hidden_dim=7 must be even"):
    validate_config(config)
  config = base_config("transformer")
  config.model_name = "rnn"  # a name without its section
  with pytest.raises(ConfigError, match="config.model_name='rnn', but config.model holds the fields of "
                                        "'transformer'"):
    validate_config(config)
  config.model_name = "lstm"
  with pytest.raises(ConfigError, match="'lstm' is not a known model"):
    validate_config(config)



def test_a_seq2seq_task_refuses_a_model_that_is_not_seq2seq():
  from tests.train.conftest import load_experiment_config
  from transformer.tasks import build_task
  config = set_model(load_experiment_config("synthetic", "copy"), "encoder_classifier")
  with pytest.raises(ConfigError, match="'encoder_classifier' is not a sequence-to-sequence model; the "
                                        "'synthetic' task trains one of \\['transformer', 'rnn'\\]"):
    build_task(config).model_config()


def test_upgrade_config_maps_the_old_sections_to_the_chosen_models_section():
  transformer = {"d_model": 128, "num_heads": 4, "num_classes": 2, "pooling": "mean"}
  rnn = {"cell": "lstm", "hidden_dim": 256}
  old_rnn_run = {"architecture": "rnn", "model": transformer, "rnn": rnn, "seed": 3, "task": {"name": "t"}}
  assert upgrade_config(old_rnn_run) == {"model_name": "rnn", "model": rnn, "seed": 3, "task": {"name": "t"},
                                         "decode": decode_section().to_dict()}
  # Before RNNs there was no architecture field: a Transformer, less the fields moved to ClassifierConfig.
  assert upgrade_config({"model": transformer, "seed": 3}) == {
      "model_name": "transformer", "model": {"d_model": 128, "num_heads": 4}, "seed": 3}
  new_shape = upgrade_config(old_rnn_run)
  again = upgrade_config(new_shape)
  assert again == new_shape and again is not new_shape
  again["model"]["cell"] = "gru"  # a copy: the argument stays as it was
  assert new_shape["model"]["cell"] == "lstm" and old_rnn_run["rnn"]["cell"] == "lstm"
  assert upgrade_config({"num_train_steps": 4}) == {"num_train_steps": 4}  # no model section: nothing to map


def test_a_workdir_saved_before_the_classifier_fields_moved_still_resumes(tmp_path):
  """model_config.json of a Transformer run saved with ModelConfig's former num_classes and pooling: the same
  model today; another model is still refused."""
  import json

  from transformer.train.session import check_workdir_model as _check_workdir_model
  model_config = ModelConfig(d_model=64, num_heads=4)
  saved = {**dataclasses.asdict(model_config), "num_classes": 2, "pooling": "mean"}
  (tmp_path / "model_config.json").write_text(json.dumps(saved))
  _check_workdir_model(str(tmp_path), model_config, has_checkpoints=True, write=False)
  with pytest.raises(ValueError, match="holds checkpoints of a different model .*d_model: 64 -> 128"):
    _check_workdir_model(str(tmp_path), model_config.replace(d_model=128), has_checkpoints=True, write=False)
  with pytest.raises(ValueError, match="holds checkpoints of a different model .*d_model: 64 -> None"):
    _check_workdir_model(str(tmp_path), RNNConfig(), has_checkpoints=True, write=False)
  # A field added since (here kernels, num_token_types, embedding_norm are left out) compares as its default.
  for added in ("kernels", "num_token_types", "embedding_norm"):
    del saved[added]
  (tmp_path / "model_config.json").write_text(json.dumps(saved))
  _check_workdir_model(str(tmp_path), model_config, has_checkpoints=True, write=False)
  with pytest.raises(ValueError, match="num_token_types: 0 -> 2"):
    _check_workdir_model(str(tmp_path), model_config.replace(num_token_types=2), has_checkpoints=True,
                         write=False)


def test_upgrade_config_moves_the_old_beam_settings_into_decode():
  old = {"model_name": "transformer", "task": {"name": "translation", "beam_size": 5, "length_penalty": 1.0}}
  upgraded = upgrade_config(old)
  assert upgraded["task"] == {"name": "translation"}
  assert upgraded["decode"] == {**decode_section().to_dict(), "method": "beam", "beam_size": 5, "length_penalty": 1.0}
  assert upgrade_config({"task": {"name": "t", "beam_size": 1}})["decode"]["method"] == "greedy"


@pytest.mark.parametrize("field, value, message", [("method", "nucleus", "method"), ("top_p", 0.0, "top_p"),
                                                   ("temperature", -1.0, "temperature"),
                                                   ("finish_rule", "flax", "finish_rule")])
def test_bad_decode_settings_are_config_errors(field, value, message):
  config = base_config()
  config.decode[field] = value
  with pytest.raises(ConfigError, match=f"config.decode: .*{message}"):
    validate_config(config)
