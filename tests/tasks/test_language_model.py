"""The language-model task on a tiny Multi30k-format fixture: batches, loss masking, perplexity, training end to
end, and greedy continuations through ``transformer.load`` checked against the model's own full-pass argmax."""
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.data.data_fixtures import write_multi30k
from transformer.data.hosts import HostShard
from transformer.tasks.language_model import LOG_PROBS_FILE, log_probs_metrics, read_log_probs
from tests.train.conftest import load_experiment_config
from transformer import load
from transformer.errors import ConfigError
from transformer.train.config import build_task
from transformer.decode import DecodeSettings
from transformer.tasks.decoding import continue_prompts
from transformer.train import run

# The fixture's made-up text has 21 characters and 47 pieces at most: the real data's tiny vocabulary is too large.
FIXTURE_VOCAB_SIZE = 40
SIZES = {"train": 300, "val": 20, "test_2016_flickr": 2, "test_2017_flickr": 2, "test_2017_mscoco": 2,
         "test_2018_flickr": 2}


@pytest.fixture(scope="module")
def raw_dir(tmp_path_factory):
  return write_multi30k(tmp_path_factory.mktemp("raw") / "multi30k", sizes=SIZES)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  return tmp_path_factory.mktemp("tfds")


def tiny_config(raw_dir, data_dir, **model_overrides):
  config = load_experiment_config("language_model", "tiny")
  config.task.source_dir, config.task.data_dir = str(raw_dir), str(data_dir)
  config.task.vocab_size = FIXTURE_VOCAB_SIZE
  config.quiet, config.tensorboard = True, False
  for name, value in model_overrides.items():
    config.model[name] = value
  return config


def test_batches_are_padded_sentences_ending_with_eos(raw_dir, data_dir):
  task = build_task(tiny_config(raw_dir, data_dir))
  batch = next(iter(task.train_iterator(0, seed=0)))
  assert set(batch) == {"tokens"} and batch["tokens"].dtype == np.int32
  rows, length = batch["tokens"].shape
  assert rows * length <= task.settings.task.max_tokens
  model_config = task.model_config()
  for row in batch["tokens"]:
    real = row[row != model_config.pad_id]
    if len(real):
      assert real[-1] == model_config.eos_id and np.all(row[:len(real)] == real)  # padding only at the end
  # Evaluation sees every validation sentence once, with its EOS.
  eval_tokens = [row for batch in task.eval_batches(0) for row in batch["tokens"]]
  sentences = [row for row in eval_tokens if np.any(row != 0)]
  assert len(sentences) == SIZES["val"]
  assert all(np.sum(row == model_config.eos_id) == 1 for row in sentences)


@pytest.mark.slow
def test_loss_counts_real_tokens_only(raw_dir, data_dir):
  """Extra padding columns and all-padding rows change neither the loss sum nor the weight."""
  task = build_task(tiny_config(raw_dir, data_dir))
  model_config = task.model_config().replace(deterministic=True)
  model = task.build_model(model_config)
  tokens = np.array([[5, 6, 7, 2], [8, 2, 0, 0]], np.int32)
  params = model.init(jax.random.key(0), tokens)["params"]
  loss, weight, metrics = task.loss_and_metrics(model, params, {"tokens": tokens}, None)
  padded = np.zeros((3, 7), np.int32)
  padded[:2, :4] = tokens
  padded_loss, padded_weight, _ = task.loss_and_metrics(model, params, {"tokens": padded}, None)
  assert float(weight) == float(padded_weight) == 6.0
  np.testing.assert_allclose(padded_loss, loss, rtol=1e-5)
  # numpy recomputation: -log softmax(logits)[target] over the non-padding targets.
  logits = np.asarray(model.apply({"params": params}, tokens), np.float64)
  log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  nll = -np.take_along_axis(log_probs, tokens[..., None], -1)[..., 0]
  np.testing.assert_allclose(float(metrics["nll"][0]), nll[tokens != 0].sum(), rtol=1e-5)


def test_perplexity_is_exp_of_each_nll():
  task = build_task(load_experiment_config("language_model", "tiny"))
  derived = task.derived_metrics({"eval/nll": 2.0, "eval/nll/seed_1": 1.0, "eval/loss": 3.0})
  assert derived == {"eval/perplexity": math.exp(2.0), "eval/perplexity/seed_1": math.exp(1.0)}


