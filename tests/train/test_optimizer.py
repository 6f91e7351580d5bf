"""Schedules and the optimizer against the paper's formulas."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from transformer.train.config import OptimizerConfig
from transformer.train.state import make_optimizer, make_schedule


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


def numpy_adam_updates(gradients, clip_norm=0.0, lr=1e-3, b1=0.9, b2=0.98, eps=1e-9):
  """The paper's Adam (bias-corrected) on a sequence of gradient vectors, each first scaled to at most
  ``clip_norm`` in L2 norm when it is positive: the updates, one per step."""
  m = v = np.zeros_like(gradients[0], np.float64)
  updates = []
  for t, g in enumerate(np.asarray(gradients, np.float64), start=1):
    if clip_norm > 0:
      g = g * min(1.0, clip_norm / np.linalg.norm(g))
    m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
    updates.append(-lr * (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps))
  return updates


def test_adam_and_clipping_against_numpy():
  """Adam's first update is -lr * sign(g) whatever the gradient's scale, so clipping shows only from the second
  step, when the gradient changes scale: 0.01x (under the clip norm) then 10x (over it)."""
  params = {"w": jnp.array([1.0, -2.0, 3.0])}
  gradients = [np.array([30.0, -40.0, 0.5]) * scale for scale in (0.01, 10.0, 1.0)]
  for clip_norm in (0.0, 1.0):
    optimizer = make_optimizer(optimizer_config(schedule="constant", warmup_steps=0, grad_clip_norm=clip_norm), 10)
    state = optimizer.init(params)
    for step, (gradient, expected) in enumerate(zip(gradients, numpy_adam_updates(gradients, clip_norm))):
      updates, state = optimizer.update({"w": jnp.asarray(gradient, jnp.float32)}, state, params)
      np.testing.assert_allclose(updates["w"], expected, rtol=1e-4, err_msg=f"clip {clip_norm}, step {step}")
  np.testing.assert_allclose(numpy_adam_updates(gradients)[0], -1e-3 * np.sign(gradients[0]), rtol=1e-4)
  # The clipped and unclipped runs part from the second step on: the check above sees clipping.
  assert np.abs(numpy_adam_updates(gradients, 1.0)[1] - numpy_adam_updates(gradients)[1]).max() > 1e-5


def test_weight_decay_is_decoupled():
  params = {"w": jnp.array([2.0])}
  optimizer = make_optimizer(optimizer_config(schedule="constant", warmup_steps=0, weight_decay=0.1), 10)
  updates, _ = optimizer.update({"w": jnp.array([0.0])}, optimizer.init(params), params)
  np.testing.assert_allclose(updates["w"], [-1e-3 * 0.1 * 2.0], rtol=1e-5)  # zero gradient: decay alone


@pytest.mark.slow
def test_frozen_params_get_no_update_and_the_rest_train_as_without_freezing():
  params = {"encoder": {"embedding": {"embedding": jnp.ones((5, 3))}, "layer_0": {"kernel": jnp.ones((3, 3))}},
            "classifier": {"kernel": jnp.ones((3, 2)), "bias": jnp.zeros((2,))}}
  # The frozen table's gradient is large and the others change scale between steps (under the clip norm, then
  # over it), so a clipping norm that counted the frozen gradient would scale the updates otherwise.
  frozen_grad = {"embedding": jnp.full((5, 3), 50.0)}
  trained_grads = {"encoder": {"layer_0": {"kernel": jnp.full((3, 3), -2.0)}},
                   "classifier": {"kernel": jnp.full((3, 2), 0.25), "bias": jnp.full((2,), 1.0)}}
  settings = {"schedule": "constant", "warmup_steps": 0, "weight_decay": 0.1, "grad_clip_norm": 1.0}
  frozen = make_optimizer(optimizer_config(frozen_params=("encoder/embedding",), **settings), 10)
  reference = make_optimizer(optimizer_config(**settings), 10)
  trained_params = {**params, "encoder": {"layer_0": params["encoder"]["layer_0"]}}
  state, reference_state = frozen.init(params), reference.init(trained_params)
  for scale in (0.05, 1.0, 0.3):  # trained gradients' norm 0.31, 6.2, 1.9 against the clip norm 1
    step = jax.tree.map(lambda gradient: gradient * scale, trained_grads)
    updates, state = frozen.update({**step, "encoder": {**step["encoder"], "embedding": frozen_grad}}, state, params)
    expected, reference_state = reference.update(step, reference_state, trained_params)
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


def state_size(optimizer, params) -> int:
  return sum(np.size(leaf) for leaf in jax.tree.leaves(optimizer.init(params)))


def test_adafactor_keeps_a_row_and_a_column_for_a_matrix_and_no_first_moment():
  """Shazeer & Stern 2018: the second moment of an [n, m] matrix as n + m numbers; a vector keeps its own."""
  params = {"kernel": jnp.ones((256, 128)), "bias": jnp.ones((128,))}
  adafactor = state_size(make_optimizer(optimizer_config(name="adafactor"), 10), params)
  adam = state_size(make_optimizer(optimizer_config(), 10), params)
  assert 0 <= adam - 2 * (256 * 128 + 128) <= 4  # two moments; the rest are step counts
  assert 0 <= adafactor - (256 + 128) - 128 <= 8  # the matrix's row and column, the vector's own; the rest counts


def test_adafactor_is_optaxs_with_the_schedule_applied_last():
  params = {"kernel": jnp.linspace(-1.0, 1.0, 256 * 128).reshape(256, 128), "bias": jnp.linspace(0.5, 1.0, 128)}
  ours = make_optimizer(optimizer_config(name="adafactor", schedule="constant", warmup_steps=0, learning_rate=0.01), 10)
  theirs = optax.adafactor(0.01)
  state, their_state = ours.init(params), theirs.init(params)
  for scale in (1.0, 0.1, 3.0):
    gradients = jax.tree.map(lambda p: jnp.cos(p * 7.0) * scale, params)
    updates, state = ours.update(gradients, state, params)
    expected, their_state = theirs.update(gradients, their_state, params)
    for name in params:
      np.testing.assert_allclose(updates[name], expected[name], rtol=1e-6, atol=1e-12)


def test_adafactor_with_weight_decay_is_linear_in_the_learning_rate():
  """What a sweep over learning rates relies on (``run_optimizer``: rate 1, each replica's updates scaled), and
  AdamW's decoupled decay: a zero gradient shrinks a parameter by learning rate * weight_decay * it."""
  params = {"kernel": jnp.linspace(-1.0, 1.0, 256 * 128).reshape(256, 128)}
  gradients = jax.tree.map(lambda p: jnp.sin(p * 5.0), params)
  updates = {}
  for rate in (1.0, 0.003):
    optimizer = make_optimizer(optimizer_config(name="adafactor", schedule="constant", warmup_steps=0,
                                                learning_rate=rate, weight_decay=0.1), 10)
    updates[rate], _ = optimizer.update(gradients, optimizer.init(params), params)
  np.testing.assert_allclose(updates[0.003]["kernel"], 0.003 * updates[1.0]["kernel"], rtol=1e-5)
  decay = make_optimizer(optimizer_config(name="adafactor", schedule="constant", warmup_steps=0, weight_decay=0.1), 10)
  zero = {"kernel": jnp.zeros((256, 128))}
  only_decay, _ = decay.update(zero, decay.init(params), params)
  np.testing.assert_allclose(only_decay["kernel"], -1e-3 * 0.1 * params["kernel"], rtol=1e-5, atol=1e-12)


def test_an_unknown_optimizer_is_named():
  from transformer.errors import ConfigError
  with pytest.raises(ConfigError, match=r"config.optimizer.name='lamb' is not supported; choose one of \['adamw'"):
    optimizer_config(name="lamb")


@pytest.mark.slow
def test_a_run_with_adafactor_trains_and_resumes_exactly(tmp_path):
  """Its factored state is saved and restored like Adam's: killed after the checkpoint of step 10 and run again,
  the run ends bit for bit where the uninterrupted one does."""
  import shutil  # pylint: disable=import-outside-toplevel
  from tests.train.conftest import tiny_config  # pylint: disable=import-outside-toplevel
  from transformer.train import run  # pylint: disable=import-outside-toplevel
  from transformer.train.workdir import read_metrics  # pylint: disable=import-outside-toplevel

  def config():
    return tiny_config(optimizer__name="adafactor", optimizer__learning_rate=1e-2, optimizer__warmup_steps=5)

  def losses(workdir):
    return [record["train/loss"] for record in read_metrics(str(workdir)) if "train/loss" in record]

  whole = run(config(), str(tmp_path / "whole"))
  assert losses(tmp_path / "whole")[-1] < 0.8 * losses(tmp_path / "whole")[0], losses(tmp_path / "whole")
  assert "FactoredState" in str(jax.tree_util.tree_structure(whole.state.opt_state))  # Adafactor's state, not Adam's
  shutil.copytree(tmp_path / "whole", tmp_path / "resumed")
  shutil.rmtree(tmp_path / "resumed" / "checkpoints" / "20")  # as if killed after the save at step 10
  resumed = run(config(), str(tmp_path / "resumed"))
  assert resumed.step == whole.step == 20
  assert losses(tmp_path / "resumed") == losses(tmp_path / "whole")  # the windows after step 10 logged again
  for resumed_leaf, whole_leaf in zip(jax.tree.leaves(resumed.state), jax.tree.leaves(whole.state)):
    np.testing.assert_array_equal(resumed_leaf, whole_leaf)
