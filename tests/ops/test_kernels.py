"""``ops.kernels``: each backend-tuned piece equals the formula it replaces (values and gradients), the
CPU pieces keep their properties, and ``select_kernels`` / ``fused_attention_blocker`` decide as documented."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer import ops
from transformer.ops import kernels

BATCH, HEADS, DIM = 2, 3, 8
AUTO = ops.select_kernels("auto")  # on this CPU machine: the XLA:CPU pieces
# Tight: float32 differs only by summation order; bfloat16 by the CPU kernels' rounding of the logit
# cotangent to bfloat16 (a few ulps of the gradient), outputs by float32 accumulation order.
TOLERANCE = {jnp.float32: dict(atol=2e-6, rtol=2e-6), jnp.bfloat16: dict(atol=2e-2, rtol=2e-2)}


def _qkv(seed, q_length, kv_length, dtype=jnp.float32, head_dim=DIM):
  rng = np.random.default_rng(seed)
  shapes = [(BATCH, q_length, HEADS, head_dim), (BATCH, kv_length, HEADS, head_dim),
            (BATCH, kv_length, HEADS, head_dim)]
  return [jnp.asarray(rng.normal(size=shape), dtype) for shape in shapes]


def _padding_causal_mask(q_length, kv_length):
  """Padding keys, a padding query, causality, and a query row that sees no key at all."""
  query_valid = np.ones((BATCH, q_length), bool)
  key_valid = np.ones((BATCH, kv_length), bool)
  query_valid[1, -1] = False
  key_valid[1, -2:] = False
  key_valid[0, 0] = False  # with causality, query 0 of batch 0 sees nothing
  return ops.combine_masks(ops.make_attention_mask(query_valid, key_valid),
                           ops.make_causal_mask(q_length, kv_length))


def _value_and_grads(function, *inputs, seed=0):
  """``function(*inputs)`` and the gradients of ``sum(output * cotangent)`` w.r.t. every input."""
  output = function(*inputs)
  cotangent = jnp.asarray(np.random.default_rng(seed).normal(size=output.shape), jnp.float32)
  loss = lambda *args: jnp.sum(function(*args).astype(jnp.float32) * cotangent)
  return output, jax.grad(loss, argnums=tuple(range(len(inputs))))(*inputs)


def _assert_same(function, inputs, tolerance):
  """``function(kernels)`` gives the same outputs and gradients with the auto kernels and the reference."""
  auto_output, auto_grads = jax.jit(functools.partial(_value_and_grads, function(AUTO)))(*inputs)
  reference_output, reference_grads = jax.jit(functools.partial(_value_and_grads, function(None)))(*inputs)
  assert auto_output.dtype == reference_output.dtype
  np.testing.assert_allclose(np.asarray(auto_output, np.float32), np.asarray(reference_output, np.float32),
                             **tolerance)
  for index, (a, b) in enumerate(zip(auto_grads, reference_grads)):
    assert a.dtype == b.dtype
    np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), err_msg=f"input {index}",
                               **tolerance)


def test_auto_on_cpu_is_the_xla_cpu_kernels_and_never_cudnn():
  assert jax.default_backend() == "cpu"
  assert AUTO is kernels.XLA_CPU and AUTO.attention is None
  assert ops.select_kernels("reference") is kernels.REFERENCE


# ------------------------------------------------------------------------- auto agrees with the reference


@pytest.mark.slow
@pytest.mark.parametrize("masked", [False, True], ids=["no-mask", "padding+causal"])
@pytest.mark.parametrize("dtype, float32_logits", [(jnp.float32, True), (jnp.bfloat16, True), (jnp.bfloat16, False)],
                         ids=["float32", "bfloat16-float32-logits", "bfloat16-logits"])  # float32 has no other logits
def test_dense_attention_auto_equals_reference(dtype, masked, float32_logits):
  query, key, value = _qkv(0, 6, 8, dtype)
  mask = _padding_causal_mask(6, 8) if masked else None
  attention = lambda kernels: lambda q, k, v: ops.dot_product_attention(
      q, k, v, mask=mask, float32_logits=float32_logits, kernels=kernels)
  _assert_same(attention, (query, key, value), TOLERANCE[dtype])
  weights = lambda kernels: ops.dot_product_attention(query, key, value, mask=mask, return_weights=True,
                                                      kernels=kernels)[1]
  np.testing.assert_allclose(np.asarray(weights(AUTO), np.float32), np.asarray(weights(None), np.float32),
                             **TOLERANCE[dtype])


@pytest.mark.parametrize("q_length", [1, 5], ids=["one-query(decode-step)", "five-queries"])
def test_cached_decode_step_and_cross_attention_shapes_agree(q_length):
  """One query against many keys (a cached decoding step, an RNN step) and cross attention (q != kv)."""
  query, key, value = _qkv(1, q_length, 9)
  key_valid = np.ones((BATCH, 9), bool)
  key_valid[0, 6:] = False
  mask = ops.make_attention_mask(np.ones((BATCH, q_length), bool), key_valid)
  attention = lambda kernels: lambda q, k, v: ops.dot_product_attention(q, k, v, mask=mask, kernels=kernels)
  _assert_same(attention, (query, key, value), TOLERANCE[jnp.float32])


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["float32", "bfloat16"])
def test_chunked_attention_auto_equals_reference(dtype):
  query, key, value = _qkv(2, 7, 9, dtype)
  query_valid = np.ones((BATCH, 7), bool)
  key_valid = np.ones((BATCH, 9), bool)
  query_valid[1, -2:] = False
  key_valid[0, -3:] = False
  attention = lambda kernels: lambda q, k, v: ops.chunked_dot_product_attention(
      q, k, v, query_valid, key_valid, causal=True, query_chunk_size=3, key_chunk_size=4, kernels=kernels)
  _assert_same(attention, (query, key, value), TOLERANCE[dtype])


@pytest.mark.parametrize("norm", ["layer_norm", "rms_norm"])
def test_norms_auto_equal_reference(norm):
  rng = np.random.default_rng(3)
  x, scale, bias = (jnp.asarray(rng.normal(size=shape), jnp.float32) for shape in [(2, 5, 16), (16,), (16,)])
  if norm == "layer_norm":
    function = lambda kernels: lambda x, s, b: ops.layer_norm(x, s, b, kernels=kernels)
  else:
    function = lambda kernels: lambda x, s, b: ops.rms_norm(x, s, kernels=kernels) + 0 * b
  _assert_same(function, (x, scale, bias), TOLERANCE[jnp.float32])


@pytest.mark.slow
@pytest.mark.parametrize("score", ["luong_dot", "general", "cosine"])
@pytest.mark.parametrize("q_length", [1, 4])
def test_rnn_scores_and_single_head_attention_auto_equal_reference(score, q_length):
  """The RNN baselines' path: a score, then ``attention_weights`` and ``weighted_values`` with one head."""
  rng = np.random.default_rng(4)
  query = jnp.asarray(rng.normal(size=(BATCH, q_length, 1, 6)), jnp.float32)
  keys = jnp.asarray(rng.normal(size=(BATCH, 5, 1, 6)), jnp.float32)
  weight = jnp.asarray(rng.normal(size=(6, 6)), jnp.float32)
  mask = np.ones((BATCH, 1, 1, 5), bool)
  mask[1, ..., 3:] = False
  scores = {"luong_dot": lambda q, k, w, kernels: ops.luong_dot_scores(q, k, kernels=kernels),
            "general": lambda q, k, w, kernels: ops.general_scores(q, k, w, kernels=kernels),
            "cosine": lambda q, k, w, kernels: ops.cosine_scores(q, k, temperature=0.1, kernels=kernels)}[score]

  def attend(kernels):
    def function(q, k, w):
      weights = ops.attention_weights(scores(q, k, w, kernels), mask, kernels=kernels)
      return ops.weighted_values(weights, k, kernels=kernels)
    return function

  _assert_same(attend, (query, keys, weight), TOLERANCE[jnp.float32])


