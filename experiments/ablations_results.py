r"""Run the ablation grid (variants x seeds) and write its results page: RESULTS.md and one plot per ablation.

    python -m experiments.ablations_results --workdir_root=/tmp/ablations                   # all seven
    python -m experiments.ablations_results --ablation=heads,norms --workdir_root=/tmp/ablations
    python -m experiments.ablations_results --workdir_root=/tmp/ablations --update_committed
    python -m experiments.ablations_results --task=multi30k --workdir_root=/tmp/ablations_m30k \
        --launch_flag=--config.task.source_dir=../shared/data/multi30k
    python -m experiments.ablations_results --from_records --update_committed   # the page again, no workdirs

Each cell, ``<workdir_root>/<ablation>/<variant>``, is one ``launch.py`` run of ``config.num_seeds`` seeds (a
finished cell is skipped, another resumes). The page is written from the cells' records in ``records.json`` beside
it, a cell without a finished run from a record of the same run whose config agrees with its own; it goes to
``experiments/ablations/`` (``multi30k/`` for ``--task=multi30k``) with ``--update_committed``. More:
experiments/ablations/README.md; the pages' prose is ``experiments/ablations/page_template.md``.
"""
from __future__ import annotations

import os

import numpy as np

from experiments import launching, pages, record_store, stats
from experiments.ablations import common
from experiments.ablations_scores import (METRICS, CellResult, above_the_line, attention_rows, comparison, gather,
                                         recorded_results)
from experiments.launching import ABLATIONS, ablation_module, config_disagreement
from transformer import plot
from transformer.errors import exit_on_user_error

DEFAULT_ROOT = "/tmp/ablations"
TEMPLATE = pages.read_template("ablations/page_template.md")  # both pages' prose
ATTENTION_HEADER = ["run", "attention", "entropy (nats)", "uniform entropy (nats)", "rows with max weight > 0.9"]
# The settings that tell a regularization table's cells from the base model (``against_base``), with their words.
REGULARIZATION_FIELDS = {"model.dropout_rate": "dropout", "model.attention_dropout_rate": "attention dropout",
                         "label_smoothing": "label smoothing"}


def against_base(cells: list[CellResult], results: dict[str, list[CellResult]], task: str) -> str:
  """The paragraph on the base model's settings and score against this table's closest cell; "" if there is none."""
  base = launching.flatten_config(common.multi30k_base() if task == "multi30k" else common.synthetic_base())
  differences = {result.cell.name: config_disagreement(result.cell.flat_config, base) for result in cells}
  base_results = [result for rows in results.values() for result in rows
                  if not config_disagreement(result.cell.flat_config, base)]
  if not differences[cells[0].cell.name] or not base_results:  # the reference is the base, or no table holds it
    return ""
  closest = min(cells, key=lambda result: len(differences[result.cell.name]))  # in the fewest fields
  fields = differences[closest.cell.name]
  metric, heading, digits = METRICS[task][0]
  base_score, score = base_results[0].per_seed[metric], closest.per_seed[metric]
  means = [np.nanmean(result.per_seed[metric]) for result in cells]
  text = TEMPLATE["against_base"].substitute(
      reference=cells[0].cell.variant, task=task, base_cells=", ".join(result.cell.name for result in base_results),
      settings=", ".join(f"{words} {base[field]}" for field, words in REGULARIZATION_FIELDS.items()),
      heading=heading, base_score=f"{np.mean(base_score):.{digits}f}", lowest=f"{min(means):.{digits}f}",
      highest=f"{max(means):.{digits}f}", closest=closest.cell.variant, score=f"{np.mean(score):.{digits}f}",
      changed=", ".join(f"{field} {closest.cell.flat_config[field]} against {base[field]}" for field in fields),
      statistics=f" ({stats.welch_text(score, base_score)})" if min(base_score.size, score.size) > 1 else "")
  if task == "multi30k":
    from experiments import multi30k
    text += " " + TEMPLATE["against_base_multi30k"].substitute(
        setting=" and ".join(f"{REGULARIZATION_FIELDS.get(field, field)} {base[field]}" for field in fields),
        steps=closest.steps, full_steps=f"{multi30k.get_config('transformer_small').num_train_steps:,}")
  return text


