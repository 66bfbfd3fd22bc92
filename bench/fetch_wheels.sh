#!/usr/bin/env bash
# Wheels a GPU machine without a package index lacks: Dask with its distributed scheduler and dask-cuda,
# Liger-Kernel (a training peer: it needs only torch and Triton), and each package they need that its image
# does not have. Run on a machine with an index, then copy .whl with
# the tree; bench/run_h200.sh installs them when .whl exists. .whl is ignored by git (.git/info/exclude).
#
# One consistent set: dask-cuda 26.10 takes its Dask through rapids-dask-dependency 26.10, which pins dask
# and distributed to 2026.7.1 (it is carried too, though its import hook stays idle in a --target install).
# Carried for distributed: tornado, zict, tblib, locket; for dask: partd. Already on the image: click,
# cloudpickle, fsspec, jinja2, msgpack, numpy, packaging, pandas, psutil, pyyaml, sortedcontainers, toolz,
# nvidia-ml-py (pynvml), cuda-core (dask-cuda imports cuda.core). Left out on purpose: bokeh
# (rapids-dask-dependency asks for it; it serves only the dashboard, which the cluster runs without).
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo /.whl/ >> .git/info/exclude
# two versions of one package stop the whole install there, so the folder holds exactly this set
rm -f .whl/*.whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
  dask==2026.7.1 distributed==2026.7.1 dask-cuda==26.10.0 rapids-dask-dependency==26.10.0 \
  tornado==6.6.1 zict==3.0.0 tblib==3.2.2 locket==1.0.0 partd==1.4.2 liger-kernel==0.8.5
ls -la .whl
du -ch .whl/*.whl | tail -n 1
