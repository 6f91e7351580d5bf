r"""Run the ablation grid (variants x seeds) and write its results page: RESULTS.md and one plot per ablation.

    python -m experiments.ablations_results --workdir_root=/tmp/ablations                   # all seven
    python -m experiments.ablations_results --ablation=heads,norms --workdir_root=/tmp/ablations
    python -m experiments.ablations_results --workdir_root=/tmp/ablations --update_committed
    python -m experiments.ablations_results --task=multi30k --workdir_root=/tmp/ablations_m30k \
        --launch_flag=--config.task.source_dir=../shared/data/multi30k
    python -m experiments.ablations_results --from_records --update_committed   # the page again, no workdirs

Each cell, ``<workdir_root>/<ablation>/<variant>``, is one ``launch.py`` run of ``config.num_seeds`` seeds; the
grid resumes (a finished cell is skipped, another resumes from its checkpoint). Every finished cell is a record of
``records.json`` beside the page, and the page is written from the records: a cell without a finished run is read
from a record of the same run whose config agrees with its own (``--launch_flag=--config.KEY=VALUE`` included),
else trained (``--ignore_recorded`` trains it anyway; ``--notrain`` names it as not finished). The page goes to
``--output_dir`` (default ``<workdir_root>/results/``), or with ``--update_committed`` to ``experiments/ablations/``
(``multi30k/`` for ``--task=multi30k``), where a row is only replaced by a run at least as long. More:
experiments/ablations/README.md.
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
from transformer.train.run_directory import MetricsLog, RunDirectory, read_metrics

ABLATIONS = ("scaling", "heads", "positions", "norm_position", "norms", "regularization", "rnn_attention")
DEFAULT_ROOT = "/tmp/ablations"
# Per task, the table's metrics as (name, heading, digits); the first is the one variants are compared on and
# plotted: exact match of greedy decoding on the synthetic task, BLEU of beam search on Multi30k validation.
_SECONDARY = (("eval/token_accuracy", "token accuracy", 3), ("eval/nll", "NLL (nats/token)", 3))
METRICS = {"synthetic": (("eval/exact_match", "exact match", 3), *_SECONDARY),
           "multi30k": (("eval/bleu", "BLEU", 2), *_SECONDARY)}
# Launch flags that set where the data lives or how a run prints, or the grid's own sweep: not settings a
# cell's config (and so its record) holds.
NOT_TRAINING_SETTINGS = ("task.source_dir", "task.data_dir", "quiet", "tensorboard", "sweep")
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


def ablation_module(name: str):
  if name not in ABLATIONS:
    raise report.UserError(f"unknown ablation {name!r}; choose from {', '.join(ABLATIONS)} or 'all'")
  return importlib.import_module(f"experiments.ablations.{name}")


def _config_key(flat: dict, leave_out: tuple[str, ...] = ()) -> str:
  return json.dumps({k: v for k, v in flat.items() if k not in leave_out}, sort_keys=True, default=str)


def expand_grid(names: list[str], task: str, root: str, ablations: tuple[str, ...] = ABLATIONS,
                launch_flags: tuple[str, ...] = ()) -> list[Cell]:
  """The cells of the ablations ``names``, in order. A variant whose config equals one earlier in
  ``ablations`` (all of them, so the choice does not depend on ``names``) gets that one's cell. Of the others,
  the variants of one ablation that differ only in ``SWEEPABLE`` fields (learning rate, warmup, label smoothing)
  share one run, vmapped over variants and seeds (``config.sweep``), in ``<ablation>/<variant>+<variant>``.
  Each cell keeps its variant's config as its runs train it, flattened (``report.flatten_config``): with the
  ``--config.KEY=VALUE`` of ``launch_flags`` set (but where data lives, ``NOT_TRAINING_SETTINGS``), so its step
  target follows ``--config.num_train_steps`` and a record made without such a flag does not stand in for it."""
  suffix = "" if task == "synthetic" else f",{task}"
  owner = {}  # config (JSON) -> the cell that trains it
  cells = {}
  for name in ablations:
    module = ablation_module(name)
    fresh = {}  # config without its sweepable fields (JSON) -> [(variant, flat config)] of configs not seen before
    seen = set()  # the configs (JSON) of this ablation's fresh variants
    repeats = {}  # variant -> the config (JSON) of an earlier variant that it equals
    for variant in module.ABLATION.variants:
      flat = report.flatten_config(report.config_with_flags(module.get_config(variant + suffix), list(launch_flags),
                                                            leave_out=NOT_TRAINING_SETTINGS))
      key = _config_key(flat)
      if key in owner or key in seen:
        repeats[variant] = key
        continue
      seen.add(key)
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
                    index * num_seeds, variant_flat)
        owner[_config_key(variant_flat)] = cells[(name, variant)] = cell
    for variant, key in repeats.items():  # its own config names the run, unless only a sweep's command does
      shared = owner[key]
      config = shared.config if shared.sweep else f"experiments/ablations/{name}.py:{variant}{suffix}"
      cells[(name, variant)] = dataclasses.replace(shared, ablation=name, variant=variant, config=config)
  return [cells[(name, variant)] for name in ablations if name in names
          for variant in ablation_module(name).ABLATION.variants]


def cell_finished(cell: Cell) -> bool:
  return RunDirectory(cell.workdir).metrics().evaluation_at(cell.num_train_steps) is not None


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
  """``name`` per seed of ``cell``: ``<name>/seed_<i>`` of the cell's replicas (a sweep's run holds those of
  every variant), or ``name`` itself in the run of a single replica."""
  if cell.num_seeds == 1 and not cell.sweep:
    return np.array([record.get(name, np.nan)], np.float64)
  return np.array([record.get(f"{name}/seed_{cell.replica_offset + i}", np.nan) for i in range(cell.num_seeds)],
                  np.float64)


def cell_result(cell: Cell, records: list[dict], hardware: str = "") -> CellResult:
  """The cell's final per-seed metrics, training loss and divergence count from its run's metric ``records``;
  ``hardware``: where it ran (default: here)."""
  final = MetricsLog(tuple(records)).evaluation_at(cell.num_train_steps)
  if final is None:
    raise report.UserError(f"{cell.workdir} has no evaluation at step {cell.num_train_steps}: its run has not "
                           "finished; rerun the script to resume it")
  per_seed = {name: seed_values(final, name, cell) for name, _, _ in METRICS[cell.task] if name in final}
  train = [r for r in records if "train/loss" in r]
  losses = np.array([seed_values(r, "train/loss", cell) for r in train])
  skipped = sum((seed_values(r, "train/skipped_steps", cell) for r in train if "train/skipped_steps" in r),
                np.zeros(cell.num_seeds))
  diverged = (~np.isfinite(losses)).any(axis=0) | (losses[-1] > common.DIVERGED_LOSS[cell.task]) | (skipped > 0)
  return CellResult(cell, per_seed, int(diverged.sum()), final["wall_seconds"], final["step"],
                    [[r["step"], loss.tolist()] for r, loss in zip(train, losses)], hardware or report.hardware(),
                    ", ".join(sorted(set(recorded_tokenizers(cell.workdir).values()))))


def record_values(result: CellResult) -> dict:
  """What a cell's record keeps beside its steps, command and hardware: enough to write its rows, plot and
  comparisons again, and its config, which a record must agree with to stand in for a run (``find_record``)."""
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


def config_disagreement(recorded: dict, config: dict) -> list[str]:
  """The fields both configs have, with different values (``str`` compared: JSON lists vs tuples)."""
  return sorted(key for key in recorded.keys() & config.keys()
                if json.dumps(recorded[key], default=str) != json.dumps(config[key], default=str))


def find_record(cell: Cell, store: report.RecordStore) -> dict | None:
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


def welch(a: np.ndarray, b: np.ndarray) -> str:
  """Welch's t-test of ``a`` against ``b`` in words (``report.welch_t_test``)."""
  t, df, p = report.welch_t_test(a, b)
  return f"Welch's t = {t:.2f}, {df:.1f} degrees of freedom, {report.format_p_value(p)}"


