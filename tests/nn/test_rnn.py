"""RNN baselines: shapes, cached decoding equals teacher forcing, padding invariance, attention, training."""
import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from transformer import ops
from transformer.decode import greedy_search
from transformer.nn import EncoderDecoder, RNNConfig, RNNEncoderDecoder, unboxed
from transformer.nn.rnn import RNNAttention, project_keys

from tests.nn import reference

CONFIG = RNNConfig(vocab_size=11, target_vocab_size=13, embedding_dim=8, hidden_dim=12, num_layers=1,
                   dropout_rate=0.0, deterministic=True)
BATCH = 2


def _tokens(seed, length, vocab_size, padding_from=None):
  """Random non-special tokens ``[BATCH, length]``; example 1 is padded from ``padding_from`` on."""
  tokens = np.random.default_rng(seed).integers(3, vocab_size, (BATCH, length))
  if padding_from is not None:
    tokens[1, padding_from:] = CONFIG.pad_id
  return jnp.asarray(tokens, jnp.int32)


SOURCE = _tokens(0, 6, CONFIG.vocab_size, padding_from=4)
TARGET = _tokens(1, 5, CONFIG.target_vocab_size)


@functools.lru_cache(maxsize=None)
def _params(config):
  """Random parameters of the model's shapes, drawn in numpy: compiling ``init`` would double these tests' time."""
  shapes = jax.eval_shape(RNNEncoderDecoder(config).init, jax.random.key(0), SOURCE, TARGET)["params"]
  rng = np.random.default_rng(0)
  return jax.tree.map(lambda shape: jnp.asarray(rng.normal(0.0, 0.5, shape.shape), shape.dtype), shapes)


@functools.partial(jax.jit, static_argnums=0)
def _forward(config, params, source, target):
  """Teacher-forced logits and the sown attention weights ``[batch, 1, target_length, source_length]``."""
  logits, variables = RNNEncoderDecoder(config).apply({"params": params}, source, target,
                                                      mutable=["intermediates"])
  (weights,) = variables["intermediates"]["decoder"]["attention_weights"]
  return logits, weights


COMBINATIONS = [pytest.param(cell, attention, id=f"{cell}-{attention}")
                for cell in ("gru", "lstm") for attention in ("bahdanau", "luong_dot", "luong_general",
                                                              "luong_cosine", "none")]


@pytest.mark.parametrize("cell, attention", COMBINATIONS)
def test_shapes_for_every_cell_and_attention(cell, attention):
  # The encoder's direction and the dtype change with the cell so both settings meet every attention;
  # abstract evaluation (no compilation) keeps this fast.
  config = CONFIG.replace(cell=cell, attention=attention, bidirectional_encoder=cell == "gru", num_layers=2,
                          dtype="float32" if cell == "gru" else "bfloat16")
  model = RNNEncoderDecoder(config)
  variables = jax.eval_shape(model.init, jax.random.key(0), SOURCE, TARGET)
  logits, intermediates = jax.eval_shape(
      functools.partial(model.apply, mutable=["intermediates"]), variables, SOURCE, TARGET)
  assert logits.shape == (BATCH, 5, config.target_vocab_size) and logits.dtype == jnp.float32
  (weights,) = intermediates["intermediates"]["decoder"]["attention_weights"]
  assert weights.shape == (BATCH, 1, 5, 6)
  encoded = jax.eval_shape(functools.partial(model.apply, method=EncoderDecoder.encode), variables, SOURCE)
  assert encoded.shape == (BATCH, 6, config.hidden_dim) and encoded.dtype == config.compute_dtype
  assert jax.eval_shape(functools.partial(model.apply, method=RNNEncoderDecoder.decode), variables, encoded,
                        SOURCE, TARGET).shape == logits.shape


DECODING_CASES = [
    pytest.param(dict(cell="gru", attention="bahdanau", bidirectional_encoder=True), id="gru-bahdanau"),
    pytest.param(dict(cell="lstm", attention="luong_general", bidirectional_encoder=False), id="lstm-luong_general"),
]


