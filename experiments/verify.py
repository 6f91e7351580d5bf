"""Check every published number against what the committed files give: exit 1 naming each one that differs.

    python -m experiments.verify                 # the committed README and pages; data from $TRANSFORMER_DATA_DIR
    python -m experiments.verify --root=DIR      # copies of the pages in DIR (the repository's layout)
    python -m experiments.verify --partial       # without the raw data: the rest, the last line says "partial"

What it recomputes, from the committed files only (nothing is trained or decoded):
- every results page, written again from its ``records.json`` (and PM2.5's ``*.npz``) by its own script
  (``--from_records``): every number of the page must come out as printed. The PM2.5 tables, intervals and
  t-tests are computed there from the committed test forecasts, its validation MAEs from the committed per-window
  validation errors; the ablations' statistics from the per-seed values;
- the numbers a page's rows rest on, from the outputs committed beside it (``recompute`` of its results script,
  the row printed again by its ``row``): synthetic exact match and token accuracy from the decoded held-out
  outputs, the LM's perplexities and cross-entropy from per-sentence log-probabilities, Disaster Tweets' F1,
  precision, recall, accuracy, thresholds and ensemble intervals from each seed's predicted probabilities;
- the values of those pages' rows (and PM2.5's) that a run's training log gives (steps, the best step and its
  logged validation metric, wall time, speed), from the log committed beside the page (``logs/<row>.jsonl``,
  ``log_values`` of the page's script); each ablation cell's per-seed final metrics, divergence and training
  losses from its run's log (``logs/<run>.jsonl``);
- BLEU of every committed test output (``*.hyp.*``) against the raw reference, with the tokenisation of the row's
  sacreBLEU signature, cased and lowercased, and BLEU by reference length; the validation BLEU that chose a
  row's checkpoint from its ``validation.hyp.*`` (needs the data folder; without it the check fails naming each
  number it could not check, unless ``--partial`` asks for the rest alone); each row's checkpoint against the
  validation BLEU its training logged (``curves`` of its record);
- the ratios of ``benchmarks/RESULTS.md`` from the timings in the same table, to the timings' printed rounding,
  and the worst ratio each section's target line quotes; where a table gives a step time beside tokens/s and
  MFU, both from the step time (tokens per step from the section's text, MFU against the peak it names), and the
  MFU a target line says a ratio needs;
- the README's results table, as text, against the table ``experiments.readme_results`` writes again from the
  pages it links (every word: numbers, counts, horizons, "met" / "not met"); every result in
  ``benchmarks/README.md``'s target table against the page it links (the number as printed there).

What has nothing committed behind it (a score whose outputs were not kept, a timing) is listed, with why
(``NOT_COMMITTED``, and a results script's ``not_committed(folder)`` for its page's rows); it does not fail the check.
What has only the record its page was written from behind it is listed as record only: a page and its
``records.json`` edited together pass there. Every number of the pages is accounted for (``verify_rules``): checked
against outputs, logs or the figures beside it (or quoted from a page checked so), on the record-only or
not-committed list, or exempt by a named rule; a number none of these holds fails the check, naming page, line and
number. The summary counts the checks against committed evidence apart from those of a page against its own
records, and the numbers of the pages by class.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import difflib
import importlib
import io
import json
import math
import os
import re
import sys
import tempfile

from experiments import record_store
from transformer.errors import UserError

# The pages a results script writes, and the arguments that write them again from their records.
PAGES = {
    "experiments/synthetic/RESULTS.md": ("experiments.synthetic_results", []),
    "experiments/language_model/RESULTS.md": ("experiments.language_model_results", []),
    "experiments/disaster_tweets/RESULTS.md": ("experiments.disaster_tweets_results", []),
    "experiments/multi30k/RESULTS.md": ("experiments.translation_results", ["--experiment=multi30k"]),
    "experiments/iwslt15_en_vi/RESULTS.md": ("experiments.translation_results", ["--experiment=iwslt15_en_vi"]),
    "experiments/ablations/RESULTS.md": ("experiments.ablations_results", []),
    "experiments/ablations/multi30k/RESULTS.md": (
        "experiments.ablations_results",
        ["--task=multi30k", "--ablation=scaling,heads,positions,norm_position,norms,regularization,rnn_attention"]),
    "experiments/beijing_pm25/RESULTS.md": ("experiments.beijing_pm25_results", []),
}
README, BENCHMARKS_README, BENCHMARKS_RESULTS = "README.md", "benchmarks/README.md", "benchmarks/RESULTS.md"
BENCHMARKS_FINDINGS = "benchmarks/FINDINGS.md"  # hand-recorded: listed as not verified
# Lines of a page that stamp where and when it was written, not a result.
STAMPS = ("Page written on:",)
NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")
# A result in a README's sentence: a decimal, or a whole number with % or x (targets and ratios).
RESULT = re.compile(r"(?<![\w.])(\d[\d,]*\.\d+|\d[\d,]*(?=\s?%|x\b))")
# Raw reference of a test set, per experiment, in the data folder (as the TFDS builders read them).
REFERENCE_FILES = {"multi30k": "{split}.de.gz", "iwslt15_en_vi": "{split}.vi"}
# The raw file of each experiment's validation split (the page's ``validation.hyp.*``).
VALIDATION_FILES = {"multi30k": "val", "iwslt15_en_vi": "tst2012"}
# Pages whose rows rest on outputs committed beside them: the results script, whose ``recompute(folder, name,
# record)`` gives a row's values from them (None: none committed), ``row(name, record)`` prints the row,
# ``HEADER`` names its columns and ``RECOMPUTED_COLUMNS`` those the outputs give.
RECOMPUTED = {
    "experiments/synthetic/RESULTS.md": "experiments.synthetic_results",
    "experiments/language_model/RESULTS.md": "experiments.language_model_results",
    "experiments/disaster_tweets/RESULTS.md": "experiments.disaster_tweets_results",
}
# Pages whose rows keep their run's training log beside them (``output_pages.read_log``): the module whose
# ``log_values(log)`` gives the row's values (``steps`` the record's own) that the log gives.
LOGGED = {
    "experiments/synthetic/RESULTS.md": "experiments.synthetic_results",
    "experiments/language_model/RESULTS.md": "experiments.language_model_results",
    "experiments/disaster_tweets/RESULTS.md": "experiments.disaster_tweets_scores",
    "experiments/beijing_pm25/RESULTS.md": "experiments.beijing_pm25_scores",
}
# Per logged page: the heading of its rows' table, and which columns print each value ``log_values`` gives (the
# cells a check against the log confirms, for the accounting of every number: ``verify_rules``).
LOG_COLUMNS = {
    "experiments/synthetic/RESULTS.md": ("task", {
        "steps": ("steps",), "reached": ("first >= 99% exact match",), "wall_seconds": ("total wall time",),
        "steps_per_second": ("steps/s (median)",), "tokens_per_second": ("tokens/s (median)",)}),
    "experiments/language_model/RESULTS.md": ("variant", {
        "steps": ("steps",), "best_step": ("at step",), "wall_seconds": ("total wall time",),
        "tokens_per_second": ("tokens/s (median)",)}),
    "experiments/disaster_tweets/RESULTS.md": ("variant", {
        "steps": ("chosen step",), "chosen_step": ("chosen step",), "wall_seconds": ("training wall time",),
        "validation_f1": ("validation F1 (chosen step)",)}),
    "experiments/beijing_pm25/RESULTS.md": ("run", {
        "steps": ("steps done",), "best_step": ("best step (validation MAE)",), "wall_seconds": ("wall time",),
        "steps_per_second": ("steps/s (median)",)}),
}
# The ablation pages (each keeps its runs' training logs, ``logs/<run>.jsonl``): their task.
ABLATION_PAGES = {"experiments/ablations/RESULTS.md": "synthetic",
                  "experiments/ablations/multi30k/RESULTS.md": "multi30k"}
# What has nothing committed behind it on each page, whatever the rows: (what, why).
NOT_COMMITTED = {
    "experiments/language_model/RESULTS.md": [("the continuations", "greedy decoding of the best checkpoint, kept "
                                               "in records.json as decoded; the checkpoint is not committed")],
    "experiments/ablations/multi30k/RESULTS.md": [("each seed's validation outputs", "not committed: a seed's final "
                                                   "validation BLEU stands in its run's training log only")],
    BENCHMARKS_FINDINGS: [("every figure (earlier runs, A/B measurements, profiles)", "copied by hand from the output "
                           "of runs whose RESULTS.md sections later runs replaced, or that wrote none")],
    README: [("the quick start's and the test suite's wall times and test counts", "measured by hand, no record")],
}
# Numbers whose only evidence is the record the page was written from are selected by the ``record only`` rules of
# ``experiments/verify_rules.py`` (with every exempt and not-committed number): the list is made from them.


@dataclasses.dataclass
class Tally:
  """What the check found: per page, how many numbers each kind of check confirmed; the numbers that differ; what
  could not be verified, with why."""
  verified: dict = dataclasses.field(default_factory=lambda: collections.defaultdict(collections.Counter))
  differences: list = dataclasses.field(default_factory=list)
  not_verified: list = dataclasses.field(default_factory=list)
  # Numbers that have their evidence committed but could not be checked here, the raw data (a reference) absent:
  # the check is then incomplete, and fails unless a partial check was asked for (--partial).
  not_checked: list = dataclasses.field(default_factory=list)
  # Numbers with only their record behind them (the ``record only`` rules of ``verify_rules``).
  record_only: list = dataclasses.field(default_factory=list)
  # Per page: (line, column index or None for the whole line) -> the evidence a check confirmed there
  # (``verify_rules.EVIDENCE``); the lines compared with the page written again from its records.
  marks: dict = dataclasses.field(default_factory=lambda: collections.defaultdict(dict))
  compared: dict = dataclasses.field(default_factory=lambda: collections.defaultdict(set))
  account: object = None  # verify_rules.Account: every number of the pages by class

  def check(self, page: str, kind: str, where: str, printed: str, recomputed: str,
            at: tuple | None = None, evidence: str | None = None) -> bool:
    """One number: counted when ``printed`` equals ``recomputed``, else a difference naming it. Where it agrees,
    the cell or line ``at`` (``(line, column index or None)``) is marked as confirmed by ``evidence``."""
    if printed == recomputed:
      self.verified[page][kind] += 1
      if at is not None and evidence is not None:
        self.marks[page].setdefault(at, evidence)
      return True
    self.differences.append(f"{page}: {where}: printed {printed}, recomputed {recomputed}")
    return False

  def fail(self, page: str, where: str, problem: str) -> None:
    """A file a number rests on that is missing or damaged: a difference (the check fails), naming the file."""
    self.differences.append(f"{page}: {where}: {problem}")

  def unverified(self, page: str, what: str, why: str) -> None:
    self.not_verified.append(f"{page}: {what}: {why}")

  def recorded_only(self, page: str, what: str, why: str) -> None:
    self.record_only.append(f"{page}: {what}: {why}")

  def unchecked(self, page: str, what: str, missing: str) -> None:
    """A number whose committed evidence could not be checked because ``missing`` (a raw file) is not there."""
    self.not_checked.append(f"{page}: {what}: {missing} is not there")


# ------------------------------------------------------------------------------ reading pages

def read(root: str, page: str) -> str:
  with open(os.path.join(root, page), encoding="utf-8") as f:
    return f.read()


def shown(path: str) -> str:
  """``path`` as a message names it: relative to the repository when inside it (what ``git checkout`` takes)."""
  relative = os.path.relpath(path, record_store.REPO)
  return path if relative.startswith("..") else relative


def numbers(text: str) -> list[str]:
  return [token.replace(",", "") for token in NUMBER.findall(text)]


def cells(line: str) -> list[str]:
  """The cells of a markdown table row (``| a | b |``), stripped; [] for any other line."""
  line = line.strip()
  if not (line.startswith("|") and line.endswith("|")):
    return []
  # A code span may hold a "|" (a sacreBLEU signature): split only outside backticks.
  return [cell.strip() for cell in re.split(r"\|(?=(?:[^`]*`[^`]*`)*[^`]*$)", line[1:-1])]


def tables(text: str) -> list[dict]:
  """Every markdown table of ``text``: ``{"header": [...], "rows": [[...]], "line": the header's line number}``."""
  found, lines = [], text.splitlines()
  for index, line in enumerate(lines):
    if cells(line) and index + 1 < len(lines) and set(lines[index + 1].replace("|", "")) == {"-"}:
      if index and cells(lines[index - 1]):
        continue
      rows = []
      for row in lines[index + 2:]:
        if not cells(row):
          break
        rows.append(cells(row))
      found.append({"header": cells(line), "rows": rows, "line": index + 1})
  return found


def cell(text: str, column: str, row_name: str, header_starts: str = "model") -> str | None:
  """The cell in column ``column`` of the row named ``row_name`` (first cell) of the first table of ``text``
  whose first heading is ``header_starts`` and that has that column; None where there is none."""
  return (find_cell(text, column, row_name, header_starts) or (None,))[0]


def find_cell(text: str, column: str, row_name: str, header_starts: str = "model") -> tuple | None:
  """``(cell, (line, column index))`` of ``cell``'s cell (the line 1-based), or None."""
  for table in tables(text):
    if table["header"][0] == header_starts and column in table["header"]:
      index = table["header"].index(column)
      for offset, row in enumerate(table["rows"]):
        if row[0] == row_name:
          return row[index], (table["line"] + 2 + offset, index)
  return None


def section_lines(text: str) -> dict[str, int]:
  """The line (1-based) of each section's marker in a benchmarks RESULTS.md: its body's line k is this plus k."""
  return {found.group(1): text[:found.start()].count("\n") + 1
          for found in re.finditer(r"<!-- (benchmarks[\w.]*) -->\n", text)}


def sections(text: str) -> dict[str, str]:
  """The sections of a benchmarks RESULTS.md by marker (``benchmarks.attention.gpu``): the text between
  ``<!-- NAME -->`` and ``<!-- /NAME -->``."""
  return dict(re.findall(r"<!-- (benchmarks[\w.]*) -->\n(.*?)<!-- /\1 -->", text, flags=re.S))


# ------------------------------------------------------------------------------ pages written again from records

def regenerate(page: str, folder: str) -> str:
  """``page`` as its script writes it from the committed records, into ``folder`` (its output quieted)."""
  module, arguments = PAGES[page]
  with contextlib.redirect_stdout(io.StringIO()):
    importlib.import_module(module).main([*arguments, "--from_records", f"--output_dir={folder}"])
  return read(folder, "RESULTS.md")


def compare_page(tally: Tally, page: str, printed: str, recomputed: str) -> None:
  """Every number of ``printed`` against the same place of ``recomputed``, lines aligned as a diff aligns them;
  a table row names its row and column. The hand-written notes (Runs not kept) are counted as not verified."""
  ours, theirs = printed.splitlines(), recomputed.splitlines()
  hand_written = next((index for index, line in enumerate(ours) if line.startswith("## Runs not kept")), len(ours))
  matcher = difflib.SequenceMatcher(None, ours, theirs, autojunk=False)
  for tag, start, end, other_start, other_end in matcher.get_opcodes():
    for offset, index in enumerate(range(start, min(end, hand_written))):
      line = ours[index]
      if line.startswith(STAMPS):
        continue
      other = theirs[other_start + offset] if other_start + offset < other_end else ""
      if numbers(line) == numbers(other):  # every number of the line as its script writes it again
        tally.compared[page].add(index + 1)
      compare_line(tally, page, index + 1, line, other, header_for(ours, index))


def header_for(lines: list[str], index: int) -> list[str]:
  """The header cells of the table holding line ``index`` ([] outside a table)."""
  while index > 0 and cells(lines[index - 1]):
    index -= 1
  return cells(lines[index]) if cells(lines[index]) else []


def compare_line(tally: Tally, page: str, number: int, line: str, other: str, header: list[str]) -> None:
  """The numbers of one printed line against the recomputed line: cell by cell in a table row."""
  kind = "written again from records.json"
  row, other_row = cells(line), cells(other)
  if row and len(row) == len(other_row) and len(row) == len(header):
    for column, (mine, theirs) in enumerate(zip(row, other_row)):
      for a, b in zip_numbers(mine, theirs):
        tally.check(page, kind, f"line {number}, row {row[0]!r}, column {header[column]!r}", a, b)
    return
  for a, b in zip_numbers(line, other):
    tally.check(page, kind, f"line {number} ({line.strip()[:60]!r})", a, b)


def zip_numbers(printed: str, recomputed: str) -> list[tuple[str, str]]:
  """Pairs of (printed, recomputed) numbers in order; a number the other side lacks pairs with "nothing"."""
  ours, theirs = numbers(printed), numbers(recomputed)
  width = max(len(ours), len(theirs))
  return list(zip(*(values + ["nothing"] * (width - len(values)) for values in (ours, theirs))))


# ------------------------------------------------------------------------------ rows from their committed outputs

def check_outputs(tally: Tally, root: str, page: str) -> None:
  """Each row of ``page`` whose outputs are committed: the cells of its ``RECOMPUTED_COLUMNS`` as its script
  prints them from the values the outputs give; a row without outputs is listed as not verified."""
  module = importlib.import_module(RECOMPUTED[page])
  text, folder = read(root, page), os.path.join(record_store.COMMITTED, os.path.basename(os.path.dirname(page)))
  store = record_store.RecordStore(folder)
  kind = "recomputed from committed outputs"
  for name in store:
    record = store[name]
    try:
      values = module.recompute(folder, name, record)
    except UserError as error:  # a damaged output file: the reader names it and the line
      tally.fail(page, f"row {name!r}", str(error))
      continue
    if values is None:
      tally.unverified(page, f"{name}: {', '.join(module.RECOMPUTED_COLUMNS)}", "its outputs are not committed")
      continue
    cells = module.row(name, {**record, "values": {**record["values"], **values}})
    for column in module.RECOMPUTED_COLUMNS:
      printed, at = find_cell(text, column, name, module.HEADER[0]) or ("nothing", None)
      tally.check(page, kind, f"row {name!r}, column {column!r}", printed, str(cells[module.HEADER.index(column)]),
                  at, "from outputs")


def check_logs(tally: Tally, page: str, root: str = record_store.REPO) -> None:
  """Each row of ``page`` whose training log is committed: the values its record holds that the log gives
  (``log_values`` of the page's module), recomputed from the log; a row without its log is listed as not
  verified."""
  from experiments import output_pages
  module = importlib.import_module(LOGGED[page])
  folder = os.path.join(record_store.COMMITTED, os.path.relpath(os.path.dirname(page), "experiments"))
  store, text = record_store.RecordStore(folder), read(root, page)
  for name in store:
    log = output_pages.read_log(folder, name)
    if log is None and output_pages.log_expected(store[name]):
      path = shown(output_pages.log_path(folder, name))
      tally.fail(page, f"row {name!r}", f"its training log {path} is missing (its record says the row was "
                 f"recorded with it): restore it, git checkout -- {path}")
      continue
    if log is None:
      tally.unverified(page, f"{name}: the steps, best step, wall time and speed its row prints",
                       f"its training log is not committed ({output_pages.LOGS}/{name}.jsonl: the row was recorded "
                       f"before logs were kept, on {output_pages.recorded_on(store[name]) or 'an undated stamp'})")
      continue
    recorded = {**store[name]["values"], "steps": store[name]["steps"]}
    header, columns = LOG_COLUMNS.get(page, ("", {}))
    for key, value in module.log_values(log).items():
      if tally.check(page, "from committed training logs", f"row {name!r}, {key}", repr(recorded.get(key)),
                     repr(value)):
        for column in columns.get(key, ()):
          found = find_cell(text, column, name, header)
          if found:
            tally.marks[page].setdefault(found[1], "from logs")


def check_ablation_logs(tally: Tally, page: str, root: str = record_store.REPO) -> None:
  """Each cell of an ablation page whose run's training log is committed: its record's per-seed final metrics,
  divergence, wall time, steps and training losses, recomputed from the log (``ablations_scores.log_values``);
  the cells without their log are listed as not verified."""
  from experiments import ablations_scores, launching, output_pages
  folder = os.path.join(record_store.COMMITTED, os.path.relpath(os.path.dirname(page), "experiments"))
  store, text = record_store.RecordStore(folder), read(root, page)
  with tempfile.TemporaryDirectory() as scratch:  # where the cells would train: only their configs are read
    grid = {cell.name: cell for cell in launching.expand_grid(
        list(launching.ABLATIONS), ABLATION_PAGES[page], scratch, ablations=launching.ABLATIONS)}
  missing = []
  for name in store:
    record = store[name]
    log = output_pages.read_log(folder, record["values"]["run"])
    if log is None or name not in grid:
      missing.append(name)
      continue
    recorded = {**record["values"], "steps": record["steps"]}
    agree = [tally.check(page, "from committed training logs", f"cell {name!r}, {key}",
                         json.dumps(recorded.get(key), sort_keys=True), json.dumps(value, sort_keys=True))
             for key, value in ablations_scores.log_values(log, grid[name]).items()]
    if all(agree):  # the row's means, spreads, divergence, steps and wall time rest on the values checked
      for table in tables(text):
        if table["header"][0] == "run" and "diverged" in table["header"]:
          for offset, row in enumerate(table["rows"]):
            for index, column in enumerate(table["header"]):
              if row[0] == name and column not in ("run", "seeds", "hardware", "command"):
                tally.marks[page].setdefault((table["line"] + 2 + offset, index), "from logs")
  if not missing and store:  # every cell's per-seed values from its log: so the comparisons and Welch's t
    for number, line in enumerate(text.splitlines(), 1):
      if re.match(r"- [\w.-]+: .* against |Diverged, by the criterion above", line):
        tally.marks[page].setdefault((number, None), "from logs")
  if missing:
    tally.unverified(page, "each seed's final metrics, divergence and training loss, and the wall time, of " + (
        f"all {len(missing)} cells" if len(missing) == len(store) else ", ".join(missing)),
        f"their runs' training logs are not committed ({output_pages.LOGS}/RUN.jsonl: recorded before logs were "
        "kept; the means, spreads, comparisons and Welch's t are recomputed from the per-seed values in "
        "records.json)")


# ------------------------------------------------------------------------------ BLEU from the committed outputs

def data_folder() -> str:
  """Where the raw data is: ``$TRANSFORMER_DATA_DIR``, else ``../shared/data`` beside the repository (the pages'
  commands name it so)."""
  from transformer.data.parallel_text import ENV_VAR
  return os.environ.get(ENV_VAR) or os.path.join(os.path.dirname(record_store.REPO), "shared", "data")


def translation_outputs(experiment: str) -> dict[str, list[str]]:
  """Row -> the committed test outputs of that row (paths relative to the page's folder), every scored row."""
  from experiments import translation_results
  store = record_store.RecordStore(os.path.join(record_store.COMMITTED, experiment))
  runs, _ = translation_results.stored_rows(store)
  return {name: translation_results.row_files(experiment, store.folder, name) for name in runs}


def check_bleu(tally: Tally, root: str, experiment: str, data: str) -> None:
  """Corpus BLEU (cased, lowercased), its signature and BLEU by reference length of every committed test output
  of ``experiment``'s page, against the cells that print them; rows without outputs are listed."""
  from experiments.translation_results import TEMPLATE, TEST_NAME
  from transformer.data.parallel_text import read_lines
  page = f"experiments/{experiment}/RESULTS.md"
  text, folder = read(root, page), os.path.join(record_store.COMMITTED, experiment)
  for name, files in translation_outputs(experiment).items():
    splits = [os.path.basename(path).split(".hyp.")[0] for path in files]
    if TEST_NAME[experiment] not in splits:
      tally.unverified(page, f"{name}: test BLEU and BLEU by length", "its test outputs were not committed")
    if "validation" not in splits:
      tally.unverified(page, f"{name}: validation BLEU",
                       "its validation outputs were " + TEMPLATE["validation_missing"].template)
    for path, split in zip(files, splits):
      raw_name = VALIDATION_FILES[experiment] if split == "validation" else split
      reference = os.path.join(data, experiment, REFERENCE_FILES[experiment].format(split=raw_name))
      if not os.path.exists(reference):
        tally.unchecked(page, f"{name}: {split} BLEU", f"the reference {reference}")
        continue
      with open(os.path.join(folder, path), encoding="utf-8") as f:
        hypotheses = f.read().split("\n")[:-1]  # one line per reference, newline-terminated
      references = read_lines(reference)
      # A test set's outputs hold one line per reference; a validation split's the first task.num_eval_sentences.
      if len(hypotheses) > len(references) or (split != "validation" and len(hypotheses) != len(references)):
        damaged = shown(os.path.join(folder, path))
        tally.fail(page, f"row {name!r}, {split} BLEU", f"{damaged} holds {len(hypotheses)} hypotheses for the "
                   f"{len(references)} references of {reference}, one a line: it is truncated or damaged; restore "
                   f"it, git checkout -- {damaged}")
        continue
      check_split(tally, page, text, name, split, split == TEST_NAME[experiment], hypotheses, references)


def check_choices(tally: Tally, experiment: str) -> None:
  """Each scored row's checkpoint against the validation BLEU that chose it, as its record keeps them: its best
  step is the step of the best ``eval/bleu`` its training logged (the trainer's best checkpoint), unless it is the
  mean of the last checkpoints, which only a higher validation BLEU than the best checkpoint's chooses."""
  from experiments.translation_scores import stored_rows
  page = f"experiments/{experiment}/RESULTS.md"
  runs, _ = stored_rows(record_store.RecordStore(os.path.join(record_store.COMMITTED, experiment)))
  kind = "checkpoint choices from the logged validation BLEU"
  for name, run in runs.items():
    logged = [record for record in run.get("curves") or [] if "eval/bleu" in record]
    by_checkpoint = run.get("validation_bleu_by_checkpoint") or {}
    chosen = max(by_checkpoint, key=by_checkpoint.get) if by_checkpoint else None
    if run.get("averaged_steps"):
      tally.check(page, kind, f"row {name!r}: the checkpoints' mean chosen", "mean of the last",
                  "mean of the last" if chosen and chosen.startswith("mean of the last") else str(chosen))
    elif logged:
      best = max(logged, key=lambda record: record["eval/bleu"])  # the first at a tie, as the trainer keeps it
      tally.check(page, kind, f"row {name!r}: best step", str(run["best_step"]), str(best["step"]))
    else:
      tally.unverified(page, f"{name}: its best step", "its record keeps no logged validation BLEU")


def check_split(tally: Tally, page: str, text: str, name: str, split: str, is_test: bool, hypotheses: list[str],
                references: list[str]) -> None:
  """One output file's BLEU against the page: the main table and the outputs table (the test set), the other
  test sets' table, or the main table's validation BLEU; the signature, and BLEU by reference length (the test
  set)."""
  from transformer.tasks.metrics import bleu_by_reference_length, corpus_bleu
  signature = (cell(text, "sacreBLEU signature", name) or "").strip("`")
  tokenize = dict(part.split(":", 1) for part in signature.split("|") if ":" in part).get("tok", "13a")
  kind = "BLEU from committed outputs"
  if split == "validation":  # the sentences training scores: all, or the first task.num_eval_sentences
    references = references[:len(hypotheses)]
  cased, recomputed_signature = corpus_bleu(hypotheses, references, tokenize)
  lowercased, _ = corpus_bleu(hypotheses, references, tokenize, lowercase=True)
  columns = [(f"{split} BLEU", cased)] + ([(f"{split} BLEU lowercased", lowercased)] if split != "validation" else [])
  for column, value in columns:
    printed, at = find_cell(text, column, name) or ("nothing", None)
    tally.check(page, kind, f"row {name!r}, column {column!r}", printed, f"{value:.2f}", at, "from outputs")
  if not is_test:
    return
  tally.check(page, kind, f"row {name!r}, sacreBLEU signature", signature, recomputed_signature,
              (find_cell(text, "sacreBLEU signature", name) or (None, None))[1], "from outputs")
  for group, values in bleu_by_reference_length(hypotheses, references, tokenize).items():
    heading = f"{group} words ({values['sentences']} sentences)"
    found = find_cell(text, heading, name)
    if found is not None:  # rows scored before the page had the table have no row there
      tally.check(page, kind, f"BLEU by length, row {name!r}, column {heading!r}", found[0],
                  f"{values['bleu']:.2f} (length ratio {values['length_ratio']:.2f})", found[1], "from outputs")


# ------------------------------------------------------------------------------ benchmark ratios

ATTENTION_REFERENCES = ("jax.nn (xla) ms", "flax ms", "jax.nn (cudnn) ms")
# Per section (its marker, less a ``.gpu``/``.1core`` suffix): (ratio column, numerator, denominators: the
# smallest of them), each a column of the same row; "row:COLUMN=VALUE" takes the column from the row of the same
# table with that value (e.g. the implementation "ours").
RATIOS = {
    "benchmarks.attention": [("ours / fastest reference", "ours ms", ATTENTION_REFERENCES),
                             ("ours, float32_logits=False / fastest reference", "ours, float32_logits=False ms",
                              ATTENTION_REFERENCES)],
    "benchmarks.chunked_attention": [("chunked / dense memory", "chunked peak MiB", ("dense peak MiB",)),
                                     ("chunked / dense time", "chunked ms", ("dense ms",))],
    "benchmarks.train_step": [("ours / this (tokens/s)", "row:implementation=ours:src+tgt tokens/s",
                               ("src+tgt tokens/s",))],
    "benchmarks.decoding": [("cache speed-up", "no-cache ms", ("cached ms",))],
    "benchmarks.input_pipeline": [("pipeline / train step", "pipeline batches/s", ("train steps/s",))],
    "benchmarks.sequence_length": [("chunked / dense time", "chunked ms", ("dense ms",))],
    "benchmarks.remat": [("peak / none", "planned peak MiB", ("row:policy=none:planned peak MiB",)),
                         ("time / none (back to back)", "step ms (10 back to back)",
                          ("row:policy=none:step ms (10 back to back)",))],
    "benchmarks.remat_fit": [("largest / none", "largest batch that fit", ("row:policy=none:largest batch that fit",))],
    "benchmarks.loop_overhead": [("loop / bare", "loop ms", ("bare step ms",))],
}


def bounds(text: str) -> tuple[float, float] | None:
  """The interval a printed number stands for (half a unit of its last digit either side); None if no number."""
  match = NUMBER.fullmatch(text.replace(" ", ""))
  if not match:
    return None
  value, decimals = float(text.replace(",", "")), len(text.partition(".")[2])
  return value - 0.5 * 10 ** -decimals, value + 0.5 * 10 ** -decimals


def column_value(table: dict, row: list[str], column: str) -> tuple[float, float] | None:
  if column.startswith("row:"):  # the named row's column
    _, selector, column = column.split(":", 2)
    field, value = selector.split("=")
    key = table["header"].index(field)
    row = next((other for other in table["rows"] if other[key] == value), None)
    if row is None:
      return None
  return bounds(row[table["header"].index(column)]) if column in table["header"] else None


def check_ratios(tally: Tally, text: str) -> None:
  """Every ratio column of ``benchmarks/RESULTS.md`` against the timings of its row, to their printed rounding,
  and each attention and decoding section's quoted worst ratio against its column."""
  starts = section_lines(text)
  for marker, body in sections(text).items():
    specs = RATIOS.get(re.sub(r"\.(gpu|1core)$", "", marker), [])
    for table in tables(body):
      for ratio, numerator, denominators in specs:
        if ratio not in table["header"]:
          continue
        for offset, row in enumerate(table["rows"]):
          check_ratio(tally, marker, table, row, ratio, numerator, denominators,
                      (starts[marker] + table["line"] + 2 + offset, table["header"].index(ratio)))
      check_worst(tally, marker, body, table, starts[marker])


def check_ratio(tally: Tally, marker: str, table: dict, row: list[str], ratio: str, numerator: str,
                denominators: tuple[str, ...], at: tuple | None = None) -> None:
  printed = bounds(row[table["header"].index(ratio)])
  top = column_value(table, row, numerator)
  bottoms = [value for value in (column_value(table, row, column) for column in denominators) if value]
  if printed is None or top is None or not bottoms:
    return  # "-", "does not fit": no ratio printed or nothing to divide
  low, high = min(b[0] for b in bottoms), min(b[1] for b in bottoms)
  possible = (top[0] / high, top[1] / low if low > 0 else math.inf)
  agrees = possible[0] <= printed[1] and printed[0] <= possible[1]
  where = f"section {marker}, row {' / '.join(row[:4])!r}, column {ratio!r}"
  text = row[table["header"].index(ratio)]
  tally.check(BENCHMARKS_RESULTS, "ratio from the timings beside it", where, text,
              text if agrees else f"{possible[0]:.3f} to {possible[1]:.3f}", at, "from the figures beside it")


# A rate column of a timing table and the timing it is a rate of: (rate column, time column in ms, work per call:
# "tokens" for batch x (source + target) tokens of the section's text, or a column to multiply by the batch).
RATES = [("src+tgt tokens/s", "step ms", "tokens"), ("cached tokens/s", "cached ms", "output tokens"),
         ("no-cache tokens/s", "no-cache ms", "output tokens")]


def interval(low: float, high: float, printed: tuple[float, float]) -> bool:
  """Whether the values ``low``..``high`` a computation allows meet the interval a printed number stands for."""
  return low <= printed[1] and printed[0] <= high


def exact(text: str) -> float | None:
  """A whole number as printed (a batch, a count of tokens): exact, not rounded; None if not one."""
  return float(text.replace(",", "")) if re.fullmatch(r"\d[\d,]*", text) else None


def matmul_peaks(body: str) -> dict[str, tuple[float, float]]:
  """The matmul peaks (GFLOP/s, as intervals of their printed rounding) a train-step section's MFU columns
  divide by: ``measured`` (the higher of before and after the timed steps, or the one measured) and
  ``theoretical``."""
  peaks = {}
  found = re.search(r"before the timed steps ([\d,.]+) TFLOP/s, after ([\d,.]+), MFU uses the higher", body)
  if found:
    low, high = max((bounds(value) for value in found.groups()), key=lambda pair: pair[0])
    peaks["measured"] = (low * 1e3, high * 1e3)
  found = re.search(r"peak = \w+ \d+x\d+ matmul measured in this run: ([\d,.]+) GFLOP/s", body)
  if found:
    peaks["measured"] = bounds(found.group(1))
  found = re.search(r"theoretical ([\d,.]+) TFLOP/s", body)
  if found:
    low, high = bounds(found.group(1))
    peaks["theoretical"] = (low * 1e3, high * 1e3)
  return peaks


def check_step_rates(tally: Tally, text: str) -> None:
  """Where a table of ``benchmarks/RESULTS.md`` gives a step time beside a rate and an MFU, they must agree to
  their printed rounding: tokens/s = tokens per call / time, MFU = model FLOPs / step time / the matmul peak the
  section names; and the target line's "Nx needs ours at M% MFU" = N x the MFU column of the reference's row."""
  kind, starts, beside = "rate or MFU from the step time beside it", section_lines(text), "from the figures beside it"
  for marker, body in sections(text).items():
    per_call = re.search(r"(\d+) x (\d+) source \+ (\d+) target tokens", body)
    peaks = matmul_peaks(body)
    for table in tables(body):
      header = table["header"]
      for offset, row in enumerate(table["rows"]):
        where, line = f"section {marker}, row {' / '.join(row[:3])!r}", starts[marker] + table["line"] + 2 + offset
        for rate, time, work in RATES:
          if rate not in header or time not in header:
            continue
          printed, milliseconds = bounds(row[header.index(rate)]), bounds(row[header.index(time)])
          batch = exact(row[header.index("batch")]) if "batch" in header else None
          if printed is None or milliseconds is None or batch is None:
            continue
          if work == "tokens":
            if per_call is None:
              continue
            amount = batch * (int(per_call.group(2)) + int(per_call.group(3)))
          else:
            amount = batch * (exact(row[header.index(work)]) or 0)
          low, high = amount / (milliseconds[1] / 1e3), amount / (milliseconds[0] / 1e3)
          text_value = row[header.index(rate)]
          tally.check(BENCHMARKS_RESULTS, kind, f"{where}, column {rate!r} from {time!r}", text_value,
                      text_value if interval(low, high, printed) else f"{low:,.2f} to {high:,.2f}",
                      (line, header.index(rate)), beside)
        for column in header:
          peak = peaks.get("theoretical" if "theoretical" in column else "measured")
          if not column.startswith("MFU %") or peak is None or "step ms" not in header:
            continue
          printed = bounds(row[header.index(column)])
          flops, milliseconds = bounds(row[header.index("model GFLOP/step")]), bounds(row[header.index("step ms")])
          if printed is None or flops is None or milliseconds is None:
            continue
          low = 100 * flops[0] / (milliseconds[1] / 1e3) / peak[1]
          high = 100 * flops[1] / (milliseconds[0] / 1e3) / peak[0]
          text_value = row[header.index(column)]
          tally.check(BENCHMARKS_RESULTS, kind, f"{where}, column {column!r} from 'step ms'", text_value,
                      text_value if interval(low, high, printed) else f"{low:.2f} to {high:.2f}",
                      (line, header.index(column)), beside)
    mfu_table = next((table for table in tables(body) if "implementation" in table["header"]
                      and any(column.startswith("MFU %") for column in table["header"])), None)
    for found in re.finditer(r"ours / ([\w-]+) [\d.]+x at batch (\d+) \((?:met|not met); ([\d.]+)x needs ours at "
                             r"(\d+)% MFU\)", body):
      if mfu_table is None:
        continue
      header = mfu_table["header"]
      column = next(column for column in header if column.startswith("MFU %"))
      row = next((row for row in mfu_table["rows"] if row[header.index("implementation")] == found.group(1)
                  and row[header.index("batch")] == found.group(2)), None)
      if row is None or bounds(row[header.index(column)]) is None:
        continue
      low, high = (float(found.group(3)) * value for value in bounds(row[header.index(column)]))
      needed = bounds(found.group(4))
      tally.check(BENCHMARKS_RESULTS, kind, f"section {marker}, the target line's MFU that {found.group(3)}x "
                  f"{found.group(1)} needs", f"{found.group(4)}%",
                  f"{found.group(4)}%" if interval(low, high, needed) else f"{low:.1f}% to {high:.1f}%",
                  (starts[marker] + body[:found.start(4)].count("\n") + 1, found.group(4)), beside)


def check_worst(tally: Tally, marker: str, body: str, table: dict, start: int = 0) -> None:
  """``worst ratio X`` (attention) or ``smallest speed-up at 256 tokens X`` (decoding) against the column."""
  quoted = re.search(r"worst ratio ([\d.]+) with the default", body)
  column = "ours / fastest reference"
  if quoted is None:
    quoted, column = re.search(r"smallest speed-up at 256 tokens ([\d.]+)", body), "cache speed-up"
  if quoted is None or column not in table["header"]:
    return
  index = table["header"].index(column)
  values = [row[index] for row in table["rows"] if bounds(row[index])
            and (column != "cache speed-up" or row[table["header"].index("output tokens")] == "256")]
  pick = max if column.startswith("ours") else min
  tally.check(BENCHMARKS_RESULTS, "ratio from the timings beside it", f"section {marker}, the target line's "
              f"{'worst' if pick is max else 'smallest'} ratio", quoted.group(1), pick(values, key=float),
              (start + body[:quoted.start(1)].count("\n") + 1, quoted.group(1)), "from the figures beside it")


# ------------------------------------------------------------------------------ the READMEs against their pages

def results_in(text: str) -> list[str]:
  """The results a sentence quotes (``RESULT``), as printed, commas dropped."""
  return [token.replace(",", "") for token in RESULT.findall(text)]


def found_on(value: str, page_text: str) -> bool:
  """Whether the number ``value`` is printed on the page (as a number: 2x is 2.0x); a percentage may also be
  printed as a fraction (100% as 1.0000)."""
  printed = {float(number) for number in numbers(page_text)}
  return float(value) in printed or (value.isdigit() and float(value) / 100 in printed)


def check_links(tally: Tally, root: str, page: str, table: dict, result_column: int, targets) -> None:
  """Each result quoted in ``table``'s rows must be printed on the page the row links (``targets(row)``: the
  page's path and text); a row linking nothing is reported."""
  for offset, row in enumerate(table["rows"]):
    target, target_text = targets(row)
    if target is None:
      tally.check(page, "quoted from its page", f"row {row[0]!r}", "a result", "no page linked")
      continue
    for printed in RESULT.findall(row[result_column]):
      value = printed.replace(",", "")
      tally.check(page, "quoted from its page", f"row {row[0]!r}: {value} (from {target})", value,
                  value if found_on(value, target_text) else f"not on {target}",
                  (table["line"] + 2 + offset, printed), "quoted from its page")


def check_readme(tally: Tally, root: str) -> None:
  """The README's results table as text against the table written again from the pages it links
  (``experiments.readme_results``): every word of a row, its numbers, counts, horizons and verdicts ("met", "not
  met", "diverged") included; a changed word fails naming the row and the words."""
  from experiments import readme_results
  lines = read(root, README).splitlines()
  printed = readme_results.printed_rows(read(root, README))
  written = readme_results.rows(root)
  kind = "words written again from its pages"
  if not printed:
    tally.fail(README, "the results table", f"not found between {readme_results.BEGIN} and {readme_results.END}")
    return
  for index in range(max(len(printed), len(written))):
    mine = printed[index] if index < len(printed) else None
    theirs = written[index] if index < len(written) else None
    name = mine[0] if mine else theirs[0] if isinstance(theirs, list) else f"{index + 1}"
    if isinstance(theirs, readme_results.NotOnPage):
      tally.fail(README, f"row {name!r}", str(theirs))
      continue
    if mine is None or theirs is None:
      tally.check(README, kind, f"row {index + 1} ({name!r})", "nothing" if mine is None else "a row",
                  "nothing" if theirs is None else "a row")
      continue
    ours, pages = " | ".join(mine).split(), " | ".join(theirs).split()
    matcher = difflib.SequenceMatcher(None, ours, pages, autojunk=False)
    changed = [opcode for opcode in matcher.get_opcodes() if opcode[0] != "equal"]
    if not changed:
      tally.verified[README][kind] += len(ours)
      line = next((number for number, text in enumerate(lines, 1) if cells(text) == mine), None)
      if line is not None:
        tally.marks[README].setdefault((line, None), "quoted from its page")
    for _, start, end, other_start, other_end in changed:  # each changed span, with a word either side
      context = (max(start - 1, 0), min(end + 1, len(ours)), max(other_start - 1, 0), min(other_end + 1, len(pages)))
      tally.check(README, kind, f"row {name!r}", repr(" ".join(ours[context[0]:context[1]])),
                  repr(" ".join(pages[context[2]:context[3]])))


def attention_sizes_met(text: str, section: str = "benchmarks.attention") -> str:
  """``N of M``: the sizes (dtype, pass, length) of an attention section within 1.1x of the fastest reference."""
  table = tables(sections(text)[section])[0]
  index = table["header"].index("ours / fastest reference")
  met = sum(float(row[index]) <= 1.1 for row in table["rows"])
  return f"{met} of {len(table['rows'])}"


def check_benchmarks_readme(tally: Tally, root: str) -> None:
  """``benchmarks/README.md``'s target table: every result in a row is printed in the RESULTS.md sections the row
  names."""
  text = read(root, BENCHMARKS_README)
  table = next(t for t in tables(text) if t["header"][:2] == ["question", "target"])
  results = sections(read(root, BENCHMARKS_RESULTS))

  def targets(row):
    named = re.findall(r"benchmarks\.[\w.]+", " ".join(row))
    missing = [name for name in named if name not in results]
    if not named or missing:
      return None, ""
    return BENCHMARKS_RESULTS, "\n".join(results[name] for name in named)

  for column in range(2, len(table["header"])):
    check_links(tally, root, BENCHMARKS_README, table, column, targets)


# ------------------------------------------------------------------------------ main

def verify(root: str = record_store.REPO, pages: tuple[str, ...] = (), data: str | None = None) -> Tally:
  """Every check on the pages under ``root`` (default: the repository), or only on ``pages``; numbers are
  recomputed from the committed files in the repository."""
  tally, data = Tally(), data or data_folder()
  chosen = pages or (*PAGES, README, BENCHMARKS_README, BENCHMARKS_RESULTS, BENCHMARKS_FINDINGS)
  with tempfile.TemporaryDirectory() as scratch:
    for index, page in enumerate(page for page in chosen if page in PAGES):
      compare_page(tally, page, read(root, page), regenerate(page, os.path.join(scratch, str(index))))
  for page in chosen:
    if page in RECOMPUTED:
      check_outputs(tally, root, page)
    if page in LOGGED:
      check_logs(tally, page, root)
    if page in ABLATION_PAGES:
      check_ablation_logs(tally, page, root)
      from experiments.ablations import common
      if ABLATION_PAGES[page] in common.NOT_REPRODUCED:
        tally.unverified(page, "every cell: not reproduced at today's code", f"recorded with "
                         f"{common.NOT_REPRODUCED[ABLATION_PAGES[page]]}, before the code's numerics changed")
  for experiment in ("multi30k", "iwslt15_en_vi"):
    if f"experiments/{experiment}/RESULTS.md" in chosen:
      check_bleu(tally, root, experiment, data)
      check_choices(tally, experiment)
  if BENCHMARKS_RESULTS in chosen:
    check_ratios(tally, read(root, BENCHMARKS_RESULTS))
    check_step_rates(tally, read(root, BENCHMARKS_RESULTS))
  if README in chosen:
    check_readme(tally, root)
  if BENCHMARKS_README in chosen:
    check_benchmarks_readme(tally, root)
  account_numbers(tally, root, chosen)
  for page in chosen:
    for what, why in NOT_COMMITTED.get(page, []) + script_not_committed(page):
      tally.unverified(page, what, why)
    for (where, rule), count in tally.account.by_rule.items() if tally.account else ():
      if where == page and rule.kind == "record only":
        tally.recorded_only(page, f"{rule.what} ({count} numbers)", rule.why)
      elif where == page and rule.kind == "not committed":
        tally.unverified(page, f"{rule.what} ({count} numbers)", rule.why)
  return tally


def accounted_lines(page: str, text: str) -> range | None:
  """The lines of ``page`` whose numbers are accounted for: the README's results table and the benchmarks
  README's target table alone (the rest of them is prose and setup), every line of the other pages."""
  if page == BENCHMARKS_README:
    table = next(t for t in tables(text) if t["header"][:2] == ["question", "target"])
    return range(table["line"] + 2, table["line"] + 2 + len(table["rows"]))
  if page != README:
    return None
  from experiments import readme_results
  lines = text.splitlines()
  begin = next((i for i, line in enumerate(lines, 1) if line.startswith(readme_results.BEGIN)), 0)
  end = next((i for i, line in enumerate(lines, 1) if line.startswith(readme_results.END)), 0)
  return range(begin + 1, end)


def account_numbers(tally: Tally, root: str, chosen) -> None:
  """Every number of the chosen pages given a class (``verify_rules``): one that no check, list or rule
  accounts for is a difference, and so is a rule that matches nothing."""
  from experiments import verify_rules
  accounted = [page for page in chosen if page in (*PAGES, README, BENCHMARKS_RESULTS, BENCHMARKS_README)]
  # A page with a number that differs is failed already, naming it, and one whose raw data is absent is failed or
  # partial, naming what was not checked: their numbers left unconfirmed are not named again.
  differing = {line.split(": ", 1)[0] for line in tally.differences + tally.not_checked}
  result = verify_rules.Account()
  for page in accounted:
    text = read(root, page)
    found = len(result.unaccounted)
    verify_rules.account(result, page, text, tally.marks[page], tally.compared[page], accounted_lines(page, text))
    if page in differing:
      del result.unaccounted[found:]
  verify_rules.check_stale(result, accounted)
  tally.account = result
  tally.differences.extend(result.unaccounted + result.stale)


def script_not_committed(page: str) -> list[tuple[str, str]]:
  """(what, why) of ``page``'s rows with nothing committed behind them, as its results script names them
  (``not_committed(folder)`` of the committed folder; [] where the script has none)."""
  if page not in PAGES:
    return []
  module = importlib.import_module(PAGES[page][0])
  folder = os.path.join(record_store.COMMITTED, os.path.relpath(os.path.dirname(page), "experiments"))
  return module.not_committed(folder) if hasattr(module, "not_committed") else []


def summary(tally: Tally, partial: bool = False) -> str:
  """What the check found; its last line the verdict: the differences, or what could not be checked for want of
  the raw data (a failure, unless ``partial``: then the line says "partial")."""
  lines = ["Verified, per page:"]
  for page, kinds in tally.verified.items():
    lines.append(f"- {page}: " + "; ".join(f"{count} {kind}" for kind, count in kinds.items()))
  lines += ["", "Not verified (nothing committed behind them):", *(f"- {line}" for line in tally.not_verified)]
  lines += ["", "Record only (checked against the records.json the page was written from, nothing else: a page and "
            "its records edited together pass):", *(f"- {line}" for line in tally.record_only)]
  totals = collections.Counter()
  for kinds in tally.verified.values():
    totals.update(kinds)
  from_records = totals.pop("written again from records.json", 0)
  from_pages = totals.pop("words written again from its pages", 0) + totals.pop("quoted from its page", 0)
  lines += ["", f"Checks: {sum(totals.values())} against committed evidence ("
            + ", ".join(f"{count} {kind}" for kind, count in sorted(totals.items(), key=lambda item: -item[1]))
            + f"); {from_records} of a page against its own records.json; {from_pages} of the READMEs against the "
            "pages they link."]
  if tally.account is not None:
    from experiments import verify_rules
    classes = collections.Counter()
    for counts in tally.account.counts.values():
      classes.update(counts)
    lines += [f"Numbers on the pages: {sum(classes.values())}, each accounted for: " + ", ".join(
        f"{classes[kind]} {kind}" for kind in verify_rules.CLASSES) + f"; {len(tally.account.unaccounted)} "
        "unaccounted for."]
  if tally.not_checked:
    lines += ["", f"Not checked: {len(tally.not_checked)} scores whose outputs are committed, for want of the raw "
              "data they are scored against:", *(f"- {line}" for line in tally.not_checked)]
  if tally.differences:
    lines += ["", f"{len(tally.differences)} numbers differ from what the committed files give, or files they "
              "rest on are missing or damaged:",
              *(f"- {line}" for line in tally.differences)]
  if tally.not_checked:
    pages = sorted({line.split(":", 1)[0] for line in tally.not_checked})
    what = f"{len(tally.not_checked)} scores of {', '.join(pages)} not checked (the raw data is not there)"
    if partial:
      verdict = "some checked numbers differ" if tally.differences else "every checked number is as given"
      lines += ["", f"partial: {verdict}; {what}."]
    else:
      lines += ["", f"Failed: {what}: give the raw data folder (--data_dir or TRANSFORMER_DATA_DIR), or --partial "
                "to accept a partial check."]
  elif not tally.differences:
    lines += ["", "Every checked number is as the committed files give it."]
  return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--root", default=record_store.REPO, help="Folder holding the pages to check, in the "
                      "repository's layout (default: the repository).")
  parser.add_argument("--page", action="append", default=[], help="Check only this page (a path under --root, "
                      f"e.g. {README}); repeat for several.")
  parser.add_argument("--data_dir", default="", help="The raw data folder, for BLEU (default: "
                      "$TRANSFORMER_DATA_DIR, else ../shared/data beside the repository).")
  parser.add_argument("--partial", action="store_true", help="Without the raw data: check what the committed files "
                      "allow and exit 0 if that agrees (the last line says \"partial\"); without this flag a number "
                      "left unchecked for want of its data fails the check.")
  args = parser.parse_args(argv)
  root, known = os.path.abspath(args.root), (*PAGES, README, BENCHMARKS_README, BENCHMARKS_RESULTS, BENCHMARKS_FINDINGS)
  for page in args.page:
    if page not in known:
      parser.error(f"--page={page} is no page this checks; give one of: {', '.join(known)}")
  missing = [page for page in args.page or known if page != BENCHMARKS_FINDINGS
             and not os.path.exists(os.path.join(root, page))]
  if missing:
    parser.error(f"--root={args.root} lacks {', '.join(missing)}: give the repository's root (or a copy of it "
                 "with the pages in their places)")
  tally = verify(root, tuple(args.page), args.data_dir or None)
  print(summary(tally, args.partial))
  return 1 if tally.differences or (tally.not_checked and not args.partial) else 0


if __name__ == "__main__":
  sys.exit(main())
