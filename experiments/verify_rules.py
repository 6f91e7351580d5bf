"""Every number on the pages ``experiments.verify`` checks, accounted for: the one place that says which numbers
are exempt, which have only their record behind them, and which have nothing committed behind them.

``account(page, text, marks, compared)`` walks each numeric token of a page (``NUMBER``) and gives it one class:

- the evidence a check of ``verify`` confirmed it from (``marks``: a table cell or a line that a check against
  outputs, logs, the figures beside it or the page a README row quotes found as printed);
- else the first rule of ``RULES`` that matches it: ``exempt`` (not a result: a date, a command, a heading, a
  setting), ``record only`` (checked only against the ``records.json`` the page was written from; the line must
  have been compared with the page written again, else the rule does not hold), ``not committed`` (nothing
  behind it: a measurement, a hand-written note), or ``from outputs`` (the page's script computes it from
  committed outputs when verify writes the page again: PM2.5's forecasts);
- else it is unaccounted for: a difference naming the page, the line and the number.

A rule that matches no number of a page it names is stale: also a difference, so the lists stay exact.
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import os
import re

NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")
EVIDENCE = ("from outputs", "from logs", "from the figures beside it", "quoted from its page")
CLASSES = (*EVIDENCE, "record only", "not committed", "exempt")

SYNTHETIC = "experiments/synthetic/RESULTS.md"
LM = "experiments/language_model/RESULTS.md"
TWEETS = "experiments/disaster_tweets/RESULTS.md"
MULTI30K = "experiments/multi30k/RESULTS.md"
IWSLT = "experiments/iwslt15_en_vi/RESULTS.md"
ABLATIONS = "experiments/ablations/RESULTS.md"
ABLATIONS_M30K = "experiments/ablations/multi30k/RESULTS.md"
PM25 = "experiments/beijing_pm25/RESULTS.md"
BENCHMARKS = "benchmarks/RESULTS.md"
BENCHMARKS_README = "benchmarks/README.md"
FINDINGS = "benchmarks/FINDINGS.md"
README = "README.md"
RESULT_PAGES = (SYNTHETIC, LM, TWEETS, MULTI30K, IWSLT, ABLATIONS, ABLATIONS_M30K, PM25)
TRANSLATION = (MULTI30K, IWSLT)
ANY = (*RESULT_PAGES, BENCHMARKS, BENCHMARKS_README, README)


@dataclasses.dataclass(frozen=True)
class Token:
  """One number of a page, where it stands: its line (1-based), the ``## `` section, the benchmark section marker,
  the table column and row (None outside a table) and the text just before it."""
  page: str
  line: int
  text: str
  line_text: str
  before: str
  after: str
  section: str
  marker: str
  column: str | None
  table: str | None  # the table's first heading
  column_index: int | None
  row: str | None
  code: bool
  heading: bool
  scripted: bool  # the number and the text beside it stand in the results scripts' source: fixed text, no record


@dataclasses.dataclass(frozen=True)
class Rule:
  """Numbers of ``pages`` that are ``kind`` (``exempt``, ``record only``, ``not committed``, ``from outputs``),
  with ``why`` in one line. Each selector given must match (regular expressions, searched): ``section`` the ``## ``
  heading, ``marker`` the benchmark section, ``column`` the table heading, ``row`` the row's first cell, ``line``
  the whole line, ``before`` the text just before the number (ending where it starts), ``number`` the number."""
  kind: str
  what: str
  why: str
  pages: tuple[str, ...] = ANY
  section: str | None = None
  marker: str | None = None
  column: str | None = None
  table: str | None = None
  row: str | None = None
  line: str | None = None
  before: str | None = None
  number: str | None = None
  code: bool | None = None
  scripted: bool | None = None
  after: str | None = None
  compared: bool = False  # holds only where the line was compared with the page written again

  def matches(self, token: Token) -> bool:
    if token.page not in self.pages or (self.code is not None and token.code != self.code):
      return False
    if self.scripted is not None and token.scripted != self.scripted:
      return False
    for pattern, value in ((self.section, token.section), (self.marker, token.marker), (self.column, token.column),
                           (self.table, token.table),
                           (self.row, token.row), (self.line, token.line_text), (self.number, token.text)):
      if pattern is not None and (value is None or not re.search(pattern, value)):
        return False
    return ((self.before is None or re.search(f"(?:{self.before})$", token.before) is not None)
            and (self.after is None or re.match(self.after, token.after) is not None))


def exempt(what, why, **where) -> Rule:
  return Rule("exempt", what, why, **where)


def record_only(what, why, **where) -> Rule:
  return Rule("record only", what, why, **where)


def not_committed(what, why, **where) -> Rule:
  return Rule("not committed", what, why, **where)


# The rules, first match wins (evidence a check confirmed comes before any of them). A rule that needs the line
# compared with the page written again (``record only``, ``from outputs``, ``scripted``) is skipped elsewhere.
WAS = r"\bwas (?:(?!\bnow\b).)*"  # under Reruns: the replaced row's value ("was X, now Y")
NOW = r"\bnow (?:(?!\bwas\b).)*"
RULES = [
    # -------------------------------------------------------------- not results
    exempt("commands and code spans", "a command's flags, paths and settings, not a result", code=True),
    exempt("headings and table headings", "names of sections and columns (\"24 h\", \"95% interval\")",
           line=r"^#"),
    exempt("dates", "when a page or a run was written", number=r"^(19|20)\d\d$", after=r"-\d\d"),
    exempt("the month and day of a date", "part of a date", before=r"(19|20)\d\d-(\d\d-)?"),
    exempt("commit hashes", "name a commit, not a quantity", before=r"\b[0-9a-f]*[a-f][0-9a-f]*"),
    exempt("commit hashes that start with a digit", "name a commit (4562ee7), not a quantity",
           before=r"(?<![\w.])", after=r"[0-9a-f]*[a-f][0-9a-f]*\b"),
    exempt("section markers", "a benchmark section's name (train_step.1core)", line=r"^<!-- "),
    exempt("page stamps", "the machine and software the page was written on",
           line=r"^(Machine|Written by|Page written on)\b"),
    exempt("links, file names and identifiers", "a path, an anchor or a name with a digit (F1, d_k, bf16)",
           before=r"\]\([^)]*|[A-Za-z_/]"),
    exempt("row names", "a run's or model's name (gru-168h, heads/16), not a quantity",
           column=r"^(run|model|task|variant)$", before=r"[\w/-]+"),
    exempt("the hardware column", "the machine a row ran on, not a result", column=r"^hardware$"),
    exempt("the results scripts' own text", "the number and its words stand in experiments/*.py or a page template "
           "(a setting, a definition), not filled in from a record", scripted=True),
    exempt("published figures", "cited from a paper or a leaderboard that the row names, not measured here",
           pages=RESULT_PAGES, table=r"^published result", compared=True),
    exempt("settings of a row", "seeds, model size, training pairs, input hours and features, the horizon: chosen, "
           "not measured", pages=RESULT_PAGES, column=r"^(seeds?|size|training pairs|input hours|inputs|horizon)$"),
    exempt("the setup a page describes", "sizes, schedules, data counts, thresholds and cell names as the page's "
           "script writes them from the configs and data, not measured", pages=RESULT_PAGES, compared=True,
           line=r"^(Task:|4 heads, d_ff|Perplexity is exp|Wall time: training|64 pieces|is above \d\.\d nats|"
                r"The same ablations on Multi30k|Against the reference \(|training run of all its seeds|"
                r"MAE on 2013|- (9e091c6ce993|not recorded))"),
    exempt("decoding settings", "beam size, length penalty and sentences scored during training: chosen",
           pages=TRANSLATION, before=r"(beam|alpha|first) "),
    exempt("the length penalties tried", "the alphas of the decoding column's \"on validation\" list: chosen",
           pages=TRANSLATION, column=r"^decoding \(length penalty", after=r":"),
    exempt("the current values under Reruns", "\"now X\" repeats the row's cell of the table above, checked there",
           pages=RESULT_PAGES, section=r"^Reruns", before=NOW),
    exempt("the benchmarks' questions and targets", "a question's number and the target set for it, not a result",
           pages=(BENCHMARKS_README,), column=r"^(question|target)$"),
    exempt("the case a benchmark result names", "whole numbers beside a quoted result name its case (tokens, "
           "batch, steps, cores, steps per call); the results (decimals, % and x) are checked against the page",
           pages=(BENCHMARKS_README,), column=r"^(CPU|GPU)", number=r"^\d[\d,]*,?$"),
    # -------------------------------------------------------------- computed from committed outputs by the page's script
    Rule("from outputs", "PM2.5's test tables, intervals, t-tests and verdicts", "the page's script computes them "
         "from the committed test forecasts (and validation errors) when verify writes the page again",
         pages=(PM25,), section=r"^(Verdict|MAE|RMSE|Equal inputs|Input window)"),
    Rule("from outputs", "PM2.5's ranking of the published models by test MAE", "from the committed test "
         "forecasts, as the tables above", pages=(PM25,), line=r"by test MAE \(mean over seeds\)"),
    Rule("from outputs", "the mean and each seed of a row group's test and validation BLEU", "each seed's BLEU is "
         "recomputed from its committed outputs in the main table", pages=(IWSLT,), table=r"^rows$",
         column=r"BLEU"),
    Rule("from outputs", "the test BLEU of the outputs table", "repeats the main table's test BLEU, recomputed "
         "there from the committed outputs", pages=TRANSLATION, table=r"^model$", column=r"^(tst2013|test_2016_"
         r"flickr) BLEU$", line=r"\.hyp\."),
    # -------------------------------------------------------------- only the record behind them
    record_only("the earlier values under Reruns (\"was X\")", "the replaced rows' values, kept in records.json; "
                "their outputs and logs were replaced by the rerun's", pages=RESULT_PAGES, section=r"^Reruns",
                before=WAS),
    record_only("the pieces per word on train", "counted from the tokenized training split when the row was "
                "recorded; the prepared data is not committed", pages=(LM,), line=r"pieces per word on train"),
    record_only("each row's validation BLEU at each evaluation of its training and its last validation NLL (every "
                "run's table)", "logged by training; translation runs' training logs are not committed, only these "
                "values in records.json", pages=TRANSLATION, column=r"^validation (BLEU at each|NLL at the last)"),
    record_only("each row's validation BLEU at the alphas not chosen (the decoding column's \"on validation\" list)",
                "only the chosen alpha's validation outputs are committed", pages=TRANSLATION,
                column=r"^decoding \(length penalty", before=r": "),
    record_only("each row's training wall time, steps trained and checkpoint steps", "logged by training; "
                "translation runs' training logs are not committed", pages=TRANSLATION,
                column=r"^(training wall time|checkpoint \(chosen on validation\) of steps trained|steps trained)$"),
    record_only("a validation BLEU whose validation outputs were not kept", "scored before --mode=eval wrote them",
                pages=(MULTI30K,), row=r"^transformer_gpu$", column=r"^validation BLEU$"),
    record_only("the attention entropy tables", "measured on the trained parameters when the cell was recorded; the "
                "checkpoints are not committed", pages=(ABLATIONS, ABLATIONS_M30K), table=r"^run$",
                column=r"entropy|max weight"),
    record_only("every cell of the Multi30k grid: each seed's final metrics, divergence, steps and wall time, and "
                "the comparisons and Welch's t from them", "their runs' training logs are not committed (recorded "
                "before logs were kept, at earlier code: the page says which)", pages=(ABLATIONS_M30K,),
                line=r"^\| [\w/]+ \||^- [\w.-]+: .* against |^Diverged|^This table's reference"),
    # -------------------------------------------------------------- nothing committed behind them
    not_committed("the numbers under Runs not kept", "hand-written in runs_not_kept.md from the training output of "
                  "runs whose workdirs are gone", pages=RESULT_PAGES, section=r"^Runs not kept"),
    not_committed("the BLEU scores of benchmarks.time_to_bleu.gpu (validation, test, test lowercased)", "its "
                  "hypotheses were not kept: copied from the run's output", pages=(BENCHMARKS,),
                  marker=r"time_to_bleu", column=r"BLEU"),
    not_committed("every timing, memory figure, rate and setting of benchmarks/RESULTS.md not checked against the "
                  "figures beside it", "a measurement printed by a benchmark script; no log or output of it is "
                  "committed", pages=(BENCHMARKS,), marker=r"^benchmarks"),
]


@dataclasses.dataclass
class Account:
  """Per page: how many numbers each class holds, per rule; the numbers no class holds; rules that matched
  nothing."""
  counts: dict = dataclasses.field(default_factory=lambda: collections.defaultdict(collections.Counter))
  by_rule: collections.Counter = dataclasses.field(default_factory=collections.Counter)  # (page, rule) -> count
  unaccounted: list = dataclasses.field(default_factory=list)
  stale: list = dataclasses.field(default_factory=list)


def in_code(line: str, offset: int) -> bool:
  return line[:offset].count("`") % 2 == 1


def table_cells(line: str) -> list[tuple[int, int]]:
  """The (start, end) offsets of the cells of a markdown table row; [] for any other line."""
  stripped = line.rstrip()
  if not (stripped.lstrip().startswith("|") and stripped.endswith("|")):
    return []
  bounds, inside = [], False
  for offset, char in enumerate(stripped):
    if char == "`":
      inside = not inside
    elif char == "|" and not inside:
      bounds.append(offset)
  return [(start + 1, end) for start, end in zip(bounds, bounds[1:])]


@functools.cache
def script_source() -> str:
  """The text of the results scripts and page templates (``experiments/*.py``, ``*.md`` beside them), where a
  page's fixed text comes from."""
  parts = []
  for folder, _, names in sorted(os.walk(os.path.dirname(os.path.abspath(__file__)))):
    for name in sorted(names):
      if name.endswith((".py", "template.md")) and name != os.path.basename(__file__):
        with open(os.path.join(folder, name), encoding="utf-8") as f:
          parts.append(f.read())
  return "\n".join(parts)


def scripted(line: str, start: int, end: int, source: str) -> bool:
  """Whether the number at ``line[start:end]`` stands in ``source`` with at least 8 characters of its context on
  one side (a record's value is filled in, so its text is not in the source)."""
  return any(len(window) >= end - start + 8 and window in source
             for window in (line[max(0, start - 12):end], line[start:end + 12], line[max(0, start - 6):end + 6]))


def tokens(page: str, text: str, lines: range | None = None, source: str = ""):
  """Every number of ``text`` (lines ``lines``, 1-based; all by default) as a ``Token``."""
  section, marker, header, fenced = "", "", None, False
  all_lines = text.splitlines()
  for index, line in enumerate(all_lines):
    number = index + 1
    if line.startswith("```"):
      fenced = not fenced
    if line.startswith("#"):
      section = line.lstrip("#").strip()
    found = re.match(r"<!-- (/?)(benchmarks[\w.]*) -->", line)
    if found:
      marker = "" if found.group(1) else found.group(2)
    spans = table_cells(line)
    if not spans:
      header = None
    elif header is None:
      header = [line[start:end].strip() for start, end in spans]
    is_header = bool(spans) and index + 1 < len(all_lines) and set(
        all_lines[index + 1].replace("|", "").strip()) <= {"-", ":"} and "-" in all_lines[index + 1]
    if lines is not None and number not in lines:
      continue
    for match in NUMBER.finditer(line):
      column_index = next((i for i, (start, end) in enumerate(spans) if start <= match.start() < end), None)
      column = header[column_index] if header and column_index is not None and column_index < len(header) else None
      row = line[spans[0][0]:spans[0][1]].strip() if spans else None
      yield Token(page, number, match.group(), line, line[max(0, match.start() - 80):match.start()],
                  line[match.end():match.end() + 40], section,
                  marker, column, header[0] if header else None, column_index, row, fenced or in_code(line, match.start()), is_header,
                  page in RESULT_PAGES and not spans and scripted(line, match.start(), match.end(), source))


def classify(token: Token, marks: dict, compared: set) -> tuple[str, Rule | None]:
  """The class of ``token``: the evidence marked at its cell or line, else the first rule matching it (a
  ``record only`` or ``from outputs`` rule only where its line was compared with the page written again)."""
  for key in ((token.line, token.column_index), (token.line, token.text), (token.line, None)):
    if key in marks:
      return marks[key], None
  if token.heading:
    return "exempt", RULES[1]
  for rule in RULES:
    if rule.matches(token):
      if (rule.kind in ("record only", "from outputs") or rule.scripted or rule.compared) and (
          token.line not in compared):
        continue
      return rule.kind, rule
  return "unaccounted", None


def account(result: Account, page: str, text: str, marks: dict, compared: set, lines: range | None = None) -> None:
  """Counts each number of ``page`` in ``result`` by class; one not accounted for is added to
  ``result.unaccounted``, naming the page, line and number."""
  for token in tokens(page, text, lines, script_source()):
    kind, rule = classify(token, marks, compared)
    if kind == "unaccounted":
      where = f"row {token.row!r}, column {token.column!r}" if token.column else repr(token.line_text.strip()[:70])
      result.unaccounted.append(f"{page}: line {token.line}, {where}: the number {token.text} is neither checked "
                                "against evidence, nor on the record-only or not-committed list, nor exempt by a rule "
                                "(experiments/verify_rules.py)")
      continue
    result.counts[page][kind] += 1
    if rule is not None:
      result.by_rule[page, rule] += 1


def check_stale(result: Account, pages) -> None:
  """A rule naming only pages that were accounted for, yet matching nothing there, is stale."""
  for rule in RULES:
    if set(rule.pages) <= set(pages) and not any(
        result.by_rule[page, rule] for page in rule.pages):
      result.stale.append(f"{', '.join(rule.pages)}: the rule {rule.kind}: {rule.what!r} matches no number: remove it "
                          "from experiments/verify_rules.py, or fix what it selects")
