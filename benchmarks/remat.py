"""Rematerialisation and the optimizer: the train step's planned memory and time under each ModelConfig.remat
policy, and with Adafactor (``config.optimizer.name``) in place of Adam.

    python -m benchmarks.remat                     # transformer_base; bfloat16 at batch 256 on an accelerator
    python -m benchmarks.remat --smoke             # seconds, prints only

For each policy of ``transformer.nn.config.REMAT_POLICIES`` ("none" keeps every activation for the backward
pass, "dots" the matmul outputs without batch dimensions, "full" only each layer's input): the train step as
``benchmarks/train_step.py`` builds it (the task's loss, Adam, the state donated), compiled at ``--batch``;
the peak memory XLA plans for it (``measure.memory_stats``), and its time per step twice: each call waited for
(as ``train_step.py`` times), and ``--back_to_back`` calls dispatched without waiting (as the training loop
runs: it never waits for a step), policies taking turns. The same without remat with Adafactor: its optimizer
state beside Adam's (bytes of the state's optimizer part) and the step's planned peak. Then at ``--fit_batch``
the steps are compiled only, not run: their planned peaks against ``--memory_limit_gib`` (default: the memory
this device has free).

Target: at ``--fit_batch``, "full" fits under the limit where "none" does not. XLA:CPU's memory plan does not
shrink with rematerialisation (its buffer assignment keeps the same peak), so on a CPU the peaks only say so.

``--fit_search`` answers another question, in a section of its own (``remat_fit``): for each policy of
``--fit_policies``, the largest batch whose train step compiles and runs one step (the state donated) on the
device. From ``--fit_start`` the batch doubles until a batch fails, then the search bisects between the largest
that fit and the smallest that failed, to multiples of ``--fit_resolution``. The compiled steps' planned peaks
pick the probes while they agree with the limit (the next batch is where the line through them crosses it; after
a probe they mispredict, the search steps away from it, then halves: ``FitSearch``), so a search takes a few
compilations, not one per halving. A probe compiles the step, runs it once and frees everything (arrays,
compiled programs) before the next; the policies take turns, one probe each, so a spent ``--time_budget_s``
leaves every policy a bracket (largest that fit, smallest that failed), and a note. What "fails" means:

- without ``--memory_limit_gib`` on an accelerator: XLA runs out of device memory compiling or running the step
  (a ``jax.errors.JaxRuntimeError`` saying RESOURCE_EXHAUSTED or out of memory); the device's own limit is its
  allocator's (``bytes_limit``: 75% of the device unless ``XLA_PYTHON_CLIENT_MEM_FRACTION`` says otherwise),
  named in the notes with the memory free at the start. Any other error is a real one and stops the run.
- with ``--memory_limit_gib``, and always on a CPU (which has no device memory limit; default there: the host's
  available memory): the compiled step's planned peak (``measure.memory_stats``) above the limit, not run.

    python -m benchmarks.remat --fit_search --fit_start 1024 --fit_resolution 64   # an accelerator
    python -m benchmarks.remat --fit_search --smoke                # seconds: policy none, a 2 MiB planned limit
"""
from __future__ import annotations

import dataclasses
import gc
import os
import sys
import time

import jax

from benchmarks import common, measure
from benchmarks.train_step import compile_step, experiment_config, random_batch
from experiments.record_store import host_description
from transformer.nn.config import REMAT_POLICIES
from transformer.train.config import build_task


def add_arguments(parser):
  parser.add_argument("--config", default="transformer_base", help="the multi30k.py variant whose model is used")
  parser.add_argument("--dtype", default=None, choices=["float32", "bfloat16"],
                      help="compute dtype (default: bfloat16 on an accelerator, float32 on a CPU)")
  parser.add_argument("--batch", type=common.positive_int, default=None,
                      help="examples per step (default: 256 on an accelerator, 8 on a CPU)")
  parser.add_argument("--length", type=common.positive_int, default=64, help="source and target tokens per example")
  parser.add_argument("--back_to_back", type=common.positive_int, default=10,
                      help="calls dispatched without waiting per timed sample")
  parser.add_argument("--fit_batch", type=common.positive_int, default=None,
                      help="the batch compiled (not run) against the memory limit (default: 16 x --batch)")
  parser.add_argument("--memory_limit_gib", type=common.positive_float, default=None,
                      help="the limit a step must fit in (default: this device's free memory; --fit_search on an "
                           "accelerator: none, a real out-of-memory error decides; --smoke: 2 MiB)")
  parser.add_argument("--fit_search", action="store_true",
                      help="instead of the timings: the largest batch per policy whose step compiles and runs")
  parser.add_argument("--fit_policies", nargs="+", choices=REMAT_POLICIES, help="default: all; --smoke: none")
  parser.add_argument("--fit_start", type=common.positive_int, default=None,
                      help="--fit_search's first batch, rounded up to --fit_resolution (default: --batch's default)")
  parser.add_argument("--fit_resolution", type=common.positive_int, default=None,
                      help="--fit_search stops when the largest batch that fit and the smallest that failed are "
                           "this close (default 8; --smoke 4)")


