r"""What every ablation shares: the base configs (synthetic and Multi30k), how a variant becomes config overrides,
and the ``Ablation`` record the driver (``experiments/ablations_results.py``) reads. No ``get_config`` here:
each ablation is its own config file beside this one.

A variant is ``NAME`` (the synthetic task) or ``NAME,multi30k`` (the Multi30k base, a budgeted run):

    python launch.py --config=experiments/ablations/heads.py:8 --workdir=/tmp/ablations/heads/8
    python launch.py --config=experiments/ablations/heads.py:8,multi30k --workdir=/tmp/ablations_m30k/heads/8 \
        --config.task.source_dir=../shared/data/multi30k

Every run trains ``NUM_SEEDS`` replicas (seeds 0, 1, 2) in one program (``config.num_seeds``: ``jax.vmap``);
their metrics are logged per seed (``.../seed_i`` in ``metrics.jsonl``).
"""
from __future__ import annotations

import dataclasses
import json
import pathlib

from transformer.errors import ConfigError
from transformer.train import base_config

NUM_SEEDS = 3
TASKS = ("synthetic", "multi30k")
SMOKE = "tiny"
# Per task, a seed counts as diverged when its final training loss is above this (or it skipped non-finite
# steps). Synthetic: guessing uniformly among the 10 symbols and EOS is ln 11 = 2.4 nats. Multi30k: guessing
# among the 8,000 pieces is 9.0 nats, and the base model is at 5.3 by step 100 of its 600, so a seed still
# above 5.0 at the end of its budget did not train.
DIVERGED_LOSS = {"synthetic": 2.0, "multi30k": 5.0}
# Each task's grid history, a results file beside the pages (provenance.json), not code: "rerun_on", the day the
# grid was last rerun whole with its runs' logs kept; "not_reproduced", the code its cells were recorded with where
# older than the numerics pinned since (tests/test_numerics_pinned.py). The pages and experiments.verify say both.
PROVENANCE = json.loads((pathlib.Path(__file__).parent / "provenance.json").read_text())
RERUN_ON = {task: entry["rerun_on"] for task, entry in PROVENANCE.items() if "rerun_on" in entry}
NOT_REPRODUCED = {task: entry["not_reproduced"] for task, entry in PROVENANCE.items() if "not_reproduced" in entry}
# What the line means, in the page's words.
DIVERGED_MEANING = {
    "synthetic": "guessing among the 10 symbols and EOS is ln 11 = 2.40 nats",
    "multi30k": "guessing among the 8,000 pieces is 9.0 nats, and the base model is at 5.3 by step 100 of its 600"}
# A diverged seed whose final loss is this close to the line is named as near it: the count hangs on the line.
NEAR_THE_LINE = 0.1


@dataclasses.dataclass(frozen=True)
class Ablation:
  """One design choice measured over its variants.

  Attributes:
    name: the config file's name (``experiments/ablations/<name>.py``).
    title: the heading of its section on the results page.
    question: what it measures, one sentence.
    variants: variant name -> ``{"a.b": value}`` overrides of the config (the first is the reference).
    model_name: ``transformer`` or ``rnn`` (a key of ``transformer.nn.MODELS``).
    setup: overrides of the synthetic base for every variant (a deeper model, another learning rate, ...).
    multi30k_setup: the same for the Multi30k base.
    note: a paragraph for the results page, under the table (how to read it; no numbers).
    against_base: the page also says how the cells stand against the base model of the other tables when
      this table's reference is not that model (regularization on Multi30k, whose base has its own dropout).
  """
  name: str
  title: str
  question: str
  variants: dict[str, dict]
  model_name: str = "transformer"
  note: str = ""  # what a reader needs to read the table right (printed under it)
  against_base: bool = False
  setup: dict = dataclasses.field(default_factory=dict)
  multi30k_setup: dict = dataclasses.field(default_factory=dict)

  def get_config(self, variant: str):
    """The config of ``variant`` (``NAME`` or ``NAME,multi30k``); ``tiny``: the reference variant on the
    synthetic task for 20 steps, a smoke run of seconds (not a grid cell)."""
    if variant == SMOKE:
      config = self.get_config(next(iter(self.variants)))
      config.num_train_steps = 20
      config.eval_every = config.checkpoint_every = 10
      config.task.num_eval_examples = 32
      return config
    name, _, task = variant.partition(",")
    task = task or "synthetic"
    if name not in self.variants or task not in TASKS:
      choices = ", ".join(list(self.variants) + [f"{v},multi30k" for v in self.variants][:1] + [SMOKE])
      raise ConfigError(f"unknown variant {variant!r} of experiments/ablations/{self.name}.py; choose one of "
                        f"{choices}, ... (e.g. --config=experiments/ablations/{self.name}.py:{next(iter(self.variants))}).")
    if task == "synthetic":
      config = synthetic_base(self.model_name)
      apply_overrides(config, self.setup)
    else:
      config = multi30k_base(self.model_name)
      apply_overrides(config, self.multi30k_setup)
    apply_overrides(config, self.variants[name])
    return config


