"""Chunked (memory-efficient) attention computes the dense function: outputs and gradients."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer import ops

BATCH, HEADS, DIM = 2, 2, 4


def _inputs(seed, q_length, kv_length, padding, dtype=jnp.float32):
  rng = np.random.default_rng(seed)
  query = jnp.asarray(rng.normal(size=(BATCH, q_length, HEADS, DIM)), dtype)
  key = jnp.asarray(rng.normal(size=(BATCH, kv_length, HEADS, DIM)), dtype)
  value = jnp.asarray(rng.normal(size=(BATCH, kv_length, HEADS, DIM + 1)), dtype)  # head_dim_v != head_dim
  query_valid = np.ones((BATCH, q_length), bool)
  key_valid = np.ones((BATCH, kv_length), bool)
  if padding:
    query_valid[1, -2:] = False
    key_valid[0, -1] = False
    key_valid[1, -3:] = False
  cotangent = jnp.asarray(rng.normal(size=(BATCH, q_length, HEADS, DIM + 1)), dtype)
  return query, key, value, query_valid, key_valid, cotangent


def _dense(query, key, value, query_valid, key_valid, causal, scale, *_):
  mask = ops.make_attention_mask(query_valid, key_valid)
  if causal:
    mask = ops.combine_masks(mask, ops.make_causal_mask(query.shape[1], key.shape[1]))
  return ops.dot_product_attention(query, key, value, mask=mask, scale=scale)


def _chunked(query, key, value, query_valid, key_valid, causal, scale, query_chunk_size, key_chunk_size):
  return ops.chunked_dot_product_attention(query, key, value, query_valid, key_valid, causal=causal, scale=scale,
                                           query_chunk_size=query_chunk_size, key_chunk_size=key_chunk_size)


@functools.partial(jax.jit, static_argnums=(0, 7, 8, 9, 10))
def _value_and_grads(attention, query, key, value, query_valid, key_valid, cotangent, causal, scale,
                     query_chunk_size, key_chunk_size):
  """Output, and gradients w.r.t. q, k, v of ``sum(output * cotangent)``."""
  def loss(q, k, v):
    output = attention(q, k, v, query_valid, key_valid, causal, scale, query_chunk_size, key_chunk_size)
    return jnp.sum((output * cotangent).astype(jnp.float32))
  output = attention(query, key, value, query_valid, key_valid, causal, scale, query_chunk_size, key_chunk_size)
  return output, jax.grad(loss, argnums=(0, 1, 2))(query, key, value)


CASES = [
    # q_length, kv_length, query_chunk, key_chunk, causal, padding
    pytest.param(7, 7, 3, 2, True, True, id="self-causal-padding-ragged-chunks"),
    pytest.param(5, 9, 2, 4, False, True, id="cross-padding-q<kv"),
    pytest.param(9, 5, 4, 3, True, False, id="cross-causal-q>kv"),
    pytest.param(6, 6, 512, 512, True, True, id="one-block"),
]


@pytest.mark.slow
@pytest.mark.parametrize("q_length, kv_length, query_chunk, key_chunk, causal, padding", CASES)
def test_chunked_equals_dense_outputs_and_gradients(q_length, kv_length, query_chunk, key_chunk, causal, padding):
  query, key, value, query_valid, key_valid, cotangent = _inputs(0, q_length, kv_length, padding)
  args = (query, key, value, query_valid, key_valid, cotangent, causal, True, query_chunk, key_chunk)
  output, grads = _value_and_grads(_chunked, *args)
  expected, expected_grads = _value_and_grads(_dense, *args)
  assert output.shape == (BATCH, q_length, HEADS, DIM + 1)
  np.testing.assert_allclose(output, expected, atol=1e-5, rtol=1e-5)
  np.testing.assert_array_equal(np.asarray(output)[~query_valid], 0.0)
  for name, grad, expected_grad in zip("qkv", grads, expected_grads):
    np.testing.assert_allclose(grad, expected_grad, atol=1e-5, rtol=1e-5, err_msg=f"d{name}")


def test_chunked_handles_rows_without_keys_and_unscaled_logits():
  """A batch element whose keys are all padding gives zeros and finite (zero) gradients."""
  query, key, value, query_valid, _, cotangent = _inputs(1, 5, 6, padding=True)
  key_valid = np.ones((BATCH, 6), bool)
  key_valid[1] = False
  args = (query, key, value, query_valid, key_valid, cotangent, True, False, 2, 4)
  output, grads = _value_and_grads(_chunked, *args)
  expected, expected_grads = _value_and_grads(_dense, *args)
  np.testing.assert_array_equal(np.asarray(output)[1], 0.0)
  np.testing.assert_allclose(output, expected, atol=1e-5, rtol=1e-5)
  for grad, expected_grad in zip(grads, expected_grads):
    assert np.isfinite(np.asarray(grad)).all()
    np.testing.assert_allclose(grad, expected_grad, atol=1e-5, rtol=1e-5)
  np.testing.assert_array_equal(np.asarray(grads[0])[1], 0.0)


@pytest.mark.slow
def test_chunked_in_bfloat16_matches_dense():
  query, key, value, query_valid, key_valid, cotangent = _inputs(2, 7, 7, True, jnp.bfloat16)
  args = (query, key, value, query_valid, key_valid, cotangent, True, True, 3, 2)
  output, grads = _value_and_grads(_chunked, *args)
  expected, expected_grads = _value_and_grads(_dense, *args)
  assert output.dtype == jnp.bfloat16
  as_f32 = lambda x: np.asarray(x, np.float32)
  np.testing.assert_allclose(as_f32(output), as_f32(expected), atol=2e-2, rtol=2e-2)
  for grad, expected_grad in zip(grads, expected_grads):
    assert grad.dtype == jnp.bfloat16
    np.testing.assert_allclose(as_f32(grad), as_f32(expected_grad), atol=2e-2, rtol=2e-2)


def test_chunked_defaults_mean_no_mask():
  query, key, value, *_ = _inputs(3, 4, 6, padding=False)
  chunked = jax.jit(functools.partial(ops.chunked_dot_product_attention, key_chunk_size=4))
  np.testing.assert_allclose(chunked(query, key, value),
                             ops.dot_product_attention(query, key, value), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("change, message", [
    (dict(query_valid=np.ones((BATCH, 4), bool)), r"query_valid must be \[batch, length\] = \(2, 5\)"),
    (dict(key_valid=np.ones((BATCH, 5), bool)), r"key_valid must be \[batch, length\] = \(2, 6\)"),
    (dict(value_length=4), "key and value must agree"),
    (dict(dtype=jnp.int32), "floating-point query, key and value"),
    (dict(query_chunk_size=0), "query_chunk_size must be a positive integer, got 0"),
    (dict(key_chunk_size=-2), "key_chunk_size must be a positive integer, got -2"),
    (dict(query_chunk_size=2.5), "query_chunk_size must be a positive integer, got 2.5"),
    (dict(key_chunk_size=True), "key_chunk_size must be a positive integer, got True"),
    (dict(q_length=0), "at least one query and one key, got q_length=0"),
    (dict(kv_length=0), "at least one query and one key, got q_length=5 and kv_length=0"),
], ids=lambda value: str(value)[:40])
def test_chunked_names_bad_inputs(change, message):
  change = dict(change)
  dtype = change.pop("dtype", jnp.float32)
  q_length, kv_length = change.pop("q_length", 5), change.pop("kv_length", 6)
  query, key, value, _, _, _ = _inputs(9, q_length, kv_length, padding=False)
  value = value[:, :change.pop("value_length", kv_length)]
  query, key, value = (x.astype(dtype) for x in (query, key, value))
  with pytest.raises(ValueError, match=message):
    ops.chunked_dot_product_attention(query, key, value, **change)


def test_numpy_integer_chunk_sizes_are_accepted():
  query, key, value, query_valid, key_valid, _ = _inputs(10, 5, 6, padding=True)
  np.testing.assert_allclose(
      ops.chunked_dot_product_attention(query, key, value, query_valid, key_valid, query_chunk_size=np.int64(2),
                                        key_chunk_size=np.int32(4)),
      _dense(query, key, value, query_valid, key_valid, False, True), atol=1e-5, rtol=1e-5)


def test_nan_in_an_invalid_key_or_value_reaches_neither_output_nor_gradients():
  query, key, value, query_valid, key_valid, cotangent = _inputs(11, 5, 6, padding=True)
  poisoned_key = key.at[1, -1].set(jnp.nan)  # key_valid[1, -3:] is False
  poisoned_value = value.at[1, -1].set(jnp.nan).at[0, -1].set(jnp.inf)
  expected, expected_grads = _value_and_grads(_dense, query, key, value, query_valid, key_valid, cotangent,
                                              True, True, 2, 4)
  for attention in (_chunked, _dense):
    output, grads = _value_and_grads(attention, query, poisoned_key, poisoned_value, query_valid, key_valid,
                                     cotangent, True, True, 2, 4)
    np.testing.assert_allclose(output, expected, atol=1e-5, rtol=1e-5)
    for grad, expected_grad in zip(grads, expected_grads):
      np.testing.assert_allclose(grad, expected_grad, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("window, causal", [(1, True), (3, True), (2, False)])
@pytest.mark.parametrize("kv_heads", [2, 1])
def test_chunked_equals_dense_with_a_local_window_and_grouped_kv_heads(window, causal, kv_heads):
  """The sliding window and grouped key/value heads (HEADS query heads over kv_heads) in both implementations:
  the same outputs and gradients (the key/value gradients summed over each group)."""
  query, key, value, query_valid, key_valid, cotangent = _inputs(4, 7, 7, True)
  key, value = key[:, :, :kv_heads], value[:, :, :kv_heads]

  def dense(query, key, value, query_valid, key_valid, causal, scale, *_):
    mask = ops.combine_masks(ops.make_attention_mask(query_valid, key_valid), ops.make_local_mask(7, window))
    if causal:
      mask = ops.combine_masks(mask, ops.make_causal_mask(7))
    return ops.dot_product_attention(query, key, value, mask=mask, scale=scale)

  def chunked(query, key, value, query_valid, key_valid, causal, scale, query_chunk, key_chunk):
    return ops.chunked_dot_product_attention(query, key, value, query_valid, key_valid, causal=causal,
                                             window=window, scale=scale, query_chunk_size=query_chunk,
                                             key_chunk_size=key_chunk)

  args = (query, key, value, query_valid, key_valid, cotangent, causal, True, 3, 2)
  output, grads = _value_and_grads(chunked, *args)
  expected, expected_grads = _value_and_grads(dense, *args)
  np.testing.assert_allclose(output, expected, atol=1e-5, rtol=1e-5)
  for name, grad, expected_grad in zip("qkv", grads, expected_grads):
    assert grad.shape == expected_grad.shape
    np.testing.assert_allclose(grad, expected_grad, atol=1e-5, rtol=1e-5, err_msg=f"d{name}")
