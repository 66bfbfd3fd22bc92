"""argmax, argmin, nanargmax, nanargmin: the key order against NumPy on the host, planning and validation
without a GPU, the compiled kernels' resources, and on a GPU every dtype, axis, layout and NaN placement
against the emulator and NumPy."""

from __future__ import annotations

import math

import numpy as np
import pytest
from _support import (
    ARCHS,
    assert_no_spills,
    compiled,
    fake_array,
    same_bits,
    struct_fields,
)

from cukern import argreduce as A
from cukern import reference as R
from cukern._compile import read_source
from cukern._dtypes import BFLOAT16, dtype_name

OPS = tuple(A.OPS)
F32 = np.dtype(np.float32)


def _special(rng, shape, dtype):
    """Values with many ties (a few distinct integers), and for floats NaN, +-inf and -0 sprinkled in;
    complex: such values in both parts."""
    if np.dtype(dtype).kind == "c":
        part = np.float32 if np.dtype(dtype) == np.complex64 else np.float64
        z = np.empty(shape, dtype)
        z.real, z.imag = _special(rng, shape, part), _special(rng, shape, part)
        return z
    x = rng.integers(-4, 5, shape).astype(np.float64)
    if np.dtype(dtype) in A.FLOATS:
        u = rng.random(shape)
        x[u < 0.03] = np.nan
        x[(u >= 0.03) & (u < 0.06)] = np.inf
        x[(u >= 0.06) & (u < 0.09)] = -np.inf
        x[(u >= 0.09) & (u < 0.2)] = -0.0
    elif np.dtype(dtype).kind == "u":
        x = np.abs(x)
    return x.astype(dtype)


# ---------------------------------------------------------------------------------------------------------
# The key order (host side of element_key): the emulators are NumPy's functions.


@pytest.mark.parametrize("dtype", A.DTYPES, ids=dtype_name)
def test_emulators_are_numpys_functions(dtype, rng):
    for shape in [(1,), (13,), (5, 7), (3, 4, 6)]:
        x = _special(rng, shape, dtype)
        if np.dtype(dtype) in A.INEXACT:
            for a in range(x.ndim):  # every slice along every axis holds a number
                np.moveaxis(x, a, 0)[-1] = 1
        for op in OPS:
            for axis in [None] + list(range(-len(shape), len(shape))):
                want = getattr(R, op)(x, axis=axis)
                assert np.array_equal(getattr(R, f"{op}_emulated")(x, axis=axis), want), (op, axis)


@pytest.mark.parametrize("dtype", [t for t in A.DTYPES if t not in A.COMPLEX], ids=dtype_name)
def test_keys_order_every_value_as_the_op_does(dtype):
    dt = np.dtype(dtype)
    if dt in A.FLOATS:
        info = np.finfo(np.float32 if dt == BFLOAT16 else dt)
        values = np.array([-np.inf, -float(info.max) / 2, -1.5, -float(info.tiny), -0.0, 0.0, float(info.tiny),
                           1.5, float(info.max) / 2, np.inf]).astype(dt)
    elif dt == np.bool_:
        values = np.array([False, True])
    else:
        info = np.iinfo(dt)
        values = np.array(sorted({info.min, info.min + 1, -1 if info.min else 0, 0, 1, info.max - 1, info.max}), dt)
    as_f = values.astype(np.float64) if dt in A.FLOATS else values
    for op in OPS:
        k = R.arg_keys(values, op)
        order = np.argsort(as_f, kind="stable")
        if op.endswith("min"):
            order = order[::-1]
        assert (np.diff(k[order].astype(np.float64)) >= 0).all(), op
        assert (k[order[1:]] > k[order[:-1]]).sum() >= len(np.unique(as_f)) - 1, op
        if dt in A.FLOATS:
            assert k[values == 0].min() == k[values == 0].max(), "-0 and +0 tie"
            nan = R.arg_keys(np.array([np.nan, -np.nan]).astype(dt), op)
            full = np.iinfo(k.dtype).max
            assert (nan == (0 if op.startswith("nan") else full)).all()
            assert 0 < k.min() and k.max() < full


