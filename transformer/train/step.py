"""Pure train and eval steps: ``(state, batch, rng) -> (state, metrics)``, compiled by ``parallel``."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from transformer.train.optimizer import frozen_labels
from transformer.train.state import TrainState


def all_finite(metrics) -> jax.Array:
  """Whether every metric sum and weight of a step (loss, accuracy, ``grad_norm``, ...) is finite: a NaN or
  infinity in the loss or the gradients reaches at least one of them."""
  return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(metrics)]))


def accumulated_gradients(grad_fn, params, batch, rng, loss_settings, grad_accum_steps: int):
  """``(grads, weight_sum, metrics)`` of ``grad_fn`` (``value_and_grad`` of a loss sum with aux ``(weight_sum,
  metrics)``) over ``batch``, summed over ``grad_accum_steps`` micro-batches with a ``lax.scan`` (micro-batch
  ``i`` with the key ``fold_in(rng, i)``)."""
  if grad_accum_steps == 1:
    (_, (weight_sum, metrics)), grads = grad_fn(params, batch, rng, loss_settings)
    return grads, weight_sum, metrics

  def split(x):  # [batch, ...] -> [accum, batch / accum, ...]
    return x.reshape(grad_accum_steps, x.shape[0] // grad_accum_steps, *x.shape[1:])

  micro_batches = jax.tree.map(split, batch)

  def accumulate(carry, inputs):
    micro_batch, index = inputs
    (_, (weight_sum, metrics)), grads = grad_fn(params, micro_batch, jax.random.fold_in(rng, index),
                                                loss_settings)
    return jax.tree.map(jnp.add, carry, (grads, weight_sum, metrics)), None

  first = jax.tree.map(lambda x: x[0], micro_batches)
  zeros = jax.tree.map(jnp.zeros_like, jax.eval_shape(grad_fn, params, first, rng, loss_settings))
  initial = (zeros[1], zeros[0][1][0], zeros[0][1][1])
  (grads, weight_sum, metrics), _ = jax.lax.scan(accumulate, initial, (micro_batches, jnp.arange(grad_accum_steps)))
  return grads, weight_sum, metrics


def make_train_step(task, model, optimizer: optax.GradientTransformation, grad_accum_steps: int = 1,
                    axis_name: str | None = None, skip_nonfinite_steps: bool = False,
                    frozen_params: tuple[str, ...] = (), variant_schedules: list | None = None):
  """Build ``train_step(state, batch, rng) -> (state, metrics)``.

  The loss is normalised once by the total weight (non-padding tokens) of the global batch: gradients of
  the loss *sum* are accumulated over ``grad_accum_steps`` micro-batches (a ``lax.scan``) and, under
  ``pmap``, summed over ``axis_name``, then divided by the summed weight. So every parallelism mode and
  accumulation setting optimises exactly the same objective.

  Metrics are ``name -> (sum, weight)`` pairs summed over the global batch.

  ``skip_nonfinite_steps``: a step whose loss or gradient norm is not finite leaves parameters and optimizer
  state as they were (the data and the step counter move on), contributes zeros to the other metrics, and
  counts in ``skipped_steps``, a ``(count, 0)`` pair: weight 0 marks a count, logged as its sum.

  ``frozen_params`` (``config.optimizer.frozen_params``, path prefixes): no gradient flows into those
  parameters (zeros in their place), so autodiff skips the backward pass of whatever only they feed, e.g. a
  whole frozen pretrained encoder. The optimizer must leave them unchanged too (``make_optimizer`` does).

  ``train_step``'s optional ``settings`` are one replica's swept values (``RunConfig.replicas.settings``; the
  strategy passes each replica its own): ``"variant"`` picks the schedule of ``variant_schedules`` whose rate
  multiplies the updates (``optimizer`` then runs at a constant rate of 1: Adam's update is linear in its rate,
  decoupled weight decay included; the schedule reads the optimizer's own step count, as optax's does, which
  a skipped non-finite step does not advance), ``"label_smoothing"`` goes to the task's loss.
  """

  def loss_fn(params, batch, rng, loss_settings):
    if frozen_params:
      labels = frozen_labels(params, frozen_params)
      params = jax.tree.map(lambda p, label: jax.lax.stop_gradient(p) if label == "frozen" else p, params, labels)
    loss_sum, weight_sum, metrics = task.loss_and_metrics(model, params, batch, rng, **loss_settings)
    return loss_sum, (weight_sum, metrics)

  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

  def train_step(state: TrainState, batch, rng, settings=None):
    settings = dict(settings or {})
    variant = settings.pop("variant", None)
    if axis_name is not None:  # independent dropout on each data-parallel device
      rng = jax.random.fold_in(rng, jax.lax.axis_index(axis_name))
    grads, weight_sum, metrics = accumulated_gradients(grad_fn, state.params, batch, rng, settings, grad_accum_steps)
    if axis_name is not None:
      grads, weight_sum, metrics = jax.lax.psum((grads, weight_sum, metrics), axis_name)
    with jax.named_scope("optimizer"):  # a name for its ops in compiled HLO and profiles
      grads = jax.tree.map(lambda g: g / jnp.maximum(weight_sum, 1.0), grads)
      updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
      if variant_schedules:
        count = optax.tree_utils.tree_get(state.opt_state, "count")  # Adam's: updates applied so far
        rate = jnp.stack([schedule(count) for schedule in variant_schedules])[variant]
        updates = jax.tree.map(lambda u: u * rate.astype(u.dtype), updates)
      params = optax.apply_updates(state.params, updates)
      metrics = dict(metrics)
      metrics["grad_norm"] = (optax.tree.norm(grads), jnp.ones((), jnp.float32))
    if skip_nonfinite_steps:
      params, opt_state, metrics = _skipped_if_nonfinite(state, params, opt_state, metrics)
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics

  return train_step


def _skipped_if_nonfinite(state: TrainState, params, opt_state, metrics):
  """The step's new ``(params, opt_state, metrics)``, or, when a metric is not finite, the state's own with
  zeroed metrics; ``metrics["skipped_steps"]`` counts it (a ``(count, 0)`` pair)."""
  finite = all_finite(metrics)
  params, opt_state = jax.tree.map(lambda new, old: jnp.where(finite, new, old), (params, opt_state),
                                   (state.params, state.opt_state))
  metrics = jax.tree.map(lambda x: jnp.where(finite, x, jnp.zeros_like(x)), metrics)
  metrics["skipped_steps"] = (jnp.where(finite, 0.0, 1.0), jnp.zeros((), jnp.float32))
  return params, opt_state, metrics


def make_eval_step(task, model, axis_name: str | None = None):
  """``eval_step(params, batch, settings=None) -> metrics`` with the deterministic model (``settings``: a
  replica's swept values, as in ``make_train_step``; those of the loss apply)."""

  def eval_step(params, batch, settings=None):
    loss_settings = {name: value for name, value in (settings or {}).items() if name != "variant"}
    _, _, metrics = task.loss_and_metrics(model, params, batch, None, **loss_settings)
    if axis_name is not None:
      metrics = jax.lax.psum(metrics, axis_name)
    return metrics

  return eval_step
