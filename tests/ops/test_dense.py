"""``ops.dense`` (every projection) against numpy (``batched_matmul``: tests/ops/test_kernels.py)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer import ops


@pytest.mark.parametrize("leading", [(), (5,), (2, 3), (2, 1, 3)])
@pytest.mark.parametrize("with_bias", [True, False])
def test_dense_matches_numpy_for_any_leading_axes(leading, with_bias):
  rng = np.random.default_rng(0)
  x = rng.normal(size=(*leading, 4)).astype(np.float32)
  kernel = rng.normal(size=(4, 7)).astype(np.float32)
  bias = rng.normal(size=7).astype(np.float32) if with_bias else None
  expected = x.astype(np.float64) @ kernel + (0 if bias is None else bias)
  output = ops.dense(x, kernel, bias)
  assert output.shape == (*leading, 7)
  np.testing.assert_allclose(output, expected, rtol=1e-5, atol=1e-5)


def test_dense_gradients_match_the_einsum_it_replaces():
  rng = np.random.default_rng(1)
  x, kernel, bias = (rng.normal(size=shape).astype(np.float32) for shape in [(2, 3, 4), (4, 5), (5,)])
  cotangent = rng.normal(size=(2, 3, 5)).astype(np.float32)

  def loss(function):
    return lambda x, kernel, bias: jnp.sum(function(x, kernel, bias) * cotangent)

  ours = jax.grad(loss(ops.dense), argnums=(0, 1, 2))(x, kernel, bias)
  reference = jax.grad(loss(lambda x, k, b: jnp.einsum("bld,df->blf", x, k) + b), argnums=(0, 1, 2))(x, kernel, bias)
  for got, want in zip(ours, reference):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  # the kernel's gradient by hand: sum over positions of x^T cotangent
  np.testing.assert_allclose(ours[1], np.einsum("bld,blf->df", x, cotangent), rtol=1e-5, atol=1e-5)


def test_dense_float32_accumulation_of_bfloat16_operands():
  x, kernel = jnp.ones((3, 257), jnp.bfloat16), jnp.ones((257, 2), jnp.bfloat16)
  assert float(ops.dense(x, kernel)[0, 0]) != 257  # not a bfloat16 number
  output = ops.dense(x, kernel, preferred_element_type=jnp.float32)
  assert output.dtype == jnp.float32
  np.testing.assert_array_equal(output, 257.0)


def test_dense_names_a_feature_mismatch():
  with pytest.raises(ValueError, match="x has 4 features but the kernel"):
    ops.dense(jnp.ones((2, 4)), jnp.ones((3, 5)))
