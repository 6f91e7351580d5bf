"""Kaggle's "Natural Language Processing with Disaster Tweets" (``nlp-getting-started``), from its CSV files.

Features: ``id`` (int64), ``keyword``, ``location``, ``text`` (text, exactly as Kaggle ships them: keywords
keep their ``%20``, tweets their mojibake and ``&amp;``) and ``label`` (``ClassLabel``: 0 ``not_disaster``,
1 ``disaster``; -1 where unknown). ``supervised_keys`` is ``("text", "label")``. Splits:

| split | from | rows | labels |
| --- | --- | ---: | --- |
| ``train`` | ``train.csv``, 80% of each class | 6,091 | 3,474 / 2,617 |
| ``validation`` | ``train.csv``, 10% of each class | 761 | 434 / 327 |
| ``test`` | ``train.csv``, 10% of each class | 761 | 434 / 327 |
| ``kaggle_test`` | ``test.csv`` (the competition's, unlabelled) | 3,263 | all -1 |

The split of ``train.csv`` is fixed, so results compare across runs and models: within each class the rows
are ranked by the SHA-256 of ``"disaster_tweets:<id>"``; the first ``round(0.1 n)`` of a class of ``n``
rows are ``test``, the next ``round(0.1 n)`` ``validation``, the rest ``train`` (see
:func:`stratified_split`). Every split keeps the order of its file (``as_data_source(split)[i]``).

Kaggle needs a login, so nothing is downloaded: the two files come from a local folder, the builder argument
``source_dir=...``, else ``download_config.manual_dir``, else ``$TRANSFORMER_DATA_DIR/disaster_tweets``.
Rows are checked as they are read; a missing column, a row with too few or too many fields, a non-UTF-8
byte, a bad or repeated ``id``, a ``target`` other than 0/1, or an empty tweet (whitespace only: Kaggle's
files have none, so one means a damaged file) raises :class:`InputFileError` naming the file and row.

The prepared data records the size and SHA-256 of both files (``transformer.data.source_files``); reused with a
source folder whose files differ since, it is refused in one line naming the file, both fingerprints and the
folder to remove. A file other than Kaggle's (:data:`RELEASES`: cut short, edited) is prepared with one WARNING
line naming its rows and the release's; a split left empty (too few rows) is one :class:`InputFileError` line.

Usage (no TensorFlow needed)::

  builder = Builder(data_dir="/tmp/tfds", file_format="array_record",
                    source_dir="../shared/data/disaster_tweets")  # or $TRANSFORMER_DATA_DIR
  builder.download_and_prepare()
  builder.as_data_source("train")[0]  # {"id": 1, "keyword": b"", "location": b"",
                                      #  "text": b"Our Deeds are the Reason of this #earthquake ...", "label": 1}
"""
from __future__ import annotations

import collections
import csv
import hashlib
import io
import logging
from typing import Iterator, Mapping, Sequence

from etils import epath
import numpy as np
import tensorflow_datasets as tfds

from transformer.data import parallel_text, source_files
from transformer.errors import InputFileError, MissingDataError

NAME = "disaster_tweets"
TRAIN_FILE, TEST_FILE = "train.csv", "test.csv"
TEXT_COLUMNS = ("keyword", "location", "text")
COLUMNS = {TRAIN_FILE: ("id",) + TEXT_COLUMNS + ("target",), TEST_FILE: ("id",) + TEXT_COLUMNS}
LABEL_NAMES = ("not_disaster", "disaster")
# Fractions of each class of train.csv held out, in the order the ranking assigns them.
HELD_OUT_FRACTIONS = (("test", 0.1), ("validation", 0.1))
SPLIT_SALT = "disaster_tweets:"
UNLABELLED = -1
# Kaggle's files as published, for the warning when a local copy differs. train.csv: the SHA-256 that projects
# which downloaded it from Kaggle record; test.csv: no published digest, the one of three identical public copies
# (both in ../shared/data/disaster_tweets/SOURCE.md).
RELEASES = {
    TRAIN_FILE: source_files.Release(
        source_files.FileFingerprint(987_712, "61111c6dc31eaffa34d1e1fa62e2395325c9bc3b38bba1941a5f1ed9b3fa60df"),
        "the digest recorded by projects that downloaded it from Kaggle",
        "7,613 rows (4,342 not_disaster, 3,271 disaster), ids 1 to 10,873"),
    TEST_FILE: source_files.Release(
        source_files.FileFingerprint(420_783, "33375dc852696331c5ad30d078ea4d20e357b74052be6225fecc2a2b0f468bd2"),
        "three identical public copies of Kaggle's file",
        "3,263 rows, ids 0 to 10,875"),
}

logger = logging.getLogger(__name__)


