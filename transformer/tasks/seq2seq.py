"""Sequence-to-sequence tasks on an ``EncoderDecoder``: teacher-forced loss, greedy/beam search, exact match.

Batches: ``{"source": int32 [batch, source_length], "target": int32 [batch, target_length]}``, padded with
``pad_id`` = 0; targets end with EOS. Synthetic tasks and translation differ only in their data.
"""
from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np

from transformer import ops
from transformer.data.files import replacing
from transformer.decode import DecodeSettings, check_max_length
from transformer.errors import ConfigError
from transformer.nn import EncoderDecoder, ModelConfig, model_spec, split_rows, unstack_layers
from transformer.tasks.base import Task
from transformer.decode import override_decode
from transformer.tasks.decoding import SEQ2SEQ_MODELS, model_class, search_decode

EXAMPLES_SHOWN = 3  # decoded examples printed at each evaluation


class Seq2SeqTask(Task):
  """Base class: subclasses provide data (``train_iterator``, ``eval_batches``) and ``model_config``."""

  def make_model_config(self, **data_fields):
    """The hyper-parameters of the ``config.model_name`` model: ``config.model`` plus what the data decides
    (vocabulary sizes, special ids; fields the model lacks, like ``share_embeddings`` for RNNs, are dropped)."""
    model_name = self.settings.model_name
    config_class = model_spec(model_name).config
    if model_name not in SEQ2SEQ_MODELS:
      raise ConfigError(f"config.model_name={model_name!r} is not a sequence-to-sequence model; the "
                        f"{self.task_config.name!r} task trains one of {list(SEQ2SEQ_MODELS)}.")
    fields = {k: v for k, v in data_fields.items() if k in config_class.field_names()}
    return self.settings.model.replace(**fields)

  def build_model(self, model_config) -> EncoderDecoder:
    return model_class(model_config)(model_config)

  def init_inputs(self, batch):
    return batch["source"], batch["target"]

  def placeholder_inputs(self):
    # Parameter shapes do not depend on the lengths of the inputs: a 1 x 2 dummy pair suffices.
    return np.ones((1, 2), np.int32), np.ones((1, 2), np.int32)

  # The id token dropout (config.source_token_dropout, config.target_token_dropout) writes in place of a
  # dropped token: the tokenizer's unknown token. None: the task's data has none, so word dropout is refused.
  unknown_id: int | None = None

  def drop_tokens(self, batch, dropout_rng, model_config):
    """Word dropout of a training batch: ``(source, target)`` with tokens replaced by ``unknown_id`` at the
    configured rates (padding and EOS kept). The model shifts the returned target right into its decoder
    inputs; the loss keeps the batch's own targets as labels."""
    rates = self.settings.source_token_dropout, self.settings.target_token_dropout
    if dropout_rng is None or not any(rates):
      return batch["source"], batch["target"]
    if self.unknown_id is None:
      raise ConfigError(f"{type(self).__name__} has no unknown-token id for word dropout; set "
                        f"config.source_token_dropout and config.target_token_dropout to 0.")
    keep_ids = (model_config.pad_id, model_config.eos_id)
    # Keys folded from the dropout key, which the model still gets whole: runs without word dropout keep
    # their random streams.
    return tuple(ops.token_dropout(batch[name], rate, jax.random.fold_in(dropout_rng, index + 1),
                                   self.unknown_id, keep_ids)
                 for index, (name, rate) in enumerate(zip(("source", "target"), rates)))

  def loss_and_metrics(self, model, params, batch, dropout_rng, label_smoothing=None):
    source, target = self.drop_tokens(batch, dropout_rng, model.config)
    segments = (batch["source_segments"], batch["target_segments"]) if "source_segments" in batch else ()
    logits = model.apply({"params": params}, source, target, *segments,
                         rngs={"dropout": dropout_rng} if dropout_rng is not None else None)
    return token_loss_and_metrics(logits, batch["target"], model.config.pad_id,
                                  self.label_smoothing(label_smoothing))

  def decode_settings(self, beam_size: int | None = None, length_penalty: float | None = None) -> DecodeSettings:
    """``config.decode``, with a call's overrides: ``beam_size`` 1 is greedy search, more is beam search."""
    return override_decode(self.settings.decode, beam_size, length_penalty)

  def decode_batch(self, model_config: ModelConfig, params, source, max_length: int, beam_size: int | None = None,
                   length_penalty: float | None = None):
    """Decode ``[batch, source_length]`` sources into ``[batch, max_length]`` tokens, the best hypothesis of
    ``decode_settings(beam_size, length_penalty)`` (of several samples, the likeliest)."""
    settings = self.decode_settings(beam_size, length_penalty)
    sequences, _ = search_decode(model_config.replace(deterministic=True), params, source, max_length, settings)
    return sequences[:, 0]

  @staticmethod
  def default_max_length(source_length: int) -> int:
    """Output tokens allowed for sources of ``source_length``: room for targets longer than their sources
    (German is ~10% longer than English)."""
    return int(source_length * 1.5) + 10

  def encode_sources(self, sources) -> list[np.ndarray]:
    """Model inputs of ``sources``: 1-D int token sequences (tasks with a tokenizer also take text)."""
    return [_as_tokens(source, "source") for source in sources]

  def encode_targets(self, targets) -> list[np.ndarray]:
    """Model outputs ``targets`` as 1-D int token sequences ending with EOS (as the task's data has them)."""
    return [_as_tokens(target, "target") for target in targets]

  def decode_sequences(self, model_config: ModelConfig, params, sources, max_length: int | None = None,
                       beam_size: int | None = None, length_penalty: float | None = None) -> list[np.ndarray]:
    """Decode ``sources`` (see ``encode_sources``; a padded ``[batch, length]`` array works too) into one 1-D
    int32 token array each, up to and including its EOS (all ``max_length`` tokens when none came), with
    ``decode_settings(beam_size, length_penalty)``. ``max_length`` None: ``default_max_length`` of the longest
    source; else an integer >= 1 (a ValueError names it: the decoding cache is sized by it)."""
    if max_length is not None:
      check_max_length(max_length)
    source = pad_sequences(self.encode_sources(sources), model_config.pad_id)
    if not len(source):
      return []
    max_length = self.default_max_length(source.shape[1]) if max_length is None else int(max_length)
    tokens = np.asarray(self.decode_batch(model_config, params, source, max_length, beam_size, length_penalty))
    return [until_eos(row, model_config.eos_id) for row in tokens]

  def score(self, model_config: ModelConfig, params, sources, targets) -> np.ndarray:
    """float64 ``[len(sources)]``: ``log P(target | source)`` of each pair under teacher forcing, summed over
    the target's tokens (EOS included); the per-token NLL is ``-score / len(target)``."""
    source_ids, target_ids = self.encode_sources(sources), self.encode_targets(targets)
    if len(source_ids) != len(target_ids):
      raise ValueError(f"{len(source_ids)} sources for {len(target_ids)} targets; give one target per source.")
    if not source_ids:
      return np.zeros((0,), np.float64)
    log_probs = sequence_log_probs(model_config.replace(deterministic=True), params,
                                   pad_sequences(source_ids, model_config.pad_id),
                                   pad_sequences(target_ids, model_config.pad_id))
    return np.asarray(log_probs, np.float64)

  def attention_weights(self, model_config: ModelConfig, params, sources, targets
                        ) -> list[dict[tuple[str, int | None], np.ndarray]]:
    """Teacher-forced attention weights of each (source, target) pair; see ``attention_weights`` (module)."""
    return attention_weights(model_config, params, self.encode_sources(sources), self.encode_targets(targets))

  def evaluation_batches(self, batches):
    """Every eval batch, each greedy-decoded on its own."""
    return list(batches)

  def evaluate_batches(self, model_config, params, batches):
    """Per batch, greedy decoding's ``{"matches", "sequences"}`` (exact-match counts, floats) and the
    ``"examples"`` of its first rows."""
    outputs = []
    for batch in batches:
      target = np.asarray(batch["target"])
      predictions = np.asarray(self.decode_batch(model_config, params, batch["source"], target.shape[1], 1))
      match, count = ops.sequence_exact_match(predictions, target, target != model_config.pad_id)
      examples = [self.format_example(batch["source"][row], target[row], predictions[row])
                  for row in range(min(EXAMPLES_SHOWN, len(target)))]
      outputs.append({"matches": float(match), "sequences": float(count), "examples": examples})
    return outputs

  def score_outputs(self, outputs):
    """Exact-match sequence accuracy and the first few examples."""
    matches = sequences = 0.0
    examples = []
    for output in outputs:  # summed in batch order
      matches += output["matches"]
      sequences += output["sequences"]
      examples += output["examples"][:EXAMPLES_SHOWN - len(examples)]
    return {"exact_match": matches / max(sequences, 1.0)}, examples

  def write_predictions(self, model_config, params, output_dir: str) -> str:
    """``--mode=predict``: ``predictions.txt``, one line per eval example, its source and its prediction by
    ``config.decode`` (up to EOS) as token ids, tab-separated."""
    path = os.path.join(output_dir, PREDICTIONS_FILE)
    with replacing(path) as f:  # a full disk or an error midway keeps the old file whole
      for batch in self.eval_batches(self.settings.eval_batch_size):
        source, target = np.asarray(batch["source"]), np.asarray(batch["target"])
        predictions = np.asarray(self.decode_batch(model_config, params, source, target.shape[1]))
        for row in np.flatnonzero((target != model_config.pad_id).any(axis=1)):  # padding rows have no target
          f.write(f"{_ids_text(source[row], model_config)}\t{_ids_text(predictions[row], model_config)}\n")
    return path

  def format_example(self, source, target, prediction) -> str:
    def show(tokens):
      return " ".join(str(int(t)) for t in tokens if t != 0)
    return f"source: {show(source)}\n  target:     {show(target)}\n  prediction: {show(prediction)}"


