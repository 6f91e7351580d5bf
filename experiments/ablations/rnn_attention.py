"""Ablation: the attention of the RNN encoder-decoder: additive (Bahdanau), dot, general, cosine (Luong), none.

    python -m experiments.ablations_results --ablation=rnn_attention --workdir_root=/tmp/ablations
    python launch.py --config=experiments/ablations/rnn_attention.py:none --workdir=/tmp/ablations/rnn/none

A GRU encoder-decoder (bidirectional encoder, hidden 64). ``none`` has no attention: the decoder sees the
source only through its initial state. Variants: additive, dot, general, cosine, none; ``NAME,multi30k`` for
the Multi30k base (experiments/multi30k.py's gru_bahdanau). Results: experiments/ablations/RESULTS.md.
"""
from experiments.ablations.common import Ablation

ABLATION = Ablation(
    name="rnn_attention", title="RNN encoder-decoder: attention score",
    question="How much does attention, and which score, matter to an RNN encoder-decoder?",
    model_name="rnn",
    variants={"additive": {"model.attention": "bahdanau"}, "dot": {"model.attention": "luong_dot"},
              "general": {"model.attention": "luong_general"}, "cosine": {"model.attention": "luong_cosine"},
              "none": {"model.attention": "none"}})


def get_config(variant: str = "additive"):
  return ABLATION.get_config(variant)
