"""Production reductions: references, compilation of every instantiation, PTX, planning, validation (CPU);
results against float64 references, determinism, NaN, layouts and 64-bit sizes (GPU)."""

import contextlib
import math
import re

import numpy as np
import pytest

from cukern import reduce as R
from cukern import reference
from cukern._compile import compile_program
from cukern._dtypes import BFLOAT16, dtype_name

ARCHS = ("sm_80", "sm_90")
OP_NAMES = ("sum", "mean", "sum_of_squares", "norm", "amax", "amin")
REFS = {
    "sum": reference.reduce_sum,
    "mean": reference.reduce_mean,
    "sum_of_squares": reference.reduce_sum_of_squares,
    "norm": reference.reduce_norm,
    "amax": reference.reduce_amax,
    "amin": reference.reduce_amin,
}


# ---------------------------------------------------------------------------------------------------------
# References.


def test_references_match_numpy(rng):
    x = rng.standard_normal((5, 7)).astype(np.float32)
    assert np.allclose(reference.reduce_sum(x, 1), x.astype(np.float64).sum(1))
    assert np.allclose(reference.reduce_norm(x), np.linalg.norm(x.astype(np.float64)))
    assert np.allclose(reference.reduce_mean(x, 0, keepdims=True), x.astype(np.float64).mean(0, keepdims=True))
    assert reference.reduce_amax(x) == x.max() and reference.reduce_amin(x) == x.min()
    i = np.array([2**31 - 1, 2**31 - 1], dtype=np.int32)
    assert reference.reduce_sum(i) == 2**32 - 2  # widened before summing
    assert reference.reduce_sum_of_squares(i) == 2 * (2**31 - 1) ** 2
    assert np.isnan(reference.reduce_amax(np.array([1.0, np.nan, 3.0])))


def test_tolerance_scales_with_size():
    t1 = reference.reduction_tolerance(1000, np.float32, 1000.0)
    t2 = reference.reduction_tolerance(10**8, np.float32, 1000.0)
    assert 0 < t1 < t2
    assert reference.reduction_tolerance(10**8, np.int64, 1.0) == 0.0


# ---------------------------------------------------------------------------------------------------------
# Compilation of every production instantiation, PTX and resources.


@pytest.fixture(scope="module", params=ARCHS)
def compiled(request):
    return compile_program(R.SOURCE, R.instantiations(), request.param)


def test_every_instantiation_compiles_without_spills(compiled):
    res = compiled.resources()
    insts = R.instantiations()
    assert len(compiled.lowered) == len(insts)
    for inst in insts:
        r = res[compiled.lowered[inst.expression]]
        assert r["spill_stores"] == 0 and r["spill_loads"] == 0, inst.expression
        assert r["stack"] == 0, inst.expression
    assert ".local" not in compiled.ptx


def test_vector_kernels_use_16_byte_loads(compiled):
    checked = 0
    for inst in R.instantiations():
        t = np.dtype(inst.args[0])
        if inst.name in ("reduce_full", "reduce_rows"):
            wide = True
        elif inst.name == "reduce_cols":
            wide = inst.args[3] * t.itemsize == 16
        else:
            continue
        body = compiled.kernel_ptx(inst)
        if wide:
            assert re.search(r"ld\.global\S*\.v(4\.(u32|b32|f32|s32)|2\.(u64|b64|f64|s64))", body), inst.expression
            checked += 1
    assert checked > 100


def test_instantiations_are_generated_and_cover_the_dispatcher():
    insts = R.instantiations()
    assert len(insts) == len(set(insts))
    assert len(insts) < 600  # CI compiles all of them for two architectures
    have = set(insts)
    shapes = [(1,), (31,), (1000003,), (4097, 3), (3, 4097), (1, 4097), (4097, 1), (7, 5, 9), (2, 3, 4, 5)]
    axes_for = {1: [None, 0], 2: [None, 0, 1, (0, 1)], 3: [None, 0, 1, 2, (0, 2), (1, 2)], 4: [(1, 3), (0, 2), 2]}
    for name, op in R.OPS.items():
        for t in op.inputs:
            for o in R.kernel_dtypes(name, t):
                for shape in shapes:
                    for axis in axes_for[len(shape)]:
                        for align in (0, 4, 16):
                            pl = R.plan(shape, t, axis, ptr=align * t.itemsize, op=name, out_dtype=o)
                            for inst in R.plan_instantiations(pl, t, o, op.kernel_op):
                                assert inst in have, (name, dtype_name(t), shape, axis, inst.expression)


# ---------------------------------------------------------------------------------------------------------
# Planning (pure).


