"""Machine-translation data in one call: prepared TFDS dataset, SentencePiece, token ids, raw text.

    data = load_translation_data("multi30k", "en-de", data_dir="/tmp/tfds",
                                 source_dir="../shared/data/multi30k", vocab_size=8000)
    batcher = batching.TokenBatcher(data.train, max_tokens=4096, seed=0)
    eval_batcher = batching.TokenBatcher(data.eval["validation"], max_tokens=4096, train=False,
                                         include_index=True)
    # BLEU: data.eval_reference_text["validation"][i] is the reference of eval example i.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Callable, Mapping, Sequence

from etils import epath
import tensorflow_datasets as tfds

from transformer.data import batching
from transformer.data import iwslt15_en_vi
from transformer.data import multi30k
from transformer.data import parallel_text
from transformer.data import token_cache
from transformer.data import tokenizers
from transformer.data import wmt14
from transformer.errors import ConfigError

logger = logging.getLogger(__name__)

# name -> TFDS builder class; each config is one language pair, usable in both directions.
BUILDERS = {"multi30k": multi30k.Builder, "iwslt15_en_vi": iwslt15_en_vi.Builder, "wmt14": wmt14.Builder}


@dataclasses.dataclass(frozen=True)
class TranslationData:
  """Tokenized splits of one language pair, in one direction.

  Attributes:
    source_language, target_language: language codes, e.g. ``"en"``, ``"de"``.
    source_tokenizer, target_tokenizer: the same object when the vocabulary is shared.
    train: training pairs, ids ending with EOS (pairs with an empty side removed); made on first use, so that
      evaluating or translating with cached tokenizers never touches the training split: memory-mapped from the
      tokenized cache beside the tokenizers (``training_examples``), else read, tokenized and cached there.
    eval: split name -> every pair of that split, in file order; ``eval[s][i]`` is
      ``(source int32 [source_length_i], target int32 [target_length_i])``.
    eval_source_text, eval_reference_text: split name -> the raw texts, aligned with ``eval``;
      the references are what BLEU is computed against.
    split_sizes: split name -> number of pairs in the prepared dataset.
    dataset_dir: the prepared TFDS dataset (its ``sentencepiece/`` holds the tokenizers).
    pieces_per_word: language -> SentencePiece pieces per whitespace-separated word of the training text
      (EOS not counted): how finely the tokenizer cuts; 1.0 keeps every word whole. Computed with ``train``.
    tokenize_training_pairs: makes or reads ``(train, pieces_per_word)``, called once on first use of either.
  """
  source_language: str
  target_language: str
  source_tokenizer: tokenizers.SentencePieceTokenizer
  target_tokenizer: tokenizers.SentencePieceTokenizer
  eval: Mapping[str, batching.TokenizedExamples]
  eval_source_text: Mapping[str, list[str]]
  eval_reference_text: Mapping[str, list[str]]
  split_sizes: Mapping[str, int]
  dataset_dir: str
  tokenize_training_pairs: Callable[[], tuple[batching.TokenizedExamples, Mapping[str, float]]] = (
      dataclasses.field(repr=False, compare=False))

  @functools.cached_property
  def _training(self) -> tuple[batching.TokenizedExamples, Mapping[str, float]]:
    return self.tokenize_training_pairs()

  @property
  def train(self) -> batching.TokenizedExamples:
    return self._training[0]

  @property
  def pieces_per_word(self) -> Mapping[str, float]:
    return self._training[1]


def prepare_dataset(name: str, pair: str, *, data_dir: epath.PathLike | None = None,
                    source_dir: epath.PathLike | None = None
                    ) -> tuple[tfds.core.DatasetBuilder, str, str]:
  """Prepares (once) and returns the TFDS builder of ``name`` holding ``pair``.

  Args:
    name: a key of :data:`BUILDERS`.
    pair: ``"<source>-<target>"``, either direction of a config (``"en-de"`` or ``"de-en"``).
    data_dir: TFDS data dir for the prepared data (default ``$TFDS_DATA_DIR`` or
      ``~/tensorflow_datasets``).
    source_dir: folder of raw files; default ``$TRANSFORMER_DATA_DIR``, else download.

  Returns:
    ``(builder, source_language, target_language)``; read with ``builder.as_data_source(split)``.
  """
  if name not in BUILDERS:
    raise ValueError(f"Unknown translation dataset {name!r}; known: {sorted(BUILDERS)}.")
  builder_class = BUILDERS[name]
  source_language, _, target_language = pair.partition("-")
  configs = {frozenset(config.languages): config.name for config in builder_class.BUILDER_CONFIGS}
  config = configs.get(frozenset((source_language, target_language)))
  if config is None or source_language == target_language:
    directions = sorted(f"{a}-{b}" for c in builder_class.BUILDER_CONFIGS
                        for a, b in (c.languages, c.languages[::-1]))
    raise ConfigError(f"{name} has no language pair {pair!r} (config.task.pair); choose one of {directions}.")
  builder = builder_class(config=config, data_dir=data_dir, source_dir=source_dir,
                          file_format="array_record")
  builder.download_and_prepare()
  return builder, source_language, target_language


def read_split_text(builder: tfds.core.DatasetBuilder, split: str,
                    languages: Sequence[str]) -> dict[str, list[str]]:
  """language -> the texts of ``split``, in the prepared dataset's (file) order."""
  rows = parallel_text.read_prepared_split(builder, split)
  return {language: [row[language].decode("utf-8") for row in rows] for language in languages}


