"""Launching runs for the results pages and saying how they ran: ``launch.py``, a run's metrics, config flags and
portable command, and the ablation grid (variants x seeds, identical configs shared, sweepable ones vmapped).
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
from transformer.train.config import SWEEPABLE
from transformer.train.config import RunConfig
from transformer.train.workdir import METRICS, MetricsLog, RunDirectory


def run_metrics(workdir: str) -> MetricsLog:
  """A training run's ``metrics.jsonl``; a ``UserError`` naming the folder when it holds none."""
  if not RunDirectory(workdir).has(METRICS):
    raise UserError(f"{workdir} holds no metrics.jsonl: give the workdir of a training run (launch.py --workdir).")
  return RunDirectory(workdir).metrics()


def first_reaching(records: list[dict], name: str, threshold: float) -> dict | None:
  """The first record whose ``name`` is at least ``threshold``."""
  return next((record for record in records if record.get(name, -math.inf) >= threshold), None)


def launch(config: str, workdir: str, overrides: tuple[str, ...] = ()) -> list[str]:
  """Runs ``launch.py`` (resuming if ``workdir`` has checkpoints); returns the command for the record."""
  arguments = [f"--config={config}", f"--workdir={workdir}", *overrides]
  run_launch(arguments)
  return ["python", "launch.py", *arguments]


def run_launch(arguments: list[str]) -> None:
  """Runs ``python launch.py ARGUMENTS`` in the repository, its progress shown; a failure is a ``UserError``."""
  result = subprocess.run([sys.executable, "launch.py", *arguments], cwd=REPO)
  if result.returncode:
    raise UserError(f"python launch.py {command_line(arguments)} exited with status {result.returncode} (its "
                    "error is printed above)")


def flatten_config(tree) -> dict:
  """A config (``ConfigDict``, ``RunConfig`` or a ``config.json``'s dict) as ``{"a.b": value}``; tuples as lists."""
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


# What no command that reproduces a run holds: the settings declared ``Effect.LOCAL`` (where this machine keeps
# the data, how a run printed) of the run description and of every task's section.
LOCAL_SETTINGS = tuple(sorted({
    prefix + name for prefix, config_class in [("", RunConfig), *(("task.", task) for task in TASK_CONFIGS.values())]
    for name, effect in field_effects(config_class).items() if effect is Effect.LOCAL}))


def config_overrides(variant_config, run_config, ignored: tuple[str, ...] = LOCAL_SETTINGS) -> list[str]:
  """The ``--config.KEY=VALUE`` flags that turn ``variant_config`` into ``run_config`` (fields ``ignored`` left out)."""
  now, run = flatten_config(variant_config), flatten_config(run_config)
  return [f"--config.{key}={_flag_text(value)}" for key, value in sorted(run.items())
          if key not in ignored and key in now and now[key] != value]


def _flag_text(value) -> str:
  """A flag's value as ``config_flags`` parses it: a list in Python's tuple syntax."""
  if isinstance(value, list):
    return "(" + ",".join(map(repr, value)) + ("," if len(value) == 1 else "") + ")"
  return str(value)


def config_disagreement(recorded: dict, config: dict) -> list[str]:
  """The fields both flat configs have, with different values (``str`` compared: JSON lists vs tuples)."""
  return sorted(key for key in recorded.keys() & config.keys()
                if json.dumps(recorded[key], default=str) != json.dumps(config[key], default=str))


def _parsed_config(arguments: list[str], config=None):
  """``--config=FILE[:VARIANT]``'s config (or a copy of ``config``) with launch.py's flags set, on absl's own flags."""
  from absl import flags
  from ml_collections import config_flags
  argv = ["launch.py", *arguments]
  parsed = flags.FlagValues()
  define = config_flags.DEFINE_config_file if config is None else config_flags.DEFINE_config_dict
  define("config", copy.deepcopy(config), flag_values=parsed, lock_config=True, sys_argv=argv)
  parsed(argv, known_only=True)
  return parsed.config


def launch_config(arguments: list[str]):
  """The ``ConfigDict`` ``launch.py ARGUMENTS`` trains (other arguments than ``--config`` flags ignored)."""
  return _parsed_config(arguments)


def config_with_flags(config, arguments: list[str], leave_out: tuple[str, ...] = ()):
  """A copy of ``config`` with the ``--config.KEY=VALUE`` of ``arguments`` (but ``leave_out``) set as launch.py does."""
  from absl import flags
  overrides = [argument for argument in arguments if argument.startswith("--config.")
               and argument[len("--config."):].partition("=")[0] not in leave_out]
  if not overrides:
    return config
  try:
    return _parsed_config(overrides, config)
  except flags.Error as error:
    raise UserError(f"{error}: give a value of the field's type") from None
  except (AttributeError, KeyError) as error:  # ml_collections' text: the field, and the likely one meant
    while isinstance(error, BaseException) and error.args:
      error = error.args[0]
    field, _, hint = str(error).partition("\n")
    raise UserError(f"{command_line(overrides)}: the config has no field {field}" + (f" ({hint.strip()})" if hint
                    else "") + "; leave the flag out or name a field of the config") from None


