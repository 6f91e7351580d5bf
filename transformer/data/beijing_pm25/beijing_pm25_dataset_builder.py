"""Beijing PM2.5 (UCI dataset 381): hourly PM2.5 at the US Embassy with the airport's weather.

One example per hour of ``PRSA_data_2010.1.1-2014.12.31.csv``, in file order (43,824 hours,
every hour of the years 2010 to 2014, local time), with the raw values; the feature engineering is
numpy on the whole series afterwards (``transformer.data.beijing_pm25.features``), as the
forecasting windows are sliced from one array. Features::

  {"time": int64,      # hours since 1970-01-01 00h of the local clock time in the file
   "pm25": float32,    # ug/m3; NaN where the file has NA (2,067 hours)
   "DEWP", "TEMP", "PRES", "Iws", "Is", "Ir": float32,   # as in the file (see README.md)
   "cbwd": ClassLabel(NE, NW, SE, cv)}                    # combined wind direction

Chronological splits (:data:`SPLIT_YEARS`): ``train`` 2010-2012 (26,304 hours), ``validation``
2013 (8,760), ``test`` 2014 (8,760).

The raw file comes from, first match wins: the builder argument ``source_dir=...``;
``download_config=tfds.download.DownloadConfig(manual_dir=...)``; ``$TRANSFORMER_DATA_DIR``
(a folder holding ``beijing_pm25/``); otherwise the official UCI URL. Offline, the download
fails at once with one line naming the file, the URL and these settings (``transformer.data.download``).

The prepared data records the size and SHA-256 of the file it was read from (``transformer.data.source_files``);
reused with a source folder whose file differs since, it is refused in one line naming both fingerprints and
the folder to remove. A file other than the UCI release (:data:`RELEASE`: hours missing, values edited) is
prepared with one WARNING line naming its rows and date range and the release's; a split without rows (no
2014), or one without any measured pm2.5 (whose metrics would be 0 / 0), is one :class:`InputFileError` line.

Usage (no TensorFlow needed)::

  builder = Builder(data_dir="/tmp/tfds", file_format="array_record",
                    source_dir="data/beijing_pm25")  # a copy of the UCI file, or leave it out
  builder.download_and_prepare()
  builder.as_data_source("test")[0]  # {"time": 385704, "pm25": 24.0, "cbwd": 1, ...}
"""
from __future__ import annotations

import csv
import datetime
import io
import logging
import math
from typing import Iterator, Mapping

from etils import epath
import numpy as np
import tensorflow_datasets as tfds

from transformer.data import download, parallel_text, source_files
from transformer.errors import InputFileError

FILE_NAME = "PRSA_data_2010.1.1-2014.12.31.csv"
URL = "https://archive.ics.uci.edu/ml/machine-learning-databases/00381/" + FILE_NAME
HOMEPAGE = "https://archive.ics.uci.edu/dataset/381/beijing+pm2+5+data"
COLUMNS = ("No", "year", "month", "day", "hour", "pm2.5", "DEWP", "TEMP", "PRES", "cbwd", "Iws",
           "Is", "Ir")
WEATHER_COLUMNS = ("DEWP", "TEMP", "PRES", "Iws", "Is", "Ir")
WIND_DIRECTIONS = ("NE", "NW", "SE", "cv")  # cv: calm and variable
MISSING = "NA"  # the file's marker of a missing pm2.5 value (the only column with gaps)
# The range of a measured pm2.5 value, ug/m3. The file's highest hour is 994 and the worst hours measured anywhere
# stay under about 2,000: a value outside is an entry or unit error (mg/m3, a -999 code), never a measurement.
PM25_RANGE = (0.0, 5000.0)
SPLIT_YEARS = {"train": (2010, 2011, 2012), "validation": (2013,), "test": (2014,)}
# The UCI file as published, for the warning when a local copy differs: the size and SHA-256 that projects which
# downloaded it from UCI record (../shared/data/beijing_pm25/SOURCE.md); checksums.tsv holds the same pair for
# TFDS's check of a download (a test keeps the two equal).
RELEASE = source_files.Release(
    source_files.FileFingerprint(2_010_494, "4127f868775e31b3956522adc0ec75af8937dde6a3896e8beed3a376c6d27f1c"),
    "the digest recorded by projects that downloaded it from UCI",
    "43,824 rows, every hour of the years 2010 to 2014")

