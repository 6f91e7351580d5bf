"""Score translation runs and write a results page: RESULTS.md, records.json, curves and the best test output.

    python -m experiments.translation_results --experiment=multi30k \\
        --run=transformer_small:/tmp/multi30k_small --run=gru_bahdanau:/tmp/multi30k_gru \\
        --source_dir=DIR  # the raw files (see transformer/data/multi30k); default: downloaded
    python -m experiments.translation_results --experiment=multi30k --from_records --update_committed

Where the page goes: ``--output_dir=DIR``; by default ``WORKDIR/results/`` of the first ``--run`` (with no
``--run``: ``./results-<experiment>/``); the folder is printed at the end. A folder without a ``records.json`` yet
starts from the committed page (``experiments/<experiment>/``: its records, ``runs_not_kept.md``, ``curves.png``
and the test outputs of its rows), so your rows are shown beside the published ones; a committed row of the same
name as one of yours is kept as ``NAME (committed)``. The committed page is only written with
``--update_committed``, and there a row is only replaced by a run of at least as many training steps as it
records (else one line says which row and both step counts), unless ``--force``.

Each ``--run=VARIANT:WORKDIR`` is a finished (or interrupted) run of ``experiments/<experiment>.py:VARIANT``;
``--run=ROW=VARIANT:WORKDIR`` names its row ROW instead of VARIANT (e.g. a run of an earlier setting of the
variant, kept beside the current one). Its best checkpoint (chosen on validation) is scored with
``launch.py --mode=eval`` unless ``WORKDIR/eval_results.json`` is already newer than its checkpoints. A row keeps
its run's settings (``config.json`` as saved, read through ``transformer.train.convert_run.upgrade_config`` so
that runs saved in an older config shape compare field by field), and its command is the variant's plus the
``--config.*`` overrides that turn the variant as it is when the page is written into those settings, so it
reproduces that run after later default changes too. Each row, with its curves, is a record of the page's
``records.json`` (``report.RecordStore``; replaced when that row is reported again), so runs made on different
days or machines end up in one table. The row with the best validation BLEU gives the page's test hypotheses
(copied from that run's folder, so the file always belongs to a row of the table); every other scored row's go
to ``hypotheses/ROW/`` (the best row's move there when another row beats it), so each test BLEU in the table can
be recomputed with sacreBLEU, and the page lists each row's files or says that they are not committed and how to
make them. Rows that differ only in ``config.seed`` are also tabled together: each seed's BLEU and their mean. A
second table splits each run's test BLEU by the reference's length in words
(``transformer.tasks.metrics.bleu_by_reference_length``). With ``--validation_only`` the runs are not decoded
again: a third table lists them beside the scored ones by the validation BLEU their training logged, for settings
that lost on validation. ``--from_records`` (or no ``--run``) rewrites the page from ``records.json`` alone
(e.g. with ``--update_committed`` after ``experiments/attention_plots.py`` added the ``attention/`` or
``alignment/`` folder it links). A hand-written ``runs_not_kept.md`` in the page's folder (settings tried whose
workdirs are gone) is quoted at the end of the page.
"""
from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import shlex
import shutil

from experiments import report
from transformer.errors import ConfigError, UserError
from transformer.tasks.metrics import bleu_by_reference_length
from transformer.train.convert_run import upgrade_config
from transformer.train.writers import read_metrics

EXPERIMENTS = ("multi30k", "iwslt15_en_vi")

# Published full-data results, quoted for reference (not reproduced here).
PUBLISHED = {
    "iwslt15_en_vi": [
        ("Luong & Manning 2015, LSTM + attention (133k pairs)", "23.3"),
        ("TensorFlow NMT tutorial, LSTM + attention (133k pairs)", "26.1"),
        ("Nguyen & Salazar 2019, Transformer (133k pairs)", "32.8"),
    ],
    "multi30k": [("Wu et al. 2021, text-only Transformer (4+4 layers, d_model 128)", "41.0 (lowercased)")],
}
# What each experiment's table must say beyond the rows.
NOTES = {
    "iwslt15_en_vi": (
        "The published numbers use all 133,317 training pairs; the rows above state how many pairs they used "
        "(the folder here holds only the first 10,000). With the full `train.en`/`train.vi` in the source "
        "folder the same builder uses them; a full-data run is "
        "`python launch.py --config=experiments/iwslt15_en_vi.py:transformer_small --workdir=WORKDIR "
        "--config.task.source_dir=DIR --config.task.max_tokens=4096 --config.num_train_steps=30000`. BLEU is "
        "sacreBLEU with `tokenize=none` on the Moses-tokenised tst2013.vi, as the published tokenised BLEU. "
        "Validation BLEU (checkpoint selection) is on the first 500 sentences of tst2012 "
        "(`task.num_eval_sentences`); the test BLEU is on all 1,268 sentences of tst2013."),
    "multi30k": (
        "Cased BLEU is sacreBLEU's default on detokenised output against the raw reference; lowercased BLEU "
        "(`-lc`) is the closest to the tokenised lowercased BLEU the Multi30k papers report."),
}
TEST_SPLIT = {"multi30k": "test_2016_flickr", "iwslt15_en_vi": "test"}
# The test set's own name, for the table and the committed hypotheses (IWSLT's TFDS "test" split is tst2013).
TEST_NAME = {"multi30k": "test_2016_flickr", "iwslt15_en_vi": "tst2013"}
TARGET_LANGUAGE = {"multi30k": "de", "iwslt15_en_vi": "vi"}
# Further test sets --mode=eval scores when the run's task.test_splits has them: reported beside the test set,
# never used to choose anything, their hypotheses committed beside its.
OTHER_TESTS = {"multi30k": ("test_2017_flickr", "test_2017_mscoco", "test_2018_flickr"), "iwslt15_en_vi": ()}
CURVES = ("train/nll", "eval/nll", "eval/bleu")
# Settings that say where the data lives, how a command ran or which test sets --mode=eval scores, not what was
# trained: never in a row's command.
NOT_TRAINING_SETTINGS = ("task.source_dir", "task.data_dir", "task.test_splits", "quiet", "tensorboard",
                         "async_checkpointing", "average_checkpoints", "translate_input", "translate_output")
