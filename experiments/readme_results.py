"""The README's results table, written from the pages it links: every number, count, horizon and word ("met",
"not met", "does not beat", "diverged") of a row is read from its page, the rest of the row is this file's text.

    python -m experiments.readme_results                    # prints the table
    python -m experiments.readme_results --update_committed # writes it into README.md, between its markers

``python -m experiments.verify`` writes the table again from the pages and compares the README's, row by row and
word by word: a changed token fails, naming the row and the words that differ.
"""
from __future__ import annotations

import argparse
import math
import os
import re
import sys

from experiments import record_store

README = "README.md"
BEGIN = "<!-- results: written by python -m experiments.readme_results --update_committed; do not edit by hand -->"
END = "<!-- /results -->"
HEADER = ["experiment", "result", "page"]
NUMBER_WORDS = {1: "one", 2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight"}
# How the README names a page's models.
DISPLAY = {"patchtst": "PatchTST", "gru": "GRU", "lstm": "LSTM", "rnn": "RNN", "dlinear": "DLinear",
           "transformer": "Transformer", "transformer_encoder": "Transformer encoder"}


class NotOnPage(ValueError):
  """What a row needs is not on its page (a table, row, column or sentence): names the page and what."""


class Page:
  """A page's text (or a section of it) and its tables, as the rows read them."""

  def __init__(self, path: str, text: str):
    self.path, self.text = path, text
    from experiments.verify import tables
    self.tables = tables(text)

  def cell(self, row: str, column: str, first: str | None = None) -> str:
    """The cell in ``column`` of the row whose first cell is ``row`` (first table that has both, optionally only
    tables whose first heading is ``first``)."""
    for table in self.tables:
      if column in table["header"] and (first is None or table["header"][0] == first):
        for cells in table["rows"]:
          if cells[0] == row:
            return cells[table["header"].index(column)]
    raise NotOnPage(f"{self.path} has no cell {column!r} of row {row!r}")

  def column(self, column: str, first: str | None = None) -> list[str]:
    """Every cell of ``column`` in the tables that have it (whose first heading is ``first``, if given)."""
    found = [cells[table["header"].index(column)] for table in self.tables
             if column in table["header"] and (first is None or table["header"][0] == first) for cells in table["rows"]]
    if not found:
      raise NotOnPage(f"{self.path} has no column {column!r}")
    return found

  def table(self, *columns: str) -> dict:
    """The first table with all of ``columns``."""
    for table in self.tables:
      if all(column in table["header"] for column in columns):
        return table
    raise NotOnPage(f"{self.path} has no table with the columns {list(columns)}")

  def search(self, pattern: str, what: str) -> re.Match:
    found = re.search(pattern, self.text, flags=re.S)
    if found is None:
      raise NotOnPage(f"{self.path} does not say {what}")
    return found

  def section(self, marker: str) -> Page:
    from experiments.verify import sections
    found = sections(self.text)
    if marker not in found:
      raise NotOnPage(f"{self.path} has no section {marker}")
    return Page(f"{self.path} section {marker}", found[marker])


def mean(cell: str) -> str:
  """``0.887 ± 0.043`` -> ``0.887``; ``15.73 (15.84, 15.62)`` -> ``15.73``."""
  return cell.split(" ")[0]


def whole(text: str) -> str:
  """``1200`` -> ``1,200`` (the README's whole numbers)."""
  return f"{int(text.replace(',', '')):,}"


def count(number: int) -> str:
  return NUMBER_WORDS.get(number, str(number))


def display(model: str) -> str:
  return DISPLAY.get(model, model)


def horizons(text: str) -> list[str]:
  """``1 h, 6 h, 12 h`` -> ``["1 h", "6 h", "12 h"]``."""
  return re.findall(r"\d+ h", text)


# ------------------------------------------------------------------------------ the rows

def synthetic(page: Page) -> tuple[str, str]:
  tasks = page.column("task")
  exact = page.column("exact match (512 held-out)", "task")
  same = len(set(exact)) == 1
  result = (f"{float(exact[0]) * 100:g}% exact match (all {count(len(tasks))})" if same else
            "exact match " + ", ".join(f"{task} {float(value) * 100:g}%" for task, value in zip(tasks, exact)))
  return f"synthetic {' / '.join(tasks)}", result


def _ablation_sections(page: Page) -> int:
  return len({run.split("/")[0] for run in page.column("run") if "/" in run})


def ablations(page: Page) -> tuple[str, str]:
  steps = sorted({int(step) for step in page.column("steps", "run")})
  seeds = sorted(set(page.column("seeds", "run")))
  metric = "exact match"

  def value(run):
    return mean(page.cell(run, metric, "run"))

  diverged = page.cell("norm_position/post_no_warmup", "diverged", "run")
  nll = mean(page.cell("norm_position/post_no_warmup", "NLL (nats/token)", "run"))
  # "Diverged" on this page is a final loss above its line; at ln 11 (10 symbols and EOS) a seed learned nothing.
  at_chance = f" (NLL {nll} nats: chance is ln 11 = {math.log(11):.3f})" if abs(float(nll) - math.log(11)) < 0.05 else ""
  experiment = (f"Ablations ({_ablation_sections(page)}, {' or '.join(seeds)} seeds each), synthetic reversal, "
                f"{steps[0]}-{steps[-1]} steps" if len(steps) > 1 else f"{steps[0]} steps")
  return experiment, (f"{metric}: scaled {value('scaling/scaled')} vs unscaled {value('scaling/unscaled')}; post-LN "
                      f"without warmup {diverged} diverged{at_chance}; no positions {value('positions/none')} vs sinusoidal "
                      f"{value('positions/sinusoidal')}")


def ablations_multi30k(page: Page, synthetic_page: Page) -> tuple[str, str]:
  steps = sorted(set(page.column("steps", "run")))
  seeds = sorted(set(page.column("seeds", "run")))

  def value(run, column="BLEU"):
    return mean(page.cell(run, column, "run"))

  def hardware(run):
    found = re.search(r"NVIDIA (\w+)", page.cell(run, "hardware", "run"))
    return f" ({found.group(1)})" if found else ""

  batch, layer = value("norms/batch_norm", "token accuracy"), value("norms/layer_norm", "token accuracy")
  post, pre = "norm_position/post_warmup", "norm_position/pre_warmup"
  experiment = (f"Ablations on Multi30k ({_ablation_sections(page)} of {_ablation_sections(synthetic_page)}), "
                f"{' or '.join(steps)} steps, {' or '.join(seeds)} seeds")
  hardware_note = hardware(post) if hardware(post) == hardware(pre) else f"{hardware(post)}, pre-LN{hardware(pre)}"
  return experiment, (
      f"validation BLEU: scaled {value('scaling/scaled')} vs unscaled {value('scaling/unscaled')}; BatchNorm "
      f"{value('norms/batch_norm')} vs LayerNorm {value('norms/layer_norm')} (its teacher-forced token accuracy is "
      f"{'higher' if float(batch) > float(layer) else 'not higher'}, {batch} vs {layer}: the gap is batch statistics in "
      f"cached decoding); rotary {value('positions/rotary')}; post-LN {value(post)} vs pre-LN {value(pre)}"
      f"{hardware_note}; GRU + additive attention {value('rnn_attention/additive')}, none "
      f"{value('rnn_attention/none')}")


def _size(page: Page, row: str) -> str:
  return page.cell(row, "size", "model").replace("d_model ", "d ")


def multi30k_transformer(page: Page) -> tuple[str, str]:
  cpu, gpu = "transformer_small", "transformer_gpu"
  hardware = page.cell(gpu, "hardware", "model")
  device = re.search(r"1 x NVIDIA (\w+)", hardware)
  if device is None:
    raise NotOnPage(f"{page.path}: row {gpu!r} names no GPU in its hardware")
  dtype = "bfloat16" if "bfloat16" in hardware else "float32"
  others = [page.cell(gpu, f"{split} BLEU", "model") for split in ("test_2017_flickr", "test_2017_mscoco",
                                                                    "test_2018_flickr")]
  empty = "from an empty workdir" in hardware
  return f"Multi30k en-de, Transformer ({_size(page, cpu)})", (
      f"{page.cell(cpu, 'test_2016_flickr BLEU', 'model')} test2016 BLEU; on one {device.group(1)} ({dtype}, "
      f"{page.cell(gpu, 'training wall time', 'model')} {'from an empty workdir, ' if empty else ''}data preparation "
      f"included): {page.cell(gpu, 'test_2016_flickr BLEU', 'model')} test2016, {' / '.join(others)} test2017 "
      "flickr / mscoco / test2018")


def multi30k_gru(page: Page) -> tuple[str, str]:
  return "Multi30k en-de, GRU + Bahdanau attention", f"{page.cell('gru_bahdanau', 'test_2016_flickr BLEU', 'model')} test2016 BLEU"


def iwslt(page: Page, rows: str, name: str) -> tuple[str, str]:
  pairs = int(page.cell(rows.split(", ")[0], "training pairs", "model").replace(",", ""))
  seeds = page.cell(rows, "seeds", "rows").split(", ")
  bleu = page.cell(rows, "tst2013 BLEU: mean (each seed)", "rows")
  return f"IWSLT'15 en-vi ({pairs // 1000}k pairs), {name}", (
      f"{mean(bleu)} tst2013 BLEU, mean of {len(seeds)} seeds {bleu.split(' ', 1)[1]}")


def language_model(page: Page) -> tuple[str, str]:
  layers = page.search(r"decoder-only Transformer \((\d+) layers, d_model (\d+)", "the model's layers and width")
  row = "small"
  return (f"Multi30k English captions, decoder-only LM ({layers.group(1)} layers, d {layers.group(2)})",
          f"{page.cell(row, 'best validation perplexity (per piece)', 'variant')} validation perplexity per piece "
          f"({page.cell(row, 'per word', 'variant')} per word), {whole(page.cell(row, 'steps', 'variant'))} steps")


def disaster_tweets(page: Page) -> tuple[str, str]:
  f1 = "test F1 (disaster)"
  seeds = sorted(set(page.column("seeds", "variant")))
  target = page.cell("minilm_finetune", "target F1", "variant")
  found = re.match(r"([\d.]+): argmax (met|not met)", target)
  if found is None:
    raise NotOnPage(f"{page.path}: row 'minilm_finetune' gives no target F1 met or not met by its argmax")
  published = page.column("F1 (disaster)", "published result (Kaggle public leaderboard)")
  return f'Disaster Tweets, test F1 of "disaster" ({" or ".join(seeds)} seeds)', (
      f"MiniLM embeddings {mean(page.cell('static_minilm', f1, 'variant'))}; frozen "
      f"{mean(page.cell('minilm_frozen', f1, 'variant'))}; fine-tuned {page.cell('minilm_finetune', f1, 'variant')} "
      f"({found.group(1)} {found.group(2)}); published {' / '.join(published)} are on another test set")


def _comparison(page: Page, first: str, second: str) -> re.Match:
  """The sentence of the comparison ``first`` against ``second``: who is better beyond the interval where."""
  return page.search(rf"\*\*{re.escape(first)} against {re.escape(second)}\*\* \([^)]*\)[^:]*: "
                     rf"{re.escape(first)} better beyond the interval at ([^,]*(?:, \d+ h)*), "
                     rf"{re.escape(second)} at ([^;]*(?:, \d+ h)*);", f"{first} against {second}")


def beijing_pm25(page: Page) -> tuple[str, str]:
  verdict = page.search(r"\*\*On 2014, the best Transformer-family model \((\w+)\) (does not beat|beats) the best "
                        r"recurrent model \((\w+)\) beyond the uncertainty at any horizon from (\d+ h)",
                        "its verdict on the best Transformer-family model against the best recurrent model")
  transformer, verb, recurrent, start = verdict.groups()
  table = page.table("horizon", f"{transformer} MAE", f"{recurrent} MAE")
  all_horizons = [row[0] for row in table["rows"]]
  last = all_horizons[-1]

  def mae(model, horizon, other=None):
    return page.cell(horizon, f"{model} MAE", "horizon") if other is None else next(
        row[t["header"].index(f"{model} MAE")] for t in page.tables
        if f"{model} MAE" in t["header"] and f"{other} MAE" in t["header"] for row in t["rows"] if row[0] == horizon)

  dlinear = [mae("dlinear", horizon, transformer) for horizon in (start, last)]
  equal = [_comparison(page, "patchtst-168h", "gru-168h-pm25_only"),
           _comparison(page, "patchtst-168h-all_inputs", "gru-168h")]
  equal_words = ("at any horizon" if all(found.group(1) == "no horizon" for found in equal) else
                 "except at " + ", ".join(found.group(1) for found in equal if found.group(1) != "no horizon"))
  inputs = _comparison(page, "patchtst-336h-all_inputs", "patchtst-336h")
  worse = horizons(inputs.group(2))
  missing = [horizon for horizon in all_horizons if horizon not in worse]
  where = ("at every horizon" if not missing else f"at every horizon but {', '.join(missing)}" if len(missing) <= 2
           else f"at {', '.join(worse)}")
  inputs_table = page.table("horizon", "patchtst-336h-all_inputs MAE", "patchtst-336h MAE")
  interval = inputs_table["header"].index("95% interval (weeks resampled)")
  lower = sorted({row[interval].split(" to ")[0] for row in inputs_table["rows"]
                  if row[0] in worse and all_horizons.index(row[0]) >= all_horizons.index(start)}, key=float)
  bounds = f"{lower[0]}" if len(lower) == 1 else f"{lower[0]} to {lower[-1]}"
  beat = "does **not** beat" if verb == "does not beat" else "beats"
  seeds = sorted({page.cell(model, "seeds", "model") for model in (transformer, recurrent)})
  return f"Beijing PM2.5, test MAE on 2014 (µg/m³), {' or '.join(seeds)} seeds", (
      f"best Transformer-family ({display(transformer)}) {beat} the best recurrent model ({display(recurrent)}) from "
      f"{start}: {mae(transformer, start)} vs {mae(recurrent, start)} at {start}, {mae(transformer, last)} vs "
      f"{mae(recurrent, last)} at {last}; DLinear {', '.join(dlinear)}; nor on equal inputs at 168 h (both on pm2.5 "
      f"alone, or both on all 18 features) {equal_words}; PatchTST on all 18 features is worse than on pm2.5 alone "
      f"at its kept 336 h window (beyond the interval {where}; from {start} its interval's lower bound is only "
      f"{bounds})")


def _met(text: str) -> bool:
  return text == "met"


def benchmarks_cpu(results: Page) -> tuple[str, str]:
  from experiments.verify import attention_sizes_met
  attention = results.section("benchmarks.attention")
  worst = attention.search(r"worst ratio ([\d.]+) \((met|not met)\) with the default", "its worst ratio")
  sizes = attention_sizes_met(results.text, "benchmarks.attention")
  step = results.section("benchmarks.train_step")
  table = step.table("implementation", "ours / this (tokens/s)")
  timed = {row[table["header"].index("timed in")] for row in table["rows"]} if "timed in" in table["header"] else set()
  own = "each implementation timed in its own process: " if timed == {"own process"} else ""
  implementation = table["header"].index("implementation")

  def value(name, column):
    row = next((row for row in table["rows"] if row[implementation] == name), None)
    if row is None or column not in table["header"]:
      raise NotOnPage(f"{step.path} has no {column!r} of implementation {name!r}")
    return row[table["header"].index(column)]

  flax, torch = value("flax-stock", "ours / this (tokens/s)"), value("pytorch", "ours / this (tokens/s)")
  targets = step.search(r"Targets \(CPU\): ours >= ([\d.]+)x flax-stock, >= ([\d.]+)x pytorch tokens/s; base MFU "
                        r">= (\d+)% at", "its targets")
  met = step.search(r"ours / flax-stock [\d.]+x at batch \d+ \((met|not met);.*?ours / pytorch [\d.]+x at batch \d+ "
                    r"\((met|not met);", "whether the targets are met")
  both = "met" if all(map(_met, met.groups())) else "not met" if not any(map(_met, met.groups())) else \
      f"{met.group(1)} and {met.group(2)}"
  mfu = value("ours", "MFU % (measured peak)")
  mfu_met = "met" if float(mfu) >= float(targets.group(3)) else "not met"
  return "benchmarks, 2 CPU cores", (
      f"attention within 1.1x of the fastest reference at {sizes} sizes (worst {worst.group(1)}x); base train step, "
      f"{own}{flax}x flax-stock, {torch}x PyTorch (targets {targets.group(1)}x and {targets.group(2)}x: {both}), "
      f"MFU {mfu}% (target {targets.group(3)}%: {mfu_met})")


def benchmarks_gpu(results: Page) -> tuple[str, str]:
  from experiments.verify import attention_sizes_met
  attention = results.section("benchmarks.attention.gpu")
  worst = attention.search(r"worst ratio ([\d.]+) \((met|not met)\) with the default", "its worst ratio")
  table = attention.table("ours / fastest reference")
  index = table["header"].index("ours / fastest reference")
  worst_row = max(table["rows"], key=lambda row: float(row[index]))
  over = [row for row in table["rows"] if row[0] == "float32" and row[1] == "forward" and float(row[index]) > 1.1]
  over_ratios = sorted(float(row[index]) for row in over)
  step = results.section("benchmarks.train_step.gpu")
  targets = step.search(r"ours >= ([\d.]+)x pytorch tokens/s; base MFU >= (\d+)% at", "its targets")
  ours_pytorch = step.search(r"ours / pytorch ([\d.]+)x at batch \d+ \((met|not met)", "the ratio to PyTorch")
  mfu = step.search(r"base MFU (\d+)% at batch \d+ \((met|not met)\)", "its MFU")
  decoding = results.section("benchmarks.decoding.gpu")
  speed = decoding.search(r"cache speed-up >= ([\d.]+)x at 256 output tokens; smallest speed-up at 256 tokens "
                          r"([\d.]+) \((met|not met)\)", "its target")
  speed_ups = sorted(float(value) for value in decoding.column("cache speed-up"))
  verdicts = [worst.group(2), ours_pytorch.group(2), mfu.group(2), speed.group(3)]
  head = ("targets not met: " if not any(map(_met, verdicts)) else
          "targets met: " if all(map(_met, verdicts)) else "")
  return "benchmarks, one H200", (
      f"{head}attention within 1.1x at {attention_sizes_met(results.text, 'benchmarks.attention.gpu')} sizes (worst "
      f"{worst.group(1)}x, {worst_row[0]} {worst_row[1]} at {worst_row[2]} tokens; float32 forward "
      f"{over_ratios[0]:.2f}-{over_ratios[-1]:.2f}x from {min(int(row[2].replace(',', '')) for row in over)} tokens); "
      f"train step {float(targets.group(1)):g}x PyTorch eager ({ours_pytorch.group(1)}x), {targets.group(2)}% MFU "
      f"({mfu.group(1)}%); decoding cache {float(speed.group(1)):g}x ({speed_ups[0]:.2f}-{speed_ups[-1]:.2f}x)")


def time_to_bleu(results: Page) -> tuple[str, str]:
  section = results.section("benchmarks.time_to_bleu.gpu")
  row = "transformer_gpu"
  return "Multi30k en-de on one H200, time to BLEU", (
      f"{section.cell(row, 'test_2016_flickr BLEU', 'config')} test2016 BLEU in {section.cell(row, 'total s', 'config')} "
      "s from an empty workdir (its hypotheses not kept)")


def link(name: str, page: str, sections: tuple[str, ...] = ()) -> str:
  text = f"[{name}]({page})"
  if sections:
    text += f", section{'s' if len(sections) > 1 else ''} " + ", ".join(f"`{section}`" for section in sections)
  return text


SYNTHETIC, ABLATIONS, ABLATIONS_MULTI30K = ("experiments/synthetic/RESULTS.md", "experiments/ablations/RESULTS.md",
                                            "experiments/ablations/multi30k/RESULTS.md")
MULTI30K, IWSLT, LANGUAGE_MODEL = ("experiments/multi30k/RESULTS.md", "experiments/iwslt15_en_vi/RESULTS.md",
                                   "experiments/language_model/RESULTS.md")
DISASTER_TWEETS, BEIJING_PM25, BENCHMARKS = ("experiments/disaster_tweets/RESULTS.md",
                                             "experiments/beijing_pm25/RESULTS.md", "benchmarks/RESULTS.md")
# Each row: (the function that writes its experiment and result cells, the pages it reads, its link cell).
ROWS = [
    (synthetic, (SYNTHETIC,), link("synthetic", SYNTHETIC)),
    (ablations, (ABLATIONS,), link("ablations", ABLATIONS)),
    (ablations_multi30k, (ABLATIONS_MULTI30K, ABLATIONS), link("ablations/multi30k", ABLATIONS_MULTI30K)),
    (multi30k_transformer, (MULTI30K,), link("multi30k", MULTI30K)),
    (multi30k_gru, (MULTI30K,), link("multi30k", MULTI30K)),
    (lambda page: iwslt(page, "transformer_small_bpe_rotary, transformer_small_bpe_rotary_seed1",
                        "Transformer (rotary, BPE)"), (IWSLT,), link("iwslt15_en_vi", IWSLT)),
    (lambda page: iwslt(page, "gru_bahdanau_bpe, gru_bahdanau_bpe_seed1", "GRU + Bahdanau (BPE)"), (IWSLT,),
     link("iwslt15_en_vi", IWSLT)),
    (language_model, (LANGUAGE_MODEL,), link("language_model", LANGUAGE_MODEL)),
    (disaster_tweets, (DISASTER_TWEETS,), link("disaster_tweets", DISASTER_TWEETS)),
    (beijing_pm25, (BEIJING_PM25,), link("beijing_pm25", BEIJING_PM25)),
    (benchmarks_cpu, (BENCHMARKS,), link("benchmarks", BENCHMARKS, ("benchmarks.attention", "benchmarks.train_step"))),
    (benchmarks_gpu, (BENCHMARKS,), link("benchmarks", BENCHMARKS, ("benchmarks.attention.gpu",
                                                                    "benchmarks.train_step.gpu",
                                                                    "benchmarks.decoding.gpu"))),
    (time_to_bleu, (BENCHMARKS,), link("benchmarks", BENCHMARKS, ("benchmarks.time_to_bleu.gpu",))),
]


def rows(root: str = record_store.REPO) -> list[list[str] | NotOnPage]:
  """The table's rows written from the pages under ``root`` (each ``[experiment, result, page]``); a row whose
  page lacks what it reads is its ``NotOnPage`` error."""
  from experiments.verify import read
  written = []
  for write, pages, page_link in ROWS:
    try:
      written.append([*write(*(Page(page, read(root, page)) for page in pages)), page_link])
    except (NotOnPage, OSError) as error:
      written.append(NotOnPage(str(error)))
  return written


def table(root: str = record_store.REPO) -> str:
  """The markdown table; a ``NotOnPage`` error if a page lacks what a row reads."""
  written = rows(root)
  for row in written:
    if isinstance(row, NotOnPage):
      raise row
  from experiments.pages import markdown_table
  return markdown_table(HEADER, written)


def printed_rows(readme_text: str) -> list[list[str]]:
  """The rows of the README's results table (between its markers)."""
  from experiments.verify import tables
  body = readme_text.split(BEGIN, 1)[-1].split(END, 1)[0]
  found = next((t for t in tables(body) if t["header"] == HEADER), None)
  return found["rows"] if found else []


def update(root: str = record_store.REPO) -> str:
  """Writes the table into ``root``'s README between its markers; returns the README's path."""
  path = os.path.join(root, README)
  with open(path, encoding="utf-8") as f:
    text = f.read()
  if BEGIN not in text or END not in text:
    raise SystemExit(f"{path} lacks the markers {BEGIN} and {END} around its results table")
  head, rest = text.split(BEGIN, 1)
  _, tail = rest.split(END, 1)
  with open(path, "w", encoding="utf-8") as f:
    f.write(f"{head}{BEGIN}\n{table(root)}\n{END}{tail}")
  return path


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--root", default=record_store.REPO, help="The repository (or a copy) whose pages are read.")
  parser.add_argument("--update_committed", action="store_true", help="Write the table into README.md.")
  args = parser.parse_args(argv)
  if args.update_committed:
    print(f"wrote {update(args.root)}")
  else:
    print(table(args.root))
  return 0


if __name__ == "__main__":
  sys.exit(main())
