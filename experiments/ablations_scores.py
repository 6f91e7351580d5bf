"""The ablation grid's numbers: a cell's final per-seed metrics, divergence, training loss and (scaling ablation)
attention statistics, from its run or from its record; ``gather`` records every cell of the grid."""
from __future__ import annotations

import dataclasses
import math
from typing import Callable

import numpy as np

from experiments import launching, output_pages, record_store, stats
from experiments.ablations import common
from experiments.launching import Cell, find_record
from transformer.errors import UserError
from transformer.train.workdir import MetricsLog, read_metrics
from transformer.train.workdir import recorded_tokenizers

# Per task, the table's metrics as (name, heading, digits); the first is the one variants are compared on and
# plotted: exact match of greedy decoding on the synthetic task, BLEU of beam search on Multi30k validation.
_SECONDARY = (("eval/token_accuracy", "token accuracy", 3), ("eval/nll", "NLL (nats/token)", 3))
METRICS = {"synthetic": (("eval/exact_match", "exact match", 3), *_SECONDARY),
           "multi30k": (("eval/bleu", "BLEU", 2), *_SECONDARY)}


@dataclasses.dataclass
class CellResult:
  """A finished cell's numbers, as its record keeps them (``record_values``) and the page shows them."""
  cell: Cell
  per_seed: dict[str, np.ndarray]  # metric -> [seeds]
  diverged: int
  wall_seconds: float
  steps: int
  train_loss: list  # [[step, [training loss per seed]]]
  hardware: str = ""  # where the cell ran: this machine unless a record of the same run says elsewhere
  tokenizers: str = ""  # fingerprint(s) of the run's SentencePiece model(s); "" for runs that did not keep them
  command: str = ""  # the command of its run, as the page shows it
  attention: dict = dataclasses.field(default_factory=dict)  # replica -> ``attention_statistics``, if measured


def seed_values(record: dict, name: str, cell: Cell) -> np.ndarray:
  """``[seeds]``: ``<name>/seed_<i>`` of the cell's replicas (a sweep's run holds every variant's), else ``name``."""
  single = cell.num_seeds == 1 and not cell.sweep  # a run of a single replica logs ``name`` alone
  return np.array([record.get(name if single else f"{name}/seed_{cell.replica_offset + i}", np.nan)
                   for i in range(cell.num_seeds)], np.float64)


def log_values(log: MetricsLog, cell: Cell) -> dict:
  """What the record of ``cell`` holds that its run's training ``log`` gives: the steps, each seed's final metrics
  (``per_seed``: metric -> ``[seeds]``), how many seeds diverged, the wall time and the training losses
  (``[[step, [loss per seed]]]``)."""
  final = log.evaluation_at(cell.num_train_steps)
  if final is None:
    raise UserError(f"{cell.workdir} has no evaluation at step {cell.num_train_steps}: its run has not "
                    "finished; rerun the script to resume it")
  per_seed = {name: seed_values(final, name, cell).tolist() for name, _, _ in METRICS[cell.task] if name in final}
  train = [r for r in log.records if "train/loss" in r]
  losses = np.array([seed_values(r, "train/loss", cell) for r in train])
  skipped = sum((seed_values(r, "train/skipped_steps", cell) for r in train if "train/skipped_steps" in r),
                np.zeros(cell.num_seeds))
  diverged = ~np.isfinite(losses).all(axis=0) | above_the_line(losses, cell.task) | (skipped > 0)
  return {"steps": final["step"], "per_seed": per_seed, "diverged": int(diverged.sum()),
          "wall_seconds": final["wall_seconds"],
          "train_loss": [[r["step"], loss.tolist()] for r, loss in zip(train, losses)]}


def cell_result(cell: Cell, records: list[dict], hardware: str = "") -> CellResult:
  """The ``CellResult`` of the cell's run from its metric ``records``; ``hardware``: where it ran (default: here)."""
  values = log_values(MetricsLog(tuple(records)), cell)
  return CellResult(cell, {name: np.asarray(per_seed, np.float64) for name, per_seed in values["per_seed"].items()},
                    values["diverged"], values["wall_seconds"], values["steps"], values["train_loss"],
                    hardware or record_store.hardware(),
                    ", ".join(sorted(set(recorded_tokenizers(cell.workdir).values()))))


def above_the_line(losses: np.ndarray, task: str) -> np.ndarray:
  """``[seeds]``: whether each seed's losses (``[logs, seeds]``) stayed finite and end above ``DIVERGED_LOSS``."""
  return np.isfinite(losses).all(axis=0) & (losses[-1] > common.DIVERGED_LOSS[task])


def record_values(result: CellResult) -> dict:
  """A cell's record's ``values``: what writes its rows, plot and comparisons again, and the config it stands for."""
  cell = result.cell
  values = {"run": cell.run, "replica_offset": cell.replica_offset, "num_seeds": cell.num_seeds,
            "per_seed": {name: values.tolist() for name, values in result.per_seed.items()},
            "diverged": result.diverged, "wall_seconds": result.wall_seconds, "tokenizers": result.tokenizers,
            "train_loss": result.train_loss, "config": cell.flat_config}
  if result.attention:
    values["attention"] = {str(replica): statistics for replica, statistics in result.attention.items()}
  return values


def recorded_result(cell: Cell, record: dict) -> CellResult:
  """The ``CellResult`` of a cell's record (``RecordStore``), as ``cell``'s."""
  values = record["values"]
  attention = {int(replica): statistics for replica, statistics in values.get("attention", {}).items()}
  return CellResult(cell, {name: np.asarray(per_seed, np.float64) for name, per_seed in values["per_seed"].items()},
                    values["diverged"], values["wall_seconds"], record["steps"], values["train_loss"],
                    record["machine"], values.get("tokenizers", ""), record.get("command", ""), attention)