def token_loss_and_metrics(logits, targets, pad_id: int, label_smoothing: float = 0.0):
  """``(loss_sum, weight_sum, metrics)`` of teacher-forced ``logits`` ``[batch, length, vocab]`` for ``targets``
  ``[batch, length]``, over the non-``pad_id`` targets: label-smoothed loss, ``nll`` and ``token_accuracy``."""
  weights = (targets != pad_id).astype(jnp.float32)
  loss_sum, weight_sum = ops.weighted_sum(ops.softmax_cross_entropy(logits, targets, label_smoothing), weights)
  # The unsmoothed loss is what perplexity and comparisons across label_smoothing settings need.
  nll_sum, _ = ops.weighted_sum(ops.softmax_cross_entropy(logits, targets), weights)
  metrics = {"loss": (loss_sum, weight_sum), "nll": (nll_sum, weight_sum),
             "token_accuracy": ops.token_accuracy(logits, targets, weights)}
  return loss_sum, weight_sum, metrics


PREDICTIONS_FILE = "predictions.txt"


def _ids_text(tokens, model_config) -> str:
  """Token ids up to (without) EOS and without padding, space-separated."""
  return " ".join(str(int(t)) for t in until_eos(np.asarray(tokens), model_config.eos_id)
                  if t not in (model_config.pad_id, model_config.eos_id))


