"""The replicas one compiled program trains with ``jax.vmap``: seeds, and the variants of ``config.sweep``."""
from __future__ import annotations

import dataclasses

from transformer.errors import ConfigError

# Fields whose variants can share one vmapped program: they enter the train step as per-replica numbers
# (the model's own fields change its code or shapes, so their variants are separate runs).
SWEEPABLE = ("optimizer.learning_rate", "optimizer.warmup_steps", "label_smoothing")
SCHEDULE_FIELDS = ("optimizer.learning_rate", "optimizer.warmup_steps")  # swept: a schedule per variant


@dataclasses.dataclass(frozen=True)
class Replicas:
  """The replicas one program trains (``jax.vmap``): ``num_seeds`` seeds of each variant of ``sweep``
  (``field -> values``, zipped). Replica ``r`` is variant ``r // num_seeds`` with seed ``seed + r % num_seeds``,
  so every variant sees the same seeds."""
  num_seeds: int = 1
  sweep: tuple[tuple[str, tuple[float, ...]], ...] = ()
  text: str = ""  # config.sweep as written, for messages

  @classmethod
  def parse(cls, text: str, num_seeds: int) -> Replicas:
    """``text``: ``"optimizer.learning_rate=1e-3,3e-3;label_smoothing=0,0.1"`` gives two variants, the first with
    learning rate 1e-3 and no label smoothing; ``""``, none.

    Raises:
      ConfigError: a field not in ``SWEEPABLE``, a value that is not a number, or fields of unequal lengths.
    """
    sweep = {}
    for part in filter(None, (part.strip() for part in text.split(";"))):
      field, _, values = part.partition("=")
      field = field.strip()
      if field not in SWEEPABLE:
        raise ConfigError(f"config.sweep={text!r}: {field!r} cannot be swept in one program; choose from "
                          f"{list(SWEEPABLE)} (other fields change the model's code or shapes: run each variant "
                          "on its own).")
      try:
        sweep[field] = tuple(float(value) for value in values.split(","))
      except ValueError:
        raise ConfigError(f"config.sweep={text!r}: the values of {field} must be numbers separated by commas, "
                          f"e.g. {field}=0.001,0.003.") from None
    lengths = {field: len(values) for field, values in sweep.items()}
    if len(set(lengths.values())) > 1:
      raise ConfigError(f"config.sweep={text!r}: its fields are zipped into variants, so they need as many "
                        f"values each; got {lengths}.")
    return cls(num_seeds, tuple(sweep.items()), text)

  @property
  def swept(self) -> dict[str, tuple[float, ...]]:
    return dict(self.sweep)

  @property
  def num_variants(self) -> int:
    return len(self.sweep[0][1]) if self.sweep else 1

  @property
  def count(self) -> int:
    """Replicas trained in one program: ``num_variants * num_seeds``."""
    return self.num_variants * self.num_seeds

  @property
  def sweeps_schedule(self) -> bool:
    """Whether the learning-rate schedule differs between variants (``SCHEDULE_FIELDS`` swept)."""
    return any(field in SCHEDULE_FIELDS for field in self.swept)

  def variant_names(self) -> list[str]:
    """Each variant by its values, as printed: ``variant_0 (optimizer.learning_rate=0.002, label_smoothing=0)``
    (its metrics keep the ``/variant_0`` suffix); none without a sweep."""
    return [f"variant_{index} (" + ", ".join(f"{field}={values[index]:g}" for field, values in self.sweep) + ")"
            for index in range(self.num_variants)] if self.sweep else []

  def seed_offsets(self) -> list[int]:
    """Each replica's seed, less the run's ``seed``."""
    return [replica % self.num_seeds for replica in range(self.count)]

  def settings(self) -> dict[str, tuple]:
    """What each replica's train and eval steps get as ``settings``, one value per replica: ``variant`` (its
    index, when the schedule is swept: the step picks that variant's learning rate) and the swept
    ``label_smoothing``. ``{}`` without a sweep."""
    values = {}
    if self.sweeps_schedule:
      values["variant"] = tuple(index for index in range(self.num_variants) for _ in range(self.num_seeds))
    if "label_smoothing" in self.swept:
      values["label_smoothing"] = tuple(value for value in self.swept["label_smoothing"]
                                        for _ in range(self.num_seeds))
    return values