def plot_ablation(results: list[CellResult], path: str, title: str) -> None:
  """Left: the first metric, final, per variant (mean bar, a dot per seed); right: training loss, mean over seeds."""
  metric, heading, _ = METRICS[results[0].cell.task][0]
  with plot.figure(path, 1, 2, (11, 3.8), dpi=100) as (figure, ((bars, curves),)):
    for index, result in enumerate(results):
      values = result.per_seed.get(metric, np.array([np.nan]))
      bars.bar(index, np.nanmean(values) if np.isfinite(values).any() else 0.0, color=f"C{index}", alpha=0.6)
      bars.scatter(np.full(values.size, index), values, color="black", s=12, zorder=3)
      losses = np.array([loss for _, loss in result.train_loss], np.float64)
      curves.plot([step for step, _ in result.train_loss], np.nanmean(losses, axis=1), color=f"C{index}",
                  label=result.cell.variant)
    bars.set_xticks(range(len(results)), [r.cell.variant for r in results], rotation=20, ha="right")
    bars.set(ylabel=f"{heading} (final, per seed)", ylim=(0, 1.02 if metric == "eval/exact_match" else None))
    bars.grid(alpha=0.3, axis="y")
    curves.set(yscale="log", xlabel="step", ylabel="training loss (mean over seeds)")
    curves.grid(alpha=0.3)
    curves.legend(fontsize=8)
    figure.suptitle(title)


def task_setting(task: str) -> str:
  """The page's paragraph on the task, the models and the budget."""
  if task == "synthetic":
    return TEMPLATE["synthetic_setting"].substitute()
  from experiments.ablations import rnn_attention
  base = common.multi30k_base()
  model = base.model
  rnn = rnn_attention.get_config(f"{next(iter(rnn_attention.ABLATION.variants))},multi30k")
  schedule = lambda optimizer: TEMPLATE["schedule"].substitute(
      learning_rate=f"{optimizer.learning_rate:g}", warmup_steps=optimizer.warmup_steps,
      decay=optimizer.schedule.replace("_", " "))
  return TEMPLATE["multi30k_setting"].substitute(
      layers=f"{model.num_encoder_layers}+{model.num_decoder_layers}", d_model=model.d_model,
      norm_position=model.norm_position, dropout=f"{model.dropout_rate:g}",
      attention_dropout=f"{model.attention_dropout_rate:g}", label_smoothing=f"{base.label_smoothing:g}",
      schedule=schedule(base.optimizer), rnn_hidden=rnn.model.hidden_dim, rnn_embedding=rnn.model.embedding_dim,
      rnn_schedule=schedule(rnn.optimizer), max_tokens=f"{base.task.max_tokens:,}", steps=base.num_train_steps,
      beam_size=base.decode.beam_size)


def table_row(result: CellResult) -> list:
  """A cell's row: its metrics (mean ± std over seeds), divergence, budget, wall time, hardware and command."""
  cell = result.cell
  return [cell.name, *(stats.mean_std(result.per_seed[metric], digits) if metric in result.per_seed else "n/a"
                       for metric, _, digits in METRICS[cell.task]),
          f"{result.diverged} of {cell.num_seeds}", result.steps, cell.num_seeds, f"{result.wall_seconds:.0f} s",
          result.hardware, f"`{result.command}`"]


def divergence_note(cells: list[CellResult], task: str) -> str:
  """Why each diverged seed counts as diverged (its final loss, or a bad step); "" where no seed diverged."""
  notes = []
  for result in (result for result in cells if result.diverged):
    losses = np.array([loss for _, loss in result.train_loss], np.float64)
    above = [str(seed) for seed in np.flatnonzero(above_the_line(losses, task))]
    other = result.diverged - len(above)
    why = ([f"seed {', '.join(above)} above the line"] if above else []) + (
        [f"{other} with a non-finite or skipped step"] if other > 0 else [])
    notes.append(f"{result.cell.variant}: {' and '.join(why)} (final training losses of its seeds: "
                 + ", ".join(f"{loss:.3f}" for loss in losses[-1]) + ")")
  line = common.DIVERGED_LOSS[task]
  near = sorted({f"{loss:.3f}" for result in cells if result.diverged
                 for loss in np.array([loss for _, loss in result.train_loss], np.float64)[-1]
                 if line < loss <= line + common.NEAR_THE_LINE})
  near_note = (f" Near the line (within {common.NEAR_THE_LINE} nats above it): {', '.join(near)}; such a count hangs "
               "on where the line is drawn." if near else "")
  return TEMPLATE["diverged"].substitute(loss=line, seeds="; ".join(notes), near=near_note) if notes else ""


