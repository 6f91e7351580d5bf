"""Ablation: the number of attention heads at a fixed d_model (paper table 3, rows A).

    python -m experiments.ablations_results --ablation=heads --workdir_root=/tmp/ablations
    python launch.py --config=experiments/ablations/heads.py:8 --workdir=/tmp/ablations/heads/8

Variants: 1, 2, 4, 8, 16 heads of d_model 64 (head size 64 ... 4); ``NAME,multi30k`` for the Multi30k base
(d_model 128). Results: experiments/ablations/RESULTS.md.
"""
from experiments.ablations.common import Ablation

ABLATION = Ablation(
    name="heads", title="Number of attention heads",
    question="How does splitting d_model into 1 to 16 heads change accuracy (synthetic: d_model 64, heads of 64 "
             "down to 4; Multi30k: d_model 128, heads of 128 down to 8)?",
    variants={str(heads): {"model.num_heads": heads} for heads in (1, 2, 4, 8, 16)})


def get_config(variant: str = "4"):
  return ABLATION.get_config(variant)
