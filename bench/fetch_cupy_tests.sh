#!/usr/bin/env bash
# Copies CuPy's own reduction tests (a check of NumPy semantics) into .cupy_tests/ (git-ignored), from a CuPy source tree or a
# git directory holding the tag: bench/fetch_cupy_tests.sh <cupy checkout or .git dir> [tag, default v14.2.0].
# The tests need only the installed cupy.testing (test_logsumexp.py compares with SciPy >= 1.15 as well, and
# skips without it). Run them routed to cukern (CUKERN_ROUTING_OPS=all routes argmax and logsumexp too):
#   CUKERN_ROUTING_OPS=all CUKERN_ROUTING_JSON=routing.json python -m pytest -p bench.cupy_routing .cupy_tests
set -euo pipefail
src=${1:?usage: $0 <cupy checkout or git dir> [tag]}
tag=${2:-v14.2.0}
dest=$(cd "$(dirname "$0")/.." && pwd)/.cupy_tests
files=(tests/cupy_tests/math_tests/test_sumprod.py tests/cupy_tests/statistics_tests/test_meanvar.py
       tests/cupy_tests/core_tests/test_ndarray_reduction.py tests/cupy_tests/linalg_tests/test_norms.py
       tests/cupy_tests/statistics_tests/test_order.py tests/cupy_tests/sorting_tests/test_search.py
       tests/cupy_tests/sorting_tests/test_count.py tests/cupy_tests/logic_tests/test_truth.py
       tests/cupyx_tests/scipy_tests/special_tests/test_logsumexp.py)
mkdir -p "$dest"
for f in "${files[@]}"; do
  out="$dest/$(basename "$(dirname "$f")")/$(basename "$f")"
  mkdir -p "$(dirname "$out")"
  if [ -f "$src/$f" ]; then
    cp "$src/$f" "$out"
  else
    git --git-dir="$src" show "$tag:$f" > "$out"
  fi
done
echo "copied ${#files[@]} CuPy test files ($tag) into $dest"
