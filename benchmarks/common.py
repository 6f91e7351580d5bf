"""What every benchmark script shares: its flags and its section of a RESULTS.md page (conventions in
benchmarks/README.md; what it measures with in ``measure.py``; the machine stamp, tables, commands and where a page
goes in the results library, ``experiments/record_store.py``, ``pages.py`` and ``launching.py``). A script's
``main(argv) -> Report`` returns its table and ratios (ours / reference), stops adding rows once
``out_of_time(args)`` and writes its section with ``finish``."""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import math
import os
import re
import sys
import time
from typing import Callable, Mapping, Sequence

import jax
import numpy as np

from experiments import launching, pages, record_store
from transformer.errors import UserError

BENCHMARKS_DIR = os.path.dirname(os.path.abspath(__file__))
RESULTS_PATH = os.path.join(BENCHMARKS_DIR, "RESULTS.md")  # the committed page (written with --update_committed)
# Sections of RESULTS.md, in the order of the questions (benchmarks/README.md); the suite's summary first.
SCRIPTS = ("suite", "attention", "chunked_attention", "train_step", "step_profile", "remat", "activation_layout",
           "packing", "checkpoint_save", "preemption", "decoding", "input_pipeline", "host_data", "token_cache",
           "sequence_length", "replicas", "time_to_bleu", "loop_overhead", "scan_layers")
RESULTS_HEADER = ("# Benchmark results\n\nWritten by the scripts in `benchmarks/` (one section each, replaced "
                  "when the script runs again into the same page: `--output_dir`, or `--update_committed` for "
                  "benchmarks/RESULTS.md); do not edit by hand.\n")


def parse_args(description: str, argv: Sequence[str] | None,
               add_arguments: Callable[[argparse.ArgumentParser], None] | None = None) -> argparse.Namespace:
  """The flags every script has (``--smoke``, ``--repeats``, ``--warmup``, the library's output flags,
  ``--time_budget_s``) plus its own. ``args.results_path``: the committed RESULTS.md with ``--update_committed``,
  else ``--output_dir``'s (by default a new folder per run under the git-ignored ``runs/``); ``None`` (nothing
  written) for a ``--smoke`` run without ``--output_dir``."""
  parser = argparse.ArgumentParser(description=description, allow_abbrev=False)  # a misspelt flag is an error
  parser.add_argument("--smoke", action="store_true",
                      help="tiny sizes and one repeat, for tests; writes RESULTS.md only if --output_dir is given")
  parser.add_argument("--repeats", type=int, default=None, help="timed calls per measurement (median)")
  parser.add_argument("--warmup", type=int, default=1, help="untimed calls before timing")
  # No --force: a section is replaced by every run of its script, there is no longer run to protect.
  pages.add_output_arguments(parser, "a new folder runs/benchmarks-<time>/ in the repository", force=False)
  parser.add_argument("--time_budget_s", type=positive_float, default=None,
                      help="stop adding measurements once this many seconds have passed (the table so far is "
                           "written, with a note); default: no limit")
  if add_arguments is not None:
    add_arguments(parser)
  args = parser.parse_args(list(argv) if argv is not None else None)
  args.started = time.monotonic()
  if args.smoke and args.update_committed:
    parser.error("--smoke numbers mean nothing: it never writes the committed benchmarks/RESULTS.md "
                 "(leave out --update_committed)")
  try:  # where it writes, decided before measuring: a wrong combination stops now, not after minutes of it
    default = os.path.join(record_store.REPO, "runs", "benchmarks-" + datetime.datetime.now().strftime("%Y%m%d-%H%M%S"))
    folder = pages.choose_results_folder(args.output_dir, args.update_committed, False, BENCHMARKS_DIR, default,
                                         keeps_rows=False)
  except UserError as error:
    parser.error(str(error))
  args.results_path = None if args.smoke and not args.output_dir else os.path.join(folder, "RESULTS.md")
  if args.repeats is None:
    args.repeats = 1 if args.smoke else 5
  if args.repeats < 1 or args.warmup < 0:
    parser.error(f"--repeats must be >= 1 and --warmup >= 0, got {args.repeats} and {args.warmup}.")
  return args


def out_of_time(args: argparse.Namespace) -> bool:
  """Whether the run's ``--time_budget_s`` is spent (never, without one)."""
  budget = getattr(args, "time_budget_s", None)
  return budget is not None and time.monotonic() - args.started > budget


# The argparse types of every script's numeric flags (lists too, as --lengths 128 -8): a bad value is argparse's
# one error line naming the flag, before anything is imported onto a device or measured.
def positive_int(text: str) -> int:
  """An argparse type: an integer of at least 1 (batch size, steps, ...), else a usage error naming the value."""
  try:
    value = int(text)
  except ValueError:
    raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}") from None
  if value < 1:
    raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {value}")
  return value


def _float_at_least(text: str, least: float, strictly: bool) -> float:
  try:
    value = float(text)
  except ValueError:
    value = float("nan")
  if not math.isfinite(value) or value < least or (strictly and value == least):
    raise argparse.ArgumentTypeError(f"must be a number {'>' if strictly else '>='} {least:g}, got {text!r}")
  return value


def positive_float(text: str) -> float:
  """An argparse type: a finite number above 0 (seconds of a budget, GiB), else a usage error naming the value."""
  return _float_at_least(text, 0.0, strictly=True)


def non_negative_float(text: str) -> float:
  """An argparse type: a finite number of at least 0 (seconds kept in reserve), else a usage error."""
  return _float_at_least(text, 0.0, strictly=False)


