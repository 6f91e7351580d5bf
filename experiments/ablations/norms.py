"""Ablation: LayerNorm (the paper) against RMSNorm and BatchNorm in its place.

    python -m experiments.ablations_results --ablation=norms --workdir_root=/tmp/ablations
    python launch.py --config=experiments/ablations/norms.py:batch_norm --workdir=/tmp/ablations/norms/batch_norm

BatchNorm here uses the statistics of the batch it sees, over non-padding positions, in training and at
evaluation alike (``transformer.ops.batch_norm``: no running averages); in greedy decoding with a cache those are
the statistics of the current step's tokens. Variants: layer_norm, rms_norm, batch_norm; ``NAME,multi30k`` for
the Multi30k base. Results: experiments/ablations/RESULTS.md.
"""
from experiments.ablations.common import Ablation

ABLATION = Ablation(
    name="norms", title="LayerNorm vs RMSNorm vs BatchNorm",
    question="Does the choice of normalisation matter, and how does BatchNorm (batch statistics) fare?",
    variants={norm: {"model.norm": norm} for norm in ("layer_norm", "rms_norm", "batch_norm")},
    note="BatchNorm here has no running averages: teacher-forced evaluation (token accuracy, NLL) normalises "
         "by the statistics of whole target sequences, as in training, and those statistics mix in later "
         "positions of the causal decoder; decoding with a cache (greedy's exact match, beam search's BLEU) "
         "normalises by the statistics of one position per row. A gap between the two kinds of metric measures "
         "that mismatch, not BatchNorm with running statistics.")


def get_config(variant: str = "layer_norm"):
  return ABLATION.get_config(variant)
