"""The results library: the record store, the one main of a results script and its flags, the command and
machine stamp, markdown tables, plots and the statistics the pages quote; the benchmarks use it too.

A page is rendered from the rows in its ``records.json`` (``--from_records`` renders it again without the runs).
The committed pages under ``experiments/<name>/`` are written only with ``--update_committed``, and there a row
is only replaced by a run of at least as many training steps, unless ``--force`` (docs/development.md).
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import datetime
import json
import math
import os
import platform
import shlex
import subprocess
import sys
import tempfile
from typing import Callable

import jax
import numpy as np

from transformer.data.files import write_atomically
from transformer.errors import UserError, exit_on_user_error  # noqa: F401 (the scripts' one-line errors)
from transformer.train.run_directory import METRICS, RunDirectory, read_metrics

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMITTED = os.path.join(REPO, "experiments")  # the committed pages: experiments/<name>/RESULTS.md
NOT_KEPT_NOTE = "runs_not_kept.md"  # beside a page, by hand: settings tried whose workdirs are gone
RECORDS_FILE = "records.json"  # beside a page: its rows (RecordStore)


# ------------------------------------------------------------------------------ flags and the one main

def add_output_arguments(parser, default: str, force: bool = True) -> None:
  """``--output_dir`` (``default``: where the page goes without it, for the help), ``--update_committed`` and
  ``--force``; ``force=False`` where no row outlives a run (the benchmarks, whose sections each run replaces)."""
  parser.add_argument("--output_dir", default="", help="Folder for the page (RESULTS.md and what it links), "
                      f"printed at the end; default: {default}.")
  parser.add_argument("--update_committed", action="store_true", help="Write into the committed page instead of "
                      "--output_dir." + (" A row there is only replaced by a run of at least as many training steps "
                                         "(see --force)." if force else ""))
  if force:
    parser.add_argument("--force", action="store_true",
                        help="With --update_committed: replace committed rows even by runs of fewer training steps.")


def add_boolean_argument(parser, name: str, default: bool, help: str) -> None:
  """``--NAME`` and ``--noNAME`` (absl's spelling, which the pages' commands and READMEs use)."""
  parser.add_argument(f"--{name}", dest=name, action="store_true", default=default, help=help)
  parser.add_argument(f"--no{name}", dest=name, action="store_false", help=f"The opposite of --{name}.")


def non_negative_int(text: str) -> int:
  """An argparse ``type``: an integer >= 0, else a usage error naming the value."""
  if not text.strip().isdigit():
    raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text}")
  return int(text)


def comma_list(text: str) -> list[str]:
  """An argparse ``type``: ``a,b`` -> ``["a", "b"]`` (absl's DEFINE_list)."""
  return [part.strip() for part in text.split(",") if part.strip()]


def results_parser(doc: str, default_output: str, default_root: str | None = None,
                   hardware: bool = False) -> argparse.ArgumentParser:
  """A results script's parser: ``doc`` as the help, ``add_output_arguments``, ``--from_records``, and
  ``--workdir_root`` (given ``default_root``) and ``--hardware`` (given ``hardware``). ``make_page`` does the rest."""
  parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter,
                                   allow_abbrev=False)  # as absl: a misspelt flag is an error
  add_output_arguments(parser, default_output)
  parser.add_argument("--from_records", action="store_true",
                      help=f"Train and score nothing: write the page from the folder's {RECORDS_FILE} alone (a new "
                           "folder's start from the committed page's), e.g. after a change of the page's layout.")
  if default_root is not None:
    parser.add_argument("--workdir_root", default=default_root,
                        help=f"Where the runs' workdirs are: <root>/<variant> (default: {default_root}).")
  if hardware:
    parser.add_argument("--hardware", default="", help="Where the runs read trained, for the page (default: this "
                        "machine), e.g. '1 x NVIDIA H200, 16 cores' for workdirs copied back from a GPU host.")
  return parser


