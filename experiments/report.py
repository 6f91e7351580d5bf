"""Shared pieces of the results scripts: read runs' metrics, write markdown tables and curve plots, and decide
where a page goes.

Every number in a RESULTS.md comes from a run's ``metrics.jsonl`` through these functions. A results script
writes into a folder of the user's (``--output_dir``, or its default, printed at the end); the committed pages
under ``experiments/<name>/`` are written only with ``--update_committed``, and there a row is only replaced by
a run of at least as many training steps as the one it records, unless ``--force``.
"""
from __future__ import annotations

import dataclasses
import datetime
import functools
import json
import math
import os
import platform
import shlex
import subprocess
import sys

from absl import flags
import jax

from transformer.errors import UserError, exit_on_user_error  # noqa: F401 (the scripts' one-line errors)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Where the committed pages live: experiments/<name>/RESULTS.md and what it links.
COMMITTED = os.path.join(REPO, "experiments")
# A hand-written note beside a results page: settings tried whose workdirs are gone (see runs_not_kept).
NOT_KEPT_NOTE = "runs_not_kept.md"


@dataclasses.dataclass(frozen=True)
class OutputFlags:
  """The flags that say where a results script writes (``output_flags``)."""
  output_dir: flags.FlagHolder
  update_committed: flags.FlagHolder
  force: flags.FlagHolder


@functools.cache  # defined once per process, whichever results script imports it first
def output_flags() -> OutputFlags:
  return OutputFlags(
      output_dir=flags.DEFINE_string(
          "output_dir", "", "Folder for the page (RESULTS.md, curves.png, ...); default: see the script's "
          "docstring. The folder is printed at the end."),
      update_committed=flags.DEFINE_bool(
          "update_committed", False, "Write into the committed experiments/<name>/ page instead of --output_dir; "
          "a row there is only replaced by a run of at least as many training steps (see --force)."),
      force=flags.DEFINE_bool(
          "force", False, "With --update_committed: replace committed rows even by runs of fewer training steps."))


@functools.cache  # one flag whichever results script defines it first; each script has its own default
def workdir_root_flag() -> flags.FlagHolder:
  return flags.DEFINE_string("workdir_root", "", "Where the runs' workdirs are: <root>/<variant> (default: the "
                             "script's own, in its docstring).")


@functools.cache  # as workdir_root_flag: results scripts imported together (the tests) share it
def hardware_flag() -> flags.FlagHolder:
  return flags.DEFINE_string("hardware", "", "Where the runs read trained, for the page (default: this "
                             "machine), e.g. '1 x NVIDIA H200, 16 cores' for workdirs copied back from a GPU host.")


def results_folder(output: OutputFlags, committed: str, default: str) -> str:
  """The folder a script writes its page to: ``committed`` with ``--update_committed``, else ``--output_dir``,
  else ``default``."""
  return choose_results_folder(output.output_dir.value, output.update_committed.value, output.force.value,
                               committed, default)


def choose_results_folder(output_dir: str, update_committed: bool, force: bool, committed: str,
                          default: str) -> str:
  """``results_folder`` on plain values (also for ``benchmarks/``, whose flags are argparse's): ``committed``
  with ``update_committed``, else ``output_dir``, else ``default``; a UserError for the combinations that
  would write the committed page by accident or say nothing."""
  if update_committed and output_dir:
    raise UserError("give either --output_dir (a page of your own) or --update_committed (the committed page "
                    f"{os.path.relpath(committed, REPO)}/), not both")
  if force and not update_committed:
    raise UserError("--force only applies with --update_committed (it lets shorter runs replace committed rows)")
  if update_committed:
    return committed
  folder = os.path.abspath(output_dir or default)
  if os.path.realpath(folder) == os.path.realpath(committed):
    raise UserError(f"--output_dir={output_dir} is the committed page; give --update_committed to "
                    "write there (rows are then only replaced by runs at least as long), or another folder")
  return folder


def runs_not_kept(output: str) -> str:
  """Markdown section: the hand-written ``output/runs_not_kept.md`` (settings tried whose workdirs are gone, so
  in no table), or "" when there is none."""
  path = os.path.join(output, NOT_KEPT_NOTE)
  if not os.path.exists(path):
    return ""
  with open(path) as f:
    note = f.read().strip()
  return (f"\n## Runs not kept\n\nSettings tried whose workdirs are gone, so they are in no table above "
          f"(hand-written in `{NOT_KEPT_NOTE}`, with the numbers their training printed):\n\n{note}\n")


def read_page(output: str) -> str:
  """The text of ``output/RESULTS.md``; empty when there is no page yet."""
  path = os.path.join(output, "RESULTS.md")
  if not os.path.exists(path):
    return ""
  with open(path) as f:
    return f.read()


