#!/usr/bin/env bash
# The GPU job: the GPU test suite, then the benchmark, writing bench/results/h200.json, the two plots and
# the rms_norm card (and copies of everything under $OUT when the device tool runs it).
# Usage: bench/run_h200.sh [all|tests|bench] [pytest args...]   (default all; the parts fit one device
# call each when a call's time limit is too short for both)
set -u -o pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
if [ -d .whl ]; then  # optional packages the device image lacks (dask), carried as wheels
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
out=${OUT:-/tmp/cukern-out}
mkdir -p "$out"
part=${1:-all}
[ $# -gt 0 ] && shift
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$out/gpu.txt"
tests=0 bench=0
if [ "$part" = all ] || [ "$part" = tests ]; then
  if [ $# -gt 0 ]; then paths=("$@"); else paths=(tests bench); fi
  python3 -m pytest -m gpu -q -p no:cacheprovider --durations=15 "${paths[@]}" 2>&1 | tee "$out/gpu_tests.log"
  tests=$?
fi
if [ "$part" = all ] || [ "$part" = bench ]; then
  r=bench/results
  python3 -m cukern bench --json $r/h200.json --plot $r/bandwidth_h200.png 2>&1 | tee "$out/bench.log"
  bench=$?
  python3 -m cukern roofline --results $r/h200.json --plot $r/roofline_h200.png 2>&1 | tee -a "$out/bench.log"
  CUKERN_TUNING=off python3 -m cukern explain rms_norm --shape 16384x4096 --dtype bfloat16 > $r/rms_norm_card_h200.txt
  cp $r/h200.json $r/bandwidth_h200.png $r/roofline_h200.png $r/rms_norm_card_h200.txt "$out/" 2>/dev/null
fi
echo "gpu tests exit $tests, bench exit $bench"
exit $(( tests || bench ))
