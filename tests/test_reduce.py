"""Production reductions on the GPU: results against float64 references and bit for bit across reruns,
layouts, views and misalignment, NaN, zero-size views, out, CUDA-graph capture, workspaces, tuned knobs,
validation and 64-bit sizes."""

import gc
import math
import warnings

import numpy as np
import pytest
from _reduce_support import ALL_DTYPES, LAYOUT_CLASSES, OP_NAMES, REFS, ZERO_SIZE_VIEWS, _axis_choices, _data, _elements
from _support import capture, refused_in_capture, victims

from cukern import _tuned, reference
from cukern import reduce as R
from cukern import reduce_plan as P
from cukern._dtypes import BFLOAT16, dtype_name


# ---------------------------------------------------------------------------------------------------------
# GPU.


def _check_result(name, got, x_host, axis, keepdims=False, dtype=None):
    """``got`` against the float64 reference. The bound scales with the sum of magnitudes, not with the
    result (a signed sum may cancel to near zero), hence not the elementwise rule of _support."""
    import cupy

    t = x_host.dtype
    want_dtype = P.result_dtype(name, t, dtype)
    assert got.dtype == want_dtype, (name, got.dtype, want_dtype)
    ref = REFS[name](x_host, axis=axis, keepdims=keepdims)
    g = cupy.asnumpy(got).astype(np.float64 if want_dtype.kind == "f" or want_dtype == BFLOAT16 else np.int64)
    assert g.shape == np.shape(ref)
    axes = P.normalize_axis(axis, x_host.ndim)
    n = max(1, math.prod(x_host.shape[i] for i in axes))
    acc = P.acc_dtype(want_dtype)
    if name in ("amax", "amin") or acc.kind == "i":
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


def _same_bits(a, b) -> bool:
    import cupy

    return a.shape == b.shape and a.dtype == b.dtype and cupy.asnumpy(a).tobytes() == cupy.asnumpy(b).tobytes()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_name)
@pytest.mark.parametrize("n", [1, 31, 1000003])
def test_full_reductions(rng, dtype, n):
    import cupy

    xh = _data(rng, (n,), dtype)
    x = cupy.asarray(xh)
    for name in OP_NAMES:
        if np.dtype(dtype) not in P.OPS[name].inputs:
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
    assert all(_same_bits(a, got) for a in again)
    assert float(R.amax(x)) == float(x.max())


@pytest.mark.gpu
def test_bit_identical_reruns_every_layout(rng):
    import cupy

    x = cupy.asarray(_data(rng, (4097, 1031), np.float32, signed=True))
    for axis in (None, 0, 1):
        for fn in (R.sum, R.norm):
            first = fn(x, axis=axis)
            for _ in range(3):
                assert _same_bits(fn(x, axis=axis), first)


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
def test_size_1_axes_match_the_kernels_bit_for_bit(rng):
    """A reduction over size-1 axes only is elementwise (no kernel); it gives what a kernel gives for the
    same values: squares formed in the accumulator and rounded once, conversions as the kernels store them.
    The kernel side reduces each value with a zero (sums), or with itself (amax, amin)."""
    import cupy

    for dtype in (np.float16, BFLOAT16, np.float32, np.float64, np.int32, np.int64):
        xh = _data(rng, (7, 1, 9), dtype, signed=True)
        x = cupy.asarray(xh)
        with_zero = cupy.asarray(np.concatenate([xh, np.zeros_like(xh)], axis=1))
        with_itself = cupy.asarray(np.concatenate([xh, xh], axis=1))
        for name in ("sum", "mean", "sum_of_squares", "amax", "amin"):
            fn = getattr(R, name)
            minmax = P.OPS[name].minmax
            for dt in [None] if minmax else [None, *P.kernel_dtypes(name, dtype)]:
                got = fn(x, axis=1, dtype=dt)
                if minmax:
                    want = fn(with_itself, axis=1)
                elif name == "mean":  # the kernels' mean would halve: compare with the sum, in mean's dtype
                    want = R.sum(with_zero, axis=1, dtype=got.dtype)
                else:
                    want = fn(with_zero, axis=1, dtype=dt)
                assert _same_bits(got, want), (name, dtype_name(dtype), dt)


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


