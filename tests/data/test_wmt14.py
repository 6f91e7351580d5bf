"""The WMT'14 de-en builder on a tiny fixture in the real files' format: TFDS's splits, local files extracted or as
archives, a missing file in one line, offline in one line."""
from __future__ import annotations

import os
import tarfile

import pytest

from data_fixtures import WMT14_SIZES, wmt14_pairs, write_wmt14
from test_parallel_text import build, closed_port_url
from transformer.data import download, parallel_text, wmt14
from transformer.data.wmt14 import wmt14_dataset_builder
from transformer.errors import InputFileError, MissingDataError

TRAIN = ("training/europarl-v7.de-en", "commoncrawl.de-en", "training/news-commentary-v9.de-en")


def read(builder, split):
  source = builder.as_data_source(split)
  return [(source[i]["de"].decode(), source[i]["en"].decode()) for i in range(len(source))]


def test_the_splits_are_tfds_sub_corpora_in_file_order_without_empty_pairs(tmp_path):
  builder = build(wmt14.Builder, tmp_path / "tfds", source_dir=write_wmt14(tmp_path / "raw"))
  assert {split: info.num_examples for split, info in builder.info.splits.items()} == {
      "train": sum(WMT14_SIZES[stem] for stem in TRAIN), "validation": 16, "test": 16}
  stems = list(WMT14_SIZES)
  # Common Crawl's extra line, empty in German, is left out; the corpora follow each other in TFDS's order.
  assert read(builder, "train") == [pair for stem in TRAIN for pair in wmt14_pairs(WMT14_SIZES[stem],
                                                                                      200 + stems.index(stem))]
  assert read(builder, "test") == wmt14_pairs(16, 200 + stems.index("dev/newstest2014-deen"))  # the <seg> texts
  assert read(builder, "validation") == wmt14_pairs(16, 200 + stems.index("dev/newstest2013"))
  assert builder.info.supervised_keys == ("de", "en")
  assert builder.info.metadata["source_files"]["test"] == [{"de": "dev/newstest2014-deen-src.de.sgm",
                                                            "en": "dev/newstest2014-deen-ref.en.sgm"}]


def test_the_files_and_archives_are_tfds_wmt14_translate_de_en():
  from tensorflow_datasets.translate import wmt, wmt14 as tfds_wmt14  # pylint: disable=import-outside-toplevel
  subsets = tfds_wmt14.Wmt14Translate._subsets.fget(None)  # pylint: disable=protected-access
  theirs = {split: [(name, wmt.DATASET_MAP[name].get_url("de"), wmt.DATASET_MAP[name].get_path("de"))
                    for name in names if "de" in wmt.DATASET_MAP[name].sources and wmt.DATASET_MAP[name].target == "en"]
            for split, names in subsets.items()}
  ours = {split: [(corpus.name, [corpus.url], [corpus.files["de"], corpus.files["en"]]) for corpus in corpora]
          for split, corpora in wmt14_dataset_builder.SPLITS.items()}
  assert ours == theirs


def test_archives_as_downloaded_give_the_same_data_as_their_files_extracted(tmp_path):
  extracted = write_wmt14(tmp_path / "extracted")
  archives = tmp_path / "archives"
  archives.mkdir()
  for url, files in wmt14_dataset_builder.ARCHIVES.items():
    with tarfile.open(archives / url.rpartition("/")[2], "w:gz") as archive:
      for name in files:
        archive.add(extracted / name, arcname=name)
  from_files = build(wmt14.Builder, tmp_path / "tfds_files", source_dir=extracted)
  from_archives = build(wmt14.Builder, tmp_path / "tfds_archives", source_dir=archives)
  for split in ("train", "validation", "test"):
    assert read(from_archives, split) == read(from_files, split)
  assert sorted(path.name for path in archives.iterdir()) == sorted(
      url.rpartition("/")[2] for url in wmt14_dataset_builder.ARCHIVES)  # the source folder is only read


def test_a_missing_file_is_one_line_naming_it_its_archive_and_where_to_put_it(tmp_path, monkeypatch):
  raw = write_wmt14(tmp_path / "raw")
  (raw / "dev" / "newstest2014-deen-ref.en.sgm").unlink()
  monkeypatch.setenv(parallel_text.ENV_VAR, os.fspath(raw))
  with pytest.raises(MissingDataError) as raised:
    build(wmt14.Builder, tmp_path / "tfds")
  message = str(raised.value)
  assert "\n" not in message
  assert f"files missing in {raw} (given by the ${parallel_text.ENV_VAR})" in message
  assert "dev/newstest2014-deen-ref.en.sgm (or dev.tgz)" in message and "newstest2013" not in message
  assert "training-parallel-europarl-v7.tgz" in message and "into that folder" in message
  assert not (tmp_path / "tfds" / "wmt14" / "de-en").exists()  # nothing half-prepared


def test_misaligned_files_are_refused(tmp_path):
  raw = write_wmt14(tmp_path / "raw")
  with (raw / "dev" / "newstest2013.en").open("a", encoding="utf-8") as file:
    file.write("One line too many .\n")
  with pytest.raises(InputFileError, match="newstest2013.de: 16, .*newstest2013.en: 17"):
    build(wmt14.Builder, tmp_path / "tfds", source_dir=raw)


def test_offline_without_a_folder_the_download_fails_at_once_in_one_line(tmp_path, monkeypatch):
  base = closed_port_url()
  monkeypatch.setattr(download.urllib.request, "getproxies", lambda: {})
  monkeypatch.setattr(wmt14_dataset_builder, "ARCHIVES", {base + "dev.tgz": ["dev/newstest2013.de"]})
  with pytest.raises(MissingDataError) as raised:
    build(wmt14.Builder, tmp_path / "tfds")
  message = str(raised.value)
  assert "\n" not in message and message.startswith(f"wmt14: cannot download {base}dev.tgz")
  assert "--config.task.source_dir=<folder>" in message and "holding wmt14/" in message
