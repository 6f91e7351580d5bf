"""Entry point: pick an experiment config, override any field from flags, run it.

    python launch.py --config=experiments/synthetic.py:copy --workdir=/tmp/copy --config.num_train_steps=300
    python launch.py --config=experiments/synthetic.py:copy --workdir=/tmp/copy --mode=eval
    python launch.py --config=experiments/synthetic.py:copy --config.num_train_steps=300 --print_config

Multi-host: add --coordinator_address=HOST:PORT --num_processes=N --process_id=I and --config.parallelism=mesh on
every host (or set the TRANSFORMER_* environment variables; SLURM under srun and TPU VMs are detected), with one
shared --workdir. See "Multi-host" in docs/training.md.

Errors the user causes (``transformer.errors``: a bad config, missing data, a bad input file) print as one line
``error: ...`` and exit with status 1; any other exception is a bug and keeps its traceback.
"""
import glob
import importlib.util
import inspect
import logging
import os
import re
import sys
import traceback

from absl import app, flags
from absl import logging as absl_logging
from ml_collections import config_flags

from transformer.errors import InputFileError, exit_on_user_error

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file, optionally :variant.",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics and the resolved config.")
_MODE = flags.DEFINE_enum("mode", "train", ["train", "eval", "predict", "translate"],
                          "train (resumes), eval (the run's saved config plus this command's --config.* overrides: "
                          "validation and test scores of the best checkpoint, else the latest; "
                          "the mean of the last N with --config.average_checkpoints=N), "
                          "predict (the task's predictions file: one line per example), translate (stdin or "
                          "--config.translate_input to stdout or --config.translate_output).")
_COORDINATOR = flags.DEFINE_string("coordinator_address", None, "Multi-host: host:port of process 0.")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Multi-host: number of processes.")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "Multi-host: this process's index.")
_LOCAL_DEVICE_IDS = flags.DEFINE_string("local_device_ids", None, "Multi-host: the devices this process drives, "
                                        "a comma list such as 0,1 (default: JAX's choice).")
_INITIALIZATION_TIMEOUT = flags.DEFINE_integer("initialization_timeout", None, "Multi-host: seconds to wait for "
                                               "every process to join (default 300).")
_PEER_TIMEOUT = flags.DEFINE_integer("peer_timeout", None, "Multi-host: a process that stops sending heartbeats "
                                     "for this many seconds is taken as lost; the survivors stop (default 100).")
_PRINT_CONFIG = flags.DEFINE_bool("print_config", False, "Print the config that --config (with its :variant) and "
                                   "every --config.FIELD=VALUE override resolve to, once validated, and exit: each "
                                   "field it lists is a --config.FIELD to override. Starts no run and needs no "
                                   "--workdir (one given is not read or written; --mode=eval and the later modes "
                                   "run with the workdir's saved config instead).")
flags.mark_flags_as_required(["config"])
flags.register_validator("workdir", lambda workdir: workdir is not None or _PRINT_CONFIG.value,
                         message="--workdir is required (a directory for the run's checkpoints and outputs), "
                                 "unless --print_config")


def _load_module(path: str):
  spec = importlib.util.spec_from_file_location("_experiment_config", path)
  module = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = module  # dataclasses look their module up there
  try:
    spec.loader.exec_module(module)
  finally:
    del sys.modules[spec.name]
  return module


def experiments(with_variants: bool = True) -> list[str]:
  """``path (variant, variant, ...)`` of every experiment config in ``experiments/`` (a file with
  ``get_config``), its variants (``_variants``) where it lists them (the path alone without ``with_variants``)."""
  here = os.path.dirname(os.path.abspath(__file__))
  described = []
  for path in sorted(glob.glob(os.path.join(here, "experiments", "**", "*.py"), recursive=True)):
    with open(path) as f:
      if not re.search(r"^def get_config", f.read(), re.MULTILINE):
        continue
    if not with_variants:
      described.append(os.path.relpath(path, here))
      continue
    try:
      variants = _variants(_load_module(path))
    except Exception:  # a config that does not import here (a missing extra) is still listed
      variants = ()
    described.append(os.path.relpath(path, here) + (f" ({', '.join(variants)})" if variants else ""))
  return described


