"""The translation task end to end on a tiny Multi30k-format fixture: train, eval (BLEU, hypotheses), translate."""
import os

import pytest

from tests.data.data_fixtures import write_multi30k
from tests.train.conftest import load_experiment_config
from transformer import load
from transformer.data.parallel_text import MissingDataError
from transformer.errors import InputFileError
from transformer.train import run

SIZES = {"train": 400, "val": 16, "test_2016_flickr": 12, "test_2017_flickr": 2, "test_2017_mscoco": 2,
         "test_2018_flickr": 2}


# Tiny sizes of each model (config.model holds the fields of config.model_name's model only).
TINY_MODELS = {
    "transformer": {"d_model": 32, "num_heads": 2, "d_ff": 64, "num_encoder_layers": 1, "num_decoder_layers": 1,
                    "dropout_rate": 0.0},
    "rnn": {"embedding_dim": 16, "hidden_dim": 32, "dropout_rate": 0.0},
}


def tiny_translation_config(raw_dir, data_dir, variant="transformer_small", **overrides):
  config = load_experiment_config("multi30k", variant)
  settings = {
      "task.source_dir": str(raw_dir), "task.data_dir": str(data_dir), "task.vocab_size": 64,
      "task.max_tokens": 512, "task.max_length": 32, "task.test_splits": ("test_2016_flickr",),
      # One batch shape, so one compilation per program instead of one per length bucket: compiling is most of
      # these tests' time. Length buckets are tested below and end to end in tests/test_launch.py.
      "task.fixed_batch_shape": True,
      "decode.method": "beam", "decode.beam_size": 2, **{f"model.{name}": value for name, value in TINY_MODELS[config.model_name].items()},
      "optimizer.learning_rate": 3e-3, "optimizer.warmup_steps": 10, "num_train_steps": 60, "log_every": 20,
      "eval_every": 60, "checkpoint_every": 60, "quiet": True, "tensorboard": False, **overrides}
  for key, value in settings.items():
    node = config
    *parents, leaf = key.split(".")
    for parent in parents:
      node = node[parent]
    node[leaf] = value
  return config


@pytest.fixture(scope="module")
def raw_dir(tmp_path_factory):
  return write_multi30k(tmp_path_factory.mktemp("raw") / "multi30k", sizes=SIZES)


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["transformer_small", "gru_bahdanau"])
def test_train_eval_and_translate(raw_dir, tmp_path, monkeypatch, variant):
  data_dir, workdir = tmp_path / "tfds", str(tmp_path / "run")
  trained = run(tiny_translation_config(raw_dir, data_dir, variant), workdir)
  assert {"eval/bleu", "eval/bleu_lowercase", "eval/loss"} <= set(trained.metrics)

  # --mode=eval picks the length penalty on validation and decodes the test split with it.
  evaluated = run(tiny_translation_config(raw_dir, data_dir, variant, **{"task.length_penalty_candidates": (0.0, 2.0)}),
                  workdir, mode="eval")
  by_alpha = evaluated.metrics["validation/bleu_by_length_penalty"]
  assert set(by_alpha) == {"0.0", "2.0"}
  chosen = evaluated.metrics["validation/length_penalty"]
  assert by_alpha[str(chosen)] == max(by_alpha.values()) == evaluated.metrics["validation/bleu"]
  assert evaluated.metrics["test_2016_flickr/length_penalty"] == chosen
  assert evaluated.metrics["test_2016_flickr/sentences"] == 12
  assert evaluated.metrics["test_2016_flickr/bleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a")
  with open(os.path.join(workdir, "test_2016_flickr.hyp.de")) as f:
    assert len(f.read().splitlines()) == 12  # one hypothesis per reference line, none dropped
  # The validation hypotheses that chose alpha are kept: sacreBLEU on them gives the validation BLEU reported.
  from transformer.data.parallel_text import read_lines
  from transformer.tasks.metrics import corpus_bleu
  with open(os.path.join(workdir, "validation.eval.hyp.de")) as f:  # --mode=predict's is validation.hyp.de
    validation = f.read().split("\n")[:-1]
  assert len(validation) == evaluated.metrics["validation/sentences"]
  references = read_lines(str(raw_dir / "val.de.gz"))[:len(validation)]
  assert corpus_bleu(validation, references)[0] == pytest.approx(evaluated.metrics["validation/bleu"], abs=1e-9)

  # Lines are split at "\n" only: U+2028 and a form feed stay inside their sentence; an empty line gives an
  # empty line; the final newline adds none.
  lines = ["a dog runs in the park", "", "the small man\u2028sits near the water", "a child\fjumps"]
  source = tmp_path / "input.en"
  source.write_text("\n".join(lines) + "\n", encoding="utf-8")
  output = tmp_path / "output.de"
  translate_config = tiny_translation_config(raw_dir, data_dir, variant, translate_input=str(source),
                                             translate_output=str(output))
  from launch import translate_files  # what --mode=translate does: read the file, translate, write the file
  translate_files(translate_config, workdir, run)
  translations = output.read_text(encoding="utf-8").split("\n")
  assert len(translations) == len(lines) + 1 and translations[-1] == ""
  assert translations[1] == ""

  # The public API translates as --mode=translate does (its config, tokenizer and checkpoint), the empty line
  # without decoding it, and each sentence as it would alone.
  model = load(workdir)
  decoded = []
  translate_batches = model.task.translate_batches
  monkeypatch.setattr(model.task, "translate_batches",
                      lambda *args, **kwargs: decoded.append(args[3]) or translate_batches(*args, **kwargs))
  assert model.translate(lines) == translations[:-1]
  assert decoded == [3]
  assert [model.translate([line])[0] for line in lines[2:]] == translations[2:4]

  source.write_bytes("ein Mann\n".encode() + "Ölfass\n".encode("latin-1"))
  with pytest.raises(InputFileError, match=r"input.en'? is not UTF-8 text: byte b'\\xd6' at offset 9 \(line 2\)"):
    translate_files(translate_config, workdir, run)