_NUMPY = {
    "sum": np.sum,
    "mean": np.mean,
    "sum_of_squares": lambda a, **kw: np.sum(a * a, **kw),
    "norm": lambda a, **kw: np.sqrt(np.sum(a * a, **kw)),
    "amax": np.max,
    "amin": np.min,
}


@pytest.mark.gpu
@pytest.mark.parametrize("label", ZERO_SIZE_VIEWS)
def test_zero_size_views_answer_as_numpy(label):
    """Every zero-size view, any axis, keepdims or not, fresh or into out: NumPy's values (sum 0,
    mean NaN with its "Mean of empty slice." warning), and amax/amin of an empty reduction raise
    ValueError as NumPy does, before anything is written."""
    import cupy

    xh = ZERO_SIZE_VIEWS[label](np.ones((3, 5), np.float32))
    x = ZERO_SIZE_VIEWS[label](cupy.ones((3, 5), np.float32))
    for axis in _axis_choices(xh.ndim):
        for keepdims in (False, True):
            for name in OP_NAMES:
                fn = getattr(R, name)
                with warnings.catch_warnings(record=True) as numpy_warned:
                    warnings.simplefilter("always")
                    try:
                        want = np.asarray(_NUMPY[name](xh, axis=axis, keepdims=keepdims))
                    except ValueError:
                        want = None
                if want is None:
                    with pytest.raises(ValueError, match="zero-size array to reduction operation"):
                        fn(x, axis=axis, keepdims=keepdims)
                    out = cupy.full(P.result_shape(x.shape, P.normalize_axis(axis, x.ndim), keepdims), 7.0,
                                    np.float32)
                    with pytest.raises(ValueError, match="zero-size"):
                        fn(x, axis=axis, keepdims=keepdims, out=out)
                    assert bool((out == 7.0).all())  # untouched
                    continue
                empty_slice = any("Mean of empty slice" in str(w.message) for w in numpy_warned)
                for with_out in (False, True):
                    out = cupy.full(want.shape, 7.0, np.float32) if with_out else None
                    with warnings.catch_warnings(record=True) as ours:
                        warnings.simplefilter("always")
                        got = fn(x, axis=axis, keepdims=keepdims, out=out)
                    assert got.shape == want.shape and got.dtype == np.float32, (label, name, axis, keepdims)
                    assert np.array_equal(cupy.asnumpy(got), want, equal_nan=True), (label, name, axis, keepdims)
                    assert out is None or got is out
                    said = any("Mean of empty slice" in str(w.message) for w in ours)
                    assert said == empty_slice, (label, name, axis, keepdims)


@pytest.mark.gpu
def test_empty_and_out(rng):
    import cupy

    e = cupy.zeros((0,), np.float32)
    assert float(R.sum(e)) == 0.0 and float(R.sum_of_squares(e)) == 0.0 and float(R.norm(e)) == 0.0
    with pytest.warns(RuntimeWarning, match="Mean of empty slice"):
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
def test_cached_calls_match_the_general_path(rng):
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
            second = getattr(R, name)(x, **kw)  # from the call cache
            assert _same_bits(second, first), (name, kw)
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
    P.Knobs(),
    P.Knobs(row_max_tpr=512, row_threads_per_sm=1024, row_waves=32),
    P.Knobs(row_max_tpr=32, row_items=128, row_waves=None),
    P.Knobs(row_max_tpr=128, row_unroll=8, row_threads_per_sm=1024, row_waves=4),
    P.Knobs(full_block=256, full_blocks_per_sm=4, full_unroll=8),
    P.Knobs(full_block=1024, full_blocks_per_sm=1, full_unroll=2),
])
def test_knob_settings_are_correct(rng, knobs):
    import cupy

    xh = _data(rng, (257, 16411), np.float32, signed=True)
    x = cupy.asarray(xh)
    _check_result("sum", R._reduce("sum", x, -1, None, False, None, knobs=knobs), xh, -1)
    _check_result("sum", R._reduce("sum", x, -1, None, False, None, knobs=knobs), xh, -1)  # cached
    _check_result("sum", R._reduce("sum", x, None, None, False, None, knobs=knobs), xh, None)
    f32 = np.dtype(np.float32)
    for axis, view, ref in ((-1, x, xh), (None, x, xh), (-1, x[:, 3:], xh[:, 3:])):
        pl = P.plan(view.shape, view.dtype, axis, strides=_elements(view), ptr=view.data.ptr % 16, knobs=knobs)
        shape = () if axis is None else (view.shape[0],)
        out = cupy.empty(shape, f32)
        R._prepare(pl, view, f32, P.OPS["sum"], pl.layout.count, shape).run(out.data.ptr, view.data.ptr)
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
    assert P.plan(x.shape, x.dtype, 0).fold is not None  # axis=0 here is the two-pass column plan
    for name in ("sum", "norm", "amax"):
        for kw in cases:
            if name == "amax" and "dtype" in kw:
                continue
            want = getattr(R, name)(x, **kw)
            outs = [cupy.full(want.shape, np.nan, want.dtype) for _ in range(3)]
            assert getattr(R, name)(x, **kw, out=outs[0]) is outs[0]  # general path, then cached
            with cupy.cuda.using_allocator(_failing_allocator):  # every plan: no temporary, workspaces made
                assert getattr(R, name)(x, **kw, out=outs[1]) is outs[1]  # cached
                R._calls.clear()
                assert getattr(R, name)(x, **kw, out=outs[2]) is outs[2]  # general path
            for o in outs:
                assert _same_bits(o, want), (name, kw)
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
        R.sum(y, axis=0, out=y[1])  # same description as out: the cached call still checks
    assert float(y.sum()) == 20.0  # nothing was written into x
    assert out.tolist() == [5.0] * 4


