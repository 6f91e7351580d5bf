"""Shared base of the TFDS builders for line-aligned parallel text (Multi30k, IWSLT'15 en-vi).

Both corpora ship one plain (or gzipped) text file per split and language, one sentence per line,
line ``i`` of every language of a split being translations of each other. Everything that is the
same for such corpora lives here, once: where the raw files come from, the error when they are
missing, reading and checking the lines, the features and the split generators. A dataset folder
(``transformer/data/multi30k/``, ``transformer/data/iwslt15_en_vi/``) only says which files make
which split and where they are downloaded from.

Where the raw files come from, first match wins:

1. the builder argument ``source_dir=...``;
2. ``download_config=tfds.download.DownloadConfig(manual_dir=...)`` of ``download_and_prepare``;
3. the environment variable ``TRANSFORMER_DATA_DIR`` (a folder holding ``multi30k/``,
   ``iwslt15_en_vi/``, ...);
4. otherwise the official URLs are downloaded (by TFDS, into ``<data_dir>/downloads``);
   offline, this fails at once with one line naming the files, their official source and the
   settings above (``transformer.data.download``).

A local folder given in 1-3 may hold the files itself or in a sub-folder named after the dataset
(``<folder>/multi30k/train.en.gz``). When a local folder is given nothing is downloaded: a missing
file raises :class:`MissingDataError`. The local folder is only read, never written; the prepared
data goes to the TFDS ``data_dir`` (default ``$TFDS_DATA_DIR`` or ``~/tensorflow_datasets``).

Features: language-keyed text, ``{"en": str, "de": str}`` (``tfds.features.Translation``), so
one prepared dataset serves both directions; ``supervised_keys`` is ``(first, second)`` language
of the config. Examples keep the order of the source files (``disable_shuffling``), so
``as_data_source(split)[i]`` is line ``i`` of the split, which keeps BLEU references aligned
with the official files. Surrounding whitespace of every line is stripped.
"""
from __future__ import annotations

import abc
import dataclasses
import gzip
import inspect
import logging
import os
from typing import Callable, Iterator, Mapping

from etils import epath
import tensorflow_datasets as tfds

from transformer.data import download
from transformer.data.download import ENV_VAR  # also imported from here
from transformer.errors import InputFileError, MissingDataError  # MissingDataError: also imported from here

logger = logging.getLogger(__name__)

# split name -> language -> file name (relative to the source folder or the download URL base).
SplitFiles = Mapping[str, Mapping[str, str]]


@dataclasses.dataclass(eq=False)
class ParallelTextConfig(tfds.core.BuilderConfig):
  """A language pair: ``name`` is ``"<first>-<second>"`` and ``languages`` the two codes."""
  languages: tuple[str, str] = ("", "")


def pair_config(first: str, second: str, description: str = "") -> ParallelTextConfig:
  return ParallelTextConfig(
      name=f"{first}-{second}", languages=(first, second),
      description=description or f"{first}-{second} parallel text")


def resolve_source_dir(dataset_name: str, source_dir: epath.PathLike | None,
                       manual_dir: epath.PathLike | None) -> tuple[epath.Path | None, str]:
  """Returns ``(folder, where_it_came_from)``; ``(None, "download")`` when no folder is given.

  Raises:
    MissingDataError: a folder was named (argument, ``manual_dir`` or environment variable) but
      does not exist.
  """
  candidates = (("source_dir argument", source_dir),
                ("download_config.manual_dir", manual_dir),
                (f"${ENV_VAR}", os.environ.get(ENV_VAR) or None))
  for origin, value in candidates:
    if not value:
      continue
    folder = epath.Path(os.path.expanduser(os.fspath(value)))
    if not folder.is_dir():
      raise MissingDataError(
          f"{dataset_name}: the {origin} points at {folder}, which is not a directory. Give the "
          f"folder holding the raw files of {dataset_name} (or its parent, holding "
          f"{dataset_name}/), or unset it to download the data.")
    if (folder / dataset_name).is_dir():
      folder = folder / dataset_name
    return folder, origin
  return None, "download"


def is_prepared(builder: tfds.core.DatasetBuilder) -> bool:
  """``builder.is_prepared()`` without the warning TFDS logs for every data set not prepared
  yet (a first run printed it above its own error line)."""
  return (epath.Path(builder.data_path) / "dataset_info.json").exists()


