"""The attention core against jax.nn and flax.linen, and its masking and causality properties."""
import functools

import flax.linen as flax_nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer import ops

BATCH, HEADS, DIM = 2, 3, 4
# Stated tolerances for outputs and gradients: float32 agrees to rounding; bfloat16 (8-bit mantissa, and
# flax's softmax runs in bfloat16) to about 2^-6. Observed: <5e-7 (float32), <8e-3 (bfloat16).
TOLERANCE = {jnp.float32: dict(atol=1e-5, rtol=1e-5), jnp.bfloat16: dict(atol=2e-2, rtol=2e-2)}


def _qkv(seed, q_length, kv_length, dtype=jnp.float32):
  rng = np.random.default_rng(seed)
  shapes = [(BATCH, q_length, HEADS, DIM), (BATCH, kv_length, HEADS, DIM), (BATCH, kv_length, HEADS, DIM)]
  return [jnp.asarray(rng.normal(size=shape), dtype) for shape in shapes]


def _mask(kind, q_length, kv_length):
  """A padding and/or causal mask; every query row keeps at least one key (references differ on empty rows)."""
  query_valid = np.ones((BATCH, q_length), bool)
  key_valid = np.ones((BATCH, kv_length), bool)
  if "padding" in kind:
    query_valid[1, -2:] = False
    key_valid[0, -1] = False
    key_valid[1, -3:] = False
  mask = ops.make_attention_mask(query_valid, key_valid)
  if "causal" in kind:
    mask = ops.combine_masks(mask, ops.make_causal_mask(q_length, kv_length))
  return mask, query_valid


def _as_f32(x):
  return np.asarray(x, np.float32)


def _ours(query, key, value, mask):
  return ops.dot_product_attention(query, key, value, mask=mask)


def _jax_nn(query, key, value, mask):
  return jax.nn.dot_product_attention(query, key, value, mask=mask)


def _flax(query, key, value, mask):
  return flax_nn.dot_product_attention(query, key, value, mask=mask)


@functools.partial(jax.jit, static_argnums=0)
def _value_and_grads(attention, query, key, value, mask, cotangent):
  """Output, and gradients w.r.t. q, k, v of ``sum(output * cotangent)``."""
  loss = lambda q, k, v: jnp.sum((attention(q, k, v, mask) * cotangent).astype(jnp.float32))
  return attention(query, key, value, mask), jax.grad(loss, argnums=(0, 1, 2))(query, key, value)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("kind, q_length, kv_length", [("padding", 5, 7), ("causal", 5, 7), ("causal", 6, 6),
                                                       ("padding+causal", 6, 6)])
def test_dot_product_attention_matches_jax_nn_and_flax(kind, q_length, kv_length, dtype):
  query, key, value = _qkv(0, q_length, kv_length, dtype)
  mask, query_valid = _mask(kind, q_length, kv_length)
  # Gradients are taken of a random projection of the real rows: padding queries are exactly 0 here,
  # while the references average over all keys there.
  real = query_valid[:, :, None, None]
  cotangent = jnp.asarray(np.random.default_rng(1).normal(size=query.shape) * real, dtype)
  output, ours = _value_and_grads(_ours, query, key, value, mask, cotangent)
  assert output.shape == query.shape and output.dtype == dtype
  np.testing.assert_array_equal(_as_f32(output)[~query_valid], 0.0)
  for name, reference in (("jax.nn", _jax_nn), ("flax.linen", _flax)):
    expected, theirs = _value_and_grads(reference, query, key, value, mask, cotangent)
    np.testing.assert_allclose(_as_f32(output) * real, _as_f32(expected) * real, err_msg=name,
                               **TOLERANCE[dtype])
    for grad_name, a, b in zip("qkv", ours, theirs):
      np.testing.assert_allclose(_as_f32(a), _as_f32(b), err_msg=f"{name} d{grad_name}",
                                 **TOLERANCE[dtype])


def test_bias_and_unscaled_logits_match_jax_nn():
  query, key, value = _qkv(2, 4, 5)
  bias = jnp.asarray(np.random.default_rng(3).normal(size=(1, HEADS, 4, 5)), jnp.float32)
  np.testing.assert_allclose(ops.dot_product_attention(query, key, value, bias=bias),
                             jax.nn.dot_product_attention(query, key, value, bias=bias), atol=1e-5, rtol=1e-5)
  np.testing.assert_allclose(ops.dot_product_attention(query, key, value, scale=False),
                             jax.nn.dot_product_attention(query, key, value, scale=1.0), atol=1e-5, rtol=1e-5)


