"""cukern.dask on a real cluster of two GPUs: the Pipelines guide's example as written, every cukern.dask op on chunks
made on both dask-cuda workers (each its own process and GPU) against the eager op on one GPU, and workers
joined through a scheduler file, as on several machines. Skipped unless two GPUs are present and
distributed and dask_cuda import (bench/fetch_wheels.sh carries them to a machine that lacks them); without
a GPU the skip says so, whatever is installed."""

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import cukern
from conftest import HAS_GPU

if not HAS_GPU:
    pytest.skip("no CUDA GPU", allow_module_level=True)
da = pytest.importorskip("dask.array")
pytest.importorskip("distributed")
pytest.importorskip("dask_cuda")

import dask  # noqa: E402
from _support import assert_close  # noqa: E402
from dask.core import flatten  # noqa: E402
from distributed import Client, wait  # noqa: E402

import cukern.dask as ckd  # noqa: E402

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parent.parent


def need_two_gpus():
    import cupy

    if cupy.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs two GPUs")


def same(a, b) -> bool:
    import cupy

    def bits(v):
        return cupy.ascontiguousarray(v).view(np.dtype(f"u{v.itemsize}"))

    return a.shape == b.shape and a.dtype == b.dtype and bool(cupy.array_equal(bits(a), bits(b)))


