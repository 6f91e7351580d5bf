"""What changing a setting does to a run, declared on the setting itself.

Every field of the run description (``RunConfig`` and its sections: model, task, optimizer, decode) has an
``Effect`` in its dataclass metadata (``setting(default, effect)``; a field without one changes results). The
rules about settings derive from it, in one place each: which differences between a command and a run's record
are refused, accepted and recorded, or ignored (``transformer.train.workdir.config_differences``), and which
settings a command that reproduces a run leaves out (``RunConfig.fields_with``).
"""
from __future__ import annotations

import dataclasses
import enum


class Effect(enum.Enum):
  """What a setting changes; the kinds a resumed or evaluated run treats alike."""
  RESULTS = "results"  # what is trained: another value in the same workdir needs config.accept_changes
  EVALUATION = "evaluation"  # what evaluation scores or how it decodes, not what is trained: accepted, recorded
  LAYOUT = "layout"  # how the same training is laid out on devices or recomputed: accepted, recorded
  BOOKKEEPING = "bookkeeping"  # how often a run logs, evaluates and saves, and what it keeps: free, not recorded
  LOCAL = "local"  # this machine's paths and display: free, not recorded, and left out of a reproducing command

  @property
  def accepted(self) -> bool:
    """Whether a resumed or evaluated run takes another value without ``config.accept_changes``."""
    return self is not Effect.RESULTS

  @property
  def recorded(self) -> bool:
    """Whether training on with another value goes to the run's history (``config_history.jsonl``)."""
    return self in (Effect.RESULTS, Effect.EVALUATION, Effect.LAYOUT)


def setting(default, effect: Effect = Effect.RESULTS):
  """A dataclass field with ``default`` and its ``effect`` in the metadata (``effect_of`` reads it)."""
  return dataclasses.field(default=default, metadata={"effect": effect})


def effect_of(field: dataclasses.Field, default: Effect = Effect.RESULTS) -> Effect:
  """The ``Effect`` a field declares; ``default`` (its section's) when it declares none."""
  return field.metadata.get("effect", default)


def field_effects(config_class: type, prefix: str = "", default: Effect = Effect.RESULTS) -> dict[str, Effect]:
  """``{prefix + field name: Effect}`` of each field of the dataclass ``config_class``."""
  return {prefix + field.name: effect_of(field, default) for field in dataclasses.fields(config_class)}
