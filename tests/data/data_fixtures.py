"""Tiny raw-data fixtures in the formats of the real files, written to a tmp dir by each test.

Multi30k: ``<split>.<lang>.gz`` (gzip, UTF-8, one sentence per line). IWSLT'15: plain
``<file>.<lang>``. Sentences are random word strings with an English and a "German" word list
(aligned word by word), so that line ``i`` of each language is a pair and SentencePiece has
enough text for a small vocabulary.
"""
from __future__ import annotations

import gzip
import pathlib
import random

ENGLISH = ("a the dog cat man woman child runs jumps sits on in near under park street water "
           "ball red blue small big").split()
GERMAN = ("ein der Hund Katze Mann Frau Kind läuft springt sitzt auf im nahe unter Park Straße "
          "Wasser Ball rot blau klein groß").split()

MULTI30K_SIZES = {"train": 24, "val": 4, "test_2016_flickr": 3, "test_2017_flickr": 2,
                  "test_2017_mscoco": 2, "test_2018_flickr": 3}
MULTI30K_SPLITS = {"train": "train", "validation": "val", "test_2016_flickr": "test_2016_flickr",
                   "test_2017_flickr": "test_2017_flickr", "test_2017_mscoco": "test_2017_mscoco",
                   "test_2018_flickr": "test_2018_flickr"}
IWSLT_SIZES = {"train.10k": 20, "tst2012": 4, "tst2013": 3}


def sentence_pairs(count: int, seed: int) -> list[tuple[str, str]]:
  rng = random.Random(seed)
  pairs = []
  for _ in range(count):
    words = [rng.randrange(len(ENGLISH)) for _ in range(rng.randint(3, 9))]
    pairs.append((" ".join(ENGLISH[w] for w in words), " ".join(GERMAN[w] for w in words)))
  return pairs


def write_multi30k(folder: pathlib.Path, languages=("en", "de"), sizes=None) -> pathlib.Path:
  folder.mkdir(parents=True, exist_ok=True)
  for seed, (prefix, count) in enumerate((sizes or MULTI30K_SIZES).items()):
    pairs = sentence_pairs(count, seed)
    for column, language in enumerate(languages):
      text = "".join(pair[column % 2] + "\n" for pair in pairs)
      (folder / f"{prefix}.{language}.gz").write_bytes(gzip.compress(text.encode("utf-8")))
  return folder


def write_iwslt(folder: pathlib.Path, sizes=None) -> pathlib.Path:
  folder.mkdir(parents=True, exist_ok=True)
  for seed, (stem, count) in enumerate((sizes or IWSLT_SIZES).items()):
    pairs = sentence_pairs(count, 100 + seed)
    for column, language in enumerate(("en", "vi")):
      (folder / f"{stem}.{language}").write_text("".join(p[column] + "\n" for p in pairs),
                                                encoding="utf-8")
  return folder
