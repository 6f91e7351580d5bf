"""Metrics as pure functions returning (numerator, denominator) pairs to be summed, then divided."""
from __future__ import annotations

import jax.numpy as jnp


def token_accuracy(logits, targets, weights=None):
  """Argmax accuracy over positions: a position is right when its target's logit is the largest.

  Computed as ``logit[target] >= max(logits)`` (a max reduction, much cheaper on CPU than an argmax's
  index reduction); a tie for the largest logit counts as right.

  Args:
    logits: ``[batch, length, vocab]``.
    targets: ``[batch, length]`` int.
    weights: ``[batch, length]`` (0 at padding) or None.

  Returns:
    ``(correct, total)`` float32 scalars.
  """
  target_logits = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
  correct = (target_logits >= jnp.max(logits, axis=-1)).astype(jnp.float32)
  weights = jnp.ones_like(correct) if weights is None else weights.astype(jnp.float32)
  return jnp.sum(correct * weights), jnp.sum(weights)


def sequence_exact_match(predictions, targets, weights=None):
  """Fraction of sequences whose every non-padding position is predicted right.

  Args:
    predictions: ``[batch, length]`` int.
    targets: ``[batch, length]`` int.
    weights: ``[batch, length]`` (0 at padding) or None.

  Returns:
    ``(matches, sequences)`` float32 scalars; sequences with no real position are not counted.
  """
  weights = jnp.ones(targets.shape, bool) if weights is None else weights.astype(bool)
  wrong = jnp.any((predictions != targets) & weights, axis=-1)
  counted = jnp.any(weights, axis=-1)
  return jnp.sum((~wrong & counted).astype(jnp.float32)), jnp.sum(counted.astype(jnp.float32))
