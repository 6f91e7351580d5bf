"""Beijing PM2.5 forecasting inputs and targets: numpy on the whole hourly series.

:func:`prepare` turns the raw columns (:func:`read_csv` of the builder module, or the prepared
TFDS splits through :func:`load`) into a :class:`PM25Series`: one array of features, the target
and its mask, and the split boundaries; ``series.windows(split, input_length, horizons)`` then
slices the forecasting windows of one split on the fly (``transformer.data.timeseries``).

Features, per hour (:data:`FEATURE_NAMES`, 18):

| feature | how |
| --- | --- |
| ``pm25`` | ``log1p(pm2.5)``, forward-filled over missing hours, standardised |
| ``pm25_observed`` | 1 where this hour's pm2.5 was measured, 0 where it was filled |
| ``DEWP``, ``TEMP``, ``PRES``, ``Iws``, ``Is``, ``Ir`` | standardised |
| ``cbwd_NE``, ``cbwd_NW``, ``cbwd_SE``, ``cbwd_cv`` | one-hot wind direction |
| ``hour_*``, ``weekday_*``, ``day_of_year_*`` | sin, cos (``timeseries.cyclical_time_features``) |

Missing pm2.5 (``NA``, 4.7% of the hours): inputs carry the last measured value of the same split
forward (past values only, so never a look ahead), with ``pm25_observed`` telling the model which
hours were filled; the hours before a split's first measurement (the series' first 24) get the
training mean (0 once standardised). So a split's features depend on its own hours only (and on
the training statistics), and with :class:`~transformer.data.timeseries.WindowedSeries` keeping
every window inside its split, no window reads another split's hours.

Targets are never filled: ``target_mask`` is False at every missing hour, so such an hour is never
scored, and its ``targets`` entry is 0 only to keep the arrays finite.

Normalisation is fitted on the training split only: mean and standard deviation of
``log1p(pm2.5)`` over its measured hours, and of each weather column over its hours. The target
is the standardised ``log1p(pm2.5)``; :meth:`PM25Series.to_concentration` inverts both steps
(``expm1(z * std + mean)``, in float64) back to ug/m3, where the metrics are computed.
"""
from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

import numpy as np

from transformer.data import parallel_text, source_files, timeseries
from transformer.data.beijing_pm25.beijing_pm25_dataset_builder import (
    SPLIT_YEARS, WEATHER_COLUMNS, WIND_DIRECTIONS, Builder, unmeasured_splits)
from transformer.errors import InputFileError

HORIZONS = (1, 6, 12, 24, 48, 72, 96)
STANDARDIZED_NAMES = ("pm25",) + WEATHER_COLUMNS  # the columns of PM25Series.standardization
FEATURE_NAMES = (("pm25", "pm25_observed") + WEATHER_COLUMNS
                 + tuple(f"cbwd_{name}" for name in WIND_DIRECTIONS)
                 + timeseries.CYCLICAL_FEATURE_NAMES)

SplitBounds = Mapping[str, tuple[int, int]]  # split -> [start, stop) hours in the series


def split_bounds_by_year(times: np.ndarray,
                         split_years: Mapping[str, Sequence[int]] = SPLIT_YEARS
                         ) -> dict[str, tuple[int, int]]:
  """``[start, stop)`` of each split's hours in ``times``, from the years each split holds.

  Raises:
    ValueError: a split's hours are not one contiguous run of ``times``, or it has none.
  """
  years = np.asarray(times).astype("datetime64[Y]").astype(np.int64) + 1970
  bounds = {}
  for split, chosen in split_years.items():
    hours = np.flatnonzero(np.isin(years, list(chosen)))
    if not hours.size or hours[-1] - hours[0] + 1 != hours.size:
      raise ValueError(f"split {split!r} (years {list(chosen)}) must be one non-empty run of "
                       f"consecutive rows of the series; it has {hours.size} rows.")
    bounds[split] = (int(hours[0]), int(hours[-1]) + 1)
  return bounds


