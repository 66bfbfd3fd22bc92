"""cukern.dask: graph construction checked on the CPU with NumPy stand-ins for the kernels (the synchronous
scheduler runs them), then on a GPU against the eager ops, and across GPUs when there are several."""

import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

import cukern
from cukern import reference

da = pytest.importorskip("dask.array")
import dask  # noqa: E402

import cukern.dask as ckd  # noqa: E402


def test_importing_cukern_dask_does_not_import_dask():
    code = "import sys, cukern, cukern.dask; print('dask' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip() == "False"


# ------------------------------------------------------------------------- NumPy stand-ins (CPU tests)


class Stub:
    """NumPy versions of the eager ops, recording what the chunk functions asked for."""

    def __init__(self):
        self.calls = []

    def rms_norm(self, x, weight=None, eps=1e-6, *, offset=0.0):
        self.calls.append(("rms_norm", x.shape))
        return reference.rms_norm(x, weight, eps, offset).astype(x.dtype)

    def fused_add_rms_norm(self, x, residual, weight=None, eps=1e-6, *, offset=0.0):
        self.calls.append(("fused_add_rms_norm", x.shape))
        residual += x
        return reference.rms_norm(residual, weight, eps, offset).astype(x.dtype)

    def rotary_embedding(self, positions, query, key, cache, *, is_neox=True, rotary_dim=None, inverse=False,
                         check_positions=True):
        assert key is None
        self.calls.append(("rotary_embedding", query.shape, positions.shape))
        query[...] = reference.rotary_embedding(positions, query, None, cache, is_neox, rotary_dim, inverse)[0]

    def _reduce(self, name, fn, x, axis, keepdims, dtype):
        self.calls.append((name, x.dtype, axis, None if dtype is None else np.dtype(dtype)))
        return np.asarray(fn(x, axis=axis, keepdims=keepdims, dtype=dtype))

    def sum(self, x, axis=None, *, dtype=None, keepdims=False):
        return self._reduce("sum", np.sum, x, axis, keepdims, dtype)

    def sum_of_squares(self, x, axis=None, *, dtype=None, keepdims=False):
        return self._reduce("sum_of_squares", lambda v, **kw: np.sum(v.astype(kw["dtype"] or v.dtype) ** 2,
                                                                      axis=kw["axis"], keepdims=kw["keepdims"]),
                            x, axis, keepdims, dtype)

    def amax(self, x, axis=None, *, dtype=None, keepdims=False):
        return self._reduce("amax", lambda v, dtype, **kw: np.max(v, **kw), x, axis, keepdims, dtype)

    def amin(self, x, axis=None, *, dtype=None, keepdims=False):
        return self._reduce("amin", lambda v, dtype, **kw: np.min(v, **kw), x, axis, keepdims, dtype)

    def astype(self, a, dtype):
        return a.astype(dtype)


@pytest.fixture
def stub(monkeypatch):
    s = Stub()
    monkeypatch.setattr(ckd, "_eager", s)
    with dask.config.set(scheduler="synchronous"):
        yield s


def test_rms_norm_maps_row_chunks(stub):
    x = np.random.default_rng(0).standard_normal((10, 16)).astype(np.float32)
    w = np.linspace(0.5, 1.5, 16).astype(np.float32)
    y = ckd.rms_norm(da.from_array(x, chunks=(4, 16)), w, 1e-5, offset=1.0)
    assert y.chunks == ((4, 4, 2), (16,)) and y.dtype == np.float32
    assert stub.calls == []  # lazy
    np.testing.assert_allclose(y.compute(), reference.rms_norm(x, w, 1e-5, 1.0), rtol=1e-6)
    assert sorted(stub.calls) == [("rms_norm", (2, 16)), ("rms_norm", (4, 16)), ("rms_norm", (4, 16))]


def test_rms_norm_without_weight_on_3d(stub):
    x = np.random.default_rng(1).standard_normal((3, 5, 8))
    y = ckd.rms_norm(da.from_array(x, chunks=(1, 2, 8)))
    np.testing.assert_allclose(y.compute(), reference.rms_norm(x), rtol=1e-12)


def test_row_ops_need_whole_rows():
    x = da.zeros((8, 16), chunks=(4, 8))
    with pytest.raises(ValueError, match=r"x.rechunk\(\{1: -1\}\)"):
        ckd.rms_norm(x)
    with pytest.raises(ValueError, match="weight has shape"):
        ckd.rms_norm(x.rechunk({1: -1}), np.ones(8))
    q = da.zeros((4, 2, 8), chunks=(2, 1, 4))
    with pytest.raises(ValueError, match="head_size"):
        ckd.rotary_embedding(np.arange(4), q, None, np.zeros((8, 8)))


