"""experiments/translation_results.py: rows accumulate in records.json across invocations, each scored row's
outputs in hypotheses/ROW/; the committed pages regenerate from their records."""
import glob
import json
import os
import shlex

import pytest

from experiments import launching, record_store, translation_results, translation_scores
from transformer.train.config import model_section
from transformer.train.convert_run import upgrade_config

HYPOTHESIS = "test_2016_flickr.hyp.de"


def summary(validation_bleu, test_bleu, **settings):
  """A row as summarize makes it; ``settings``: flat overrides of the transformer_small config it trained."""
  from experiments import multi30k
  config = multi30k.get_config("transformer_small")
  for key, value in settings.items():
    section, _, name = key.rpartition(".")
    (config[section] if section else config)[name] = value
  return {"variant": "transformer_small", "config": json.loads(config.to_json_best_effort()),
          "source_dir": "$TRANSFORMER_DATA_DIR", "size": "4+4 layers, d_model 128", "training_pairs": 29000,
          "best_step": 200, "averaged_steps": [], "steps_trained": 300, "steps_planned": 400, "wall_hours": 0.5,
          "beam_size": 5, "length_penalty": 0.6, "validation_bleu_by_length_penalty": {},
          "validation_bleu": validation_bleu, "test_bleu": test_bleu,
          "test_bleu_lowercase": test_bleu + 0.5, "signature": "nrefs:1|tok:13a",
          "hardware": "1 x cpu", "note": "",
          "curves": [{"step": 100, "train/nll": 3.0}, {"step": 200, "train/nll": 2.0, "eval/bleu": validation_bleu}]}


def write_results(output, new_runs, new_validation_runs=None, replace_only_longer=False):
  """One invocation's collect and render (as main's, without workdirs): returns the page."""
  store = record_store.RecordStore(str(output), force=not replace_only_longer)
  translation_scores.add_runs("multi30k", store, str(output), new_runs, new_validation_runs or {})
  text = translation_results.render_page("multi30k", store, str(output))
  store.save()
  return record_store.write_text(str(output), text)


def stored(output) -> dict:
  """Row name -> record of the page's records.json."""
  return dict(record_store.RecordStore(str(output)).items())


def read_markdown_table(text: str, first_column: str) -> list[dict[str, str]]:
  """The rows of the first table in markdown ``text`` whose header starts with ``first_column``, each as
  ``{column: cell}`` (the inverse of ``markdown_table`` for cells without ``|``); empty when there is none."""
  def cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]
  lines = text.splitlines()
  for index, line in enumerate(lines):
    if line.startswith("|") and cells(line)[0] == first_column:
      rows = []
      for body in lines[index + 2:]:  # after the header and its |---| line
        if not body.startswith("|"):
          break
        rows.append(dict(zip(cells(line), cells(body))))
      return rows
  return []


def run_dir(tmp_path, name, text):
  workdir = tmp_path / name
  workdir.mkdir()
  (workdir / HYPOTHESIS).write_text(text)
  return str(workdir)


def outputs(output, row, name=HYPOTHESIS):
  """The text of row ``row``'s output file ``name`` in the page folder ``output``."""
  return (output / "hypotheses" / row / name).read_text()