# What a new page folder copies from the committed one, with the test outputs of its rows (they belong to them).
STARTING_FILES = (report.NOT_KEPT_NOTE, "curves.png")
# Beside the page: the test outputs of each scored row but the best (whose are the page's own files), one folder
# per row, so that every row's test BLEU can be recomputed.
ROW_OUTPUTS = "hypotheses"
# Folders of experiments/attention_plots.py output linked from RESULTS.md when present.
PLOT_FOLDERS = {"attention": "Transformer attention (encoder self, decoder self, cross)",
                "alignment": "RNN attention alignment"}


def config_overrides(experiment: str, variant: str, run_config: dict) -> list[str]:
  """The ``--config.KEY=VALUE`` flags that turn ``experiments/<experiment>.py:VARIANT`` as it is now into
  ``run_config`` (a run's config.json, of any shape ``upgrade_config`` reads), so that a run made before the
  variant changed can be reproduced."""
  current = importlib.import_module(f"experiments.{experiment}").get_config(variant)
  run_config = upgrade_config(run_config)
  if run_config.get("model_name", current.model_name) != current.model_name:
    raise ConfigError(f"the run trained model_name={run_config['model_name']!r}, but experiments/{experiment}.py:"
                      f"{variant} builds {current.model_name!r}; report it under a variant of its model.")
  return report.config_overrides(current, run_config, NOT_TRAINING_SETTINGS)


def evaluate(args: argparse.Namespace, variant: str, workdir: str,
             average_checkpoints: int = 0) -> tuple[dict, str]:
  """``(eval_results, output_dir)`` of the best checkpoint, or of the mean of the last ``average_checkpoints``
  (run by ``launch.py --mode=eval`` unless its results are newer than the checkpoints)."""
  output_dir = os.path.join(workdir, f"average_last_{average_checkpoints}") if average_checkpoints else workdir
  path = os.path.join(output_dir, "eval_results.json")
  checkpoints = os.path.join(workdir, "checkpoints")
  newest = max((os.path.getmtime(os.path.join(checkpoints, s)) for s in os.listdir(checkpoints)), default=0)
  stale = not os.path.exists(path) or os.path.getmtime(path) < newest
  if not stale:
    with open(path) as f:  # results from before the experiment chose alpha on validation
      stale = (f"{TEST_SPLIT[args.experiment]}/length_penalty" not in json.load(f) and
               bool(importlib.import_module(f"experiments.{args.experiment}").get_config(variant)
                    .task.length_penalty_candidates))
  if stale:
    command = [f"--config=experiments/{args.experiment}.py:{variant}",
               f"--workdir={workdir}", "--mode=eval", "--config.quiet=True",
               f"--config.average_checkpoints={average_checkpoints}"]
    with open(os.path.join(workdir, "config.json")) as f:  # the run's settings, should the variant have changed
      command += config_overrides(args.experiment, variant, json.load(f))
    if args.source_dir:
      command.append(f"--config.task.source_dir={args.source_dir}")
    if args.data_dir:
      command.append(f"--config.task.data_dir={args.data_dir}")
    report.run_launch(command)
  with open(path) as f:
    return json.load(f), output_dir


def validation_bleu(results: dict, eval_split: str) -> float:
  """Validation BLEU of an evaluation: with the length penalty chosen on validation when one was chosen."""
  return results.get(f"{eval_split}/bleu", results["eval/bleu"])


def _prepared_dataset(args: argparse.Namespace, config: dict):
  """``(builder, source_language, target_language)`` of the run's prepared dataset."""
  from transformer.data.translation import prepare_dataset
  task = config["task"]
  return prepare_dataset(args.experiment, task["pair"], data_dir=task["data_dir"] or args.data_dir or None,
                         source_dir=task["source_dir"] or args.source_dir or None)


def training_pairs(args: argparse.Namespace, config: dict) -> int:
  """How many training pairs the run's prepared dataset holds (results must say)."""
  builder, _, _ = _prepared_dataset(args, config)
  return builder.info.splits["train"].num_examples