def _variants(module) -> tuple[str, ...]:
  """The variants an experiment config names: its ``VARIANTS`` (an ablation: its ``ABLATION``'s, each also as
  ``NAME,multi30k``), and its smoke-test variant ``SMOKE`` where they leave it out."""
  variants = tuple(getattr(module, "VARIANTS", ()))
  ablation = getattr(module, "ABLATION", None)
  smoke = getattr(module, "SMOKE", None)
  if not variants and ablation is not None:
    variants = (*ablation.variants, "NAME,multi30k")
    smoke = getattr(sys.modules.get(type(ablation).__module__), "SMOKE", None)
  return variants + ((smoke,) if smoke and smoke not in variants else ())


def _check_config_argument(argv):
  """Fail early and clearly on a missing config file, a file that is no experiment, a colon naming no variant,
  or an unknown variant (before flag parsing); ``--help`` starts with the experiments and their variants."""
  if any(arg in ("--help", "-h", "--helpfull", "-?") for arg in argv):
    print("Experiments (--config=PATH[:VARIANT]):\n  " + "\n  ".join(experiments()) + "\n\n"
          "Config fields: python launch.py --config=PATH[:VARIANT] --print_config lists every field of that "
          "experiment with its value; override any with --config.FIELD=VALUE (e.g. --config.num_train_steps=300, "
          "--config.model.num_heads=4).\n")
  values = [arg.split("=", 1)[1] for arg in argv if arg.startswith("--config=")]
  values += [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == "--config"]
  if not values:
    return
  path, colon, variant = values[-1].partition(":")
  listing = "Experiments: " + ", ".join(experiments(with_variants=False))  # --help lists their variants
  if not os.path.isfile(path):
    sys.exit(f"error: --config file {path!r} does not exist. {listing}")
  module = _load_module(path)
  if not callable(getattr(module, "get_config", None)):
    sys.exit(f"error: --config={values[-1]}: {path} is no experiment config (it has no get_config). {listing}")
  if colon and not variant:
    sys.exit(f"error: --config={values[-1]} ends with ':' but names no variant: give --config={path}:VARIANT, "
             f"or drop the colon. {listing}")
  if variant and not inspect.signature(module.get_config).parameters:
    sys.exit(f"error: {path} has no variants; give --config={path} without :{variant}.")
  exit_on_user_error(module.get_config, *([variant] if variant else []))


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  absl_logging.set_verbosity(absl_logging.WARNING)  # orbax logs every save step at INFO
  if _PRINT_CONFIG.value:
    print_config(_CONFIG.value, _MODE.value)
    return
  show_own_lines(quiet=_CONFIG.value.get("quiet", False))
  from transformer.train import multihost, run, validate_config  # after flag parsing: imports JAX
  if multihost.needs_supervisor(_COORDINATOR.value):  # one of several processes: a parent watches it
    status = multihost.supervise(_WORKDIR.value, _PROCESS_ID.value, _NUM_PROCESSES.value)
    sys.stdout.flush()
    os._exit(status)  # nothing of the parent's to tear down: unloading JAX and the config's imports took seconds
  exit_on_user_error(multihost.initialize, _COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value,
                     local_device_ids=_LOCAL_DEVICE_IDS.value, initialization_timeout=_INITIALIZATION_TIMEOUT.value,
                     peer_timeout=_PEER_TIMEOUT.value)
  try:
    config = exit_on_user_error(_config_for_mode, _CONFIG.value, _WORKDIR.value, _MODE.value, sys.argv[1:])
    run_config = exit_on_user_error(validate_config, config, None, _MODE.value)  # the one reading of the config
    if _MODE.value == "translate":
      exit_on_user_error(translate_files, run_config, _WORKDIR.value, run)
    else:
      output = exit_on_user_error(run, run_config, _WORKDIR.value, _MODE.value)
      if getattr(output, "interrupted", None) == "SIGINT":  # saved, but not finished: `launch ... && next` stops
        from transformer.train.multihost import INTERRUPTED_EXIT_STATUS
        sys.exit(INTERRUPTED_EXIT_STATUS)
  except BaseException as error:  # with several processes: the others stop at once, naming this one
    if not isinstance(error, SystemExit) or error.code not in (0, None):
      from transformer.train.multihost import leave_after_error
      # Returns only in a single-process run, where the error goes on as usual.
      leave_after_error(error.code if isinstance(error, SystemExit) else traceback.format_exc(), error)
    raise


