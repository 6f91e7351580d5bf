"""Forecasting windows sliced on the fly from one hourly series; persistence baselines.

Dataset-agnostic numpy (the Beijing PM2.5 specifics live in ``transformer/data/beijing_pm25/``).

A series is a few arrays sharing the leading ``[hours]`` axis: ``features`` float32 ``[hours, num_features]``
(the model's inputs), ``targets`` float32 ``[hours]`` (the value to forecast, finite everywhere),
``target_mask`` bool ``[hours]`` (True where the target was observed; only those hours are ever scored) and
optionally ``times`` datetime64[h] ``[hours]``.

A window is named by its forecast origin ``t``, the last input hour. Its inputs are the hours
``t - input_length + 1 ... t``, its targets the hours ``t + h`` for each horizon ``h`` (each horizon is
predicted directly, one output each). :class:`WindowedSeries` keeps only the windows lying entirely, inputs
and targets, in ``[start, stop)``: a split's windows never read an hour of another split. Windows are gathered
from the one array when a batch is made, never stored.

Pieces:

* :func:`forward_fill`, :func:`one_hot`, :func:`cyclical_time_features`, :class:`Standardization`: features.
* :class:`WindowedSeries`: batches of windows by index; :meth:`WindowedSeries.train_iterator` (endless,
  shuffled, resumable: :class:`WindowBatchIterator`) and :meth:`WindowedSeries.eval_batches` (in order, fixed
  shape, padding rows unscored).
* :func:`persistence_forecast`, :func:`daily_persistence_forecast`: the baselines (scored by
  ``transformer.tasks.metrics.forecast_metrics``).
"""
from __future__ import annotations

import collections.abc
import dataclasses
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from transformer.errors import ConfigError

CYCLICAL_FEATURE_NAMES = ("hour_sin", "hour_cos", "weekday_sin", "weekday_cos", "day_of_year_sin", "day_of_year_cos")


def forward_fill(values: np.ndarray, observed: np.ndarray, segment_starts: Sequence[int] = ()) -> np.ndarray:
  """``values`` with every unobserved entry replaced by the last observed one before it.

  Args:
    values: ``[hours]``, any value (NaN included) where not observed.
    observed: bool ``[hours]``.
    segment_starts: hours where the filling restarts (e.g. each split's first hour), so no value
      is carried from one segment into the next.

  Returns:
    float64 ``[hours]``; NaN where nothing was observed yet in the segment.
  """
  values = np.asarray(values, np.float64)
  observed = np.asarray(observed, bool)
  hours = np.arange(len(values))
  last_observed = np.maximum.accumulate(np.where(observed, hours, -1))
  is_start = np.isin(hours, np.asarray(segment_starts, np.int64))
  segment_start = np.maximum.accumulate(np.where(is_start, hours, 0))
  found = last_observed >= segment_start
  return np.where(found, values[np.maximum(last_observed, 0)], np.nan)


def one_hot(codes: np.ndarray, num_classes: int) -> np.ndarray:
  """float32 ``[len(codes), num_classes]``; ``codes`` are ints in ``[0, num_classes)``."""
  codes = np.asarray(codes)
  if codes.size and (codes.min() < 0 or codes.max() >= num_classes):
    raise ValueError(f"one_hot: codes must lie in [0, {num_classes}); got {codes.min()} to "
                     f"{codes.max()}.")
  return np.eye(num_classes, dtype=np.float32)[codes]


