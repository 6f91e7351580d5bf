"""Convert runs saved by older code to today's run format (``workdir.FORMAT_VERSION``), in place.

    python -m transformer.train.convert_run WORKDIR [WORKDIR ...]

The one home of what older runs looked like; the rest of the code reads today's format only. A run without a
``run_format.json`` is format 1 when its ``config.json`` has ``model_name``, else format 0 (``architecture``
chose between a Transformer section ``model`` and an RNN section ``rnn``; beam settings sat in ``task``).
Format 2 kept the best checkpoint in ``best/``; format 3 keeps it among ``checkpoints/`` (``move_best_checkpoint``).
Each rewritten file is kept as ``<file>.v<old format>``; checkpoints are not touched. Converting a converted
run does nothing, so the command can be run on a whole directory of runs (``/tmp/runs/*``) again and again.
"""
from __future__ import annotations

import copy
import dataclasses
import json
import os
import shutil
import sys

from transformer.data.files import write_atomically
from transformer.decode import DecodeSettings
from transformer.errors import WorkdirError, exit_on_user_error
from transformer.nn import model_spec
from transformer.train.config import model_section
from transformer.train.checkpoint import CHECKPOINTS
from transformer.train.workdir import (BEST, CONFIG, FORMAT, FORMAT_VERSION, MODEL_CONFIG, check_writable,
                                       read_format, write_format)

MOVED_TO_CLASSIFIER = ("num_classes", "pooling")  # ModelConfig's fields until ClassifierConfig took them


def upgrade_config(saved: dict) -> dict:
  """A saved config (a workdir's ``config.json``, a results row's settings) in today's shape.

  Configs saved before ``model_name`` existed held a Transformer section ``model`` and an RNN section ``rnn``,
  and ``architecture`` chose one: the chosen section becomes ``model``, less the fields its model no longer has
  (the classifier's ``num_classes`` and ``pooling`` moved to ``ClassifierConfig``), and ``architecture`` becomes
  ``model_name``. Configs saved before ``decode`` get one (``_upgrade_decode``). A config of today's shape comes
  back unchanged (as a copy).
  """
  upgraded = copy.deepcopy(dict(saved))
  _upgrade_decode(upgraded)
  if "model_name" in upgraded or "model" not in upgraded:
    return upgraded
  model_name = upgraded.pop("architecture", "transformer")
  rnn_section = upgraded.pop("rnn", {})
  section = rnn_section if model_name == "rnn" else upgraded["model"]
  fields = model_section(model_name).keys()
  upgraded["model_name"] = model_name
  upgraded["model"] = {name: value for name, value in section.items() if name in fields}
  return upgraded


def _upgrade_decode(config: dict) -> None:
  """Give ``config`` a ``decode`` section: translation configs saved before it kept ``task.beam_size`` and
  ``task.length_penalty`` (beam search, greedy for beam 1); the other fields get today's defaults."""
  if "decode" in config or "task" not in config:
    return
  task = config["task"] = dict(config["task"])
  decode = dataclasses.asdict(DecodeSettings())
  if "beam_size" in task:
    beam_size = task.pop("beam_size")
    decode.update(method="greedy" if beam_size == 1 else "beam", beam_size=beam_size)
  if "length_penalty" in task:
    decode["length_penalty"] = task.pop("length_penalty")
  config["decode"] = decode


def upgrade_model_config(saved: dict, model_name: str) -> dict:
  """A run's ``model_config.json`` in today's shape: Transformer runs saved the classifier's ``num_classes`` and
  ``pooling`` before they moved to ``ClassifierConfig``; a model whose config lacks them drops them. (Any other
  field today's config lacks stays, so that resuming names it as a difference rather than ignoring it.)"""
  fields = {field.name for field in dataclasses.fields(model_spec(model_name).config)}
  return {name: value for name, value in saved.items() if name in fields or name not in MOVED_TO_CLASSIFIER}


def saved_format(workdir: str, config: dict) -> int:
  """The format ``workdir`` is saved in: its marker's, else what its ``config`` (``config.json``) shows."""
  version = read_format(workdir)
  if version is not None:
    return version
  return 1 if "model_name" in config else 0


def _flat(tree: dict, prefix: str = "") -> dict:
  out = {}
  for name, value in tree.items():
    if isinstance(value, dict) and value:
      out.update(_flat(value, f"{prefix}{name}."))
    else:
      out[prefix + name] = value
  return out


def _names(fields: set, other: dict) -> list[str]:
  """Dotted field names, sorted; a section that ``other`` lacks altogether as ``section.*``."""
  whole = {name.split(".")[0] for name in fields if "." in name} - {name.split(".")[0] for name in other}
  return sorted({f"{name.split('.')[0]}.*" if name.split(".")[0] in whole else name for name in fields})