def _as_tokens(sequence, name: str) -> np.ndarray:
  """A 1-D int32 token array, or a clear error for anything else (e.g. text given to a task without a
  tokenizer)."""
  tokens = np.asarray(sequence)
  if tokens.ndim != 1 or not (tokens.size == 0 or np.issubdtype(tokens.dtype, np.integer)):
    raise ValueError(f"a {name} must be a 1-D sequence of token ids here, got {str(sequence)[:80]!r}; only "
                     "tasks with a tokenizer (translation) take text.")
  return tokens.astype(np.int32)


def pad_sequences(sequences, pad_id: int = 0) -> np.ndarray:
  """Right-pad 1-D int sequences into int32 ``[batch, longest]``; padded rows (of a 2-D array) stay as they are."""
  batch = np.full((len(sequences), max((len(s) for s in sequences), default=0)), pad_id, np.int32)
  for row, sequence in enumerate(sequences):
    batch[row, :len(sequence)] = sequence
  return batch


def until_eos(tokens: np.ndarray, eos_id: int) -> np.ndarray:
  """The decoded tokens ``[length]`` up to and including the first EOS (all of them if there is none)."""
  ends = np.flatnonzero(tokens == eos_id)
  return tokens[: ends[0] + 1] if len(ends) else tokens


@functools.partial(jax.jit, static_argnums=0)
def sequence_log_probs(model_config: ModelConfig, params, source, target):
  """``[batch]`` float32 ``sum_i log P(target[:, i] | source, target[:, :i])`` over the non-padding tokens of
  ``target`` ``[batch, target_length]`` (teacher forcing), for ``source`` ``[batch, source_length]``."""
  def log_probs_of(source, target):
    logits = model_class(model_config)(model_config).apply({"params": params}, source, target)
    log_probs = jnp.take_along_axis(jax.nn.log_softmax(logits.astype(jnp.float32)), target[..., None], -1)[..., 0]
    return jnp.sum(jnp.where(target != model_config.pad_id, log_probs, 0.0), axis=-1)
  return split_rows(log_probs_of, source, target)


