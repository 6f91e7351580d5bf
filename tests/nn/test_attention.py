"""MultiHeadAttention against the numpy reference, and its dense, chunked and cached paths against each other."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.nn import reference
from transformer import ops
from transformer.nn import ModelConfig, MultiHeadAttention

CONFIG = ModelConfig(vocab_size=11, d_model=8, num_heads=2, d_ff=16, dropout_rate=0.0, attention_dropout_rate=0.0,
                     deterministic=True, attention_chunk_size=2)
BATCH, Q_LENGTH, KV_LENGTH = 2, 5, 6


def _inputs(seed=0):
  rng = np.random.default_rng(seed)
  inputs_q = rng.normal(size=(BATCH, Q_LENGTH, CONFIG.d_model)).astype(np.float32)
  inputs_kv = rng.normal(size=(BATCH, KV_LENGTH, CONFIG.d_model)).astype(np.float32)
  query_valid = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], bool)
  key_valid = np.array([[1, 1, 1, 1, 1, 0], [1, 1, 0, 0, 0, 0]], bool)
  return inputs_q, inputs_kv, query_valid, key_valid


@pytest.mark.slow
@pytest.mark.parametrize("kernels", ["auto", "reference"])
@pytest.mark.parametrize("implementation", ["dense", "chunked"])
@pytest.mark.parametrize("positional_encoding", ["sinusoidal", "rotary"])
def test_self_and_cross_attention_match_numpy(positional_encoding, implementation, kernels):
  config = CONFIG.replace(positional_encoding=positional_encoding, attention_implementation=implementation,
                          kernels=kernels)
  inputs_q, inputs_kv, query_valid, key_valid = _inputs()
  rotary = positional_encoding == "rotary"
  params = reference.perturbed_params(MultiHeadAttention(config), inputs_q, inputs_kv, query_valid, key_valid)
  numpy_params = reference.as_numpy(params)

  @functools.partial(jax.jit, static_argnames=("causal", "cross_attention"))
  def apply(*args, causal=False, cross_attention=False):
    return MultiHeadAttention(config, cross_attention).apply({"params": params}, *args, causal=causal)

  padded_self = apply(inputs_kv, inputs_kv, key_valid, key_valid)
  expected = reference.multi_head_attention(numpy_params, inputs_kv, inputs_kv, key_valid, key_valid,
                                            config.num_heads, rotary=rotary)
  np.testing.assert_allclose(padded_self, expected, atol=1e-5, rtol=1e-5)

  causal_self = apply(inputs_q, inputs_q, query_valid, query_valid, causal=True)
  expected = reference.multi_head_attention(numpy_params, inputs_q, inputs_q, query_valid, query_valid,
                                            config.num_heads, causal=True, rotary=rotary)
  np.testing.assert_allclose(causal_self, expected, atol=1e-5, rtol=1e-5)

  # Cross attention carries no rotary positions: a target and a source position have no offset to encode.
  cross = apply(inputs_q, inputs_kv, query_valid, key_valid, cross_attention=True)
  expected = reference.multi_head_attention(numpy_params, inputs_q, inputs_kv, query_valid, key_valid,
                                            config.num_heads)
  np.testing.assert_allclose(cross, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("num_kv_heads, window", [(None, None), (1, None), (None, 2), (1, 3)])
@pytest.mark.parametrize("kernels", ["auto", "reference"])
def test_cached_decoding_equals_full_causal_attention(kernels, num_kv_heads, window):
  """One position per call through the cache gives the full causal self attention (rotary positions too; with
  grouped key/value heads, whose cache is smaller, and a sliding window, which the cache mask must apply)."""
  config = CONFIG.replace(positional_encoding="rotary", kernels=kernels, num_kv_heads=num_kv_heads,
                          attention_window=window)
  inputs, _, _, _ = _inputs(1)
  valid = np.ones((BATCH, Q_LENGTH), bool)
  module = MultiHeadAttention(config)
  params = reference.perturbed_params(module, inputs, inputs, valid, valid, causal=True)
  full = module.apply({"params": params}, inputs, inputs, valid, valid, causal=True)

  decoder = MultiHeadAttention(config.replace(decode=True))
  cache = decoder.init(jax.random.key(0), inputs, inputs, valid, valid, causal=True)["cache"]
  assert cache["cached_key"].shape == (BATCH, Q_LENGTH, config.kv_heads, config.head_dim)

  @jax.jit
  def step(cache, x):
    output, variables = decoder.apply({"params": params, "cache": cache}, x, x, valid[:, :1], valid[:, :1],
                                      causal=True, mutable=["cache"])
    return output, variables["cache"]

  outputs = []
  for position in range(Q_LENGTH):
    output, cache = step(cache, inputs[:, position:position + 1])
    outputs.append(output)
  np.testing.assert_allclose(jnp.concatenate(outputs, axis=1), full, atol=1e-5, rtol=1e-5)
  np.testing.assert_array_equal(cache["cache_index"], [Q_LENGTH] * BATCH)


def test_attention_weights_are_sown_for_plots():
  inputs_q, inputs_kv, query_valid, key_valid = _inputs()
  module = MultiHeadAttention(CONFIG)
  params = reference.perturbed_params(module, inputs_q, inputs_kv, query_valid, key_valid)
  _, state = module.apply({"params": params}, inputs_q, inputs_kv, query_valid, key_valid,
                          mutable=["intermediates"])
  (weights,) = state["intermediates"]["attention_weights"]
  assert weights.shape == (BATCH, CONFIG.num_heads, Q_LENGTH, KV_LENGTH)
  np.testing.assert_array_equal(np.asarray(weights)[1, :, :, 2:], 0.0)  # padding keys of example 1


@pytest.mark.parametrize("positional_encoding", ["sinusoidal", "rotary"])
def test_prefill_of_different_lengths_then_steps_equals_full_causal_attention(positional_encoding):
  """A prompt written in one call (3 positions for example 0, 1 for example 1), then one position per call
  from each example's own next position, gives the full causal self attention."""
  config = CONFIG.replace(positional_encoding=positional_encoding)
  inputs, _, _, _ = _inputs(2)
  module = MultiHeadAttention(config)
  params = reference.perturbed_params(module, inputs, inputs, causal=True)
  full = np.asarray(module.apply({"params": params}, inputs, inputs, causal=True))
  decoder = MultiHeadAttention(config.replace(decode=True))
  cache = decoder.init(jax.random.key(0), inputs, inputs, causal=True)["cache"]

  @jax.jit
  def call(cache, x, valid):
    output, variables = decoder.apply({"params": params, "cache": cache}, x, x, valid, valid, causal=True,
                                      mutable=["cache"])
    return output, variables["cache"]

  lengths = np.array([3, 1])
  prompt_valid = np.arange(3)[None] < lengths[:, None]
  output, cache = call(cache, inputs[:, :3], prompt_valid)
  np.testing.assert_array_equal(cache["cache_index"], lengths)
  for row, length in enumerate(lengths):
    np.testing.assert_allclose(output[row, :length], full[row, :length], atol=1e-5, rtol=1e-5)
  for step in range(Q_LENGTH - lengths.max()):
    positions = lengths + step
    output, cache = call(cache, inputs[np.arange(BATCH), positions][:, None], np.ones((BATCH, 1), bool))
    np.testing.assert_allclose(output[:, 0], full[np.arange(BATCH), positions], atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_float32_attention_logits_flag_reaches_the_dense_attention():
  """``float32_attention_logits=False`` in bfloat16 changes the computation (logits and softmax in bfloat16)
  but stays within bfloat16 rounding of the default; in float32 it changes nothing."""
  inputs_q, inputs_kv, query_valid, key_valid = _inputs(2)
  params = MultiHeadAttention(CONFIG).init(jax.random.PRNGKey(0), inputs_q, inputs_kv, query_valid, key_valid)

  def apply(**overrides):
    config = CONFIG.replace(**overrides)
    return np.asarray(MultiHeadAttention(config).apply(params, inputs_q, inputs_kv, query_valid, key_valid),
                      np.float32)

  default, low = apply(dtype="bfloat16"), apply(dtype="bfloat16", float32_attention_logits=False)
  assert not np.array_equal(default, low)
  np.testing.assert_allclose(low, default, atol=5e-2, rtol=5e-2)
  np.testing.assert_array_equal(apply(float32_attention_logits=False), apply())


@pytest.mark.slow
@pytest.mark.parametrize("implementation", ["dense", "chunked"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_kernels_auto_and_reference_agree_in_outputs_and_gradients(implementation, dtype):
  """Self (causal, padded) and cross attention: same outputs and parameter gradients with either setting."""
  inputs_q, inputs_kv, query_valid, key_valid = _inputs(3)
  params = reference.perturbed_params(MultiHeadAttention(CONFIG), inputs_q, inputs_kv, query_valid, key_valid)
  tolerance = dict(atol=1e-5, rtol=1e-5) if dtype == "float32" else dict(atol=3e-2, rtol=3e-2)

  def outputs_and_grads(kernels):
    config = CONFIG.replace(attention_implementation=implementation, dtype=dtype, kernels=kernels)

    def loss(params):
      causal = MultiHeadAttention(config).apply({"params": params}, inputs_q, inputs_q, query_valid, query_valid,
                                                causal=True)
      cross = MultiHeadAttention(config, cross_attention=True).apply({"params": params}, inputs_q, inputs_kv,
                                                                     query_valid, key_valid)
      outputs = jnp.stack([causal, cross]).astype(jnp.float32)
      return jnp.sum(jnp.sin(outputs)), outputs
    (_, outputs), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
    return outputs, grads

  auto_outputs, auto_grads = outputs_and_grads("auto")
  reference_outputs, reference_grads = outputs_and_grads("reference")
  np.testing.assert_allclose(auto_outputs, reference_outputs, **tolerance)
  for name in auto_grads:
    np.testing.assert_allclose(auto_grads[name], reference_grads[name], err_msg=name, **tolerance)


@pytest.mark.slow
def test_on_a_gpu_auto_fuses_attention_unless_weights_are_sown_or_dropped(monkeypatch):
  """With the platform faked as a GPU (cuDNN cannot run here), ``kernels="auto"`` routes bfloat16 attention to
  the fused kernel, and falls back to the formula when the weights are sown, with attention dropout, and in
  float32; ``kernels="reference"`` never fuses."""
  from transformer.ops import kernels
  calls = []

  def fused(query, key, value, mask, scale):
    calls.append(query.shape)
    return ops.dot_product_attention(query, key, value, mask=mask, scale=scale)

  monkeypatch.setattr(kernels, "current_platform", lambda: "gpu")
  monkeypatch.setattr(kernels, "CUDNN", kernels.Kernels(name="cudnn", attention=fused))
  _, inputs, _, valid = _inputs(4)  # length 6: even, as cuDNN's masked backward needs
  config = CONFIG.replace(d_model=16, dtype="bfloat16")  # head_dim 8, a multiple of 8 as cuDNN needs
  inputs = np.concatenate([inputs, inputs], axis=-1)
  module = MultiHeadAttention(config)
  params = module.init(jax.random.key(0), inputs, inputs, valid, valid)["params"]

  def run(**changes):
    calls.clear()
    changed = config.replace(**changes)
    rngs = {} if changed.deterministic else {"dropout": jax.random.key(1)}
    MultiHeadAttention(changed).apply({"params": params}, inputs, inputs, valid, valid, causal=True, rngs=rngs)
    sown = MultiHeadAttention(changed).apply({"params": params}, inputs, inputs, valid, valid, causal=True,
                                             rngs=rngs, mutable=["intermediates"])[1]
    assert sown["intermediates"]["attention_weights"][0].shape == (BATCH, 2, 6, 6)
    return len(calls)

  assert run() == 1  # the call that sows its weights takes the formula
  assert run(kernels="reference") == 0
  assert run(dtype="float32") == 0
  assert run(deterministic=False, attention_dropout_rate=0.1) == 0


def _repeat_kv_params(params, groups, head_dim):
  """Key/value kernels and biases of ``kv_heads`` heads with each head repeated ``groups`` times."""
  def repeat(x):  # [..., kv_heads * head_dim] -> [..., kv_heads * groups * head_dim]
    x = x.reshape(*x.shape[:-1], -1, 1, head_dim)
    return jnp.broadcast_to(x, (*x.shape[:-2], groups, head_dim)).reshape(*x.shape[:-3], -1)
  return {name: repeat(value) if name.split("_")[0] in ("key", "value") else value for name, value in params.items()}


@pytest.mark.slow
@pytest.mark.parametrize("implementation", ["dense", "chunked"])
@pytest.mark.parametrize("num_kv_heads", [1, 2])
def test_grouped_kv_heads_equal_full_attention_with_each_kv_head_repeated(num_kv_heads, implementation):
  """Grouped-query attention (Ainslie et al. 2023) is multi-head attention whose key/value heads are shared
  within each group of query heads: query head n reads key/value head n // groups."""
  config = CONFIG.replace(d_model=16, num_heads=4, attention_implementation=implementation)
  rng = np.random.default_rng(2)
  inputs = rng.normal(size=(BATCH, Q_LENGTH, config.d_model)).astype(np.float32)
  valid = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], bool)
  grouped = MultiHeadAttention(config.replace(num_kv_heads=num_kv_heads))
  params = reference.perturbed_params(grouped, inputs, inputs, valid, valid, causal=True)
  assert params["key_kernel"].shape == (config.d_model, num_kv_heads * config.head_dim)
  full_params = _repeat_kv_params(params, config.num_heads // num_kv_heads, config.head_dim)
  expected = MultiHeadAttention(config).apply({"params": full_params}, inputs, inputs, valid, valid, causal=True)
  actual = grouped.apply({"params": params}, inputs, inputs, valid, valid, causal=True)
  np.testing.assert_allclose(actual, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kernels", ["auto", "reference"])
def test_local_window_is_the_same_function_dense_and_chunked_and_limits_what_a_query_sees(kernels):
  config = CONFIG.replace(attention_window=2, kernels=kernels)
  inputs, _, valid, _ = _inputs(3)
  module = MultiHeadAttention(config)
  params = reference.perturbed_params(module, inputs, inputs, valid, valid, causal=True)
  dense = module.apply({"params": params}, inputs, inputs, valid, valid, causal=True)
  chunked = MultiHeadAttention(config.replace(attention_implementation="chunked")).apply(
      {"params": params}, inputs, inputs, valid, valid, causal=True)
  np.testing.assert_allclose(chunked, dense, atol=1e-5, rtol=1e-5)
  # Changing a position more than window - 1 before the last query leaves the last output unchanged.
  changed = inputs.copy()
  changed[:, 0] += 10.0
  again = module.apply({"params": params}, changed, changed, valid, valid, causal=True)
  np.testing.assert_allclose(again[0, -1], dense[0, -1], atol=1e-5, rtol=1e-5)
  assert not np.allclose(again[0, 1], dense[0, 1])


@pytest.mark.slow
def test_a_models_kernels_are_resolved_once_on_its_config(monkeypatch):
  """Every op of every layer gets its config's ``resolved_kernels``, resolved once per config (the encoder and
  decoder each derive one): the count does not grow with the layers, their attention or norm calls, or a
  second apply; the chunk size of ``attention_implementation="chunked"`` is in it."""
  from transformer.nn import EncoderDecoder
  from transformer.nn import config as config_module
  calls = []
  select = config_module.select_kernels
  monkeypatch.setattr(config_module, "select_kernels", lambda *args, **kwargs: calls.append(kwargs) or select(
      *args, **kwargs))
  tokens = jnp.ones((BATCH, Q_LENGTH), jnp.int32)
  counts = []
  for layers in (1, 3):
    calls.clear()
    config = CONFIG.replace(num_encoder_layers=layers, num_decoder_layers=layers, attention_implementation="chunked")
    model = EncoderDecoder(config)
    params = model.init(jax.random.key(0), tokens, tokens)["params"]
    model.apply({"params": params}, tokens, tokens)
    counts.append(len(calls))
  assert counts[0] == counts[1] <= 3 and calls[0] == {"attention_chunk_size": 2}
  assert config.resolved_kernels is config.resolved_kernels
  assert config.resolved_kernels.attention_chunk_size == 2
  assert CONFIG.replace(kernels="reference").resolved_kernels.attention_chunk_size is None


def test_a_chunked_model_sows_the_weights_of_the_dense_path_when_asked():
  """The chunked implementation never forms the weights: asking for them (attention plots) takes the dense
  path for that call, with the same output."""
  inputs, _, valid, _ = _inputs(5)
  module = MultiHeadAttention(CONFIG.replace(attention_implementation="chunked"))
  params = reference.perturbed_params(module, inputs, inputs, valid, valid, causal=True)
  plain = module.apply({"params": params}, inputs, inputs, valid, valid, causal=True)
  sown_output, state = module.apply({"params": params}, inputs, inputs, valid, valid, causal=True,
                                    mutable=["intermediates"])
  dense_output, dense_state = MultiHeadAttention(CONFIG).apply(
      {"params": params}, inputs, inputs, valid, valid, causal=True, mutable=["intermediates"])
  np.testing.assert_allclose(sown_output, plain, atol=1e-5, rtol=1e-5)
  np.testing.assert_allclose(sown_output, dense_output, atol=1e-5, rtol=1e-5)
  np.testing.assert_allclose(state["intermediates"]["attention_weights"][0],
                             dense_state["intermediates"]["attention_weights"][0], atol=1e-6)