def read_prepared_split(builder: tfds.core.DatasetBuilder, split: str) -> list[dict]:
  """Every example of ``split`` of a prepared builder, in order, in one batched read.

  Raises:
    InputFileError: a prepared file cannot be read (truncated by a full disk or a copy cut short: Riegeli's
      ``RuntimeError``), naming the split's files and how to prepare them again.
  """
  try:
    source = builder.as_data_source(split)
    rows = source.__getitems__(list(range(len(source))))
    # A file cut at a block boundary reads without an error, as examples whose every feature is None.
    if any(value is None for row in rows for value in row.values()):
      raise RuntimeError("examples without features")
    return rows
  except RuntimeError as error:
    try:
      files = " ".join(map(str, builder.info.splits[split].filepaths))
    except (KeyError, ValueError):
      files = f"the {split} files"
    reason = str(error).strip().split(";")[0] or type(error).__name__  # Riegeli's first clause names the damage
    reason = reason if len(reason) <= 120 else reason[:117] + "..."
    raise InputFileError(
        f"{builder.name}: the prepared {split} split cannot be read ({reason}): {files} is truncated or damaged. "
        f"Remove the prepared folder (rm -r {builder.data_dir}) and run again to prepare it from the raw files."
    ) from None


def local_dataset_info(builder: tfds.core.GeneratorBasedBuilder, **fields) -> tfds.core.DatasetInfo:
  """``builder.dataset_info_from_configs(**fields)`` for a data set that is not on TFDS's GCS bucket.

  A builder of an unprepared data set asks the bucket for precomputed info, and TFDS makes an empty
  ``/tmp/tmp*tfds`` folder for the answer that it never removes (one per builder made); ours skip the ask.
  """
  info = builder.dataset_info_from_configs(**fields)
  info.initialize_from_bucket = lambda: None
  return info


class LocalSourceBuilder:
  """Mixed into a builder before TFDS's class, for raw files that may be read from a local folder:

  - the builder argument ``source_dir=...`` (``resolve_source_dir``'s first choice), kept in the state TFDS
    pickles a builder with;
  - the code folder (README.md, checksums.tsv and CITATIONS.bib sit there) is the class's file's: TFDS 4.9.10's
    own lookup imports `importlib_resources`, which it only installs on Python < 3.9;
  - one line of our log when preparing, instead of TFDS's two printed whatever the logging settings
    ("Downloading and preparing dataset Unknown size (download: Unknown size, ...)", sizes it never knows for
    these files, then "... Subsequent calls will reuse this data.")."""

  def __init__(self, *, source_dir: epath.PathLike | None = None, **kwargs):
    self._source_dir_argument = source_dir
    super().__init__(**kwargs)
    self._original_state["source_dir"] = source_dir  # so that the builder pickles

  @tfds.core.utils.classproperty
  @classmethod
  def code_path(cls) -> epath.Path:
    return epath.Path(inspect.getfile(cls))

  def _log_download_bytes(self) -> None:
    logger.info("%s: preparing the data set in %s", self.name, self.data_dir)

  def _log_download_done(self) -> None:
    pass


