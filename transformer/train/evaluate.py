"""Evaluation of a train state, and the means that turn device metric sums into logged numbers.

Metrics leave the compiled steps as ``name -> (sum, weight)`` pairs (one value per replica when seeds or
variants are vmapped); ``means`` divides them on the host, once per logging window or evaluation.
"""
from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
import numpy as np

from transformer.data.hosts import host_rows, pad_rows
from transformer.tasks.base import Task
from transformer.train.gather import split_over_processes
from transformer.train.step import make_eval_step


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

  The processes share the task's evaluation: each evaluates every ``process_count``-th unit of
  ``task.evaluation_batches`` (``gather.split_over_processes``) and all score the outputs of every unit, in
  order, so every process returns the metrics of one process evaluating everything."""
  strategy, task, num_seeds = session.strategy, session.task, session.run_config.num_seeds
  eval_step = strategy.compile_eval_step(make_eval_step(task, eval_model, getattr(strategy, "axis_name", None)))
  eval_batches = (task.eval_batches(session.run_config.eval_batch_size) if split is None
                  else task.eval_batches(session.run_config.eval_batch_size, split=split))
  # Each process places its rows of every batch, padded with rows of zero weight to split over the devices.
  host_batches = [host_rows(pad_rows(batch, strategy.num_devices), session.process_index, session.process_count)
                  for batch in eval_batches]
  shared = type(task).evaluate is Task.evaluate  # else the task evaluates whole on every process
  units = task.evaluation_batches(eval_batches) if shared else None

  def task_evaluation(params) -> tuple[dict, list[str]]:
    if not shared:
      return task.evaluate(session.model_config, params, eval_batches)
    # Each process decodes its share of the units; every process scores all outputs, in the units' order.
    outputs = split_over_processes(lambda share: task.evaluate_batches(session.model_config, params, share),
                                   units, session.process_index, session.process_count)
    return task.score_outputs(outputs)

  def evaluate(state) -> dict:
    sums = None
    for batch in host_batches:
      metrics = eval_step(state.params, strategy.put_batch(batch))
      sums = metrics if sums is None else jax.tree.map(jnp.add, sums, metrics)
    results = means(strategy.fetch(sums), split or "eval", num_seeds)
    results.update(task.derived_metrics(results))
    if split is not None:
      return results
    params = jax.device_get(strategy.host_params(state))
    per_replica = []  # each replica's own evaluation (e.g. decoding): seeds are compared on it, not on a mean
    for replica in range(session.num_replicas):
      replica_params = params if session.num_replicas == 1 else jax.tree.map(lambda x, i=replica: x[i], params)
      task_metrics, examples = task_evaluation(replica_params)
      per_replica.append(task_metrics)
      if session.is_main and examples and replica == 0:
        write("examples:\n  " + "\n  ".join(examples))
        sys.stdout.flush()
    for name in per_replica[0]:
      values = [metrics[name] for metrics in per_replica]
      results.update(replica_means(f"eval/{name}", values[0] if session.num_replicas == 1 else values, num_seeds))
    return results

  return evaluate
