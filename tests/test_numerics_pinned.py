"""The numerics pinned: the first 20 training losses of a tiny run of each model family, to 1e-6.

Each case trains through the public ``transformer.train.run`` (initialisation, data order, dropout, the train
step, the optimizer), float32 on one CPU device, logging every step, and compares the 20 logged losses with the
literal numbers below. A change to the code that moves any of them (a new initialiser, another order of
operations, another RNG split, another layout of the parameters) fails here, naming the family and the first step
that differs. Such a change must update the pins IN THE SAME COMMIT and say in its message why the numbers moved
(the failure message prints the new list ready to paste); a change meant to keep the numerics (a refactor, a new
sharding of the same parameters) must leave them as they are.

The pins are of float32 on the CPU of the project's hosts (x86-64, XLA:CPU as pinned in setup.cfg); another CPU
or another jax/XLA version may differ in the last bits, which a 1e-6 tolerance over 20 steps does not absorb.
Families: encoder-decoder (synthetic copy; Multi30k-format translation with SentencePiece), the same encoder-decoder
under ``parallelism=mesh`` with FSDP and tensor parallelism on the 8 virtual devices, decoder-only LM, GRU
encoder-decoder with additive attention, encoder classifier, and each forecaster of ``transformer.nn.forecasters``.
"""
from __future__ import annotations

import numpy as np
import pytest

from tests.data.data_fixtures import write_multi30k
from tests.pretrained.tiny_bert import write_tiny_bert
from tests.train.conftest import load_experiment_config
from transformer.nn.forecasters import ARCHITECTURES
from transformer.train import run
from transformer.train.workdir import read_metrics

pytestmark = pytest.mark.slow  # 13 training runs: 66 s on 2 CPU cores with the compilation cache warm, 3.5 min cold

STEPS = 20
TOLERANCE = 1e-6


def set_fields(config, **fields):
  """``a__b=v`` sets ``config.a.b``."""
  for name, value in fields.items():
    node = config
    *parents, leaf = name.split("__")
    for parent in parents:
      node = node[parent]
    node[leaf] = value
  return config


def pinned_run(config, workdir) -> list[float]:
  """The training loss of each of the first ``STEPS`` steps of ``config``, run in ``workdir``."""
  set_fields(config, num_train_steps=STEPS, log_every=1, eval_every=STEPS, checkpoint_every=STEPS,
             num_seeds=1, quiet=True, tensorboard=False, async_checkpointing=False, best_metric="")
  # A short warmup to a large rate: from the second step on, a change to the gradients shows in the loss.
  set_fields(config, optimizer__warmup_steps=2, optimizer__learning_rate=1e-2)
  run(config, str(workdir))
  losses = [record["train/loss"] for record in read_metrics(str(workdir)) if "train/loss" in record]
  assert len(losses) == STEPS, f"logged {len(losses)} training losses, not {STEPS}"
  return losses


def check(family: str, losses: list[float]) -> None:
  expected = PINS.get(family, [])
  differs = [step + 1 for step, (a, b) in enumerate(zip(losses, expected)) if abs(a - b) > TOLERANCE]
  assert not differs and len(expected) == STEPS, (
      f"{family}: the training loss differs from its pin from step {differs[0] if differs else '?'} "
      f"(pinned {expected[differs[0] - 1] if differs else '-'}, now {losses[differs[0] - 1] if differs else '-'}). "
      f"If the change is meant to move the numerics, update the pins in the same commit and say why:\n"
      f"    {family!r}: {format_pins(losses)},")


def format_pins(losses: list[float]) -> str:
  return "[" + ", ".join(f"{loss:.9g}" for loss in losses) + "]"


# ------------------------------------------------------------------------------ the tiny runs

def synthetic_config(model_name: str = "transformer"):
  """The synthetic copy task, sequences of up to 6 symbols, batches of 8."""
  config = load_experiment_config("synthetic", "copy")
  set_fields(config, task__max_length=6, task__num_eval_examples=8, batch_size=8, eval_batch_size=8)
  if model_name == "transformer":
    # Dropout and label smoothing on: their random keys and their arithmetic are pinned too.
    set_fields(config, model__d_model=16, model__num_heads=2, model__d_ff=32, model__num_encoder_layers=1,
               model__num_decoder_layers=1, model__dropout_rate=0.1, model__attention_dropout_rate=0.1,
               label_smoothing=0.1)
    return config
  from transformer.train import base_config
  rnn = base_config("rnn")
  rnn.task = config.task
  for name in ("batch_size", "eval_batch_size", "optimizer", "best_metric"):
    rnn[name] = config[name]
  set_fields(rnn, model__cell="gru", model__attention="bahdanau", model__embedding_dim=8, model__hidden_dim=16,
             model__dropout_rate=0.1)
  return rnn


