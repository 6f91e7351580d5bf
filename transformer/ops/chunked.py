"""Memory-efficient attention: online softmax over key blocks (Rabe & Staats 2021; Dao et al. 2022).

Not a drop-in for ``attention.dot_product_attention``: it takes no dense ``mask`` (nor ``bias``, dropout,
``return_weights``, ``precision`` or ``float32_logits``) but the mask's parts, below, and a causal mask
without an offset (queries and keys start at the same position: no cached decoding). Given those parts it
equals, to float rounding, ``dot_product_attention`` over the mask they build, in float32 logits, and
never materialises the ``[q_length, kv_length]`` weights: queries are processed in blocks with
``lax.map``, keys in blocks with ``lax.scan`` while a running maximum and normaliser are kept per query.
The backward pass is a custom VJP that recomputes each block's weights from the saved log-sum-exp, so
peak memory is ``O(length * chunk)`` in both directions rather than ``O(length^2)``.

A dense ``[batch, heads, q, k]`` mask would itself be quadratic, so masks are given per position:
``query_valid`` ``[batch, q_length]``, ``key_valid`` ``[batch, kv_length]``, the segment ids of packed rows
(``query_segments``, ``key_segments``) and ``causal``. Inside, validity and segments travel as one int id per
position (0: invalid): query and key see each other where their ids are equal and non-zero.
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from transformer.ops.heads import check_attention_inputs, repeat_kv_heads
from transformer.ops.kernels import REFERENCE, Kernels
from transformer.ops.masks import MASK_VALUE, check_per_position
from transformer.ops.scores import dot_product_scores


def chunked_dot_product_attention(query, key, value, query_valid=None, key_valid=None, *,
                                  causal: bool = False, window: int | None = None, scale: bool | float = True,
                                  query_chunk_size: int = 512, key_chunk_size: int = 512,
                                  kernels: Kernels | None = None, query_segments=None, key_segments=None):
  """Block-wise scaled dot-product attention with O(length * chunk) memory.

  Args:
    query: ``[batch, q_length, heads, head_dim]``.
    key: ``[batch, kv_length, kv_heads, head_dim]``, ``kv_heads`` dividing ``heads`` (grouped-query attention).
    value: ``[batch, kv_length, kv_heads, head_dim_v]``.
    query_valid: ``[batch, q_length]`` bool; invalid (padding) queries return zeros. Default: all valid.
    key_valid: ``[batch, kv_length]`` bool; invalid keys get no weight (a NaN there never reaches the
      output). Default: all valid.
    causal: query ``i`` sees only keys ``j <= i``.
    window: None, or query ``i`` sees only keys ``j`` with ``|i - j| < window`` (``masks.make_local_mask``).
    scale: as ``dot_product_scores``.
    query_chunk_size, key_chunk_size: positive block sizes; lengths need not be multiples of them.
    kernels: a backend-tuned product for the blocks' logits (``kernels.py``); None for the einsum.
    query_segments, key_segments: ``[batch, q_length]`` and ``[batch, kv_length]`` int segment ids of packed
      rows (``masks.make_segment_mask``): a query sees only keys of its own segment. Default: one segment.

  Returns:
    ``[batch, q_length, heads, head_dim_v]`` in the query's dtype. Equal (to float rounding) to
    ``dot_product_attention`` with the mask ``make_attention_mask(query_valid, key_valid)`` (and causal,
    ``make_local_mask`` and ``make_segment_mask``). Blocks outside the window are computed and masked, not
    skipped.
  """
  check_attention_inputs(query, key, value)
  batch, q_length = query.shape[:2]
  kv_length = key.shape[1]
  _check_sizes(batch, q_length, kv_length, query_chunk_size, key_chunk_size, window,
               query_valid=query_valid, key_valid=key_valid, query_segments=query_segments, key_segments=key_segments)
  if query_valid is None:
    query_valid = jnp.ones((batch, q_length), bool)
  if key_valid is None:
    key_valid = jnp.ones((batch, kv_length), bool)
  query_ids, key_ids = _position_ids(query_valid, query_segments), _position_ids(key_valid, key_segments)
  key_valid = key_ids > 0
  # Grouped-query keys and values repeated per query head: the blocks' einsums and the custom VJP see equal
  # head counts, and the repeat's gradient (a sum over each group) comes from autodiff.
  key, value = repeat_kv_heads(key, query.shape[2]), repeat_kv_heads(value, query.shape[2])
  # Invalid keys and values set to 0: a weight of exactly 0 times a NaN there would still reach the output.
  key = jnp.where(key_valid[:, :, None, None], key, jnp.zeros((), key.dtype))
  value = jnp.where(key_valid[:, :, None, None], value, jnp.zeros((), value.dtype))
  if scale is True:
    scale = query.shape[-1] ** -0.5
  elif scale is False:
    scale = 1.0
  query_chunk_size = min(int(query_chunk_size), q_length)
  key_chunk_size = min(int(key_chunk_size), kv_length)
  return _chunked_attention(query, key, value, query_ids, key_ids, causal, None if window is None else int(window),
                            float(scale), query_chunk_size, key_chunk_size, kernels or REFERENCE)


def _check_sizes(batch, q_length, kv_length, query_chunk_size, key_chunk_size, window, **per_position) -> None:
  """A ValueError naming the first bad size: no query or key, a block size or window that is no positive
  integer, or a per-position mask (``query_valid``, ``key_segments``, ...) not ``[batch, its length]``."""
  if not q_length or not kv_length:
    raise ValueError(f"chunked attention needs at least one query and one key, got q_length={q_length} and "
                     f"kv_length={kv_length}")
  for name, size in (("query_chunk_size", query_chunk_size), ("key_chunk_size", key_chunk_size)):
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
      raise ValueError(f"{name} must be a positive integer, got {size!r}")
  for name, values in per_position.items():
    check_per_position(name, values, batch, q_length if name.startswith("query") else kv_length)
  if window is not None and (isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window < 1):
    raise ValueError(f"window must be a positive integer or None, got {window!r}")


def _position_ids(valid, segments):
  """One int32 id per position ``[batch, length]``: 0 where invalid, else the segment id + 1 (1 without
  segments), so that two positions may attend to each other exactly where their ids are equal and non-zero."""
  ids = jnp.ones(jnp.shape(valid), jnp.int32) if segments is None else jnp.asarray(segments, jnp.int32) + 1
  return jnp.where(jnp.asarray(valid, bool), ids, 0)


def _split_blocks(x, chunk_size):
  """``[batch, length, ...]`` -> ``[num_blocks, batch, chunk_size, ...]``, zero-padded at the end."""
  length = x.shape[1]
  num_blocks = math.ceil(length / chunk_size)
  padding = [(0, 0)] * x.ndim
  padding[1] = (0, num_blocks * chunk_size - length)
  x = jnp.pad(x, padding)
  x = x.reshape(x.shape[0], num_blocks, chunk_size, *x.shape[2:])
  return jnp.moveaxis(x, 1, 0)


def _merge_blocks(x, length):
  """Inverse of ``_split_blocks``: ``[num_blocks, batch, chunk, ...]`` -> ``[batch, length, ...]``."""
  x = jnp.moveaxis(x, 0, 1)
  x = x.reshape(x.shape[0], -1, *x.shape[3:])
  return x[:, :length]


def _block_positions(length, chunk_size):
  return jnp.arange(math.ceil(length / chunk_size) * chunk_size).reshape(-1, chunk_size)


def _block_mask(query_ids, key_ids, query_position, key_position, causal, window):
  """``[batch, 1, q_chunk, k_chunk]`` bool mask of one (query block, key block) pair, from the blocks'
  ``_position_ids``."""
  mask = (query_ids[:, None, :, None] == key_ids[:, None, None, :]) & (query_ids[:, None, :, None] > 0)
  if causal:
    mask = mask & (key_position[None, None, None, :] <= query_position[None, None, :, None])
  if window is not None:
    distance = query_position[None, None, :, None] - key_position[None, None, None, :]
    mask = mask & (jnp.abs(distance) < window)
  return mask


def _block_probabilities(query, key, mask, log_normaliser, scale, kernels):
  """Softmax weights of one block from the saved log-sum-exp: ``[batch, heads, q_chunk, k_chunk]``."""
  logits = dot_product_scores(query, key, scale=scale, kernels=kernels)
  return jnp.where(mask, jnp.exp(logits - log_normaliser[..., None]), 0.0)


def _forward(query, key, value, query_valid, key_valid, causal, window, scale, query_chunk_size, key_chunk_size,
             kernels):
  q_length, kv_length = query.shape[1], key.shape[1]
  key_blocks = (_split_blocks(key, key_chunk_size), _split_blocks(value, key_chunk_size),
                _split_blocks(key_valid, key_chunk_size), _block_positions(kv_length, key_chunk_size))

  def one_query_block(query_block_inputs):
    query_block, query_valid_block, query_position = query_block_inputs
    batch, chunk, heads, _ = query_block.shape

    def one_key_block(carry, key_block_inputs):
      accumulator, running_max, running_sum = carry
      key_block, value_block, key_valid_block, key_position = key_block_inputs
      mask = _block_mask(query_valid_block, key_valid_block, query_position, key_position, causal, window)
      logits = jnp.where(mask, dot_product_scores(query_block, key_block, scale=scale, kernels=kernels),
                         MASK_VALUE)
      new_max = jnp.maximum(running_max, jnp.max(logits, axis=-1))  # [batch, heads, q_chunk]
      correction = jnp.exp(running_max - new_max)
      probabilities = jnp.where(mask, jnp.exp(logits - new_max[..., None]), 0.0)
      running_sum = running_sum * correction + jnp.sum(probabilities, axis=-1)
      # [batch, q_chunk, heads, head_dim_v]
      accumulator = (accumulator * jnp.swapaxes(correction, 1, 2)[..., None]
                     + jnp.einsum("bhqk,bkhd->bqhd", probabilities, value_block.astype(jnp.float32)))
      return (accumulator, new_max, running_sum), None

    initial = (jnp.zeros((batch, chunk, heads, value.shape[-1]), jnp.float32),
               jnp.full((batch, heads, chunk), MASK_VALUE, jnp.float32),
               jnp.zeros((batch, heads, chunk), jnp.float32))
    (accumulator, running_max, running_sum), _ = jax.lax.scan(one_key_block, initial, key_blocks)
    has_keys = running_sum > 0
    normaliser = jnp.where(has_keys, running_sum, 1.0)
    output = accumulator / jnp.swapaxes(normaliser, 1, 2)[..., None]
    log_normaliser = jnp.where(has_keys, running_max + jnp.log(normaliser), 0.0)
    return output, log_normaliser

  outputs, log_normalisers = jax.lax.map(one_query_block, (
      _split_blocks(query, query_chunk_size), _split_blocks(query_valid, query_chunk_size),
      _block_positions(q_length, query_chunk_size)))
  output = _merge_blocks(outputs, q_length).astype(query.dtype)
  # [num_q_blocks, batch, heads, q_chunk] -> [batch, heads, q_length]
  log_normaliser = jnp.moveaxis(log_normalisers, 0, 2).reshape(query.shape[0], query.shape[2], -1)
  return output, log_normaliser[:, :, :q_length]


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7, 8, 9, 10))
def _chunked_attention(query, key, value, query_valid, key_valid, causal, window, scale, query_chunk_size,
                       key_chunk_size, kernels):
  output, _ = _forward(query, key, value, query_valid, key_valid, causal, window, scale, query_chunk_size,
                       key_chunk_size, kernels)
  return output


def _chunked_attention_fwd(query, key, value, query_valid, key_valid, causal, window, scale, query_chunk_size,
                           key_chunk_size, kernels):
  output, log_normaliser = _forward(query, key, value, query_valid, key_valid, causal, window, scale,
                                    query_chunk_size, key_chunk_size, kernels)
  return output, (query, key, value, query_valid, key_valid, output, log_normaliser)


def _chunked_attention_bwd(causal, window, scale, query_chunk_size, key_chunk_size, kernels, residuals,
                           output_cotangent):
  query, key, value, query_valid, key_valid, output, log_normaliser = residuals
  q_length, kv_length = query.shape[1], key.shape[1]
  output_cotangent = output_cotangent.astype(jnp.float32)
  # D_i = sum_d dO_i * O_i, the softmax-gradient correction term (Dao et al. 2022, alg. 2). [batch, heads, q]
  correction = jnp.einsum("bqhd,bqhd->bhq", output_cotangent, output.astype(jnp.float32))

  def split_query_side(x, axis_is_length_last=False):
    if axis_is_length_last:  # [batch, heads, q] -> [num_blocks, batch, heads, chunk]
      return jnp.moveaxis(_split_blocks(jnp.swapaxes(x, 1, 2), query_chunk_size), 3, 2)
    return _split_blocks(x, query_chunk_size)

  query_blocks = (split_query_side(query), split_query_side(query_valid),
                  _block_positions(q_length, query_chunk_size), split_query_side(output_cotangent),
                  split_query_side(log_normaliser, True), split_query_side(correction, True))
  key_blocks = (_split_blocks(key, key_chunk_size), _split_blocks(value, key_chunk_size),
                _split_blocks(key_valid, key_chunk_size), _block_positions(kv_length, key_chunk_size))

  def block_gradients(query_block_inputs, key_block_inputs):
    """Probabilities and logit cotangents of one (query block, key block) pair."""
    query_block, query_valid_block, query_position, d_output, log_norm, corr = query_block_inputs
    key_block, value_block, key_valid_block, key_position = key_block_inputs
    mask = _block_mask(query_valid_block, key_valid_block, query_position, key_position, causal, window)
    probabilities = _block_probabilities(query_block, key_block, mask, log_norm, scale, kernels)
    d_probabilities = jnp.einsum("bqhd,bkhd->bhqk", d_output, value_block.astype(jnp.float32))
    d_logits = probabilities * (d_probabilities - corr[..., None])
    return probabilities, d_logits

  def query_gradient(query_block_inputs):
    def one_key_block(d_query, key_block_inputs):
      _, d_logits = block_gradients(query_block_inputs, key_block_inputs)
      d_query = d_query + scale * jnp.einsum("bhqk,bkhd->bqhd", d_logits,
                                             key_block_inputs[0].astype(jnp.float32))
      return d_query, None
    d_query, _ = jax.lax.scan(one_key_block, jnp.zeros(query_block_inputs[0].shape, jnp.float32), key_blocks)
    return d_query

  def key_value_gradient(key_block_inputs):
    def one_query_block(carry, query_block_inputs):
      d_key, d_value = carry
      probabilities, d_logits = block_gradients(query_block_inputs, key_block_inputs)
      d_value = d_value + jnp.einsum("bhqk,bqhd->bkhd", probabilities, query_block_inputs[3])
      d_key = d_key + scale * jnp.einsum("bhqk,bqhd->bkhd", d_logits,
                                         query_block_inputs[0].astype(jnp.float32))
      return (d_key, d_value), None
    initial = (jnp.zeros(key_block_inputs[0].shape, jnp.float32),
               jnp.zeros(key_block_inputs[1].shape, jnp.float32))
    (d_key, d_value), _ = jax.lax.scan(one_query_block, initial, query_blocks)
    return d_key, d_value

  d_query = _merge_blocks(jax.lax.map(query_gradient, query_blocks), q_length)
  d_key, d_value = jax.lax.map(key_value_gradient, key_blocks)
  d_key, d_value = _merge_blocks(d_key, kv_length), _merge_blocks(d_value, kv_length)
  return (d_query.astype(query.dtype), d_key.astype(key.dtype), d_value.astype(value.dtype), None, None)


_chunked_attention.defvjp(_chunked_attention_fwd, _chunked_attention_bwd)
