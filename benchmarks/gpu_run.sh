#!/bin/bash
# Any command of this checkout on a bare GPU machine whose image lacks some of the project's packages:
#
#   bash benchmarks/gpu_run.sh WHEEL_DIR COMMAND [ARGS ...]
#   bash benchmarks/gpu_run.sh .whl python3 launch.py --config=experiments/multi30k.py:transformer_small ...
#
# Installs WHEEL_DIR/*.whl (tensorflow_datasets, ml_collections and their dependencies) without their
# dependencies into a private folder ($GPU_SUITE_SITE, default /tmp/site; once per machine), puts it and the
# checkout first on PYTHONPATH, sets JAX_PLATFORMS=cuda (no silent fall-back to the CPU) and runs COMMAND from
# the checkout. The pip log goes to $GPU_INSTALL_LOG (default: shown only when the install fails).
set -u -o pipefail
if [ $# -lt 2 ]; then
  echo "usage: bash benchmarks/gpu_run.sh WHEEL_DIR COMMAND [ARGS ...]" >&2
  exit 2
fi
wheels=$1
shift
site=${GPU_SUITE_SITE:-/tmp/site}
log=${GPU_INSTALL_LOG:-$site.install.log}
cd "$(dirname "$0")/.." || exit 1
if [ ! -e "$site/.installed" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
    "$wheels"/*.whl > "$log" 2>&1 || { cat "$log" >&2; exit 1; }
  touch "$site/.installed"
fi
export PYTHONUNBUFFERED=1
export JAX_PLATFORMS=${JAX_PLATFORMS:-cuda}
export PYTHONPATH="$site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec "$@"
