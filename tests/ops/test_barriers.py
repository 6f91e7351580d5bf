"""gradient_barrier: the identity in value and gradient, with an optimization barrier in the backward pass."""
import jax
import jax.numpy as jnp
import numpy as np

from transformer import ops


def _loss(x):
  return jnp.sum(jnp.sin(ops.gradient_barrier(x)) ** 2)


def test_value_and_gradient_are_unchanged():
  x = jax.random.normal(jax.random.PRNGKey(0), (3, 5, 8))
  np.testing.assert_array_equal(ops.gradient_barrier(x), x)
  expected = jax.grad(lambda x: jnp.sum(jnp.sin(x) ** 2))(x)
  np.testing.assert_allclose(jax.jit(jax.grad(_loss))(x), expected, rtol=1e-6)
  batched = jax.vmap(jax.grad(_loss))(x)  # also under vmap (vmap over seeds)
  np.testing.assert_allclose(batched, expected, rtol=1e-6)


def test_barrier_sits_in_the_backward_pass_only():
  x = jnp.ones((4, 8))
  assert "optimization_barrier" not in jax.jit(_loss).lower(x).as_text()
  assert "optimization_barrier" in jax.jit(jax.grad(_loss)).lower(x).as_text()


def test_norms_put_a_barrier_on_their_input_gradient():
  x, scale, bias = jnp.ones((2, 3, 8)), jnp.ones(8), jnp.zeros(8)
  for norm in (lambda x: ops.layer_norm(x, scale, bias), lambda x: ops.rms_norm(x, scale)):
    backward = jax.jit(jax.grad(lambda x: jnp.sum(norm(x) ** 3))).lower(x).as_text()
    assert "optimization_barrier" in backward