def load_translation_data(
    name: str, pair: str = "en-de", *,
    data_dir: epath.PathLike | None = None,
    source_dir: epath.PathLike | None = None,
    vocab_size: int = 8000,
    shared_vocab: bool = True,
    eval_splits: Sequence[str] | None = None,
    tokenizer_options: tokenizers.SentencePieceOptions | None = None,
) -> TranslationData:
  """Prepares the dataset, trains or loads SentencePiece on its train split, tokenizes.

  Args:
    name: a key of :data:`BUILDERS` (``"multi30k"``, ``"iwslt15_en_vi"``, ``"wmt14"``).
    pair: ``"<source>-<target>"``, e.g. ``"en-de"``, ``"de-en"``, ``"en-vi"``.
    data_dir: TFDS data dir for the prepared data and the cached tokenizers.
    source_dir: folder of raw files (default ``$TRANSFORMER_DATA_DIR``, else download).
    vocab_size: SentencePiece vocabulary size (4 special ids included).
    shared_vocab: one tokenizer for both languages (True), or one per language.
    eval_splits: splits to tokenize for evaluation; default every split but ``train``.
    tokenizer_options: other SentencePiece options; its ``vocab_size`` is replaced by
      ``vocab_size``.

  Returns:
    :class:`TranslationData`: tokenizers, ``train`` and ``eval`` token ids, raw eval text.
  """
  builder, source_language, target_language = prepare_dataset(
      name, pair, data_dir=data_dir, source_dir=source_dir)
  split_sizes = {split: info.num_examples for split, info in builder.info.splits.items()}
  languages = (source_language, target_language)
  eval_splits = _checked_eval_splits(name, builder, split_sizes, eval_splits)
  logger.info("%s/%s: splits %s; training files %s", name, builder.builder_config.name,
              split_sizes, builder.info.metadata.get("source_files", {}).get("train"))

  @functools.cache
  def train_text() -> dict[str, list[str]]:
    return read_split_text(builder, "train", languages)

  options = dataclasses.replace(tokenizer_options or tokenizers.SentencePieceOptions(),
                                vocab_size=vocab_size)
  source_tokenizer, target_tokenizer = _load_tokenizers(builder, languages, train_text, shared_vocab, options)
  tokenize = functools.partial(_tokenize, source_tokenizer, target_tokenizer, languages)
  eval_text = {split: read_split_text(builder, split, languages) for split in eval_splits}
  return TranslationData(
      source_language=source_language,
      target_language=target_language,
      source_tokenizer=source_tokenizer,
      target_tokenizer=target_tokenizer,
      eval={split: tokenize(texts) for split, texts in eval_text.items()},
      eval_source_text={split: texts[source_language] for split, texts in eval_text.items()},
      eval_reference_text={split: texts[target_language] for split, texts in eval_text.items()},
      split_sizes=split_sizes,
      dataset_dir=str(builder.data_dir),
      tokenize_training_pairs=functools.partial(
          training_examples, builder, languages, (source_tokenizer, target_tokenizer), "pairs with no empty side",
          functools.partial(_tokenize_training_pairs, name, train_text, split_sizes["train"], tokenize, languages)),
  )