def comparison(result: CellResult, reference: CellResult) -> str:
  """One sentence on ``result`` against ``reference`` in the task's first metric: the difference of means,
  whether it exceeds twice its standard error (a screen) and Welch's t-test beside it (with 3 seeds a side,
  a difference the screen calls larger can be above p = 0.05)."""
  metric, heading, digits = METRICS[result.cell.task][0]
  a, b = result.per_seed.get(metric), reference.per_seed.get(metric)
  if a is None or b is None or not (np.isfinite(a).all() and np.isfinite(b).all()):
    return f"{result.cell.variant}: not comparable (missing or non-finite values)"
  difference, spread = a.mean() - b.mean(), min(a.size, b.size) > 1
  error = math.sqrt(a.var(ddof=1) / a.size + b.var(ddof=1) / b.size) if spread else 0.0
  verdict = ("larger than the spread of seeds" if abs(difference) > 2 * error
             else "within the spread of seeds: no conclusion") + (f"; {welch(a, b)}" if spread else "")
  return (f"{result.cell.variant}: {difference:+.{digits}f} {heading} against {reference.cell.variant} "
          f"(standard error {error:.{digits}f}; {verdict})")


# The settings that tell a regularization table's cells from the base model (``against_base``), with their words.
REGULARIZATION_FIELDS = {"model.dropout_rate": "dropout", "model.attention_dropout_rate": "attention dropout",
                         "label_smoothing": "label smoothing"}