def portable_command(parts: list[str]) -> str:
  """``parts`` as a shell line without this machine's paths: ``--workdir=WORKDIR``, no data dir, a relative source."""
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


def expand_grid(names: list[str], task: str, root: str, ablations: tuple[str, ...] = ABLATIONS,
                launch_flags: tuple[str, ...] = ()) -> list[Cell]:
  """The cells of the ablations ``names``: a variant whose config equals one earlier in ``ablations`` (all, so as not
  to depend on ``names``) gets its cell; those differing only in ``SWEEPABLE`` fields share one run (a sweep)."""
  suffix = "" if task == "synthetic" else f",{task}"
  owner, cells = {}, {}  # config (JSON) -> the cell that trains it; (ablation, variant) -> its cell
  seen = set()  # the configs (JSON) of the variants so far that are no repeat
  for name in ablations:
    module = ablation_module(name)
    fresh, repeats = {}, {}  # config less SWEEPABLE -> [(variant, flat config)]; variant -> the config it repeats
    for variant in module.ABLATION.variants:
      flat = flatten_config(config_with_flags(module.get_config(variant + suffix), list(launch_flags),
                                              leave_out=NOT_TRAINING_SETTINGS))
      key = _config_key(flat)
      if key in seen:
        repeats[variant] = key
        continue
      seen.add(key)
      fresh.setdefault(_config_key(flat, leave_out=SWEEPABLE), []).append((variant, flat))
    for group in fresh.values():
      variants = [variant for variant, _ in group]
      first, flat = group[0]
      swept = [field for field in SWEEPABLE if len({str(f[field]) for _, f in group}) > 1]
      sweep = ";".join(f"{field}={','.join(repr(f[field]) for _, f in group)}" for field in swept)
      for index, (variant, variant_flat) in enumerate(group):
        cell = Cell(name, variant, f"experiments/ablations/{name}.py:{first}{suffix}",
                    os.path.join(root, name, "+".join(variants)), flat["num_train_steps"], flat["num_seeds"], task,
                    sweep, index * flat["num_seeds"], variant_flat)
        owner[_config_key(variant_flat)] = cells[(name, variant)] = cell
    for variant, key in repeats.items():  # its own config names the run, unless only a sweep's command does
      shared = owner[key]
      config = shared.config if shared.sweep else f"experiments/ablations/{name}.py:{variant}{suffix}"
      cells[(name, variant)] = dataclasses.replace(shared, ablation=name, variant=variant, config=config)
  return [cells[(name, variant)] for name in ablations if name in names
          for variant in ablation_module(name).ABLATION.variants]


def find_record(cell: Cell, store: RecordStore) -> dict | None:
  """The record of ``cell``'s run in ``store`` (its own, else a shared run's) whose config agrees, or None."""
  candidates = [store[cell.name]] if cell.name in store else []
  candidates += [record for name, record in store.items() if name != cell.name
                 and record["values"]["run"] == cell.run and record["values"]["replica_offset"] == cell.replica_offset]
  return next((record for record in candidates if record["values"]["num_seeds"] == cell.num_seeds
               and record["steps"] == cell.num_train_steps
               and not config_disagreement(record["values"]["config"], cell.flat_config)), None)


def run_grid(cells: list[Cell], store: RecordStore, record: Callable[[Cell], tuple[int, str, dict]],
             train: Callable[[str, str, tuple], object] | None = launch, launch_flags: tuple[str, ...] = (),
             ignore_recorded: bool = False) -> None:
  """Trains what is left of the grid and records every cell in ``store``: ``record(cell)`` (steps, hardware, values
  with ``run``, ``replica_offset``, ``num_seeds``, ``config``) of its finished run, else its run's record there
  (unless ``ignore_recorded``), else trains it (``train=None``: leaves it unrecorded); shorter runs refused first."""
  stand_ins = {} if ignore_recorded else {
      cell.name: found for cell in cells if not cell.finished() for found in [find_record(cell, store)] if found}
  store.check({**{cell.name: cell.num_train_steps for cell in cells if train is not None or cell.finished()},
               **{name: found["steps"] for name, found in stand_ins.items()}})
  for cell in cells:
    flags = (*cell.launch_flags, *launch_flags)
    command = portable_command(["python", "launch.py", f"--config={cell.config}", f"--workdir={cell.workdir}", *flags])
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
