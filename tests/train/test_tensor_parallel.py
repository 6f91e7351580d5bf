"""Tensor parallelism (``config.tensor_parallelism``): a ``model`` mesh axis splits heads, feed-forward width and
vocabulary; the train step computes what one device computes, and each device holds less of the parameters."""
import re

import jax
import numpy as np
import pytest

from benchmarks.activation_layout import Unconstrained  # a mesh whose steps trace without the rules
from tests.train.conftest import tiny_config
from tests.train.test_loop import assert_params_close
from transformer.errors import ConfigError
from transformer.train.config import RunConfig, build_task
from transformer.train.state import make_optimizer
from transformer.train.config import DATA_AXIS, MODEL_AXIS, logical_axis_rules
from transformer.train.mesh import MeshStrategy, make_strategy
from transformer.train.state import create_train_state
from transformer.train.step import make_train_step
from transformer.decode import DecodeSettings
from transformer.tasks.decoding import search_decode

STEPS = 3


def _compiled_step(strategy):
  """``(step, state, batches)``: the tiny synthetic model's (wider: 8 heads, d_ff 128) train step compiled by
  ``strategy``, its initial state and an iterator of its batches."""
  run = RunConfig.from_config(tiny_config(model__num_heads=8, model__d_ff=128, task__num_symbols=13))
  task = build_task(run)
  model = task.build_model(task.model_config())
  optimizer = make_optimizer(run.optimizer, run.num_train_steps)
  batches = map(strategy.put_batch, task.train_iterator(run.batch_size, seed=0))
  first = next(batches)
  state = strategy.create_state(lambda key: create_train_state(model, optimizer, task.init_inputs(first), key),
                                jax.random.PRNGKey(0))
  return strategy.compile_train_step(make_train_step(task, model, optimizer)), state, batches, first


def _train(strategy):
  """Losses of ``STEPS`` steps of the tiny synthetic model (wider: 8 heads, d_ff 128) and the final state."""
  step, state, batches, first = _compiled_step(strategy)
  losses, batch = [], first
  for _ in range(STEPS):
    state, metrics = step(state, batch)
    loss_sum, weight = jax.device_get(metrics["loss"])
    losses.append(float(loss_sum) / float(weight))
    batch = next(batches)
  return np.array(losses), state


@pytest.fixture(scope="module")
def one_device():
  return _train(make_strategy("jit"))


@pytest.mark.parametrize("data,model", [(2, 2), (1, 4), (4, 2)], ids=["2x2", "1x4", "4x2"])
def test_a_model_axis_trains_as_one_device_does(one_device, data, model):
  strategy = MeshStrategy(jax.devices()[:data * model], tensor_parallelism=model)
  assert dict(strategy.mesh.shape) == {"hosts": 1, "data": data, "model": model} and strategy.num_devices == data
  losses, state = _train(strategy)
  reference_losses, reference_state = one_device
  np.testing.assert_allclose(losses, reference_losses, rtol=2e-5)
  query = state.params["encoder"]["layer_0"]["self_attention"]["query_kernel"]
  assert query.sharding.spec[1] == MODEL_AXIS  # split by heads, not replicated
  assert_params_close(state.params, reference_state.params, rtol=1e-3, atol=1e-5)  # as the data-parallel modes


def _constraints(text: str) -> list[tuple[str, str]]:
  """The sharding constraints of a lowered program's text (Shardy's): ``(mesh axes per dimension, shape)``,
  e.g. ``('{"hosts", "data"}, {}, {"model"}, {}', '16x6x8x4xf32')``."""
  return re.findall(r"sdy.sharding_constraint %\S+ <@mesh, \[(.*?)\]> : tensor<(\S+?)>", text)


