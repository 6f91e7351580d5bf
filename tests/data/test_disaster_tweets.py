"""The Disaster Tweets builder on hand-made CSV files: a stratified, deterministic, disjoint split that covers
every row; Kaggle's quoting kept; every bad input named by file and row; the real files when present."""
from __future__ import annotations

import collections
import csv
import hashlib
import logging
import os
import random
import re
import shutil

import pytest

from tests.shared_data import shared_path
from transformer.data import disaster_tweets, parallel_text, source_files
from transformer.data.disaster_tweets import disaster_tweets_dataset_builder as tweets
from transformer.errors import InputFileError, MissingDataError

HEADER = ["id", "keyword", "location", "text", "target"]
# 30 tweets of class 0 and 20 of class 1: held-out splits of round(0.1 n) = 3 and 2 per class.
LABELLED = [[tweet_id, "flood" if tweet_id % 3 else "", "", f"tweet number {tweet_id}", int(tweet_id % 5 < 2)]
            for tweet_id in range(1, 51)]
# Kaggle's awkward cases: a quoted text with a comma, a quote and a newline; mojibake; %20 in a keyword.
LABELLED[4][1:4] = ["airplane%20accident", "Paris, France", 'Fire near "the" road,\nsend help']
LABELLED[7][3] = "mojibake åÊ Û_ &amp; ☕"
UNLABELLED = [[0, "", "", "Just happened a terrible car crash"],
              [2, "fire", "", "Heard about #earthquake,\nstay safe"], [3, "", "London", "Crash"]]


def write_csv(path, header, rows):
  with open(path, "w", newline="", encoding="utf-8") as file:
    writer = csv.writer(file, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)


@pytest.fixture
def source(tmp_path):
  folder = tmp_path / "raw" / "disaster_tweets"
  folder.mkdir(parents=True)
  write_csv(folder / "train.csv", HEADER, LABELLED)
  write_csv(folder / "test.csv", HEADER[:4], UNLABELLED)
  return folder


def build(data_dir, **kwargs):
  builder = disaster_tweets.Builder(data_dir=os.fspath(data_dir), file_format="array_record", **kwargs)
  builder.download_and_prepare()
  return builder


def read_split(builder, split):
  source = builder.as_data_source(split)
  return [source[index] for index in range(len(source))]


def test_split_is_stratified_disjoint_and_covers_every_row(source, tmp_path):
  builder = build(tmp_path / "tfds", source_dir=source)
  splits = {split: read_split(builder, split) for split in ("train", "validation", "test")}
  ids = {split: [int(example["id"]) for example in examples] for split, examples in splits.items()}
  assert sorted(sum(ids.values(), [])) == list(range(1, 51))  # every row once: disjoint and complete
  labels = {split: collections.Counter(int(example["label"]) for example in examples)
            for split, examples in splits.items()}
  assert labels == {"train": {0: 24, 1: 16}, "validation": {0: 3, 1: 2}, "test": {0: 3, 1: 2}}
  for split, split_ids in ids.items():
    assert split_ids == sorted(split_ids), split  # file order kept
  by_id = {row[0]: row for row in LABELLED}
  for example in sum(splits.values(), []):
    tweet_id, keyword, location, text, target = by_id[int(example["id"])]
    assert (example["keyword"].decode(), example["location"].decode(), example["text"].decode(),
            int(example["label"])) == (keyword, location, text, target)
  assert {split: info.num_examples for split, info in builder.info.splits.items()} == {
      "train": 40, "validation": 5, "test": 5, "kaggle_test": 3}
  assert builder.info.supervised_keys == ("text", "label")


def test_split_depends_on_the_ids_only(source, tmp_path):
  """The same ids in another row order (or another machine, run, seed) land in the same splits."""
  first = build(tmp_path / "tfds_first", source_dir=source)
  shuffled = LABELLED.copy()
  random.Random(0).shuffle(shuffled)
  write_csv(source / "train.csv", HEADER, shuffled)
  second = build(tmp_path / "tfds_second", source_dir=source)
  for split in ("train", "validation", "test"):
    assert (sorted(int(e["id"]) for e in read_split(first, split))
            == sorted(int(e["id"]) for e in read_split(second, split))), split
  # The held-out ids are those of lowest sha256 rank within their class (the documented rule).
  for label in (0, 1):
    ranked = sorted((row[0] for row in LABELLED if row[4] == label), key=tweets.split_rank_key)
    held_out = 3 if label == 0 else 2
    assert {int(e["id"]) for e in read_split(first, "test") if e["label"] == label} == set(ranked[:held_out])


