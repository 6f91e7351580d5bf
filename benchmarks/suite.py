"""Every GPU question in one command: the benchmarks in order, each in its own process, within a time budget.

    python -m benchmarks.suite                          # on a GPU: under 10 minutes, writes runs/benchmarks-<time>/
    python -m benchmarks.suite --parts=attention,train_step --output_dir=/tmp/bench
    python -m benchmarks.suite --smoke                  # CPU, tiny sizes: the dispatch and every script run
    bash benchmarks/gpu_suite.sh WHEEL_DIR OUTPUT_DIR   # a bare GPU machine: installs the missing wheels first

Parts (``PARTS``, in this order; ``--parts`` picks some, ``--skip`` leaves some out):

- ``time_to_bleu``: ``time_to_bleu.py``, Multi30k from an empty workdir to a test_2016_flickr BLEU;
- ``train_step``: ``train_step.py``, the base model in bfloat16 at batch 256: tokens/s, MFU against the measured
  and the theoretical matmul peak, PyTorch ``nn.Transformer`` eager and ``torch.compile``d beside it when torch
  is installed;
- ``attention``: ``attention.py``, forward and forward+backward, bfloat16 then float32, 128-4,096 tokens, ours
  (``kernels="auto"``) against ``jax.nn.dot_product_attention`` (cuDNN and XLA) and flax;
- ``step_profile``: ``step_profile.py``, the base step at batch 128 under the profiler: matmul efficiency, busy
  fraction, time per model part;
- ``decoding``: ``decoding.py``, greedy and beam search with and without the key/value cache, batch 1 and 64,
  256 output tokens;

and, by name only (``--parts=train_step_big`` or ``--parts=remat_fit``, one to a call: each fills one):

- ``train_step_big``: ``train_step.py``, base and Transformer (big) in bfloat16 against PyTorch eager and
  ``torch.compile`` at batch 512, ours also at 1,024;
- ``remat_fit``: ``remat.py --fit_search``, the largest batch of the base model each remat policy runs.

Each part runs as ``python -m benchmarks.<script>`` in a new process with a time limit: its share of
``--time_budget_s`` (``Part.share``) plus whatever the parts before it left unused. The script gets most of that
limit as its own ``--time_budget_s`` (it stops adding measurements and writes what it has); at the limit the
process group is sent SIGTERM, then SIGKILL. A crash, an out-of-memory or a timeout is a row of the summary,
and the next part runs. Each part writes its section of the same RESULTS.md (``--output_dir``, default a new
folder, printed at the end; ``--update_committed`` for benchmarks/RESULTS.md) and its output to
``<part>.log`` beside it; the suite adds its own section: each part's status, time and the host's load when
it started. The exit status is 1 when a part did not finish.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Callable, Sequence

# The parts share the GPU one after another; this process touches JAX only after they have all finished, and
# then must not take three quarters of the device memory.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

from benchmarks import common  # noqa: E402
from experiments.record_store import REPO, cpu_name, host_description, usable_cores  # noqa: E402

DEFAULT_BUDGET_S = 560.0  # under 10 minutes of one H100 with the wheels' install and this process's start
SOFT_SHARE = 0.75  # of a part's time limit, given to the script as --time_budget_s (it stops measuring then)
KILL_GRACE_S = 15.0  # between SIGTERM and SIGKILL at a part's time limit


@dataclasses.dataclass(frozen=True)
class Part:
  """One benchmark of the suite: ``python -m benchmarks.<script>`` with ``arguments`` (``smoke_arguments``
  with ``--smoke``), given ``share`` of the suite's time budget."""
  name: str
  script: str
  share: float
  arguments: tuple[str, ...] = ()
  smoke_arguments: tuple[str, ...] = ("--smoke",)