def test_full_plan_fixed_grid():
    sm = 132
    p = R.plan_full(2**29, 4, sm)
    assert p.grid == R.FULL_BLOCKS_PER_SM * sm and p.block == R.FULL_BLOCK
    assert R.plan_full(0, 4, sm).grid == 1
    assert R.plan_full(1, 2, sm).grid == 1
    mid = R.plan_full(2**20, 4, sm)
    assert 1 <= mid.grid <= R.FULL_BLOCKS_PER_SM * sm
    assert R.plan_full(2**20, 4, sm) == mid  # a pure function of its arguments
    assert R.plan_full(2**40, 2, sm).grid == R.FULL_BLOCKS_PER_SM * sm
    assert R.FULL_BLOCKS_PER_SM * 200 <= R._WORK_ELEMENTS


def test_rows_plan():
    k = R.DEFAULT_KNOBS
    big = R.plan_rows(16384, 32768, 4)
    assert big.tpr == big.block == k.row_max_tpr and big.unroll == k.row_unroll
    assert big.min_blocks * big.block == k.row_threads_per_sm
    assert big.grid == min(32768, k.row_waves * 132 * big.min_blocks)
    assert R.plan_rows(3, 4097, 4).tpr == 4
    assert big.index32 and not R.plan_rows(R.ROW_INDEX32_LIMIT, 2, 2).index32
    assert R.plan_rows(R.ROW_INDEX32_LIMIT - 1, 2, 2).index32
    small = R.plan_rows(100, 10**6, 4)
    assert small.block == R.ROW_SMALL_BLOCK and small.block % small.tpr == 0
    for length in (1, 31, 1000, 4096, 10**6):
        p = R.plan_rows(length, 10, 2)
        assert p.tpr in R.row_tprs() and p.block == R.row_block(p.tpr)
        assert R.plan_rows(length, 10**7, 2).tpr == p.tpr  # a row's order does not depend on the batch


def test_defaults_from_the_h200_sweep():
    # bench/results/sweeps/reduce_h200.log: rows [32768, 16384] float32, tpr 256 / unroll 4 / 4 blocks per
    # SM: 475.0 us at 8 waves, 470.5 us at 32 (cupy 470.7); the full-sum defaults stay.
    k = R.DEFAULT_KNOBS
    assert k.row_waves == 32 and (k.row_max_tpr, k.row_unroll, k.row_threads_per_sm) == (256, 4, 1024)
    assert (k.full_block, k.full_blocks_per_sm, k.full_unroll) == (512, 2, 4)
    p = R.plan_rows(16384, 32768, 4, 132)
    assert (p.tpr, p.unroll, p.min_blocks, p.grid) == (256, 4, 4, 32 * 132 * 4)


def _fake_array(shape, dtype=np.float32, device_id=0):
    from types import SimpleNamespace

    return SimpleNamespace(shape=tuple(shape), ndim=len(shape), size=math.prod(shape), dtype=np.dtype(dtype),
                           data=SimpleNamespace(device_id=device_id))


def test_tuned_knobs_lookup_rule(monkeypatch):
    calls = []
    tuned = {"sum": R.Knobs(full_block=256), "sum_rows": R.Knobs(row_waves=4)}

    def lookup(op, device_id, dtype, shape):
        calls.append((op, device_id, dtype, shape))
        return tuned.get(op)

    monkeypatch.setattr(R._tuning, "lookup", lookup)
    x = _fake_array((6, 5, 7), np.float16, device_id=1)
    assert R._tuned_knobs(x, None) == tuned["sum"]
    assert calls[-1] == ("sum", 1, np.dtype(np.float16), (210,))
    for axis in (-1, 2, (2,), (-1,), np.int64(-1)):
        calls.clear()
        assert R._tuned_knobs(x, axis) == tuned["sum_rows"], axis
        assert calls == [("sum_rows", 1, np.dtype(np.float16), (30, 7))]
    calls.clear()
    for axis in (0, 1, (1, 2), (0, 1, 2), True, (True,), 1.0, [2], "x", ()):
        assert R._tuned_knobs(x, axis) is R.DEFAULT_KNOBS, axis
    assert R._tuned_knobs(_fake_array((7,)), -1) is R.DEFAULT_KNOBS  # rows need 2 or more dimensions
    assert R._tuned_knobs(_fake_array((3, 0)), -1) is R.DEFAULT_KNOBS  # empty rows: nothing to look up
    assert calls == []
    monkeypatch.setattr(R._tuning, "lookup", lambda *a: None)  # nothing tuned: the defaults
    assert R._tuned_knobs(x, None) is R.DEFAULT_KNOBS and R._tuned_knobs(x, -1) is R.DEFAULT_KNOBS


def test_tuning_adapter_is_on():
    import inspect

    from cukern import tuning

    assert inspect.signature(R._reduce).parameters["knobs"].default is None
    for op in ("sum", "sum_rows"):
        t = tuning._reduce_tunable(op)
        assert t is not None and t.default == R.DEFAULT_KNOBS