def compile_policies(args, batch_size: int, policies) -> dict:
  """policy -> ``train_step.CompiledStep`` of ``args.config``'s model at ``batch_size``, with Adam."""
  steps = {}
  for policy in policies:
    if common.out_of_time(args):
      break
    steps[policy] = compile_one(args, batch_size, policy, "adamw")
  return steps


def compile_one(args, batch_size: int, policy: str, optimizer: str):
  """The ``train_step.CompiledStep`` of ``args.config``'s model at ``batch_size`` with remat ``policy`` and
  ``optimizer`` (``config.optimizer.name``)."""
  config, model_config = experiment_config(args.config, args.smoke, dtype=args.dtype, remat=policy)
  config.optimizer.name = optimizer
  model = build_task(config).build_model(model_config)
  batch = random_batch(batch_size, args.length, args.length, model_config.vocab_size)
  step = compile_step(config, model, batch, smoke=args.smoke)
  print(f"batch {batch_size} remat={policy} {optimizer}: compiled in {step.compile_seconds:.1f} s, planned peak "
        f"{measure.mib(measure.memory_stats(step.compiled).peak):,.0f} MiB, optimizer state "
        f"{measure.mib(optimizer_state_bytes(step)):,.1f} MiB", flush=True)
  return step


def optimizer_state_bytes(step) -> int:
  """Bytes of the optimizer's state in ``step``'s train state (Adam: two moments the size of the parameters)."""
  return sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree.leaves(step.state.opt_state))


# ------------------------------------------------------------------------ the largest batch that fits

@dataclasses.dataclass(frozen=True)
class Probe:
  """One batch tried: whether its step fit, its planned peak (``None``: not compiled) and the plan's argument
  bytes (train state and batch: the part that hardly grows with the batch), how it ended, and its seconds."""
  batch: int
  fits: bool
  peak: int | None
  argument: int | None
  outcome: str  # "ran one step", "planned peak over the limit", "out of memory compiling", "... running"
  seconds: float = 0.0


