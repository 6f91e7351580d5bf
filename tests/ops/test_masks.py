"""Masks: hand-made examples of padding, causal (with offset) and combined masks."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer import ops


def test_attention_mask_is_outer_and_of_validities():
  query_valid = np.array([[1, 1, 0]], bool)
  key_valid = np.array([[1, 0, 1, 1]], bool)
  mask = np.asarray(ops.make_attention_mask(query_valid, key_valid))
  expected = np.array([[1, 0, 1, 1], [1, 0, 1, 1], [0, 0, 0, 0]], bool)
  assert mask.shape == (1, 1, 3, 4)
  np.testing.assert_array_equal(mask[0, 0], expected)


def test_padding_mask_hides_pad_id_on_both_sides():
  query_tokens = np.array([[5, 6, 0]])
  key_tokens = np.array([[7, 0]])
  np.testing.assert_array_equal(ops.make_padding_mask(query_tokens, key_tokens)[0, 0],
                                [[True, False], [True, False], [False, False]])
  # Self attention by default, and a non-zero pad id.
  np.testing.assert_array_equal(ops.make_padding_mask(np.array([[3, 9, 9]]), pad_id=9)[0, 0],
                                [[True, False, False], [False, False, False], [False, False, False]])


def test_causal_mask_is_lower_triangular_with_offset():
  np.testing.assert_array_equal(ops.make_causal_mask(3)[0, 0], np.tril(np.ones((3, 3), bool)))
  # Rectangular: query i sees keys j <= i (aligned at the first key, as jax.nn).
  np.testing.assert_array_equal(ops.make_causal_mask(2, 4)[0, 0], [[1, 0, 0, 0], [1, 1, 0, 0]])
  # Offset: a single query at position 2 of the keys (cached decoding) sees keys 0..2.
  np.testing.assert_array_equal(ops.make_causal_mask(1, 5, offset=2)[0, 0], [[1, 1, 1, 0, 0]])


def test_combine_masks_is_logical_and_and_ignores_none():
  padding = ops.make_attention_mask(np.array([[1, 1, 1]], bool), np.array([[1, 1, 0]], bool))
  causal = ops.make_causal_mask(3)
  combined = np.asarray(ops.combine_masks(padding, None, causal))
  np.testing.assert_array_equal(combined[0, 0], [[1, 0, 0], [1, 1, 0], [1, 1, 0]])
  assert ops.combine_masks(None, None) is None
  np.testing.assert_array_equal(ops.combine_masks(None, causal), causal)


def test_combine_masks_rejects_different_ranks():
  with pytest.raises(ValueError, match="same rank"):
    ops.combine_masks(np.ones((1, 1, 2, 2), bool), np.ones((2, 2), bool))


def test_local_mask_is_a_band_and_with_causal_a_sliding_window():
  # |i - j| < 2: the diagonal and one key on each side.
  band = np.asarray(ops.make_local_mask(4, 2)[0, 0])
  np.testing.assert_array_equal(band, np.tril(np.triu(np.ones((4, 4), bool), -1), 1))
  # With causal masking: query i sees keys i - 2 .. i (a window of 3), as Mistral's sliding window.
  window = np.asarray(ops.combine_masks(ops.make_causal_mask(5), ops.make_local_mask(5, 3))[0, 0])
  np.testing.assert_array_equal(window[4], [0, 0, 1, 1, 1])
  np.testing.assert_array_equal(window.sum(-1), [1, 2, 3, 3, 3])
  # Offset: one query at position 3 of 6 keys (cached decoding), window 2 -> keys 2..4, 4 hidden by causal.
  np.testing.assert_array_equal(ops.make_local_mask(1, 2, 6, offset=3)[0, 0], [[0, 0, 1, 1, 1, 0]])
  with pytest.raises(ValueError, match="positive"):
    ops.make_local_mask(3, 0)


def test_a_negative_length_is_named_not_made_an_empty_mask():
  """``jnp.arange(-3)`` is empty: without the check a typo'd length gave a mask of no positions, silently."""
  with pytest.raises(ValueError, match="length is a number of positions, >= 0; got -3"):
    ops.make_causal_mask(-3)
  with pytest.raises(ValueError, match="kv_length is a number of positions, >= 0; got -1"):
    ops.make_causal_mask(2, -1)
  with pytest.raises(ValueError, match="length is a number of positions, >= 0; got -2"):
    ops.make_local_mask(-2, 2)
  assert ops.make_causal_mask(0).shape == (1, 1, 0, 0)  # no positions: empty, as it should be


def test_a_traced_length_is_refused_by_name_and_a_static_one_taken():
  """The mask's shape is its length: under jit a traced length failed inside jnp.arange (or a tracer-bool
  error) without saying that the length must be static."""
  with pytest.raises(ValueError, match="length must be a static int .* got a traced value"):
    jax.jit(ops.make_causal_mask)(3)
  with pytest.raises(ValueError, match="kv_length must be a static int .* got a traced value"):
    jax.jit(lambda kv_length: ops.make_causal_mask(2, kv_length))(3)
  with pytest.raises(ValueError, match=r"length must be a static int number of positions, got 3.0 \(float\)"):
    ops.make_causal_mask(3.0)
  # Static lengths, and a traced offset (cached decoding), are fine under jit.
  static = jax.jit(ops.make_causal_mask, static_argnums=(0, 1))(2, 4)
  np.testing.assert_array_equal(static[0, 0], [[1, 0, 0, 0], [1, 1, 0, 0]])
  shifted = jax.jit(lambda offset: ops.make_causal_mask(1, 4, offset))(jnp.int32(2))
  np.testing.assert_array_equal(shifted[0, 0], [[1, 1, 1, 0]])
  np.testing.assert_array_equal(ops.make_causal_mask(np.int64(2)), ops.make_causal_mask(2))


def test_a_symbolic_length_of_jax_export_is_static_and_taken():
  """``jax.export``'s symbolic dimensions are static shapes: a model exported for any length builds its causal
  mask from them (they were refused with the traced lengths)."""
  def masked_scores(x):  # [batch, length]
    mask = ops.make_causal_mask(x.shape[1])
    ops.masks.check_mask_shape("mask", mask.shape, (x.shape[0], 1, x.shape[1], x.shape[1]))
    return jnp.where(mask[0, 0], x[:, :, None], 0.0)
  exported = jax.export.export(jax.jit(masked_scores))(
      jax.ShapeDtypeStruct(jax.export.symbolic_shape("batch, length"), jnp.float32))
  for length in (2, 5):
    x = np.arange(3 * length, dtype=np.float32).reshape(3, length)
    np.testing.assert_array_equal(exported.call(x), masked_scores(x))
