"""Run the ablation grid (variants x seeds) and write its results page: RESULTS.md and one plot per ablation.

    python -m experiments.ablations_results --workdir_root=/tmp/ablations                   # all seven
    python -m experiments.ablations_results --ablation=heads,norms --workdir_root=/tmp/ablations
    python -m experiments.ablations_results --workdir_root=/tmp/ablations --update_committed
    python -m experiments.ablations_results --task=multi30k --workdir_root=/tmp/ablations_m30k \\
        --launch_flag=--config.task.source_dir=../shared/data/multi30k
    python -m experiments.ablations_results --from_records --update_committed   # the page again, no workdirs

The ablations are the config files in ``experiments/ablations/`` (``ABLATIONS``); each cell of the grid is one
``launch.py`` run of a variant that trains ``config.num_seeds`` seeds in one program (``jax.vmap``), in
``<workdir_root>/<ablation>/<variant>``. Variants with the same config (the reference model appears in several
ablations) share the cell of the first. The grid resumes: a cell whose ``metrics.jsonl`` has its final
evaluation is not run again, and any other is launched, which resumes from its latest checkpoint.

Each finished cell's numbers (final metrics per seed, training loss curve, divergence, wall time, hardware,
attention statistics, its flattened config, its command) are a record of ``records.json`` beside the page
(``report.RecordStore``), and the page is written from those records, so it outlives the workdirs: a cell whose
run is absent or unfinished under ``--workdir_root`` is read from the record of the same run (the output
folder's; a new folder starts from the committed page's) when the record's config agrees with the cell's on
every field both have, and trained only when there is none (``--ignore_recorded`` trains it anyway).
``--notrain`` trains nothing: the page holds the finished and recorded cells and names the others;
``--from_records`` reads no workdir at all. Each row names the hardware its cell trained on: this machine's,
unless a record of the same run says elsewhere or ``--hardware`` names it (workdirs copied back from a GPU
machine).

Every number on the page is the mean +- standard deviation over the seeds of a cell's final evaluation
(``eval/<metric>/seed_i``). The page goes to ``--output_dir``, by default ``<workdir_root>/results/``; the
committed page ``experiments/ablations/`` (``experiments/ablations/multi30k/`` for ``--task=multi30k``) only with
``--update_committed``, and then only when no cell trains fewer steps than the committed row records.
"""
from __future__ import annotations

import dataclasses
import importlib
import json
import math
import os
from typing import Callable

import numpy as np

from experiments import report
from experiments.ablations import common
from transformer.tasks.run_config import SWEEPABLE
from transformer.train.workdir import recorded_tokenizers
from transformer.train.writers import read_metrics

ABLATIONS = ("scaling", "heads", "positions", "norm_position", "norms", "regularization", "rnn_attention")
DEFAULT_ROOT = "/tmp/ablations"
# Per task, the table's metrics as (name, heading, digits); the first is the one variants are compared on and
# plotted: exact match of greedy decoding on the synthetic task, BLEU of beam search on Multi30k validation.
METRICS = {
    "synthetic": (("eval/exact_match", "exact match", 3), ("eval/token_accuracy", "token accuracy", 3),
                  ("eval/nll", "NLL (nats/token)", 3)),
    "multi30k": (("eval/bleu", "BLEU", 2), ("eval/token_accuracy", "token accuracy", 3),
                 ("eval/nll", "NLL (nats/token)", 3)),
}
ATTENTION_HEADER = ["run", "attention", "entropy (nats)", "uniform entropy (nats)", "rows with max weight > 0.9"]


@dataclasses.dataclass(frozen=True)
class Cell:
  """One variant of one ablation: ``config`` (``path:variant``) trained in ``workdir``."""
  ablation: str
  variant: str
  config: str
  workdir: str
  num_train_steps: int
  num_seeds: int
  task: str = "synthetic"  # a key of METRICS
  # Variants that differ only in SWEEPABLE fields train in one program: ``config`` (the group's first variant)
  # with ``--config.sweep=<sweep>``; this cell's seeds are replicas replica_offset, ... of that run.
  sweep: str = ""
  replica_offset: int = 0

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


def cell_config(cell: Cell) -> dict:
  """The cell's own variant config, flattened (``report.flatten_config``)."""
  suffix = "" if cell.task == "synthetic" else f",{cell.task}"
  return report.flatten_config(ablation_module(cell.ablation).get_config(cell.variant + suffix))


def ablation_module(name: str):
  if name not in ABLATIONS:
    raise report.UserError(f"unknown ablation {name!r}; choose from {', '.join(ABLATIONS)} or 'all'")
  return importlib.import_module(f"experiments.ablations.{name}")


def _config_key(flat: dict, leave_out: tuple[str, ...] = ()) -> str:
  return json.dumps({k: v for k, v in flat.items() if k not in leave_out}, sort_keys=True, default=str)


