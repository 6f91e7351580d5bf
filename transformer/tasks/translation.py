"""Machine translation: TFDS parallel text, SentencePiece, token-bucketed batches, beam search and BLEU.

``config.task``: ``transformer.tasks.configs.TranslationConfig`` (the dataset and language pair, the
SentencePiece vocabulary, token-sized batches, the splits, BLEU's tokenizer and the length penalties tried).
"""
from __future__ import annotations

import functools
import logging
import os

import numpy as np

from transformer.data import batching, prefetch, tokenizers
from transformer.data.files import write_atomically
from transformer.data.translation import load_translation_data
from transformer.errors import ConfigError
from transformer.tasks.configs import TranslationConfig
from transformer.tasks.metrics import corpus_bleu
from transformer.tasks.progress import Progress
from transformer.tasks.seq2seq import Seq2SeqTask
from transformer.tasks.tokenized import RecordedTokenizers

log = logging.getLogger(__name__)


def sentencepiece_options(task_config) -> tokenizers.SentencePieceOptions:
  """The SentencePiece options of a task's typed config (its ``tokenizer_type``, checked there against
  ``configs.TOKENIZER_TYPES``; ``vocab_size`` is set by the loader)."""
  return tokenizers.SentencePieceOptions(model_type=task_config.tokenizer_type)