def test_the_train_step_lays_out_the_activations_by_the_rule_table():
  """Traced under the mesh, the step carries the activations' constraints (data 2 x model 4): the batch over
  the hosts and data axes everywhere; the heads, the feed-forward hidden width and the vocabulary over the model
  axis; the residual stream's width whole. Without the rules in context it carries none."""
  step, state, _, batch = _compiled_step(MeshStrategy(jax.devices()[:8], tensor_parallelism=4))
  constraints = _constraints(step.lower(state, batch).as_text())
  batch_size = batch["source"].shape[0]
  assert constraints and all(spec.startswith('{"hosts", "data"}') and shape.startswith(f"{batch_size}x")
                             for spec, shape in constraints)
  specs = {spec for spec, _ in constraints}
  split = '{"hosts", "data"}, {}, {"model"}'
  assert {f"{split}, {{}}", split, '{"hosts", "data"}, {}, {}'} <= specs  # heads; mlp and vocab; residual stream
  assert any(re.fullmatch(rf"{batch_size}x\d+x8x4xf32", shape) for spec, shape in constraints
             if spec == f"{split}, {{}}")  # [batch, length, heads, head_dim]
  assert any(shape.endswith("x128xf32") for spec, shape in constraints if spec == split)  # [batch, length, d_ff]
  step, state, _, batch = _compiled_step(Unconstrained(jax.devices()[:8], tensor_parallelism=4))
  assert not _constraints(step.lower(state, batch).as_text())


def test_the_activation_constraints_leave_the_losses_as_without_them_and_on_one_device(one_device):
  """The constraints change where values are computed, never the values: FSDP with tensor parallelism (data 2
  x model 4) trains as without constraints and as one device, to the suite's tolerance."""
  rules = logical_axis_rules(fsdp=True)
  constrained, _ = _train(MeshStrategy(jax.devices()[:8], tensor_parallelism=4, rules=rules))
  unconstrained, _ = _train(Unconstrained(jax.devices()[:8], tensor_parallelism=4, rules=rules))
  np.testing.assert_allclose(constrained, unconstrained, rtol=2e-5)
  np.testing.assert_allclose(constrained, one_device[0], rtol=2e-5)


def test_the_activation_rules_follow_the_parameters_unless_named_and_never_take_fsdps_width():
  rules = dict(logical_axis_rules(fsdp=True))
  assert rules["activation_batch"] == ("hosts", DATA_AXIS) and rules["activation_embed"] is None
  assert rules["embed"] == DATA_AXIS  # the parameters' width, not the activations'
  assert rules["activation_heads"] == rules["activation_mlp"] == rules["activation_vocab"] == MODEL_AXIS
  kept_whole = dict(logical_axis_rules(overrides="vocab=none"))
  assert kept_whole["vocab"] is kept_whole["activation_vocab"] is None
  named = dict(logical_axis_rules(overrides="vocab=none,activation_vocab=model,activation_batch=none"))
  assert named["activation_vocab"] == MODEL_AXIS and named["vocab"] is None and named["activation_batch"] is None


def test_a_hybrid_mesh_splits_parameters_within_a_host_copies_them_across_hosts_and_trains_as_one_device(one_device):
  """FSDP within each of 2 groups of 4 devices (hosts; across processes in tests/train/test_multihost.py), data
  parallel between them: each device holds a quarter of a weight matrix, the same quarter as its peer in the other
  group, and the batch is split over all 8."""
  strategy = MeshStrategy(jax.devices()[:8], rules=logical_axis_rules(fsdp=True), hosts=2)
  assert dict(strategy.mesh.shape) == {"hosts": 2, "data": 4, "model": 1} and strategy.num_devices == 8
  losses, state = _train(strategy)
  np.testing.assert_allclose(losses, one_device[0], rtol=2e-5)
  assert_params_close(state.params, one_device[1].params, rtol=1e-3, atol=1e-5)
  kernel = state.params["encoder"]["layer_0"]["feed_forward"]["kernel_in"]
  assert tuple(kernel.sharding.spec) == (DATA_AXIS, MODEL_AXIS)
  holders = {}
  for device, index in kernel.sharding.devices_indices_map(kernel.shape).items():
    holders.setdefault(str(index), []).append(device)
  assert len(holders) == 4 and all(len(devices) == 2 for devices in holders.values())
  groups = [set(group.flat) for group in strategy.mesh.devices]
  assert all(sum(device in group for device in devices) == 1 for devices in holders.values() for group in groups)


