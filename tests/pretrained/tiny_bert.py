"""A tiny random BERT written in the Hugging Face layout, and a numpy BERT to check loaded models against.

``write_tiny_bert`` writes ``config.json``, ``model.safetensors`` (``BertModel`` tensor names, PyTorch's
``[out, in]`` Linear weights, the pooler and the ``position_ids`` buffer included, as real checkpoints have)
and a WordPiece ``tokenizer.json`` built with the ``tokenizers`` library. ``numpy_bert`` is the forward pass
of Hugging Face's ``BertModel`` written from its definition, reading the tensors by their checkpoint names.
"""
from __future__ import annotations

import json
import math
import pathlib

import numpy as np
import safetensors.numpy
import tokenizers
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = ["the", "a", "fire", "flood", "near", "river", "road", "is", "on", "big", "small", "##s", "##ing",
         "burn", "rain", ".", ",", "!"]
SIZES = {"hidden_size": 8, "num_attention_heads": 2, "intermediate_size": 16, "num_hidden_layers": 2,
         "max_position_embeddings": 16, "type_vocab_size": 2}


def tiny_tokenizer() -> tokenizers.Tokenizer:
  """An uncased BERT WordPiece tokenizer over ``SPECIAL_TOKENS + WORDS``: ``[CLS] text [SEP]``."""
  vocab = {token: index for index, token in enumerate(SPECIAL_TOKENS + WORDS)}
  tokenizer = tokenizers.Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
  tokenizer.add_special_tokens(SPECIAL_TOKENS)  # already in the vocabulary: marks them special, keeps the ids
  tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
  tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
  tokenizer.post_processor = processors.TemplateProcessing(
      single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
      special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])])
  tokenizer.decoder = decoders.WordPiece()
  return tokenizer


def tiny_bert_tensors(hf_config: dict, seed: int = 0) -> dict[str, np.ndarray]:
  """Random float32 tensors of a ``BertModel`` with ``hf_config``'s sizes, by checkpoint name."""
  rng = np.random.default_rng(seed)
  hidden, inner = hf_config["hidden_size"], hf_config["intermediate_size"]

  def normal(*shape, scale=0.3):
    return (scale * rng.normal(size=shape)).astype(np.float32)

  tensors = {
      "embeddings.word_embeddings.weight": normal(hf_config["vocab_size"], hidden),
      "embeddings.position_embeddings.weight": normal(hf_config["max_position_embeddings"], hidden),
      "embeddings.token_type_embeddings.weight": normal(hf_config["type_vocab_size"], hidden),
      "embeddings.LayerNorm.weight": 1 + normal(hidden, scale=0.1),
      "embeddings.LayerNorm.bias": normal(hidden, scale=0.1),
      "embeddings.position_ids": np.arange(hf_config["max_position_embeddings"], dtype=np.int64)[None],
      "pooler.dense.weight": normal(hidden, hidden),
      "pooler.dense.bias": normal(hidden),
  }
  for index in range(hf_config["num_hidden_layers"]):
    prefix = f"encoder.layer.{index}."
    # [out, in] as PyTorch stores them; non-square where the sizes differ, so a missed transpose shows.
    for name, shape in (("attention.self.query", (hidden, hidden)), ("attention.self.key", (hidden, hidden)),
                        ("attention.self.value", (hidden, hidden)), ("attention.output.dense", (hidden, hidden)),
                        ("intermediate.dense", (inner, hidden)), ("output.dense", (hidden, inner))):
      tensors[prefix + name + ".weight"] = normal(*shape, scale=1 / math.sqrt(shape[1]))
      tensors[prefix + name + ".bias"] = normal(shape[0], scale=0.1)
    for name in ("attention.output.LayerNorm", "output.LayerNorm"):
      tensors[prefix + name + ".weight"] = 1 + normal(hidden, scale=0.1)
      tensors[prefix + name + ".bias"] = normal(hidden, scale=0.1)
  return tensors


def write_tiny_bert(folder: pathlib.Path, seed: int = 0, **sizes) -> tuple[dict, dict[str, np.ndarray]]:
  """Writes the three files of a tiny random BERT to ``folder``; returns its config and tensors."""
  folder.mkdir(parents=True, exist_ok=True)
  tokenizer = tiny_tokenizer()
  hf_config = {"model_type": "bert", "architectures": ["BertModel"], "vocab_size": tokenizer.get_vocab_size(),
               "hidden_act": "gelu", "layer_norm_eps": 1e-12, "pad_token_id": 0, "hidden_dropout_prob": 0.1,
               "attention_probs_dropout_prob": 0.1, "position_embedding_type": "absolute", **SIZES, **sizes}
  tensors = tiny_bert_tensors(hf_config, seed)
  (folder / "config.json").write_text(json.dumps(hf_config, indent=2))
  safetensors.numpy.save_file(tensors, folder / "model.safetensors")
  tokenizer.save(str(folder / "tokenizer.json"))
  return hf_config, tensors


def _layer_norm(x, weight, bias, epsilon):
  mean = x.mean(-1, keepdims=True)
  variance = ((x - mean) ** 2).mean(-1, keepdims=True)
  return (x - mean) / np.sqrt(variance + epsilon) * weight + bias


def _gelu(x):
  return x * 0.5 * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))


def numpy_bert(tensors: dict[str, np.ndarray], hf_config: dict, input_ids, token_type_ids,
               attention_mask) -> np.ndarray:
  """``BertModel(...).last_hidden_state`` in float64: ``[batch, length]`` ints -> ``[batch, length, hidden]``."""
  t = {name: np.asarray(value, np.float64) for name, value in tensors.items()}
  epsilon, heads = hf_config["layer_norm_eps"], hf_config["num_attention_heads"]
  batch, length = np.shape(input_ids)

  def linear(x, name):
    return x @ t[name + ".weight"].T + t[name + ".bias"]

  x = (t["embeddings.word_embeddings.weight"][input_ids] + t["embeddings.position_embeddings.weight"][:length]
       + t["embeddings.token_type_embeddings.weight"][token_type_ids])
  x = _layer_norm(x, t["embeddings.LayerNorm.weight"], t["embeddings.LayerNorm.bias"], epsilon)
  # Padding keys get a very negative additive score, as BertModel's extended attention mask.
  key_bias = np.where(np.asarray(attention_mask, bool), 0.0, -1e9)[:, None, None, :]
  for index in range(hf_config["num_hidden_layers"]):
    p = f"encoder.layer.{index}."

    def heads_first(y):  # [batch, length, hidden] -> [batch, heads, length, head_dim]
      return y.reshape(batch, length, heads, -1).transpose(0, 2, 1, 3)

    q, k, v = (heads_first(linear(x, p + f"attention.self.{n}")) for n in ("query", "key", "value"))
    scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(q.shape[-1]) + key_bias
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    context = (weights @ v).transpose(0, 2, 1, 3).reshape(batch, length, -1)
    x = _layer_norm(x + linear(context, p + "attention.output.dense"), t[p + "attention.output.LayerNorm.weight"],
                    t[p + "attention.output.LayerNorm.bias"], epsilon)
    hidden = _gelu(linear(x, p + "intermediate.dense"))
    x = _layer_norm(x + linear(hidden, p + "output.dense"), t[p + "output.LayerNorm.weight"],
                    t[p + "output.LayerNorm.bias"], epsilon)
  return x
