"""Beijing PM2.5: CSV checks, features, windows, iterators, baselines and metrics; the real file.

The hand-made fixture ``beijing_pm25_fixture.csv`` holds 12 hours, 2012-12-31 18h to 2013-01-01
05h (CRLF, as the UCI file); its first 6 hours are the training split, the last 6 validation.
Its training pm2.5 values 9, 99 and 999 make ``log1p`` 1, 2 and 3 times ln 10, so the
standardised values are known by hand: mean 2 ln 10, std ln 10 * sqrt(2/3).

Tests on the real file are skipped when it is absent; it is found under
``$TRANSFORMER_SHARED_DIR/data/beijing_pm25`` (default ``<repo root>/../shared``).
"""
from __future__ import annotations

import calendar
import csv
import datetime
import logging
import math
import os
import pathlib
import socket

import numpy as np
import pytest
import tensorflow_datasets as tfds

from transformer.data import beijing_pm25, download, parallel_text, source_files, timeseries
from transformer.data.beijing_pm25 import beijing_pm25_dataset_builder as builder_module
from transformer.data.beijing_pm25 import features as pm25_features
from transformer.errors import InputFileError
from transformer.tasks.metrics import forecast_metrics

FIXTURE = pathlib.Path(__file__).parent / "beijing_pm25_fixture.csv"
FIXTURE_BOUNDS = {"train": (0, 6), "validation": (6, 12)}
REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
SHARED_DIR = pathlib.Path(os.environ.get("TRANSFORMER_SHARED_DIR") or REPO_ROOT.parent / "shared")
REAL_DIR = SHARED_DIR / "data" / "beijing_pm25"
REAL_CSV = REAL_DIR / beijing_pm25.FILE_NAME
needs_real_csv = pytest.mark.skipif(
    not REAL_CSV.exists(), reason=f"{REAL_CSV} not found; set TRANSFORMER_SHARED_DIR to the folder "
    "holding data/beijing_pm25/")

LN10 = math.log(10.0)
SQRT_3_2 = math.sqrt(1.5)


def fixture_lines() -> list[str]:
  return FIXTURE.read_text().splitlines()


def write_csv(path: pathlib.Path, lines: list[str]) -> pathlib.Path:
  path.write_bytes("".join(line + "\r\n" for line in lines).encode())
  return path


def write_hours(path: pathlib.Path, first: datetime.datetime, count: int,
                seed: int = 0) -> pathlib.Path:
  """A PRSA-format CSV of ``count`` consecutive hours from ``first``, random values, some NA."""
  rng = np.random.default_rng(seed)
  lines = [",".join(beijing_pm25.COLUMNS)]
  for index in range(count):
    time = first + datetime.timedelta(hours=index)
    pm25 = "NA" if rng.random() < 0.1 else str(int(rng.integers(0, 500)))
    wind = beijing_pm25.WIND_DIRECTIONS[rng.integers(4)]
    lines.append(f"{index + 1},{time.year},{time.month},{time.day},{time.hour},{pm25},"
                 f"{rng.integers(-40, 28)},{rng.integers(-19, 42)},{rng.integers(991, 1046)},"
                 f"{wind},{rng.integers(45, 58560) / 100:.2f},{rng.integers(0, 5)},"
                 f"{rng.integers(0, 5)}")
  return write_csv(path, lines)


@pytest.fixture(scope="module")
def fixture_series() -> pm25_features.PM25Series:
  return pm25_features.prepare(beijing_pm25.read_csv(FIXTURE), FIXTURE_BOUNDS)


# --- reading the CSV ------------------------------------------------------------------------------


def test_read_csv_columns_of_the_fixture():
  columns = beijing_pm25.read_csv(FIXTURE)
  assert columns["time"][0] == np.datetime64("2012-12-31T18", "h")
  assert np.all(np.diff(columns["time"]) == np.timedelta64(1, "h"))
  np.testing.assert_array_equal(np.isnan(columns["pm25"]),
                                [True, False] * 3 + [True, False, True, False, False, False])
  np.testing.assert_array_equal(columns["pm25"][[1, 3, 5]], [9, 99, 999])
  np.testing.assert_array_equal(columns["cbwd"][:4], [1, 1, 3, 0])  # NW, NW, cv, NE
  np.testing.assert_allclose(columns["Iws"][:2], [1.79, 4.92], rtol=1e-6)


def replace_field(lines, line_number, column, value):
  header = lines[0].split(",")
  fields = lines[line_number - 1].split(",")
  fields[header.index(column)] = value
  return lines[:line_number - 1] + [",".join(fields)] + lines[line_number:]


