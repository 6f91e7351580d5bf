"""Beam search: finds what greedy misses on a hand-made chain, equals exhaustive search when wide, equals
greedy with one beam, handles EOS, and scores a real cached EncoderDecoder as a teacher-forced pass does."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.decode import BOS, EOS, PAD, exhaustive_search, gnmt_penalty, markov_cache, markov_step_fn, normalize
from transformer import ops
from transformer.decode import (beam_search, expand_to_beams, flatten_beams, gather_beams, greedy_search,
                                unflatten_beams)
from transformer.nn import EncoderDecoder, ModelConfig
from transformer.tasks.decoding import beam_decode, greedy_decode


@functools.partial(jax.jit, static_argnames=("beam_size", "max_length", "pad_id"))
def _beam(log_probs, context, length_penalty, *, beam_size, max_length, pad_id=PAD):
  """All beams of a Markov chain: ``([batch, beam, max_length], [batch, beam])``; alpha is traced, so
  changing it does not recompile."""
  return beam_search(markov_step_fn(log_probs), markov_cache(context), context.shape[0], beam_size, max_length,
                     BOS, EOS, pad_id, length_penalty, return_all_beams=True)


def _assert_pad_after_eos(sequences, pad_id=PAD):
  """Each hypothesis holds at most one EOS, and only pad_id after it."""
  for tokens in np.asarray(sequences).reshape(-1, sequences.shape[-1]):
    eos_positions = np.flatnonzero(tokens == EOS)
    if eos_positions.size:
      assert np.all(tokens[eos_positions[0] + 1:] == pad_id), tokens


def test_beam_helpers_follow_the_batch_major_layout():
  x = jnp.arange(2 * 3 * 4).reshape(2, 3, 4)  # [batch, beam, feature]
  np.testing.assert_array_equal(unflatten_beams(flatten_beams(x), 3), x)
  np.testing.assert_array_equal(flatten_beams(x)[1 * 3 + 2], x[1, 2])
  np.testing.assert_array_equal(unflatten_beams(expand_to_beams(x[:, 0], 3), 3), np.repeat(x[:, :1], 3, axis=1))
  indices = jnp.array([[2, 2, 0, 1], [1, 0, 0, 2]])
  np.testing.assert_array_equal(gather_beams(x, indices), np.asarray(x)[np.arange(2)[:, None], indices])


# pad 0, bos 1, eos 2, a 3, b 4. From BOS "a" is likelier than "b", but "b" nearly always ends at once
# while "a" spreads over three continuations: greedy takes "a" and never recovers.
_CHAIN = np.full((5, 5), 1e-3)
_CHAIN[BOS, [3, 4]] = [0.55, 0.44]
_CHAIN[3, [3, 4, EOS]] = [0.40, 0.30, 0.29]
_CHAIN[4, [EOS, 3, 4]] = [0.90, 0.05, 0.04]
_CHAIN = normalize(np.log(_CHAIN))


@pytest.mark.parametrize("length_penalty", [0.0, 0.6])
def test_beam_finds_the_optimum_that_greedy_misses_on_a_hand_made_chain(length_penalty):
  context = np.zeros(1, np.int32)
  sequences, scores = _beam(_CHAIN, context, length_penalty, beam_size=2, max_length=3)
  greedy = np.asarray(greedy_search(markov_step_fn(_CHAIN), markov_cache(context), 1, 3, BOS, EOS, PAD)[0])

  best_score = (_CHAIN[BOS, 4] + _CHAIN[4, EOS]) / gnmt_penalty(2, length_penalty)  # "b EOS"
  np.testing.assert_array_equal(sequences[0, 0], [4, EOS, PAD])
  np.testing.assert_allclose(scores[0, 0], best_score, rtol=1e-6)
  np.testing.assert_array_equal(greedy[0], [3, 3, 3])  # "a a a"
  greedy_score = (_CHAIN[BOS, 3] + 2 * _CHAIN[3, 3]) / gnmt_penalty(3, length_penalty)
  assert greedy_score < best_score - 0.5
  exhaustive = exhaustive_search(_CHAIN, 0, 3, length_penalty)
  assert max(exhaustive, key=exhaustive.get) == (4, EOS, PAD)


def test_length_penalty_lets_a_longer_hypothesis_overtake_an_early_eos():
  """From BOS, EOS (0.55) beats "a" (0.45), after which "a" repeats almost surely. log P of the long "a a ..."
  hardly falls while its penalty grows, so it wins at max_length: the search must keep the alive beam going
  after EOS fills the finished set (one beam, so greedy ends at once), and must not stop early on a bound that
  ignores the longer lengths still possible."""
  max_length, alpha = 10, 0.6
  chain = np.full((5, 5), 1e-4)
  chain[BOS, [EOS, 3]] = [0.55, 0.45]
  chain[3, 3] = 1.0
  chain = normalize(np.log(chain))
  context = np.zeros(1, np.int32)
  sequences, scores = _beam(chain, context, alpha, beam_size=1, max_length=max_length)
  greedy, _ = greedy_search(markov_step_fn(chain), markov_cache(context), 1, max_length, BOS, EOS, PAD)

  long_score = (chain[BOS, 3] + (max_length - 1) * chain[3, 3]) / gnmt_penalty(max_length, alpha)
  assert long_score > chain[BOS, EOS] / gnmt_penalty(1, alpha)
  np.testing.assert_array_equal(sequences[0, 0], [3] * max_length)
  np.testing.assert_allclose(scores[0, 0], long_score, rtol=1e-5)
  np.testing.assert_array_equal(greedy[0, :2], [EOS, PAD])


@pytest.mark.parametrize("seed", range(3))
def test_wide_beam_equals_exhaustive_search_on_random_chains(seed):
  """vocab ** max_length beams hold every hypothesis: all of them come back, sorted, with their exact scores.
  The order-2 chain conditions on a token kept in the cache, so a wrong cache gather changes the scores."""
  vocab, max_length, alpha = 5, 4, 0.6
  rng = np.random.default_rng(seed)
  log_probs = normalize(2.0 * rng.normal(size=(vocab,) * 3))
  context = np.array([0, 3, 4], np.int32)
  sequences, scores = map(np.asarray, _beam(log_probs, context, alpha, beam_size=vocab ** max_length,
                                            max_length=max_length))
  assert sequences.shape == (3, vocab ** max_length, max_length) and sequences.dtype == np.int32
  _assert_pad_after_eos(sequences)
  for row, before in enumerate(context):
    exhaustive = exhaustive_search(log_probs, before, max_length, alpha)
    found = np.isfinite(scores[row])
    assert found.sum() == len(exhaustive) == 1 + 4 + 16 + 64 + 4 ** 4  # EOS at 1..4, or cut at 4
    np.testing.assert_allclose(scores[row, found], sorted(exhaustive.values(), reverse=True), atol=1e-5)
    for tokens, score in zip(sequences[row, found], scores[row, found]):
      np.testing.assert_allclose(score, exhaustive[tuple(tokens)], atol=1e-5)
    assert tuple(sequences[row, 0]) == max(exhaustive, key=exhaustive.get)


@pytest.mark.parametrize("seed", range(3))
def test_narrow_beam_scores_its_hypotheses_exactly(seed):
  """Two beams over a longer horizon: every returned score is its sequence's true score, never above the
  optimum; beams reorder and fall behind, so this checks the bookkeeping where the wide test cannot."""
  vocab, max_length, alpha = 4, 6, 0.6
  log_probs = normalize(2.0 * np.random.default_rng(seed).normal(size=(vocab,) * 3))
  context = np.array([0, 3], np.int32)
  sequences, scores = map(np.asarray, _beam(log_probs, context, alpha, beam_size=2, max_length=max_length))
  _assert_pad_after_eos(sequences)
  for row, before in enumerate(context):
    exhaustive = exhaustive_search(log_probs, before, max_length, alpha)
    assert scores[row, 0] >= scores[row, 1]
    for tokens, score in zip(sequences[row], scores[row]):
      np.testing.assert_allclose(score, exhaustive[tuple(tokens)], atol=1e-5)
    assert scores[row, 0] <= max(exhaustive.values()) + 1e-5


@pytest.mark.slow
def test_one_beam_without_length_penalty_is_greedy_search():
  vocab, max_length, batch = 5, 6, 8
  ended_with_eos = []
  for seed in range(4):
    log_probs = normalize(2.0 * np.random.default_rng(seed).normal(size=(vocab,) * 3))
    context = np.arange(batch, dtype=np.int32) % vocab
    sequences, _ = _beam(log_probs, context, 0.0, beam_size=1, max_length=max_length)
    greedy, _ = greedy_search(markov_step_fn(log_probs), markov_cache(context), batch, max_length, BOS, EOS, PAD)
    np.testing.assert_array_equal(sequences[:, 0], greedy)
    ended_with_eos.extend(np.any(np.asarray(greedy) == EOS, axis=1))
  assert 0 < sum(ended_with_eos) < len(ended_with_eos)  # both EOS and cut-off outputs were compared


def test_immediate_eos_is_kept_with_its_score_and_padded():
  vocab, max_length, pad_id = 5, 5, 4  # a pad_id other than the default 0
  log_probs = np.full((vocab, vocab), np.log(0.1 / (vocab - 1)))
  log_probs[:, EOS] = np.log(0.9)
  sequences, scores = map(np.asarray, _beam(log_probs, np.zeros(2, np.int32), 0.6, beam_size=3,
                                            max_length=max_length, pad_id=pad_id))
  np.testing.assert_array_equal(sequences[:, 0], [[EOS] + [pad_id] * (max_length - 1)] * 2)
  np.testing.assert_allclose(scores[:, 0], np.log(0.9) / gnmt_penalty(1, 0.6), rtol=1e-6)
  assert np.all(sequences[:, 1:, 1] == EOS)  # the runners-up are one token and EOS
  _assert_pad_after_eos(sequences, pad_id)


def test_search_stops_once_no_alive_beam_can_win():
  vocab, max_length = 5, 40
  log_probs = np.full((vocab, vocab), np.log(0.1 / (vocab - 1)))
  log_probs[:, EOS] = np.log(0.9)
  steps = []

  def counting_step_fn(tokens, cache):
    jax.debug.callback(lambda: steps.append(1))
    return markov_step_fn(log_probs)(tokens, cache)

  sequences, _ = jax.jit(lambda: beam_search(counting_step_fn, markov_cache(np.zeros(1)), 1, 2, max_length, BOS,
                                             EOS, PAD, length_penalty=0.0))()
  jax.block_until_ready(sequences)
  np.testing.assert_array_equal(sequences[0, :2], [EOS, PAD])
  assert 1 < len(steps) < 5


# One layer each keeps compilation short (tests/nn checks cached layers feeding cached layers).
_MODEL_CONFIG = ModelConfig(vocab_size=7, d_model=16, num_heads=2, d_ff=32, num_encoder_layers=1,
                            num_decoder_layers=1, dropout_rate=0.0, attention_dropout_rate=0.0, max_length=16,
                            deterministic=True)


@functools.cache
def _tiny_model():
  source = jnp.array([[3, 4, 5, 6, 3], [6, 5, 4, 0, 0]], jnp.int32)  # example 1 padded
  # This initialisation ends some hypotheses with EOS, cuts others at max_length, and decodes the two
  # sources differently (so that mixing up examples in the cache would show).
  params = jax.jit(EncoderDecoder(_MODEL_CONFIG).init)(jax.random.key(6), source, source)["params"]
  return source, params


@jax.jit
def _teacher_forced_log_probs(params, source, targets):
  """``log P(targets[:, i] | source, targets[:, :i])`` ``[batch, length]``, every target position valid (a
  hypothesis may contain the pad token, which the model's own call would mask)."""
  model = EncoderDecoder(_MODEL_CONFIG)
  encoded = model.apply({"params": params}, source, method=EncoderDecoder.encode)
  logits = model.apply({"params": params}, encoded, source, ops.shift_right(targets, _MODEL_CONFIG.bos_id),
                       method=EncoderDecoder.decode)
  return jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None], -1)[..., 0]