def against_base(cells: list[CellResult], results: dict[str, list[CellResult]], task: str) -> str:
  """A paragraph for a table whose reference is not the model the other tables start from (``Ablation.
  against_base``): that base's regularization and score, and this table's cell closest to it, with the settings
  in which it differs and the gap. "" when the reference is the base, or no table on the page holds the base."""
  base = report.flatten_config(common.multi30k_base() if task == "multi30k" else common.synthetic_base())
  differences = {result.cell.name: config_disagreement(result.cell.flat_config, base) for result in cells}
  base_results = [result for rows in results.values() for result in rows
                  if not config_disagreement(result.cell.flat_config, base)]
  if not differences[cells[0].cell.name] or not base_results:
    return ""
  metric, heading, digits = METRICS[task][0]
  closest = min(cells, key=lambda result: len(differences[result.cell.name]))
  fields = differences[closest.cell.name]
  changed = ", ".join(f"{field} {closest.cell.flat_config[field]} against {base[field]}" for field in fields)
  settings = ", ".join(f"{words} {base[field]}" for field, words in REGULARIZATION_FIELDS.items())
  base_score, score = base_results[0].per_seed[metric], closest.per_seed[metric]
  statistics = f" ({welch(score, base_score)})" if min(base_score.size, score.size) > 1 else ""
  means = [np.nanmean(result.per_seed[metric]) for result in cells]
  text = (f"This table's reference ({cells[0].cell.variant}) is not the model the other tables start from: the "
          f"base (`common.{task}_base`; {', '.join(result.cell.name for result in base_results)} are that run) "
          f"trains with {settings}, and scores {np.mean(base_score):.{digits}f} {heading}; these variants set those "
          f"settings themselves and score {min(means):.{digits}f}-{max(means):.{digits}f}. The closest of them, "
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
  rows = {}  # kind -> [(entropy, uniform entropy, saturated) per row of one map]
  for maps in model.attention_weights(sources, targets):
    for (kind, _), weights in maps.items():  # [heads, q_length, kv_length]
      entropy = -np.sum(np.where(weights > 0, weights * np.log(np.maximum(weights, 1e-30)), 0.0), axis=-1)
      queries, keys = weights.shape[1:]  # a decoder query sees the keys up to its own position
      valid_keys = np.arange(1, queries + 1) if kind == "decoder_self" else np.full(queries, keys)
      uniform = np.broadcast_to(np.log(valid_keys), entropy.shape)
      rows.setdefault(kind, []).append((entropy.ravel(), uniform.ravel(), (weights.max(axis=-1) > 0.9).ravel()))
  return {kind: tuple(float(np.concatenate(column).mean()) for column in zip(*maps)) for kind, maps in rows.items()}


def plot_ablation(results: list[CellResult], path: str, title: str) -> None:
  """Left: the task's first metric, final, per variant (mean bar, one dot per seed); right: training loss, mean
  over seeds."""
  metric, heading, _ = METRICS[results[0].cell.task][0]
  with report.figure(path, 1, 2, (11, 3.8), dpi=100) as (figure, ((bars, curves),)):
    for index, result in enumerate(results):
      values = result.per_seed.get(metric, np.array([np.nan]))
      bars.bar(index, np.nanmean(values) if np.isfinite(values).any() else 0.0, color=f"C{index}", alpha=0.6)
      bars.scatter(np.full(values.size, index), values, color="black", s=12, zorder=3)
      losses = np.array([loss for _, loss in result.train_loss], np.float64)
      curves.plot([step for step, _ in result.train_loss], np.nanmean(losses, axis=1), color=f"C{index}",
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
  model = base.model
  rnn = rnn_attention.get_config(f"{next(iter(rnn_attention.ABLATION.variants))},multi30k")
  schedule = lambda optimizer: (f"peak learning rate {optimizer.learning_rate:g} after {optimizer.warmup_steps} "
                                f"warmup steps, then {optimizer.schedule.replace('_', ' ')} decay")
  return (f"Task: Multi30k en-de (`experiments/ablations/common.py`, `multi30k_base`): experiments/multi30k.py's "
          f"`transformer_small` ({model.num_encoder_layers}+{model.num_decoder_layers} layers, d_model "
          f"{model.d_model}, {model.norm_position}-LN; dropout {model.dropout_rate:g} on the residual sublayers, "
          f"{model.attention_dropout_rate:g} on the attention weights, label smoothing {base.label_smoothing:g}: "
          f"the settings of its full run, kept in every Transformer table but regularization), "
          f"{schedule(base.optimizer)}; the RNN ablation: its `gru_bahdanau` with hidden {rnn.model.hidden_dim} "
          f"and embeddings {rnn.model.embedding_dim} (`rnn_attention.py`), {schedule(rnn.optimizer)}; batches of "
          f"{base.task.max_tokens:,} tokens, a budget of {base.num_train_steps} steps; BLEU of beam search (beam "
          f"{base.decode.beam_size}) on the validation set at the end. A budget this short compares the variants "
          "early in training, not at convergence.")


ATTENTION_NOTE = """
Attention of the trained models (final parameters, the first 64 validation pairs, teacher-forced; mean ± std
over seeds, through `transformer.load(workdir, replica=i).attention_weights`): the mean entropy of a query's
weights, that of uniform weights over the same keys, and the share of query rows whose largest weight exceeds
0.9 (a saturated softmax, whose gradient is small: the paper's reason for the scale).

"""


def table_row(result: CellResult) -> list:
  """A cell's row: its metrics (mean ± std over seeds), divergence, budget, wall time, hardware and command."""
  cell = result.cell
  return [cell.name, *(report.mean_std(result.per_seed[metric], digits) if metric in result.per_seed else "n/a"
                       for metric, _, digits in METRICS[cell.task]),
          f"{result.diverged} of {cell.num_seeds}", result.steps, cell.num_seeds, f"{result.wall_seconds:.0f} s",
          result.hardware, f"`{result.command}`"]


def attention_rows(result: CellResult) -> list[list]:
  """The cell's rows of the attention table (mean ± std over its seeds); none where it was not measured."""
  rows = []
  for kind in ("encoder_self", "decoder_self", "cross") if result.attention else ():
    entropy, uniform, saturated = np.array([result.attention[r][kind] for r in sorted(result.attention)]).T
    rows.append([result.cell.name, kind, report.mean_std(entropy, 2), f"{uniform.mean():.2f}",
                 report.mean_std(saturated, 3)])
  return rows


def divergence_note(cells: list[CellResult], task: str) -> str:
  """Why each diverged seed counts as diverged: its final training loss against the line, or a non-finite or
  skipped step; "" where no seed diverged."""
  line, notes = common.DIVERGED_LOSS[task], []
  for result in (result for result in cells if result.diverged):
    final = np.array(result.train_loss[-1][1], np.float64)
    losses = np.array([loss for _, loss in result.train_loss], np.float64)
    above = [str(seed) for seed in range(final.size) if np.isfinite(losses[:, seed]).all() and final[seed] > line]
    other = result.diverged - len(above)
    why = ([f"seed {', '.join(above)} above the line"] if above else []) + (
        [f"{other} with a non-finite or skipped step"] if other > 0 else [])
    notes.append(f"{result.cell.variant}: {' and '.join(why)} (final training losses of its seeds: "
                 + ", ".join(f"{loss:.3f}" for loss in final) + ")")
  return (f"Diverged, by the criterion above (final training loss above {line} nats, or a non-finite or skipped "
          "step): " + "; ".join(notes) + ".") if notes else ""


def ablation_section(name: str, cells: list[CellResult], results: dict[str, list[CellResult]], task: str,
                     output: str) -> str:
  """One ablation's section (``cells``: its results in variant order, the first the reference); draws
  ``output/<name>.png``."""
  ablation = ablation_module(name).ABLATION
  header = ["run", *(heading for _, heading, _ in METRICS[task]), "diverged", "steps", "seeds", "wall time",
            "hardware", "command"]
  plot_ablation(cells, os.path.join(output, f"{name}.png"), ablation.title)
  reading = "\n".join(f"- {comparison(result, cells[0])}" for result in cells[1:]) + tokenizer_caveat(cells)
  if len(cells) > 1:  # only the reference finished: nothing to compare yet
    reading = f"Against the reference ({cells[0].cell.variant}), {METRICS[task][0][1]}:\n{reading}"
  if diverged := divergence_note(cells, task):
    reading += f"\n\n{diverged}"
  if ablation.against_base and (contrast := against_base(cells, results, task)):
    reading += f"\n\n{contrast}"
  note = f"\n{ablation.note}\n" if ablation.note else ""
  text = (f"## {ablation.title}\n\n{ablation.question} Config: `experiments/ablations/{name}.py`.\n\n"
          f"{report.markdown_table(header, [table_row(result) for result in cells])}\n\n{reading}\n{note}\n"
          f"![{name}]({name}.png)\n")
  if attention := [row for result in cells for row in attention_rows(result)]:
    text += f"{ATTENTION_NOTE}{report.markdown_table(ATTENTION_HEADER, attention)}\n"
  return text


PAGE = """# Ablations: the paper's design choices over seeds

Written by `{invocation}`; do not edit by hand.

Page written on: {machine}; each row names the hardware its cell ran on.

{setting} Every cell trains its seeds in one program (`config.num_seeds`, `jax.vmap`; seeds share the data
order). Each number is the mean ± sample standard deviation over the seeds of the final evaluation; "diverged"
counts seeds whose training loss became non-finite, that skipped a non-finite step, or whose final training loss
is above {diverged_loss} nats. A difference is called "larger than the spread of seeds" when it exceeds
twice its standard error; with 3 seeds that is a screen, not a significance test. Beside it, Welch's t-test
(unequal variances; `experiments.report.welch_t_test`): t, its Welch-Satterthwaite degrees of freedom and the
two-sided p-value. With 2-4 degrees of freedom a t between 2 and 4 can be p above 0.05: read such a
"larger" as a hint, not a finding. Wall time includes compilation and
evaluation. Cells with the same config (the reference model) are one run, listed under each ablation; so are
variants that differ only in the learning rate, its warmup or label smoothing (`--config.sweep`: variants and
seeds in one vmapped program; the wall time is the program's, listed under each of its variants).

"""


def page_notes(task: str, results: dict[str, list[CellResult]], unfinished: tuple[str, ...]) -> list[str]:
  """The paragraphs on what the page does not hold (the other task's page, the ablations not run, the cells not
  finished) and on the tokenizers its cells used."""
  if task == "synthetic":
    base = common.multi30k_base()
    page = os.path.exists(os.path.join(report.COMMITTED, "ablations", "multi30k", "RESULTS.md"))
    notes = [f"The same ablations on Multi30k, a budgeted run of {base.num_train_steps} steps x {base.num_seeds} "
             f"seeds per cell (`--task=multi30k`, `common.multi30k_base`): "
             + ("[multi30k/RESULTS.md](multi30k/RESULTS.md)." if page else "not run yet.")]
  else:
    not_run = [name for name in ABLATIONS if name not in results]
    notes = [f"Not run on Multi30k yet: {', '.join(not_run)} (their synthetic results: [../RESULTS.md]"
             "(../RESULTS.md))."] if not_run else []
  if unfinished:
    notes.append("Not finished when this page was written (`--notrain`), so left out with any table whose "
                 f"reference they are: {', '.join(unfinished)}.")
  return ["\n\n".join(notes), tokenizer_summary(results)]


def render_page(output: str, results: dict[str, list[CellResult]], invocation: str, task: str,
                unfinished: tuple[str, ...] = ()) -> str:
  """The page's text (``results``: ablation -> its cells' results, in variant order, the first the reference;
  ``unfinished``: the cells with neither a finished run nor a record, named on the page); draws
  ``output/<ablation>.png``."""
  head = PAGE.format(invocation=invocation, machine=report.machine_description(), setting=task_setting(task),
                     diverged_loss=common.DIVERGED_LOSS[task])
  notes = "".join(f"{note}\n\n" for note in page_notes(task, results, unfinished) if note)
  return head + notes + "\n".join(ablation_section(name, cells, results, task, output)
                                   for name, cells in results.items())


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
  for result in (result for cells in results.values() for result in cells):
    groups.setdefault(result.tokenizers, {}).setdefault(result.hardware, []).append(result.cell.name)
  if not set(groups) - {""}:  # no run kept its tokenizers: nothing to tell apart
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
  record of its run already there (unless ``ignore_recorded``), else after training it with ``train(config,
  workdir, launch_flags)`` (by default ``report.launch``, which resumes from the latest checkpoint; ``None``
  trains nothing, and a cell with neither a finished run nor a record is left unrecorded). ``hardware``: where
  the finished runs trained (default: this machine), unless a record of the same run says elsewhere. A cell that
  would replace a record of more steps is refused (``RecordStore.check``) before anything trains."""
  stand_ins = {} if ignore_recorded else {
      cell.name: record for cell in cells if not cell_finished(cell) for record in [find_record(cell, store)] if record}
  store.check({**{cell.name: cell.num_train_steps for cell in cells if train is not None or cell_finished(cell)},
               **{name: record["steps"] for name, record in stand_ins.items()}})
  for cell in cells:
    flags = (*cell.launch_flags, *launch_flags)
    command = report.portable_command(["python", "launch.py", f"--config={cell.config}", f"--workdir={cell.workdir}",
                                       *flags])
    if cell.name in stand_ins:  # under its own name and today's command (the record may be a shared run's)
      print(f"{cell.name}: its result recorded in {report.RECORDS_FILE} (no finished run in {cell.workdir})",
            flush=True)
      record = stand_ins[cell.name]
      store.add(cell.name, steps=record["steps"], command=command, machine=record["machine"],
                values=record["values"])
      continue
    if train is not None and not cell_finished(cell):
      print(f"training {cell.name} in {cell.workdir}", flush=True)
      train(cell.config, cell.workdir, flags)
    if train is not None or cell_finished(cell):
      result = run_result(cell, store, hardware)
      store.add(cell.name, steps=result.steps, command=command, machine=result.hardware,
                values=record_values(result))


def run_result(cell: Cell, store: report.RecordStore, hardware: str) -> CellResult:
  """The ``CellResult`` of the cell's finished run, with its hardware and tokenizers from the record of the same
  run in ``store`` where it has one, and the attention statistics of the scaling ablation's models."""
  result = cell_result(cell, read_metrics(cell.workdir), hardware)
  same_run = find_record(cell, store)
  if same_run and same_run["values"]["wall_seconds"] == result.wall_seconds:  # recorded from this run
    result.hardware = same_run["machine"]
    result.tokenizers = result.tokenizers or same_run["values"].get("tokenizers", "")
  if cell.ablation == "scaling":
    result.attention = {replica: attention_statistics(cell.workdir, cell.replica_offset + replica)
                        for replica in range(cell.num_seeds)}
  return result


def recorded_results(cells: list[Cell], store: report.RecordStore):
  """What the page shows of ``cells``: ``(results, unfinished)``, ablation -> the ``CellResult``s of the records
  in ``store`` whose config agrees with the cell's, in variant order (an ablation whose reference has no record
  is left out), and the cells without one."""
  results, unfinished = {}, []
  for cell in cells:
    record = find_record(cell, store)
    if record is None:
      unfinished.append(cell.name)
    else:
      results.setdefault(cell.ablation, []).append(recorded_result(cell, record))
  references = {cell.ablation: cell.name for cell in reversed(cells)}  # each ablation's first cell
  results = {name: rows for name, rows in results.items() if rows[0].cell.name == references[name]}
  return results, tuple(dict.fromkeys(unfinished))


def main(argv: list[str] | None = None) -> None:
  parser = report.results_parser(__doc__, "WORKDIR_ROOT/results", default_root=DEFAULT_ROOT, hardware=True)
  parser.add_argument("--ablation", type=report.comma_list, default=["all"],
                      help=f"Comma-separated ablations, or 'all': {', '.join(ABLATIONS)}.")
  parser.add_argument("--task", default="synthetic", choices=list(common.TASKS),
                      help="The base: synthetic (reversal) or multi30k.")
  parser.add_argument("--ignore_recorded", action="store_true",
                      help="Train every unfinished cell, even one whose result is recorded.")
  report.add_boolean_argument(parser, "train", True, "Train the cells that have neither a finished run nor a "
                              "record. --notrain writes the page from what has finished and lists the rest as not "
                              "finished (e.g. at a session's end, while the grid still trains).")
  parser.add_argument("--launch_flag", action="append", default=[], help="Passed to every launch.py run, e.g. "
                      "--launch_flag=--config.task.source_dir=../shared/data/multi30k; repeat for several. A "
                      "--config.KEY=VALUE flag (other than where the data lives) is part of every cell's config: "
                      "--config.num_train_steps sets the step target, and a record made without the flag does not "
                      "stand in for a cell.")
  args = parser.parse_args(argv)
  root = os.path.abspath(args.workdir_root)
  task = args.task
  names = list(ABLATIONS) if args.ablation == ["all"] else args.ablation
  for name in names:
    report.exit_on_user_error(ablation_module, name)
  committed = os.path.join(report.COMMITTED, "ablations", *(() if task == "synthetic" else (task,)))
  cells = report.exit_on_user_error(expand_grid, names, task, root, launch_flags=tuple(args.launch_flag))
  invocation = "python -m experiments.ablations_results" + (
      f" --ablation={','.join(args.ablation)}" if args.ablation != ["all"] else "") + (
      f" --task={task}" if task != "synthetic" else "") + " --workdir_root=WORKDIR_ROOT"  # a local folder

  def collect(store: report.RecordStore, folder: str) -> None:
    gather(cells, store, report.launch if args.train else None, tuple(args.launch_flag), args.ignore_recorded,
           args.hardware)

  def render(store: report.RecordStore, folder: str) -> str:
    results, unfinished = recorded_results(cells, store)
    if unfinished:
      print(f"not finished, left out of the page: {', '.join(unfinished)}")
    return render_page(folder, results, invocation, task, unfinished)

  report.make_page(args, committed, os.path.join(root, "results"), collect, render)


if __name__ == "__main__":
  main()