@pytest.mark.parametrize("edit, expected", [
    (lambda lines: [lines[0].replace("DEWP", "DEWPT")] + lines[1:],
     ["line 1", "missing: ['DEWP']", "unknown: ['DEWPT']"]),
    (lambda lines: [line.rsplit(",", 1)[0] for line in lines], ["line 1", "missing: ['Ir']"]),
    (lambda lines: replace_field(lines, 5, "TEMP", "warm"), ["line 5", "TEMP", "'warm'"]),
    (lambda lines: replace_field(lines, 2, "No", "one"), ["line 2", "column No", "'one'"]),
    (lambda lines: replace_field(lines, 7, "PRES", "NA"), ["line 7", "PRES", "'NA'"]),
    (lambda lines: replace_field(lines, 3, "pm2.5", "nan"), ["line 3", "pm2.5", "or NA"]),
    # Once a WindowedSeries traceback (log1p of -50 is NaN) and silently accepted, in that order.
    (lambda lines: replace_field(lines, 4, "pm2.5", "-50"), ["line 4", "column pm2.5 is '-50'", "outside [0, 5,000]",
                                                              "write NA where it was not measured"]),
    (lambda lines: replace_field(lines, 6, "pm2.5", "1e30"), ["line 6", "column pm2.5 is '1e30'", "outside [0, 5,000]"]),
    (lambda lines: replace_field(lines, 4, "cbwd", "SW"), ["line 4", "cbwd", "'SW'"]),
    (lambda lines: replace_field(lines, 6, "month", "13"), ["line 6", "no such date"]),
    (lambda lines: lines[:4] + lines[5:], ["line 5", "2012-12-31 22h after 2012-12-31 20h",
                                           "skips 1 hour"]),
    (lambda lines: lines[:5] + lines[4:], ["line 6", "2012-12-31 21h after 2012-12-31 21h",
                                           "repeats"]),
    (lambda lines: lines[:3] + [lines[3] + ",0"] + lines[4:], ["line 4", "14 fields"]),
    (lambda lines: lines[:1], ["not followed by any row"]),
])
def test_bad_csv_gives_one_line_naming_the_row(tmp_path, edit, expected):
  path = write_csv(tmp_path / "bad.csv", edit(fixture_lines()))
  with pytest.raises(InputFileError) as raised:
    beijing_pm25.read_csv(path)
  message = str(raised.value)
  assert isinstance(raised.value, ValueError)
  assert "\n" not in message and str(path) in message
  for part in expected:
    assert part in message


# --- features -------------------------------------------------------------------------------------


def test_pm25_input_is_forward_filled_within_its_split_and_flagged(fixture_series):
  column = fixture_series.features[:, pm25_features.FEATURE_NAMES.index("pm25")]
  observed = fixture_series.features[:, pm25_features.FEATURE_NAMES.index("pm25_observed")]
  z = lambda value: (math.log1p(value) - 2 * LN10) / (LN10 * math.sqrt(2 / 3))
  expected = [0.0, -SQRT_3_2, -SQRT_3_2, 0.0, 0.0, SQRT_3_2,  # training split
              0.0, z(20), z(20), z(30), z(40), z(50)]  # the fill restarts: hour 6 gets the mean
  np.testing.assert_allclose(column, expected, atol=1e-6)
  np.testing.assert_array_equal(observed, [0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 1, 1])


def test_targets_are_masked_where_pm25_is_missing_and_never_filled(fixture_series):
  np.testing.assert_array_equal(fixture_series.target_mask, ~np.isnan(fixture_series.pm25))
  assert np.all(fixture_series.targets[~fixture_series.target_mask] == 0)
  np.testing.assert_allclose(fixture_series.targets[[1, 3, 5]], [-SQRT_3_2, 0, SQRT_3_2],
                             atol=1e-6)


def test_weather_is_standardised_with_training_statistics_only(fixture_series):
  columns = beijing_pm25.read_csv(FIXTURE)
  for name in builder_module.WEATHER_COLUMNS:
    train = columns[name][:6].astype(np.float64)
    expected = (columns[name] - train.mean()) / (train.std() if train.std() > 0 else 1.0)
    got = fixture_series.features[:, pm25_features.FEATURE_NAMES.index(name)]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5, err_msg=name)
  dewpoint = fixture_series.standardization  # hand values: -10 .. -14 -> mean -12, var 10 / 6
  assert dewpoint.mean[1] == pytest.approx(-12)
  assert dewpoint.std[1] == pytest.approx(math.sqrt(10 / 6))
  assert dewpoint.mean[0] == pytest.approx(2 * LN10)


def test_validation_values_do_not_change_the_normalisation_or_the_training_features(tmp_path):
  lines = fixture_lines()
  for line in range(8, 14):  # every validation row
    for column, value in (("pm2.5", "400"), ("DEWP", "25"), ("TEMP", "40"), ("cbwd", "cv")):
      lines = replace_field(lines, line, column, value)
  changed = pm25_features.prepare(beijing_pm25.read_csv(write_csv(tmp_path / "v.csv", lines)),
                                  FIXTURE_BOUNDS)
  original = pm25_features.prepare(beijing_pm25.read_csv(FIXTURE), FIXTURE_BOUNDS)
  np.testing.assert_array_equal(changed.standardization.mean, original.standardization.mean)
  np.testing.assert_array_equal(changed.standardization.std, original.standardization.std)
  np.testing.assert_array_equal(changed.features[:6], original.features[:6])
  assert not np.array_equal(changed.features[6:], original.features[6:])