def test_feed_forward_without_dropout_is_the_same_for_any_kernels():
  rng = np.random.default_rng(5)
  x, kernel_in, kernel_out = (jnp.asarray(rng.normal(size=s), jnp.float32) for s in [(2, 3, 4), (4, 8), (8, 4)])
  np.testing.assert_array_equal(ops.feed_forward(x, kernel_in, None, kernel_out, None, kernels=AUTO),
                                ops.feed_forward(x, kernel_in, None, kernel_out, None))


# ------------------------------------------------------------------------------- the XLA:CPU pieces


def _sine_loss(x):
  return jnp.sum(jnp.sin(kernels.gradient_barrier(x)) ** 2)


def test_gradient_barrier_is_the_identity_in_value_and_gradient():
  x = jax.random.normal(jax.random.PRNGKey(0), (3, 5, 8))
  np.testing.assert_array_equal(kernels.gradient_barrier(x), x)
  expected = jax.grad(lambda x: jnp.sum(jnp.sin(x) ** 2))(x)
  np.testing.assert_allclose(jax.jit(jax.grad(_sine_loss))(x), expected, rtol=1e-6)
  np.testing.assert_allclose(jax.vmap(jax.grad(_sine_loss))(x), expected, rtol=1e-6)  # vmap over seeds