@pytest.mark.parametrize("knobs", [
    R.Knobs(row_max_tpr=512, row_threads_per_sm=1024, row_waves=32),
    R.Knobs(row_max_tpr=32, row_items=128, row_waves=None),
    R.Knobs(row_max_tpr=128, row_unroll=2, row_threads_per_sm=1536, row_waves=4),
    R.Knobs(row_waves=8),
    R.Knobs(full_block=256, full_blocks_per_sm=4, full_unroll=8),
])
def test_knobs_give_consistent_plans(knobs):
    for length, rows in ((16384, 32768), (100, 10**6), (1, 5), (4096, 2**31 - 5)):
        p = R.plan_rows(length, rows, 4, 132, knobs)
        assert p.tpr in R.row_tprs(knobs) and p.block == R.row_block(p.tpr) and p.block % p.tpr == 0
        assert p.min_blocks * p.block <= 2048 and 1 <= p.grid < 2**31
        assert p.grid * (p.block // p.tpr) < 2**31
        if knobs.row_waves is not None:
            assert p.grid <= knobs.row_waves * 132 * p.min_blocks
    f = R.plan_full(2**29, 4, 132, knobs)
    assert f.block == knobs.full_block and f.unroll == knobs.full_unroll
    assert f.grid == knobs.full_blocks_per_sm * 132 <= R._WORK_ELEMENTS
    pl = R.plan((32768, 16384), np.float32, -1, knobs=knobs)
    assert pl.kernel == R.plan_rows(16384, 32768, 4, 132, knobs)


def test_cols_plan_benchmark_shape():
    p = R.plan((16384, 32768), np.float32, 0)
    assert p.layout.kind == "cols"
    first, second = p.kernel, p.cols2
    assert first.vec == 4 and first.vector and first.cw == 256 and first.slices > 1
    assert first.slices * first.rows_per_slice >= 16384
    assert (first.slices - 1) * first.rows_per_slice < 16384
    assert second.slices == 1 and second.rows_per_slice == first.slices
    assert not R.plan((16384, 32768), np.float32, 0, ptr=4).kernel.vector  # misaligned base: scalar loads
    assert not R.plan((16, 30), np.float32, 0).kernel.vector  # rows 30 elements apart: packs misalign


def test_classify_layouts():
    assert R.classify((8, 16), (16, 1), (1,)).kind == "rows"
    assert R.classify((8, 16), (16, 1), (0,)).kind == "cols"
    assert R.classify((8, 16), (16, 1), (0, 1)).kind == "full"
    assert R.classify((16, 8), (1, 16), (0, 1)) == R.Layout("full", (), ((128, 1),))  # transposed
    assert R.classify((4, 5, 6), (30, 6, 1), (1,)).kind == "cols"  # middle axis: matrices of columns
    assert R.classify((4, 5, 6), (30, 6, 1), (0, 2)).kind == "strided"
    assert R.classify((8, 16), (32, 2), (0, 1)).kind == "full"  # x[:, ::2] of [8, 32]: one stride-2 run
    assert R.classify((8, 16), (40, 2), (0, 1)).kind == "copy"  # x[:, :32:2] of [8, 40]: two levels
    assert R.classify((8, 16), (16, 1), ()).kind == "none"
    assert R.classify((8, 1), (1, 1), (1,)).kind == "none"
    assert R.classify((2, 3, 4, 5), (60, 20, 5, 1), (1, 3)).kind == "strided"
    assert R.classify((2, 3, 4, 5, 6), (360, 120, 30, 6, 1), (1, 3)).kind == "copy"
    p = R.plan((2, 3, 4, 5, 6), np.float32, (1, 3))
    assert p.copy and p.layout.kind == "rows"


def test_normalize_axis():
    assert R.normalize_axis(None, 3) == (0, 1, 2)
    assert R.normalize_axis(-1, 3) == (2,)
    assert R.normalize_axis((2, 0), 3) == (0, 2)
    with pytest.raises(np.exceptions.AxisError):
        R.normalize_axis(3, 3)
    with pytest.raises(ValueError, match="repeats"):
        R.normalize_axis((0, -3), 3)
    with pytest.raises(TypeError):
        R.normalize_axis(1.0, 3)
    with pytest.raises(TypeError):
        R.normalize_axis(True, 3)


def test_result_dtypes_follow_numpy():
    i32, i64, f16, f32, f64 = (np.dtype(t) for t in ("int32", "int64", "float16", "float32", "float64"))
    assert R.result_dtype("sum", i32) == np.sum(np.ones(2, i32)).dtype == i64
    assert R.result_dtype("sum", np.bool_) == i64
    assert R.result_dtype("sum", f16) == f16 and R.result_dtype("sum", BFLOAT16) == BFLOAT16
    assert R.result_dtype("mean", i32) == f64 and R.result_dtype("norm", i64) == f64
    assert R.result_dtype("mean", f16) == np.mean(np.ones(2, f16)).dtype
    assert R.result_dtype("sum", f16, "float32") == f32
    assert R.result_dtype("amax", i32) == i32
    with pytest.raises(TypeError, match="dtype=float16 is not supported for sum of float32"):
        R.result_dtype("sum", f32, np.float16)
    for name in ("sum", "mean", "sum_of_squares", "norm"):
        for t in R.OPS[name].inputs:
            assert R.acc_dtype(R.result_dtype(name, t)) in (f32, f64, i64)
            if t in (f16, BFLOAT16):
                assert R.acc_dtype(R.result_dtype(name, t)) == f32  # halves accumulate in float32


def test_bytes_moved():
    assert R.bytes_moved((32768, 16384), np.float32, -1) == 32768 * 16384 * 4 + 32768 * 4
    assert R.bytes_moved((2**29,), np.float32) == 2**31 + 4
    assert R.bytes_moved((16, 8), np.int32, 0) == 16 * 8 * 4 + 8 * 8  # int32 sums are int64


def test_rejects_host_arrays():
    for name in OP_NAMES:
        with pytest.raises(TypeError, match="cupy.asarray"):
            getattr(R, name)(np.ones(4, np.float32))
    with pytest.raises(TypeError, match="cupy.ndarray"):
        R.sum([1.0, 2.0])


# ---------------------------------------------------------------------------------------------------------
# GPU.

ALL_DTYPES = (np.float32, np.float64, np.float16, BFLOAT16, np.int32, np.int64, np.bool_)


def _data(rng, shape, dtype, *, signed=False):
    """Random values that are never zero: floats in [0.5, 1.5) (times a random sign when ``signed``),
    integers in [1, 100] (or [-100, -1] U [1, 100]), booleans mostly True."""
    dtype = np.dtype(dtype)
    size = math.prod(shape)
    if dtype == np.bool_:
        return (rng.random(size) < 0.9).reshape(shape)
    if dtype.kind == "i":
        v = rng.integers(1, 101, size)
    else:
        v = rng.random(size) + 0.5
    if signed:
        v = v * rng.choice([-1, 1], size)
    return v.reshape(shape).astype(dtype)


def _check_result(name, got, x_host, axis, keepdims=False, dtype=None):
    import cupy

    t = x_host.dtype
    want_dtype = R.result_dtype(name, t, dtype)
    assert got.dtype == want_dtype, (name, got.dtype, want_dtype)
    ref = REFS[name](x_host, axis=axis, keepdims=keepdims)
    g = cupy.asnumpy(got).astype(np.float64 if want_dtype.kind == "f" or want_dtype == BFLOAT16 else np.int64)
    assert g.shape == np.shape(ref)
    axes = R.normalize_axis(axis, x_host.ndim)
    n = max(1, math.prod(x_host.shape[i] for i in axes))
    acc = R.acc_dtype(want_dtype)
    if name in ("amax", "amin"):
        tol = 0.0
    elif acc.kind == "i":
        tol = 0.0
    else:
        w = np.abs(x_host.astype(np.float64))
        mag = np.sum(w * w if name in ("sum_of_squares", "norm") else w, axis=axis, keepdims=keepdims)
        tol = reference.reduction_tolerance(n, acc, 1.0) * mag
        if name == "mean":
            tol = tol / n
        if name == "norm":
            tol = tol / (2 * np.maximum(np.asarray(ref), 1e-30))
    out_eps = 0.0 if want_dtype.kind in "biu" else float(np.finfo(np.float32 if want_dtype == BFLOAT16 else want_dtype).eps)
    if want_dtype == BFLOAT16:
        out_eps = 2.0**-8
    tol = tol + out_eps * np.abs(ref)  # rounding the result to its dtype
    if want_dtype.kind == "f":  # as in NumPy, a result past its dtype's range is an infinity of the right sign
        over = np.abs(ref) > float(np.finfo(want_dtype).max) * (1 + out_eps)
        assert np.all(np.where(over, g == np.sign(ref) * np.inf, True)), (name, dtype_name(t), "overflow")
        ref, g = np.where(over, 0.0, ref), np.where(over, 0.0, g)
    assert np.all(np.abs(g - ref) <= tol), (name, dtype_name(t), x_host.shape, axis, np.max(np.abs(g - ref)))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_name)