def test_decoding_under_fsdp_keeps_the_parameters_split_and_gives_one_devices_output():
  """Evaluation decodes with the parameters as training laid them out (``evaluation_params``), not gathered onto
  every device, and its activations laid out by the rules (``strategy.evaluating``): on an FSDP mesh of 8 the
  compiled greedy search takes about 1/8 of their bytes per device, and finds what one device finds, also for 3
  rows, which the data axis does not divide."""
  run = RunConfig.from_config(tiny_config(model__num_heads=8, model__d_ff=128, task__num_symbols=13))
  task = build_task(run)
  model = task.build_model(task.model_config())
  optimizer = make_optimizer(run.optimizer, run.num_train_steps)
  batch = next(iter(task.train_iterator(run.batch_size, seed=0)))
  model_config, source = task.model_config().replace(deterministic=True), np.asarray(batch["source"])
  outputs, argument_bytes = [], []
  for devices, rules in ((1, logical_axis_rules()), (8, logical_axis_rules(fsdp=True))):
    strategy = MeshStrategy(jax.devices()[:devices], rules=rules)
    state = strategy.create_state(lambda key: create_train_state(model, optimizer, task.init_inputs(batch), key),
                                  jax.random.PRNGKey(0))
    with strategy.evaluating(state) as params:
      lowered = search_decode.lower(model_config, params, source, 6, DecodeSettings("greedy"))
      outputs.append(jax.device_get(search_decode(model_config, params, source[:3], 6, DecodeSettings("greedy"))))
    assert _constraints(lowered.as_text())  # traced in the layout (trivial on the mesh of one device)
    compiled = lowered.compile()
    argument_bytes.append(compiled.memory_analysis().argument_size_in_bytes)
    outputs.append(jax.device_get(compiled(params, source)))
  total = sum(leaf.nbytes for leaf in jax.tree.leaves(params))
  assert argument_bytes[0] > total and argument_bytes[1] < 0.2 * total  # 1/8 of the matrices, whole vectors
  for one, mesh in ((outputs[0], outputs[2]), (outputs[1], outputs[3])):  # 3 rows, then all
    np.testing.assert_array_equal(mesh[0], one[0])
    np.testing.assert_allclose(mesh[1], one[1], rtol=1e-5)


def _tiny_state_shapes(**changes):
  """The tiny synthetic model's train state shapes (a vocabulary of 16), parameters boxed with their logical axis
  names."""
  overrides = {"model__num_heads": 8, "model__d_ff": 128, "task__num_symbols": 13, **changes}
  run = RunConfig.from_config(tiny_config(**overrides))
  task = build_task(run)
  model = task.build_model(task.model_config())
  optimizer = make_optimizer(run.optimizer, run.num_train_steps)
  inputs = [np.ones((2, 4), np.int32)] * len(task.init_inputs(next(iter(task.train_iterator(2, seed=0)))))
  return jax.eval_shape(lambda key: create_train_state(model, optimizer, inputs, key), jax.random.PRNGKey(0))


def test_each_device_holds_less_of_the_parameters_as_the_model_axis_grows():
  shapes = _tiny_state_shapes()
  held = []
  for model_size in (1, 2, 4):
    sharding = MeshStrategy(jax.devices()[:4], tensor_parallelism=model_size).state_sharding(shapes)
    held.append(sum(int(np.prod(s.shard_shape(leaf.shape))) * leaf.dtype.itemsize
                    for leaf, s in zip(jax.tree.leaves(shapes.params), jax.tree.leaves(sharding.params))))
  assert held[0] > held[1] > held[2]
  assert held[2] < 0.5 * held[0]


