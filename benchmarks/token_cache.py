"""The tokenized training split cache: what does tokenizing once and memory-mapping after save each process?

    python -m benchmarks.token_cache            # the real sets under $TRANSFORMER_DATA_DIR: about 2 minutes
    python -m benchmarks.token_cache --smoke    # tiny made-up Multi30k and IWSLT'15 files (tests)

For each set (``SETS``: IWSLT'15 en-vi and Multi30k en-de translation, Multi30k en language model, each with its
experiment's config), the raw files are copied and prepared into a temporary folder (``config.task.source_dir``,
``config.task.data_dir``: nothing is written beside the shared data) and its tokenizers trained there, untimed.
Then, in rounds (``--warmup`` untimed, ``--repeats`` timed), each from a fresh ``build_task(config).data`` built
untimed (the prepared dataset, tokenizers and eval splits), seconds of:

- *uncached*: tokenizing the training split in memory, as every process did before the cache: the function
  ``transformer/data/token_cache.py`` calls on a miss (read the text, drop what is not kept, SentencePiece);
- *cold*: ``data.train`` with no cache entry: the same, plus writing the ``.npy`` arrays and their record (what
  process 0 does in ``Task.prepare_data``);
- *warm*: ``data.train`` again: the entry memory-mapped (what the other processes and a restart do). Pages are
  read on first touch, not here; right after the cold write they are in the page cache.

The warm examples are compared with the uncached ones, array by array with their dtypes, and the run stops with
an error if a single token differs. Ratio: warm / uncached median.
"""
from __future__ import annotations

import functools
import gc
import os
import pathlib
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np

from benchmarks import common
from benchmarks.measure import Timing
from experiments import iwslt15_en_vi, language_model, multi30k
from experiments.record_store import host_description
from transformer.data import batching, token_cache, translation
from transformer.data.download import ENV_VAR
from transformer.errors import UserError
from transformer.train.config import build_task

# row name -> (experiment module, variant, raw folder under the data dir)
SETS = {"IWSLT'15 en-vi": (iwslt15_en_vi, "transformer_small", "iwslt15_en_vi"),
        "Multi30k en-de": (multi30k, "transformer_small", "multi30k"),
        "Multi30k en (language model)": (language_model, "small", "multi30k")}
SMOKE_VOCAB_SIZE = 40  # the made-up fixture text has about 47 pieces (tests/tasks/test_language_model.py)
SMOKE_SIZES = {"multi30k": {"train": 300, "val": 20, "test_2016_flickr": 2, "test_2017_flickr": 2,
                            "test_2017_mscoco": 2, "test_2018_flickr": 2},
               "iwslt15_en_vi": {"train.10k": 300, "tst2012": 4, "tst2013": 3}}


def add_arguments(parser):
  parser.add_argument("--data_dir", default=os.environ.get(ENV_VAR, ""),
                      help=f"folder holding iwslt15_en_vi/ and multi30k/ raw files (default ${ENV_VAR})")


def raw_folders(args, scratch: str) -> dict[str, str | None]:
  """raw folder name -> a copy of it under ``scratch`` (``None`` when ``--data_dir`` lacks it); ``--smoke``: tiny
  made-up files in the real formats (``tests/data/data_fixtures.py``)."""
  folders = {}
  for name in {raw for _, _, raw in SETS.values()}:
    copy = os.path.join(scratch, "raw", name)
    if args.smoke:
      from tests.data import data_fixtures  # pylint: disable=import-outside-toplevel  # only the smoke run has it
      writer = data_fixtures.write_multi30k if name == "multi30k" else data_fixtures.write_iwslt
      writer(pathlib.Path(copy), sizes=SMOKE_SIZES[name])
      folders[name] = copy
    elif args.data_dir and os.path.isdir(os.path.join(args.data_dir, name)):
      shutil.copytree(os.path.join(args.data_dir, name), copy)
      folders[name] = copy
    else:
      folders[name] = None
  return folders


def uncached_tokenize(data) -> token_cache.Tokenize:
  """What ``data``'s training split cache calls on a miss: the last argument of the
  ``translation.training_examples`` partial behind ``TranslationData.tokenize_training_pairs`` and
  ``MonolingualData.tokenize_training_sentences``."""
  cached = getattr(data, "tokenize_training_pairs", None) or data.tokenize_training_sentences
  if not (isinstance(cached, functools.partial) and cached.func is translation.training_examples):
    raise TypeError(f"{type(data).__name__} no longer reads its training split through "
                    "translation.training_examples(..., tokenize): update benchmarks/token_cache.py")
  return cached.args[-1]


def check_identical(name: str, found: batching.TokenizedExamples, expected: batching.TokenizedExamples) -> None:
  """Raise AssertionError naming the set and array where the cached examples differ from fresh tokenizing."""
  for array in token_cache.DTYPES:
    found_array, expected_array = getattr(found, array), getattr(expected, array)
    if found_array.dtype != expected_array.dtype or not np.array_equal(found_array, expected_array):
      raise AssertionError(f"{name}: the memory-mapped {array} ({found_array.dtype} {list(found_array.shape)}) "
                           f"differ from fresh tokenizing ({expected_array.dtype} {list(expected_array.shape)})")