@pytest.mark.parametrize("n", [1, 31, 1000003])
def test_full_reductions(rng, dtype, n):
    import cupy

    xh = _data(rng, (n,), dtype)
    x = cupy.asarray(xh)
    for name in OP_NAMES:
        if np.dtype(dtype) not in R.OPS[name].inputs:
            continue
        _check_result(name, getattr(R, name)(x), xh, None)


@pytest.mark.gpu
def test_large_float32_sum_and_bit_identical_reruns(rng):
    import cupy

    n = 2**28 + 7
    x = cupy.random.random(n, dtype=np.float32) + np.float32(0.5)
    ref = math.fsum(float(x[i:i + 2**26].astype(np.float64).sum()) for i in range(0, n, 2**26))
    got = R.sum(x)
    assert abs(float(got) - ref) <= reference.reduction_tolerance(n, np.float32, ref)
    again = [R.sum(x) for _ in range(5)]
    assert all(cupy.asnumpy(a).tobytes() == cupy.asnumpy(got).tobytes() for a in again)
    assert float(R.amax(x)) == float(x.max())


@pytest.mark.gpu
def test_bit_identical_reruns_every_layout(rng):
    import cupy

    x = cupy.asarray(_data(rng, (4097, 1031), np.float32, signed=True))
    for axis in (None, 0, 1):
        for fn in (R.sum, R.norm):
            first = cupy.asnumpy(fn(x, axis=axis)).tobytes()
            for _ in range(3):
                assert cupy.asnumpy(fn(x, axis=axis)).tobytes() == first


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float16, BFLOAT16, np.float64], ids=dtype_name)
def test_nan_propagates(dtype):
    import cupy

    for n in (1, 5, 1000003):
        for where in sorted({0, n // 2, n - 1}):
            xh = np.linspace(-3, 3, n).astype(dtype)
            xh[where] = np.nan
            x = cupy.asarray(xh)
            assert np.isnan(float(R.amax(x))) and np.isnan(float(R.amin(x))), (n, where)
            assert np.isnan(float(R.sum(x)))
    xh = np.ones((3, 4097), dtype)
    xh[1, 4000] = np.nan
    for axis in (0, 1):
        got = cupy.asnumpy(R.amax(cupy.asarray(xh), axis=axis)).astype(np.float64)
        assert np.array_equal(np.isnan(got), np.isnan(np.max(xh.astype(np.float64), axis=axis)))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, BFLOAT16, np.int32], ids=dtype_name)