def test_encoder_decoder(tmp_path):
  check("encoder_decoder", pinned_run(synthetic_config(), tmp_path))


def test_encoder_decoder_on_a_mesh_with_fsdp_and_tensor_parallelism(tmp_path):
  """The same model with its parameters sharded (FSDP over 4 data devices, heads and feed-forward over 2, the
  vocabulary of 13 kept whole): the losses of its own layout, pinned so that a change of how parameters are
  named or sharded shows."""
  config = set_fields(synthetic_config(), parallelism="mesh", fsdp=True, tensor_parallelism=2,
                      axis_rules="vocab=none")
  check("encoder_decoder_mesh", pinned_run(config, tmp_path))


def test_rnn_encoder_decoder_with_additive_attention(tmp_path):
  check("rnn_attention", pinned_run(synthetic_config("rnn"), tmp_path))


@pytest.fixture(scope="module")
def multi30k_raw(tmp_path_factory):
  return write_multi30k(tmp_path_factory.mktemp("raw") / "multi30k",
                        sizes={"train": 200, "val": 8, "test_2016_flickr": 2, "test_2017_flickr": 2,
                               "test_2017_mscoco": 2, "test_2018_flickr": 2})


def test_encoder_decoder_translation(multi30k_raw, tmp_path):
  """experiments/multi30k.py:tiny on a Multi30k-format fixture: SentencePiece pieces, one batch shape."""
  config = load_experiment_config("multi30k", "tiny")
  set_fields(config, task__source_dir=str(multi30k_raw), task__data_dir=str(tmp_path / "tfds"),
             task__vocab_size=60, task__max_tokens=128, task__max_length=16, task__num_eval_sentences=4,
             task__test_splits=(), model__d_model=16, model__d_ff=32, model__dropout_rate=0.1,
             label_smoothing=0.1, eval_batch_size=8)
  check("translation", pinned_run(config, tmp_path / "run"))


def test_decoder_only_language_model(multi30k_raw, tmp_path):
  config = load_experiment_config("language_model", "tiny")
  set_fields(config, task__source_dir=str(multi30k_raw), task__data_dir=str(tmp_path / "tfds"),
             task__vocab_size=40, task__max_tokens=128, task__max_length=16, model__d_model=16, model__num_heads=2, model__d_ff=32,
             model__num_decoder_layers=1, model__dropout_rate=0.1, eval_batch_size=8)
  check("language_model", pinned_run(config, tmp_path / "run"))


def test_encoder_classifier(tmp_path):
  """experiments/disaster_tweets.py's model with one encoder layer trained from scratch (learned positions,
  dropout, mean pooling) on a hand-made CSV, with a tiny BERT's tokenizer."""
  from tests.tasks.test_classification import write_tweets
  source = tmp_path / "raw"
  source.mkdir()
  write_tweets(source)
  write_tiny_bert(tmp_path / "bert")
  config = load_experiment_config("disaster_tweets", "tiny")
  set_fields(config, task__source_dir=str(source), task__data_dir=str(tmp_path / "tfds"),
             task__pretrained_dir=str(tmp_path / "bert"), task__max_length=12, model__max_length=12,
             model__num_encoder_layers=1, model__num_heads=2, model__d_model=16, model__d_ff=32,
             model__positional_encoding="learned", model__scale_embeddings=True, model__attention_dropout_rate=0.1,
             batch_size=8, eval_batch_size=8)
  check("encoder_classifier", pinned_run(config, tmp_path / "run"))


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_forecaster(architecture, tmp_path):
  """experiments/beijing_pm25.py's variant of each architecture, shrunk, on the ``tiny`` variant's generated
  series (no data)."""
  config = load_experiment_config("beijing_pm25", architecture)
  set_fields(config, task__dataset="synthetic", task__synthetic_hours=1200, model__input_length=48,
             model__num_layers=1, model__d_model=8, model__d_ff=16, batch_size=16, eval_batch_size=64)
  check(f"forecaster_{architecture}", pinned_run(config, tmp_path))


# ------------------------------------------------------------------------------ the pins