def make_page(args: argparse.Namespace, committed: str, default_output: str,
              collect: Callable[[RecordStore, str], object] | None,
              render: Callable[[RecordStore, str], str]) -> str:
  """The one main of a results script: in the folder (``choose_results_folder``), its ``RecordStore`` (a new
  folder's starts from the committed records, forced unless committed) gets the runs' records from ``collect(store,
  folder)`` (train, score, plots; not with ``--from_records``); ``render(store, folder)`` gives the page's text.
  Before any of that, ``--from_records`` without rows and a folder that cannot be written are refused; RESULTS.md
  and records.json are written (atomically) only if every step succeeds; a ``UserError`` exits with one line."""
  force = getattr(args, "force", False)
  folder = exit_on_user_error(choose_results_folder, args.output_dir, args.update_committed, force, committed,
                              default_output)
  updating = args.update_committed  # choose_results_folder refuses any other way into the committed folder

  def write() -> str:
    store = RecordStore(folder, start_from=None if updating else committed, force=force or not updating)
    if args.from_records:  # a page of no rows would replace the page: refused before anything is written
      store.require_rows("--from_records")
    require_writable(folder)  # before collect's hours of training or decoding
    if collect is not None and not args.from_records:
      collect(store, folder)
    text = render(store, folder)
    store.save()
    return write_page(folder, text)

  text = exit_on_user_error(write)
  print(text)
  print(f"Wrote the page to {folder}/RESULTS.md" + ("" if updating else f" (the committed page "
        f"{os.path.relpath(committed, REPO)}/ is unchanged; --update_committed writes there)."))
  return text


def require_writable(folder: str) -> None:
  """Makes ``folder`` and checks that a file can be created in it (a read-only folder or file system refuses
  it, as it would the page at the end); a ``UserError`` of one line naming the folder otherwise."""
  try:
    os.makedirs(folder, exist_ok=True)
    handle, probe = tempfile.mkstemp(prefix=".write-check-", dir=folder)
    os.close(handle)
    os.remove(probe)
  except OSError as error:
    raise UserError(f"cannot write the page into {folder} ({error.strerror or error}): give --output_dir=<a "
                    "folder you can write>, or make it writable, and rerun") from None


def choose_results_folder(output_dir: str, update_committed: bool, force: bool, committed: str,
                          default: str, keeps_rows: bool = True) -> str:
  """``committed`` with ``update_committed``, else ``output_dir``, else ``default``; a UserError for the
  combinations that would write the committed page by accident or say nothing. ``keeps_rows=False``: a page
  whose sections every run replaces (the benchmarks'), for the message."""
  if update_committed and output_dir:
    raise UserError("give either --output_dir (a page of your own) or --update_committed (the committed page "
                    f"{os.path.relpath(committed, REPO)}/), not both")
  if force and not update_committed:
    raise UserError("--force only applies with --update_committed (it lets shorter runs replace committed rows)")
  if update_committed:
    return committed
  folder = os.path.abspath(output_dir or default)
  if os.path.realpath(folder) == os.path.realpath(committed):
    raise UserError(f"--output_dir={output_dir} is the committed page; give --update_committed to write there"
                    + (" (rows are then only replaced by runs at least as long)" if keeps_rows else "")
                    + ", or another folder")
  return folder


# ------------------------------------------------------------------------------ the record store