def test_stratified_split_rounds_each_class_fraction():
  ids = list(range(1000, 1037))
  labels = [0] * 25 + [1] * 12
  assignment = tweets.stratified_split(ids, labels, held_out=(("test", 0.2), ("validation", 0.1)))
  counts = collections.Counter((label, assignment[tweet_id]) for tweet_id, label in zip(ids, labels))
  assert counts == {(0, "test"): 5, (0, "validation"): 2, (0, "train"): 18,  # round(2.5) = 2 (to even)
                    (1, "test"): 2, (1, "validation"): 1, (1, "train"): 9}


def test_kaggle_test_split_is_unlabelled_and_keeps_the_text(source, tmp_path):
  examples = read_split(build(tmp_path / "tfds", source_dir=source), "kaggle_test")
  assert [(int(e["id"]), e["keyword"].decode(), e["location"].decode(), e["text"].decode(), int(e["label"]))
          for e in examples] == [(*row, -1) for row in UNLABELLED]


def test_environment_variable_names_the_parent_folder(source, tmp_path, monkeypatch):
  monkeypatch.setenv(parallel_text.ENV_VAR, os.fspath(source.parent))
  assert build(tmp_path / "tfds").info.splits["kaggle_test"].num_examples == len(UNLABELLED)


def test_missing_files_say_where_to_put_them_and_nothing_is_downloaded(source, tmp_path):
  with pytest.raises(MissingDataError, match="Kaggle's files cannot be downloaded without a login") as raised:
    build(tmp_path / "tfds")
  assert "kaggle.com/competitions/nlp-getting-started" in str(raised.value)
  assert parallel_text.ENV_VAR in str(raised.value)
  (source / "test.csv").unlink()
  with pytest.raises(MissingDataError, match=f"test.csv missing in {source}"):
    build(tmp_path / "tfds", source_dir=source)
  assert not (tmp_path / "tfds" / "disaster_tweets").exists()  # nothing half-prepared


def test_missing_column_names_the_file_and_the_column(source, tmp_path):
  write_csv(source / "train.csv", ["id", "keyword", "location", "text"], [row[:4] for row in LABELLED])
  with pytest.raises(InputFileError, match=re.escape(f"{source / 'train.csv'}: missing column(s) target; the "
                                                     f"header is 'id,keyword,location,text'")):
    build(tmp_path / "tfds", source_dir=source)


# Row 5 of the fixture spans lines 6-7 (a quoted newline), so row 6 starts on line 8.
@pytest.mark.parametrize("row, change, message", [
    (6, lambda row: row.__setitem__(3, "  "), "row 7 (line 9): the text is empty"),
    (2, lambda row: row.__setitem__(4, 2), "row 3 (line 4): target '2' is not 0 or 1"),
    (9, lambda row: row.__setitem__(0, "x1"), "row 10 (line 12): id 'x1' is not an integer"),
    (9, lambda row: row.__setitem__(0, 2), "row 10 (line 12): id 2 repeats row 2"),
    (1, lambda row: row.pop(), "row 2 (line 3): 4 fields, the header has 5"),
])
def test_bad_rows_are_named_by_file_row_and_line(source, tmp_path, row, change, message):
  rows = [list(r) for r in LABELLED]
  change(rows[row])
  write_csv(source / "train.csv", HEADER, rows)
  with pytest.raises(InputFileError, match=re.escape(f"{source / 'train.csv'}, {message}")):
    build(tmp_path / "tfds", source_dir=source)


def test_non_utf8_tweet_is_named_by_row(source, tmp_path):
  data = (source / "test.csv").read_bytes().replace(b"Crash", "Crash in K\xf6ln".encode("latin-1"))
  (source / "test.csv").write_bytes(data)
  with pytest.raises(InputFileError, match=r"test.csv, row 3 \(line 5\): the text is not valid UTF-8"):
    build(tmp_path / "tfds", source_dir=source)


@pytest.mark.slow
def test_the_real_files_split_as_documented(tmp_path):
  folder = shared_path("data", "disaster_tweets")
  builder = build(tmp_path / "tfds", source_dir=folder)
  assert {split: info.num_examples for split, info in builder.info.splits.items()} == {
      "train": 6091, "validation": 761, "test": 761, "kaggle_test": 3263}
  balance = {split: collections.Counter(int(e["label"]) for e in read_split(builder, split))
             for split in ("train", "validation", "test")}
  assert balance == {"train": {0: 3474, 1: 2617}, "validation": {0: 434, 1: 327}, "test": {0: 434, 1: 327}}
  with open(folder / "train.csv", newline="", encoding="utf-8") as file:
    all_ids = sorted(int(row["id"]) for row in csv.DictReader(file))
  split_ids = sorted(int(e["id"]) for split in balance for e in read_split(builder, split))
  assert split_ids == all_ids
  first = read_split(builder, "train")[0]
  assert (int(first["id"]), first["text"].decode()) == (1, "Our Deeds are the Reason of this #earthquake May "
                                                           "ALLAH Forgive us all")