@dataclasses.dataclass(frozen=True)
class PM25Series:
  """The whole hourly series, ready for windowing (see the module docstring).

  Attributes:
    times: datetime64[h] ``[hours]``.
    features: float32 ``[hours, len(FEATURE_NAMES)]``.
    targets: float32 ``[hours]`` standardised ``log1p(pm2.5)``; 0 where not measured.
    target_mask: bool ``[hours]``: pm2.5 was measured.
    pm25: float64 ``[hours]`` ug/m3 as measured, NaN where missing.
    pm25_filled: float64 ``[hours]`` ug/m3 forward-filled within each split (NaN before the
      split's first measurement); what the persistence baselines forecast from.
    standardization: of ``STANDARDIZED_NAMES`` (``pm25`` is its ``log1p``), fitted on
      ``fit_split``.
    split_bounds: split name -> ``[start, stop)``.
    fit_split: the split the normalisation was fitted on.
    source_fingerprint: ``"<dataset>/<file>"`` -> size and SHA-256 of the raw file the series was read from
      (``source_files.data_fingerprint``; what a run records of its data); empty for a series made from
      columns in memory.
  """
  times: np.ndarray
  features: np.ndarray
  targets: np.ndarray
  target_mask: np.ndarray
  pm25: np.ndarray
  pm25_filled: np.ndarray
  standardization: timeseries.Standardization
  split_bounds: dict[str, tuple[int, int]]
  fit_split: str
  source_fingerprint: Mapping[str, str] = dataclasses.field(default_factory=dict)

  feature_names = FEATURE_NAMES

  def windows(self, split: str, input_length: int,
              horizons: Sequence[int] = HORIZONS) -> timeseries.WindowedSeries:
    """The windows of ``split``, inputs and targets all inside it."""
    if split not in self.split_bounds:
      raise ValueError(f"Unknown split {split!r}; the series has {sorted(self.split_bounds)}.")
    start, stop = self.split_bounds[split]
    return timeseries.WindowedSeries(self.features, self.targets, self.target_mask,
                                     input_length, horizons, start, stop, times=self.times)

  def to_concentration(self, targets: np.ndarray) -> np.ndarray:
    """Standardised ``log1p`` values (targets or predictions) -> ug/m3, float64."""
    log_values = np.asarray(targets, np.float64) * self.standardization.std[0]
    return np.expm1(log_values + self.standardization.mean[0])

  def from_concentration(self, concentration: np.ndarray) -> np.ndarray:
    """ug/m3 -> standardised ``log1p``, float64; the inverse of :meth:`to_concentration`."""
    log_values = np.log1p(np.asarray(concentration, np.float64))
    return (log_values - self.standardization.mean[0]) / self.standardization.std[0]

  def baselines(self, windows: timeseries.WindowedSeries) -> dict[str, np.ndarray]:
    """Persistence forecasts in ug/m3 for every window: ``name -> [num_windows, num_horizons]``.

    ``persistence``: the last measured value at the origin; ``daily_persistence``: the target's
    hour of day, one day (two for ``h > 24``) earlier (``timeseries.daily_persistence_forecast``),
    which lies inside the input window when ``input_length >= 24``. Both use values of the
    window's split only (NaN if the split has no measurement up to the origin yet).
    """
    if windows.input_length < 24:
      raise ValueError(f"baselines: daily persistence reads 23 hours before the origin, outside "
                       f"windows of input_length {windows.input_length}; use at least 24.")
    origins = windows.origins
    return {
        "persistence": timeseries.persistence_forecast(self.pm25_filled, origins,
                                                       windows.horizons),
        "daily_persistence": timeseries.daily_persistence_forecast(self.pm25_filled, origins,
                                                                   windows.horizons),
    }

  def concentration_targets(self, windows: timeseries.WindowedSeries
                            ) -> tuple[np.ndarray, np.ndarray]:
    """``(pm2.5 in ug/m3 (NaN where missing), mask)``, each ``[num_windows, num_horizons]``."""
    hours = windows.target_hours(np.arange(windows.num_windows))
    return self.pm25[hours], self.target_mask[hours]


