"""Sequence-to-sequence tasks on an ``EncoderDecoder``: teacher-forced loss, greedy/beam search, exact match.

Batches: ``{"source": int32 [batch, source_length], "target": int32 [batch, target_length]}``, padded with
``pad_id`` = 0; targets end with EOS. Synthetic tasks and translation differ only in their data.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from transformer import ops
from transformer.decode import beam_search, expand_to_beams, greedy_search
from transformer.errors import ConfigError
from transformer.nn import CROSS_CACHE, MODELS, EncoderDecoder, ModelConfig, cross_attention_cache, model_spec
from transformer.tasks.base import Task

# The config.model_name values (keys of transformer.nn.MODELS) a seq2seq task trains. Both models share the
# EncoderDecoder interface (encode, decode, teacher-forced __call__, a decode cache), so loss and search code
# is the same for both.
SEQ2SEQ_MODELS = ("transformer", "rnn")


def model_class(model_config) -> type[EncoderDecoder]:
  """The Flax module of a seq2seq model's hyper-parameters (``ModelConfig`` or ``RNNConfig``)."""
  return next(MODELS[name].module for name in SEQ2SEQ_MODELS if type(model_config) is MODELS[name].config)


class Seq2SeqTask(Task):
  """Base class: subclasses provide data (``train_iterator``, ``eval_batches``) and ``model_config``."""

  def make_model_config(self, **data_fields):
    """The hyper-parameters of the ``config.model_name`` model: ``config.model`` plus what the data decides
    (vocabulary sizes, special ids; fields the model lacks, like ``share_embeddings`` for RNNs, are dropped)."""
    model_name = self.config.model_name
    config_class = model_spec(model_name).config
    if model_name not in SEQ2SEQ_MODELS:
      raise ConfigError(f"config.model_name={model_name!r} is not a sequence-to-sequence model; the "
                        f"{self.config.task.name!r} task trains one of {list(SEQ2SEQ_MODELS)}.")
    fields = {k: v for k, v in data_fields.items() if k in config_class.field_names()}
    return config_class.from_dict({**self.config.model.to_dict(), **fields})

  def build_model(self, model_config) -> EncoderDecoder:
    return model_class(model_config)(model_config)

  def init_inputs(self, batch):
    return batch["source"], batch["target"]

  # The id token dropout (config.source_token_dropout, config.target_token_dropout) writes in place of a
  # dropped token: the tokenizer's unknown token. None: the task's data has none, so word dropout is refused.
  unknown_id: int | None = None

  def drop_tokens(self, batch, dropout_rng, model_config):
    """Word dropout of a training batch: ``(source, target)`` with tokens replaced by ``unknown_id`` at the
    configured rates (padding and EOS kept). The model shifts the returned target right into its decoder
    inputs; the loss keeps the batch's own targets as labels."""
    rates = self.config.get("source_token_dropout", 0.0), self.config.get("target_token_dropout", 0.0)
    if dropout_rng is None or not any(rates):
      return batch["source"], batch["target"]
    if self.unknown_id is None:
      raise ValueError(f"{type(self).__name__} has no unknown-token id for word dropout; set "
                       f"config.source_token_dropout and config.target_token_dropout to 0.")
    keep_ids = (model_config.pad_id, model_config.eos_id)
    # Keys folded from the dropout key, which the model still gets whole: runs without word dropout keep
    # their random streams.
    return tuple(ops.token_dropout(batch[name], rate, jax.random.fold_in(dropout_rng, index + 1),
                                   self.unknown_id, keep_ids)
                 for index, (name, rate) in enumerate(zip(("source", "target"), rates)))

  def loss_and_metrics(self, model, params, batch, dropout_rng):
    source, target = self.drop_tokens(batch, dropout_rng, model.config)
    logits = model.apply({"params": params}, source, target,
                         rngs={"dropout": dropout_rng} if dropout_rng is not None else None)
    weights = (batch["target"] != model.config.pad_id).astype(jnp.float32)
    losses = ops.softmax_cross_entropy(logits, batch["target"], self.config.get("label_smoothing", 0.0))
    loss_sum, weight_sum = ops.weighted_sum(losses, weights)
    # The unsmoothed loss is what perplexity and comparisons across label_smoothing settings need.
    nll_sum, _ = ops.weighted_sum(ops.softmax_cross_entropy(logits, batch["target"]), weights)
    metrics = {
        "loss": (loss_sum, weight_sum),
        "nll": (nll_sum, weight_sum),
        "token_accuracy": ops.token_accuracy(logits, batch["target"], weights),
    }
    return loss_sum, weight_sum, metrics

  def decode_batch(self, model_config: ModelConfig, params, source, max_length: int, beam_size: int = 1,
                   length_penalty: float = 0.6):
    """Decode ``[batch, source_length]`` sources into ``[batch, max_length]`` tokens: greedy when
    ``beam_size`` is 1, else beam search ranked with the GNMT ``length_penalty`` (alpha)."""
    model_config = model_config.replace(deterministic=True)
    if beam_size == 1:
      return _greedy_decode(model_config, params, source, max_length)
    sequences, _ = _beam_decode(model_config, params, source, max_length, beam_size, length_penalty)
    return sequences

  def evaluate(self, model_config, params, batches):
    """Greedy-decode every eval batch; exact-match sequence accuracy and a few examples."""
    matches = sequences = 0.0
    examples = []
    for batch in batches:
      target = np.asarray(batch["target"])
      predictions = np.asarray(self.decode_batch(model_config, params, batch["source"], target.shape[1]))
      match, count = ops.sequence_exact_match(predictions, target, target != model_config.pad_id)
      matches += float(match)
      sequences += float(count)
      for row in range(min(3 - len(examples), len(target))):
        examples.append(self.format_example(batch["source"][row], target[row], predictions[row]))
    return {"exact_match": matches / max(sequences, 1.0)}, examples

  def format_example(self, source, target, prediction) -> str:
    def show(tokens):
      return " ".join(str(int(t)) for t in tokens if t != 0)
    return f"source: {show(source)}\n  target:     {show(target)}\n  prediction: {show(prediction)}"