class RecordStore:
  """The rows of a results page in ``records.json`` beside it, so the page outlives its runs' workdirs:
  ``{"<row>": {"steps": int, "command": str, "machine": str, "values": {...JSON}, "order": int}}`` (``order``:
  the row's place, as first added, which the file's sorted keys do not keep). A row is only replaced by a run of
  at least as many steps unless the store (or ``add``) is forced."""

  def __init__(self, folder: str, start_from: str | None = None, force: bool = False):
    """Reads ``folder/records.json``, else ``start_from/records.json`` (the committed page's) where given:
    ``source``, the file read or, when neither exists, the one looked for last."""
    self.folder, self.force = folder, force
    self.path = os.path.join(folder, RECORDS_FILE)
    self.looked_at = [self.path] + ([os.path.join(start_from, RECORDS_FILE)] if start_from else [])
    self.source = next((path for path in self.looked_at if os.path.exists(path)), self.looked_at[-1])
    self.records: dict[str, dict] = read_records(self.source) if os.path.exists(self.source) else {}

  def require_rows(self, why: str) -> None:
    """Refuses (one ``UserError`` naming the file) a store without a file or without rows: ``why`` (e.g.
    ``--from_records``) would write a page of nothing over the page."""
    if not os.path.exists(self.source):
      missing = " nor ".join(dict.fromkeys(self.looked_at))
      raise UserError(f"{why}: there is no {missing}, so no row to write the page from (nothing was written); "
                      "restore it (git checkout -- FILE), or run without --from_records to record the runs first")
    if not self.records:
      raise UserError(f"{why}: {self.source} holds no rows, so no page to write from it (nothing was written); "
                      "restore it (git checkout -- FILE), or run without --from_records to record the runs first")

  def check(self, new_steps: dict[str, int], force: bool | None = None) -> None:
    """Refuses (one ``UserError`` naming each row, both step counts and ``--force``) to replace a row by a run
    of fewer steps (``new_steps``: row -> steps); call it before training, so that a refusal costs nothing."""
    if self.force if force is None else force:
      return
    shorter = [f"row {name!r} records a run of {self.records[name]['steps']} training steps, the new one "
               f"trained {steps}" for name, steps in new_steps.items()
               if name in self.records and steps < self.records[name]["steps"]]
    if shorter:
      raise UserError(f"{self.path}: {'; '.join(shorter)}. A committed row is only replaced by a run at least as "
                      "long: give --force to replace it anyway, another row name for a row of its own, or leave "
                      "out --update_committed to write a page of your own.")

  def add(self, name: str, *, steps: int, command: str, machine: str, values: dict,
          force: bool | None = None) -> None:
    """Records row ``name`` (``check`` first), in its place or after the others. Saved by ``save``."""
    self.check({name: steps}, force)
    order = self.records.get(name, {}).get("order")
    if order is None:  # a new row (or one of a file written without places)
      order = 1 + max((record.get("order", -1) for record in self.records.values()), default=-1)
    self.records[name] = {"steps": int(steps), "command": command, "machine": machine, "values": values,
                          "order": order}

  def rename(self, name: str, new_name: str) -> None:
    self.records[new_name] = self.records.pop(name)  # the record keeps its place

  def save(self) -> None:
    """Writes ``records.json`` atomically; a store without rows creates no file (there is nothing to keep)."""
    if self.records or os.path.exists(self.path):
      write_page(self.folder, json.dumps(self.records, indent=1, sort_keys=True, allow_nan=True) + "\n",
                 RECORDS_FILE)

  def __getitem__(self, name: str) -> dict:
    return self.records[name]

  def __contains__(self, name: str) -> bool:
    return name in self.records

  def __iter__(self):
    return iter(name for name, _ in self.items())

  def __len__(self) -> int:
    return len(self.records)

  def distinct(self, names, field: str = "machine") -> list:
    """The distinct ``record[field]`` (else ``record["values"][field]``) of the rows ``names``, first seen
    first, None left out: a page's machine stamps, workdir roots."""
    found = [self[name][field] if field in self[name] else self[name]["values"].get(field) for name in names]
    return list(dict.fromkeys(value for value in found if value is not None))

  def items(self) -> list[tuple[str, dict]]:
    """``(name, record)`` in the order the rows were first added."""
    return sorted(self.records.items(), key=lambda item: item[1].get("order", math.inf))