def test_weights_rows_sum_to_one_and_respect_the_mask():
  query, key, value = _qkv(4, 6, 6)
  mask, _ = _mask("padding+causal", 6, 6)
  _, weights = ops.dot_product_attention(query, key, value, mask=mask, return_weights=True)
  weights = np.asarray(weights)
  assert weights.shape == (BATCH, HEADS, 6, 6)
  assert (weights[~np.broadcast_to(mask, weights.shape)] == 0).all()
  row_has_key = np.broadcast_to(np.asarray(mask).any(-1), weights.shape[:3])
  np.testing.assert_allclose(weights.sum(-1)[row_has_key], 1.0, rtol=1e-6)


def test_fully_masked_rows_are_zero_with_finite_gradients():
  query, key, value = _qkv(5, 3, 4)
  mask = np.ones((BATCH, 1, 3, 4), bool)
  mask[0, :, 1] = False  # query 1 of batch 0 sees no key
  mask[1] = False  # batch 1 sees nothing at all
  output = np.asarray(jax.jit(ops.dot_product_attention)(query, key, value, mask=mask))
  assert np.isfinite(output).all()
  np.testing.assert_array_equal(output[0, 1], 0.0)
  np.testing.assert_array_equal(output[1], 0.0)
  assert np.abs(output[0, 0]).min() > 0

  grads = jax.jit(jax.grad(lambda q, k, v: jnp.sum(ops.dot_product_attention(q, k, v, mask=mask) ** 2),
                           argnums=(0, 1, 2)))(query, key, value)
  for grad in grads:
    assert np.isfinite(np.asarray(grad)).all()
  # Nothing flows through a row that attends to nothing.
  np.testing.assert_array_equal(grads[0][0, 1], 0.0)
  np.testing.assert_array_equal(grads[0][1], 0.0)
  np.testing.assert_array_equal(grads[2][1], 0.0)


@pytest.mark.slow
@pytest.mark.parametrize("kernels", ["reference", "auto"])
@pytest.mark.parametrize("masked", [False, True])
def test_bfloat16_gradients_match_float32_attention_of_the_same_inputs(masked, kernels):
  """bfloat16 attention's gradients stay within bfloat16 rounding of the float32 computation on the same
  (bfloat16-valued) inputs, also with the CPU kernels (which keep the softmax weights for the backward in
  bfloat16 and round the logit cotangent to bfloat16), and rows that see nothing get none."""
  kernels = ops.select_kernels(kernels)
  query, key, value = (np.asarray(jnp.asarray(x, jnp.bfloat16), np.float32) for x in _qkv(11, 6, 7))
  mask = np.ones((BATCH, 1, 6, 7), bool)
  if masked:
    mask[0, :, 2] = False  # a query that sees no key
    mask[1, :, :, 5:] = False  # padding keys
  cotangent = np.random.default_rng(12).normal(size=query.shape[:3] + value.shape[-1:]).astype(np.float32)

  def grads(dtype):
    loss = lambda q, k, v: jnp.sum(ops.dot_product_attention(q, k, v, mask=mask, kernels=kernels).astype(
        jnp.float32) * cotangent)
    return [np.asarray(g, np.float32) for g in
            jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(*(jnp.asarray(x, dtype) for x in (query, key, value)))]

  for low, reference in zip(grads(jnp.bfloat16), grads(jnp.float32)):
    assert np.isfinite(low).all()
    scale = np.abs(reference).max()
    assert np.abs(low - reference).max() <= 3e-2 * scale, (np.abs(low - reference).max(), scale)
    assert np.abs(low - reference).mean() <= 5e-3 * scale
  if masked:
    np.testing.assert_array_equal(grads(jnp.bfloat16)[0][0, 2], 0.0)
    np.testing.assert_array_equal(grads(jnp.bfloat16)[1][1, 5:], 0.0)  # padding keys get no gradient