def fmt(value, digits: int = 2) -> str:
  """A table cell: numbers with ``digits`` decimals and thousands separators, '-' for missing values."""
  if value is None:
    return "-"
  if isinstance(value, str):
    return value
  if isinstance(value, (int, np.integer)):
    return f"{value:,}"
  return f"{value:,.{digits}f}" if math.isfinite(value) else "-"


@dataclasses.dataclass
class Report:
  """One script's result: a table, its ratios (name -> ours / reference) and notes printed under it."""
  script: str  # module name in benchmarks/, e.g. "attention"
  title: str
  header: list[str]
  rows: list[list] = dataclasses.field(default_factory=list)
  ratios: dict[str, float] = dataclasses.field(default_factory=dict)
  notes: list[str] = dataclasses.field(default_factory=list)
  # Its RESULTS.md section's name when a mode of the script answers another question than its default run
  # (``remat_fit``: remat.py --fit_search), so the two runs keep a section each; default the script's.
  section: str = ""

  @property
  def name(self) -> str:
    return self.section or self.script

  def text(self) -> str:
    table = pages.markdown_table(self.header, [[fmt(cell) for cell in row] for row in self.rows])
    notes = "\n".join(f"- {note}" for note in self.notes)
    return f"{table}\n\n{notes}\n" if notes else f"{table}\n"


def command(script: str, argv: Sequence[str] | None) -> str:
  """``python -m benchmarks.<script> ARGUMENTS`` as run (``argv``, else ``sys.argv``), less the flags that say
  where the page goes, not what was measured (``--output_dir [DIR]``, ``--update_committed``)."""
  arguments = list(argv) if argv is not None else sys.argv[1:]
  kept = []
  while arguments:
    argument = arguments.pop(0)
    if argument == "--output_dir" and arguments:
      arguments.pop(0)  # its value
    elif argument.partition("=")[0] not in ("--output_dir", "--update_committed"):
      kept.append(argument)
  return launching.command_line(["python", "-m", f"benchmarks.{script}", *kept])


def placement() -> tuple[str, str]:
  """``(name suffix, title suffix)`` of a run's section: ``.<backend>`` on an accelerator and ``.<N>core`` on CPU
  narrowed to N cores by ``taskset``, so such a run sits beside the default one instead of replacing it."""
  backend = jax.default_backend()
  if backend != "cpu":
    return f".{backend}", f" on {backend.upper()}"
  cores = record_store.usable_cores()
  return ("", "") if cores == os.cpu_count() else (f".{cores}core", f" on {cores} of {os.cpu_count()} CPU cores")


def section_name(script: str) -> str:
  """The RESULTS.md section a script's run writes: ``script`` and its ``placement``."""
  return script + placement()[0]


def section(report: Report, argv: Sequence[str] | None, machine: str) -> str:
  """The run's section: title (with its ``placement``), command, ``machine`` (``record_store.host_description`` at the
  start of the run), versions, date, table and notes."""
  suffix, title_suffix = placement()
  name = report.name + suffix
  return (f"<!-- benchmarks.{name} -->\n## {report.title}{title_suffix}\n\n"
          f"- Command: `{command(report.script, argv)}`\n- Machine: {machine}\n- Versions: {record_store.versions()}\n"
          f"- Date: {datetime.date.today().isoformat()}\n\n{report.text()}<!-- /benchmarks.{name} -->\n")


SECTION_PATTERN = re.compile(r"<!-- benchmarks\.([\w.]+) -->\n.*?<!-- /benchmarks\.\1 -->\n", re.DOTALL)


def read_sections(path: str) -> dict[str, str]:
  """``{section name: its text}`` of a RESULTS.md page (empty when the file does not exist)."""
  text = record_store.read_text(*os.path.split(path))
  return {match.group(1): match.group(0) for match in SECTION_PATTERN.finditer(text)}


def write_sections(new_sections: Mapping[str, str], path: str) -> None:
  """Replace (or add) ``new_sections`` in the page at ``path``, keeping the others; sections follow
  ``SCRIPTS``, each script's accelerator sections after its CPU one, then its modes' (``Report.section``)."""
  sections = {**read_sections(path), **new_sections}
  rank = {script: index for index, script in enumerate(SCRIPTS)}

  def script_rank(name):  # a mode's section (``remat_fit``) follows its script's
    base = name.split(".")[0]
    return min((rank[script] for script in SCRIPTS if base == script or base.startswith(script + "_")),
               default=len(SCRIPTS))
  order = sorted(sections, key=lambda name: (script_rank(name), name))
  folder, file = os.path.split(path)
  record_store.write_text(folder, RESULTS_HEADER + "".join("\n" + sections[name] for name in order), name=file)


def update_results(report: Report, argv: Sequence[str] | None, machine: str, path: str) -> None:
  """Replace (or add) the run's section of the page at ``path`` (``section_name``), keeping the others."""
  write_sections({section_name(report.name): section(report, argv, machine)}, path)


def finish(report: Report, args: argparse.Namespace, argv: Sequence[str] | None, machine: str) -> Report:
  """Print the report and write its section of ``args.results_path`` (nothing for a bare ``--smoke``)."""
  print(f"\n## {report.title}\n\n{machine}\n{record_store.versions()}\n\n{report.text()}", flush=True)
  if args.results_path is not None:
    update_results(report, argv, machine, args.results_path)
    print(f"wrote its section of {args.results_path}", flush=True)
  return report