def expand_grid(names: list[str], task: str, root: str, ablations: tuple[str, ...] = ABLATIONS) -> list[Cell]:
  """The cells of the ablations ``names``, in order. A variant whose config equals one earlier in
  ``ablations`` (all of them, so the choice does not depend on ``names``) gets that one's cell. Of the others,
  the variants of one ablation that differ only in ``SWEEPABLE`` fields (learning rate, warmup, label smoothing) share
  one run, vmapped over variants and seeds (``config.sweep``), in ``<ablation>/<variant>+<variant>``."""
  suffix = "" if task == "synthetic" else f",{task}"
  owner = {}  # config (JSON) -> the cell that trains it
  cells = {}
  for name in ablations:
    module = ablation_module(name)
    fresh = {}  # config without its sweepable fields (JSON) -> [(variant, flat config)] of configs not seen before
    repeats = {}  # variant -> the config (JSON) of an earlier variant of this ablation that it equals
    for variant in module.ABLATION.variants:
      flat = report.flatten_config(module.get_config(variant + suffix))
      key = _config_key(flat)
      if key in owner or any(key == _config_key(f) for group in fresh.values() for _, f in group):
        repeats[variant] = key
        continue
      fresh.setdefault(_config_key(flat, leave_out=SWEEPABLE), []).append((variant, flat))
    for group in fresh.values():
      variants = [variant for variant, _ in group]
      first, flat = group[0]
      swept = [field for field in SWEEPABLE if len({str(f[field]) for _, f in group}) > 1]
      sweep = ";".join(f"{field}={','.join(repr(f[field]) for _, f in group)}" for field in swept)
      num_seeds = flat["num_seeds"]
      for index, (variant, variant_flat) in enumerate(group):
        cell = Cell(name, variant, f"experiments/ablations/{name}.py:{first}{suffix}",
                    os.path.join(root, name, "+".join(variants)), flat["num_train_steps"], num_seeds, task, sweep,
                    index * num_seeds)
        owner[_config_key(variant_flat)] = cells[(name, variant)] = cell
    for variant, key in repeats.items():  # its own config names the run, unless only a sweep's command does
      shared = owner[key]
      config = shared.config if shared.sweep else f"experiments/ablations/{name}.py:{variant}{suffix}"
      cells[(name, variant)] = dataclasses.replace(shared, ablation=name, variant=variant, config=config)
  return [cells[(name, variant)] for name in ablations if name in names
          for variant in ablation_module(name).ABLATION.variants]


def final_evaluation(records: list[dict], num_train_steps: int) -> dict | None:
  """The evaluation record at ``num_train_steps`` (None while the run has not finished)."""
  done = [r for r in records if r.get("step") == num_train_steps and any(k.startswith("eval/") for k in r)]
  return done[-1] if done else None


def run_finished(workdir: str, num_train_steps: int) -> bool:
  return bool(os.path.exists(os.path.join(workdir, "metrics.jsonl"))
              and final_evaluation(read_metrics(workdir), num_train_steps))


def cell_finished(cell: Cell) -> bool:
  return run_finished(cell.workdir, cell.num_train_steps)


def run_grid(cells: list[Cell], train: Callable[[str, str, tuple], object] | None = report.launch,
             launch_flags: tuple[str, ...] = (), recorded: frozenset[str] = frozenset()) -> dict[str, list[str]]:
  """Train every cell that has not finished (``train(config, workdir, launch_flags)``, by default
  ``report.launch``, which resumes from the latest checkpoint), except those named in ``recorded`` (their
  result comes from their record); ``train=None`` trains nothing. Returns cell name -> its launch command."""
  commands = {}
  for cell in cells:
    if cell.name in recorded:
      print(f"{cell.name}: its result recorded in {report.RECORDS_FILE} (no finished run in {cell.workdir})",
            flush=True)
    if cell.name not in recorded and train is not None and not cell_finished(cell):
      print(f"training {cell.name} in {cell.workdir}", flush=True)
      train(cell.config, cell.workdir, (*cell.launch_flags, *launch_flags))
    commands[cell.name] = ["python", "launch.py", f"--config={cell.config}", f"--workdir={cell.workdir}",
                           *cell.launch_flags, *launch_flags]
  return commands


def _own_replicas(records: list[dict], offset: int, count: int) -> list[dict]:
  """Records of a run of several variants as the cell's own: its replicas ``offset .. offset + count - 1`` as
  ``<name>/seed_0 ..``, the other replicas (and the run's per-variant means) dropped, and each mean over the
  cell's replicas only."""
  own = []
  for record in records:
    kept = {key: value for key, value in record.items() if "/seed_" not in key and "/variant_" not in key}
    for key, value in record.items():
      name, marker, index = key.rpartition("/seed_")
      if marker and offset <= int(index) < offset + count:
        kept[f"{name}/seed_{int(index) - offset}"] = value
    names = {key.rsplit("/seed_", 1)[0] for key in kept if "/seed_" in key}
    kept.update({name: float(np.mean([kept[f"{name}/seed_{i}"] for i in range(count)])) for name in names})
    own.append(kept)
  return own


