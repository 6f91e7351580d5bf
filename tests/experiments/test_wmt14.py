"""experiments/wmt14.py: the paper's base recipe as published, and its ``tiny`` variant end to end (train, eval with
the mean of its checkpoints, translate) on a WMT-format fixture of a few dozen pairs written here."""
import pytest

from tests.data.data_fixtures import write_wmt14
from tests.train.conftest import load_experiment_config
from transformer.train import run
from transformer.train.config import validate_config


def test_transformer_base_is_the_papers_base_recipe():
  config = validate_config(load_experiment_config("wmt14", "transformer_base"))
  model, task, optimizer, decode = config.model, config.task, config.optimizer, config.decode
  assert (model.d_model, model.num_heads, model.d_ff, model.num_encoder_layers, model.num_decoder_layers) == (
      512, 8, 2048, 6, 6)
  assert (model.dropout_rate, config.label_smoothing, model.norm_position, model.share_embeddings) == (
      0.1, 0.1, "post", True)
  assert (task.dataset, task.pair, task.test_splits) == ("wmt14", "en-de", ("test",))
  assert (task.tokenizer_type, task.vocab_size, task.shared_vocab, task.max_tokens) == ("bpe", 37_000, True, 25_000)
  assert (optimizer.b1, optimizer.b2, optimizer.eps, optimizer.weight_decay) == (0.9, 0.98, 1e-9, 0.0)
  # eq. 3: d_model^-0.5 * min(step^-0.5, step * warmup^-1.5) peaks at step 4000 at (512 * 4000)^-0.5
  assert (optimizer.schedule, optimizer.warmup_steps) == ("inverse_sqrt", 4000)
  assert optimizer.learning_rate == pytest.approx(512 ** -0.5 * 4000 ** -0.5)
  assert config.num_train_steps == 100_000 and config.num_train_steps % config.checkpoint_every == 0
  assert config.keep_checkpoints == config.average_checkpoints == 5
  assert (decode.method, decode.beam_size, decode.length_penalty) == ("beam", 4, 0.6)


@pytest.mark.slow
def test_tiny_trains_evaluates_the_mean_of_its_checkpoints_and_translates_on_the_fixture(tmp_path):
  config = load_experiment_config("wmt14", "tiny")
  config.task.source_dir = str(write_wmt14(tmp_path / "wmt14"))
  config.task.data_dir = str(tmp_path / "tfds")
  config.quiet, config.tensorboard = True, False
  workdir = str(tmp_path / "run")
  trained = run(config, workdir)
  assert trained.metrics["eval/loss"] < 6.9  # below log(1000), the loss of a uniform guess: it trains

  evaluated = run(config, workdir, mode="eval")
  assert evaluated.metrics["test/sentences"] == 16  # newstest2014's segments in the fixture's SGML
  assert (tmp_path / "run" / "average_last_2" / "test.hyp.de").read_text(encoding="utf-8").count("\n") == 16

  translated = run(config, workdir, mode="translate", lines=["Caloma sumu haneli .", ""])
  assert len(translated.outputs) == 2 and translated.outputs[1] == ""
