"""Write the language model's results page from a trained run: RESULTS.md and curves.png.

    TFDS_DATA_DIR=/tmp/tfds python -m experiments.language_model_results --workdir_root=/tmp/lm
    python -m experiments.language_model_results --from_records --update_committed   # the page from records.json

The run is ``<workdir_root>/small`` (this script trains nothing); ``transformer.load`` gives its best checkpoint and
tokenizer, so the data the run read must be reachable (its ``task.source_dir``, the same TFDS data dir). Its row,
continuations included, is kept in ``records.json`` beside the page, which goes to ``--output_dir`` (default
``<workdir_root>/results/``) or, with ``--update_committed``, to ``experiments/language_model/`` (from a run of at
least the recorded steps, unless ``--force``).
"""
from __future__ import annotations

import math
import os

from experiments import launching, pages, record_store
from transformer import plot
from experiments.language_model import get_config
import transformer
from transformer.train.run_directory import MetricsLog

VARIANT = "small"
# Where the data lives and how the run printed: not part of the command that reproduces it.
NOT_TRAINING_SETTINGS = ("task.source_dir", "task.data_dir", "quiet", "tensorboard")
PROMPTS = ("A man in a red shirt", "Two dogs", "A group of children are", "A woman", "")
HEADER = ["variant", "steps", "best validation perplexity (per piece)", "at step", "per word",
          "validation cross-entropy (nats per piece)", "total wall time", "tokens/s (median)", "command"]


def per_word_perplexity(nll_per_piece: float, pieces: int, words: int, sentences: int) -> float:
  """The same total log-likelihood spread over words (each sentence's EOS counted as one): comparable across
  tokenizers, unlike the per-piece perplexity."""
  return math.exp(nll_per_piece * pieces / (words + sentences))


def collect(store: record_store.RecordStore, folder: str, workdir: str) -> None:
  """The row of the run in ``workdir`` (scores, the model and data it describes, greedy continuations) and
  ``folder/curves.png``."""
  records = launching.run_metrics(workdir)
  store.check({VARIANT: records[-1]["step"]})  # before loading and decoding
  metrics = MetricsLog(tuple(records))
  best = metrics.best("eval/perplexity", mode="min")
  model, run_config = transformer.load(workdir), transformer.read_run_config(workdir)
  model_config, data = model.model_config, model.task.data
  command = ["python", "launch.py", f"--config=experiments/language_model.py:{VARIANT}", f"--workdir={workdir}",
             f"--config.task.source_dir={run_config.task.source_dir}",
             *launching.config_overrides(get_config(VARIANT), run_config, NOT_TRAINING_SETTINGS)]
  split = run_config.task.eval_split
  pieces = int(data.eval[split].target_tokens.size)
  words = sum(len(text.split()) for text in data.eval_text[split])
  values = {
      "best_perplexity": best["eval/perplexity"], "best_step": best["step"], "best_nll": best["eval/nll"],
      "per_word_perplexity": per_word_perplexity(best["eval/nll"], pieces, words, len(data.eval_text[split])),
      "wall_seconds": records[-1]["wall_seconds"], "tokens_per_second": metrics.median_rate("train/tokens_per_second"),
      "model": {name: getattr(model_config, name) for name in ("num_decoder_layers", "d_model", "num_heads",
                                                                "d_ff", "vocab_size")},
      "tokenizer_type": run_config.task.tokenizer_type, "pieces_per_word": data.pieces_per_word,
      "words": words, "pieces": pieces, "split": split, "max_length": run_config.task.max_length,
      "continuations": [list(pair) for pair in zip(PROMPTS, model.continue_texts(list(PROMPTS)))]}
  store.add(VARIANT, steps=records[-1]["step"], command=launching.portable_command(command),
            machine=record_store.machine_description(), values=values)
  plot.plot_curves({VARIANT: records}, ["train/loss", "eval/perplexity"], os.path.join(folder, "curves.png"),
                     "Multi30k English language model")


def render(store: record_store.RecordStore, folder: str) -> str:
  if VARIANT not in store:
    raise UserError(f"{store.path} has no row {VARIANT!r}: train it (see the script's docstring) and "
                           "run without --from_records")
  record = store[VARIANT]
  values, model = record["values"], record["values"]["model"]
  row = [VARIANT, record["steps"], f"{values['best_perplexity']:.2f}", values["best_step"],
         f"{values['per_word_perplexity']:.2f}", f"{values['best_nll']:.4f}",
         f"{values['wall_seconds'] / 60:.1f} min", f"{values['tokens_per_second']:,.0f}", f"`{record['command']}`"]
  examples = "\n".join(f"| {prompt or '(empty: a sentence from scratch)'} | {text} |"
                       for prompt, text in values["continuations"])
  return f"""# Multi30k English language model

Written by `python -m experiments.language_model_results --workdir_root=WORKDIR_ROOT` (a local folder holding the
run); do not edit by hand.

Machine: {record['machine']}; trained on its CPU, shared with other jobs, so the wall time is an
upper bound.

A decoder-only Transformer ({model['num_decoder_layers']} layers, d_model {model['d_model']},
{model['num_heads']} heads, d_ff {model['d_ff']}, pre-LN, tied output embedding) over the English
captions of Multi30k, one sentence per example, with a SentencePiece {values['tokenizer_type']}
vocabulary of {model['vocab_size']} pieces ({values['pieces_per_word']:.3f} pieces per word on train).
Perplexity is exp of the mean cross-entropy per piece on the {values['words']:,} words ({values['pieces']:,} pieces, EOS
included) of the {values['split']} split; "per word" spreads the same log-likelihood over words and end-of-sentence
marks. The best checkpoint is chosen on validation perplexity; wall time includes compilation, evaluation and
checkpointing.

{pages.markdown_table(HEADER, [row])}

{pages.image(folder, "curves.png", "training curves")}

## Greedy continuations

The best checkpoint through `transformer.load(workdir).continue_texts(prompts)` (greedy, cached decoding; up to
{values['max_length']} pieces or the end of the sentence):

| prompt | continuation |
|---|---|
{examples}
"""


def main(argv=None) -> str:
  args = pages.results_parser(__doc__, "WORKDIR_ROOT/results", default_root="/tmp/lm").parse_args(argv)
  return pages.make_page(args, os.path.join(record_store.COMMITTED, "language_model"),
                          os.path.join(args.workdir_root, "results"),
                          lambda store, folder: collect(store, folder, os.path.join(args.workdir_root, VARIANT)),
                          render)


if __name__ == "__main__":
  main()