def read_cell(cell: Cell) -> list[dict]:
  """The cell's metric records; for a cell of a sweep, its own replicas as its seeds."""
  if cell.sweep:
    return _own_replicas(read_metrics(cell.workdir), cell.replica_offset, cell.num_seeds)
  return read_metrics(cell.workdir)


@dataclasses.dataclass
class CellResult:
  """Per-seed values of a finished cell."""
  cell: Cell
  per_seed: dict[str, np.ndarray]  # metric -> [seeds]
  diverged: int
  wall_seconds: float
  steps: int
  records: list[dict]  # the metric records; read back from its record, only the training loss
  hardware: str = ""  # where the cell ran: this machine unless a record of the same run says elsewhere
  tokenizers: str = ""  # fingerprint(s) of the run's SentencePiece model(s); "" for runs that did not keep them


def seed_values(record: dict, name: str, num_seeds: int) -> np.ndarray:
  if num_seeds == 1:
    return np.array([record.get(name, np.nan)], np.float64)
  return np.array([record.get(f"{name}/seed_{i}", np.nan) for i in range(num_seeds)], np.float64)


def cell_result(cell: Cell, records: list[dict], hardware: str = "") -> CellResult:
  """The cell's final per-seed metrics and divergence count; ``hardware``: where it ran (default: here)."""
  final = final_evaluation(records, cell.num_train_steps)
  if final is None:
    raise report.UserError(f"{cell.workdir} has no evaluation at step {cell.num_train_steps}: its run has not "
                           "finished; rerun the script to resume it")
  per_seed = {name: seed_values(final, name, cell.num_seeds) for name, _, _ in METRICS[cell.task] if name in final}
  train = [r for r in records if "train/loss" in r]
  last_loss = seed_values(train[-1], "train/loss", cell.num_seeds)
  skipped = sum(seed_values(r, "train/skipped_steps", cell.num_seeds) for r in train
                if "train/skipped_steps" in r) if any("train/skipped_steps" in r for r in train) else 0.0
  losses = np.array([seed_values(r, "train/loss", cell.num_seeds) for r in train])
  diverged = ((~np.isfinite(losses)).any(axis=0) | (last_loss > common.DIVERGED_LOSS[cell.task])
              | (np.asarray(skipped) > 0))
  return CellResult(cell, per_seed, int(diverged.sum()), final["wall_seconds"], final["step"], records,
                    hardware or report.hardware(), tokenizer_label(cell.workdir))


def tokenizer_label(workdir: str) -> str:
  """The fingerprints of the tokenizers a run kept (``WORKDIR/tokenizers/``), each once; "" if none."""
  return ", ".join(sorted(set(recorded_tokenizers(workdir).values())))


# ------------------------------------------------------------------------------------------ recorded results

def record_values(result: CellResult, config: dict, attention: dict[int, dict] | None = None) -> dict:
  """What a cell's record keeps beside its steps, command and hardware: enough to write its rows, plot and
  comparisons again."""
  cell = result.cell
  train = [r for r in result.records if "train/loss" in r]
  values = {"run": cell.run, "replica_offset": cell.replica_offset, "num_seeds": cell.num_seeds,
            "per_seed": {name: values.tolist() for name, values in result.per_seed.items()},
            "diverged": result.diverged, "wall_seconds": result.wall_seconds, "tokenizers": result.tokenizers,
            "train_loss": [[r["step"], seed_values(r, "train/loss", cell.num_seeds).tolist()] for r in train],
            "config": config}
  if attention:
    values["attention"] = {str(replica): statistics for replica, statistics in attention.items()}
  return values


def recorded_result(cell: Cell, record: dict) -> CellResult:
  """The ``CellResult`` of a cell's record (``RecordStore``), as ``cell``'s."""
  values = record["values"]
  if cell.num_seeds == 1:
    records = [{"step": step, "train/loss": losses[0]} for step, losses in values["train_loss"]]
  else:
    records = [{"step": step, "train/loss": float(np.mean(losses)),
                **{f"train/loss/seed_{i}": loss for i, loss in enumerate(losses)}}
               for step, losses in values["train_loss"]]
  per_seed = {name: np.asarray(per_seed, np.float64) for name, per_seed in values["per_seed"].items()}
  return CellResult(cell, per_seed, values["diverged"], values["wall_seconds"], record["steps"], records,
                    record["machine"], values.get("tokenizers", ""))


def recorded_attention(record: dict) -> dict[int, dict]:
  return {int(replica): {kind: tuple(values) for kind, values in statistics.items()}
          for replica, statistics in record["values"].get("attention", {}).items()}