def describe_changes(old: dict, new: dict) -> str:
  """What became of ``old``'s fields in ``new``: the removed, added and changed dotted names."""
  old_flat, new_flat = _flat(old), _flat(new)
  removed, added = set(old_flat) - set(new_flat), set(new_flat) - set(old_flat)
  changed = sorted(name for name in set(old_flat) & set(new_flat) if old_flat[name] != new_flat[name])
  parts = []
  if removed:
    parts.append("removed " + ", ".join(_names(removed, new_flat)))
  if added:
    parts.append("added " + ", ".join(_names(added, old_flat)))
  if changed:
    parts.append("changed " + ", ".join(f"{name} ({old_flat[name]!r} -> {new_flat[name]!r})" for name in changed))
  return "; ".join(parts)


def move_best_checkpoint(workdir: str) -> str | None:
  """Format 2 kept the best checkpoint in ``best/<step>`` beside ``checkpoints/``; format 3 keeps every step in
  ``checkpoints/``, the best one carrying its metric. The best step's folder moves over; where ``checkpoints/``
  held the same step too (the same state, saved without the metric), that copy goes to ``best.v2/<step>.periodic``.
  ``best/`` is then renamed ``best.v2`` (nothing is deleted); returns the line that says so, None without a
  ``best/``."""
  best = os.path.join(workdir, BEST)
  if not os.path.isdir(best):
    return None
  checkpoints = os.path.join(workdir, CHECKPOINTS)
  os.makedirs(checkpoints, exist_ok=True)
  moved = sorted((name for name in os.listdir(best) if name.isdigit()), key=int)
  for step in moved:
    source, target = os.path.join(best, step), os.path.join(checkpoints, step)
    if os.path.isdir(target):
      os.rename(target, os.path.join(best, f"{step}.periodic"))
    shutil.copytree(source, f"{target}.converting")  # complete or absent: an interrupted copy is redone
    os.rename(f"{target}.converting", target)
  os.rename(best, f"{best}.v2")
  return (f"{BEST}/: step {', '.join(moved) or 'none'} into {CHECKPOINTS}/ (was kept as {BEST}.v2; delete it once "
          "the run loads)")


def _read_json(path: str) -> dict:
  try:
    with open(path) as f:
      return json.load(f)
  except json.JSONDecodeError as error:
    raise WorkdirError(f"{path} is not valid JSON ({error}); restore it from the run's copy before converting.") \
        from None


def _rewrite(path: str, old: dict, new: dict, version: int) -> str | None:
  """Write ``new`` to ``path`` (keeping the file as ``path.v<version>``) if it differs from ``old``; returns
  the line that says what changed, None when nothing did."""
  if new == old:
    return None
  backup = f"{path}.v{version}"
  if not os.path.exists(backup):  # a conversion interrupted before: the first backup holds the original
    shutil.copy2(path, backup)
  write_atomically(path, json.dumps(new, indent=2, sort_keys=True))
  return f"{os.path.basename(path)}: {describe_changes(old, new)} (was kept as {os.path.basename(backup)})"


def convert(workdir: str) -> list[str]:
  """Convert the run in ``workdir`` to ``FORMAT_VERSION``; returns what changed, one line each (empty: the
  run was already of today's format).

  Raises:
    WorkdirError: ``workdir`` holds no run (no ``config.json``), or one of a newer format.
  """
  config_path = os.path.join(workdir, CONFIG)
  if not os.path.isfile(config_path):
    raise WorkdirError(f"{workdir} holds no {CONFIG}: give the workdir of a training run.")
  config = _read_json(config_path)
  version = saved_format(workdir, config)
  if version == FORMAT_VERSION:
    return []
  check_writable(workdir, "convert_run rewrites the run's record in its workdir")
  if version > FORMAT_VERSION:
    raise WorkdirError(f"{workdir} is saved in run format {version}, newer than this code's {FORMAT_VERSION}; "
                       "update the code.")
  # Steps in order: the marker comes last, so an interrupted conversion is converted again from the start.
  upgraded = upgrade_config(config)
  changes = [_rewrite(config_path, config, upgraded, version)]
  model_config_path = os.path.join(workdir, MODEL_CONFIG)
  if os.path.isfile(model_config_path):
    model_config = _read_json(model_config_path)
    changes.append(_rewrite(model_config_path, model_config,
                            upgrade_model_config(model_config, upgraded.get("model_name", "transformer")), version))
  changes.append(move_best_checkpoint(workdir))
  write_format(workdir)
  return [f"format {version} -> {FORMAT_VERSION}"] + [line for line in changes if line] + [f"wrote {FORMAT}"]


def main(argv: list[str]) -> None:
  """Convert each workdir of ``argv`` (the command's arguments), printing what changed."""
  if not argv or any(arg.startswith("-") for arg in argv):
    sys.exit(f"usage: python -m transformer.train.convert_run WORKDIR [WORKDIR ...]\n{__doc__}")
  for workdir in argv:
    lines = exit_on_user_error(convert, workdir)
    print(f"{workdir}: " + ("; ".join(lines) if lines else f"already format {FORMAT_VERSION}, nothing to convert"),
          flush=True)


if __name__ == "__main__":
  main(sys.argv[1:])