def cyclical_time_features(times: np.ndarray) -> np.ndarray:
  """Hour of day, day of week and day of year as points on circles (sin, cos).

  Angles are ``2 pi hour / 24``, ``2 pi weekday / 7`` (Monday 0) and ``2 pi (day_of_year - 1) /
  days_in_year`` (365 or 366), so 23h sits next to 0h and 31 December next to 1 January.

  Args:
    times: datetime64 ``[hours]`` (converted to hours).

  Returns:
    float32 ``[hours, 6]``, columns named by :data:`CYCLICAL_FEATURE_NAMES`.
  """
  times = np.asarray(times).astype("datetime64[h]")
  days = times.astype("datetime64[D]")
  hour = (times - days).astype(np.int64)
  weekday = (days.astype(np.int64) + 3) % 7  # 1970-01-01 was a Thursday
  year_start = times.astype("datetime64[Y]")
  day_of_year = (days - year_start.astype("datetime64[D]")).astype(np.int64)  # from 0
  days_in_year = ((year_start + np.timedelta64(1, "Y")).astype("datetime64[D]")
                  - year_start.astype("datetime64[D]")).astype(np.int64)
  angles = 2 * np.pi * np.stack([hour / 24, weekday / 7, day_of_year / days_in_year], axis=-1)
  return np.stack([np.sin(angles), np.cos(angles)], axis=-1).reshape(len(times), 6).astype(
      np.float32)


@dataclasses.dataclass(frozen=True)
class Standardization:
  """``(x - mean) / std`` per feature, and its exact inverse; fitted on chosen rows only.

  Attributes:
    names: one name per feature.
    mean, std: float64 ``[num_features]``.
  """
  names: tuple[str, ...]
  mean: np.ndarray
  std: np.ndarray

  @classmethod
  def fit(cls, names: Sequence[str], values: np.ndarray,
          mask: np.ndarray | None = None) -> Standardization:
    """Mean and (population) standard deviation of each column over the rows where ``mask``.

    Args:
      names: ``[num_features]``.
      values: ``[rows, num_features]``.
      mask: bool ``[rows, num_features]`` or None (all rows).

    A constant column gets ``std = 1`` (it is only shifted), so standardising never divides by 0.
    """
    values = np.asarray(values, np.float64)
    mask = np.ones(values.shape, bool) if mask is None else np.asarray(mask, bool)
    counts = mask.sum(axis=0)
    if np.any(counts == 0):
      empty = [name for name, count in zip(names, counts) if count == 0]
      raise ValueError(f"Standardization.fit: no rows to fit {empty} on; the fitting period "
                       "must hold at least one observed value of every feature.")
    masked = np.where(mask, values, 0.0)
    mean = masked.sum(axis=0) / counts
    variance = np.where(mask, (values - mean) ** 2, 0.0).sum(axis=0) / counts
    std = np.sqrt(variance)
    return cls(tuple(names), mean, np.where(std > 0, std, 1.0))

  def apply(self, values: np.ndarray) -> np.ndarray:
    """``[..., num_features]`` -> standardised, float64."""
    return (np.asarray(values, np.float64) - self.mean) / self.std

  def invert(self, values: np.ndarray) -> np.ndarray:
    """The inverse of :meth:`apply`, float64."""
    return np.asarray(values, np.float64) * self.std + self.mean

  def to_dict(self) -> dict[str, list]:
    """JSON-serialisable, e.g. to save next to a checkpoint; :meth:`from_dict` reads it back."""
    return {"names": list(self.names), "mean": self.mean.tolist(), "std": self.std.tolist()}

  @classmethod
  def from_dict(cls, data: Mapping[str, Sequence]) -> Standardization:
    return cls(tuple(data["names"]), np.asarray(data["mean"], np.float64),
               np.asarray(data["std"], np.float64))