def gather(cells: list[Cell], store: record_store.RecordStore,
           train: Callable[[str, str, tuple], object] | None = launching.launch, launch_flags: tuple[str, ...] = (),
           ignore_recorded: bool = False, hardware: str = "") -> None:
  """``launching.run_grid`` of the ablation grid (``hardware``: where the finished runs trained, default: here)."""
  def record(cell: Cell) -> tuple[int, str, dict]:
    result = cell_result(cell, read_metrics(cell.workdir), hardware)
    same_run = find_record(cell, store)
    if same_run and same_run["values"]["wall_seconds"] == result.wall_seconds:  # recorded from this run
      result.hardware = same_run["machine"]
      result.tokenizers = result.tokenizers or same_run["values"].get("tokenizers", "")
    if cell.ablation == "scaling":
      result.attention = {replica: attention_statistics(cell.workdir, cell.replica_offset + replica)
                          for replica in range(cell.num_seeds)}
    output_pages.keep_log(store.folder, cell.run, cell.workdir)  # cells sharing a run share its log  # cells sharing a run share its log
    return result.steps, result.hardware, record_values(result)
  launching.run_grid(cells, store, record, train, launch_flags, ignore_recorded)


def recorded_results(cells: list[Cell], store: record_store.RecordStore):
  """``(results, unfinished)``: ablation -> its cells' recorded ``CellResult``s, and the cells without a record."""
  records = {cell.name: find_record(cell, store) for cell in cells}
  references = {cell.ablation: cell.name for cell in reversed(cells)}  # each ablation's first cell
  results = {}
  for cell in cells:  # an ablation whose reference has no record has no table
    if records[cell.name] is not None and records[references[cell.ablation]] is not None:
      results.setdefault(cell.ablation, []).append(recorded_result(cell, records[cell.name]))
  return results, tuple(name for name, record in records.items() if record is None)


def first_pairs(batches, count: int, pad: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
  """The split's first ``count`` (source, target) pairs from its evaluation ``batches``, padding removed."""
  pairs = []  # (position in the split, source, target)
  for batch in batches:
    rows = np.asarray(batch["source"]), np.asarray(batch["target"])
    # Token batches group sentences by length (``index``: their place) and end in filler rows (index -1, padding).
    indices = np.asarray(batch["index"]) if "index" in batch else len(pairs) + np.arange(len(rows[0]))
    pairs.extend((index, source[source != pad], target[target != pad])
                 for index, source, target in zip(indices, *rows) if index >= 0 and np.any(source != pad))
  pairs = sorted(pairs, key=lambda pair: pair[0])[:count]
  return [pair[1] for pair in pairs], [pair[2] for pair in pairs]


def attention_statistics(workdir: str, replica: int, count: int = 64) -> dict[str, tuple[float, float, float]]:
  """Per attention kind: mean row entropy, that of uniform rows (nats), and the share of rows with a weight > 0.9."""
  import transformer
  model = transformer.load(workdir, checkpoint="latest", replica=replica)
  sources, targets = first_pairs(model.task.eval_batches(count), count, model.model_config.pad_id)
  rows = {}  # kind -> [(entropy, uniform entropy, saturated) per row of one map]
  for maps in model.attention_weights(sources, targets):
    for (kind, _), weights in maps.items():  # [heads, q_length, kv_length]
      entropy = -np.sum(np.where(weights > 0, weights * np.log(np.maximum(weights, 1e-30)), 0.0), axis=-1)
      queries, keys = weights.shape[1:]  # a decoder query sees the keys up to its own position
      valid_keys = np.arange(1, queries + 1) if kind == "decoder_self" else np.full(queries, keys)
      uniform = np.broadcast_to(np.log(valid_keys), entropy.shape)
      rows.setdefault(kind, []).append((entropy.ravel(), uniform.ravel(), (weights.max(axis=-1) > 0.9).ravel()))
  return {kind: tuple(float(np.concatenate(column).mean()) for column in zip(*maps)) for kind, maps in rows.items()}


def comparison(result: CellResult, reference: CellResult) -> str:
  """One sentence on ``result`` against ``reference`` in the first metric: the difference, its screen and Welch's t."""
  metric, heading, digits = METRICS[result.cell.task][0]
  a, b = result.per_seed.get(metric), reference.per_seed.get(metric)
  if a is None or b is None or not (np.isfinite(a).all() and np.isfinite(b).all()):
    return f"{result.cell.variant}: not comparable (missing or non-finite values)"
  difference, spread = a.mean() - b.mean(), min(a.size, b.size) > 1  # the screen alone can pass at p > 0.05
  error = math.sqrt(a.var(ddof=1) / a.size + b.var(ddof=1) / b.size) if spread else 0.0
  verdict = ("larger than the spread of seeds" if abs(difference) > 2 * error
             else "within the spread of seeds: no conclusion") + (f"; {stats.welch_text(a, b)}" if spread else "")
  return (f"{result.cell.variant}: {difference:+.{digits}f} {heading} against {reference.cell.variant} "
          f"(standard error {error:.{digits}f}; {verdict})")


def attention_rows(result: CellResult) -> list[list]:
  """The cell's rows of the attention table (mean ± std over its seeds); none where it was not measured."""
  rows = []
  for kind in ("encoder_self", "decoder_self", "cross") if result.attention else ():
    entropy, uniform, saturated = np.array([result.attention[r][kind] for r in sorted(result.attention)]).T
    rows.append([result.cell.name, kind, stats.mean_std(entropy, 2), f"{uniform.mean():.2f}",
                 stats.mean_std(saturated, 3)])
  return rows