PINS: dict[str, list[float]] = {
    "encoder_decoder":
        [2.49419245, 2.47189162, 2.10898786, 2.06777208, 2.11859574, 1.90804059, 1.89196248, 1.82925797,
         1.8797797, 1.82814129, 1.81154083, 1.76532114, 1.86323912, 1.65889945, 1.77284045, 1.77283581,
         1.69528484, 1.75256822, 1.83380027, 1.84272585],
    "encoder_decoder_mesh":
        [2.49419298, 2.47189162, 2.10898766, 2.06777225, 2.11859557, 1.90804059, 1.89196285, 1.82925797,
         1.8797797, 1.82814129, 1.81154116, 1.76532125, 1.86323912, 1.65889975, 1.77284026, 1.77283581,
         1.69528484, 1.75256822, 1.83380047, 1.84272585],
    "rnn_attention":
        [2.61392107, 2.54580222, 2.66453415, 2.60529158, 2.55255446, 2.48570981, 2.4961794, 2.47890684,
         2.39588373, 2.41906553, 2.40427623, 2.40288401, 2.45251332, 2.26931807, 2.42336606, 2.32518975,
         2.37136507, 2.45601551, 2.4364885, 2.44483386],
    "translation":
        [3.79505389, 3.52224977, 3.4069493, 3.11920372, 3.04963488, 3.08902396, 3.02843546, 2.96827653,
         3.0053493, 3.04484673, 2.79664967, 2.85990529, 2.87624713, 2.87990723, 2.79184058, 2.87477236,
         2.78251381, 2.72458758, 2.80313902, 2.79647508],
    "encoder_classifier":
        [0.644796014, 0.799197137, 0.707329869, 0.896262527, 0.50138545, 0.675233424, 0.851135492, 0.425078183,
         0.466629267, 0.48269245, 0.380634159, 0.354842842, 0.475319862, 0.305196077, 0.301509082, 0.498066634,
         0.326693654, 0.322208107, 0.354774922, 0.515152097],
    "forecaster_rnn":
        [0.917508867, 1.10608278, 1.03453938, 0.917749153, 0.988205162, 0.957371798, 0.914607197, 0.96647959,
         0.849017922, 0.86913706, 0.902756457, 0.82513455, 0.846698414, 0.851485313, 0.845533683, 0.924163538,
         0.866403614, 0.813858603, 0.913829768, 0.829720098],
    "forecaster_lstm":
        [0.754323606, 0.911097995, 0.978944813, 0.801609111, 0.897522041, 0.866319414, 0.829503121, 0.898636564,
         0.753850394, 0.768183485, 0.813059249, 0.834453038, 0.753408259, 0.758153348, 0.799997989, 0.962535753,
         0.772141751, 0.781964881, 0.84207025, 0.708999564],
    "forecaster_gru":
        [0.940581852, 1.11190942, 1.1031809, 0.909061792, 0.968430596, 0.983012945, 0.978105178, 0.97921333,
         0.845545568, 0.845612856, 0.941778075, 0.89131982, 0.826370239, 0.813705651, 0.832928606, 1.01242814,
         0.80366315, 0.853276476, 0.872489573, 0.746459961],
    "forecaster_transformer":
        [0.783536911, 0.927869762, 0.947346843, 0.783381048, 0.871597221, 0.901738808, 0.828476232, 0.893735483,
         0.772381354, 0.73518229, 0.856817138, 0.881453855, 0.809205211, 0.785316605, 0.802715093, 1.00711837,
         0.791883781, 0.807015036, 0.816453239, 0.733705902],
    "forecaster_transformer_encoder":
        [1.05851901, 1.14058463, 1.11367208, 1.01314106, 1.0113203, 0.933363758, 1.02008302, 0.982976231,
         0.877030959, 0.901722133, 0.927302666, 0.845129149, 0.887917189, 0.900236662, 0.912983496, 0.973219565,
         0.883196397, 0.856329018, 0.872683801, 0.775062908],
    "forecaster_patchtst":
        [0.990611182, 0.994256176, 1.1001659, 1.0945657, 0.856110994, 0.947477445, 0.898722377, 0.891746311,
         0.891246761, 0.962690264, 0.769727815, 0.795363835, 0.768694722, 0.823507086, 0.731907238, 0.835049131,
         0.706456757, 0.75790776, 0.794881589, 0.806200756],
    "forecaster_dlinear":
        [1.29508068, 1.2356043, 1.17050698, 1.10213945, 1.07551733, 0.924821195, 0.773912902, 0.781548876,
         0.794502048, 0.738264066, 0.637072725, 0.732387543, 0.677604051, 0.696089599, 0.713413447, 0.654475011,
         0.628178544, 0.648838863, 0.640164955, 0.71476593],
    "language_model":
        [4.03932007, 4.11228494, 4.16822118, 3.93691902, 3.78510469, 3.63722983, 3.64940544, 3.50957222,
         3.51367116, 3.5345789, 3.46123709, 3.46193115, 3.43341064, 3.28489621, 3.29031834, 3.3880059,
         3.2923818, 3.40347731, 3.30281619, 3.31044784],
}