def test_appending_padding_keys_leaves_outputs_unchanged():
  query, key, value = _qkv(6, 4, 5)
  key_valid = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], bool)
  mask = ops.make_attention_mask(np.ones((BATCH, 4), bool), key_valid)
  output = ops.dot_product_attention(query, key, value, mask=mask)
  # Three more keys with large random contents, all marked as padding.
  extra_key, extra_value = [jnp.asarray(np.random.default_rng(7).normal(size=(BATCH, 3, HEADS, DIM)) * 50,
                                        jnp.float32) for _ in range(2)]
  longer_valid = np.concatenate([key_valid, np.zeros((BATCH, 3), bool)], axis=1)
  longer_mask = ops.make_attention_mask(np.ones((BATCH, 4), bool), longer_valid)
  longer_output = ops.dot_product_attention(query, jnp.concatenate([key, extra_key], 1),
                                            jnp.concatenate([value, extra_value], 1), mask=longer_mask)
  np.testing.assert_allclose(longer_output, output, atol=1e-6, rtol=1e-6)


def test_causal_attention_output_does_not_depend_on_later_positions():
  """d output[i] / d input[j] is exactly zero for j > i (and not for j <= i)."""
  length = 5
  query, key, value = _qkv(8, length, length)
  mask = ops.make_causal_mask(length)

  def attend(x):  # self attention: the same sequence gives queries, keys and values
    return ops.dot_product_attention(x, x * 0.5 + key, x * 2.0 + value, mask=mask)

  jacobian = np.asarray(jax.jit(jax.jacrev(attend))(query))  # [b, i, h, d, b', j, h', d']
  # Sum of |d out[b, i] / d in[b, j]| over the other axes: [batch, i, j].
  influence = np.abs(jacobian).sum(axis=(2, 3, 6, 7))[np.arange(BATCH), :, np.arange(BATCH)]
  future = np.triu(np.ones((length, length), bool), k=1)
  assert (influence[:, future] == 0).all()
  assert (influence[:, ~future] > 0).all()


def test_shape_errors_name_the_shapes():
  query, key, value = _qkv(9, 2, 3)
  with pytest.raises(ValueError, match=r"\[batch, length, heads, head_dim\]"):
    ops.dot_product_attention(query[0], key, value)
  with pytest.raises(ValueError, match="head_dim differ"):
    ops.dot_product_attention(query[..., :2], key, value)
  with pytest.raises(ValueError, match="key and value"):
    ops.dot_product_attention(query, key, value[:, :2])


def test_a_mask_of_the_wrong_length_is_named_with_its_shape_even_under_jit():
  """A padding mask one key short broadcast-failed deep in jnp.where, naming neither the mask nor its shape."""
  query, key, value = _qkv(9, 5, 7)
  short = np.ones((BATCH, 1, 5, 6), bool)
  expected = r"mask has shape \(2, 1, 5, 6\), which does not broadcast to .* = \(2, 3, 5, 7\): its kv_length"
  with pytest.raises(ValueError, match=expected):
    ops.dot_product_attention(query, key, value, mask=short)
  with pytest.raises(ValueError, match=expected):  # shapes are static: the check runs while tracing
    jax.jit(ops.dot_product_attention)(query, key, value, mask=short)
  with pytest.raises(ValueError, match=r"bias has shape \(3, 1, 1, 7\).* its batch axis is 3, expected 2"):
    ops.dot_product_attention(query, key, value, bias=np.zeros((3, 1, 1, 7)))
  with pytest.raises(ValueError, match=r"mask has shape \(2, 1, 5, 6\).*= \(2, 3, 5, 7\)"):
    ops.attention_weights(jnp.zeros((BATCH, HEADS, 5, 7)), mask=short)
  # Broadcastable masks (fewer axes, axes of 1) are still taken.
  ops.dot_product_attention(query, key, value, mask=np.ones((5, 7), bool))
  ops.dot_product_attention(query, key, value, mask=np.ones((BATCH, 1, 1, 7), bool))


@pytest.mark.parametrize("chunked", [False, True])
def test_attend_names_a_per_position_mask_of_the_wrong_shape(chunked):
  query, key, value = _qkv(9, 5, 7)
  kernels = ops.select_kernels("reference", attention_chunk_size=4 if chunked else None)
  with pytest.raises(ValueError, match=r"key_valid must be \[batch, length\] = \(2, 7\), got shape \(2, 6\)"):
    ops.attend(query, key, value, key_valid=np.ones((BATCH, 6), bool), kernels=kernels)
  with pytest.raises(ValueError, match=r"query_segments must be \[batch, length\] = \(2, 5\)"):
    ops.attend(query, key, value, query_segments=np.zeros((BATCH, 7), int), key_segments=np.zeros((BATCH, 7), int),
               kernels=kernels)