def _decoding_step(config, params):
  """The zero cache and the jitted one-token step, built as the seq2seq task builds them."""
  decoding = RNNEncoderDecoder(config.replace(decode=True))
  encoded = jax.jit(functools.partial(decoding.apply, method=EncoderDecoder.encode))({"params": params}, SOURCE)
  # The cache's shapes come from an init with a full-length dummy target; its values start at 0.
  cache_shapes = jax.eval_shape(decoding.init, jax.random.key(0), SOURCE, jnp.zeros_like(TARGET))["cache"]
  cache = jax.tree.map(lambda shape: jnp.zeros(shape.shape, shape.dtype), cache_shapes)

  @jax.jit
  def step(tokens, cache):
    logits, variables = decoding.apply({"params": params, "cache": cache}, encoded, SOURCE, tokens,
                                       method=EncoderDecoder.decode, mutable=["cache"])
    return logits, variables["cache"]

  return step, cache


@pytest.mark.slow
@pytest.mark.parametrize("changes", DECODING_CASES)
def test_cached_decoding_equals_teacher_forcing(changes):
  # Two layers, so that a cached layer feeds another cached layer.
  config = CONFIG.replace(num_layers=2, **changes)
  params = _params(config)
  full, _ = _forward(config, params, SOURCE, TARGET)
  step, cache = _decoding_step(config, params)
  assert "encoder" not in cache  # the source is encoded whole, with no cache
  decoder_inputs = ops.shift_right(TARGET, config.bos_id)
  stepwise = []
  for position in range(TARGET.shape[1]):
    logits, cache = step(decoder_inputs[:, position:position + 1], cache)
    stepwise.append(logits)
  np.testing.assert_allclose(jnp.concatenate(stepwise, axis=1), full, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_greedy_search_emits_the_argmax_of_the_teacher_forced_logits():
  config = CONFIG.replace(num_layers=2, cell="gru", attention="bahdanau")
  params = _params(config)
  step, cache = _decoding_step(config, params)
  greedy = np.asarray(greedy_search(step, cache, BATCH, TARGET.shape[1], config.bos_id, config.eos_id,
                                    config.pad_id)[0])
  # Teacher forcing on the search's own output: each token is the argmax given the tokens before it,
  # up to and including the first EOS (padding follows it).
  forced, _ = _forward(config, params, SOURCE, jnp.asarray(greedy))
  up_to_eos = np.cumsum(greedy == config.eos_id, axis=1) - (greedy == config.eos_id) == 0
  np.testing.assert_array_equal(np.where(up_to_eos, greedy, -1), np.where(up_to_eos, np.argmax(forced, -1), -1))


@pytest.mark.slow
@pytest.mark.parametrize("changes", DECODING_CASES)
def test_extra_source_padding_leaves_logits_unchanged(changes):
  config = CONFIG.replace(num_layers=2, **changes)
  params = _params(config)
  logits, _ = _forward(config, params, SOURCE, TARGET)
  padded = jnp.pad(SOURCE, ((0, 0), (0, 3)), constant_values=config.pad_id)
  padded_logits, _ = _forward(config, params, padded, TARGET)
  np.testing.assert_allclose(padded_logits, logits, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("changes", DECODING_CASES)
def test_attention_weights_sum_to_one_over_real_source_and_are_zero_at_padding(changes):
  config = CONFIG.replace(num_layers=2, **changes)
  _, weights = _forward(config, _params(config), SOURCE, TARGET)
  valid = np.asarray(SOURCE != config.pad_id)[:, None, None, :]  # [batch, heads, q_length, kv_length]
  weights = np.asarray(weights)
  np.testing.assert_array_equal(np.where(valid, 0.0, weights), 0.0)
  np.testing.assert_allclose(weights.sum(axis=-1), 1.0, atol=1e-6)
  assert np.all(weights[np.broadcast_to(valid, weights.shape)] > 0.0)


def _numpy_attention(config, params, query, encoded, valid, key_weight=None):
  """Reference: the papers' formulas in numpy, softmax over real source positions only."""
  query, encoded = np.asarray(query, np.float64), np.asarray(encoded, np.float64)
  if config.attention == "bahdanau":  # v^T tanh(W q + U k)
    hidden = np.tanh((query @ params["query_weight"])[:, None, :] + encoded @ key_weight)
    scores = hidden @ params["score_vector"]
  elif config.attention == "luong_dot":
    scores = np.einsum("bd,bkd->bk", query, encoded)
  elif config.attention == "luong_general":
    scores = np.einsum("bd,de,bke->bk", query, params["weight"], encoded)
  else:
    cosine = np.einsum("bd,bkd->bk", query, encoded) / (
        np.linalg.norm(query, axis=-1)[:, None] * np.linalg.norm(encoded, axis=-1))
    scores = cosine / config.cosine_temperature
  scores = np.where(valid, scores, -np.inf)
  weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
  weights /= weights.sum(axis=-1, keepdims=True)
  return np.einsum("bk,bkd->bd", weights, encoded), weights


@pytest.mark.parametrize("attention", ["bahdanau", "luong_dot", "luong_general", "luong_cosine"])
def test_attention_matches_numpy_reference(attention):
  config = CONFIG.replace(attention=attention, cosine_temperature=0.5)
  keys = jax.random.split(jax.random.key(1), 2)
  query = jax.random.normal(keys[0], (BATCH, config.hidden_dim))
  encoded = jax.random.normal(keys[1], (BATCH, 6, config.hidden_dim))
  valid = SOURCE != config.pad_id
  attention_module = RNNAttention(config)
  rng = np.random.default_rng(2)
  key_weight = rng.normal(0.0, 0.5, (config.hidden_dim, 12)).astype(np.float32)
  projected_keys = project_keys(key_weight, encoded) if attention == "bahdanau" else None
  shapes = unboxed(jax.eval_shape(attention_module.init, jax.random.key(0), query, encoded, valid,
                                  projected_keys).get("params", {}))
  params = jax.tree.map(lambda shape: rng.normal(0.0, 0.5, shape.shape).astype(np.float32), shapes)
  context, weights = jax.jit(attention_module.apply)({"params": params}, query, encoded, valid, projected_keys)
  expected_context, expected_weights = _numpy_attention(config, params, query, encoded, np.asarray(valid),
                                                        key_weight)
  np.testing.assert_allclose(weights, expected_weights, atol=1e-5)
  np.testing.assert_allclose(context, expected_context, atol=1e-5)


def _sigmoid(x):
  return 1.0 / (1.0 + np.exp(-x))


def _numpy_cell(config, params, state, inputs):
  """One GRU or LSTM step as flax's cells define them (kernels ``i*`` on inputs, ``h*`` on the state)."""
  def gate(name):
    return (inputs @ params[f"i{name}"]["kernel"] + params[f"i{name}"].get("bias", 0.0)
            + state["hidden"] @ params[f"h{name}"]["kernel"])
  if config.cell == "gru":
    reset, update = _sigmoid(gate("r")), _sigmoid(gate("z"))
    candidate = np.tanh(inputs @ params["in"]["kernel"] + params["in"]["bias"]
                        + reset * (state["hidden"] @ params["hn"]["kernel"] + params["hn"]["bias"]))
    return {"hidden": (1.0 - update) * candidate + update * state["hidden"]}
  i, f, g, o = (gate(name) + params[f"h{name}"]["bias"] for name in "ifgo")
  cell = _sigmoid(f) * state["cell"] + _sigmoid(i) * np.tanh(g)
  return {"cell": cell, "hidden": _sigmoid(o) * np.tanh(cell)}


def _numpy_run(config, params, inputs, features):
  """An RNN from a zero state over ``inputs`` ``[length, d]`` -> ``[length, features]``."""
  state = {"hidden": np.zeros(features), "cell": np.zeros(features)}
  outputs = []
  for x in inputs:
    state = {**state, **_numpy_cell(config, params, state, x)}
    outputs.append(state["hidden"])
  return np.stack(outputs)


def _numpy_model(config, params, source, target):
  """Reference forward pass from the papers' equations, one example at a time, on the real tokens only."""
  params = reference.as_numpy(params)
  encoder, decoder = params["encoder"], params["decoder"]
  step = decoder["step"]
  logits = []
  for tokens, targets in zip(np.asarray(source), np.asarray(target)):
    x = encoder["embedding"]["embedding"][tokens[tokens != config.pad_id]]
    for layer in range(config.num_layers):
      if config.bidirectional_encoder:
        half = config.hidden_dim // 2
        x = np.concatenate([_numpy_run(config, encoder[f"layer_{layer}_forward"], x, half),
                            _numpy_run(config, encoder[f"layer_{layer}_backward"], x[::-1], half)[::-1]], -1)
      else:
        x = _numpy_run(config, encoder[f"layer_{layer}"], x, config.hidden_dim)
    encoded = x[None]  # [1, real source length, hidden_dim]
    half = config.hidden_dim // 2 if config.bidirectional_encoder else config.hidden_dim
    summary = np.concatenate([encoded[0, -1, :half], encoded[0, 0, half:]])
    states = [{part: np.tanh(summary @ decoder[f"bridge_{part}_{layer}"]["kernel"]
                             + decoder[f"bridge_{part}_{layer}"]["bias"])
               for part in (("hidden", "cell") if config.cell == "lstm" else ("hidden",))}
              for layer in range(config.num_layers)]
    attentional = np.zeros(config.hidden_dim)
    valid = np.ones((1, encoded.shape[1]), bool)
    row = []
    for previous in np.concatenate([[config.bos_id], targets[:-1]]):
      embedded = decoder["embedding"]["embedding"][previous]
      if config.attention == "bahdanau":  # s_{i-1} attends; [E y_{i-1}; c_i] enters the RNN
        context = _numpy_attention(config, step["attention"], states[-1]["hidden"][None], encoded, valid,
                                   decoder["attention_key_weight"])[0][0]
        x = np.concatenate([embedded, context])
      else:  # input feeding: [E y_{t-1}; h~_{t-1}] enters the RNN
        x = np.concatenate([embedded, attentional])
      for layer in range(config.num_layers):
        states[layer] = {**states[layer], **_numpy_cell(config, step[f"layer_{layer}"], states[layer], x)}
        x = states[layer]["hidden"]
      if config.attention == "bahdanau":  # deep output: maxout over pairs, then the vocabulary
        pre_maxout = np.concatenate([x, context, embedded]) @ decoder["readout"]["kernel"] + decoder["readout"]["bias"]
        features = pre_maxout.reshape(-1, 2).max(axis=-1)
      else:  # h_t attends; h~_t = tanh(W_c [c_t; h_t])
        context = _numpy_attention(config, step["attention"], x[None], encoded, valid)[0][0]
        attentional = features = np.tanh(np.concatenate([context, x]) @ step["attentional"]["kernel"])
      row.append(features @ decoder["logits"]["kernel"] + decoder["logits"]["bias"])
    logits.append(np.stack(row))
  return np.stack(logits)


@pytest.mark.parametrize("changes", DECODING_CASES)
def test_teacher_forced_logits_match_numpy_reference(changes):
  config = CONFIG.replace(num_layers=2, **changes)
  params = _params(config)
  logits, _ = _forward(config, params, SOURCE, TARGET)
  np.testing.assert_allclose(logits, _numpy_model(config, params, SOURCE, TARGET), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("changes, pattern", [
    (dict(cell="rnn"), "RNNConfig.cell='rnn' is not supported; choose one of ['gru', 'lstm']"),
    (dict(attention="luong_concat"),
     "RNNConfig.attention='luong_concat' is not supported; choose one of "
     "['bahdanau', 'luong_dot', 'luong_general', 'luong_cosine', 'none']"),
    (dict(dtype="float16"), "RNNConfig.dtype='float16' is not supported; choose one of ['float32', 'bfloat16']"),
    (dict(hidden_dim=0), "RNNConfig.hidden_dim"),
    (dict(num_layers=1.5), "RNNConfig.num_layers"),
    (dict(target_vocab_size=-3), "RNNConfig.target_vocab_size"),
    (dict(dropout_rate=1.0), "RNNConfig.dropout_rate=1.0"),
    (dict(cosine_temperature=0.0), "RNNConfig.cosine_temperature=0.0"),
    (dict(hidden_dim=7), "RNNConfig.hidden_dim=7 must be even with bidirectional_encoder=True"),
    (dict(attention="bahdanau", input_feeding=False),
     "RNNConfig.input_feeding=False is not supported with attention='bahdanau'"),
    (dict(kernels="fast"), "RNNConfig.kernels='fast' is not supported; choose one of ['auto', 'reference']"),
])
def test_config_validation_names_field_value_and_fix(changes, pattern):
  with pytest.raises(ValueError, match=re.escape(pattern)):
    RNNConfig(**changes)


def test_config_rejects_unknown_fields_with_a_suggestion():
  with pytest.raises(ValueError, match=re.escape("RNNConfig has no field 'hiden_dim'. Did you mean 'hidden_dim'?")):
    CONFIG.replace(hiden_dim=8)
  with pytest.raises(ValueError, match="RNNConfig has no field 'd_model'"):
    RNNConfig.from_dict({"d_model": 8})
  assert RNNConfig.from_dict({"cell": "lstm", "hidden_dim": 8}) == RNNConfig(cell="lstm", hidden_dim=8)
  assert CONFIG.output_vocab_size == 13 and CONFIG.replace(target_vocab_size=None).output_vocab_size == 11


@pytest.mark.slow
def test_dropout_follows_the_key_and_is_off_when_deterministic():
  config = CONFIG.replace(dropout_rate=0.5, deterministic=False)
  params = _params(config)
  apply = jax.jit(lambda key: RNNEncoderDecoder(config).apply({"params": params}, SOURCE, TARGET,
                                                              rngs={"dropout": key}))
  # "rbg" keys compile faster on CPU than the default threefry ones; the module code is the same.
  first, again, other = (apply(jax.random.key(seed, impl="rbg")) for seed in (0, 0, 1))
  np.testing.assert_array_equal(first, again)
  assert not np.allclose(first, other)
  # Deterministic: no key is asked for (a dropout call would fail without one) and the output differs.
  evaluation, _ = _forward(config.replace(deterministic=True), params, SOURCE, TARGET)
  assert not np.allclose(first, evaluation)


@pytest.mark.slow
def test_training_on_a_copy_task_reduces_the_loss():
  config = RNNConfig(vocab_size=8, embedding_dim=8, hidden_dim=16, cell="gru", attention="luong_dot",
                     bidirectional_encoder=False, dropout_rate=0.0, deterministic=True)
  source = jnp.asarray(np.random.default_rng(0).integers(3, config.vocab_size, (16, 5)), jnp.int32)
  target = jnp.concatenate([source, jnp.full((16, 1), config.eos_id, jnp.int32)], axis=1)
  model = RNNEncoderDecoder(config)
  optimizer = optax.adam(3e-2)

  def loss_fn(params):
    return jnp.mean(ops.softmax_cross_entropy(model.apply({"params": params}, source, target), target))

  @jax.jit  # one program (init, 40 steps, both losses): one compilation
  def initial_and_final_loss():
    def step(carry, _):
      params, opt_state = carry
      updates, opt_state = optimizer.update(jax.grad(loss_fn)(params), opt_state, params)
      return (optax.apply_updates(params, updates), opt_state), None
    params = model.init(jax.random.key(0), source, target)["params"]
    (trained, _), _ = jax.lax.scan(step, (params, optimizer.init(params)), length=40)
    return loss_fn(params), loss_fn(trained)

  initial_loss, final_loss = map(float, initial_and_final_loss())
  assert np.isfinite(final_loss) and final_loss < 0.5 * initial_loss, (initial_loss, final_loss)


@pytest.mark.slow
@pytest.mark.parametrize("attention", ["bahdanau", "luong_dot", "luong_general", "luong_cosine"])
def test_kernels_auto_and_reference_agree_in_logits_and_gradients(attention):
  config = CONFIG.replace(attention=attention)
  params = _params(config)

  def logits_and_grads(kernels):
    model = RNNEncoderDecoder(config.replace(kernels=kernels))
    loss = lambda params: jnp.sum(jnp.sin(model.apply({"params": params}, SOURCE, TARGET)))
    return jax.jit(jax.value_and_grad(loss))(params)

  (auto_loss, auto_grads), (reference_loss, reference_grads) = logits_and_grads("auto"), logits_and_grads("reference")
  np.testing.assert_allclose(auto_loss, reference_loss, rtol=1e-5)
  for auto_grad, reference_grad in zip(jax.tree.leaves(auto_grads), jax.tree.leaves(reference_grads)):
    np.testing.assert_allclose(auto_grad, reference_grad, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_without_attention_the_decoder_sees_the_source_only_through_its_initial_state():
  """attention='none': zero weights, and changing a source token moves the logits only through the encoder's
  summary (the bridge), so with the bridge's inputs held fixed the logits do not move."""
  config = CONFIG.replace(attention="none")
  model = RNNEncoderDecoder(config)
  params = model.init(jax.random.key(0), SOURCE, TARGET)["params"]
  logits, weights = _forward(config, params, SOURCE, TARGET)
  assert np.all(np.asarray(weights) == 0.0)
  encoded = model.apply({"params": params}, SOURCE, method=EncoderDecoder.encode)
  # Encoder states other than the summary's (last forward, first backward) do not reach the decoder.
  lengths = np.sum(np.asarray(SOURCE) != config.pad_id, axis=1)
  keep = np.zeros(encoded.shape[:2], bool)
  keep[np.arange(len(lengths)), lengths - 1] = True
  keep[:, 0] = True
  scrambled = jnp.where(keep[..., None], encoded, 7.0)
  decode = functools.partial(model.apply, {"params": params}, method=RNNEncoderDecoder.decode)
  np.testing.assert_allclose(decode(scrambled, SOURCE, TARGET), decode(encoded, SOURCE, TARGET), atol=1e-5,
                             rtol=1e-5)
  assert logits.shape == (BATCH, 5, config.target_vocab_size)
