"""Forecasters: shapes, causality among horizon queries, nothing but the own window read, dropout, gradients,
recurrent forecasters against a numpy unroll of the cell equations, DLinear against numpy, PatchTST's
scale equivariance, fitting a noisy sine, config errors."""
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from tests.nn.reference import as_numpy, perturbed_params
from transformer.errors import ConfigError
from transformer.nn import ForecasterConfig, RecurrentForecaster, TransformerForecaster, make_forecaster
from transformer.nn.forecasters import ARCHITECTURES, DLinearForecaster, PatchTSTForecaster

MODULES = {"rnn": RecurrentForecaster, "lstm": RecurrentForecaster, "gru": RecurrentForecaster,
           "transformer": TransformerForecaster, "transformer_encoder": TransformerForecaster,
           "patchtst": PatchTSTForecaster, "dlinear": DLinearForecaster}
TARGET_ONLY = ("patchtst", "dlinear")  # channel independent: the target's forecast reads its own history only

# Tiny sizes and one layer keep the tests quick; the tests of causality and of the recurrent unroll use two,
# where stacking matters.
CONFIG = ForecasterConfig(num_features=3, input_length=6, num_horizons=4, d_model=8, num_layers=1,
                          num_decoder_layers=1, num_heads=2, d_ff=16, dropout_rate=0.0, deterministic=True,
                          patch_length=4, patch_stride=2, moving_average=3)
BATCH = 3
INPUTS = jnp.asarray(np.random.default_rng(0).normal(size=(BATCH, CONFIG.input_length, CONFIG.num_features)),
                     jnp.float32)


def _forward(config, params, inputs=INPUTS, **kwargs):
  return make_forecaster(config).apply({"params": params}, inputs, **kwargs)


def _params(config, seed=0):
  return perturbed_params(make_forecaster(config), INPUTS, seed=seed)


ARCHITECTURE_VARIANTS = [pytest.param(dict(architecture=name), id=name) for name in ARCHITECTURES]
LEARNED_POSITIONS_POST_NORM = pytest.param(
    dict(architecture="transformer", positional_encoding="learned", norm_position="post"),
    id="transformer-learned-post")
VARIANTS = ARCHITECTURE_VARIANTS + [
    LEARNED_POSITIONS_POST_NORM,
    pytest.param(dict(architecture="transformer", positional_encoding="rotary"), id="transformer-rotary"),
    pytest.param(dict(architecture="transformer_encoder", pooling="mean", positional_encoding="none"),
                 id="transformer_encoder-mean"),
    pytest.param(dict(architecture="transformer", dtype="bfloat16"), id="transformer-bfloat16"),
    pytest.param(dict(architecture="lstm", dtype="bfloat16"), id="lstm-bfloat16"),
]


@pytest.mark.slow
@pytest.mark.parametrize("changes", VARIANTS)
def test_shapes_dtype_and_module_for_every_architecture(changes):
  config = CONFIG.replace(**changes)
  model = make_forecaster(config)
  assert type(model) is MODULES[config.architecture]
  forecasts = _forward(config, _params(config))
  assert forecasts.shape == (BATCH, config.num_horizons) and forecasts.dtype == jnp.float32
  assert np.all(np.isfinite(forecasts))