logger = logging.getLogger(__name__)


def read_csv(path: epath.PathLike) -> dict[str, np.ndarray]:
  """The columns of a PRSA CSV file, checked row by row.

  Returns:
    ``{"time": datetime64[h], "pm25": float32 (NaN where NA), "DEWP" ... "Ir": float32,
    "cbwd": int64 index into WIND_DIRECTIONS}``, each ``[hours]``.

  Raises:
    InputFileError: naming the file, the line (the header is line 1) and the problem: a missing
      or unknown column, a row of the wrong length, a value that is not a finite number (``NA``
      is allowed in pm2.5 only), a pm2.5 outside :data:`PM25_RANGE`, an unknown wind direction, an
      impossible date, or an hour that does not follow the previous row's by exactly one (a gap, a repeat or a
      step back).
  """
  path = epath.Path(path)
  reader, header = _csv_reader(path)
  position = {name: header.index(name) for name in COLUMNS}
  times, pm25, codes = [], [], []
  weather = {name: [] for name in WEATHER_COLUMNS}
  for row in reader:
    where = f"{path}, line {reader.line_num}"
    if len(row) != len(COLUMNS):
      raise InputFileError(f"{where}: {len(row)} fields, expected {len(COLUMNS)} ({','.join(header)}).")

    def number(name: str, allow_missing: bool = False) -> float:
      return parse_number(row[position[name]], allow_missing, f"{where}: column {name}")

    number("No")  # checked, not kept: the time columns order the rows
    time = _row_hour([number(name) for name in ("year", "month", "day", "hour")], times[-1] if times else None,
                     where)
    wind = row[position["cbwd"]].strip()
    if wind not in WIND_DIRECTIONS:
      raise InputFileError(f"{where}: column cbwd is {wind!r}, expected one of {', '.join(WIND_DIRECTIONS)}.")
    times.append(time)
    pm25.append(number("pm2.5", allow_missing=True))
    if not math.isnan(pm25[-1]) and not PM25_RANGE[0] <= pm25[-1] <= PM25_RANGE[1]:
      raise InputFileError(f"{where}: column pm2.5 is {row[position['pm2.5']].strip()!r}, outside "
                           f"{_pm25_range_text()}; correct the value, or write {MISSING} where it was not measured.")
    codes.append(WIND_DIRECTIONS.index(wind))
    for name in WEATHER_COLUMNS:
      weather[name].append(number(name))
  if not times:
    raise InputFileError(f"{path}: the header is not followed by any row.")
  columns = {"time": np.array(times, "datetime64[h]"), "pm25": np.array(pm25, np.float32)}
  columns.update((name, np.array(values, np.float32)) for name, values in weather.items())
  columns["cbwd"] = np.array(codes, np.int64)
  return columns


def _csv_reader(path: epath.Path):
  """``(reader, header)``: a CSV reader of the file's rows after its header, and the header, checked to name
  each of :data:`COLUMNS` once; else InputFileError."""
  try:
    text = path.read_bytes().decode("utf-8-sig")
  except UnicodeDecodeError as error:
    raise InputFileError(f"{path}: not a UTF-8 text file ({error}); expected the CSV "
                         f"{FILE_NAME}.") from None
  reader = csv.reader(io.StringIO(text, newline=""))
  header = next(reader, None)
  if header is None:
    raise InputFileError(f"{path}: the file is empty; expected the header "
                         f"{','.join(COLUMNS)} and one row per hour.")
  missing = [name for name in COLUMNS if name not in header]
  unknown = [name for name in header if name not in COLUMNS]
  if missing or unknown or len(header) != len(COLUMNS):
    raise InputFileError(
        f"{path}, line 1: the header must name the columns {','.join(COLUMNS)} once each "
        f"(missing: {missing or 'none'}; unknown: {unknown or 'none'}; got {','.join(header)}).")
  return reader, header