@pytest.mark.parametrize("m", [1, 3, 4097])
@pytest.mark.parametrize("n", [1, 3, 4097])
def test_axis_variants(rng, dtype, m, n):
    import cupy

    xh = _data(rng, (m, n), dtype, signed=True)
    x = cupy.asarray(xh)
    for name in OP_NAMES:
        for axis in (None, 0, 1, -1, (0, 1)):
            for keepdims in (False, True):
                _check_result(name, getattr(R, name)(x, axis=axis, keepdims=keepdims), xh, axis, keepdims)


@pytest.mark.gpu
def test_layouts_views_and_misalignment(rng):
    import cupy

    base_h = _data(rng, (6, 37, 41), np.float32, signed=True)
    base = cupy.asarray(base_h)
    views = {
        "contiguous": (base, base_h),
        "offset": (base.reshape(-1)[1:].reshape(-1)[: 6 * 37 * 41 - 5], base_h.reshape(-1)[1: 6 * 37 * 41 - 4]),
        "transposed": (base.transpose(2, 0, 1), base_h.transpose(2, 0, 1)),
        "step": (base[:, ::2, 1:], base_h[:, ::2, 1:]),
        "reversed": (base[::-1, :, ::-1], base_h[::-1, :, ::-1]),
    }
    for label, (x, xh) in views.items():
        axes = [None] + list(range(xh.ndim)) + [(0, xh.ndim - 1)] if xh.ndim > 1 else [None, 0]
        for axis in axes:
            for name in ("sum", "amax", "norm"):
                _check_result(name, getattr(R, name)(x, axis=axis), xh, axis)


@pytest.mark.gpu
def test_misaligned_rows_and_dtype_argument(rng):
    import cupy

    for dtype in (np.float16, BFLOAT16, np.float32, np.int64, np.bool_):
        xh = _data(rng, (1000003 + 3,), dtype)
        x = cupy.asarray(xh)
        for k in (1, 2, 3):
            _check_result("sum", R.sum(x[k:]), xh[k:], None)
        for k, width in ((1, 3), (3, 1001)):  # rows start at every alignment
            rows_h = xh[k:k + 997 * width].reshape(997, width)
            rows = x[k:k + 997 * width].reshape(997, width)
            _check_result("sum", R.sum(rows, axis=1), rows_h, 1)
            _check_result("sum", R.sum(rows, axis=0), rows_h, 0)
    xh = _data(rng, (4097, 33), np.float16)
    x = cupy.asarray(xh)
    for dt in ("float32", "float64"):
        for name in ("sum", "mean", "norm"):
            _check_result(name, getattr(R, name)(x, axis=0, dtype=dt), xh, 0, dtype=dt)
    xi = _data(rng, (4097, 33), np.int32)
    _check_result("sum", R.sum(cupy.asarray(xi), axis=1, dtype=np.int32), xi, 1, dtype=np.int32)


