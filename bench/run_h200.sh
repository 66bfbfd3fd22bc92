#!/usr/bin/env bash
# The one GPU job: the GPU test suite, then the benchmark, writing bench/results/h200.json (and copies of
# everything under $OUT when the device tool runs it). Usage: bench/run_h200.sh [--sweep] [test paths and pytest options; default tests]
set -u -o pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
out=${OUT:-/tmp/cukern-out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$out/gpu.txt"
if [ "${1:-}" = "--sweep" ]; then
  shift
  python3 bench/sweep_rms_norm.py 2>&1 | tee "$out/sweep.log"
fi
python3 -m pytest -m gpu -q -p no:cacheprovider --durations=15 "${@:-tests}" 2>&1 | tee "$out/gpu_tests.log"
tests=$?
python3 -m cukern bench --json bench/results/h200.json 2>&1 | tee "$out/bench.log"
bench=$?
cp bench/results/h200.json "$out/" 2>/dev/null
echo "gpu tests exit $tests, bench exit $bench"
exit $(( tests || bench ))