# The fields of a record (``RecordStore``) and their JSON types; ``order`` may be missing (files before it).
RECORD_FIELDS = {"steps": int, "command": str, "machine": str, "values": dict}
JSON_TYPES = {dict: "an object", list: "a list", str: "a string", int: "a whole number", float: "a number",
              bool: "a boolean", type(None): "null"}


def read_records(path: str) -> dict[str, dict]:
  """The rows of the record store ``path``; a ``UserError`` of one line naming the file (and the row) when it
  is empty, not JSON, not an object of rows, or a row lacks a field or has one of the wrong type."""
  fix = f"restore it from git (git checkout -- {path}) or delete it to record its rows again"
  try:
    text = read_page(*os.path.split(path))
  except UnicodeDecodeError as error:
    raise UserError(f"{path} is not the JSON of a record store ({error}); {fix}") from None
  if not text.strip():  # our writes are atomic: a write cut short by something else (a copy, an editor)
    raise UserError(f"{path} is empty ({len(text.encode())} bytes), not a record store; {fix}")
  try:
    records = json.loads(text)
  except json.JSONDecodeError as error:
    raise UserError(f"{path} is not the JSON of a record store ({error}); {fix}") from None
  if not isinstance(records, dict):
    raise UserError(f"{path} holds {JSON_TYPES.get(type(records), 'a value')}, not a record store (an object "
                    f'of rows: {{"<row>": {{"steps", "command", "machine", "values"}}}}); {fix}')
  for name, record in records.items():
    if problem := record_problem(record):
      raise UserError(f"{path}: row {name!r} {problem}; correct or remove the row, or {fix}")
  return records


def record_problem(record) -> str:
  """What is wrong with one row of a record store, or "" when nothing is."""
  if not isinstance(record, dict):
    return f"is {JSON_TYPES.get(type(record), 'a value')}, not an object of {', '.join(RECORD_FIELDS)}"
  for field, kind in {**RECORD_FIELDS, **({"order": int} if "order" in record else {})}.items():
    if field not in record:
      return f"has no {field!r}"
    if not isinstance(record[field], kind) or (kind is int and isinstance(record[field], bool)):
      return f"has {json.dumps(record[field])[:40]} as {field!r}, not {JSON_TYPES[kind]}"
  return ""


# ------------------------------------------------------------------------------ the page

def read_page(output: str, name: str = "RESULTS.md") -> str:
  """The text of ``output/NAME``; empty when there is none."""
  path = os.path.join(output, name)
  if not os.path.exists(path):
    return ""
  with open(path) as f:
    return f.read()


def write_page(output: str, text: str, name: str = "RESULTS.md") -> str:
  """Writes ``text`` as ``output/NAME`` (making the folder), atomically: a kill or a full disk mid-write leaves
  the old file whole (a full disk: a ``UserError`` naming the file and the free space); returns it."""
  os.makedirs(output or ".", exist_ok=True)
  path = os.path.join(output, name)
  try:
    write_atomically(path, text)
  except OSError as error:  # a folder made read-only since, say; a full disk is write_atomically's UserError
    raise UserError(f"cannot write {path} ({error.strerror or error}); the old file, if any, is unchanged") from None
  return text


def image(folder: str, file: str, alt: str) -> str:
  """``![alt](file)`` when ``folder/file`` exists; else a line saying it is drawn from the runs' workdirs (a plot
  of per-step curves, which records do not keep: ``--from_records`` into a new folder)."""
  if os.path.exists(os.path.join(folder, file)):
    return f"![{alt}]({file})"
  return f"({alt}: `{file}` is drawn from the runs' workdirs, not from {RECORDS_FILE}; not drawn here.)"


def runs_not_kept(output: str) -> str:
  """A section of the hand-written ``output/runs_not_kept.md`` (settings tried whose workdirs are gone, so in no
  table), or "" when there is none."""
  note = read_page(output, NOT_KEPT_NOTE).strip()
  return note and (f"\n## Runs not kept\n\nSettings tried whose workdirs are gone, so they are in no table above "
                   f"(hand-written in `{NOT_KEPT_NOTE}`, with the numbers their training printed):\n\n{note}\n")


