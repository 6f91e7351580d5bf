"""Hourly time-series forecasting: a window of features in, one value per horizon out (``model_name="forecaster"``).

The project's regression task on continuous inputs. Batches are windows of one hourly series
(``transformer.data.timeseries.WindowedSeries``)::

    {"inputs": float32 [batch, input_length, num_features], "targets": float32 [batch, num_horizons],
     "target_mask": bool [batch, num_horizons], "time": int32 [batch], "origin": int32 [batch]}

Forecast: the model's outputs, plus (``config.task.residual``) the last input hour's pm2.5 feature, so that a
model learns the change from persistence rather than the level. Loss: mean absolute (``config.task.loss="mae"``;
its minimiser, the median, is the median in ug/m3 too, what the MAE rewards) or squared (``"mse"``) error of the
standardised ``log1p(pm2.5)`` over the observed targets. Metrics, in ug/m3 after inverting the normalisation (``forecast_concentration``):
``mae`` and ``mse`` over all horizons and ``mae_<h>h`` / ``mse_<h>h`` per horizon, summed in the compiled
eval step (so a ``num_seeds > 1`` run gets them per seed); ``rmse`` and ``rmse_<h>h`` come from the host-side
``evaluate`` (one seed), or as ``sqrt(mse)`` from the per-seed values.

``config.task``: ``transformer.tasks.configs.ForecastingConfig`` (the series, the horizons, the loss, residual
forecasts). The window length is ``config.model.input_length``.

Splits: ``train`` fits the model and the normalisation, ``validation`` is evaluated during training (best
checkpoint), ``test`` is scored by ``predict_split`` / ``--mode=predict`` (the forecasts CSV) and the
results script.
"""
from __future__ import annotations

import csv
import functools
import os
from typing import Mapping

import jax
import jax.numpy as jnp
import numpy as np

from transformer.data import timeseries
from transformer.data.beijing_pm25 import features as pm25_features
from transformer.data.beijing_pm25.beijing_pm25_dataset_builder import (WEATHER_COLUMNS, WIND_DIRECTIONS,
                                                                         check_columns)
from transformer.data.files import replacing
from transformer.errors import ConfigError
from transformer.nn import ForecasterConfig, make_forecaster, split_rows, unboxed
from transformer.tasks.base import Task
from transformer.tasks.configs import ForecastingConfig
from transformer.tasks.metrics import forecast_metrics

# Forecasts are clipped to [0, expm1(MAX_LOG_CONCENTRATION)] = [0, ~22,000] ug/m3 (the record is under 1,000):
# an untrained model's wild outputs stay finite in the metrics.
MAX_LOG_CONCENTRATION = 10.0
PREDICTIONS_FILE = "forecasts_test.csv"
PREDICT_BATCH_SIZE = 512  # windows per forecast call of predict_split and the evaluation
PM25_FEATURE = pm25_features.FEATURE_NAMES.index("pm25")  # standardised log1p(pm2.5), as the targets
SYNTHETIC_SPLITS = {"train": 0.6, "validation": 0.2, "test": 0.2}  # fractions of the generated series


def synthetic_columns(num_hours: int, seed: int = 0) -> dict[str, np.ndarray]:
  """A made-up hourly series with the raw columns of ``read_csv``, from the first hour of 2010.

  pm2.5 follows a daily cycle times a slow AR(1) level, so both the hour of day and the recent past help a
  forecast; about 3% of the hours are missing (NaN), in runs, as in the real file.

  Returns:
    ``{"time": datetime64[h], "pm25": float64 (NaN where missing), WEATHER_COLUMNS...: float64,
    "cbwd": int64}``, each ``[num_hours]``.
  """
  rng = np.random.default_rng(seed)
  hours = np.arange(num_hours)
  level = np.zeros(num_hours)
  noise = rng.normal(0.0, 0.15, num_hours)
  for hour in range(1, num_hours):  # a slow AR(1): weather-like episodes lasting days
    level[hour] = 0.97 * level[hour - 1] + noise[hour]
  daily = 0.5 * np.sin(2 * np.pi * hours / 24)
  pm25 = np.exp(4.0 + level + daily + rng.normal(0.0, 0.1, num_hours))
  missing_starts = rng.random(num_hours) < 0.005
  missing = np.convolve(missing_starts, np.ones(6), mode="same") > 0  # runs of ~6 hours
  weather = {name: rng.normal(0.0, 1.0, num_hours) for name in WEATHER_COLUMNS}
  weather["DEWP"] = level * 5.0 + rng.normal(0.0, 1.0, num_hours)  # a weather column that carries signal
  return {"time": np.datetime64("2010", "h") + hours.astype("timedelta64[h]"),
          "pm25": np.where(missing, np.nan, pm25), **weather,
          "cbwd": rng.integers(0, len(WIND_DIRECTIONS), num_hours)}