def test_attention_dropout_shares_one_mask_over_batch_and_heads():
  query, key, value = _qkv(10, 4, 4)

  @jax.jit
  def dropped(rng):
    weights = [ops.dot_product_attention(query, key, value, dropout_rate=0.5, dropout_rng=rng,
                                         broadcast_dropout=broadcast, return_weights=True)[1] == 0
               for broadcast in (True, False)]
    return weights

  shared, independent = [np.asarray(x) for x in dropped(jax.random.key(0))]
  assert shared.any() and not shared.all()
  assert (shared == shared[:1, :1]).all()
  assert not (independent == independent[:1, :1]).all()


@pytest.mark.slow
def test_low_precision_logits_match_flax_stock_bfloat16_attention():
  """``float32_logits=False`` keeps logits and softmax in the inputs' dtype, as flax's stock attention;
  for float32 inputs the flag changes nothing."""
  query, key, value = _qkv(13, 6, 7, jnp.bfloat16)
  mask, query_valid = _mask("padding+causal", 6, 7)
  assert ops.dot_product_scores(query, key).dtype == jnp.float32
  assert ops.dot_product_scores(query, key, float32_logits=False).dtype == jnp.bfloat16
  real = query_valid[:, :, None, None]
  cotangent = jnp.asarray(np.random.default_rng(14).normal(size=query.shape) * real, jnp.bfloat16)
  low = functools.partial(ops.dot_product_attention, float32_logits=False)
  output, ours = _value_and_grads(lambda q, k, v, m: low(q, k, v, mask=m), query, key, value, mask, cotangent)
  expected, theirs = _value_and_grads(_flax, query, key, value, mask, cotangent)
  assert output.dtype == jnp.bfloat16
  np.testing.assert_allclose(_as_f32(output) * real, _as_f32(expected) * real, **TOLERANCE[jnp.bfloat16])
  for grad_name, a, b in zip("qkv", ours, theirs):
    np.testing.assert_allclose(_as_f32(a), _as_f32(b), err_msg=f"d{grad_name}", **TOLERANCE[jnp.bfloat16])

  query, key, value = _qkv(13, 6, 7)
  np.testing.assert_array_equal(low(query, key, value, mask=mask),
                                ops.dot_product_attention(query, key, value, mask=mask))


def test_float32_logits_are_more_accurate_than_bfloat16_ones():
  """The default's reason to exist: against float64 attention of the same bfloat16-valued inputs, float32
  logits give a smaller error than logits and softmax in bfloat16 (64 keys, so the normaliser matters)."""
  query, key, value = _qkv(15, 16, 64, jnp.bfloat16)
  q64, k64, v64 = (np.asarray(x, np.float64) for x in (query, key, value))
  logits = np.einsum("bqhd,bkhd->bhqk", q64, k64) / np.sqrt(DIM)
  weights = np.exp(logits - logits.max(-1, keepdims=True))
  weights /= weights.sum(-1, keepdims=True)
  reference = np.einsum("bhqk,bkhd->bqhd", weights, v64)
  errors = {float32_logits: np.abs(_as_f32(ops.dot_product_attention(query, key, value,
                                                                     float32_logits=float32_logits))
                                   - reference).mean()
            for float32_logits in (True, False)}
  assert errors[True] < 0.8 * errors[False], errors


@pytest.mark.slow
def test_float16_logits_keep_fully_masked_rows_finite():
  """float16 cannot hold MASK_VALUE (it rounds to -inf, and a row that sees no key has a NaN softmax): such
  rows are still exactly 0, with finite gradients, and masked keys get none."""
  query, key, value = _qkv(16, 3, 4, jnp.float16)
  mask = np.ones((BATCH, 1, 3, 4), bool)
  mask[0, :, 1] = False
  mask[1, :, :, 2:] = False
  attention = functools.partial(ops.dot_product_attention, mask=mask, float32_logits=False)
  output = np.asarray(attention(query, key, value), np.float32)
  assert np.isfinite(output).all()
  np.testing.assert_array_equal(output[0, 1], 0.0)
  grads = jax.grad(lambda q, k, v: jnp.sum(attention(q, k, v).astype(jnp.float32) ** 2), argnums=(0, 1, 2))(
      query, key, value)
  for grad in grads:
    assert np.isfinite(np.asarray(grad, np.float32)).all()
  np.testing.assert_array_equal(np.asarray(grads[1], np.float32)[1, 2:], 0.0)  # masked keys get no gradient


