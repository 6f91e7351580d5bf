"""Masks: hand-made examples of padding, causal (with offset) and combined masks."""
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
