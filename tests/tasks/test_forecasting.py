"""The forecasting task end to end on a generated series: training through ``run``, metrics in ug/m3 against a
numpy recomputation from the model's outputs, the predictions CSV, vmapped seeds and ``load(...).forecast``."""
import csv
import json
import os

import jax
import numpy as np
import pytest

from tests.train.conftest import load_experiment_config
from transformer import load
from transformer.errors import ConfigError
from transformer.data.beijing_pm25.features import FEATURE_NAMES
from transformer.nn import make_forecaster
from transformer.nn.forecasters import TARGET_FEATURE
from transformer.train.config import build_task
from transformer.tasks.forecasting import PM25_FEATURE, PREDICTIONS_FILE, synthetic_columns
from transformer.train import run

HOURS = 1200  # splits of 720 / 240 / 240 hours
INPUT_LENGTH = 24


def small_config(**overrides):
  """``experiments/beijing_pm25.py:tiny`` shrunk further; ``a__b=v`` sets ``config.a.b``."""
  config = load_experiment_config("beijing_pm25", "tiny")
  config.task.synthetic_hours = HOURS
  config.model.input_length = INPUT_LENGTH
  config.model.d_model = 8
  config.num_train_steps = 24
  config.eval_every = 12
  config.checkpoint_every = 12
  config.log_every = 6
  config.optimizer.warmup_steps = 1
  config.optimizer.learning_rate = 1e-2
  config.eval_batch_size = 64
  config.quiet = True
  config.tensorboard = False
  config.async_checkpointing = False
  for name, value in overrides.items():
    section = config
    *parents, field = name.split("__")
    for parent in parents:
      section = section[parent]
    section[field] = value
  return config


def numpy_metrics(task, params, split="validation"):
  """MAE and RMSE in ug/m3 per horizon and overall, recomputed in float64 numpy from the model's outputs."""
  windows = task.windows(split)
  model = make_forecaster(task.model_config().replace(deterministic=True))
  batch = windows.batch(np.arange(len(windows)))
  outputs = np.asarray(model.apply({"params": params}, batch["inputs"]), np.float64)
  outputs = outputs + batch["inputs"][:, -1, :1]  # residual: the change from the last hour's pm2.5 feature
  mean, std = task.series.standardization.mean[0], task.series.standardization.std[0]
  forecasts = np.expm1(np.clip(outputs * std + mean, 0.0, 10.0))
  hours = windows.target_hours(np.arange(len(windows)))
  actual, mask = task.series.pm25[hours], task.series.target_mask[hours]
  errors = np.where(mask, forecasts - np.where(mask, actual, 0.0), 0.0)
  return {"mae": np.abs(errors).sum() / mask.sum(), "rmse": np.sqrt((errors ** 2).sum() / mask.sum()),
          "mae_h": np.abs(errors).sum(0) / mask.sum(0), "rmse_h": np.sqrt((errors ** 2).sum(0) / mask.sum(0)),
          "forecasts": forecasts, "actual": actual, "mask": mask, "origins": windows.origins}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """A GRU trained 24 steps through ``run``, then evaluated (``--mode=eval``) and predicted (``--mode=predict``)."""
  workdir = str(tmp_path_factory.mktemp("forecast"))
  config = small_config()
  train_output = run(config, workdir, "train")
  eval_output = run(config, workdir, "eval")
  run(config, workdir, "predict")
  return config, workdir, train_output, eval_output


@pytest.mark.slow
def test_training_lowers_the_loss_and_counts_input_hours(trained):
  _, workdir, train_output, _ = trained
  assert train_output.step == 24
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    logged = [record for record in map(json.loads, f) if "train/loss" in record]
  assert logged[-1]["train/loss"] < logged[0]["train/loss"]
  # Throughput counts input hours of real windows (16 windows x 24 hours per step), not integer tokens.
  task = build_task(small_config())
  batch = next(task.train_iterator(batch_size=16, seed=0))
  assert task.count_tokens(batch) == 16 * INPUT_LENGTH
  padded = task.windows("validation").batch(np.arange(5), batch_size=8)
  assert task.count_tokens(padded) == 5 * INPUT_LENGTH


