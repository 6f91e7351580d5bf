"""WMT'14 German-English news translation: the data of TFDS's ``wmt14_translate/de-en``, local or downloaded.

One config ``de-en``, usable in both directions (the paper translates ``en-de``); features ``{"de": text, "en":
text}``, untokenised, original casing. The splits are those of TFDS's ``wmt14_translate/de-en`` (the sub-corpora
of ``tensorflow_datasets/translate/wmt14.py`` that hold German-English, from the archives and paths of its
``wmt.py``):

| split | sub-corpus | files (paths inside the archive) | archive |
| --- | --- | --- | --- |
| ``train`` | europarl_v7 | ``training/europarl-v7.de-en.{de,en}`` | ``training-parallel-europarl-v7.tgz`` |
| | commoncrawl | ``commoncrawl.de-en.{de,en}`` | ``training-parallel-commoncrawl.tgz`` |
| | newscommentary_v9 | ``training/news-commentary-v9.de-en.{de,en}`` | ``training-parallel-nc-v9.tgz`` |
| ``validation`` | newstest2013 | ``dev/newstest2013.{de,en}`` | ``dev.tgz`` |
| ``test`` | newstest2014 | ``dev/newstest2014-deen-src.de.sgm``, ``dev/newstest2014-deen-ref.en.sgm`` | ``dev.tgz`` |

TFDS counts 4,508,785 training pairs, 3,000 validation and 3,003 test. As in TFDS, a pair with an empty side is
left out and an SGML file gives the text of each ``<seg>`` (entities as written); unlike TFDS, every line is
stripped of surrounding whitespace and examples keep file order (corpora in the order above), so that
``as_data_source("test")[i]`` is segment ``i`` of newstest2014.

Where the files come from, first match wins (as ``parallel_text``): the builder argument ``source_dir=``,
``download_config.manual_dir``, ``$TRANSFORMER_DATA_DIR`` (a folder holding ``wmt14/``), else the four archives
are downloaded from statmt.org (the URLs TFDS uses; sizes and SHA-256 in ``checksums.tsv``) into
``<data_dir>/downloads``. A local folder holds, for each archive, either the archive as downloaded or its files
extracted under the paths above; the files needed are taken out of an archive into ``<data_dir>/downloads/
extracted/wmt14/`` (by Python's ``tarfile``: TFDS's extractor needs TensorFlow), the folder is only read.
A file missing from a local folder is one :class:`MissingDataError` line naming it and where to put it.

Usage (no TensorFlow needed)::

  builder = Builder(data_dir="/tmp/tfds", file_format="array_record", source_dir="data/wmt14")
  builder.download_and_prepare()
  builder.as_data_source("test")[0]  # {"de": b"Gutach: Noch mehr Sicherheit ...", "en": b"Gutach: ..."}
"""
from __future__ import annotations

import dataclasses
import gzip
import logging
import os
import re
import shutil
import tarfile
from typing import Iterator, Mapping, Sequence

from etils import epath
import tensorflow_datasets as tfds

from transformer.data import download
from transformer.data import parallel_text
from transformer.errors import InputFileError, MissingDataError

logger = logging.getLogger(__name__)

HOMEPAGE = "https://www.statmt.org/wmt14/translation-task.html"
_STATMT = "http://www.statmt.org/"
_DEV = "http://data.statmt.org/wmt19/translation-task/dev.tgz"  # newstest2013 and newstest2014, as TFDS's


@dataclasses.dataclass(frozen=True)
class Corpus:
  """A sub-corpus of a split: TFDS's name for it, the archive it ships in and its file of each language."""
  name: str
  url: str  # of the archive
  files: Mapping[str, str]  # language -> path inside the archive (and inside a local folder)

  @property
  def archive(self) -> str:
    """The archive's file name, as downloaded."""
    return self.url.rpartition("/")[2]


def _both(stem: str) -> dict[str, str]:
  return {"de": f"{stem}.de", "en": f"{stem}.en"}


SPLITS: Mapping[str, tuple[Corpus, ...]] = {
    "train": (
        Corpus("europarl_v7", _STATMT + "wmt13/training-parallel-europarl-v7.tgz",
               _both("training/europarl-v7.de-en")),
        Corpus("commoncrawl", _STATMT + "wmt13/training-parallel-commoncrawl.tgz", _both("commoncrawl.de-en")),
        Corpus("newscommentary_v9", _STATMT + "wmt14/training-parallel-nc-v9.tgz",
               _both("training/news-commentary-v9.de-en")),
    ),
    "validation": (Corpus("newstest2013", _DEV, _both("dev/newstest2013")),),
    "test": (Corpus("newstest2014", _DEV, {"de": "dev/newstest2014-deen-src.de.sgm",
                                           "en": "dev/newstest2014-deen-ref.en.sgm"}),),
}


def _archives() -> dict[str, list[str]]:
  archives = {}
  for corpora in SPLITS.values():
    for corpus in corpora:
      archives.setdefault(corpus.url, []).extend(corpus.files.values())
  return archives


ARCHIVES = _archives()  # archive URL -> the files it holds, in the order of SPLITS
_SEGMENT = re.compile(r"<seg id=\"?\d+\"?>(.*)</seg>")