def test_nan_rules():
    x = np.array([1.0, np.nan, 3.0, np.nan], np.float32)
    assert R.argmax_emulated(x) == 1 and R.argmin_emulated(x) == 1
    assert R.nanargmax_emulated(x) == 2 and R.nanargmin_emulated(x) == 0
    with pytest.raises(ValueError, match="All-NaN"):
        R.nanargmax_emulated(np.full((2, 3), np.nan, np.float32), axis=0)
    assert list(R.nanargmin_emulated(np.array([[np.nan, 1], [np.nan, 2]], np.float32), axis=1)) == [1, 1]


# ---------------------------------------------------------------------------------------------------------
# Planning (pure).


@pytest.mark.parametrize("n", [1, 63, 64, 65, 8191, 1 << 20, (1 << 28) + 3, (1 << 31) + 5, 5 << 30])
@pytest.mark.parametrize("sm", [1, 108, 132])
def test_spans_cover_the_row(n, sm):
    for knobs in (A.DEFAULT_KNOBS, A.Knobs(1, 64), A.Knobs(16, 1 << 20)):
        p = A.plan((n,), None, sm_count=sm, knobs=knobs)
        assert p.kernel == "span" and p.rows == 1 and p.n == n and not p.copy
        assert p.span % A.SPAN_ALIGN == 0 and p.span <= A.MAX_SPAN
        assert (p.spans - 1) * p.span < n <= p.spans * p.span
        assert p.spans == math.ceil(n / A.MAX_SPAN) and 1 <= p.ways <= A.MAX_WAYS
        assert p.grid == p.spans * p.ways
        assert p.grid < max(sm * knobs.blocks_per_sm, 1) + p.spans
        assert p.grid == 1 or p.grid <= math.ceil(n / knobs.min_span) + p.spans


def test_rows_and_columns():
    rows = A.plan((4096, 1000), 1)
    assert (rows.kernel, rows.rows, rows.n, rows.stride, rows.spans) == ("span", 4096, 1000, 1, 1)
    assert (rows.inner, rows.s1) == (4096, 1000)
    cols = A.plan((1000, 4096), 0)
    assert (cols.kernel, cols.rows, cols.n, cols.stride, cols.s1) == ("cols", 4096, 1000, 4096, 1)
    assert cols.grid == 4096 // A.BLOCK
    few = A.plan((1 << 20, 3), 0)  # three adjacent rows: too few for the column kernel
    assert few.kernel == "span" and few.ways > 1 and few.stride == 3
    short = A.plan((100000, 5), 1)
    assert short.kernel == "cols" and short.stride == 1 and short.s1 == 5
    mid = A.plan((6, 7, 8), 1)
    assert (mid.rows, mid.n, mid.stride, mid.inner, mid.s0, mid.s1) == (48, 7, 8, 8, 56, 1)


def test_layouts_that_are_copied():
    # axis=None over a transposed matrix is not one strided run
    assert A.plan((5, 7), None, strides=(1, 5)).copy
    assert not A.plan((5, 7), None, strides=(-7, -1)).copy
    assert A.plan((5, 7), None, strides=(-7, -1)).stride == -1
    # three kept levels that do not merge
    assert A.plan((3, 4, 5, 6), 1, strides=(1000, 6, 100, 1)).copy
    assert not A.plan((3, 4, 5, 6), 3, strides=(1000, 200, 40, 1)).copy