def test_fused_add_returns_new_arrays_and_leaves_inputs(stub):
    rng = np.random.default_rng(2)
    x, r = rng.standard_normal((9, 8)), rng.standard_normal((9, 8))
    r_before = r.copy()
    out, res = ckd.fused_add_rms_norm(da.from_array(x, chunks=(3, 8)), da.from_array(r, chunks=(5, 8)), None)
    out, res = dask.compute(out, res)
    np.testing.assert_array_equal(r, r_before)
    np.testing.assert_allclose(res, x + r, rtol=1e-12)
    np.testing.assert_allclose(out, reference.rms_norm(x + r), rtol=1e-12)
    assert len([c for c in stub.calls if c[0] == "fused_add_rms_norm"]) == 3  # once per chunk, not per output


def test_rotary_chunks_tokens_and_heads_and_aligns_positions(stub):
    rng = np.random.default_rng(3)
    q, k = rng.standard_normal((7, 4, 16)), rng.standard_normal((7, 2, 16))
    pos = rng.integers(0, 32, 7)
    cache = reference.rope_cache(32, 16)
    dq, dk = ckd.rotary_embedding(da.from_array(pos, chunks=2), da.from_array(q, chunks=(3, 2, 16)),
                                  da.from_array(k, chunks=(4, 2, 16)), cache, is_neox=False)
    rq, rk = reference.rotary_embedding(pos, q, k, cache, is_neox=False)
    gq, gk = dask.compute(dq, dk)
    np.testing.assert_allclose(gq, rq, rtol=1e-12)
    np.testing.assert_allclose(gk, rk, rtol=1e-12)
    assert ("rotary_embedding", (3, 2, 16), (3,)) in stub.calls and ("rotary_embedding", (4, 2, 16), (4,)) in stub.calls
    assert ckd.rotary_embedding(pos, da.from_array(q), None, cache)[1] is None


REDUCTIONS = {"sum": reference.reduce_sum, "mean": reference.reduce_mean, "amax": reference.reduce_amax,
              "amin": reference.reduce_amin, "norm": reference.reduce_norm,
              "sum_of_squares": reference.reduce_sum_of_squares}


@pytest.mark.parametrize("name", sorted(REDUCTIONS))
@pytest.mark.parametrize("axis", [None, 0, -1, (0, 2)])
@pytest.mark.parametrize("keepdims", [False, True])
def test_reductions_tree(stub, name, axis, keepdims):
    x = np.random.default_rng(4).standard_normal((10, 6, 12))
    y = getattr(ckd, name)(da.from_array(x, chunks=(3, 4, 5)), axis=axis, keepdims=keepdims, split_every=2)
    expected = REDUCTIONS[name](x, axis=axis, keepdims=keepdims)
    assert y.shape == np.shape(expected)
    np.testing.assert_allclose(y.compute(), expected, rtol=1e-12)


def test_partials_stay_in_the_accumulator_type(stub):
    x = np.arange(24, dtype=np.float16).reshape(4, 6)
    y = ckd.mean(da.from_array(x, chunks=(2, 3)), axis=0)
    assert y.dtype == np.float16
    got = y.compute()
    assert got.dtype == np.float16
    np.testing.assert_allclose(got, x.astype(np.float64).mean(axis=0), rtol=1e-3)
    chunks = [c for c in stub.calls if c[1] == np.float16]  # the chunk step reads x
    assert len(chunks) == 4 and all(c[0] == "sum" and c[3] == np.float32 for c in chunks)
    assert all(c[1] == np.float32 for c in stub.calls if c[1] != np.float16)  # combine and aggregate
    ints = ckd.sum(da.from_array(np.arange(10, dtype=np.int32), chunks=3))
    assert ints.dtype == np.int64 and ints.compute() == 45


def test_reduction_errors_match_eager():
    with pytest.raises(ValueError, match="zero-size"):
        ckd.amax(da.zeros((0, 3)), axis=0)
    with pytest.raises(TypeError, match="bool"):
        ckd.norm(da.zeros(3, dtype=bool))
    with pytest.raises(TypeError, match="dtype=float16"):
        ckd.sum(da.zeros(3, dtype=np.float32), dtype=np.float16)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32])
