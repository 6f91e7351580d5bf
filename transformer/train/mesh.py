"""Parallelism: one ``(hosts, data, model)`` mesh for every run, and ``pmap`` as classic data parallelism.

- ``mesh`` (and ``jit``, the same on one device: a mesh of 1 x 1 x 1): ``jax.jit`` over a ``Mesh`` with
  ``NamedSharding``. The batch is split over the ``hosts`` and ``data`` axes. ``hosts`` is 1 but in a hybrid mesh
  (``config.hybrid_mesh``): one entry per process, so that what the rules send to ``data`` (FSDP) is split over
  each process's own devices (their fast links) and replicated across processes, which are data parallel (as
  MaxText's ICI and DCN axes). Each parameter is laid out by its logical axis
  names (``transformer.nn.axes``, flax's logical partitioning) through the run's rule table
  (``RunConfig.axis_rules``): ``tensor_parallelism`` > 1 gives the ``model`` axis that many devices, which split
  what the rules send there (heads, feed-forward width, vocabulary); FSDP sends the model width to ``data``.
  The optimizer's moments follow their parameters. The model's activations say their layout where it matters
  (``transformer.nn.with_activation_axes``: the residual stream, attention heads, feed-forward hidden, logits) by
  the same table, the batch over ``hosts`` and ``data``: each step is traced under the mesh and the rules
  (``activation_layout``), so XLA's sharding propagation splits the rest of the work to match, not by guesswork.
- several replicas: ``jax.vmap`` trains ``num_replicas`` of them in one program, inside the mesh: seeds
  (``config.num_seeds``) and the variants of ``config.sweep``, each replica with its own ``settings``; the replica
  axis is never split.
- several steps per call (``config.steps_per_call``): one compiled call ``lax.scan``s the same step over a stack
  of batches, so the host dispatches once per ``steps_per_call`` steps.
- ``pmap``: replicated data parallelism over local devices, gradients summed with ``psum``; tested equal to the
  mesh.
- evaluation and decoding (``evaluating``) run with the parameters as trained, never gathered; across processes
  every process runs the same passes, each one program whose rows ``transformer.nn.split_rows`` splits as the
  training batch is split (over ``hosts`` and ``data``).

Both strategies expose the same methods, so the training loop never branches on the mode. Checkpoints always
hold the canonical (unreplicated, global, unboxed) state, so a run can resume under another strategy or device
count.
"""
from __future__ import annotations

import contextlib

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from transformer.errors import ConfigError
from transformer.nn.axes import unboxed
from transformer.train.config import DATA_AXIS, HOSTS_AXIS, MODEL_AXIS, PARALLELISMS, logical_axis_rules


class Strategy:
  """What the loop calls: create and place the state, compile the steps, place batches, convert to and from
  the canonical state. ``trace_count``: how many times the train step was traced (= compiled); tests check 1."""
  name = ""
  num_replicas = 1

  def __init__(self):
    self.trace_count = 0

  def _counted(self, fn):
    def traced(*args):
      self.trace_count += 1
      return fn(*args)
    return traced

  def activation_layout(self):
    """The context in which a traced model lays out its activations (``transformer.nn.with_activation_axes``):
    none here, so the constraints are no-ops."""
    return contextlib.nullcontext()

  def to_canonical(self, state):
    """The state as checkpoints store it."""
    return state

  def from_canonical(self, state):
    return state

  def fetch(self, tree):
    return jax.tree.map(lambda x: np.asarray(jax.device_get(x)), tree)

  def evaluation_params(self, state):
    """The parameters that evaluation, decoding and predictions run with: as trained (a mesh's laid out over it,
    on one process or several), so a jitted decoder computes with them there and no device holds more of them
    than in training; nothing gathers a copy."""
    return state.params

  @contextlib.contextmanager
  def evaluating(self, state):
    """``with strategy.evaluating(state) as params:``: ``evaluation_params(state)``, and the placement that
    evaluation runs under while the block lasts (a mesh's and its rules; nothing here)."""
    yield self.evaluation_params(state)