def write_page(output: str, text: str) -> str:
  """Write ``text`` as ``output/RESULTS.md``; returns it."""
  with open(os.path.join(output, "RESULTS.md"), "w") as f:
    f.write(text)
  return text


def check_replacements(page: str, recorded_steps: dict[str, int], new_steps: dict[str, int]) -> None:
  """Refuses to replace a recorded row by a run of fewer training steps.

  Args:
    page: the page's file, for the message (e.g. ``experiments/multi30k/runs.json``).
    recorded_steps: row name -> training steps of the run the page records.
    new_steps: row name -> training steps of the run that would replace it.

  Raises:
    UserError: one line naming each refused row, both step counts and ``--force``.
  """
  shorter = [f"row {name!r} records a run of {recorded_steps[name]} training steps, the new one trained {steps}"
             for name, steps in new_steps.items() if name in recorded_steps and steps < recorded_steps[name]]
  if shorter:
    raise UserError(f"{page}: {'; '.join(shorter)}. A committed row is only replaced by a run at least as long: "
                    "give --force to replace it anyway, --run=NEW_ROW=VARIANT:WORKDIR for a row of its own, or "
                    "leave out --update_committed to write a page of your own.")


def machine_description() -> str:
  devices = jax.devices()
  cores = os.cpu_count()
  return (f"{len(devices)} x {devices[0].device_kind} ({platform.machine()}, {cores} CPU cores), "
          f"JAX {jax.__version__}, {datetime.date.today().isoformat()}")


def launch(config: str, workdir: str, overrides: tuple[str, ...] = ()) -> list[str]:
  """Run ``launch.py`` (resuming if ``workdir`` has checkpoints) with its progress output (a bar on a terminal,
  else a line per logging step: a grid of cells can train for hours); returns the command for the record."""
  run_launch([f"--config={config}", f"--workdir={workdir}", *overrides])
  return ["python", "launch.py", f"--config={config}", f"--workdir={workdir}", *overrides]


def run_launch(arguments: list[str]) -> None:
  """``python launch.py ARGUMENTS`` in the repository.

  Raises:
    UserError: it failed; its own error (one line, or a bug's traceback) is printed above, so the script's
      message is one line more, not a second traceback.
  """
  result = subprocess.run([sys.executable, "launch.py", *arguments], cwd=REPO)
  if result.returncode:
    raise UserError(f"python launch.py {command_line(arguments)} exited with status {result.returncode} (its "
                    "error is printed above)")


def series(records: list[dict], name: str) -> tuple[list[int], list[float]]:
  points = [(r["step"], r[name]) for r in records if name in r]
  return [p[0] for p in points], [p[1] for p in points]


def first_reaching(records: list[dict], name: str, threshold: float) -> dict | None:
  """The first record whose ``name`` is at least ``threshold``."""
  for record in records:
    if record.get(name, float("-inf")) >= threshold:
      return record
  return None


def markdown_table(header: list[str], rows: list[list]) -> str:
  lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
  lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
  return "\n".join(lines)


def read_markdown_table(text: str, first_column: str) -> list[dict[str, str]]:
  """The rows of the first table in markdown ``text`` whose header starts with ``first_column``, each as
  ``{column: cell}`` (the inverse of ``markdown_table`` for cells without ``|``); empty when there is none."""
  def cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]
  lines = text.splitlines()
  for index, line in enumerate(lines):
    if line.startswith("|") and cells(line)[0] == first_column:
      rows = []
      for body in lines[index + 2:]:  # after the header and its |---| line
        if not body.startswith("|"):
          break
        rows.append(dict(zip(cells(line), cells(body))))
      return rows
  return []


# Panels per row of a curves figure: a run with many metrics (a forecaster's per-horizon errors) reads as a grid.
MAX_PANEL_COLUMNS = 4


