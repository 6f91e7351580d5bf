"""Write the language model's results page from a trained run: RESULTS.md and curves.png.

    TFDS_DATA_DIR=/tmp/tfds python -m experiments.language_model_results --workdir_root=/tmp/lm

The run is ``<workdir_root>/small``, trained by the command the page records (this script trains nothing).
``transformer.load`` gives the best checkpoint (by validation perplexity) and its tokenizer, so the data the run
read must be reachable: its ``task.source_dir`` and the same TFDS data dir. The page goes to ``--output_dir``,
by default ``<workdir_root>/results/``; the committed ``experiments/language_model/`` only with
``--update_committed`` (and then only from a run of at least the recorded steps, unless ``--force``).
"""
from __future__ import annotations

import math
import os

import numpy as np
from absl import app

from experiments import report
from experiments.language_model import get_config
import transformer
from transformer.train.writers import read_metrics

_ROOT = report.workdir_root_flag()
DEFAULT_ROOT = "/tmp/lm"
_OUTPUT = report.output_flags()  # --output_dir, --update_committed, --force
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


def write_results(output: str, workdir: str, *, replace_only_longer: bool = False) -> str:
  records = read_metrics(workdir)
  evaluations = [r for r in records if "eval/perplexity" in r]
  best = min(evaluations, key=lambda r: r["eval/perplexity"])
  last = records[-1]
  model = transformer.load(workdir)
  run_config = transformer.read_run_config(workdir)
  command = ["python", "launch.py", f"--config=experiments/language_model.py:{VARIANT}", f"--workdir={workdir}",
             f"--config.task.source_dir={run_config.task.source_dir}",
             *report.config_overrides(get_config(VARIANT), run_config, NOT_TRAINING_SETTINGS)]
  data = model.task.data
  split = run_config.task.eval_split
  pieces = int(data.eval[split].target_tokens.size)
  words = sum(len(text.split()) for text in data.eval_text[split])
  tokens = [r["train/tokens_per_second"] for r in records if "train/tokens_per_second" in r][1:]
  row = [VARIANT, last["step"], f"{best['eval/perplexity']:.2f}", best["step"],
         f"{per_word_perplexity(best['eval/nll'], pieces, words, len(data.eval_text[split])):.2f}",
         f"{best['eval/nll']:.4f}", f"{last['wall_seconds'] / 60:.1f} min", f"{np.median(tokens):,.0f}",
         f"`{report.portable_command(command)}`"]
  if replace_only_longer:
    report.check_replacements(os.path.join(output, "RESULTS.md"), report.recorded_steps(output, "variant"),
                              {VARIANT: row[1]})
  continuations = model.continue_texts(list(PROMPTS))
  examples = "\n".join(f"| {prompt or '(empty: a sentence from scratch)'} | {text} |"
                       for prompt, text in zip(PROMPTS, continuations))
  os.makedirs(output, exist_ok=True)
  report.plot_curves({VARIANT: records}, ["train/loss", "eval/perplexity"], os.path.join(output, "curves.png"),
                     "Multi30k English language model")
  model_config = model.model_config
  text = f"""# Multi30k English language model

Written by `python -m experiments.language_model_results --workdir_root=WORKDIR_ROOT` (a local folder holding the
run); do not edit by hand.

Machine: {report.machine_description()}; trained on its CPU, shared with other jobs, so the wall time is an
upper bound.

A decoder-only Transformer ({model_config.num_decoder_layers} layers, d_model {model_config.d_model},
{model_config.num_heads} heads, d_ff {model_config.d_ff}, pre-LN, tied output embedding) over the English
captions of Multi30k, one sentence per example, with a SentencePiece {run_config.task.tokenizer_type}
vocabulary of {model_config.vocab_size} pieces ({data.pieces_per_word:.3f} pieces per word on train).
Perplexity is exp of the mean cross-entropy per piece on the {words:,} words ({pieces:,} pieces, EOS
included) of the {split} split; "per word" spreads the same log-likelihood over words and end-of-sentence
marks. The best checkpoint is chosen on validation perplexity; wall time includes compilation, evaluation and
checkpointing.

{report.markdown_table(HEADER, [row])}

![training curves](curves.png)

## Greedy continuations

The best checkpoint through `transformer.load(workdir).continue_texts(prompts)` (greedy, cached decoding; up to
{run_config.task.max_length} pieces or the end of the sentence):

| prompt | continuation |
|---|---|
{examples}
"""
  return report.write_page(output, text)


def main(argv):
  del argv
  root = _ROOT.value or DEFAULT_ROOT
  committed = os.path.join(report.COMMITTED, "language_model")
  output = report.exit_on_user_error(report.results_folder, _OUTPUT, committed, os.path.join(root, "results"))
  print(report.exit_on_user_error(write_results, output, os.path.join(root, VARIANT),
                                  replace_only_longer=output == committed and not _OUTPUT.force.value))
  print(f"Wrote the page to {output}/RESULTS.md")


if __name__ == "__main__":
  app.run(main)