def prepare(columns: Mapping[str, np.ndarray], split_bounds: SplitBounds,
            fit_split: str = "train",
            standardization: timeseries.Standardization | None = None) -> PM25Series:
  """Features, targets and mask of the whole series, normalised on ``fit_split`` only.

  Args:
    columns: ``{"time", "pm25", "DEWP", ..., "Ir", "cbwd"}`` as :func:`read_csv` returns them.
    split_bounds: split name -> ``[start, stop)``, e.g. :func:`split_bounds_by_year`.
    fit_split: the split whose hours the normalisation is fitted on.
    standardization: statistics to use instead of fitting them (e.g. those saved with a trained
      model, :meth:`~transformer.data.timeseries.Standardization.from_dict`), of
      ``STANDARDIZED_NAMES``.
  """
  if fit_split not in split_bounds:
    raise ValueError(f"fit_split {fit_split!r} is not one of the splits {sorted(split_bounds)}.")
  times = np.asarray(columns["time"]).astype("datetime64[h]")
  pm25 = np.asarray(columns["pm25"], np.float64)
  observed = ~np.isnan(pm25)
  weather = np.stack([np.asarray(columns[name], np.float64) for name in WEATHER_COLUMNS], -1)
  log_pm25 = np.log1p(np.where(observed, pm25, 0.0))
  raw = np.concatenate([log_pm25[:, None], weather], axis=-1)  # [hours, 7]

  start, stop = split_bounds[fit_split]
  fit_mask = np.zeros(raw.shape, bool)
  fit_mask[start:stop] = True
  fit_mask[:, 0] &= observed  # pm2.5 statistics only from measured hours
  if standardization is None:
    standardization = timeseries.Standardization.fit(STANDARDIZED_NAMES, raw, fit_mask)
  elif standardization.names != STANDARDIZED_NAMES:
    raise ValueError(f"prepare: the standardization is of {standardization.names}; expected "
                     f"{STANDARDIZED_NAMES}.")
  standardized = standardization.apply(raw)

  targets = np.where(observed, standardized[:, 0], 0.0)
  # Filling in standardised space is the same as filling the raw value (a monotone map per hour);
  # before the first measurement the training mean (0) stands in.
  split_starts = [start for start, _ in split_bounds.values()]
  filled_input = np.nan_to_num(
      timeseries.forward_fill(standardized[:, 0], observed, split_starts), nan=0.0)
  features = np.concatenate([
      filled_input[:, None], observed[:, None], standardized[:, 1:],
      timeseries.one_hot(columns["cbwd"], len(WIND_DIRECTIONS)),
      timeseries.cyclical_time_features(times)], axis=-1).astype(np.float32)
  return PM25Series(
      times=times, features=features, targets=targets.astype(np.float32), target_mask=observed,
      pm25=np.where(observed, pm25, np.nan),
      pm25_filled=timeseries.forward_fill(pm25, observed, split_starts),
      standardization=standardization, split_bounds=dict(split_bounds), fit_split=fit_split)


def read_prepared(builder: Builder) -> dict[str, np.ndarray]:
  """The columns of a prepared builder's splits, concatenated in time order (as ``read_csv``)."""
  parts = []
  for split in SPLIT_YEARS:
    examples = parallel_text.read_prepared_split(builder, split)
    parts.append({name: np.array([example[name] for example in examples])
                  for name in ("time", "pm25", "cbwd") + WEATHER_COLUMNS})
  columns = {name: np.concatenate([part[name] for part in parts]) for name in parts[0]}
  columns["time"] = columns["time"].astype("datetime64[h]")
  if np.any(np.diff(columns["time"]) != np.timedelta64(1, "h")):
    raise ValueError(f"beijing_pm25 at {builder.data_dir}: the prepared splits are not one run of "
                     "consecutive hours; prepare the dataset again from the original file.")
  return columns


def load(data_dir: str | None = None, source_dir: str | None = None,
         fit_split: str = "train") -> PM25Series:
  """Prepares the TFDS dataset if needed (array_record) and returns the :class:`PM25Series`.

  Args:
    data_dir: TFDS data folder (default ``$TFDS_DATA_DIR`` or ``~/tensorflow_datasets``).
    source_dir: folder holding the raw CSV (see the builder module for the alternatives).
    fit_split: as :func:`prepare`.

  Raises:
    InputFileError: the prepared files are truncated, or a split holds no measured pm2.5; the message names the
      folder to remove.
  """
  builder = Builder(data_dir=data_dir, file_format="array_record", source_dir=source_dir)
  builder.download_and_prepare()
  columns = read_prepared(builder)
  bounds = split_bounds_by_year(columns["time"])
  # The builder refuses such a file; data prepared before it did is refused here.
  unmeasured = unmeasured_splits(columns["pm25"], {split: slice(*rows) for split, rows in bounds.items()})
  if unmeasured:
    raise InputFileError(f"beijing_pm25 at {builder.data_dir}: no pm2.5 measured in split(s) {', '.join(unmeasured)}; "
                         "a model can be neither chosen nor scored on hours without a measurement. Prepare it again "
                         f"from a file with pm2.5 measured in every split's years (rm -r {builder.data_dir}).")
  series = prepare(columns, bounds, fit_split)
  return dataclasses.replace(series, source_fingerprint=source_files.data_fingerprint(builder))
