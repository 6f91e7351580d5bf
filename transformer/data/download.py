"""Downloads of raw data files from their official URLs, failing at once and in one line when offline.

TFDS's downloader retries a failing connection for minutes and then raises a long ``requests`` traceback.
The builders that download (``parallel_text`` for Multi30k and IWSLT'15, ``beijing_pm25``) first call
:func:`check_reachable`, a single TCP connection to each host, and download through :func:`download`; both raise
:class:`MissingDataError` with :func:`offline_message`: the files, their official source, and the settings that
point at a local copy instead (``--config.task.source_dir``, the builders' ``source_dir=``, ``$TRANSFORMER_DATA_DIR``).
"""
from __future__ import annotations

import os
import socket
import urllib.parse
import urllib.request
from typing import Mapping, Sequence

import tensorflow_datasets as tfds

from transformer.errors import MissingDataError

# A folder holding one sub-folder of raw files per dataset (multi30k/, iwslt15_en_vi/, ...).
ENV_VAR = "TRANSFORMER_DATA_DIR"


def offline_message(dataset: str, urls: Sequence[str], reason: object, homepage: str = "") -> str:
  """The one line that says which files could not be downloaded and how to give a local copy instead."""
  if len(urls) == 1:
    what = urls[0]
  else:
    base = os.path.commonprefix(list(urls)).rpartition("/")[0] + "/"
    what = f"{' '.join(url[len(base):] for url in urls)} from {base}"
  official = f" (official source: {homepage})" if homepage else ""
  reason = " ".join(str(reason).split())  # one line, whatever the error's message looks like
  return (f"{dataset}: cannot download {what} ({reason}). Download them{official} into a folder and give it "
          f"with --config.task.source_dir=<folder> (the builder's source_dir=<folder>), or set ${ENV_VAR} to a "
          f"folder holding {dataset}/.")


def check_reachable(dataset: str, urls: Sequence[str], homepage: str = "", timeout: float = 10.0) -> None:
  """Fails at once when a host of ``urls`` cannot be reached, instead of after the downloader's retries.

  Behind a proxy (``urllib.request.getproxies()``) a direct connection proves nothing, so the check is skipped
  there and :func:`download` reports.

  Raises:
    MissingDataError: with :func:`offline_message`.
  """
  if urllib.request.getproxies():
    return
  hosts = {(parts.hostname, parts.port or (443 if parts.scheme == "https" else 80))
           for parts in map(urllib.parse.urlsplit, urls)}
  for host in sorted(hosts):
    try:
      socket.create_connection(host, timeout=timeout).close()
    except OSError as error:
      raise MissingDataError(offline_message(dataset, urls, error, homepage)) from None


def download(dl_manager: tfds.download.DownloadManager, dataset: str, urls: str | Mapping[str, str],
             homepage: str = "") -> os.PathLike | dict[str, os.PathLike]:
  """``dl_manager.download(urls)``: a URL gives its local path, a mapping key -> URL gives key -> local path.
  A failure is a MissingDataError with :func:`offline_message` (the original error chained for debugging)."""
  try:
    return dl_manager.download(urls if isinstance(urls, str) else dict(urls))
  except Exception as error:  # pylint: disable=broad-except  # requests, OSError, TFDS checksum errors alike
    listed = [urls] if isinstance(urls, str) else list(urls.values())
    raise MissingDataError(offline_message(dataset, listed, error, homepage)) from error