def test_references(args: argparse.Namespace, config: dict) -> list[str]:
  """The test split's reference sentences, in the order of the hypotheses ``--mode=eval`` writes."""
  from transformer.data.translation import read_split_text
  builder, _, target_language = _prepared_dataset(args, config)
  return read_split_text(builder, TEST_SPLIT[args.experiment], [target_language])[target_language]


def test_bleu_by_reference_length(args: argparse.Namespace, config: dict, output_dir: str) -> dict:
  """``bleu_by_reference_length`` of the test hypotheses in ``output_dir`` (written by ``--mode=eval``)."""
  path = os.path.join(output_dir, f"{TEST_SPLIT[args.experiment]}.hyp.{TARGET_LANGUAGE[args.experiment]}")
  with open(path) as f:
    hypotheses = f.read().split("\n")[:-1]  # one line per reference, newline-terminated
  return bleu_by_reference_length(hypotheses, test_references(args, config),
                                  config["task"].get("bleu_tokenize", "13a"))


def trained_run(args: argparse.Namespace, variant: str, workdir: str) -> dict:
  """What a row says of a run from its workdir alone (no decoding): size, training pairs, steps and wall time,
  the run's settings (its command is derived from them, see ``run_command``), hardware and curves."""
  with open(os.path.join(workdir, "config.json")) as f:
    config = json.load(f)
  with open(os.path.join(workdir, "model_config.json")) as f:
    model_config = json.load(f)
  records = read_metrics(workdir)
  trained = [r for r in records if "wall_seconds" in r]  # training logs (evaluations have no wall time)
  size = (f"{model_config['num_encoder_layers']}+{model_config['num_decoder_layers']} layers, "
          f"d_model {model_config['d_model']}" if "d_model" in model_config else
          f"{model_config['cell']}, {model_config['attention']}, hidden {model_config['hidden_dim']}")
  return {
      "size": size,
      "training_pairs": training_pairs(args, config),
      "steps_trained": steps_trained(records),
      "steps_planned": config["num_train_steps"],
      "wall_hours": trained[-1]["wall_seconds"] / 3600 if trained else math.nan,
      # The run's settings: its command is derived from them against the variant's defaults of the day the
      # page is written (run_command), so a row stays reproducible when the defaults change later.
      "variant": variant,
      "config": config,
      "source_dir": args.source_dir or "$TRANSFORMER_DATA_DIR",
      "hardware": args.hardware or report.machine_description(),
      "note": args.note,
      "curves": [{k: v for k, v in r.items() if k == "step" or k in CURVES}
                 for r in records if any(k in r for k in CURVES)],
  }


def summarize(args: argparse.Namespace, variant: str, workdir: str) -> tuple[dict, str]:
  """``(row, output_dir)``: the table row and curves of one run, and the folder of its test outputs.

  Scores the best checkpoint (on validation) and, with ``--average_checkpoints``, also the mean of the last
  that many checkpoints; the one with the higher validation BLEU is reported (never chosen on test).
  """
  experiment, average_checkpoints = args.experiment, args.average_checkpoints
  test = TEST_SPLIT[experiment]
  run = trained_run(args, variant, workdir)
  config = run["config"]
  eval_split = config["task"].get("eval_split", "validation")
  results, output_dir = evaluate(args, variant, workdir)
  candidates = {"best checkpoint": validation_bleu(results, eval_split)}
  if average_checkpoints:
    averaged, averaged_dir = evaluate(args, variant, workdir, average_checkpoints)
    candidates[f"mean of the last {average_checkpoints}"] = validation_bleu(averaged, eval_split)
    if validation_bleu(averaged, eval_split) > validation_bleu(results, eval_split):
      results, output_dir = averaged, averaged_dir
  summary = {
      **run,
      "best_step": results["step"],
      "averaged_steps": results.get("averaged_steps", []),
      "validation_bleu_by_checkpoint": candidates,
      "validation_bleu": validation_bleu(results, eval_split),
      # The run's config.json holds the training-time decoding settings; --mode=eval records what it used.
      "beam_size": upgrade_config(config)["decode"]["beam_size"],
      "length_penalty": results.get(f"{test}/length_penalty", upgrade_config(config)["decode"]["length_penalty"]),
      "validation_bleu_by_length_penalty": results.get(f"{eval_split}/bleu_by_length_penalty", {}),
      "test_bleu": results[f"{test}/bleu"],
      "test_bleu_lowercase": results[f"{test}/bleu_lowercase"],
      "test_bleu_by_reference_length": test_bleu_by_reference_length(args, config, output_dir),
      "signature": results[f"{test}/bleu_signature"],
      "other_tests": {split: {"bleu": results[f"{split}/bleu"], "bleu_lowercase": results[f"{split}/bleu_lowercase"]}
                      for split in OTHER_TESTS[experiment] if f"{split}/bleu" in results},
  }
  return {**summary, "command": run_command(experiment, summary)}, output_dir


