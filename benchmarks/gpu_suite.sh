#!/bin/bash
# The benchmark suite on a bare GPU machine, in one line (benchmarks/README.md, "The suite"):
#
#   bash benchmarks/gpu_suite.sh WHEEL_DIR OUTPUT_DIR [benchmarks.suite flags ...]
#
# WHEEL_DIR: wheels of what the machine's image lacks (tensorflow_datasets, ml_collections and their
# dependencies), installed by benchmarks/gpu_run.sh, which runs each command. OUTPUT_DIR: RESULTS.md, one log
# per part, env.log, install.log, and gpu_tests.log: the tests CI skips for want of a GPU (cuDNN attention
# against the formula; needs pytest, from the image or WHEEL_DIR). The raw Multi30k files for time_to_bleu:
# --data_dir=..., $TRANSFORMER_DATA_DIR, or the git-ignored .gpu_data/ of the checkout.
set -u -o pipefail
if [ $# -lt 2 ]; then
  echo "usage: bash benchmarks/gpu_suite.sh WHEEL_DIR OUTPUT_DIR [benchmarks.suite flags ...]" >&2
  exit 2
fi
wheels=$1
output=$2
shift 2
cd "$(dirname "$0")/.." || exit 1
mkdir -p "$output" || exit 1
export GPU_INSTALL_LOG="$output/install.log"
{
  nvidia-smi -L
  bash benchmarks/gpu_run.sh "$wheels" python3 -c \
    "import jax, flax, optax; print('jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__)"
} > "$output/env.log" 2>&1 || { cat "$output/env.log"; exit 1; }
# A failing GPU test is reported, not fatal: the timings still run.
bash benchmarks/gpu_run.sh "$wheels" python3 -m pytest -q -p no:cacheprovider -o addopts="" \
  tests/ops/test_kernels_gpu.py > "$output/gpu_tests.log" 2>&1
echo "GPU tests (tests/ops/test_kernels_gpu.py): exit status $? ($output/gpu_tests.log)" | tee -a "$output/env.log"
bash benchmarks/gpu_run.sh "$wheels" python3 -m benchmarks.suite --output_dir "$output" "$@" 2>&1 \
  | tee "$output/suite.log"
