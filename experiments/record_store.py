"""The rows of a results page and the machine stamp they carry: ``RecordStore`` (``records.json`` beside the page,
so that it outlives its runs' workdirs), the files a page writes whole, and where a run trained.
"""
from __future__ import annotations

import contextlib
import datetime
import json
import math
import os
import platform

import jax

from transformer.data.files import write_atomically
from transformer.errors import UserError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMITTED = os.path.join(REPO, "experiments")  # the committed pages: experiments/<name>/RESULTS.md
RECORDS_FILE = "records.json"  # beside a page: its rows (RecordStore)
# The fields of a record and their JSON types; ``order`` may be missing (files before it).
RECORD_FIELDS = {"steps": int, "command": str, "machine": str, "values": dict}
JSON_TYPES = {dict: "an object", list: "a list", str: "a string", int: "a whole number", float: "a number",
              bool: "a boolean", type(None): "null"}


class RecordStore:
  """The rows of a results page, ``{"<row>": {"steps", "command", "machine", "values": {...}, "order"}}`` (``order``:
  the row's place, which the file's sorted keys lose), each replaced only by a run at least as long unless forced."""

  def __init__(self, folder: str, start_from: str | None = None, force: bool = False):
    """Reads ``folder/records.json``, else ``start_from/records.json`` (the committed page's): ``source``."""
    self.folder, self.force = folder, force
    self.path = os.path.join(folder, RECORDS_FILE)
    self.looked_at = [self.path] + ([os.path.join(start_from, RECORDS_FILE)] if start_from else [])
    self.source = next((path for path in self.looked_at if os.path.exists(path)), self.looked_at[-1])
    self.records: dict[str, dict] = read_records(self.source) if os.path.exists(self.source) else {}

  def require_rows(self, why: str) -> None:
    """Refuses a store without a file or rows: ``why`` (``--from_records``) would write a page of nothing."""
    fix = ("(nothing was written); restore it (git checkout -- FILE), or run without --from_records to record the "
           "runs first")
    if not os.path.exists(self.source):
      missing = " nor ".join(dict.fromkeys(self.looked_at))
      raise UserError(f"{why}: there is no {missing}, so no row to write the page from {fix}")
    if not self.records:
      raise UserError(f"{why}: {self.source} holds no rows, so no page to write from it {fix}")

  def check(self, new_steps: dict[str, int], force: bool | None = None) -> None:
    """Refuses to replace a row by a run of fewer steps (``new_steps``: row -> steps); call it before training."""
    if self.force if force is None else force:
      return
    shorter = [f"row {name!r} records a run of {self.records[name]['steps']} training steps, the new one "
               f"trained {steps}" for name, steps in new_steps.items()
               if name in self.records and steps < self.records[name]["steps"]]
    if shorter:
      raise UserError(f"{self.path}: {'; '.join(shorter)}. A committed row is only replaced by a run at least as "
                      "long: give --force to replace it anyway, another row name for a row of its own, or leave "
                      "out --update_committed to write a page of your own.")

  def add(self, name: str, *, steps: int, command: str, machine: str, values: dict, force: bool | None = None) -> None:
    """Records row ``name`` (``check`` first), in its place or after the others. Saved by ``save``."""
    self.check({name: steps}, force)
    order = self.records.get(name, {}).get("order")
    if order is None:  # a new row (or one of a file written without places)
      order = 1 + max((record.get("order", -1) for record in self.records.values()), default=-1)
    self.records[name] = {"steps": int(steps), "command": command, "machine": machine, "values": values, "order": order}

  def rename(self, name: str, new_name: str) -> None:
    self.records[new_name] = self.records.pop(name)  # the record keeps its place

  def save(self) -> None:
    """Writes ``records.json`` atomically; a store without rows creates no file (there is nothing to keep)."""
    if self.records or os.path.exists(self.path):
      write_text(self.folder, json.dumps(self.records, indent=1, sort_keys=True, allow_nan=True) + "\n", RECORDS_FILE)

  def __getitem__(self, name: str) -> dict:
    return self.records[name]

  def __contains__(self, name: str) -> bool:
    return name in self.records

  def __iter__(self):
    return iter(name for name, _ in self.items())

  def __len__(self) -> int:
    return len(self.records)

  def distinct(self, names, field: str = "machine") -> list:
    """The distinct ``record[field]`` (else ``record["values"][field]``) of the rows ``names``, first seen first."""
    found = [self[name][field] if field in self[name] else self[name]["values"].get(field) for name in names]
    return list(dict.fromkeys(value for value in found if value is not None))

  def items(self) -> list[tuple[str, dict]]:
    """``(name, record)`` in the order the rows were first added."""
    return sorted(self.records.items(), key=lambda item: item[1].get("order", math.inf))


def read_records(path: str) -> dict[str, dict]:
  """The rows of the record store ``path``; a one-line ``UserError`` naming the file (and row) when malformed."""
  fix = f"restore it from git (git checkout -- {path}) or delete it to record its rows again"
  try:
    text = read_text(*os.path.split(path))
    if not text.strip():  # our writes are atomic: a write cut short by something else (a copy, an editor)
      raise UserError(f"{path} is empty ({len(text.encode())} bytes), not a record store; {fix}")
    records = json.loads(text)
  except (UnicodeDecodeError, json.JSONDecodeError) as error:
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


def read_text(folder: str, name: str = "RESULTS.md") -> str:
  """The text of ``folder/NAME``; empty when there is none."""
  path = os.path.join(folder, name)
  if not os.path.exists(path):
    return ""
  with open(path) as f:
    return f.read()


def write_text(folder: str, text: str, name: str = "RESULTS.md") -> str:
  """Writes ``text`` as ``folder/NAME`` atomically (a kill mid-write leaves the old file whole); returns it."""
  os.makedirs(folder or ".", exist_ok=True)
  path = os.path.join(folder, name)
  try:
    write_atomically(path, text)
  except OSError as error:  # a folder made read-only since, say; a full disk is write_atomically's UserError
    raise UserError(f"cannot write {path} ({error.strerror or error}); the old file, if any, is unchanged") from None
  return text


def host_description(load_average: bool = False) -> str:
  """Device, host CPU, cores and memory; with ``load_average``, the load now (others' work skews timings)."""
  devices = jax.devices()
  memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
  device = f"{len(devices)} x {devices[0].device_kind}" if devices[0].platform != "cpu" else "CPU only"
  cores, all_cores = usable_cores(), os.cpu_count()
  cores_text = f"{cores} cores" if cores == all_cores else f"{cores} of its {all_cores} cores (taskset)"
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
  """The first processor's fields of /proc/cpuinfo (or none), and ``max MHz``: the highest clock seen or rated."""
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
    megahertz.append(int(read_text("/sys/devices/system/cpu/cpu0/cpufreq", "cpuinfo_max_freq")) / 1e3)
  if megahertz:
    fields["max MHz"] = str(max(megahertz))
  return fields
