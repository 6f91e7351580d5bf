"""Autoregressive search over a function ``(tokens, cache) -> (logits, cache)``: greedy, sampling, beam."""
from transformer import lazy_exports

# submodule -> the names it exports here, imported on first use
__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "beam": ("FINISH_RULES", "beam_search", "expand_to_beams", "flatten_beams", "gather_beams",
             "gnmt_length_penalty", "map_batch_leaves", "unflatten_beams"),
    "greedy": ("greedy_search",),
    "sampling": ("check_sampling", "sample", "sample_logits", "top_k_logits", "top_p_logits"),
    "search": ("METHODS", "DecodeSettings", "check_scores_finite", "override_decode", "search"),
    "start": ("PrefillFunction", "StepFunction", "check_max_length", "check_special_ids", "first_log_probs",
              "non_finite_rows"),
})
