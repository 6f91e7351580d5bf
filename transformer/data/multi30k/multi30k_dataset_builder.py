"""Multi30k task 1 (image-caption translation), raw text: en with de, fr and cs.

Configs ``en-de``, ``en-fr``, ``en-cs``; features ``{"en": text, "<other>": text}``. Splits, named
after the official files (``<file>.<lang>.gz``), only those that exist for both languages:

| split | file | pairs | configs |
| --- | --- | ---: | --- |
| ``train`` | ``train`` | 29,000 | all |
| ``validation`` | ``val`` | 1,014 | all |
| ``test_2016_flickr`` | ``test_2016_flickr`` | 1,000 | all |
| ``test_2017_flickr`` | ``test_2017_flickr`` | 1,000 | en-de, en-fr |
| ``test_2017_mscoco`` | ``test_2017_mscoco`` | 461 | en-de, en-fr |
| ``test_2018_flickr`` | ``test_2018_flickr`` | 1,071 | all |

The raw files are ``data/task1/raw/<split>.<lang>.gz`` of https://github.com/multi30k/dataset; without
``source_dir`` (or ``$TRANSFORMER_DATA_DIR``) they are downloaded from there. Usage (no TensorFlow needed)::

  builder = Builder(config="en-de", data_dir="/tmp/tfds", file_format="array_record",
                    source_dir="data/multi30k")  # a copy of the official files, or leave it out
  builder.download_and_prepare()
  builder.as_data_source("train")[0]  # {"de": b"Zwei junge ...", "en": b"Two young, ..."}
"""
from __future__ import annotations

from typing import Callable

import tensorflow_datasets as tfds

from transformer.data import parallel_text

# The repository's HEAD when the local copy was made; the raw files there never changed.
_COMMIT = "a3d2e0d26b56f3846f66a952536ffed4e401d05a"
_URL_BASE = f"https://raw.githubusercontent.com/multi30k/dataset/{_COMMIT}/data/task1/raw/"

# split name -> file prefix, languages other than English that have it.
_SPLITS = {
    "train": ("train", ("de", "fr", "cs")),
    "validation": ("val", ("de", "fr", "cs")),
    "test_2016_flickr": ("test_2016_flickr", ("de", "fr", "cs")),
    "test_2017_flickr": ("test_2017_flickr", ("de", "fr")),
    "test_2017_mscoco": ("test_2017_mscoco", ("de", "fr")),
    "test_2018_flickr": ("test_2018_flickr", ("de", "fr", "cs")),
}


class Builder(parallel_text.ParallelTextBuilder):
  """Multi30k task 1 raw parallel text (see the module docstring)."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Raw task-1 files of github.com/multi30k/dataset @ " + _COMMIT[:8]}
  BUILDER_CONFIGS = [
      parallel_text.pair_config("en", "de", "English-German (Elliott et al., 2016)"),
      parallel_text.pair_config("en", "fr", "English-French (Elliott et al., 2017)"),
      parallel_text.pair_config("en", "cs", "English-Czech (Barrault et al., 2018)"),
  ]
  DEFAULT_CONFIG_NAME = "en-de"
  HOMEPAGE = "https://github.com/multi30k/dataset"
  DOWNLOAD_HINT = ("The files are data/task1/raw/<split>.<lang>.gz of "
                   "github.com/multi30k/dataset.")

  def _split_files(self, exists: Callable[[str], bool]) -> parallel_text.SplitFiles:
    del exists  # every file of a config is required
    other = self.languages[1]
    return {split: {lang: f"{prefix}.{lang}.gz" for lang in self.languages}
            for split, (prefix, others) in _SPLITS.items() if other in others}

  def _url(self, file_name: str) -> str:
    return _URL_BASE + file_name
