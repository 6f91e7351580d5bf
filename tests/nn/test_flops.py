"""``transformer.nn.transformer_flops``: the model-FLOP count behind MFU, against a hand count and XLA's count of
the model."""
import jax
import numpy as np
import pytest

from transformer.nn import EncoderDecoder, ModelConfig
from transformer.nn.config import transformer_flops
from transformer.nn.models import TransformerLM


def test_a_tiny_encoder_decoder_counted_by_hand():
  """d_model 4, d_ff 8, one encoder and one decoder layer, vocabulary 10; one example of 3 source and 2 target
  tokens. Multiply-adds of the forward pass:
  - encoder layer, per source token: q, k, v, o 4 * 4 * 4 = 64, feed-forward 2 * 4 * 8 = 64; x 3 tokens = 384
  - decoder layer, per target token: self q, k, v, o 64, cross q, o 32, feed-forward 64; x 2 tokens = 320; cross
    k, v per source token 32, x 3 = 96; = 416
  - output projection 4 * 10 per target token, x 2 = 80
  - attention (q k^T and weights v, each q_length * kv_length * d_model): encoder 2 * 3 * 3 * 4 = 72, decoder
    self 2 * 2 * 2 * 4 = 32, cross 2 * 2 * 3 * 4 = 48; = 152
  2 FLOPs a multiply-add; training is 3 forward passes."""
  config = ModelConfig(vocab_size=10, d_model=4, num_heads=1, d_ff=8, num_encoder_layers=1, num_decoder_layers=1)
  forward = transformer_flops(config, 1, 3, 2, train=False)
  assert forward == {"parameters": 2 * (384 + 416 + 80), "attention": 2 * 152, "total": 2 * (384 + 416 + 80 + 152)}
  assert transformer_flops(config, 5, 3, 2)["total"] == 5 * 3 * forward["total"]  # per example, x3 to train
  # Decoder-only (a language model over the 2 tokens): no encoder, no cross-attention.
  assert transformer_flops(config, 1, 0, 2, train=False)["total"] == 2 * ((64 + 64) * 2 + 80 + 2 * 2 * 2 * 4)
  # Encoder alone (a classifier): no decoder, no output projection.
  assert transformer_flops(config, 1, 3, 0, train=False)["total"] == 2 * (384 + 72)


def xla_flops(model, *inputs) -> float:
  params = model.init(jax.random.PRNGKey(0), *inputs)
  analysis = jax.jit(model.apply).lower(params, *inputs).compile().cost_analysis()
  return (analysis[0] if isinstance(analysis, (list, tuple)) else analysis)["flops"]


@pytest.mark.slow
def test_the_count_is_within_5_percent_of_xlas_count_of_the_forward_pass():
  """At most XLA's count of the whole forward pass and within 5% of it (XLA also counts the non-matmul FLOPs:
  softmax, norms, residuals); source and target lengths differ so that cross attention is checked too."""
  config = ModelConfig(vocab_size=300, d_model=64, num_heads=4, d_ff=128, num_encoder_layers=2,
                       num_decoder_layers=1, deterministic=True)
  source, target = np.ones((2, 24), np.int32), np.ones((2, 16), np.int32)
  for ours, xla in ((transformer_flops(config, 2, 24, 16, train=False)["total"],
                     xla_flops(EncoderDecoder(config), source, target)),
                    (transformer_flops(config, 2, 0, 16, train=False)["total"],
                     xla_flops(TransformerLM(config), target))):
    assert ours <= xla and ours == pytest.approx(xla, rel=0.05)
