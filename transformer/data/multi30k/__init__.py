"""Multi30k task 1 TFDS builder (``name="multi30k"``, configs ``en-de``, ``en-fr``, ``en-cs``)."""
from transformer.data.multi30k.multi30k_dataset_builder import Builder
