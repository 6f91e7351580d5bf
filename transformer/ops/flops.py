"""Model FLOPs of a Transformer step from its sizes: the numerator of MFU, for the training log and the benchmarks."""
from __future__ import annotations


def transformer_flops(config, batch_size: int, source_length: int, target_length: int,
                      train: bool = True) -> dict[str, float]:
  """Model FLOPs of one step of a Transformer, split into ``parameters`` and ``attention`` (and ``total``).

  ``config`` has the fields of ``transformer.nn.ModelConfig`` used here (``d_model``, ``d_ff``,
  ``num_encoder_layers``, ``num_decoder_layers``, ``output_vocab_size``). The encoder-decoder reads
  ``[batch_size, source_length]`` and predicts ``[batch_size, target_length]``; ``source_length`` 0 is a
  decoder-only language model (no encoder, no cross-attention), ``target_length`` 0 an encoder alone (a
  classifier, whose pooled head is not counted: one ``d_model x classes`` product per example).

  Convention (Kaplan et al. 2020; PaLM, Chowdhery et al. 2022, appendix B): only matmuls count, 2 FLOPs per
  multiply-add; a training step is 3x the forward pass (the backward pass computes the gradients of both the
  inputs and the weights, 2x forward). Hence "6 * parameters * tokens plus attention":

  - ``parameters``: ``6 * N * D`` with every weight matrix counted for the tokens it multiplies: encoder
    matrices for source tokens, decoder self-attention, cross-attention query/output and feed-forward for
    target tokens, cross-attention key/value for source tokens (once per decoder layer), and the (tied)
    output projection ``d_model x vocab`` for target tokens. Embedding lookups, biases, norms, the softmax,
    the loss and the optimizer update are not counted (they are not matmuls).
  - ``attention``: ``q k^T`` and ``weights v``, ``2 * 2 * q_length * kv_length * d_model`` forward per layer
    and example (``heads * head_dim = d_model``), times 3. Causal self attention is counted in full, as the
    dense kernel computes the whole matrix (PaLM halves nothing either).

  Dropout, padding and recomputation (remat) are ignored: this is *model* FLOPs, the numerator of MFU.
  """
  d, f = config.d_model, config.d_ff
  source, target = source_length, target_length
  cross = source > 0  # a decoder with an encoder to attend to
  encoder_parameters = config.num_encoder_layers * (4 * d * d + 2 * d * f) * source
  decoder_parameters = config.num_decoder_layers * (
      (4 * d * d + 2 * d * f) * target + cross * (2 * d * d * target + 2 * d * d * source)) if target else 0
  output_projection = d * config.output_vocab_size * target
  encoder_attention = config.num_encoder_layers * 2 * source * source * d
  decoder_attention = config.num_decoder_layers * 2 * (target * target + cross * target * source) * d
  multiplier = 6.0 if train else 2.0  # 2 FLOPs per multiply-add, x3 for forward + backward
  parameters = multiplier * batch_size * (encoder_parameters + decoder_parameters + output_projection)
  attention = multiplier * batch_size * (encoder_attention + decoder_attention)
  return {"parameters": parameters, "attention": attention, "total": parameters + attention}
