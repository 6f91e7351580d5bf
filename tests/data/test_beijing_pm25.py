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
import math
import os
import pathlib
import socket

import numpy as np
import pytest
import tensorflow_datasets as tfds

from transformer.data import beijing_pm25, parallel_text, timeseries
from transformer.data.beijing_pm25 import beijing_pm25_dataset_builder as builder_module
from transformer.data.beijing_pm25 import features as pm25_features
from transformer.errors import InputFileError

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


# --- reading the CSV -------------------------------------------------------------------------------


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
    (lambda lines: replace_field(lines, 7, "PRES", "NA"), ["line 7", "PRES", "'NA'"]),
    (lambda lines: replace_field(lines, 3, "pm2.5", "nan"), ["line 3", "pm2.5", "or NA"]),
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


# --- features ----------------------------------------------------------------------------------------


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


# --- windows -----------------------------------------------------------------------------------------


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
      assert len(series) == stop - start - input_length - 48 + 1
      last = series.batch([len(series) - 1])
      assert last["inputs"][0, 0, 0] >= start and last["targets"][0, -1] == stop - 1
      assert last["time"][0] == times[stop - 49].astype(np.int64)


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
