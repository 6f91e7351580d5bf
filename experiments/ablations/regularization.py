"""Ablation: label smoothing 0 vs 0.1 and dropout 0 vs 0.1 (paper section 5.4), as a 2 x 2 grid.

    python -m experiments.ablations_results --ablation=regularization --workdir_root=/tmp/ablations
    python launch.py --config=experiments/ablations/regularization.py:both --workdir=/tmp/ablations/reg/both

Dropout 0.1 is on the residual sublayers and the attention weights. Variants: none, label_smoothing, dropout,
both; ``NAME,multi30k`` for the Multi30k base (whose own dropout is 0.3: there the variants set it).
Results: experiments/ablations/RESULTS.md.
"""
from experiments.ablations.common import Ablation

ABLATION = Ablation(
    name="regularization", title="Label smoothing and dropout",
    question="Do label smoothing 0.1 and dropout 0.1 help or hurt (the synthetic task has no noise to overfit)?",
    against_base=True,  # on Multi30k "none" is not the other tables' reference, which trains with dropout 0.3
    variants={name: {"label_smoothing": smoothing, "model.dropout_rate": dropout,
                     "model.attention_dropout_rate": dropout}
              for name, smoothing, dropout in (("none", 0.0, 0.0), ("label_smoothing", 0.1, 0.0),
                                               ("dropout", 0.0, 0.1), ("both", 0.1, 0.1))})


def get_config(variant: str = "none"):
  return ABLATION.get_config(variant)
