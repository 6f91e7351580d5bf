"""Tasks that train SentencePiece tokenizers on their data (translation, language modelling): a trained run's own
copies of them (``WORKDIR/tokenizers/``) stand in for the data's, so a loaded model reads and writes text without
its prepared data, which is then read only when something needs it (evaluation, BLEU, predictions).
"""
from __future__ import annotations

from transformer.data import tokenizers
from transformer.errors import WorkdirError


class RecordedTokenizers:
  """Mixin of a task whose ``data`` (a ``functools.cached_property``, read on first use) trains or reads the
  tokenizers named ``tokenizer_names``: ``tokenizer(name)`` is the run's recorded model once
  ``use_recorded_tokenizers`` gave it, else the data's. Data read after that must hold the same models."""
  tokenizer_names: tuple[str, ...] = ()
  _recorded: dict = {}  # name -> SentencePieceTokenizer, set per task by use_recorded_tokenizers

  def data_tokenizers(self, data) -> dict:
    """name -> tokenizer of the task's ``data`` (every one of ``tokenizer_names``)."""
    raise NotImplementedError

  def use_recorded_tokenizers(self, paths: dict[str, str]) -> None:
    """Take the run's tokenizers, ``name -> model file`` (``<name>.<fingerprint>.model``), instead of the data's."""
    self._recorded = {name: tokenizers.SentencePieceTokenizer.from_file(path) for name, path in paths.items()
                      if name in self.tokenizer_names}

  def tokenizer(self, name: str):
    """The tokenizer ``name``: the recorded one, else that of the data (which is then read)."""
    return self._recorded[name] if name in self._recorded else self.data_tokenizers(self.data)[name]

  def prepare_data(self, training: bool = True) -> None:
    """The data set prepared and its tokenizers trained on disk, and with ``training`` its training split
    tokenized into the cache the other processes memory-map (``data.token_cache``), without keeping them:
    ``data``, read again on first use, is checked then against the run's tokenizers (which may not be known yet)."""
    if training:
      self.data.train  # pylint: disable=pointless-statement
    else:
      self.data  # pylint: disable=pointless-statement
    del self.__dict__["data"]

  def trained_tokenizers(self) -> dict:
    return {name: self.tokenizer(name) for name in self.tokenizer_names}

  def checked_data(self, data):
    """``data``, once its tokenizers are the recorded ones (when some are): token ids the model reads must mean
    the pieces it was trained on.

    Raises:
      WorkdirError: a tokenizer of the data differs from the run's; the message names the ``cp`` that fixes it.
    """
    for name, tokenizer in sorted(self.data_tokenizers(data).items()):
      recorded = self._recorded.get(name)
      if recorded is not None and recorded.fingerprint != tokenizer.fingerprint:
        raise WorkdirError(
            f"the prepared data's {name} tokenizer {tokenizer.path or ''} (fingerprint {tokenizer.fingerprint}) is "
            f"not the one the model was trained with ({recorded.path}, fingerprint {recorded.fingerprint}): its "
            f"token ids would mean other pieces. Copy the run's own model over it: cp {recorded.path} "
            f"{tokenizer.path or 'TOKENIZER_PATH'} (or set config.task.data_dir to the data the run trained on).")
    return data
