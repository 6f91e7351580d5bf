"""The Multi30k and IWSLT'15 builders on tiny fixtures: build, read back, sizes, errors."""
from __future__ import annotations

import gzip
import os
import pathlib
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from data_fixtures import (IWSLT_SIZES, MULTI30K_SIZES, MULTI30K_SPLITS, sentence_pairs,
                           write_iwslt, write_multi30k)
from transformer.data import download, iwslt15_en_vi, multi30k, parallel_text
from transformer.data.multi30k import multi30k_dataset_builder


def build(builder_class, data_dir, **kwargs):
  builder = builder_class(data_dir=os.fspath(data_dir), file_format="array_record", **kwargs)
  builder.download_and_prepare()
  return builder


def test_multi30k_splits_have_the_file_sizes_and_keep_line_order(raw_root, tmp_path):
  builder = build(multi30k.Builder, tmp_path / "tfds", config="en-de",
                  source_dir=raw_root / "multi30k")
  sizes = {split: info.num_examples for split, info in builder.info.splits.items()}
  assert sizes == {split: MULTI30K_SIZES[prefix] for split, prefix in MULTI30K_SPLITS.items()}
  validation = builder.as_data_source("validation")
  expected = sentence_pairs(MULTI30K_SIZES["val"], seed=list(MULTI30K_SIZES).index("val"))
  read = [(validation[i]["en"].decode(), validation[i]["de"].decode())
          for i in range(len(validation))]
  assert read == expected  # file order, both languages aligned
  assert builder.info.supervised_keys == ("en", "de")
  assert builder.info.metadata["source_files"]["validation"] == {"en": "val.en.gz",
                                                                 "de": "val.de.gz"}


def test_multi30k_en_cs_has_only_the_splits_with_czech(tmp_path):
  sizes = {prefix: 2 for prefix in ("train", "val", "test_2016_flickr", "test_2018_flickr")}
  source = write_multi30k(tmp_path / "raw", languages=("en", "cs"), sizes=sizes)
  builder = build(multi30k.Builder, tmp_path / "tfds", config="en-cs", source_dir=source)
  assert sorted(builder.info.splits) == sorted(
      ["train", "validation", "test_2016_flickr", "test_2018_flickr"])


def test_environment_variable_names_the_parent_folder(raw_root, tmp_path, monkeypatch):
  monkeypatch.setenv(parallel_text.ENV_VAR, os.fspath(raw_root))
  builder = build(multi30k.Builder, tmp_path / "tfds", config="en-de")
  assert builder.info.splits["train"].num_examples == MULTI30K_SIZES["train"]


def test_iwslt_uses_train_10k_when_full_training_files_are_absent(raw_root, tmp_path):
  builder = build(iwslt15_en_vi.Builder, tmp_path / "tfds", source_dir=raw_root)
  assert {split: info.num_examples for split, info in builder.info.splits.items()} == {
      "train": IWSLT_SIZES["train.10k"], "validation": IWSLT_SIZES["tst2012"],
      "test": IWSLT_SIZES["tst2013"]}
  assert builder.info.metadata["source_files"]["train"] == {"en": "train.10k.en",
                                                            "vi": "train.10k.vi"}
  # Reopened without a source folder, the prepared data says how many training pairs it has.
  reopened = iwslt15_en_vi.Builder(data_dir=os.fspath(tmp_path / "tfds"))
  assert reopened.info.splits["train"].num_examples == IWSLT_SIZES["train.10k"]
  assert len(reopened.as_data_source("train")) == IWSLT_SIZES["train.10k"]


def test_iwslt_prefers_the_full_training_files(tmp_path):
  source = write_iwslt(tmp_path / "raw", sizes={"train": 7, "train.10k": 5, "tst2012": 2,
                                               "tst2013": 2})
  builder = build(iwslt15_en_vi.Builder, tmp_path / "tfds", source_dir=source)
  assert builder.info.splits["train"].num_examples == 7
  assert builder.info.metadata["source_files"]["train"]["en"] == "train.en"


def test_without_a_local_folder_the_official_urls_are_downloaded(raw_root, tmp_path, monkeypatch):
  requested = []

  def fake_download(self, urls):  # serves the fixture files, renamed as TFDS's cache does
    requested.extend(urls.values())
    paths = {}
    for key, url in urls.items():
      copy = tmp_path / "cache" / f"{key}_{abs(hash(url))}"
      copy.parent.mkdir(exist_ok=True)
      copy.write_bytes((raw_root / "iwslt15_en_vi" / url.rsplit("/", 1)[1]
                        .replace("train.", "train.10k.")).read_bytes())
      paths[key] = copy
    return paths

  checked = []
  monkeypatch.setattr(download, "check_reachable", lambda dataset, urls, homepage: checked.extend(urls))
  monkeypatch.setattr(parallel_text.tfds.download.DownloadManager, "download", fake_download)
  builder = build(iwslt15_en_vi.Builder, tmp_path / "tfds")
  assert sorted(checked) == sorted(requested)  # the hosts were probed before the download
  assert sorted(url.rsplit("/", 1)[1] for url in requested) == [
      "train.en", "train.vi", "tst2012.en", "tst2012.vi", "tst2013.en", "tst2013.vi"]
  assert all(url.startswith("https://nlp.stanford.edu/projects/nmt/data/") for url in requested)
  assert builder.info.splits["test"].num_examples == IWSLT_SIZES["tst2013"]


