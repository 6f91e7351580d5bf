"""Pretrained checkpoints loaded into this package's own modules.

| module | holds |
| --- | --- |
| ``bert`` | ``load_bert(model_dir) -> (ModelConfig, params, tokenizer)``: Hugging Face BERT-family checkpoints (``config.json``, ``model.safetensors``, ``tokenizer.json``) as ``transformer.nn.Encoder`` parameters; ``load_bert_text``: the config and tokenizer alone |
| ``tokenizer`` | ``PretrainedTokenizer`` (a model's ``tokenizer.json`` through the ``tokenizers`` library), ``pad_batch`` |
| ``embed`` | ``python -m transformer.pretrained.embed``: mean-pooled, L2-normalised sentence embeddings |
"""
from transformer import lazy_exports

# submodule -> the names it exports here, imported on first use
__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "bert": ("load_bert", "load_bert_text"),
    "tokenizer": ("PretrainedTokenizer", "pad_batch"),
})
