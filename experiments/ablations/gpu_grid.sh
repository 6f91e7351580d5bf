#!/bin/bash
# Multi30k ablations on a bare GPU machine (experiments/ablations/README.md, "Cells trained on another machine"):
#
#   BUDGET_S=530 bash experiments/ablations/gpu_grid.sh WHEEL_DIR MULTI30K_DIR OUTPUT_DIR ABLATION [ABLATION ...]
#
# Runs the grid driver once per ablation (each writes its own page and records.json), stops starting or running
# them after BUDGET_S seconds (default 530), and packs the workdirs without checkpoints, with the pages and
# logs, into OUTPUT_DIR/ablations.tgz: unpack it here and read it with --hardware and --notrain. A killed run
# is lost with the machine; a finished cell is not. WHEEL_DIR: see benchmarks/gpu_run.sh.
#
# PREPARED_DIR (optional): a TFDS data dir copied from the host whose cells the GPU's join, holding the
# prepared multi30k and its sentencepiece/ model. Without it the GPU machine trains its own SentencePiece
# model, which can differ from that host's (pieces per word on train: en 1.187 there, 1.232 here), so its
# cells would compare different tokens; every run keeps the model it used in WORKDIR/tokenizers/.
# DRIVER_FLAGS (optional): more flags of experiments.ablations_results, e.g. --ignore_recorded to train again
# cells that records.json records (from another tokenizer, say).
# XLA's GPU autotuning is off unless XLA_FLAGS says otherwise: with it, compiling each of the ~10 batch
# shapes took most of a 600-step program.
set -u -o pipefail
if [ $# -lt 4 ]; then
  echo "usage: BUDGET_S=530 bash experiments/ablations/gpu_grid.sh WHEEL_DIR MULTI30K_DIR OUTPUT_DIR ABLATION ..." >&2
  exit 2
fi
wheels=$1
source_dir=$2
output=$3
shift 3
cd "$(dirname "$0")/../.." || exit 1
mkdir -p "$output" || exit 1
work=$(mktemp -d)
export GPU_INSTALL_LOG="$output/install.log"
export XLA_FLAGS=${XLA_FLAGS:---xla_gpu_autotune_level=0}
data_flag=()
[ -n "${PREPARED_DIR:-}" ] && data_flag=(--launch_flag=--config.task.data_dir="$PREPARED_DIR")
pack() { tar czf "$output/ablations.tgz" --exclude=checkpoints --exclude=best -C "$work" . 2>/dev/null; }
{ nvidia-smi -L; bash benchmarks/gpu_run.sh "$wheels" python3 -c \
  "from experiments import report; import sentencepiece; print(report.machine_description()); \
print('sentencepiece', sentencepiece.__version__)"; echo "XLA_FLAGS=$XLA_FLAGS PREPARED_DIR=${PREPARED_DIR:-}"; } 2>&1 | tee "$output/env.log"
start=$(date +%s)
for ablation in "$@"; do
  left=$(( ${BUDGET_S:-530} - ($(date +%s) - start) ))
  [ "$left" -gt 60 ] || { echo "$ablation: not started, the budget is spent"; continue; }
  # timeout stops the driver only: its launch.py, which would save a checkpoint first, is killed below.
  timeout -k 20 "$left" bash benchmarks/gpu_run.sh "$wheels" python3 -m experiments.ablations_results \
    --ablation="$ablation" --task=multi30k --workdir_root="$work/runs" --output_dir="$work/pages/$ablation" \
    --launch_flag=--config.task.source_dir="$source_dir" "${data_flag[@]}" ${DRIVER_FLAGS:-} > "$work/$ablation.log" 2>&1
  echo "$ablation: exit status $? after $(( $(date +%s) - start )) s"
  grep -E "^(training|step|not finished)" "$work/$ablation.log" | tail -3
  pkill -9 -f -- "--workdir=$work/"  # this grid's runs only; a checkpoint would leave with the machine anyway
  pack
done