def test_extremes_skip_chunks_empty_along_a_reduced_axis(stub, dtype):
    """Chunks of no rows (compute_chunk_sizes after a mask makes them) hold no extreme: Dask's own max skips
    them, and so do these, with any axis form and keepdims."""
    x = (np.arange(24).reshape(4, 6) % 7 - 3).astype(dtype)
    dx = da.from_array(x, chunks=((0, 3, 0, 1), (2, 0, 4)))
    for name, fn in (("amax", np.max), ("amin", np.min)):
        for axis in (None, 0, 1, (0, 1)):
            for keepdims in (False, True):
                got = getattr(ckd, name)(dx, axis=axis, keepdims=keepdims, split_every=2).compute()
                want = fn(x, axis=axis, keepdims=keepdims)
                assert got.dtype == want.dtype and np.array_equal(got, want), (name, axis, keepdims)


def test_sums_take_unknown_chunk_sizes(stub):
    x = np.arange(10.0)
    masked = da.from_array(x, chunks=4)
    masked = masked[masked > 2.5]  # chunk sizes unknown until computed
    assert float(ckd.sum(masked).compute()) == x[x > 2.5].sum()
    with pytest.raises(ValueError, match="unknown chunk sizes"):
        ckd.mean(masked)


def test_empty_mean_is_nan(stub):
    assert np.isnan(ckd.mean(da.zeros((0,), chunks=1)).compute())


# ------------------------------------------------------------------------------------------------- GPU


def bits(a):
    import cupy

    return cupy.ascontiguousarray(a).view(np.dtype(f"u{a.itemsize}"))


def same(a, b) -> bool:
    import cupy

    return a.shape == b.shape and bool(cupy.array_equal(bits(a), bits(b)))


@pytest.fixture
def gpu_data():
    import cupy

    rng = cupy.random.default_rng(9)
    return SimpleNamespace(
        x=rng.standard_normal((1000, 512), dtype=cupy.float32).astype(cupy.float16),
        r=rng.standard_normal((1000, 512), dtype=cupy.float32).astype(cupy.float16),
        w=rng.standard_normal(512, dtype=cupy.float32),
        q=rng.standard_normal((1000, 8, 64), dtype=cupy.float32).astype(cupy.float16),
        k=rng.standard_normal((1000, 2, 64), dtype=cupy.float32).astype(cupy.float16),
        pos=rng.integers(0, 2048, 1000),
        cache=cukern.rope_cache(2048, 64),
        f=rng.standard_normal((300, 700), dtype=cupy.float32),
    )


@pytest.mark.gpu
def test_dask_row_ops_match_eager_on_one_gpu(gpu_data):
    import cupy

    d = gpu_data
    with dask.config.set(scheduler="synchronous"):
        dx = da.from_array(d.x, chunks=(128, 512), asarray=False)
        y = ckd.rms_norm(dx, d.w)
        assert isinstance(y._meta, cupy.ndarray)
        assert same(y.compute(), cukern.rms_norm(d.x, d.w))
        out, res = dask.compute(*ckd.fused_add_rms_norm(dx, da.from_array(d.r, chunks=(300, 512), asarray=False),
                                                        d.w))
        ref_res = d.r.copy()
        assert same(out, cukern.fused_add_rms_norm(d.x, ref_res, d.w)) and same(res, ref_res)
        dq, dk = ckd.rotary_embedding(da.from_array(d.pos, chunks=250, asarray=False),
                                      da.from_array(d.q, chunks=(200, 4, 64), asarray=False),
                                      da.from_array(d.k, chunks=(300, 2, 64), asarray=False), d.cache)
        gq, gk = dask.compute(dq, dk)
    rq, rk = d.q.copy(), d.k.copy()
    cukern.rotary_embedding(d.pos, rq, rk, d.cache)
    for got, ref in ((gq, rq), (gk, rk)):  # one rounding per element either way; launch shapes differ
        cupy.testing.assert_allclose(got.astype(cupy.float32), ref.astype(cupy.float32), rtol=1e-3, atol=1e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["sum", "mean", "amax", "amin", "norm", "sum_of_squares"])