def validation_summary(args: argparse.Namespace, variant: str, workdir: str) -> dict:
  """A run recorded only by the validation BLEU its training logged (``eval/bleu`` at each evaluation, decoded
  with the run's ``decode.length_penalty``): a setting compared on validation and never scored on test."""
  run = trained_run(args, variant, workdir)
  if not any("eval/bleu" in record for record in run["curves"]):
    raise UserError(f"{workdir}/metrics.jsonl has no eval/bleu: the run stopped before its first "
                         "evaluation (config.eval_every); train it further or leave it out.")
  return {**run, "command": run_command(args.experiment, run)}


def run_command(experiment: str, run: dict) -> str:
  """The command that trains ``run`` with today's ``experiments/<experiment>.py``: the variant plus the
  overrides that turn its defaults into the run's stored config."""
  variant = run["variant"]
  return " ".join([f"python launch.py --config=experiments/{experiment}.py:{variant} --workdir=WORKDIR",
                   f"--config.task.source_dir={run['source_dir']}",
                   *map(shlex.quote, config_overrides(experiment, variant, run["config"]))])


def decoding_label(decode: dict, length_penalty: float | None = None) -> str:
  """How a run decoded, for a table: ``greedy``, ``beam 5, alpha 0.6`` (``length_penalty``: the alpha chosen on
  validation, else the config's) or ``sampling, temperature 0.8, top-p 0.9``, from its ``config.decode``."""
  if decode["method"] == "greedy":
    return "greedy"
  if decode["method"] == "beam":
    alpha = decode["length_penalty"] if length_penalty is None else length_penalty
    return f"beam {decode['beam_size']}, alpha {alpha:g}"
  settings = [f"temperature {decode['temperature']:g}"]
  settings += [f"top-k {decode['top_k']}"] if decode["top_k"] else []
  settings += [f"top-p {decode['top_p']:g}"] if decode["top_p"] < 1 else []
  settings += [f"best of {decode['num_samples']}"] if decode["num_samples"] > 1 else []
  return ", ".join(["sampling", *settings])


def row(name: str, run: dict) -> list:
  stopped = (f" (stopped early of {run['steps_planned']})" if run["steps_trained"] < run["steps_planned"]
             else "")
  averaged = run.get("averaged_steps")
  checkpoint = (f"mean of steps {', '.join(map(str, averaged))}" if averaged else str(run["best_step"]))
  by_alpha = run.get("validation_bleu_by_length_penalty")
  decoding = (decoding_label(upgrade_config(run["config"])["decode"], run["length_penalty"])
              if run.get("length_penalty") is not None else "")  # rows reported before decoding settings were recorded
  if by_alpha:
    decoding += " (on validation: " + ", ".join(f"{float(a):g}: {b:.2f}" for a, b in by_alpha.items()) + ")"
  return [name, str(run_seed(run)), run["size"], f"{run['training_pairs']:,}",
          f"{checkpoint} of {run['steps_trained']}{stopped}",
          f"{run['wall_hours']:.2f} h", decoding, f"{run['validation_bleu']:.2f}", f"{run['test_bleu']:.2f}",
          f"{run['test_bleu_lowercase']:.2f}", run["hardware"] + (f"; {run['note']}" if run["note"] else ""),
          f"`{run['signature']}`", f"`{run['command']}`"]


def run_seed(run: dict) -> int:
  """The row's ``config.seed`` (initialisation, dropout and data order)."""
  return upgrade_config(run["config"]).get("seed", 0)


def seed_groups(runs: dict) -> list[list[str]]:
  """Rows that trained the same settings on the same data with different ``config.seed``, each group in seed
  order; groups of one seed, or where two rows share a seed (a rerun: which to average is unclear), are left out."""
  groups: dict[str, list[str]] = {}
  for name, run in runs.items():
    settings = {key: value for key, value in report.flatten_config(upgrade_config(run["config"])).items()
                if key != "seed" and key not in NOT_TRAINING_SETTINGS}
    groups.setdefault(json.dumps([settings, run["training_pairs"]], sort_keys=True, default=str), []).append(name)
  seeded = []
  for names in groups.values():
    seeds = [run_seed(runs[name]) for name in names]
    if len(names) > 1 and len(set(seeds)) == len(seeds):
      seeded.append(sorted(names, key=lambda name: run_seed(runs[name])))
  return seeded


def seeds_table(test: str, runs: dict) -> str:
  """Markdown section: for each ``seed_groups`` group, each seed's test and validation BLEU and their mean (the
  number to quote for the setting), or "" when no row has a second seed."""
  def mean_and_each(names: list[str], key: str) -> str:
    values = [runs[name][key] for name in names]
    return f"{sum(values) / len(values):.2f} ({', '.join(f'{value:.2f}' for value in values)})"
  rows = [[", ".join(names), ", ".join(str(run_seed(runs[name])) for name in names),
           *(mean_and_each(names, key) for key in ("test_bleu", "test_bleu_lowercase", "validation_bleu"))]
          for names in seed_groups(runs)]
  if not rows:
    return ""
  table = report.markdown_table(
      ["rows", "seeds", f"{test} BLEU: mean (each seed)", f"{test} BLEU lowercased: mean (each seed)",
       "validation BLEU: mean (each seed)"], rows)
  return (f"\nRows that trained the same settings with another `config.seed` (initialisation, dropout and data "
          f"order), each seed's checkpoint and alpha chosen on validation as above; the mean over seeds is the "
          f"number to quote for the setting, one seed's row is one draw:\n\n{table}\n")