@pytest.mark.slow
@pytest.mark.parametrize("positional_encoding", ["sinusoidal", "rotary"])
def test_horizon_queries_attend_causally(positional_encoding):
  """Horizon i reads the queries of horizons <= i only: moving a later query leaves earlier forecasts as
  they were (through both decoder layers), and changes its own."""
  config = CONFIG.replace(architecture="transformer", positional_encoding=positional_encoding, num_decoder_layers=2)
  params = _params(config)
  forecasts = _forward(config, params)
  # A random direction: a shift of all features alike would vanish in the first LayerNorm.
  shift = jax.random.normal(jax.random.key(1), (config.d_model,))
  for horizon in range(config.num_horizons):
    moved = jax.tree.map(lambda leaf: leaf, params)
    moved["horizon_queries"]["embedding"] = params["horizon_queries"]["embedding"].at[horizon].add(shift)
    moved_forecasts = _forward(config, moved)
    np.testing.assert_allclose(moved_forecasts[:, :horizon], forecasts[:, :horizon], atol=1e-6)
    assert np.all(np.abs(moved_forecasts[:, horizon] - forecasts[:, horizon]) > 1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("changes", ARCHITECTURE_VARIANTS)
def test_each_forecast_reads_every_hour_of_its_own_window_and_nothing_else(changes):
  """Row b's forecasts depend on row b's inputs only (no leak across the batch), and on every hour of
  them: the window is read whole, the origin included; PatchTST and DLinear read the target feature only."""
  config = CONFIG.replace(**changes)
  params = _params(config)
  # d forecasts[0] / d inputs: [num_horizons, batch, input_length, num_features]
  jacobian = jax.jacobian(lambda inputs: _forward(config, params, inputs)[0])(INPUTS)
  np.testing.assert_array_equal(jacobian[:, 1:], 0.0)
  if config.architecture in TARGET_ONLY:
    np.testing.assert_array_equal(jacobian[:, 0, :, 1:], 0.0)
  assert np.all(np.abs(jacobian[:, 0]).sum(axis=-1) > 0.0)  # every horizon, every hour


@pytest.mark.slow
@pytest.mark.parametrize("changes", [variant for variant in ARCHITECTURE_VARIANTS if variant.id != "dlinear"])
def test_dropout_follows_the_key_and_is_off_when_deterministic(changes):
  config = CONFIG.replace(dropout_rate=0.3, attention_dropout_rate=0.3, deterministic=False, **changes)
  params = _params(config)
  first, again, other = (_forward(config, params, rngs={"dropout": jax.random.key(seed)}) for seed in (0, 0, 1))
  np.testing.assert_array_equal(first, again)
  assert not np.allclose(first, other)
  # Deterministic: no key is asked for (a dropout call would fail without one) and the keys change nothing.
  evaluation = config.replace(deterministic=True)
  np.testing.assert_array_equal(_forward(evaluation, params),
                                _forward(evaluation, params, rngs={"dropout": jax.random.key(1)}))
  assert not np.allclose(first, _forward(evaluation, params))


@pytest.mark.slow
@pytest.mark.parametrize("changes", ARCHITECTURE_VARIANTS + [LEARNED_POSITIONS_POST_NORM])
def test_gradients_are_finite_and_nonzero_for_every_parameter(changes):
  config = CONFIG.replace(**changes)
  params = _params(config)
  targets = jnp.asarray(np.random.default_rng(1).normal(size=(BATCH, config.num_horizons)), jnp.float32)
  grads = jax.grad(lambda p: jnp.mean((_forward(config, p) - targets) ** 2))(params)
  for path, grad in jax.tree_util.tree_leaves_with_path(grads):
    name = jax.tree_util.keystr(path)
    assert np.all(np.isfinite(grad)), name
    assert np.any(grad != 0.0), name


def _sigmoid(x):
  return 1.0 / (1.0 + np.exp(-x))


def _cell_step(architecture, p, carry, x):
  """One step of the cell equations, read off flax's docstrings: ``(carry, x [batch, features]) -> carry``;
  the carry is ``h`` (and ``c`` for the LSTM), each ``[batch, d_model]``."""
  if architecture == "rnn":  # h' = tanh(W_i x + b_i + W_h h)
    return np.tanh(x @ p["i"]["kernel"] + p["i"]["bias"] + carry @ p["h"]["kernel"])
  if architecture == "gru":
    r = _sigmoid(x @ p["ir"]["kernel"] + p["ir"]["bias"] + carry @ p["hr"]["kernel"])
    z = _sigmoid(x @ p["iz"]["kernel"] + p["iz"]["bias"] + carry @ p["hz"]["kernel"])
    n = np.tanh(x @ p["in"]["kernel"] + p["in"]["bias"] + r * (carry @ p["hn"]["kernel"] + p["hn"]["bias"]))
    return (1.0 - z) * n + z * carry
  h, c = carry  # LSTM: gates from W_i* x + W_h* h + b_h*
  gate = {name: x @ p[f"i{name}"]["kernel"] + h @ p[f"h{name}"]["kernel"] + p[f"h{name}"]["bias"]
          for name in "ifgo"}
  c = _sigmoid(gate["f"]) * c + _sigmoid(gate["i"]) * np.tanh(gate["g"])
  return _sigmoid(gate["o"]) * np.tanh(c), c


@pytest.mark.slow
@pytest.mark.parametrize("architecture", ["rnn", "lstm", "gru"])
def test_recurrent_forecaster_equals_a_numpy_unroll_of_the_cell(architecture):
  """Each layer starts from a zero state and runs the cell over the window; the head reads the top layer's
  last hidden state."""
  config = CONFIG.replace(architecture=architecture, num_layers=2)
  params = _params(config)
  p = as_numpy(params)
  x = np.asarray(INPUTS, np.float64)  # [batch, input_length, num_features]
  for index in range(config.num_layers):
    zeros = np.zeros((BATCH, config.d_model))
    carry = (zeros, zeros) if architecture == "lstm" else zeros
    outputs = []
    for hour in range(config.input_length):
      carry = _cell_step(architecture, p[f"layer_{index}"], carry, x[:, hour])
      outputs.append(carry[0] if architecture == "lstm" else carry)
    x = np.stack(outputs, axis=1)  # [batch, input_length, d_model]
  expected = x[:, -1] @ p["head"]["kernel"] + p["head"]["bias"]
  np.testing.assert_allclose(_forward(config, params), expected, rtol=1e-4, atol=1e-5)


def test_dlinear_equals_numpy_decomposition_and_two_linear_maps():
  """Trend: the mean of the 3 hours centred on each, the ends repeated once; seasonal: the rest; each mapped
  over the window to the horizons, summed (Zeng et al. 2023, section 4)."""
  config = CONFIG.replace(architecture="dlinear")
  params = _params(config)
  p = as_numpy(params)
  target = np.asarray(INPUTS, np.float64)[:, :, 0]  # [batch, input_length]
  padded = np.concatenate([target[:, :1], target, target[:, -1:]], axis=1)
  trend = np.stack([padded[:, hour:hour + 3].mean(axis=1) for hour in range(config.input_length)], axis=1)
  expected = ((target - trend) @ p["seasonal"]["kernel"] + p["seasonal"]["bias"]
              + trend @ p["trend"]["kernel"] + p["trend"]["bias"])
  np.testing.assert_allclose(_forward(config, params), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_patchtst_forecasts_move_with_the_window_level_and_scale():
  """Instance normalisation: a window scaled by a > 0 and shifted by b gives forecasts a * f + b (exactly, but
  for the variance's epsilon, which a wide window makes negligible)."""
  config = CONFIG.replace(architecture="patchtst")
  params = _params(config)
  inputs = INPUTS * 10.0
  moved = inputs.at[..., 0].set(inputs[..., 0] * 3.0 + 5.0)
  np.testing.assert_allclose(_forward(config, params, moved), 3.0 * _forward(config, params, inputs) + 5.0,
                             rtol=1e-4, atol=1e-3)


@pytest.mark.slow
def test_patchtst_tokens_are_the_normalised_target_patches():
  """The Encoder sees ``num_patches`` tokens, each the patch embedding of ``patch_length`` normalised hours."""
  config = CONFIG.replace(architecture="patchtst")
  params = _params(config)
  _, state = make_forecaster(config).apply({"params": params}, INPUTS, capture_intermediates=True,
                                            mutable=["intermediates"])
  embedded = state["intermediates"]["patch_embedding"]["__call__"][0]
  assert embedded.shape == (BATCH, config.num_patches, config.d_model) == (BATCH, 3, config.d_model)
  target = np.asarray(INPUTS, np.float64)[:, :, 0]
  normalized = (target - target.mean(1, keepdims=True)) / np.sqrt(target.var(1, keepdims=True) + 1e-5)
  padded = np.concatenate([normalized, normalized[:, -1:], normalized[:, -1:]], axis=1)  # stride 2 copies
  tokens = np.stack([padded[:, start:start + 4] for start in (0, 2, 4)], axis=1)  # [batch, 3, patch_length]
  kernel = as_numpy(params)["patch_embedding"]
  np.testing.assert_allclose(embedded, tokens @ kernel["kernel"] + kernel["bias"], rtol=1e-4, atol=1e-5)


def _input_jacobian(config, params):
  """d forecasts[0] / d inputs: ``[num_horizons, batch, input_length, num_features]``."""
  return jax.jacobian(lambda inputs: _forward(config, params, inputs)[0])(INPUTS)


@pytest.mark.parametrize("architecture, reads_target_only", [
    ("rnn", False), ("lstm", False), ("gru", False), ("transformer", False), ("transformer_encoder", False),
    ("patchtst", True), ("dlinear", True)])
def test_input_features_auto_is_each_architectures_published_choice(architecture, reads_target_only):
  config = CONFIG.replace(architecture=architecture)
  assert config.input_features == "auto" and config.reads_target_only is reads_target_only
  assert config.num_input_channels == (1 if reads_target_only else CONFIG.num_features)
  explicit = config.replace(input_features="target" if reads_target_only else "all")
  assert explicit.reads_target_only is reads_target_only
  assert config.replace(input_features="all").num_input_channels == CONFIG.num_features
  assert config.replace(input_features="target").num_input_channels == 1


@pytest.mark.slow
@pytest.mark.parametrize("changes", ARCHITECTURE_VARIANTS)
def test_auto_input_features_give_the_same_parameters_and_forecasts_as_the_published_choice(changes):
  """The default ("auto") is the published choice itself, so every config from before the setting keeps its
  parameters and forecasts."""
  config = CONFIG.replace(**changes)
  explicit = config.replace(input_features="target" if config.architecture in TARGET_ONLY else "all")
  params = _params(config)
  assert jax.tree.map(jnp.shape, params) == jax.tree.map(jnp.shape, _params(explicit))
  np.testing.assert_array_equal(_forward(config, params), _forward(explicit, params))


@pytest.mark.slow
@pytest.mark.parametrize("changes", ARCHITECTURE_VARIANTS)
def test_target_input_features_read_the_target_alone(changes):
  """``input_features="target"``: every architecture's forecasts move with feature 0 only (zero gradient with
  respect to every other feature), at every hour of the window."""
  config = CONFIG.replace(input_features="target", **changes)
  params = _params(config)
  forecasts = _forward(config, params)
  assert forecasts.shape == (BATCH, config.num_horizons) and forecasts.dtype == jnp.float32
  jacobian = _input_jacobian(config, params)
  np.testing.assert_array_equal(jacobian[:, 1:], 0.0)
  np.testing.assert_array_equal(jacobian[:, 0, :, 1:], 0.0)
  assert np.all(np.abs(jacobian[:, 0, :, 0]) > 0.0)  # every horizon, every hour of the target


@pytest.mark.slow
@pytest.mark.parametrize("architecture", TARGET_ONLY)
def test_multichannel_patchtst_and_dlinear_read_every_channel(architecture):
  """``input_features="all"``: PatchTST and DLinear forecasts move with every feature of the own window
  (nonzero gradient), and with no other row's."""
  config = CONFIG.replace(architecture=architecture, input_features="all")
  params = _params(config)
  forecasts = _forward(config, params)
  assert forecasts.shape == (BATCH, config.num_horizons) and forecasts.dtype == jnp.float32
  jacobian = _input_jacobian(config, params)
  np.testing.assert_array_equal(jacobian[:, 1:], 0.0)
  assert np.all(np.abs(jacobian[:, 0]).sum(axis=1) > 0.0)  # every horizon, every feature


def test_multichannel_dlinear_sums_each_channels_two_linear_maps():
  """Several channels: each channel's trend and rest mapped over the window to the target's horizons, every
  channel's maps summed (channel ``c``'s rows of each kernel: ``c * input_length`` on)."""
  config = CONFIG.replace(architecture="dlinear", input_features="all")
  params = _params(config)
  p = as_numpy(params)
  length = config.input_length
  assert p["trend"]["kernel"].shape == (config.num_features * length, config.num_horizons)
  expected = p["seasonal"]["bias"] + p["trend"]["bias"]
  for channel in range(config.num_features):
    series = np.asarray(INPUTS, np.float64)[:, :, channel]  # [batch, input_length]
    padded = np.concatenate([series[:, :1], series, series[:, -1:]], axis=1)
    trend = np.stack([padded[:, hour:hour + 3].mean(axis=1) for hour in range(length)], axis=1)
    rows = slice(channel * length, (channel + 1) * length)
    expected = (expected + (series - trend) @ p["seasonal"]["kernel"][rows]
                + trend @ p["trend"]["kernel"][rows])
  np.testing.assert_allclose(_forward(config, params), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_multichannel_patchtst_encodes_each_channel_alone_and_flattens_all_into_the_head():
  """Several channels: each channel's normalised patches are a token sequence of its own through the shared
  embedding and encoder (a channel's states are those of the one-channel model on that channel alone); the
  head reads every channel's states; the forecast takes the target's window level and scale."""
  config = CONFIG.replace(architecture="patchtst", input_features="all")
  params = _params(config)
  assert params["head"]["kernel"].shape == (config.num_features * config.num_patches * config.d_model,
                                            config.num_horizons)
  _, state = make_forecaster(config).apply({"params": params}, INPUTS, capture_intermediates=True,
                                            mutable=["intermediates"])
  encoded = state["intermediates"]["encoder"]["__call__"][0]  # [batch * channels, patches, d_model]
  assert encoded.shape == (BATCH * config.num_features, config.num_patches, config.d_model)
  single = CONFIG.replace(architecture="patchtst", input_features="target")
  single_params = {**params, "head": {"kernel": params["head"]["kernel"][:config.num_patches * config.d_model],
                                      "bias": params["head"]["bias"]}}
  for channel in range(config.num_features):
    moved = INPUTS.at[..., 0].set(INPUTS[..., channel])  # the channel as the one-channel model's target
    _, alone = make_forecaster(single).apply({"params": single_params}, moved, capture_intermediates=True,
                                             mutable=["intermediates"])
    np.testing.assert_allclose(encoded.reshape(BATCH, config.num_features, *encoded.shape[1:])[:, channel],
                               alone["intermediates"]["encoder"]["__call__"][0], rtol=1e-5, atol=1e-5)
  # Only the target channel's level and scale move the forecast as a * f + b; the others are normalised away.
  inputs = INPUTS * 10.0
  moved = inputs.at[..., 0].set(inputs[..., 0] * 3.0 + 5.0).at[..., 1].set(inputs[..., 1] * 2.0 - 1.0)
  np.testing.assert_allclose(_forward(config, params, moved), 3.0 * _forward(config, params, inputs) + 5.0,
                             rtol=1e-4, atol=1e-3)


def _sine_windows(rng, count, input_length, horizons, noise=0.1, period=12.0):
  """Windows of a noisy sine with a random phase each: inputs ``[count, input_length, 1]`` (the noisy
  series) and targets ``[count, len(horizons)]``, the noisy values ``h`` hours after the window's end."""
  hours = np.arange(input_length + max(horizons))
  phases = rng.uniform(0, 2 * np.pi, (count, 1))
  series = np.sin(2 * np.pi * hours / period + phases) + noise * rng.normal(size=(count, len(hours)))
  inputs = series[:, :input_length, None]
  targets = series[:, [input_length - 1 + h for h in horizons]]
  return jnp.asarray(inputs, jnp.float32), jnp.asarray(targets, jnp.float32)


@pytest.mark.slow
@pytest.mark.parametrize("architecture", ["gru", "transformer", "patchtst", "dlinear"])
def test_a_tiny_model_fits_a_noisy_sine(architecture):
  """h hours ahead of a sine of period 12 with noise 0.1: a constant forecast scores 0.5 MSE, the best
  one 0.01 (the target's own noise) plus the input noise's share."""
  horizons = (1, 3, 6)
  config = ForecasterConfig(architecture=architecture, num_features=1, input_length=12,
                            num_horizons=len(horizons), d_model=16, num_layers=1, num_heads=2, d_ff=32,
                            dropout_rate=0.0, deterministic=True, patch_length=4, patch_stride=2,
                            moving_average=5)
  rng = np.random.default_rng(0)
  train_inputs, train_targets = _sine_windows(rng, 512, config.input_length, horizons)
  test_inputs, test_targets = _sine_windows(rng, 256, config.input_length, horizons)
  model = make_forecaster(config)
  optimizer = optax.adam(1e-2)

  def loss_fn(params, inputs, targets):
    return jnp.mean((model.apply({"params": params}, inputs) - targets) ** 2)

  @jax.jit  # one program (init, the steps, the test loss): one compilation
  def trained_test_loss():
    def step(carry, batch_index):
      params, opt_state = carry
      rows = jax.lax.dynamic_slice_in_dim(jnp.arange(512), (batch_index % 8) * 64, 64)
      grads = jax.grad(loss_fn)(params, train_inputs[rows], train_targets[rows])
      updates, opt_state = optimizer.update(grads, opt_state, params)
      return (optax.apply_updates(params, updates), opt_state), None
    params = model.init(jax.random.key(0), train_inputs[:1])["params"]
    (trained, _), _ = jax.lax.scan(step, (params, optimizer.init(params)), jnp.arange(200))
    return loss_fn(trained, test_inputs, test_targets)

  test_loss = float(trained_test_loss())
  assert test_loss < 0.05, test_loss


@pytest.mark.parametrize("changes, pattern", [
    (dict(architecture="tcn"), "ForecasterConfig.architecture='tcn' is not supported; choose one of "
                               "['rnn', 'lstm', 'gru', 'transformer', 'transformer_encoder', 'patchtst', "
                               "'dlinear']"),
    (dict(num_heads=3), "ForecasterConfig.num_heads=3 does not divide d_model=8; choose num_heads from "
                        "[1, 2, 4, 8] or change d_model"),
    (dict(num_heads=8, positional_encoding="rotary"),
     "ForecasterConfig.positional_encoding='rotary'"),
    (dict(pooling="first"), "ForecasterConfig.pooling='first' is not supported; choose one of ['last', 'mean']"),
    (dict(positional_encoding="alibi"), "ForecasterConfig.positional_encoding='alibi'"),
    (dict(input_length=0), "ForecasterConfig.input_length"),
    (dict(num_horizons=2.0), "ForecasterConfig.num_horizons"),
    (dict(dropout_rate=1.0), "ForecasterConfig.dropout_rate=1.0 is outside [0, 1); use 0.0 to disable dropout"),
    (dict(dtype="float16"), "ForecasterConfig.dtype='float16'"),
    (dict(architecture="patchtst", patch_length=7), "ForecasterConfig.patch_length=7 is longer than the window "
                                                     "(input_length=6); choose patch_length <= input_length"),
    (dict(architecture="dlinear", moving_average=4), "ForecasterConfig.moving_average=4"),
    (dict(patch_stride=0), "ForecasterConfig.patch_stride"),
    (dict(input_features="pm25"), "ForecasterConfig.input_features='pm25' is not supported; choose one of "
                                  "['auto', 'all', 'target']"),
])
def test_config_validation_names_field_value_and_fix(changes, pattern):
  with pytest.raises(ConfigError, match=re.escape(pattern)):
    CONFIG.replace(**changes)


def test_config_ignores_transformer_fields_for_recurrent_architectures_and_rejects_unknown_fields():
  assert CONFIG.replace(architecture="gru", num_heads=3).num_heads == 3  # heads mean nothing to a GRU
  with pytest.raises(ValueError, match="ForecasterConfig has no field 'hidden_dim'"):
    CONFIG.replace(hidden_dim=4)
  with pytest.raises(ValueError, match="Did you mean 'num_horizons'"):
    ForecasterConfig.from_dict({"num_horizon": 5})


@pytest.mark.parametrize("architecture", ["gru", "transformer"])
def test_inputs_of_another_shape_than_the_config_are_rejected(architecture):
  config = CONFIG.replace(architecture=architecture)
  with pytest.raises(ValueError, match=re.escape("Forecaster inputs must be [batch, input_length, "
                                                 "num_features] = [batch, 6, 3], got [3, 6, 2]")):
    make_forecaster(config).init(jax.random.key(0), INPUTS[..., :2])