@pytest.mark.slow
def test_eval_metrics_in_ug_per_m3_match_numpy_from_the_model_outputs(trained):
  config, workdir, _, eval_output = trained
  restored = load(workdir)
  assert restored.step == eval_output.step
  expected = numpy_metrics(restored.task, restored.params)
  results = eval_output.metrics
  np.testing.assert_allclose(results["eval/mae"], expected["mae"], rtol=1e-4)
  np.testing.assert_allclose(results["eval/rmse"], expected["rmse"], rtol=1e-6)
  np.testing.assert_allclose(np.sqrt(results["eval/mse"]), expected["rmse"], rtol=1e-4)
  for index, horizon in enumerate(config.task.horizons):
    np.testing.assert_allclose(results[f"eval/mae_{horizon}h"], expected["mae_h"][index], rtol=1e-4)
    np.testing.assert_allclose(results[f"eval/rmse_{horizon}h"], expected["rmse_h"][index], rtol=1e-6)
  assert len(set(np.round(expected["mae_h"], 6))) == len(config.task.horizons)  # horizons really differ


@pytest.mark.slow
def test_predict_writes_one_row_per_test_window_and_horizon(trained):
  config, workdir, _, _ = trained
  restored = load(workdir)
  expected = numpy_metrics(restored.task, restored.params, "test")
  with open(os.path.join(workdir, PREDICTIONS_FILE)) as f:
    rows = list(csv.DictReader(f))
  horizons = list(config.task.horizons)
  assert len(rows) == len(expected["origins"]) * len(horizons)
  times = restored.task.series.times
  for row_index in (0, len(rows) // 2 + 3, len(rows) - 1):
    row = rows[row_index]
    window, horizon_index = divmod(row_index, len(horizons))
    origin = expected["origins"][window]
    assert row["timestamp"] == str(times[origin])
    assert int(row["horizon"]) == horizons[horizon_index]
    assert row["target_time"] == str(times[origin + horizons[horizon_index]])
    np.testing.assert_allclose(float(row["forecast"]), expected["forecasts"][window, horizon_index], atol=2e-3)
    if expected["mask"][window, horizon_index]:
      np.testing.assert_allclose(float(row["actual"]), expected["actual"][window, horizon_index], atol=0.06)
    else:
      assert row["actual"] == ""
  assert sum(row["actual"] == "" for row in rows) == (~expected["mask"]).sum()


@pytest.mark.slow
def test_load_forecast_from_raw_rows_equals_forecast_from_features(trained):
  _, workdir, _, _ = trained
  model = load(workdir)
  series = model.task.series
  start, _ = series.split_bounds["test"]
  # A window whose first hour was measured: forward filling inside the rows then equals the series' filling.
  first = next(hour for hour in range(start, start + 100) if series.target_mask[hour])
  rows = slice(first, first + INPUT_LENGTH)
  columns = {name: values[rows] for name, values in synthetic_columns(HOURS).items()}
  np.testing.assert_allclose(model.task.features_of_rows(columns), series.features[rows], atol=1e-5)
  from_rows = model.forecast(columns)
  from_features = model.forecast(series.features[rows])
  assert from_rows.shape == (len(model.run_config.task.horizons),)
  np.testing.assert_allclose(from_rows, from_features, rtol=1e-5)
  batch = model.forecast(np.stack([series.features[rows]] * 2))
  assert batch.shape == (2, len(model.run_config.task.horizons))
  with pytest.raises(ValueError, match="input_length, num_features"):
    model.forecast(series.features[first:first + INPUT_LENGTH - 1])


@pytest.mark.slow
def test_per_horizon_metrics_weigh_only_observed_targets():
  config = small_config()
  task = build_task(config)
  model_config = task.model_config()
  model = make_forecaster(model_config.replace(deterministic=True))
  batch = task.windows("validation").batch(np.arange(10), batch_size=12)
  batch["target_mask"][0, :2] = False  # unobserved targets, and two padding rows
  params = model.init(jax.random.PRNGKey(0), batch["inputs"])["params"]
  loss_sum, weight_sum, metrics = task.loss_and_metrics(model, params, batch, None)
  outputs = np.asarray(model.apply({"params": params}, batch["inputs"]), np.float64)
  outputs = outputs + batch["inputs"][:, -1, :1]  # residual
  mask = batch["target_mask"]
  assert config.task.loss == "mae" and float(weight_sum) == mask.sum()
  np.testing.assert_allclose(float(loss_sum), np.abs(np.where(mask, outputs - batch["targets"], 0)).sum(), rtol=1e-5)
  config.task.loss, config.task.residual = "mse", False
  loss_sum, _, _ = build_task(config).loss_and_metrics(model, params, batch, None)
  direct = np.asarray(model.apply({"params": params}, batch["inputs"]), np.float64)
  np.testing.assert_allclose(float(loss_sum), (np.where(mask, direct - batch["targets"], 0) ** 2).sum(), rtol=1e-5)
  mean, std = task.series.standardization.mean[0], task.series.standardization.std[0]
  forecasts = np.expm1(np.clip(outputs * std + mean, 0, 10))
  hours = task.windows("validation").target_hours(np.arange(10))
  actual = np.zeros(mask.shape)
  actual[:10] = np.nan_to_num(task.series.pm25[hours])
  errors = np.where(mask, forecasts - actual, 0.0)
  for index, horizon in enumerate(config.task.horizons):
    total, count = metrics[f"mae_{horizon}h"]
    assert float(count) == mask[:, index].sum()
    np.testing.assert_allclose(float(total), np.abs(errors[:, index]).sum(), rtol=1e-4)
    total, _ = metrics[f"mse_{horizon}h"]
    np.testing.assert_allclose(float(total), (errors[:, index] ** 2).sum(), rtol=1e-4)


def test_the_pm25_feature_is_the_forecasters_target_feature():
  """What a forecaster reads as its target (``input_features="target"``, PatchTST, DLinear) is pm2.5: the feature
  the residual forecast adds back and the targets are standardised as."""
  assert FEATURE_NAMES[TARGET_FEATURE] == "pm25" and PM25_FEATURE == TARGET_FEATURE


@pytest.mark.slow
@pytest.mark.parametrize("architecture", ["gru", "dlinear"])
def test_input_features_choose_what_the_task_forecasts_from(architecture):
  """``config.model.input_features``: "target" forecasts (the residual included) from the pm2.5 column alone,
  zero gradient with respect to every other feature; "all" reads the weather too (DLinear included)."""
  for input_features in ("target", "all"):
    task = build_task(small_config(model__architecture=architecture, model__input_features=input_features))
    model_config = task.model_config().replace(deterministic=True)
    assert model_config.input_features == input_features
    model = make_forecaster(model_config)
    inputs = task.windows("validation").batch(np.arange(4))["inputs"]
    params = model.init(jax.random.PRNGKey(0), inputs)["params"]
    # [batch, num_horizons, batch, input_length, num_features] -> of each window's own inputs, summed over hours
    jacobian = jax.jacobian(lambda x: task.standardized_forecast(model.apply({"params": params}, x), x))(inputs)
    own = np.abs(np.stack([jacobian[row, :, row] for row in range(len(inputs))])).sum(axis=2)
    assert np.all(own[..., PM25_FEATURE] > 0)
    others = np.delete(own, PM25_FEATURE, axis=-1)
    if input_features == "target":
      np.testing.assert_array_equal(others, 0.0)
    else:
      assert np.all(others.sum(axis=(0, 1)) > 0)  # every feature reaches some forecast


@pytest.mark.slow
def test_vmapped_seeds_train_and_load_separately(tmp_path):
  config = small_config(num_seeds=2, num_train_steps=6, eval_every=6, model__architecture="transformer_encoder",
                        model__num_heads=2)
  output = run(config, str(tmp_path), "train")
  seeds = [output.metrics[f"eval/mae/seed_{i}"] for i in range(2)]
  assert all(np.isfinite(seeds)) and seeds[0] != seeds[1]
  np.testing.assert_allclose(output.metrics["eval/mae"], np.mean(seeds), rtol=1e-9)
  forecasts = []
  for replica in range(2):
    model = load(str(tmp_path), replica=replica)
    expected = numpy_metrics(model.task, model.params)
    np.testing.assert_allclose(seeds[replica], expected["mae"], rtol=1e-4)
    forecasts.append(numpy_metrics(model.task, model.params, "test")["forecasts"])
  # --mode=predict with the seeds' stacked parameters: their mean forecast, and one column per seed.
  run(config, str(tmp_path), "predict")
  with open(tmp_path / PREDICTIONS_FILE) as f:
    rows = list(csv.DictReader(f))
  row = rows[len(config.task.horizons) + 2]  # window 1, horizon index 2
  for replica in range(2):
    np.testing.assert_allclose(float(row[f"forecast_seed_{replica}"]), forecasts[replica][1, 2], atol=2e-3)
  np.testing.assert_allclose(float(row["forecast"]), (forecasts[0][1, 2] + forecasts[1][1, 2]) / 2, atol=2e-3)


def test_a_synthetic_series_has_no_raw_file_to_fingerprint():
  """The Beijing series' fingerprint (the CSV's size and SHA-256) is checked with the real file in
  tests/data/test_beijing_pm25.py; a generated series is a function of the config alone."""
  assert build_task(small_config()).data_fingerprint() == {}


def test_user_errors_name_the_fix():
  with pytest.raises(ConfigError, match="set --config.model.num_horizons=7"):
    build_task(small_config(model__num_horizons=3)).model_config()
  with pytest.raises(ConfigError, match="choose one of"):
    build_task(small_config(task__loss="huber"))


def test_default_token_count_is_the_nonzero_integer_entries():
  config = load_experiment_config("synthetic", "copy")
  batch = {"source": np.array([[5, 6, 0], [7, 0, 0]]), "target": np.array([[5, 6, 2, 0], [7, 2, 0, 0]]),
           "weights": np.ones((2, 3), np.float32)}
  assert build_task(config).count_tokens(batch) == 3 + 5


@pytest.mark.slow
def test_forecast_refuses_rows_it_cannot_read_naming_the_row_and_column(trained):
  """Rows without a measured pm2.5, out of time order, or with NaN / inf once gave confident numbers or NaN
  (``read_csv`` refuses each in a file; ``forecast`` now does on rows in memory)."""
  _, workdir, _, _ = trained
  model = load(workdir)
  series = model.task.series
  start, _ = series.split_bounds["test"]
  rows = slice(start + 30, start + 30 + INPUT_LENGTH)
  good = {name: np.array(values[rows]) for name, values in synthetic_columns(HOURS).items()}
  good["pm25"][:3] = [10.0, np.nan, 12.0]  # NaN: not measured, forward-filled
  assert np.all(np.isfinite(model.forecast(good)))

  def edited(name, row, value):
    columns = {key: values.copy() for key, values in good.items()}
    columns[name][row] = value
    return columns

  unmeasured = {**good, "pm25": np.full(INPUT_LENGTH, np.nan)}
  swapped = {**good, "time": good["time"][[0, 1, 3, 2] + list(range(4, INPUT_LENGTH))]}
  cases = [
      (unmeasured, r"column pm25 holds no measured value in its 24 rows \(all NaN\)"),
      (swapped, r"row 2 \(time .*\) after row 1 \(.*\) skips 1 hour\(s\); the rows must be consecutive hours in "
                r"time order"),
      ({**good, "time": good["time"][::-1]}, r"row 1 \(time .*\) after row 0 \(.*\) goes back in time"),
      (edited("TEMP", 5, np.nan), r"column TEMP of row 5 is nan, expected a finite number"),
      (edited("Iws", 7, np.inf), r"column Iws of row 7 is inf, expected a finite number"),
      (edited("pm25", 4, np.inf), r"column pm25 of row 4 is inf, expected NaN \(not measured\) or a value in \[0, "
                                  r"5,000\] ug/m3"),
      (edited("pm25", 2, -50.0), r"column pm25 of row 2 is -50.0, expected NaN"),
      (edited("cbwd", 1, 7), r"column cbwd of row 1 is 7, expected an index 0..3"),
  ]
  for columns, expected in cases:
    with pytest.raises(ValueError, match="^forecast: " + expected) as raised:
      model.forecast(columns)
    assert "\n" not in str(raised.value)

  features = np.array(series.features[rows])
  features[6, 3] = np.nan
  with pytest.raises(ValueError, match=rf"NaN or infinite value\(s\), the first at row 6, feature "
                                       rf"{series.feature_names[3]} \(nan\)"):
    model.forecast(features)
  with pytest.raises(ValueError, match=r"the first at window 1, row 6"):
    model.forecast(np.stack([series.features[rows], features]))


def _table_rows(text: str, header: str) -> list[str]:
  """The metric names of the table printed below the line ``header`` (up to the first line not a row of it)."""
  lines = text.splitlines()
  start = lines.index(header) + 2  # the header line, then the table's own "metric  eval" line
  rows = []
  for line in lines[start:]:
    name, _, value = line.partition(" ")
    if not value.strip() or not name.replace("_", "").isalnum():
      break
    rows.append(name)
  return rows


@pytest.mark.slow
def test_eval_reports_the_metrics_of_the_training_summary(tmp_path, capsys):
  """--mode=eval's table of a forecaster has the rows of training's summary: loss, mae and mse over all
  horizons, and mae, mse and rmse of each horizon (a report said eval gave loss/mae/mse only)."""
  config, workdir = small_config(num_train_steps=6, eval_every=6, checkpoint_every=6), str(tmp_path / "run")
  config.quiet = False  # the summary is what is compared
  run(config, workdir, "train")
  summary = _table_rows(capsys.readouterr().out, "final:")
  run(config, workdir, "eval")
  evaluated = _table_rows(capsys.readouterr().out, "step 6:")
  horizons = [f"{kind}_{h}h" for kind in ("mae", "mse", "rmse") for h in config.task.horizons]
  assert set(horizons) <= set(summary)
  assert evaluated == summary