def row_outputs_folder(output: str, name: str) -> str:
  """Where the test outputs of row ``name`` are kept in the page's folder, unless it is the best row."""
  return os.path.join(output, ROW_OUTPUTS, name)


def keep_row_outputs(experiment: str, output: str, name: str) -> None:
  """Move the page's own test outputs, row ``name``'s until now, into ``hypotheses/NAME/``: another row has
  become the best on validation and takes the page's files."""
  for _, page_name in test_outputs(experiment):
    path = os.path.join(output, page_name)
    if os.path.exists(path):
      os.makedirs(row_outputs_folder(output, name), exist_ok=True)
      shutil.move(path, os.path.join(row_outputs_folder(output, name), page_name))


def copy_row_outputs(experiment: str, output_dir: str, folder: str) -> None:
  """Copy the test outputs ``--mode=eval`` wrote in ``output_dir`` into ``folder`` under the page's names,
  replacing what an earlier run of the row left there."""
  shutil.rmtree(folder, ignore_errors=True)
  for written, page_name in test_outputs(experiment):
    if os.path.exists(os.path.join(output_dir, written)):
      os.makedirs(folder, exist_ok=True)
      shutil.copy(os.path.join(output_dir, written), os.path.join(folder, page_name))


def outputs_table(experiment: str, output: str, runs: dict, best: str) -> str:
  """Markdown section: each scored row's test outputs in the page's folder (the best row's are the page's own
  files), or that they are not committed and the commands that make them."""
  test = TEST_NAME[experiment]
  rows = []
  for name, run in runs.items():
    if name == best:
      files = [page_name for _, page_name in test_outputs(experiment)
               if os.path.exists(os.path.join(output, page_name))]
    else:
      files = [f"{ROW_OUTPUTS}/{name}/{page_name}" for _, page_name in test_outputs(experiment)
               if os.path.exists(os.path.join(row_outputs_folder(output, name), page_name))]
    spec = f"{name}={run['variant']}" if name != run["variant"] else run["variant"]
    missing = ("not committed (the row was reported before every row's outputs were kept): train it with the "
               f"row's command, then `python -m experiments.translation_results --experiment={experiment} "
               f"--run={spec}:WORKDIR` scores it and writes them")
    rows.append([name, f"{run['test_bleu']:.2f}", ", ".join(f"`{path}`" for path in files) or missing])
  table = report.markdown_table(["model", f"{test} BLEU", "test outputs in this folder"], rows)
  return (f"\nEach row's test outputs (one line per reference line, the row's checkpoint and decoding): "
          f"`sacrebleu REFERENCE -i FILE --tokenize TOK` recomputes its BLEU, with the reference file of the test "
          f"set from the source folder and TOK the `tok:` of the row's sacreBLEU signature (`-lc` for the "
          f"lowercased column):\n\n{table}\n")


def by_length_table(test: str, runs: dict) -> str:
  """Markdown section: each row's test BLEU by reference length (rows reported before it was measured are
  left out), or "" when no row has it."""
  measured = {name: run["test_bleu_by_reference_length"] for name, run in runs.items()
              if run.get("test_bleu_by_reference_length")}
  if not measured:
    return ""
  groups = list(dict.fromkeys(group for by_length in measured.values() for group in by_length))
  sentences = {group: next(by_length[group]["sentences"] for by_length in measured.values() if group in by_length)
               for group in groups}
  table = report.markdown_table(
      ["model"] + [f"{group} words ({sentences[group]:,} sentences)" for group in groups],
      [[name] + [f"{by_length[group]['bleu']:.2f} (length ratio {by_length[group]['length_ratio']:.2f})"
                 if group in by_length else "-" for group in groups] for name, by_length in measured.items()])
  return (f"\n{test} BLEU by the reference's length in words (same decoding as the table above; the length "
          f"ratio is hypothesis / reference length within the group):\n\n{table}\n")


def validation_table(runs: dict, validation_runs: dict) -> str:
  """Markdown section: every run (those scored on test above and those recorded with ``--validation_only``) by
  the validation BLEU its training logged at each evaluation, one decoding setting per run, so settings
  are compared on validation alone; "" when there are no validation-only runs."""
  if not validation_runs:
    return ""
  rows = []
  for name, run in {**runs, **validation_runs}.items():
    task = run["config"]["task"]
    evaluations = [r for r in run["curves"] if "eval/bleu" in r]
    sentences = task.get("num_eval_sentences", 0)
    decoding = (decoding_label(upgrade_config(run["config"])["decode"])
                + (f", first {sentences:,} sentences" if sentences else ""))
    rows.append([name, run["size"], f"{run['training_pairs']:,}", str(run["steps_trained"]),
                 f"{run['wall_hours']:.2f} h", decoding,
                 ", ".join(f"{r['step']}: {r['eval/bleu']:.2f}" for r in evaluations),
                 f"{evaluations[-1]['eval/nll']:.2f}" if evaluations and "eval/nll" in evaluations[-1] else "-",
                 "yes (table above)" if name in runs else "no",
                 run["hardware"] + (f"; {run['note']}" if run["note"] else ""), f"`{run['command']}`"])
  table = report.markdown_table(
      ["model", "size", "training pairs", "steps trained", "training wall time", "decoding during training",
       "validation BLEU at each evaluation (step: BLEU)", "validation NLL at the last evaluation",
       "scored on test", "hardware", "command"], rows)
  return ("\nEvery run by the validation BLEU its training logged (written with `--validation_only` for runs "
          "that lost on validation and were never scored on the test set; NLL per piece, so only comparable "
          f"between runs of the same tokenizer):\n\n{table}\n")


