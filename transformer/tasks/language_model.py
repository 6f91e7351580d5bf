"""Language modelling on one side of a parallel-text dataset (the English captions of Multi30k) with the
decoder-only ``TransformerLM``: next-token cross entropy, perplexity, greedy continuations of prompts.

``config.task``: ``transformer.tasks.configs.LanguageModelConfig`` (the dataset, pair and side modelled, the
SentencePiece vocabulary, token-sized batches, the eval split and the continuations shown at each evaluation).

Batches: ``{"tokens": int32 [batch, length]}``, one sentence per row ending with EOS, padded with 0; the model
predicts every token from the ones before it (BOS first), and padding weighs 0.
"""
from __future__ import annotations

import functools
import logging
import math
import os

import jax
import jax.numpy as jnp
import numpy as np

from transformer.data import batching, prefetch, tokenizers
from transformer.data.files import read_table, write_atomically
from transformer.data.monolingual import chunk_long_sequences, load_monolingual_data
from transformer.decode import DecodeSettings, check_max_length
from transformer.errors import ConfigError
from transformer.nn import ModelConfig, TransformerLM, split_rows
from transformer.tasks.base import Task
from transformer.tasks.configs import LanguageModelConfig
from transformer.decode import override_decode
from transformer.tasks.decoding import continue_prompts
from transformer.tasks.seq2seq import token_loss_and_metrics
from transformer.tasks.tokenized import RecordedTokenizers
from transformer.tasks.translation import sentencepiece_options

log = logging.getLogger(__name__)

LOG_PROBS_FILE = "{split}_log_probs.tsv"  # what --mode=eval writes: see LanguageModelTask.write_log_probs
LOG_PROBS_COLUMNS = ("sentence", "pieces", "words", "log_prob")


class SentenceBatcher(batching.TokenBatcher):
  """``TokenBatcher`` over sentences held as targets (``monolingual.sentences_as_targets``): batches
  ``{"tokens": int32 [batch, length]}``, plus ``"segments"`` (the same shape) when packed."""

  def make_batch(self, indices, process_index=0, process_count=1):
    batch = super().make_batch(indices, process_index, process_count)
    return {"tokens": batch["target"], **({"segments": batch["target_segments"]} if self.pack else {})}


