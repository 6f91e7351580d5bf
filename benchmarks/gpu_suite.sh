#!/bin/bash
# The benchmark suite on a bare GPU machine, in one line (benchmarks/README.md, "The suite"):
#
#   bash benchmarks/gpu_suite.sh WHEEL_DIR OUTPUT_DIR [benchmarks.suite flags ...]
#
# WHEEL_DIR: wheels of what the machine's image lacks (tensorflow_datasets, ml_collections and their
# dependencies), installed without their dependencies into a private folder ($GPU_SUITE_SITE, default
# /tmp/site) that goes first on PYTHONPATH. OUTPUT_DIR: RESULTS.md, one log per part, env.log. The raw Multi30k
# files for time_to_bleu: --data_dir=..., $TRANSFORMER_DATA_DIR, or the git-ignored .gpu_data/ of the checkout.
set -u -o pipefail
if [ $# -lt 2 ]; then
  echo "usage: bash benchmarks/gpu_suite.sh WHEEL_DIR OUTPUT_DIR [benchmarks.suite flags ...]" >&2
  exit 2
fi
wheels=$1
output=$2
shift 2
site=${GPU_SUITE_SITE:-/tmp/site}
cd "$(dirname "$0")/.." || exit 1
mkdir -p "$output" || exit 1
export PYTHONUNBUFFERED=1
export JAX_PLATFORMS=${JAX_PLATFORMS:-cuda}  # no silent fall-back to the CPU with the GPU's sizes
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
  "$wheels"/*.whl > "$output/install.log" 2>&1 || { cat "$output/install.log"; exit 1; }
export PYTHONPATH="$site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
{
  nvidia-smi -L
  python3 -c "import jax, flax, optax; print('jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__)"
} > "$output/env.log" 2>&1
python3 -m benchmarks.suite --output_dir "$output" "$@" 2>&1 | tee "$output/suite.log"
