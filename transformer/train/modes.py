"""The modes that read a trained run: ``run_eval``, ``run_predict``, ``run_translate``; and ``run``, which
dispatches ``launch.py --mode=...`` to its function (training is ``loop.run_train``).

Each restores the checkpoint chosen on validation (``best_metric``) when the run kept one, else the latest;
with ``config.average_checkpoints=N`` the mean parameters of the last N periodic checkpoints, whose outputs go
to ``WORKDIR/average_last_N``. None of them writes into a workdir that holds no run.
"""
from __future__ import annotations

import dataclasses
import json
import os

import jax

from transformer.data.files import write_atomically
from transformer.errors import ConfigError
from transformer.tasks import WritesTestOutputs
from transformer.train.run_config import RunConfig
from transformer.train.config import run_optimizer, validate_config
from transformer.train.evaluate import make_evaluator
from transformer.train.initialise import state_factory, with_params
from transformer.train.loop import RunOutput, run_train
from transformer.train.session import Session, prepare
from transformer.train.run_directory import EVAL_RESULTS, PREDICT_RESULTS
from transformer.train.writers import results_table, variant_tables


@dataclasses.dataclass
class Restored:
  """A checkpoint restored for eval/predict/translate: its step, the state, where outputs go and, when
  averaged, ``{"averaged_steps": [...]}`` for the results file."""
  step: int
  state: object
  output_dir: str
  averaged: dict


def restore_for_inference(session: Session) -> Restored:
  """The best checkpoint when the run kept one, else the latest; or the average of the last N."""
  run_config, checkpointer, workdir, task = session.run_config, session.checkpointer, session.workdir, session.task
  _, abstract_state = state_factory(session, task.build_model(session.model_config), run_optimizer(run_config),
                                    task.placeholder_inputs())
  use_best = checkpointer.best_step() is not None
  restored = checkpointer.restore(abstract_state, best=use_best)
  if restored is None:
    raise ConfigError(f"--mode={session.mode} needs a checkpoint, but {workdir} has none yet; train first.")
  step, canonical, _ = restored
  state = session.strategy.from_canonical(canonical)
  session.say(f"{'restored the best checkpoint, step' if use_best else 'resumed from step'} {step} in {workdir}")
  if not run_config.average_checkpoints:
    return Restored(step, state, workdir, {})
  steps, params = checkpointer.average_params(abstract_state, run_config.average_checkpoints)
  output_dir = session.directory.output_dir(run_config.average_checkpoints)
  os.makedirs(output_dir, exist_ok=True)
  session.say(f"averaged the parameters of steps {steps}; outputs go to {output_dir}")
  return Restored(steps[-1], with_params(session, state, params), output_dir, {"averaged_steps": steps})


def _file_times(folder: str) -> dict:
  return {name: os.path.getmtime(os.path.join(folder, name)) for name in os.listdir(folder)
          if os.path.isfile(os.path.join(folder, name))}


def run_eval(run_config: RunConfig, workdir: str) -> RunOutput:
  """Validation metrics of the best (or averaged) checkpoint, and the task's test splits scored and written
  (``WritesTestOutputs``): printed as a table and written to ``<output dir>/eval_results.json``."""
  session = prepare(run_config, workdir, "eval")
  restored = restore_for_inference(session)
  before = _file_times(restored.output_dir)
  evaluate = make_evaluator(session, session.task.build_model(session.model_config.replace(deterministic=True)))
  results = evaluate(restored.state)
  if isinstance(session.task, WritesTestOutputs):
    params = jax.device_get(session.strategy.host_params(restored.state))
    tests = session.task.write_test_outputs(session.model_config, params, restored.output_dir, results)
    results.update({f"{split}/{k}": v for split, metrics in tests.items() for k, v in metrics.items()})
  if session.is_main:
    summary = {"step": restored.step, **restored.averaged, **results}
    write_atomically(os.path.join(restored.output_dir, EVAL_RESULTS), json.dumps(summary, indent=2))
    written = sorted(name for name, time_ in _file_times(restored.output_dir).items() if before.get(name) != time_)
    tables = variant_tables(results, run_config.replicas.variant_names())  # a sweep: each variant's, not only the mean
    print("\n".join([f"step {restored.step}:", results_table(results), *([tables] if tables else []),
                     f"written: {', '.join(os.path.join(restored.output_dir, name) for name in written)}"]),
          flush=True)
  session.checkpointer.close()
  return RunOutput(restored.step, results, session.strategy.to_canonical(restored.state))


def run_predict(run_config: RunConfig, workdir: str) -> RunOutput:
  """The task's predictions of the best (or averaged) checkpoint written to a file (``WritesPredictions``: one
  line or row per example), whose path is printed and recorded in ``<output dir>/predict_results.json``."""
  session = prepare(run_config, workdir, "predict")
  restored = restore_for_inference(session)
  if session.is_main:
    params = jax.device_get(session.strategy.host_params(restored.state))
    path = session.task.write_predictions(session.model_config, params, restored.output_dir)
    write_atomically(os.path.join(restored.output_dir, PREDICT_RESULTS),
                     json.dumps({"step": restored.step, **restored.averaged, "predictions": path}, indent=2))
    print(f"predictions of step {restored.step}: {path}", flush=True)
  session.checkpointer.close()
  return RunOutput(restored.step, {}, session.strategy.to_canonical(restored.state))


def run_translate(run_config: RunConfig, workdir: str, lines: list[str] | None = None) -> RunOutput:
  """Translate ``lines`` with the best (or averaged) checkpoint: ``RunOutput.outputs`` holds one line per input
  line, an empty line for an empty one. Reading and writing the text (``config.translate_input`` /
  ``translate_output``, stdin, stdout) is ``launch.py``'s."""
  if lines is None:
    raise ConfigError("--mode=translate needs the lines to translate: run(config, workdir, 'translate', "
                      "lines=[...]), or launch.py with --config.translate_input=FILE or standard input.")
  session = prepare(run_config, workdir, "translate")
  restored = restore_for_inference(session)
  params = jax.device_get(session.strategy.host_params(restored.state))
  translations = session.task.translate_lines(session.model_config, params, lines)
  session.say(f"translated {len(lines)} lines with the checkpoint of step {restored.step}")
  session.checkpointer.close()
  return RunOutput(restored.step, {}, session.strategy.to_canonical(restored.state), outputs=translations)


MODE_FUNCTIONS = {"train": run_train, "eval": run_eval, "predict": run_predict, "translate": run_translate}


def run(config, workdir: str, mode: str = "train", lines: list[str] | None = None) -> RunOutput:
  """Run ``mode`` (one of ``MODE_FUNCTIONS``) of the experiment ``config`` (a ``ConfigDict``, resolved here once
  into its ``RunConfig``, or a ``RunConfig``) in ``workdir``; ``lines``: the text ``translate`` translates."""
  if mode not in MODE_FUNCTIONS:
    raise ConfigError(f"--mode={mode!r} is not supported; choose one of {list(MODE_FUNCTIONS)}.")
  resolved = config if isinstance(config, RunConfig) else validate_config(config, None, mode)
  if mode == "translate":
    return MODE_FUNCTIONS[mode](resolved, workdir, lines)
  return MODE_FUNCTIONS[mode](resolved, workdir)
