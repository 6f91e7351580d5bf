"""Tiny raw-data fixtures in the formats of the real files, written to a tmp dir by each test.

Multi30k: ``<split>.<lang>.gz`` (gzip, UTF-8, one sentence per line). IWSLT'15: plain
``<file>.<lang>``. WMT'14: its archives' files, extracted (plain text, and SGML for newstest2014). Sentences are random word strings with an English and a "German" word list
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
# WMT'14 de-en: file stem (paths of the archives) -> pairs; train is the first three, in this order.
WMT14_SIZES = {"training/europarl-v7.de-en": 16, "commoncrawl.de-en": 12, "training/news-commentary-v9.de-en": 12,
               "dev/newstest2013": 16, "dev/newstest2014-deen": 16}


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


def _pseudo_words(rng: random.Random, consonants: str, vowels: str, count: int) -> list[str]:
  words = {"".join(rng.choice(consonants) + rng.choice(vowels) for _ in range(rng.randint(2, 4)))
           for _ in range(count)}
  return sorted(words)


def wmt14_pairs(count: int, seed: int) -> list[tuple[str, str]]:
  """``(German, English)`` sentences of made-up words aligned word by word: a few hundred distinct words, so that
  SentencePiece's BPE finds the 1,000 pieces of the ``tiny`` variant in a few dozen pairs."""
  vocabulary = random.Random(7)
  english = _pseudo_words(vocabulary, "bcdfghklmnprstvw", "aeiou", 300)
  german = _pseudo_words(vocabulary, "bdfghklmnprstwz", "aeiouäöü", 300)
  rng = random.Random(seed)
  pairs = []
  for _ in range(count):
    words = [rng.randrange(min(len(english), len(german))) for _ in range(rng.randint(4, 12))]
    pairs.append((" ".join(german[w] for w in words).capitalize() + " .",
                  " ".join(english[w] for w in words).capitalize() + " ."))
  return pairs


def _sgml(kind: str, language: str, sentences: list[str]) -> str:
  """A newstest SGML file as statmt.org ships them: a set, a document, one ``<seg>`` per line."""
  header = ('<srcset setid="newstest2014" srclang="any">' if kind == "src" else
            f'<refset setid="newstest2014" srclang="any" trglang="{language}">')
  segments = "".join(f'<seg id="{i}">{sentence}</seg>\n' for i, sentence in enumerate(sentences, 1))
  return (f'{header}\n<doc sysid="ref" docid="1012-bbc" genre="news" origlang="en">\n<p>\n{segments}</p>\n'
          f'</doc>\n</{kind}set>\n')


def write_wmt14(folder: pathlib.Path, sizes=None, empty_pair: bool = True) -> pathlib.Path:
  """WMT'14 de-en's files, extracted under their archives' paths in ``folder``; ``empty_pair``: Common Crawl gets
  one more line, empty in German (the builder leaves it out, as TFDS does)."""
  for seed, (stem, count) in enumerate((sizes or WMT14_SIZES).items()):
    pairs = wmt14_pairs(count, 200 + seed)
    if empty_pair and stem == "commoncrawl.de-en":
      pairs.append(("", "A line without its German ."))
    for column, language in enumerate(("de", "en")):
      texts = [pair[column] for pair in pairs]
      if stem == "dev/newstest2014-deen":
        kind = "src" if language == "de" else "ref"
        path, text = folder / f"{stem}-{kind}.{language}.sgm", _sgml(kind, language, texts)
      else:
        path, text = folder / f"{stem}.{language}", "".join(line + "\n" for line in texts)
      path.parent.mkdir(parents=True, exist_ok=True)
      path.write_text(text, encoding="utf-8")
  return folder


WRITERS = {"multi30k": write_multi30k, "iwslt15_en_vi": write_iwslt, "wmt14": write_wmt14}

if __name__ == "__main__":  # python tests/data/data_fixtures.py wmt14 FOLDER: a fixture to try a tiny variant on
  import sys
  dataset, folder = sys.argv[1:]
  print(WRITERS[dataset](pathlib.Path(folder)))