def test_multi30k_urls_are_the_official_raw_files(tmp_path):
  builder_url = multi30k.Builder(config="en-de", data_dir=os.fspath(tmp_path))._url("train.de.gz")
  assert builder_url.startswith("https://raw.githubusercontent.com/multi30k/dataset/")
  assert builder_url.endswith("/data/task1/raw/train.de.gz")


def test_missing_file_names_the_files_and_the_environment_variable(raw_root, tmp_path):
  (raw_root / "multi30k" / "test_2017_mscoco.de.gz").unlink()
  builder = multi30k.Builder(config="en-de", data_dir=os.fspath(tmp_path / "tfds"),
                             file_format="array_record", source_dir=raw_root / "multi30k")
  with pytest.raises(parallel_text.MissingDataError) as raised:
    builder.download_and_prepare()
  message = str(raised.value)
  assert isinstance(raised.value, FileNotFoundError)
  assert "missing: test_2017_mscoco.de.gz" in message
  assert "train.en.gz" in message and parallel_text.ENV_VAR in message
  assert not (tmp_path / "tfds" / "multi30k" / "en-de").exists()  # nothing half-prepared


def test_missing_folder_is_reported_and_nothing_is_downloaded(tmp_path, monkeypatch):
  monkeypatch.setenv(parallel_text.ENV_VAR, os.fspath(tmp_path / "nowhere"))
  builder = iwslt15_en_vi.Builder(data_dir=os.fspath(tmp_path / "tfds"), file_format="array_record")
  with pytest.raises(parallel_text.MissingDataError, match="not a directory"):
    builder.download_and_prepare()
  empty = tmp_path / "empty"
  empty.mkdir()
  with pytest.raises(FileNotFoundError, match="missing: train.en train.vi tst2012.en"):
    iwslt15_en_vi.Builder(data_dir=os.fspath(tmp_path / "tfds"),
                          source_dir=empty).download_and_prepare()


def test_misaligned_files_are_refused(raw_root, tmp_path):
  path = raw_root / "multi30k" / "val.de.gz"
  path.write_bytes(gzip.compress(gzip.decompress(path.read_bytes()) + b"one line too many\n"))
  with pytest.raises(ValueError, match="same number of lines"):
    build(multi30k.Builder, tmp_path / "tfds", config="en-de", source_dir=raw_root)


def test_read_lines_splits_on_newlines_only(tmp_path):
  path = tmp_path / "x.en"
  path.write_text("a\u2028b \nc\x0cd\n", encoding="utf-8")
  assert parallel_text.read_lines(path) == ["a\u2028b", "c\x0cd"]


@pytest.mark.slow
def test_builds_and_reads_without_tensorflow(raw_root, tmp_path):
  """In a fresh interpreter where `import tensorflow` fails, even if it is installed."""
  script = textwrap.dedent(f"""
      import sys

      class HideTensorFlow:  # as if tensorflow were not installed, even where it is
        def __init__(self, finder):
          self.finder = finder
        def find_spec(self, name, path=None, target=None):
          if name == "tensorflow" or name.startswith("tensorflow."):
            return None
          return self.finder.find_spec(name, path, target)
        def __getattr__(self, attribute):
          return getattr(self.finder, attribute)

      sys.meta_path[:] = [HideTensorFlow(finder) for finder in sys.meta_path]
      import tensorflow_datasets as tfds
      tfds.disable_progress_bar()
      from transformer.data import multi30k
      builder = multi30k.Builder(config="en-de", data_dir={os.fspath(tmp_path / 'tfds')!r},
                                 file_format="array_record",
                                 source_dir={os.fspath(raw_root / 'multi30k')!r})
      builder.download_and_prepare()
      source = builder.as_data_source("train")
      print("RESULT", len(source), "tensorflow" in sys.modules)
  """)
  result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=pathlib.Path(__file__).parents[2], timeout=120)
  assert result.returncode == 0, result.stderr[-3000:]
  assert f"RESULT {MULTI30K_SIZES['train']} False" in result.stdout


def closed_port_url() -> str:
  """``http://127.0.0.1:PORT/`` of a port nothing listens on (bound, then closed): connecting is refused at once."""
  with socket.socket() as probe:
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
  return f"http://127.0.0.1:{port}/"


