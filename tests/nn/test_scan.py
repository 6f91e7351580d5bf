"""Layers under scan (ModelConfig.scan_layers): the scanned stack is the unrolled one with its parameters stacked,
so with the same (converted) parameters it gives the same logits, loss, gradients and cached decoding, under every
remat policy; ``unstack_layers`` / ``stack_layers`` convert losslessly between the layouts."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from transformer import ops
from transformer.decode import DecodeSettings
from transformer.nn import EncoderDecoder, ModelConfig, TransformerLM, stack_layers, unboxed, unstack_layers
from transformer.nn.config import REMAT_POLICIES
from transformer.tasks.decoding import continue_prompts, search_decode

# Two encoder and three decoder layers: the stacks differ in length, and a cached layer feeds another.
CONFIG = ModelConfig(vocab_size=17, d_model=16, num_heads=2, num_kv_heads=1, d_ff=32, num_encoder_layers=2,
                     num_decoder_layers=3, dropout_rate=0.0, attention_dropout_rate=0.0, max_length=16,
                     deterministic=True)
SCANNED = CONFIG.replace(scan_layers=True)


def _tokens(seed, shape):
  return jnp.asarray(np.random.default_rng(seed).integers(3, CONFIG.vocab_size, shape), jnp.int32)


SOURCE, TARGET = _tokens(0, (2, 7)), _tokens(1, (2, 6))
MODELS = {"encoder-decoder": (EncoderDecoder, (SOURCE, TARGET)), "language-model": (TransformerLM, (TARGET,))}


def _params(model_class, config, inputs):
  return unboxed(model_class(config).init(jax.random.key(0), *inputs)["params"])


def _loss_and_gradients(model, params, inputs):
  def loss(params):
    logits = model.apply({"params": params}, *inputs, rngs={"dropout": jax.random.key(7)})
    return ops.softmax_cross_entropy(logits, TARGET).mean(), logits
  (value, logits), gradients = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
  return logits, value, gradients


def _assert_close(actual, expected, **tolerance):
  assert jax.tree.structure(actual) == jax.tree.structure(expected)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, **tolerance), actual, expected)


@pytest.mark.parametrize("name", MODELS)
def test_scanned_parameters_are_the_unrolled_ones_stacked(name):
  model_class, inputs = MODELS[name]
  unrolled, scanned = _params(model_class, CONFIG, inputs), _params(model_class, SCANNED, inputs)
  stacked = stack_layers(unrolled, scanned)
  assert "layer_0" not in stacked["decoder"] and stacked["decoder"]["layers"]["feed_forward"]["kernel_in"].shape == (
      CONFIG.num_decoder_layers, CONFIG.d_model, CONFIG.d_ff)
  assert jax.tree.map(np.shape, stacked) == jax.tree.map(np.shape, scanned)
  jax.tree.map(np.testing.assert_array_equal, unstack_layers(stacked), unrolled)  # lossless both ways
  assert unstack_layers(unrolled) is unrolled and stack_layers(scanned, unrolled) is scanned  # nothing to convert


@pytest.mark.parametrize("name", MODELS)
def test_scanned_stack_gives_the_same_logits_loss_and_gradients(name):
  model_class, inputs = MODELS[name]
  unrolled = _params(model_class, CONFIG, inputs)
  stacked = stack_layers(unrolled, _params(model_class, SCANNED, inputs))
  logits, loss, gradients = _loss_and_gradients(model_class(CONFIG), unrolled, inputs)
  scanned_logits, scanned_loss, scanned_gradients = _loss_and_gradients(model_class(SCANNED), stacked, inputs)
  np.testing.assert_allclose(scanned_logits, logits, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(scanned_loss, loss, rtol=1e-6)
  _assert_close(unstack_layers(scanned_gradients), gradients, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("name", [pytest.param("encoder-decoder", marks=pytest.mark.slow), "language-model"])
def test_every_remat_policy_under_scan_gives_the_same_loss_and_gradients_with_dropout(name):
  """Dropout on: the rematerialised layer body must draw the same masks in its recomputation."""
  model_class, inputs = MODELS[name]
  config = SCANNED.replace(deterministic=False, dropout_rate=0.2, attention_dropout_rate=0.2)
  params = _params(model_class, config, inputs)
  results = {policy: _loss_and_gradients(model_class(config.replace(remat=policy)), params, inputs)
             for policy in REMAT_POLICIES}
  _, loss, gradients = results["none"]
  assert np.isfinite(loss) and loss > 0
  for policy in ("dots", "full"):
    _, policy_loss, policy_gradients = results[policy]
    np.testing.assert_allclose(policy_loss, loss, rtol=1e-6)
    _assert_close(policy_gradients, gradients, rtol=1e-5, atol=1e-6)


def test_remat_under_scan_recomputes_the_forward_matmuls():
  """The policy reaches the scanned layer: "full" recomputes the layer's forward matmuls in the backward pass."""
  model_class, inputs = MODELS["language-model"]
  config = SCANNED.replace(deterministic=False)
  params = _params(model_class, config, inputs)

  def dots(policy):
    model = model_class(config.replace(remat=policy))
    loss = lambda p: model.apply({"params": p}, *inputs, rngs={"dropout": jax.random.key(7)}).sum()
    return jax.jit(jax.grad(loss)).lower(params).as_text().count("stablehlo.dot_general")
  assert dots("full") > dots("none")