def _searched(count: int, misaligned: int, vec: int, way: int, ways: int) -> list:
    """The indices of a span that block ``way`` of ``ways`` offers, as search_steps walks them: head and tail
    (block 0 only), then its vectors, for a unit stride and a span start ``misaligned`` elements past a
    16-byte boundary."""
    head = min(vec - misaligned if misaligned else 0, count)
    vectors = (count - head) // vec
    step = A.BLOCK * A.UNROLL
    got = list(range(head)) if way == 0 else []
    for v0 in range(way * step, vectors, ways * step):
        for v in range(v0, min(v0 + step, vectors)):
            got.extend(range(head + v * vec, head + (v + 1) * vec))
    if way == 0:
        got.extend(range(head + vectors * vec, count))
    return got


@pytest.mark.parametrize("count", [1, 7, 4096, 4096 * 3 + 5, 100003])
@pytest.mark.parametrize("vec", [2, 4, 16])
def test_interleaved_blocks_search_every_index_once(count, vec):
    for misaligned in (0, 1, vec - 1):
        for ways in (1, 2, 3, 7):
            seen = sorted(i for w in range(ways) for i in _searched(count, misaligned, vec, w, ways))
            assert seen == list(range(count)), (misaligned, ways)


def test_block_step_matches_the_kernel():
    src = read_source(A.SOURCE)
    assert f"constexpr int ARG_BLOCK = {A.BLOCK};" in src
    assert f"constexpr int ARG_UNROLL = {A.UNROLL};" in src


def test_nothing_to_launch_without_rows():
    p = A.plan((0, 5), 1)
    assert p.kernel is None and p.rows == 0


def test_every_plan_uses_a_listed_instantiation():
    insts = set(A.instantiations())
    shapes = [((1 << 20,), None), ((4096, 1000), 1), ((1000, 4096), 0), ((7, 1), 0), ((100000, 5), 1)]
    for dt in A.DTYPES:
        for shape, axis in shapes:
            assert A.plan(shape, axis).instantiation(dt) in insts
    assert len(insts) == 2 * len(A.DTYPES)


def test_knobs_never_change_the_search_order_but_do_change_the_grid():
    grids = {A.plan((1 << 26,), None, knobs=A.make_knobs({"blocks_per_sm": b, "min_span": s})).grid
             for b in A.SPACE["blocks_per_sm"] for s in A.SPACE["min_span"]}
    assert len(grids) > 1
    with pytest.raises(ValueError, match="blocks_per_sm"):
        A.Knobs(0)
    with pytest.raises(ValueError, match="min_span"):
        A.Knobs(4, 8)


def test_params_match_the_struct():
    assert struct_fields(A.SOURCE, "ArgParams") == A.PARAMS.fields


def test_bytes_moved():
    assert A.bytes_moved((1 << 28,), F32) == (1 << 30) + 8
    assert A.bytes_moved((100, 30), np.float16, 0) == 6000 + 8 * 30
    assert A.bytes_moved((100, 30), np.bool_, -1, keepdims=True) == 3000 + 8 * 100


def test_result_shape():
    assert A.result_shape((3, 4, 5), None, False) == ()
    assert A.result_shape((3, 4, 5), None, True) == (1, 1, 1)
    assert A.result_shape((3, 4, 5), 1, False) == (3, 5)
    assert A.result_shape((3, 4, 5), 1, True) == (3, 1, 5)


# ---------------------------------------------------------------------------------------------------------
# Validation, before any launch (planning with a fake array needs no GPU; every error comes first).


@pytest.mark.parametrize("shape, dtype, axis, err, match", [
    ((4,), np.dtype("datetime64[s]"), None, TypeError, "has dtype"),
    ((4, 5), F32, (0,), TypeError, "axis must be None or an int"),
    ((4, 5), F32, 1.0, TypeError, "axis must be None or an int"),
    ((4, 5), F32, True, TypeError, "axis must be None or an int"),
    ((4, 5), F32, 2, np.exceptions.AxisError, "out of bounds"),
    ((4, 5), F32, -3, np.exceptions.AxisError, "out of bounds"),
    ((0,), F32, None, ValueError, "empty sequence"),
    ((3, 0), F32, 1, ValueError, "empty sequence"),
])
@pytest.mark.parametrize("op", OPS)
def test_bad_input(op, shape, dtype, axis, err, match):
    with pytest.raises(err, match=match):
        A._prepare(op, fake_array(shape, dtype), axis, False, A.DEFAULT_KNOBS, 132)


