r"""Score translation runs and write a results page: RESULTS.md, records.json, curves and the test outputs.

    python -m experiments.translation_results --experiment=multi30k \
        --run=transformer_small:/tmp/multi30k_small --run=gru_bahdanau:/tmp/multi30k_gru \
        --source_dir=DIR  # the raw files (see transformer/data/multi30k); default: downloaded
    python -m experiments.translation_results --experiment=multi30k --from_records --update_committed

Each ``--run=[ROW=]VARIANT:WORKDIR`` (a run of ``experiments/<experiment>.py:VARIANT``, in row ROW) is scored on
test by ``launch.py --mode=eval`` with its checkpoint chosen on validation, unless ``WORKDIR/eval_results.json`` is
newer than its checkpoints. The page goes to ``--output_dir``, by default ``WORKDIR/results/`` of the first
``--run``; a new folder starts from the committed page (``experiments/<experiment>/``), whose row of a new row's
name is kept as ``NAME (committed)``. The committed page is only written with ``--update_committed``, and there a
row is only replaced by a run of at least as many training steps, unless ``--force``. ``--from_records`` (or no
``--run``) rewrites the page from ``records.json`` alone. More in docs/translation.md (Results tables); the page
says what each of its tables and files holds.
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
from transformer.train.run_directory import CHECKPOINTS, CONFIG, EVAL_RESULTS, MODEL_CONFIG, RunDirectory

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
        "(`task.num_eval_sentences`); the test BLEU is on all 1,268 sentences of tst2013. One glimpse of the test "
        "set: the RNN rows' step budget was set after a GRU run's tst2013 BLEU had been seen during training (under "
        "Runs not kept), so the RNN rows' tst2013 scores are not wholly blind to it; nothing else was chosen on "
        "tst2013."),
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
STARTING_FILES = (report.NOT_KEPT_NOTE, "curves.png")  # and the PLOT_FOLDERS
# Beside the page, one folder per scored row but the best (whose are the page's own files): its test outputs.
ROW_OUTPUTS = "hypotheses"
# Folders of experiments/attention_plots.py output linked from RESULTS.md when present.
PLOT_FOLDERS = {"attention": "Transformer attention (encoder self, decoder self, cross)",
                "alignment": "RNN attention alignment"}


def config_overrides(experiment: str, variant: str, run_config: dict) -> list[str]:
  """The ``--config.KEY=VALUE`` flags that turn ``experiments/<experiment>.py:VARIANT`` as it is now into
  ``run_config`` (a run's config.json, of any shape ``upgrade_config`` reads)."""
  current = importlib.import_module(f"experiments.{experiment}").get_config(variant)
  run_config = upgrade_config(run_config)
  if run_config.get("model_name", current.model_name) != current.model_name:
    raise ConfigError(f"the run trained model_name={run_config['model_name']!r}, but experiments/{experiment}.py:"
                      f"{variant} builds {current.model_name!r}; report it under a variant of its model.")
  return report.config_overrides(current, run_config, NOT_TRAINING_SETTINGS)


def run_command(experiment: str, run: dict) -> str:
  """The command that trains ``run``'s settings with today's ``experiments/<experiment>.py``."""
  return " ".join([f"python launch.py --config=experiments/{experiment}.py:{run['variant']} --workdir=WORKDIR",
                   f"--config.task.source_dir={run['source_dir']}",
                   *map(shlex.quote, config_overrides(experiment, run["variant"], run["config"]))])


def evaluate(args: argparse.Namespace, variant: str, workdir: str,
             average_checkpoints: int = 0) -> tuple[dict, str]:
  """``(eval_results, output_dir)`` of the best checkpoint, or of the mean of the last ``average_checkpoints``
  (run by ``launch.py --mode=eval`` unless its results are newer than the checkpoints)."""
  directory = RunDirectory(workdir)
  output_dir = directory.output_dir(average_checkpoints)
  path = os.path.join(output_dir, EVAL_RESULTS)
  checkpoints = directory.path(CHECKPOINTS)
  newest = max((os.path.getmtime(os.path.join(checkpoints, s)) for s in os.listdir(checkpoints)), default=0)
  fresh = os.path.exists(path) and os.path.getmtime(path) >= newest
  results = directory.eval_results(average_checkpoints) if fresh else {}
  experiment = importlib.import_module(f"experiments.{args.experiment}")
  # Results from before the experiment chose alpha on validation are stale too.
  if not results or (f"{TEST_SPLIT[args.experiment]}/length_penalty" not in results
                     and experiment.get_config(variant).task.length_penalty_candidates):
    run_config = directory.config_values(any_format=True)  # the run's settings, should the variant change
    report.run_launch([f"--config=experiments/{args.experiment}.py:{variant}", f"--workdir={workdir}",
                       "--mode=eval", "--config.quiet=True", f"--config.average_checkpoints={average_checkpoints}",
                       *config_overrides(args.experiment, variant, run_config),
                       *(f"--config.task.{key}={value}" for key, value in
                         (("source_dir", args.source_dir), ("data_dir", args.data_dir)) if value)])
    results = directory.eval_results(average_checkpoints)
  return results, output_dir


def _prepared_dataset(args: argparse.Namespace, config: dict):
  """``(builder, source_language, target_language)`` of the run's prepared dataset."""
  from transformer.data.translation import prepare_dataset
  task = config["task"]
  return prepare_dataset(args.experiment, task["pair"], data_dir=task["data_dir"] or args.data_dir or None,
                         source_dir=task["source_dir"] or args.source_dir or None)


def training_pairs(args: argparse.Namespace, config: dict) -> int:
  return _prepared_dataset(args, config)[0].info.splits["train"].num_examples


def test_references(args: argparse.Namespace, config: dict) -> list[str]:
  """The test split's reference sentences, in the order of the hypotheses ``--mode=eval`` writes."""
  from transformer.data.translation import read_split_text
  builder, _, target_language = _prepared_dataset(args, config)
  return read_split_text(builder, TEST_SPLIT[args.experiment], [target_language])[target_language]


def test_bleu_by_reference_length(args: argparse.Namespace, config: dict, output_dir: str) -> dict:
  """``bleu_by_reference_length`` of the test hypotheses ``--mode=eval`` wrote in ``output_dir``."""
  with open(os.path.join(output_dir, test_outputs(args.experiment)[0][0])) as f:
    hypotheses = f.read().split("\n")[:-1]  # one line per reference, newline-terminated
  return bleu_by_reference_length(hypotheses, test_references(args, config),
                                  config["task"].get("bleu_tokenize", "13a"))


def steps_trained(records: list[dict]) -> int:
  """The last training step a run's metrics record (0 before the first log)."""
  trained = [r for r in records if "wall_seconds" in r]  # training logs (evaluations have no wall time)
  return trained[-1]["step"] if trained else 0


def trained_run(args: argparse.Namespace, variant: str, workdir: str) -> dict:
  """What a row says of a run from its workdir alone (no decoding); its command is derived from its settings."""
  directory = RunDirectory(workdir)
  config, model = directory.config_values(any_format=True), directory.read_json(MODEL_CONFIG)
  records = report.run_metrics(workdir)
  trained = [r for r in records if "wall_seconds" in r]
  return {
      "size": (f"{model['num_encoder_layers']}+{model['num_decoder_layers']} layers, d_model {model['d_model']}"
               if "d_model" in model else f"{model['cell']}, {model['attention']}, hidden {model['hidden_dim']}"),
      "training_pairs": training_pairs(args, config), "steps_trained": steps_trained(records),
      "steps_planned": config["num_train_steps"],
      "wall_hours": trained[-1]["wall_seconds"] / 3600 if trained else math.nan,
      "variant": variant, "config": config, "source_dir": args.source_dir or "$TRANSFORMER_DATA_DIR",
      "hardware": args.hardware or report.machine_description(), "note": args.note,
      "curves": [{k: v for k, v in r.items() if k == "step" or k in CURVES}
                 for r in records if any(k in r for k in CURVES)],
  }


def summarize(args: argparse.Namespace, variant: str, workdir: str) -> tuple[dict, str]:
  """``(row, output_dir)``: the table row and curves of one run, and the folder of its test outputs: of the best
  checkpoint or, with ``--average_checkpoints``, of the mean of the last ones if better on validation."""
  test = TEST_SPLIT[args.experiment]
  run = trained_run(args, variant, workdir)
  eval_split = run["config"]["task"].get("eval_split", "validation")
  candidates = {"best checkpoint": evaluate(args, variant, workdir)}
  if args.average_checkpoints:
    candidates[f"mean of the last {args.average_checkpoints}"] = evaluate(
        args, variant, workdir, args.average_checkpoints)
  # Validation BLEU with the length penalty chosen on validation, where one was.
  bleu = {label: results.get(f"{eval_split}/bleu", results["eval/bleu"]) for label, (results, _) in candidates.items()}
  chosen = max(bleu, key=bleu.get)  # never chosen on test; the best checkpoint on a tie
  results, output_dir = candidates[chosen]
  decode = upgrade_config(run["config"])["decode"]  # as trained; --mode=eval records the alpha it chose
  return {
      **run, "best_step": results["step"], "averaged_steps": results.get("averaged_steps", []),
      "validation_bleu_by_checkpoint": bleu, "validation_bleu": bleu[chosen], "beam_size": decode["beam_size"],
      "length_penalty": results.get(f"{test}/length_penalty", decode["length_penalty"]),
      "validation_bleu_by_length_penalty": results.get(f"{eval_split}/bleu_by_length_penalty", {}),
      "test_bleu": results[f"{test}/bleu"], "test_bleu_lowercase": results[f"{test}/bleu_lowercase"],
      "test_bleu_by_reference_length": test_bleu_by_reference_length(args, run["config"], output_dir),
      "signature": results[f"{test}/bleu_signature"],
      "other_tests": {split: {"bleu": results[f"{split}/bleu"], "bleu_lowercase": results[f"{split}/bleu_lowercase"]}
                      for split in OTHER_TESTS[args.experiment] if f"{split}/bleu" in results},
  }, output_dir


def validation_summary(args: argparse.Namespace, variant: str, workdir: str) -> dict:
  """A run recorded only by the validation BLEU its training logged (``eval/bleu`` at each evaluation, decoded
  with the run's ``decode.length_penalty``): a setting compared on validation and never scored on test."""
  run = trained_run(args, variant, workdir)
  if not any("eval/bleu" in record for record in run["curves"]):
    raise UserError(f"{workdir}/metrics.jsonl has no eval/bleu: the run stopped before its first "
                    "evaluation (config.eval_every); train it further or leave it out.")
  return run


# ------------------------------------------------------------------------------ the page's tables

def decoding_label(decode: dict, length_penalty: float | None = None) -> str:
  """How a run decoded, for a table: ``greedy``, ``beam 5, alpha 0.6`` (``length_penalty``: the alpha chosen on
  validation, else the config's) or ``sampling, temperature 0.8, top-p 0.9``, from its ``config.decode``."""
  if decode["method"] == "greedy":
    return "greedy"
  if decode["method"] == "beam":
    alpha = decode["length_penalty"] if length_penalty is None else length_penalty
    return f"beam {decode['beam_size']}, alpha {alpha:g}"
  settings = [f"temperature {decode['temperature']:g}", decode["top_k"] and f"top-k {decode['top_k']}",
              decode["top_p"] < 1 and f"top-p {decode['top_p']:g}",
              decode["num_samples"] > 1 and f"best of {decode['num_samples']}"]
  return ", ".join(["sampling", *filter(None, settings)])


def row(name: str, run: dict) -> list:
  """The main table's row of a scored run."""
  stopped = f" (stopped early of {run['steps_planned']})" if run["steps_trained"] < run["steps_planned"] else ""
  averaged = run["averaged_steps"]
  checkpoint = f"mean of steps {', '.join(map(str, averaged))}" if averaged else str(run["best_step"])
  decoding = decoding_label(upgrade_config(run["config"])["decode"], run["length_penalty"])
  if run["validation_bleu_by_length_penalty"]:
    decoding += " (on validation: " + ", ".join(
        f"{float(alpha):g}: {bleu:.2f}" for alpha, bleu in run["validation_bleu_by_length_penalty"].items()) + ")"
  return [name, str(run_seed(run)), run["size"], f"{run['training_pairs']:,}",
          f"{checkpoint} of {run['steps_trained']}{stopped}", f"{run['wall_hours']:.2f} h", decoding,
          *(f"{run[key]:.2f}" for key in ("validation_bleu", "test_bleu", "test_bleu_lowercase")),
          run["hardware"] + (f"; {run['note']}" if run["note"] else ""), f"`{run['signature']}`",
          f"`{run['command']}`"]


def section(caption: str, header: list[str], rows: list[list]) -> str:
  """A captioned table between blank lines, or "" without rows."""
  return f"\n{caption}:\n\n{report.markdown_table(header, rows)}\n" if rows else ""


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
  return [sorted(names, key=lambda name: run_seed(runs[name])) for names in groups.values()
          if len(names) > 1 and len({run_seed(runs[name]) for name in names}) == len(names)]


def seeds_table(test: str, runs: dict) -> str:
  """Section: for each ``seed_groups`` group, each seed's test and validation BLEU and their mean."""
  def mean_and_each(names: list[str], key: str) -> str:
    values = [runs[name][key] for name in names]
    return f"{sum(values) / len(values):.2f} ({', '.join(f'{value:.2f}' for value in values)})"
  return section(
      "Rows that trained the same settings with another `config.seed` (initialisation, dropout and data order), "
      "each seed's checkpoint and alpha chosen on validation as above; the mean over seeds is the number to quote "
      "for the setting, one seed's row is one draw",
      ["rows", "seeds", f"{test} BLEU: mean (each seed)", f"{test} BLEU lowercased: mean (each seed)",
       "validation BLEU: mean (each seed)"],
      [[", ".join(names), ", ".join(str(run_seed(runs[name])) for name in names),
        *(mean_and_each(names, key) for key in ("test_bleu", "test_bleu_lowercase", "validation_bleu"))]
       for names in seed_groups(runs)])


def outputs_table(experiment: str, output: str, runs: dict, best: str) -> str:
  """Section: each scored row's test outputs in the page's folder, or how to make them."""
  rows = []
  for name, run in runs.items():
    spec = f"{name}={run['variant']}" if name != run["variant"] else run["variant"]
    missing = ("not committed (the row was reported before every row's outputs were kept): train it with the "
               f"row's command, then `python -m experiments.translation_results --experiment={experiment} "
               f"--run={spec}:WORKDIR` scores it and writes them")
    files = row_files(experiment, output, name, best)
    rows.append([name, f"{run['test_bleu']:.2f}", ", ".join(f"`{path}`" for path in files) or missing])
  return section(
      "Each row's test outputs (one line per reference line, the row's checkpoint and decoding): `sacrebleu "
      "REFERENCE -i FILE --tokenize TOK` recomputes its BLEU, with the reference file of the test set from the "
      "source folder and TOK the `tok:` of the row's sacreBLEU signature (`-lc` for the lowercased column)",
      ["model", f"{TEST_NAME[experiment]} BLEU", "test outputs in this folder"], rows)


def other_tests_table(experiment: str, runs: dict) -> str:
  """Section: BLEU on ``OTHER_TESTS`` of the rows that have it."""
  splits = OTHER_TESTS[experiment]
  return section(
      f"The other test sets, scored with the same checkpoint and decoding as the row's {TEST_NAME[experiment]} "
      "(rows whose `--mode=eval` had them in `task.test_splits`); nothing was chosen on them",
      ["model", *(f"{split} BLEU{suffix}" for split in splits for suffix in ("", " lowercased"))],
      [[name, *(f"{run['other_tests'][split][key]:.2f}" if split in run["other_tests"] else "-"
                for split in splits for key in ("bleu", "bleu_lowercase"))]
       for name, run in runs.items() if run.get("other_tests")])


def by_length_table(test: str, runs: dict) -> str:
  """Section: each row's test BLEU by reference length (rows reported before it was measured are left out)."""
  measured = {name: run["test_bleu_by_reference_length"] for name, run in runs.items()
              if run.get("test_bleu_by_reference_length")}
  groups = list(dict.fromkeys(group for by_length in measured.values() for group in by_length))
  sentences = {group: next(by_length[group]["sentences"] for by_length in measured.values() if group in by_length)
               for group in groups}
  return section(
      f"{test} BLEU by the reference's length in words (same decoding as the table above; the length ratio is "
      "hypothesis / reference length within the group)",
      ["model"] + [f"{group} words ({sentences[group]:,} sentences)" for group in groups],
      [[name] + [f"{by_length[group]['bleu']:.2f} (length ratio {by_length[group]['length_ratio']:.2f})"
                 if group in by_length else "-" for group in groups] for name, by_length in measured.items()])


def validation_table(runs: dict, validation_runs: dict) -> str:
  """Section: every run (scored on test or ``--validation_only``) by the validation BLEU its training logged at
  each evaluation, so settings are compared on validation alone; "" without validation-only runs."""
  if not validation_runs:
    return ""
  rows = []
  for name, run in {**runs, **validation_runs}.items():
    evaluations = [r for r in run["curves"] if "eval/bleu" in r]
    sentences = run["config"]["task"].get("num_eval_sentences", 0)
    rows.append([name, run["size"], f"{run['training_pairs']:,}", str(run["steps_trained"]),
                 f"{run['wall_hours']:.2f} h", decoding_label(upgrade_config(run["config"])["decode"])
                 + (f", first {sentences:,} sentences" if sentences else ""),
                 ", ".join(f"{r['step']}: {r['eval/bleu']:.2f}" for r in evaluations),
                 f"{evaluations[-1]['eval/nll']:.2f}" if evaluations and "eval/nll" in evaluations[-1] else "-",
                 "yes (table above)" if name in runs else "no",
                 run["hardware"] + (f"; {run['note']}" if run["note"] else ""), f"`{run['command']}`"])
  return section(
      "Every run by the validation BLEU its training logged (written with `--validation_only` for runs that lost "
      "on validation and were never scored on the test set; NLL per piece, so only comparable between runs of "
      "the same tokenizer)",
      ["model", "size", "training pairs", "steps trained", "training wall time", "decoding during training",
       "validation BLEU at each evaluation (step: BLEU)", "validation NLL at the last evaluation",
       "scored on test", "hardware", "command"], rows)


def render_page(experiment: str, store: report.RecordStore, output: str) -> str:
  """The page's text from ``store`` and the files in ``output`` (test outputs, plot folders, the not-kept note);
  redraws ``curves.png``. Each row's command is derived again from its settings (``run_command``)."""
  for record in store.records.values():
    record["command"] = run_command(experiment, record["values"])
  runs, validation_runs = stored_rows(store)
  if not runs:
    raise UserError("give at least one --run=VARIANT:WORKDIR to score on test (without --validation_only): the "
                    "page needs one model scored on test")
  test, best = TEST_NAME[experiment], best_row(runs)
  if any(run["curves"] for run in runs.values()):  # rows carried over without curves keep the old plot
    report.plot_curves({name: run["curves"] for name, run in runs.items()}, list(CURVES),
                       os.path.join(output, "curves.png"), f"{experiment}: training curves")
  table = report.markdown_table(
      ["model", "seed", "size", "training pairs", "checkpoint (chosen on validation) of steps trained",
       "training wall time", "decoding (length penalty alpha chosen on validation)", "validation BLEU",
       f"{test} BLEU", f"{test} BLEU lowercased", "hardware",
       "sacreBLEU signature", "command"], [row(name, run) for name, run in runs.items()])
  published = report.markdown_table(["published result", f"{test} BLEU"], PUBLISHED[experiment])
  files, hypotheses = row_files(experiment, output, best, best), test_outputs(experiment)[0][1]
  test_output = (f"The best model on validation ({best}) gives {', '.join(f'`{name}`' for name in files)} (one line "
                 "per reference line), so\nanyone can recompute its score with sacreBLEU." if hypotheses in files else
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


# ------------------------------------------------------------------------------ rows as records, outputs as files

def add_row(experiment: str, store: report.RecordStore, name: str, run: dict) -> None:
  """Row ``name`` (a ``summarize`` or ``validation_summary`` dict) into ``store`` as a record."""
  store.add(name, steps=run["steps_trained"], command=run_command(experiment, run), machine=run["hardware"],
            values={key: value for key, value in run.items() if key not in ("steps_trained", "command", "hardware")})


def stored_rows(store: report.RecordStore) -> tuple[dict, dict]:
  """``(scored on test, validation_only)``: row name -> the row as ``add_row`` took it, in the store's order."""
  rows = {name: {**record["values"], "steps_trained": record["steps"], "command": record["command"],
                 "hardware": record["machine"]} for name, record in store.items()}
  scored = {name: run for name, run in rows.items() if "test_bleu" in run}
  return scored, {name: run for name, run in rows.items() if name not in scored}


def best_row(runs: dict) -> str | None:
  """The scored row of the highest validation BLEU: the page's test outputs are its."""
  return max(runs, key=lambda name: runs[name]["validation_bleu"], default=None)


def test_outputs(experiment: str) -> list[tuple[str, str]]:
  """``(file --mode=eval writes, the page's file)`` of the test set and of each of ``OTHER_TESTS``."""
  language = TARGET_LANGUAGE[experiment]
  return [(f"{TEST_SPLIT[experiment]}.hyp.{language}", f"{TEST_NAME[experiment]}.hyp.{language}"),
          *((f"{split}.hyp.{language}",) * 2 for split in OTHER_TESTS[experiment])]


def row_files(experiment: str, output: str, name: str, best: str) -> list[str]:
  """Row ``name``'s test outputs in the page's folder ``output``, relative to it (the best row's are the page's)."""
  folder = "" if name == best else f"{ROW_OUTPUTS}/{name}/"
  return [folder + page_name for _, page_name in test_outputs(experiment)
          if os.path.exists(os.path.join(output, folder + page_name))]


def place_outputs(experiment: str, source: str, target: str, page_names: bool = False, move: bool = False) -> None:
  """Copy (or ``move``) the test outputs in ``source`` (named as ``--mode=eval`` writes them, or as the page does)
  into ``target`` under the page's names, removing there those ``source`` lacks (an earlier run's)."""
  for written, page_name in test_outputs(experiment):
    path = os.path.join(source, page_name if page_names else written)
    if os.path.exists(path):
      os.makedirs(target, exist_ok=True)
      (shutil.move if move else shutil.copy)(path, os.path.join(target, page_name))
    elif os.path.exists(os.path.join(target, page_name)):
      os.remove(os.path.join(target, page_name))


def start_page(experiment: str, store: report.RecordStore, output: str, committed: str, new_names: set[str]) -> None:
  """Starts the page in ``output``, if it is a new folder (``store`` then holds the committed records), from the
  committed one in ``committed``: its notes, curves and the test outputs of its rows. A committed row named as one
  of ``new_names`` is kept as ``NAME (committed)`` (its outputs' folder too), beside the new run of that name."""
  if os.path.exists(store.path) or os.path.realpath(output) == os.path.realpath(committed):
    return
  os.makedirs(output, exist_ok=True)
  for name in STARTING_FILES:
    if os.path.exists(os.path.join(committed, name)):
      shutil.copy(os.path.join(committed, name), os.path.join(output, name))
  for name in PLOT_FOLDERS:  # the page links them when present
    if os.path.isdir(os.path.join(committed, name)):
      shutil.copytree(os.path.join(committed, name), os.path.join(output, name), dirs_exist_ok=True)
  place_outputs(experiment, committed, output, page_names=True)
  rows = os.path.join(committed, ROW_OUTPUTS)
  for name in os.listdir(rows) if os.path.isdir(rows) else ():
    shutil.copytree(os.path.join(rows, name),  # a rerun after a failed one finds them there
                    os.path.join(output, ROW_OUTPUTS, f"{name} (committed)" if name in new_names else name),
                    dirs_exist_ok=True)
  for name in new_names & set(store):
    store.rename(name, f"{name} (committed)")


def add_runs(experiment: str, store: report.RecordStore, output: str, new_runs: dict[str, tuple[dict, str]],
             new_validation_runs: dict[str, dict]) -> None:
  """Record ``new_runs`` (row name -> ``summarize``'s (row, output folder)) and ``new_validation_runs`` (row
  name -> ``validation_summary``) in ``store``; the test outputs of the best row on validation are the page's own
  files, every other scored row's are in ``hypotheses/ROW/``. A refused row (``store.check``) changes nothing."""
  store.check({name: run["steps_trained"] for name, run in new_validation_runs.items()}
              | {name: summary["steps_trained"] for name, (summary, _) in new_runs.items()})
  before = best_row(stored_rows(store)[0])  # whose test outputs the page's files are
  for name, (summary, _) in new_runs.items():
    add_row(experiment, store, name, summary)
  runs, _ = stored_rows(store)
  for name, run in new_validation_runs.items():
    if name not in runs:  # a run scored on test is no longer a validation-only row
      add_row(experiment, store, name, run)
  after = best_row(runs)
  if before not in (None, after, *new_runs):  # beaten: the former best row's files go to its own folder
    place_outputs(experiment, output, os.path.join(output, ROW_OUTPUTS, before), page_names=True, move=True)
  elif before in new_runs and after not in new_runs:  # the best row was replaced by a worse run: no row's output
    for path in row_files(experiment, output, before, before):
      os.remove(os.path.join(output, path))
  for name, (_, output_dir) in new_runs.items():
    shutil.rmtree(os.path.join(output, ROW_OUTPUTS, name), ignore_errors=True)  # an earlier run's of this row
    place_outputs(experiment, output_dir, output if name == after else os.path.join(output, ROW_OUTPUTS, name))


# ------------------------------------------------------------------------------ main

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
  if not RunDirectory(workdir).has(CONFIG):
    raise UserError(f"--run={spec!r}: {workdir} holds no config.json; give the --workdir of a training run")
  return name or variant, variant, workdir


def check_checkpoints(workdir: str, average_checkpoints: int) -> None:
  """Refuses (``UserError``) ``--average_checkpoints`` larger than the number of checkpoints ``workdir`` kept."""
  folder = RunDirectory(workdir).path(CHECKPOINTS)
  kept = sorted(int(name) for name in os.listdir(folder) if name.isdigit()) if os.path.isdir(folder) else []
  if len(kept) < average_checkpoints:
    raise UserError(f"--average_checkpoints={average_checkpoints}: {workdir} kept {len(kept)} checkpoint(s) (steps "
                    f"{', '.join(map(str, kept)) or 'none'}); give --average_checkpoints={len(kept)} or fewer, or "
                    "leave it out to score the best checkpoint alone.")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
  parser = report.results_parser(__doc__, "WORKDIR/results/ of the first --run", hardware=True)
  parser.add_argument("--experiment", default="multi30k", choices=EXPERIMENTS, help="Which experiment.")
  parser.add_argument("--run", action="append", default=[], help="[ROW=]VARIANT:WORKDIR of a run to report (ROW: "
                      "the row's name, default VARIANT); repeat for several.")
  parser.add_argument("--source_dir", default="", help="Raw data folder (as --config.task.source_dir).")
  parser.add_argument("--data_dir", default="", help="TFDS data dir (as --config.task.data_dir).")
  parser.add_argument("--average_checkpoints", type=report.non_negative_int, default=0, help="Also score the mean of the last N "
                      "checkpoints and report it if it is better on validation (each run must have kept N: "
                      "config.keep_checkpoints and enough checkpoints saved).")
  parser.add_argument("--validation_only", action="store_true", help="Record the --run runs from their training "
                      "logs alone, in the table of runs compared on validation (no decoding, never scored on the "
                      "test set): for settings that lost on validation.")
  parser.add_argument("--note", default="", help="A remark stored with this invocation's rows (e.g. shared CPU).")
  return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
  args = parse_args(argv)
  experiment, committed = args.experiment, os.path.join(report.COMMITTED, args.experiment)
  specs = [report.exit_on_user_error(parse_run, experiment, spec) for spec in args.run]
  default = os.path.join(specs[0][2], "results") if specs else os.path.join(os.getcwd(), f"results-{experiment}")
  args.from_records = args.from_records or not specs  # no run: the page from records.json, which must hold rows

  def collect(store: report.RecordStore, folder: str) -> None:
    start_page(experiment, store, folder, committed, {name for name, _, _ in specs})  # before the new rows' files
    # Before the runs are decoded: a refused row costs nothing.
    store.check({name: steps_trained(report.run_metrics(workdir)) for name, _, workdir in specs})
    if args.validation_only:
      add_runs(experiment, store, folder, {}, {name: validation_summary(args, variant, workdir)
                                               for name, variant, workdir in specs})
      return
    if args.average_checkpoints:
      for _, _, workdir in specs:
        check_checkpoints(workdir, args.average_checkpoints)
    add_runs(experiment, store, folder, {name: summarize(args, variant, workdir)
                                         for name, variant, workdir in specs}, {})

  def render(store: report.RecordStore, folder: str) -> str:
    if args.from_records:  # else collect has started a new folder
      start_page(experiment, store, folder, committed, set())
    return render_page(experiment, store, folder)

  report.make_page(args, committed, default, collect, render)


if __name__ == "__main__":
  main()
