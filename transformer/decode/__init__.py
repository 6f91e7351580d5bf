"""Autoregressive search over a function ``(tokens, cache) -> (logits, cache)``: greedy, sampling, beam."""
from transformer.decode.beam import (FINISH_RULES, beam_search, expand_to_beams, flatten_beams, gather_beams,
                                     gnmt_length_penalty, map_batch_leaves, unflatten_beams)
from transformer.decode.greedy import greedy_search
from transformer.decode.sampling import check_sampling, sample, sample_logits, top_k_logits, top_p_logits
from transformer.decode.search import METHODS, DecodeSettings, search
from transformer.decode.start import PrefillFunction, StepFunction, first_log_probs

__all__ = ["FINISH_RULES", "METHODS", "DecodeSettings", "search", "PrefillFunction", "StepFunction", "beam_search", "check_sampling", "expand_to_beams",
           "first_log_probs", "flatten_beams", "gather_beams", "gnmt_length_penalty", "greedy_search",
           "map_batch_leaves", "sample", "sample_logits", "top_k_logits", "top_p_logits", "unflatten_beams"]
