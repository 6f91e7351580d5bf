"""Schedules and the optimizer against the paper's formulas."""
import numpy as np
import optax
import pytest
import jax.numpy as jnp

from transformer.train.optimizer import OptimizerConfig
from transformer.train.optimizer import make_optimizer, make_schedule


def optimizer_config(**overrides):
  return OptimizerConfig(**{"learning_rate": 1e-3, "schedule": "inverse_sqrt", "warmup_steps": 100, **overrides})


def test_inverse_sqrt_is_the_papers_schedule():
  d_model, warmup = 512, 4000
  schedule = make_schedule(optimizer_config(learning_rate=(d_model * warmup) ** -0.5, warmup_steps=warmup), 10**5)
  for step_number in (1, 100, 3999, 4000, 4001, 20000, 100000):  # the paper counts steps from 1
    paper = d_model ** -0.5 * min(step_number ** -0.5, step_number * warmup ** -1.5)
    np.testing.assert_allclose(float(schedule(step_number - 1)), paper, rtol=1e-5)


def test_cosine_and_constant_schedules():
  cosine = make_schedule(optimizer_config(schedule="cosine", warmup_steps=10), 110)
  assert float(cosine(0)) == 0.0 and float(cosine(10)) == pytest.approx(1e-3)
  assert float(cosine(60)) == pytest.approx(0.5e-3, rel=1e-4) and float(cosine(110)) == pytest.approx(0.0, abs=1e-9)
  constant = make_schedule(optimizer_config(schedule="constant", warmup_steps=0), 100)
  assert float(constant(0)) == float(constant(99)) == pytest.approx(1e-3)


def test_unknown_schedule_is_named():
  with pytest.raises(ValueError, match="schedule='linear' is not supported"):
    make_schedule(optimizer_config(schedule="linear"), 100)


def test_first_adam_step_and_clipping():
  """Adam's first update is -lr * sign(g) (bias-corrected m/sqrt(v)); clipping bounds the gradient norm."""
  params = {"w": jnp.array([1.0, -2.0, 3.0])}
  grads = {"w": jnp.array([30.0, -40.0, 0.5])}
  optimizer = make_optimizer(optimizer_config(schedule="constant", warmup_steps=0), 10)
  updates, _ = optimizer.update(grads, optimizer.init(params), params)
  np.testing.assert_allclose(updates["w"], -1e-3 * np.sign(grads["w"]), rtol=1e-4)
  clip = make_optimizer(optimizer_config(schedule="constant", warmup_steps=0, grad_clip_norm=1.0), 10)
  state = clip.init(params)
  clipped, _ = optax.clip_by_global_norm(1.0).update(grads, optax.clip_by_global_norm(1.0).init(params))
  assert float(optax.tree.norm(clipped)) == pytest.approx(1.0, rel=1e-5)
  updates, _ = clip.update(grads, state, params)
  np.testing.assert_allclose(updates["w"], -1e-3 * np.sign(grads["w"]), rtol=1e-3)


def test_weight_decay_is_decoupled():
  params = {"w": jnp.array([2.0])}
  optimizer = make_optimizer(optimizer_config(schedule="constant", warmup_steps=0, weight_decay=0.1), 10)
  updates, _ = optimizer.update({"w": jnp.array([0.0])}, optimizer.init(params), params)
  np.testing.assert_allclose(updates["w"], [-1e-3 * 0.1 * 2.0], rtol=1e-5)  # zero gradient: decay alone


@pytest.mark.slow
def test_frozen_params_get_no_update_and_the_rest_train_as_without_freezing():
  params = {"encoder": {"embedding": {"embedding": jnp.ones((5, 3))}, "layer_0": {"kernel": jnp.ones((3, 3))}},
            "classifier": {"kernel": jnp.ones((3, 2)), "bias": jnp.zeros((2,))}}
  grads = {"encoder": {"embedding": {"embedding": jnp.full((5, 3), 0.5)}, "layer_0": {"kernel": jnp.full((3, 3), -2.0)}},
           "classifier": {"kernel": jnp.full((3, 2), 0.25), "bias": jnp.full((2,), 1.0)}}
  settings = {"schedule": "constant", "warmup_steps": 0, "weight_decay": 0.1, "grad_clip_norm": 1.0}
  frozen = make_optimizer(optimizer_config(frozen_params=("encoder/embedding",), **settings), 10)
  reference = make_optimizer(optimizer_config(**settings), 10)
  trained_grads = {**grads, "encoder": {"layer_0": grads["encoder"]["layer_0"]}}  # what the reference sees
  trained_params = {**params, "encoder": {"layer_0": params["encoder"]["layer_0"]}}
  state, reference_state = frozen.init(params), reference.init(trained_params)
  for _ in range(3):
    updates, state = frozen.update(grads, state, params)
    expected, reference_state = reference.update(trained_grads, reference_state, trained_params)
    np.testing.assert_array_equal(updates["encoder"]["embedding"]["embedding"], 0.0)
    for path in (("encoder", "layer_0", "kernel"), ("classifier", "kernel"), ("classifier", "bias")):
      got, want = updates, expected
      for key in path:
        got, want = got[key], want[key]
      # Clipping sees the trained parameters' norm only, so the updates equal the reference's.
      np.testing.assert_allclose(got, want, rtol=1e-6)
      assert np.all(np.asarray(got) != 0)


def test_a_frozen_prefix_that_names_no_parameter_is_refused():
  from transformer.errors import ConfigError
  optimizer = make_optimizer(optimizer_config(frozen_params=("encoder/embeding",)), 10)
  with pytest.raises(ConfigError, match="encoder/embeding.*no parameter"):
    optimizer.init({"encoder": {"embedding": {"embedding": jnp.ones((2, 2))}}})
