"""Learning-rate schedules and the optax optimizer, built from a run's ``OptimizerConfig``."""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import optax

from transformer.errors import ConfigError
from transformer.nn.config import ValidatedConfig

SCHEDULES = ("inverse_sqrt", "cosine", "constant")  # built by make_schedule


@dataclasses.dataclass(frozen=True)
class OptimizerConfig(ValidatedConfig):
  """``config.optimizer``: Adam with a warmup schedule (``transformer.train.optimizer.make_optimizer``)."""
  learning_rate: float = 1e-3  # peak learning rate
  schedule: str = "inverse_sqrt"  # one of SCHEDULES
  warmup_steps: int = 100
  b1: float = 0.9  # Adam betas and epsilon as in the paper
  b2: float = 0.98
  eps: float = 1e-9
  weight_decay: float = 0.0  # decoupled (AdamW)
  grad_clip_norm: float = 0.0  # global-norm clipping; 0 disables
  # Parameter path prefixes that are not trained, e.g. ("encoder/embedding",) keeps a pretrained table fixed.
  frozen_params: tuple[str, ...] = ()

  def __post_init__(self):
    object.__setattr__(self, "frozen_params", tuple(self.frozen_params or ()))
    if self.schedule not in SCHEDULES:
      raise ConfigError(f"config.optimizer.schedule={self.schedule!r} is not supported; choose one of "
                        f"{list(SCHEDULES)}.")
    if not self.learning_rate > 0:
      raise ConfigError(f"config.optimizer.learning_rate must be > 0, got {self.learning_rate}.")
    if self.warmup_steps < 0:
      raise ConfigError("config.optimizer.warmup_steps must be >= 0.")
    for name in ("b1", "b2"):  # decay rates of Adam's moment averages
      if not 0.0 <= getattr(self, name) < 1.0:
        raise ConfigError(f"config.optimizer.{name}={getattr(self, name)} is outside [0, 1) (the paper: b1 0.9, "
                          "b2 0.98).")
    if not self.eps > 0:
      raise ConfigError(f"config.optimizer.eps must be > 0 (it keeps Adam's step finite), got {self.eps}.")
    if not self.weight_decay >= 0 or not self.grad_clip_norm >= 0:
      raise ConfigError(f"config.optimizer.weight_decay={self.weight_decay} and grad_clip_norm={self.grad_clip_norm} "
                        "must be >= 0 (0 turns either off).")


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


def parameter_path(path) -> str:
  """``"encoder/embedding/embedding"``: a parameter's path in the tree (``jax.tree_util`` keys) joined by ``/``."""
  return "/".join(str(getattr(key, "key", getattr(key, "name", key))) for key in path)


def frozen_labels(params, frozen_prefixes) -> object:
  """The tree of ``params`` with ``"frozen"`` where a parameter's path equals or lies under one of
  ``frozen_prefixes`` (``"encoder/embedding"`` freezes ``encoder/embedding/embedding``), else ``"trained"``.

  Raises:
    ConfigError: a prefix names no parameter (a misspelling would silently train everything).
  """
  def is_frozen(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix.rstrip("/") + "/")

  paths = [parameter_path(path) for path, _ in jax.tree_util.tree_flatten_with_path(params)[0]]
  for prefix in frozen_prefixes:
    if not any(is_frozen(path, prefix) for path in paths):
      tops = sorted({path.split("/")[0] for path in paths})
      raise ConfigError(f"config.optimizer.frozen_params names {prefix!r}, which is no parameter's path (nor a "
                        f"prefix of one); paths start with {tops}, e.g. {paths[0]!r}.")
  return jax.tree_util.tree_map_with_path(
      lambda path, _: "frozen" if any(is_frozen(parameter_path(path), p) for p in frozen_prefixes) else "trained",
      params)


def make_optimizer(config, num_train_steps: int, constant_rate: float | None = None) -> optax.GradientTransformation:
  """Adam (paper: b1 0.9, b2 0.98, eps 1e-9), optional decoupled weight decay and global-norm clipping.

  ``config.frozen_params`` (optional; path prefixes such as ``("encoder/embedding",)``): those parameters get
  zero updates and no Adam moments, and are left out of the clipping norm; the rest train as usual.
  ``constant_rate``: this fixed rate instead of the schedule (a sweep's train step applies each replica's).
  """
  schedule = make_schedule(config, num_train_steps) if constant_rate is None else constant_rate
  parts = []
  if config.grad_clip_norm and config.grad_clip_norm > 0:
    parts.append(optax.clip_by_global_norm(config.grad_clip_norm))
  parts.append(optax.adamw(schedule, b1=config.b1, b2=config.b2, eps=config.eps,
                           weight_decay=config.weight_decay))
  optimizer = optax.chain(*parts)
  frozen = config.frozen_params
  if not frozen:
    return optimizer
  return optax.multi_transform({"trained": optimizer, "frozen": optax.set_to_zero()},
                               lambda params: frozen_labels(params, frozen))
