"""Pytest fixtures of tests/data: raw-data folders in a tmp dir, no network, no leaked env."""
from __future__ import annotations

import pathlib

import pytest
import tensorflow_datasets as tfds

from data_fixtures import write_iwslt, write_multi30k

tfds.disable_progress_bar()


@pytest.fixture
def raw_root(tmp_path) -> pathlib.Path:
  """A TRANSFORMER_DATA_DIR-like folder holding multi30k/ and iwslt15_en_vi/."""
  root = tmp_path / "raw"
  write_multi30k(root / "multi30k")
  write_iwslt(root / "iwslt15_en_vi")
  return root


@pytest.fixture(autouse=True)
def no_data_dir_env(monkeypatch):
  """Tests choose their folders themselves; the user's environment must not leak in."""
  monkeypatch.delenv("TRANSFORMER_DATA_DIR", raising=False)


@pytest.fixture(autouse=True)
def no_download(monkeypatch):
  """Tests never touch the network: a download attempt fails the test."""
  def refuse(self, url_or_urls):
    raise AssertionError(f"download attempted: {url_or_urls}")
  monkeypatch.setattr(tfds.download.DownloadManager, "download", refuse)
