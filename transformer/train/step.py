"""Pure train and eval steps: ``(state, batch, rng) -> (state, metrics)``, compiled by ``parallel``."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from transformer.train.state import TrainState


def make_train_step(task, model, optimizer: optax.GradientTransformation, grad_accum_steps: int = 1,
                    axis_name: str | None = None):
  """Build ``train_step(state, batch, rng) -> (state, metrics)``.

  The loss is normalised once by the total weight (non-padding tokens) of the global batch: gradients of
  the loss *sum* are accumulated over ``grad_accum_steps`` micro-batches (a ``lax.scan``) and, under
  ``pmap``, summed over ``axis_name``, then divided by the summed weight. So every parallelism mode and
  accumulation setting optimises exactly the same objective.

  Metrics are ``name -> (sum, weight)`` pairs summed over the global batch.
  """

  def loss_fn(params, batch, rng):
    loss_sum, weight_sum, metrics = task.loss_and_metrics(model, params, batch, rng)
    return loss_sum, (weight_sum, metrics)

  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

  def gradients(params, batch, rng):
    if grad_accum_steps == 1:
      (_, (weight_sum, metrics)), grads = grad_fn(params, batch, rng)
      return grads, weight_sum, metrics

    def split(x):  # [batch, ...] -> [accum, batch / accum, ...]
      return x.reshape(grad_accum_steps, x.shape[0] // grad_accum_steps, *x.shape[1:])

    micro_batches = jax.tree.map(split, batch)

    def accumulate(carry, inputs):
      micro_batch, index = inputs
      (_, (weight_sum, metrics)), grads = grad_fn(params, micro_batch, jax.random.fold_in(rng, index))
      return jax.tree.map(jnp.add, carry, (grads, weight_sum, metrics)), None

    first = jax.tree.map(lambda x: x[0], micro_batches)
    zeros = jax.tree.map(jnp.zeros_like, jax.eval_shape(grad_fn, params, first, rng))
    initial = (zeros[1], zeros[0][1][0], zeros[0][1][1])
    (grads, weight_sum, metrics), _ = jax.lax.scan(accumulate, initial,
                                                   (micro_batches, jnp.arange(grad_accum_steps)))
    return grads, weight_sum, metrics

  def train_step(state: TrainState, batch, rng):
    if axis_name is not None:  # independent dropout on each data-parallel device
      rng = jax.random.fold_in(rng, jax.lax.axis_index(axis_name))
    grads, weight_sum, metrics = gradients(state.params, batch, rng)
    if axis_name is not None:
      grads, weight_sum, metrics = jax.lax.psum((grads, weight_sum, metrics), axis_name)
    with jax.named_scope("optimizer"):  # a name for its ops in compiled HLO and profiles
      grads = jax.tree.map(lambda g: g / jnp.maximum(weight_sum, 1.0), grads)
      updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
      params = optax.apply_updates(state.params, updates)
      metrics = dict(metrics)
      metrics["grad_norm"] = (optax.tree.norm(grads), jnp.ones((), jnp.float32))
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics

  return train_step


def make_eval_step(task, model, axis_name: str | None = None):
  """``eval_step(params, batch) -> metrics`` with the deterministic model."""

  def eval_step(params, batch):
    _, _, metrics = task.loss_and_metrics(model, params, batch, None)
    if axis_name is not None:
      metrics = jax.lax.psum(metrics, axis_name)
    return metrics

  return eval_step
