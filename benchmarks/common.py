"""What every benchmark script shares: its flags and its section of a RESULTS.md page (what it measures
with is in ``measure.py``; the machine stamp, tables, commands and where a page goes are the results library's,
``experiments/report.py``).

Conventions of the scripts in this folder:

- ``python -m benchmarks.<name>`` measures at full size, prints its table and writes its own section (command,
  machine, JAX version, date, table) of ``RESULTS.md`` in ``--output_dir`` (default: a new folder
  ``runs/benchmarks-<time>/``, printed at the end); the committed ``benchmarks/RESULTS.md`` is written only
  with ``--update_committed``. ``--smoke`` shrinks every size to something that runs in seconds (what the
  tests run) and writes nothing unless ``--output_dir`` is given.
- ``--time_budget_s``: a script checks ``out_of_time(args)`` between measurements and stops adding rows once
  the budget is spent (a note says what was left out), so a run with a deadline still writes its table.
- ``main(argv) -> Report``: the table and a dict of ratios (ours / reference, measured side by side in the
  same process), so tests can check that every ratio is a finite number.
- A section is the run's alone: a run replaces its script's section (``section_name``) and keeps the others.
"""
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

from experiments import report as library
from transformer.errors import UserError

BENCHMARKS_DIR = os.path.dirname(os.path.abspath(__file__))
RESULTS_PATH = os.path.join(BENCHMARKS_DIR, "RESULTS.md")  # the committed page (written with --update_committed)
# Sections of RESULTS.md, in the order of the questions (benchmarks/README.md); the suite's summary first.
SCRIPTS = ("suite", "attention", "chunked_attention", "train_step", "step_profile", "decoding", "input_pipeline",
           "sequence_length", "replicas", "time_to_bleu", "loop_overhead")
RESULTS_HEADER = ("# Benchmark results\n\nWritten by the scripts in `benchmarks/` (one section each, replaced "
                  "when the script runs again into the same page: `--output_dir`, or `--update_committed` for "
                  "benchmarks/RESULTS.md); do not edit by hand.\n")


# ----------------------------------------------------------------------------------------------- flags

def parse_args(description: str, argv: Sequence[str] | None,
               add_arguments: Callable[[argparse.ArgumentParser], None] | None = None) -> argparse.Namespace:
  """The flags every script has (``--smoke``, ``--repeats``, ``--warmup``, the library's output flags,
  ``--time_budget_s``) plus its own; ``args.results_path`` is where its section goes (``results_path``)."""
  parser = argparse.ArgumentParser(description=description)
  parser.add_argument("--smoke", action="store_true",
                      help="tiny sizes and one repeat, for tests; writes RESULTS.md only if --output_dir is given")
  parser.add_argument("--repeats", type=int, default=None, help="timed calls per measurement (median)")
  parser.add_argument("--warmup", type=int, default=None, help="untimed calls before timing")
  # No --force: a section is replaced by every run of its script, there is no longer run to protect.
  library.add_output_arguments(parser, "a new folder runs/benchmarks-<time>/ in the repository", force=False)
  parser.add_argument("--time_budget_s", type=float, default=None,
                      help="stop adding measurements once this many seconds have passed (the table so far is "
                           "written, with a note); default: no limit")
  if add_arguments is not None:
    add_arguments(parser)
  args = parser.parse_args(list(argv) if argv is not None else None)
  args.started = time.monotonic()
  if args.smoke and args.update_committed:
    parser.error("--smoke numbers mean nothing: it never writes the committed benchmarks/RESULTS.md "
                 "(leave out --update_committed)")
  try:  # decided before measuring: a wrong combination stops now, not after minutes of it
    args.results_path = results_path(args)
  except UserError as error:
    parser.error(str(error))
  if args.repeats is None:
    args.repeats = 1 if args.smoke else 5
  if args.warmup is None:
    args.warmup = 1
  if args.repeats < 1 or args.warmup < 0:
    parser.error(f"--repeats must be >= 1 and --warmup >= 0, got {args.repeats} and {args.warmup}.")
  return args


def results_path(args: argparse.Namespace) -> str | None:
  """The RESULTS.md a run writes: the committed one with ``--update_committed``, else ``--output_dir``'s (its
  default a new folder per run under the git-ignored ``runs/``); ``None`` for a ``--smoke`` run without
  ``--output_dir`` (it writes nothing).

  Raises:
    UserError: both flags, or an ``--output_dir`` that is the committed folder.
  """
  if args.smoke and not args.output_dir:
    return None
  default = os.path.join(library.REPO, "runs", "benchmarks-" + datetime.datetime.now().strftime("%Y%m%d-%H%M%S"))
  folder = library.choose_results_folder(args.output_dir, args.update_committed, False, BENCHMARKS_DIR, default)
  return os.path.join(folder, "RESULTS.md")


def out_of_time(args: argparse.Namespace) -> bool:
  """Whether the run's ``--time_budget_s`` is spent (never, without one)."""
  budget = getattr(args, "time_budget_s", None)
  return budget is not None and time.monotonic() - args.started > budget


def positive_int(text: str) -> int:
  """An argparse type: an integer of at least 1 (batch size, steps, ...), else a usage error naming the value."""
  value = int(text)
  if value < 1:
    raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {value}")
  return value


