"""BERT-family checkpoints in the Hugging Face layout, loaded into this package's own ``Encoder``.

A model directory holds ``config.json`` (sizes), ``model.safetensors`` (weights, ``BertModel`` names) and
``tokenizer.json``; e.g. sentence-transformers' all-MiniLM-L6-v2 or bert-base-uncased. Any size works: every
size is read from ``config.json``. BERT is a post-LN Transformer encoder with exact (erf) GELU, learned
positions, token-type embeddings, a LayerNorm over the embedding sum, no sqrt(d_model) embedding scale and
biases everywhere: :func:`bert_model_config` sets the ``ModelConfig`` fields that say so.

Tensor names (``N`` the layer), and where each goes in the ``Encoder`` parameter tree; PyTorch's
``Linear.weight`` is ``[out, in]``, so every ``*.weight`` of a dense layer is transposed into a kernel::

  embeddings.word_embeddings.weight        embedding/embedding
  embeddings.position_embeddings.weight    embedder/positions/position_table
  embeddings.token_type_embeddings.weight  embedder/token_type_embedding/embedding
  embeddings.LayerNorm.{weight,bias}       embedder/embedding_norm/{scale,bias}
  encoder.layer.N.attention.self.{query,key,value}.{weight,bias}  layer_N/self_attention/{..}_{kernel,bias}
  encoder.layer.N.attention.output.dense.{weight,bias}            layer_N/self_attention/output_{kernel,bias}
  encoder.layer.N.attention.output.LayerNorm.{weight,bias}        layer_N/attention_norm/{scale,bias}
  encoder.layer.N.intermediate.dense.{weight,bias}                layer_N/feed_forward/{kernel,bias}_in
  encoder.layer.N.output.dense.{weight,bias}                      layer_N/feed_forward/{kernel,bias}_out
  encoder.layer.N.output.LayerNorm.{weight,bias}                  layer_N/feed_forward_norm/{scale,bias}

Names may carry a ``bert.`` prefix (checkpoints of ``BertFor...`` models), and old checkpoints call the
LayerNorm parameters ``gamma``/``beta``. ``pooler.*`` (the [CLS] pooler, which the encoder does not have)
and the ``embeddings.position_ids`` buffer are ignored; any other tensor is unexpected and refused.
"""
from __future__ import annotations

import json
import os
import pathlib
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
import safetensors.numpy

from transformer.errors import ConfigError, InputFileError, MissingDataError
from transformer.nn.axes import unboxed
from transformer.nn.config import ModelConfig
from transformer.nn.models import Encoder
from transformer.pretrained.tokenizer import PretrainedTokenizer

CONFIG_FILE, WEIGHTS_FILE, TOKENIZER_FILE = "config.json", "model.safetensors", "tokenizer.json"
REQUIRED_FILES = (CONFIG_FILE, WEIGHTS_FILE, TOKENIZER_FILE)
# sentence-transformers' settings, when the directory is one of its models: the length it embeds with.
SENTENCE_TRANSFORMERS_FILE = "sentence_bert_config.json"
IGNORED_TENSORS = ("embeddings.position_ids", "pooler.dense.weight", "pooler.dense.bias")
# config.json hidden_act -> ModelConfig.activation; "gelu" in BERT is the exact erf form.
ACTIVATIONS = {"gelu": "gelu_exact", "gelu_new": "gelu", "gelu_pytorch_tanh": "gelu", "relu": "relu"}
PARAMETER_ROOT = "Encoder"  # how error messages name the root of the parameter tree

Params = dict[str, Any]


def check_model_dir(model_dir: str | os.PathLike) -> pathlib.Path:
  """The model directory as a path, after checking that it holds every file that loading reads.

  Raises:
    MissingDataError: naming the directory and the missing files.
  """
  folder = pathlib.Path(model_dir)
  if not folder.is_dir():
    raise MissingDataError(f"BERT model directory {folder} does not exist; give a directory holding "
                           f"{', '.join(REQUIRED_FILES)} (a Hugging Face BERT model's files).")
  missing = [name for name in REQUIRED_FILES if not (folder / name).is_file()]
  if missing:
    raise MissingDataError(f"BERT model directory {folder} lacks {', '.join(missing)}; it needs "
                           f"{', '.join(REQUIRED_FILES)} (download them from the model's Hugging Face page).")
  return folder