def config_disagreement(recorded: dict, config: dict) -> list[str]:
  """The fields both configs have, with different values (``str`` compared: JSON lists vs tuples)."""
  return sorted(key for key in recorded.keys() & config.keys()
                if json.dumps(recorded[key], default=str) != json.dumps(config[key], default=str))


def find_record(cell: Cell, config: dict, store: report.RecordStore) -> dict | None:
  """The record of ``cell``'s run in ``store``: its own, else another cell's of the same run (a shared
  reference), whose config agrees with ``config``; None if there is none."""
  candidates = [store[cell.name]] if cell.name in store else []
  candidates += [record for name, record in store.items() if name != cell.name
                 and record["values"]["run"] == cell.run and record["values"]["replica_offset"] == cell.replica_offset]
  for record in candidates:
    if (record["values"]["num_seeds"] == cell.num_seeds and record["steps"] == cell.num_train_steps
        and not config_disagreement(record["values"]["config"], config)):
      return record
  return None


def comparison(result: CellResult, reference: CellResult) -> str:
  """One sentence on ``result`` against ``reference`` in the task's first metric: the difference of means,
  whether it exceeds the seeds' spread (more than twice the standard error of the difference: a screen), and
  beside it Welch's t, its degrees of freedom and two-sided p-value (``report.welch_t_test``), which with 3
  seeds a side can leave a difference the screen calls larger above p = 0.05."""
  metric, heading, digits = METRICS[result.cell.task][0]
  a, b = result.per_seed.get(metric), reference.per_seed.get(metric)
  if a is None or b is None or not (np.isfinite(a).all() and np.isfinite(b).all()):
    return f"{result.cell.variant}: not comparable (missing or non-finite values)"
  difference = a.mean() - b.mean()
  error = math.sqrt(a.var(ddof=1) / a.size + b.var(ddof=1) / b.size) if min(a.size, b.size) > 1 else 0.0
  verdict = ("larger than the spread of seeds" if abs(difference) > 2 * error
             else "within the spread of seeds: no conclusion")
  if min(a.size, b.size) > 1:
    t, df, p = report.welch_t_test(a, b)
    verdict += f"; Welch's t = {t:.2f}, {df:.1f} degrees of freedom, {report.format_p_value(p)}"
  return (f"{result.cell.variant}: {difference:+.{digits}f} {heading} against {reference.cell.variant} "
          f"(standard error {error:.{digits}f}; {verdict})")


# The settings that tell a regularization table's cells from the base model (``against_base``), with their words.
REGULARIZATION_FIELDS = {"model.dropout_rate": "dropout", "model.attention_dropout_rate": "attention dropout",
                         "label_smoothing": "label smoothing"}


def against_base(cells: list[CellResult], results: dict[str, list[CellResult]], task: str) -> str:
  """A paragraph for a table whose reference is not the model the other tables start from (``Ablation.
  against_base``): that base's regularization and score, and this table's cell closest to it, with the settings
  in which it differs and the gap (Welch's t as in ``comparison``). "" when the reference is the base, or no
  table on the page holds the base."""
  base = report.flatten_config(common.multi30k_base() if task == "multi30k" else common.synthetic_base())
  differences = {result.cell.name: config_disagreement(cell_config(result.cell), base) for result in cells}
  if not differences[cells[0].cell.name]:
    return ""
  base_results = [result for rows in results.values() for result in rows
                  if not config_disagreement(cell_config(result.cell), base)]
  if not base_results:
    return ""
  base_result = base_results[0]
  metric, heading, digits = METRICS[task][0]
  closest = min(cells, key=lambda result: len(differences[result.cell.name]))
  fields = differences[closest.cell.name]
  changed = ", ".join(f"{field} {cell_config(closest.cell)[field]} against {base[field]}" for field in fields)
  settings = ", ".join(f"{words} {base[field]}" for field, words in REGULARIZATION_FIELDS.items())
  base_score, score = base_result.per_seed[metric], closest.per_seed[metric]
  statistics = ""
  if min(base_score.size, score.size) > 1:
    t, df, p = report.welch_t_test(score, base_score)
    statistics = f" (Welch's t = {t:.2f}, {df:.1f} degrees of freedom, {report.format_p_value(p)})"
  means = [np.nanmean(result.per_seed[metric]) for result in cells]
  same_run = ", ".join(result.cell.name for result in base_results)
  text = (f"This table's reference ({cells[0].cell.variant}) is not the model the other tables start from: the "
          f"base (`common.{task}_base`; {same_run} are that run) trains with "
          f"{settings}, and scores {np.mean(base_score):.{digits}f} {heading}; these variants set those settings "
          f"themselves and score {min(means):.{digits}f}-{max(means):.{digits}f}. The closest of them, "
          f"{closest.cell.variant}, differs from the base only in {changed}: {np.mean(score):.{digits}f} against "
          f"{np.mean(base_score):.{digits}f}{statistics}.")
  if task == "multi30k":
    from experiments import multi30k
    setting = " and ".join(f"{REGULARIZATION_FIELDS.get(field, field)} {base[field]}" for field in fields)
    text += (f" So the base scores below these cells for its {setting} within a budget of {closest.steps} steps; "
             f"experiments/multi30k.py sets it for its full "
             f"{multi30k.get_config('transformer_small').num_train_steps:,}-step run.")
  return text


