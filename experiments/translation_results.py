"""Score translation runs and write experiments/<dataset>/RESULTS.md, curves and the best test output.

    python -m experiments.translation_results --experiment=multi30k \\
        --run=transformer_small:/tmp/multi30k_small --run=gru_bahdanau:/tmp/multi30k_gru \\
        --source_dir=../shared/data/multi30k

Each ``--run=VARIANT:WORKDIR`` is a finished (or interrupted) run of ``experiments/<experiment>.py:VARIANT``.
Its best checkpoint (chosen on validation) is scored with ``launch.py --mode=eval`` unless
``WORKDIR/eval_results.json`` is already newer than its checkpoints. The row with the best validation BLEU
gives the committed test hypotheses.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

from absl import app, flags

from experiments import report
from transformer.train.writers import read_metrics

_EXPERIMENT = flags.DEFINE_enum("experiment", "multi30k", ["multi30k", "iwslt15_en_vi"], "Which experiment.")
_RUNS = flags.DEFINE_multi_string("run", [], "VARIANT:WORKDIR of a run to report.")
_SOURCE_DIR = flags.DEFINE_string("source_dir", "", "Raw data folder (as --config.task.source_dir).")
_DATA_DIR = flags.DEFINE_string("data_dir", "", "TFDS data dir (as --config.task.data_dir).")
_HARDWARE = flags.DEFINE_string("hardware", "", "Where the runs trained (default: this machine).")

# Published full-data results, quoted for reference (not reproduced here).
PUBLISHED = {
    "iwslt15_en_vi": [
        ("Luong & Manning 2015, LSTM + attention (133k pairs)", "23.3"),
        ("TensorFlow NMT tutorial, LSTM + attention (133k pairs)", "26.1"),
        ("Nguyen & Salazar 2019, Transformer (133k pairs)", "32.8"),
    ],
    "multi30k": [("Wu et al. 2021, text-only Transformer (4+4 layers, d_model 128)", "41.0 (lowercased)")],
}
TEST_SPLIT = {"multi30k": "test_2016_flickr", "iwslt15_en_vi": "test"}
TARGET_LANGUAGE = {"multi30k": "de", "iwslt15_en_vi": "vi"}


def evaluate(variant: str, workdir: str) -> dict:
  path = os.path.join(workdir, "eval_results.json")
  checkpoints = os.path.join(workdir, "checkpoints")
  newest = max((os.path.getmtime(os.path.join(checkpoints, s)) for s in os.listdir(checkpoints)), default=0)
  if not os.path.exists(path) or os.path.getmtime(path) < newest:
    command = [sys.executable, "launch.py", f"--config=experiments/{_EXPERIMENT.value}.py:{variant}",
               f"--workdir={workdir}", "--mode=eval", "--config.quiet=True"]
    if _SOURCE_DIR.value:
      command.append(f"--config.task.source_dir={_SOURCE_DIR.value}")
    if _DATA_DIR.value:
      command.append(f"--config.task.data_dir={_DATA_DIR.value}")
    subprocess.run(command, cwd=report.REPO, check=True)
  with open(path) as f:
    return json.load(f)


def main(argv):
  del argv
  experiment = _EXPERIMENT.value
  output = os.path.join(report.REPO, "experiments", experiment)
  os.makedirs(output, exist_ok=True)
  test = TEST_SPLIT[experiment]
  rows, runs, best = [], {}, None
  for spec in _RUNS.value:
    variant, _, workdir = spec.partition(":")
    results = evaluate(variant, workdir)
    records = read_metrics(workdir)
    runs[variant] = workdir
    with open(os.path.join(workdir, "config.json")) as f:
      config = json.load(f)
    trained = [r for r in records if "wall_seconds" in r]
    wall = trained[-1]["wall_seconds"] if trained else float("nan")
    last_step = trained[-1]["step"] if trained else 0
    pairs = ""
    with open(os.path.join(workdir, "model_config.json")) as f:
      model_config = json.load(f)
    size = (f"{model_config.get('num_encoder_layers')}+{model_config.get('num_decoder_layers')} layers, "
            f"d_model {model_config.get('d_model')}" if "d_model" in model_config else
            f"{model_config.get('cell')}, {model_config.get('attention')}, hidden {model_config.get('hidden_dim')}")
    command = (f"python launch.py --config=experiments/{experiment}.py:{variant} --workdir=WORKDIR "
               f"--config.task.source_dir={_SOURCE_DIR.value or '$TRANSFORMER_DATA_DIR'}")
    rows.append([variant, size, f"{results['step']} of {last_step}", f"{wall / 3600:.2f} h",
                 f"{results['eval/bleu']:.2f}", f"{results[f'{test}/bleu']:.2f}",
                 f"{results[f'{test}/bleu_lowercase']:.2f}", f"`{results[f'{test}/bleu_signature']}`",
                 f"`{command}`"])
    if best is None or results["eval/bleu"] > best[1]["eval/bleu"]:
      best = (variant, results, workdir)
  if not rows:
    raise app.UsageError("give at least one --run=VARIANT:WORKDIR")
  hypothesis_name = f"{test}.hyp.{TARGET_LANGUAGE[experiment]}"
  shutil.copy(os.path.join(best[2], hypothesis_name), os.path.join(output, hypothesis_name))
  report.plot_curves(runs, ["train/nll", "eval/nll", "eval/bleu"], os.path.join(output, "curves.png"),
                     f"{experiment}: training curves")
  table = report.markdown_table(
      ["model", "size", "checkpoint step (best on validation) of steps trained", "training wall time",
       "validation BLEU", f"{test} BLEU", f"{test} BLEU lowercased", "sacreBLEU signature", "command"], rows)
  published = report.markdown_table(["published result", f"{test} BLEU"], PUBLISHED[experiment])
  with open(os.path.join(output, "RESULTS.md"), "w") as f:
    f.write(f"""# {experiment}: translation results

Written by `python -m experiments.translation_results --experiment={experiment} {' '.join('--run=' + r.split(':')[0] + ':WORKDIR' for r in _RUNS.value)}`;
do not edit by hand.

Hardware: {_HARDWARE.value or report.machine_description()}.

Checkpoints are chosen on the validation split; the test split is scored once, by `--mode=eval`, with beam
search. The best model's test output is `{hypothesis_name}` (one line per reference line), so anyone can
recompute the score with sacreBLEU.

{table}

{published}

![training curves](curves.png)
""")
  print(open(os.path.join(output, "RESULTS.md")).read())


if __name__ == "__main__":
  app.run(main)