def bert_model_config(hf_config: Mapping[str, Any], source: str = CONFIG_FILE) -> ModelConfig:
  """The ``ModelConfig`` of a BERT encoder from its Hugging Face ``config.json`` values.

  Dropout rates are BERT's training ones; use ``.replace(deterministic=True)`` for inference.

  Raises:
    InputFileError: a missing size, or a model BERT's layout does not describe (``source`` names the file).
  """
  def value(key, default=None):
    if key not in hf_config and default is None:
      raise InputFileError(f"{source}: no {key!r}; a BERT config.json gives hidden_size, num_attention_heads, "
                           f"intermediate_size, num_hidden_layers, vocab_size and max_position_embeddings.")
    return hf_config.get(key, default)

  model_type = hf_config.get("model_type", "bert")
  if model_type != "bert":
    raise InputFileError(f"{source}: model_type={model_type!r}; this loader reads BERT checkpoints "
                         f"(model_type 'bert'); other families differ in ways a name check cannot see "
                         f"(RoBERTa's positions start after the padding id, for one).")
  position_type = hf_config.get("position_embedding_type", "absolute")
  if position_type != "absolute":
    raise InputFileError(f"{source}: position_embedding_type={position_type!r}; only 'absolute' (learned "
                         f"positions) is supported.")
  hidden_act = value("hidden_act", "gelu")
  if hidden_act not in ACTIVATIONS:
    raise InputFileError(f"{source}: hidden_act={hidden_act!r} is not supported; supported: "
                         f"{sorted(ACTIVATIONS)}.")
  try:
    return ModelConfig(
        vocab_size=value("vocab_size"), d_model=value("hidden_size"), num_heads=value("num_attention_heads"),
        d_ff=value("intermediate_size"), num_encoder_layers=value("num_hidden_layers"), num_decoder_layers=0,
        max_length=value("max_position_embeddings"), num_token_types=value("type_vocab_size", 2),
        norm_epsilon=value("layer_norm_eps", 1e-12), activation=ACTIVATIONS[hidden_act],
        dropout_rate=value("hidden_dropout_prob", 0.1), attention_dropout_rate=value(
            "attention_probs_dropout_prob", 0.1), feed_forward_dropout_rate=0.0,
        pad_id=hf_config.get("pad_token_id", 0) or 0,
        positional_encoding="learned", scale_embeddings=False, embedding_norm=True, norm="layer_norm",
        norm_position="post", share_embeddings=False, tie_output_embedding=False)
  except ValueError as error:  # e.g. heads that do not divide the width
    raise InputFileError(f"{source}: {error}") from error


def _dense(prefix: str, kernel: tuple[str, ...], bias: tuple[str, ...]):
  """(flax path, tensor name, to_flax) of a PyTorch Linear layer: its ``[out, in]`` weight transposed."""
  return [(kernel, f"{prefix}.weight", np.transpose), (bias, f"{prefix}.bias", None)]


def _norm(prefix: str, path: tuple[str, ...]):
  return [(path + ("scale",), f"{prefix}.weight", None), (path + ("bias",), f"{prefix}.bias", None)]


def parameter_sources(config: ModelConfig) -> list[tuple[tuple[str, ...], str, Callable | None]]:
  """Every ``Encoder`` parameter as ``(path in the tree, checkpoint tensor name, to_flax or None)``."""
  sources = [(("embedding", "embedding"), "embeddings.word_embeddings.weight", None),
             (("embedder", "positions", "position_table"), "embeddings.position_embeddings.weight", None),
             (("embedder", "token_type_embedding", "embedding"), "embeddings.token_type_embeddings.weight",
              None)]
  sources += _norm("embeddings.LayerNorm", ("embedder", "embedding_norm"))
  for index in range(config.num_encoder_layers):
    layer, prefix = f"layer_{index}", f"encoder.layer.{index}"
    for projection in ("query", "key", "value"):
      sources += _dense(f"{prefix}.attention.self.{projection}", (layer, "self_attention", f"{projection}_kernel"),
                        (layer, "self_attention", f"{projection}_bias"))
    sources += _dense(f"{prefix}.attention.output.dense", (layer, "self_attention", "output_kernel"),
                      (layer, "self_attention", "output_bias"))
    sources += _norm(f"{prefix}.attention.output.LayerNorm", (layer, "attention_norm"))
    sources += _dense(f"{prefix}.intermediate.dense", (layer, "feed_forward", "kernel_in"),
                      (layer, "feed_forward", "bias_in"))
    sources += _dense(f"{prefix}.output.dense", (layer, "feed_forward", "kernel_out"),
                      (layer, "feed_forward", "bias_out"))
    sources += _norm(f"{prefix}.output.LayerNorm", (layer, "feed_forward_norm"))
  return sources