def test_wind_direction_is_one_hot(fixture_series):
  first = pm25_features.FEATURE_NAMES.index("cbwd_NE")
  assert pm25_features.FEATURE_NAMES[first:first + 4] == (
      "cbwd_NE", "cbwd_NW", "cbwd_SE", "cbwd_cv")
  names = [line.split(",")[9] for line in fixture_lines()[1:]]
  expected = np.array([[name == wind for wind in ("NE", "NW", "SE", "cv")] for name in names])
  np.testing.assert_array_equal(fixture_series.features[:, first:first + 4], expected)


def test_cyclical_features_against_the_calendar():
  times = np.arange(np.datetime64("2012-12-30T20", "h"), np.datetime64("2013-01-02T03", "h"))
  times = np.concatenate([times, [np.datetime64("2014-06-15T12", "h")]])
  got = timeseries.cyclical_time_features(times)
  for row, time in zip(got, times.astype(datetime.datetime)):
    days_in_year = 366 if calendar.isleap(time.year) else 365
    angles = [2 * math.pi * time.hour / 24, 2 * math.pi * time.weekday() / 7,
              2 * math.pi * (time.timetuple().tm_yday - 1) / days_in_year]
    expected = [f(angle) for angle in angles for f in (math.sin, math.cos)]
    np.testing.assert_allclose(row, expected, atol=1e-6, err_msg=str(time))
  # 31 December of a leap year sits one day-step before 1 January, on both sides of the seam.
  dec31, jan1 = got[4, 4:], got[28, 4:]
  assert np.allclose(dec31, [math.sin(-2 * math.pi / 366), math.cos(2 * math.pi / 366)],
                     atol=1e-6) and np.allclose(jan1, [0, 1])


def test_forward_fill_restarts_at_segment_starts():
  values = np.array([np.nan, 1, np.nan, 3, np.nan, np.nan, 6])
  observed = ~np.isnan(values)
  np.testing.assert_array_equal(timeseries.forward_fill(values, observed),
                                [np.nan, 1, 1, 3, 3, 3, 6])
  np.testing.assert_array_equal(timeseries.forward_fill(values, observed, segment_starts=[4]),
                                [np.nan, 1, 1, 3, np.nan, np.nan, 6])


def test_denormalisation_round_trip(fixture_series):
  concentration = np.array([0.0, 1.0, 9.0, 98.613, 994.0, 1e4])
  np.testing.assert_allclose(
      fixture_series.to_concentration(fixture_series.from_concentration(concentration)),
      concentration, rtol=1e-12, atol=1e-10)
  observed = fixture_series.target_mask
  np.testing.assert_allclose(fixture_series.to_concentration(fixture_series.targets[observed]),
                             fixture_series.pm25[observed], rtol=1e-5)


def test_standardization_serialises_and_inverts():
  values = np.random.default_rng(0).normal(3, 2, size=(50, 3))
  values[:, 2] = 7.0  # a constant column is shifted, never divided by 0
  fitted = timeseries.Standardization.fit(("a", "b", "c"), values)
  np.testing.assert_allclose(fitted.mean, values.mean(0))
  np.testing.assert_allclose(fitted.std[:2], values.std(0)[:2])
  assert fitted.std[2] == 1.0
  again = timeseries.Standardization.from_dict(fitted.to_dict())
  np.testing.assert_allclose(again.invert(fitted.apply(values)), values, rtol=1e-12)


# --- windows --------------------------------------------------------------------------------------


def numbered_series(hours=30, num_features=2, masked=()):
  """features[t] = [t, 100 + t, ...], targets[t] = t: a window's content names its hours."""
  features = np.arange(hours)[:, None] + 100 * np.arange(num_features)
  mask = np.ones(hours, bool)
  mask[list(masked)] = False
  return features.astype(np.float32), np.arange(hours, dtype=np.float32), mask


def test_first_and_last_window_of_a_range():
  features, targets, mask = numbered_series()
  series = timeseries.WindowedSeries(features, targets, mask, input_length=3, horizons=(1, 2),
                                     start=5, stop=15)
  assert len(series) == 15 - 5 - 3 - 2 + 1
  batch = series.batch([0, len(series) - 1])
  np.testing.assert_array_equal(batch["inputs"][0, :, 0], [5, 6, 7])  # starts at `start`
  np.testing.assert_array_equal(batch["targets"][0], [8, 9])
  np.testing.assert_array_equal(batch["inputs"][1, :, 0], [10, 11, 12])
  np.testing.assert_array_equal(batch["targets"][1], [13, 14])  # ends at stop - 1
  np.testing.assert_array_equal(batch["inputs"][1, :, 1], [110, 111, 112])
  np.testing.assert_array_equal(batch["origin"], [7, 12])
  assert batch["inputs"].dtype == np.float32 and batch["target_mask"].dtype == bool
  with pytest.raises(IndexError):
    series.batch([len(series)])