@pytest.mark.parametrize("dtype", ["int8", np.int16, np.dtype(np.int32), "q", "l"])
def test_index_dtypes_are_cupys_signed_integers(dtype):
    assert A.index_dtype(dtype, (3, 4), 1) == np.dtype(dtype)
    assert A.index_dtype(None, (3, 4), 1) is None
    assert A.index_dtype(dtype, (), None) == np.dtype(dtype)  # a 0-d x: one index, 0


@pytest.mark.parametrize("dtype, shape, axis, err, match", [
    (np.uint8, (3, 4), 1, TypeError, "dtype=uint8 is not an index dtype; use one of int8, int16"),
    (np.float32, (3, 4), None, TypeError, "not an index dtype"),
    (np.bool_, (3, 4), 0, TypeError, "not an index dtype"),
    ("int8", (2, 129), 1, ValueError, "dtype=int8 holds indices up to 127, and axis 1 has 129 elements; use int16"),
    ("int8", (16, 16), None, ValueError, "and x has 256 elements; use int16 or wider"),
    (np.int16, (40000,), 0, ValueError, "up to 32767.*use int32"),
    (np.int32, (2**31 + 1,), None, ValueError, "use int64"),
])
def test_index_dtype_too_narrow_or_not_an_index(dtype, shape, axis, err, match):
    with pytest.raises(err, match=match):
        A.index_dtype(dtype, shape, axis)


def test_the_largest_index_decides_not_the_length():
    assert A.index_dtype(np.int8, (128,), 0) == np.int8  # indices 0..127
    assert A.index_dtype(np.int8, (5, 128, 7), 1) == np.int8


def test_the_call_cache_answers_for_x_on_the_current_device_only(monkeypatch):
    """A cached call holds its stream's workspace on x's device; the key reads the current device's stream (and
    waits for that device on the per-thread stream's first call), so x on another device is planned afresh
    there, as the reductions' cache does."""
    from contextlib import nullcontext
    from types import SimpleNamespace

    from cukern._launch import CallCache

    class Arr:
        def __init__(self, shape=(4,), dtype=F32):
            self.shape, self.strides, self.dtype = shape, (4,) * len(shape), np.dtype(dtype)
            self.data = SimpleNamespace(ptr=0, device_id=1)

    current, planned = [1], []
    stream = SimpleNamespace(ptr=0)
    cuda = SimpleNamespace(get_current_stream=lambda: stream, runtime=SimpleNamespace(getDevice=lambda: current[0]))
    monkeypatch.setattr(A, "_cupy", lambda: SimpleNamespace(ndarray=Arr, cuda=cuda))
    monkeypatch.setattr(A, "_calls", CallCache())
    monkeypatch.setattr(A._check, "as_array", lambda x, name: x)
    monkeypatch.setattr(A, "on_device", lambda device: nullcontext())
    nothing = A._Call(None, False, None, None, False, (), False, None)
    monkeypatch.setattr(A, "_prepare", lambda *args: planned.append(current[0]) or nothing)
    for current[0] in (1, 1, 0, 0):
        A.argmax(Arr())
    assert planned == [1, 0, 0]


# ---------------------------------------------------------------------------------------------------------
# Compilation.


@pytest.mark.nvrtc(A.SOURCE)
@pytest.mark.parametrize("arch", ARCHS)
def test_every_instantiation_compiles_without_spills_and_vectorizes(arch):
    c = compiled(A.SOURCE, arch)
    res = c.resources()
    insts = A.instantiations()
    assert len(c.lowered) == len(insts)
    assert ".local" not in c.ptx
    for inst in insts:
        assert_no_spills(res[c.lowered[inst.expression]], arch, inst.expression)
        if inst.name == "argreduce_span":
            body = c.kernel_ptx(inst)
            assert "ld.global.v4.u32" in body or "ld.global.v2.u64" in body or "ld.global.nc.v4" in body, inst.expression
            assert "atom.global.add.u32" in body, inst.expression