def hypothesis_name(experiment: str) -> str:
  """The page's file of the best row's test output, named after the test set (e.g. ``test_2016_flickr.hyp.de``)."""
  return f"{TEST_NAME[experiment]}.hyp.{TARGET_LANGUAGE[experiment]}"


def test_outputs(experiment: str) -> list[tuple[str, str]]:
  """``(file --mode=eval writes, the page's file)`` of the test set and of each of ``OTHER_TESTS``."""
  language = TARGET_LANGUAGE[experiment]
  return [(f"{TEST_SPLIT[experiment]}.hyp.{language}", hypothesis_name(experiment)),
          *((f"{split}.hyp.{language}",) * 2 for split in OTHER_TESTS[experiment])]


def other_tests_table(experiment: str, runs: dict) -> str:
  """BLEU on ``OTHER_TESTS`` of the rows that have it ("" when none has)."""
  splits = OTHER_TESTS[experiment]
  scored = {name: run for name, run in runs.items() if run.get("other_tests")}
  if not scored:
    return ""
  rows = [[name, *(f"{run['other_tests'][split][key]:.2f}" if split in run["other_tests"] else "-"
                   for split in splits for key in ("bleu", "bleu_lowercase"))] for name, run in scored.items()]
  table = report.markdown_table(
      ["model", *(f"{split} BLEU{suffix}" for split in splits for suffix in ("", " lowercased"))], rows)
  return (f"\nThe other test sets, scored with the same checkpoint and decoding as the row's {TEST_NAME[experiment]} "
          f"(rows whose `--mode=eval` had them in `task.test_splits`); nothing was chosen on them:\n\n{table}\n")


def steps_trained(records: list[dict]) -> int:
  """The last training step a run's metrics record (0 before the first log)."""
  trained = [r for r in records if "wall_seconds" in r]
  return trained[-1]["step"] if trained else 0


def check_checkpoints(workdir: str, average_checkpoints: int) -> None:
  """Refuses (``UserError``) ``--average_checkpoints`` larger than the number of checkpoints ``workdir`` kept."""
  folder = os.path.join(workdir, "checkpoints")
  kept = sorted(int(name) for name in os.listdir(folder) if name.isdigit()) if os.path.isdir(folder) else []
  if len(kept) < average_checkpoints:
    raise UserError(f"--average_checkpoints={average_checkpoints}: {workdir} kept {len(kept)} checkpoint(s) (steps "
                    f"{', '.join(map(str, kept)) or 'none'}); give --average_checkpoints={len(kept)} or fewer, or "
                    "leave it out to score the best checkpoint alone.")


def parse_run(experiment: str, spec: str) -> tuple[str, str, str]:
  """``--run`` value ``[ROW=]VARIANT:WORKDIR`` -> ``(row name, variant, workdir)``; the row name defaults to
  the variant. A malformed value, an unknown variant or a missing workdir is a UserError naming the fix."""
  name_and_variant, _, workdir = spec.partition(":")
  name, _, variant = name_and_variant.rpartition("=")
  if not workdir or not variant:
    raise UserError(f"--run={spec!r}: give VARIANT:WORKDIR or ROW=VARIANT:WORKDIR")
  variants = importlib.import_module(f"experiments.{experiment}").VARIANTS
  if variant not in variants:
    raise UserError(f"--run={spec!r}: unknown variant {variant!r} of experiments/{experiment}.py; choose "
                         f"one of {list(variants)}")
  if not os.path.isfile(os.path.join(workdir, "config.json")):
    raise UserError(f"--run={spec!r}: {workdir} holds no config.json; give the --workdir of a training run")
  return name or variant, variant, workdir


# ------------------------------------------------------------------------------ rows as records

def add_row(experiment: str, store: report.RecordStore, name: str, run: dict) -> None:
  """Row ``name`` (a ``summarize`` or ``validation_summary`` dict) into ``store``: its steps, command
  (``run_command``) and hardware as the record's, the rest as its values."""
  store.add(name, steps=run["steps_trained"], command=run_command(experiment, run), machine=run["hardware"],
            values={key: value for key, value in run.items() if key not in ("steps_trained", "command", "hardware")})


