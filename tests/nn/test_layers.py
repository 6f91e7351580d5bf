"""Layers: a whole EncoderLayer against numpy with the module's own weights; decoder-layer causality."""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.nn import reference
from transformer import ops
from transformer.errors import ConfigError
from transformer.nn import (DecoderLayer, Encoder, EncoderLayer, ModelConfig, Norm, PositionalEncoding,
                            unboxed)

CONFIG = ModelConfig(vocab_size=11, d_model=8, num_heads=2, d_ff=16, dropout_rate=0.0, attention_dropout_rate=0.0,
                     max_length=16, deterministic=True)
BATCH, LENGTH = 2, 5


def _sequence(seed=0, length=LENGTH):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(BATCH, length, CONFIG.d_model)).astype(np.float32)
  valid = np.ones((BATCH, length), bool)
  valid[1, 3:] = False
  return x, valid


@pytest.mark.slow
@pytest.mark.parametrize("norm_position, norm", [("post", "layer_norm"), ("pre", "layer_norm"), ("pre", "rms_norm")])
def test_encoder_layer_matches_numpy(norm_position, norm):
  config = CONFIG.replace(norm_position=norm_position, norm=norm)
  x, valid = _sequence()
  layer = EncoderLayer(config)
  params = reference.perturbed_params(layer, x, valid)
  output = layer.apply({"params": params}, x, valid)
  numpy_norm = reference.rms_norm if norm == "rms_norm" else reference.layer_norm
  expected = reference.encoder_layer(reference.as_numpy(params), x.astype(np.float64), valid, config.num_heads,
                                     norm_position, numpy_norm, config.norm_epsilon)
  # Padding positions are computed too (they attend to nothing, so only the residual path and the FFN
  # act); they match as well.
  np.testing.assert_allclose(output, expected, atol=1e-5, rtol=1e-5)


def test_norm_module_is_the_configured_norm():
  x, _ = _sequence(1)
  for norm in ("layer_norm", "rms_norm"):
    module = Norm(CONFIG.replace(norm=norm, norm_epsilon=1e-3))
    params = reference.perturbed_params(module, x)
    expected = (reference.rms_norm if norm == "rms_norm" else reference.layer_norm)(
        x.astype(np.float64), reference.as_numpy(params), 1e-3)
    np.testing.assert_allclose(module.apply({"params": params}, x), expected, atol=1e-5, rtol=1e-5)
  assert set(Norm(CONFIG.replace(norm="rms_norm")).init(jax.random.key(0), x)["params"]) == {"scale"}