class LanguageModelTask(RecordedTokenizers, Task):
  """Next-token prediction over sentences with a ``TransformerLM`` (``config.model_name = "lm"``). Its ``text``
  tokenizer can be a run's own (``use_recorded_tokenizers``): continuing prompts then reads no data."""
  task_config_class = LanguageModelConfig
  task_config: LanguageModelConfig
  tokenizer_names = ("text",)

  @functools.cached_property
  def data(self):
    task = self.task_config
    return self.checked_data(load_monolingual_data(
        task.dataset, task.pair, task.language, data_dir=task.data_dir or None, source_dir=task.source_dir or None,
        vocab_size=task.vocab_size, eval_splits=(task.eval_split,), tokenizer_options=sentencepiece_options(task)))

  def data_tokenizers(self, data):
    return {"text": data.tokenizer}

  def model_config(self) -> ModelConfig:
    if self.settings.model_name != "lm":
      raise ConfigError(f"the language_model task trains config.model_name='lm' (a decoder-only TransformerLM), "
                        f"got {self.settings.model_name!r}.")
    return self.settings.model.replace(vocab_size=self.tokenizer("text").vocab_size, pad_id=tokenizers.PAD_ID,
                                  bos_id=tokenizers.BOS_ID, eos_id=tokenizers.EOS_ID)

  def build_model(self, model_config):
    return TransformerLM(model_config)

  def _batcher(self, examples, train: bool, seed: int = 0) -> SentenceBatcher:
    task = self.task_config
    return SentenceBatcher(examples, max_tokens=task.max_tokens, max_length=task.max_length, train=train,
                           seed=seed, batch_size_multiple=task.batch_size_multiple,
                           fixed_shape=task.fixed_batch_shape,
                           pack=task.pack and train, plan_workers=task.plan_workers if task.pack and train else 0,
                           pack_streams=task.pack_streams if task.pack and train else 1)

  def training_sentences(self):
    """The training sentences as the batcher gets them: those longer than ``max_length`` cut into pieces if
    ``config.task.chunk_long_sentences`` (else the batcher drops them); a log line says how many either way."""
    task, train = self.task_config, self.data.train
    if task.chunk_long_sentences:
      chunked, count = chunk_long_sequences(train, task.max_length)
      log.info("training: %d of %d sentences longer than max_length=%d cut into pieces (%d examples now)", count,
               len(train), task.max_length, len(chunked))
      return chunked
    count = int(np.sum(train.target_lengths > task.max_length))
    log.info("training: %d of %d sentences longer than max_length=%d dropped (config.task.chunk_long_sentences=True "
             "cuts them into pieces instead)", count, len(train), task.max_length)
    return train

  def train_iterator(self, batch_size, seed):
    del batch_size  # global batches are sized by config.task.max_tokens; .batch_shapes lists their shapes
    return prefetch.PrefetchIterator(self._batcher(self.training_sentences(), train=True, seed=seed).iterator())

  def eval_batches(self, batch_size):
    del batch_size
    batcher = self._batcher(self.data.eval[self.task_config.eval_split], train=False)
    return [batcher.make_batch(indices) for indices in batcher.epoch_batches(0)]

  def init_inputs(self, batch):
    return (batch["tokens"],)

  def placeholder_inputs(self):
    return (np.ones((1, 2), np.int32),)  # parameter shapes do not depend on the length

  def loss_and_metrics(self, model, params, batch, dropout_rng, label_smoothing=None):
    logits = model.apply({"params": params}, batch["tokens"], segments=batch.get("segments"),
                         rngs={"dropout": dropout_rng} if dropout_rng is not None else None)
    return token_loss_and_metrics(logits, batch["tokens"], model.config.pad_id,
                                  self.label_smoothing(label_smoothing))

  def write_test_outputs(self, model_config, params, output_dir, eval_metrics=None):
    """``--mode=eval``: ``<eval_split>_log_probs.tsv`` (``write_log_probs``), what the evaluation's
    ``eval/nll`` and ``eval/perplexity`` come from; a run of several replicas writes one per replica
    (``.replica_<i>.tsv``). No other split: returns no metrics."""
    del eval_metrics
    count = self.settings.num_replicas
    name, extension = os.path.splitext(LOG_PROBS_FILE.format(split=self.task_config.eval_split))
    for replica in range(count):
      path = os.path.join(output_dir, f"{name}{extension}" if count == 1 else f"{name}.replica_{replica}{extension}")
      self.write_log_probs(model_config, params if count == 1 else jax.tree.map(lambda leaf: leaf[replica], params),
                           path)
    return {}

  def write_log_probs(self, model_config, params, path: str) -> dict[str, float]:
    """Writes ``path``: a header (``LOG_PROBS_COLUMNS``), then one row per sentence of the eval split, in its
    order, tab-separated: its index, its pieces (EOS included), its whitespace-separated words and the sum of
    its pieces' log-probabilities (natural log, each piece given the ones before it), computed on the
    evaluation's own batches. Returns ``log_probs_metrics`` of the file read back."""
    split = self.task_config.eval_split
    batcher = self._batcher(self.data.eval[split], train=False)
    texts, sums, pieces = self.data.eval_text[split], {}, {}
    for indices in batcher.epoch_batches(0):
      tokens = batcher.make_batch(indices)["tokens"]
      log_probs = np.asarray(_token_log_probs(model_config.replace(deterministic=True), params, tokens), np.float64)
      for row, index in enumerate(indices):
        sums[int(index)] = math.fsum(log_probs[row][tokens[row] != model_config.pad_id])
        pieces[int(index)] = int(np.count_nonzero(tokens[row] != model_config.pad_id))
    rows = [LOG_PROBS_COLUMNS] + [(index, pieces[index], len(texts[index].split()), repr(sums[index]))
                                  for index in range(len(texts))]
    write_atomically(path, "".join("\t".join(map(str, row)) + "\n" for row in rows))
    return log_probs_metrics(read_log_probs(path))

  def score_texts(self, model_config, params, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """``(log_probs, pieces)``: each text's log-probability (float64, natural log, EOS included, each piece given
    the ones before it; what ``write_log_probs`` writes for the eval split) and its number of pieces."""
    encoded = self.tokenizer("text").encode_batch(list(texts))
    tokens = np.full((len(encoded), max([len(ids) for ids in encoded] + [1])), model_config.pad_id, np.int32)
    for row, ids in enumerate(encoded):
      tokens[row, :len(ids)] = ids
    log_probs = np.asarray(_token_log_probs(model_config.replace(deterministic=True), params, tokens), np.float64)
    return (np.array([math.fsum(row[ids != model_config.pad_id]) for row, ids in zip(log_probs, tokens)]),
            np.array([len(ids) for ids in encoded]))

  def derived_metrics(self, metrics):
    """``<prefix>/perplexity`` = exp(mean token NLL) for every ``<prefix>/nll`` (per seed too)."""
    return {name.replace("/nll", "/perplexity", 1): math.exp(min(value, 700.0))  # exp overflows past ~709
            for name, value in metrics.items() if name.split("/")[1:2] == ["nll"]}

  def evaluation_batches(self, batches):
    """One unit: the first words of a few eval sentences, as prompts, which ``continue_texts`` decodes
    together."""
    task = self.task_config
    sentences = self.data.eval_text[task.eval_split][:task.num_eval_prompts]
    return [[" ".join(sentence.split()[:task.prompt_words]) for sentence in sentences]]

  def evaluate_batches(self, model_config, params, batches):
    """Per list of prompts, ``(prompt, continuation)`` pairs."""
    return [list(zip(prompts, self.continue_texts(model_config, params, prompts))) for prompts in batches]

  def score_outputs(self, outputs):
    """The continuations, as examples (no metrics)."""
    return {}, [f"prompt: {prompt}\n  continuation: {text}" for pairs in outputs for prompt, text in pairs]

  def continue_texts(self, model_config, params, prompts: list[str], max_new_tokens: int | None = None,
                     settings: DecodeSettings | None = None) -> list[str]:
    """Each prompt's continuation up to EOS or ``max_new_tokens`` pieces (default the task's ``max_length``),
    as text without the prompt, by ``settings`` (default the run's ``config.decode``: greedy, beam or
    sampling; of several beams or samples, the likeliest). An empty prompt starts a sentence. All prompts go
    through the model in one batch, each written into the key/value cache in one parallel pass."""
    if isinstance(prompts, str):
      raise ValueError("continue_texts takes a list of prompts, got one string; wrap it in a list.")
    if max_new_tokens is not None:
      check_max_length(max_new_tokens, "max_new_tokens")  # before the prompts are encoded, also for no prompts
    if not prompts:
      return []
    max_new_tokens = self.task_config.max_length if max_new_tokens is None else int(max_new_tokens)
    settings = self.settings.decode if settings is None else settings
    encoded = self.tokenizer("text").encode_batch(list(prompts), add_eos=False)
    lengths = np.array([len(ids) for ids in encoded], np.int32)
    prompt = np.full((len(encoded), max(1, int(lengths.max()))), model_config.pad_id, np.int32)
    for row, ids in enumerate(encoded):
      prompt[row, :len(ids)] = ids
    sequences, _ = continue_prompts(model_config.replace(deterministic=True), params, prompt, lengths,
                                    max_new_tokens, settings)
    return [self.tokenizer("text").decode(best) for best in np.asarray(sequences)[:, 0]]

  def translate_lines(self, model_config, params, lines: list[str], beam_size: int | None = None,
                      length_penalty: float | None = None) -> list[str]:
    """``--mode=translate`` for a language model: each input line is a prompt, each output line its
    continuation (``config.decode``; ``beam_size``/``length_penalty`` override it as for translation)."""
    return self.continue_texts(model_config, params, lines,
                               settings=override_decode(self.settings.decode, beam_size, length_penalty))


@functools.partial(jax.jit, static_argnums=0)
def _token_log_probs(model_config: ModelConfig, params, tokens):
  """float32 ``[batch, length]``: ``log P(tokens[:, i] | tokens[:, :i])`` (0 where ``tokens`` is padding)."""
  def log_probs_of(tokens):
    logits = TransformerLM(model_config).apply({"params": params}, tokens)
    log_probs = jnp.take_along_axis(jax.nn.log_softmax(logits.astype(jnp.float32)), tokens[..., None], -1)[..., 0]
    return jnp.where(tokens != model_config.pad_id, log_probs, 0.0)
  return split_rows(log_probs_of, tokens)


def read_log_probs(path: str) -> list[dict]:
  """The rows of a ``write_log_probs`` file: ``sentence``, ``pieces``, ``words`` (ints) and ``log_prob``.

  Raises:
    InputFileError: the file is not one, or a line is damaged (the message names the file and the line).
  """
  def parse(cells):
    sentence, pieces, words, log_prob = cells
    return {"sentence": int(sentence), "pieces": int(pieces), "words": int(words), "log_prob": float(log_prob)}
  return read_table(path, LOG_PROBS_COLUMNS, parse, "per-sentence log-probabilities")


def log_probs_metrics(rows: list[dict]) -> dict:
  """From per-sentence rows (``read_log_probs``): ``nll``, the mean negative log-likelihood per piece (EOS
  included), ``perplexity`` = exp(nll), ``per_word_perplexity`` (the same log-likelihood over words and
  end-of-sentence marks) and the counts ``pieces``, ``words`` and ``sentences``."""
  pieces, words = sum(row["pieces"] for row in rows), sum(row["words"] for row in rows)
  total = -math.fsum(row["log_prob"] for row in rows)
  nll = total / max(pieces, 1)
  return {"nll": nll, "perplexity": math.exp(nll), "per_word_perplexity": math.exp(total / max(words + len(rows), 1)),
          "pieces": pieces, "words": words, "sentences": len(rows)}
