"""Positional encodings: the paper's sinusoid formula, its linear-shift property, and rotary's relativity; shift_right
(decoder inputs for teacher forcing; segment positions in tests/nn/test_packing.py)."""
import jax.numpy as jnp
import numpy as np
import pytest

from transformer import ops


def _numpy_sinusoid(length, d_model):
  """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d)) (Vaswani et al. 3.5)."""
  encoding = np.zeros((length, d_model))
  for pos in range(length):
    for i in range((d_model + 1) // 2):
      angle = pos / 10000 ** (2 * i / d_model)
      encoding[pos, 2 * i] = np.sin(angle)
      if 2 * i + 1 < d_model:
        encoding[pos, 2 * i + 1] = np.cos(angle)
  return encoding


@pytest.mark.parametrize("d_model", [16, 7])
def test_sinusoidal_encoding_is_the_paper_formula(d_model):
  encoding = ops.sinusoidal_position_encoding(50, d_model)
  assert encoding.shape == (50, d_model) and encoding.dtype == jnp.float32
  np.testing.assert_allclose(encoding, _numpy_sinusoid(50, d_model), atol=1e-5)


def test_sinusoidal_encoding_of_arbitrary_position_arrays():
  positions = np.array([[3, 0, 7], [1, 1, 2]])
  encoding = ops.sinusoidal_position_encoding(positions, 8)
  assert encoding.shape == (2, 3, 8)
  np.testing.assert_allclose(encoding, _numpy_sinusoid(8, 8)[positions], atol=1e-6)


def test_an_int_means_the_positions_below_it_and_ambiguous_scalars_are_refused():
  """``positions=n`` (a Python int) is ``range(n)``, as every caller of a sequence's length uses it; a 0-d
  array is one position. A numpy integer, bool, float or negative int reads as either: refused by name."""
  np.testing.assert_array_equal(ops.sinusoidal_position_encoding(4, 6), ops.sinusoidal_position_encoding(np.arange(4), 6))
  assert ops.sinusoidal_position_encoding(0, 6).shape == (0, 6)
  np.testing.assert_allclose(ops.sinusoidal_position_encoding(jnp.asarray(4), 6), _numpy_sinusoid(5, 6)[4], atol=1e-6)
  np.testing.assert_allclose(ops.sinusoidal_position_encoding([3, 0], 6), _numpy_sinusoid(4, 6)[[3, 0]], atol=1e-6)
  for positions, shown in ((np.int64(4), r"np.int64\(4\) \(int64\)"), (True, r"True \(bool\)"),
                           (4.0, r"4.0 \(float\)"), (np.arange(4.0), r"an array of float32 and shape \(4,\)")):
    with pytest.raises(ValueError, match=rf"positions must be an int .* got {shown}; pass int\(n\)"):
      ops.sinusoidal_position_encoding(positions, 6)
  with pytest.raises(ValueError, match="positions=-3: an int is a number of positions"):
    ops.sinusoidal_position_encoding(-3, 6)


def _shift_matrix(k, d_model):
  """Block-diagonal M_k with blocks [[cos(k w_i), sin(k w_i)], [-sin(k w_i), cos(k w_i)]] on (sin, cos) pairs."""
  matrix = np.zeros((d_model, d_model))
  for i in range(d_model // 2):
    w = 1.0 / 10000 ** (2 * i / d_model)
    matrix[2 * i:2 * i + 2, 2 * i:2 * i + 2] = [[np.cos(k * w), np.sin(k * w)], [-np.sin(k * w), np.cos(k * w)]]
  return matrix


@pytest.mark.parametrize("k", [1, 3, 17])
def test_sinusoidal_shift_is_a_fixed_linear_map(k):
  d_model = 16
  encoding = np.asarray(ops.sinusoidal_position_encoding(41 + k, d_model), np.float64)
  shift = _shift_matrix(k, d_model)
  # PE(pos + k) = M_k PE(pos) for every pos, with M_k independent of pos.
  shifted = encoding[:40] @ shift.T
  np.testing.assert_allclose(shifted, encoding[k:40 + k], atol=2e-5)
  # The map is specific to k: M_k does not move PE(pos) to PE(pos + k + 1).
  assert np.abs(shifted - encoding[k + 1:41 + k]).max() > 0.1


def _numpy_rotary(x, positions):
  """Rotate each pair (i, i + d/2) by position * 10000^(-2i/d) with an explicit 2x2 matrix."""
  x = np.asarray(x, np.float64)
  out = np.empty_like(x)
  half = x.shape[-1] // 2
  for b in range(x.shape[0]):
    for t in range(x.shape[1]):
      for i in range(half):
        angle = positions[t] / 10000 ** (2 * i / x.shape[-1])
        rotation = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
        pair = np.stack([x[b, t, :, i], x[b, t, :, i + half]], axis=0)  # [2, heads]
        out[b, t, :, i], out[b, t, :, i + half] = rotation @ pair
  return out


def test_rotary_matches_explicit_rotations():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(2, 5, 3, 8)).astype(np.float32)
  positions = np.array([0, 1, 2, 9, 30])
  np.testing.assert_allclose(ops.apply_rotary_embedding(x, positions), _numpy_rotary(x, positions), atol=1e-5)
  # Per-batch positions give the same as the shared ones; position 0 is the identity.
  batched = ops.apply_rotary_embedding(x, np.broadcast_to(positions, (2, 5)))
  np.testing.assert_allclose(batched, _numpy_rotary(x, positions), atol=1e-5)
  np.testing.assert_allclose(ops.apply_rotary_embedding(x, np.zeros(5, int)), x, atol=0)


def test_rotary_dot_product_depends_only_on_relative_position():
  rng = np.random.default_rng(1)
  query = rng.normal(size=(1, 1, 1, 16)).astype(np.float32)
  key = rng.normal(size=(1, 1, 1, 16)).astype(np.float32)

  def score(m, n):
    rotated_query = ops.apply_rotary_embedding(query, np.array([m]))
    rotated_key = ops.apply_rotary_embedding(key, np.array([n]))
    return float(jnp.sum(rotated_query * rotated_key))

  for offset in (0, 3, -5):
    scores = [score(n + offset, n) for n in (0, 7, 20, 41) if n + offset >= 0]
    np.testing.assert_allclose(scores, scores[0], atol=1e-4)
  # ...and it does depend on the offset (the check above could fail).
  assert abs(score(3, 0) - score(0, 0)) > 1e-2
  assert abs(score(3, 0) - score(0, 3)) > 1e-2


def test_rotary_rejects_odd_head_dim():
  with pytest.raises(ValueError, match="even head_dim"):
    ops.apply_rotary_embedding(np.ones((1, 2, 1, 5), np.float32), np.arange(2))


def test_scale_embeddings_multiplies_by_sqrt_d_model():
  x = jnp.ones((1, 2, 16), jnp.bfloat16)
  y = ops.scale_embeddings(x, 16)
  assert y.dtype == jnp.bfloat16
  np.testing.assert_array_equal(np.asarray(y, np.float32), 4.0)


def test_shift_right_prepends_bos_and_drops_last():
  tokens = np.array([[5, 6, 7, 8], [9, 4, 0, 0]], np.int32)
  shifted = ops.shift_right(tokens, bos_id=1)
  np.testing.assert_array_equal(shifted, [[1, 5, 6, 7], [1, 9, 4, 0]])
  assert shifted.dtype == tokens.dtype and shifted.shape == tokens.shape


def test_shift_right_along_another_axis():
  tokens = np.array([[5, 6], [7, 8], [9, 3]], np.int32)  # time on axis 0
  np.testing.assert_array_equal(ops.shift_right(tokens, bos_id=2, axis=0), [[2, 2], [5, 6], [7, 8]])