class MeshStrategy(Strategy):
  """``jax.jit`` over a ``(hosts, data, model)`` mesh of ``devices`` (default: all), parameters laid out by
  ``rules`` (logical axis -> mesh axis or None; default ``logical_axis_rules()``: tensor parallelism's, no FSDP).
  ``hosts`` > 1: the devices in that many groups (by process, then id), data parallel between the groups.

  ``num_replicas`` > 1 adds a leading replica axis trained with ``vmap``; ``settings``: swept values,
  ``name -> one number per replica`` (``RunConfig.replicas.settings``), which the train and eval steps get as
  their ``settings`` argument, each replica its own (``{}``: none).
  """

  def __init__(self, devices=None, tensor_parallelism: int = 1, rules=None, num_replicas: int = 1,
               settings: dict | None = None, name: str = "mesh", hosts: int = 1):
    super().__init__()
    devices = list(jax.devices() if devices is None else devices)
    if tensor_parallelism < 1 or len(devices) % (tensor_parallelism * hosts):
      per_host = len(devices) // hosts
      raise ConfigError(f"config.tensor_parallelism={tensor_parallelism} must divide the {per_host} devices"
                        f"{' of each process' if hosts > 1 else ''}; choose one of "
                        f"{[n for n in range(1, per_host + 1) if per_host % n == 0]}.")
    self.name = name
    self.rules = tuple(logical_axis_rules() if rules is None else rules)
    self.num_replicas = num_replicas
    self.settings = {name: np.asarray(values) for name, values in (settings or {}).items()}
    if any(len(values) != num_replicas for values in self.settings.values()):
      raise ValueError(f"settings need one value per replica ({num_replicas}): "
                       f"{ {name: len(values) for name, values in self.settings.items()} }")
    self.mesh = _mesh(devices, hosts, tensor_parallelism)
    if any(len({device.process_index for device in group}) > 1
           for group in self.mesh.devices.reshape(-1, tensor_parallelism)):
      # Each process feeds its own rows of the batch: a model group across processes would get other rows on each.
      local = len(devices) // len({device.process_index for device in devices})
      raise ConfigError(
          f"config.tensor_parallelism={tensor_parallelism} spans processes: its model axis would join devices of "
          f"several processes, which feed it different rows of the batch (and splitting a layer across hosts sends "
          f"its partial sums over the network at every layer). Choose a tensor_parallelism that divides the {local} "
          f"devices of each process ({', '.join(str(n) for n in range(1, local + 1) if local % n == 0)}), with data "
          "parallelism (config.fsdp=True to shard the parameters too) across processes.")
    batch_axes = (HOSTS_AXIS, DATA_AXIS)
    self.batch_sharding = NamedSharding(self.mesh, PartitionSpec(batch_axes))
    self.stacked_batch_sharding = NamedSharding(self.mesh, PartitionSpec(None, batch_axes))  # [steps, batch, ...]
    self.replicated = NamedSharding(self.mesh, PartitionSpec())
    self._state_sharding = None

  @property
  def num_devices(self):
    """Devices the batch is split over: the ``hosts`` and ``data`` axes."""
    return self.mesh.shape[HOSTS_AXIS] * self.mesh.shape[DATA_AXIS]

  def state_sharding(self, state_shapes):
    """The ``NamedSharding`` of each leaf of ``state_shapes`` (a train state's shapes, its parameters boxed with
    their logical axis names, as ``create_train_state`` makes it): a parameter's by its names and the rules, an
    optimizer moment's as its parameter's (``logical_axis_names``), anything else replicated.

    Raises:
      ConfigError: a rule splits an axis that its mesh axis does not divide (naming the parameters and the fix).
    """
    names_of = logical_axis_names(state_shapes)
    replica_axes = (None,) if self.num_replicas > 1 else ()
    problems = []

    def sharding(path, leaf):
      names = names_of(path, leaf.shape)
      if names is None:
        return self.replicated
      spec = PartitionSpec(*replica_axes, *nn.logical_to_mesh_axes(names, self.rules))
      for size, axis, name in zip(leaf.shape, spec, (*replica_axes, *names)):
        if axis is not None and size % self.mesh.shape[axis]:
          problems.append((f"{jax.tree_util.keystr(path, simple=True, separator='/')} {tuple(leaf.shape)}: its "
                           f"'{name}' axis of {size} over the {self.mesh.shape[axis]} devices of '{axis}'", name))
      return NamedSharding(self.mesh, spec)

    shardings = jax.tree_util.tree_map_with_path(sharding, unboxed(state_shapes))
    if problems:  # the first parameter names the problem; its optimizer moments repeat it
      where, name = problems[0]
      raise ConfigError(f"a parameter does not split evenly over the mesh: {where}. Choose sizes that the mesh "
                        "axis divides (d_model, heads, d_ff, vocabulary), another tensor_parallelism, or keep that "
                        f"axis whole on every device with --config.axis_rules='{name}=none'.")
    return shardings

  @contextlib.contextmanager
  def activation_layout(self):
    """Activation constraints take this mesh's layout by ``rules``: the mesh's shape (its abstract mesh, which
    may be entered inside ``jax.jit``, where ``jax.set_mesh`` may not) and the rule table, for what is traced in
    the context. ``jit``'s cache keys on the abstract mesh, so a function traced here is traced anew outside; not
    on the rules, so a module-level jitted decoder traced under one table keeps its layout under another on a mesh
    of the same shape (the values are the same, only the layout differs)."""
    with jax.sharding.use_abstract_mesh(self.mesh.abstract_mesh), nn.logical_axis_rules(self.rules):
      yield

  def _laid_out(self, fn):
    """``fn`` traced in ``activation_layout``."""
    def traced(*args):
      with self.activation_layout():
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
    """Run ``create_fn(key) -> TrainState`` compiled, each leaf placed by ``state_sharding``.

    With ``num_replicas > 1``, ``seed_key`` is a stack of ``num_replicas`` keys, initialised one after the
    other (``lax.map``, the same values as ``vmap``): the RNN encoder-decoder's vmapped init (its decoder's
    ``nn.scan``) never finishes on XLA:CPU, while its vmapped train and eval steps run.
    """
    create = (lambda keys: jax.lax.map(create_fn, keys)) if self.num_replicas > 1 else create_fn
    self._state_sharding = self.state_sharding(jax.eval_shape(create, seed_key))
    return jax.jit(lambda key: unboxed(create(key)), out_shardings=self._state_sharding)(seed_key)

  def compile_train_step(self, train_step, steps_per_call: int = 1):
    """``(state, batch) -> (state, metrics)``; the step's key is ``fold_in(state.rng, state.step)``.

    ``steps_per_call`` > 1: ``(state, batches) -> (state, metrics)`` of that many steps (``scanned``), ``batches``
    stacked ``[steps_per_call, ...]`` (``data.prefetch.stack_batches``, placed by ``put_batches``), metrics too.
    """
    def step_with_rng(state, batch, *settings):
      return train_step(state, batch, jax.random.fold_in(state.rng, state.step), *settings)
    in_axes = (0, None, 0) if self.settings else (0, None)
    step = self._with_settings(self._vmapped(step_with_rng, in_axes))
    batch_sharding = self.batch_sharding if steps_per_call == 1 else self.stacked_batch_sharding
    return jax.jit(self._counted(self._laid_out(scanned(step, steps_per_call))),
                   in_shardings=(self._state_sharding, batch_sharding),
                   out_shardings=(self._state_sharding, self.replicated), donate_argnums=(0,))

  def compile_eval_step(self, eval_step):
    in_axes = (0, None, 0) if self.settings else (0, None)
    return jax.jit(self._laid_out(self._with_settings(self._vmapped(eval_step, in_axes))),
                   in_shardings=(self._state_sharding.params, self.batch_sharding), out_shardings=self.replicated)

  def put_batch(self, batch):
    # Each process holds its own rows of the global batch (multi-host); on one host this is a plain split.
    return jax.tree.map(
        lambda x: jax.make_array_from_process_local_data(self.batch_sharding, np.asarray(x)), batch)

  def put_batches(self, batches):
    """Place a stack of batches (``[steps_per_call, batch, ...]``) for a several-step call."""
    return jax.tree.map(
        lambda x: jax.make_array_from_process_local_data(self.stacked_batch_sharding, np.asarray(x)), batches)

  def abstract_canonical(self, state_shapes):
    """Restore targets: ``state_shapes`` (boxed as for ``state_sharding``) unboxed, with this mesh's shardings."""
    self._state_sharding = self.state_sharding(state_shapes)
    return jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), unboxed(state_shapes),
                        self._state_sharding)

  @contextlib.contextmanager
  def evaluating(self, state):
    """This mesh bound (``jax.set_mesh``) with its rule table while the block lasts: every process runs the same
    evaluation (the same units, in order), and each jitted search or scoring pass (``split_rows``) is one program
    over every process's devices, each device computing its rows of every batch (``activation_batch``) with the
    parameters as trained and its activations laid out by the rules; each process gets all outputs back."""
    with jax.set_mesh(self.mesh), nn.logical_axis_rules(self.rules):
      yield self.evaluation_params(state)