@pytest.mark.slow
@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_scanned_cached_decoding_gives_the_same_sequences_and_scores(search):
  """Cached decoding of the encoder-decoder (the decode and cross-attention caches stacked on their layer axis 1,
  so beam search reorders their leading batch axis) and of the language model with a prefilled prompt."""
  settings = DecodeSettings(search, beam_size=3 if search == "beam" else 1)
  unrolled = _params(EncoderDecoder, CONFIG, (SOURCE, TARGET))
  stacked = stack_layers(unrolled, _params(EncoderDecoder, SCANNED, (SOURCE, TARGET)))
  sequences, scores = search_decode(CONFIG, unrolled, SOURCE, 8, settings)
  scanned_sequences, scanned_scores = search_decode(SCANNED, stacked, SOURCE, 8, settings)
  np.testing.assert_array_equal(scanned_sequences, sequences)
  np.testing.assert_allclose(scanned_scores, scores, rtol=1e-5, atol=1e-5)

  unrolled = _params(TransformerLM, CONFIG, (TARGET,))
  stacked = stack_layers(unrolled, _params(TransformerLM, SCANNED, (TARGET,)))
  prompt, lengths = TARGET[:, :4], jnp.asarray([4, 2], jnp.int32)
  expected = continue_prompts(CONFIG, unrolled, prompt, lengths, 6, settings)
  actual = continue_prompts(SCANNED, stacked, prompt, lengths, 6, settings)
  np.testing.assert_array_equal(actual[0], expected[0])
  np.testing.assert_allclose(actual[1], expected[1], rtol=1e-5, atol=1e-5)


def test_conversion_covers_a_train_state_with_replicas_and_frozen_moments():
  """A checkpoint's tree: parameters and Adam's moments under a leading replica axis (the layer axis is then 1),
  the moments of a frozen stack masked away (no leaves, yet the same layer names)."""
  model_class, inputs = MODELS["encoder-decoder"]
  scanned = _params(model_class, SCANNED, inputs)
  replicas = jax.tree.map(lambda x: np.stack([x, x + 1]), scanned)  # [replicas, layers, ...]
  labels = jax.tree.map(lambda _: "trained", replicas)
  labels["encoder"] = jax.tree.map(lambda _: "frozen", labels["encoder"])
  optimizer = optax.multi_transform({"trained": optax.adam(1e-3), "frozen": optax.set_to_zero()}, labels)
  state = {"params": replicas, "opt_state": optimizer.init(replicas)}
  per_layer = unstack_layers(state, axis=1)
  assert set(per_layer["params"]["encoder"]) >= {"layer_0", "layer_1"} and "layers" not in per_layer["params"]["encoder"]
  mu = per_layer["opt_state"].inner_states["trained"].inner_state[0].mu
  assert {"layer_0", "layer_1"} <= set(mu["encoder"]) and {"layer_0", "layer_1", "layer_2"} <= set(mu["decoder"])
  np.testing.assert_array_equal(per_layer["params"]["decoder"]["layer_2"]["feed_forward"]["bias_in"],
                                replicas["decoder"]["layers"]["feed_forward"]["bias_in"][:, 2])
  restacked = stack_layers(per_layer, state, axis=1)
  assert jax.tree.structure(restacked) == jax.tree.structure(state)
  jax.tree.map(np.testing.assert_array_equal, restacked, state)


def test_restore_targets_lose_the_layer_axis_and_its_sharding_entry():
  mesh = jax.make_mesh((1, 1), ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2,
                       devices=jax.devices()[:1])
  spec = jax.sharding.PartitionSpec(None, None, "model")
  target = {"layers": {"kernel": jax.ShapeDtypeStruct((3, 4, 8), jnp.float32,
                                                      sharding=jax.sharding.NamedSharding(mesh, spec))}}
  per_layer = unstack_layers(target)
  assert sorted(per_layer) == ["layer_0", "layer_1", "layer_2"]
  kernel = per_layer["layer_2"]["kernel"]
  assert kernel.shape == (4, 8) and kernel.sharding.spec == jax.sharding.PartitionSpec(None, "model")


def test_attention_weights_of_a_scanned_model_are_read_per_layer():
  """The scanned stack sows its weights stacked ``[layers, ...]``; the plots' reader names each layer as unrolled."""
  from transformer.tasks.seq2seq import attention_weights
  unrolled = _params(EncoderDecoder, CONFIG, (SOURCE, TARGET))
  stacked = stack_layers(unrolled, _params(EncoderDecoder, SCANNED, (SOURCE, TARGET)))
  sources, targets = [np.asarray(SOURCE[0])], [np.asarray(TARGET[0, :4])]
  expected = attention_weights(CONFIG, unrolled, sources, targets)[0]
  actual = attention_weights(SCANNED, stacked, sources, targets)[0]
  assert sorted(actual) == sorted(expected) and ("cross", 2) in actual and ("encoder_self", 1) in actual
  for key, weights in expected.items():
    np.testing.assert_allclose(actual[key], weights, rtol=1e-5, atol=1e-6)
