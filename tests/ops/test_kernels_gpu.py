"""The GPU kernels on a real GPU: ``kernels="auto"`` compiles to cuDNN's fused attention where
``fused_attention_blocker`` allows it, and then equals the plain formula in values and gradients.

CI has no GPU, so these are skipped there (test_kernels.py checks the same wrapper through jax.nn's XLA
implementation). Run them on a GPU with ``JAX_PLATFORMS=cuda python -m pytest tests/ops/test_kernels_gpu.py``.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer import ops

pytestmark = pytest.mark.skipif(jax.default_backend() != "gpu",
                                reason="needs a CUDA GPU (run with JAX_PLATFORMS=cuda)")

BATCH, HEADS = 2, 4
# bfloat16 keeps 8 bits of mantissa; the fused kernel and the formula round at different places.
BFLOAT16_TOLERANCE = dict(atol=3e-2, rtol=3e-2)


def _qkv(q_length, kv_length, head_dim, dtype=jnp.bfloat16, seed=0):
  rng = np.random.default_rng(seed)
  return [jnp.asarray(rng.normal(size=(BATCH, length, HEADS, head_dim)), dtype)
          for length in (q_length, kv_length, kv_length)]


def _mask(kind, q_length, kv_length):
  if kind is None:
    return None
  causal = ops.make_causal_mask(q_length, kv_length)
  if kind == "causal":
    return causal
  query_valid = np.ones((BATCH, q_length), bool)
  key_valid = np.ones((BATCH, kv_length), bool)
  key_valid[1, kv_length // 2:] = False
  key_valid[0, 0] = False  # with causality, query 0 of batch 0 sees no key
  return ops.combine_masks(ops.make_attention_mask(query_valid, key_valid), causal)


def _value_and_grads(kernels, mask, query, key, value):
  attend = lambda q, k, v: ops.dot_product_attention(q, k, v, mask=mask, kernels=kernels)
  output = attend(query, key, value)
  cotangent = jnp.asarray(np.random.default_rng(1).normal(size=output.shape), jnp.float32)
  loss = lambda *args: jnp.sum(attend(*args).astype(jnp.float32) * cotangent)
  return output, jax.grad(loss, argnums=(0, 1, 2))(query, key, value)


@pytest.mark.parametrize("q_length, kv_length, head_dim, mask", [
    (128, 128, 64, None), (128, 128, 64, "causal"), (64, 128, 64, "padding_causal"), (256, 256, 128, "causal"),
])
def test_auto_is_cudnn_fused_attention_and_equals_the_formula(q_length, kv_length, head_dim, mask):
  inputs = _qkv(q_length, kv_length, head_dim)
  mask = _mask(mask, q_length, kv_length)
  assert ops.kernels.fused_attention_blocker(*inputs, mask=mask) is None
  auto = ops.select_kernels("auto")
  assert auto.name == "cudnn"
  fused = jax.jit(functools.partial(_value_and_grads, auto, mask))
  assert "cudnn$fmha" in fused.lower(*inputs).compile().as_text().lower()  # the fused custom call, not the formula
  output, grads = fused(*inputs)
  reference_output, reference_grads = jax.jit(functools.partial(_value_and_grads, None, mask))(*inputs)
  to_f32 = lambda x: np.asarray(x, np.float32)
  np.testing.assert_allclose(to_f32(output), to_f32(reference_output), **BFLOAT16_TOLERANCE)
  for index, (grad, reference_grad) in enumerate(zip(grads, reference_grads)):
    assert np.isfinite(to_f32(grad)).all()
    np.testing.assert_allclose(to_f32(grad), to_f32(reference_grad), err_msg=f"input {index}",
                               **BFLOAT16_TOLERANCE)


def test_a_blocked_call_compiles_without_cudnn():
  query, key, value = _qkv(128, 128, 64, dtype=jnp.float32)  # float32: cuDNN's fused kernel does not apply
  compiled = jax.jit(lambda q, k, v: ops.dot_product_attention(q, k, v, kernels=ops.select_kernels("auto")))
  assert "cudnn$fmha" not in compiled.lower(query, key, value).compile().as_text().lower()
