"""Ablation: the attention of the RNN encoder-decoder: additive (Bahdanau), dot, general, cosine (Luong), none.

    python -m experiments.ablations_results --ablation=rnn_attention --workdir_root=/tmp/ablations
    python launch.py --config=experiments/ablations/rnn_attention.py:none --workdir=/tmp/ablations/rnn/none

A GRU encoder-decoder (bidirectional encoder, hidden 64). ``none`` has no attention: the decoder sees the
source only through its initial state. Variants: additive, dot, general, cosine, none; ``NAME,multi30k`` for
the Multi30k base (experiments/multi30k.py's gru_bahdanau, its width halved: ``MULTI30K_SETUP``).
Results: experiments/ablations/RESULTS.md.
"""
from experiments.ablations.common import Ablation

# Half gru_bahdanau's width (hidden 512, embeddings 256): at full width the five 3-seed programs would take most
# of a day on a 2-core CPU.
MULTI30K_SETUP = {"model.hidden_dim": 256, "model.embedding_dim": 128}

ABLATION = Ablation(
    name="rnn_attention", title="RNN encoder-decoder: attention score",
    question="How much does attention, and which score, matter to an RNN encoder-decoder?",
    model_name="rnn",
    variants={"additive": {"model.attention": "bahdanau"}, "dot": {"model.attention": "luong_dot"},
              "general": {"model.attention": "luong_general"}, "cosine": {"model.attention": "luong_cosine"},
              "none": {"model.attention": "none"}},
    multi30k_setup=MULTI30K_SETUP)


def get_config(variant: str = "additive"):
  return ABLATION.get_config(variant)
