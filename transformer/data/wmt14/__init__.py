"""WMT'14 German-English TFDS builder (``name="wmt14"``, config ``de-en``): TFDS's ``wmt14_translate/de-en``
data, read from local files or downloaded."""
from transformer.data.wmt14.wmt14_dataset_builder import Builder