class PmapStrategy(Strategy):
  """Classic data parallelism: one copy of the state per local device, the batch split along a leading device
  axis, gradients summed with ``psum`` over ``axis_name``."""
  name = "pmap"
  axis_name = "batch"

  def __init__(self):
    super().__init__()
    self.devices = jax.local_devices()

  @property
  def num_devices(self):
    return len(self.devices)

  def create_state(self, create_fn, seed_key):
    return self.from_canonical(jax.jit(lambda key: unboxed(create_fn(key)))(seed_key))

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

  def abstract_canonical(self, state_shapes):
    sharding = jax.sharding.make_single_device_sharding(jax.local_devices()[0])
    return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding), unboxed(state_shapes))

  def evaluation_params(self, state):
    """The first device's copy of the parameters."""
    return jax.tree.map(_first_replica, state.params)

  def fetch(self, tree):
    return jax.tree.map(lambda x: np.asarray(x[0]), jax.device_get(tree))


def logical_axis_names(state_shapes):
  """``names_of(path, shape)``: the logical axis names of the leaf at ``path`` of ``state_shapes`` unboxed (its
  parameters boxed, ``nn.LogicallyPartitioned``). A parameter has its own names; an optimizer-state leaf those of
  the parameter whose path ends its own and whose shape it has (Adam's moments; a factored statistic of another
  shape has none); any other leaf None."""
  params = getattr(state_shapes, "params", state_shapes)
  by_path = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(params, is_leaf=_is_boxed)[0]:
    if _is_boxed(leaf):
      by_path[_dict_keys(path)] = (tuple(leaf.names), tuple(leaf.value.shape))

  def names_of(path, shape):
    keys = _dict_keys(path)
    for start in range(len(keys)):
      names, expected = by_path.get(keys[start:], (None, None))
      if names is not None and expected == tuple(shape):
        return names
    return None
  return names_of


