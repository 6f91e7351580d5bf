"""Pure train and eval steps, and evaluation of a train state over a dataset.

Pure train and eval steps: ``(state, batch, rng) -> (state, metrics)``, compiled by ``mesh``.

Evaluation of a train state, and the means that turn device metric sums into logged numbers.

Metrics leave the compiled steps as ``name -> (sum, weight)`` pairs (one value per replica when seeds or
variants are vmapped); ``means`` divides them on the host, once per logging window or evaluation.
"""
from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax

from transformer.data.hosts import host_rows, pad_rows
from transformer.train.state import TrainState, frozen_labels


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


def means(sums: dict, prefix: str, num_seeds: int = 1) -> dict:
  """``name -> (sum, weight)`` to ``prefix/name -> sum / weight``; per-replica values get a ``/seed_i`` suffix,
  and with several variants (``config.sweep``: replicas in groups of ``num_seeds``) each variant's mean over
  its seeds a ``/variant_v`` suffix. Weight 0 marks a count (``train/skipped_steps``), reported as its sum."""
  out = {}
  for name, (total, weight) in sums.items():
    weight = np.asarray(weight, np.float64)
    value = np.where(weight > 0, np.asarray(total, np.float64) / np.maximum(weight, 1e-12), total)
    out.update(replica_means(f"{prefix}/{name}", value, num_seeds))
  return out


def replica_means(name: str, value, num_seeds: int) -> dict:
  """``name``: the mean of ``value`` (one per replica, or a scalar), ``name/seed_i`` each replica's, and
  ``name/variant_v`` each variant's mean when the replicas are several variants of ``num_seeds`` seeds."""
  value = np.asarray(value, np.float64)
  if value.ndim == 0:
    return {name: float(value)}
  out = {name: float(value.mean()), **{f"{name}/seed_{i}": float(v) for i, v in enumerate(value)}}
  if len(value) > num_seeds:
    out.update({f"{name}/variant_{v}": float(m) for v, m in enumerate(value.reshape(-1, num_seeds).mean(axis=1))})
  return out


def make_evaluator(session, eval_model, write=print, split: str | None = None):
  """``evaluate(state) -> {"eval/<name>": value}``: the loss metrics of the validation set and the task's own
  evaluation (decoding), whose examples (of the first replica) the main process prints with ``write`` (the
  training loop's ``bar.write``, so that they never land inside its progress bar). With ``split`` (an evaluator
  of ``config.evaluators``): the loss metrics of that split only, as ``<split>/<name>``. With several replicas
  (``num_seeds > 1``, ``config.sweep``) each metric is the mean over replicas, with each replica's value as
  ``eval/<name>/seed_i`` (``i`` the replica: variant ``i // num_seeds``, seed ``config.seed + i % num_seeds``).

  The processes share the task's evaluation as one program (``strategy.evaluating``): each runs every unit of it,
  each device computes its rows with the parameters as trained, and every process gets every output back, so
  every process returns the metrics of one process evaluating everything."""
  strategy, task, num_seeds = session.strategy, session.task, session.run_config.num_seeds
  eval_step = strategy.compile_eval_step(make_eval_step(task, eval_model, getattr(strategy, "axis_name", None)))
  eval_batches = (task.eval_batches(session.run_config.eval_batch_size) if split is None
                  else task.eval_batches(session.run_config.eval_batch_size, split=split))
  # Each process places its rows of every batch, padded with rows of zero weight to split over the devices.
  host_batches = [host_rows(pad_rows(batch, strategy.num_devices), session.process_index, session.process_count)
                  for batch in eval_batches]

  def evaluate(state) -> dict:
    sums = None
    for batch in host_batches:
      metrics = eval_step(state.params, strategy.put_batch(batch))
      sums = metrics if sums is None else jax.tree.map(jnp.add, sums, metrics)
    results = means(strategy.fetch(sums), split or "eval", num_seeds)
    results.update(task.derived_metrics(results))
    if split is not None:
      return results
    with strategy.evaluating(state) as params:  # each replica's own (e.g. decoding): seeds are compared on it
      per_replica = [task.evaluate(session.model_config, replica_params, eval_batches)
                     for replica_params in _replicas(params, session.num_replicas)]
    examples = per_replica[0][1]
    if session.is_main and examples:
      write("examples:\n  " + "\n  ".join(examples))
      sys.stdout.flush()
    for name in per_replica[0][0]:
      values = [metrics[name] for metrics, _ in per_replica]
      results.update(replica_means(f"eval/{name}", values[0] if session.num_replicas == 1 else values, num_seeds))
    return results

  return evaluate


def _replicas(params, count: int) -> list:
  """Each replica's parameters: ``params`` itself for one, else its slices along the leading replica axis."""
  return [params] if count == 1 else [jax.tree.map(lambda x, i=i: x[i], params) for i in range(count)]
