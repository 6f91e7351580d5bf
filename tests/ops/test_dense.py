"""``ops.dense`` (every projection) and ``ops.batched_matmul`` (attention's products), against numpy."""
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


@pytest.mark.parametrize("shapes", [((2, 3, 4, 5), (2, 3, 5, 6)),  # a smaller than the cotangent: a^T g
                                    ((2, 3, 9, 8), (2, 3, 8, 2)),  # a larger: (g^T a)^T
                                    ((2, 3, 1, 8), (2, 3, 8, 4))],  # one row: plain autodiff
                         ids=["transpose-a", "transpose-cotangent", "one-row"])
def test_batched_matmul_values_and_gradients_match_numpy(shapes):
  rng = np.random.default_rng(2)
  a, b = (rng.normal(size=shape).astype(np.float32) for shape in shapes)
  cotangent = rng.normal(size=(*shapes[0][:-1], shapes[1][-1])).astype(np.float32)
  np.testing.assert_allclose(ops.batched_matmul(a, b), a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)
  a_grad, b_grad = jax.grad(lambda a, b: jnp.sum(ops.batched_matmul(a, b) * cotangent), argnums=(0, 1))(a, b)
  np.testing.assert_allclose(a_grad, cotangent @ np.swapaxes(b, -1, -2), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(b_grad, np.swapaxes(a, -1, -2) @ cotangent, rtol=1e-5, atol=1e-5)


def test_batched_matmul_backward_runs_every_dot_in_plain_form():
  """No gradient dot contracts its left operand's second-to-last axis (XLA:CPU ran those on its slow path)."""
  a, b = jnp.ones((2, 4, 32, 8)), jnp.ones((2, 4, 8, 32))
  grad = jax.jit(jax.grad(lambda a, b: jnp.sum(jnp.tanh(ops.batched_matmul(a, b))), argnums=(0, 1)))
  hlo = grad.lower(a, b).as_text(dialect="hlo")  # before optimisation: the dots as jax wrote them
  dots = [line for line in hlo.splitlines() if " dot(" in line]
  assert len(dots) == 3  # forward, and one per operand
  assert all("lhs_contracting_dims={3}" in line for line in dots), dots


def test_batched_matmul_bfloat16_backward_rounds_the_cotangent_and_accumulates_in_float32():
  rng = np.random.default_rng(3)
  a, b = (jnp.asarray(rng.normal(size=shape), jnp.bfloat16) for shape in [(1, 2, 300, 16), (1, 2, 16, 3)])
  cotangent = jnp.asarray(rng.normal(size=(1, 2, 300, 3)), jnp.float32)
  logits = ops.batched_matmul(a, b, preferred_element_type=jnp.float32)
  assert logits.dtype == jnp.float32
  a_grad, b_grad = jax.grad(lambda a, b: jnp.sum(ops.batched_matmul(a, b, preferred_element_type=jnp.float32)
                                                 * cotangent), argnums=(0, 1))(a, b)
  assert a_grad.dtype == b_grad.dtype == jnp.bfloat16
  # The b gradient sums 300 products: float32 accumulation of the bfloat16-rounded cotangent, rounded once.
  rounded = np.asarray(cotangent.astype(jnp.bfloat16), np.float32)
  expected = np.swapaxes(np.asarray(a, np.float32), -1, -2) @ rounded
  np.testing.assert_array_equal(np.asarray(b_grad, np.float32),
                                np.asarray(jnp.asarray(expected, jnp.bfloat16), np.float32))


def test_batched_matmul_names_a_shape_mismatch():
  with pytest.raises(ValueError, match="are not"):
    ops.batched_matmul(jnp.ones((2, 3, 4)), jnp.ones((2, 5, 6)))
