"""Independent numpy (float64) implementations of the Transformer layers, read off the paper.

They take the weights from a Flax params tree but share no code with ``transformer``: the tests in this
folder compare the modules against them.
"""
import flax.linen as nn
import jax
import numpy as np


def as_numpy(tree):
  """Flax params (nested dicts of arrays, boxed with logical axis names or not) -> nested dicts of float64
  numpy arrays."""
  tree = nn.meta.unbox(tree)
  if isinstance(tree, dict) or hasattr(tree, "items"):
    return {name: as_numpy(value) for name, value in tree.items()}
  return np.asarray(tree, np.float64)


def perturbed_params(module, *args, seed=0, **kwargs):
  """Initialised params plus noise, so zero biases and unit gains cannot hide a mistake."""
  params = nn.meta.unbox(module.init(jax.random.key(seed), *args, **kwargs)["params"])
  leaves, tree = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.key(seed + 1), len(leaves))
  return jax.tree.unflatten(tree, [leaf + 0.3 * jax.random.normal(k, leaf.shape) for leaf, k in zip(leaves, keys)])


def layer_norm(x, params, epsilon):
  mean = x.mean(-1, keepdims=True)
  variance = ((x - mean) ** 2).mean(-1, keepdims=True)
  return (x - mean) / np.sqrt(variance + epsilon) * params["scale"] + params["bias"]


def rms_norm(x, params, epsilon):
  return x / np.sqrt((x ** 2).mean(-1, keepdims=True) + epsilon) * params["scale"]


def rotate(x, positions):
  """Rotary embedding: pair (i, i + d/2) of ``x [length, d]`` turned by ``position * 10000^(-2i/d)``."""
  half = x.shape[-1] // 2
  angles = positions[:, None] * 10000.0 ** (-2.0 * np.arange(half) / x.shape[-1])
  first, second = x[:, :half], x[:, half:]
  return np.concatenate([first * np.cos(angles) - second * np.sin(angles),
                         first * np.sin(angles) + second * np.cos(angles)], axis=-1)


def multi_head_attention(params, inputs_q, inputs_kv, query_valid, key_valid, num_heads, causal=False,
                         rotary=False):
  """Concat(head_1..head_h) W^O with head_i = softmax(Q_i K_i^T / sqrt(d_k)) V_i, one example at a time.

  Queries with no visible key give zeros before ``W^O`` (so the output there is the output bias).
  """
  batch, q_length, _ = inputs_q.shape
  kv_length = inputs_kv.shape[1]
  features = params["query_kernel"].shape[1]
  head_dim = features // num_heads
  output = np.zeros((batch, q_length, features))
  for b in range(batch):
    query = inputs_q[b] @ params["query_kernel"] + params["query_bias"]
    key = inputs_kv[b] @ params["key_kernel"] + params["key_bias"]
    value = inputs_kv[b] @ params["value_kernel"] + params["value_bias"]
    for h in range(num_heads):
      heads = slice(h * head_dim, (h + 1) * head_dim)
      q, k, v = query[:, heads], key[:, heads], value[:, heads]
      if rotary:
        q, k = rotate(q, np.arange(q_length)), rotate(k, np.arange(kv_length))
      for i in range(q_length):
        visible = [j for j in range(kv_length)
                   if query_valid[b, i] and key_valid[b, j] and (not causal or j <= i)]
        if not visible:
          continue
        logits = np.array([q[i] @ k[j] / np.sqrt(head_dim) for j in visible])
        weights = np.exp(logits - logits.max())
        weights /= weights.sum()
        output[b, i, heads] = weights @ v[visible]
  return output @ params["output_kernel"] + params["output_bias"]


def feed_forward(params, x, activation="relu"):
  assert activation == "relu"
  return np.maximum(x @ params["kernel_in"] + params["bias_in"], 0.0) @ params["kernel_out"] + params["bias_out"]


def encoder_layer(params, x, valid, num_heads, norm_position="post", norm=layer_norm, epsilon=1e-6):
  """Post-LN: ``LN(x + Sublayer(x))`` (paper section 5.4); pre-LN: ``x + Sublayer(LN(x))``."""
  attention = lambda h: multi_head_attention(params["self_attention"], h, h, valid, valid, num_heads)
  ffn = lambda h: feed_forward(params["feed_forward"], h)
  attention_norm = lambda h: norm(h, params["attention_norm"], epsilon)
  feed_forward_norm = lambda h: norm(h, params["feed_forward_norm"], epsilon)
  if norm_position == "post":
    x = attention_norm(x + attention(x))
    return feed_forward_norm(x + ffn(x))
  x = x + attention(attention_norm(x))
  return x + ffn(feed_forward_norm(x))