@pytest.mark.slow
def test_cached_beam_scores_equal_teacher_forced_rescoring():
  max_length, beam_size, alpha = 6, 3, 0.6
  source, params = _tiny_model()
  sequences, scores = map(np.asarray, beam_decode(_MODEL_CONFIG, params, source, max_length, beam_size, alpha,
                                                   True))
  _assert_pad_after_eos(sequences)

  targets = flatten_beams(sequences)
  token_log_probs = np.asarray(_teacher_forced_log_probs(params, expand_to_beams(source, beam_size), targets))
  is_eos = targets == _MODEL_CONFIG.eos_id
  lengths = np.where(is_eos.any(1), is_eos.argmax(1) + 1, max_length)
  assert 0 < is_eos.any(1).sum() < len(lengths)  # both EOS-ended and cut-off hypotheses
  log_p = np.array([row[:length].sum() for row, length in zip(token_log_probs, lengths)])
  np.testing.assert_allclose(flatten_beams(scores), log_p / gnmt_penalty(lengths, alpha), atol=1e-4)
  assert np.all(np.diff(scores, axis=1) <= 0)  # sorted best first


@pytest.mark.slow
def test_cached_beam_of_one_equals_greedy_decoding_of_the_model():
  source, params = _tiny_model()
  greedy, _ = greedy_decode(_MODEL_CONFIG, params, source, 6)
  sequences, _ = beam_decode(_MODEL_CONFIG, params, source, 6, 1, 0.0)
  np.testing.assert_array_equal(sequences, greedy)