def _cached_decoder(model_config: ModelConfig, params, source, max_length: int, beam_size: int = 1):
  """Encode ``source`` ``[batch, source_length]`` once; return ``(step_fn, cache)`` for the searches.

  ``step_fn`` maps the previous tokens ``[batch * beam_size, 1]`` and the cache to logits
  ``[batch * beam_size, 1, vocab]``: it attends to the encoder output repeated per beam. The cache is the
  empty key/value cache for ``batch`` sequences of ``max_length`` tokens (``beam_search`` repeats it).
  """
  model = model_class(model_config)(model_config)
  decoder = model_class(model_config)(model_config.replace(decode=True))
  batch_size = source.shape[0]
  encoded = model.apply({"params": params}, source, method=EncoderDecoder.encode)
  # The cache's shapes come from an abstract init with a full-length dummy target; its values start at 0.
  cache_shapes = jax.eval_shape(
      lambda: decoder.init(jax.random.PRNGKey(0), source, jnp.zeros((batch_size, max_length), jnp.int32)))
  cache = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), cache_shapes["cache"])
  encoded, source = expand_to_beams(encoded, beam_size), expand_to_beams(source, beam_size)
  # Cross-attention keys and values, projected once; the steps read them (constants of the search loop).
  cross_cache = cross_attention_cache(model, params, encoded, source)

  def step_fn(tokens, cache):
    logits, variables = decoder.apply({"params": params, "cache": cache, CROSS_CACHE: cross_cache}, encoded,
                                      source, tokens, method=EncoderDecoder.decode, mutable=["cache"])
    return logits, variables["cache"]

  return step_fn, cache


@functools.partial(jax.jit, static_argnums=(0, 3))
def _greedy_decode(model_config: ModelConfig, params, source, max_length: int):
  step_fn, cache = _cached_decoder(model_config, params, source, max_length)
  return greedy_search(step_fn, cache, source.shape[0], max_length, model_config.bos_id, model_config.eos_id,
                       model_config.pad_id)


@functools.partial(jax.jit, static_argnums=(0, 3, 4, 5, 6))
def _beam_decode(model_config: ModelConfig, params, source, max_length: int, beam_size: int,
                 length_penalty: float = 0.6, return_all_beams: bool = False):
  """Beam search: ``([batch, max_length] tokens, [batch] scores)``, or all beams (see ``beam_search``)."""
  step_fn, cache = _cached_decoder(model_config, params, source, max_length, beam_size)
  return beam_search(step_fn, cache, source.shape[0], beam_size, max_length, model_config.bos_id,
                     model_config.eos_id, model_config.pad_id, length_penalty, return_all_beams)