class WindowedSeries:
  """The forecasting windows of ``[start, stop)`` of one series, gathered by index on demand.

  Window ``i`` has its forecast origin at hour ``origins[i] = start + input_length - 1 + i``; the
  last window's furthest target is hour ``stop - 1``. A batch of windows ``indices`` is::

    {"inputs": float32 [batch, input_length, num_features],   # hours origin-L+1 .. origin
     "targets": float32 [batch, num_horizons],                 # hours origin + horizons
     "target_mask": bool [batch, num_horizons],                # False: not observed, never scored
     "time": int32 [batch],     # the origin in hours since 1970-01-01 00h (its index if no
                                # times); 0 on padding rows
     "origin": int32 [batch]}   # the origin's index in the series; -1 on padding rows

  Args:
    features: float32 ``[hours, num_features]``.
    targets: float32 ``[hours]``, finite (a masked target is multiplied by 0, and NaN * 0 is NaN).
    target_mask: bool ``[hours]``.
    input_length: hours of input per window.
    horizons: hours ahead of the origin, each >= 1, e.g. ``(1, 6, 12, 24, 48)``.
    start, stop: the hours the windows may touch (a split); default the whole series.
    times: datetime64 ``[hours]`` or None.
  """

  def __init__(self, features: np.ndarray, targets: np.ndarray, target_mask: np.ndarray,
               input_length: int, horizons: Sequence[int], start: int = 0,
               stop: int | None = None, times: np.ndarray | None = None):
    self.features = np.asarray(features, np.float32)
    self.targets = np.asarray(targets, np.float32)
    self.target_mask = np.asarray(target_mask, bool)
    num_hours = len(self.features)
    if self.features.ndim != 2 or self.targets.shape != (num_hours,) or (
        self.target_mask.shape != (num_hours,)):
      raise ValueError(f"WindowedSeries: features must be [hours, num_features] and targets, "
                       f"target_mask [hours]; got {self.features.shape}, {self.targets.shape}, "
                       f"{self.target_mask.shape}.")
    if not np.all(np.isfinite(self.targets)):
      raise ValueError("WindowedSeries: targets must be finite everywhere; put any finite value "
                       "(e.g. 0) at unobserved hours and mark them False in target_mask.")
    self.input_length = int(input_length)
    self.horizons = np.asarray(horizons, np.int64)
    if self.input_length < 1 or self.horizons.ndim != 1 or not self.horizons.size or (
        self.horizons.min() < 1):
      raise ValueError(f"WindowedSeries: input_length must be >= 1 and horizons a non-empty list "
                       f"of hours >= 1; got {input_length} and {list(horizons)}.")
    self.start = int(start)
    self.stop = num_hours if stop is None else int(stop)
    if not 0 <= self.start <= self.stop <= num_hours:
      raise ValueError(f"WindowedSeries: need 0 <= start <= stop <= {num_hours} (hours in the "
                       f"series); got start={start}, stop={stop}.")
    span = self.input_length + int(self.horizons.max())
    if self.stop - self.start < span:
      raise ConfigError(
          f"WindowedSeries: [{self.start}, {self.stop}) holds {self.stop - self.start} hours, "
          f"fewer than one window needs (input_length {self.input_length} + longest horizon "
          f"{self.horizons.max()} = {span}); shorten the window (config.model.input_length) or the horizons "
          f"(config.task.horizons), or give a longer series (config.task.synthetic_hours for the synthetic one).")
    self.times = None if times is None else np.asarray(times).astype("datetime64[h]")
    if self.times is not None and self.times.shape != (num_hours,):
      raise ValueError(f"WindowedSeries: times must be [hours] = [{num_hours}]; got "
                       f"{self.times.shape}.")
    self.first_origin = self.start + self.input_length - 1
    self.num_windows = self.stop - self.start - span + 1
    self._input_offsets = np.arange(1 - self.input_length, 1)

  def __len__(self) -> int:
    return self.num_windows

  @property
  def origins(self) -> np.ndarray:
    """int64 ``[num_windows]``: the forecast origin (last input hour) of every window."""
    return self.first_origin + np.arange(self.num_windows)

  def target_hours(self, indices: np.ndarray) -> np.ndarray:
    """int64 ``[len(indices), num_horizons]``: the hours forecast by windows ``indices``."""
    return self.first_origin + np.asarray(indices, np.int64)[:, None] + self.horizons

  def scored_windows(self) -> np.ndarray:
    """Indices of the windows with at least one observed target (the others teach nothing)."""
    return np.flatnonzero(self.target_mask[self.target_hours(np.arange(self.num_windows))].any(-1))

  def batch(self, indices: Sequence[int], batch_size: int | None = None) -> dict[str, np.ndarray]:
    """The windows ``indices``, then padding rows (zeros, nothing scored) up to ``batch_size``."""
    indices = np.asarray(indices, np.int64)
    if indices.size and (indices.min() < 0 or indices.max() >= self.num_windows):
      raise IndexError(f"WindowedSeries: window indices must lie in [0, {self.num_windows}); got "
                       f"{indices.min()} to {indices.max()}.")
    rows = len(indices) if batch_size is None else int(batch_size)
    if rows < len(indices):
      raise ValueError(f"WindowedSeries.batch: {len(indices)} windows do not fit batch_size "
                       f"{rows}.")
    origins = self.first_origin + indices
    target_hours = self.target_hours(indices)
    batch = {
        "inputs": np.zeros([rows, self.input_length, self.features.shape[1]], np.float32),
        "targets": np.zeros([rows, len(self.horizons)], np.float32),
        "target_mask": np.zeros([rows, len(self.horizons)], bool),
        "time": np.zeros([rows], np.int32),
        "origin": np.full([rows], -1, np.int32),
    }
    count = len(indices)
    batch["inputs"][:count] = self.features[origins[:, None] + self._input_offsets]
    batch["targets"][:count] = self.targets[target_hours]
    batch["target_mask"][:count] = self.target_mask[target_hours]
    batch["time"][:count] = (origins if self.times is None
                             else self.times[origins].astype(np.int64))
    batch["origin"][:count] = origins
    return batch

  def train_iterator(self, batch_size: int, seed: int) -> WindowBatchIterator:
    """Endless shuffled global batches of the scored windows (see :class:`WindowBatchIterator`)."""
    return WindowBatchIterator(self, batch_size, seed)

  def eval_batches(self, batch_size: int) -> EvalBatches:
    """Every window in order, in batches of ``batch_size`` (the last one padded)."""
    return EvalBatches(self, batch_size)