@pytest.mark.gpu
def test_empty_and_out(rng):
    import cupy

    e = cupy.zeros((0,), np.float32)
    assert float(R.sum(e)) == 0.0 and float(R.sum_of_squares(e)) == 0.0 and float(R.norm(e)) == 0.0
    assert np.isnan(float(R.mean(e)))
    with pytest.raises(ValueError, match="zero-size"):
        R.amax(e)
    with pytest.raises(ValueError, match="zero-size"):
        R.amin(cupy.zeros((3, 0), np.float32), axis=1)
    assert R.amax(cupy.zeros((0, 3), np.float32), axis=1).shape == (0,)
    assert R.sum(cupy.zeros((0, 3), np.int32), axis=0).tolist() == [0, 0, 0]
    xh = _data(rng, (5, 9), np.float32)
    x = cupy.asarray(xh)
    out = cupy.empty(9, np.float32)
    assert R.sum(x, axis=0, out=out) is out
    _check_result("sum", out, xh, 0)
    strided_out = cupy.empty(18, np.float32)[::2]
    R.amax(x, axis=0, out=strided_out)
    assert np.array_equal(cupy.asnumpy(strided_out), xh.max(0))
    s = cupy.asarray(np.float32(3.0))
    assert float(R.sum(s)) == 3.0 and R.sum(s).shape == ()


@pytest.mark.gpu
def test_fast_path_matches_the_general_path(rng):
    import cupy

    xh = _data(rng, (513, 1031), np.float32, signed=True)
    x = cupy.asarray(xh)
    cases = [dict(), dict(axis=1), dict(axis=0), dict(axis=(0, 1)), dict(axis=1, keepdims=True),
             dict(dtype=np.float64), dict(axis=-1, dtype="float64")]
    for name in ("sum", "norm", "amax"):
        for kw in cases:
            if name == "amax" and "dtype" in kw:
                continue
            first = getattr(R, name)(x, **kw)  # general path, then cached
            second = getattr(R, name)(x, **kw)  # fast path
            assert second.shape == first.shape and second.dtype == first.dtype
            assert cupy.asnumpy(second).tobytes() == cupy.asnumpy(first).tobytes(), (name, kw)
            assert second.data.ptr != first.data.ptr  # a fresh result every call
    y = cupy.asarray(xh[:, 1:])  # other strides and alignment: its own entry
    _check_result("sum", R.sum(y, axis=1), xh[:, 1:], 1)
    _check_result("sum", R.sum(x[:, 1:], axis=1), xh[:, 1:], 1)
    _check_result("sum", R.sum(x[::-1, 0]), xh[::-1, 0], None)
    _check_result("sum", R.sum(x[::-1, 0]), xh[::-1, 0], None)
    # values that compare equal to cached valid arguments are still rejected
    R.sum(x, axis=1)
    with pytest.raises(TypeError):
        R.sum(x, axis=True)
    with pytest.raises(TypeError):
        R.sum(x, axis=(True,))
    with pytest.raises(TypeError):
        R.sum(x, axis=1.0)
    with cupy.cuda.Stream():  # another stream: its own workspace and entry
        _check_result("sum", R.sum(x), xh, None)
    _check_result("sum", R.sum(x), xh, None)