def test_too_short_a_range_is_refused_with_the_numbers():
  features, targets, mask = numbered_series()
  with pytest.raises(ValueError, match="fewer than one window needs"):
    timeseries.WindowedSeries(features, targets, mask, 24, (1, 48), start=0, stop=30)
  targets[3] = np.nan
  with pytest.raises(ValueError, match="finite"):
    timeseries.WindowedSeries(features, targets, mask, 3, (1,))


def test_no_window_of_the_real_splits_crosses_a_boundary_and_time_is_the_origin():
  times = np.arange(np.datetime64("2010-01-01T00", "h"), np.datetime64("2015-01-01T00", "h"))
  bounds = pm25_features.split_bounds_by_year(times)
  assert bounds == {"train": (0, 26304), "validation": (26304, 35064), "test": (35064, 43824)}
  features, targets, mask = numbered_series(len(times), 1)
  for input_length in (72, 168):
    for split, (start, stop) in bounds.items():
      series = timeseries.WindowedSeries(features, targets, mask, input_length,
                                         pm25_features.HORIZONS, start, stop, times=times)
      hours = series.target_hours(np.arange(len(series)))
      assert series.origins.min() - input_length + 1 == start  # the first window starts the split
      assert hours.max() == stop - 1  # the last window's longest horizon ends it
      assert np.all(series.origins - input_length + 1 >= start) and np.all(hours < stop)
      assert len(series) == stop - start - input_length - max(pm25_features.HORIZONS) + 1
      last = series.batch([len(series) - 1])
      assert last["inputs"][0, 0, 0] >= start and last["targets"][0, -1] == stop - 1
      assert last["time"][0] == times[stop - 1 - max(pm25_features.HORIZONS)].astype(np.int64)


def test_windows_gather_only_the_hours_of_their_range():
  features, targets, mask = numbered_series(40, masked=(3, 20))
  start, stop = 10, 30
  garbage = np.ones(40, bool)
  garbage[start:stop] = False
  noisy_features, noisy_targets, noisy_mask = features.copy(), targets.copy(), mask.copy()
  noisy_features[garbage] = np.nan
  noisy_targets[garbage] = -7.0
  noisy_mask[garbage] = ~noisy_mask[garbage]
  clean = timeseries.WindowedSeries(features, targets, mask, 4, (1, 3), start, stop)
  noisy = timeseries.WindowedSeries(noisy_features, noisy_targets, noisy_mask, 4, (1, 3), start,
                                    stop)
  every = np.arange(len(clean))
  for name, value in clean.batch(every).items():
    np.testing.assert_array_equal(value, noisy.batch(every)[name], err_msg=name)


def test_a_splits_features_depend_only_on_its_own_hours_given_the_statistics(tmp_path,
                                                                            fixture_series):
  lines = fixture_lines()
  for line in range(2, 8):  # every training row
    for column, value in (("pm2.5", "NA"), ("DEWP", "5"), ("cbwd", "cv")):
      lines = replace_field(lines, line, column, value)
  lines = replace_field(lines, 3, "pm2.5", "500")  # the last training value carried forward
  changed = pm25_features.prepare(beijing_pm25.read_csv(write_csv(tmp_path / "t.csv", lines)),
                                  FIXTURE_BOUNDS,
                                  standardization=fixture_series.standardization)
  np.testing.assert_array_equal(changed.features[6:], fixture_series.features[6:])
  np.testing.assert_array_equal(changed.pm25_filled[6:], fixture_series.pm25_filled[6:])
  assert not np.array_equal(changed.features[:6], fixture_series.features[:6])


# --- iterators ------------------------------------------------------------------------------------


def iterator_series():
  features, targets, mask = numbered_series(60, masked=range(20, 35))
  return timeseries.WindowedSeries(features, targets, mask, input_length=4, horizons=(1, 2))


def test_training_iterator_resumes_exactly_across_epochs():
  series = iterator_series()
  iterator = series.train_iterator(batch_size=5, seed=3)
  for _ in range(iterator.batches_per_epoch + 2):  # into the second epoch
    next(iterator)
  state = iterator.get_state()
  expected = [next(iterator) for _ in range(2 * iterator.batches_per_epoch)]
  resumed = series.train_iterator(batch_size=5, seed=3)
  resumed.set_state(state)
  for want, got in zip(expected, (next(resumed) for _ in expected)):
    for name in want:
      np.testing.assert_array_equal(want[name], got[name], err_msg=name)
  with pytest.raises(ValueError, match="same series"):
    series.train_iterator(batch_size=5, seed=4).set_state(state)


