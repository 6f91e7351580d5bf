"""Backend-tuned implementations of the ops' inner pieces, and the one function that picks them.

Every op in ``transformer.ops`` is written as its formula (``jnp.einsum``, ``jax.nn.softmax``, dropout by
``jax.random.bernoulli``): that is the reference path, and what an op computes when called without
``kernels``. A ``Kernels`` value swaps faster versions into six places; each is equal to the formula in
value and gradient (to float rounding), except the 8-bit dropout, which draws its mask differently.

    kernels = select_kernels(config.kernels)            # "auto" or "reference"; at trace time
    out = dot_product_attention(q, k, v, mask=mask, kernels=kernels)

``select_kernels("auto")`` picks by platform: on CPU ``XLA_CPU`` (the XLA:CPU pieces below), on an NVIDIA GPU
``CUDNN`` (cuDNN's fused attention where ``fused_attention_blocker`` finds nothing against it, the formula
elsewhere), on anything else the reference. ``attention_chunk_size`` adds the memory-efficient implementation
(``chunked.py``), which ``attention.attend`` takes wherever nothing needs the weights. A model resolves its
choice once, on its config (``ModelConfig.resolved_kernels``). Why each piece exists, with the measurements:
benchmarks/FINDINGS.md#why-these-kernels.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Callable, Optional

import jax
import jax.numpy as jnp

KERNEL_SETTINGS = ("auto", "reference")


@dataclasses.dataclass(frozen=True)
class Kernels:
  """Which implementation each tunable piece of the ops uses; ``None`` means the formula.

  Shapes as in ``attention.py``: queries ``[batch, q_length, heads, head_dim]``, keys and values
  ``[batch, kv_length, heads, head_dim]``, logits and weights ``[batch, heads, q_length, kv_length]``.
  """
  name: str
  # (query, key, precision, preferred_element_type) -> logits; replaces einsum "bqhd,bkhd->bhqk"
  query_key_product: Optional[Callable] = None
  # (weights, value, precision) -> output; replaces einsum "bhqk,bkhd->bqhd"
  weights_value_product: Optional[Callable] = None
  # (float logits, dtype) -> softmax over the last axis, in dtype; replaces jax.nn.softmax
  softmax: Optional[Callable] = None
  # x -> x, identity in value and gradient, applied to a norm's input
  norm_input: Optional[Callable] = None
  # (x, rate, rng, broadcast_dims) -> inverted dropout of x; replaces the bernoulli mask
  dropout: Optional[Callable] = None
  # (query, key, value, mask, scale) -> output of a whole attention call, used where
  # fused_attention_blocker finds nothing against it
  attention: Optional[Callable] = None
  # block size of the memory-efficient attention (chunked.py) that attention.attend uses where it can;
  # None: dense attention
  attention_chunk_size: Optional[int] = None


# ----------------------------------------------------------------------------------------- XLA:CPU pieces


@jax.custom_vjp
def gradient_barrier(x):
  """Identity whose gradient is computed once, as a whole array, before anything uses it.

  Why: XLA:CPU fuses a norm's element-wise backward into every consumer of its cotangent and so recomputes
  the residual stream's gradient from the top of the stack in each layer (quadratic in depth);
  ``lax.optimization_barrier`` on the cotangent stops that fusion.

  Args:
    x: any array, e.g. ``[batch, length, d_model]``.

  Returns:
    ``x`` unchanged; its gradient is also unchanged.
  """
  return x


def _gradient_barrier_forward(x):
  return x, None


def _gradient_barrier_backward(_, cotangent):
  return (jax.lax.optimization_barrier(cotangent),)


gradient_barrier.defvjp(_gradient_barrier_forward, _gradient_barrier_backward)


def materialized_transpose(x):
  """``x`` ``[..., m, n]`` -> ``[..., n, m]``, written out as a new array rather than folded into its consumer.

  Why: XLA folds a transpose into the dot that consumes it, and XLA:CPU runs a dot that contracts its left
  operand's second-to-last axis on its slower Eigen path instead of YNNPACK.
  """
  return jax.lax.optimization_barrier(jnp.swapaxes(x, -1, -2))


def batched_matmul(a, b, precision=None, preferred_element_type=None):
  """``a @ b`` over the last two axes, ``[..., m, n] x [..., n, p] -> [..., m, p]``, whose backward is plain matmuls.

  Why: autodiff's gradient of ``b``, ``a^T g``, contracts ``a``'s second-to-last axis (XLA:CPU's slow path);
  here the smaller of ``a`` and ``g`` is transposed first (``materialized_transpose``). When ``a`` and ``b``
  share a 16-bit dtype the cotangent is rounded to it before the backward's matmuls, which accumulate in
  float32 (as FlashAttention-2 rounds its ``dS``). One row (``m = 1``, an RNN decoder step inside a scan) is
  plain autodiff: a custom VJP would stack a loop-invariant ``b`` into the scan's residuals at every step.
  """
  if a.shape[:-2] != b.shape[:-2] or a.shape[-1] != b.shape[-2]:
    raise ValueError(f"batched_matmul: shapes {a.shape} and {b.shape} are not [..., m, n] and [..., n, p] with "
                     "the same leading axes")
  if a.shape[-2] == 1:
    return jnp.einsum("...mn,...np->...mp", a, b, precision=precision,
                      preferred_element_type=preferred_element_type)
  return _batched_matmul(a, b, precision, preferred_element_type)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _batched_matmul(a, b, precision, preferred_element_type):
  return jnp.matmul(a, b, precision=precision, preferred_element_type=preferred_element_type)


def _batched_matmul_forward(a, b, precision, preferred_element_type):
  return _batched_matmul(a, b, precision, preferred_element_type), (a, b)


def _batched_matmul_backward(precision, preferred_element_type, residuals, cotangent):
  del preferred_element_type
  a, b = residuals
  operands_dtype = jnp.promote_types(a.dtype, b.dtype)
  if jnp.finfo(operands_dtype).bits < 32:
    cotangent = cotangent.astype(operands_dtype)
  accumulate = jnp.promote_types(operands_dtype, jnp.float32)
  matmul = functools.partial(jnp.matmul, precision=precision, preferred_element_type=accumulate)
  a_cotangent = matmul(cotangent, jnp.swapaxes(b, -1, -2))  # contracts the last axis of both: a plain dot
  if a.size <= cotangent.size:
    b_cotangent = matmul(materialized_transpose(a), cotangent)
  else:  # (g^T a)^T: transposes g and the [n, p] result instead of the large a
    b_cotangent = jnp.swapaxes(matmul(materialized_transpose(cotangent), a), -1, -2)
  return a_cotangent.astype(a.dtype), b_cotangent.astype(b.dtype)


_batched_matmul.defvjp(_batched_matmul_forward, _batched_matmul_backward)


def heads_first_query_key_product(query, key, precision=None, preferred_element_type=None):
  """``einsum("bqhd,bkhd->bhqk")`` as a plain batched matmul over ``[batch * heads]``.

  Why: with heads moved next to batch XLA:CPU runs one batched matmul instead of choosing strided layouts,
  and ``batched_matmul`` keeps the backward's dots on the fast path. One query (an RNN decoder step) stays
  an einsum, which keeps the key's transpose folded into the dot inside a scan.
  """
  query, key = jnp.swapaxes(query, 1, 2), jnp.swapaxes(key, 1, 2)  # [batch, heads, length, head_dim]
  if query.shape[2] == 1:
    return jnp.einsum("bhqd,bhkd->bhqk", query, key, precision=precision,
                      preferred_element_type=preferred_element_type)
  return batched_matmul(query, jnp.swapaxes(key, -1, -2), precision=precision,
                        preferred_element_type=preferred_element_type)


def heads_first_weights_value_product(weights, value, precision=None):
  """``einsum("bhqk,bkhd->bqhd")`` as a batched matmul over ``[batch * heads]`` (why: as the logits')."""
  return jnp.swapaxes(batched_matmul(weights, jnp.swapaxes(value, 1, 2), precision=precision), 1, 2)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _softmax_saved_in(logits, dtype):
  return jax.nn.softmax(logits.astype(jnp.float32), axis=-1).astype(dtype)


def _softmax_forward(logits, dtype):
  weights = _softmax_saved_in(logits, dtype)
  return weights, weights


def _softmax_backward(dtype, weights, weights_cotangent):
  del dtype
  weights = weights.astype(jnp.float32)
  weights_cotangent = weights_cotangent.astype(jnp.float32)
  return (weights * (weights_cotangent - jnp.sum(weights * weights_cotangent, axis=-1, keepdims=True)),)


_softmax_saved_in.defvjp(_softmax_forward, _softmax_backward)


def softmax_saved_in_output_dtype(logits, dtype):
  """``softmax(logits)`` over the last axis, computed in float32, returned in ``dtype``.

  Why: for float32 logits and 16-bit weights, autodiff would keep the float32 weights for the backward; this
  keeps the ``dtype`` ones (half the bytes written and read) and computes ``w * (g - sum(w g))`` in float32.
  Otherwise it is ``jax.nn.softmax``.
  """
  if logits.dtype == jnp.float32 and jnp.finfo(dtype).bits < 32:
    return _softmax_saved_in(logits, dtype)
  return jax.nn.softmax(logits, axis=-1)


# Masks are drawn as 8-bit random integers, four per 32-bit draw (see random_bytes): a quarter of the
# threefry work of a float32 uniform draw. The drop probability is therefore ``rate`` rounded to a
# multiple of 1/256; the survivors are scaled by that rounded probability, so the expectation is kept.
_MASK_LEVELS = 256


def random_bytes(rng, shape):
  """Uniform ``uint8`` of ``shape``, cut from 32-bit random words: one threefry evaluation per 4 bytes.

  ``jax.random.bits(rng, shape, jnp.uint8)`` evaluates threefry once per *element* when
  ``jax_threefry_partitionable`` is on (the default), so asking for bytes alone saves nothing.
  Words are drawn along the last axis (when it divides by 4), so the bytes keep the mask's layout.
  """
  shape = tuple(shape)
  if not shape or shape[-1] % 4:
    return jax.random.bits(rng, shape, jnp.uint8)
  words = jax.random.bits(rng, shape[:-1] + (shape[-1] // 4,), jnp.uint32)
  return jax.lax.bitcast_convert_type(words, jnp.uint8).reshape(shape)  # [..., n // 4, 4] -> [..., n]


def effective_dropout_rate(rate: float) -> float:
  """The drop probability ``byte_mask_dropout`` applies for ``rate``: the nearest multiple of 1/256 (within
  0.002; 0.3 becomes 0.30078125). The reference dropout applies ``rate`` itself."""
  return round(rate * _MASK_LEVELS) / _MASK_LEVELS


def byte_mask_dropout(x, rate: float, rng, broadcast_dims=()):
  """Inverted dropout with 8-bit masks, at ``effective_dropout_rate(rate)`` (below 1/512 nothing is dropped).

  Why: a quarter of the random bits of a float draw; dropout's random bits were a visible share of the CPU
  train step. Arguments as ``ops.dropout``, which checks them.
  """
  threshold = round(rate * _MASK_LEVELS)
  if threshold == 0:
    return x
  mask_shape = tuple(1 if axis in broadcast_dims else size for axis, size in enumerate(x.shape))
  with jax.named_scope("dropout"):  # names its ops in compiled HLO and profiles (benchmarks/step_profile.py)
    keep = random_bytes(rng, mask_shape) >= jnp.uint8(threshold)
    scale = _MASK_LEVELS / (_MASK_LEVELS - threshold)
    return jnp.where(keep, x * jnp.asarray(scale, x.dtype), jnp.zeros((), x.dtype))


# ------------------------------------------------------------------------------------------- GPU pieces

# cuDNN's flash attention (jax.nn.dot_product_attention, implementation="cudnn") takes 16-bit inputs and a
# head size that is a multiple of 8, up to 128 on every GPU it supports (256 from Hopper on).
_CUDNN_DTYPES = (jnp.float16, jnp.bfloat16)
_CUDNN_MAX_HEAD_DIM = 128


def fused_attention_blocker(query, key, value, *, mask=None, bias=None, dropout_rate: float = 0.0,
                            return_weights: bool = False, precision=None) -> str | None:
  """Why cuDNN's fused attention cannot compute this ``dot_product_attention`` call, or None when it can.

  Arguments as ``attention.dot_product_attention``. The fused kernel never forms the weights, draws no
  dropout through ``jax.nn``, takes 16-bit inputs of one dtype, equal query and value head sizes that are
  multiples of 8 up to 128, and, with a mask (given to cuDNN as a bias), even lengths when differentiated.
  """
  if return_weights:
    return "the attention weights are requested"
  if dropout_rate > 0.0:
    return "attention dropout needs the weights"
  if bias is not None:
    return "a bias is given"
  if precision is not None:
    return "a matmul precision is given"
  dtypes = {jnp.dtype(x.dtype) for x in (query, key, value)}
  if len(dtypes) != 1 or dtypes.pop() not in {jnp.dtype(d) for d in _CUDNN_DTYPES}:
    return f"cuDNN needs float16 or bfloat16 inputs of one dtype, got {query.dtype}, {key.dtype}, {value.dtype}"
  head_dim = query.shape[-1]
  if head_dim != value.shape[-1] or head_dim % 8 or head_dim > _CUDNN_MAX_HEAD_DIM:
    return (f"cuDNN needs equal query and value head sizes, multiples of 8 up to {_CUDNN_MAX_HEAD_DIM}; got "
            f"{head_dim} and {value.shape[-1]}")
  if mask is not None and (query.shape[1] % 2 or key.shape[1] % 2):
    return f"a mask needs even lengths in cuDNN's backward, got {query.shape[1]} and {key.shape[1]}"
  return None


def cudnn_attention(query, key, value, mask, scale: float):
  """``jax.nn.dot_product_attention(implementation="cudnn")`` with this package's mask contract.

  Why: one fused kernel, never writing the ``[batch, heads, q_length, kv_length]`` weights to memory.
  A query row whose keys are all masked returns 0 (as ``attention_weights``): it is given every key, so
  the kernel's softmax statistics stay finite, and its output and gradient are zeroed.
  """
  attend = functools.partial(jax.nn.dot_product_attention, scale=scale, implementation="cudnn")
  if mask is None:
    return attend(query, key, value)
  q_length, kv_length = query.shape[1], key.shape[1]
  mask = jnp.broadcast_to(mask, (*mask.shape[:2], q_length, kv_length))  # cuDNN's bias spans both lengths
  sees_a_key = jnp.any(mask, axis=-1, keepdims=True)  # [batch, heads, q_length, 1]
  output = attend(query, key, value, mask=mask | ~sees_a_key)  # [batch, q_length, heads, head_dim]
  return jnp.where(jnp.swapaxes(sees_a_key, 1, 2), output, jnp.zeros((), output.dtype))


# ------------------------------------------------------------------------------------------- selection

REFERENCE = Kernels(name="reference")
XLA_CPU = Kernels(name="xla_cpu", query_key_product=heads_first_query_key_product,
                  weights_value_product=heads_first_weights_value_product,
                  softmax=softmax_saved_in_output_dtype, norm_input=gradient_barrier, dropout=byte_mask_dropout)
CUDNN = Kernels(name="cudnn", attention=cudnn_attention)


def current_platform() -> str:
  """The platform jit compiles for now: "cpu", "gpu" (CUDA), "rocm", "tpu", ..."""
  platform = jax.default_backend()
  if platform == "gpu" and "rocm" in jax.devices()[0].client.platform_version.lower():
    return "rocm"
  return platform


def select_kernels(setting: str = "auto", platform: str | None = None,
                   attention_chunk_size: int | None = None) -> Kernels:
  """The implementations for ``setting`` (``ModelConfig.kernels``) on ``platform`` (default: the current one).

  "reference": the formula everywhere. "auto": ``XLA_CPU`` on "cpu", ``CUDNN`` on "gpu"/"cuda",
  ``REFERENCE`` elsewhere. ``attention_chunk_size``: attention in blocks of this many queries and keys where
  ``attention.attend`` can (``ModelConfig.attention_implementation="chunked"``); None: dense.
  """
  if setting not in KERNEL_SETTINGS:
    raise ValueError(f"kernels={setting!r} is not supported; choose one of {list(KERNEL_SETTINGS)}.")
  if setting == "reference":
    kernels = REFERENCE
  else:
    platform = current_platform() if platform is None else platform
    kernels = XLA_CPU if platform == "cpu" else CUDNN if platform in ("gpu", "cuda") else REFERENCE
  if attention_chunk_size is None:
    return kernels
  return dataclasses.replace(kernels, name=f"{kernels.name}+chunked", attention_chunk_size=attention_chunk_size)
