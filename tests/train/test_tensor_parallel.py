"""Tensor parallelism (``config.tensor_parallelism``): a ``model`` mesh axis splits heads, feed-forward width and
vocabulary; the train step computes what one device computes, and each device holds less of the parameters."""
import jax
import numpy as np
import pytest

from tests.train.conftest import tiny_config
from tests.train.test_loop import assert_params_close
from transformer.errors import ConfigError
from transformer.train.config import RunConfig, build_task
from transformer.train.state import make_optimizer
from transformer.train.mesh import MODEL_AXIS, MeshStrategy, Strategy, tensor_parallel_axis
from transformer.train.state import create_train_state
from transformer.train.step import make_train_step

STEPS = 3


def _train(strategy):
  """Losses of ``STEPS`` steps of the tiny synthetic model (wider: 8 heads, d_ff 128) and the final state."""
  run = RunConfig.from_config(tiny_config(model__num_heads=8, model__d_ff=128))
  task = build_task(run)
  model = task.build_model(task.model_config())
  optimizer = make_optimizer(run.optimizer, run.num_train_steps)
  batches = iter(task.train_iterator(run.batch_size, seed=0))
  first = strategy.put_batch(next(batches))
  state = strategy.create_state(lambda key: create_train_state(model, optimizer, task.init_inputs(first), key),
                                jax.random.PRNGKey(0))
  step = strategy.compile_train_step(make_train_step(task, model, optimizer))
  losses, batch = [], first
  for _ in range(STEPS):
    state, metrics = step(state, batch)
    loss_sum, weight = jax.device_get(metrics["loss"])
    losses.append(float(loss_sum) / float(weight))
    batch = strategy.put_batch(next(batches))
  return np.array(losses), state


@pytest.fixture(scope="module")
def one_device():
  return _train(Strategy())


@pytest.mark.parametrize("data,model", [(2, 2), (1, 4), (4, 2)], ids=["2x2", "1x4", "4x2"])
def test_a_model_axis_trains_as_one_device_does(one_device, data, model):
  strategy = MeshStrategy(tensor_parallelism=model, devices=jax.devices()[:data * model])
  assert dict(strategy.mesh.shape) == {"data": data, "model": model} and strategy.num_devices == data
  losses, state = _train(strategy)
  reference_losses, reference_state = one_device
  np.testing.assert_allclose(losses, reference_losses, rtol=2e-5)
  query = state.params["encoder"]["layer_0"]["self_attention"]["query_kernel"]
  assert query.sharding.spec[1] == MODEL_AXIS  # split by heads, not replicated
  assert_params_close(state.params, reference_state.params, rtol=1e-3, atol=1e-5)  # as the data-parallel modes


def test_each_device_holds_less_of_the_parameters_as_the_model_axis_grows():
  run = RunConfig.from_config(tiny_config(model__num_heads=8, model__d_ff=128))
  task = build_task(run)
  model = task.build_model(task.model_config())
  optimizer = make_optimizer(run.optimizer, run.num_train_steps)
  inputs = [np.ones((2, 4), np.int32)] * len(task.init_inputs(next(iter(task.train_iterator(2, seed=0)))))
  shapes = jax.eval_shape(lambda key: create_train_state(model, optimizer, inputs, key), jax.random.PRNGKey(0))
  held = []
  for model_size in (1, 2, 4):
    sharding = MeshStrategy(tensor_parallelism=model_size, devices=jax.devices()[:4]).state_sharding(shapes)
    held.append(sum(int(np.prod(s.shard_shape(leaf.shape))) * leaf.dtype.itemsize
                    for leaf, s in zip(jax.tree.leaves(shapes.params), jax.tree.leaves(sharding.params))))
  assert held[0] > held[1] > held[2]
  assert held[2] < 0.5 * held[0]


def test_the_rules_name_heads_feed_forward_and_vocabulary():
  def path(*names):
    return tuple(jax.tree_util.DictKey(name) for name in names)
  assert tensor_parallel_axis(path("params", "encoder", "layer_0", "self_attention", "query_kernel")) == 1
  assert tensor_parallel_axis(path("params", "encoder", "layer_0", "self_attention", "output_kernel")) == 0
  assert tensor_parallel_axis(path("params", "decoder", "layer_0", "feed_forward", "kernel_in")) == 1
  assert tensor_parallel_axis(path("params", "shared_embedding", "embedding")) == 0
  assert tensor_parallel_axis(path("params", "decoder", "logits", "kernel")) == 1
  assert tensor_parallel_axis(path("params", "classifier", "kernel")) is None
  assert tensor_parallel_axis(path("params", "encoder", "layer_0", "attention_norm", "scale")) is None


def test_a_model_axis_that_does_not_divide_the_devices_or_without_a_mesh_is_refused():
  with pytest.raises(ValueError, match="tensor_parallelism=3 must divide the 8 devices"):
    MeshStrategy(tensor_parallelism=3)
  with pytest.raises(ConfigError, match="set --config.parallelism=mesh"):
    RunConfig.from_config(tiny_config(tensor_parallelism=2))