def _canonical_name(name: str) -> str:
  """``bert.`` prefix dropped, old ``LayerNorm.gamma``/``beta`` named ``weight``/``bias``."""
  name = name.removeprefix("bert.")
  if ".LayerNorm." in name:
    name = name.replace(".LayerNorm.gamma", ".LayerNorm.weight").replace(".LayerNorm.beta", ".LayerNorm.bias")
  return name


def encoder_parameter_shapes(config: ModelConfig) -> dict[tuple[str, ...], tuple[int, ...]]:
  """The shape of every parameter of ``Encoder(config)``, by path (no arrays are allocated)."""
  tokens = jax.ShapeDtypeStruct((1, 1), jnp.int32)
  shapes = unboxed(jax.eval_shape(lambda t: Encoder(config).init(jax.random.key(0), t), tokens)["params"])
  return {tuple(key.key for key in path): tuple(leaf.shape)
          for path, leaf in jax.tree_util.tree_flatten_with_path(shapes)[0]}


def convert_bert_weights(tensors: Mapping[str, np.ndarray], config: ModelConfig,
                         source: str = WEIGHTS_FILE) -> Params:
  """The ``Encoder(config)`` parameter tree (float32 numpy arrays) from checkpoint tensors by name.

  Raises:
    InputFileError: listing every missing, unexpected and mis-shaped tensor (its name, the shape that
      ``config`` expects and the one found), ``source`` naming the file.
  """
  expected_shapes = encoder_parameter_shapes(config)
  sources = parameter_sources(config)
  mapped = {path for path, _, _ in sources}
  if mapped != set(expected_shapes):  # the model's parameter names changed: this table must follow
    unmapped = sorted("/".join(path) for path in set(expected_shapes) - mapped)
    stale = sorted("/".join(path) for path in mapped - set(expected_shapes))
    raise AssertionError(f"bert.parameter_sources is out of date with Encoder: unmapped {unmapped}, "
                         f"stale {stale}.")

  found = {}
  for name, tensor in tensors.items():
    canonical = _canonical_name(name)
    if canonical in found:
      raise InputFileError(f"{source}: two tensors are named {canonical!r} once normalised ({name!r}).")
    found[canonical] = tensor

  params: Params = {}
  problems = []
  for path, name, to_flax in sources:
    shape = expected_shapes[path]
    stored_shape = shape[::-1] if to_flax is np.transpose else shape  # as the checkpoint stores it
    if name not in found:
      problems.append(f"missing tensor {name} (expected shape {list(stored_shape)})")
      continue
    tensor = np.asarray(found[name])
    if tuple(tensor.shape) != stored_shape:
      problems.append(f"tensor {name} has shape {list(tensor.shape)}, expected {list(stored_shape)}")
      continue
    if not np.issubdtype(tensor.dtype, np.floating):
      problems.append(f"tensor {name} has dtype {tensor.dtype}, expected a floating-point type")
      continue
    value = np.asarray(to_flax(tensor) if to_flax else tensor, np.float32)
    node = params
    for key in path[:-1]:
      node = node.setdefault(key, {})
    node[path[-1]] = value
  used = {name for _, name, _ in sources}
  for name in sorted(set(found) - used - set(IGNORED_TENSORS)):
    problems.append(f"unexpected tensor {name} (shape {list(np.shape(found[name]))})")
  if problems:
    sizes = (f"d_model={config.d_model}, d_ff={config.d_ff}, layers={config.num_encoder_layers}, "
             f"vocab={config.vocab_size}, positions={config.max_length}, token types={config.num_token_types}")
    shown = "\n  ".join(problems[:20]) + (f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else "")
    raise InputFileError(
        f"{source}: {len(problems)} tensor(s) do not fit a BERT encoder of the config's sizes ({sizes}):\n"
        f"  {shown}\nThe loader reads the BertModel layout (embeddings.*, encoder.layer.N.*); check that "
        f"config.json belongs to these weights.")
  return params


