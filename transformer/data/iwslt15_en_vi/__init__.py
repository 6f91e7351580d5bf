"""IWSLT'15 English-Vietnamese TFDS builder (``name="iwslt15_en_vi"``, config ``en-vi``)."""
from transformer.data.iwslt15_en_vi.iwslt15_en_vi_dataset_builder import Builder