# ---------------------------------------------------------------------------------------------------------
# On a GPU: bits (indices) equal to the emulator, which equals NumPy.


def _check(op, x, xh, axis=None, keepdims=False, **kw):
    got = getattr(A, op)(x, axis=axis, keepdims=keepdims, **kw)
    want = getattr(R, f"{op}_emulated")(xh, axis=axis, keepdims=keepdims)
    assert got.dtype == np.int64 and got.shape == np.shape(want), (op, axis)
    np.testing.assert_array_equal(got.get(), want, err_msg=f"{op} axis={axis}")
    ref = np.asarray(getattr(R, op)(xh, axis=axis, keepdims=keepdims))
    differ = np.asarray(want) != ref
    if differ.any():
        # np.nanargmin / nanargmax put +inf / -inf in place of a NaN, so a NaN before a slice's first +inf
        # (-inf) can be NumPy's answer; cukern skips every NaN: they differ only where NumPy picked a NaN
        assert op.startswith("nan"), (op, axis)
        if axis is None:
            picked = np.asarray(xh).reshape(-1)[ref]
        else:
            picked = np.take_along_axis(np.asarray(xh), ref if keepdims else np.expand_dims(ref, axis), axis=axis)
            picked = picked if keepdims else np.squeeze(picked, axis)
        picked = np.asarray(picked)
        assert np.isnan(picked if picked.dtype.kind == "c" else picked.astype(np.float64))[differ].all(), (op, axis)
    return got


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", A.DTYPES, ids=dtype_name)
def test_every_dtype_axis_and_op(dtype, rng):
    import cupy

    for shape in [(1,), (111,), (7, 989), (989, 7), (3, 5, 67)]:
        xh = _special(rng, shape, dtype)
        if np.dtype(dtype) in A.INEXACT:
            for a in range(xh.ndim):  # no all-NaN slice along any axis: each holds a 2 last
                np.moveaxis(xh, a, 0)[-1] = 2
        x = cupy.asarray(xh)
        for op in OPS:
            for axis in [None] + list(range(-len(shape), len(shape))):
                _check(op, x, xh, axis)
            _check(op, x, xh, len(shape) - 1, keepdims=True)
            _check(op, x, xh, None, keepdims=True)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64, BFLOAT16, np.int8, np.uint64], ids=dtype_name)
def test_long_rows_split_into_spans_and_every_knob_agrees(dtype, rng):
    """Rows cut into many spans, ties and NaNs (first, middle, last) placed across span boundaries; every
    knob and SM count gives the emulator's index."""
    import cupy

    n = (1 << 20) + 37
    xh = _special(rng, (n,), dtype)
    if np.dtype(dtype) in A.FLOATS:
        xh[np.isnan(xh.astype(np.float64))] = 0
    for where in (None, 0, n // 2, n - 1):
        yh = xh.copy()
        if where is not None and np.dtype(dtype) in A.FLOATS:
            yh[where] = np.nan
        y = cupy.asarray(yh)
        for op in OPS:
            want = getattr(R, f"{op}_emulated")(yh)
            for knobs in (A.DEFAULT_KNOBS, A.Knobs(1, 64), A.Knobs(12, 4096)):
                for sm in (None, 3, 132):
                    got = A._run(op, y, None, False, None, knobs=knobs, sm=sm)
                    assert int(got) == int(want), (op, where, knobs, sm)
    rows = cupy.asarray(_special(rng, (3, 300001), dtype))
    rh = rows.get()
    if np.dtype(dtype) in A.FLOATS:
        rh[:, ::7] = 1
        rows = cupy.asarray(rh)
    for op in OPS:
        _check(op, rows, rh, 1)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int16, np.bool_], ids=dtype_name)