def test_a_vocabulary_smaller_than_the_texts_characters_is_one_line_naming_the_least_that_fits(raw_dir, data_dir):
  """The fixture's 21 characters and the 4 specials are a piece each: 25 at least (the real captions: 84)."""
  config = tiny_config(raw_dir, data_dir)
  config.task.vocab_size = 10
  with pytest.raises(ConfigError, match=r"^Vocabulary size too low: SentencePiece needs at least 25 pieces for these "
                     r"300 sentences \(one per character, 4 special\), not 10; set config.task.vocab_size to at "
                     r"least 25\.$"):
    build_task(config).model_config()


def test_the_task_refuses_another_model(raw_dir, data_dir):
  config = tiny_config(raw_dir, data_dir)
  config.model_name = "transformer"
  with pytest.raises(ConfigError, match="model_name='lm'"):
    build_task(config).model_config()


@pytest.mark.slow
def test_tiny_run_trains_reports_perplexity_and_continues_prompts(raw_dir, data_dir, tmp_path):
  """With multi-query attention and a sliding window, whose cached decoding the continuation check covers."""
  workdir = str(tmp_path / "run")
  config = tiny_config(raw_dir, data_dir, num_kv_heads=1, attention_window=4)
  trained = run(config, workdir)
  metrics = trained.metrics
  assert metrics["eval/perplexity"] == pytest.approx(math.exp(metrics["eval/nll"]))
  assert metrics["eval/perplexity"] < 40  # below a uniform guess over the 40-piece vocabulary

  # --mode=eval writes each validation sentence's log-probability: read back, they give its NLL and perplexity.
  evaluated = run(config, workdir, mode="eval").metrics
  rows = read_log_probs(os.path.join(workdir, LOG_PROBS_FILE.format(split="validation")))
  recomputed = log_probs_metrics(rows)
  assert [row["sentence"] for row in rows] == list(range(len(rows))) and all(row["pieces"] > 0 for row in rows)
  assert recomputed["nll"] == pytest.approx(evaluated["eval/nll"], rel=1e-5)
  assert recomputed["perplexity"] == pytest.approx(evaluated["eval/perplexity"], rel=1e-5)

  model = load(workdir)
  # The run keeps the SentencePiece model it trained with, the one a later load checks against.
  fingerprint = model.task.data.tokenizer.fingerprint
  with open(os.path.join(workdir, "tokenizers", f"text.{fingerprint}.model"), "rb") as f:
    assert f.read() == model.task.data.tokenizer.model_proto
  # A text is scored as --mode=eval scores the validation sentences (other batches, the same formula).
  validation = model.task.data.eval_text["validation"]
  np.testing.assert_allclose(model.score(validation), [row["log_prob"] for row in rows], rtol=1e-5, atol=1e-4)
  assert model.perplexity(validation) == pytest.approx(recomputed["perplexity"], rel=1e-5)
  for bad in (None, [1, 2]):
    with pytest.raises(ValueError, match="score takes a list of texts"):
      model.score(bad)
  texts = model.continue_texts(["a dog", "", "the small man sits"], max_new_tokens=6)
  assert len(texts) == 3 and all(isinstance(text, str) for text in texts)
  with pytest.raises(ValueError, match="continue_texts takes a list of prompts, got one string 'a dog'"):
    model.continue_texts("a dog")

  # Prompts of different lengths in one batch, prefilled in one pass: each row's cached continuation is the
  # argmax of the model's own full pass over its prompt + continuation.
  model_config = model.model_config.replace(deterministic=True)
  encoded = model.task.data.tokenizer.encode_batch(["a dog", "the small man sits"], add_eos=False)
  lengths = np.array([len(ids) for ids in encoded], np.int32)
  assert lengths[0] != lengths[1]
  prompt = np.zeros((2, lengths.max()), np.int32)
  for row, ids in enumerate(encoded):
    prompt[row, :len(ids)] = ids
  sequences, _ = continue_prompts(model_config, model.params, jnp.asarray(prompt), jnp.asarray(lengths), 6,
                                  DecodeSettings("greedy"))
  for row, ids in enumerate(encoded):
    generated = np.asarray(sequences)[row, 0]
    steps = int(np.argmax(generated == model_config.eos_id)) + 1 if model_config.eos_id in generated else 6
    sequence = np.concatenate([ids, generated[:steps]])[None]
    logits = model.task.build_model(model_config).apply({"params": model.params}, sequence)
    expected = np.argmax(np.asarray(logits), -1)[0, len(ids):]
    np.testing.assert_array_equal(generated[:steps], expected)

  # Sampling: the same seed gives the same continuations; --mode=translate's path reads config.decode.
  sampled = DecodeSettings("sample", temperature=1.0, top_k=5, num_samples=2, seed=3)
  first = model.task.continue_texts(model.model_config, model.params, ["a dog", "a"], 6, settings=sampled)
  assert first == model.task.continue_texts(model.model_config, model.params, ["a dog", "a"], 6, settings=sampled)
  assert model.task.translate_lines(model.model_config, model.params, ["a dog"], beam_size=2) == \
      model.task.continue_texts(model.model_config, model.params, ["a dog"],
                                settings=DecodeSettings("beam", beam_size=2))