def test_a_state_saved_with_shards_restores_only_from_a_single_shard():
  series = iterator_series()
  iterator = series.train_iterator(batch_size=5, seed=3)
  for _ in range(3):
    next(iterator)
  state = iterator.get_state()
  assert set(state) == {"epoch", "batch", "seed", "num_windows"}
  expected = next(iterator)
  resumed = series.train_iterator(batch_size=5, seed=3)
  resumed.set_state(dict(state, shard_index=0, shard_count=1))  # as saved before batches were global
  np.testing.assert_array_equal(next(resumed)["origin"], expected["origin"])
  with pytest.raises(ValueError, match="saved by shard 1 of 2"):
    resumed.set_state(dict(state, shard_index=1, shard_count=2))


def test_training_epochs_shuffle_scored_windows_once_each():
  series = iterator_series()
  scored = series.scored_windows()
  # A window scores when hour origin+1 or origin+2 lies outside the unmeasured hours 20-34.
  hours = series.target_hours(np.arange(len(series)))
  np.testing.assert_array_equal(scored, np.flatnonzero(((hours < 20) | (hours > 34)).any(-1)))
  iterator = series.train_iterator(batch_size=4, seed=0)
  order = np.concatenate([next(iterator)["origin"] for _ in range(iterator.batches_per_epoch)])
  order -= series.first_origin
  assert len(set(order)) == len(order) == len(scored) // 4 * 4 and set(order) <= set(scored)
  single = series.train_iterator(batch_size=4, seed=0)
  epochs = [single.epoch_order(epoch) for epoch in range(2)]
  assert sorted(epochs[0]) == list(scored) and not np.array_equal(epochs[0], epochs[1])
  other_seed = series.train_iterator(batch_size=4, seed=1).epoch_order(0)
  assert not np.array_equal(epochs[0], other_seed)


def test_eval_batches_cover_every_window_in_order_with_zero_weight_padding():
  series = iterator_series()
  batches = series.eval_batches(batch_size=8)
  assert len(batches) == math.ceil(len(series) / 8)
  shapes = {tuple(value.shape for value in batch.values()) for batch in batches}
  assert len(shapes) == 1  # one compiled shape
  origins = np.concatenate([batch["origin"] for batch in batches])
  real = origins >= 0
  np.testing.assert_array_equal(origins[real], series.origins)
  last = batches[-1]
  padding = last["origin"] < 0
  assert padding.sum() == len(batches) * 8 - len(series) > 0
  assert not last["target_mask"][padding].any() and not last["inputs"][padding].any()
  targets = np.concatenate([batch["targets"] for batch in batches])[real]
  np.testing.assert_array_equal(targets, series.origins[:, None] + series.horizons)  # t + h


# --- baselines and metrics ------------------------------------------------------------------------


def test_persistence_baselines_on_a_hand_made_series():
  values = np.array([10, 11, np.nan, 13, 14, np.nan, np.nan, 17, 18, 19])
  filled = timeseries.forward_fill(values, ~np.isnan(values))  # 10 11 11 13 14 14 14 17 18 19
  origins = np.array([3, 6])
  np.testing.assert_array_equal(timeseries.persistence_forecast(filled, origins, (1, 2, 5)),
                                [[13, 13, 13], [14, 14, 14]])
  # period 4: horizon h at origin t reads hour t + h - 4 * ceil(h / 4).
  got = timeseries.daily_persistence_forecast(filled, origins, (1, 3, 4, 6), period=4)
  np.testing.assert_array_equal(got, [[10, 11, 13, 11],  # hours 0, 2, 3, 1
                                      [13, 14, 14, 14]])  # hours 3, 5, 6, 4
  with pytest.raises(ValueError, match="earlier hours"):
    timeseries.daily_persistence_forecast(filled, np.array([1]), (1,), period=4)


# --- the TFDS builder -----------------------------------------------------------------------------


def build(data_dir, **kwargs):
  builder = beijing_pm25.Builder(data_dir=os.fspath(data_dir), file_format="array_record",
                                 **kwargs)
  builder.download_and_prepare()
  return builder


def test_builder_stores_the_hourly_rows_by_year_and_reads_back_what_the_csv_holds(
    tmp_path, monkeypatch):
  raw = tmp_path / "raw" / "beijing_pm25"
  raw.mkdir(parents=True)
  first = datetime.datetime(2012, 12, 31, 21)
  csv_path = write_hours(raw / beijing_pm25.FILE_NAME, first, 3 + 8760 + 2)
  monkeypatch.setenv(parallel_text.ENV_VAR, os.fspath(tmp_path / "raw"))  # the parent folder
  builder = build(tmp_path / "tfds")
  assert {split: info.num_examples for split, info in builder.info.splits.items()} == {
      "train": 3, "validation": 8760, "test": 2}
  columns = beijing_pm25.read_csv(csv_path)
  read_back = pm25_features.read_prepared(builder)
  for name, values in columns.items():
    np.testing.assert_array_equal(read_back[name], values, err_msg=name)  # NaN == NaN here
  example = builder.as_data_source("test")[1]
  assert np.datetime64(int(example["time"]), "h") == np.datetime64("2014-01-01T01", "h")
  assert beijing_pm25.WIND_DIRECTIONS[example["cbwd"]] == beijing_pm25.WIND_DIRECTIONS[
      columns["cbwd"][-1]]