def training_examples(builder: tfds.core.DatasetBuilder, languages: Sequence[str],
                      tokenizers_used: Sequence[tokenizers.SentencePieceTokenizer], kept: str,
                      tokenize: token_cache.Tokenize) -> tuple[batching.TokenizedExamples, dict[str, float]]:
  """``tokenize()``'s ``(training examples, pieces_per_word)`` of ``builder``'s train split, or the same read
  memory-mapped from ``<data_dir>/tokenized/`` (``token_cache``), keyed by all that decides them: the prepared
  split, the ``languages`` in order and their ``tokenizers_used``, and ``kept`` (which examples are kept)."""
  split = builder.info.splits["train"]
  settings = {"dataset": builder.name, "config": builder.builder_config.name, "version": str(builder.version),
              "split": "train", "split_examples": split.num_examples, "split_bytes": split.num_bytes,
              "languages": list(languages), "tokenizers": [tokenizer.fingerprint for tokenizer in tokenizers_used],
              "kept": kept}
  return token_cache.load_or_tokenize(epath.Path(builder.data_dir) / "tokenized", f"train.{'-'.join(languages)}",
                                      settings, tokenize)


def _checked_eval_splits(name: str, builder: tfds.core.DatasetBuilder, split_sizes: Mapping[str, int],
                         eval_splits: Sequence[str] | None) -> Sequence[str]:
  """``eval_splits``, by default every split but ``train``; a ConfigError names a split the dataset lacks."""
  if eval_splits is None:
    eval_splits = [split for split in split_sizes if split != "train"]
  unknown = [split for split in eval_splits if split not in split_sizes]
  if unknown:
    raise ConfigError(f"{name}/{builder.builder_config.name} has no split {unknown} (config.task.eval_split, "
                      f"config.task.test_splits); splits: {sorted(split_sizes)}.")
  return eval_splits


def _load_tokenizers(builder: tfds.core.DatasetBuilder, languages: Sequence[str],
                     train_text: Callable[[], dict[str, list[str]]], shared_vocab: bool,
                     options: tokenizers.SentencePieceOptions):
  """``(source_tokenizer, target_tokenizer)`` cached under the prepared dataset, trained on ``train_text()``
  (read only when a tokenizer is not cached yet): one shared by both languages, or one per language."""
  cache_dir = epath.Path(builder.data_dir) / "sentencepiece"
  if shared_vocab:
    shared = tokenizers.load_or_train_sentencepiece(
        cache_dir, builder.builder_config.name,
        lambda: train_text()[builder.languages[0]] + train_text()[builder.languages[1]], options)
    return shared, shared
  return tuple(
      tokenizers.load_or_train_sentencepiece(cache_dir, language, lambda language=language: train_text()[language],
                                             options)
      for language in languages)


def _tokenize(source_tokenizer: tokenizers.SentencePieceTokenizer,
              target_tokenizer: tokenizers.SentencePieceTokenizer, languages: Sequence[str],
              texts: Mapping[str, list[str]]) -> batching.TokenizedExamples:
  """The pairs of ``texts`` (language -> aligned texts) as token ids; ``languages`` is (source, target)."""
  source_language, target_language = languages
  return batching.TokenizedExamples.from_sequences(
      source_tokenizer.encode_batch(texts[source_language]),
      target_tokenizer.encode_batch(texts[target_language]))


def _tokenize_training_pairs(name: str, train_text: Callable[[], dict[str, list[str]]], train_size: int,
                             tokenize: Callable[[Mapping[str, list[str]]], batching.TokenizedExamples],
                             languages: Sequence[str]) -> tuple[batching.TokenizedExamples, dict[str, float]]:
  """``(train, pieces_per_word)`` of ``TranslationData``: the training pairs with no empty side, tokenized."""
  texts = train_text()
  source_language, target_language = languages
  nonempty = [i for i, (source, target) in enumerate(zip(*(texts[l] for l in languages))) if source and target]
  if len(nonempty) < train_size:
    logger.info("%s: %d training pairs with an empty side removed.", name, train_size - len(nonempty))
  logger.info("%s: tokenizing %d training pairs...", name, len(nonempty))
  train = tokenize({language: [texts[language][i] for i in nonempty] for language in languages})
  train_words = {language: sum(len(texts[language][i].split()) for i in nonempty) for language in languages}
  train_pieces = {source_language: train.source_tokens.size, target_language: train.target_tokens.size}
  pieces_per_word = {language: (train_pieces[language] - len(train)) / max(train_words[language], 1)
                     for language in languages}
  # A unigram SentencePiece model trained on little text can cut frequent words apart (IWSLT'15 en-vi, 10k
  # pairs: 79 of the 300 most frequent Vietnamese words, against 1 with BPE); this number shows it.
  logger.info("%s: SentencePiece pieces per word on train: %s", name,
              ", ".join(f"{language} {value:.3f}" for language, value in pieces_per_word.items()))
  return train, pieces_per_word