def _row_hour(date_fields: list[float], previous: datetime.datetime | None, where: str) -> datetime.datetime:
  """The hour of a row's year, month, day and hour, checked to exist and to follow ``previous`` (the hour of
  the row before, None for the first row) by exactly one; else InputFileError at ``where``."""
  if any(value != int(value) for value in date_fields):
    raise InputFileError(f"{where}: year, month, day and hour must be integers; got {date_fields}.")
  try:
    time = datetime.datetime(*(int(value) for value in date_fields))
  except ValueError as error:
    raise InputFileError(f"{where}: no such date and hour {[int(value) for value in date_fields]} "
                         f"({error}).") from None
  if previous is not None and time != previous + datetime.timedelta(hours=1):
    hours = (time - previous) / datetime.timedelta(hours=1)
    problem = ("repeats it" if hours == 0 else
               f"skips {hours - 1:g} hour(s)" if hours > 1 else "goes back in time")
    raise InputFileError(
        f"{where}: {time.strftime('%Y-%m-%d %Hh')} after {previous.strftime('%Y-%m-%d %Hh')} {problem}; "
        f"the rows must be consecutive hours, one row per hour, with no gap or repeat.")
  return time


def parse_number(field: str, allow_missing: bool, where: str) -> float:
  """``field`` as a finite float (NaN for ``NA`` when ``allow_missing``); else InputFileError."""
  field = field.strip()
  if allow_missing and field == MISSING:
    return math.nan
  try:
    value = float(field)
  except ValueError:
    value = math.nan
  if not math.isfinite(value):
    allowed = f" or {MISSING}" if allow_missing else ""
    raise InputFileError(f"{where} is {field!r}, expected a finite number{allowed}.")
  return value


def _pm25_range_text() -> str:
  return f"[{PM25_RANGE[0]:g}, {PM25_RANGE[1]:,.0f}] ug/m3, the range of a measured concentration"


def check_columns(columns: Mapping[str, np.ndarray], what: str) -> None:
  """The checks of :func:`read_csv` on columns given in memory (``read_csv``'s dict; ``time`` as datetime64):
  equal lengths, finite weather, pm2.5 NaN (not measured) or inside :data:`PM25_RANGE`, wind directions
  that are indices into :data:`WIND_DIRECTIONS`, consecutive hours in time order, and pm2.5 measured in at
  least one row.

  Raises:
    ValueError: one line starting with ``what``, naming the column and the row (counted from 0).
  """
  names = ("time", "pm25", "cbwd") + WEATHER_COLUMNS
  lengths = {name: len(columns[name]) for name in names}
  if len(set(lengths.values())) != 1:
    raise ValueError(f"{what}: the columns differ in length ({lengths}); give one value per row in each.")

  def refuse(name: str, bad: np.ndarray, values, expected: str):
    row = int(np.flatnonzero(bad)[0])
    raise ValueError(f"{what}: column {name} of row {row} is {values[row]}, expected {expected} "
                     f"({int(bad.sum())} such row(s)).")

  for name in WEATHER_COLUMNS:
    values = np.asarray(columns[name], np.float64)
    if not np.all(np.isfinite(values)):
      refuse(name, ~np.isfinite(values), values, "a finite number")
  pm25 = np.asarray(columns["pm25"], np.float64)
  outside = ~np.isnan(pm25) & ~((pm25 >= PM25_RANGE[0]) & (pm25 <= PM25_RANGE[1]))
  if outside.any():
    refuse("pm25", outside, pm25, f"NaN (not measured) or a value in {_pm25_range_text()}")
  if np.isnan(pm25).all():
    raise ValueError(f"{what}: column pm25 holds no measured value in its {len(pm25)} rows (all NaN); forecasts "
                     "start from the last measured concentration: give rows that include at least one.")
  wind = np.asarray(columns["cbwd"])
  unknown = ~np.isin(wind, np.arange(len(WIND_DIRECTIONS)))
  if unknown.any():
    refuse("cbwd", unknown, wind, f"an index 0..{len(WIND_DIRECTIONS) - 1} into {WIND_DIRECTIONS}")
  times = np.asarray(columns["time"]).astype("datetime64[h]")
  steps = np.diff(times)
  wrong = steps != np.timedelta64(1, "h")
  if wrong.any():
    row = int(np.flatnonzero(wrong)[0]) + 1
    hours = int(steps[row - 1] / np.timedelta64(1, "h"))
    problem = "repeats it" if hours == 0 else f"skips {hours - 1} hour(s)" if hours > 1 else "goes back in time"
    raise ValueError(f"{what}: row {row} (time {times[row]}) after row {row - 1} ({times[row - 1]}) {problem}; "
                     "the rows must be consecutive hours in time order, one per hour, the last the forecast origin.")


