"""The train state: everything a step needs and a checkpoint must hold."""
from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax


@flax.struct.dataclass
class TrainState:
  """``step`` (int32 scalar), ``params``, ``opt_state`` and ``rng`` (the run's base key; step ``i`` uses
  ``fold_in(rng, i)``, so resuming at any step reproduces the same randomness)."""
  step: jax.Array
  params: Any
  opt_state: Any
  rng: jax.Array


def create_train_state(model, optimizer: optax.GradientTransformation, init_inputs: tuple, seed_key):
  """Initialise parameters and optimizer state from one key. Pure: jit it, with out_shardings if sharded."""
  init_key, dropout_key, run_key = jax.random.split(seed_key, 3)
  params = model.init({"params": init_key, "dropout": dropout_key}, *init_inputs)["params"]
  return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=optimizer.init(params),
                    rng=run_key)
