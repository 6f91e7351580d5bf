"""Launching runs for the results pages and saying how they ran: ``launch.py`` as a subprocess, a run's metrics,
its config as the ``--config.KEY=VALUE`` flags that make it from a variant, its command without this machine's
paths, and the ablation grid (variants x seeds, identical configs shared, sweepable ones vmapped), which resumes.
"""
from __future__ import annotations

import copy
import dataclasses
import importlib
import json
import math
import os
import shlex
import subprocess
import sys
from typing import Callable

from experiments.record_store import REPO, RECORDS_FILE, RecordStore
from transformer.effects import Effect, field_effects
from transformer.errors import UserError
from transformer.tasks import TASK_CONFIGS
from transformer.train.replicas import SWEEPABLE
from transformer.train.run_config import RunConfig
from transformer.train.run_directory import METRICS, RunDirectory, read_metrics


def run_metrics(workdir: str) -> list[dict]:
  """The records of a training run's ``metrics.jsonl``; a ``UserError`` naming the folder when it holds none."""
  if not RunDirectory(workdir).has(METRICS):
    raise UserError(f"{workdir} holds no metrics.jsonl: give the workdir of a training run (launch.py --workdir).")
  return read_metrics(workdir)


def first_reaching(records: list[dict], name: str, threshold: float) -> dict | None:
  """The first record whose ``name`` is at least ``threshold``."""
  return next((record for record in records if record.get(name, -math.inf) >= threshold), None)


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


# ------------------------------------------------------------------------------ configs and commands

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


def _local_settings() -> tuple[str, ...]:
  """The settings of every run description that declare ``Effect.LOCAL`` (this machine's paths and display), over
  every task's section."""
  fields = {name for name, effect in field_effects(RunConfig).items() if effect is Effect.LOCAL}
  for config_class in TASK_CONFIGS.values():
    fields |= {f"task.{name}" for name, effect in field_effects(config_class).items() if effect is Effect.LOCAL}
  return tuple(sorted(fields))


# What no command that reproduces a run holds: where this machine keeps the data, and how a run printed.
LOCAL_SETTINGS = _local_settings()


def config_overrides(variant_config, run_config, ignored: tuple[str, ...] = LOCAL_SETTINGS) -> list[str]:
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


def config_disagreement(recorded: dict, config: dict) -> list[str]:
  """The fields both flat configs have, with different values (``str`` compared: JSON lists vs tuples)."""
  return sorted(key for key in recorded.keys() & config.keys()
                if json.dumps(recorded[key], default=str) != json.dumps(config[key], default=str))


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


# ------------------------------------------------------------------------------ the ablation grid

ABLATIONS = ("scaling", "heads", "positions", "norm_position", "norms", "regularization", "rnn_attention")
# Launch flags of this machine, or the grid's own sweep: not settings a cell's config (and so its record) holds.
NOT_TRAINING_SETTINGS = LOCAL_SETTINGS + ("sweep",)


@dataclasses.dataclass(frozen=True)
class Cell:
  """One variant of one ablation: ``config`` (``path:variant``) trained in ``workdir``."""
  ablation: str
  variant: str
  config: str
  workdir: str
  num_train_steps: int
  num_seeds: int
  task: str = "synthetic"  # a key of ablations_results.METRICS
  # Variants that differ only in SWEEPABLE fields train in one program: ``config`` (the group's first variant)
  # with ``--config.sweep=<sweep>``; this cell's seeds are replicas replica_offset, ... of that run.
  sweep: str = ""
  replica_offset: int = 0
  flat_config: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)  # its variant's config

  @property
  def name(self) -> str:
    return f"{self.ablation}/{self.variant}"

  @property
  def run(self) -> str:
    """The run's folder under the workdir root (``<ablation>/<variant>[+<variant>]``); cells may share one."""
    return "/".join(self.workdir.rstrip("/").split("/")[-2:])

  @property
  def launch_flags(self) -> tuple[str, ...]:
    """What the cell's run adds to ``--config`` (its sweep)."""
    return (f"--config.sweep={self.sweep}",) if self.sweep else ()

  def finished(self) -> bool:
    return RunDirectory(self.workdir).metrics().evaluation_at(self.num_train_steps) is not None


def ablation_module(name: str):
  if name not in ABLATIONS:
    raise UserError(f"unknown ablation {name!r}; choose from {', '.join(ABLATIONS)} or 'all'")
  return importlib.import_module(f"experiments.ablations.{name}")


def _config_key(flat: dict, leave_out: tuple[str, ...] = ()) -> str:
  return json.dumps({k: v for k, v in flat.items() if k not in leave_out}, sort_keys=True, default=str)


def _fresh_variants(name: str, suffix: str, launch_flags: tuple[str, ...], seen: set[str]):
  """``(fresh, repeats)`` of ablation ``name``: its variants whose config (JSON) is not in ``seen``, grouped by
  their config without its ``SWEEPABLE`` fields (``[(variant, flat config)]`` each), and variant -> the config
  (JSON) of an earlier variant that it equals. Adds the fresh configs to ``seen``."""
  fresh, repeats = {}, {}
  for variant in ablation_module(name).ABLATION.variants:
    flat = flatten_config(config_with_flags(ablation_module(name).get_config(variant + suffix), list(launch_flags),
                                            leave_out=NOT_TRAINING_SETTINGS))
    key = _config_key(flat)
    if key in seen:
      repeats[variant] = key
      continue
    seen.add(key)
    fresh.setdefault(_config_key(flat, leave_out=SWEEPABLE), []).append((variant, flat))
  return fresh, repeats