def stored_rows(store: report.RecordStore) -> tuple[dict, dict]:
  """``(scored, validation_only)``: row name -> the row as ``add_row`` took it, in the store's order; a row
  scored on test has a test BLEU."""
  rows = {name: {**record["values"], "steps_trained": record["steps"], "command": record["command"],
                 "hardware": record["machine"]} for name, record in store.items()}
  scored = {name: run for name, run in rows.items() if "test_bleu" in run}
  return scored, {name: run for name, run in rows.items() if name not in scored}


def start_page(experiment: str, store: report.RecordStore, output: str, committed: str, new_names: set[str]) -> None:
  """Starts the page in ``output`` (a folder without records yet; ``store`` holds the committed ones) from the
  committed one in ``committed``: its notes, curves and the test outputs of its rows. A committed row named as one
  of ``new_names`` is kept as ``NAME (committed)`` (its outputs' folder too), so the new run of that name is shown
  beside it."""
  os.makedirs(output, exist_ok=True)
  for name in (*STARTING_FILES, *(page_name for _, page_name in test_outputs(experiment))):
    if os.path.exists(os.path.join(committed, name)):
      shutil.copy(os.path.join(committed, name), os.path.join(output, name))
  for name in (os.listdir(os.path.join(committed, ROW_OUTPUTS))
               if os.path.isdir(os.path.join(committed, ROW_OUTPUTS)) else ()):
    shutil.copytree(os.path.join(committed, ROW_OUTPUTS, name),
                    row_outputs_folder(output, f"{name} (committed)" if name in new_names else name))
  for name in new_names & set(store):
    store.rename(name, f"{name} (committed)")


def add_runs(experiment: str, store: report.RecordStore, output: str, new_runs: dict[str, tuple[dict, str]],
             new_validation_runs: dict[str, dict]) -> None:
  """Record ``new_runs`` (row name -> ``summarize``'s (row, output folder)) and ``new_validation_runs`` (row
  name -> ``validation_summary``) in ``store``, and copy the test output of a run that beats every stored one on
  validation into ``output`` (the former best row's move to its ``hypotheses/ROW/``). A refused replacement
  (``RecordStore.check``) stops it before any file is touched."""
  store.check({**{name: run["steps_trained"] for name, run in new_validation_runs.items()},
               **{name: summary["steps_trained"] for name, (summary, _) in new_runs.items()}})
  hypotheses = hypothesis_name(experiment)
  runs, _ = stored_rows(store)
  # The folder's test output is the best row's (as this function keeps it), until that row is replaced.
  owner = max(runs, key=lambda name: runs[name]["validation_bleu"], default=None)
  # A row reported again is replaced: the old row's score no longer counts.
  best_before = max((run["validation_bleu"] for name, run in runs.items() if name not in new_runs),
                    default=-math.inf)
  for name, (summary, output_dir) in new_runs.items():
    add_row(experiment, store, name, summary)
    if summary["validation_bleu"] > best_before:  # the best model so far: its test outputs are the page's
      best_before = summary["validation_bleu"]
      if owner is not None and owner != name:  # the former best row keeps its outputs in its own folder
        keep_row_outputs(experiment, output, owner)
      shutil.rmtree(row_outputs_folder(output, name), ignore_errors=True)  # an earlier run's of this row
      for written, page_name in test_outputs(experiment):
        if os.path.exists(os.path.join(output_dir, written)) or page_name == hypotheses:
          shutil.copy(os.path.join(output_dir, written), os.path.join(output, page_name))
        elif os.path.exists(os.path.join(output, page_name)):
          os.remove(os.path.join(output, page_name))  # the previous best's: not this run's
      owner = name
    else:
      copy_row_outputs(experiment, output_dir, row_outputs_folder(output, name))
  runs, _ = stored_rows(store)
  for name, run in new_validation_runs.items():
    if name not in runs:  # a run scored on test is no longer a validation-only row
      add_row(experiment, store, name, run)
  best = max(runs, key=lambda name: runs[name]["validation_bleu"], default=None)
  if owner in new_runs and owner != best:  # the best row was replaced by a worse run: no row's output now
    for _, page_name in test_outputs(experiment):
      if os.path.exists(os.path.join(output, page_name)):
        os.remove(os.path.join(output, page_name))