def test_integer_inputs_are_named():
  query, key, value = (x.astype(jnp.int32) for x in _qkv(17, 3, 4))
  with pytest.raises(ValueError, match="floating-point query, key and value, got int32"):
    ops.dot_product_attention(query, key, value)


@pytest.mark.slow
def test_nan_in_a_masked_out_value_does_not_leak_into_the_output():
  """A key no query may attend to (padding) is never read: NaN or inf there changes nothing, also with a
  2-D mask (broadcast as numpy does)."""
  query, key, value = _qkv(18, 3, 5)
  mask, _ = _mask("padding", 3, 5)  # key 4 of example 0 and keys 2-4 of example 1 are padding
  expected = ops.dot_product_attention(query, key, value, mask=mask)
  poisoned_value = value.at[0, 4].set(jnp.nan).at[1, 2].set(jnp.inf)
  poisoned_key = key.at[1, 3].set(jnp.nan)
  output = ops.dot_product_attention(query, poisoned_key, poisoned_value, mask=mask)
  np.testing.assert_allclose(output, expected, atol=1e-6, rtol=1e-6)
  grads = jax.grad(lambda q, k, v: jnp.sum(ops.dot_product_attention(q, k, v, mask=mask) ** 2),
                   argnums=(0, 1, 2))(query, poisoned_key, poisoned_value)
  assert all(np.isfinite(np.asarray(grad)).all() for grad in grads)
  causal = ops.make_causal_mask(3, 5)[0, 0]  # [q_length, kv_length]: key 4 is seen by no query
  np.testing.assert_allclose(ops.dot_product_attention(query, key, value.at[:, 4].set(jnp.nan), mask=causal),
                             ops.dot_product_attention(query, key, value, mask=causal[None, None]),
                             atol=1e-6, rtol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("kernels", ["reference", "auto"])
@pytest.mark.parametrize("kv_heads", [4, 2, 1])
def test_grouped_query_attention_matches_jax_nn(kv_heads, kernels):
  """Keys and values with fewer heads than the queries (group sizes 1, 2, 4 of 4 query heads), as jax.nn's own
  grouped-query test: outputs and gradients, with a padding and causal mask, on the formula and the CPU kernels."""
  rng = np.random.default_rng(5)
  query = jnp.asarray(rng.normal(size=(BATCH, 6, 4, DIM)), jnp.float32)
  key, value = (jnp.asarray(rng.normal(size=(BATCH, 6, kv_heads, DIM)), jnp.float32) for _ in range(2))
  mask, query_valid = _mask("padding+causal", 6, 6)
  real = query_valid[:, :, None, None]
  cotangent = jnp.asarray(rng.normal(size=query.shape) * real, jnp.float32)
  def ours(query, key, value, mask):
    return ops.dot_product_attention(query, key, value, mask=mask, kernels=ops.select_kernels(kernels))
  output, grads = _value_and_grads(ours, query, key, value, mask, cotangent)
  expected, expected_grads = _value_and_grads(_jax_nn, query, key, value, mask, cotangent)
  np.testing.assert_allclose(_as_f32(output) * real, _as_f32(expected) * real, atol=1e-5, rtol=1e-5)
  for name, grad, expected_grad in zip("qkv", grads, expected_grads):
    assert grad.shape == expected_grad.shape
    np.testing.assert_allclose(grad, expected_grad, atol=1e-5, rtol=1e-5, err_msg=f"d{name}")


def test_key_heads_that_do_not_divide_the_query_heads_are_named():
  query = jnp.zeros((1, 2, 4, DIM))
  key = jnp.zeros((1, 2, 3, DIM))
  with pytest.raises(ValueError, match="must divide"):
    ops.dot_product_attention(query, key, key)


@pytest.mark.slow
def test_nested_lists_are_taken_as_jax_nn_takes_them():
  query, key, value = (np.asarray(x).tolist() for x in _qkv(0, 3, 3))
  mask = np.asarray(_mask("causal", 3, 3)[0]).tolist()
  expected = jax.nn.dot_product_attention(query, key, value, mask=mask)  # jax.nn converts array-likes
  output = ops.dot_product_attention(query, key, value, mask=mask)
  np.testing.assert_allclose(output, expected, **TOLERANCE[jnp.float32])
  bias = np.zeros((1, 1, 3, 3)).tolist()
  np.testing.assert_allclose(ops.dot_product_attention(query, key, value, bias=bias),
                             jax.nn.dot_product_attention(query, key, value), **TOLERANCE[jnp.float32])


def _dense_reference(query, key, value, mask):
  """Softmax attention written out in numpy (float64): weights ``[batch, heads, q, kv]`` that are 0 off the mask
  and on rows with no key, and the output ``[batch, q, heads, dim]``; independent of ``ops``."""
  query, key, value = (np.asarray(x, np.float64) for x in (query, key, value))
  mask = np.broadcast_to(np.asarray(mask, bool), (query.shape[0], query.shape[2], query.shape[1], key.shape[1]))
  logits = np.einsum("bqhd,bkhd->bhqk", query, key) / np.sqrt(query.shape[-1])
  logits = np.where(mask, logits, -np.inf)
  row_max = np.where(mask.any(-1, keepdims=True), logits.max(-1, keepdims=True), 0.0)
  exp = np.where(mask, np.exp(logits - row_max), 0.0)
  weights = exp / np.maximum(exp.sum(-1, keepdims=True), 1e-300)
  return np.einsum("bhqk,bkhd->bqhd", weights, value), weights


@pytest.mark.parametrize("kernels", ["reference", "auto"])
def test_attend_builds_the_mask_from_its_parts_and_chunked_kernels_compute_the_same(kernels):
  """``attend`` = attention over make_attention_mask(valid) & causal & extra mask & window; with
  ``attention_chunk_size`` the blocked implementation, the same values; dense again where weights are asked
  or a further mask is given. Checked against a numpy softmax, weights included."""
  query, key, value = _qkv(7, 6, 6)
  query_valid = np.array([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]], bool)
  key_valid = np.array([[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 0, 0]], bool)
  mask = ops.combine_masks(ops.make_attention_mask(query_valid, key_valid), ops.make_causal_mask(6, 6))
  mask = np.asarray(ops.combine_masks(mask, ops.make_local_mask(6, 3, 6)))
  expected, expected_weights = _dense_reference(query, key, value, mask)
  parts = dict(query_valid=query_valid, key_valid=key_valid, causal=True, window=3)
  dense = ops.select_kernels(kernels)
  chunked = ops.select_kernels(kernels, attention_chunk_size=4)
  assert chunked.attention_chunk_size == 4 and dense.attention_chunk_size is None
  np.testing.assert_allclose(ops.attend(query, key, value, kernels=dense, **parts), expected, atol=1e-5)
  np.testing.assert_allclose(ops.attend(query, key, value, kernels=chunked, **parts), expected, atol=1e-5)
  output, weights = ops.attend(query, key, value, kernels=chunked, return_weights=True, **parts)
  np.testing.assert_allclose(output, expected, atol=1e-5)
  np.testing.assert_allclose(weights, expected_weights, atol=1e-6)
  # A further mask (a decode cache's, per example): it hides key 1 from example 0 and key 2 from example 1,
  # which every query that sees them must feel; it takes the dense path.
  extra = np.ones((BATCH, 1, 6, 6), bool)
  extra[0, :, :, 1] = False
  extra[1, :, :, 2] = False
  expected_extra, expected_extra_weights = _dense_reference(query, key, value, mask & extra)
  assert np.abs(expected_extra - expected).max() > 0.1  # the extra mask changes the answer
  for chosen in (dense, chunked):
    np.testing.assert_allclose(ops.attend(query, key, value, kernels=chosen, mask=extra, **parts), expected_extra,
                               atol=1e-5)
    output, weights = ops.attend(query, key, value, kernels=chosen, mask=extra, return_weights=True, **parts)
    np.testing.assert_allclose(output, expected_extra, atol=1e-5)
    np.testing.assert_allclose(weights, expected_extra_weights, atol=1e-6)