def measure_set(args, name: str, config, data_dir: str) -> tuple[dict[str, Timing], batching.TokenizedExamples]:
  """``({"uncached", "cold", "warm"} -> seconds per call, the kept training examples)`` of ``config``'s training
  split (``TokenizedExamples``: int32 ``[tokens]`` and int64 ``[examples + 1]`` offsets per side), in rounds;
  each round's warm examples checked against its uncached ones (AssertionError naming the set if not the same)."""
  build_task(config).prepare_data(training=False)  # TFDS preparation and SentencePiece training: untimed

  def drop_cache():
    for folder, _, _ in os.walk(data_dir):
      if os.path.basename(folder) == "tokenized":
        shutil.rmtree(folder)

  def timed(call):
    gc.collect()  # the garbage of the calls before is not this one's to collect
    start = time.perf_counter()
    result = call()
    return time.perf_counter() - start, result

  times = {"uncached": [], "cold": [], "warm": []}
  for round_index in range(args.warmup + args.repeats):
    seconds = {}
    seconds["uncached"], (fresh, _) = timed(uncached_tokenize(build_task(config).data))
    drop_cache()
    cold_data = build_task(config).data
    seconds["cold"], _ = timed(lambda: cold_data.train)
    warm_data = build_task(config).data
    seconds["warm"], warm = timed(lambda: warm_data.train)
    if warm.target_tokens.flags.writeable:  # not the read-only map: the cache was not written or not hit
      raise AssertionError(f"{name}: data.train did not memory-map the cache (a warning above says why)")
    check_identical(name, warm, fresh)
    if round_index >= args.warmup:
      for kind, value in seconds.items():
        times[kind].append(value)
    del cold_data, warm_data, warm  # each round starts with only the last fresh examples alive
  return {kind: Timing(statistics.median(values), min(values), tuple(values)) for kind, values in times.items()}, fresh


def spread(timing: Timing, scale: float) -> str:
  """``"median (min-max)"`` of ``timing`` in seconds x ``scale``."""
  return f"{timing.median * scale:,.2f} ({timing.minimum * scale:,.2f}-{max(timing.times) * scale:,.2f})"


def main(argv=None) -> common.Report:
  args = common.parse_args(__doc__.splitlines()[0], argv, add_arguments)
  machine = host_description(load_average=True)
  report = common.Report(
      "token_cache", "Tokenized training split: tokenize in memory vs write the cache vs memory-map it "
      "(benchmarks/token_cache.py)",
      ["set", "examples", "tokens (source + target)", "arrays MiB", "uncached s", "cold (tokenize + write) s",
       "warm (memory-map) ms", "warm / uncached", "cold / uncached", "warm = fresh tokens"])
  left_out = []
  with tempfile.TemporaryDirectory(prefix="token-cache-") as scratch:
    folders = raw_folders(args, scratch)
    for name, (experiment, variant, raw) in SETS.items():
      if common.out_of_time(args):
        left_out.append(name)
        continue
      if folders[raw] is None:
        where = os.path.join(args.data_dir or f"${ENV_VAR}", raw)
        report.rows.append([name, f"no data: put its raw files (docs/translation.md names them) in {where}, or "
                            f"give --data_dir", *["-"] * 8])
        continue
      config = experiment.get_config(variant)
      config.task.source_dir, config.task.data_dir = folders[raw], os.path.join(scratch, "tfds")
      if args.smoke:
        config.task.vocab_size = SMOKE_VOCAB_SIZE
      try:
        timings, examples = measure_set(args, name, config, config.task.data_dir)
      except UserError as error:  # raw files there but not usable (one missing, another layout)
        report.rows.append([name, f"no data: {error}", *["-"] * 8])
        continue
      warm_ratio = timings["warm"].median / timings["uncached"].median
      cold_ratio = timings["cold"].median / timings["uncached"].median
      report.ratios[f"{name} warm / uncached"] = warm_ratio
      cache_bytes = sum(getattr(examples, array).nbytes for array in token_cache.DTYPES)
      report.rows.append([name, len(examples), int(examples.source_tokens.size + examples.target_tokens.size),
                          cache_bytes / 2**20, spread(timings["uncached"], 1), spread(timings["cold"], 1),
                          spread(timings["warm"], 1e3), f"{warm_ratio:.4f}", cold_ratio, "yes"])
  report.notes += [
      f"Median (min-max) of {args.repeats} rounds after {args.warmup} untimed; each round: uncached, cold (the "
      "cache folder removed first), warm, each on a fresh task's data (dataset, tokenizers, eval splits loaded "
      "untimed). Raw files copied into a temporary folder and prepared there"
      f"{' (--smoke: made-up files of 300 examples, a 40-piece vocabulary)' if args.smoke else ''}.",
      "Warm is the memory-mapping alone: its pages are read when a batch gathers them (here from the page cache, "
      "just written); examples and tokens are the kept training examples, EOS included.",
  ]
  if left_out:
    report.notes.append(f"--time_budget_s spent: left out {', '.join(left_out)}.")
  return common.finish(report, args, argv, machine)


if __name__ == "__main__":
  main(sys.argv[1:])
