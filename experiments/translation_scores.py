"""Translation runs scored for the results page (``launch.py --mode=eval``, choosing on validation) and recorded as
rows, their test outputs beside the page, the rows that differ only in their seed, and a new page folder."""
from __future__ import annotations

import argparse
import importlib
import json
import os
import shlex
import shutil

from experiments import launching, pages, record_store
from transformer.errors import ConfigError, UserError
from transformer.tasks.metrics import bleu_by_reference_length
from transformer.train.convert_run import upgrade_config
from transformer.train.config import RunConfig
from transformer.train.checkpoint import CHECKPOINTS
from transformer.train.workdir import EVAL_RESULTS, MODEL_CONFIG, RunDirectory
from transformer.train.workdir import record_defaults

TEST_SPLIT = {"multi30k": "test_2016_flickr", "iwslt15_en_vi": "test"}
# The test set's own name, for the table and the committed hypotheses (IWSLT's TFDS "test" split is tst2013).
TEST_NAME = {"multi30k": "test_2016_flickr", "iwslt15_en_vi": "tst2013"}
TARGET_LANGUAGE = {"multi30k": "de", "iwslt15_en_vi": "vi"}
# Further test sets --mode=eval scores when in the run's task.test_splits: reported, never used to choose anything.
OTHER_TESTS = {"multi30k": ("test_2017_flickr", "test_2017_mscoco", "test_2018_flickr"), "iwslt15_en_vi": ()}
CURVES = ("train/nll", "eval/nll", "eval/bleu")
# Never in a row's command (which trains): this machine's settings, and what only --mode=eval and saving use.
NOT_TRAINING_SETTINGS = launching.LOCAL_SETTINGS + ("task.test_splits", "async_checkpointing", "average_checkpoints")
ROW_OUTPUTS = "hypotheses"  # beside the page: hypotheses/ROW/ holds the outputs of scored row ROW
# Folders of experiments/attention_plots.py output linked from RESULTS.md when present.
PLOT_FOLDERS = {"attention": "Transformer attention (encoder self, decoder self, cross)",
                "alignment": "RNN attention alignment"}


def config_overrides(experiment: str, variant: str, run_config: dict) -> list[str]:
  """The ``--config.KEY=VALUE`` flags that turn the variant as it is now into ``run_config`` (any config.json)."""
  current = importlib.import_module(f"experiments.{experiment}").get_config(variant)
  run_config = upgrade_config(run_config)
  if run_config.get("model_name", current.model_name) != current.model_name:
    raise ConfigError(f"the run trained model_name={run_config['model_name']!r}, but experiments/{experiment}.py:"
                      f"{variant} builds {current.model_name!r}; report it under a variant of its model.")
  return launching.config_overrides(current, run_config, NOT_TRAINING_SETTINGS)


def run_command(experiment: str, run: dict) -> str:
  """The command that trains ``run``'s settings with today's ``experiments/<experiment>.py``."""
  return " ".join([f"python launch.py --config=experiments/{experiment}.py:{run['variant']} --workdir=WORKDIR",
                   f"--config.task.source_dir={run['source_dir']}",
                   *map(shlex.quote, config_overrides(experiment, run["variant"], run["config"]))])


def output_files(experiment: str) -> list[tuple[str, str]]:
  """``(file --mode=eval writes, the page's file)`` of the test set, ``OTHER_TESTS`` and the validation sentences
  whose BLEU chose the checkpoint and alpha."""
  language = TARGET_LANGUAGE[experiment]
  return [(f"{TEST_SPLIT[experiment]}.hyp.{language}", f"{TEST_NAME[experiment]}.hyp.{language}"),
          *((f"{split}.hyp.{language}",) * 2 for split in OTHER_TESTS[experiment]),
          (f"validation.eval.hyp.{language}", f"validation.hyp.{language}")]


