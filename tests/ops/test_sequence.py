"""shift_right: decoder inputs for teacher forcing."""
import numpy as np

from transformer import ops


def test_shift_right_prepends_bos_and_drops_last():
  tokens = np.array([[5, 6, 7, 8], [9, 4, 0, 0]], np.int32)
  shifted = ops.shift_right(tokens, bos_id=1)
  np.testing.assert_array_equal(shifted, [[1, 5, 6, 7], [1, 9, 4, 0]])
  assert shifted.dtype == tokens.dtype and shifted.shape == tokens.shape


def test_shift_right_along_another_axis():
  tokens = np.array([[5, 6], [7, 8], [9, 3]], np.int32)  # time on axis 0
  np.testing.assert_array_equal(ops.shift_right(tokens, bos_id=2, axis=0), [[2, 2], [5, 6], [7, 8]])
