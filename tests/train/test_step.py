"""The train step's own properties: frozen parameters get no gradient, and their backward pass is skipped."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer.train.config import OptimizerConfig
from transformer.train.state import make_optimizer
from transformer.train.state import TrainState
from transformer.train.step import make_train_step


class _TwoLayerTask:
  """loss = sum((x A) B - y)^2 over ``params = {"first": {"kernel": A}, "second": {"kernel": B}}``."""

  def loss_and_metrics(self, model, params, batch, rng):
    hidden = batch["x"] @ params["first"]["kernel"]
    loss = jnp.sum((hidden @ params["second"]["kernel"] - batch["y"]) ** 2)
    weight = jnp.asarray(batch["y"].shape[0], jnp.float32)
    return loss, weight, {"loss": (loss, weight)}


def _state_and_batch(optimizer):
  keys = jax.random.split(jax.random.key(0), 4)
  params = {"first": {"kernel": jax.random.normal(keys[0], (4, 5))},
            "second": {"kernel": jax.random.normal(keys[1], (5, 3))}}
  state = TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=optimizer.init(params),
                     rng=jax.random.key(1))
  batch = {"x": jax.random.normal(keys[2], (6, 4)), "y": jax.random.normal(keys[3], (6, 3))}
  return state, batch


def _dot_count(function, *args) -> int:
  return sum(equation.primitive.name == "dot_general" for equation in jax.make_jaxpr(function)(*args).eqns)


@pytest.mark.slow
def test_frozen_parameters_stay_and_the_rest_train_as_without_freezing():
  config = OptimizerConfig(learning_rate=0.1, schedule="constant", warmup_steps=0)
  plain_optimizer = make_optimizer(config, 10)
  frozen_optimizer = make_optimizer(config.replace(frozen_params=("first",)), 10)
  plain = make_train_step(_TwoLayerTask(), None, plain_optimizer)
  frozen = make_train_step(_TwoLayerTask(), None, frozen_optimizer, frozen_params=("first",))
  plain_state, batch = _state_and_batch(plain_optimizer)
  frozen_state, _ = _state_and_batch(frozen_optimizer)
  rng = jax.random.key(2)

  # Forward: two matmuls; backward without freezing: the gradients of B, of the hidden layer and of A (3);
  # with A frozen only B's (1): nothing is computed for the frozen kernel.
  assert _dot_count(plain, plain_state, batch, rng) == 5
  assert _dot_count(frozen, frozen_state, batch, rng) == 3

  new_plain, plain_metrics = jax.jit(plain)(plain_state, batch, rng)
  new_frozen, frozen_metrics = jax.jit(frozen)(frozen_state, batch, rng)
  np.testing.assert_array_equal(new_frozen.params["first"]["kernel"], frozen_state.params["first"]["kernel"])
  # B's first Adam step is the same either way (A is the same in both before the step).
  np.testing.assert_allclose(new_frozen.params["second"]["kernel"], new_plain.params["second"]["kernel"], rtol=1e-6)
  assert not np.allclose(new_plain.params["first"]["kernel"], plain_state.params["first"]["kernel"])
  # The logged gradient norm covers the trained parameters only.
  grads = jax.grad(lambda p: _TwoLayerTask().loss_and_metrics(None, p, batch, None)[0] / 6.0)(frozen_state.params)
  np.testing.assert_allclose(float(frozen_metrics["grad_norm"][0]),
                             float(jnp.linalg.norm(grads["second"]["kernel"])), rtol=1e-5)
  assert float(plain_metrics["grad_norm"][0]) > float(frozen_metrics["grad_norm"][0])