def markdown_table(header: list[str], rows: list[list]) -> str:
  lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
  lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
  return "\n".join(lines)


def mean_std(values, digits: int = 3) -> str:
  """``mean ± std`` (sample standard deviation, e.g. over seeds) of the finite values, and how many are not."""
  values = np.asarray(values, np.float64)
  finite = values[np.isfinite(values)]
  if not finite.size:
    return "n/a"
  spread = finite.std(ddof=1) if finite.size > 1 else 0.0
  text = f"{finite.mean():.{digits}f} ± {spread:.{digits}f}"
  return text if finite.size == values.size else f"{text} ({values.size - finite.size} not finite)"


# ------------------------------------------------------------------------------ the machine stamp

def host_description(load_average: bool = False) -> str:
  """Device, host CPU, cores and memory; with ``load_average``, the 1-minute load average now (others' work
  skews timings)."""
  devices = jax.devices()
  memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
  device = f"{len(devices)} x {devices[0].device_kind}" if devices[0].platform != "cpu" else "CPU only"
  cores = usable_cores()
  cores_text = (f"{os.cpu_count()} cores" if cores == os.cpu_count()
                else f"{cores} of its {os.cpu_count()} cores (taskset)")
  load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
  return (f"{device}; host {cpu_name()}{cpu_vector_description()}, {cores_text}, {memory_gib:.0f} GiB"
          + (f"; 1-minute load average at start {load:.1f}" if load_average else ""))


def machine_description() -> str:
  """The stamp of a results page: ``host_description``, the versions of JAX, Flax and Optax, and today's date."""
  return f"{host_description()}; {versions()}; {datetime.date.today().isoformat()}"


def hardware() -> str:
  """Where a row's run trained, short (the form ``--hardware`` takes): ``1 x NVIDIA H200, 16 cores``."""
  devices = jax.devices()
  return f"{len(devices)} x {devices[0].device_kind}, {os.cpu_count()} cores"


def versions() -> str:
  import flax
  import optax
  return f"JAX {jax.__version__} (backend {jax.default_backend()}), flax {flax.__version__}, optax {optax.__version__}"


def usable_cores() -> int:
  """CPU cores this process may run on (``taskset`` narrows them; XLA's and PyTorch's thread pools follow)."""
  return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def cpu_name() -> str:
  return read_cpuinfo().get("model name") or platform.processor() or platform.machine()


def cpu_vector_description(cpuinfo: dict[str, str] | None = None) -> str:
  """`` (AVX2, FMA, 3.5 GHz)``: what the CPU's theoretical peak is computed from; empty where unreadable."""
  info = read_cpuinfo() if cpuinfo is None else cpuinfo
  flags = set(info.get("flags", "").split())
  if not flags:
    return ""
  isa = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "SSE"
  parts = [isa] + (["FMA"] if "fma" in flags else []) + (["BF16"] if "avx512_bf16" in flags else [])
  if "max MHz" in info:
    parts.append(f"{float(info['max MHz']) / 1e3:.2f} GHz")
  return f" ({', '.join(parts)})"


def read_cpuinfo() -> dict[str, str]:
  """The first processor's fields of /proc/cpuinfo (empty where unreadable), plus ``max MHz``: the highest
  clock any core reports there, or the rated maximum where the kernel exposes it (boost clocks)."""
  fields, megahertz = {}, []
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        name, _, value = (part.strip() for part in line.partition(":"))
        if name == "cpu MHz":
          megahertz.append(float(value))
        fields.setdefault(name, value)
  except (OSError, ValueError):
    return {}
  with contextlib.suppress(OSError, ValueError):
    megahertz.append(int(read_page("/sys/devices/system/cpu/cpu0/cpufreq", "cpuinfo_max_freq")) / 1e3)
  if megahertz:
    fields["max MHz"] = str(max(megahertz))
  return fields