def test_builder_reports_a_bad_csv_as_input_file_error(tmp_path):
  lines = replace_field(fixture_lines(), 9, "TEMP", "?")
  write_csv(tmp_path / beijing_pm25.FILE_NAME, lines)
  with pytest.raises(InputFileError, match=r"line 9: column TEMP is '\?'"):
    build(tmp_path / "tfds", source_dir=tmp_path)


def test_builder_refuses_a_folder_without_the_file(tmp_path):
  (tmp_path / "empty").mkdir()
  with pytest.raises(parallel_text.MissingDataError) as raised:
    build(tmp_path / "tfds", source_dir=tmp_path / "empty")
  message = str(raised.value)
  assert beijing_pm25.FILE_NAME in message and beijing_pm25.URL in message
  assert parallel_text.ENV_VAR in message
  assert not (tmp_path / "tfds" / "beijing_pm25").exists()


def test_offline_download_fails_at_once_with_one_line_naming_file_url_and_setting(
    tmp_path, monkeypatch):
  def unreachable(address, timeout=None):
    raise socket.gaierror(-2, "Name or service not known")
  monkeypatch.setattr(download.urllib.request, "getproxies", lambda: {})
  monkeypatch.setattr(download.socket, "create_connection", unreachable)
  with pytest.raises(parallel_text.MissingDataError) as raised:
    build(tmp_path / "tfds")
  message = str(raised.value)
  assert "\n" not in message
  for part in (beijing_pm25.FILE_NAME, beijing_pm25.URL, "source_dir", parallel_text.ENV_VAR,
               "Name or service not known"):
    assert part in message


def test_a_failing_download_behind_a_proxy_gives_the_same_line(tmp_path, monkeypatch):
  def fail(self, url):
    raise OSError("Connection refused")
  monkeypatch.setattr(download.urllib.request, "getproxies",
                      lambda: {"https": "http://proxy:3128"})
  monkeypatch.setattr(tfds.download.DownloadManager, "download", fail)
  with pytest.raises(parallel_text.MissingDataError, match="Connection refused.*source_dir"):
    build(tmp_path / "tfds")


def test_without_a_local_copy_the_official_url_is_downloaded(tmp_path, monkeypatch):
  requested = []
  csv_path = write_hours(tmp_path / "cache_copy", datetime.datetime(2012, 12, 31, 23), 8762)

  def serve(self, url):
    requested.append(url)
    return csv_path
  monkeypatch.setattr(download.urllib.request, "getproxies", lambda: {"https": "proxy"})
  monkeypatch.setattr(tfds.download.DownloadManager, "download", serve)
  builder = build(tmp_path / "tfds")
  assert requested == [beijing_pm25.URL]
  assert beijing_pm25.URL.startswith("https://archive.ics.uci.edu/")
  assert builder.info.splits["test"].num_examples == 1


def test_a_cut_file_warns_and_its_prepared_rows_are_refused_once_the_full_file_is_back(tmp_path, caplog):
  """The issue's case: prepared from a file missing its last weeks (one WARNING line naming its rows and dates),
  then the full file restored in the same folder (one error line, not the old rows)."""
  raw = tmp_path / "raw"
  raw.mkdir()
  first = datetime.datetime(2012, 12, 31, 21)
  full = write_hours(raw / beijing_pm25.FILE_NAME, first, 3 + 8760 + 30).read_bytes()
  cut = write_hours(raw / beijing_pm25.FILE_NAME, first, 3 + 8760 + 2)
  cut_fingerprint = source_files.FileFingerprint.of(cut)
  caplog.set_level(logging.WARNING)
  stale = build(tmp_path / "tfds", source_dir=raw)
  warnings = [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING]
  assert len(warnings) == 1 and "\n" not in warnings[0]
  assert f"{cut} is not the published release ({cut_fingerprint}; " in warnings[0]
  assert ("it holds 8,765 rows, 2012-12-31 21h to 2014-01-01 01h, the release 43,824 rows, every hour of the years "
          "2010 to 2014") in warnings[0]
  assert source_files.recorded(stale) == {beijing_pm25.FILE_NAME: cut_fingerprint}

  cut.write_bytes(full)
  with pytest.raises(InputFileError) as raised:
    pm25_features.load(data_dir=os.fspath(tmp_path / "tfds"), source_dir=os.fspath(raw))
  message = str(raised.value)
  assert "\n" not in message
  assert f"is now {source_files.FileFingerprint.of(cut)}, the prepared data was built from {cut_fingerprint}" in message
  assert f"rm -r {stale.data_dir}" in message
  # The old file back: the prepared data is its own again.
  write_hours(raw / beijing_pm25.FILE_NAME, first, 3 + 8760 + 2)
  assert source_files.data_fingerprint(build(tmp_path / "tfds", source_dir=raw)) == {
      f"beijing_pm25/{beijing_pm25.FILE_NAME}": f"size={cut_fingerprint.size} sha256={cut_fingerprint.sha256}"}


