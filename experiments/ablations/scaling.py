"""Ablation: scaled dot-product attention, q.k / sqrt(d_k) (paper eq. 1), against q.k unscaled.

    python -m experiments.ablations_results --ablation=scaling --workdir_root=/tmp/ablations
    python launch.py --config=experiments/ablations/scaling.py:unscaled --workdir=/tmp/ablations/scaling/unscaled

At d_k = 64 as in the paper (one head of d_model 64), where unscaled logits of unit-variance q and k have a
standard deviation of 8 and the softmax saturates (paper footnote 4). The results page adds the attention
entropy and the share of saturated rows, measured on the trained models through ``transformer.load``.
Variants: scaled, unscaled (and ``NAME,multi30k``, see common.py). Results: experiments/ablations/RESULTS.md.
"""
from experiments.ablations.common import Ablation

ABLATION = Ablation(
    name="scaling", title="Attention scaling by 1/sqrt(d_k)",
    question="Does dividing q.k by sqrt(d_k) matter at d_k = 64, and does the softmax saturate without it?",
    variants={"scaled": {"model.scale_attention": True}, "unscaled": {"model.scale_attention": False}},
    setup={"model.num_heads": 1}, multi30k_setup={"model.num_heads": 2})  # d_k = 64 on both


def get_config(variant: str = "scaled"):
  return ABLATION.get_config(variant)