# ------------------------------------------------------------------------------ runs and their commands

def run_metrics(workdir: str) -> list[dict]:
  """The records of a training run's ``metrics.jsonl``; a ``UserError`` naming the folder when it holds none."""
  if not RunDirectory(workdir).has(METRICS):
    raise UserError(f"{workdir} holds no metrics.jsonl: give the workdir of a training run (launch.py --workdir).")
  return read_metrics(workdir)


def launch(config: str, workdir: str, overrides: tuple[str, ...] = ()) -> list[str]:
  """Runs ``launch.py`` (resuming if ``workdir`` has checkpoints) with its progress output (a grid of cells can
  train for hours); returns the command for the record."""
  run_launch([f"--config={config}", f"--workdir={workdir}", *overrides])
  return ["python", "launch.py", f"--config={config}", f"--workdir={workdir}", *overrides]


def run_launch(arguments: list[str]) -> None:
  """``python launch.py ARGUMENTS`` in the repository; a failure is a ``UserError`` of one line (launch.py's
  own error is printed above it)."""
  result = subprocess.run([sys.executable, "launch.py", *arguments], cwd=REPO)
  if result.returncode:
    raise UserError(f"python launch.py {command_line(arguments)} exited with status {result.returncode} (its "
                    "error is printed above)")


def first_reaching(records: list[dict], name: str, threshold: float) -> dict | None:
  """The first record whose ``name`` is at least ``threshold``."""
  return next((record for record in records if record.get(name, -math.inf) >= threshold), None)


def flatten_config(tree) -> dict:
  """A config (``ConfigDict``, ``RunConfig`` or the dict of a ``config.json``) as ``{"a.b": value}``; tuples as
  lists."""
  if hasattr(tree, "record"):  # a RunConfig: its values as given
    tree = dict(tree.record)
  if not isinstance(tree, dict):
    tree = json.loads(tree.to_json_best_effort())
  flat = {}
  for key, value in tree.items():
    if isinstance(value, dict):
      flat.update({f"{key}.{name}": inner for name, inner in flatten_config(value).items()})
    else:
      flat[key] = list(value) if isinstance(value, tuple) else value
  return flat


def config_overrides(variant_config, run_config, ignored: tuple[str, ...] = ()) -> list[str]:
  """The ``--config.KEY=VALUE`` flags that turn ``variant_config`` (the variant as it is now) into ``run_config``
  (a run's saved config), for the fields the variant has, less ``ignored`` (where data lives, how it printed);
  a list value in Python's tuple syntax, as ``config_flags`` parses it."""
  now, run = flatten_config(variant_config), flatten_config(run_config)
  overrides = []
  for key, value in sorted(run.items()):
    if key in ignored or key not in now or now[key] == value:
      continue
    text = ("(" + ",".join(map(repr, value)) + ("," if len(value) == 1 else "") + ")" if isinstance(value, list)
            else str(value))
    overrides.append(f"--config.{key}={text}")
  return overrides


def launch_config(arguments: list[str]):
  """The ``ConfigDict`` ``launch.py ARGUMENTS`` trains (``--config=FILE[:VARIANT]`` and ``--config.KEY=VALUE``;
  other arguments ignored), parsed by ml_collections' parser on absl flags of its own: nothing global defined."""
  from absl import flags
  from ml_collections import config_flags
  argv = ["launch.py", *arguments]
  parsed = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, flag_values=parsed, lock_config=True, sys_argv=argv)
  parsed(argv, known_only=True)
  return parsed.config