def _is_boxed(x) -> bool:
  return isinstance(x, nn.meta.AxisMetadata)


def _dict_keys(path) -> tuple:
  return tuple(str(key.key) for key in path if isinstance(key, jax.tree_util.DictKey))


def scanned(step, steps_per_call: int):
  """``step`` itself for 1; else ``(state, batches) -> (state, metrics)``: ``step(state, batch)`` on each of
  ``batches`` ``[steps_per_call, ...]`` in turn, in one ``lax.scan`` (the same step, the same keys: each step
  folds ``state.step`` into its key), its metrics stacked ``[steps_per_call, ...]``."""
  if steps_per_call == 1:
    return step

  def steps(state, batches):
    return jax.lax.scan(step, state, batches, length=steps_per_call)
  return steps


def _mesh(devices: list, hosts: int, tensor_parallelism: int) -> jax.sharding.Mesh:
  """The ``(hosts, data, model)`` mesh of ``devices``: JAX's device order on one host; with several, the devices
  grouped by process (each group one process's, so that the ``data`` axis stays inside a host)."""
  axes, axis_types = (HOSTS_AXIS, DATA_AXIS, MODEL_AXIS), (jax.sharding.AxisType.Auto,) * 3
  shape = (hosts, len(devices) // hosts // tensor_parallelism, tensor_parallelism)
  if hosts == 1:
    return jax.make_mesh(shape, axes, axis_types=axis_types, devices=devices)
  grouped = np.array(sorted(devices, key=lambda device: (device.process_index, device.id))).reshape(shape)
  processes = [{device.process_index for device in group.flat} for group in grouped]
  if jax.process_count() > 1 and any(len(group) > 1 for group in processes):
    raise ConfigError(f"config.hybrid_mesh=True needs the same number of devices on each of the {hosts} processes; "
                      f"their devices are {sorted(device.process_index for device in devices)} by process. Give "
                      "each process as many devices (--local_device_ids), or set hybrid_mesh=False.")
  return jax.sharding.Mesh(grouped, axes, axis_types=axis_types)


def make_strategy(parallelism: str, num_replicas: int = 1, settings: dict | None = None,
                  tensor_parallelism: int = 1, rules=None, hybrid: bool = False) -> Strategy:
  """The strategy of ``parallelism``: ``jit``, a mesh of this process's first device; ``mesh``, of every device
  (``hybrid``: a ``hosts`` axis of one entry per process); ``pmap``. ``RunConfig`` checks the combination of
  fields, naming them."""
  if parallelism == "pmap":
    return PmapStrategy()
  if parallelism in ("jit", "mesh"):
    devices = jax.local_devices()[:1] if parallelism == "jit" else None
    return MeshStrategy(devices, tensor_parallelism, rules, num_replicas, settings, name=parallelism,
                        hosts=jax.process_count() if hybrid else 1)
  raise ValueError(f"config.parallelism={parallelism!r} is not supported; choose one of {list(PARALLELISMS)}.")


def _first_replica(x):
  """The copy of a ``pmap`` value on the first local device, ``x[0]`` read from that device alone: indexing the
  whole array dispatches a gather over every device per leaf, which XLA:CPU has aborted on under load."""
  shards = getattr(x, "addressable_shards", None)
  return shards[0].data[0] if shards else x[0]