# ---------------------------------------------------------------------------------------- the section

def fmt(value, digits: int = 2) -> str:
  """A table cell: numbers with ``digits`` decimals and thousands separators, '-' for missing values."""
  if value is None:
    return "-"
  if isinstance(value, str):
    return value
  if isinstance(value, (int, np.integer)):
    return f"{value:,}"
  if not math.isfinite(value):
    return "-"
  return f"{value:,.{digits}f}"


@dataclasses.dataclass
class Report:
  """One script's result: a table, its ratios (name -> ours / reference) and notes printed under it."""
  script: str  # module name in benchmarks/, e.g. "attention"
  title: str
  header: list[str]
  rows: list[list] = dataclasses.field(default_factory=list)
  ratios: dict[str, float] = dataclasses.field(default_factory=dict)
  notes: list[str] = dataclasses.field(default_factory=list)

  def text(self) -> str:
    table = library.markdown_table(self.header, [[fmt(cell) for cell in row] for row in self.rows])
    notes = "\n".join(f"- {note}" for note in self.notes)
    return f"{table}\n\n{notes}\n" if notes else f"{table}\n"


# Flags that say where a run's page goes, not what it measured: left out of the command a section records.
_WHERE_FLAGS = ("--output_dir", "--update_committed")


def command(script: str, argv: Sequence[str] | None) -> str:
  """``python -m benchmarks.<script> ARGUMENTS`` as run (``argv``, else ``sys.argv``) less ``_WHERE_FLAGS``."""
  arguments, skip_value = [], False
  for argument in (list(argv) if argv is not None else sys.argv[1:]):
    if skip_value:
      skip_value = False
      continue
    name = argument.partition("=")[0]
    if name in _WHERE_FLAGS:
      skip_value = name == "--output_dir" and "=" not in argument
      continue
    arguments.append(argument)
  return library.command_line(["python", "-m", f"benchmarks.{script}", *arguments])


def section_name(script: str) -> str:
  """The RESULTS.md section a script's run writes: ``script`` on CPU, ``script.<backend>`` on an accelerator
  and ``script.<N>core`` on CPU narrowed to N cores by ``taskset``, so such a run sits beside the default
  one instead of replacing it."""
  backend = jax.default_backend()
  if backend != "cpu":
    return f"{script}.{backend}"
  cores = library.usable_cores()
  return script if cores == os.cpu_count() else f"{script}.{cores}core"


def section(report: Report, argv: Sequence[str] | None, machine: str) -> str:
  """The run's section: its title (with the backend or cores where ``section_name`` has them), command,
  ``machine`` (``report.host_description`` at the start of the run), versions, date, table and notes."""
  name = section_name(report.script)
  title = report.title
  if name != report.script:
    backend = jax.default_backend()
    title += (f" on {backend.upper()}" if backend != "cpu"
              else f" on {library.usable_cores()} of {os.cpu_count()} CPU cores")
  return (f"<!-- benchmarks.{name} -->\n## {title}\n\n"
          f"- Command: `{command(report.script, argv)}`\n- Machine: {machine}\n- Versions: {library.versions()}\n"
          f"- Date: {datetime.date.today().isoformat()}\n\n{report.text()}<!-- /benchmarks.{name} -->\n")


# ------------------------------------------------------------------------------------------- the page

SECTION_PATTERN = re.compile(r"<!-- benchmarks\.([\w.]+) -->\n.*?<!-- /benchmarks\.\1 -->\n", re.DOTALL)


def read_sections(path: str) -> dict[str, str]:
  """``{section name: its text}`` of a RESULTS.md page (empty when the file does not exist)."""
  if not os.path.exists(path):
    return {}
  with open(path) as f:
    return {match.group(1): match.group(0) for match in SECTION_PATTERN.finditer(f.read())}


def write_sections(new_sections: Mapping[str, str], path: str) -> None:
  """Replace (or add) ``new_sections`` in the page at ``path``, keeping the others; sections follow
  ``SCRIPTS``, each script's accelerator sections after its CPU one."""
  sections = {**read_sections(path), **new_sections}
  rank = {script: index for index, script in enumerate(SCRIPTS)}
  order = sorted(sections, key=lambda name: (rank.get(name.split(".")[0], len(SCRIPTS)), name))
  with open(path, "w") as f:
    f.write(RESULTS_HEADER + "".join("\n" + sections[name] for name in order))


def update_results(report: Report, argv: Sequence[str] | None, machine: str, path: str) -> None:
  """Replace (or add) the run's section of the page at ``path`` (``section_name``), keeping the others."""
  write_sections({section_name(report.script): section(report, argv, machine)}, path)


def finish(report: Report, args: argparse.Namespace, argv: Sequence[str] | None, machine: str) -> Report:
  """Print the report and write its section of ``args.results_path`` (nothing for a bare ``--smoke``)."""
  print(f"\n## {report.title}\n\n{machine}\n{library.versions()}\n\n{report.text()}", flush=True)
  path = args.results_path
  if path is not None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    update_results(report, argv, machine, path)
    print(f"wrote its section of {path}", flush=True)
  return report
