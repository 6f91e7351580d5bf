"""load_bert: a tiny random BERT in the Hugging Face layout gives our Encoder the numpy BERT's hidden states;
every missing, unexpected or mis-shaped tensor is named with its shapes; a bad model directory says what
is missing."""
from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy

from tests.pretrained.tiny_bert import numpy_bert, write_tiny_bert
from transformer.errors import ConfigError, InputFileError, MissingDataError
from transformer.nn import ClassifierConfig, Encoder, EncoderClassifier, unboxed
from transformer.pretrained import bert, load_bert

INPUT_IDS = np.array([[2, 7, 8, 9, 10, 3, 0, 0], [2, 12, 18, 13, 5, 14, 21, 3]])
TOKEN_TYPE_IDS = np.array([[0, 0, 0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 1, 1, 1, 1]])


def _hidden_states(config, params, input_ids, token_type_ids):
  encoder = Encoder(config.replace(deterministic=True))
  return np.asarray(encoder.apply({"params": params}, jnp.asarray(input_ids), jnp.asarray(token_type_ids)))


@pytest.mark.slow
@pytest.mark.parametrize("sizes", [{}, {"hidden_size": 12, "num_attention_heads": 3, "intermediate_size": 20,
                                        "num_hidden_layers": 1, "max_position_embeddings": 10,
                                        "type_vocab_size": 3}])
def test_loaded_encoder_equals_a_numpy_bert(tmp_path, sizes):
  """Sizes come from config.json; hidden states at real tokens equal BertModel's, token types included."""
  hf_config, tensors = write_tiny_bert(tmp_path / "model", **sizes)
  config, params, tokenizer = load_bert(tmp_path / "model")
  assert (config.d_model, config.num_heads, config.d_ff, config.num_encoder_layers, config.max_length,
          config.num_token_types, config.vocab_size) == (
              hf_config["hidden_size"], hf_config["num_attention_heads"], hf_config["intermediate_size"],
              hf_config["num_hidden_layers"], hf_config["max_position_embeddings"], hf_config["type_vocab_size"],
              hf_config["vocab_size"])
  assert config.activation == "gelu_exact" and config.norm_epsilon == 1e-12 and not config.scale_embeddings
  assert tokenizer.max_length == hf_config["max_position_embeddings"]  # no sentence_bert_config.json

  mask = INPUT_IDS != 0
  expected = numpy_bert(tensors, hf_config, INPUT_IDS, TOKEN_TYPE_IDS, mask)
  found = _hidden_states(config, params, INPUT_IDS, TOKEN_TYPE_IDS)
  np.testing.assert_allclose(found[mask], expected[mask], atol=2e-5)
  # The token types matter (so the comparison above checks their table), and default to 0.
  without_types = _hidden_states(config, params, INPUT_IDS, np.zeros_like(INPUT_IDS))
  assert np.abs(found[1, 4:] - without_types[1, 4:]).max() > 1e-3
  np.testing.assert_allclose(_hidden_states(config, params, INPUT_IDS[:1], TOKEN_TYPE_IDS[:1])[0][mask[0]],
                             expected[0][mask[0]], atol=2e-5)


@pytest.mark.slow
def test_params_drop_into_an_encoder_classifier(tmp_path):
  write_tiny_bert(tmp_path / "model")
  config, params, _ = load_bert(tmp_path / "model")
  classifier = EncoderClassifier(ClassifierConfig.from_encoder(config, num_classes=2, deterministic=True))
  initial = unboxed(classifier.init(jax.random.key(0), jnp.asarray(INPUT_IDS))["params"])
  loaded = {**initial, "encoder": params}
  assert jax.tree.structure(loaded) == jax.tree.structure(initial)
  assert jax.tree.map(np.shape, loaded) == jax.tree.map(np.shape, initial)
  assert classifier.apply({"params": loaded}, jnp.asarray(INPUT_IDS)).shape == (2, 2)


def test_bert_prefix_and_old_gamma_beta_names_load_the_same_weights(tmp_path):
  write_tiny_bert(tmp_path / "model")
  _, params, _ = load_bert(tmp_path / "model")
  tensors = safetensors.numpy.load_file(tmp_path / "model" / "model.safetensors")
  old_names = {"LayerNorm.weight": "LayerNorm.gamma", "LayerNorm.bias": "LayerNorm.beta"}
  renamed = {}
  for name, value in tensors.items():
    for new, old in old_names.items():
      name = name.replace(new, old)
    renamed["bert." + name] = value
  config = bert.bert_model_config(json.loads((tmp_path / "model" / "config.json").read_text()))
  converted = bert.convert_bert_weights(renamed, config)
  jax.tree.map(np.testing.assert_array_equal, converted, params)


