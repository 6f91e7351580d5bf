r"""Score translation runs and write a results page: RESULTS.md, records.json, curves and the test outputs.

    python -m experiments.translation_results --experiment=multi30k \
        --run=transformer_small:/tmp/multi30k_small --run=gru_bahdanau:/tmp/multi30k_gru \
        --source_dir=DIR  # the raw files (see transformer/data/multi30k); default: downloaded
    python -m experiments.translation_results --experiment=multi30k --from_records --update_committed

Each ``--run=[ROW=]VARIANT:WORKDIR`` (a run of ``experiments/<experiment>.py:VARIANT``, in row ROW) is scored on
test by ``launch.py --mode=eval`` with its checkpoint chosen on validation, unless ``WORKDIR/eval_results.json`` is
newer than its checkpoints. A new page folder starts from the committed page (``experiments/<experiment>/``),
whose row of a new row's name is kept as ``NAME (committed)``; ``--from_records`` (or no ``--run``) rewrites the
page from ``records.json`` alone. More in docs/translation.md (Results tables); the page says what each of its
tables and files holds, in the prose of ``experiments/translation_page_template.md``.
"""
from __future__ import annotations

import argparse
import importlib
import os

from experiments import launching, pages, record_store, translation_scores
from experiments.translation_scores import TEST_NAME, add_runs, best_row, row_files, run_seed, start_page, stored_rows
from transformer import plot
from transformer.errors import UserError, exit_on_user_error
from transformer.train.convert_run import upgrade_config
from transformer.train.workdir import CONFIG, RunDirectory

EXPERIMENTS = ("multi30k", "iwslt15_en_vi")

TEMPLATE = pages.read_template("translation_page_template.md")  # both pages' prose


def decoding_label(run: dict, length_penalty: float | None = None) -> str:
  """How a run decoded: ``greedy``, ``beam 5, alpha 0.6`` (``length_penalty`` or the config's) or ``sampling, ...``."""
  decode = upgrade_config(run["config"])["decode"]
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
  decoding = decoding_label(run, run["length_penalty"])
  if run["validation_bleu_by_length_penalty"]:
    decoding += " (on validation: " + ", ".join(
        f"{float(alpha):g}: {bleu:.2f}" for alpha, bleu in run["validation_bleu_by_length_penalty"].items()) + ")"
  return [name, str(run_seed(run)), run["size"], f"{run['training_pairs']:,}",
          f"{checkpoint} of {run['steps_trained']}{stopped}", f"{run['wall_hours']:.2f} h", decoding,
          *(f"{run[key]:.2f}" for key in ("validation_bleu", "test_bleu", "test_bleu_lowercase")),
          run["hardware"] + (f"; {run['note']}" if run["note"] else ""), f"`{run['signature']}`",
          f"`{run['command']}`"]


def seeds_table(test: str, runs: dict) -> str:
  """Section: for each ``seed_groups`` group, each seed's test and validation BLEU and their mean."""
  def mean_and_each(names: list[str], key: str) -> str:
    values = [runs[name][key] for name in names]
    return f"{sum(values) / len(values):.2f} ({', '.join(f'{value:.2f}' for value in values)})"
  return pages.section(
      TEMPLATE["seeds_caption"].substitute(),
      ["rows", "seeds", *(f"{column}: mean (each seed)" for column in
                          (f"{test} BLEU", f"{test} BLEU lowercased", "validation BLEU"))],
      [[", ".join(names), ", ".join(str(run_seed(runs[name])) for name in names),
        *(mean_and_each(names, key) for key in ("test_bleu", "test_bleu_lowercase", "validation_bleu"))]
       for names in translation_scores.seed_groups(runs)])