def synthetic_split_bounds(num_hours: int) -> dict[str, tuple[int, int]]:
  """``SYNTHETIC_SPLITS`` as consecutive ``[start, stop)`` hours."""
  bounds, start = {}, 0
  for index, (split, fraction) in enumerate(SYNTHETIC_SPLITS.items()):
    stop = num_hours if index == len(SYNTHETIC_SPLITS) - 1 else start + int(round(fraction * num_hours))
    bounds[split] = (start, stop)
    start = stop
  return bounds


@functools.lru_cache(maxsize=4)
def load_series(dataset: str, data_dir: str = "", source_dir: str = "",
                synthetic_hours: int = 0) -> pm25_features.PM25Series:
  """The prepared series of ``dataset`` (cached: tasks built again for eval or loading reuse it)."""
  if dataset == "synthetic":
    columns = synthetic_columns(synthetic_hours)
    return pm25_features.prepare(columns, synthetic_split_bounds(synthetic_hours))
  return pm25_features.load(data_dir=data_dir or None, source_dir=source_dir or None)


@functools.lru_cache(maxsize=8)
def _compiled_forecaster(model_config: ForecasterConfig):
  """A compiled ``(params, inputs [batch, L, F]) -> the model's outputs [batch, H]``, shared by every task
  (and seed) with this model (deterministic ``model_config``)."""
  model = make_forecaster(model_config)
  return jax.jit(lambda params, inputs: split_rows(lambda rows: model.apply({"params": params}, rows), inputs))


def forecast_concentration(log_values, xp=np):
  """Forecasts of ``log1p(ug/m3)`` -> ug/m3, clipped to ``[0, expm1(MAX_LOG_CONCENTRATION)]``.
  ``xp``: ``numpy`` (host, float64) or ``jax.numpy`` (inside the compiled step)."""
  return xp.expm1(xp.clip(log_values, 0.0, MAX_LOG_CONCENTRATION))


