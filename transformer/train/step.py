"""Pure train and eval steps: ``(state, batch, rng) -> (state, metrics)``, compiled by ``parallel``."""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from transformer.errors import TrainingDiverged
from transformer.train.optimizer import frozen_labels
from transformer.train.state import TrainState


def all_finite(metrics) -> jax.Array:
  """Whether every metric sum and weight of a step (loss, accuracy, ``grad_norm``, ...) is finite: a NaN or
  infinity in the loss or the gradients reaches at least one of them."""
  return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(metrics)]))


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

  ``train_step``'s optional ``settings`` are one replica's swept values (``config.replica_values``; the
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

  def gradients(params, batch, rng, loss_settings):
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
    (grads, weight_sum, metrics), _ = jax.lax.scan(accumulate, initial,
                                                   (micro_batches, jnp.arange(grad_accum_steps)))
    return grads, weight_sum, metrics

  def train_step(state: TrainState, batch, rng, settings=None):
    settings = dict(settings or {})
    variant = settings.pop("variant", None)
    if axis_name is not None:  # independent dropout on each data-parallel device
      rng = jax.random.fold_in(rng, jax.lax.axis_index(axis_name))
    grads, weight_sum, metrics = gradients(state.params, batch, rng, settings)
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
      finite = all_finite(metrics)
      params, opt_state = jax.tree.map(lambda new, old: jnp.where(finite, new, old), (params, opt_state),
                                       (state.params, state.opt_state))
      metrics = jax.tree.map(lambda x: jnp.where(finite, x, jnp.zeros_like(x)), metrics)
      metrics["skipped_steps"] = (jnp.where(finite, 0.0, 1.0), jnp.zeros((), jnp.float32))
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics

  return train_step


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


_all_finite = jax.jit(all_finite)


class DivergenceGuard:
  """Stops training at the first step whose loss or gradient norm is not finite.

  ``observe`` checks the previous step's metrics, one step behind, so the host waits for a step only while
  the device already runs the next one; ``check`` checks the last step too, before anything is saved.
  With ``skip_nonfinite_steps`` the train step zeroes such metrics, so nothing trips it.
  """

  def __init__(self, fetch: Callable, before_raise: Callable[[], None] = lambda: None):
    self._fetch = fetch  # device metrics -> host numpy (the strategy's fetch)
    self._before_raise = before_raise  # e.g. let asynchronous checkpoint saves finish
    self._pending = None

  def observe(self, step: int, metrics) -> None:
    """Record step ``step``'s metrics (not waited for); check those of the step before.

    Raises:
      TrainingDiverged: the step before has a non-finite loss or gradient norm.
    """
    pending, self._pending = self._pending, (step, metrics, _all_finite(metrics))  # dispatched, not waited for
    if pending is not None:
      self._check(*pending)

  def check(self) -> None:
    """Check every observed step (waits for the last one).

    Raises:
      TrainingDiverged: one has a non-finite loss or gradient norm.
    """
    pending, self._pending = self._pending, None
    if pending is not None:
      self._check(*pending)

  def _check(self, step: int, metrics, finite: jax.Array) -> None:
    if bool(np.asarray(finite.addressable_data(0))):  # one scalar to the host (also a multi-host global array)
      return
    self._before_raise()
    fetched = self._fetch(metrics)
    values = ", ".join(f"{name} {np.asarray(total).tolist()}" for name, (total, _) in sorted(fetched.items())
                       if name in ("loss", "grad_norm"))
    raise TrainingDiverged(
        f"training diverged at step {step}: the loss or gradient norm is not finite ({values}). Nothing from "
        "this step on was saved; the latest checkpoint is the last finite state. Lower "
        "config.optimizer.learning_rate (or set config.optimizer.grad_clip_norm), or set "
        "--config.skip_nonfinite_steps=True to skip such steps.")