def _convert_error(tmp_path, change) -> str:
  hf_config, tensors = write_tiny_bert(tmp_path / "model")
  change(tensors)
  with pytest.raises(InputFileError) as raised:
    bert.convert_bert_weights(tensors, bert.bert_model_config(hf_config), source="model.safetensors")
  return str(raised.value)


def test_missing_tensor_is_named_with_its_expected_shape(tmp_path):
  message = _convert_error(tmp_path, lambda t: t.pop("encoder.layer.1.intermediate.dense.weight"))
  assert message.startswith("model.safetensors: 1 tensor(s)")
  assert "missing tensor encoder.layer.1.intermediate.dense.weight (expected shape [16, 8])" in message


def test_unexpected_tensor_is_named(tmp_path):
  message = _convert_error(tmp_path, lambda t: t.update({"cls.predictions.bias": np.zeros(23, np.float32)}))
  assert "unexpected tensor cls.predictions.bias (shape [23])" in message


def test_mis_shaped_tensor_names_expected_and_found_shape(tmp_path):
  def transpose_one(tensors):  # a [out, in] weight stored the other way round
    name = "encoder.layer.0.output.dense.weight"
    tensors[name] = tensors[name].T.copy()
  message = _convert_error(tmp_path, transpose_one)
  assert "tensor encoder.layer.0.output.dense.weight has shape [16, 8], expected [8, 16]" in message


def test_every_problem_is_listed_once(tmp_path):
  def break_three(tensors):
    tensors.pop("embeddings.LayerNorm.bias")
    tensors["encoder.layer.2.output.dense.bias"] = np.zeros(8, np.float32)  # a third layer config lacks
    tensors["embeddings.word_embeddings.weight"] = tensors["embeddings.word_embeddings.weight"][:-1]
  message = _convert_error(tmp_path, break_three)
  assert message.count("\n  ") == 3 and "3 tensor(s)" in message
  assert "missing tensor embeddings.LayerNorm.bias (expected shape [8])" in message
  assert "unexpected tensor encoder.layer.2.output.dense.bias" in message
  assert "embeddings.word_embeddings.weight has shape [22, 8], expected [23, 8]" in message


@pytest.mark.parametrize("missing", ["config.json", "model.safetensors", "tokenizer.json"])
def test_model_dir_missing_a_file_names_it(tmp_path, missing):
  write_tiny_bert(tmp_path / "model")
  (tmp_path / "model" / missing).unlink()
  with pytest.raises(MissingDataError, match=f"lacks {missing}; it needs config.json, model.safetensors, "
                                             f"tokenizer.json"):
    load_bert(tmp_path / "model")
  with pytest.raises(MissingDataError, match="does not exist"):
    load_bert(tmp_path / "nowhere")


def test_config_json_problems_name_the_file_and_key(tmp_path):
  hf_config, _ = write_tiny_bert(tmp_path / "model")
  config_path = tmp_path / "model" / "config.json"
  for change, expected in (({"model_type": "roberta"}, "model_type='roberta'"),
                           ({"hidden_act": "swish"}, "hidden_act='swish' is not supported"),
                           ({"num_attention_heads": 3}, "num_heads=3 does not divide d_model=8")):
    config_path.write_text(json.dumps({**hf_config, **change}))
    with pytest.raises(InputFileError, match=expected):
      load_bert(tmp_path / "model")
  config_path.write_text(json.dumps({key: value for key, value in hf_config.items() if key != "hidden_size"}))
  with pytest.raises(InputFileError, match=r"config.json: no 'hidden_size'"):
    load_bert(tmp_path / "model")


def test_damaged_weights_file_and_too_long_max_length_are_refused(tmp_path):
  write_tiny_bert(tmp_path / "model")
  with pytest.raises(ConfigError, match=r"max_length=17 must be in \[3, 16\]"):
    load_bert(tmp_path / "model", max_length=17)
  (tmp_path / "model" / "model.safetensors").write_bytes(b"not safetensors")
  with pytest.raises(InputFileError, match="model.safetensors: cannot be read as safetensors"):
    load_bert(tmp_path / "model")