@pytest.mark.slow
def test_a_trained_run_continues_prompts_without_its_data(tmp_path, monkeypatch):
  """``load`` once needed the prepared data (or its raw files) to build the tokenizer; the run keeps its own."""
  import shutil

  raw, workdir = tmp_path / "raw", str(tmp_path / "run")
  config = tiny_config(write_multi30k(raw / "multi30k", sizes=SIZES), tmp_path / "tfds")
  config.num_train_steps, config.eval_every, config.checkpoint_every, config.log_every = 4, 4, 4, 2
  run(config, workdir)
  expected = load(workdir).continue_texts(["a dog", ""], max_new_tokens=4)
  shutil.rmtree(raw)
  shutil.rmtree(tmp_path / "tfds")
  monkeypatch.setenv("TRANSFORMER_DATA_DIR", str(tmp_path / "nowhere"))
  assert load(workdir).continue_texts(["a dog", ""], max_new_tokens=4) == expected


def test_long_training_sentences_are_dropped_or_cut_into_pieces_and_the_log_says_how_many(raw_dir, data_dir, caplog):
  config = tiny_config(raw_dir, data_dir)
  config.task.max_length = 8  # the fixture's sentences run to 47 pieces: many are longer
  counts = {}
  for chunk in (False, True):
    config.task.chunk_long_sentences = chunk
    task = build_task(config)
    train = task.data.train
    long = int(np.sum(train.target_lengths > 8))
    assert long > 0
    with caplog.at_level("INFO", logger="transformer.tasks.language_model"):
      caplog.clear()
      iterator = task.train_iterator(0, seed=0)
      per_epoch = iterator._iterator.batcher.num_batches(0)
      tokens = sum(int(np.count_nonzero(next(iterator)["tokens"])) for _ in range(per_epoch))
      iterator.close()
    fate = "cut into pieces" if chunk else "dropped"
    assert f"{long} of {len(train)} sentences longer than max_length=8 {fate}" in caplog.text
    counts[chunk] = tokens
  assert counts[True] == train.target_tokens.size  # cut into pieces, every token is trained on once an epoch
  assert counts[False] == int(train.target_lengths[train.target_lengths <= 8].sum())


def test_each_process_builds_only_its_rows_of_the_tasks_global_batches(raw_dir, data_dir):
  """The task's training iterator is asked by ``HostShard`` to build one process's rows, and the rows of 2
  processes joined are the global batches of one process, past the first epoch's end."""
  task = build_task(tiny_config(raw_dir, data_dir))
  reference = task.train_iterator(0, seed=3)
  count = reference._iterator.batcher.num_batches(0) + 2
  expected = [next(reference) for _ in range(count)]
  shards = [HostShard(task.train_iterator(0, seed=3), process, 2) for process in range(2)]
  assert all(shard.builds_rows for shard in shards)
  for want in expected:
    rows = [next(shard) for shard in shards]
    np.testing.assert_array_equal(np.concatenate([row["tokens"] for row in rows]), want["tokens"])
  for iterator in (reference, *shards):
    iterator.close()