def _flax_wmt_beam_search(log_probs, context, beam_size, max_length, alpha):
  """The best hypothesis of flax's ``examples/wmt/decode.py`` beam search on one example of an order-2 chain,
  re-implemented in plain Python from its description: ``2 * beam`` candidates a step; every EOS among them
  competes for the finished set, scored ``log P / ((5 + length) / 6) ** alpha``; the other best ``beam`` stay
  alive; a large negative constant (not -inf) fills empty slots; the loop stops when every finished slot is
  filled and beats the best alive bound; with no finished hypothesis the best alive one is returned."""
  neg_inf, vocab = -1.0e7, log_probs.shape[-1]

  def penalty(length):
    return ((5.0 + length) / 6.0) ** alpha

  def next_log_probs(tokens):
    history = (context, BOS) + tokens
    return log_probs[history[-2], history[-1]]

  alive = [((), 0.0)] + [((), neg_inf)] * (beam_size - 1)
  finished = [((), neg_inf, False)] * beam_size
  for step in range(max_length):
    best_alive_bound = max(log_p for _, log_p in alive) / penalty(max_length + 1)  # flax's max_decode_len
    worst_finished = min(score for _, score, _ in finished)
    if all((worst_finished if flag else neg_inf) > best_alive_bound for _, _, flag in finished):
      break
    candidates = [(tokens + (token,), log_p + next_log_probs(tokens)[token])
                  for tokens, log_p in alive for token in range(vocab)]
    # lax.top_k keeps the lower index first on ties: sorted() is stable.
    top = sorted(candidates, key=lambda c: -c[1])[:2 * beam_size]
    alive = sorted([(tokens, log_p + (neg_inf if tokens[-1] == EOS else 0.0)) for tokens, log_p in top],
                   key=lambda c: -c[1])[:beam_size]
    ended = [(tokens, log_p / penalty(step + 1) + (0.0 if tokens[-1] == EOS else neg_inf), tokens[-1] == EOS)
             for tokens, log_p in top]
    finished = sorted(finished + ended, key=lambda c: -c[1])[:beam_size]
  best = finished[0][0] if any(flag for _, _, flag in finished) else max(alive, key=lambda c: c[1])[0]
  return best + (PAD,) * (max_length - len(best))