def ablation_section(name: str, cells: list[CellResult], results: dict[str, list[CellResult]], task: str,
                     output: str) -> str:
  """One ablation's section (``cells``: in variant order, the first the reference); draws ``output/<name>.png``."""
  ablation = ablation_module(name).ABLATION
  header = ["run", *(heading for _, heading, _ in METRICS[task]), "diverged", "steps", "seeds", "wall time",
            "hardware", "command"]
  plot_ablation(cells, os.path.join(output, f"{name}.png"), ablation.title)
  reading = "\n".join(f"- {comparison(result, cells[0])}" for result in cells[1:]) + tokenizer_caveat(cells)
  if len(cells) > 1:  # only the reference finished: nothing to compare yet
    reading = f"Against the reference ({cells[0].cell.variant}), {METRICS[task][0][1]}:\n{reading}"
  notes = [divergence_note(cells, task), against_base(cells, results, task) if ablation.against_base else ""]
  reading += "".join(f"\n\n{note}" for note in notes if note)
  text = TEMPLATE["ablation"].substitute(
      title=ablation.title, question=ablation.question, name=name, reading=reading,
      table=pages.markdown_table(header, [table_row(result) for result in cells]),
      note=f"\n{ablation.note}\n" if ablation.note else "") + "\n"
  if attention := [row for result in cells for row in attention_rows(result)]:
    text += f"\n{TEMPLATE['attention'].substitute()}\n\n{pages.markdown_table(ATTENTION_HEADER, attention)}\n"
  return text


def page_notes(task: str, results: dict[str, list[CellResult]], unfinished: tuple[str, ...]) -> str:
  """What the page does not hold (the other task's page, ablations not run, cells not finished) and tokenizers."""
  if task == "synthetic":
    base = common.multi30k_base()
    page = os.path.exists(os.path.join(record_store.COMMITTED, "ablations", "multi30k", "RESULTS.md"))
    notes = [TEMPLATE["multi30k_page"].substitute(steps=base.num_train_steps, seeds=base.num_seeds, link=(
        "[multi30k/RESULTS.md](multi30k/RESULTS.md)." if page else "not run yet."))]
    if task in common.RERUN_ON:
      notes.append(TEMPLATE["rerun"].substitute(date=common.RERUN_ON[task]))
  else:
    not_run = [name for name in ABLATIONS if name not in results]
    notes = [TEMPLATE["not_run_on_multi30k"].substitute(ablations=", ".join(not_run))] if not_run else []
    if task in common.NOT_REPRODUCED:
      notes.append(TEMPLATE["not_reproduced"].substitute(code=common.NOT_REPRODUCED[task]))
  if unfinished:
    notes.append(TEMPLATE["unfinished"].substitute(cells=", ".join(unfinished)))
  return "".join(f"{note}\n\n" for note in ("\n\n".join(notes), tokenizer_summary(results)) if note)


def render_page(output: str, results: dict[str, list[CellResult]], invocation: str, task: str,
                unfinished: tuple[str, ...] = ()) -> str:
  """The page's text (``results``: ablation -> its cells' results, reference first); draws the plots in ``output``."""
  return TEMPLATE["page"].substitute(
      invocation=invocation, machine=record_store.machine_description(), setting=task_setting(task),
      diverged_loss=common.DIVERGED_LOSS[task], diverged_meaning=common.DIVERGED_MEANING[task], notes=page_notes(task, results, unfinished),
      sections="\n".join(ablation_section(name, cells, results, task, output) for name, cells in results.items()))