def evaluate(args: argparse.Namespace, variant: str, workdir: str, average_checkpoints: int = 0) -> tuple[dict, str]:
  """``(eval_results, output_dir)`` of the best checkpoint or the mean of the last ``average_checkpoints``."""
  directory = RunDirectory(workdir)
  output_dir = directory.output_dir(average_checkpoints)
  path = os.path.join(output_dir, EVAL_RESULTS)
  checkpoints = directory.path(CHECKPOINTS)
  newest = max((os.path.getmtime(os.path.join(checkpoints, s)) for s in os.listdir(checkpoints)), default=0)
  fresh = os.path.exists(path) and os.path.getmtime(path) >= newest
  results = directory.eval_results(average_checkpoints) if fresh else {}
  if not results:
    run_config = directory.config_values(any_format=True)  # the run's settings, should the variant change
    launching.run_launch([f"--config=experiments/{args.experiment}.py:{variant}", f"--workdir={workdir}",
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
  with open(os.path.join(output_dir, output_files(args.experiment)[0][0])) as f:
    hypotheses = f.read().split("\n")[:-1]  # one line per reference, newline-terminated
  return bleu_by_reference_length(hypotheses, test_references(args, config), config["task"].get("bleu_tokenize", "13a"))


def trained_run(args: argparse.Namespace, variant: str, workdir: str) -> dict:
  """What a row says of a run from its workdir alone (no decoding)."""
  directory = RunDirectory(workdir)
  config, model = directory.config_values(any_format=True), directory.read_json(MODEL_CONFIG)
  metrics = launching.run_metrics(workdir)
  steps, wall_seconds = metrics.progress
  return {
      "size": (f"{model['num_encoder_layers']}+{model['num_decoder_layers']} layers, d_model {model['d_model']}"
               if "d_model" in model else f"{model['cell']}, {model['attention']}, hidden {model['hidden_dim']}"),
      "training_pairs": training_pairs(args, config), "steps_trained": steps,
      "steps_planned": config["num_train_steps"], "wall_hours": wall_seconds / 3600, "variant": variant,
      "config": config, "source_dir": args.source_dir or "$TRANSFORMER_DATA_DIR",
      "hardware": args.hardware or record_store.machine_description(), "note": args.note,
      "curves": [{k: v for k, v in r.items() if k == "step" or k in CURVES}
                 for r in metrics.records if any(k in r for k in CURVES)],
  }


def summarize(args: argparse.Namespace, variant: str, workdir: str) -> tuple[dict, str]:
  """``(row, output_dir)`` of one run: its best checkpoint's, or the mean of the last ones' if better on validation."""
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
  """A run's row by the validation BLEU its training logged alone (``--validation_only``: never scored on test)."""
  run = trained_run(args, variant, workdir)
  if not any("eval/bleu" in record for record in run["curves"]):
    raise UserError(f"{workdir}/metrics.jsonl has no eval/bleu: the run stopped before its first "
                    "evaluation (config.eval_every); train it further or leave it out.")
  return run


def check_checkpoints(workdir: str, average_checkpoints: int) -> None:
  """Refuses (``UserError``) ``--average_checkpoints`` larger than the number of checkpoints ``workdir`` kept."""
  folder = RunDirectory(workdir).path(CHECKPOINTS)
  kept = sorted(int(name) for name in os.listdir(folder) if name.isdigit()) if os.path.isdir(folder) else []
  if len(kept) < average_checkpoints:
    raise UserError(f"--average_checkpoints={average_checkpoints}: {workdir} kept {len(kept)} checkpoint(s) (steps "
                    f"{', '.join(map(str, kept)) or 'none'}); give --average_checkpoints={len(kept)} or fewer, or "
                    "leave it out to score the best checkpoint alone.")


def stored_rows(store: record_store.RecordStore) -> tuple[dict, dict]:
  """``(scored on test, validation_only)``: row name -> the row as ``add_runs`` took it, in the store's order."""
  rows = {name: {**record["values"], "steps_trained": record["steps"], "command": record["command"],
                 "hardware": record["machine"]} for name, record in store.items()}
  scored = {name: run for name, run in rows.items() if "test_bleu" in run}
  return scored, {name: run for name, run in rows.items() if name not in scored}


def run_seed(run: dict) -> int:
  """The row's ``config.seed`` (initialisation, dropout and data order)."""
  return upgrade_config(run["config"]).get("seed", 0)


def seed_groups(runs: dict) -> list[list[str]]:
  """Rows that trained the same settings on the same data with different ``config.seed``, each group in seed
  order; groups of one seed, or where two rows share a seed (a rerun: which to average is unclear), are left out."""
  groups: dict[str, list[str]] = {}
  for name, run in runs.items():
    config = upgrade_config(run["config"])  # a field added since a row was trained: its default, as it ran
    flat = {**record_defaults(RunConfig.from_config(config)), **launching.flatten_config(config)}
    settings = {key: value for key, value in flat.items() if key != "seed" and key not in NOT_TRAINING_SETTINGS}
    groups.setdefault(json.dumps([settings, run["training_pairs"]], sort_keys=True, default=str), []).append(name)
  return [sorted(names, key=lambda name: run_seed(runs[name])) for names in groups.values()
          if len(names) > 1 and len({run_seed(runs[name]) for name in names}) == len(names)]


def best_row(runs: dict) -> str | None:
  """The scored row of the highest validation BLEU."""
  return max(runs, key=lambda name: runs[name]["validation_bleu"], default=None)


def row_files(experiment: str, output: str, name: str) -> list[str]:
  """Row ``name``'s outputs in the page's folder ``output``, relative to it."""
  folder = f"{ROW_OUTPUTS}/{name}/"
  return [folder + page_name for _, page_name in output_files(experiment)
          if os.path.exists(os.path.join(output, folder + page_name))]


def add_runs(experiment: str, store: record_store.RecordStore, output: str, new_runs: dict[str, tuple[dict, str]],
             new_validation_runs: dict[str, dict]) -> None:
  """Records ``new_runs`` (row -> ``summarize``) and ``new_validation_runs`` (row -> ``validation_summary``) in
  ``store``, each scored row's outputs in ``hypotheses/ROW/``; a refused row (``store.check``) changes nothing."""
  store.check({name: run["steps_trained"] for name, run in new_validation_runs.items()}
              | {name: summary["steps_trained"] for name, (summary, _) in new_runs.items()})
  scored = {name: summary for name, (summary, _) in new_runs.items()}
  # A run scored on test is no longer a validation-only row.
  validation_only = {name: run for name, run in new_validation_runs.items()
                     if name not in stored_rows(store)[0] and name not in scored}
  for name, run in {**scored, **validation_only}.items():
    store.add(name, steps=run["steps_trained"], command=run_command(experiment, run), machine=run["hardware"],
              values={key: value for key, value in run.items() if key not in ("steps_trained", "command", "hardware")})
  for name, (_, output_dir) in new_runs.items():
    folder = os.path.join(output, ROW_OUTPUTS, name)
    shutil.rmtree(folder, ignore_errors=True)  # an earlier run's of this row
    for written, page_name in output_files(experiment):
      if os.path.exists(os.path.join(output_dir, written)):
        os.makedirs(folder, exist_ok=True)
        shutil.copy(os.path.join(output_dir, written), os.path.join(folder, page_name))


def start_page(experiment: str, store: record_store.RecordStore, output: str, committed: str,
               new_names: set[str]) -> None:
  """Starts a new page folder ``output`` (``store`` then holds the committed records) from ``committed``: its files
  and its rows' outputs; a committed row named as one of ``new_names`` is kept as ``NAME (committed)``."""
  if os.path.exists(store.path) or os.path.realpath(output) == os.path.realpath(committed):
    return
  os.makedirs(output, exist_ok=True)
  for name in (pages.NOT_KEPT_NOTE, "curves.png", *PLOT_FOLDERS):  # the page links the plot folders when present
    if os.path.isdir(os.path.join(committed, name)):
      shutil.copytree(os.path.join(committed, name), os.path.join(output, name), dirs_exist_ok=True)
    elif os.path.exists(os.path.join(committed, name)):
      shutil.copy(os.path.join(committed, name), os.path.join(output, name))
  rows = os.path.join(committed, ROW_OUTPUTS)
  for name in os.listdir(rows) if os.path.isdir(rows) else ():
    shutil.copytree(os.path.join(rows, name),  # a rerun after a failed one finds them there
                    os.path.join(output, ROW_OUTPUTS, f"{name} (committed)" if name in new_names else name),
                    dirs_exist_ok=True)
  for name in new_names & set(store):
    store.rename(name, f"{name} (committed)")