class WindowBatchIterator:
  """Endless training batches: epoch after epoch, a shuffled pass over the scored windows.

  Epoch ``e``'s order is ``numpy.random.default_rng([seed, e]).permutation`` of the scored
  windows, cut into full batches of ``batch_size`` (the remainder is left out of that epoch, a
  different one each epoch). The batches are global, the same on every process (each takes its
  rows with ``hosts.HostShard``). A batch is thus a pure function of ``(seed, epoch, batch)``, and
  ``get_state()`` ``{"epoch", "batch", "seed", "num_windows"}`` restored by ``set_state`` into an
  iterator over the same series and settings resumes exactly.
  """

  def __init__(self, series: WindowedSeries, batch_size: int, seed: int):
    self.series = series
    self.batch_size = int(batch_size)
    self.seed = int(seed)
    self._windows = series.scored_windows()
    self.batches_per_epoch = len(self._windows) // self.batch_size
    if self.batches_per_epoch == 0:
      raise ValueError(
          f"WindowBatchIterator: {len(self._windows)} scored windows make no full batch of "
          f"{self.batch_size}; lower the batch size.")
    self._epoch = 0
    self._batch = 0
    self._order_cache: tuple[int, np.ndarray] | None = None

  def epoch_order(self, epoch: int) -> np.ndarray:
    """The window indices of ``epoch``, in the order they are batched."""
    if self._order_cache is None or self._order_cache[0] != epoch:
      self._order_cache = (epoch, np.random.default_rng([self.seed, epoch]).permutation(self._windows))
    return self._order_cache[1]

  def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    if self._batch == self.batches_per_epoch:
      self._epoch, self._batch = self._epoch + 1, 0
    first = self._batch * self.batch_size
    indices = self.epoch_order(self._epoch)[first:first + self.batch_size]
    self._batch += 1
    return self.series.batch(indices)

  def get_state(self) -> dict[str, Any]:
    return {"epoch": self._epoch, "batch": self._batch, "seed": self.seed,
            "num_windows": len(self._windows)}

  def set_state(self, state: Mapping[str, Any]) -> None:
    # States saved before batches were global carry the shards; one shard of one is the global order.
    if int(state.get("shard_count", 1)) != 1:
      raise ValueError(f"Iterator state {dict(state)} was saved by shard {state.get('shard_index')} of "
                       f"{state['shard_count']} (each host striding the windows), which no global batch "
                       f"sequence continues; restart the run, or resume it with the code that saved it.")
    expected = {"seed": self.seed, "num_windows": len(self._windows)}
    found = {key: state.get(key) for key in expected}
    if found != expected:
      raise ValueError(f"Iterator state {dict(state)} was saved for {found}, but this iterator "
                       f"has {expected}: restore it into an iterator over the same series, "
                       f"windows and seed.")
    self._epoch, self._batch = int(state["epoch"]), int(state["batch"])