def test_batch_norm_module_normalises_each_feature_over_the_valid_positions():
  x, _ = _sequence(1)
  valid = np.ones(x.shape[:-1], bool)
  valid[-1, 1:] = False
  module = Norm(CONFIG.replace(norm="batch_norm", norm_epsilon=1e-3))
  params = reference.perturbed_params(module, x, valid)
  rows = x.reshape(-1, x.shape[-1]).astype(np.float64)[valid.reshape(-1)]
  expected = (x - rows.mean(0)) / np.sqrt(rows.var(0) + 1e-3) * np.asarray(params["scale"]) + np.asarray(
      params["bias"])
  np.testing.assert_allclose(np.asarray(module.apply({"params": params}, x, valid))[valid], expected[valid],
                             atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_a_batch_norm_encoder_ignores_what_padding_holds():
  """The padding mask reaches every norm of the stack: padded positions change no statistics."""
  config = CONFIG.replace(norm="batch_norm", vocab_size=11, num_encoder_layers=2)
  tokens = np.array([[3, 4, 5, 6], [7, 8, 0, 0]], np.int32)
  encoder = Encoder(config.replace(deterministic=True))
  params = encoder.init(jax.random.key(0), tokens)["params"]
  valid = tokens != 0
  extra = np.concatenate([tokens, np.zeros((2, 3), np.int32)], axis=1)  # more padding columns
  np.testing.assert_allclose(np.asarray(encoder.apply({"params": params}, extra))[:, :4][valid],
                             np.asarray(encoder.apply({"params": params}, tokens))[valid], atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_decoder_layer_is_causal():
  """d output[i] / d input[j] is exactly zero for j > i (cross attention over a padded source included)."""
  x, _ = _sequence(2)
  valid = np.ones((BATCH, LENGTH), bool)
  encoded = np.random.default_rng(3).normal(size=(BATCH, 3, CONFIG.d_model)).astype(np.float32)
  encoded_valid = np.array([[1, 1, 1], [1, 1, 0]], bool)
  layer = DecoderLayer(CONFIG)
  params = reference.perturbed_params(layer, x, valid, encoded, encoded_valid)
  jacobian = jax.jit(jax.jacrev(lambda inputs: layer.apply({"params": params}, inputs, valid, encoded,
                                                           encoded_valid)))(x)
  # [batch, i, d, batch', j, d'] -> [batch, i, j]
  influence = np.abs(np.asarray(jacobian)).sum(axis=(2, 5))[np.arange(BATCH), :, np.arange(BATCH)]
  future = np.triu(np.ones((LENGTH, LENGTH), bool), k=1)
  assert (influence[:, future] == 0).all()
  assert (influence[:, ~future] > 0).all()


def test_positional_encoding_module_adds_the_encoding():
  x, _ = _sequence(4)
  sinusoidal = PositionalEncoding(CONFIG)
  np.testing.assert_allclose(sinusoidal.apply({}, x), x + ops.sinusoidal_position_encoding(LENGTH, 8)[None],
                             atol=1e-6)
  learned = PositionalEncoding(CONFIG.replace(positional_encoding="learned"))
  params = unboxed(learned.init(jax.random.key(0), x)["params"])
  assert params["position_table"].shape == (CONFIG.max_length, CONFIG.d_model)
  np.testing.assert_allclose(learned.apply({"params": params}, x), x + params["position_table"][:LENGTH][None],
                             atol=1e-6)
  for name in ("rotary", "none"):
    np.testing.assert_array_equal(PositionalEncoding(CONFIG.replace(positional_encoding=name)).apply({}, x), x)


def test_learned_positions_refuse_a_sequence_longer_than_their_table():
  x, _ = _sequence(4)  # LENGTH positions
  learned = PositionalEncoding(CONFIG.replace(positional_encoding="learned", max_length=LENGTH - 1))
  with pytest.raises(ConfigError, match=f"a sequence of {LENGTH} positions .*config.model.max_length={LENGTH - 1}"):
    learned.init(jax.random.key(0), x)
  PositionalEncoding(CONFIG.replace(positional_encoding="sinusoidal", max_length=LENGTH - 1)).apply({}, x)


def test_positional_encoding_continues_from_the_cache_when_decoding():
  x, _ = _sequence(5)
  module = PositionalEncoding(CONFIG.replace(decode=True))
  cache = module.init(jax.random.key(0), x)["cache"]
  outputs = []
  for position in range(LENGTH):
    output, variables = module.apply({"cache": cache}, x[:, position:position + 1], mutable=["cache"])
    cache = variables["cache"]
    outputs.append(output)
  np.testing.assert_allclose(jnp.concatenate(outputs, 1), PositionalEncoding(CONFIG).apply({}, x), atol=1e-6)


def test_dropout_is_active_only_when_not_deterministic():
  x, valid = _sequence(6)
  config = CONFIG.replace(dropout_rate=0.5, attention_dropout_rate=0.5, feed_forward_dropout_rate=0.5)
  layer = EncoderLayer(config)
  params = reference.perturbed_params(layer, x, valid)
  without = EncoderLayer(CONFIG).apply({"params": params}, x, valid)
  np.testing.assert_allclose(layer.apply({"params": params}, x, valid), without, atol=1e-6)
  training = EncoderLayer(config.replace(deterministic=False))
  apply = jax.jit(lambda rng: training.apply({"params": params}, x, valid, rngs={"dropout": rng}))
  first = apply(jax.random.key(1))
  np.testing.assert_array_equal(first, apply(jax.random.key(1)))
  assert np.abs(first - without).max() > 1e-2
  assert np.abs(first - apply(jax.random.key(2))).max() > 1e-2


@pytest.mark.slow
def test_kernels_setting_is_validated_and_reaches_the_norms_and_dropout():
  with pytest.raises(ValueError, match=re.escape("ModelConfig.kernels='cpu' is not supported; choose one of "
                                                 "['auto', 'reference']")):
    CONFIG.replace(kernels="cpu")
  x, valid = _sequence(7)
  config = CONFIG.replace(dropout_rate=0.3, attention_dropout_rate=0.3, feed_forward_dropout_rate=0.3)
  params = reference.perturbed_params(EncoderLayer(config), x, valid)
  # Deterministic: the settings agree; with dropout they draw different masks (8-bit draws on CPU for "auto").
  deterministic = {kernels: EncoderLayer(config.replace(kernels=kernels)).apply({"params": params}, x, valid)
                   for kernels in ("auto", "reference")}
  np.testing.assert_allclose(deterministic["auto"], deterministic["reference"], atol=1e-5, rtol=1e-5)
  training = {kernels: EncoderLayer(config.replace(kernels=kernels, deterministic=False)).apply(
      {"params": params}, x, valid, rngs={"dropout": jax.random.key(0)}) for kernels in ("auto", "reference")}
  assert np.abs(training["auto"] - training["reference"]).max() > 1e-2
  backward = {kernels: jax.jit(jax.grad(lambda x: jnp.sum(Norm(CONFIG.replace(kernels=kernels)).apply(
      {"params": {"scale": jnp.ones(8), "bias": jnp.zeros(8)}}, x) ** 3))).lower(x).as_text()
      for kernels in ("auto", "reference")}
  assert "optimization_barrier" in backward["auto"] and "optimization_barrier" not in backward["reference"]


@pytest.mark.slow
@pytest.mark.parametrize("use_bias, dtype", [(True, None), (False, None), (True, jnp.bfloat16)])
def test_dense_is_flax_dense_in_parameters_values_and_gradients(use_bias, dtype):
  import flax.linen as nn
  from transformer.nn.layers import Dense
  x = jnp.asarray(np.random.default_rng(0).normal(size=(3, 4, 6)), jnp.float32)  # [batch, length, features]
  ours = Dense(5, ("embed", "mlp"), use_bias=use_bias, dtype=dtype)
  flax_dense = nn.Dense(5, use_bias=use_bias, dtype=dtype)
  params = unboxed(ours.init(jax.random.key(1), x))  # without the logical axis names flax's layer lacks
  flax_params = flax_dense.init(jax.random.key(1), x)
  assert jax.tree.structure(params) == jax.tree.structure(flax_params)
  for ours_leaf, flax_leaf in zip(jax.tree.leaves(params), jax.tree.leaves(flax_params)):
    np.testing.assert_array_equal(ours_leaf, flax_leaf)  # same names, shapes and initialisation
  params = jax.tree.map(lambda p: p + 0.1, params)  # a nonzero bias too
  out = ours.apply(params, x)
  assert out.shape == (3, 4, 5) and out.dtype == (dtype or jnp.float32)
  tolerance = 2e-2 if dtype == jnp.bfloat16 else 1e-5
  np.testing.assert_allclose(out.astype(jnp.float32), flax_dense.apply(params, x).astype(jnp.float32),
                             rtol=tolerance, atol=tolerance)
  loss = lambda module: lambda p, x: jnp.sum(jnp.sin(module.apply(p, x).astype(jnp.float32)))
  grads = jax.grad(loss(ours), argnums=(0, 1))(params, x)
  flax_grads = jax.grad(loss(flax_dense), argnums=(0, 1))(params, x)
  for ours_leaf, flax_leaf in zip(jax.tree.leaves(grads), jax.tree.leaves(flax_grads)):
    np.testing.assert_allclose(ours_leaf, flax_leaf, rtol=5 * tolerance, atol=5 * tolerance)