def test_dask_reductions_match_eager_on_one_gpu(gpu_data, name):
    import cupy

    x = gpu_data.f
    eager, lazy = getattr(cukern, name), getattr(ckd, name)
    dx = da.from_array(x, chunks=(64, 100), asarray=False)
    with dask.config.set(scheduler="synchronous"):
        for axis in (None, 0, 1):
            got = lazy(dx, axis=axis, split_every=3).compute()
            ref = eager(x, axis=axis)
            assert isinstance(got, cupy.ndarray) and got.dtype == ref.dtype and got.shape == ref.shape
            if name in ("amax", "amin"):
                assert same(got, ref)
            else:
                cupy.testing.assert_allclose(got, ref, rtol=2e-5, atol=1e-3)


@pytest.mark.gpu
def test_dask_extremes_skip_empty_chunks_on_the_gpu(gpu_data):
    import cupy

    x = gpu_data.f[:7]
    dx = da.from_array(x, chunks=((0, 4, 0, 3), (300, 0, 400)), asarray=False)
    with dask.config.set(scheduler="synchronous"):
        for name in ("amax", "amin"):
            for axis in (None, 0, 1):
                got = getattr(ckd, name)(dx, axis=axis, split_every=2).compute()
                assert isinstance(got, cupy.ndarray) and same(got, getattr(cukern, name)(x, axis=axis)), (name, axis)


@pytest.mark.gpu
def test_dask_mean_and_norm_keep_subnormal_results():
    """mean divides and norm square-roots in float64, as the eager kernels finish (CuPy's float32 division and
    square root flush a subnormal operand or result). Sums of these multiples of 2^-149, and of the squares of
    multiples of 2^-74 up to 16 of them (21000 squares of at most 2^8 units of 2^-148 stay below 2^24 units),
    are exact in float32 in any order, so the bits are the eager op's."""
    import cupy

    rng = np.random.default_rng(11)
    k = rng.integers(-1000, 1000, (300, 70)).astype(np.float32)
    for name, x in (("mean", np.ldexp(k, -149)), ("norm", np.ldexp(k % 33 - 16, -74))):
        x = cupy.asarray(x)
        dx = da.from_array(x, chunks=(64, 30), asarray=False)
        with dask.config.set(scheduler="synchronous"):
            for axis in (None, 0, 1):
                got = getattr(ckd, name)(dx, axis=axis, split_every=3).compute()
                ref = getattr(cukern, name)(x, axis=axis)
                assert same(got, ref) and np.any(ref.get() != 0), (name, axis)  # (CuPy's != flushes too)


@pytest.mark.gpu
def test_dask_chunks_on_two_gpus():
    """Chunks made on devices 0 and 1 (by the graph itself, as a worker per GPU makes them) are normed and
    summed on their own device. (Built from CuPy arrays with ``from_array`` and ``concatenate`` instead,
    Dask 2026.8 handed every chunk over on device 0, so that form cannot place chunks.)"""
    import cupy

    if cupy.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs two GPUs")

    def make(block_info=None):
        i = block_info[None]["chunk-location"][0]
        with cupy.cuda.Device(i // 2):
            return cupy.random.default_rng(i).standard_normal((128, 1024), dtype=cupy.float32)

    x = da.map_blocks(make, chunks=((128,) * 4, (1024,)), dtype=np.float32,
                      meta=cupy.empty((0, 0), dtype=cupy.float32))
    with cupy.cuda.Device(0):
        with dask.config.set(scheduler="sync"):
            parts = dask.compute(*x.to_delayed().ravel())
        assert [p.device.id for p in parts] == [0, 0, 1, 1]
        y = ckd.rms_norm(x)
        sums = ckd.sum(x, axis=1)
        with dask.config.set(scheduler="threads"):
            blocks = dask.compute(*y.to_delayed().ravel(), *sums.to_delayed().ravel())
            total, largest = dask.compute(ckd.sum(x, split_every=4), ckd.amax(x, axis=0, split_every=4))
        whole = cupy.concatenate([cupy.asarray(p.get()) for p in parts])
        assert total.device.id == 0 and largest.device.id == 0
        cupy.testing.assert_allclose(total, whole.astype(cupy.float64).sum(), rtol=1e-5, atol=1e-2)
        assert same(largest, whole.max(axis=0))
    normed, row_sums = blocks[:4], blocks[4:]
    for i, (b, s, part) in enumerate(zip(normed, row_sums, parts)):
        dev = i // 2
        assert b.device.id == dev and s.device.id == dev
        with cupy.cuda.Device(dev):
            assert same(b, cukern.rms_norm(part))
            assert same(s, cukern.sum(part, axis=1))
