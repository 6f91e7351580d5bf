"""Pure JAX functions for Transformers: no Flax, no global state, randomness only through explicit keys.

    from transformer import ops
    out = ops.dot_product_attention(q, k, v, mask=ops.make_causal_mask(q.shape[1]))

Each op computes its formula; backend-tuned implementations live in ``ops.kernels`` and are passed in as
``kernels=ops.select_kernels(setting)`` (what a model config's ``resolved_kernels`` holds).
"""
from transformer import lazy_exports

# submodule -> the names it exports here, imported on first use
__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "attention": ("attend", "attention_weights", "dot_product_attention", "weighted_values"),
    "chunked": ("chunked_dot_product_attention",),
    "kernels": ("select_kernels",),
    "dense": ("ACTIVATIONS", "dense", "feed_forward"),
    "dropout": ("dropout", "token_dropout"),
    "losses": ("sequence_exact_match", "softmax_cross_entropy", "token_accuracy", "weighted_sum"),
    "heads": ("head_groups", "repeat_kv_heads"),
    "masks": ("MASK_VALUE", "combine_masks", "make_attention_mask", "make_causal_mask", "make_local_mask",
              "make_padding_mask", "make_segment_mask"),
    "norms": ("batch_norm", "layer_norm", "rms_norm"),
    "positional": ("apply_rotary_embedding", "scale_embeddings", "segment_positions", "shift_right",
                   "sinusoidal_position_encoding"),
    "scores": ("additive_scores", "additive_scores_projected", "cosine_scores", "dot_product_scores",
               "general_scores", "luong_dot_scores", "project_additive_keys"),
    "series": ("instance_normalize", "moving_average", "patches", "series_decomposition"),
})