@pytest.mark.gpu
def test_out_in_a_cuda_graph(rng):
    import cupy

    from cukern.lab import pipeline

    x = cupy.asarray(_data(rng, (64, 4096), np.float32, signed=True))
    calls = [(name, axis) for name in ("sum", "amax", "norm") for axis in (None, -1, 0)]
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
            assert _same_bits(o, getattr(R, name)(x, axis=axis)), (name, axis)


@pytest.mark.gpu
@pytest.mark.filterwarnings("ignore:Mean of empty slice")
@pytest.mark.parametrize("label", LAYOUT_CLASSES)
def test_captured_reductions_write_only_their_results(rng, label):
    """Every op, fresh and into a C-contiguous out, of each layout class: after one eager call on the
    stream (compilation, plans, workspaces), the capture frees nothing, so arrays allocated after it never
    share memory with what its replays write, and the replays give the eager results."""
    import cupy

    shape, view, axis, kind, _ = LAYOUT_CLASSES[label]
    x = view(cupy.asarray(_data(rng, shape, np.float32, signed=True)))
    names = [n for n in OP_NAMES if not (kind == "fill" and P.OPS[n].minmax)]
    pool = cupy.get_default_memory_pool()
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        want = {n: getattr(R, n)(x, axis=axis) for n in names}
        outs = {n: cupy.full(w.shape, -1, w.dtype) for n, w in want.items()}
        for n in names:
            getattr(R, n)(x, axis=axis, out=outs[n])
        stream.synchronize()
        gc.collect()
        pool.free_all_blocks()
        graph, results, freed = capture(stream, lambda: ([getattr(R, n)(x, axis=axis) for n in names]
                                                          + [getattr(R, n)(x, axis=axis, out=outs[n]) for n in names]))
        later = victims(pool)
        for v in later:
            v.fill(0x5A)
        for o in outs.values():
            o.fill(-1)
        for _ in range(2):
            graph.launch(stream)
        stream.synchronize()
    assert not freed, f"{label}: the capture freed blocks of {freed} bytes that its replays may still write"
    assert all(bool((v == 0x5A).all()) for v in later), f"{label}: a replay wrote into a later allocation"
    for n, got in zip(names + names, results):
        assert _same_bits(got, want[n]), (label, n)
    assert all(r is outs[n] for n, r in zip(names, results[len(names):]))


