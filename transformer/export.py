r"""Export a trained model as ``jax.export`` artifacts: serialized StableHLO that JAX alone (no Flax, no
``transformer``) deserializes and runs, with the parameters beside it as a plain ``.npz``.

    python -m transformer.export WORKDIR --out DIR [--checkpoint best] [--beam-size 4] [--platforms cpu,cuda]

``DIR`` then holds ``manifest.json`` (each function's file, inputs, outputs, how to call it; special token ids),
``params.npz`` (float arrays keyed by their path, ``encoder/layer_0/self_attention/query/kernel``), one
``<function>.jax_exported`` per function and the run's recorded tokenizers (``tokenizers/<name>.model``,
SentencePiece). Serving from it (docs/export.md):

    import jax, numpy as np
    params = dict(np.load("DIR/params.npz"))
    greedy = jax.export.deserialize(open("DIR/greedy.jax_exported", "rb").read())
    tokens, log_probs = greedy.call(params, source)   # source int32 [batch, source_length], padded with 0

Exported (batch and sequence lengths symbolic: one artifact serves every shape):

- sequence-to-sequence runs (synthetic, translation): ``score`` (``log P(target | source)`` per pair, as
  ``SequenceModel.score``), ``greedy`` and ``beam`` (as ``SequenceModel.decode`` with ``beam_size`` 1 or the
  exported one), whose ``max_length`` is ``source_length + source_length // 2 + 10`` of the padded source
  (``Seq2SeqTask.default_max_length``): a function's output length can only be a function of its inputs'
  shapes, so pad the source with more columns for more room;
- the language model: ``logits`` (the forward pass) and ``greedy`` / ``beam`` continuations of prompts (as
  ``continue_texts``), of ``max_new_tokens`` fixed at export (no input's length could carry it).

Not exported: sampling, attention weights, classification and forecasting runs (refused in one line).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
from typing import Any, Callable

import jax
import numpy as np

from transformer.decode import DecodeSettings
from transformer.errors import UserError, exit_on_user_error
from transformer.inference import LanguageModel, SequenceModel, TrainedModel, load
from transformer.tasks import require_extra
from transformer.tasks.decoding import continue_prompts, search_decode
from transformer.tasks.seq2seq import sequence_log_probs

MANIFEST_FILE, PARAMS_FILE, TOKENIZERS_FOLDER = "manifest.json", "params.npz", "tokenizers"
ARTIFACT_EXTENSION = ".jax_exported"
FORMAT_VERSION = 1
DEFAULT_PLATFORMS = ("cpu", "cuda")
SUPPORTED = ("sequence-to-sequence runs (config.task.name 'synthetic', 'translation') and language models "
             "('language_model')")
PATH_SEPARATOR = "/"


@dataclasses.dataclass(frozen=True)
class Function:
  """One function to export: ``fn(params, *inputs)`` with ``inputs`` ``(name, shape, dtype)``, each shape a
  string of ``jax.export.symbolic_shape`` (``"batch, source_length"``), and what ``fn`` returns."""
  name: str
  fn: Callable
  inputs: tuple[tuple[str, str, str], ...]
  outputs: tuple[str, ...]
  description: str
  constraints: tuple[str, ...] = ()  # on the symbolic dimensions, jax.export.symbolic_shape's


def flatten_params(params) -> dict[str, np.ndarray]:
  """The nested parameter dict as ``{"a/b/c": host array}``, the layout of ``params.npz`` and of every exported
  function's first argument."""
  flat = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    keys = [str(getattr(entry, "key", entry)) for entry in path]
    if any(PATH_SEPARATOR in key for key in keys):
      raise ValueError(f"parameter {keys} has {PATH_SEPARATOR!r} in a name; it cannot be keyed by its path.")
    flat[PATH_SEPARATOR.join(keys)] = np.asarray(leaf)
  return flat


def unflatten_params(flat: dict[str, Any]) -> dict:
  """``flatten_params`` undone: the nested dict the Flax module's ``apply`` takes."""
  nested: dict = {}
  for path, leaf in flat.items():
    *parents, name = path.split(PATH_SEPARATOR)
    node = nested
    for parent in parents:
      node = node.setdefault(parent, {})
    node[name] = leaf
  return nested


