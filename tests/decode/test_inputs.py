"""What every search does with inputs outside the normal: logits that are no distribution (NaN), a batch of 0,
special ids outside the vocabulary. Greedy search, sampling and beam search agree on each."""
import jax
import numpy as np
import pytest

from tests.decode import BOS, EOS, PAD, markov_cache, markov_step_fn
from transformer.decode import (DecodeSettings, beam_search, check_scores_finite, greedy_search, non_finite_rows,
                                sample, search)

VOCAB, MAX_LENGTH = 5, 4
BROKEN_TOKEN = 3  # the order-2 chain below gives NaN logits after BOS, 3


def _chain_with_nan_after_token_3():
  """Order-2 chain (``table[before_previous, previous]``): context 0 emits 3 (then NaN logits), context 1 emits
  EOS (then NaN logits too, which a finished row must ignore), context 2 emits 4s; every other step is well
  defined."""
  table = np.full((VOCAB, VOCAB, VOCAB), -30.0, np.float32)
  table[..., 4] = 0.0  # by default token 4: sequences run to max_length
  table[0, BOS] = -30.0
  table[0, BOS, BROKEN_TOKEN] = 0.0
  table[1, BOS] = -30.0
  table[1, BOS, EOS] = 0.0
  table[1:, BOS, BROKEN_TOKEN] = -40.0  # below the other unlikely starts: no beam of rows 1, 2 begins with 3
  table[BOS, BROKEN_TOKEN, BOS] = np.nan  # one NaN logit, which argmax and top_k would pick as the largest
  table[BOS, EOS] = np.nan
  return table


def _run(method, table, context, **kwargs):
  step_fn, cache, batch = markov_step_fn(table), markov_cache(context), len(context)
  if method == "greedy":
    tokens, scores = greedy_search(step_fn, cache, batch, MAX_LENGTH, BOS, EOS, PAD, **kwargs)
  elif method == "sample":
    tokens, scores = sample(step_fn, cache, batch, MAX_LENGTH, BOS, EOS, PAD, rng=jax.random.key(0), **kwargs)
    tokens, scores = tokens[:, 0], scores[:, 0]
  else:
    tokens, scores = beam_search(step_fn, cache, batch, 2, MAX_LENGTH, BOS, EOS, PAD, length_penalty=0.0, **kwargs)
  return np.asarray(tokens), np.asarray(scores)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["greedy", "sample", "beam"])
def test_nan_logits_end_the_row_with_a_nan_score_in_every_search(method):
  tokens, scores = _run(method, _chain_with_nan_after_token_3(), np.array([0, 1, 2]))
  # Row 0 met NaN logits after emitting 3: no token there, padding after, score NaN (ranked first in beams).
  np.testing.assert_array_equal(tokens[0], [BROKEN_TOKEN, PAD, PAD, PAD])
  assert np.isnan(scores[0])
  # Row 1 ended with EOS before its NaN logits, row 2 never met any: both finite, as without NaN.
  np.testing.assert_array_equal(tokens[1:], [[EOS, PAD, PAD, PAD], [4, 4, 4, 4]])
  assert np.all(np.isfinite(scores[1:])) and scores[1] == pytest.approx(0.0, abs=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["greedy", "sample", "beam"])
def test_nan_logits_at_the_first_step_give_padding_and_nan(method):
  tokens, scores = _run(method, np.full((VOCAB, VOCAB), np.nan, np.float32), np.zeros(2, np.int32))
  np.testing.assert_array_equal(tokens, np.full((2, MAX_LENGTH), PAD))
  assert np.all(np.isnan(scores))


def test_a_broken_beam_ranks_first_and_the_others_are_kept():
  """Beam 3 over context 0: the likeliest start (3) meets NaN and ranks first with NaN; the other beams, which
  never met it, keep finite scores."""
  table = _chain_with_nan_after_token_3()
  table[0, BOS, 4] = -1.0  # a second start, 4, likely enough to stay in the beam
  sequences, scores = beam_search(markov_step_fn(table), markov_cache(np.array([0])), 1, 3, MAX_LENGTH, BOS, EOS,
                                  PAD, length_penalty=0.0, return_all_beams=True)
  sequences, scores = np.asarray(sequences)[0], np.asarray(scores)[0]
  np.testing.assert_array_equal(sequences[0], [BROKEN_TOKEN, PAD, PAD, PAD])
  assert np.isnan(scores[0]) and np.all(np.isfinite(scores[1:]))
  np.testing.assert_array_equal(sequences[1], [4, 4, 4, 4])


@pytest.mark.slow
def test_search_ranks_nan_samples_first_and_check_scores_finite_names_the_rows():
  table = np.full((VOCAB, VOCAB), -30.0, np.float32)
  table[BOS, BROKEN_TOKEN] = table[BOS, 4] = 0.0  # a fair coin between 3 (then NaN) and 4 (then on)
  table[4, 4] = 0.0
  table[BROKEN_TOKEN] = np.nan
  context = np.zeros(8, np.int32)
  _, scores = search(DecodeSettings("sample", num_samples=3, seed=1), markov_step_fn(table), markov_cache(context),
                     len(context), MAX_LENGTH, BOS, EOS, PAD)
  broken = np.isnan(np.asarray(scores))
  assert np.any(broken.any(1) & ~broken.all(1)), "no example mixes NaN and finite samples: pick another seed"
  # Within every example the NaN samples come first: a failing model is not hidden behind a good sample.
  assert np.all(np.diff(broken.astype(int), axis=1) <= 0)
  with pytest.raises(FloatingPointError, match=rf"NaN or infinite for {broken.any(1).sum()} of 8 examples \(rows "
                     + ", ".join(map(str, np.flatnonzero(broken.any(1))))):
    check_scores_finite(scores)
  check_scores_finite(np.array([[-1.0, -np.inf]]))  # -inf marks an empty beam slot, not a failure


