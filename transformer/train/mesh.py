"""Parallelism strategies: how state and batches are placed and how steps are compiled.

- ``jit``: one device.
- ``pmap``: classic replicated data parallelism over local devices; gradients summed with ``psum``.
- ``mesh``: ``jax.jit`` over a ``Mesh`` with ``NamedSharding``: the batch split over the ``data`` axis,
  parameters replicated or, with ``fsdp``, each parameter sharded along its largest divisible axis; with
  ``tensor_parallelism`` > 1 a ``model`` axis of that many devices splits the attention heads, the feed-forward
  width and the vocabulary (``TENSOR_PARALLEL_AXES``), and XLA's sharding propagation splits the work.
- several replicas (with ``jit``): ``jax.vmap`` trains ``num_replicas`` of them in one program: seeds
  (``config.num_seeds``) and the variants of ``config.sweep``, each replica with its own ``settings``.
- several steps per call (``jit`` and ``mesh``; ``config.steps_per_call``): one compiled call ``lax.scan``s the
  same step over a stack of batches, so the host dispatches once per ``steps_per_call`` steps.

Every strategy exposes the same methods, so the training loop never branches on the mode. Checkpoints
always hold the canonical (unreplicated, global) state, so a run can resume under another strategy or
device count.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from transformer.errors import ConfigError
from transformer.train.config import PARALLELISMS

DATA_AXIS = "data"
MODEL_AXIS = "model"
# Tensor parallelism, the one place its rules live: parameter name (the last key of its path in the model, or
# the last two) -> the axis the ``model`` mesh axis splits. Heads: the query/key/value projections' outputs and
# the output projection's input; feed-forward width: the hidden layer; vocabulary: the embedding tables' rows
# and an untied output layer's columns. Anything else (norms, positions, biases after a reduction) is replicated,
# and so is a parameter whose axis the model axis does not divide.
TENSOR_PARALLEL_AXES = {
    "query_kernel": 1, "key_kernel": 1, "value_kernel": 1, "query_bias": 0, "key_bias": 0, "value_bias": 0,
    "output_kernel": 0, "kernel_in": 1, "bias_in": 0, "kernel_out": 0, "embedding": 0,
    "logits/kernel": 1, "logits/bias": 0,
}


def tensor_parallel_axis(path) -> int | None:
  """The axis of the parameter at tree ``path`` (parameters and optimizer moments alike) that tensor
  parallelism splits, or None."""
  names = [str(getattr(key, "key", getattr(key, "name", ""))) for key in path]
  return TENSOR_PARALLEL_AXES.get("/".join(names[-2:]), TENSOR_PARALLEL_AXES.get(names[-1] if names else ""))


class Strategy:
  """Base: single device ``jit``; ``num_replicas`` > 1 adds a leading replica axis with ``vmap``.

  ``settings``: swept values, ``name -> one number per replica`` (``RunConfig.replicas.settings``), which the train
  and eval steps get as their ``settings`` argument, each replica its own (``{}``: none).
  """
  name = "jit"

  def __init__(self, num_replicas: int = 1, settings: dict | None = None):
    self.num_replicas = num_replicas
    self.settings = {name: np.asarray(values) for name, values in (settings or {}).items()}
    if any(len(values) != num_replicas for values in self.settings.values()):
      raise ValueError(f"settings need one value per replica ({num_replicas}): "
                       f"{ {name: len(values) for name, values in self.settings.items()} }")
    self.trace_count = 0  # how many times the train step was traced (= compiled) — tests check it is 1

  @property
  def num_devices(self) -> int:
    return 1

  def _counted(self, fn):
    def traced(*args):
      self.trace_count += 1
      return fn(*args)
    return traced

  def _vmapped(self, fn, in_axes):
    return jax.vmap(fn, in_axes=in_axes) if self.num_replicas > 1 else fn

  def _with_settings(self, fn):
    """``fn(*args) = vmapped(*args, settings)``: the replicas' settings passed as the last argument, a
    compile-time constant of the program (``[num_replicas]`` per name; scalars for a single replica)."""
    settings = self.settings

    def call(*args):
      if not settings:
        return fn(*args)
      values = settings if self.num_replicas > 1 else {name: value[0] for name, value in settings.items()}
      return fn(*args, {name: jnp.asarray(value) for name, value in values.items()})
    return call

  def create_state(self, create_fn, seed_key):
    """Run ``create_fn(key) -> TrainState`` compiled, placed as this strategy wants it.

    With ``num_replicas > 1``, ``seed_key`` is a stack of ``num_replicas`` keys, initialised one after the
    other (``lax.map``, the same values as ``vmap``): the RNN encoder-decoder's vmapped init (its decoder's
    ``nn.scan``) never finishes on XLA:CPU, while its vmapped train and eval steps run.
    """
    if self.num_replicas > 1:
      return jax.jit(lambda keys: jax.lax.map(create_fn, keys))(seed_key)
    return jax.jit(create_fn)(seed_key)

  def compile_train_step(self, train_step, steps_per_call: int = 1):
    """``(state, batch) -> (state, metrics)``; the step's key is ``fold_in(state.rng, state.step)``.

    ``steps_per_call`` > 1: ``(state, batches) -> (state, metrics)`` of that many steps (``scanned``), ``batches``
    stacked ``[steps_per_call, ...]`` (``data.prefetch.stack_batches``, placed by ``put_batches``), metrics too.
    """
    def step_with_rng(state, batch, *settings):
      return train_step(state, batch, jax.random.fold_in(state.rng, state.step), *settings)
    in_axes = (0, None, 0) if self.settings else (0, None)
    step = self._with_settings(self._vmapped(step_with_rng, in_axes))
    return jax.jit(self._counted(scanned(step, steps_per_call)), donate_argnums=(0,))

  def compile_eval_step(self, eval_step):
    in_axes = (0, None, 0) if self.settings else (0, None)
    return jax.jit(self._with_settings(self._vmapped(eval_step, in_axes)))

  def put_batch(self, batch):
    return jax.device_put(batch)

  def put_batches(self, batches):
    """Place a stack of batches (``[steps_per_call, batch, ...]``) for a several-step call."""
    return jax.device_put(batches)

  def to_canonical(self, state):
    """The state as checkpoints store it."""
    return state

  def from_canonical(self, state):
    return state

  def abstract_canonical(self, state_shapes):
    """Restore targets: shapes and dtypes with this strategy's shardings."""
    sharding = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding), state_shapes)

  def host_params(self, state):
    """Parameters for host-side evaluation (decoding)."""
    return state.params

  def fetch(self, tree):
    return jax.tree.map(np.asarray, jax.device_get(tree))