def config_with_flags(config, arguments: list[str], leave_out: tuple[str, ...] = ()):
  """A copy of the ``ConfigDict`` ``config`` with the ``--config.KEY=VALUE`` flags among ``arguments`` set, parsed
  as ``launch.py`` parses them (ml_collections' parser; other arguments and the fields ``leave_out`` ignored); a
  ``UserError`` naming a flag that names no field or gives a value of the wrong type."""
  from absl import flags
  from ml_collections import config_flags
  overrides = [argument for argument in arguments if argument.startswith("--config.")
               and argument[len("--config."):].partition("=")[0] not in leave_out]
  if not overrides:
    return config
  argv = ["launch.py", *overrides]
  parsed = flags.FlagValues()
  try:
    config_flags.DEFINE_config_dict("config", copy.deepcopy(config), flag_values=parsed, lock_config=True,
                                    sys_argv=argv)
    parsed(argv, known_only=True)
  except flags.Error as error:
    raise UserError(f"{error}: give a value of the field's type") from None
  except (AttributeError, KeyError) as error:  # ml_collections' text: the field, and the likely one meant
    while isinstance(error, BaseException) and error.args:
      error = error.args[0]
    field, _, hint = str(error).partition("\n")
    raise UserError(f"{command_line(overrides)}: the config has no field {field}" + (f" ({hint.strip()})" if hint
                    else "") + "; leave the flag out or name a field of the config") from None
  return parsed.config


def portable_command(parts: list[str]) -> str:
  """``parts`` as a shell line without this machine's paths: ``--workdir=WORKDIR``, no TFDS data dir, and a
  source folder relative to the repository (e.g. ``../data/multi30k``)."""
  kept = []
  for part in parts:
    name, _, value = part.partition("=")
    if name == "--workdir":
      part = "--workdir=WORKDIR"
    elif name == "--config.task.data_dir":
      continue
    elif name == "--config.task.source_dir" and os.path.isabs(value):
      part = f"{name}={os.path.relpath(value, REPO)}"
    kept.append(part)
  return command_line(kept)


def command_line(parts: list[str]) -> str:
  return " ".join(shlex.quote(p) for p in parts)


# ------------------------------------------------------------------------------ plots