def print_config(config, mode: str) -> None:
  """``--print_config``: ``config`` (the file's variant with every override) checked as a run would check it, a
  bad value one line ``error: ...``, then printed as ml_collections writes it; no workdir is read or written."""
  from transformer.train import validate_config  # imports JAX
  exit_on_user_error(validate_config, config, None, mode)
  print(config, end="" if str(config).endswith("\n") else "\n")


class OwnLineFormatter(logging.Formatter):
  """Our progress as plain lines (``disaster_tweets: preparing ...``), a warning or error with its level."""

  def format(self, record: logging.LogRecord) -> str:
    text = super().format(record)
    return text if record.levelno <= logging.INFO else f"{record.levelname}: {text}"


def show_own_lines(quiet: bool) -> None:
  """The ``transformer`` loggers write to stderr through their own handler: absl's, which ``app.run`` puts on the
  root logger, would stamp every line ``I1128 12:00:00.123 140005 file.py:257]``. ``quiet``: warnings only;
  else also our progress (data preparation, tokenizers, padding fraction)."""
  handler = logging.StreamHandler(sys.stderr)
  handler.setFormatter(OwnLineFormatter("%(message)s"))
  own = logging.getLogger("transformer")
  own.handlers = [handler]
  own.propagate = False
  own.setLevel(logging.WARNING if quiet else logging.INFO)


def translate_files(run_config, workdir: str, run) -> None:
  """``--mode=translate``: both files checked before anything is decoded, then the run's translations of the
  input lines (``config.translate_input`` or stdin) into ``config.translate_output`` (or stdout)."""
  source, target = run_config.translate_input, run_config.translate_output
  if source and os.path.isdir(source):
    raise InputFileError(f"config.translate_input={source!r} is a directory; give a UTF-8 text file, one sentence "
                         "a line (or leave it empty to read standard input).")
  if source and not os.path.isfile(source):
    raise InputFileError(f"config.translate_input={source!r} does not exist; give a UTF-8 text file, one sentence "
                         "a line (or leave it empty to read standard input).")
  if target and not os.path.isdir(os.path.dirname(os.path.abspath(target))):
    raise InputFileError(f"config.translate_output={target!r}: its folder {os.path.dirname(os.path.abspath(target))} "
                         "does not exist; create it first (or leave the field empty to write standard output).")
  if target and os.path.isdir(target):
    raise InputFileError(f"config.translate_output={target!r} is a directory; give the path of the file to write "
                         "(or leave the field empty to write standard output).")
  if target and not os.access(os.path.dirname(os.path.abspath(target)), os.W_OK):
    raise InputFileError(f"config.translate_output={target!r}: its folder is not writable; choose another path "
                         "(or leave the field empty to write standard output).")
  lines = read_input_lines(source)
  translations = run(run_config, workdir, "translate", lines=lines).outputs
  text = "".join(line + "\n" for line in translations)
  if target:
    from transformer.data.files import write_atomically  # a full disk keeps an earlier output whole
    write_atomically(target, text)
    print(f"translations: {target}", file=sys.stderr, flush=True)
  else:
    sys.stdout.write(text)
    sys.stdout.flush()


def split_input_lines(text: str) -> list[str]:
  """Lines of a text to translate: split at ``"\\n"`` only (not at the other breaks ``str.splitlines`` knows,
  like U+2028 or a form feed, which may sit inside a sentence); a final newline ends the last line, it does not
  start an empty one."""
  if not text:
    return []
  return (text[:-1] if text.endswith("\n") else text).split("\n")