@pytest.mark.parametrize("fsdp", [False, True], ids=["tensor_parallel", "fsdp_and_tensor_parallel"])
def test_each_parameter_is_laid_out_by_its_logical_axes_and_adams_moments_follow(fsdp):
  """The rule table, not the parameters' names: heads, feed-forward width and vocabulary on the model axis; the
  model width on the data axis under FSDP; Adam's moments as their parameters; the step counter replicated."""
  shapes = _tiny_state_shapes()
  strategy = MeshStrategy(jax.devices()[:4], tensor_parallelism=2, rules=logical_axis_rules(fsdp=fsdp))
  shardings = strategy.state_sharding(shapes)
  specs = jax.tree.map(lambda sharding: tuple(sharding.spec), shardings)
  embed = DATA_AXIS if fsdp else None
  layer = specs.params["encoder"]["layer_0"]
  assert layer["self_attention"]["query_kernel"] == (embed, MODEL_AXIS)
  assert layer["self_attention"]["output_kernel"] == (MODEL_AXIS, embed)
  assert layer["feed_forward"]["kernel_in"] == (embed, MODEL_AXIS)
  assert layer["feed_forward"]["bias_in"] == (MODEL_AXIS,)
  assert layer["attention_norm"]["scale"] in ((embed,), ())
  assert specs.params["shared_embedding"]["embedding"] == (MODEL_AXIS, embed)
  moments = [tuple(sharding.spec) for path, sharding in jax.tree_util.tree_flatten_with_path(shardings.opt_state)[0]
             if jax.tree_util.keystr(path).endswith("['encoder']['layer_0']['self_attention']['query_kernel']")]
  assert moments == [(embed, MODEL_AXIS)] * 2  # Adam's mu and nu
  assert shardings.step.is_fully_replicated


def test_a_parameter_the_mesh_axis_does_not_divide_is_refused_naming_it_and_the_fix():
  shapes = _tiny_state_shapes(model__d_ff=130)
  with pytest.raises(ConfigError, match=r"layer_0/feed_forward/bias_in \(130,\): its 'mlp' axis of 130 over the 4 "
                                        r"devices of 'model'.*axis_rules='mlp=none'"):
    MeshStrategy(jax.devices()[:4], tensor_parallelism=4).state_sharding(shapes)
  kept_whole = MeshStrategy(jax.devices()[:4], tensor_parallelism=4, rules=logical_axis_rules(overrides="mlp=none"))
  kernel_in = kept_whole.state_sharding(shapes).params["encoder"]["layer_0"]["feed_forward"]["kernel_in"]
  assert kernel_in.is_fully_replicated


def test_a_model_axis_that_does_not_divide_the_devices_or_without_a_mesh_is_refused():
  with pytest.raises(ValueError, match="tensor_parallelism=3 must divide the 8 devices"):
    MeshStrategy(tensor_parallelism=3)
  with pytest.raises(ConfigError, match="set --config.parallelism=mesh"):
    RunConfig.from_config(tiny_config(tensor_parallelism=2))


def test_a_model_axis_that_would_cut_through_a_head_is_refused_or_keeps_those_heads_whole():
  grouped = {"parallelism": "mesh", "tensor_parallelism": 4, "model__num_heads": 8, "model__num_kv_heads": 2}
  with pytest.raises(ConfigError, match=r"tensor_parallelism=4 would split inside an attention head: "
                                        r"config.model.num_kv_heads=2 .*--config.axis_rules='kv_heads=none'"):
    RunConfig.from_config(tiny_config(**grouped))
  with pytest.raises(ConfigError, match=r"config.model.num_heads=6 is not a multiple"):
    RunConfig.from_config(tiny_config(parallelism="mesh", tensor_parallelism=4, model__num_heads=6,
                                      model__d_model=48))
  kept_whole = RunConfig.from_config(tiny_config(**grouped, axis_rules="kv_heads=none"))
  assert dict(kept_whole.logical_axis_rules)["kv_heads"] is None
