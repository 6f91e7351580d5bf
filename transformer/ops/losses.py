"""What predictions score against their targets: the loss (label-smoothed cross entropy) and the metrics (token
accuracy, sequence exact match), each summed as a ``(sum, weight)`` pair over positions and divided once after
summing over batches and devices."""
from __future__ import annotations

import jax
import jax.numpy as jnp


def softmax_cross_entropy(logits, targets, label_smoothing: float = 0.0):
  """Per-position cross entropy against label-smoothed one-hot targets (Szegedy et al. 2016).

  The target distribution puts ``1 - label_smoothing`` on the true class and spreads ``label_smoothing``
  evenly over the other ``vocab - 1`` classes. The entropy of that distribution is subtracted, so a
  perfect prediction of the smoothed distribution has loss 0 and values are comparable across settings.

  Args:
    logits: ``[..., vocab]`` (any float dtype; computed in float32).
    targets: ``[...]`` int class ids in ``[0, vocab)``.
    label_smoothing: in ``[0, 1)``; a Python number, or a traced scalar (one per replica when a sweep vmaps
      several settings; 0 then gives the unsmoothed loss through the smoothed formula). A concrete value
      outside ``[0, 1)`` is a ValueError here; a traced one cannot be checked while tracing, so it gives
      NaN losses instead (which the training loop reports as a divergence).

  Returns:
    ``[...]`` float32 losses. A target outside ``[0, vocab)`` (negative ones included, which indexing would
    wrap around) gives NaN at its position, so a vocabulary mismatch shows in the loss instead of training
    silently on another class; padding must use a real id (``pad_id``) with weight 0.

  Raises:
    ValueError: a concrete ``label_smoothing`` outside ``[0, 1)``, or any smoothing but a concrete 0 with a
      vocabulary of 1 (there is no other class to spread it over).
  """
  with jax.named_scope("cross_entropy"):  # a name for its ops in compiled HLO and profiles
    vocab_size = logits.shape[-1]
    _check_label_smoothing(label_smoothing, vocab_size)
    logits = logits.astype(jnp.float32)
    # log p_i = logits_i - logsumexp(logits): computed per position from three [...] reductions, so no
    # [..., vocab] array of log-probabilities is written (the backward is one fused softmax pass).
    log_normalizer = jax.nn.logsumexp(logits, axis=-1)
    true_log_prob = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0] - log_normalizer
    confidence = 1.0 - label_smoothing
    loss = -confidence * true_log_prob
    if not isinstance(label_smoothing, (int, float)) or label_smoothing > 0.0:
      low_confidence = label_smoothing / (vocab_size - 1)
      sum_log_probs = jnp.sum(logits, axis=-1) - vocab_size * log_normalizer
      # Sum over the wrong classes = sum over all classes minus the true one.
      loss = loss - low_confidence * (sum_log_probs - true_log_prob)
      minimum = -(confidence * jnp.log(confidence) + (vocab_size - 1) * low_confidence
                  * jnp.log(low_confidence + 1e-20))
      loss = loss - minimum
    valid = (targets >= 0) & (targets < vocab_size)
    if isinstance(label_smoothing, jax.core.Tracer):  # unchecked above: NaN rather than a plausible wrong loss
      valid = valid & (label_smoothing >= 0.0) & (label_smoothing < 1.0)
    return jnp.where(valid, loss, jnp.nan)


def _check_label_smoothing(label_smoothing, vocab_size: int) -> None:
  """The checks ``softmax_cross_entropy`` can make while tracing: on a concrete ``label_smoothing`` and the
  static vocabulary size."""
  traced = isinstance(label_smoothing, jax.core.Tracer)
  if not traced and not 0.0 <= float(label_smoothing) < 1.0:
    raise ValueError(f"label_smoothing={float(label_smoothing)!r} is outside [0, 1): it is the probability "
                     "mass moved off the true class (0.1 in the Transformer paper, 0 for none).")
  if vocab_size == 1 and (traced or float(label_smoothing) != 0.0):
    raise ValueError(f"label_smoothing={'a traced value' if traced else float(label_smoothing)} needs a "
                     "vocabulary of at least 2 classes to spread over; the logits have 1. Use "
                     "label_smoothing=0.")


def weighted_sum(values, weights=None):
  """``(sum(values * weights), sum(weights))``: the pieces of a mean over non-padding positions.

  Returning both lets callers sum across devices and steps first and divide once, so the loss is
  normalised by the number of real tokens in the global batch, not per device.
  """
  if weights is None:
    weights = jnp.ones_like(values)
  weights = weights.astype(jnp.float32)
  return jnp.sum(values * weights), jnp.sum(weights)


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