class TranslationTask(RecordedTokenizers, Seq2SeqTask):
  """Translation with an ``EncoderDecoder``: label-smoothed teacher forcing, beam search, sacreBLEU. Its
  ``source`` and ``target`` tokenizers can be a run's own (``use_recorded_tokenizers``): translating then reads no
  data."""
  unknown_id = tokenizers.UNK_ID  # SentencePiece's <unk>, the replacement of word dropout
  task_config_class = TranslationConfig
  task_config: TranslationConfig
  tokenizer_names = ("source", "target")

  @functools.cached_property
  def data(self):
    task = self.task_config
    return self.checked_data(load_translation_data(
        task.dataset, task.pair, data_dir=task.data_dir or None, source_dir=task.source_dir or None,
        vocab_size=task.vocab_size, shared_vocab=task.shared_vocab, tokenizer_options=sentencepiece_options(task),
        eval_splits=[task.eval_split, *[s for s in task.test_splits if s != task.eval_split]]))

  def data_tokenizers(self, data):
    return {"source": data.source_tokenizer, "target": data.target_tokenizer}

  def model_config(self):
    return self.make_model_config(
        vocab_size=self.tokenizer("source").vocab_size, target_vocab_size=self.tokenizer("target").vocab_size,
        share_embeddings=getattr(self.settings.model, "share_embeddings", False) and self.task_config.shared_vocab,
        pad_id=0, bos_id=1, eos_id=2)

  def _batcher(self, examples, train: bool, seed: int = 0) -> batching.TokenBatcher:
    task = self.task_config
    if task.pack and self.settings.model_name != "transformer":
      raise ConfigError(f"config.task.pack=True packs several examples per row for the Transformer, whose "
                        f"attention keeps them apart; the {self.settings.model_name!r} model reads one example per row: "
                        f"set --config.task.pack=False.")
    return batching.TokenBatcher(examples, max_tokens=task.max_tokens, max_length=task.max_length, train=train,
                                 seed=seed, batch_size_multiple=task.batch_size_multiple,
                                 fixed_shape=task.fixed_batch_shape, include_index=not train,
                                 pack=task.pack and train,
                                 plan_workers=task.plan_workers if task.pack and train else 0,
                                 pack_streams=task.pack_streams if task.pack and train else 1)

  def train_iterator(self, batch_size, seed):
    del batch_size  # global batches are sized by config.task.max_tokens; .batch_shapes lists their shapes
    batcher = self._batcher(self.data.train, train=True, seed=seed)
    if batcher.streams is None:
      log.info("training batches: %d per epoch, padding fraction %.3f, shapes %s", batcher.num_batches(),
               batcher.padding_fraction(), batcher.batch_shapes)
    else:  # the figures need the whole epoch packed, which each process must not do (it plans its streams only)
      log.info("training batches: packed in %d streams, each process planning its own, shapes %s",
               batcher.streams.count, batcher.batch_shapes)
    return prefetch.PrefetchIterator(batcher.iterator())

  def eval_batches(self, batch_size, split: str | None = None):
    del batch_size
    split = split or self.task_config.eval_split
    batcher = self._batcher(self.data.eval[split], train=False)
    return [batcher.make_batch(indices) for indices in batcher.epoch_batches(0)]

  def translate_batches(self, model_config, params, batches, count: int, length_penalty: float | None = None,
                        beam_size: int | None = None, description: str = "translating") -> list[str]:
    """Decode batches (with ``index``) into ``count`` detokenised hypotheses in the original order, with beam
    search of ``config.decode``, or beam search of ``beam_size`` ranked by ``length_penalty`` when given (see
    ``decode_settings``). Shows ``Progress`` as ``description``: sentences done of ``count``."""
    decoded = self.decode_indexed(model_config, params, batches, count, length_penalty, beam_size, description)
    return place_hypotheses(decoded, count)

  def decode_indexed(self, model_config, params, batches, count: int, length_penalty: float | None = None,
                     beam_size: int | None = None, description: str = "translating") -> list[list[tuple[int, str]]]:
    """Per batch, ``(example index, detokenised hypothesis)`` of its rows whose index lies in ``[0, count)``
    (none for a batch without such rows, which is not decoded); search and ``Progress`` as
    ``translate_batches``."""
    decoded = []
    total = sum(_rows_below(batch, count).size for batch in batches)
    progress = Progress(description, total, quiet=self.settings.quiet)
    for batch in batches:
      rows = _rows_below(batch, count)
      if not rows.size:
        decoded.append([])
        continue
      max_length = self.default_max_length(batch["source"].shape[1])
      tokens = np.asarray(self.decode_batch(model_config, params, batch["source"], max_length, beam_size,
                                            length_penalty))
      index = np.asarray(batch["index"])
      decoded.append([(int(index[row]), self.tokenizer("target").decode(tokens[row])) for row in rows])
      progress.update(int(rows.size))
    progress.close()
    return decoded

  def sentence_count(self, split: str, count: int | None = None) -> int:
    """Sentences of ``split`` scored: its first ``count`` if given, else all."""
    references = self.data.eval_reference_text[split]
    return len(references) if not count else min(count, len(references))

  def bleu(self, model_config, params, split: str, count: int | None = None, length_penalty: float | None = None):
    """``(metrics, hypotheses)`` on ``split`` (its first ``count`` sentences if given)."""
    count = self.sentence_count(split, count)
    hypotheses = self.translate_batches(model_config, params, self.eval_batches(0, split), count, length_penalty,
                                        description=f"decoding {split}")
    return self.bleu_of(hypotheses, split), hypotheses

  def bleu_of(self, hypotheses: list[str], split: str) -> dict:
    """Corpus BLEU (cased and lowercased, with their signatures) of the hypotheses of the first
    ``len(hypotheses)`` sentences of ``split``."""
    references = self.data.eval_reference_text[split][:len(hypotheses)]
    tokenize = self.task_config.bleu_tokenize
    bleu, signature = corpus_bleu(hypotheses, references, tokenize)
    bleu_lowercase, signature_lowercase = corpus_bleu(hypotheses, references, tokenize, lowercase=True)
    return {"bleu": bleu, "bleu_lowercase": bleu_lowercase, "bleu_signature": signature,
            "bleu_lowercase_signature": signature_lowercase, "sentences": len(hypotheses)}

  def eval_sentence_count(self) -> int:
    """Sentences of the eval split that evaluation scores: its first ``num_eval_sentences`` (0: all)."""
    return self.sentence_count(self.task_config.eval_split, self.task_config.num_eval_sentences)

  def evaluation_batches(self, batches):
    """The eval split's batches that hold one of the sentences scored (``eval_sentence_count``)."""
    count = self.eval_sentence_count()
    return [batch for batch in batches if _rows_below(batch, count).size]

  def evaluate_batches(self, model_config, params, batches):
    """Per batch, ``(example index, hypothesis)`` of its sentences, by ``config.decode``."""
    return self.decode_indexed(model_config, params, batches, self.eval_sentence_count(),
                               description=f"decoding {self.task_config.eval_split}")

  def score_outputs(self, outputs):
    """Corpus BLEU of all the hypotheses (put in sentence order) and the first three sentences."""
    split = self.task_config.eval_split
    hypotheses = place_hypotheses(outputs, self.eval_sentence_count())
    metrics = self.bleu_of(hypotheses, split)
    sources = self.data.eval_source_text[split]
    references = self.data.eval_reference_text[split]
    examples = [f"source:     {sources[i]}\n  reference:  {references[i]}\n  hypothesis: {hypotheses[i]}"
                for i in range(min(3, len(hypotheses)))]
    return {k: v for k, v in metrics.items() if isinstance(v, float)}, examples

  def write_predictions(self, model_config, params, output_dir: str) -> str:
    """``--mode=predict``: the translations of the eval split, ``<eval_split>.hyp.<target language>``, one line
    per source line."""
    split = self.task_config.eval_split
    count = len(self.data.eval_reference_text[split])
    hypotheses = self.translate_batches(model_config, params, self.eval_batches(0, split), count,
                                        description=f"decoding {split}")
    path = os.path.join(output_dir, f"{split}.hyp.{self.data.target_language}")
    write_atomically(path, "".join(line + "\n" for line in hypotheses))  # a full disk keeps the old file whole
    return path

  def translate_lines(self, model_config, params, lines: list[str], beam_size: int | None = None,
                      length_penalty: float | None = None) -> list[str]:
    """Translate raw source sentences, one output line per input line (``--mode=translate``,
    ``TrainedModel.translate``); a blank line gives an empty line and is not decoded. Decoding: ``config.decode``
    (``beam_size``, ``length_penalty`` override it)."""
    if isinstance(lines, str):
      raise ValueError("translate_lines takes a list of sentences, got one string; wrap it in a list.")
    nonblank = [index for index, line in enumerate(lines) if line.strip()]
    if not nonblank:
      return [""] * len(lines)
    encoded = self.tokenizer("source").encode_batch([lines[index] for index in nonblank])
    examples = batching.TokenizedExamples.from_sequences(encoded, [np.array([2], np.int32)] * len(encoded))
    batcher = self._batcher(examples, train=False)
    batches = [batcher.make_batch(indices) for indices in batcher.epoch_batches(0)]
    translated = self.translate_batches(model_config, params, batches, len(encoded), length_penalty, beam_size)
    outputs = [""] * len(lines)
    for index, translation in zip(nonblank, translated):
      outputs[index] = translation
    return outputs

  def encode_sources(self, sources) -> list[np.ndarray]:
    """Source sentences (text, tokenized with EOS) or 1-D token id sequences, as model inputs."""
    return self._encode(sources, self.tokenizer("source"), "source")

  def encode_targets(self, targets) -> list[np.ndarray]:
    """Target sentences (text, tokenized with EOS) or 1-D token id sequences ending with EOS."""
    return self._encode(targets, self.tokenizer("target"), "target")

  def _encode(self, items, tokenizer, name: str) -> list[np.ndarray]:
    if isinstance(items, str):
      raise ValueError(f"give a list of {name} sentences, got one string; wrap it in a list.")
    texts = [index for index, item in enumerate(items) if isinstance(item, str)]
    encoded = dict(zip(texts, tokenizer.encode_batch([items[index] for index in texts]))) if texts else {}
    ids = super().encode_sources if name == "source" else super().encode_targets
    return [encoded[index] if index in encoded else ids([item])[0] for index, item in enumerate(items)]

  def choose_length_penalty(self, model_config, params,
                            known: dict | None = None) -> tuple[float | None, dict, list | None]:
    """``(alpha, metrics, hypotheses)``: the candidate of ``task.length_penalty_candidates`` with the highest BLEU
    on the eval split (its first ``num_eval_sentences``), never on a test split; ``metrics`` has that BLEU and the
    BLEU of every candidate; ``hypotheses`` are the chosen candidate's (None when it was not decoded here).
    ``known``: alpha -> BLEU already measured there (not decoded again). Without candidates:
    ``(config.decode.length_penalty, {}, None)``. Decoding other than beam search (``config.decode.method``) ranks
    no beams, so no length penalty applies: ``(None, {}, None)``, the candidates unused (said in a warning)."""
    task = self.task_config  # its candidates are >= 0 (TranslationConfig checks them)
    if self.decode_settings().method != "beam":
      if task.length_penalty_candidates:
        log.warning("config.task.length_penalty_candidates=%s unused: the length penalty ranks beams, and "
                    "config.decode.method=%r searches none", task.length_penalty_candidates,
                    self.decode_settings().method)
      return None, {}, None
    if not task.length_penalty_candidates:
      return self.decode_settings().length_penalty, {}, None
    known, by_candidate, decoded = {float(alpha): bleu for alpha, bleu in (known or {}).items()}, {}, {}
    for alpha in map(float, task.length_penalty_candidates):
      if alpha in known:
        by_candidate[alpha] = known[alpha]
        continue
      metrics, decoded[alpha] = self.bleu(model_config, params, task.eval_split, task.num_eval_sentences, alpha)
      by_candidate[alpha] = metrics["bleu"]
      log.info("length penalty %.2f: %s BLEU %.2f", alpha, task.eval_split, by_candidate[alpha])
    chosen = max(by_candidate, key=by_candidate.get)  # ties: the first listed
    return chosen, {"bleu": by_candidate[chosen], "length_penalty": chosen,
                    "bleu_by_length_penalty": {str(alpha): bleu for alpha, bleu in by_candidate.items()}}, \
        decoded.get(chosen)

  def write_test_outputs(self, model_config, params, output_dir: str, eval_metrics: dict) -> dict:
    """Hypotheses of every test split as ``output_dir/<split>.hyp.<language>`` (one line per reference line), with
    BLEU, decoded with the length penalty chosen on the eval split; and the eval split's hypotheses that chose it
    (its first ``num_eval_sentences``), with their BLEU, as ``<eval split>.eval.hyp.<language>`` (``--mode=predict``
    writes the whole split by ``config.decode`` as ``<eval split>.hyp.<language>``).
    ``eval_metrics["eval/bleu"]``, decoded by ``evaluate`` with ``config.decode``, is not decoded again to choose
    the length penalty. Only beam search has one: other decodings report none (``choose_length_penalty``)."""
    task = self.task_config
    default_alpha = self.decode_settings().length_penalty
    known = {default_alpha: eval_metrics["eval/bleu"]} if "eval/bleu" in eval_metrics else {}
    length_penalty, chosen_on, eval_hypotheses = self.choose_length_penalty(model_config, params, known)
    if eval_hypotheses is None:  # chosen on what evaluate decoded: decoded again, so the file behind the BLEU exists
      eval_hypotheses = self.bleu(model_config, params, task.eval_split, task.num_eval_sentences, length_penalty)[1]
    results = {task.eval_split: {**self.bleu_of(eval_hypotheses, task.eval_split), **chosen_on}}
    self._write_hypotheses(output_dir, f"{task.eval_split}.eval", eval_hypotheses)
    for split in task.test_splits:
      metrics, hypotheses = self.bleu(model_config, params, split, length_penalty=length_penalty)
      self._write_hypotheses(output_dir, split, hypotheses)
      results[split] = {**metrics, **({} if length_penalty is None else {"length_penalty": length_penalty})}
    return results

  def _write_hypotheses(self, output_dir: str, name: str, hypotheses: list[str]) -> None:
    write_atomically(os.path.join(output_dir, f"{name}.hyp.{self.data.target_language}"),
                     "\n".join(hypotheses) + "\n")


def _rows_below(batch, count: int) -> np.ndarray:
  """The rows of a batch whose example ``index`` lies in ``[0, count)`` (filler and padding rows have -1)."""
  index = np.asarray(batch["index"])
  return np.flatnonzero((index >= 0) & (index < count))


def place_hypotheses(decoded: list[list[tuple[int, str]]], count: int) -> list[str]:
  """``count`` hypotheses in example order from ``decode_indexed``'s ``(index, hypothesis)`` pairs (of every
  batch, in any order); an example no batch holds gets ``""``."""
  hypotheses = [""] * count
  for pairs in decoded:
    for example, hypothesis in pairs:
      hypotheses[example] = hypothesis
  return hypotheses