PARTS = (
    # First: the headline number, and the part whose length is known (training steps); a part that finishes
    # early leaves its time to the next. Shares sized from the first H200 run, whose time to BLEU and base-model
    # compilations were longer than the suite run's now in benchmarks/RESULTS.md (suite.gpu, time_to_bleu.gpu).
    Part("time_to_bleu", "time_to_bleu", 0.56, ("--eval_reserve_s", "40"), ()),
    # One batch size: each compiles for tens of seconds on a GPU, and torch.compile adds its own.
    Part("train_step", "train_step", 0.20,
         ("--configs", "transformer_base", "--dtype", "bfloat16", "--batch", "256", "--no_flax_stock",
          "--torch_compile", "--repeats", "10", "--warmup", "3"),
         ("--smoke", "--no_flax_stock", "--no_torch")),
    # bfloat16 first: where the GPU target is still open; the budget may cut the float32 rows (the notes say).
    Part("attention", "attention", 0.08,
         ("--dtypes", "bfloat16", "float32", "--budget_s", "4", "--repeats", "10", "--warmup", "2")),
    Part("step_profile", "step_profile", 0.10, ("--dtype", "bfloat16", "--batch", "128", "--steps", "10")),
    # Not every size of decoding.py: each row compiles two programs (tens of seconds each on a GPU, the
    # no-cache one a decoder per prefix bucket), and 8 rows did not finish in 150 s; the target's 256 tokens.
    Part("decoding", "decoding", 0.06, ("--lengths", "256", "--repeats", "3", "--budget_s", "10"),
         ("--smoke", "--searches", "greedy")),
    # Run by name only (not in DEFAULT_PARTS), each about one call's worth of device time: the big model beside
    # base against the PyTorch anchors, ours also at the batch that fills an 80 GB device; the largest batch each
    # remat policy runs.
    Part("train_step_big", "train_step", 0.5,
         ("--configs", "transformer_base", "transformer_big", "--dtype", "bfloat16", "--batch", "512", "1024",
          "--torch_compile", "--no_flax_stock", "--gpu_option_rows=none", "--repeats", "10", "--warmup", "3"),
         ("--smoke", "--configs", "transformer_big", "--no_flax_stock", "--no_torch")),
    Part("remat_fit", "remat", 0.5,
         ("--fit_search", "--config", "transformer_base", "--dtype", "bfloat16", "--length", "64", "--fit_start",
          "1024", "--fit_resolution", "64"),
         ("--smoke", "--fit_search")),
)
PART_NAMES = tuple(part.name for part in PARTS)
DEFAULT_PARTS = PART_NAMES[:5]


@dataclasses.dataclass
class PartResult:
  """What became of one part: ``status`` is "ok", "failed (exit N)", "timed out" or "skipped (why)"."""
  name: str
  status: str
  seconds: float
  limit_s: float
  host: str
  log: str


def host_at_start() -> str:
  """CPU model, cores and the 1-minute load average now (another job on the host skews timings)."""
  load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
  return f"{cpu_name()}, {usable_cores()} cores, load {load:.1f}"


def run_part(name: str, command: Sequence[str], limit_s: float, log_path: str,
             env: dict | None = None) -> PartResult:
  """Run ``command`` in a new process group, its output to ``log_path`` and to stdout; at ``limit_s`` the
  group gets SIGTERM and, ``KILL_GRACE_S`` later, SIGKILL."""
  host = host_at_start()
  start = time.monotonic()
  with open(log_path, "w") as log:
    log.write(f"$ {' '.join(command)}\n")
    log.flush()
    process = subprocess.Popen(list(command), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               errors="replace", start_new_session=True, cwd=REPO, env=env)

    def copy_output():
      for line in process.stdout:
        log.write(line)
        sys.stdout.write(f"[{name}] {line}")
        sys.stdout.flush()

    reader = threading.Thread(target=copy_output, daemon=True)
    reader.start()
    timed_out = False
    try:
      process.wait(timeout=max(limit_s, 0.1))
    except subprocess.TimeoutExpired:
      timed_out = True
      _signal_group(process, signal.SIGTERM)
      try:
        process.wait(timeout=KILL_GRACE_S)
      except subprocess.TimeoutExpired:
        _signal_group(process, signal.SIGKILL)
        process.wait()
    reader.join(timeout=5)
    seconds = time.monotonic() - start
    if timed_out:
      status = f"timed out after {seconds:.0f} s"
    elif process.returncode:
      status = f"failed (exit {process.returncode})"
    else:
      status = "ok"
    log.write(f"\n[suite] {name}: {status}\n")
  return PartResult(name, status, seconds, limit_s, host, log_path)


def _signal_group(process: subprocess.Popen, signum: int) -> None:
  try:
    os.killpg(process.pid, signum)
  except ProcessLookupError:  # already gone
    pass


def run_parts(planned: Sequence[tuple[str, float, Callable[[float], Sequence[str]]]], budget_s: float,
              log_dir: str, env: dict | None = None) -> list[PartResult]:
  """Run ``(name, share, command_for_limit)`` in order. A part's limit is ``share * budget_s`` plus what the
  parts before it left unused, at most what is left of the budget; ``command_for_limit(limit_s)`` builds its
  command. One failing or timing out does not stop the next."""
  results = []
  start = time.monotonic()
  shares_before = 0.0
  for name, share, command_for_limit in planned:
    shares_before += share
    elapsed = time.monotonic() - start
    limit = max(0.0, min(shares_before * budget_s - elapsed, budget_s - elapsed)) if shares_before else 0.0
    if limit < 1.0:
      results.append(PartResult(name, "skipped (time budget spent)", 0.0, limit, host_at_start(), ""))
      continue
    print(f"[suite] {name}: time limit {limit:.0f} s", flush=True)
    results.append(run_part(name, command_for_limit(limit), limit, os.path.join(log_dir, f"{name}.log"), env))
    print(f"[suite] {name}: {results[-1].status} in {results[-1].seconds:.0f} s", flush=True)
  return results