def read_input_lines(path: str = "") -> list[str]:
  """The lines of the UTF-8 file ``path`` ("" = standard input), see ``split_input_lines``.

  Raises:
    InputFileError: the input is not UTF-8.
  """
  if path:
    with open(path, "rb") as f:
      data = f.read()
  else:
    stream = getattr(sys.stdin, "buffer", None)
    data = stream.read() if stream is not None else sys.stdin.read()
  if isinstance(data, bytes):
    try:
      data = data.decode("utf-8")
    except UnicodeDecodeError as error:
      name = f"config.translate_input={path!r}" if path else "the standard input"
      line = data[:error.start].count(b"\n") + 1
      raise InputFileError(f"{name} is not UTF-8 text: byte {data[error.start:error.start + 1]!r} at offset "
                           f"{error.start} (line {line}) cannot be decoded; convert the file to UTF-8 first, e.g. "
                           "iconv -f latin1 -t utf-8.") from None
  return split_input_lines(data)


def _config_for_mode(config, workdir: str, mode: str, argv):
  """Train uses ``config``; every other mode the run's saved ``config.json`` (so a run trained with overrides is
  evaluated as trained), with this command line's ``--config.*`` overrides set on top."""
  from transformer.train.workdir import CONFIG, RunDirectory
  directory = RunDirectory(workdir)
  if mode == "train" or not directory.has(CONFIG):
    return config
  overridden = sorted({arg[len("--config."):].partition("=")[0] for arg in argv if arg.startswith("--config.")})
  saved = directory.config_dict(overrides_from=config, fields=overridden)
  print(f"--mode={mode} uses the run's saved config ({directory.path(CONFIG)})"
        + (f" with {', '.join('--config.' + p for p in overridden)} from this command" if overridden else ""),
        file=sys.stderr if mode == "translate" else sys.stdout, flush=True)  # translate's stdout: translations only
  return saved


def _parse_flags_or_exit(argv):
  """Parse flags once up front so that bad values and misspelled config fields get one clear line."""
  try:
    return flags.FLAGS(argv)
  except flags.Error as error:
    sys.exit(f"error: {error}")
  except (AttributeError, KeyError) as error:  # ml_collections: unknown field, with a suggestion
    text = str(error.args[0] if error.args else error).replace("\\n", "\n").replace("\\'", "'")
    name, _, hint = text.strip("'\"").partition("\n")
    name = name.strip(chr(39))
    model_field = any(arg.startswith("--config.model.") and arg.partition("=")[0].endswith(f".{name}")
                      for arg in argv)
    if model_field and not hint.strip():
      hint = ("config.model holds the fields of the experiment's model (config.model_name) only: "
              "choose a variant of a model that has this field.")
    sys.exit(f"error: unknown config field {name!r}. {hint.strip()}")


class ClosedPipeTolerant:
  """``sys.stdout`` / ``sys.stderr`` whose reader may go away (``python launch.py ... | tee log``: the Ctrl-C
  that stops the run stops tee too): once a write finds the pipe closed, the stream's file descriptor is pointed
  at /dev/null, so the run saves its checkpoint and exits instead of dying on ``BrokenPipeError``."""

  def __init__(self, stream):
    self._stream = stream

  def _silence(self) -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, self._stream.fileno())
    os.close(devnull)

  def write(self, text):
    try:
      return self._stream.write(text)
    except BrokenPipeError:
      self._silence()
      return len(text)

  def flush(self):
    try:
      self._stream.flush()
    except BrokenPipeError:
      self._silence()

  def __getattr__(self, name):
    return getattr(self._stream, name)


if __name__ == "__main__":
  sys.stdout, sys.stderr = ClosedPipeTolerant(sys.stdout), ClosedPipeTolerant(sys.stderr)
  if not sys.stderr.isatty():  # output to a log file: no tqdm bars (TFDS's write terminal escape codes)
    os.environ["TQDM_DISABLE"] = "1"  # read when tqdm is imported: before the experiment's config imports it
  _check_config_argument(sys.argv)
  app.run(main, flags_parser=_parse_flags_or_exit)