def read_tweets(path: epath.PathLike, columns: Sequence[str]) -> list[dict]:
  """The records of a Kaggle CSV file, checked: ``{"id": int, "keyword", "location", "text": str,
  "target": int}`` (``target`` only when ``columns`` has it). Parsed as RFC 4180 CSV (quoted fields may hold
  newlines). Other columns are ignored.

  Raises:
    InputFileError: naming the file, the row (1 = the first after the header) and its first line.
  """
  path = epath.Path(path)
  # surrogateescape keeps undecodable bytes as lone surrogates, so the row holding one can be named.
  text = path.read_bytes().decode("utf-8", errors="surrogateescape").removeprefix("\ufeff")
  reader = csv.reader(io.StringIO(text, newline=""))
  header = next(reader, None)
  if header is None:
    raise InputFileError(f"{path}: empty file; expected a CSV header {','.join(columns)} and one row per tweet.")
  missing = [column for column in columns if column not in header]
  if missing:
    raise InputFileError(f"{path}: missing column(s) {', '.join(missing)}; the header is {','.join(header)!r}, "
                         f"expected {','.join(columns)} (Kaggle's {path.name}).")
  index = {column: header.index(column) for column in columns}
  records, seen_ids = [], {}
  first_line = reader.line_num + 1
  for row_number, row in enumerate(reader, start=1):
    where = f"{path}, row {row_number} (line {first_line})"
    first_line = reader.line_num + 1
    if len(row) != len(header):
      raise InputFileError(f"{where}: {len(row)} fields, the header has {len(header)}; a field holding a comma, "
                           f"quote or newline must be in double quotes.")
    for column, value in zip(header, row):
      if any("\udc80" <= character <= "\udcff" for character in value):
        raise InputFileError(f"{where}: the {column} is not valid UTF-8; save the file as UTF-8.")
    try:
      tweet_id = int(row[index["id"]])
    except ValueError:
      raise InputFileError(f"{where}: id {row[index['id']]!r} is not an integer.") from None
    if tweet_id in seen_ids:
      raise InputFileError(f"{where}: id {tweet_id} repeats row {seen_ids[tweet_id]}; ids must be unique.")
    seen_ids[tweet_id] = row_number
    record = {"id": tweet_id, **{column: row[index[column]] for column in TEXT_COLUMNS}}
    if not record["text"].strip():
      raise InputFileError(f"{where}: the text is empty; every tweet needs text (remove the row or fix it).")
    if "target" in index:
      target = row[index["target"]]
      if target not in ("0", "1"):
        raise InputFileError(f"{where}: target {target!r} is not 0 or 1.")
      record["target"] = int(target)
    records.append(record)
  return records


def describe_tweets(records: Sequence[Mapping]) -> str:
  """What a file of tweets holds, as :data:`RELEASES` says it: rows, labels (if any), id range."""
  if not records:
    return "no rows"
  text = f"{len(records):,} rows"
  labels = collections.Counter(record["target"] for record in records if "target" in record)
  if labels:
    text += f" ({labels[0]:,} {LABEL_NAMES[0]}, {labels[1]:,} {LABEL_NAMES[1]})"
  ids = [record["id"] for record in records]
  return f"{text}, ids {min(ids):,} to {max(ids):,}"


def split_rank_key(tweet_id: int) -> str:
  return hashlib.sha256(f"{SPLIT_SALT}{tweet_id}".encode()).hexdigest()


def stratified_split(ids: Sequence[int], labels: Sequence[int],
                     held_out: Sequence[tuple[str, float]] = HELD_OUT_FRACTIONS) -> dict[int, str]:
  """Split name of each id: within each label, ids ranked by :func:`split_rank_key`; the first
  ``round(fraction * n)`` go to the first held-out split, the next to the second, ..., the rest to ``train``.

  Deterministic (a function of the ids alone, not of their order or any seed) and exactly stratified: every
  split holds each label's fraction, up to rounding (Python's ``round``: halves to even).
  """
  by_label = collections.defaultdict(list)
  for tweet_id, label in zip(ids, labels):
    by_label[label].append(tweet_id)
  assignment = {}
  for label_ids in by_label.values():
    ranked = sorted(label_ids, key=split_rank_key)
    start = 0
    for split, fraction in held_out:
      count = round(fraction * len(ranked))
      assignment.update((tweet_id, split) for tweet_id in ranked[start:start + count])
      start += count
    assignment.update((tweet_id, "train") for tweet_id in ranked[start:])
  return assignment


