"""Language modelling on one side of a parallel-text dataset (the English captions of Multi30k) with the
decoder-only ``TransformerLM``: next-token cross entropy, perplexity, greedy continuations of prompts.

``config.task``: ``transformer.tasks.configs.LanguageModelConfig`` (the dataset, pair and side modelled, the
SentencePiece vocabulary, token-sized batches, the eval split and the continuations shown at each evaluation).

Batches: ``{"tokens": int32 [batch, length]}``, one sentence per row ending with EOS, padded with 0; the model
predicts every token from the ones before it (BOS first), and padding weighs 0.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from transformer.data import batching, tokenizers
from transformer.data.monolingual import load_monolingual_data
from transformer.decode import DecodeSettings, check_max_length
from transformer.errors import ConfigError
from transformer.nn import ModelConfig, TransformerLM
from transformer.tasks.base import Task
from transformer.tasks.configs import LanguageModelConfig
from transformer.decode import override_decode
from transformer.tasks.decoding import continue_prompts
from transformer.tasks.seq2seq import token_loss_and_metrics
from transformer.tasks.tokenized import RecordedTokenizers
from transformer.tasks.translation import sentencepiece_options


class SentenceBatcher(batching.TokenBatcher):
  """``TokenBatcher`` over sentences held as targets (``monolingual.sentences_as_targets``): batches
  ``{"tokens": int32 [batch, length]}``, plus ``"segments"`` (the same shape) when packed."""

  def make_batch(self, indices):
    batch = super().make_batch(indices)
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
                           fixed_shape=task.fixed_batch_shape, pack=task.pack and train)

  def train_iterator(self, batch_size, seed):
    del batch_size  # global batches are sized by config.task.max_tokens; .batch_shapes lists their shapes
    return batching.PrefetchIterator(self._batcher(self.data.train, train=True, seed=seed).iterator())

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

  def derived_metrics(self, metrics):
    """``<prefix>/perplexity`` = exp(mean token NLL) for every ``<prefix>/nll`` (per seed too)."""
    return {name.replace("/nll", "/perplexity", 1): math.exp(min(value, 700.0))  # exp overflows past ~709
            for name, value in metrics.items() if name.split("/")[1:2] == ["nll"]}

  def evaluation_batches(self, batches):
    """One unit: the first words of a few eval sentences, as prompts, which ``continue_texts`` decodes
    together (so one process does)."""
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
