"""experiments/attention_plots.py on a tiny trained Transformer and GRU-Bahdanau: files, and the maps' properties."""
import os

import numpy as np
import pytest

from experiments import attention_plots
from tests.data.data_fixtures import write_multi30k
from tests.tasks.test_translation import SIZES, tiny_translation_config
from transformer import load
from transformer.train import run

SPLIT = "test_2016_flickr"
COMMAND = "python -m experiments.attention_plots --config=tiny"
# A few steps are enough: the properties checked hold for any parameters. Greedy search keeps compiles short.
QUICK = {"num_train_steps": 3, "eval_every": 3, "checkpoint_every": 3, "log_every": 3, "decode.method": "greedy",
         "task.num_eval_sentences": 2, "async_checkpointing": False}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
  """Raw fixture files and one TFDS folder shared by both models (prepared once)."""
  root = tmp_path_factory.mktemp("attention")
  return write_multi30k(root / "raw" / "multi30k", sizes=SIZES), root / "tfds", root


@pytest.fixture(scope="module", params=["transformer_small", "gru_bahdanau"])
def trained(request, folders):
  """``(variant, model)``: a tiny model trained a few steps by ``run``, loaded as the script loads it."""
  raw_dir, data_dir, root = folders
  variant = request.param
  config = tiny_translation_config(raw_dir, data_dir, variant, **QUICK)
  workdir = str(root / f"run_{variant}")
  run(config, workdir)
  return variant, load(workdir, checkpoint="latest")  # the config the run saved


@pytest.mark.slow
def test_plots_and_attention_properties(trained, tmp_path):
  variant, model = trained
  assert model.step == QUICK["num_train_steps"]
  task, model_config = model.task, model.model_config
  output_dir = str(tmp_path / "attention")
  os.makedirs(output_dir)
  stale = f"{SPLIT}_0_cross_layer7.png"  # an earlier, deeper model's plot is removed; other files stay
  for name in (stale, "notes.png"):
    with open(os.path.join(output_dir, name), "wb") as f:
      f.write(b"old")
  note = "Trained with --config.num_train_steps=60."
  (sentence,) = attention_plots.write_attention_plots(model, SPLIT, [0], output_dir, command=COMMAND, note=note)

  if variant == "gru_bahdanau":
    expected, heads = {("alignment", None)}, 1
    names = [f"{SPLIT}_0_alignment.png"]
  else:
    expected, heads = {("encoder_self", 0), ("decoder_self", 0), ("cross", 0)}, model_config.num_heads
    names = [f"{SPLIT}_0_{kind}_layer0.png" for kind in ("encoder_self", "decoder_self", "cross")]
  assert set(sentence.maps) == expected
  assert sentence.files == names
  assert sorted(os.listdir(output_dir)) == sorted(names + ["README.md", "notes.png"])
  for name in names:
    with open(os.path.join(output_dir, name), "rb") as f:
      assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  with open(os.path.join(output_dir, "README.md")) as f:
    readme = f.read()
  assert COMMAND in readme and note in readme
  assert sentence.source_text in readme and sentence.hypothesis_text in readme
  assert all(f"]({name})" in readme for name in names)

  source_length, target_length = len(sentence.source_pieces), len(sentence.target_pieces)
  assert source_length == len(task.data.eval[SPLIT].source(0)) and sentence.source_pieces[-1] == "</s>"
  shapes = {"encoder_self": (heads, source_length, source_length),
            "decoder_self": (heads, target_length, target_length),
            "cross": (heads, target_length, source_length), "alignment": (heads, target_length, source_length)}
  for (kind, _), weights in sentence.maps.items():
    assert weights.shape == shapes[kind], kind
    assert np.all(weights >= 0.0), kind
    # Padding cropped away: each query's weights over the real keys sum to 1.
    np.testing.assert_allclose(weights.sum(axis=-1), 1.0, atol=1e-5, err_msg=kind)
    if kind == "decoder_self":  # causal: exactly no weight on later positions
      assert np.all(np.triu(weights, k=1) == 0.0)


@pytest.mark.slow
def test_padding_in_the_batch_does_not_change_the_maps(trained):
  """A sentence's cropped maps are the same alone and batched (padded) beside a longer sentence."""
  _, model = trained
  source, target = model.task.data.eval[SPLIT][0]
  # A partner longer on both sides, so the sentence gets source and target padding in the batch.
  longer_source, longer_target = np.concatenate([source, source]), np.concatenate([target, target])

  alone = model.attention_weights([source], [target])[0]
  batched = model.attention_weights([source, longer_source], [target, longer_target])
  assert alone.keys() == batched[0].keys()
  for key in alone:
    np.testing.assert_allclose(batched[0][key], alone[key], atol=1e-5, err_msg=str(key))
  assert batched[1][("cross", 0) if ("cross", 0) in alone else ("alignment", None)].shape[1:] == (
      len(longer_target), len(longer_source))


def test_the_command_line_refuses_what_it_cannot_plot(capsys):
  with pytest.raises(SystemExit):  # a classification config: no decoder to plot
    attention_plots.main(["--config=experiments/disaster_tweets.py", "--workdir=W", "--output_dir=O"])
  assert "attention plots need a translation config" in capsys.readouterr().err
  with pytest.raises(SystemExit):  # anything but --config.* overrides is refused, not ignored
    attention_plots.main(["--config=experiments/multi30k.py:gru_bahdanau", "--workdir=W", "--output_dir=O",
                          "--num_sentence=2"])
  assert "unrecognized arguments: --num_sentence=2" in capsys.readouterr().err
