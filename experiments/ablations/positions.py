"""Ablation: how positions enter (sinusoidal, learned, rotary, none) and the sqrt(d_model) embedding scale.

    python -m experiments.ablations_results --ablation=positions --workdir_root=/tmp/ablations
    python launch.py --config=experiments/ablations/positions.py:rotary --workdir=/tmp/ablations/positions/rotary

Reversal needs positions: without any, the encoder sees a bag of symbols (the causal decoder can still count).
Variants: sinusoidal (the paper), learned, rotary, none, and ``sinusoidal_unscaled_embeddings`` (no
sqrt(d_model) factor on the embeddings, section 3.4); ``NAME,multi30k`` for the Multi30k base.
Results: experiments/ablations/RESULTS.md.
"""
from experiments.ablations.common import Ablation

ABLATION = Ablation(
    name="positions", title="Positional encoding and the embedding scale",
    question="Which positional encoding works, and does the sqrt(d_model) embedding scale matter?",
    variants={
        "sinusoidal": {"model.positional_encoding": "sinusoidal"},
        "learned": {"model.positional_encoding": "learned"},
        "rotary": {"model.positional_encoding": "rotary"},
        "none": {"model.positional_encoding": "none"},
        "sinusoidal_unscaled_embeddings": {"model.positional_encoding": "sinusoidal",
                                           "model.scale_embeddings": False},
    })


def get_config(variant: str = "sinusoidal"):
  return ABLATION.get_config(variant)