def test_offline_the_download_fails_at_once_in_one_line_naming_files_source_and_settings(tmp_path, monkeypatch):
  base = closed_port_url()
  monkeypatch.setattr(download.urllib.request, "getproxies", lambda: {})
  monkeypatch.setattr(multi30k_dataset_builder, "_URL_BASE", base)
  started = time.monotonic()
  with pytest.raises(parallel_text.MissingDataError) as raised:
    build(multi30k.Builder, tmp_path / "tfds", config="en-de")
  assert time.monotonic() - started < 5
  message = str(raised.value)
  assert "\n" not in message and raised.value.__cause__ is None  # nothing from the downloader
  assert message.startswith("multi30k: cannot download train.en.gz train.de.gz val.en.gz")
  assert f"from {base} (" in message
  for part in ("official source: https://github.com/multi30k/dataset", "--config.task.source_dir=<folder>",
               f"${parallel_text.ENV_VAR}", "holding multi30k/"):
    assert part in message
  assert not (tmp_path / "tfds" / "multi30k" / "en-de").exists()


def test_a_failing_download_is_the_same_one_line(tmp_path, monkeypatch):
  """Behind a proxy the probe is skipped; the downloader's own failure becomes the same line."""
  def refuse(self, urls):
    raise OSError("Max retries exceeded\n(Caused by ProxyError)")
  monkeypatch.setattr(download.urllib.request, "getproxies", lambda: {"https": "http://proxy:3128"})
  monkeypatch.setattr(parallel_text.tfds.download.DownloadManager, "download", refuse)
  with pytest.raises(parallel_text.MissingDataError) as raised:
    build(iwslt15_en_vi.Builder, tmp_path / "tfds")
  message = str(raised.value)
  assert "\n" not in message and "(Max retries exceeded (Caused by ProxyError))" in message
  assert "tst2013.vi from https://nlp.stanford.edu/projects/nmt/data/iwslt15.en-vi/" in message
  assert "official source: https://nlp.stanford.edu/projects/nmt/" in message


@pytest.mark.slow
def test_launch_offline_without_data_prints_one_error_line(tmp_path):
  """launch.py with no source folder, no $TRANSFORMER_DATA_DIR, an empty TFDS data dir and no network (every
  connection refused): one ``error:`` line and exit status 1, in seconds."""
  script = textwrap.dedent("""
      import runpy, socket, sys
      def refuse(address, *args, **kwargs):
        raise ConnectionRefusedError(111, "Connection refused")
      socket.create_connection = refuse  # as if offline
      sys.argv = ["launch.py", *sys.argv[1:]]
      runpy.run_path("launch.py", run_name="__main__")
  """)
  environment = {key: value for key, value in os.environ.items()
                 if key != parallel_text.ENV_VAR and "proxy" not in key.lower()}
  environment["TFDS_DATA_DIR"] = os.fspath(tmp_path / "tfds")
  started = time.monotonic()
  result = subprocess.run(
      [sys.executable, "-c", script, "--config=experiments/multi30k.py:transformer_small",
       f"--workdir={tmp_path / 'workdir'}", f"--config.task.data_dir={tmp_path / 'tfds'}"],
      capture_output=True, text=True, cwd=pathlib.Path(__file__).parents[2], env=environment, timeout=120)
  assert result.returncode == 1, result.stderr[-3000:]
  errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
  assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
  assert "multi30k: cannot download" in errors[0] and "Connection refused" in errors[0]
  assert "--config.task.source_dir=<folder>" in errors[0] and parallel_text.ENV_VAR in errors[0]
  assert time.monotonic() - started < 60


@pytest.mark.parametrize("builder_name", ["multi30k", "iwslt15_en_vi", "wmt14", "disaster_tweets", "beijing_pm25"])
def test_making_a_builder_leaves_no_temporary_folder(builder_name, tmp_path, monkeypatch):
  # TFDS asks its GCS bucket for the info of an unprepared data set through a /tmp/tmp*tfds folder it
  # never removes; ours skip the ask.
  import importlib
  import tempfile
  temporary = tmp_path / "tmp"
  temporary.mkdir()
  monkeypatch.setattr(tempfile, "tempdir", os.fspath(temporary))
  builder_class = importlib.import_module(f"transformer.data.{builder_name}").Builder
  builder = builder_class(data_dir=os.fspath(tmp_path / "tfds"), file_format="array_record")
  assert builder.info.name == builder_name
  assert list(temporary.iterdir()) == []


@pytest.mark.parametrize("builder_name", ["multi30k", "iwslt15_en_vi", "wmt14", "disaster_tweets", "beijing_pm25"])
def test_a_builder_pickles_with_its_source_folder_and_reads_its_code_folder(builder_name, tmp_path):
  # Pickled builders (worker processes, TFDS's own copies) are made again from their arguments.
  import importlib
  import pickle
  module = importlib.import_module(f"transformer.data.{builder_name}")
  builder = module.Builder(data_dir=os.fspath(tmp_path / "tfds"), file_format="array_record",
                           source_dir=os.fspath(tmp_path / "raw"))
  copy = pickle.loads(pickle.dumps(builder))
  assert copy._source_dir_argument == os.fspath(tmp_path / "raw") and copy.name == builder_name
  assert (module.Builder.code_path.parent / "CITATIONS.bib").exists()
  assert module.Builder.code_path.parent == pathlib.Path(module.__file__).parent