class EvalBatches(collections.abc.Sequence):
  """Every window of a :class:`WindowedSeries` in order, ``batch_size`` per batch, made on access.

  All batches have the same shape; the last one is filled with padding rows whose
  ``target_mask`` is all False and ``origin`` -1, so they weigh nothing.
  """

  def __init__(self, series: WindowedSeries, batch_size: int):
    if batch_size < 1:
      raise ValueError(f"EvalBatches: batch_size must be >= 1; got {batch_size}.")
    self.series = series
    self.batch_size = int(batch_size)

  def __len__(self) -> int:
    return -(-self.series.num_windows // self.batch_size)

  def __getitem__(self, index):
    if isinstance(index, slice):
      return [self[i] for i in range(*index.indices(len(self)))]
    if index < 0:
      index += len(self)
    if not 0 <= index < len(self):
      raise IndexError(f"EvalBatches: batch {index} of {len(self)}.")
    first = index * self.batch_size
    indices = np.arange(first, min(first + self.batch_size, self.series.num_windows))
    return self.series.batch(indices, self.batch_size)


def persistence_forecast(filled: np.ndarray, origins: np.ndarray,
                         horizons: Sequence[int]) -> np.ndarray:
  """Every horizon forecast as the last observed value at the origin.

  Args:
    filled: ``[hours]`` the forward-filled series (:func:`forward_fill`).
    origins: int ``[windows]``, forecast origins.
    horizons: ``[num_horizons]``.

  Returns:
    ``[windows, num_horizons]``.
  """
  filled = np.asarray(filled)
  return np.repeat(filled[np.asarray(origins)][:, None], len(horizons), axis=1)


def daily_persistence_forecast(filled: np.ndarray, origins: np.ndarray, horizons: Sequence[int],
                               period: int = 24) -> np.ndarray:
  """Each target hour forecast by the latest hour at or before the origin with the same hour of day.

  For origin ``t`` and horizon ``h`` that is hour ``t + h - period * ceil(h / period)``: with
  ``period = 24``, the target's hour of the day before for ``h <= 24`` (the origin itself for
  ``h = 24``), of two days before for ``24 < h <= 48`` (the origin for ``h = 48``). Its
  forward-filled value is used (the last observed one at or before it).

  Args:
    filled: ``[hours]`` the forward-filled series.
    origins: int ``[windows]``.
    horizons: ``[num_horizons]``.
    period: hours in one cycle.

  Returns:
    ``[windows, num_horizons]``.

  Raises:
    ValueError: an origin is too early to look a period back.
  """
  horizons = np.asarray(horizons, np.int64)
  source_hours = (np.asarray(origins, np.int64)[:, None] + horizons
                  - period * (-(-horizons // period)))
  if source_hours.size and source_hours.min() < 0:
    raise ValueError(f"daily_persistence_forecast: an origin needs {period - 1} earlier hours; "
                     f"the earliest origin is {np.min(origins)}.")
  return np.asarray(filled)[source_hours]
