"""Beijing PM2.5 TFDS builder (``name="beijing_pm25"``) and its forecasting features.

``Builder`` stores the raw hourly rows; ``features.prepare`` / ``features.load`` turn them into
one normalised series whose windows ``transformer.data.timeseries`` slices on the fly.
"""
from transformer.data.beijing_pm25.beijing_pm25_dataset_builder import (
    COLUMNS, FILE_NAME, SPLIT_YEARS, URL, WIND_DIRECTIONS, Builder, read_csv)
from transformer.data.beijing_pm25.features import (
    FEATURE_NAMES, HORIZONS, PM25Series, load, prepare, split_bounds_by_year)
