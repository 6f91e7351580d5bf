"""Where a run's train state comes from: fresh initialisation, another run's parameters
(``config.restore_from``), or a task's pretrained weights."""
from __future__ import annotations

import flax.traverse_util
import jax
import numpy as np

from transformer.errors import ConfigError
from transformer.tasks import StartsFromPretrained
from transformer.train.saved_run import abstract_train_state, load_params, seed_keys
from transformer.train.state import create_train_state


def state_factory(session, model, optimizer, init_inputs):
  """``(create, abstract_state)``: ``create(key)`` initialises a train state; ``abstract_state`` is the
  canonical state's shapes with this strategy's shardings, the target checkpoints are restored onto."""
  def create(key):
    return create_train_state(model, optimizer, init_inputs, key)
  return create, abstract_train_state(create, session.run_config, session.strategy)


def with_params(session, state, params):
  """``state`` with ``params`` (a canonical tree of the same shapes) in place of its parameters."""
  return session.strategy.from_canonical(session.strategy.to_canonical(state).replace(params=params))


def initial_state(session, create):
  """A fresh train state: every replica's seed, then ``config.restore_from``'s parameters or the task's
  pretrained weights where the run asks for them."""
  state = session.strategy.create_state(create, seed_keys(session.run_config))
  if session.run_config.restore_from:
    return _initialise_from(session, state, session.run_config.restore_from)
  if isinstance(session.task, StartsFromPretrained):
    return _initialise_pretrained(session, state)
  return state


def _broadcast(session, value, like):
  """``value`` (one replica's) placed as ``like``: the same for every replica of a run of several."""
  return jax.device_put(np.broadcast_to(value, like.shape) if session.num_replicas > 1 else value, like.sharding)


def _replica_shape(session, leaf):
  return leaf.shape[1:] if session.num_replicas > 1 else leaf.shape


def _initialise_from(session, state, source_workdir: str):
  """``config.restore_from``: the parameters of another run (its latest checkpoint) in place of the fresh
  ones; the optimizer state, step and data order start anew."""
  source = load_params(source_workdir, checkpoint="latest")
  canonical = session.strategy.to_canonical(state).params
  fresh = jax.tree_util.tree_flatten_with_path(canonical)[0]
  loaded = jax.tree_util.tree_flatten_with_path(source.params)[0]
  expected = [(jax.tree_util.keystr(path), _replica_shape(session, leaf)) for path, leaf in fresh]
  found = [(jax.tree_util.keystr(path), np.shape(leaf)) for path, leaf in loaded]
  if expected != found:
    differences = [f"{e} != {f}" for e, f in zip(expected, found) if e != f] or ["a different number of tensors"]
    raise ConfigError(f"config.restore_from={source_workdir!r} holds parameters of another model shape "
                      f"({'; '.join(differences[:3])}); set config.model as that run had it.")
  params = jax.tree.map(lambda new, old: _broadcast(session, new, old), source.params, canonical)
  session.say(f"initialised parameters from {source_workdir} step {source.step}")
  return with_params(session, state, params)


def _initialise_pretrained(session, state):
  """``StartsFromPretrained`` tasks: the task's pretrained weights in place of those fresh parameters (every
  replica of a run of several gets the same; the others keep each seed's initialisation)."""
  canonical = flax.traverse_util.flatten_dict(session.strategy.to_canonical(state).params)
  pretrained = flax.traverse_util.flatten_dict(session.task.pretrained_params())
  if not pretrained:
    return state
  for path, value in pretrained.items():
    fresh = canonical.get(path)
    shape = None if fresh is None else _replica_shape(session, fresh)
    if shape != np.shape(value):
      raise ConfigError(f"pretrained parameter {'/'.join(path)} has shape {np.shape(value)}, the model's "
                        f"{'is ' + str(shape) if shape else 'does not exist'}; config.model does not match the "
                        "pretrained model.")
    canonical[path] = _broadcast(session, value, fresh)
  session.say(f"initialised {len(pretrained)} parameter tensors from pretrained weights")
  return with_params(session, state, flax.traverse_util.unflatten_dict(canonical))
