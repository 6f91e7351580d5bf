"""ModelConfig validates at construction with messages naming the field, the bad value and the choices."""
import re

import flax.linen
import pytest

from transformer.errors import ConfigError
from transformer.nn import MODELS, ClassifierConfig, ModelConfig, RNNConfig, model_spec


@pytest.mark.parametrize("field, value, allowed", [
    ("positional_encoding", "sinusoid", ["sinusoidal", "learned", "rotary", "none"]),
    ("norm", "group_norm", ["layer_norm", "rms_norm", "batch_norm"]),
    ("norm_position", "middle", ["post", "pre"]),
    ("activation", "tanh", ["relu", "gelu", "gelu_exact"]),
    ("attention_implementation", "flash", ["dense", "chunked"]),
    ("dtype", "float16", ["float32", "bfloat16"]),
])
def test_unknown_choice_names_field_value_and_choices(field, value, allowed):
  with pytest.raises(ConfigError) as error:  # a ValueError too, for callers that catch those
    ModelConfig(**{field: value})
  message = str(error.value)
  assert f"ModelConfig.{field}={value!r}" in message
  assert str(allowed) in message


def test_heads_must_divide_d_model():
  with pytest.raises(ValueError) as error:
    ModelConfig(d_model=512, num_heads=6)
  message = str(error.value)
  assert "num_heads=6" in message and "d_model=512" in message
  # The suggested head counts all divide d_model.
  suggested = [int(h) for h in re.search(r"choose num_heads from \[([\d, ]+)\]", message).group(1).split(",")]
  assert 8 in suggested and all(512 % h == 0 for h in suggested)


def test_kv_heads_must_divide_num_heads_and_the_error_lists_the_divisors():
  assert ModelConfig(num_heads=8).kv_heads == 8 and ModelConfig(num_heads=8, num_kv_heads=2).kv_heads == 2
  with pytest.raises(ConfigError, match=r"num_kv_heads=3\b.*\[1, 2, 4, 8\]"):
    ModelConfig(num_heads=8, num_kv_heads=3)


@pytest.mark.parametrize("field", ["num_kv_heads", "attention_window"])
def test_kv_heads_and_window_are_positive_or_none(field):
  with pytest.raises(ConfigError, match=rf"ModelConfig\.{field}\b"):
    ModelConfig(**{field: 0})


@pytest.mark.parametrize("field", ["dropout_rate", "attention_dropout_rate", "feed_forward_dropout_rate"])
@pytest.mark.parametrize("value", [-0.1, 1.0, 1.5])
def test_dropout_rates_must_be_in_unit_interval(field, value):
  with pytest.raises(ConfigError, match=re.escape(f"ModelConfig.{field}={value}")):
    ModelConfig(**{field: value})


@pytest.mark.parametrize("field", ["vocab_size", "d_model", "num_heads", "d_ff", "max_length"])
def test_sizes_must_be_positive_integers(field):
  with pytest.raises(ConfigError, match=rf"ModelConfig\.{field}\b"):
    ModelConfig(**{field: 0})


def test_rotary_needs_even_head_dim_and_shared_embeddings_need_equal_vocabularies():
  with pytest.raises(ValueError, match="even head_dim.*got 3"):
    ModelConfig(d_model=6, num_heads=2, positional_encoding="rotary")
  with pytest.raises(ConfigError, match="share_embeddings=True.*target_vocab_size"):
    ModelConfig(vocab_size=100, target_vocab_size=50)
  assert ModelConfig(vocab_size=100, target_vocab_size=50, share_embeddings=False).output_vocab_size == 50


def test_replace_with_misspelled_field_suggests_the_closest_name():
  config = ModelConfig()
  with pytest.raises(ValueError, match=r"no field 'num_head'\. Did you mean 'num_heads'\?"):
    config.replace(num_head=4)
  with pytest.raises(ValueError, match=r"Did you mean 'dropout_rate'\?"):
    config.replace(droput_rate=0.2)
  with pytest.raises(ValueError, match=r"no field 'zzz'\. Valid fields: vocab_size, "):
    config.replace(zzz=1)
  with pytest.raises(ValueError, match=r"Did you mean 'd_model'\?"):
    ModelConfig.from_dict({"dmodel": 8})


def test_replace_validates_and_keeps_the_original():
  config = ModelConfig(d_model=64, num_heads=4)
  assert config.replace(deterministic=True, decode=True).decode
  assert not config.decode and config.head_dim == 16
  with pytest.raises(ValueError, match="num_heads=5"):
    config.replace(num_heads=5)


def test_defaults_are_the_base_model():
  config = ModelConfig()
  assert (config.d_model, config.num_heads, config.d_ff, config.num_encoder_layers, config.dropout_rate) == (
      512, 8, 2048, 6, 0.1)
  assert config.head_dim == 64


def test_classifier_fields_live_in_the_classifier_config_only():
  assert not {"num_classes", "pooling"} & set(ModelConfig.field_names())
  config = ClassifierConfig(d_model=64, num_heads=4, num_classes=3, pooling="first")
  assert (config.num_classes, config.pooling, config.head_dim) == (3, "first", 16)
  with pytest.raises(ConfigError, match=re.escape("ClassifierConfig.pooling='max'")):
    ClassifierConfig(pooling="max")
  with pytest.raises(ConfigError, match=r"ClassifierConfig\.num_classes\b"):
    ClassifierConfig(num_classes=0)
  with pytest.raises(ConfigError, match=r"ClassifierConfig\.num_heads=6\b"):
    ClassifierConfig(num_heads=6)  # the encoder's checks name the subclass
  with pytest.raises(ConfigError, match=r"ModelConfig has no field 'num_classes'\. Did you mean"):
    ModelConfig.from_dict({"num_classes": 3})


def test_the_registry_names_each_models_config_and_module():
  assert model_spec("transformer").config is ModelConfig and model_spec("rnn").config is RNNConfig
  assert model_spec("encoder_classifier").config is ClassifierConfig
  for name, spec in MODELS.items():  # every entry builds a Flax module that holds its config
    config = spec.config()
    module = spec.module(config)
    assert isinstance(module, flax.linen.Module) and module.config is config, name
  with pytest.raises(ConfigError, match=r"config.model_name='rnm' is not a known model; choose one of "
                                        r"\['transformer', 'rnn', 'encoder_classifier', 'forecaster', 'lm'\]\. "
                                        r"Did you mean 'rnn'\?"):
    model_spec("rnm")