def test_a_file_without_2014_is_one_line_naming_the_empty_split(tmp_path, caplog):
  write_hours(tmp_path / beijing_pm25.FILE_NAME, datetime.datetime(2012, 12, 31, 21), 3 + 8760)
  caplog.set_level(logging.WARNING)
  with pytest.raises(InputFileError) as raised:
    build(tmp_path / "tfds", source_dir=tmp_path)
  assert [record for record in caplog.records if record.levelno >= logging.WARNING] == []  # the error alone
  message = str(raised.value)
  assert "\n" not in message
  assert "no example for split(s) test" in message and "2012-12-31 21h to 2013-12-31 23h" in message


def _without_pm25_in(path: pathlib.Path, year: int) -> pathlib.Path:
  """The CSV at ``path`` with every pm2.5 of ``year`` written NA."""
  lines = path.read_text().splitlines()
  header = lines[0].split(",")
  for number, line in enumerate(lines[1:], 2):
    if line.split(",")[header.index("year")] == str(year):
      lines = replace_field(lines, number, "pm2.5", "NA")
  return write_csv(path, lines)


def test_a_split_without_any_measured_pm25_is_refused_where_the_data_is_prepared(tmp_path, monkeypatch):
  """A validation year of NA only gave eval/mae=0.0000 (a sum over no hour, weight 0), kept as the best checkpoint."""
  csv_path = _without_pm25_in(write_hours(tmp_path / beijing_pm25.FILE_NAME, datetime.datetime(2012, 12, 31, 21),
                                          3 + 8760 + 2), 2013)
  with pytest.raises(InputFileError) as raised:
    build(tmp_path / "tfds", source_dir=tmp_path)
  message = str(raised.value)
  assert "\n" not in message and str(csv_path) in message
  assert "no pm2.5 measured in split(s) validation (years [2013]: every value NA)" in message
  assert not (tmp_path / "tfds" / "beijing_pm25" / "1.1.0").exists()

  # Data prepared before the builder checked (here: with the check switched off) is refused where it is read.
  monkeypatch.setattr(builder_module, "unmeasured_splits", lambda pm25, rows: [])
  stale = build(tmp_path / "tfds", source_dir=tmp_path)
  with pytest.raises(InputFileError, match=rf"no pm2.5 measured in split\(s\) validation; .*rm -r {stale.data_dir}"):
    pm25_features.load(data_dir=os.fspath(tmp_path / "tfds"), source_dir=os.fspath(tmp_path))


