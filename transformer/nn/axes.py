"""Logical axis names of parameters and activations (flax's logical partitioning).

Every parameter says what each of its axes is, with ``with_axes`` on its initialiser, and the few activations
whose layout matters say theirs with ``with_activation_axes``; the run layer maps the names to mesh axes with one
rule table (``RunConfig.axis_rules``), so a new layer is sharded by what its axes are, never by what it is called.
``model.init`` returns the parameters boxed (``nn.LogicallyPartitioned``); ``model.apply`` accepts them boxed or
plain, and ``unboxed`` strips the names where only the arrays matter.
"""
from __future__ import annotations

import flax.linen as nn
import jax

LOGICAL_AXES = {
    "layers": "a scanned stack's layers (config.scan_layers): the leading axis of its stacked parameters",
    "vocab": "the vocabulary: embedding rows, output-layer columns",
    "embed": "the model width d_model (and an RNN's embedding width): what flows between layers",
    "heads": "the query heads' features, heads * head_dim: query projection out, output projection in",
    "kv_heads": "the key/value heads' features, kv_heads * head_dim (grouped-query attention: fewer than heads)",
    "mlp": "the feed-forward hidden width d_ff",
    "position": "the rows of a learned position table (max_length)",
    "token_types": "the rows of a token-type table",
    "rnn": "an RNN's hidden units (and an attentional RNN's attention width), as a layer writes them",
    "rnn_state": "an RNN's hidden units as a layer reads them (the recurrent kernel's rows, a next layer's input)",
    "features": "a time series' input features (or a patch's values)",
    "window": "a forecaster's input time steps",
    "outputs": "a small output head: classes or forecast horizons",
}

# Activations' names are their own (as MaxText's), so one rule table can send a parameter's model width to the
# data axis (FSDP) while the activations' batch, not their width, is what the data axis splits.
ACTIVATION_AXES = {
    "activation_batch": "the examples of a batch (beams of a search included): split as the batch is",
    "activation_length": "the positions of a sequence",
    "activation_embed": "the model width d_model of the residual stream between sublayers",
    "activation_heads": "the query heads of [batch, length, heads, head_dim] (attention queries and outputs)",
    "activation_kv_heads": "the key/value heads of [batch, length, kv_heads, head_dim]",
    "activation_mlp": "the feed-forward hidden width d_ff",
    "activation_vocab": "the vocabulary of the output logits",
}
BATCH_LENGTH = ("activation_batch", "activation_length")  # the leading axes of every sequence activation


def with_axes(init, *names: str):
  """``init`` whose parameter carries the logical axis ``names``, one per axis (each in ``LOGICAL_AXES``)."""
  unknown = [name for name in names if name not in LOGICAL_AXES]
  if unknown:
    raise ValueError(f"unknown logical axis name(s) {unknown}; use one of {sorted(LOGICAL_AXES)} "
                     "(or add the new one to transformer.nn.axes.LOGICAL_AXES with what it means).")
  return nn.with_logical_partitioning(init, names)


def with_activation_axes(x, *names: str | None):
  """``x`` constrained to the layout that the rule table in context gives the activation axis ``names``, one
  per axis of ``x`` (each in ``ACTIVATION_AXES``, or None: kept whole), e.g. ``[batch, length, heads, head_dim]``
  as ``("activation_batch", "activation_length", "activation_heads", None)``.

  The rules and mesh come from the context in which the model is traced (the run layer's ``MeshStrategy``); with
  neither, as in a plain ``model.apply``, ``x`` comes back unchanged.
  """
  unknown = [name for name in names if name is not None and name not in ACTIVATION_AXES]
  if unknown or len(names) != x.ndim:
    raise ValueError(f"activation axis names {names} for shape {x.shape}: give one per axis, each None or one of "
                     f"{sorted(ACTIVATION_AXES)} (or add a new one to transformer.nn.axes.ACTIVATION_AXES).")
  return nn.with_logical_constraint(x, names)


def unboxed(tree):
  """``tree`` with every logically partitioned parameter replaced by its array (a no-op on plain trees). Only
  the names go: flax's own unboxing also constrains each array to its layout, which under a bound mesh and rules
  (evaluation's) fails on shapes (``jax.eval_shape``) and host arrays."""
  return jax.tree.map(lambda leaf: leaf.value if isinstance(leaf, nn.Partitioned) else leaf, tree,
                      is_leaf=lambda leaf: isinstance(leaf, nn.Partitioned))


def dense_axes(inputs: str, outputs: str) -> dict:
  """Keyword arguments that name an ``nn.Dense``'s kernel ``(inputs, outputs)`` and bias ``(outputs,)``, with
  flax's default initialisers."""
  return {"kernel_init": with_axes(nn.linear.default_kernel_init, inputs, outputs),
          "bias_init": with_axes(nn.initializers.zeros_init(), outputs)}


def embed_axes(rows: str, init=nn.linear.default_embed_init) -> dict:
  """Keyword arguments that name an ``nn.Embed``'s table ``(rows, embed)``."""
  return {"embedding_init": with_axes(init, rows, "embed")}


def cell_axes(inputs: str) -> dict:
  """Keyword arguments that name a flax RNN cell's kernels (``(inputs, rnn)``, recurrent ``(rnn_state, rnn)``)
  and biases (``(rnn,)``), with the cells' default initialisers."""
  return {"kernel_init": with_axes(nn.linear.default_kernel_init, inputs, "rnn"),
          "recurrent_kernel_init": with_axes(nn.initializers.orthogonal(), "rnn_state", "rnn"),
          "bias_init": with_axes(nn.initializers.zeros_init(), "rnn")}


def split_rows(fn, *rows):
  """``fn(*rows)`` inside ``jax.jit``, with ``rows`` (arrays ``[batch, ...]`` of the same batch) split over the
  devices that the rule in effect for ``activation_batch`` names, and every output (a tree of arrays) whole on
  each device. Without such a rule (flax's ``nn.logical_axis_rules`` under ``jax.set_mesh``, which the run layer sets
  for evaluation: ``MeshStrategy.evaluating``) this is ``fn(*rows)``, placed as jit chooses.

  With the rule, one program over every process's devices decodes each device's rows with the parameters laid
  out as trained (no copy gathered), and every process can read all outputs (small: token ids, scores).
  """
  def whole(x):
    return nn.with_logical_constraint(x, (None,) * x.ndim)

  # Whole first, then split: the argument arrives replicated (as every process passes the same rows), and a
  # number of rows that the devices do not divide is split unevenly inside the program, not refused at its input.
  split = [nn.with_logical_constraint(whole(x), ("activation_batch",) + (None,) * (x.ndim - 1)) for x in rows]
  return jax.tree.map(whole, fn(*split))
