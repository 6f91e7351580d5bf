"""Write the language model's results page from a trained run: RESULTS.md and curves.png.

    TFDS_DATA_DIR=/tmp/tfds python -m experiments.language_model_results --workdir_root=/tmp/lm
    python -m experiments.language_model_results --from_records --update_committed   # the page from records.json

The run is ``<workdir_root>/small`` (this script trains nothing); ``transformer.load`` gives its best checkpoint and
tokenizer, so the data the run read must be reachable (its ``task.source_dir``, the same TFDS data dir). Its row,
continuations included, is kept in ``records.json`` beside the page; the best checkpoint's log-probability of every
validation sentence, in ``log_probs/<variant>.validation.tsv``, gives its perplexities and cross-entropy
(``recompute``), its training log in ``logs/<variant>.jsonl`` the best step, wall time and throughput
(``log_values``).
"""
from __future__ import annotations

import os

import transformer
from experiments import launching, output_pages, pages, record_store, reruns
from experiments.language_model import get_config
from transformer import plot
from transformer.errors import UserError
from transformer.tasks.language_model import log_probs_metrics, read_log_probs
from transformer.train.workdir import MetricsLog

VARIANT = "small"
PROMPTS = ("A man in a red shirt", "Two dogs", "A group of children are", "A woman", "")
HEADER = ["variant", "steps", "best validation perplexity (per piece)", "at step", "per word",
          "validation cross-entropy (nats per piece)", "total wall time", "tokens/s (median)", "command"]
# The columns the committed log-probabilities give (``recompute``); a rerun's page says where they changed.
RECOMPUTED_COLUMNS = ("best validation perplexity (per piece)", "per word", "validation cross-entropy (nats per piece)")
LOG_PROBS = "log_probs"  # beside the page: <variant>.<split>.tsv, the best checkpoint's per-sentence log-probs
TEMPLATE = pages.read_template("language_model/page_template.md")  # the page's prose


def log_probs_path(folder: str, name: str, split: str = "validation") -> str:
  return os.path.join(folder, LOG_PROBS, f"{name}.{split}.tsv")


def log_probs_values(metrics: dict) -> dict:
  """A row's values from ``log_probs_metrics`` of its per-sentence log-probabilities."""
  return {"best_perplexity": metrics["perplexity"], "best_nll": metrics["nll"],
          "per_word_perplexity": metrics["per_word_perplexity"], "pieces": metrics["pieces"],
          "words": metrics["words"]}


def recompute(folder: str, name: str, record: dict) -> dict | None:
  """The row's values its committed log-probabilities give; None without them."""
  path = log_probs_path(folder, name, record["values"]["split"])
  return log_probs_values(log_probs_metrics(read_log_probs(path))) if os.path.exists(path) else None


def log_values(log: MetricsLog) -> dict:
  """The row's values its training log gives (``experiments.verify`` recomputes them from the committed log): the
  last step, the best validation perplexity's step and metrics as logged, the wall time, the median throughput."""
  best = log.best("eval/perplexity", mode="min")
  steps, wall_seconds = log.progress
  return {"steps": steps, "best_step": best["step"],
          "logged": {"nll": best["eval/nll"], "perplexity": best["eval/perplexity"]},
          "wall_seconds": wall_seconds, "tokens_per_second": log.median_rate("train/tokens_per_second")}


def collect(store: record_store.RecordStore, folder: str, args) -> None:
  """The row of the run in ``<workdir_root>/small`` (scores, the model and data it describes, greedy
  continuations) and ``folder/curves.png``."""
  workdir = os.path.join(args.workdir_root, VARIANT)
  metrics = launching.run_metrics(workdir)
  from_log = log_values(metrics)
  steps = from_log.pop("steps")
  store.check({VARIANT: steps})  # before loading and decoding
  model, run_config = transformer.load(workdir), transformer.read_run_config(workdir)
  model_config, data = model.model_config, model.task.data
  command = output_pages.training_command("experiments/language_model.py", VARIANT, get_config, workdir,
                                          f"--config.task.source_dir={run_config.task.source_dir}")
  split = run_config.task.eval_split
  os.makedirs(os.path.join(folder, LOG_PROBS), exist_ok=True)
  scored = model.task.write_log_probs(model_config, model.params, log_probs_path(folder, VARIANT, split))
  values = {
      **from_log, **log_probs_values(scored), "workdir": workdir, "checkpoint_step": model.step,
      "model": {name: getattr(model_config, name) for name in ("num_decoder_layers", "d_model", "num_heads",
                                                                "d_ff", "vocab_size")},
      "tokenizer_type": run_config.task.tokenizer_type, "pieces_per_word": data.pieces_per_word,
      "split": split, "max_length": run_config.task.max_length,
      "continuations": [list(pair) for pair in zip(PROMPTS, model.continue_texts(list(PROMPTS)))]}
  output_pages.add_row(store, VARIANT, steps, command, values, row, HEADER, RECOMPUTED_COLUMNS, workdir=workdir,
                       run_key="workdir")
  plot.plot_curves({VARIANT: list(metrics.records)}, ["train/loss", "eval/perplexity"], os.path.join(folder, "curves.png"),
                   "Multi30k English language model")


def row(name: str, record: dict) -> list:
  """The cells of the row ``name`` of the table (``HEADER``)."""
  values = record["values"]
  return [name, record["steps"], f"{values['best_perplexity']:.2f}", values["best_step"],
          f"{values['per_word_perplexity']:.2f}", f"{values['best_nll']:.4f}",
          f"{values['wall_seconds'] / 60:.1f} min", f"{values['tokens_per_second']:,.0f}", f"`{record['command']}`"]


def render(store: record_store.RecordStore, folder: str, args) -> str:
  """The page's markdown."""
  if VARIANT not in store:
    raise UserError(f"{store.path} has no row {VARIANT!r}: train it (see the script's docstring) and "
                           "run without --from_records")
  record = store[VARIANT]
  values, model = record["values"], record["values"]["model"]
  examples = "\n".join(f"| {prompt or '(empty: a sentence from scratch)'} | {text} |"
                       for prompt, text in values["continuations"])
  return TEMPLATE["page"].substitute(
      values, **model, machine=record["machine"], log_probs=log_probs_path("", VARIANT, values["split"]),
      pieces_per_word=f"{values['pieces_per_word']:.3f}", words=f"{values['words']:,}", pieces=f"{values['pieces']:,}",
      table=pages.markdown_table(HEADER, [row(VARIANT, record)]), examples=examples,
      curves=pages.image(folder, "curves.png", "training curves"), reruns=reruns.section(store, [VARIANT]))


def main(argv=None) -> str:
  """The page's text (``output_pages.make_page``)."""
  parser = pages.results_parser(__doc__, "WORKDIR_ROOT/results", default_root="/tmp/lm")
  return output_pages.make_page(parser, argv, os.path.join(record_store.COMMITTED, "language_model"), collect, render)


if __name__ == "__main__":
  main()
