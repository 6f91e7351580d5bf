"""Autoregressive search over a function ``(tokens, cache) -> (logits, cache)``."""
from transformer.decode.beam import (beam_search, expand_to_beams, flatten_beams, gather_beams,
                                     gnmt_length_penalty, unflatten_beams)
from transformer.decode.greedy import greedy_search

__all__ = ["beam_search", "expand_to_beams", "flatten_beams", "gather_beams", "gnmt_length_penalty",
           "greedy_search", "unflatten_beams"]