class FitSearch:
  """The largest batch, a multiple of ``resolution``, that fits for one policy: ``next_batch`` to try, then
  ``record`` its ``Probe``, until ``done``.

  From ``start`` (rounded up to ``resolution``) the batch doubles until one fails (halves until one fits, if the
  start fails), then the search bisects between the largest that fit and the smallest that failed. The planned
  peaks pick the probes while they agree with ``limit`` (every fit planned at most ``limit``, every failure
  planned above it, where compiled): then the next batch is where the line through the two nearest plans (one
  plan and the arguments' bytes at batch 0, while only one is known) crosses ``limit``. A probe they mispredict
  (on a GPU: a step planned under the allocator's limit that still ran out, its limit less what it lost to
  fragmentation) turns the guide off: the boundary is then most likely just below that probe, so the next ones
  step away from it by ``resolution``, twice that, four times, ... while they fail and the step is under half
  the bracket, then the search halves the bracket. Batches are assumed to fit below one size and fail above it.
  """

  def __init__(self, start: int, resolution: int, limit: int | None):
    self.resolution, self.limit = resolution, limit
    self.start = -(-start // resolution) * resolution
    self.probes: list[Probe] = []
    self.guided = limit is not None
    self.mispredicted: int | None = None  # the index in ``probes`` of the probe that turned the guide off

  @property
  def largest(self) -> Probe | None:
    return max((probe for probe in self.probes if probe.fits), key=lambda probe: probe.batch, default=None)

  @property
  def smallest_failed(self) -> Probe | None:
    return min((probe for probe in self.probes if not probe.fits), key=lambda probe: probe.batch, default=None)

  def done(self) -> bool:
    fit, failed = self.largest, self.smallest_failed
    return failed is not None and failed.batch - (fit.batch if fit else 0) <= self.resolution

  def record(self, probe: Probe) -> None:
    self.probes.append(probe)
    if self.guided and probe.peak is not None and (probe.peak <= self.limit) != probe.fits:
      self.guided, self.mispredicted = False, len(self.probes) - 1

  def next_batch(self) -> int:
    fit, failed, step = self.largest, self.smallest_failed, self.resolution
    if not self.probes:
      return self.start
    guess = self._guess()
    if failed is None:  # growing: just past the plans' largest fit, else double
      return max(guess, fit.batch) + step if guess is not None else 2 * fit.batch
    low, high = (fit.batch if fit else 0), failed.batch
    middle = low + (high - low) // step // 2 * step  # halving (from a failed start, low is 0)
    if guess is not None:  # the plans' largest fit, or the batch above it once that fit
      candidate = guess if guess > low else guess + step
      if low < candidate < high:
        return candidate
    elif self.mispredicted is not None:  # away from the mispredicted probe, while the outcome stays its own
      anchor, since = self.probes[self.mispredicted], self.probes[self.mispredicted + 1:]
      if all(probe.fits == anchor.fits for probe in since):
        away = step * 2 ** len(since)
        candidate = anchor.batch + away if anchor.fits else anchor.batch - away
        if (middle < candidate < high) if not anchor.fits else (low < candidate < middle):  # not past halving
          return candidate
    return middle

  def _guess(self) -> int | None:
    """The largest multiple of ``resolution`` whose peak the plans' line puts at most ``limit``; ``None``
    while the plans do not guide (no limit, a misprediction, nothing compiled)."""
    if not self.guided:
      return None
    planned = [probe for probe in (self.largest, self.smallest_failed) if probe and probe.peak is not None]
    if len(planned) == 2:
      (x0, y0), (x1, y1) = ((probe.batch, probe.peak) for probe in planned)
    elif planned:
      (x0, y0), (x1, y1) = (0, planned[0].argument), (planned[0].batch, planned[0].peak)
    else:
      return None
    slope = (y1 - y0) / (x1 - x0)
    if slope <= 0:
      return None
    return max(0, int((x0 + (self.limit - y0) / slope) // self.resolution) * self.resolution)


def probe_batch(args, policy: str, batch_size: int, planned_limit: int | None) -> Probe:
  """Compile the step of ``policy`` at ``batch_size`` and run it once (``planned_limit``: a planned peak above it
  fails, not run); everything it made is freed before it returns. An error other than out-of-memory propagates."""
  started, step, stats = time.perf_counter(), None, None
  try:
    step = compile_one(args, batch_size, policy, "adamw")
    stats = measure.memory_stats(step.compiled)
    if planned_limit is not None and stats.peak > planned_limit:
      fits, outcome = False, "planned peak over the limit"
    else:
      jax.block_until_ready((step(), step.state))
      fits, outcome = True, "ran one step"
  except jax.errors.JaxRuntimeError as error:
    if not measure.is_out_of_memory(error):
      raise
    fits, outcome = False, "out of memory " + ("running" if stats else "compiling")
    print(f"batch {batch_size} remat={policy}: {outcome}: {str(error).splitlines()[0]}", flush=True)
  finally:
    del step  # the state, batch and executable; then what jit and XLA keep of them
    jax.clear_caches()
    gc.collect()
  return Probe(batch_size, fits, stats.peak if stats else None, stats.argument if stats else None, outcome,
               time.perf_counter() - started)


def search_fits(args, searches: dict[str, FitSearch], probe) -> list[str]:
  """Run ``searches`` (policy -> ``FitSearch``), the policies taking turns one ``probe(policy, batch)`` each,
  until all are done or the next probe would end past ``--time_budget_s`` (judged by the longest so far).
  Returns the policies left unfinished."""
  longest = 0.0
  while any(not search.done() for search in searches.values()):
    for policy, search in searches.items():
      if search.done():
        continue
      if common.out_of_time(args) or (args.time_budget_s is not None and
                                      time.monotonic() - args.started + longest > args.time_budget_s):
        return [policy for policy, search in searches.items() if not search.done()]
      result = probe(policy, search.next_batch())
      search.record(result)
      longest = max(longest, result.seconds)
  return []


def fit_search_report(args, start: int, accelerator: bool) -> common.Report:
  """``--fit_search``'s table: per policy the largest batch that fit, the smallest that failed, their planned
  peaks, and largest / none's largest."""
  resolution = args.fit_resolution or (4 if args.smoke else 8)
  start = args.fit_start or start
  policies = args.fit_policies or (["none"] if args.smoke else list(REMAT_POLICIES))  # a probe takes ~4 s in smoke
  free = measure.available_memory_bytes()  # on an accelerator its allocator's limit less what is in use
  if args.memory_limit_gib:
    planned_limit = int(args.memory_limit_gib * 2**30)
  elif args.smoke:
    planned_limit = 2 * 2**20  # the smoke model's step plans ~0.4 MiB at batch 2, ~56 KiB more per example
  else:
    planned_limit = None if accelerator else free
  searches = {policy: FitSearch(start, resolution, planned_limit or free) for policy in policies}
  unfinished = search_fits(args, searches, lambda policy, batch: probe_batch(args, policy, batch, planned_limit))

  report = common.Report(
      "remat", "Rematerialisation: the largest batch whose train step compiles and runs, per policy "
      "(benchmarks/remat.py --fit_search)",
      ["policy", "largest batch that fit", "its planned peak MiB", "smallest batch that failed",
       "its planned peak MiB", "how it failed", "largest / none", "probes", "search s"], section="remat_fit")
  largest = {policy: search.largest.batch if search.largest else None for policy, search in searches.items()}
  for policy, search in searches.items():
    fit, failed = search.largest, search.smallest_failed
    report.rows.append([policy, fit.batch if fit else None, planned_mib(fit), failed.batch if failed else None,
                        planned_mib(failed), failed.outcome if failed else None,
                        measure.ratio(largest[policy], largest.get("none")), len(search.probes),
                        sum(probe.seconds for probe in search.probes)])
    report.ratios[f"{policy} largest batch"] = measure.ratio(largest[policy], largest.get("none"))
  if planned_limit is None:
    meaning = ("XLA raised no out-of-memory error compiling or running it (a real one, no planned limit); the "
               f"device's memory: {device_memory_text(free)}")
  else:
    source = ("--memory_limit_gib" if args.memory_limit_gib else "--smoke's" if args.smoke else
              "the host's available memory: a CPU has no device memory limit")
    meaning = (f"its planned peak (XLA's memory analysis of the compiled step) was at most "
               f"{measure.mib(planned_limit):,.2f} MiB ({source}); a step planned above it is not run")
  report.notes += [
      f"multi30k.py:{args.config}'s model, {args.dtype} compute (parameters and Adam float32), dropout as "
      f"configured; batch x {args.length} source + {args.length} target tokens. A batch fits when its train step "
      f"(Adam, state donated) compiled and ran one step, and {meaning}.",
      f"Search: from batch {searches[policies[0]].start}, doubling until a batch failed, then bisecting to "
      f"multiples of {resolution}; the planned peaks picked the probes while they agreed with the outcomes "
      f"(limit {measure.mib(planned_limit or free):,.2f} MiB); policies taking turns, everything freed between "
      "probes. Probes in order: "
      + "; ".join(f"{policy} " + ", ".join(f"{probe.batch} {'fit' if probe.fits else 'failed'}"
                                          for probe in search.probes) for policy, search in searches.items()) + ".",
  ]
  if unfinished:
    report.notes.append(f"Not finished within --time_budget_s={args.time_budget_s:g}: {', '.join(unfinished)}; "
                        "their rows are the bracket found so far (largest that fit, smallest that failed).")
  if not accelerator:
    report.notes.append("On a CPU XLA's memory plan does not shrink with rematerialisation: measure on an "
                        "accelerator.")
  return report


def planned_mib(probe: Probe | None) -> float | None:
  return measure.mib(probe.peak) if probe and probe.peak is not None else None


def device_memory_text(free: int) -> str:
  """The default device's allocator limit (``memory_stats()['bytes_limit']``), the memory ``free`` at the start,
  and the environment variables that set the limit."""
  device = jax.devices()[0]
  stats = (device.memory_stats() if hasattr(device, "memory_stats") else None) or {}
  limit = f"allocator limit {measure.mib(stats['bytes_limit']) / 1024:,.2f} GiB, " if "bytes_limit" in stats else ""
  settings = [f"{name}={os.environ[name]}" for name in ("XLA_PYTHON_CLIENT_MEM_FRACTION", "XLA_CLIENT_MEM_FRACTION",
                                                         "XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_PYTHON_CLIENT_ALLOCATOR")
              if name in os.environ]
  return f"{limit}{measure.mib(free) / 1024:,.2f} GiB free at the start" + (
      f" ({', '.join(settings)})" if settings else "")

def main(argv=None) -> common.Report:
  args = common.parse_args(__doc__.splitlines()[0], argv, add_arguments)
  accelerator = jax.default_backend() != "cpu"
  args.dtype = args.dtype or ("bfloat16" if accelerator else "float32")
  batch_size = 2 if args.smoke else args.batch or (256 if accelerator else 8)
  args.length = 8 if args.smoke else args.length
  fit_batch = args.fit_batch or 16 * batch_size
  if not args.smoke:
    measure.disable_persistent_cache()
  machine = host_description(load_average=True)
  if args.fit_search:
    return common.finish(fit_search_report(args, batch_size, accelerator), args, argv, machine)
  limit = args.memory_limit_gib * 2**30 if args.memory_limit_gib else measure.available_memory_bytes()

  steps = {(policy, "adamw"): step for policy, step in compile_policies(args, batch_size, REMAT_POLICIES).items()}
  if not common.out_of_time(args):  # Adafactor's factored moments beside Adam's two, without remat
    steps["none", "adafactor"] = compile_one(args, batch_size, "none", "adafactor")
  waited = measure.time_interleaved(steps, warmup=args.warmup, repeats=args.repeats)
  back_to_back = measure.time_interleaved(steps, warmup=args.warmup, repeats=args.repeats,
                                          back_to_back=args.back_to_back)
  report = common.Report(
      "remat", "Rematerialisation: planned memory and step time per policy (benchmarks/remat.py)",
      ["policy", "optimizer", "batch", "optimizer state MiB", "planned peak MiB", "peak / none", "step ms (each "
       "waited for)", f"step ms ({args.back_to_back} back to back)", "time / none (back to back)", "compile s"])
  peaks = {key: measure.memory_stats(step.compiled).peak for key, step in steps.items()}
  states = {key: optimizer_state_bytes(step) for key, step in steps.items()}
  reference = ("none", "adamw")
  for (policy, optimizer), step in steps.items():
    key = policy, optimizer
    report.rows.append([policy, optimizer, batch_size, measure.mib(states[key]), measure.mib(peaks[key]),
                        measure.ratio(peaks[key], peaks[reference]), 1e3 * waited[key].median,
                        1e3 * back_to_back[key].median,
                        measure.ratio(back_to_back[key].median, back_to_back[reference].median), step.compile_seconds])
    report.ratios[f"{policy} memory" if optimizer == "adamw" else f"{optimizer} memory"] = measure.ratio(
        peaks[key], peaks[reference])
  if ("none", "adafactor") in states:
    report.ratios["adafactor optimizer state"] = measure.ratio(states["none", "adafactor"], states[reference])
  del steps

  fit_steps = compile_policies(args, fit_batch, ("none", "full"))
  fits = {policy: measure.memory_stats(step.compiled).peak for policy, step in fit_steps.items()}
  del fit_steps
  if len(fits) < 2:
    report.notes.append(f"Batch {fit_batch}: {', '.join(sorted({'none', 'full'} - set(fits)))} not compiled: "
                        f"--time_budget_s={args.time_budget_s:g} spent.")
  for policy, peak in fits.items():
    report.rows.append([policy, "adamw", fit_batch, None, measure.mib(peak), measure.ratio(peak, fits.get("none")),
                        "not run", "not run", None, None])
  verdict = {policy: peak <= limit for policy, peak in fits.items()}
  met = verdict.get("full") and verdict.get("none") is False
  report.notes += [
      f"multi30k.py:{args.config}'s model, {args.dtype} compute (parameters and optimizer state float32), dropout "
      f"as configured; {batch_size} x {args.length} source + {args.length} target tokens. Optimizer state = the "
      f"bytes of the train state's optimizer part (adamw: two moments per parameter; adafactor, optax's: a row and "
      f"a column of second moments per matrix, no first moment). Planned peak = XLA's "
      f"memory analysis of the compiled step (arguments + outputs + temporaries - aliased). Times: median of "
      f"{args.repeats} samples after {args.warmup} warm-up, the policies taking turns.",
      f"Target (at batch {fit_batch}, 'full' fits under {measure.mib(limit) / 1024:.1f} GiB where 'none' does "
      f"not): " + (", ".join(f"{policy} {'fits' if fit else 'does not fit'}" for policy, fit in verdict.items())
                   + f" ({'met' if met else 'not met'})." if len(fits) == 2 else "not run (not both compiled)."),
  ]
  if not accelerator:
    report.notes.append("On a CPU XLA's memory plan does not shrink with rematerialisation: measure on an "
                        "accelerator.")
  return common.finish(report, args, argv, machine)


if __name__ == "__main__":
  main(sys.argv[1:])