def _attention_kind_and_layer(path: tuple[str, ...]) -> tuple[str, int | None]:
  """Classify a sown ``attention_weights`` by its module path, e.g.
  ``('decoder', 'layer_1', 'cross_attention', 'attention_weights')`` -> ``('cross', 1)``."""
  layers = [int(name[len("layer_"):]) for name in path if name.startswith("layer_") and name[6:].isdigit()]
  layer = layers[0] if layers else None
  if "cross_attention" in path:
    return "cross", layer
  if "self_attention" in path:
    return ("encoder_self" if path[0] == "encoder" else "decoder_self"), layer
  if path == ("decoder", "attention_weights"):  # RNNDecoder: [batch, heads=1, target_length, source_length]
    return "alignment", None
  raise ValueError(f"attention_weights sown at an unknown place {'/'.join(path)}; teach "
                   "_attention_kind_and_layer.")


ATTENTION_KINDS = ("encoder_self", "decoder_self", "cross", "alignment")


def attention_weights(model_config: ModelConfig, params, sources: list[np.ndarray], targets: list[np.ndarray]
                      ) -> list[dict[tuple[str, int | None], np.ndarray]]:
  """Teacher-forced attention weights of each (source, target) pair, padding cropped away.

  The model runs with ``deterministic=True`` and the dense attention implementation (the chunked one never
  materialises, hence never sows, its weights).

  Args:
    sources, targets: 1-D int token arrays (without padding); targets end with EOS.

  Returns:
    Per pair, ``(kind, layer)`` -> float32 ``[heads, q_length, kv_length]``, ``kind`` one of
    ``ATTENTION_KINDS``, ``layer`` numbered from 0 (None for the RNN alignment): ``[S, S]`` for encoder self
    attention, ``[T, T]`` for decoder self attention, ``[T, S]`` for cross attention and the RNN alignment,
    where ``S`` and ``T`` are the pair's source and target lengths. Every row sums to 1.
  """
  from flax import traverse_util

  if not len(sources):
    return []
  model_config = model_config.replace(deterministic=True)
  if hasattr(model_config, "attention_implementation"):
    model_config = model_config.replace(attention_implementation="dense")
  _, variables = _sown_intermediates(model_config, params, pad_sequences(sources, model_config.pad_id),
                                     pad_sequences(targets, model_config.pad_id))
  collected = [{} for _ in sources]
  sown_per_layer = unstack_layers(variables["intermediates"])  # a scanned stack sows [layers, ...]
  for path, sown in traverse_util.flatten_dict(sown_per_layer).items():
    if path[-1] != "attention_weights":
      continue
    kind, layer = _attention_kind_and_layer(path)
    weights = np.asarray(sown[0], np.float32)  # [batch, heads, q_length, kv_length]
    for row, (source, target) in enumerate(zip(sources, targets)):
      queries = len(source) if kind == "encoder_self" else len(target)
      keys = len(target) if kind == "decoder_self" else len(source)
      collected[row][kind, layer] = weights[row, :, :queries, :keys]
  return collected


# Jitted: one compile costs less than dispatching the model op by op.
@functools.partial(jax.jit, static_argnums=0)
def _sown_intermediates(model_config: ModelConfig, params, source, target):
  return model_class(model_config)(model_config).apply({"params": params}, source, target,
                                                       mutable=["intermediates"])