def add_arguments(parser: argparse.ArgumentParser) -> None:
  parser.add_argument("--parts", default=",".join(DEFAULT_PARTS),
                      help=f"comma-separated parts to run, in the suite's order ({','.join(PART_NAMES)}; "
                      f"default {','.join(DEFAULT_PARTS)})")
  parser.add_argument("--skip", default="", help="comma-separated parts to leave out")
  parser.add_argument("--data_dir", default="", help="raw Multi30k files for time_to_bleu (see its --data_dir); "
                      "with --smoke, time_to_bleu runs only when this is given")


def chosen_parts(parts: str, skip: str) -> list[Part]:
  """The ``PARTS`` named in ``parts`` less those in ``skip``, in the suite's order.

  Raises:
    ValueError: a name that is not a part (the message lists them).
  """
  wanted = [name.strip() for name in parts.split(",") if name.strip()]
  skipped = [name.strip() for name in skip.split(",") if name.strip()]
  unknown = [name for name in wanted + skipped if name not in PART_NAMES]
  if unknown:
    raise ValueError(f"unknown part(s) {', '.join(unknown)}; choose from {', '.join(PART_NAMES)}")
  chosen = [part for part in PARTS if part.name in wanted and part.name not in skipped]
  for script in {part.script for part in chosen}:
    same = [part.name for part in chosen if part.script == script]
    if len(same) > 1:  # each would write the script's one section of the page
      raise ValueError(f"parts {' and '.join(same)} both run {script}.py; choose one of them per call")
  return chosen


def part_command(part: Part, args: argparse.Namespace, output_dir: str | None, limit_s: float) -> list[str]:
  """``python -m benchmarks.<script>`` for ``part``: its arguments, where to write, and its own time budget."""
  command = [sys.executable, "-m", f"benchmarks.{part.script}",
             *(part.smoke_arguments if args.smoke else part.arguments)]
  if part.script == "time_to_bleu":
    command += ["--time_budget_s", f"{max(limit_s - KILL_GRACE_S, 1.0):.0f}"]  # it keeps its own reserve
    if args.data_dir:
      command += ["--data_dir", args.data_dir]
  else:
    command += ["--time_budget_s", f"{SOFT_SHARE * limit_s:.0f}"]
  if args.update_committed:
    command.append("--update_committed")
  elif output_dir:
    command += ["--output_dir", output_dir]
  return command


def main(argv=None) -> common.Report:
  def more_arguments(parser):
    add_arguments(parser)
    parser.set_defaults(time_budget_s=DEFAULT_BUDGET_S)

  args = common.parse_args(__doc__.splitlines()[0], argv, more_arguments)
  try:
    parts = chosen_parts(args.parts, args.skip)
  except ValueError as error:
    sys.exit(f"error: {error}")
  output_dir = os.path.dirname(args.results_path) if args.results_path else None
  log_dir = output_dir or tempfile.mkdtemp(prefix="benchmarks-suite-")
  os.makedirs(log_dir, exist_ok=True)
  skipped = []
  if args.smoke and not args.data_dir and any(part.name == "time_to_bleu" for part in parts):
    parts = [part for part in parts if part.name != "time_to_bleu"]
    skipped.append(PartResult("time_to_bleu", "skipped (--smoke without --data_dir)", 0.0, 0.0, "", ""))
  total_share = sum(part.share for part in parts) or 1.0
  planned = [(part.name, part.share / total_share,
              lambda limit, part=part: part_command(part, args, output_dir, limit)) for part in parts]
  results = run_parts(planned, args.time_budget_s, log_dir) + skipped

  machine = host_description(load_average=True)  # JAX starts in this process only now, the parts done
  report = common.Report(
      "suite", "Benchmark suite: each part in its own process (benchmarks/suite.py)",
      ["part", "status", "seconds", "time limit s", "host at start (CPU, cores, 1-minute load)", "log"])
  for result in results:
    report.rows.append([result.name, result.status, result.seconds, result.limit_s, result.host,
                        os.path.basename(result.log) if result.log else "-"])
  finished = [result for result in results if result.status == "ok"]
  ran = [result for result in results if not result.status.startswith("skipped")]
  report.ratios["parts finished / run"] = len(finished) / max(1, len(ran))
  report.notes += [
      f"Time budget {args.time_budget_s:g} s; each part's limit is its share plus what the parts before it left "
      f"unused; a script stops measuring at {SOFT_SHARE:.0%} of its limit (time_to_bleu: its limit less "
      f"{KILL_GRACE_S:g} s, its evaluation reserve inside), then SIGTERM and SIGKILL at the limit.",
      f"Each part's section follows in this page; its output is in the log named here (in {log_dir}).",
  ]
  report = common.finish(report, args, argv, machine)
  print(f"\nsuite: {len(finished)} of {len(ran)} parts run ok ({len(results) - len(ran)} skipped); logs in "
        f"{log_dir}"
        + (f"; results in {args.results_path}" if args.results_path else ""), flush=True)
  return report


if __name__ == "__main__":
  suite_report = main(sys.argv[1:])
  if any(row[1] != "ok" and not row[1].startswith("skipped") for row in suite_report.rows):
    sys.exit(1)