@pytest.mark.gpu
@pytest.mark.parametrize("knobs", [
    R.Knobs(),
    R.Knobs(row_max_tpr=512, row_threads_per_sm=1024, row_waves=32),
    R.Knobs(row_max_tpr=32, row_items=128, row_waves=None),
    R.Knobs(row_max_tpr=128, row_unroll=8, row_threads_per_sm=1024, row_waves=4),
    R.Knobs(full_block=256, full_blocks_per_sm=4, full_unroll=8),
    R.Knobs(full_block=1024, full_blocks_per_sm=1, full_unroll=2),
])
def test_knob_settings_are_correct(rng, knobs):
    import cupy

    xh = _data(rng, (257, 16411), np.float32, signed=True)
    x = cupy.asarray(xh)
    _check_result("sum", R._reduce("sum", x, -1, None, False, None, knobs=knobs), xh, -1)
    _check_result("sum", R._reduce("sum", x, -1, None, False, None, knobs=knobs), xh, -1)  # cached
    _check_result("sum", R._reduce("sum", x, None, None, False, None, knobs=knobs), xh, None)
    for axis, view, ref in ((-1, x, xh), (None, x, xh), (-1, x[:, 3:], xh[:, 3:])):
        pl = R.plan(view.shape, view.dtype, axis, strides=tuple(s // 4 for s in view.strides),
                    ptr=view.data.ptr % 16, knobs=knobs)
        out = cupy.empty(() if axis is None else view.shape[0], np.float32)
        R._launch(pl, out, view, view.dtype, np.dtype(np.float32), R.OP_SUM, R.FINISH_NONE, 1.0)
        _check_result("sum", out, ref, axis)


def _failing_allocator(size):
    raise MemoryError(f"unexpected device allocation of {size} bytes")


@pytest.mark.gpu
def test_out_is_written_directly_without_allocations(rng):
    import cupy

    xh = _data(rng, (257, 1031), np.float32, signed=True)
    x = cupy.asarray(xh)
    cases = [dict(), dict(axis=1), dict(axis=-1, keepdims=True), dict(axis=0), dict(axis=(0, 1)),
             dict(axis=1, dtype=np.float64)]
    for name in ("sum", "norm", "amax"):
        for kw in cases:
            if name == "amax" and "dtype" in kw:
                continue
            want = getattr(R, name)(x, **kw)
            outs = [cupy.full(want.shape, np.nan, want.dtype) for _ in range(3)]
            assert getattr(R, name)(x, **kw, out=outs[0]) is outs[0]  # general path, then cached
            pl = R.plan(x.shape, x.dtype, kw.get("axis"), out_dtype=want.dtype)
            # The two-pass column plan (axis=0 here) still allocates its partials; nothing else allocates.
            single = not pl.copy and pl.cols2 is None
            with cupy.cuda.using_allocator(_failing_allocator) if single else contextlib.nullcontext():
                assert getattr(R, name)(x, **kw, out=outs[1]) is outs[1]  # fast path: no temporary
                R._fast.clear()
                assert getattr(R, name)(x, **kw, out=outs[2]) is outs[2]  # general path: no temporary
            for o in outs:
                assert cupy.asnumpy(o).tobytes() == cupy.asnumpy(want).tobytes(), (name, kw)
    # A strided out, and amax with a converted dtype, go through a temporary and still land in out.
    strided = cupy.zeros(2 * 1031, np.float32)[::2]
    assert R.sum(x, axis=0, out=strided) is strided
    _check_result("sum", strided, xh, 0)
    conv = cupy.zeros(257, np.float64)
    assert R.amax(x, axis=1, dtype=np.float64, out=conv) is conv
    assert np.array_equal(cupy.asnumpy(conv), xh.max(1).astype(np.float64))


@pytest.mark.gpu
def test_out_overlapping_x_raises():
    import cupy

    y = cupy.ones((5, 4), np.float32)
    with pytest.raises(ValueError, match="out overlaps x"):
        R.sum(y, axis=0, out=y[0])
    with pytest.raises(ValueError, match="out overlaps x"):
        R.sum(y, axis=1, out=y[:, 0])  # strided: the temporary path checks too
    out = cupy.empty(4, np.float32)
    R.sum(y, axis=0, out=out)  # cached for out's shape, strides, dtype and alignment
    R.sum(y, axis=0, out=out)
    with pytest.raises(ValueError, match="out overlaps x"):
        R.sum(y, axis=0, out=y[1])  # same description as out: the fast path still checks
    assert float(y.sum()) == 20.0  # nothing was written into x
    assert out.tolist() == [5.0] * 4


@pytest.mark.gpu
def test_out_in_a_cuda_graph(rng):
    import cupy

    from cukern import pipeline

    x = cupy.asarray(_data(rng, (64, 4096), np.float32, signed=True))
    calls = [(name, axis) for name in ("sum", "amax", "norm") for axis in (None, -1, 0)]
    for _, axis in calls:  # single-launch plans: the graph holds no temporary
        pl = R.plan(x.shape, x.dtype, axis)
        assert not pl.copy and pl.cols2 is None
    shapes = {None: (), -1: (64,), 0: (4096,)}
    outs = [cupy.empty(shapes[axis], np.float32) for _, axis in calls]

    def step():
        return [getattr(R, name)(x, axis=axis, out=o) for (name, axis), o in zip(calls, outs)]

    captured = pipeline.capture(step)
    assert all(r is o for r, o in zip(captured.results[0], outs))
    for _ in range(2):  # new inputs each replay: the graph writes into out again
        with captured.stream:
            x[...] = cupy.asarray(_data(rng, x.shape, np.float32, signed=True))
            for o in outs:
                o.fill(np.nan)
            captured.replay()
            captured.stream.synchronize()
        for (name, axis), o in zip(calls, outs):
            want = getattr(R, name)(x, axis=axis)
            assert cupy.asnumpy(o).tobytes() == cupy.asnumpy(want).tobytes(), (name, axis)


@pytest.mark.gpu
def test_workspaces_are_bounded(rng, monkeypatch):
    import cupy

    monkeypatch.setattr(R, "_WORKSPACE_MAX", 3)
    xh = _data(rng, (1 << 20,), np.float32)
    x = cupy.asarray(xh)
    cupy.cuda.Device().synchronize()
    streams = [cupy.cuda.Stream(non_blocking=True) for _ in range(6)]
    got = []
    for _ in range(3):  # interleaved: kernels of several streams in flight while entries are evicted
        for s in streams:
            with s:
                got.append(R.sum(x))
                R._fast.clear()  # the general path, so each call asks for its stream's workspace
                got.append(R.sum(x))
            assert len(R._workspaces) <= 3
    for s in streams:
        s.synchronize()
    first = cupy.asnumpy(got[0]).tobytes()
    assert all(cupy.asnumpy(g).tobytes() == first for g in got)  # bit-identical on every stream
    _check_result("sum", got[0], xh, None)


@pytest.mark.gpu
def test_tuned_knobs_are_used_and_keyed(rng, monkeypatch):
    import cupy

    tuned = {"sum": R.Knobs(full_block=256, full_blocks_per_sm=4, full_unroll=8),
             "sum_rows": R.Knobs(row_max_tpr=128, row_unroll=2, row_waves=4)}
    seen = []

    def lookup(op, device_id, dtype, shape):
        seen.append((op, shape))
        return tuned.get(op)

    xh = _data(rng, (33, 4099), np.float32, signed=True)
    x = cupy.asarray(xh)
    R._fast.clear()
    monkeypatch.setattr(R._tuning, "lookup", lookup)
    for _ in range(2):  # general path, then the fast path
        _check_result("sum", R.sum(x), xh, None)
        _check_result("sum", R.sum(x, axis=-1), xh, -1)
        _check_result("sum", R.sum(x, axis=1, out=cupy.empty(33, np.float32)), xh, 1)
    assert ("sum", (x.size,)) in seen and ("sum_rows", (33, 4099)) in seen
    keyed = {e for k in R._fast for e in k if isinstance(e, R.Knobs)}
    assert keyed == set(tuned.values())  # each call's entry carries the knobs it was planned with
    monkeypatch.setattr(R._tuning, "lookup", lambda *a: None)  # untuned: the defaults, their own entries
    _check_result("sum", R.sum(x), xh, None)
    _check_result("sum", R.sum(x, axis=-1), xh, -1)
    assert any(k[-1] is R.DEFAULT_KNOBS for k in R._fast)


@pytest.mark.gpu
def test_bad_input_raises_before_launch():
    import cupy

    x = cupy.ones((4, 5), np.float32)
    with pytest.raises(TypeError, match="supported"):
        R.sum(cupy.ones(3, np.uint8))
    with pytest.raises(TypeError, match="supported"):
        R.amax(cupy.ones(3, np.bool_))
    with pytest.raises(np.exceptions.AxisError):
        R.sum(x, axis=2)
    with pytest.raises(ValueError, match="shape"):
        R.sum(x, axis=0, out=cupy.empty(4, np.float32))
    with pytest.raises(TypeError, match="dtype"):
        R.sum(x, axis=0, out=cupy.empty(5, np.float64))
    with pytest.raises(ValueError, match="zero stride"):
        R.sum(x, axis=0, out=cupy.broadcast_to(cupy.empty(1, np.float32), (5,)))
    with pytest.raises(TypeError, match="cupy"):
        R.sum(x, out=np.empty((), np.float32))


@pytest.mark.gpu
def test_more_than_2_31_elements():
    import cupy

    n = 2**31 + 7
    for dtype in (np.float16, BFLOAT16):
        x = cupy.empty(n, dtype=dtype)
        bits = x.view(np.uint16)  # filled through the bit pattern: no dependence on CuPy's half-type fills
        bits.fill(int(np.array(0.5, dtype).view(np.uint16)))
        bits[-3:] = int(np.array(1024, dtype).view(np.uint16))
        want = 0.5 * (n - 3) + 3 * 1024
        assert float(R.sum(x, dtype=np.float64)) == want
        assert float(R.amax(x)) == 1024.0
        rows = x[:-7].reshape(2**15, 2**16)
        got = R.sum(rows, axis=1, dtype=np.float64)
        assert float(got[-1]) == 0.5 * rows.shape[1] and float(got[0]) == 0.5 * rows.shape[1]
        two = x[:2**31].reshape(2, 2**30)  # rows of 2^30 elements: 64-bit indices within the row
        assert not R.plan(two.shape, two.dtype, 1).kernel.index32
        got = R.sum(two, axis=1, dtype=np.float64)
        assert float(got[0]) == float(got[1]) == 0.5 * 2**30
        del two
        del x, rows, got
