r"""Attention heatmaps of a trained translation model, with a generated README index.

    python -m experiments.attention_plots --config=experiments/multi30k.py:transformer_small \
        --workdir=/tmp/multi30k_small --output_dir=experiments/multi30k/attention --num_sentences=3 \
        [--split=test_2016_flickr] [--checkpoint=best] [--config.task.source_dir=...]

Loads the run with ``transformer.load`` (the latest checkpoint, or ``--checkpoint=best``), decodes the first
``--num_sentences`` of ``--split`` (the config's beam search, or ``--beam_size``), then plots the model's
teacher-forced attention weights on (source, hypothesis) (``TrainedModel.attention_weights``):

* Transformer: ``<split>_<i>_encoder_self_layer<l>.png``, ``..._decoder_self_layer<l>.png`` and
  ``..._cross_layer<l>.png``, one panel per head plus the head average; layers numbered from 0 as in the
  parameter tree (``layer_0``).
* RNN encoder-decoder: ``<split>_<i>_alignment.png``, the single-head alignment of Bahdanau/Luong attention.

Rows (queries) are the hypothesis pieces the decoder outputs (``</s>`` included): row ``t`` is the attention
used to produce piece ``t``. Columns (keys) are the source pieces for encoder and cross attention, and the
decoder *inputs* (``<s>`` then the hypothesis shifted right) for decoder self attention, which is therefore
lower-triangular. Padding is cropped away: every row sums to 1 over the plotted keys.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sys

import numpy as np

KINDS = ("encoder_self", "decoder_self", "cross", "alignment")
# File names this script writes (see ``plot_sentence``): older ones it did not write again are removed.
PLOT_NAME = re.compile(r".+_\d+_((encoder_self|decoder_self|cross)_layer\d+|alignment)\.png")


@dataclasses.dataclass
class SentenceAttention:
  """One sentence's attention maps and what labels them.

  Attributes:
    index: the sentence's position in its split.
    source_text, reference_text, hypothesis_text: raw source, reference and detokenised hypothesis.
    source_pieces: SentencePiece pieces of the source, ``</s>`` included (the encoder's positions).
    target_pieces: pieces of the hypothesis, ``</s>`` included (the decoder's outputs, the query axis).
    maps: ``(kind, layer)`` -> float32 ``[heads, q_length, kv_length]`` weights cropped to the real lengths;
      ``kind`` is one of ``KINDS``, ``layer`` None for the RNN alignment.
    files: the PNG file names written for this sentence (relative to the output folder).
  """
  index: int
  source_text: str
  reference_text: str
  hypothesis_text: str
  source_pieces: list[str]
  target_pieces: list[str]
  maps: dict[tuple[str, int | None], np.ndarray]
  files: list[str] = dataclasses.field(default_factory=list)

  @property
  def decoder_input_pieces(self) -> list[str]:
    """Keys of decoder self attention: ``<s>`` then the hypothesis without its last piece."""
    return ["<s>", *self.target_pieces[:-1]]


def _beam_size(model) -> int:
  """The run's beam: ``config.decode.beam_size`` with beam search, else 1 (greedy)."""
  return model.run_config.decode.beam_size if model.run_config.decode.method == "beam" else 1


def attention_for_sentences(model, split: str, indices: list[int], beam_size: int | None = None
                            ) -> list[SentenceAttention]:
  """Decode sentences ``indices`` of ``split`` with ``model`` (a ``transformer.TrainedModel`` of a translation
  run) and collect their attention maps on (source, hypothesis). ``beam_size`` None uses the run's
  ``config.decode`` beam (1 is greedy)."""
  settings = model.run_config.decode
  beam_size = _beam_size(model) if beam_size is None else beam_size
  data = model.task.data
  sources = [data.eval[split].source(i) for i in indices]
  hypotheses = model.decode(sources, beam_size=beam_size, length_penalty=settings.length_penalty)
  maps = model.attention_weights(sources, hypotheses)
  return [SentenceAttention(index=index, source_text=data.eval_source_text[split][index],
                            reference_text=data.eval_reference_text[split][index],
                            hypothesis_text=data.target_tokenizer.decode(hypothesis),
                            source_pieces=_pieces(data.source_tokenizer, source),
                            target_pieces=_pieces(data.target_tokenizer, hypothesis), maps=sentence_maps)
          for index, source, hypothesis, sentence_maps in zip(indices, sources, hypotheses, maps)]


def _pieces(tokenizer, ids) -> list[str]:
  """SentencePiece pieces of ``ids`` (``▁`` marks a word start), read from the tokenizer's model bytes."""
  import sentencepiece as spm
  processor = spm.SentencePieceProcessor(model_proto=tokenizer.model_proto)
  return [processor.id_to_piece(int(token)) for token in ids]


def plot_attention(weights: np.ndarray, query_labels: list[str], key_labels: list[str], title: str,
                   path: str) -> None:
  """One heatmap panel per head plus their average (when there is more than one head).

  Args:
    weights: ``[heads, q_length, kv_length]``.
    query_labels, key_labels: ``q_length`` and ``kv_length`` tick labels (rows and columns).
  """
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  heads, queries, keys = weights.shape
  panels = [(f"head {h}" if heads > 1 else "weights", weights[h]) for h in range(heads)]
  if heads > 1:
    panels.append(("average of heads", weights.mean(axis=0)))
  columns = min(len(panels), 3)
  rows = -(-len(panels) // columns)
  cell = 0.22  # inches per token: room for a rotated piece label
  panel_width, panel_height = 1.6 + cell * keys, 1.4 + cell * queries
  figure, axes = plt.subplots(rows, columns, figsize=(columns * panel_width + 1.0, rows * panel_height + 0.6),
                              squeeze=False, layout="constrained")
  # One colour scale for the whole figure so heads can be compared.
  vmax = max(float(weights.max()), 1e-6)
  image = None
  for axis, (name, matrix) in zip(axes.flat, panels):
    image = axis.imshow(matrix, cmap="viridis", vmin=0.0, vmax=vmax, aspect="auto", interpolation="nearest")
    axis.set_title(name, fontsize=9)
    axis.set_xticks(range(keys), key_labels, rotation=90, fontsize=7)
    axis.set_yticks(range(queries), query_labels, fontsize=7)
  for axis in list(axes.flat)[len(panels):]:
    axis.axis("off")
  figure.suptitle(title, fontsize=10)
  figure.colorbar(image, ax=axes, shrink=0.8, label="attention weight")
  figure.savefig(path, dpi=80)
  plt.close(figure)


def plot_sentence(sentence: SentenceAttention, split: str, output_dir: str) -> list[str]:
  """Write every map of ``sentence`` as ``<split>_<i>_<kind>_layer<l>.png`` (RNN: ``<split>_<i>_alignment.png``)."""
  labels = {"encoder_self": (sentence.source_pieces, sentence.source_pieces),
            "decoder_self": (sentence.target_pieces, sentence.decoder_input_pieces),
            "cross": (sentence.target_pieces, sentence.source_pieces),
            "alignment": (sentence.target_pieces, sentence.source_pieces)}
  files = []
  for (kind, layer), weights in sorted(sentence.maps.items(), key=lambda item: (KINDS.index(item[0][0]),
                                                                              item[0][1] or 0)):
    suffix = kind if layer is None else f"{kind}_layer{layer}"
    name = f"{split}_{sentence.index}_{suffix}.png"
    query_labels, key_labels = labels[kind]
    title = f"{split} #{sentence.index}: {kind.replace('_', ' ')}" + ("" if layer is None else f", layer {layer}")
    plot_attention(weights, query_labels, key_labels, title, os.path.join(output_dir, name))
    files.append(name)
  sentence.files = files
  return files


def write_readme(output_dir: str, sentences: list[SentenceAttention], split: str, step: int, command: str,
                 beam_size: int, note: str = "") -> str:
  """``output_dir/README.md``: the command (and ``note``, e.g. how the run was trained), then per sentence its
  texts, pieces and plot files."""
  decoding = "greedy search" if beam_size == 1 else f"beam search (beam {beam_size})"
  lines = [
      "# Attention maps", "",
      f"Generated by `experiments/attention_plots.py` from the checkpoint at step {step}, hypotheses by "
      f"{decoding}, then the model run teacher-forced on (source, hypothesis):", "",
      "```", command, "```", "", *([note, ""] if note else []),
      "Rows are the hypothesis pieces the decoder outputs (`</s>` included); columns are the source pieces "
      "(encoder self attention, cross attention, RNN alignment) or the decoder inputs `<s>` + hypothesis "
      "(decoder self attention). Padding is cropped; each row sums to 1. Layers are numbered from 0. Each "
      "figure has one panel per head and the head average.", ""]
  for sentence in sentences:
    lines += [f"## {split} #{sentence.index}", "",
              f"- source: {sentence.source_text}",
              f"- reference: {sentence.reference_text}",
              f"- hypothesis: {sentence.hypothesis_text}",
              f"- source pieces: `{' '.join(sentence.source_pieces)}`",
              f"- hypothesis pieces: `{' '.join(sentence.target_pieces)}`",
              "- plots: " + ", ".join(f"[{name}]({name})" for name in sentence.files), ""]
  path = os.path.join(output_dir, "README.md")
  with open(path, "w") as f:
    f.write("\n".join(lines))
  return path


def write_attention_plots(model, split: str, indices: list[int], output_dir: str, command: str,
                          beam_size: int | None = None, note: str = "") -> list[SentenceAttention]:
  """Decode, collect and plot ``indices`` of ``split`` into ``output_dir``, with its README; returns the maps.
  ``model``: a ``transformer.TrainedModel`` of a translation run."""
  data = model.task.data
  if split not in data.eval:
    raise ValueError(f"--split={split!r} is not loaded; splits: {sorted(data.eval)}.")
  size = len(data.eval[split])
  if not indices or min(indices) < 0 or max(indices) >= size:
    raise ValueError(f"sentences {indices} are outside {split}, which has {size} sentences.")
  beam_size = _beam_size(model) if beam_size is None else beam_size
  os.makedirs(output_dir, exist_ok=True)
  sentences = attention_for_sentences(model, split, indices, beam_size)
  for sentence in sentences:
    plot_sentence(sentence, split, output_dir)
  written = {name for sentence in sentences for name in sentence.files}
  for name in os.listdir(output_dir):  # plots of an earlier model (other layers or sentences) would mislead
    if PLOT_NAME.fullmatch(name) and name not in written:
      os.remove(os.path.join(output_dir, name))
  write_readme(output_dir, sentences, split, model.step, command, beam_size, note)
  return sentences


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                   allow_abbrev=False)
  parser.add_argument("--config", required=True, help="Experiment config file, optionally :variant, as launch.py's; "
                      "--config.KEY=VALUE overrides follow it as there.")
  parser.add_argument("--workdir", required=True, help="The run's directory (its checkpoints are read, nothing "
                      "written).")
  parser.add_argument("--output_dir", required=True, help="Folder for the PNG files and README.md.")
  parser.add_argument("--split", default="", help="Evaluation split; default: the config's first test split.")
  parser.add_argument("--num_sentences", type=int, default=3, help="How many sentences to plot.")
  parser.add_argument("--first_sentence", type=int, default=0, help="Index of the first sentence in the split.")
  parser.add_argument("--beam_size", type=int, default=0, help="Beam size of the hypotheses; 0: config.decode's, "
                      "1: greedy.")
  parser.add_argument("--checkpoint", default="latest", choices=["latest", "best"],
                      help="latest, or best (by config.best_metric; the latest when the run kept none).")
  parser.add_argument("--note", default="", help="A paragraph for README.md under the command, e.g. how the run "
                      "was trained when it is not an experiment's default.")
  args, overrides = parser.parse_known_args(argv)
  unknown = [argument for argument in overrides if not argument.startswith("--config.")]
  if unknown:
    parser.error(f"unrecognized arguments: {' '.join(unknown)}")
  if args.num_sentences < 1 or args.first_sentence < 0:
    parser.error("--num_sentences must be >= 1 and --first_sentence >= 0.")
  import logging
  logging.getLogger("absl").setLevel(logging.WARNING)  # orbax logs every restore step at INFO
  from experiments import launching
  from transformer import load

  try:
    config = launching.launch_config([f"--config={args.config}", *overrides])
    if config.task.name != "translation":
      parser.error(f"attention plots need a translation config; config.task.name={config.task.name!r}.")
    split = args.split or config.task.test_splits[0]
    if split != config.task.eval_split and split not in config.task.test_splits:
      config.task.test_splits = (*config.task.test_splits, split)  # so that task.data tokenizes it
    model = load(args.workdir, checkpoint=args.checkpoint, config=config)
    indices = list(range(args.first_sentence, args.first_sentence + args.num_sentences))
    command = launching.portable_command(["python", "-m", "experiments.attention_plots",
                                         *(sys.argv[1:] if argv is None else argv)])
    sentences = write_attention_plots(model, split, indices, args.output_dir, command, args.beam_size or None,
                                      args.note)
  except (ValueError, FileNotFoundError) as error:
    sys.exit(f"error: {error}")
  print(f"step {model.step}: wrote {sum(len(s.files) for s in sentences)} plots and README.md to {args.output_dir}")


if __name__ == "__main__":
  main()