@pytest.mark.slow
@pytest.mark.parametrize("beam_size", [1, 2])
def test_any_candidate_finishing_scores_at_least_flax_wmt_beam_search(beam_size):
  """finish_rule='any' (flax's and t5x's rule): on random chains the best hypothesis scores at least as high
  as flax's examples/wmt search (same candidates; finishing cut-off hypotheses too can only add)."""
  vocab, max_length, alpha = 4, 5, 0.6
  differs_from_within_beam = False
  for seed in range(6):
    log_probs = normalize(2.0 * np.random.default_rng(seed).normal(size=(vocab,) * 3))
    context = np.array([0, 3], np.int32)
    found = _beam_any(log_probs, context, alpha, beam_size=beam_size, max_length=max_length)
    within, _ = _beam(log_probs, context, alpha, beam_size=beam_size, max_length=max_length)
    sequences, scores = map(np.asarray, found)
    for row, before in enumerate(context):
      exhaustive = exhaustive_search(log_probs, before, max_length, alpha)
      np.testing.assert_allclose(scores[row, 0], exhaustive[tuple(sequences[row, 0])], atol=1e-5)
      flax_best = _flax_wmt_beam_search(log_probs, int(before), beam_size, max_length, alpha)
      assert scores[row, 0] >= exhaustive[flax_best] - 1e-5, (seed, row)
      differs_from_within_beam |= tuple(sequences[row, 0]) != tuple(np.asarray(within)[row, 0])
  if beam_size == 1:
    assert differs_from_within_beam  # the two rules are different searches


@functools.partial(jax.jit, static_argnames=("beam_size", "max_length"))
def _beam_any(log_probs, context, length_penalty, *, beam_size, max_length):
  return beam_search(markov_step_fn(log_probs), markov_cache(context), context.shape[0], beam_size, max_length,
                     BOS, EOS, PAD, length_penalty, return_all_beams=True, finish_rule="any")


def test_unknown_finish_rule_is_refused():
  with pytest.raises(ValueError, match="finish_rule"):
    beam_search(markov_step_fn(_CHAIN), markov_cache(np.zeros(1, np.int32)), 1, 2, 3, BOS, EOS, PAD,
                finish_rule="flax")