class PmapStrategy(Strategy):
  name = "pmap"
  axis_name = "batch"

  def __init__(self):
    super().__init__()
    self.devices = jax.local_devices()

  @property
  def num_devices(self):
    return len(self.devices)

  def create_state(self, create_fn, seed_key):
    return self.from_canonical(jax.jit(create_fn)(seed_key))

  def compile_train_step(self, train_step, steps_per_call: int = 1):
    del steps_per_call  # one step per call: RunConfig refuses more with pmap (its metrics would be [devices, steps])
    def step_with_rng(state, batch):
      return train_step(state, batch, jax.random.fold_in(state.rng, state.step))
    return jax.pmap(self._counted(step_with_rng), axis_name=self.axis_name, donate_argnums=(0,))

  def compile_eval_step(self, eval_step):
    return jax.pmap(eval_step, axis_name=self.axis_name)

  def put_batch(self, batch):
    count = self.num_devices
    def shard(x):
      x = np.asarray(x)
      if x.shape[0] % count:
        raise ValueError(f"batch of {x.shape[0]} does not split over {count} devices")
      return x.reshape(count, x.shape[0] // count, *x.shape[1:])
    return jax.tree.map(shard, batch)

  def to_canonical(self, state):
    return jax.tree.map(_first_replica, state)

  def from_canonical(self, state):
    """One copy per device along a leading axis, laid out as ``pmap`` expects."""
    sharding = NamedSharding(jax.sharding.Mesh(np.array(self.devices), ("replica",)), PartitionSpec("replica"))
    count = self.num_devices
    return jax.tree.map(lambda x: jax.device_put(jnp.broadcast_to(x, (count,) + x.shape), sharding), state)

  def host_params(self, state):
    return jax.tree.map(_first_replica, state.params)

  def fetch(self, tree):
    return jax.tree.map(lambda x: np.asarray(x[0]), jax.device_get(tree))


class MeshStrategy(Strategy):
  name = "mesh"

  def __init__(self, fsdp: bool = False, tensor_parallelism: int = 1, devices=None):
    super().__init__()
    devices = list(jax.devices() if devices is None else devices)
    if tensor_parallelism < 1 or len(devices) % tensor_parallelism:
      raise ConfigError(f"config.tensor_parallelism={tensor_parallelism} must divide the {len(devices)} devices; "
                       f"choose one of {[n for n in range(1, len(devices) + 1) if len(devices) % n == 0]}.")
    self.fsdp = fsdp
    self.model_size = tensor_parallelism
    self.mesh = jax.make_mesh((len(devices) // tensor_parallelism, tensor_parallelism), (DATA_AXIS, MODEL_AXIS),
                              axis_types=(jax.sharding.AxisType.Auto,) * 2, devices=devices)
    self.batch_sharding = NamedSharding(self.mesh, PartitionSpec(DATA_AXIS))
    self.stacked_batch_sharding = NamedSharding(self.mesh, PartitionSpec(None, DATA_AXIS))  # [steps, batch, ...]
    self.replicated = NamedSharding(self.mesh, PartitionSpec())
    self._state_sharding = None

  @property
  def num_devices(self):
    """Devices the batch is split over: the ``data`` axis."""
    return self.mesh.shape[DATA_AXIS]

  def _parameter_sharding(self, path, shape):
    """Tensor parallelism: the model axis on the parameter's ``tensor_parallel_axis``; FSDP: the data axis on the
    largest other axis it divides; replicated where neither applies."""
    spec = [None] * len(shape)
    model_axis = tensor_parallel_axis(path) if self.model_size > 1 and shape else None
    if model_axis is not None and model_axis < len(shape) and shape[model_axis] % self.model_size == 0:
      spec[model_axis] = MODEL_AXIS
    if self.fsdp and shape:
      candidates = [axis for axis in np.argsort(shape)[::-1]
                    if spec[axis] is None and shape[axis] % self.num_devices == 0]
      if candidates:
        spec[candidates[0]] = DATA_AXIS
    return NamedSharding(self.mesh, PartitionSpec(*spec)) if any(spec) else self.replicated

  def state_sharding(self, state_shapes):
    return jax.tree_util.tree_map_with_path(lambda path, s: self._parameter_sharding(path, s.shape), state_shapes)

  def create_state(self, create_fn, seed_key):
    shapes = jax.eval_shape(create_fn, seed_key)
    self._state_sharding = self.state_sharding(shapes)
    return jax.jit(create_fn, out_shardings=self._state_sharding)(seed_key)

  def compile_train_step(self, train_step, steps_per_call: int = 1):
    def step_with_rng(state, batch):
      return train_step(state, batch, jax.random.fold_in(state.rng, state.step))
    batch_sharding = self.batch_sharding if steps_per_call == 1 else self.stacked_batch_sharding
    return jax.jit(self._counted(scanned(step_with_rng, steps_per_call)),
                   in_shardings=(self._state_sharding, batch_sharding),
                   out_shardings=(self._state_sharding, self.replicated), donate_argnums=(0,))

  def compile_eval_step(self, eval_step):
    return jax.jit(eval_step, in_shardings=(self._state_sharding.params, self.batch_sharding),
                   out_shardings=self.replicated)

  def put_batch(self, batch):
    # Each process holds its own rows of the global batch (multi-host); on one host this is a plain split.
    return jax.tree.map(
        lambda x: jax.make_array_from_process_local_data(self.batch_sharding, np.asarray(x)), batch)

  def put_batches(self, batches):
    return jax.tree.map(
        lambda x: jax.make_array_from_process_local_data(self.stacked_batch_sharding, np.asarray(x)), batches)

  def abstract_canonical(self, state_shapes):
    self._state_sharding = self.state_sharding(state_shapes)
    return jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), state_shapes,
                        self._state_sharding)

  def host_params(self, state):
    """The parameters replicated on every device: with FSDP over several processes, no process holds a whole
    parameter until it is gathered (``device_get`` of a sharded array spanning other hosts fails)."""
    if not self.fsdp and self.model_size == 1:
      return state.params
    return jax.jit(lambda params: params, out_shardings=self.replicated)(state.params)

  def fetch(self, tree):
    return jax.tree.map(lambda x: np.asarray(jax.device_get(x)), tree)