def test_missing_data_names_the_files_and_where_to_put_them(tmp_path):
  (tmp_path / "empty").mkdir()
  with pytest.raises(MissingDataError, match=r"train\.en\.gz"):
    run(tiny_translation_config(tmp_path / "empty", tmp_path / "tfds"), str(tmp_path / "run"))


def test_a_negative_length_penalty_candidate_is_named_in_the_error(raw_dir, tmp_path):
  from transformer.train.config import build_task
  config = tiny_translation_config(raw_dir, tmp_path / "tfds", **{"task.length_penalty_candidates": (0.6, -1.0)})
  with pytest.raises(ValueError, match=r"length_penalty_candidates=\(0\.6, -1\.0\) has a negative alpha"):
    build_task(config).choose_length_penalty(None, None)


def test_choosing_the_length_penalty_reuses_the_bleu_already_measured(raw_dir, tmp_path, monkeypatch):
  """--mode=eval has just decoded the eval split with config.decode.length_penalty: only the other candidates decode."""
  from transformer.train.config import build_task
  config = tiny_translation_config(raw_dir, tmp_path / "tfds", **{"task.length_penalty_candidates": (0.6, 2.0)})
  task = build_task(config)
  decoded = []

  def fake_bleu(model_config, params, split, count=None, length_penalty=None):
    decoded.append((split, length_penalty))
    return {"bleu": 10.0 * length_penalty}, []
  monkeypatch.setattr(task, "bleu", fake_bleu)
  chosen, metrics, hypotheses = task.choose_length_penalty(None, None, known={0.6: 30.0})
  assert decoded == [("validation", 2.0)]
  assert chosen == 0.6 and metrics["bleu_by_length_penalty"] == {"0.6": 30.0, "2.0": 20.0}
  assert hypotheses is None  # the chosen alpha's hypotheses were decoded by evaluate, not here


@pytest.mark.parametrize("method", ["greedy", "sample"])
def test_a_decoding_without_beams_reports_no_length_penalty(raw_dir, tmp_path, monkeypatch, method):
  """The eval table of a greedy (or sampled) run showed ``length_penalty 0.6``, a beam-only setting: only what
  applies to the decoding used is reported, and candidates are not decoded one by one to the same output."""
  from transformer.train.config import build_task
  from transformer.train.writers import results_table
  config = tiny_translation_config(raw_dir, tmp_path / "tfds", **{"decode.method": method,
                                                                   "task.length_penalty_candidates": (0.6, 2.0)})
  task = build_task(config)
  decoded = []

  def fake_bleu(model_config, params, split, count=None, length_penalty=None):
    decoded.append((split, length_penalty))
    return {"bleu": 12.5}, ["a"]
  monkeypatch.setattr(task, "bleu", fake_bleu)
  monkeypatch.setattr(task, "bleu_of", lambda hypotheses, split: {"bleu": 12.5})
  monkeypatch.setattr(task, "_write_hypotheses", lambda *args: None)
  results = task.write_test_outputs(None, None, str(tmp_path), {"eval/bleu": 12.5})
  assert decoded == [("validation", None), ("test_2016_flickr", None)]
  assert not any("length_penalty" in name for split in results.values() for name in split)
  table = results_table({f"{split}/{name}": value for split, metrics in results.items()
                         for name, value in metrics.items()})
  assert "length_penalty" not in table and "bleu" in table