def expand_grid(names: list[str], task: str, root: str, ablations: tuple[str, ...] = ABLATIONS,
                launch_flags: tuple[str, ...] = ()) -> list[Cell]:
  """The cells of the ablations ``names``, in order. A variant whose config equals one earlier in
  ``ablations`` (all of them, so the choice does not depend on ``names``) gets that one's cell. Of the others,
  the variants of one ablation that differ only in ``SWEEPABLE`` fields (learning rate, warmup, label smoothing)
  share one run, vmapped over variants and seeds (``config.sweep``), in ``<ablation>/<variant>+<variant>``.
  Each cell keeps its variant's config as its runs train it, flattened (``flatten_config``): with the
  ``--config.KEY=VALUE`` of ``launch_flags`` set (but where data lives, ``NOT_TRAINING_SETTINGS``), so its step
  target follows ``--config.num_train_steps`` and a record made without such a flag does not stand in for it."""
  suffix = "" if task == "synthetic" else f",{task}"
  owner, cells = {}, {}  # config (JSON) -> the cell that trains it; (ablation, variant) -> its cell
  for name in ablations:
    fresh, repeats = _fresh_variants(name, suffix, launch_flags, set(owner))
    for group in fresh.values():
      variants = [variant for variant, _ in group]
      first, flat = group[0]
      swept = [field for field in SWEEPABLE if len({str(f[field]) for _, f in group}) > 1]
      sweep = ";".join(f"{field}={','.join(repr(f[field]) for _, f in group)}" for field in swept)
      num_seeds = flat["num_seeds"]
      for index, (variant, variant_flat) in enumerate(group):
        cell = Cell(name, variant, f"experiments/ablations/{name}.py:{first}{suffix}",
                    os.path.join(root, name, "+".join(variants)), flat["num_train_steps"], num_seeds, task, sweep,
                    index * num_seeds, variant_flat)
        owner[_config_key(variant_flat)] = cells[(name, variant)] = cell
    for variant, key in repeats.items():  # its own config names the run, unless only a sweep's command does
      shared = owner[key]
      config = shared.config if shared.sweep else f"experiments/ablations/{name}.py:{variant}{suffix}"
      cells[(name, variant)] = dataclasses.replace(shared, ablation=name, variant=variant, config=config)
  return [cells[(name, variant)] for name in ablations if name in names
          for variant in ablation_module(name).ABLATION.variants]


def find_record(cell: Cell, store: RecordStore) -> dict | None:
  """The record of ``cell``'s run in ``store``: its own, else another cell's of the same run (a shared
  reference), whose config agrees with the cell's; None if there is none."""
  candidates = [store[cell.name]] if cell.name in store else []
  candidates += [record for name, record in store.items() if name != cell.name
                 and record["values"]["run"] == cell.run and record["values"]["replica_offset"] == cell.replica_offset]
  for record in candidates:
    if (record["values"]["num_seeds"] == cell.num_seeds and record["steps"] == cell.num_train_steps
        and not config_disagreement(record["values"]["config"], cell.flat_config)):
      return record
  return None


def run_grid(cells: list[Cell], store: RecordStore, record: Callable[[Cell], tuple[int, str, dict]],
             train: Callable[[str, str, tuple], object] | None = launch, launch_flags: tuple[str, ...] = (),
             ignore_recorded: bool = False) -> None:
  """Train what is left of the grid and record every cell in ``store``: from its finished run (``record(cell)``:
  its steps, hardware and values, which hold its ``run``, ``replica_offset``, ``num_seeds`` and ``config``), else
  from the record of its run already there (unless ``ignore_recorded``; ``find_record``), else after training it
  with ``train(config, workdir, launch_flags)`` (``launch`` resumes from the latest checkpoint; ``None`` trains
  nothing, and a cell with neither a finished run nor a record is left unrecorded). A cell that would replace a
  record of more steps is refused (``RecordStore.check``) before anything trains."""
  stand_ins = {} if ignore_recorded else {
      cell.name: found for cell in cells if not cell.finished() for found in [find_record(cell, store)] if found}
  store.check({**{cell.name: cell.num_train_steps for cell in cells if train is not None or cell.finished()},
               **{name: found["steps"] for name, found in stand_ins.items()}})
  for cell in cells:
    flags = (*cell.launch_flags, *launch_flags)
    command = portable_command(["python", "launch.py", f"--config={cell.config}", f"--workdir={cell.workdir}",
                                *flags])
    if cell.name in stand_ins:  # under its own name and today's command (the record may be a shared run's)
      print(f"{cell.name}: its result recorded in {RECORDS_FILE} (no finished run in {cell.workdir})", flush=True)
      found = stand_ins[cell.name]
      store.add(cell.name, steps=found["steps"], command=command, machine=found["machine"], values=found["values"])
      continue
    if train is not None and not cell.finished():
      print(f"training {cell.name} in {cell.workdir}", flush=True)
      train(cell.config, cell.workdir, flags)
    if train is not None or cell.finished():
      steps, machine, values = record(cell)
      store.add(cell.name, steps=steps, command=command, machine=machine, values=values)
