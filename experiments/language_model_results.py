"""Write the language model's results page from a trained run: RESULTS.md and curves.png.

    TFDS_DATA_DIR=/tmp/tfds python -m experiments.language_model_results --workdir_root=/tmp/lm
    python -m experiments.language_model_results --from_records --update_committed   # the page from records.json

The run is ``<workdir_root>/small`` (this script trains nothing); ``transformer.load`` gives its best checkpoint and
tokenizer, so the data the run read must be reachable (its ``task.source_dir``, the same TFDS data dir). Its row,
continuations included, is kept in ``records.json`` beside the page, which goes to ``--output_dir`` (default
``<workdir_root>/results/``) or, with ``--update_committed``, to ``experiments/language_model/`` (from a run of at
least the recorded steps, unless ``--force``). The best checkpoint's log-probability of every validation sentence
goes to ``log_probs/<variant>.validation.tsv`` beside the page: the row's perplexities and cross-entropy are
computed from it (and ``recompute`` computes them again).
"""
from __future__ import annotations

import os

from experiments import launching, pages, record_store, reruns
from transformer import plot
from transformer.errors import UserError
from experiments.language_model import get_config
import transformer
from transformer.tasks.language_model import log_probs_metrics, read_log_probs
from transformer.train.run_directory import MetricsLog

VARIANT = "small"
# Where the data lives and how the run printed: not part of the command that reproduces it.
PROMPTS = ("A man in a red shirt", "Two dogs", "A group of children are", "A woman", "")
HEADER = ["variant", "steps", "best validation perplexity (per piece)", "at step", "per word",
          "validation cross-entropy (nats per piece)", "total wall time", "tokens/s (median)", "command"]
# The columns the committed log-probabilities give (``recompute``); a rerun's page says where they changed.
RECOMPUTED_COLUMNS = ("best validation perplexity (per piece)", "per word", "validation cross-entropy (nats per piece)")
LOG_PROBS = "log_probs"  # beside the page: <variant>.<split>.tsv, the best checkpoint's per-sentence log-probs


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
             *launching.config_overrides(get_config(VARIANT), run_config)]
  split = run_config.task.eval_split
  os.makedirs(os.path.join(folder, LOG_PROBS), exist_ok=True)
  scored = model.task.write_log_probs(model_config, model.params, log_probs_path(folder, VARIANT, split))
  values = {
      "best_step": best["step"], **log_probs_values(scored), "workdir": workdir, "checkpoint_step": model.step,
      "logged": {"nll": best["eval/nll"], "perplexity": best["eval/perplexity"]},
      "wall_seconds": records[-1]["wall_seconds"], "tokens_per_second": metrics.median_rate("train/tokens_per_second"),
      "model": {name: getattr(model_config, name) for name in ("num_decoder_layers", "d_model", "num_heads",
                                                                "d_ff", "vocab_size")},
      "tokenizer_type": run_config.task.tokenizer_type, "pieces_per_word": data.pieces_per_word,
      "split": split, "max_length": run_config.task.max_length,
      "continuations": [list(pair) for pair in zip(PROMPTS, model.continue_texts(list(PROMPTS)))]}
  record = {"steps": records[-1]["step"], "command": launching.portable_command(command),
            "machine": record_store.machine_description(), "values": values}
  values["reruns"] = reruns.history(store.records.get(VARIANT), record, VARIANT, row, HEADER, RECOMPUTED_COLUMNS,
                                    run_key="workdir")
  store.add(VARIANT, **record)
  plot.plot_curves({VARIANT: records}, ["train/loss", "eval/perplexity"], os.path.join(folder, "curves.png"),
                   "Multi30k English language model")


def row(name: str, record: dict) -> list:
  values = record["values"]
  return [name, record["steps"], f"{values['best_perplexity']:.2f}", values["best_step"],
          f"{values['per_word_perplexity']:.2f}", f"{values['best_nll']:.4f}",
          f"{values['wall_seconds'] / 60:.1f} min", f"{values['tokens_per_second']:,.0f}", f"`{record['command']}`"]


def render(store: record_store.RecordStore, folder: str) -> str:
  if VARIANT not in store:
    raise UserError(f"{store.path} has no row {VARIANT!r}: train it (see the script's docstring) and "
                           "run without --from_records")
  record = store[VARIANT]
  values, model = record["values"], record["values"]["model"]
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
marks. The best checkpoint is chosen on validation perplexity; the three are computed from its log-probability of
each sentence in `{LOG_PROBS}/{VARIANT}.{values['split']}.tsv` (pieces, words, summed log-probability), from which
`python -m experiments.verify` computes them again. Wall time includes compilation, evaluation and checkpointing.

{pages.markdown_table(HEADER, [row(VARIANT, record)])}

{pages.image(folder, "curves.png", "training curves")}

## Greedy continuations

The best checkpoint through `transformer.load(workdir).continue_texts(prompts)` (greedy, cached decoding; up to
{values['max_length']} pieces or the end of the sentence):

| prompt | continuation |
|---|---|
{examples}

{reruns.section(store, [VARIANT])}"""


def main(argv=None) -> str:
  args = pages.results_parser(__doc__, "WORKDIR_ROOT/results", default_root="/tmp/lm").parse_args(argv)
  return pages.make_page(args, os.path.join(record_store.COMMITTED, "language_model"),
                         os.path.join(args.workdir_root, "results"),
                         lambda store, folder: collect(store, folder, os.path.join(args.workdir_root, VARIANT)),
                         render)


if __name__ == "__main__":
  main()
