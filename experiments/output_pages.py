"""What the results pages whose rows rest on outputs committed beside them share (synthetic, language model,
Disaster Tweets and Beijing PM2.5, whose rows ``experiments.verify`` recomputes): the main, a run's command, how a
row is recorded with its run's training log (``logs/<row>.jsonl``) and the top of the page."""
from __future__ import annotations

import argparse
import os
import re
import shutil

from experiments import launching, pages, record_store, reruns
from transformer import read_run_config
from transformer.train.workdir import METRICS, MetricsLog, RunDirectory, read_records

LOGS = "logs"  # beside a page: each row's training log, the metrics.jsonl of the run it was recorded from


def make_page(parser: argparse.ArgumentParser, argv, committed: str, collect, render) -> str:
  """The page's text: ``pages.make_page`` of the folder ``committed``, ``--output_dir`` or
  ``<workdir_root>/results``, with ``collect(store, folder, args)`` and ``render(store, folder, args)``."""
  args = parser.parse_args(argv)
  return pages.make_page(args, committed, os.path.join(args.workdir_root, "results"),
                         lambda store, folder: collect(store, folder, args),
                         lambda store, folder: render(store, folder, args))


def training_command(config_file: str, variant: str, get_config, workdir: str | None, *flags: str) -> str:
  """The command that trains ``variant`` of ``config_file`` with ``flags``, paths made portable; given the run's
  ``workdir``, with a ``--config.<field>=<value>`` for each setting in which the run differs from
  ``get_config(variant)``, the variant today."""
  parts = ["python", "launch.py", f"--config={config_file}:{variant}", f"--workdir={workdir or 'WORKDIR'}", *flags]
  if workdir is not None:
    parts += launching.config_overrides(get_config(variant), read_run_config(workdir))
  return launching.portable_command(parts)


def add_row(store: record_store.RecordStore, name: str, steps: int, command: str, values: dict, row,
            header: list[str], columns: tuple[str, ...], *, workdir: str, run_key: str = "workdir_root") -> None:
  """Records row ``name`` of the run in ``workdir`` scored here today, and keeps its training log beside the page
  (``read_log``); ``values["reruns"]`` says what a rerun changed in ``columns`` of its ``row``
  (``reruns.history``)."""
  record = {"steps": steps, "command": command, "machine": record_store.machine_description(), "values": values}
  values["reruns"] = reruns.history(store.records.get(name), record, name, row, header, columns, run_key)
  store.add(name, **record)
  keep_log(store.folder, name, workdir)
  store.records[name]["log"] = os.path.relpath(log_path(store.folder, name), store.folder)  # what log_expected reads


def keep_log(folder: str, name: str, workdir: str) -> None:
  """Copies the training log of the run in ``workdir`` beside the page in ``folder``, as ``name``'s."""
  path = log_path(folder, name)
  os.makedirs(os.path.dirname(path), exist_ok=True)  # a name may hold folders (an ablation's ``<ablation>/<run>``)
  shutil.copyfile(RunDirectory(workdir).path(METRICS), path)


def log_path(folder: str, name: str) -> str:
  return os.path.join(folder, LOGS, f"{name}.jsonl")


def recorded_on(record: dict) -> str | None:
  """The date a row was recorded (``YYYY-MM-DD``, the end of its machine stamp); None for a stamp without one."""
  match = re.search(r"(\d{4}-\d\d-\d\d)$", record.get("machine", ""))
  return match.group(1) if match else None


def log_expected(record: dict) -> bool:
  """Whether a row was recorded with its training log (its ``log`` field, which ``add_row`` writes), so that the
  log is missing, not never kept, when it is not there."""
  return bool(record.get("log"))


def read_log(folder: str, name: str) -> MetricsLog | None:
  """Row ``name``'s training log kept in the page folder ``folder``; None where there is none (``log_expected``
  says whether there should be)."""
  path = log_path(folder, name)
  return MetricsLog(tuple(read_records(path, ("step",)))) if os.path.exists(path) else None


def heading(title: str, store: record_store.RecordStore, script: str, flags: str = "") -> str:
  """The top of a page: its title, the command that wrote it (one per workdir root of the rows, ``python -m
  experiments.SCRIPT --workdir_root=ROOT FLAGS``) and the machine stamps of the rows, up to "Machine: ...."."""
  names = list(store)
  written_by = " and ".join(f"`python -m experiments.{script} --workdir_root={root}{flags}`"
                            for root in store.distinct(names, "workdir_root"))
  return f"# {title}\n\nWritten by {written_by}; do not edit by hand.\n\nMachine: {'; '.join(store.distinct(names))}."