def read_json(path: pathlib.Path) -> dict:
  try:
    with open(path, encoding="utf-8") as file:
      return json.load(file)
  except (UnicodeDecodeError, json.JSONDecodeError) as error:
    raise InputFileError(f"{path}: not a valid UTF-8 JSON file ({error}).") from error


def default_max_length(model_dir: str | os.PathLike, config: ModelConfig) -> int:
  """The length sentence-transformers embeds with (``sentence_bert_config.json``'s ``max_seq_length``, when
  there), else the model's position table size."""
  settings = pathlib.Path(model_dir) / SENTENCE_TRANSFORMERS_FILE
  if settings.is_file():
    return min(int(read_json(settings).get("max_seq_length", config.max_length)), config.max_length)
  return config.max_length


def load_bert(model_dir: str | os.PathLike,
              max_length: int | None = None) -> tuple[ModelConfig, Params, PretrainedTokenizer]:
  """``(model_config, params, tokenizer)`` of the BERT checkpoint in ``model_dir``.

  ``params`` is the parameter tree of ``transformer.nn.Encoder(model_config)`` (put it under ``"encoder"``
  for an ``EncoderClassifier``). The tokenizer truncates to ``max_length`` tokens (default:
  :func:`default_max_length`).

  Raises:
    ConfigError: ``max_length`` is outside ``[3, model_config.max_length]``.
    MissingDataError: the directory or one of its files is missing.
    InputFileError: a file is malformed or the weights do not match ``config.json`` (see
      :func:`convert_bert_weights`).
  """
  folder = check_model_dir(model_dir)
  config, tokenizer = load_bert_text(folder / CONFIG_FILE, folder / TOKENIZER_FILE, max_length)
  weights_path = folder / WEIGHTS_FILE
  try:
    tensors = safetensors.numpy.load_file(weights_path)
  except Exception as error:  # safetensors raises its own SafetensorError (and others) on a damaged file
    raise InputFileError(f"{weights_path}: cannot be read as safetensors ({error}).") from error
  return config, convert_bert_weights(tensors, config, source=os.fspath(weights_path)), tokenizer


def load_bert_text(config_path: str | os.PathLike, tokenizer_path: str | os.PathLike,
                   max_length: int | None = None) -> tuple[ModelConfig, PretrainedTokenizer]:
  """``(model_config, tokenizer)`` of a BERT checkpoint from its ``config.json`` and ``tokenizer.json`` alone
  (in the model's folder, or the copies a run keeps of them): what reading text needs, without the weights.
  ``max_length`` as :func:`load_bert`'s (its default reads ``config_path``'s folder).

  Raises:
    ConfigError, InputFileError: as :func:`load_bert`.
  """
  config = bert_model_config(read_json(pathlib.Path(config_path)), source=os.fspath(config_path))
  if max_length is None:
    max_length = default_max_length(pathlib.Path(config_path).parent, config)
  if not 2 < max_length <= config.max_length:
    raise ConfigError(f"max_length={max_length} must be in [3, {config.max_length}] (the model's position "
                     f"table has {config.max_length} rows).")
  try:
    tokenizer = PretrainedTokenizer.from_file(tokenizer_path, max_length, pad_id=config.pad_id)
  except Exception as error:  # the tokenizers library raises a bare Exception on a malformed file
    raise InputFileError(f"{tokenizer_path}: cannot be read by the tokenizers library ({error}).") from error
  if tokenizer.vocab_size > config.vocab_size:
    raise InputFileError(f"{tokenizer_path}: {tokenizer.vocab_size} tokens, but {config_path} has "
                         f"vocab_size={config.vocab_size}; the tokenizer does not belong to these weights.")
  return config, tokenizer
