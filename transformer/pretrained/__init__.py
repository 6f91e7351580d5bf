"""Pretrained checkpoints loaded into this package's own modules.

| module | holds |
| --- | --- |
| ``bert`` | ``load_bert(model_dir) -> (ModelConfig, params, tokenizer)``: Hugging Face BERT-family checkpoints (``config.json``, ``model.safetensors``, ``tokenizer.json``) as ``transformer.nn.Encoder`` parameters |
| ``tokenizer`` | ``PretrainedTokenizer`` (a model's ``tokenizer.json`` through the ``tokenizers`` library), ``pad_batch`` |
| ``embed`` | ``python -m transformer.pretrained.embed``: mean-pooled, L2-normalised sentence embeddings |
"""
from transformer.pretrained.bert import load_bert
from transformer.pretrained.tokenizer import PretrainedTokenizer, pad_batch

__all__ = ["load_bert", "PretrainedTokenizer", "pad_batch"]
