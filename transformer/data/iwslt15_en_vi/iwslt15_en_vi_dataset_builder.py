"""IWSLT'15 English-Vietnamese (TED talks), the Stanford NMT preprocessed release.

One config ``en-vi``; features ``{"en": text, "vi": text}`` (Moses-tokenised, ``&apos;`` escapes,
original casing, as released). Splits:

| split | files | pairs |
| --- | --- | ---: |
| ``train`` | ``train.{en,vi}`` (else ``train.10k.{en,vi}``) | 133,317 (10,000) |
| ``validation`` | ``tst2012.{en,vi}`` | 1,553 |
| ``test`` | ``tst2013.{en,vi}`` | 1,268 |

The training split is made from ``train.en``/``train.vi`` when the source folder holds them, else
from ``train.10k.en``/``train.10k.vi`` (the first 10,000 pairs; a warning says so). Which files were
used is saved with the prepared data (``builder.info.metadata["source_files"]``) and the number of
pairs is ``builder.info.splits["train"].num_examples``. A prepared dataset is reused as it is: to
rebuild from other training files, prepare into another ``data_dir`` or pass
``download_config=tfds.download.DownloadConfig(download_mode="force_redownload")``.

The files are at https://nlp.stanford.edu/projects/nmt/data/iwslt15.en-vi/ (official source:
https://nlp.stanford.edu/projects/nmt/); without ``source_dir`` (or ``$TRANSFORMER_DATA_DIR``) they are
downloaded from there. Usage (no TensorFlow needed)::

  builder = Builder(data_dir="/tmp/tfds", file_format="array_record",
                    source_dir="data/iwslt15_en_vi")  # a copy of the official files, or leave it out
  builder.download_and_prepare()
  builder.as_data_source("test")[0]  # {"en": b"When I was little , ...", "vi": b"..."}
"""
from __future__ import annotations

import logging
from typing import Callable

import tensorflow_datasets as tfds

from transformer.data import parallel_text

_URL_BASE = "https://nlp.stanford.edu/projects/nmt/data/iwslt15.en-vi/"
_LANGUAGES = ("en", "vi")

logger = logging.getLogger(__name__)


class Builder(parallel_text.ParallelTextBuilder):
  """IWSLT'15 en-vi, Stanford NMT release (see the module docstring)."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Stanford NMT files: train, tst2012 (validation), tst2013 (test)."}
  BUILDER_CONFIGS = [parallel_text.pair_config("en", "vi", "English-Vietnamese TED talks")]
  HOMEPAGE = "https://nlp.stanford.edu/projects/nmt/"
  DOWNLOAD_HINT = (f"The files are at {_URL_BASE}<file>; train.10k.en/train.10k.vi (the first "
                   "10,000 lines of train.en/train.vi) may stand in for the training files.")

  def _split_files(self, exists: Callable[[str], bool]) -> parallel_text.SplitFiles:
    full, head = "train", "train.10k"
    if all(exists(f"{full}.{lang}") for lang in _LANGUAGES):
      train = full
    elif all(exists(f"{head}.{lang}") for lang in _LANGUAGES):
      train = head
      logger.warning("iwslt15_en_vi: train.en/train.vi not found, the training split is made from "
                     "train.10k.en/train.10k.vi (the first 10,000 of 133,317 pairs).")
    else:
      train = full  # reported as missing
    return {split: {lang: f"{stem}.{lang}" for lang in _LANGUAGES}
            for split, stem in (("train", train), ("validation", "tst2012"), ("test", "tst2013"))}

  def _url(self, file_name: str) -> str:
    return _URL_BASE + file_name
