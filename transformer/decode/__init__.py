"""Autoregressive search over a function ``(tokens, cache) -> (logits, cache)``: greedy, sampling, beam."""
from transformer.decode.beam import (FINISH_RULES, beam_search, expand_to_beams, flatten_beams, gather_beams,
                                     gnmt_length_penalty, map_batch_leaves, unflatten_beams)
from transformer.decode.greedy import greedy_search
from transformer.decode.sampling import check_sampling, sample, sample_logits, top_k_logits, top_p_logits
from transformer.decode.search import METHODS, DecodeSettings, check_scores_finite, override_decode, search
from transformer.decode.start import (PrefillFunction, StepFunction, check_max_length, check_special_ids,
                                      first_log_probs, non_finite_rows)

__all__ = ["FINISH_RULES", "METHODS", "DecodeSettings", "override_decode", "PrefillFunction", "StepFunction", "beam_search",
           "check_max_length", "check_sampling", "check_scores_finite", "check_special_ids", "expand_to_beams",
           "first_log_probs", "flatten_beams", "gather_beams", "gnmt_length_penalty", "greedy_search",
           "map_batch_leaves", "non_finite_rows", "sample", "sample_logits", "search", "top_k_logits", "top_p_logits",
           "unflatten_beams"]
