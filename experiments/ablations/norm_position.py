"""Ablation: post-LN (the paper) against pre-LN, with and without learning-rate warmup, counting divergence.

    python -m experiments.ablations_results --ablation=norm_position --workdir_root=/tmp/ablations
    python launch.py --config=experiments/ablations/norm_position.py:post_no_warmup --workdir=/tmp/np/post_nw

A deeper model (4+4 layers) at a high constant learning rate (5e-3) without gradient clipping, where post-LN
without warmup is expected to struggle (Xiong et al. 2020); non-finite steps are skipped per seed
(``skip_nonfinite_steps``) so that one diverging seed does not stop the others, and the page counts a seed as
diverged when it skipped steps or ends above ``common.DIVERGED_LOSS``. Variants: post_warmup, post_no_warmup,
pre_warmup, pre_no_warmup (warmup: 50 steps); ``NAME,multi30k`` for the Multi30k base.
Results: experiments/ablations/RESULTS.md.
"""
from experiments.ablations.common import Ablation

_UNSTABLE = {"model.num_encoder_layers": 4, "model.num_decoder_layers": 4, "optimizer.learning_rate": 5e-3,
             "optimizer.schedule": "constant", "optimizer.grad_clip_norm": 0.0, "skip_nonfinite_steps": True}

ABLATION = Ablation(
    name="norm_position", title="Post-LN vs pre-LN, with and without warmup",
    question="Does post-LN need warmup at a high learning rate where pre-LN does not?",
    variants={f"{position}_{'warmup' if warmup else 'no_warmup'}":
              {"model.norm_position": position, "optimizer.warmup_steps": warmup}
              for position in ("post", "pre") for warmup in (50, 0)},
    note=("Warmup ramps the learning rate linearly from 0 over 50 steps. On the synthetic task the rate is "
          "constant after it, so the ramp is the only difference; on Multi30k the base's inverse-sqrt schedule "
          "stays, so without warmup the rate starts at its peak and decays as peak / sqrt(step): above the "
          "warmed-up rate for the first 13 steps, then below it, sqrt(50) times below from step 50 on "
          "(peak * sqrt(50 / step)). There the variants differ in the whole schedule, not only the ramp."),
    setup={**_UNSTABLE, "num_train_steps": 200, "eval_every": 200},
    multi30k_setup={"optimizer.grad_clip_norm": 0.0, "skip_nonfinite_steps": True})


def get_config(variant: str = "post_warmup"):
  return ABLATION.get_config(variant)