def scanned(step, steps_per_call: int):
  """``step`` itself for 1; else ``(state, batches) -> (state, metrics)``: ``step(state, batch)`` on each of
  ``batches`` ``[steps_per_call, ...]`` in turn, in one ``lax.scan`` (the same step, the same keys: each step
  folds ``state.step`` into its key), its metrics stacked ``[steps_per_call, ...]``."""
  if steps_per_call == 1:
    return step

  def steps(state, batches):
    return jax.lax.scan(step, state, batches, length=steps_per_call)
  return steps


def make_strategy(parallelism: str, num_replicas: int = 1, fsdp: bool = False,
                  settings: dict | None = None, tensor_parallelism: int = 1) -> Strategy:
  """The strategy of ``parallelism``; ``num_replicas`` and per-replica ``settings`` with ``jit`` only,
  ``fsdp`` and ``tensor_parallelism`` with ``mesh`` only (``RunConfig`` checks the combination, naming the fields)."""
  if parallelism == "jit":
    return Strategy(num_replicas, settings)
  if parallelism == "pmap":
    return PmapStrategy()
  if parallelism == "mesh":
    return MeshStrategy(fsdp, tensor_parallelism)
  raise ValueError(f"config.parallelism={parallelism!r} is not supported; choose one of {list(PARALLELISMS)}.")


def _first_replica(x):
  """The copy of a ``pmap`` value on the first local device, ``x[0]`` read from that device alone: indexing the
  whole array dispatches a gather over every device per leaf, which XLA:CPU has aborted on under load."""
  shards = getattr(x, "addressable_shards", None)
  return shards[0].data[0] if shards else x[0]