def beam_settings(model: TrainedModel, beam_size: int) -> DecodeSettings:
  """The run's ``config.decode`` as a beam search of ``beam_size`` (its length penalty and finish rule kept)."""
  return dataclasses.replace(model.task.settings.decode, method="beam", beam_size=beam_size)


def position_limits(config, *lengths: str) -> tuple[str, ...]:
  """Constraints ``length <= config.max_length`` on each of ``lengths`` (expressions of symbolic dimensions) for
  a model of learned positions, whose table has ``max_length`` rows (a longer input is refused there, where
  checking it needs them); none for computed positions (sinusoidal, rotary), which take any length."""
  if getattr(config, "positional_encoding", None) != "learned":
    return ()
  return tuple(f"{length} <= {config.max_length}" for length in lengths)


# Seq2SeqTask.default_max_length of a symbolic length (int(1.5 * n) == n + n // 2 for n >= 0).
DECODE_LENGTH = "source_length + floordiv(source_length, 2) + 10"


def seq2seq_functions(model: SequenceModel, beam_size: int) -> list[Function]:
  """``score``, ``greedy`` and (``beam_size`` > 0) ``beam`` of a sequence-to-sequence model."""
  config = model.model_config.replace(deterministic=True)
  source = ("source", "batch, source_length", "int32")
  decode_limits = position_limits(config, DECODE_LENGTH)

  def max_length(source):  # DECODE_LENGTH
    return source.shape[1] + source.shape[1] // 2 + 10

  def score(flat, source, target):
    return sequence_log_probs(config, unflatten_params(flat), source, target)

  def greedy(flat, source):
    sequences, log_probs = search_decode(config, unflatten_params(flat), source, max_length(source),
                                         DecodeSettings("greedy"))
    return sequences[:, 0], log_probs[:, 0]

  functions = [
      Function("score", score, (source, ("target", "batch, target_length", "int32")),
               ("log_prob float32 [batch]",),
               "log P(target | source) of each pair under teacher forcing, summed over the target's non-padding "
               "tokens (EOS included): SequenceModel.score. Per-token NLL: -log_prob / target tokens.",
               position_limits(config, "source_length", "target_length")),
      Function("greedy", greedy, (source,),
               ("tokens int32 [batch, max_length]", "log_prob float32 [batch]"),
               "greedy decoding: SequenceModel.decode(sources, beam_size=1). max_length = source_length + "
               "source_length // 2 + 10; each row holds its tokens up to and including EOS, then pad_id.",
               decode_limits)]
  if beam_size:
    settings = beam_settings(model, beam_size)

    def beam(flat, source):
      return search_decode(config, unflatten_params(flat), source, max_length(source), settings)

    functions.append(Function(
        "beam", beam, (source,),
        (f"tokens int32 [batch, {beam_size}, max_length]", f"scores float32 [batch, {beam_size}]"),
        f"beam search (beam_size={beam_size}, length_penalty={settings.length_penalty}, finish_rule="
        f"{settings.finish_rule!r}), every beam, best first: [:, 0] is SequenceModel.decode(sources, "
        f"beam_size={beam_size}). max_length as greedy's.", decode_limits))
  return functions


def language_model_functions(model: LanguageModel, beam_size: int, max_new_tokens: int) -> list[Function]:
  """``logits``, ``greedy`` and (``beam_size`` > 0) ``beam`` continuations of a decoder-only language model."""
  config = model.model_config.replace(deterministic=True)
  network = model.task.build_model(config)
  prompt = (("prompt", "batch, prompt_length", "int32"), ("prompt_lengths", "batch", "int32"))
  decode_limits = position_limits(config, f"prompt_length + {max_new_tokens}")

  def logits(flat, tokens):
    return network.apply({"params": unflatten_params(flat)}, tokens)

  def continuations(settings):
    def fn(flat, prompt, prompt_lengths):
      return continue_prompts(config, unflatten_params(flat), prompt, prompt_lengths, max_new_tokens, settings)
    return fn

  greedy = continuations(DecodeSettings("greedy"))
  prompt_note = (f"prompt: row b's first prompt_lengths[b] tokens real (no BOS, no EOS), prompt_length >= 1; "
                 f"max_new_tokens={max_new_tokens} fixed at export")
  functions = [
      Function("logits", logits, (("tokens", "batch, length", "int32"),),
               ("logits float32 [batch, length, vocab]",),
               "the forward pass: logits[:, i] predicts tokens[:, i] from the ones before it (BOS prepended "
               "inside the model), as in training.", position_limits(config, "length")),
      Function("greedy", lambda flat, p, n: tuple(x[:, 0] for x in greedy(flat, p, n)), prompt,
               (f"tokens int32 [batch, {max_new_tokens}]", "log_prob float32 [batch]"),
               f"greedy continuation (LanguageModel.continue_texts with config.decode.method='greedy'), EOS "
               f"included, then pad_id; {prompt_note}.", decode_limits)]
  if beam_size:
    settings = beam_settings(model, beam_size)
    functions.append(Function(
        "beam", continuations(settings), prompt,
        (f"tokens int32 [batch, {beam_size}, {max_new_tokens}]", f"scores float32 [batch, {beam_size}]"),
        f"beam search (beam_size={beam_size}, length_penalty={settings.length_penalty}), every beam, best "
        f"first; {prompt_note}.", decode_limits))
  return functions