def test_fixed_batch_shape_gives_one_shape_and_keeps_every_example(raw_dir, tmp_path):
  """``task.fixed_batch_shape``: every training batch [max_tokens // max_length, max_length] (one compiled
  step), and evaluation still sees each validation sentence exactly once."""
  from transformer.train.config import build_task

  config = tiny_translation_config(raw_dir, tmp_path / "tfds", **{"task.fixed_batch_shape": True})
  task = build_task(config)
  iterator = task.train_iterator(batch_size=0, seed=0)
  shapes = {next(iterator)["source"].shape for _ in range(12)}
  assert shapes == {(512 // 32 // 8 * 8, 32)}  # batch rows a multiple of batch_size_multiple (8)
  indices = [index for batch in task.eval_batches(0) for index in batch["index"].tolist() if index >= 0]
  assert sorted(indices) == list(range(SIZES["val"]))
  bucketed = build_task(tiny_translation_config(raw_dir, tmp_path / "tfds", **{"task.fixed_batch_shape": False}))
  bucketed_iterator = bucketed.train_iterator(batch_size=0, seed=0)
  assert len({next(bucketed_iterator)["source"].shape for _ in range(12)}) > 1  # the default: length buckets


@pytest.mark.slow
def test_packed_training_batches_and_their_loss_with_the_transformer_only(raw_dir, tmp_path):
  """``task.pack``: training batches of packed rows, whose loss equals the loss of the same examples unpacked
  (dropout off); the RNN baseline, which reads one example per row, refuses it in one line."""
  import jax
  import numpy as np

  from transformer.errors import ConfigError
  from transformer.train.config import build_task

  config = tiny_translation_config(raw_dir, tmp_path / "tfds", **{"task.pack": True})
  task = build_task(config)
  batch = next(task.train_iterator(batch_size=0, seed=0))
  assert {"source_segments", "target_segments"} <= set(batch) and batch["target_segments"].max() > 1
  model = task.build_model(task.model_config().replace(deterministic=True))
  params = model.init(jax.random.key(0), batch["source"][:1], batch["target"][:1])["params"]
  row = {name: values[:1] for name, values in batch.items()}
  packed_loss = task.loss_and_metrics(model, params, row, None)[0]
  pairs = [(row["source"][0][row["source_segments"][0] == s], row["target"][0][row["target_segments"][0] == s])
           for s in range(1, int(row["target_segments"].max()) + 1)]
  width = max(max(len(source), len(target)) for source, target in pairs)
  unpacked = {name: np.stack([np.pad(pair[side], (0, width - len(pair[side]))) for pair in pairs])
              for side, name in enumerate(("source", "target"))}
  np.testing.assert_allclose(task.loss_and_metrics(model, params, unpacked, None)[0], packed_loss, rtol=1e-5)
  rnn_task = build_task(tiny_translation_config(raw_dir, tmp_path / "tfds", "gru_bahdanau", **{"task.pack": True}))
  with pytest.raises(ConfigError, match="pack=False"):
    rnn_task.train_iterator(batch_size=0, seed=0)


@pytest.mark.slow
def test_pack_streams_reach_the_training_batches_and_must_split_over_the_processes(raw_dir, tmp_path):
  """``task.pack_streams``: the packed training batches of 2 processes, each planning its own stream, join to the
  batches of 1; 3 processes are refused in one line naming the fix."""
  import numpy as np

  from transformer.data.hosts import HostShard
  from transformer.errors import ConfigError
  from transformer.train.config import build_task

  task = build_task(tiny_translation_config(raw_dir, tmp_path / "tfds", **{"task.pack": True,
                                                                           "task.pack_streams": 2}))
  with task.train_iterator(batch_size=0, seed=0) as iterator:
    whole = next(iterator)
  rows = []
  for process in range(2):
    with HostShard(task.train_iterator(batch_size=0, seed=0), process, 2) as shard:
      rows.append(next(shard))
  for name, value in whole.items():
    np.testing.assert_array_equal(np.concatenate([part[name] for part in rows]), value)
  with pytest.raises(ConfigError, match="pack_streams=2 does not split over 3 processes: set pack_streams to a "
                                        "multiple of 3"):
    HostShard(task.train_iterator(batch_size=0, seed=0), 0, 3)


@pytest.mark.slow
def test_word_dropout_changes_the_inputs_and_keeps_the_labels(raw_dir, tmp_path):
  """``config.source_token_dropout`` / ``target_token_dropout``: the loss of a training batch is the model's
  loss on inputs with tokens replaced by <unk>, against the batch's own (whole) targets; eval is untouched."""
  import jax
  import numpy as np

  from transformer import ops
  from transformer.data.tokenizers import UNK_ID
  from transformer.train.config import build_task

  config = tiny_translation_config(raw_dir, tmp_path / "tfds", source_token_dropout=0.3,
                                   target_token_dropout=0.5)
  task = build_task(config)
  batch = next(task.train_iterator(batch_size=0, seed=0))
  model_config = task.model_config()
  model = task.build_model(model_config)
  params = model.init(jax.random.key(0), batch["source"], batch["target"])["params"]
  key = jax.random.key(7)

  source, target = task.drop_tokens(batch, key, model_config)
  for name, dropped, rate in (("source", source, 0.3), ("target", target, 0.5)):
    original = np.asarray(batch[name])
    changed = np.asarray(dropped) != original
    assert (np.asarray(dropped)[changed] == UNK_ID).all()
    assert not changed[np.isin(original, (model_config.pad_id, model_config.eos_id))].any()
    eligible = ~np.isin(original, (model_config.pad_id, model_config.eos_id, UNK_ID))
    assert abs(changed[eligible].mean() - rate) < 0.1, name

  loss_sum, weight_sum, _ = task.loss_and_metrics(model, params, batch, key)
  logits = model.apply({"params": params}, source, target, rngs={"dropout": key})
  weights = (np.asarray(batch["target"]) != model_config.pad_id).astype(np.float32)
  expected = (np.asarray(ops.softmax_cross_entropy(logits, batch["target"], config.label_smoothing))
              * weights).sum()
  np.testing.assert_allclose(float(loss_sum), expected, rtol=1e-5)
  assert float(weight_sum) == weights.sum()  # padding only: no label was dropped
  # Without a dropout key (evaluation) the batch goes in whole.
  assert task.drop_tokens(batch, None, model_config) == (batch["source"], batch["target"])


def test_tokenizer_type_selects_the_sentencepiece_algorithm(raw_dir, tmp_path):
  """``task.tokenizer_type``: "bpe" trains (and caches) a BPE model beside the default unigram one; an unknown
  type is refused by name before any data is prepared."""
  from sentencepiece import sentencepiece_model_pb2

  from transformer.train.config import build_task

  def trained_type(tokenizer):
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(tokenizer.model_proto)
    return sentencepiece_model_pb2.TrainerSpec.ModelType.Name(proto.trainer_spec.model_type)

  unigram = build_task(tiny_translation_config(raw_dir, tmp_path / "tfds")).data.source_tokenizer
  bpe = build_task(tiny_translation_config(raw_dir, tmp_path / "tfds", **{"task.tokenizer_type": "bpe"}))
  bpe_tokenizer = bpe.data.source_tokenizer
  assert (trained_type(unigram), trained_type(bpe_tokenizer)) == ("UNIGRAM", "BPE")
  assert bpe_tokenizer.path != unigram.path  # both cached, neither overwrites the other
  with pytest.raises(ValueError, match=r"tokenizer_type='wordpiece'.*'unigram', 'bpe'"):
    build_task(tiny_translation_config(raw_dir, tmp_path / "tfds", **{"task.tokenizer_type": "wordpiece"})).data


@pytest.mark.slow
def test_a_run_refuses_a_tokenizer_other_than_the_one_it_trained_with(raw_dir, tmp_path):
  """The SentencePiece cache is keyed by the options, but another host can train another model from them: a run
  keeps its own models and refuses to resume or evaluate with a different one, naming the file to copy; ``load``
  uses the run's own, and refuses the data once something reads it."""
  import shutil

  from transformer.data.tokenizers import SentencePieceOptions, train_sentencepiece
  from transformer.errors import WorkdirError

  data_dir, workdir = tmp_path / "tfds", str(tmp_path / "run")
  short = {"num_train_steps": 4, "eval_every": 4, "checkpoint_every": 4, "log_every": 2}
  run(tiny_translation_config(raw_dir, data_dir, **short), workdir)
  model = load(workdir)
  ours = model.task.data.source_tokenizer
  recorded = {name: tokenizer.fingerprint for name, tokenizer in model.task.trained_tokenizers().items()}
  assert sorted(os.listdir(os.path.join(workdir, "tokenizers"))) == [
      f"source.{ours.fingerprint}.model", f"target.{ours.fingerprint}.model"]  # the shared vocabulary, twice
  assert recorded == {"source": ours.fingerprint, "target": ours.fingerprint}
  other = train_sentencepiece(model.task.data.eval_source_text["validation"] * 4,  # same size, other pieces
                              SentencePieceOptions(vocab_size=ours.vocab_size, model_type="bpe"))
  assert other.fingerprint != ours.fingerprint
  saved = tmp_path / "ours.model"
  shutil.copy(ours.path, saved)
  with open(ours.path, "wb") as f:  # what the cache of another host could hold under the same name
    f.write(other.model_proto)

  expected = rf"trained with another source tokenizer \(fingerprint {ours.fingerprint}\).*cp \S+/tokenizers/source\."
  loaded = load(workdir)
  assert loaded.translate(["a dog runs"]) == model.translate(["a dog runs"])  # the run's own tokenizers
  with pytest.raises(WorkdirError, match=rf"the prepared data's source tokenizer .*fingerprint {other.fingerprint}.*"
                                         rf"cp \S+/tokenizers/source\.{ours.fingerprint}\.model"):
    loaded.task.data  # e.g. for BLEU: its token ids would mean other pieces
  with pytest.raises(WorkdirError, match=expected):
    run(tiny_translation_config(raw_dir, data_dir, **{**short, "num_train_steps": 8}), workdir)
  with pytest.raises(WorkdirError, match=expected):
    run(tiny_translation_config(raw_dir, data_dir, **short), workdir, mode="eval")

  shutil.copy(os.path.join(workdir, "tokenizers", f"source.{ours.fingerprint}.model"), ours.path)  # the fix named
  assert open(ours.path, "rb").read() == saved.read_bytes()
  assert load(workdir).translate(["a dog runs"]) == model.translate(["a dog runs"])
  with pytest.raises(ValueError, match=r"translate takes a list of source sentences, got one string 'a dog runs'"):
    model.translate("a dog runs")  # once one translation per character


@pytest.mark.slow
def test_a_trained_run_loads_and_translates_without_its_data(tmp_path, monkeypatch):
  """``load`` once built the task's data, which needs the prepared dataset or its raw files (``MissingDataError:
  multi30k: cannot download`` offline); the run keeps its tokenizers, so it loads and translates on its own and
  reads the data only when something needs it."""
  import shutil

  raw, data_dir, workdir = tmp_path / "raw", tmp_path / "tfds", str(tmp_path / "run")
  short = {"num_train_steps": 4, "eval_every": 4, "checkpoint_every": 4, "log_every": 2}
  run(tiny_translation_config(write_multi30k(raw / "multi30k", sizes=SIZES), data_dir, **short), workdir)
  lines = ["a dog runs in the park", "", "the small man sits"]
  expected = load(workdir).translate(lines)

  shutil.rmtree(raw)  # neither the raw files nor the prepared data are left, nor a folder to look in
  shutil.rmtree(data_dir)
  monkeypatch.setenv("TRANSFORMER_DATA_DIR", str(tmp_path / "nowhere"))
  model = load(workdir)
  assert model.translate(lines) == expected
  assert model.score(["a dog runs"], ["ein hund"]).shape == (1,)
  with pytest.raises(MissingDataError):
    model.task.bleu(model.model_config, model.params, "validation")  # scoring needs the references: the data


def test_prepare_data_writes_the_prepared_set_and_tokenizers_and_keeps_nothing(raw_dir, tmp_path):
  """What a multi-process run's process 0 does before the others read (they raced on TFDS's renames when each
  prepared on first use): the data set and its tokenizers are on disk, and ``data`` is read afresh later, so it is
  checked against the run's tokenizers known by then."""
  from transformer.train.config import RunConfig, build_task

  data_dir = tmp_path / "tfds"
  task = build_task(RunConfig.from_config(tiny_translation_config(raw_dir, data_dir)))
  assert not data_dir.exists()  # a task reads its data on first use
  task.prepare_data(training=False)  # evaluating: no training split tokenized
  assert not list(data_dir.rglob("tokenized/*"))
  task.prepare_data()
  assert "data" not in vars(task)
  prepared = sorted(str(path.relative_to(data_dir)) for path in data_dir.rglob("*") if path.is_file())
  assert any(name.endswith(".model") for name in prepared) and any("array_record" in name for name in prepared)
  # the training split tokenized once, for the other processes to memory-map instead of tokenizing the text
  assert any("/tokenized/train.en-de." in name and name.endswith(".json") for name in prepared)
  assert task.data.source_tokenizer.vocab_size == 64
