r"""WMT'14 English-German with the paper's base recipe (Vaswani et al. 2017, "Transformer (base model)": 27.3 BLEU
on newstest2014). Not trained here: no WMT data is reachable from this project's machines (experiments/wmt14/
README.md says what a run needs: data, device hours, and how its BLEU compares with the paper's).

    python launch.py --config=experiments/wmt14.py:transformer_base --workdir=/tmp/wmt14_base \
        --config.task.source_dir=/data/wmt14
    python launch.py --config=experiments/wmt14.py:transformer_base --workdir=/tmp/wmt14_base --mode=eval
    # the smoke run, on a WMT-format fixture of a few dozen made-up pairs (tests/data/data_fixtures.py)
    python tests/data/data_fixtures.py wmt14 /tmp/wmt14_fixture
    python launch.py --config=experiments/wmt14.py:tiny --workdir=/tmp/wmt14_tiny \
        --config.task.source_dir=/tmp/wmt14_fixture --config.task.data_dir=/tmp/wmt14_tiny_tfds

The data is TFDS's ``wmt14_translate/de-en`` (transformer/data/wmt14: Europarl v7, Common Crawl and News
Commentary v9 for training, newstest2013 validation, newstest2014 test), from a local folder of statmt.org's
archives or downloaded. ``transformer_base``: the base model (6+6 layers, d_model 512, 8 heads, d_ff 2048,
dropout 0.1 on sublayer outputs and embeddings), label smoothing 0.1, one BPE vocabulary of 37,000 pieces for
both languages, about 25,000 source and 25,000 target tokens per batch, Adam (0.9, 0.98, 1e-9) with the paper's
warmup schedule (4,000 steps), 100,000 steps, the mean of the last 5 checkpoints, beam 4 with alpha 0.6.
``tiny``: translation's smoke settings (one layer of d_model 32, 40 steps, greedy decoding) for the fixture:
train, eval (the mean of its 2 checkpoints) and translate in minutes on 2 CPU cores; not a result.
"""
from experiments import translation
from experiments.translation import SMOKE
from transformer.errors import ConfigError
from transformer.train import base_config

VARIANTS = ("transformer_base", SMOKE)
__all__ = ["SMOKE", "VARIANTS", "get_config"]


def get_config(variant: str = "transformer_base"):
  if variant not in VARIANTS:
    raise ConfigError(f"unknown variant {variant!r} of experiments/wmt14.py; choose one of {list(VARIANTS)} "
                      "(e.g. --config=experiments/wmt14.py:transformer_base).")
  config = base_config("transformer")
  config.task = translation.task("wmt14", "en-de", test_splits=("test",))  # newstest2014
  # "byte-pair encoding, ... a shared source-target vocabulary" (5.1); also what the fixture's 1,000 pieces need
  config.task.tokenizer_type = "bpe"
  translation.paper_training(config)  # label smoothing 0.1, inverse_sqrt, Adam b2 0.98, BLEU chooses checkpoints
  if variant == "transformer_base":
    paper_base(config)
  else:  # tiny: minutes end to end on the fixture
    translation.smoke(config)
    config.average_checkpoints = 2  # eval and translate average the 2 it saves (steps 20 and 40)
  return config


def paper_base(config) -> None:
  """The paper's base model and its training and decoding recipe (sections 5 and 6.1, table 3 row "base")."""
  model = config.model
  model.d_model = 512
  model.num_heads = 8
  model.d_ff = 2048
  model.num_encoder_layers = 6
  model.num_decoder_layers = 6
  model.dropout_rate = 0.1  # P_drop, on each sublayer's output and on the embeddings plus positions (5.4)
  model.attention_dropout_rate = 0.0  # the paper drops out nowhere else
  model.feed_forward_dropout_rate = 0.0
  model.norm_position = "post"  # LayerNorm(x + Sublayer(x))
  model.share_embeddings = True  # one table for both embeddings and the pre-softmax projection (3.4)
  task = config.task
  task.vocab_size = 37_000  # "about 37000 tokens"
  task.shared_vocab = True
  task.max_tokens = 25_000  # "approximately 25000 source tokens and 25000 target tokens" per batch (5.1)
  task.max_length = 256  # training pairs longer than this (in pieces) are left out; the paper names no limit
  optimizer = config.optimizer
  optimizer.b1, optimizer.b2, optimizer.eps = 0.9, 0.98, 1e-9  # (5.3)
  optimizer.weight_decay = 0.0
  optimizer.schedule = "inverse_sqrt"
  optimizer.warmup_steps = 4000
  optimizer.learning_rate = (512 * 4000) ** -0.5  # d_model^-0.5 * min(step^-0.5, step * warmup^-1.5) (eq. 3)
  config.num_train_steps = 100_000
  # "averaging the last 5 checkpoints, which were written at 10-minute intervals": about 1,400 of the paper's
  # steps (100k in 12 hours); 1,250 divides 100k.
  config.checkpoint_every = 1250
  config.keep_checkpoints = 5
  config.average_checkpoints = 5  # --mode=eval, predict and translate use the mean of the last 5
  config.eval_every = 5000  # BLEU of beam search on newstest2013 (3,000 sentences): checkpoint selection
  config.log_every = 100
  decode = config.decode
  decode.method = "beam"
  decode.beam_size = 4  # "beam search with a beam size of 4 and length penalty alpha = 0.6" (6.1)
  decode.length_penalty = 0.6