class ForecastingTask(Task):
  """See the module docstring for ``config.task``."""
  task_config_class = ForecastingConfig
  task_config: ForecastingConfig

  def __init__(self, settings):
    super().__init__(settings)
    task = self.task_config
    self.horizons = task.horizons
    if settings.model_name != "forecaster":
      raise ConfigError(f"config.model_name={settings.model_name!r}: the forecasting task trains the 'forecaster' "
                        "model; use a variant of experiments/beijing_pm25.py.")
    self.series = load_series(task.dataset, task.data_dir, task.source_dir, task.synthetic_hours)
    self.input_length = settings.model.input_length
    self.residual = task.residual
    self._log_mean = float(self.series.standardization.mean[0])
    self._log_std = float(self.series.standardization.std[0])

  def data_fingerprint(self) -> dict[str, str]:
    """``"beijing_pm25/<file>"`` -> size and SHA-256 of the raw file the series was prepared from
    (``transformer.data.source_files.data_fingerprint``): a run records it and compares it at eval. Empty for the
    synthetic series, a function of the config alone."""
    return dict(self.series.source_fingerprint)

  # --- model -----------------------------------------------------------------------------------------------

  def model_config(self) -> ForecasterConfig:
    decided = {"num_features": len(self.series.feature_names), "num_horizons": len(self.horizons)}
    for name, value in decided.items():
      if getattr(self.settings.model, name) != value:
        raise ConfigError(f"config.model.{name}={getattr(self.settings.model, name)}, but the data gives {value} "
                          f"({'features per hour' if name == 'num_features' else 'config.task.horizons'}); "
                          f"set --config.model.{name}={value}.")
    return self.settings.model

  def build_model(self, model_config):
    return make_forecaster(model_config)

  def init_inputs(self, batch):
    return (batch["inputs"],)

  def placeholder_inputs(self):
    return (np.zeros((1, self.input_length, len(self.series.feature_names)), np.float32),)

  # --- data ------------------------------------------------------------------------------------------------

  def windows(self, split: str) -> timeseries.WindowedSeries:
    """The windows of ``split`` (``train``, ``validation``, ``test``)."""
    return self.series.windows(split, self.input_length, self.horizons)

  def train_iterator(self, batch_size, seed):
    return self.windows("train").train_iterator(batch_size, seed)

  def eval_batches(self, batch_size, split: str | None = None):
    split = split or "validation"
    if split not in self.series.split_bounds:
      raise KeyError(split)  # an evaluator of a split the series lacks (the loop names it)
    return self.windows(split).eval_batches(batch_size)

  def count_tokens(self, batch) -> int:
    """Work per batch for the throughput log: input hours of the real windows (``tokens_per_second``)."""
    return int(np.count_nonzero(np.asarray(batch["origin"]) >= 0)) * self.input_length

  # --- loss and metrics ------------------------------------------------------------------------------------

  def standardized_forecast(self, outputs, inputs):
    """The model's ``outputs`` ``[batch, H]`` as standardised ``log1p`` forecasts: with ``residual``, plus the
    last input hour's (forward-filled) pm2.5 of ``inputs`` ``[batch, L, F]``, which is in the same units."""
    return outputs + inputs[:, -1, PM25_FEATURE][:, None] if self.residual else outputs

  def to_log_concentration(self, standardized):
    """Standardised targets or forecasts -> ``log1p(ug/m3)``."""
    return standardized * self._log_std + self._log_mean

  def loss_and_metrics(self, model, params, batch, dropout_rng):
    outputs = model.apply({"params": params}, batch["inputs"],
                          rngs={"dropout": dropout_rng} if dropout_rng is not None else None)
    forecasts = self.standardized_forecast(outputs, batch["inputs"])
    mask = batch["target_mask"].astype(jnp.float32)  # [batch, num_horizons]
    errors = forecasts - batch["targets"]
    losses = jnp.square(errors) if self.task_config.loss == "mse" else jnp.abs(errors)
    weight_sum = jnp.sum(mask)
    loss_sum = jnp.sum(losses * mask)
    # In ug/m3; an unobserved target (0 in standardised space) is masked out after the inversion.
    concentration_errors = (forecast_concentration(self.to_log_concentration(forecasts), jnp)
                            - jnp.expm1(self.to_log_concentration(batch["targets"])))
    absolute = jnp.abs(concentration_errors) * mask
    squared = jnp.square(concentration_errors) * mask
    counts = jnp.sum(mask, axis=0)  # [num_horizons]
    metrics = {"loss": (loss_sum, weight_sum), "mae": (jnp.sum(absolute), weight_sum),
               "mse": (jnp.sum(squared), weight_sum)}
    for index, horizon in enumerate(self.horizons):
      metrics[f"mae_{horizon}h"] = (jnp.sum(absolute[:, index]), counts[index])
      metrics[f"mse_{horizon}h"] = (jnp.sum(squared[:, index]), counts[index])
    return loss_sum, weight_sum, metrics

  # --- host-side forecasts ---------------------------------------------------------------------------------

  def _predict_fn(self, model_config):
    return _compiled_forecaster(model_config.replace(deterministic=True))

  def forecast_features(self, model_config, params, inputs, batch_size: int = PREDICT_BATCH_SIZE) -> np.ndarray:
    """float64 ug/m3 ``[windows, num_horizons]`` forecasts of prepared feature windows ``[windows, L, F]``."""
    inputs = np.asarray(inputs, np.float32)
    predict = self._predict_fn(model_config)
    outputs = []
    for start in range(0, len(inputs), batch_size):
      chunk = inputs[start:start + batch_size]
      padded = np.concatenate([chunk, np.zeros((batch_size - len(chunk),) + chunk.shape[1:], np.float32)])
      outputs.append(self.standardized_forecast(np.asarray(predict(params, padded), np.float64)[:len(chunk)],
                                                chunk.astype(np.float64)))
    standardized = np.concatenate(outputs) if outputs else np.zeros((0, len(self.horizons)))
    return forecast_concentration(self.to_log_concentration(standardized))

  def predict_split(self, model_config, params, split: str) -> dict[str, np.ndarray]:
    """Every window of ``split``: ``{"forecast", "actual" (NaN where unobserved), "mask": [windows, H],
    "origin_time": datetime64[h] [windows], "target_time": datetime64[h] [windows, H]}``, in ug/m3."""
    batches = self.windows(split).eval_batches(PREDICT_BATCH_SIZE)
    return self.split_prediction(split, self.evaluate_batches(model_config, params, batches))

  def split_prediction(self, split: str, forecasts: list[np.ndarray]) -> dict[str, np.ndarray]:
    """``predict_split``'s dict from the forecasts of each of its batches, in order."""
    windows = self.windows(split)
    actual, mask = self.series.concentration_targets(windows)
    target_hours = windows.target_hours(np.arange(windows.num_windows))
    return {"forecast": np.concatenate(forecasts), "actual": actual, "mask": mask,
            "origin_time": self.series.times[windows.origins], "target_time": self.series.times[target_hours]}

  def evaluation_batches(self, batches):
    del batches  # the validation windows in the batches of predict_split, so that both give the same numbers
    return self.windows("validation").eval_batches(PREDICT_BATCH_SIZE)

  def evaluate_batches(self, model_config, params, batches):
    """Per batch of windows, float64 ug/m3 ``[real windows, num_horizons]`` forecasts."""
    return [self.forecast_features(model_config, params, batch["inputs"][batch["origin"] >= 0])
            for batch in batches]

  def score_outputs(self, outputs):
    """RMSE in ug/m3 over all horizons and per horizon on the validation split (float64, host), and one
    example forecast."""
    predicted = self.split_prediction("validation", outputs)
    metrics = forecast_metrics(predicted["forecast"], np.nan_to_num(predicted["actual"]), predicted["mask"])
    mask = predicted["mask"]
    errors = np.where(mask, predicted["forecast"] - np.nan_to_num(predicted["actual"]), 0.0)
    results = {"rmse": float(np.sqrt(np.sum(errors ** 2) / max(mask.sum(), 1)))}
    results.update({f"rmse_{h}h": float(v) for h, v in zip(self.horizons, metrics["rmse"])})
    row = len(mask) // 2
    example = (f"origin {predicted['origin_time'][row]}: " + ", ".join(
        f"+{h}h {f:.0f} (actual {a:.0f})" for h, f, a in
        zip(self.horizons, predicted["forecast"][row], predicted["actual"][row])) + " ug/m3")
    return results, [example]

  def seed_params(self, model_config, params) -> list:
    """``params`` split into one tree per seed: those of a ``num_seeds > 1`` run's state carry a leading seed
    axis (``--mode=predict`` passes them so), those of one seed (``transformer.load``) do not."""
    model = make_forecaster(model_config.replace(deterministic=True))
    shapes = unboxed(jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), *self.placeholder_inputs()))["params"])
    leaf, reference = jax.tree.leaves(params)[0], jax.tree.leaves(shapes)[0]
    if np.ndim(leaf) == len(reference.shape):
      return [params]
    return [jax.tree.map(lambda x, i=i: np.asarray(x)[i], params) for i in range(np.shape(leaf)[0])]

  def write_predictions(self, model_config, params, output_dir: str) -> str:
    """``forecasts_test.csv``: one row per test window and horizon, ``timestamp`` (the forecast origin, the
    window's last hour), ``horizon`` (hours), ``target_time``, ``forecast`` and ``actual`` in ug/m3
    (``actual`` empty where pm2.5 was not measured). Parameters of several seeds (``num_seeds > 1``): ``forecast``
    is their mean, and ``forecast_seed_<i>`` columns follow."""
    seeds = [self.predict_split(model_config, p, "test") for p in self.seed_params(model_config, params)]
    predicted = seeds[0]
    forecast = np.mean([seed["forecast"] for seed in seeds], axis=0)
    path = os.path.join(output_dir, PREDICTIONS_FILE)
    per_seed = [f"forecast_seed_{i}" for i in range(len(seeds))] if len(seeds) > 1 else []
    with replacing(path, newline="") as f:  # a full disk or an error midway keeps the old file whole
      writer = csv.writer(f)
      writer.writerow(["timestamp", "horizon", "target_time", "forecast", "actual"] + per_seed)
      for row, origin in enumerate(predicted["origin_time"]):
        for index, horizon in enumerate(self.horizons):
          actual = predicted["actual"][row, index]
          writer.writerow([str(origin), horizon, str(predicted["target_time"][row, index]),
                           f"{forecast[row, index]:.3f}", f"{actual:.1f}" if predicted["mask"][row, index] else ""]
                          + ([f"{seed['forecast'][row, index]:.3f}" for seed in seeds] if per_seed else []))
    return path

  def forecast(self, model_config, params, window) -> np.ndarray:
    """Forecasts in ug/m3 from one window of raw hourly rows or of prepared features.

    Args:
      window: either raw rows, a mapping of the columns ``read_csv`` returns (``time``, ``pm25`` with NaN
        where missing, ``DEWP`` ... ``Ir``, ``cbwd`` as an index into ``WIND_DIRECTIONS``) over at least
        ``input_length`` consecutive hours, the last being the forecast origin (normalised with the
        training statistics; missing pm2.5 is forward-filled within the rows given, and at least one row must
        hold a measurement; ``beijing_pm25_dataset_builder.check_columns`` names a bad row); or prepared features
        float ``[input_length, num_features]`` (``PM25Series.features`` rows), or a batch of them
        ``[windows, input_length, num_features]``.

    Returns:
      float64 ``[num_horizons]`` (``[windows, num_horizons]`` for a batch of feature windows), for the
      hours ``origin + h`` of ``config.task.horizons``.

    Raises:
      ValueError: one line naming the row and column of rows out of time order, a NaN or infinite value (NaN
        pm2.5 means not measured), a pm2.5 outside ``PM25_RANGE``, rows without any measured pm2.5, or a
        wrong shape.
    """
    if isinstance(window, Mapping):
      inputs = self.features_of_rows(window)
    else:
      inputs = np.asarray(window, np.float32)
    single = inputs.ndim == 2
    inputs = inputs[None] if single else inputs
    expected = (self.input_length, len(self.series.feature_names))
    if inputs.ndim != 3 or inputs.shape[1:] != expected:
      raise ValueError(f"forecast: a feature window must be [input_length, num_features] = {list(expected)} "
                       f"(or a batch of them); got {list(np.shape(window))}. Raw rows go in as a dict of "
                       f"columns.")
    bad = ~np.isfinite(inputs)
    if bad.any():
      index, row, feature = (int(i) for i in np.argwhere(bad)[0])
      where = f"row {row}" if single else f"window {index}, row {row}"
      raise ValueError(f"forecast: the feature windows hold {int(bad.sum())} NaN or infinite value(s), the first "
                       f"at {where}, feature {self.series.feature_names[feature]} ({inputs[index, row, feature]}); "
                       "prepared features are finite (PM25Series.features); raw rows with missing pm2.5 go in as a "
                       "dict of columns.")
    forecasts = self.forecast_features(model_config, params, inputs)
    return forecasts[0] if single else forecasts

  def features_of_rows(self, columns: Mapping[str, np.ndarray]) -> np.ndarray:
    """float32 ``[input_length, num_features]``: the model's window of the last ``input_length`` raw rows."""
    needed = ("time", "pm25", "cbwd") + WEATHER_COLUMNS
    missing = [name for name in needed if name not in columns]
    if missing:
      raise ValueError(f"forecast: the raw rows lack the columns {missing}; give {list(needed)} "
                       f"(as transformer.data.beijing_pm25.read_csv returns them).")
    hours = len(columns["time"])
    if hours < self.input_length:
      raise ValueError(f"forecast: {hours} rows given; the model reads the last {self.input_length} hours.")
    check_columns(columns, "forecast")
    prepared = pm25_features.prepare({name: np.asarray(columns[name]) for name in needed},
                                     {"rows": (0, hours)}, fit_split="rows",
                                     standardization=self.series.standardization)
    return prepared.features[-self.input_length:]