def first_pairs(batches, count: int, pad: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
  """The split's first ``count`` (source, target) pairs, padding removed, from its evaluation ``batches``: in
  the order of ``batch["index"]`` where batches have one (token batches group sentences by length and end in
  filler rows, index -1), else in batch order; rows of padding only are skipped."""
  pairs = []  # (position in the split, source, target)
  for batch in batches:
    rows = np.asarray(batch["source"]), np.asarray(batch["target"])
    indices = np.asarray(batch["index"]) if "index" in batch else len(pairs) + np.arange(len(rows[0]))
    pairs.extend((index, source[source != pad], target[target != pad])
                 for index, source, target in zip(indices, *rows) if index >= 0 and np.any(source != pad))
  pairs = sorted(pairs, key=lambda pair: pair[0])[:count]
  return [pair[1] for pair in pairs], [pair[2] for pair in pairs]


def attention_statistics(workdir: str, replica: int, count: int = 64) -> dict[str, tuple[float, float, float]]:
  """Mean row entropy, the mean entropy of uniform rows of the same lengths, and the share of rows with a
  weight above 0.9, per attention kind (encoder_self, decoder_self, cross), of replica ``replica``'s final
  parameters on ``count`` validation pairs (teacher-forced), through ``transformer.load``."""
  import transformer
  model = transformer.load(workdir, checkpoint="latest", replica=replica)
  pad = model.model_config.pad_id if hasattr(model, "model_config") else 0
  sources, targets = first_pairs(model.task.eval_batches(count), count, pad)
  rows = {}
  for maps in model.attention_weights(sources, targets):
    for (kind, _), weights in maps.items():  # [heads, q_length, kv_length]
      entropy = -np.sum(np.where(weights > 0, weights * np.log(np.maximum(weights, 1e-30)), 0.0), axis=-1)
      valid_keys = np.broadcast_to(np.arange(1, weights.shape[1] + 1)[:, None] if kind == "decoder_self"
                                   else np.full((weights.shape[1], 1), weights.shape[2]), weights.shape[1:2] + (1,))
      uniform = np.broadcast_to(np.log(valid_keys[:, 0]), entropy.shape)
      saturated = weights.max(axis=-1) > 0.9
      bucket = rows.setdefault(kind, ([], [], []))
      bucket[0].append(entropy.ravel())
      bucket[1].append(uniform.ravel())
      bucket[2].append(saturated.ravel())
  return {kind: (float(np.concatenate(e).mean()), float(np.concatenate(u).mean()), float(np.concatenate(s).mean()))
          for kind, (e, u, s) in rows.items()}


def plot_ablation(results: list[CellResult], path: str, title: str) -> None:
  """Left: the task's first metric, final, per variant (mean bar, one dot per seed); right: training loss, mean
  over seeds."""
  metric, heading, _ = METRICS[results[0].cell.task][0]
  with report.figure(path, 1, 2, (11, 3.8), dpi=100) as (figure, ((bars, curves),)):
    for index, result in enumerate(results):
      values = result.per_seed.get(metric, np.array([np.nan]))
      bars.bar(index, np.nanmean(values) if np.isfinite(values).any() else 0.0, color=f"C{index}", alpha=0.6)
      bars.scatter(np.full(values.size, index), values, color="black", s=12, zorder=3)
      train = [r for r in result.records if "train/loss" in r]
      losses = np.array([seed_values(r, "train/loss", result.cell.num_seeds) for r in train])
      curves.plot([r["step"] for r in train], np.nanmean(losses, axis=1), color=f"C{index}",
                  label=result.cell.variant)
    bars.set_xticks(range(len(results)), [r.cell.variant for r in results], rotation=20, ha="right")
    bars.set_ylabel(f"{heading} (final, per seed)")
    bars.set_ylim(0, 1.02 if metric == "eval/exact_match" else None)
    bars.grid(alpha=0.3, axis="y")
    curves.set_yscale("log")
    curves.set_xlabel("step")
    curves.set_ylabel("training loss (mean over seeds)")
    curves.grid(alpha=0.3)
    curves.legend(fontsize=8)
    figure.suptitle(title)


def task_setting(task: str) -> str:
  """The page's paragraph on the task, the models and the budget."""
  if task == "synthetic":
    return ("Task: reverse 1-16 symbols of 10 (`experiments/ablations/common.py`, `synthetic_base`), greedy "
            "decoding of 256 held-out sequences; a small encoder-decoder (2+2 layers, d_model 64, 4 heads, "
            "d_ff 128) or a GRU encoder-decoder (hidden 64), batch 64, cosine schedule to 0 from 3e-3 after 50 "
            "warmup steps, 300 steps (norm_position: 4+4 layers, 200 steps at a constant 5e-3, no clipping).")
  from experiments.ablations import rnn_attention
  base = common.multi30k_base()
  model, optimizer = base.model, base.optimizer
  rnn = rnn_attention.get_config(f"{next(iter(rnn_attention.ABLATION.variants))},multi30k")
  schedule = lambda optimizer: (f"peak learning rate {optimizer.learning_rate:g} after {optimizer.warmup_steps} "
                                f"warmup steps, then {optimizer.schedule.replace('_', ' ')} decay")
  return (f"Task: Multi30k en-de (`experiments/ablations/common.py`, `multi30k_base`): experiments/multi30k.py's "
          f"`transformer_small` ({model.num_encoder_layers}+{model.num_decoder_layers} layers, d_model "
          f"{model.d_model}, {model.norm_position}-LN; dropout {model.dropout_rate:g} on the residual sublayers, "
          f"{model.attention_dropout_rate:g} on the attention weights, label smoothing {base.label_smoothing:g}: "
          f"the settings of its full run, kept in every Transformer table but regularization), "
          f"{schedule(optimizer)}; the RNN ablation: its "
          f"`gru_bahdanau` with hidden {rnn.model.hidden_dim} and embeddings {rnn.model.embedding_dim} "
          f"(`rnn_attention.py`), {schedule(rnn.optimizer)}; batches of {base.task.max_tokens:,} tokens, a budget "
          f"of {base.num_train_steps} steps; BLEU of beam search (beam {base.decode.beam_size}) on the "
          f"validation set at the end. A budget this short compares the variants early in training, not at "
          f"convergence.")


def render_page(output: str, results: dict[str, list[CellResult]], commands: dict[str, str],
                attention: dict[str, dict], invocation: str, task: str, unfinished: tuple[str, ...] = ()) -> str:
  """The page's text (``results``: ablation -> its cells' results, in variant order, the first the reference);
  draws ``output/<ablation>.png``.

  Args:
    commands: cell name -> the command of its run, as the page shows it.
    attention: cell name -> replica -> ``attention_statistics``, for the cells that have them.
    unfinished: cells left out because they have neither a finished run nor a record, named on the page.
  """
  header = ["run", *(heading for _, heading, _ in METRICS[task]), "diverged", "steps", "seeds", "wall time",
            "hardware", "command"]
  sections = []
  for name, cells in results.items():
    ablation = ablation_module(name).ABLATION
    rows = []
    for result in cells:
      cell = result.cell
      rows.append([cell.name, *(report.mean_std(result.per_seed[metric], digits) if metric in result.per_seed else "n/a"
                                for metric, _, digits in METRICS[task]),
                   f"{result.diverged} of {cell.num_seeds}", result.steps, cell.num_seeds,
                   f"{result.wall_seconds:.0f} s", result.hardware, f"`{commands[cell.name]}`"])
    plot_ablation(cells, os.path.join(output, f"{name}.png"), ablation.title)
    reading = "\n".join(f"- {comparison(result, cells[0])}" for result in cells[1:])
    reading += tokenizer_caveat(cells)
    if len(cells) > 1:  # only the reference finished: nothing to compare yet
      reading = f"Against the reference ({cells[0].cell.variant}), {METRICS[task][0][1]}:\n{reading}"
    if ablation.against_base and (contrast := against_base(cells, results, task)):
      reading += f"\n\n{contrast}"
    text = f"""## {ablation.title}

{ablation.question} Config: `experiments/ablations/{name}.py`.

{report.markdown_table(header, rows)}

{reading}
{chr(10) + ablation.note + chr(10) if ablation.note else ""}
![{name}]({name}.png)
"""
    attention_rows = []
    for result in cells:
      per_replica = attention.get(result.cell.name)
      if not per_replica:
        continue
      for kind in ("encoder_self", "decoder_self", "cross"):
        values = np.array([[per_replica[r][kind][i] for r in sorted(per_replica)] for i in range(3)])
        attention_rows.append([result.cell.name, kind, report.mean_std(values[0], 2), f"{values[1].mean():.2f}",
                               report.mean_std(values[2], 3)])
    if attention_rows:
      text += f"""
Attention of the trained models (final parameters, the first 64 validation pairs, teacher-forced; mean ± std
over seeds, through `transformer.load(workdir, replica=i).attention_weights`): the mean entropy of a query's
weights, that of uniform weights over the same keys, and the share of query rows whose largest weight exceeds
0.9 (a saturated softmax, whose gradient is small: the paper's reason for the scale).

{report.markdown_table(ATTENTION_HEADER, attention_rows)}
"""
    sections.append(text)
  setting = task_setting(task)
  if task == "synthetic":
    base = common.multi30k_base()
    other = (f"The same ablations on Multi30k, a budgeted run of {base.num_train_steps} steps x {base.num_seeds} "
             f"seeds per cell (`--task=multi30k`, `common.multi30k_base`): ")
    multi30k_page = os.path.join(report.COMMITTED, "ablations", "multi30k", "RESULTS.md")
    missing = other + ("[multi30k/RESULTS.md](multi30k/RESULTS.md)." if os.path.exists(multi30k_page)
                       else "not run yet.")
  else:
    not_run = [name for name in ABLATIONS if name not in results]
    missing = (f"Not run on Multi30k yet: {', '.join(not_run)} (their synthetic results: "
               f"[../RESULTS.md](../RESULTS.md)).") if not_run else ""
  if unfinished:
    missing += (f"{chr(10) * 2 if missing else ''}Not finished when this page was written (`--notrain`), so left "
                f"out with any table whose reference they are: {', '.join(unfinished)}.")
  return f"""# Ablations: the paper's design choices over seeds

Written by `{invocation}`; do not edit by hand.

Page written on: {report.machine_description()}; each row names the hardware its cell ran on.

{setting} Every cell trains its seeds in one program (`config.num_seeds`, `jax.vmap`; seeds share the data
order). Each number is the mean ± sample standard deviation over the seeds of the final evaluation; "diverged"
counts seeds whose training loss became non-finite, that skipped a non-finite step, or whose final training loss
is above {common.DIVERGED_LOSS[task]} nats. A difference is called "larger than the spread of seeds" when it exceeds
twice its standard error; with 3 seeds that is a screen, not a significance test. Beside it, Welch's t-test
(unequal variances; `experiments.report.welch_t_test`): t, its Welch-Satterthwaite degrees of freedom and the
two-sided p-value. With 2-4 degrees of freedom a t between 2 and 4 can be p above 0.05: read such a
"larger" as a hint, not a finding. Wall time includes compilation and
evaluation. Cells with the same config (the reference model) are one run, listed under each ablation; so are
variants that differ only in the learning rate, its warmup or label smoothing (`--config.sweep`: variants and
seeds in one vmapped program; the wall time is the program's, listed under each of its variants).

{"".join(part + chr(10) * 2 for part in (missing, tokenizer_summary(results)) if part)}{chr(10).join(sections)}"""


def tokenizer_caveat(cells: list[CellResult]) -> str:
  """A line for a table whose cells tokenized with different SentencePiece models, or may have: some runs
  did not keep theirs and the table mixes hardware (another host can train another model). "" otherwise."""
  known = {result.tokenizers for result in cells if result.tokenizers}
  unknown = any(not result.tokenizers for result in cells)
  if len(known) <= 1 and not (unknown and len({result.hardware for result in cells}) > 1):
    return ""
  which = "; ".join(f"{result.cell.variant}: {result.tokenizers or 'not recorded'}" for result in cells)
  verdict = "did not all" if len(known) > 1 else "may not all"
  return (f"\n- These cells {verdict} tokenize with one SentencePiece model ({which}), so their differences "
          f"{'include' if len(known) > 1 else 'may include'} the tokenizers'.")


def tokenizer_summary(results: dict[str, list[CellResult]]) -> str:
  """Which SentencePiece model each cell's run tokenized with, grouped by model: the same options and text can
  train another model on another host, so numbers compare across tables only within one group."""
  groups: dict[str, dict[str, list[str]]] = {}
  for cells in results.values():
    for result in cells:
      hardware = groups.setdefault(result.tokenizers, {}).setdefault(result.hardware, [])
      if result.cell.name not in hardware:
        hardware.append(result.cell.name)
  if not groups or set(groups) == {""}:
    return ""
  lines = [f"- {fingerprint or 'not recorded (the run predates WORKDIR/tokenizers/)'}: "
           + "; ".join(f"{', '.join(names)} ({hardware})" for hardware, names in by_hardware.items())
           for fingerprint, by_hardware in sorted(groups.items(), key=lambda item: item[0] == "")]
  return ("SentencePiece model of each cell's run (fingerprint of `WORKDIR/tokenizers/`; the same options and "
          "text can train a different model on another host):\n" + "\n".join(lines))


def gather(cells: list[Cell], store: report.RecordStore,
           train: Callable[[str, str, tuple], object] | None = report.launch, launch_flags: tuple[str, ...] = (),
           ignore_recorded: bool = False, hardware: str = "") -> None:
  """Train what is left of the grid and record every cell in ``store``: from its finished run, else from the
  record of its run already there (unless ``ignore_recorded``), else after training it. ``train=None`` trains
  nothing: a cell with neither a finished run nor a record is left unrecorded. ``hardware``: where the finished
  runs trained (default: this machine), unless a record of the same run says elsewhere. A cell that would
  replace a record of more steps is refused (``RecordStore.check``) before anything trains."""
  configs = {cell.name: cell_config(cell) for cell in cells}
  stand_ins = {} if ignore_recorded else {
      cell.name: record for cell in cells if not cell_finished(cell)
      for record in [find_record(cell, configs[cell.name], store)] if record}
  store.check({**{cell.name: cell.num_train_steps for cell in cells if train is not None or cell_finished(cell)},
               **{name: record["steps"] for name, record in stand_ins.items()}})
  commands = run_grid(cells, train, launch_flags, frozenset(stand_ins))
  for cell in cells:
    command = report.portable_command(commands[cell.name])
    if cell.name in stand_ins:  # under its own name and today's command (the record may be a shared run's)
      record = stand_ins[cell.name]
      store.add(cell.name, steps=record["steps"], command=command, machine=record["machine"],
                values=record["values"])
      continue
    if train is None and not cell_finished(cell):
      continue
    result = cell_result(cell, read_cell(cell), hardware)
    same_run = find_record(cell, configs[cell.name], store)
    if same_run and same_run["values"]["wall_seconds"] == result.wall_seconds:  # recorded from this run
      result = dataclasses.replace(result, hardware=same_run["machine"],
                                   tokenizers=result.tokenizers or same_run["values"].get("tokenizers", ""))
    attention = ({replica: attention_statistics(cell.workdir, cell.replica_offset + replica)
                  for replica in range(cell.num_seeds)} if cell.ablation == "scaling" else None)
    store.add(cell.name, steps=result.steps, command=command, machine=result.hardware,
              values=record_values(result, configs[cell.name], attention))


def recorded_results(cells: list[Cell], store: report.RecordStore):
  """What the page shows of ``cells``: the records in ``store`` whose config agrees with the cell's.

  Returns ``(results, commands, attention, unfinished)``: ablation -> its ``CellResult``s in variant order (an
  ablation whose reference has no record is left out); cell name -> its command; cell name -> replica ->
  ``attention_statistics``; the cells without a record.
  """
  results, commands, attention, unfinished = {}, {}, {}, []
  for cell in cells:
    record = find_record(cell, cell_config(cell), store)
    if record is None:
      unfinished.append(cell.name)
      continue
    results.setdefault(cell.ablation, []).append(recorded_result(cell, record))
    commands[cell.name] = record["command"]
    if statistics := recorded_attention(record):
      attention[cell.name] = statistics
  references = {}
  for cell in cells:
    references.setdefault(cell.ablation, cell.name)
  results = {name: rows for name, rows in results.items() if rows[0].cell.name == references[name]}
  return results, commands, attention, tuple(dict.fromkeys(unfinished))


def main(argv: list[str] | None = None) -> None:
  parser = report.results_parser(__doc__, "WORKDIR_ROOT/results", default_root=DEFAULT_ROOT, hardware=True)
  parser.add_argument("--ablation", default="all",
                      help=f"Comma-separated ablations, or 'all': {', '.join(ABLATIONS)}.")
  parser.add_argument("--task", default="synthetic", choices=list(common.TASKS),
                      help="The base: synthetic (reversal) or multi30k.")
  parser.add_argument("--ignore_recorded", action="store_true",
                      help="Train every unfinished cell, even one whose result is recorded.")
  report.add_boolean_argument(parser, "train", True, "Train the cells that have neither a finished run nor a "
                              "record. --notrain writes the page from what has finished and lists the rest as not "
                              "finished (e.g. at a session's end, while the grid still trains).")
  parser.add_argument("--launch_flag", action="append", default=[], help="Passed to every launch.py run, e.g. "
                      "--launch_flag=--config.task.source_dir=../shared/data/multi30k; repeat for several.")
  args = parser.parse_args(argv)
  root = os.path.abspath(args.workdir_root)
  task = args.task
  names = list(ABLATIONS) if args.ablation == "all" else [n.strip() for n in args.ablation.split(",")]
  for name in names:
    report.exit_on_user_error(ablation_module, name)
  committed = os.path.join(report.COMMITTED, "ablations", *(() if task == "synthetic" else (task,)))
  cells = expand_grid(names, task, root)
  invocation = "python -m experiments.ablations_results" + (
      f" --ablation={args.ablation}" if args.ablation != "all" else "") + (
      f" --task={task}" if task != "synthetic" else "") + " --workdir_root=WORKDIR_ROOT"  # a local folder

  def collect(store: report.RecordStore, folder: str) -> None:
    gather(cells, store, report.launch if args.train else None, tuple(args.launch_flag), args.ignore_recorded,
           args.hardware)

  def render(store: report.RecordStore, folder: str) -> str:
    results, commands, attention, unfinished = recorded_results(cells, store)
    if unfinished:
      print(f"not finished, left out of the page: {', '.join(unfinished)}")
    return render_page(folder, results, commands, attention, invocation, task, unfinished)

  report.make_page(args, committed, os.path.join(root, "results"), collect, render)


if __name__ == "__main__":
  main()