def test_truncated_prepared_files_name_the_file_and_how_to_prepare_it_again(tmp_path):
  """A prepared file cut short (a full disk, a copy interrupted) was a Riegeli ``RuntimeError`` traceback."""
  write_hours(tmp_path / beijing_pm25.FILE_NAME, datetime.datetime(2012, 12, 31, 21), 3 + 8760 + 2)
  builder = build(tmp_path / "tfds", source_dir=tmp_path)
  [validation] = builder.info.splits["validation"].filepaths
  data = validation.read_bytes()
  validation.write_bytes(data[:len(data) // 2])
  with pytest.raises(InputFileError) as raised:
    pm25_features.load(data_dir=os.fspath(tmp_path / "tfds"), source_dir=os.fspath(tmp_path))
  message = str(raised.value)
  assert "\n" not in message
  assert "beijing_pm25: the prepared validation split cannot be read (" in message
  assert f"{validation} is truncated or damaged" in message and f"rm -r {builder.data_dir}" in message


def test_the_release_constant_is_the_download_checksum():
  """TFDS checks a download against checksums.tsv; the warning compares with RELEASE: one pair, twice."""
  lines = (pathlib.Path(builder_module.__file__).parent / "checksums.tsv").read_text().splitlines()
  url, size, sha256, name = next(line for line in lines if not line.startswith("#")).split("\t")
  assert (url, name) == (beijing_pm25.URL, beijing_pm25.FILE_NAME)
  assert source_files.FileFingerprint(int(size), sha256) == builder_module.RELEASE.fingerprint


# --- the real file --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def real_columns():
  if not REAL_CSV.exists():
    pytest.skip(f"{REAL_CSV} not found; set TRANSFORMER_SHARED_DIR")
  return beijing_pm25.read_csv(REAL_CSV)


@needs_real_csv
def test_real_file_rows_missing_values_and_splits(real_columns):
  times, pm25 = real_columns["time"], real_columns["pm25"]
  assert len(times) == 43824
  assert times[0] == np.datetime64("2010-01-01T00") and times[-1] == np.datetime64("2014-12-31T23")
  assert np.isnan(pm25).sum() == 2067
  years = times.astype("datetime64[Y]").astype(int) + 1970
  # Missing values per year as SOURCE.md counts them with the csv module.
  assert [int(np.isnan(pm25[years == year]).sum()) for year in range(2010, 2015)] == [
      669, 728, 489, 82, 99]
  assert np.nanmean(pm25.astype(np.float64)) == pytest.approx(98.613, abs=5e-4)
  bounds = pm25_features.split_bounds_by_year(times)
  assert {split: stop - start for split, (start, stop) in bounds.items()} == {
      "train": 26304, "validation": 8760, "test": 8760}
  series = pm25_features.prepare(real_columns, bounds)
  assert series.features.shape == (43824, len(pm25_features.FEATURE_NAMES))
  assert np.all(np.isfinite(series.features)) and np.all(np.isfinite(series.targets))
  train = series.features[:26304, [0, 2, 3, 4]]  # pm25, DEWP, TEMP, PRES standardised on train
  observed = series.target_mask[:26304]
  assert abs(train[observed, 0].mean()) < 1e-4
  assert train[observed, 0].std() == pytest.approx(1, 1e-4)
  np.testing.assert_allclose(train[:, 1:].mean(0), 0, atol=1e-4)


def plain_persistence_mae(csv_path, year, input_length, horizons):
  """Persistence and daily persistence MAE on ``year``'s windows, straight from the CSV rows."""
  with open(csv_path, newline="") as file:
    rows = [row for row in csv.DictReader(file) if int(row["year"]) == year]
  values = [None if row["pm2.5"] == "NA" else float(row["pm2.5"]) for row in rows]
  last, filled = None, []
  for value in values:
    last = value if value is not None else last
    filled.append(last)
  errors = {"persistence": [[] for _ in horizons], "daily_persistence": [[] for _ in horizons]}
  for origin in range(input_length - 1, len(rows) - max(horizons)):
    for column, horizon in enumerate(horizons):
      target = values[origin + horizon]
      if target is None:
        continue
      daily_source = origin + horizon - 24 * math.ceil(horizon / 24)
      errors["persistence"][column].append(abs(filled[origin] - target))
      errors["daily_persistence"][column].append(abs(filled[daily_source] - target))
  return {name: [sum(e) / len(e) for e in by_horizon] for name, by_horizon in errors.items()}


@needs_real_csv
@pytest.mark.parametrize("input_length", [72, 168])
def test_real_file_persistence_baselines_on_2014(real_columns, input_length):
  series = pm25_features.prepare(real_columns,
                                 pm25_features.split_bounds_by_year(real_columns["time"]))
  windows = series.windows("test", input_length)
  targets, mask = series.concentration_targets(windows)
  expected = plain_persistence_mae(REAL_CSV, 2014, input_length, pm25_features.HORIZONS)
  print(f"\nBeijing PM2.5, test 2014, input_length {input_length}, {len(windows)} windows; "
        f"ug/m3 by horizon {pm25_features.HORIZONS}")
  for name, forecast in series.baselines(windows).items():
    metrics = forecast_metrics(forecast, targets, mask)
    np.testing.assert_allclose(metrics["mae"], expected[name], rtol=1e-9)
    print(f"  {name:18s} MAE  " + "  ".join(f"{value:7.2f}" for value in metrics["mae"]))
    print(f"  {name:18s} RMSE " + "  ".join(f"{value:7.2f}" for value in metrics["rmse"]))
    print(f"  {name:18s} scored " + " ".join(f"{int(c)}" for c in metrics["count"]))


@pytest.mark.slow
@needs_real_csv
def test_real_file_through_the_builder_equals_the_csv(real_columns, tmp_path, caplog):
  caplog.set_level(logging.WARNING)
  series = pm25_features.load(data_dir=os.fspath(tmp_path / "tfds"), source_dir=REAL_DIR)
  assert [record for record in caplog.records if record.levelno >= logging.WARNING] == []  # the release
  release = builder_module.RELEASE
  assert series.source_fingerprint == {f"beijing_pm25/{beijing_pm25.FILE_NAME}":
                                       f"size={release.fingerprint.size} sha256={release.fingerprint.sha256}"}
  times = real_columns["time"]  # the release's words hold for the real file: every hour of its years
  assert np.all(np.diff(times) == np.timedelta64(1, "h"))
  assert release.contents == (f"{len(times):,} rows, every hour of the years {times[0].astype(object).year} to "
                              f"{times[-1].astype(object).year}")
  direct = pm25_features.prepare(real_columns,
                                 pm25_features.split_bounds_by_year(real_columns["time"]))
  np.testing.assert_array_equal(series.features, direct.features)
  np.testing.assert_array_equal(series.target_mask, direct.target_mask)
  assert series.split_bounds == direct.split_bounds
  with pytest.raises(ValueError, match="at least 24"):
    series.baselines(series.windows("test", 12))