def render_page(experiment: str, store: report.RecordStore, output: str) -> str:
  """The page's text from ``store`` and the files in ``output`` (test outputs, plot folders, the not-kept note);
  redraws ``curves.png``. Each row's command is derived again from its settings (``run_command``: the variant's
  defaults of today)."""
  for name, record in store.items():
    record["command"] = run_command(experiment, {**record["values"]})
  runs, validation_runs = stored_rows(store)
  if not runs:
    raise UserError("give at least one --run=VARIANT:WORKDIR to score on test (without --validation_only): the "
                    "page needs one model scored on test")
  test = TEST_NAME[experiment]
  hypotheses = hypothesis_name(experiment)
  best = max(runs, key=lambda name: runs[name]["validation_bleu"])
  if any(run["curves"] for run in runs.values()):  # rows carried over without curves keep the old plot
    report.plot_curves({name: run["curves"] for name, run in runs.items()}, list(CURVES),
                       os.path.join(output, "curves.png"), f"{experiment}: training curves")
  table = report.markdown_table(
      ["model", "seed", "size", "training pairs", "checkpoint (chosen on validation) of steps trained",
       "training wall time", "decoding (length penalty alpha chosen on validation)", "validation BLEU",
       f"{test} BLEU", f"{test} BLEU lowercased", "hardware",
       "sacreBLEU signature", "command"], [row(name, run) for name, run in runs.items()])
  published = report.markdown_table(["published result", f"{test} BLEU"], PUBLISHED[experiment])
  others = [page_name for _, page_name in test_outputs(experiment)[1:]
            if os.path.exists(os.path.join(output, page_name))]
  test_output = (f"The best model on validation ({best}) gives `{hypotheses}`"
                 + "".join(f", `{name}`" for name in others)
                 + " (one line per reference line), so\nanyone can recompute its score with sacreBLEU."
                 if os.path.exists(os.path.join(output, hypotheses)) else
                 f"The best model on validation ({best}) has no test output in this folder (the row that gave it was "
                 f"replaced by a worse run): report {best} again to add `{hypotheses}`.")
  plots = [f"[{title}]({folder}/README.md)" for folder, title in PLOT_FOLDERS.items()
           if os.path.exists(os.path.join(output, folder, "README.md"))]
  plots_line = (f"\nAttention heatmaps (written by `python -m experiments.attention_plots`; each README has its "
                f"command): {', '.join(plots)}.\n" if plots else "")
  return f"""# {experiment}: translation results

Written by `python -m experiments.translation_results --experiment={experiment} --run=VARIANT:WORKDIR ...`
from `{report.RECORDS_FILE}` (one entry per row, added or replaced by each invocation); do not edit by hand.

Checkpoints are chosen on the validation split (the best single checkpoint, or with `--average_checkpoints=N`
the mean of the last N when that scores higher on validation); the test split is scored by `--mode=eval`,
with beam search. {test_output}

{table}

{NOTES[experiment]}
{seeds_table(test, runs)}{outputs_table(experiment, output, runs, best)}{other_tests_table(experiment, runs)}\
{by_length_table(test, runs)}{validation_table(runs, validation_runs)}
{published}

![training curves](curves.png)
{plots_line}{report.runs_not_kept(output)}"""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
  parser = report.results_parser(__doc__, "WORKDIR/results/ of the first --run", hardware=True)
  parser.add_argument("--experiment", default="multi30k", choices=EXPERIMENTS, help="Which experiment.")
  parser.add_argument("--run", action="append", default=[], help="[ROW=]VARIANT:WORKDIR of a run to report (ROW: "
                      "the row's name, default VARIANT); repeat for several.")
  parser.add_argument("--source_dir", default="", help="Raw data folder (as --config.task.source_dir).")
  parser.add_argument("--data_dir", default="", help="TFDS data dir (as --config.task.data_dir).")
  parser.add_argument("--average_checkpoints", type=int, default=0, help="Also score the mean of the last N "
                      "checkpoints and report it if it is better on validation (each run must have kept N: "
                      "config.keep_checkpoints and enough checkpoints saved).")
  parser.add_argument("--validation_only", action="store_true", help="Record the --run runs from their training "
                      "logs alone, in the table of runs compared on validation (no decoding, never scored on the "
                      "test set): for settings that lost on validation.")
  parser.add_argument("--note", default="", help="A remark stored with the rows of this invocation (e.g. shared "
                      "CPU).")
  return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
  args = parse_args(argv)
  experiment = args.experiment
  committed = os.path.join(report.COMMITTED, experiment)
  specs = [report.exit_on_user_error(parse_run, experiment, spec) for spec in args.run]
  default = (os.path.join(specs[0][2], "results") if specs else os.path.join(os.getcwd(), f"results-{experiment}"))
  started = []

  def start(store: report.RecordStore, folder: str, new_names: set[str]) -> None:
    """A new folder starts from the committed page's files, once (before the new rows' files are added)."""
    if not started and not os.path.exists(store.path) and os.path.realpath(folder) != os.path.realpath(committed):
      start_page(experiment, store, folder, committed, new_names)
    started.append(folder)

  def collect(store: report.RecordStore, folder: str) -> None:
    start(store, folder, {name for name, _, _ in specs})
    # Before the runs are decoded: a refused row costs nothing.
    store.check({name: steps_trained(read_metrics(workdir)) for name, _, workdir in specs})
    if args.average_checkpoints and not args.validation_only:
      for _, _, workdir in specs:
        check_checkpoints(workdir, args.average_checkpoints)
    new_runs, new_validation_runs = {}, {}
    for name, variant, workdir in specs:
      if args.validation_only:
        new_validation_runs[name] = validation_summary(args, variant, workdir)
      else:
        new_runs[name] = summarize(args, variant, workdir)
    add_runs(experiment, store, folder, new_runs, new_validation_runs)

  def render(store: report.RecordStore, folder: str) -> str:
    start(store, folder, set())
    return render_page(experiment, store, folder)

  report.make_page(args, committed, default, collect, render)


if __name__ == "__main__":
  main()