def test_a_first_preparation_warns_only_that_the_files_are_not_kaggles(source, tmp_path, caplog):
  """TFDS's is_prepared() warns 'Variant folder ... has no dataset_info.json' for every data set not prepared
  yet; the builder asks without it. What remains is one line per file that is not Kaggle's release, naming its
  rows and the release's."""
  caplog.set_level(logging.WARNING)
  build(tmp_path / "tfds", source_dir=source)
  warnings = [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING]
  assert len(warnings) == 2 and all("\n" not in warning for warning in warnings)
  assert "train.csv is not the published release" in warnings[0]
  assert "it holds 50 rows (30 not_disaster, 20 disaster), ids 1 to 50, the release 7,613 rows" in warnings[0]
  assert "test.csv is not the published release" in warnings[1] and "it holds 3 rows" in warnings[1]


def test_prepared_data_records_size_and_sha256_of_both_files(source, tmp_path):
  builder = build(tmp_path / "tfds", source_dir=source)
  expected = {name: source_files.FileFingerprint(len((source / name).read_bytes()),
                                                 hashlib.sha256((source / name).read_bytes()).hexdigest())
              for name in ("train.csv", "test.csv")}
  reopened = disaster_tweets.Builder(data_dir=os.fspath(tmp_path / "tfds"), file_format="array_record")
  assert source_files.recorded(reopened) == expected  # read back from the prepared folder
  assert source_files.data_fingerprint(reopened) == {
      f"disaster_tweets/{name}": f"size={value.size} sha256={value.sha256}" for name, value in expected.items()}


def test_prepared_data_of_a_cut_file_is_refused_once_the_full_file_is_back(source, tmp_path):
  """The issue's case: prepared from train.csv cut short, then the full file restored in the same folder."""
  full = (source / "train.csv").read_bytes()
  write_csv(source / "train.csv", HEADER, LABELLED[:30])
  cut = source_files.FileFingerprint.of(source / "train.csv")
  stale = build(tmp_path / "tfds", source_dir=source)
  assert stale.info.splits["train"].num_examples < 40
  (source / "train.csv").write_bytes(full)
  with pytest.raises(InputFileError) as raised:
    build(tmp_path / "tfds", source_dir=source)
  message = str(raised.value)
  assert "\n" not in message
  assert f"train.csv is now {source_files.FileFingerprint.of(source / 'train.csv')}" in message
  assert f"built from {cut}" in message and f"rm -r {stale.data_dir}" in message
  assert "test.csv" not in message  # unchanged, not named
  # Removing the folder as told prepares the full file; without a source folder the prepared data is used.
  shutil.rmtree(stale.data_dir)
  assert build(tmp_path / "tfds", source_dir=source).info.splits["train"].num_examples == 40
  assert build(tmp_path / "tfds").info.splits["train"].num_examples == 40


@pytest.mark.parametrize("train_rows, test_rows, empty", [(LABELLED[:4], UNLABELLED, "validation, test"),
                                                          (LABELLED, [], "kaggle_test")])
def test_an_empty_split_is_one_line_not_an_assertion(source, tmp_path, caplog, train_rows, test_rows, empty):
  write_csv(source / "train.csv", HEADER, train_rows)
  write_csv(source / "test.csv", HEADER[:4], test_rows)
  caplog.set_level(logging.WARNING)
  with pytest.raises(InputFileError) as raised:
    build(tmp_path / "tfds", source_dir=source)
  assert [record for record in caplog.records if record.levelno >= logging.WARNING] == []  # the error alone
  message = str(raised.value)
  assert f"no example for split(s) {empty} in {source}" in message and "\n" not in message
  assert not (tmp_path / "tfds" / "disaster_tweets" / str(disaster_tweets.Builder.VERSION)).exists()


def test_the_real_files_are_kaggles_release():
  folder = shared_path("data", "disaster_tweets")
  for name, release in tweets.RELEASES.items():
    assert source_files.FileFingerprint.of(folder / name) == release.fingerprint
    records = tweets.read_tweets(folder / name, tweets.COLUMNS[name])
    assert release.contents == tweets.describe_tweets(records)


def test_preparing_from_local_files_is_one_log_line_not_tfds_unknown_sizes(source, tmp_path, capsys, caplog):
  caplog.set_level(logging.INFO, "transformer.data.parallel_text")
  build(tmp_path / "tfds", source_dir=source)
  printed = capsys.readouterr()
  assert "Unknown size" not in printed.out + printed.err and "Subsequent calls" not in printed.out + printed.err
  assert [r.getMessage() for r in caplog.records if r.name == "transformer.data.parallel_text"] == [
      f"disaster_tweets: preparing the data set in {tmp_path / 'tfds' / 'disaster_tweets' / '1.1.0'}"]