def test_strided_misaligned_and_negative_views(dtype, rng):
    import cupy

    base_h = _special(rng, (64, 301), dtype)
    if np.dtype(dtype) in A.FLOATS:
        base_h[::3, ::3] = 1
        base_h[:, 0] = 1
        base_h[0, :] = 1
    base = cupy.asarray(base_h)
    views = [(lambda a: a[1:, 1:]), (lambda a: a[::-1, ::-2]), (lambda a: a.T), (lambda a: a[:, 5:300:3]),
             (lambda a: a[::2]), (lambda a: a.reshape(64, 7, 43)[:, ::2, 1:].transpose(2, 0, 1))]
    for view in views:
        x, xh = view(base), view(base_h)
        for op in OPS:
            for axis in [None] + list(range(x.ndim)):
                _check(op, x, xh, axis)
    flat = base.reshape(-1)[1:]  # 16-byte misaligned, then a head of elements before the vectors
    for op in OPS:
        _check(op, flat, base_h.reshape(-1)[1:])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float16, BFLOAT16, np.float64], ids=dtype_name)
def test_nan_placement_and_all_nan_slices(dtype):
    import cupy

    for n in (1, 5, 4099, 100003):
        for where in sorted({0, n // 2, n - 1}):
            xh = np.linspace(-3, 3, n).astype(dtype)
            xh[where] = np.nan
            x = cupy.asarray(xh)
            assert int(A.argmax(x)) == where and int(A.argmin(x)) == where
            if n > 1:
                assert int(A.nanargmax(x)) == int(np.nanargmax(xh.astype(np.float64)))
                assert int(A.nanargmin(x)) == int(np.nanargmin(xh.astype(np.float64)))
    all_nan = cupy.full((3, 4097), np.nan, dtype)
    for op in ("nanargmax", "nanargmin"):
        with pytest.raises(ValueError, match="All-NaN slice encountered"):
            getattr(A, op)(all_nan)
        with pytest.raises(ValueError, match="All-NaN slice encountered"):
            getattr(A, op)(all_nan, axis=0)
        one_row = all_nan.copy()
        one_row[:, 7] = 1
        assert (getattr(A, op)(one_row, axis=1).get() == 7).all()  # the flag was cleared by the raise
    assert (A.argmax(all_nan, axis=1).get() == 0).all()


@pytest.mark.gpu
def test_ints_and_bool_never_check_for_nan():
    import cupy

    x = cupy.asarray(np.array([[3, 3, 1], [0, 5, 5]], np.int32))
    assert list(A.nanargmax(x, axis=1).get()) == [0, 1] and list(A.nanargmin(x, axis=1).get()) == [2, 0]
    b = cupy.asarray(np.array([False, False, True, True]))
    assert int(A.argmax(b)) == 2 and int(A.argmin(b)) == 0 and int(A.argmax(~b)) == 0


@pytest.mark.gpu
def test_empty_and_zero_rows():
    import cupy

    for op in OPS:
        with pytest.raises(ValueError, match="empty sequence"):
            getattr(A, op)(cupy.zeros((0,), np.float32))
        with pytest.raises(ValueError, match="empty sequence"):
            getattr(A, op)(cupy.zeros((4, 0), np.float32), axis=1)
        r = getattr(A, op)(cupy.zeros((0, 5), np.float32), axis=1)
        assert r.shape == (0,) and r.dtype == np.int64
        assert int(getattr(A, op)(cupy.asarray(np.float32(2.5)))) == 0
        assert int(getattr(A, op)(cupy.asarray(np.float32(2.5)), axis=-1)) == 0


@pytest.mark.gpu
def test_out_is_written_and_checked(rng):
    import cupy

    xh = _special(rng, (37, 129), np.float32)
    xh[:, 0] = 1
    x = cupy.asarray(xh)
    want = R.nanargmax_emulated(xh, axis=1)
    out = cupy.full(37, -7, np.int64)  # poisoned
    assert A.nanargmax(x, axis=1, out=out) is out
    np.testing.assert_array_equal(out.get(), want)
    strided = cupy.full((37, 2), -7, np.int64)
    A.nanargmax(x, axis=1, out=strided[:, 1])
    np.testing.assert_array_equal(strided[:, 1].get(), want)
    assert (strided[:, 0] == -7).all()
    kept = cupy.full((37, 1), -7, np.int64)
    A.nanargmax(x, axis=1, keepdims=True, out=kept)
    np.testing.assert_array_equal(kept.get()[:, 0], want)
    # another type int64 holds takes the indices (up to 128) cast, as NumPy's: int8 wraps, bool is nonzero
    top = R.argmax_emulated(xh, axis=1)
    for t in (np.int32, np.int16, np.uint8, np.int8, np.bool_):
        cast = cupy.full(37, 7, t)
        assert A.argmax(x, axis=1, out=cast) is cast
        np.testing.assert_array_equal(cast.get(), top.astype(t), err_msg=str(t))
        np.argmax(xh, axis=1, out=np.empty(37, t))  # NumPy takes it too
    stepped = cupy.full(74, 7, np.int32)
    A.argmax(x, axis=1, out=stepped[::2])
    np.testing.assert_array_equal(stepped[::2].get(), top)
    assert (stepped[1::2] == 7).all()
    before = x.copy()
    for bad, err, match in [(cupy.empty(36, np.int64), ValueError, "shape"),
                            (cupy.empty(37, np.float64), TypeError, "int64"),
                            (cupy.empty(37, np.uint64), TypeError, "int64"),
                            (cupy.empty(37, np.complex64), TypeError, "int64"),
                            (cupy.empty(36, np.int32), ValueError, "shape"),
                            (cupy.empty((37, 1), np.int64), ValueError, "shape"),
                            (np.empty(37, np.int64), TypeError, "numpy.ndarray"),
                            (cupy.broadcast_to(cupy.zeros(1, np.int64), (37,)), ValueError, "zero stride")]:
        with pytest.raises(err, match=match):
            A.argmax(x, axis=1, out=bad)
    with pytest.raises(ValueError, match="overlaps"):
        A.argmax(x, axis=1, out=x.reshape(-1)[:74].view(np.int64))
    assert same_bits(x, before)  # x holds NaNs, which == never matches


@pytest.mark.gpu
def test_bad_input_raises_before_launch():
    import cupy

    x = cupy.arange(12, dtype=np.float32).reshape(3, 4)
    for args, err, match in [((np.zeros(3, np.float32),), TypeError, "numpy.ndarray"),
                             ((x, (0, 1)), TypeError, "axis"), ((x, 2), np.exceptions.AxisError, "out of bounds")]:
        with pytest.raises(err, match=match):
            A.argmax(*args)
    with pytest.raises(TypeError, match="keepdims"):
        A.argmax(x, keepdims="yes")


@pytest.mark.gpu
def test_more_than_2_31_elements():
    import cupy

    n = (1 << 31) + 9
    x = cupy.zeros(n, np.uint8)
    x[n - 3] = 7
    x[(1 << 31) + 1] = 7
    assert int(A.argmax(x)) == (1 << 31) + 1
    assert int(A.argmin(x)) == 0
    x[:] = 1
    x[n - 1] = 0
    assert int(A.argmin(x)) == n - 1


@pytest.mark.gpu
def test_large_float32_matches_cupy_and_reruns_agree():
    import cupy

    x = cupy.random.default_rng(1).standard_normal(1 << 26, dtype=np.float32)
    for op, peer in (("argmax", cupy.argmax), ("argmin", cupy.argmin)):
        first = int(getattr(A, op)(x))
        assert first == int(peer(x))
        assert all(int(getattr(A, op)(x)) == first for _ in range(3))


@pytest.mark.gpu
def test_capture_refuses_a_temporary_and_replays_the_rest(rng):
    """A copied layout or a strided out would go through a temporary that a graph's replays keep writing after
    the pool hands it out again: under capture those raise RuntimeError before anything is recorded or
    allocated. A call that writes straight into its result replays the eager answer and writes nothing else."""
    import cupy

    from _support import refused_in_capture, replayed_alone

    x = cupy.asarray(rng.standard_normal((300, 1000)).astype(np.float32))
    strided_out = cupy.empty(2000, np.int64)[::2]
    narrow_out = cupy.empty(300, np.int32)
    cases = {"copied layout": lambda: A.argmax(x.T),
             "strided out": lambda: A.argmin(x, axis=0, out=strided_out),
             "int32 out": lambda: A.argmax(x, axis=1, out=narrow_out)}
    stream = cupy.cuda.Stream(non_blocking=True)
    for call in cases.values():
        with stream:
            call()  # eager: works, through a temporary
        refused_in_capture(stream, call)
    out = cupy.full(300, -1, np.int64)

    def refill():
        x[...] = cupy.asarray(rng.standard_normal(x.shape).astype(np.float32))

    got = replayed_alone(stream, lambda: [A.argmax(x), A.argmin(x.T, axis=1), A.argmax(x, axis=1, out=out)], refill)
    xh = x.get()
    assert int(got[0]) == int(np.argmax(xh)) and got[2] is out
    assert np.array_equal(got[1].get(), np.argmin(xh.T, axis=1)) and np.array_equal(out.get(), np.argmax(xh, axis=1))


@pytest.mark.gpu
@pytest.mark.parametrize("op", OPS)
def test_index_dtype_results_and_checks_before_launch(op, rng):
    """``dtype=`` gives the same indices in CuPy's signed integer types, for every axis and keepdims; a
    dtype too narrow or not an index type raises before anything runs, leaving out as it was."""
    import cupy

    xh = rng.standard_normal((7, 130)).astype(np.float32)
    x = cupy.asarray(xh)
    emulated = getattr(R, f"{op}_emulated")
    for axis, t in ((0, np.int8), (None, np.int16), (1, np.int16), (-1, np.int32), (1, np.int64)):
        for keepdims in (False, True):
            got = getattr(A, op)(x, axis, dtype=t, keepdims=keepdims)
            assert got.dtype == t, (axis, t)
            np.testing.assert_array_equal(got.get(), emulated(xh, axis, keepdims).astype(t))
    scalar = getattr(A, op)(cupy.asarray(np.float32(3.0)), dtype=np.int8)
    assert scalar.shape == () and scalar.dtype == np.int8 and int(scalar) == 0
    out = cupy.full(7, -5, np.int16)
    assert getattr(A, op)(x, 1, dtype=np.int16, out=out) is out
    np.testing.assert_array_equal(out.get(), emulated(xh, 1, False))
    out.fill(-5)
    with pytest.raises(ValueError, match="int8 holds indices up to 127, and axis 1 has 130"):
        getattr(A, op)(x, 1, dtype=np.int8)
    with pytest.raises(TypeError, match="not an index dtype"):
        getattr(A, op)(x, 1, dtype=np.uint32)
    with pytest.raises(TypeError, match="dtype=int32 and out's dtype int16 differ"):
        getattr(A, op)(x, 1, dtype=np.int32, out=out)
    assert (out == -5).all()


@pytest.mark.gpu
def test_a_narrow_index_dtype_is_refused_under_capture():
    import cupy

    from _support import refused_in_capture

    x = cupy.arange(12, dtype=np.float32).reshape(3, 4)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        assert A.argmax(x, axis=1, dtype=np.int32).dtype == np.int32
    refused_in_capture(stream, lambda: A.argmax(x, axis=1, dtype=np.int32))