@pytest.mark.gpu
def test_capture_refuses_a_temporary_before_recording_anything(rng):
    """Calls that go through a temporary work eagerly; under capture they raise RuntimeError before
    anything is recorded or allocated."""
    import cupy

    deep = cupy.asarray(_data(rng, (6, 7, 8, 9, 10), np.float32, signed=True))
    y = cupy.asarray(_data(rng, (33, 1031), np.float32, signed=True))
    strided_out = cupy.empty(2 * 1031, np.float32)[::2]
    deep_out = cupy.empty((6, 8, 10), np.float32)
    wide_out = cupy.empty(33, np.float64)
    assert P.plan(deep.shape, deep.dtype, (1, 3)).copy
    cases = {
        "copied layout": lambda: R.sum(deep, axis=(1, 3)),
        "copied layout into out": lambda: R.norm(deep, axis=(1, 3), out=deep_out),
        "strided out": lambda: R.sum(y, axis=0, out=strided_out),
        "amax converting": lambda: R.amax(y, axis=1, dtype=np.float64),
        "amin converting into out": lambda: R.amin(y, axis=1, dtype=np.float64, out=wide_out),
    }
    for label, call in cases.items():
        stream = cupy.cuda.Stream(non_blocking=True)
        with stream:
            call()  # eager: works, through a temporary
        refused_in_capture(stream, call)


@pytest.mark.gpu
def test_capture_refuses_to_make_or_grow_a_workspace(rng, monkeypatch):
    """A full or two-pass column reduction needs the stream's workspace, made and grown by eager calls; a
    capture that would have to make or grow it is refused, and works once an eager call has done that."""
    import cupy

    from cukern._launch import CallCache

    # Workspaces and the cached calls that point into them, for this test only (a stream made here may
    # reuse the address of one an earlier test made a workspace for).
    monkeypatch.setattr(R, "_workspaces", {})
    monkeypatch.setattr(R, "_calls", CallCache(4096))
    small = cupy.asarray(_data(rng, (4096, 64), np.float32))
    big = cupy.asarray(_data(rng, (4096, 256), np.float32))
    sm = cupy.cuda.Device().attributes["MultiProcessorCount"]
    need_small = P.plan(small.shape, small.dtype, 0, sm_count=sm).partials
    need_big = P.plan(big.shape, big.dtype, 0, sm_count=sm).partials
    assert 0 < 2 * need_small < need_big  # the small one's scratch, even doubled, is too small for the big one
    for a in (small, big):  # compiled on the default stream
        R.sum(a)
        R.sum(a, axis=0)
    stream = cupy.cuda.Stream(non_blocking=True)
    refused_in_capture(stream, lambda: R.sum(small), "before capturing")  # no workspace on this stream yet
    refused_in_capture(stream, lambda: R.sum(small, axis=0), "before capturing")
    with stream:
        R.sum(small, axis=0)  # eager: makes the workspace, with scratch for the small partials
    refused_in_capture(stream, lambda: R.sum(big, axis=0), "before capturing")  # would grow it
    pool = cupy.get_default_memory_pool()
    with stream:
        R.sum(big, axis=0)  # eager: grows it
        want = [R.sum(small, axis=0), R.sum(big, axis=0), R.sum(small)]
        stream.synchronize()
        gc.collect()
        pool.free_all_blocks()
        graph, got, freed = capture(stream, lambda: [R.sum(small, axis=0), R.sum(big, axis=0), R.sum(small)])
        later = victims(pool)
        for v in later:
            v.fill(0x5A)
        graph.launch(stream)
        stream.synchronize()
    assert not freed
    assert all(bool((v == 0x5A).all()) for v in later)
    assert all(_same_bits(g, w) for g, w in zip(got, want))


@pytest.mark.gpu
def test_every_stream_keeps_its_own_workspace(rng):
    import cupy

    xh = _data(rng, (1 << 20,), np.float32)
    x = cupy.asarray(xh)
    cupy.cuda.Device().synchronize()
    streams = [cupy.cuda.Stream(non_blocking=True) for _ in range(6)]
    got, kept = [], {}
    for _ in range(3):  # interleaved: kernels of several streams in flight at once
        for s in streams:
            with s:
                got.append(R.sum(x))
                R._calls.clear()  # the general path, so each call asks for its stream's workspace
                got.append(R.sum(x))
                ws = R.workspace()
            assert kept.setdefault(s.ptr, ws) is ws  # made once per stream, never replaced
    for s in streams:
        s.synchronize()
    assert all(_same_bits(g, got[0]) for g in got)  # bit-identical on every stream
    _check_result("sum", got[0], xh, None)