def spread(client, make, rows: int, chunk_rows: int, seed: int):
    """A persisted dask array of ``rows`` rows of CuPy chunks: the first half made on (and kept by) one
    worker, the rest on the other. ``make(rng, rows, chunk_rows)`` builds a half from a CuPy-backed Dask
    generator, so only seeds travel from here."""
    import cupy

    workers = sorted(client.scheduler_info()["workers"])
    halves = []
    for i, (worker, n) in enumerate(zip(workers, (rows // 2, rows - rows // 2))):
        rng = da.random.default_rng(cupy.random.default_rng(seed + i))
        halves.append(client.persist(make(rng, n, chunk_rows), workers=[worker]))
    x = client.persist(da.concatenate(halves))
    wait(x)
    return x


def gpus_holding(client, arr) -> dict:
    """Chunk key -> PCI bus id of the GPU its array lies on, read in the worker process that holds it."""
    arr = client.persist(arr)
    wait(arr)
    keys = list(flatten(arr.__dask_keys__()))

    def read(dask_worker, keys=keys):
        return {k: dask_worker.data[k].device.pci_bus_id for k in keys if k in dask_worker.data}

    found = {}
    for held in client.run(read).values():
        found.update(held)
    assert len(found) == len(keys)
    return found


def normal(dtype, *trailing):
    import cupy

    def make(rng, n, chunk_rows):
        return rng.standard_normal((n, *trailing), chunks=(chunk_rows, *trailing), dtype=cupy.float32).astype(dtype)

    return make


def documented_example() -> str:
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "guide" / "pipelines.md").read_text(), re.S)
    return next(b for b in blocks if "LocalCUDACluster" in b)


def test_documented_example_runs_as_written():
    need_two_gpus()
    r = subprocess.run([sys.executable, "-c", documented_example()], capture_output=True, text=True, cwd=ROOT,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]
    # rows normalized with a weight of ones have a norm of sqrt(4096) = 64, eps aside
    assert abs(float(r.stdout.split()[-1]) - 64.0) < 1e-3, r.stdout


@pytest.fixture(scope="module")
def client():
    need_two_gpus()
    from dask_cuda import LocalCUDACluster

    with LocalCUDACluster(n_workers=2, CUDA_VISIBLE_DEVICES="0,1", protocol="tcp", threads_per_worker=1,
                          dashboard_address=None) as cluster, Client(cluster) as c:
        yield c


def test_workers_are_two_gpus(client):
    import cupy

    buses = client.run(lambda: cupy.cuda.Device().pci_bus_id)
    assert len(buses) == 2 and len(set(buses.values())) == 2


def test_row_ops_on_two_workers_match_one_gpu(client):
    import cupy

    w = cupy.random.default_rng(1).standard_normal(1024, dtype=cupy.float32)
    x = spread(client, normal(cupy.float16, 1024), 1001, 128, seed=10)
    r = spread(client, normal(cupy.float16, 1024), 1001, 200, seed=20)
    assert len(set(gpus_holding(client, x).values())) == 2
    y = ckd.rms_norm(x, w)
    assert len(set(gpus_holding(client, y).values())) == 2  # computed where the chunks lie
    xs, rs = x.compute(), r.compute()
    assert same(y.compute(), cukern.rms_norm(xs, w))  # rows are batch invariant: bitwise

    out, res = dask.compute(*ckd.fused_add_rms_norm(x, r, w))
    assert same(out, cukern.fused_add_rms_norm(xs, rs, w)) and same(res, rs)


def test_rotary_on_two_workers_matches_one_gpu(client):
    import cupy

    cache = cukern.rope_cache(4096, 128)
    pos = spread(client, lambda rng, n, c: rng.integers(0, 4096, size=n, chunks=c), 777, 100, seed=30)
    q = spread(client, normal(cupy.float16, 8, 128), 777, 100, seed=40)
    k = spread(client, normal(cupy.float16, 2, 128), 777, 100, seed=50)
    gq, gk = ckd.rotary_embedding(pos, q, k, cache)
    assert len(set(gpus_holding(client, gq).values())) == 2
    gq, gk = dask.compute(gq, gk)
    ps, qs, ks = pos.compute(), q.compute(), k.compute()
    cukern.rotary_embedding(ps, qs, ks, cache)
    assert same(gq, qs) and same(gk, ks)  # each element one rounding of the same products: bitwise


@pytest.fixture(scope="module")
def positive(client):
    """float32 [1001, 700] in [0, 1) (no cancellation, so the relative closeness rule holds), chunked both
    ways, half on each worker; and the same array gathered onto this process's GPU 0."""
    import cupy

    x = spread(client, lambda rng, n, c: rng.random((n, 700), chunks=(c, 350), dtype=cupy.float32), 1001, 128,
               seed=60)
    return x, x.compute()


@pytest.mark.parametrize("name", ["sum", "mean", "sum_of_squares", "norm", "amax", "amin"])
def test_reductions_across_two_workers_match_one_gpu(client, positive, name):
    import cupy

    x, xs = positive
    for axis in (None, 0, -1):
        got = getattr(ckd, name)(x, axis=axis, split_every=3).compute()  # combine steps mix both workers' partials
        ref = getattr(cukern, name)(xs, axis=axis)
        assert isinstance(got, cupy.ndarray) and got.dtype == ref.dtype and got.shape == ref.shape
        if name in ("amax", "amin"):
            assert same(got, ref)
        else:
            assert_close(got, ref, terms=xs.size if axis is None else xs.shape[axis])


def test_workers_joined_through_a_scheduler_file(tmp_path):
    """The multi-machine set-up on one machine: ``dask scheduler`` and ``dask cuda worker`` started apart,
    meeting through a scheduler file (on several machines: a file on a shared file system)."""
    need_two_gpus()
    import cupy

    file = str(tmp_path / "scheduler.json")
    procs = []
    try:  # each waits for the file to appear
        for command in (["scheduler", "--port", "0"], ["cuda", "worker", "--nthreads", "1"]):
            procs.append(subprocess.Popen([sys.executable, "-m", "dask", *command, "--scheduler-file", file,
                                           "--no-dashboard"], cwd=ROOT))
        with Client(scheduler_file=file, timeout=120, set_as_default=False) as c:
            c.wait_for_workers(2, timeout=180)
            x = spread(c, normal(cupy.float32, 512), 600, 100, seed=70)
            assert len(set(gpus_holding(c, x).values())) == 2
            total = c.compute(ckd.sum_of_squares(ckd.rms_norm(x))).result()
            xs = c.compute(x).result()
        assert_close(total, cukern.sum_of_squares(cukern.rms_norm(xs)), terms=xs.size)
    finally:
        for p in reversed(procs):
            p.terminate()
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