def tokenizer_caveat(cells: list[CellResult]) -> str:
  """A line for a table whose cells tokenized with different SentencePiece models, or may have; "" otherwise."""
  known = {result.tokenizers for result in cells if result.tokenizers}
  unknown = any(not result.tokenizers for result in cells)  # another host can train another model from the same text
  if len(known) <= 1 and not (unknown and len({result.hardware for result in cells}) > 1):
    return ""
  return "\n" + TEMPLATE["tokenizers_differ" if len(known) > 1 else "tokenizers_may_differ"].substitute(
      which="; ".join(f"{result.cell.variant}: {result.tokenizers or 'not recorded'}" for result in cells))


def tokenizer_summary(results: dict[str, list[CellResult]]) -> str:
  """The cells grouped by the SentencePiece model their runs tokenized with, and by hardware; "" if none is known."""
  groups: dict[str, dict[str, list[str]]] = {}
  for result in (result for cells in results.values() for result in cells):
    groups.setdefault(result.tokenizers, {}).setdefault(result.hardware, []).append(result.cell.name)
  if not set(groups) - {""}:  # no run kept its tokenizers: nothing to tell apart
    return ""
  return TEMPLATE["tokenizers"].substitute(models="\n".join(
      f"- {fingerprint or 'not recorded (the run predates WORKDIR/tokenizers/)'}: "
      + "; ".join(f"{', '.join(names)} ({hardware})" for hardware, names in by_hardware.items())
      for fingerprint, by_hardware in sorted(groups.items(), key=lambda item: item[0] == "")))


def main(argv: list[str] | None = None) -> None:
  parser = pages.results_parser(__doc__, "WORKDIR_ROOT/results", default_root=DEFAULT_ROOT, hardware=True)
  parser.add_argument("--ablation", type=pages.comma_list, default=["all"],
                      help=f"Comma-separated ablations, or 'all': {', '.join(ABLATIONS)}.")
  parser.add_argument("--task", default="synthetic", choices=list(common.TASKS),
                      help="The base: synthetic (reversal) or multi30k.")
  parser.add_argument("--ignore_recorded", action="store_true",
                      help="Train every unfinished cell, even one whose result is recorded.")
  pages.add_boolean_argument(parser, "train", True, "Train the cells that have neither a finished run nor a "
                             "record. --notrain writes the page from what has finished and lists the rest as not "
                             "finished (e.g. at a session's end, while the grid still trains).")
  parser.add_argument("--launch_flag", action="append", default=[], help="Passed to every launch.py run, e.g. "
                      "--launch_flag=--config.task.source_dir=../shared/data/multi30k; repeat for several. A "
                      "--config.KEY=VALUE flag (other than where the data lives) is part of every cell's config: "
                      "--config.num_train_steps sets the step target, and a record made without the flag does not "
                      "stand in for a cell.")
  args = parser.parse_args(argv)
  root, task = os.path.abspath(args.workdir_root), args.task
  names = list(ABLATIONS) if args.ablation == ["all"] else args.ablation
  for name in names:
    exit_on_user_error(ablation_module, name)
  committed = os.path.join(record_store.COMMITTED, "ablations", *(() if task == "synthetic" else (task,)))
  cells = exit_on_user_error(launching.expand_grid, names, task, root, launch_flags=tuple(args.launch_flag))
  invocation = "python -m experiments.ablations_results" + (
      f" --ablation={','.join(args.ablation)}" if args.ablation != ["all"] else "") + (
      f" --task={task}" if task != "synthetic" else "") + " --workdir_root=WORKDIR_ROOT"  # a local folder
  train = launching.launch if args.train else None

  def render(store: record_store.RecordStore, folder: str) -> str:
    results, unfinished = recorded_results(cells, store)
    if unfinished:
      print(f"not finished, left out of the page: {', '.join(unfinished)}")
    return render_page(folder, results, invocation, task, unfinished)

  pages.make_page(args, committed, os.path.join(root, "results"), lambda store, folder: gather(
      cells, store, train, tuple(args.launch_flag), args.ignore_recorded, args.hardware), render)


if __name__ == "__main__":
  main()