class ParallelTextBuilder(LocalSourceBuilder, tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """Base builder: one text file per (split, language), lines aligned across languages.

  Subclasses set ``VERSION``, ``BUILDER_CONFIGS`` (of :class:`ParallelTextConfig`),
  ``HOMEPAGE`` (the official source, named when a download fails), ``DOWNLOAD_HINT`` (one line
  saying where the files come from) and implement
  :meth:`_split_files` and :meth:`_url`.

  Args (beyond those of ``tfds.core.GeneratorBasedBuilder``: ``data_dir``, ``config``,
  ``file_format``, ...):
    source_dir: folder holding the raw files (or a sub-folder named after the dataset). Only
      read. See the module docstring for the other ways to give it.
  """
  HOMEPAGE = ""
  DOWNLOAD_HINT = ""
  _local_dir: epath.Path | None = None  # set when a local source folder is found
  _local_files: SplitFiles | None = None

  @abc.abstractmethod
  def _split_files(self, exists: Callable[[str], bool]) -> SplitFiles:
    """The files of each split for the current config.

    Args:
      exists: tells whether a file name is present in the source (always True when downloading);
        lets a builder choose between alternatives (IWSLT: ``train.*`` or ``train.10k.*``).
    """

  @abc.abstractmethod
  def _url(self, file_name: str) -> str:
    """The official download URL of ``file_name``."""

  @property
  def languages(self) -> tuple[str, str]:
    return self.builder_config.languages

  def _info(self) -> tfds.core.DatasetInfo:
    return local_dataset_info(
        self,
        features=tfds.features.Translation(languages=list(self.languages)),
        supervised_keys=self.languages,
        homepage=self.HOMEPAGE,
        disable_shuffling=True,
        metadata=tfds.core.MetadataDict(),
    )

  def download_and_prepare(self, *, download_config=None, **kwargs):
    """As TFDS's; first finds the raw files so that a missing one fails here, plainly."""
    if not is_prepared(self):
      manual_dir = download_config.manual_dir if download_config is not None else None
      self._local_dir, origin = resolve_source_dir(
          self.name, self._source_dir_argument, manual_dir)
      if self._local_dir is not None:
        self._local_files = self.check_source_files(self._local_dir, origin)
        logger.info("%s/%s: reading raw files from %s (%s)", self.name, self.builder_config.name,
                    self._local_dir, origin)
      else:
        download.check_reachable(self.name, list(self._download_urls().values()), self.HOMEPAGE)
    return super().download_and_prepare(download_config=download_config, **kwargs)

  def check_source_files(self, folder: epath.Path,
                         origin: str = "source_dir argument") -> SplitFiles:
    """The files of each split in ``folder``.

    Raises:
      MissingDataError: naming every missing file and how to provide it.
    """
    split_files = self._split_files(lambda name: (folder / name).exists())
    expected = [name for files in split_files.values() for name in files.values()]
    missing = [name for name in expected if not (folder / name).exists()]
    if missing:
      raise MissingDataError(
          f"{self.name} ({self.builder_config.name}): {len(missing)} of {len(expected)} raw files "
          f"missing in {folder} (given by the {origin}).\n"
          f"  missing: {' '.join(missing)}\n"
          f"  expected: {' '.join(expected)}\n"
          f"Put the files in one folder and pass it as source_dir=..., or set {ENV_VAR} to a "
          f"folder holding {self.name}/. {self.DOWNLOAD_HINT} With none of source_dir, manual_dir "
          f"and ${ENV_VAR} set, the files are downloaded from their official URLs (e.g. "
          f"{self._url(expected[0])}).")
    return split_files

  def _split_generators(self, dl_manager: tfds.download.DownloadManager):
    if self._local_dir is not None:
      split_files = self._local_files
      paths = {split: {lang: self._local_dir / name for lang, name in files.items()}
               for split, files in split_files.items()}
    else:
      split_files = self._split_files(lambda name: True)
      downloaded = download.download(dl_manager, self.name, self._download_urls(), self.HOMEPAGE)
      paths = {split: {lang: epath.Path(downloaded[f"{split}.{lang}"]) for lang in files}
               for split, files in split_files.items()}
    # Saved with the prepared data: which raw file made which split.
    self.info.metadata["source_files"] = {
        split: dict(files) for split, files in split_files.items()}
    return {split: self._generate_examples(split_paths) for split, split_paths in paths.items()}

  def _download_urls(self) -> dict[str, str]:
    """``"<split>.<lang>"`` -> official URL of every file of the current config."""
    split_files = self._split_files(lambda name: True)
    return {f"{split}.{lang}": self._url(name)
            for split, files in split_files.items() for lang, name in files.items()}

  def _generate_examples(self, paths: Mapping[str, epath.Path]) -> Iterator[tuple[int, dict]]:
    lines = {lang: read_lines(path) for lang, path in paths.items()}
    yield from enumerate(aligned_pairs(self.name, lines, paths))


def aligned_pairs(dataset: str, lines: Mapping[str, list], paths: Mapping[str, epath.Path]) -> Iterator[dict]:
  """``{language: text}`` of each translation pair: item i of every language's ``lines`` (read from ``paths``).

  Raises:
    InputFileError: the languages hold different numbers of texts (naming each file and its count).
  """
  counts = {lang: len(texts) for lang, texts in lines.items()}
  if len(set(counts.values())) != 1:
    described = ", ".join(f"{paths[lang]}: {count}" for lang, count in counts.items())
    raise InputFileError(f"{dataset}: the files of one split must have the same number of lines or segments "
                         f"(item i of each is one translation pair); got {described}.")
  for texts in zip(*lines.values()):
    yield dict(zip(lines.keys(), texts))


def read_lines(path: epath.PathLike) -> list[str]:
  """The lines of a UTF-8 text file (gzipped or not), each stripped of surrounding whitespace.

  Gzip is recognised by its magic bytes, not the name: TFDS's download cache renames files.
  Lines are split on ``\\n`` only (``str.splitlines`` would also split inside a line at
  characters such as U+2028 or form feed, breaking the alignment between languages).
  """
  data = epath.Path(path).read_bytes()
  try:
    if data[:2] == b"\x1f\x8b":
      data = gzip.decompress(data)
    lines = data.decode("utf-8").split("\n")
  except (EOFError, gzip.BadGzipFile) as error:
    raise InputFileError(f"{path} is a truncated or damaged gzip file ({error}); download it again.") from None
  except UnicodeDecodeError as error:
    line = data[:error.start].count(b"\n") + 1
    raise InputFileError(f"{path} is not UTF-8 text (line {line}, byte {error.start}: {error.reason}); convert "
                         "it to UTF-8, e.g. with iconv.") from None
  if lines and not lines[-1]:
    lines.pop()  # the final newline ends the last line; it does not start an empty one
  return [line.strip() for line in lines]