def unmeasured_splits(pm25: np.ndarray, rows: Mapping[str, np.ndarray | slice]) -> list[str]:
  """The splits (name -> their rows of ``pm25``, float ug/m3 with NaN where not measured) without any
  measured value: a metric there is over zero hours (0 / 0), so no model could be chosen or scored on them."""
  return [split for split, selected in rows.items() if np.isnan(np.asarray(pm25)[selected]).all()]


def describe_hours(columns: dict[str, np.ndarray]) -> str:
  """What a file holds, beside :data:`RELEASE`'s words: its rows and its first and last hour (``YYYY-MM-DD HHh``)."""
  times = columns["time"]
  def hour(time):
    return str(time.astype("datetime64[h]")).replace("T", " ") + "h"
  return f"{len(times):,} rows, {hour(times[0])} to {hour(times[-1])}"


def split_of_year(year: int) -> str | None:
  return next((split for split, years in SPLIT_YEARS.items() if year in years), None)


class Builder(parallel_text.LocalSourceBuilder, tfds.core.GeneratorBasedBuilder):
  """Beijing PM2.5 hourly rows (see the module docstring).

  Args (beyond those of ``tfds.core.GeneratorBasedBuilder``: ``data_dir``, ``file_format``, ...):
    source_dir: folder holding ``PRSA_data_2010.1.1-2014.12.31.csv`` (or a sub-folder
      ``beijing_pm25/`` holding it). Only read.
  """

  VERSION = tfds.core.Version("1.1.0")
  RELEASE_NOTES = {"1.0.0": "Raw hourly rows of the UCI file; splits by year.",
                   # A new version so that data prepared without the fingerprint is not reused unchecked.
                   "1.1.0": "Records the size and SHA-256 of the CSV it was built from (source_files)."}

  _local_file: epath.Path | None = None  # set when a local source folder is found

  def _info(self) -> tfds.core.DatasetInfo:
    def scalar(dtype, doc):
      return tfds.features.Scalar(dtype, doc=doc)
    weather_docs = {"DEWP": "dew point, degrees C", "TEMP": "temperature, degrees C",
                    "PRES": "pressure, hPa", "Iws": "cumulated wind speed, m/s",
                    "Is": "cumulated hours of snow", "Ir": "cumulated hours of rain"}
    features = {
        "time": scalar(np.int64, "hours since 1970-01-01 00h, local Beijing time as in the file"),
        "pm25": scalar(np.float32, "PM2.5 concentration, ug/m3; NaN where the file has NA"),
        **{name: scalar(np.float32, weather_docs[name]) for name in WEATHER_COLUMNS},
        "cbwd": tfds.features.ClassLabel(names=list(WIND_DIRECTIONS),
                                         doc="combined wind direction (cv: calm and variable)"),
    }
    return parallel_text.local_dataset_info(
        self,
        features=tfds.features.FeaturesDict(features),
        homepage=HOMEPAGE,
        disable_shuffling=True,  # example i of a split is its i-th hour
        metadata=tfds.core.MetadataDict(),  # the source file's fingerprint
    )

  def download_and_prepare(self, *, download_config=None, **kwargs):
    """As TFDS's; first finds the raw file (or checks the network) so that a failure is plain, and refuses
    prepared data built from another file than the source folder now holds (``source_files.check_prepared``)."""
    manual_dir = download_config.manual_dir if download_config is not None else None
    if parallel_text.is_prepared(self):
      # Without a local file there is nothing to compare: the prepared data (of whatever file) is used.
      folder, _ = parallel_text.resolve_source_dir(self.name, self._source_dir_argument, manual_dir)
      if folder is not None and (folder / FILE_NAME).exists():
        source_files.check_prepared(self, {FILE_NAME: folder / FILE_NAME})
    else:
      folder, origin = parallel_text.resolve_source_dir(
          self.name, self._source_dir_argument, manual_dir)
      if folder is None:
        download.check_reachable(self.name, [URL], HOMEPAGE)
      else:
        self._local_file = folder / FILE_NAME
        if not self._local_file.exists():
          raise parallel_text.MissingDataError(
              f"beijing_pm25: {FILE_NAME} is not in {folder} (given by the {origin}); put it "
              f"there (official URL {URL}), or unset source_dir, manual_dir and "
              f"${parallel_text.ENV_VAR} to download it.")
        logger.info("beijing_pm25: reading %s (%s)", self._local_file, origin)
    return super().download_and_prepare(download_config=download_config, **kwargs)

  def _split_generators(self, dl_manager: tfds.download.DownloadManager):
    path = self._local_file
    if path is None:
      path = epath.Path(download.download(dl_manager, self.name, URL, HOMEPAGE))
    fingerprint = source_files.FileFingerprint.of(path)
    columns = read_csv(path)
    years = columns["time"].astype("datetime64[Y]").astype(np.int64) + 1970
    outside = np.flatnonzero([split_of_year(year) is None for year in np.unique(years)])
    if outside.size:
      raise InputFileError(f"{path}: rows of year(s) {np.unique(years)[outside].tolist()} "
                           f"belong to no split; the splits are {SPLIT_YEARS}.")
    selected = {split: np.isin(years, split_years) for split, split_years in SPLIT_YEARS.items()}
    source_files.check_nonempty_splits(
        self.name, {split: int(rows.sum()) for split, rows in selected.items()},
        f"{path} ({describe_hours(columns)})", f"the splits are the years {SPLIT_YEARS}")
    unmeasured = unmeasured_splits(columns["pm25"], selected)
    if unmeasured:
      raise InputFileError(
          f"{path}: no pm2.5 measured in split(s) {', '.join(unmeasured)} (years "
          f"{[year for split in unmeasured for year in SPLIT_YEARS[split]]}: every value {MISSING}); a model can be "
          f"neither chosen nor scored on hours without a measurement. Use a file with pm2.5 measured in the years "
          f"of every split (the UCI release: {RELEASE.contents}).")
    # After the checks above, so that a file that cannot be prepared gives its error line alone.
    source_files.warn_unless_release(self.name, path, fingerprint, RELEASE, lambda: describe_hours(columns))
    source_files.record(self, {FILE_NAME: fingerprint})  # under the release's name, wherever it was read
    return {split: self._generate_examples(columns, rows) for split, rows in selected.items()}

  def _generate_examples(self, columns: dict[str, np.ndarray],
                         selected: np.ndarray) -> Iterator[tuple[int, dict]]:
    hours = columns["time"].astype(np.int64)
    for index in np.flatnonzero(selected):
      example = {name: columns[name][index] for name in ("pm25", "cbwd") + WEATHER_COLUMNS}
      example["time"] = hours[index]
      yield int(index), example