def apply_overrides(config, overrides: dict) -> None:
  """Set ``{"a.b": value}`` fields of ``config`` (a ``ConfigDict``); an unknown field is a ``ConfigError``."""
  for path, value in overrides.items():
    *parents, leaf = path.split(".")
    node = config
    for parent in parents:
      node = node[parent]
    if leaf not in node:
      raise ConfigError(f"ablation override {path}={value!r}: the config has no field {path!r}.")
    node[leaf] = value


def synthetic_base(model_name: str = "transformer"):
  """Reversal of 1..16 symbols (experiments/synthetic.py: 1..12) on a budget of 300 steps of batch 64, where a
  small model is still far from 100% and the variants can differ in how fast they learn; 3 seeds. The budget is
  that of a 2-core CPU shared with other work: all seven ablations in about an hour."""
  from experiments import synthetic
  reverse = synthetic.get_config("reverse")  # the task, and the 2+2-layer d_model 64 Transformer
  if model_name == "transformer":
    config = reverse
    config.model.max_length = 20
  else:  # the RNN encoder-decoder of the same width, on the same task
    config = base_config(model_name)
    config.task = reverse.task
    config.model.cell = "gru"
    config.model.embedding_dim = 32
    config.model.hidden_dim = 64
    config.model.dropout_rate = 0.0
  config.task.max_length = 16
  config.task.num_eval_examples = 256
  config.num_seeds = NUM_SEEDS
  config.batch_size = 64
  config.num_train_steps = 300
  config.optimizer.learning_rate = 3e-3
  config.optimizer.warmup_steps = 50
  config.optimizer.schedule = "cosine"
  config.optimizer.grad_clip_norm = 1.0
  config.log_every = 25
  config.eval_every = 300  # once, at the end: greedy decoding of every seed is a large part of a short run
  config.checkpoint_every = 100
  config.best_metric = "eval/exact_match"
  config.tensorboard = False
  return config


def multi30k_base(model_name: str = "transformer"):
  """experiments/multi30k.py's ``transformer_small`` (or ``gru_bahdanau`` for the RNN), its batches of 4,096
  tokens and peak learning rate, on a budget of 600 steps (150 of warmup) and 3 seeds, evaluated once at the
  end (beam search on the validation set); needs ``--config.task.source_dir`` (see experiments/multi30k.py).
  The budget is sized so that a cell runs within a CPU session (the RESULTS page gives each cell's wall time):
  the variants are compared early in training, not at convergence."""
  from experiments import multi30k
  config = multi30k.get_config("transformer_small" if model_name == "transformer" else "gru_bahdanau")
  config.num_seeds = NUM_SEEDS
  config.num_train_steps = 600
  config.optimizer.warmup_steps = min(config.optimizer.warmup_steps, 150)
  config.eval_every = 600
  config.checkpoint_every = 100
  config.tensorboard = False
  return config