def export_functions(model: TrainedModel, beam_size: int, max_new_tokens: int | None) -> list[Function]:
  """The functions of ``model`` to export; a UserError naming what is supported for any other kind of run."""
  if isinstance(model, SequenceModel):
    return seq2seq_functions(model, beam_size)
  if isinstance(model, LanguageModel):
    default = model.task.task_config.max_length  # continue_texts' default
    return language_model_functions(model, beam_size, default if max_new_tokens is None else max_new_tokens)
  raise UserError(f"cannot export the run in {model.workdir!r}: it trained config.task.name="
                  f"{model.run_config.task.name!r} (a {type(model).__name__}); export supports {SUPPORTED}.")


def export_function(function: Function, params: dict[str, np.ndarray], platforms: tuple[str, ...]):
  """``function`` traced with its inputs' dimensions symbolic (one scope for all of them, so ``batch`` is one
  dimension) and lowered for ``platforms``: a ``jax.export.Exported``."""
  names = [name for _, shape, _ in function.inputs for name in shape.replace(" ", "").split(",")]
  unique = list(dict.fromkeys(names))
  dims = dict(zip(unique, jax.export.symbolic_shape(", ".join(unique), constraints=function.constraints)))
  args = [jax.ShapeDtypeStruct(tuple(dims[n] for n in shape.replace(" ", "").split(",")), np.dtype(dtype))
          for _, shape, dtype in function.inputs]
  param_specs = {path: jax.ShapeDtypeStruct(array.shape, array.dtype) for path, array in params.items()}
  return jax.export.export(jax.jit(function.fn), platforms=platforms)(param_specs, *args)


def _describe(function: Function, exported) -> dict:
  inputs = ", ".join(name for name, _, _ in function.inputs)
  return {
      "file": function.name + ARTIFACT_EXTENSION,
      "description": function.description,
      "call": f"jax.export.deserialize(bytes).call(params, {inputs}) -> ({', '.join(o.split()[0] for o in function.outputs)})",
      "inputs": [{"name": "params", "shape": "dict of params.npz", "dtype": "float32"}]
                + [{"name": name, "shape": [d.strip() for d in shape.split(",")], "dtype": dtype}
                   for name, shape, dtype in function.inputs],
      "outputs": list(function.outputs),
      "traced_outputs": [str(aval) for aval in exported.out_avals],
      "constraints": list(function.constraints),
  }


def check_out(out: str) -> None:
  """A UserError unless ``out`` is absent or an empty folder: an export never mixes with earlier files."""
  if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
    raise UserError(f"--out {out!r} exists and is not an empty folder; give a new folder (or remove it).")