def test_non_finite_rows_are_nan_inf_or_all_minus_inf_logits():
  logits = np.array([[0.0, 1.0], [np.nan, 1.0], [np.inf, 1.0], [-np.inf, -np.inf], [-np.inf, 1.0]], np.float32)
  np.testing.assert_array_equal(non_finite_rows(jax.nn.log_softmax(logits)), [False, True, True, True, False])


@pytest.mark.parametrize("method", ["greedy", "sample", "beam"])
def test_a_batch_of_zero_gives_empty_arrays_of_the_right_shapes(method):
  table = np.zeros((VOCAB, VOCAB), np.float32)
  tokens, scores = _run(method, table, np.zeros(0, np.int32))
  assert tokens.shape == (0, MAX_LENGTH) and scores.shape == (0,)
  settings = DecodeSettings(method, beam_size=2, num_samples=2)
  tokens, scores = search(settings, markov_step_fn(table), markov_cache(np.zeros(0, np.int32)), 0, MAX_LENGTH, BOS,
                          EOS, PAD)
  assert tokens.shape == (0, settings.copies, MAX_LENGTH) and scores.shape == (0, settings.copies)


@pytest.mark.parametrize("method", ["greedy", "sample", "beam"])
@pytest.mark.parametrize("name, value", [("eos_id", VOCAB), ("eos_id", -2), ("bos_id", -1), ("pad_id", VOCAB + 4)])
def test_special_ids_outside_the_vocabulary_are_named(method, name, value):
  ids = {"bos_id": BOS, "eos_id": EOS, "pad_id": PAD, name: value}
  table = np.zeros((VOCAB, VOCAB), np.float32)
  step_fn, cache = markov_step_fn(table), markov_cache(np.zeros(1, np.int32))
  with pytest.raises(ValueError, match=rf"{name}={value} is outside the vocabulary \[0, {VOCAB}\)"):
    if method == "beam":
      beam_search(step_fn, cache, 1, 2, MAX_LENGTH, **ids)
    else:
      sample(step_fn, cache, 1, MAX_LENGTH, **ids, rng=jax.random.key(0),
             temperature=0.0 if method == "greedy" else 1.0)


@pytest.mark.parametrize("max_length", [0, -1, 2.5, True])
def test_a_max_length_below_one_or_not_an_integer_is_named_by_every_search(max_length):
  step_fn, cache = markov_step_fn(np.zeros((VOCAB, VOCAB), np.float32)), markov_cache(np.zeros(2, np.int32))
  calls = {
      "greedy": lambda: greedy_search(step_fn, cache, 2, max_length, BOS, EOS, PAD),
      "sample": lambda: sample(step_fn, cache, 2, max_length, BOS, EOS, PAD, rng=jax.random.key(0)),
      "beam": lambda: beam_search(step_fn, cache, 2, 2, max_length, BOS, EOS, PAD),
      "search": lambda: search(DecodeSettings("beam", beam_size=2), step_fn, cache, 2, max_length, BOS, EOS, PAD),
  }
  for method, call in calls.items():
    with pytest.raises(ValueError, match=rf"max_length must be an integer >= 1 \(tokens to generate at most\), "
                                         rf"got {max_length!r}"):
      call()


@pytest.mark.parametrize("method", ["greedy", "beam"])
def test_a_symbolic_max_length_exports_one_search_for_every_length(method):
  """``jax.export`` with ``max_length`` a symbolic dimension (here an input's length), as
  ``python -m transformer.export`` decodes: one artifact runs every length as the concrete search does."""
  table = np.asarray(jax.random.normal(jax.random.key(3), (VOCAB, VOCAB)), np.float32)
  step_fn = markov_step_fn(table)
  settings = DecodeSettings(method, beam_size=2)

  def decode(room, max_length):  # room: int32 [2, max_length], only its shape is read
    return search(settings, step_fn, markov_cache(np.zeros(2, np.int32)), 2, max_length, BOS, EOS, PAD)

  (length,) = jax.export.symbolic_shape("length", constraints=("length >= 2",))  # greedy scans length - 1 steps
  exported = jax.export.export(jax.jit(lambda room: decode(room, room.shape[1])))(
      jax.ShapeDtypeStruct((2, length), np.int32))
  for max_length in (2, 3, 7):
    tokens, scores = exported.call(np.zeros((2, max_length), np.int32))
    expected_tokens, expected_scores = decode(None, max_length)
    assert tokens.shape == (2, settings.copies, max_length)
    np.testing.assert_array_equal(tokens, expected_tokens)
    np.testing.assert_allclose(scores, expected_scores, rtol=1e-6)