def outputs_table(experiment: str, output: str, runs: dict) -> str:
  """Section: each scored row's test and validation outputs in the page's folder, or why they are not there."""
  validation = translation_scores.output_files(experiment)[-1][1]
  rows = []
  for name, run in runs.items():
    files = row_files(experiment, output, name)
    tests = ", ".join(f"`{path}`" for path in files if not path.endswith(validation))
    rows.append([name, f"{run['test_bleu']:.2f}", tests or TEMPLATE["outputs_missing"].substitute(
        experiment=experiment, run=f"{name}={run['variant']}" if name != run["variant"] else run["variant"]),
        next((f"`{path}`" for path in files if path.endswith(validation)), TEMPLATE["validation_missing"].template)])
  return pages.section(TEMPLATE["outputs_caption"].substitute(), [
      "model", f"{TEST_NAME[experiment]} BLEU", "test outputs in this folder",
      "validation outputs (chose the checkpoint and alpha)"], rows)


def other_tests_table(experiment: str, runs: dict) -> str:
  """Section: BLEU on ``OTHER_TESTS`` of the rows that have it."""
  splits = translation_scores.OTHER_TESTS[experiment]
  return pages.section(
      TEMPLATE["other_tests_caption"].substitute(test=TEST_NAME[experiment]),
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
  return pages.section(
      TEMPLATE["by_length_caption"].substitute(test=test),
      ["model"] + [f"{group} words ({sentences[group]:,} sentences)" for group in groups],
      [[name] + [f"{by_length[group]['bleu']:.2f} (length ratio {by_length[group]['length_ratio']:.2f})"
                 if group in by_length else "-" for group in groups] for name, by_length in measured.items()])


def validation_table(runs: dict, validation_runs: dict) -> str:
  """Section: every run by the validation BLEU its training logged; "" without validation-only runs."""
  rows = []
  for name, run in {**runs, **validation_runs}.items() if validation_runs else ():
    evaluations = [r for r in run["curves"] if "eval/bleu" in r]
    sentences = run["config"]["task"].get("num_eval_sentences", 0)
    decoding = decoding_label(run) + (f", first {sentences:,} sentences" if sentences else "")
    rows.append([name, run["size"], f"{run['training_pairs']:,}", str(run["steps_trained"]),
                 f"{run['wall_hours']:.2f} h", decoding,
                 ", ".join(f"{r['step']}: {r['eval/bleu']:.2f}" for r in evaluations),
                 f"{evaluations[-1]['eval/nll']:.2f}" if evaluations and "eval/nll" in evaluations[-1] else "-",
                 "yes (table above)" if name in runs else "no",
                 run["hardware"] + (f"; {run['note']}" if run["note"] else ""), f"`{run['command']}`"])
  return pages.section(TEMPLATE["validation_caption"].substitute(), [
      "model", "size", "training pairs", "steps trained", "training wall time", "decoding during training",
      "validation BLEU at each evaluation (step: BLEU)", "validation NLL at the last evaluation", "scored on test",
      "hardware", "command"], rows)


def render_page(experiment: str, store: record_store.RecordStore, output: str) -> str:
  """The page's text from ``store`` and the files in ``output``; redraws ``curves.png``."""
  for record in store.records.values():  # each row's command derived again from its settings
    record["command"] = translation_scores.run_command(experiment, record["values"])
  runs, validation_runs = stored_rows(store)
  if not runs:
    raise UserError("give at least one --run=VARIANT:WORKDIR to score on test (without --validation_only): the "
                    "page needs one model scored on test")
  test, best = TEST_NAME[experiment], best_row(runs)
  if any(run["curves"] for run in runs.values()):  # rows carried over without curves keep the old plot
    plot.plot_curves({name: run["curves"] for name, run in runs.items()}, list(translation_scores.CURVES),
                     os.path.join(output, "curves.png"), f"{experiment}: training curves")
  plots = [f"[{title}]({folder}/README.md)" for folder, title in translation_scores.PLOT_FOLDERS.items()
           if os.path.exists(os.path.join(output, folder, "README.md"))]
  sections = (seeds_table(test, runs) + outputs_table(experiment, output, runs) + other_tests_table(
      experiment, runs) + by_length_table(test, runs) + validation_table(runs, validation_runs))
  return TEMPLATE["page"].substitute(
      experiment=experiment, records=record_store.RECORDS_FILE, best=best, sections=sections,
      table=pages.markdown_table(
          ["model", "seed", "size", "training pairs", "checkpoint (chosen on validation) of steps trained",
           "training wall time", "decoding (length penalty alpha chosen on validation)", "validation BLEU",
           f"{test} BLEU", f"{test} BLEU lowercased", "hardware", "sacreBLEU signature", "command"],
          [row(name, run) for name, run in runs.items()]),
      note=TEMPLATE[f"{experiment}_note"].substitute(),
      published=TEMPLATE[f"{experiment}_published"].substitute(test=test),
      plots=f"\n{TEMPLATE['plots'].substitute(plots=', '.join(plots))}\n" if plots else "",
      runs_not_kept=pages.runs_not_kept(output))


def parse_run(experiment: str, spec: str) -> tuple[str, str, str]:
  """``--run`` value ``[ROW=]VARIANT:WORKDIR`` -> ``(row name, variant, workdir)``; a UserError naming the fix."""
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
  task = RunDirectory(workdir).read_json(CONFIG).get("task", {})
  if (task.get("name"), task.get("dataset")) != ("translation", experiment):
    raise UserError(f"--run={spec!r}: {workdir} holds a {task.get('dataset') or task.get('name')!r} run, not one of "
                    f"experiments/{experiment}.py; give the workdir of such a run (or --experiment=<its experiment>)")
  return name or variant, variant, workdir


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
  parser = pages.results_parser(__doc__, "WORKDIR/results/ of the first --run", hardware=True)
  parser.add_argument("--experiment", default="multi30k", choices=EXPERIMENTS, help="Which experiment.")
  parser.add_argument("--run", action="append", default=[], help="[ROW=]VARIANT:WORKDIR of a run to report (ROW: "
                      "the row's name, default VARIANT); repeat for several.")
  parser.add_argument("--source_dir", default="", help="Raw data folder (as --config.task.source_dir).")
  parser.add_argument("--data_dir", default="", help="TFDS data dir (as --config.task.data_dir).")
  parser.add_argument("--average_checkpoints", type=pages.non_negative_int, default=0, help="Also score the mean "
                      "of the last N checkpoints and report it if it is better on validation (each run must have "
                      "kept N: config.keep_checkpoints and enough checkpoints saved).")
  parser.add_argument("--validation_only", action="store_true", help="Record the --run runs from their training "
                      "logs alone, in the table of runs compared on validation (no decoding, never scored on the "
                      "test set): for settings that lost on validation.")
  parser.add_argument("--note", default="", help="A remark stored with this invocation's rows (e.g. shared CPU).")
  return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
  args = parse_args(argv)
  experiment, committed = args.experiment, os.path.join(record_store.COMMITTED, args.experiment)
  specs = [exit_on_user_error(parse_run, experiment, spec) for spec in args.run]
  default = os.path.join(specs[0][2], "results") if specs else os.path.join(os.getcwd(), f"results-{experiment}")
  args.from_records = args.from_records or not specs  # no run: the page from records.json, which must hold rows

  def collect(store: record_store.RecordStore, folder: str) -> None:
    start_page(experiment, store, folder, committed, {name for name, _, _ in specs})  # before the new rows' files
    # Before the runs are decoded: a refused row costs nothing.
    store.check({name: launching.run_metrics(workdir).progress[0] for name, _, workdir in specs})
    if args.validation_only:
      add_runs(experiment, store, folder, {}, {name: translation_scores.validation_summary(args, variant, workdir)
                                               for name, variant, workdir in specs})
      return
    for _, _, workdir in specs:  # --average_checkpoints=0 always passes
      translation_scores.check_checkpoints(workdir, args.average_checkpoints)
    add_runs(experiment, store, folder, {name: translation_scores.summarize(args, variant, workdir)
                                         for name, variant, workdir in specs}, {})

  def render(store: record_store.RecordStore, folder: str) -> str:
    if args.from_records:  # else collect has started a new folder
      start_page(experiment, store, folder, committed, set())
    return render_page(experiment, store, folder)

  pages.make_page(args, committed, default, collect, render)


if __name__ == "__main__":
  main()