def export_model(workdir: str, out: str, checkpoint: str | int = "best", beam_size: int | None = None,
                 max_new_tokens: int | None = None, platforms: tuple[str, ...] = DEFAULT_PLATFORMS) -> dict:
  """Writes the export of the run in ``workdir`` into the new folder ``out`` (see the module docstring) and
  returns its manifest.

  Args:
    checkpoint: as ``transformer.load``'s (``"best"``, ``"latest"`` or a step).
    beam_size: of the exported beam search; None: the run's ``config.decode.beam_size``; 0: no beam search.
    max_new_tokens: the language model's continuation length; None: the run's ``config.task.max_length``.
    platforms: what the artifacts are lowered for (``jax.export``'s ``platforms``).

  Raises:
    UserError: ``out`` is not new, the workdir holds no run or checkpoint, or its task is not exported.
  """
  check_out(out)
  require_extra("export", "exporting a model")  # jax.export's serialization needs flatbuffers
  model = load(workdir, checkpoint=checkpoint)
  beam_size = model.task.settings.decode.beam_size if beam_size is None else beam_size
  if beam_size < 0 or (max_new_tokens is not None and max_new_tokens < 1):
    raise UserError(f"--beam-size must be >= 0 (0: no beam search), --max-new-tokens >= 1; got {beam_size}, "
                    f"{max_new_tokens}.")
  functions = export_functions(model, beam_size, max_new_tokens)
  params = flatten_params(model.params)
  exported = {function.name: export_function(function, params, tuple(platforms)) for function in functions}

  os.makedirs(out, exist_ok=True)
  np.savez(os.path.join(out, PARAMS_FILE), **params)
  for name, artifact in exported.items():
    with open(os.path.join(out, name + ARTIFACT_EXTENSION), "wb") as f:
      f.write(artifact.serialize())
  tokenizer_files = {}
  for name, tokenizer in sorted(model.task.trained_tokenizers().items()):
    os.makedirs(os.path.join(out, TOKENIZERS_FOLDER), exist_ok=True)
    tokenizer_files[name] = os.path.join(TOKENIZERS_FOLDER, f"{name}.model")
    shutil.copyfile(tokenizer.path, os.path.join(out, tokenizer_files[name]))
  config = model.model_config.replace(deterministic=True)  # as exported
  manifest = {
      "format_version": FORMAT_VERSION,
      "workdir": os.path.abspath(workdir), "task": model.run_config.task.name, "model_type": type(model).__name__,
      "model_name": model.run_config.model_name, "steps": model.steps,
      "jax_version": jax.__version__, "platforms": list(platforms),
      "special_ids": {"pad_id": config.pad_id, "bos_id": config.bos_id, "eos_id": config.eos_id},
      "vocab_size": getattr(config, "vocab_size", None),
      "target_vocab_size": getattr(config, "target_vocab_size", None) or getattr(config, "vocab_size", None),
      "model_config": {field.name: getattr(config, field.name) for field in dataclasses.fields(config)},
      "params": {"file": PARAMS_FILE, "arrays": len(params),
                 "how": "params = dict(np.load('params.npz')): every function's first argument"},
      "tokenizers": tokenizer_files,
      "functions": {function.name: _describe(function, exported[function.name]) for function in functions},
  }
  with open(os.path.join(out, MANIFEST_FILE), "w", encoding="utf-8") as f:
    json.dump(manifest, f, indent=2, default=str)
    f.write("\n")
  return manifest


def _checkpoint(text: str) -> str | int:
  return int(text) if text.isdigit() else text


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(prog="python -m transformer.export", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
  parser.add_argument("workdir", metavar="WORKDIR", help="a training run's --workdir")
  parser.add_argument("--out", required=True, help="folder to write (new or empty)")
  parser.add_argument("--checkpoint", type=_checkpoint, default="best", help="best, latest or a step number")
  parser.add_argument("--beam-size", type=int, default=None,
                      help="beam of the exported beam search (default: the run's config.decode.beam_size; 0: none)")
  parser.add_argument("--max-new-tokens", type=int, default=None,
                      help="language models: continuation length (default: the run's config.task.max_length)")
  parser.add_argument("--platforms", default=",".join(DEFAULT_PLATFORMS),
                      help="comma-separated platforms to lower for (cpu, cuda, rocm, tpu)")
  args = parser.parse_args(argv)
  platforms = tuple(p for p in args.platforms.split(",") if p)
  manifest = exit_on_user_error(export_model, args.workdir, args.out, args.checkpoint, args.beam_size,
                                args.max_new_tokens, platforms)
  print(f"wrote {args.out}: {', '.join(manifest['functions'])} ({', '.join(platforms)}), "
        f"{manifest['params']['arrays']} parameter arrays, tokenizers: {list(manifest['tokenizers']) or 'none'}",
        file=sys.stderr)


if __name__ == "__main__":
  main()