def panel_grid(num_panels: int) -> tuple[int, int]:
  """``(rows, columns)`` of a figure of ``num_panels`` panels: one row up to ``MAX_PANEL_COLUMNS``, then a grid."""
  columns = max(1, min(num_panels, MAX_PANEL_COLUMNS))
  return -(-num_panels // columns), columns


def plot_curves(runs: dict[str, list[dict]], metrics: list[str], path: str, title: str) -> None:
  """One panel per metric (``panel_grid``), one line per run (``name -> metric records``, as read by
  ``read_metrics``)."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  rows, columns = panel_grid(len(metrics))
  figure, axes = plt.subplots(rows, columns, figsize=(5 * columns, 3.6 * rows), squeeze=False)
  for axis in axes.flat[len(metrics):]:
    axis.set_visible(False)
  for axis, metric in zip(axes.flat, metrics):
    for name, records in runs.items():
      steps, values = series(records, metric)
      if not steps:
        continue
      axis.plot(steps, values, marker="." if len(steps) < 30 else None, label=name)
    axis.set_xlabel("step")
    axis.set_title(metric)
    if "loss" in metric:
      axis.set_yscale("log")
    axis.grid(alpha=0.3)
    if axis.get_legend_handles_labels()[0]:
      axis.legend()
  figure.suptitle(title)
  figure.tight_layout()
  figure.savefig(path, dpi=110)
  plt.close(figure)


def flatten_config(tree) -> dict:
  """A config (``ConfigDict`` or the dict of a ``config.json``) as ``{"a.b": value}``; tuples as lists."""
  if not isinstance(tree, dict):
    tree = json.loads(tree.to_json_best_effort())
  flat = {}
  for key, value in tree.items():
    if isinstance(value, dict):
      flat.update({f"{key}.{name}": inner for name, inner in flatten_config(value).items()})
    else:
      flat[key] = list(value) if isinstance(value, tuple) else value
  return flat


def config_overrides(variant_config, run_config, ignored: tuple[str, ...] = ()) -> list[str]:
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


# ------------------------------------------------------------------------------ comparing seeds of two runs
# Plain math, no scipy: the results scripts need no dependency beyond the package's for one p-value.


def regularized_incomplete_beta(x: float, a: float, b: float) -> float:
  """I_x(a, b), the regularized incomplete beta function, for 0 <= x <= 1 and a, b > 0.

  The continued fraction of Numerical Recipes (section 6.4, evaluated by the modified Lentz method); it
  converges fast for x < (a + 1) / (a + b + 2), and the symmetry I_x(a, b) = 1 - I_{1-x}(b, a) covers the rest.
  """
  if not 0.0 <= x <= 1.0:
    raise ValueError(f"regularized_incomplete_beta: x={x!r} is outside [0, 1]")
  if x in (0.0, 1.0):
    return x
  if x > (a + 1.0) / (a + b + 2.0):
    return 1.0 - regularized_incomplete_beta(1.0 - x, b, a)
  log_front = a * math.log(x) + b * math.log1p(-x) - (math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b))
  tiny, epsilon = 1e-300, 1e-15
  c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
  d = 1.0 / (d if abs(d) > tiny else tiny)
  fraction = d
  for m in range(1, 10_000):
    for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),  # the even step, then the odd
                      -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
      d = 1.0 + numerator * d
      d = 1.0 / (d if abs(d) > tiny else tiny)
      c = 1.0 + numerator / c
      c = c if abs(c) > tiny else tiny
      fraction *= c * d
    if abs(c * d - 1.0) < epsilon:
      break
  return math.exp(log_front) * fraction / a


def student_t_two_sided_p(t: float, df: float) -> float:
  """P(|T| >= |t|) for Student's t with ``df`` (not necessarily whole) degrees of freedom:
  I_{df / (df + t^2)}(df / 2, 1 / 2)."""
  if math.isinf(t):
    return 0.0
  return regularized_incomplete_beta(df / (df + t * t), df / 2.0, 0.5)


def welch_t_test(a, b) -> tuple[float, float, float]:
  """Welch's t-test of the means of two samples (seeds of two runs) without assuming equal variances.

  Args:
    a, b: the samples, each of at least 2 finite values (a sequence or 1-D array).

  Returns:
    ``(t, df, p)``: t = (mean(a) - mean(b)) / sqrt(var(a) / n_a + var(b) / n_b) with sample variances, its
    Welch-Satterthwaite degrees of freedom, and the two-sided p-value from Student's t. Both samples constant:
    t = +-inf and p = 0 when the means differ, t = nan and p = 1 when they do not; df is then nan.

  Raises:
    ValueError: a sample has fewer than 2 values (no variance to estimate), or a value that is not finite.
  """
  samples = [[float(value) for value in sample] for sample in (a, b)]
  for name, sample in zip("ab", samples):
    if len(sample) < 2 or not all(math.isfinite(value) for value in sample):
      raise ValueError(f"welch_t_test: sample {name}={sample!r} needs at least 2 values, all finite")
  means = [math.fsum(sample) / len(sample) for sample in samples]
  # The variance of each mean: the sample variance (n - 1 in the denominator) over n.
  mean_variances = [math.fsum((value - mean) ** 2 for value in sample) / (len(sample) - 1) / len(sample)
                    for sample, mean in zip(samples, means)]
  difference, variance = means[0] - means[1], sum(mean_variances)
  if variance == 0.0:
    return (math.copysign(math.inf, difference), math.nan, 0.0) if difference else (math.nan, math.nan, 1.0)
  t = difference / math.sqrt(variance)
  df = variance ** 2 / sum(v ** 2 / (len(sample) - 1) for v, sample in zip(mean_variances, samples))
  return t, df, student_t_two_sided_p(t, df)


def format_p_value(p: float) -> str:
  """``p = 0.093`` (three decimals), ``p < 0.001`` below that."""
  return "p < 0.001" if p < 0.001 else f"p = {p:.3f}"
