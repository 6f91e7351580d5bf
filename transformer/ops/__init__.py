"""Pure JAX functions for Transformers: no Flax, no global state, randomness only through explicit keys.

    from transformer import ops
    out = ops.dot_product_attention(q, k, v, mask=ops.make_causal_mask(q.shape[1]))

Each op computes its formula; backend-tuned implementations live in ``ops.kernels`` and are passed in as
``kernels=ops.select_kernels(setting)`` (what a model config's ``resolved_kernels`` holds).
"""
from transformer.ops.attention import attend, attention_weights, dot_product_attention, weighted_values
from transformer.ops.chunked import chunked_dot_product_attention
from transformer.ops import kernels
from transformer.ops.dense import dense
from transformer.ops.dropout import dropout, token_dropout
from transformer.ops.feed_forward import ACTIVATIONS, feed_forward
from transformer.ops.kernels import select_kernels  # the one choice of backend-tuned pieces: see above
from transformer.ops.losses import softmax_cross_entropy, weighted_sum
from transformer.ops.heads import head_groups, repeat_kv_heads
from transformer.ops.masks import (MASK_VALUE, combine_masks, make_attention_mask, make_causal_mask, make_local_mask,
                                   make_padding_mask, make_segment_mask)
from transformer.ops.metrics import sequence_exact_match, token_accuracy
from transformer.ops.norms import batch_norm, layer_norm, rms_norm
from transformer.ops.positional import apply_rotary_embedding, scale_embeddings, sinusoidal_position_encoding
from transformer.ops.scores import (additive_scores, additive_scores_projected, cosine_scores, dot_product_scores,
                                    general_scores, luong_dot_scores, project_additive_keys)
from transformer.ops.sequence import segment_positions, shift_right
from transformer.ops.series import instance_normalize, moving_average, patches, series_decomposition

__all__ = [
    "MASK_VALUE", "ACTIVATIONS", "attend", "attention_weights", "dot_product_attention", "weighted_values",
    "kernels", "select_kernels", "chunked_dot_product_attention", "dense", "dropout", "token_dropout",
    "feed_forward", "softmax_cross_entropy", "weighted_sum",
    "combine_masks", "make_attention_mask", "make_causal_mask", "make_local_mask", "make_padding_mask",
    "make_segment_mask",
    "head_groups", "repeat_kv_heads",
    "sequence_exact_match", "token_accuracy", "layer_norm", "rms_norm", "batch_norm", "apply_rotary_embedding",
    "scale_embeddings", "sinusoidal_position_encoding", "additive_scores", "additive_scores_projected",
    "project_additive_keys", "cosine_scores",
    "dot_product_scores", "general_scores", "luong_dot_scores", "segment_positions", "shift_right",
    "instance_normalize", "moving_average", "patches", "series_decomposition",
]
