#!/usr/bin/env bash
# The GPU job: the GPU test suite, then compute-sanitizer over bench/sanitize.py, then the benchmark, writing
# bench/results/<card>.json, the two plots, the rms_norm card and bench/results/sanitizer_<card>.json, <card>
# being h200 or h100 as nvidia-smi names the GPU (and copies of the results and logs.tar.gz under $OUT, a
# folder a remote machine hands back).
# Usage: bench/run_h200.sh [all|PART[,PART...]] [pytest args...], PART one of tests, sanitize, bench
# (default all; e.g. tests,bench for the suite and the benchmark in one run; each part also runs alone, for
# a machine whose time limit is too short for all; SANITIZE_TOOLS="memcheck racecheck"
# runs a subset of the four tools)
set -u -o pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
if [ -d .whl ]; then  # optional packages the machine's image lacks (dask), brought as wheels (bench/fetch_wheels.sh)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
out=${OUT:-/tmp/cukern-out}
logs=$out/logs  # every log here, packed into $out/logs.tar.gz at the end (a remote machine may hand back only a few files)
mkdir -p "$logs"
part=${1:-all}
[ $# -gt 0 ] && shift
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$logs/gpu.txt"
case "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)" in
  *H100*) card=h100 ;;
  *H200*) card=h200 ;;
  *) card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1 | tr -cs 'A-Za-z0-9' _ | tr A-Z a-z) ;;
esac
echo "results file: bench/results/$card.json"
tests=0 bench=0
want() { [ "$part" = all ] || [[ ",$part," == *",$1,"* ]]; }
if want tests; then
  if [ $# -gt 0 ]; then paths=("$@"); else paths=(tests bench); fi
  # The tests that only check results share the GPU in GPU_TEST_WORKERS processes (pytest-xdist, on the
  # image; most of their time is NumPy emulation and NVRTC on the host); those marked serial time GPU work
  # and run after them, alone. One log for both.
  spread=(-n "${GPU_TEST_WORKERS:-6}")
  python3 -c 'import xdist' 2>/dev/null || spread=()
  { python3 -m pytest -m "gpu and not serial" "${spread[@]}" -q -p no:cacheprovider --durations=15 "${paths[@]}"
    shared=$?
    python3 -m pytest -m "gpu and serial" -q -p no:cacheprovider "${paths[@]}"
    alone=$?
    [ $shared = 5 ] && shared=0  # pytest's "no tests selected", in a run of a few chosen files
    [ $alone = 5 ] && alone=0
    echo "gpu tests: shared exit $shared, serial exit $alone"
    exit $(( shared || alone )); } 2>&1 | tee "$logs/gpu_tests.log"
  tests=$?
fi
sanitize=0
if want sanitize; then
  # One tool per run, each log in $logs/sanitize_<tool>.log. A finding, a Python error in the script or a
  # missing compute-sanitizer all count as errors: the job fails rather than claim a check it did not make.
  cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  outcomes=()
  for tool in ${SANITIZE_TOOLS:-memcheck racecheck initcheck synccheck}; do
    log=$logs/sanitize_$tool.log
    if [ ! -x "$cs" ]; then
      echo "compute-sanitizer not found (PATH, /usr/local/cuda/bin)" > "$log"
      outcomes+=("$tool=errors")
    elif "$cs" --tool "$tool" --error-exitcode 1 --target-processes all python3 bench/sanitize.py > "$log" 2>&1; then
      outcomes+=("$tool=clean")
    else
      outcomes+=("$tool=errors")
    fi
    [ "${outcomes[-1]#*=}" = clean ] || sanitize=1
    echo "sanitize $tool: ${outcomes[-1]#*=} ($(tail -n 1 "$log"))"
  done
  # Outcomes of this tree add to those already recorded for it (a subset per run, SANITIZE_TOOLS).
  python3 -c 'import json, os, sys
from cukern._compile import source_sha256
path, sha = sys.argv[1], source_sha256()
old = json.load(open(path)) if os.path.exists(path) else {}
tools = old["tools"] if old.get("source_sha256") == sha else {}
tools.update(a.split("=", 1) for a in sys.argv[2:])
with open(path, "w") as f:
    json.dump({"source_sha256": sha, "tools": tools}, f, indent=2)
    f.write("\n")' bench/results/sanitizer_$card.json "${outcomes[@]}" || sanitize=1
  cp bench/results/sanitizer_$card.json "$out/" 2>/dev/null
fi
if want bench; then
  r=bench/results
  python3 -m cukern.lab bench --json $r/$card.json --plot $r/bandwidth_$card.png 2>&1 | tee "$logs/bench.log"
  bench=$?
  python3 -m cukern.lab roofline --results $r/$card.json --plot $r/roofline_$card.png 2>&1 | tee -a "$logs/bench.log"
  CUKERN_TUNING=off python3 -m cukern.lab explain rms_norm --shape 16384x4096 --dtype bfloat16 > $r/rms_norm_card_$card.txt
  cp $r/$card.json $r/bandwidth_$card.png $r/roofline_$card.png $r/rms_norm_card_$card.txt "$out/" 2>/dev/null
fi
tar -czf "$out/logs.tar.gz" -C "$out" logs && rm -rf "$logs"
echo "gpu tests exit $tests, sanitize exit $sanitize, bench exit $bench"
exit $(( tests || sanitize || bench ))
