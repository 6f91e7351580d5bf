"""Learning-rate schedules and the optax optimizer, built from ``config.optimizer``."""
from __future__ import annotations

import jax.numpy as jnp
import optax

SCHEDULES = ("inverse_sqrt", "cosine", "constant")


def make_schedule(config, num_train_steps: int) -> optax.Schedule:
  """Learning rate as a function of the step (0-based).

  - ``inverse_sqrt`` (Vaswani et al., eq. 3): linear warmup to ``learning_rate`` over ``warmup_steps``, then
    ``learning_rate * sqrt(warmup_steps / step)``. The paper's ``d_model^-0.5 * min(step^-0.5,
    step * warmup^-1.5)`` is this with ``learning_rate = (d_model * warmup_steps) ** -0.5``.
  - ``cosine``: linear warmup, then cosine decay to 0 at ``num_train_steps``.
  - ``constant``: linear warmup, then constant.
  """
  peak, warmup = config.learning_rate, max(int(config.warmup_steps), 0)
  if config.schedule == "inverse_sqrt":
    def schedule(step):
      step = jnp.asarray(step, jnp.float32) + 1.0
      if warmup == 0:
        return peak / jnp.sqrt(step)
      return peak * jnp.minimum(step / warmup, jnp.sqrt(warmup / step))
    return schedule
  if config.schedule == "cosine":
    return optax.warmup_cosine_decay_schedule(0.0, peak, max(warmup, 1), max(num_train_steps, warmup + 1))
  if config.schedule == "constant":
    return optax.linear_schedule(0.0, peak, warmup) if warmup else optax.constant_schedule(peak)
  raise ValueError(f"config.optimizer.schedule={config.schedule!r} is not supported; choose one of "
                   f"{list(SCHEDULES)}.")


def make_optimizer(config, num_train_steps: int) -> optax.GradientTransformation:
  """Adam (paper: b1 0.9, b2 0.98, eps 1e-9), optional decoupled weight decay and global-norm clipping."""
  schedule = make_schedule(config, num_train_steps)
  parts = []
  if config.grad_clip_norm and config.grad_clip_norm > 0:
    parts.append(optax.clip_by_global_norm(config.grad_clip_norm))
  parts.append(optax.adamw(schedule, b1=config.b1, b2=config.b2, eps=config.eps,
                           weight_decay=config.weight_decay))
  return optax.chain(*parts)