def panel_grid(num_panels: int) -> tuple[int, int]:
  """``(rows, columns)`` of a figure of ``num_panels`` panels: one row up to 4, then a grid (a forecaster's
  per-horizon errors read as a grid, not one long row)."""
  columns = max(1, min(num_panels, 4))
  return -(-num_panels // columns), columns


@contextlib.contextmanager
def figure(path: str, rows: int, columns: int, size: tuple[float, float], dpi: int = 110):
  """``with figure(path, rows, columns, (width, height)) as (figure, axes):`` a matplotlib figure of a grid of
  panels (``axes[row, column]``), laid out, written to ``path`` and closed at the end of the block."""
  import matplotlib
  matplotlib.use("Agg")  # no display: the pages are written on servers
  import matplotlib.pyplot as plt
  drawing, axes = plt.subplots(rows, columns, figsize=size, squeeze=False)
  try:
    yield drawing, axes
    drawing.tight_layout()
    drawing.savefig(path, dpi=dpi)
  finally:
    plt.close(drawing)


def plot_curves(runs: dict[str, list[dict]], metrics: list[str], path: str, title: str) -> None:
  """One panel per metric (``panel_grid``), one line per run (``name -> metric records``, as ``read_metrics``)."""
  rows, columns = panel_grid(len(metrics))
  with figure(path, rows, columns, (5 * columns, 3.6 * rows)) as (drawing, axes):
    for axis in axes.flat[len(metrics):]:
      axis.set_visible(False)
    for axis, metric in zip(axes.flat, metrics):
      for name, records in runs.items():
        points = [(record["step"], record[metric]) for record in records if metric in record]
        if points:
          axis.plot(*zip(*points), marker="." if len(points) < 30 else None, label=name)
      axis.set_xlabel("step")
      axis.set_title(metric)
      if "loss" in metric:
        axis.set_yscale("log")
      axis.grid(alpha=0.3)
      if axis.get_legend_handles_labels()[0]:
        axis.legend()
    drawing.suptitle(title)


# ------------------------------------------------------------------------------ comparing seeds of two runs

def student_t_two_sided_p(t: float, df: float) -> float:
  """P(|T| >= |t|) for Student's t with ``df`` (not necessarily whole) degrees of freedom:
  I_{df / (df + t^2)}(df / 2, 1 / 2), the regularized incomplete beta function (scipy comes with JAX)."""
  import scipy.special
  return float(scipy.special.betainc(df / 2.0, 0.5, df / (df + t * t)))


def welch_t_test(a, b) -> tuple[float, float, float]:
  """Welch's t-test of the means of two samples (seeds of two runs), each of at least 2 finite values (else a
  ValueError), without assuming equal variances.

  Returns ``(t, df, p)``: t = (mean(a) - mean(b)) / sqrt(var(a) / n_a + var(b) / n_b) with sample variances,
  its Welch-Satterthwaite degrees of freedom and the two-sided p-value from Student's t. Both samples constant:
  t = +-inf and p = 0 when the means differ, t = nan and p = 1 when they do not; df is then nan.
  """
  samples = [[float(value) for value in sample] for sample in (a, b)]
  for name, sample in zip("ab", samples):
    if len(sample) < 2 or not all(math.isfinite(value) for value in sample):
      raise ValueError(f"welch_t_test: sample {name}={sample!r} needs at least 2 values, all finite")
  means = [math.fsum(sample) / len(sample) for sample in samples]
  # The variance of each mean: the sample variance (n - 1 in the denominator) over n.
  mean_variances = [math.fsum((value - mean) ** 2 for value in sample) / (len(sample) - 1) / len(sample)
                    for sample, mean in zip(samples, means)]
  difference, variance = means[0] - means[1], sum(mean_variances)
  if variance == 0.0:
    return (math.copysign(math.inf, difference), math.nan, 0.0) if difference else (math.nan, math.nan, 1.0)
  t = difference / math.sqrt(variance)
  df = variance ** 2 / sum(v ** 2 / (len(sample) - 1) for v, sample in zip(mean_variances, samples))
  return t, df, student_t_two_sided_p(t, df)


def format_p_value(p: float) -> str:
  """``p = 0.093`` (three decimals), ``p < 0.001`` below that."""
  return "p < 0.001" if p < 0.001 else f"p = {p:.3f}"


def block_bootstrap_difference(errors_a: np.ndarray, errors_b: np.ndarray, mask: np.ndarray,
                               block_length: int, resamples: int = 2000,
                               seed: int = 0) -> dict[str, np.ndarray]:
  """MAE(a) - MAE(b) per horizon and its 95% percentile interval, resampling blocks of consecutive windows.

  ``errors_a``, ``errors_b``: ``[windows, H]`` absolute errors of two models on the same windows (0 where
  unmeasured); ``mask``: ``[windows, H]`` measured targets; ``block_length``: windows per block (the last may be
  shorter). Returns ``{"difference", "low", "high": [H]}``, the interval from ``resamples`` draws of as many
  blocks as there are, with replacement.
  """
  starts = np.arange(0, len(mask), block_length)
  block_errors = np.add.reduceat(errors_a - errors_b, starts, axis=0)  # [blocks, H]
  block_counts = np.add.reduceat(mask.astype(np.float64), starts, axis=0)
  draws = np.random.default_rng(seed).integers(0, len(starts), size=(resamples, len(starts)))
  with np.errstate(invalid="ignore", divide="ignore"):  # a draw of unmeasured blocks only: left out (NaN)
    resampled = block_errors[draws].sum(axis=1) / block_counts[draws].sum(axis=1)  # [resamples, H]
  low, high = np.nanpercentile(resampled, [2.5, 97.5], axis=0)
  return {"difference": block_errors.sum(0) / block_counts.sum(0), "low": low, "high": high}