def test_gradient_barrier_sits_in_the_backward_pass_only():
  x = jnp.ones((4, 8))
  assert "optimization_barrier" not in jax.jit(_sine_loss).lower(x).as_text()
  assert "optimization_barrier" in jax.jit(jax.grad(_sine_loss)).lower(x).as_text()


@pytest.mark.parametrize("kernels_, barrier", [(AUTO, True), (None, False)], ids=["auto", "reference"])
def test_norms_put_a_barrier_on_their_input_gradient_only_with_the_cpu_kernels(kernels_, barrier):
  x, scale, bias = jnp.ones((2, 3, 8)), jnp.ones(8), jnp.zeros(8)
  for norm in (lambda x: ops.layer_norm(x, scale, bias, kernels=kernels_),
               lambda x: ops.rms_norm(x, scale, kernels=kernels_)):
    backward = jax.jit(jax.grad(lambda x: jnp.sum(norm(x) ** 3))).lower(x).as_text()
    assert ("optimization_barrier" in backward) == barrier


def test_materialized_transpose_swaps_the_last_two_axes():
  x = jnp.arange(24.0).reshape(2, 3, 4)
  np.testing.assert_array_equal(kernels.materialized_transpose(x), np.swapaxes(np.asarray(x), -1, -2))


@pytest.mark.parametrize("shapes", [((2, 3, 4, 5), (2, 3, 5, 6)),  # a smaller than the cotangent: a^T g
                                    ((2, 3, 9, 8), (2, 3, 8, 2)),  # a larger: (g^T a)^T
                                    ((2, 3, 1, 8), (2, 3, 8, 4))],  # one row: plain autodiff
                         ids=["transpose-a", "transpose-cotangent", "one-row"])