def test_rows_accumulate_and_each_keeps_its_outputs(tmp_path):
  output = tmp_path / "multi30k"
  output.mkdir()
  first = run_dir(tmp_path, "first", "erste\n")
  write_results(output, {"transformer_small": (summary(30.0, 31.0), first)})
  assert outputs(output, "transformer_small") == "erste\n"
  assert "Attention heatmaps" not in (output / "RESULTS.md").read_text()  # no plot folders yet

  (output / "alignment").mkdir()  # attention_plots.py output is linked once it exists
  (output / "alignment" / "README.md").write_text("# Attention maps\n")
  worse = run_dir(tmp_path, "worse", "schlechter\n")
  text = write_results(output, {"gru_bahdanau": (summary(20.0, 21.0), worse)})
  assert outputs(output, "transformer_small") == "erste\n" and outputs(output, "gru_bahdanau") == "schlechter\n"
  assert list(stored(output)) == ["transformer_small", "gru_bahdanau"]  # the order they were added
  main_table = text.split("Each row's test outputs")[0]
  rows = [line for line in main_table.splitlines() if line.startswith(("| transformer_small", "| gru"))]
  assert len(rows) == 2 and "| 31.00 | 31.50 |" in rows[0] and "| 21.00 | 21.50 |" in rows[1]
  assert "200 of 300 (stopped early of 400)" in rows[0]
  assert "The best model on validation is transformer_small." in text
  assert "[RNN attention alignment](alignment/README.md)" in text and "(attention/README.md)" not in text

  better = run_dir(tmp_path, "better", "besser\n")  # reporting a variant again replaces its row and outputs
  text = write_results(output, {"gru_bahdanau": (summary(35.0, 36.0), better)})
  assert outputs(output, "gru_bahdanau") == "besser\n" and outputs(output, "transformer_small") == "erste\n"
  assert "| 36.00 |" in text and "| 21.00 |" not in text
  assert "The best model on validation is gru_bahdanau." in text
  assert (output / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  assert not list(output.glob("*.hyp.*"))  # no row's outputs outside its folder


def test_the_other_test_sets_are_tabled_and_their_hypotheses_kept_with_their_row(tmp_path):
  output = tmp_path / "multi30k"
  output.mkdir()
  others = {"test_2017_flickr": {"bleu": 33.0, "bleu_lowercase": 33.5},
            "test_2018_flickr": {"bleu": 29.0, "bleu_lowercase": 29.25}}
  first = run_dir(tmp_path, "first", "erste\n")
  for split in others:
    (tmp_path / "first" / f"{split}.hyp.de").write_text(f"{split}\n")
  text = write_results(
      output, {"transformer_small": ({**summary(30.0, 31.0), "other_tests": others}, first)})
  for split in others:
    assert outputs(output, "transformer_small", f"{split}.hyp.de") == f"{split}\n"
  assert not (output / "hypotheses" / "transformer_small" / "test_2017_mscoco.hyp.de").exists()  # a dash
  assert "| transformer_small | 33.00 | 33.50 | - | - | 29.00 | 29.25 |" in text

  worse = run_dir(tmp_path, "worse", "schlechter\n")  # a model without the other sets: a row, no files
  text = write_results(output, {"gru_bahdanau": (summary(20.0, 21.0), worse)})
  assert outputs(output, "transformer_small", "test_2017_flickr.hyp.de") == "test_2017_flickr\n"
  assert "| gru_bahdanau | " not in text.split("The other test sets")[1].split("\n\n")[1]

  again = run_dir(tmp_path, "again", "nochmal\n")  # the row again without the other sets: its old files go
  text = write_results(output, {"transformer_small": (summary(30.0, 31.0), again)})
  assert os.listdir(output / "hypotheses" / "transformer_small") == [HYPOTHESIS]
  assert "The other test sets" not in text


@pytest.mark.parametrize("averaged_validation, chosen", [(33.0, "averaged"), (31.0, "best")])
def test_checkpoint_average_is_reported_only_when_better_on_validation(tmp_path, monkeypatch, averaged_validation,
                                                                        chosen):
  workdir = tmp_path / "run"
  workdir.mkdir()
  (workdir / "config.json").write_text(json.dumps({"num_train_steps": 400,
                                                  "task": {"name": "translation", "dataset": "multi30k"}}))
  (workdir / "model_config.json").write_text(json.dumps({"num_encoder_layers": 4, "num_decoder_layers": 4,
                                                         "d_model": 128}))
  (workdir / "metrics.jsonl").write_text(json.dumps({"step": 400, "train/nll": 2.0, "wall_seconds": 60.0}) + "\n")
  directories = {name: run_dir(tmp_path, f"{name}_dir", "Ein Hund .\n") for name in ("best", "averaged")}
  results = {  # test BLEU of the averaged parameters is lower: it must not influence the choice
      "best": ({"step": 300, "eval/bleu": 32.0, "test_2016_flickr/bleu": 35.0,
                "test_2016_flickr/bleu_lowercase": 36.0, "test_2016_flickr/bleu_signature": "s"},
               directories["best"]),
      "averaged": ({"step": 400, "averaged_steps": [300, 400], "eval/bleu": averaged_validation,
                    "test_2016_flickr/bleu": 34.0, "test_2016_flickr/bleu_lowercase": 35.0,
                    "test_2016_flickr/bleu_signature": "s"}, directories["averaged"])}
  monkeypatch.setattr(translation_scores, "evaluate",
                      lambda args, variant, workdir, average=0: results["averaged" if average else "best"])
  monkeypatch.setattr(translation_scores, "training_pairs", lambda args, config: 29000)
  monkeypatch.setattr(translation_scores, "test_references", lambda args, config: ["Ein Hund ."])
  row, output_dir = translation_scores.summarize(translation_results.parse_args(["--average_checkpoints=2"]),
                                                 "transformer_small", str(workdir))
  assert output_dir == directories[chosen]
  assert row["validation_bleu_by_checkpoint"] == {"best checkpoint": 32.0, "mean of the last 2": averaged_validation}
  cells = " | ".join(translation_results.row("transformer_small", {**row, "command": "cmd"}))
  assert ("mean of steps 300, 400 of 400" in cells) == (chosen == "averaged")
  assert row["test_bleu"] == (34.0 if chosen == "averaged" else 35.0)


def test_the_row_reports_the_length_penalty_chosen_on_validation(tmp_path, monkeypatch):
  workdir = tmp_path / "run"
  workdir.mkdir()
  (workdir / "config.json").write_text(json.dumps(
      {"num_train_steps": 400, "task": {"eval_split": "validation", "beam_size": 5, "length_penalty": 0.6}}))
  (workdir / "model_config.json").write_text(json.dumps({"cell": "gru", "attention": "bahdanau", "hidden_dim": 8}))
  (workdir / "metrics.jsonl").write_text(json.dumps({"step": 400, "train/nll": 2.0, "wall_seconds": 60.0}) + "\n")
  results = {"step": 400, "eval/bleu": 30.0,  # eval/bleu: decoded with the training-time alpha 0.6
             "validation/bleu": 32.0, "validation/bleu_by_length_penalty": {"0.6": 30.0, "1.5": 32.0},
             "test_2016_flickr/length_penalty": 1.5, "test_2016_flickr/bleu": 35.0,
             "test_2016_flickr/bleu_lowercase": 36.0, "test_2016_flickr/bleu_signature": "s"}
  output_dir = run_dir(tmp_path, "output", "Ein Hund .\n")
  monkeypatch.setattr(translation_scores, "evaluate",
                      lambda args, variant, workdir, average=0: (results, output_dir))
  monkeypatch.setattr(translation_scores, "training_pairs", lambda args, config: 29000)
  monkeypatch.setattr(translation_scores, "test_references", lambda args, config: ["Ein Hund ."])
  row, _ = translation_scores.summarize(translation_results.parse_args([]), "gru_bahdanau", str(workdir))
  assert row["validation_bleu"] == 32.0  # the BLEU of the alpha the test was decoded with
  cells = translation_results.row("gru_bahdanau", {**row, "command": "cmd"})
  assert "beam 5, alpha 1.5 (on validation: 0.6: 30.00, 1.5: 32.00)" in cells


def test_a_greedy_or_sampled_run_is_labelled_by_its_decoding_not_by_beam_settings():
  # As summarize writes them: beam_size and length_penalty are the config's, whatever its method.
  greedy = {**summary(30.0, 31.0, **{"decode.method": "greedy"}), "beam_size": 5, "length_penalty": 0.6,
            "command": "cmd"}
  sampled = {**summary(20.0, 21.0, **{"decode.method": "sample", "decode.temperature": 0.8, "decode.top_p": 0.9}),
             "command": "cmd"}
  beam = {**summary(32.0, 33.0), "beam_size": 5, "length_penalty": 1.0, "command": "cmd"}
  assert translation_results.row("greedy", greedy)[6] == "greedy"
  assert translation_results.row("beam", beam)[6] == "beam 5, alpha 1"  # the alpha its --mode=eval chose
  table = translation_results.validation_table({"greedy": greedy}, {"sampled": sampled, "beam": beam})
  rows = read_markdown_table(table, "model")
  assert [row["decoding during training"] for row in rows] == [
      "greedy", "sampling, temperature 0.8, top-p 0.9", "beam 5, alpha 0.6"]


def test_the_command_of_a_run_reproduces_its_config(tmp_path):
  """A run trained with overrides (or before its variant changed): the row's flags rebuild its config.json."""
  from experiments import multi30k
  config = multi30k.get_config("gru_bahdanau")
  config.num_train_steps = 1000
  config.task.pair = "en-fr"
  config.task.length_penalty_candidates = (1.0, 2.0)
  config.model.dropout_rate = 0.25
  config.task.source_dir = str(tmp_path)  # where the data lives is not a training setting
  run_config = json.loads(config.to_json_best_effort())
  overrides = translation_scores.config_overrides("multi30k", "gru_bahdanau", run_config)
  assert overrides == ["--config.model.dropout_rate=0.25", "--config.num_train_steps=1000",
                       "--config.task.length_penalty_candidates=(1.0,2.0)", "--config.task.pair=en-fr"]

  argv = ["launch.py", "--config=experiments/multi30k.py:gru_bahdanau", *overrides,
          f"--config.task.source_dir={tmp_path}"]
  assert _launch_config(argv) == run_config


def _launch_config(argv: list[str]) -> dict:
  """The config ``launch.py ARGV`` trains (its config file, variant and --config.* overrides)."""
  return json.loads(launching.launch_config(argv[1:]).to_json_best_effort())


def test_row_commands_follow_the_variant_defaults_of_the_day_the_page_is_written(tmp_path, monkeypatch):
  """A row keeps its run's settings: when a default changes later, its command spells out the old value."""
  from experiments import multi30k
  output = tmp_path / "multi30k"
  output.mkdir()
  workdir = run_dir(tmp_path, "run", "Ein Hund .\n")
  row = summary(30.0, 31.0, num_train_steps=123)
  prefix = ("python launch.py --config=experiments/multi30k.py:transformer_small --workdir=WORKDIR "
            "--config.task.source_dir=$TRANSFORMER_DATA_DIR")
  text = write_results(output, {"transformer_small": (row, workdir)})
  assert f"`{prefix} --config.num_train_steps=123`" in text

  get_config = multi30k.get_config
  def changed_defaults(variant):
    config = get_config(variant)
    config.num_train_steps, config.model.dropout_rate = 123, 0.2
    return config
  monkeypatch.setattr(multi30k, "get_config", changed_defaults)
  text = write_results(output, {})  # rewritten from records.json
  assert f"`{prefix} --config.model.dropout_rate=0.3`" in text
  assert stored(output)["transformer_small"]["command"] == f"{prefix} --config.model.dropout_rate=0.3"


def test_run_specs_name_rows_and_bad_ones_say_what_to_give(tmp_path):
  (tmp_path / "config.json").write_text('{"task": {"name": "translation", "dataset": "multi30k"}}')
  assert translation_results.parse_run("multi30k", f"gru_bahdanau:{tmp_path}") == ("gru_bahdanau", "gru_bahdanau",
                                                                                    str(tmp_path))
  assert translation_results.parse_run("multi30k", f"first try=transformer_small:{tmp_path}") == (
      "first try", "transformer_small", str(tmp_path))
  with pytest.raises(translation_results.UserError, match="give VARIANT:WORKDIR"):
    translation_results.parse_run("multi30k", "gru_bahdanau")
  with pytest.raises(translation_results.UserError, match="unknown variant 'gru' .*gru_bahdanau"):
    translation_results.parse_run("multi30k", f"gru:{tmp_path}")
  with pytest.raises(translation_results.UserError, match="holds no config.json"):
    translation_results.parse_run("multi30k", f"gru_bahdanau:{tmp_path / 'missing'}")
  with pytest.raises(translation_results.UserError, match="holds a 'multi30k' run, not one of experiments/iwslt15"):
    translation_results.parse_run("iwslt15_en_vi", f"gru_bahdanau:{tmp_path}")
  (tmp_path / "config.json").write_text('{"task": {"name": "synthetic"}}')
  with pytest.raises(translation_results.UserError, match="holds a 'synthetic' run, not one of experiments/multi30k"):
    translation_results.parse_run("multi30k", f"gru_bahdanau:{tmp_path}")


def test_bleu_by_reference_length_groups_the_test_sentences(tmp_path, monkeypatch):
  """The summary scores the written test hypotheses per reference-length group: a hypothesis that only gets
  the long sentence wrong lowers only that group, and the groups hold every sentence once."""
  short = ["ein Hund läuft über die Wiese .", "zwei Kinder spielen im Park .", "eine Frau liest ein Buch ."]
  long = " ".join(["ein Mann in einem roten Hemd steht neben einem Auto und spricht mit einer Frau ."] * 2)
  references = short + [long]
  output_dir = run_dir(tmp_path, "output", "\n".join(short + ["ein Mann"]) + "\n")
  monkeypatch.setattr(translation_scores, "test_references", lambda args, config: references)
  by_length = translation_scores.test_bleu_by_reference_length(translation_results.parse_args([]), {"task": {}},
                                                               output_dir)
  assert list(by_length) == ["0-9", "20-39"]
  assert [group["sentences"] for group in by_length.values()] == [3, 1]
  assert by_length["0-9"]["bleu"] == pytest.approx(100.0) and by_length["0-9"]["length_ratio"] == 1.0
  assert by_length["20-39"]["bleu"] < 5.0 and by_length["20-39"]["length_ratio"] < 0.2

  text = translation_results.by_length_table("test_2016_flickr", {
      "old": summary(30.0, 31.0), "new": {**summary(32.0, 33.0), "test_bleu_by_reference_length": by_length}})
  assert "| model | 0-9 words (3 sentences) | 20-39 words (1 sentences) |" in text
  assert "| new | 100.00 (length ratio 1.00) |" in text and "| old |" not in text  # rows from before: left out
  assert translation_results.by_length_table("test_2016_flickr", {"old": summary(30.0, 31.0)}) == ""


def test_validation_only_runs_are_listed_beside_the_scored_ones_and_never_replace_their_output(tmp_path,
                                                                                               monkeypatch):
  output = tmp_path / "multi30k"
  output.mkdir()
  write_results(output, {"transformer_small": (summary(30.0, 31.0), run_dir(tmp_path, "scored", "a\n"))})
  workdir = tmp_path / "lost"
  workdir.mkdir()
  from experiments import multi30k
  config = multi30k.get_config("transformer_small")
  config.model.dropout_rate = 0.5
  (workdir / "config.json").write_text(config.to_json_best_effort())
  (workdir / "model_config.json").write_text(json.dumps({"num_encoder_layers": 4, "num_decoder_layers": 4,
                                                         "d_model": 128}))
  records = [{"step": 100, "train/nll": 3.0, "wall_seconds": 36.0},
             {"step": 100, "eval/nll": 2.5, "eval/bleu": 12.5},
             {"step": 200, "train/nll": 2.0, "wall_seconds": 72.0},
             {"step": 200, "eval/nll": 2.25, "eval/bleu": 40.0}]  # higher than the scored row: still not committed
  (workdir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
  monkeypatch.setattr(translation_scores, "training_pairs", lambda args, config: 29000)
  args = translation_results.parse_args([])
  lost = translation_scores.validation_summary(args, "transformer_small", str(workdir))
  text = write_results(output, {}, {"more dropout": lost})

  assert outputs(output, "transformer_small") == "a\n"
  assert "The best model on validation is transformer_small." in text
  assert "test_bleu" not in stored(output)["more dropout"]["values"]  # recorded, not scored
  section = text.split("Every run by the validation BLEU")[1].split("\n\n")[1]  # the table after the caption
  rows = {line.split(" | ")[0][2:]: line for line in section.splitlines()[2:]}
  assert set(rows) == {"transformer_small", "more dropout"}
  assert "| 100: 12.50, 200: 40.00 | 2.25 | no |" in rows["more dropout"]
  assert "| 200: 30.00 | - | yes (table above) |" in rows["transformer_small"]
  assert "| 200 | 0.02 h | beam 5, alpha 0.6 |" in rows["more dropout"]
  assert "--config.model.dropout_rate=0.5" in rows["more dropout"]

  # Scoring that run on test later moves it out of the validation-only list.
  text = write_results(
      output, {"more dropout": (summary(29.0, 30.0), run_dir(tmp_path, "now scored", "b\n"))})
  assert "test_bleu" in stored(output)["more dropout"]["values"]
  assert "Every run by the validation BLEU" not in text

  (workdir / "metrics.jsonl").write_text(json.dumps(records[0]) + "\n")  # stopped before its first evaluation
  with pytest.raises(translation_results.UserError, match="no eval/bleu"):
    translation_scores.validation_summary(args, "transformer_small", str(workdir))


def _flat_settings(config: dict) -> dict:
  """A config's flattened fields less those that say where data lives or how a command ran."""
  return {key: value for key, value in launching.flatten_config(config).items()
          if key not in translation_scores.NOT_TRAINING_SETTINGS}


def test_an_old_shaped_run_config_gets_model_overrides_that_rebuild_it():
  """config.json saved before config.model_name (sections ``model`` and ``rnn``, ``architecture`` choosing one):
  the overrides name today's ``config.model`` fields, and parsing them gives the migrated settings."""
  from experiments import multi30k
  new_shape = json.loads(multi30k.get_config("gru_bahdanau").to_json_best_effort())
  transformer_section = json.loads(multi30k.get_config("transformer_small").to_json_best_effort())["model"]
  old_shape = {key: value for key, value in new_shape.items() if key not in ("model_name", "model")}
  old_shape.update(architecture="rnn", rnn={**new_shape["model"], "hidden_dim": 256, "cell": "lstm"},
                   model={**transformer_section, "num_classes": 2, "pooling": "mean"})
  overrides = translation_scores.config_overrides("multi30k", "gru_bahdanau", old_shape)
  assert overrides == ["--config.model.cell=lstm", "--config.model.hidden_dim=256"]
  command = ("python launch.py --config=experiments/multi30k.py:gru_bahdanau --workdir=WORKDIR "
             "--config.task.source_dir=../data " + " ".join(overrides))
  parsed = _launch_config(shlex.split(command)[1:])
  assert _flat_settings(parsed) == _flat_settings(upgrade_config(old_shape))
  with pytest.raises(ValueError, match="trained model_name='rnn', but .*transformer_small builds 'transformer'"):
    translation_scores.config_overrides("multi30k", "transformer_small", old_shape)


@pytest.mark.parametrize("experiment", translation_results.EXPERIMENTS)
def test_every_committed_row_command_reproduces_its_recorded_settings(experiment):
  """Each row of the committed records.json: its command, parsed as launch.py parses it (config file,
  variant, --config.* overrides) with today's experiment configs, gives the run's saved config.json (migrated
  to today's shape) in every field the run recorded and today's configs still have."""
  store = record_store.RecordStore(os.path.join(record_store.COMMITTED, experiment))
  assert len(store)
  for name, record in store.items():
    parsed = _flat_settings(_launch_config(shlex.split(record["command"])[1:]))
    recorded = {key: value for key, value in _flat_settings(upgrade_config(record["values"]["config"])).items()
                if key not in translation_scores.NOT_TRAINING_SETTINGS}
    assert recorded.keys() <= parsed.keys(), (name, sorted(recorded.keys() - parsed.keys()))
    assert {key: parsed[key] for key in recorded} == recorded, name
    # Model fields added after the run take their defaults (which keep the behaviour the run had).
    defaults = model_section(recorded["model_name"]).to_dict()
    added = {key for key in parsed if key.startswith("model.")} - set(recorded)
    assert {key: parsed[key] for key in added} == {key: defaults[key[len("model."):]] for key in added}, name


def _file_bytes(folder) -> dict:
  return {os.path.relpath(path, folder): open(path, "rb").read()
          for path in glob.glob(os.path.join(folder, "**"), recursive=True) if os.path.isfile(path)}


def _committed_copy(tmp_path):
  """A copy of the committed experiments/multi30k/ page (tests never write the repository's)."""
  import shutil
  committed = tmp_path / "committed" / "multi30k"
  shutil.copytree(os.path.join(record_store.COMMITTED, "multi30k"), committed)
  return committed


def _fake_workdir(tmp_path, name, steps):
  """A run's workdir as parse_run and the step check read it: config.json and metrics.jsonl."""
  workdir = tmp_path / name
  workdir.mkdir()
  (workdir / "config.json").write_text(json.dumps({"task": {"name": "translation", "dataset": "multi30k"}}))
  (workdir / "metrics.jsonl").write_text(json.dumps({"step": steps, "train/nll": 2.0, "wall_seconds": 6.0}) + "\n")
  return workdir


def test_by_default_the_page_goes_to_a_new_folder_beside_the_committed_rows(tmp_path, monkeypatch, capsys):
  """main with --run alone: the committed page (here a copy, and the repository's own) keeps its bytes; the new
  folder WORKDIR/results shows the new row beside the committed ones, each with its outputs."""
  committed = _committed_copy(tmp_path)
  monkeypatch.setattr(record_store, "COMMITTED", str(committed.parent))
  before, repository_before = _file_bytes(committed), _file_bytes(
      os.path.join(record_store.REPO, "experiments", "multi30k"))
  workdir = _fake_workdir(tmp_path, "short_run", steps=300)
  (workdir / HYPOTHESIS).write_text("kurz\n")
  monkeypatch.setattr(translation_scores, "summarize",
                      lambda args, variant, workdir: (summary(9.86, 9.5), workdir))
  translation_results.main(["--experiment=multi30k", f"--run=transformer_small:{workdir}"])
  assert _file_bytes(committed) == before
  assert _file_bytes(os.path.join(record_store.REPO, "experiments", "multi30k")) == repository_before
  output = workdir / "results"
  assert str(output) in capsys.readouterr().out
  rows, committed_rows = stored(output), stored(committed)
  assert list(rows) == [name if name != "transformer_small" else f"{name} (committed)"  # in its place
                        for name in committed_rows] + ["transformer_small"]
  assert rows["transformer_small (committed)"]["values"] == committed_rows["transformer_small"]["values"]
  for row in os.listdir(committed / "hypotheses"):  # the committed rows' outputs came with them
    new_name = f"{row} (committed)" if row == "transformer_small" else row
    assert _file_bytes(output / "hypotheses" / new_name) == _file_bytes(committed / "hypotheses" / row)
  assert outputs(output, "transformer_small") == "kurz\n"
  text = (output / "RESULTS.md").read_text()
  assert "| transformer_small | " in text and "| transformer_small (committed) | " in text

  with pytest.raises(SystemExit, match="is the committed page; give --update_committed"):  # named as an output
    translation_results.main([f"--run=transformer_small:{workdir}", f"--output_dir={committed}"])
  assert _file_bytes(committed) == before


def test_a_committed_row_is_replaced_only_by_a_run_at_least_as_long(tmp_path, monkeypatch):
  committed = _committed_copy(tmp_path)
  recorded = stored(committed)["transformer_small"]["steps"]
  before = _file_bytes(committed)
  short = run_dir(tmp_path, "short", "kurz\n")
  with pytest.raises(translation_results.UserError) as refused:
    write_results(committed, {
        "transformer_small": ({**summary(9.86, 9.5), "steps_trained": 300}, short)}, replace_only_longer=True)
  message = str(refused.value)
  assert "\n" not in message and "'transformer_small'" in message and "--force" in message
  assert f"{recorded} training steps, the new one trained 300" in message
  assert _file_bytes(committed) == before  # refused before anything is written

  # Through main: refused before the run is decoded, as one line and exit status 1.
  monkeypatch.setattr(record_store, "COMMITTED", str(committed.parent))
  monkeypatch.setattr(translation_scores, "summarize", lambda *args: pytest.fail("decoded a refused run"))
  workdir = _fake_workdir(tmp_path, "short_run", steps=300)
  with pytest.raises(SystemExit) as exited:
    translation_results.main([f"--run=transformer_small:{workdir}", "--update_committed"])
  assert str(exited.value).startswith("error: ") and "trained 300" in str(exited.value)
  assert _file_bytes(committed) == before

  longer = run_dir(tmp_path, "longer", "lang\n")  # as long as the recorded run: it replaces the row
  text = write_results(committed, {
      "transformer_small": ({**summary(50.0, 51.0), "steps_trained": recorded}, longer)}, replace_only_longer=True)
  assert stored(committed)["transformer_small"]["values"]["test_bleu"] == 51.0
  assert outputs(committed, "transformer_small") == "lang\n" and "| 51.00 |" in text

  # --force (replace_only_longer=False) lets a shorter run replace it, outputs included.
  write_results(committed, {"transformer_small": ({**summary(9.86, 9.5), "steps_trained": 300}, short)})
  assert stored(committed)["transformer_small"]["steps"] == 300 and outputs(committed, "transformer_small") == "kurz\n"


def test_averaging_more_checkpoints_than_a_run_kept_is_refused_naming_them(tmp_path):
  for step in (100, 200, 300):
    (tmp_path / "checkpoints" / str(step)).mkdir(parents=True)
  translation_scores.check_checkpoints(str(tmp_path), 3)
  with pytest.raises(translation_results.UserError,
                     match=r"kept 3 checkpoint\(s\) \(steps 100, 200, 300\); give --average_checkpoints=3 or fewer"):
    translation_scores.check_checkpoints(str(tmp_path), 5)


@pytest.mark.slow
def test_a_failing_launch_is_one_more_line_not_a_traceback(tmp_path):
  with pytest.raises(translation_results.UserError, match="exited with status 1 .its error is printed above"):
    launching.run_launch(["--config=experiments/no_such_experiment.py", f"--workdir={tmp_path}"])


def test_rows_of_one_setting_over_seeds_are_tabled_with_their_mean_and_each_seed(tmp_path):
  """A row of one seed is one draw: rows that differ only in config.seed get a table with the mean (the number
  to quote) and each seed, and the main table says each row's seed."""
  output = tmp_path / "multi30k"
  output.mkdir()
  runs = {"transformer_small": (summary(30.0, 31.0), run_dir(tmp_path, "seed0", "null\n")),
          "transformer_small_seed1": (summary(29.0, 30.0, seed=1), run_dir(tmp_path, "seed1", "eins\n")),
          "transformer_small_warmup": (summary(28.0, 27.0, **{"optimizer.warmup_steps": 10}),
                                       run_dir(tmp_path, "other", "anders\n"))}
  text = write_results(output, runs)
  rows = read_markdown_table(text, "rows")
  assert rows == [{"rows": "transformer_small, transformer_small_seed1", "seeds": "0, 1",
                   "test_2016_flickr BLEU: mean (each seed)": "30.50 (31.00, 30.00)",
                   "test_2016_flickr BLEU lowercased: mean (each seed)": "31.00 (31.50, 30.50)",
                   "validation BLEU: mean (each seed)": "29.50 (30.00, 29.00)"}]
  assert [row["seed"] for row in read_markdown_table(text, "model")] == ["0", "1", "0"]
  # The same seed twice (a rerun) is not averaged: which rows to take would be a guess.
  assert translation_scores.seed_groups({"a": runs["transformer_small"][0],
                                          "b": {**runs["transformer_small"][0]}}) == []


def test_every_scored_row_keeps_its_test_output_and_the_page_says_where(tmp_path):
  """Every row's outputs are in hypotheses/ROW/ and the outputs table lists them, so each test BLEU of the table
  can be recomputed; a row without them says how to make them."""
  output = tmp_path / "multi30k"
  output.mkdir()
  first = run_dir(tmp_path, "first", "erste\n")
  write_results(output, {"transformer_small": (summary(30.0, 31.0), first)})
  worse = run_dir(tmp_path, "worse", "schlecht\n")
  (tmp_path / "worse" / "validation.eval.hyp.de").write_text("validiert\n")  # what --mode=eval writes
  write_results(output, {"gru_bahdanau": (summary(20.0, 21.0), worse)})
  text = write_results(
      output, {"best": (summary(35.0, 36.0), run_dir(tmp_path, "best", "beste\n"))})
  assert [outputs(output, row) for row in ("transformer_small", "gru_bahdanau", "best")] == [
      "erste\n", "schlecht\n", "beste\n"]
  table = read_markdown_table(text.split("Each row's test outputs")[1], "model")
  listed = {row["model"]: row["test outputs in this folder"] for row in table}
  assert listed == {"transformer_small": f"`hypotheses/transformer_small/{HYPOTHESIS}`",
                    "gru_bahdanau": f"`hypotheses/gru_bahdanau/{HYPOTHESIS}`",
                    "best": f"`hypotheses/best/{HYPOTHESIS}`"}
  # The validation outputs behind the validation BLEU column, or a row's mark that they were not kept.
  validation = {row["model"]: row["validation outputs (chose the checkpoint and alpha)"] for row in table}
  assert validation["gru_bahdanau"] == "`hypotheses/gru_bahdanau/validation.hyp.de`"
  assert validation["best"].startswith("not kept (the row was scored before `--mode=eval` wrote")

  # A page of one's own starts with them; a committed row renamed beside a new run of its name keeps its own.
  mine = tmp_path / "mine"
  store = record_store.RecordStore(str(mine), start_from=str(output))
  translation_scores.start_page("multi30k", store, str(mine), str(output), {"transformer_small"})
  assert (mine / "hypotheses" / "transformer_small (committed)" / HYPOTHESIS).read_text() == "erste\n"
  assert (mine / "hypotheses" / "gru_bahdanau" / HYPOTHESIS).read_text() == "schlecht\n"
  assert list(store) == ["transformer_small (committed)", "gru_bahdanau", "best"]

  # A row reported before rows kept their outputs: the page says so and how to make them.
  (output / "hypotheses" / "gru_bahdanau" / HYPOTHESIS).unlink()
  text = write_results(output, {})
  assert ("| gru_bahdanau | 21.00 | not committed (the row was reported before every row's outputs were kept): "
          "train it with the row's command, then `python -m experiments.translation_results --experiment=multi30k "
          "--run=gru_bahdanau=transformer_small:WORKDIR` scores it") in text


@pytest.mark.parametrize("experiment", translation_results.EXPERIMENTS)
def test_the_committed_page_is_regenerated_from_its_records_alone(experiment, tmp_path, monkeypatch):
  """``--from_records --update_committed`` (on a copy of the committed folder): no workdir, the same page."""
  import shutil
  committed = tmp_path / experiment
  shutil.copytree(os.path.join(record_store.COMMITTED, experiment), committed)
  before = (committed / "RESULTS.md").read_text()
  (committed / "RESULTS.md").unlink()  # so that only a page written again from the records can match
  monkeypatch.setattr(record_store, "COMMITTED", str(tmp_path))
  translation_results.main([f"--experiment={experiment}", "--from_records", "--update_committed"])
  assert (committed / "RESULTS.md").read_text() == before
  assert stored(committed) == stored(os.path.join(record_store.REPO, "experiments", experiment))


@pytest.mark.parametrize("best_first", [False, True])
def test_the_best_row_reported_again_beside_a_better_run_keeps_its_new_outputs(tmp_path, best_first):
  """One invocation re-reports the best row (now worse) and adds a better run, in either order: each row's folder
  holds its new run's outputs, the re-reported row's not its old ones."""
  output = tmp_path / "multi30k"
  output.mkdir()
  write_results(output, {"transformer_small": (summary(30.0, 31.0), run_dir(tmp_path, "old", "alt\n")),
                         "gru_bahdanau": (summary(20.0, 21.0), run_dir(tmp_path, "gru", "gru\n"))})
  new_runs = {"transformer_small": (summary(25.0, 26.0), run_dir(tmp_path, "new", "neu\n")),
              "best": (summary(35.0, 36.0), run_dir(tmp_path, "best", "beste\n"))}
  write_results(output, dict(reversed(new_runs.items())) if best_first else new_runs)
  assert [outputs(output, row) for row in ("best", "transformer_small", "gru_bahdanau")] == ["beste\n", "neu\n", "gru\n"]


def test_no_run_and_no_records_refuses_instead_of_writing_an_empty_page(tmp_path, monkeypatch):
  """Without --run the page is rewritten from records.json: with none there (nor committed) that wrote a page of
  no rows, exit 0; now one line naming the files, and no folder made."""
  monkeypatch.setattr(record_store, "COMMITTED", str(tmp_path / "committed"))
  output = tmp_path / "page"
  with pytest.raises(SystemExit, match=f"there is no {output / 'records.json'} nor "
                                       f"{tmp_path / 'committed' / 'multi30k' / 'records.json'}"):
    translation_results.main(["--experiment=multi30k", f"--output_dir={output}"])
  assert not output.exists()
