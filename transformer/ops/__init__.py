"""Pure JAX functions for Transformers: no Flax, no global state, randomness only through explicit keys.

    from transformer import ops
    out = ops.dot_product_attention(q, k, v, mask=ops.make_causal_mask(q.shape[1]))

Each op computes its formula; backend-tuned implementations live in ``ops.kernels`` and are passed in as
``kernels=ops.select_kernels(setting)`` (what a model config's ``resolved_kernels`` holds).
"""
from transformer.lazy import lazy_exports

# submodule -> the names it exports here, imported on first use
__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "attention": ("attend", "attention_weights", "dot_product_attention", "weighted_values"),
    "chunked": ("chunked_dot_product_attention",),
    "kernels": ("select_kernels",),
    "dense": ("dense",),
    "dropout": ("dropout", "token_dropout"),
    "feed_forward": ("ACTIVATIONS", "feed_forward"),
    "flops": ("transformer_flops",),
    "losses": ("softmax_cross_entropy", "weighted_sum"),
    "heads": ("head_groups", "repeat_kv_heads"),
    "masks": ("MASK_VALUE", "combine_masks", "make_attention_mask", "make_causal_mask", "make_local_mask",
              "make_padding_mask", "make_segment_mask"),
    "metrics": ("sequence_exact_match", "token_accuracy"),
    "norms": ("batch_norm", "layer_norm", "rms_norm"),
    "positional": ("apply_rotary_embedding", "scale_embeddings", "sinusoidal_position_encoding"),
    "scores": ("additive_scores", "additive_scores_projected", "cosine_scores", "dot_product_scores",
               "general_scores", "luong_dot_scores", "project_additive_keys"),
    "sequence": ("segment_positions", "shift_right"),
    "series": ("instance_normalize", "moving_average", "patches", "series_decomposition"),
})