class Builder(parallel_text.LocalSourceBuilder, tfds.core.GeneratorBasedBuilder):
  """WMT'14 de-en as TFDS's ``wmt14_translate/de-en`` (see the module docstring)."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "TFDS's wmt14_translate/de-en sub-corpora, from local files or statmt.org."}
  BUILDER_CONFIGS = [parallel_text.pair_config("de", "en", "German-English, WMT'14 news translation task")]
  _roots: dict[str, epath.Path] | None = None  # archive URL -> the folder its files are under, once found

  @property
  def languages(self) -> tuple[str, str]:
    return self.builder_config.languages

  def _info(self) -> tfds.core.DatasetInfo:
    return parallel_text.local_dataset_info(
        self,
        features=tfds.features.Translation(languages=list(self.languages)),
        supervised_keys=self.languages,
        homepage=HOMEPAGE,
        disable_shuffling=True,
        metadata=tfds.core.MetadataDict(),
    )

  def download_and_prepare(self, *, download_config=None, **kwargs):
    """As TFDS's; first finds the files (or checks the network) so that a missing one fails here, in one line."""
    if not parallel_text.is_prepared(self):
      manual_dir = download_config.manual_dir if download_config is not None else None
      folder, origin = parallel_text.resolve_source_dir(self.name, self._source_dir_argument, manual_dir)
      if folder is None:
        download.check_reachable(self.name, list(ARCHIVES), HOMEPAGE)
      else:
        self._roots = self.find_local_files(folder, origin)
        logger.info("%s/%s: reading raw files from %s (%s)", self.name, self.builder_config.name, folder, origin)
    return super().download_and_prepare(download_config=download_config, **kwargs)

  def find_local_files(self, folder: epath.Path, origin: str = "source_dir argument") -> dict[str, epath.Path]:
    """archive URL -> ``folder`` where it holds the archive's files extracted, or the archive's path in it.

    Raises:
      MissingDataError: one line naming every file missing (with its archive) and where to put them.
    """
    roots, missing = {}, []
    for url, files in ARCHIVES.items():
      archive = url.rpartition("/")[2]
      if all((folder / name).exists() for name in files):
        roots[url] = folder
      elif (folder / archive).exists():
        roots[url] = folder / archive
      else:
        missing.append(f"{' '.join(name for name in files if not (folder / name).exists())} (or {archive})")
    if missing:
      raise MissingDataError(
          f"{self.name}: files missing in {folder} (given by the {origin}): {'; '.join(missing)}. Download "
          f"{' '.join(ARCHIVES)} (WMT'14: {HOMEPAGE}) into that folder, as they are or extracted, or leave "
          f"source_dir and ${parallel_text.ENV_VAR} unset to download them.")
    return roots

  def _split_generators(self, dl_manager: tfds.download.DownloadManager):
    roots = {}
    for url, files in ARCHIVES.items():
      if self._roots is None:  # statmt.org refuses parallel downloads (TFDS's wmt.py): one at a time
        archive = epath.Path(download.download(dl_manager, self.name, url, HOMEPAGE))
      elif self._roots[url].is_file():
        archive = self._roots[url]
      else:
        roots[url] = self._roots[url]
        continue
      roots[url] = extract_files(archive, files, epath.Path(dl_manager.download_dir) / "extracted" / self.name /
                                 url.rpartition("/")[2].partition(".")[0])
    # Saved with the prepared data: which files made which split.
    self.info.metadata["source_files"] = {
        split: [dict(corpus.files) for corpus in corpora] for split, corpora in SPLITS.items()}
    return {split: self._generate_examples(
                [{language: roots[corpus.url] / name for language, name in corpus.files.items()}
                 for corpus in corpora])
            for split, corpora in SPLITS.items()}

  def _generate_examples(self, corpora: list[Mapping[str, epath.Path]]) -> Iterator[tuple[str, dict]]:
    for paths in corpora:
      lines = {language: read_segments(path) for language, path in paths.items()}
      stem = paths[self.languages[0]].name
      for index, pair in enumerate(parallel_text.aligned_pairs(self.name, lines, paths)):
        if all(pair.values()):
          yield f"{stem}/{index}", pair


def read_segments(path: epath.PathLike) -> list[str]:
  """The sentences of a WMT file: the lines of a text file (``parallel_text.read_lines``), or the text of each
  ``<seg id="...">`` of an SGML one (``.sgm``), each stripped of surrounding whitespace."""
  path = epath.Path(path)
  if path.suffix != ".sgm":
    return parallel_text.read_lines(path)
  return [match.group(1).strip() for line in parallel_text.read_lines(path)
          if (match := _SEGMENT.search(line))]


def extract_files(archive: epath.Path, names: Sequence[str], folder: epath.Path) -> epath.Path:
  """Copies the members ``names`` of the tar ``archive`` (gzipped or not) to the same paths under ``folder``, in
  one pass over the archive; returns ``folder``.

  Raises:
    InputFileError: the archive cannot be read, or lacks a member (a download cut short or another archive).
  """
  wanted = set(names)
  try:
    with tarfile.open(os.fspath(archive)) as tar:
      for member in tar:
        name = member.name.removeprefix("./")
        if name in wanted and member.isfile():
          path = folder / name
          path.parent.mkdir(parents=True, exist_ok=True)
          with tar.extractfile(member) as source, path.open("wb") as target:
            shutil.copyfileobj(source, target)
          wanted.discard(name)
  except (tarfile.TarError, EOFError, gzip.BadGzipFile) as error:
    raise InputFileError(f"{archive} cannot be read as a tar archive ({error}); download it again.") from None
  if wanted:
    raise InputFileError(f"{archive} holds no {' '.join(sorted(wanted))}; it is not the archive of that name "
                         f"(or was cut short): download it again.")
  return folder