@pytest.mark.gpu
def test_tuned_knobs_are_used(rng, monkeypatch):
    import cupy

    tuned = {"sum": P.Knobs(full_block=256, full_blocks_per_sm=4, full_unroll=8),
             "sum_rows": P.Knobs(row_max_tpr=128, row_unroll=2, row_waves=4)}
    seen = []

    def lookup(rule, device_id, dtype, shape):
        seen.append((rule.op, shape))
        return tuned.get(rule.op, rule.default)

    xh = _data(rng, (33, 4099), np.float32, signed=True)
    x = cupy.asarray(xh)
    R._calls.clear()
    monkeypatch.setattr(_tuned, "lookup", lookup)
    for _ in range(2):  # general path, then cached
        _check_result("sum", R.sum(x), xh, None)
        _check_result("sum", R.sum(x, axis=-1), xh, -1)
        _check_result("sum", R.sum(x, axis=1, out=cupy.empty(33, np.float32)), xh, 1)
    assert ("sum", (x.size,)) in seen and ("sum_rows", (33, 4099)) in seen
    monkeypatch.setattr(_tuned, "lookup", lambda rule, *a: rule.default)  # untuned: the defaults
    _check_result("sum", R.sum(x), xh, None)
    _check_result("sum", R.sum(x, axis=-1), xh, -1)


@pytest.mark.gpu
def test_bad_input_raises_before_launch():
    import cupy

    x = cupy.ones((4, 5), np.float32)
    with pytest.raises(TypeError, match="not supported"):
        R.sum_of_squares(cupy.ones(3, np.complex64))
    with pytest.raises(TypeError, match="return_sign must be True or False"):
        R.logsumexp(x, return_sign=None)
    with pytest.raises(np.exceptions.AxisError):
        R.sum(x, axis=2)
    with pytest.raises(ValueError, match="shape"):
        R.sum(x, axis=0, out=cupy.empty(4, np.float32))
    with pytest.raises(TypeError, match="dtype=int32 is not supported"):
        R.norm(x, axis=0, dtype=np.int32)
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
        assert not P.plan(two.shape, two.dtype, 1).kernel.index32
        got = R.sum(two, axis=1, dtype=np.float64)
        assert float(got[0]) == float(got[1]) == 0.5 * 2**30
        del two
        del x, rows, got


@pytest.mark.gpu
def test_columns_past_one_launch():
    """2^31 matrices of 2 x 2 (a column grid past 2^31 - 1 blocks: the strided kernel) and columns of
    2^34 + 2^20 rows (129 spans of 2^19 leaves, past COL_MAX_SPANS, folded by reduce_cols_fold)."""
    import cupy

    free, _ = cupy.cuda.runtime.memGetInfo()
    if free < 30 * 2**30:  # x 16 GiB, its sums 8 GiB, their test against 1 4 GiB
        pytest.skip("needs 30 GiB of free GPU memory")
    x = cupy.empty((2**31, 2, 2), np.float16)
    x.view(np.uint16).fill(int(np.array(0.5, np.float16).view(np.uint16)))
    x[-1, :, 1] = 3
    assert P.plan(x.shape, x.dtype, 1).layout.kind == "strided"
    got = R.sum(x, axis=1)
    assert float(got[-1, 1]) == 6.0 and float(got[-1, 0]) == float(got[0, 0]) == 1.0
    assert int(cupy.count_nonzero(got == 1)) == 2**32 - 1
    del x, got
    cupy.get_default_memory_pool().free_all_blocks()
    if free < 36 * 2**30:
        pytest.skip("columns of 2^34 + 2^20 rows need 36 GiB of free GPU memory")
    b = cupy.zeros((2**34 + 2**20, 2), np.bool_)
    b[::2**20, 0] = True
    b[-1, 1] = True
    assert P.plan(b.shape, b.dtype, 0).kernel.spans > P.COL_MAX_SPANS
    assert R.sum(b, axis=0).tolist() == [2**14 + 1, 1]
    del b
    cupy.get_default_memory_pool().free_all_blocks()
