#!/usr/bin/env bash
# Wheels the device machine's image lacks (it reaches no registry): dask and the two packages it needs that
# the image does not have. Run here before a device call, then name .whl in the call's `carry`;
# bench/run_h200.sh installs them when .whl exists. .whl is ignored by git (.git/info/exclude).
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo /.whl/ >> .git/info/exclude
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_17_x86_64 -d .whl dask==2026.8.0 partd==1.4.2 locket==1.0.0
ls -la .whl