class Builder(parallel_text.LocalSourceBuilder, tfds.core.GeneratorBasedBuilder):
  """Disaster Tweets from Kaggle's CSV files (see the module docstring).

  Args (beyond those of ``tfds.core.GeneratorBasedBuilder``: ``data_dir``, ``file_format``, ...):
    source_dir: folder holding ``train.csv`` and ``test.csv`` (or a sub-folder ``disaster_tweets/``). Only
      read.
  """

  VERSION = tfds.core.Version("1.1.0")
  RELEASE_NOTES = {"1.0.0": "Kaggle nlp-getting-started train.csv (split 80/10/10 per class) and test.csv.",
                   # A new version so that data prepared without the fingerprints is not reused unchecked.
                   "1.1.0": "Records the size and SHA-256 of train.csv and test.csv (source_files)."}
  MANUAL_DOWNLOAD_INSTRUCTIONS = (
      f"Download train.csv and test.csv from https://www.kaggle.com/competitions/nlp-getting-started/data "
      f"(needs a Kaggle login) into a folder; pass it as source_dir=... or set ${parallel_text.ENV_VAR} to a "
      f"folder holding {NAME}/.")
  _local_dir: epath.Path | None = None  # set when a local source folder is found

  def _info(self) -> tfds.core.DatasetInfo:
    return parallel_text.local_dataset_info(
        self,
        features=tfds.features.FeaturesDict({
            "id": tfds.features.Scalar(np.int64, doc="Kaggle's tweet id"),
            "keyword": tfds.features.Text(doc="a disaster keyword of the tweet (may be empty; %20 = space)"),
            "location": tfds.features.Text(doc="the user's profile location (may be empty)"),
            "text": tfds.features.Text(doc="the tweet"),
            "label": tfds.features.ClassLabel(names=LABEL_NAMES, doc="-1: unknown (kaggle_test)"),
        }),
        supervised_keys=("text", "label"),
        homepage="https://www.kaggle.com/competitions/nlp-getting-started",
        disable_shuffling=True,
        metadata=tfds.core.MetadataDict(),
    )

  def download_and_prepare(self, *, download_config=None, **kwargs):
    """As TFDS's; first finds the two files so that a missing one fails here, plainly, and refuses prepared data
    built from other files than the source folder now holds (``source_files.check_prepared``)."""
    manual_dir = download_config.manual_dir if download_config is not None else None
    if parallel_text.is_prepared(self):  # self.is_prepared() warns of a missing dataset_info.json
      # Without a source folder (or with the files gone) there is nothing to compare: the prepared data is used.
      folder, _ = parallel_text.resolve_source_dir(NAME, self._source_dir_argument, manual_dir)
      if folder is not None and all((folder / name).exists() for name in COLUMNS):
        source_files.check_prepared(self, {name: folder / name for name in COLUMNS})
    else:
      self._local_dir, origin = parallel_text.resolve_source_dir(NAME, self._source_dir_argument, manual_dir)
      if self._local_dir is None:
        raise MissingDataError(f"{NAME}: no source folder given and Kaggle's files cannot be downloaded "
                               f"without a login. {self.MANUAL_DOWNLOAD_INSTRUCTIONS}")
      missing = [name for name in COLUMNS if not (self._local_dir / name).exists()]
      if missing:
        raise MissingDataError(f"{NAME}: {' and '.join(missing)} missing in {self._local_dir} (given by the "
                               f"{origin}). {self.MANUAL_DOWNLOAD_INSTRUCTIONS}")
    return super().download_and_prepare(download_config=download_config, **kwargs)

  def _split_generators(self, dl_manager: tfds.download.DownloadManager):
    del dl_manager  # nothing is downloaded
    paths = {name: self._local_dir / name for name in COLUMNS}
    fingerprints = source_files.fingerprint_files(paths)
    labelled = read_tweets(paths[TRAIN_FILE], COLUMNS[TRAIN_FILE])
    unlabelled = read_tweets(paths[TEST_FILE], COLUMNS[TEST_FILE])
    assignment = stratified_split([record["id"] for record in labelled], [record["target"] for record in labelled])
    splits = {split: [] for split in ("train", "validation", "test")}
    for record in labelled:
      splits[assignment[record["id"]]].append(record)
    splits["kaggle_test"] = unlabelled
    split_rule = (f"train.csv, per class, ranked by sha256('{SPLIT_SALT}<id>'): first round(0.1 n) test, next "
                  f"round(0.1 n) validation, rest train")
    source_files.check_nonempty_splits(
        NAME, {split: len(records) for split, records in splits.items()},
        f"{self._local_dir} ({describe_tweets(labelled)} in {TRAIN_FILE}, {describe_tweets(unlabelled)} in "
        f"{TEST_FILE})", f"the splits are {split_rule}; kaggle_test is {TEST_FILE}")
    # After the check above, so that files that cannot be prepared give their error line alone.
    for name, records in ((TRAIN_FILE, labelled), (TEST_FILE, unlabelled)):
      source_files.warn_unless_release(NAME, paths[name], fingerprints[name], RELEASES[name],
                                       lambda records=records: describe_tweets(records))
    # Saved with the prepared data: where each split came from, how train.csv was divided, which bytes were read.
    self.info.metadata["source_files"] = {"train": TRAIN_FILE, "validation": TRAIN_FILE, "test": TRAIN_FILE,
                                          "kaggle_test": TEST_FILE}
    self.info.metadata["split_rule"] = split_rule
    source_files.record(self, fingerprints)
    logger.info("%s: %s", NAME, {split: len(records) for split, records in splits.items()})
    return {split: self._generate_examples(records) for split, records in splits.items()}

  def _generate_examples(self, records: Sequence[Mapping]) -> Iterator[tuple[int, dict]]:
    for record in records:
      example = {column: record[column] for column in ("id",) + TEXT_COLUMNS}
      yield record["id"], {**example, "label": record.get("target", UNLABELLED)}