def test_batched_matmul_values_and_gradients_match_numpy(shapes):
  rng = np.random.default_rng(2)
  a, b = (rng.normal(size=shape).astype(np.float32) for shape in shapes)
  cotangent = rng.normal(size=(*shapes[0][:-1], shapes[1][-1])).astype(np.float32)
  np.testing.assert_allclose(kernels.batched_matmul(a, b), a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)
  a_grad, b_grad = jax.grad(lambda a, b: jnp.sum(kernels.batched_matmul(a, b) * cotangent), argnums=(0, 1))(a, b)
  np.testing.assert_allclose(a_grad, cotangent @ np.swapaxes(b, -1, -2), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(b_grad, np.swapaxes(a, -1, -2) @ cotangent, rtol=1e-5, atol=1e-5)


def test_batched_matmul_backward_runs_every_dot_in_plain_form():
  """No gradient dot contracts its left operand's second-to-last axis (XLA:CPU ran those on its slow path)."""
  a, b = jnp.ones((2, 4, 32, 8)), jnp.ones((2, 4, 8, 32))
  grad = jax.jit(jax.grad(lambda a, b: jnp.sum(jnp.tanh(kernels.batched_matmul(a, b))), argnums=(0, 1)))
  hlo = grad.lower(a, b).as_text(dialect="hlo")  # before optimisation: the dots as jax wrote them
  dots = [line for line in hlo.splitlines() if " dot(" in line]
  assert len(dots) == 3  # forward, and one per operand
  assert all("lhs_contracting_dims={3}" in line for line in dots), dots


def test_batched_matmul_bfloat16_backward_rounds_the_cotangent_and_accumulates_in_float32():
  rng = np.random.default_rng(3)
  a, b = (jnp.asarray(rng.normal(size=shape), jnp.bfloat16) for shape in [(1, 2, 300, 16), (1, 2, 16, 3)])
  cotangent = jnp.asarray(rng.normal(size=(1, 2, 300, 3)), jnp.float32)
  matmul = functools.partial(kernels.batched_matmul, preferred_element_type=jnp.float32)
  assert matmul(a, b).dtype == jnp.float32
  a_grad, b_grad = jax.grad(lambda a, b: jnp.sum(matmul(a, b) * cotangent), argnums=(0, 1))(a, b)
  assert a_grad.dtype == b_grad.dtype == jnp.bfloat16
  # The b gradient sums 300 products: float32 accumulation of the bfloat16-rounded cotangent, rounded once.
  rounded = np.asarray(cotangent.astype(jnp.bfloat16), np.float32)
  expected = np.swapaxes(np.asarray(a, np.float32), -1, -2) @ rounded
  np.testing.assert_array_equal(np.asarray(b_grad, np.float32),
                                np.asarray(jnp.asarray(expected, jnp.bfloat16), np.float32))


def test_batched_matmul_names_a_shape_mismatch():
  with pytest.raises(ValueError, match="are not"):
    kernels.batched_matmul(jnp.ones((2, 3, 4)), jnp.ones((2, 5, 6)))


def test_cpu_bfloat16_scores_backward_is_two_bfloat16_matmuls_within_rounding_of_float64():
  """The CPU kernels' backward of bfloat16 scores rounds the float32 logit cotangent to bfloat16 and runs two
  bfloat16 matmuls (FlashAttention-2's dS): gradients within bfloat16 rounding of the exact ones."""
  rng = np.random.default_rng(4)
  query16 = jnp.asarray(rng.normal(size=(BATCH, 3, 2, 5)), jnp.bfloat16)
  key16 = jnp.asarray(rng.normal(size=(BATCH, 4, 2, 5)), jnp.bfloat16)
  cotangent = rng.normal(size=(BATCH, 2, 3, 4)).astype(np.float32)
  logits, vjp = jax.vjp(lambda q, k: ops.dot_product_scores(q, k, scale=False, kernels=AUTO), query16, key16)
  query_grad, key_grad = vjp(jnp.asarray(cotangent))
  assert logits.dtype == np.float32 and query_grad.dtype == key_grad.dtype == jnp.bfloat16
  q64, k64, g64 = (np.asarray(x, np.float64) for x in (query16, key16, cotangent))
  # rounding g to bfloat16 (relative 2^-8 per term) and the result to bfloat16 (2^-8 relative)
  query_bound = 2 * 2.0 ** -8 * np.einsum("bhqk,bkhd->bqhd", np.abs(g64), np.abs(k64)) + 1e-6
  key_bound = 2 * 2.0 ** -8 * np.einsum("bhqk,bqhd->bkhd", np.abs(g64), np.abs(q64)) + 1e-6
  assert np.all(np.abs(np.asarray(query_grad, np.float64) - np.einsum("bhqk,bkhd->bqhd", g64, k64)) <= query_bound)
  assert np.all(np.abs(np.asarray(key_grad, np.float64) - np.einsum("bhqk,bqhd->bkhd", g64, q64)) <= key_bound)
  backward = jax.make_jaxpr(vjp)(jnp.asarray(cotangent))
  dots = [eqn for eqn in backward.jaxpr.eqns if eqn.primitive.name == "dot_general"]
  assert len(dots) == 2
  assert all(var.aval.dtype == jnp.bfloat16 for dot in dots for var in dot.invars)


@pytest.mark.slow
def test_softmax_saved_in_output_dtype_is_jax_nn_softmax_in_value_and_gradient():
  logits = jax.random.normal(jax.random.PRNGKey(1), (2, 3, 4, 7)) * 3
  cotangent = jax.random.normal(jax.random.PRNGKey(2), logits.shape)
  for dtype in (jnp.bfloat16, jnp.float32):
    ours, ours_vjp = jax.vjp(lambda x: kernels.softmax_saved_in_output_dtype(x, dtype), logits)
    theirs, theirs_vjp = jax.vjp(lambda x: jax.nn.softmax(x, axis=-1).astype(dtype), logits)
    assert ours.dtype == dtype
    np.testing.assert_array_equal(np.asarray(ours, np.float32), np.asarray(theirs, np.float32))
    # bfloat16: the backward reads the bfloat16 weights (relative 2^-8), float32: the same computation
    tolerance = 2e-2 if dtype == jnp.bfloat16 else 1e-6
    np.testing.assert_allclose(ours_vjp(cotangent.astype(dtype))[0], theirs_vjp(cotangent.astype(dtype))[0],
                               atol=tolerance, rtol=tolerance)


@pytest.mark.parametrize("shape", [(64, 4096), (3, 50, 7)])  # four bytes per 32-bit word, and the fallback
def test_random_bytes_are_uniform_and_independent(shape):
  draws = np.asarray(kernels.random_bytes(jax.random.key(3), shape))
  assert draws.dtype == np.uint8 and draws.shape == shape
  counts = np.bincount(draws.ravel(), minlength=256)
  expected = draws.size / 256
  chi_square = ((counts - expected) ** 2 / expected).sum()
  assert chi_square < 255 + 5 * np.sqrt(2 * 255)  # 255 degrees of freedom: mean 255, sd ~22.6
  # Bytes cut from one word must not be related: neighbours along the last axis are uncorrelated.
  flat = draws.reshape(-1, shape[-1]).astype(np.float64)
  correlation = np.corrcoef(flat[:, :-1].ravel(), flat[:, 1:].ravel())[0, 1]
  assert abs(correlation) < 5 / np.sqrt(flat[:, 1:].size)
  assert not np.array_equal(draws, np.asarray(kernels.random_bytes(jax.random.key(4), shape)))


@pytest.mark.parametrize("rate", [0.1, 0.3, 0.5, 0.9])
def test_byte_mask_dropout_drops_at_its_documented_rate_and_keeps_the_expectation(rate):
  applied = kernels.effective_dropout_rate(rate)
  assert applied * 256 == round(applied * 256) and abs(applied - rate) <= 1 / 512
  y = np.asarray(ops.dropout(jnp.ones((400, 500)), rate, jax.random.key(4), kernels=AUTO))
  assert abs((y == 0).mean() - applied) < 0.005  # 200k draws: standard error <= 0.0012
  np.testing.assert_allclose(y[y != 0], 1.0 / (1.0 - applied), rtol=1e-6)  # expectation kept exactly
  np.testing.assert_array_equal(y, kernels.byte_mask_dropout(jnp.ones((400, 500)), rate, jax.random.key(4)))


def test_byte_mask_dropout_applies_the_rounded_rate_not_the_given_one():
  """0.3 is applied as 77/256 = 0.30078: over 16M draws (standard error 0.000115) that is what is measured."""
  assert kernels.effective_dropout_rate(0.3) == 77 / 256
  y = ops.dropout(jnp.ones((4000, 4000)), 0.3, jax.random.key(5), kernels=AUTO)
  assert abs(float(jnp.mean(y == 0)) - 77 / 256) < 4 * 0.000115
  np.testing.assert_array_equal(ops.dropout(jnp.ones(8), 1 / 1024, jax.random.key(0), kernels=AUTO), 1.0)  # 0/256


def test_byte_mask_dropout_follows_its_key_and_shares_masks_over_broadcast_dims():
  x = jnp.ones((3, 4, 64))
  a = ops.dropout(x, 0.5, jax.random.key(1), broadcast_dims=(0, 1), kernels=AUTO)
  np.testing.assert_array_equal(a, ops.dropout(x, 0.5, jax.random.key(1), broadcast_dims=(0, 1), kernels=AUTO))
  assert not np.array_equal(a, ops.dropout(x, 0.5, jax.random.key(2), broadcast_dims=(0, 1), kernels=AUTO))
  assert (np.asarray(a) == np.asarray(a)[:1, :1]).all() and 0 < (np.asarray(a)[0, 0] == 0).sum() < 64
  with pytest.raises(ValueError, match="needs a key"):  # ops.dropout checks before any kernel runs
    ops.dropout(x, 0.5, None, kernels=AUTO)


# ------------------------------------------------------------------------------------- the dispatcher


@pytest.mark.parametrize("platform, expected", [("cpu", "xla_cpu"), ("gpu", "cudnn"), ("cuda", "cudnn"),
                                                ("rocm", "reference"), ("tpu", "reference"),
                                                ("METAL", "reference")])
def test_select_kernels_picks_by_platform(platform, expected):
  assert ops.select_kernels("auto", platform=platform).name == expected
  assert ops.select_kernels("reference", platform=platform) is kernels.REFERENCE


def test_select_kernels_names_the_choices():
  with pytest.raises(ValueError, match=r"kernels='fast'.*\['auto', 'reference'\]"):
    ops.select_kernels("fast")


def _bfloat16_qkv(head_dim=64, q_length=4, kv_length=6):
  return _qkv(6, q_length, kv_length, jnp.bfloat16, head_dim=head_dim)


@pytest.mark.parametrize("change, reason", [
    ({}, None),
    (dict(dtype=jnp.float16), None),
    (dict(mask=True), None),
    (dict(return_weights=True), "weights are requested"),
    (dict(dropout_rate=0.1), "attention dropout"),
    (dict(bias=True), "bias"),
    (dict(precision=jax.lax.Precision.HIGHEST), "precision"),
    (dict(dtype=jnp.float32), "float16 or bfloat16"),
    (dict(head_dim=12), "multiples of 8"),
    (dict(head_dim=256), "up to 128"),
    (dict(mask=True, q_length=5), "even lengths"),
], ids=lambda value: str(value))
def test_fused_attention_blocker_names_each_failed_precondition(change, reason):
  change = dict(change)
  dtype = change.pop("dtype", jnp.bfloat16)
  query, key, value = _qkv(6, change.pop("q_length", 4), 6, dtype, head_dim=change.pop("head_dim", 64))
  if change.pop("mask", False):
    change["mask"] = ops.make_causal_mask(query.shape[1], key.shape[1])
  if change.pop("bias", False):
    change["bias"] = jnp.zeros((1, 1, query.shape[1], key.shape[1]))
  blocker = kernels.fused_attention_blocker(query, key, value, **change)
  if reason is None:
    assert blocker is None
  else:
    assert reason in blocker


def test_fused_attention_blocker_rejects_mixed_dtypes():
  query, key, value = _bfloat16_qkv()
  assert "one dtype" in kernels.fused_attention_blocker(query, key, value.astype(jnp.float16))


def _spy_kernels(calls):
  """GPU kernels whose fused attention records its call and returns a marker, 7 everywhere (cuDNN cannot run
  here)."""
  def fused(query, key, value, mask, scale):
    calls.append(scale)
    return jnp.full(query.shape, 7, query.dtype)
  return kernels.Kernels(name="spy", attention=fused)


def test_dot_product_attention_takes_the_fused_kernel_only_where_nothing_blocks_it():
  calls = []
  spy = _spy_kernels(calls)
  query, key, value = _bfloat16_qkv()
  fused = ops.dot_product_attention(query, key, value, kernels=spy)
  assert calls == [64 ** -0.5]
  np.testing.assert_array_equal(np.asarray(fused, np.float32), 7.0)  # the kernel's output is what comes back
  ops.dot_product_attention(query, key, value, scale=False, kernels=spy)
  assert calls[-1] == 1.0
  # clean fallbacks: the formula runs, the kernel is not called
  ops.dot_product_attention(query, key, value, return_weights=True, kernels=spy)
  ops.dot_product_attention(query, key, value, dropout_rate=0.1, dropout_rng=jax.random.key(0), kernels=spy)
  ops.dot_product_attention(*(x.astype(jnp.float32) for x in (query, key, value)), kernels=spy)
  ops.dot_product_attention(*_bfloat16_qkv(head_dim=12), kernels=spy)
  assert len(calls) == 2


@pytest.mark.slow
def test_cudnn_attention_keeps_the_mask_contract(monkeypatch):
  """The wrapper around jax.nn's cuDNN call, run here through jax.nn's XLA implementation: rows that see no
  key give 0 with finite gradients, other rows equal the reference attention."""
  xla_attention = jax.nn.dot_product_attention
  monkeypatch.setattr(jax.nn, "dot_product_attention",
                      lambda *args, implementation, **kwargs: xla_attention(*args, implementation="xla", **kwargs))
  query, key, value = _qkv(7, 6, 8)
  mask = _padding_causal_mask(6, 8)
  fused = lambda kernels: lambda q, k, v: kernels.attention(q, k, v, mask, DIM ** -0.5)
  output, grads = _value_and_grads(fused(kernels.CUDNN), query, key, value)
  reference_output, reference_grads = _value_and_grads(
      lambda q, k, v: ops.dot_product_attention(q, k, v, mask=mask), query, key, value)
  np.testing.assert_array_equal(output[0, 0], 0.0)  # query 0 of batch 0 sees no key
  np.testing.assert_allclose(output, reference_output, atol=1e-6, rtol=1e-6)
  for grad, reference_grad in zip(grads, reference_grads):
    assert np.isfinite(np.asarray(grad)).all()
    np.testing.assert_allclose(grad, reference_grad, atol=1e-5, rtol=1e-5)
  unmasked = kernels.cudnn_attention(query, key, value, None, DIM ** -0.5)
  np.testing.assert_allclose(unmasked, ops.dot_product_attention(query, key, value), atol=1e-6, rtol=1e-6)


def _grouped_local_inputs(kv_heads, dtype, length=8, heads=4, head_dim=DIM, window=3):
  """Queries of ``heads`` heads, keys and values of ``kv_heads``, and a padding + causal + sliding-window mask."""
  rng = np.random.default_rng(11)
  query = jnp.asarray(rng.normal(size=(BATCH, length, heads, head_dim)), dtype)
  key, value = (jnp.asarray(rng.normal(size=(BATCH, length, kv_heads, head_dim)), dtype) for _ in range(2))
  key_valid = np.ones((BATCH, length), bool)
  key_valid[1, -2:] = False
  mask = ops.combine_masks(ops.make_attention_mask(np.ones((BATCH, length), bool), key_valid),
                           ops.make_causal_mask(length), ops.make_local_mask(length, window))
  return query, key, value, mask


@pytest.mark.slow
@pytest.mark.parametrize("kv_heads", [4, 2, 1])
def test_cudnn_attention_takes_grouped_kv_heads_and_a_window_mask(monkeypatch, kv_heads):
  """jax.nn's fused attention reads grouped key/value heads itself (no repeat): run here through jax.nn's XLA
  implementation, the wrapper equals the reference for grouped-query and multi-query attention."""
  xla_attention = jax.nn.dot_product_attention
  monkeypatch.setattr(jax.nn, "dot_product_attention",
                      lambda *args, implementation, **kwargs: xla_attention(*args, implementation="xla", **kwargs))
  query, key, value, mask = _grouped_local_inputs(kv_heads, jnp.float32)
  output, grads = _value_and_grads(lambda q, k, v: kernels.cudnn_attention(q, k, v, mask, DIM ** -0.5),
                                   query, key, value)
  expected, expected_grads = _value_and_grads(lambda q, k, v: ops.dot_product_attention(q, k, v, mask=mask),
                                              query, key, value)
  np.testing.assert_allclose(output, expected, atol=1e-5, rtol=1e-5)
  for grad, expected_grad in zip(grads, expected_grads):
    np.testing.assert_allclose(grad, expected_grad, atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a GPU (cuDNN's fused attention)")
@pytest.mark.parametrize("kv_heads", [8, 2, 1])
def test_on_a_gpu_cudnn_grouped_and_windowed_attention_equals_the_formula(kv_heads):
  """The real cuDNN kernel on bfloat16 grouped-query inputs with a padding + causal + sliding-window mask,
  against the formula on the same inputs: outputs and gradients within bfloat16 rounding."""
  query, key, value, mask = _grouped_local_inputs(kv_heads, jnp.bfloat16, length=64, heads=8, head_dim=64,
                                                  window=16)
  assert kernels.fused_attention_blocker(query, key, value, mask=mask) is None
  fused = jax.jit(lambda *qkv: _value_and_grads(
      lambda q, k, v: ops.dot_product_attention(q, k, v, mask=mask, kernels=kernels.CUDNN), *qkv))
  formula = jax.jit(lambda *qkv: _value_and_grads(
      lambda q, k, v: ops.dot_product_attention(q, k, v, mask=mask), *qkv))
  (output, grads), (expected, expected_grads) = fused(query, key, value), formula(query, key, value)
  assert "cudnn" in fused.lower(query, key, value).compile().as_text().lower()  # the fused kernel ran
  np.testing.assert_allclose(np.asarray(output, np.float32), np.asarray(expected, np.float32), atol=2e-2, rtol=2e-2)
  for grad, expected_grad in zip(grads, expected_grads):
    np.testing.assert_allclose(np.asarray(grad, np.float32), np.asarray(expected_grad, np.float32), atol=5e-2,
                               rtol=5e-2)
