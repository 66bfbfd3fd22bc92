"""NumPy semantics of the reductions: NumPy's input dtypes, result dtypes, ``dtype=`` targets,
``out=`` casting and the K memory order of results, all without new kernels (cukern.reduce_plan.route)."""

import warnings

import numpy as np
import pytest

from cukern import argreduce as A
from cukern import reduce as R
from cukern import reduce_plan as P
from cukern._dtypes import BFLOAT16, dtype_name
from cukern._layout import k_order

_NP = {
    "sum": np.sum, "mean": np.mean, "prod": np.prod, "amax": np.max, "amin": np.min, "nansum": np.nansum,
    "var": np.var, "std": np.std, "nanmax": np.nanmax, "nanmin": np.nanmin, "nanmean": np.nanmean,
    "sum_of_squares": lambda x, axis=None, dtype=None: np.sum(
        x.astype(np.uint64 if x.dtype.kind == "u" else np.int64) ** 2, axis=axis, dtype=dtype)
    if x.dtype.kind in "biu" else np.sum(np.square(x.astype(dtype or x.dtype)), axis=axis, dtype=dtype),
    "norm": lambda x, dtype=None: np.linalg.norm(x),
    "count_nonzero": lambda x, dtype=None: np.int64(np.count_nonzero(x)),
}
_OPS = ("sum", "mean", "prod", "amax", "amin", "nansum", "var", "std", "norm", "nanmax", "nanmin",
        "count_nonzero", "sum_of_squares")
_NO_DTYPE_IN_NUMPY = ("norm", "amax", "amin", "nanmax", "nanmin", "count_nonzero")
_NUMPY_DTYPES = [t for t in P.NUMERIC if t != BFLOAT16]


def _numpy_dtype(op, t, r=None):
    x = np.ones(3, t)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return np.asarray(_NP[op](x) if r is None else _NP[op](x, dtype=r)).dtype


# ---------------------------------------------------------------------------------------------------------
# Dtype tables (CPU).


@pytest.mark.parametrize("op", _OPS)
def test_result_dtypes_are_numpys(op):
    for t in _NUMPY_DTYPES:
        if t in P.public_inputs(op):
            assert P.result_dtype(op, t) == _numpy_dtype(op, t), (op, t)
            for r in P.targets(op, t):
                if r == BFLOAT16 or op in _NO_DTYPE_IN_NUMPY:
                    continue
                assert P.result_dtype(op, t, r) == _numpy_dtype(op, t, r), (op, t, r)
        else:
            with pytest.raises(TypeError, match=dtype_name(t)):
                P.check_input(op, t)


def test_new_inputs_and_targets():
    for op in ("sum", "mean", "prod", "sum_of_squares", "amax", "amin", "norm", "nansum", "count_nonzero"):
        for t in ("int8", "int16", "uint8", "uint16", "uint32", "uint64"):
            assert np.dtype(t) in P.public_inputs(op), (op, t)
    for op in ("amax", "amin", "norm"):
        assert P.BOOL in P.public_inputs(op)
    for op in ("sum", "mean", "norm", "prod", "amax", "amin", "nanmax", "nanmin", "var", "std", "nansum", "nanmean",
               "count_nonzero"):
        assert set(P.COMPLEX) <= set(P.public_inputs(op))
    assert P.result_dtype("mean", np.int32, np.int64) == np.int64
    assert P.result_dtype("sum", np.int32, np.bool_) == np.bool_
    assert P.result_dtype("sum", np.float32, np.complex64) == np.complex64
    assert P.result_dtype("sum", np.float32, np.float16) == np.float16
    assert P.result_dtype("norm", np.complex64) == np.float32
    assert P.result_dtype("prod", np.float32, np.complex64) == np.complex64
    with pytest.raises(TypeError, match="dtype=float32 is not supported for prod of complex64"):
        P.result_dtype("prod", np.complex64, np.float32)
    with pytest.raises(TypeError, match="dtype=float32 is not supported for sum of complex64"):
        P.result_dtype("sum", np.complex64, np.float32)
    assert P.result_dtype("nansum", np.float32, np.bool_) == np.bool_
    assert P.result_dtype("var", np.complex64) == np.float32
    with pytest.raises(TypeError, match="dtype=float64 is not supported for var of complex64"):
        P.result_dtype("var", np.complex64, np.float64)  # NumPy's would drop the mean's imaginary parts
    with pytest.raises(TypeError):
        P.result_dtype("count_nonzero", np.int32, np.int64)


def test_routes_use_only_existing_kernels():
    """Every route runs the kernels on one of their own (input, result) dtype pairs: no new instantiation."""
    combos = {(t, o, op) for t, o, op in P.kernel_combos()}
    seen = 0
    for name in _OPS:
        for t in P.public_inputs(name):
            for final in {P.result_dtype(name, t), *P.targets(name, t)}:
                rt = P.route(name, t, final)
                if rt.how == "gather":  # complex maxima: the arg-reduction kernels' index, gathered
                    assert t in A.COMPLEX and rt.via == t and name in P.MINMAX_OPS, (name, t, final, rt)
                    continue
                assert rt.via in P.OPS[rt.op].inputs, (name, t, final, rt)
                kernel = rt.via if rt.op in P.MINMAX_OPS else rt.kernel
                assert (rt.via, kernel, P.OPS[rt.op].kernel_op) in combos, (name, t, final, rt)
                seen += 1
    assert seen > 1000
    assert len(P.instantiations()) <= 800


def test_route_choices():
    R_ = P.route
    assert R_("sum", np.uint64, np.uint64) == P.Route("sum", "view", P.I64, P.I64)
    assert R_("amax", np.uint64, np.uint64).how == "flip"
    assert R_("mean", np.uint64, np.float64) == P.Route("mean", "cast", P.F64, P.F64)
    assert R_("sum", np.int8, np.int64) == P.Route("sum", "cast", P.I32, P.I64)
    assert R_("sum", np.uint32, np.uint64) == P.Route("sum", "cast", P.I64, P.I64)
    assert R_("amax", np.bool_, np.bool_) == P.Route("amax", "cast", P.I32, P.I32)
    assert R_("sum", np.complex64, np.complex64) == P.Route("sum", "complex", P.F32, P.F32)
    assert R_("sum", np.complex64, np.complex128).kernel == P.F64
    assert R_("amax", np.complex64, np.complex64) == P.Route("amax", "gather", P.C64, P.C64)
    assert R_("nanmin", np.complex128, np.float64) == P.Route("nanmin", "gather", P.C128, P.C128)
    assert R_("sum", np.float32, np.bool_).op == "count_nonzero"
    assert R_("mean", np.int32, np.int64).mean_int
    assert R_("sum", np.float64, np.int32) == P.Route("sum", "cast", P.I64, P.I64)  # NumPy truncates first
    assert R_("prod", np.int32, np.float64) == P.Route("prod", "cast", P.F64, P.F64)
    # a complex product mixes the parts: its own kernels, x converted to a complex target of another dtype
    assert R_("prod", np.complex64, np.complex64) == P.Route("prod", "direct", P.C64, P.C64)
    assert R_("prod", np.complex64, np.complex128) == P.Route("prod", "cast", P.C128, P.C128)
    assert R_("prod", np.int16, np.complex64) == P.Route("prod", "cast", P.C64, P.C64)
    assert P.kernels_answer("prod", np.complex128, np.complex128)
    assert R_("sum", np.float32, np.float16) == P.Route("sum", "direct", P.F32, P.F32)  # then rounded
    # complex var and std: the parts' variances (std's square root after they are added); counts of x != 0
    assert R_("std", np.complex64, np.float32) == P.Route("var", "complex", P.F32, P.F32)
    assert R_("var", np.complex128, np.float64) == P.Route("var", "complex", P.F64, P.F64)
    assert R_("count_nonzero", np.complex64, np.int64) == P.Route("count_nonzero", "cast", P.BOOL, P.COUNT)
    assert R_("any", np.complex64, np.bool_) == P.Route("any", "cast", P.BOOL, P.BOOL)
    assert R_("all", np.float32, np.bool_) == P.Route("all", "direct", P.F32, P.BOOL)
    assert R_("nansum", np.complex64, np.complex128) == P.Route("nansum", "complex", P.F32, P.F64)
    assert R_("nansum", np.float32, np.bool_).op == "count_nonzero"
    assert R_("nansum", np.float32, np.complex64) == P.Route("nansum", "direct", P.F32, P.F32)  # then widened
    assert P.kernels_answer("sum", np.float32, np.float64) and not P.kernels_answer("sum", np.int8, np.int64)


@pytest.mark.parametrize("final, out", [(np.float64, np.int64), (np.complex64, np.float32),
                                        (np.int64, np.bool_), (np.float32, np.float16)])
def test_out_casting_follows_numpy(final, out):
    """NumPy's (and CuPy's) reductions cast into ``out`` unsafely; a complex result into a real ``out`` warns."""
    x = np.ones((2, 3), final)
    o = np.empty(2, out)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        np.sum(x, axis=1, out=o)
    numpy_warns = any(issubclass(i.category, np.exceptions.ComplexWarning) for i in w)
    assert (P.out_cast(final, out) == "ComplexWarning") == numpy_warns


# ---------------------------------------------------------------------------------------------------------
# K order (CPU): the planned result strides are NumPy's.


def test_k_order_strides_are_numpys(rng):
    for _ in range(400):
        nd = int(rng.integers(1, 5))
        shape = tuple(int(v) for v in rng.integers(1, 5, nd))
        a = np.zeros(shape, np.float32)
        perm = rng.permutation(nd)
        a = np.ascontiguousarray(a.transpose(perm)).transpose(np.argsort(perm))
        a = a[tuple(slice(None, None, -1) if rng.random() < 0.3 else slice(None) for _ in range(nd))]
        axes = tuple(sorted(rng.choice(nd, int(rng.integers(0, nd + 1)), replace=False).tolist()))
        for keepdims in (False, True):
            want = np.sum(a, axis=axes, keepdims=keepdims)
            got = P.k_strides(a.shape, [s // 4 for s in a.strides], axes, 4, keepdims)
            big = [i for i, n in enumerate(want.shape) if n > 1]
            assert [got[i] for i in big] == [want.strides[i] for i in big], (a.shape, a.strides, axes, keepdims)


def test_k_order_is_none_for_c_order_and_idempotent():
    assert k_order((3, 4, 5), (20, 5, 1), (1,)) is None
    perm = k_order((3, 4, 5), (1, 3, 12), (0,))
    assert perm == (2, 1, 0)
    shape = tuple((3, 4, 5)[i] for i in perm)
    strides = tuple((1, 3, 12)[i] for i in perm)
    assert k_order(shape, strides, (2,)) is None


# ---------------------------------------------------------------------------------------------------------
# GPU: values against NumPy.

_SHAPE = (5, 7, 3)


def _data(rng, dtype, shape=_SHAPE):
    t = np.dtype(dtype)
    if t == np.bool_:
        return rng.random(shape) < 0.5
    if t.kind in "iu":
        info = np.iinfo(t)
        lo, hi = (max(info.min, -100), min(info.max, 100)) if t.itemsize <= 2 else (info.min // 4, info.max // 4)
        return rng.integers(lo, hi, size=shape, dtype=t, endpoint=True)
    if t.kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(t)
    return rng.standard_normal(shape).astype(t)


def _check(got, want, exact):
    got = got.get()
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, want.dtype, got.shape, want.shape)
    if exact:
        assert np.array_equal(got, want)
    else:
        # the data are standard normal and the slices short: an absolute term covers sums that cancel
        single = want.dtype in (np.float32, np.complex64)
        np.testing.assert_allclose(got, want, rtol=1e-5 if single else 1e-12, atol=1e-5 if single else 1e-12)


_NEW = ("int8", "int16", "uint8", "uint16", "uint32", "uint64", "bool", "complex64", "complex128")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", _NEW)
def test_new_input_dtypes_against_numpy(rng, dtype):
    import cupy as cp

    import cukern

    h = _data(rng, dtype)
    d = cp.asarray(h)
    for name in ("sum", "mean", "prod", "sum_of_squares", "amax", "amin", "norm", "nansum", "count_nonzero"):
        if np.dtype(dtype) not in P.public_inputs(name):
            with pytest.raises(TypeError):
                getattr(cukern, name)(d)
            continue
        for axis in (None, 1, (0, 2)):
            if name == "norm":
                want = np.sqrt(np.sum(np.abs(h.astype(np.complex128 if h.dtype.kind == "c" else np.float64)) ** 2,
                                      axis=axis)).astype(P.result_dtype("norm", h.dtype))
            elif name == "sum_of_squares":
                w = h.astype(np.int64 if h.dtype.kind in "bi" else np.uint64) if h.dtype.kind in "biu" else h
                want = np.sum(w * w, axis=axis)
            elif name == "count_nonzero":
                want = np.asarray(np.count_nonzero(h, axis=axis), dtype=np.int64)
            else:
                want = _NP[name](h, axis=axis)
            got = getattr(cukern, name)(d, axis=axis)
            _check(got, np.asarray(want), exact=np.dtype(want.dtype).kind in "biu")
            kept = getattr(cukern, name)(d, axis=axis, keepdims=True)  # the shape NumPy keeps, every route
            assert kept.shape == np.expand_dims(np.asarray(want), () if axis is None else axis).shape or (
                axis is None and kept.shape == (1,) * h.ndim), (name, axis, kept.shape)


@pytest.mark.gpu
def test_dtype_targets_against_numpy(rng):
    import cupy as cp

    import cukern

    cases = [("sum", "int32", "int8"), ("sum", "float64", "int32"), ("sum", "int32", "bool"), ("sum", "float32", "bool"),
             ("sum", "float32", "complex64"), ("sum", "complex64", "complex128"), ("sum", "uint8", "uint8"),
             ("sum", "float32", "float16"), ("mean", "int32", "int64"), ("mean", "int16", "complex64"),
             ("mean", "bool", "bool"), ("prod", "int32", "float64"), ("prod", "int64", "int8"),
             ("prod", "int32", "bool"), ("prod", "complex64", "complex128"), ("prod", "float32", "complex64"),
             ("amax", "float32", "int32"), ("sum_of_squares", "float32", "float64")]
    for name, t, r in cases:
        h = _data(rng, t, (4, 6))
        if name == "prod" and np.dtype(t).kind in "iu":
            h = (h % 5).astype(t)
        if r == "int32" and h.dtype.kind == "f":
            h = h * 10
        d = cp.asarray(h)
        for axis in (None, 1):
            want = np.asarray(_NP[name](h, axis=axis, dtype=r) if name != "amax" else np.max(h, axis=axis).astype(r))
            got = getattr(cukern, name)(d, axis=axis, dtype=r)
            if r == "float16":
                # NumPy adds in float16 itself; cukern adds in float32 and rounds once: against the float64 sum,
                # cukern is within one float16 rounding, NumPy's own sum may not be
                assert got.dtype == want.dtype
                exact = np.asarray(_NP[name](h.astype(np.float64), axis=axis))
                np.testing.assert_allclose(got.get(), exact.astype(np.float16), rtol=1e-3, atol=1e-6)
            else:
                _check(got, want, exact=want.dtype.kind in "biu")


@pytest.mark.gpu
def test_size_one_axes_convert_once_into_the_target():
    """Each result of a reduction over size-1 axes is its one element converted once into the ``dtype=``
    target (NumPy's bits and the emulator's), never through the kernels' float32 first: 1 + 2^-11 + 2^-40
    is 1.001 as float16, where through float32 (1 + 2^-11, a tie) it would round to 1."""
    import cupy as cp

    import cukern
    from cukern import reference as R
    from cukern._dtypes import BFLOAT16

    v = np.array([1 + 2**-11 + 2**-40, -(1 + 2**-8 + 2**-40), 3.0, np.nan], np.float64)
    h = np.stack([v, v[::-1]])[:, :, None]  # (2, 4, 1)
    d = cp.asarray(h)
    for name in ("sum", "mean", "nansum", "sum_of_squares", "norm"):
        for r in (np.float16, BFLOAT16):
            for axis, keepdims in ((2, False), ((2,), True), (-1, True)):
                got = getattr(cukern, name)(d, axis=axis, dtype=r, keepdims=keepdims).get()
                want = getattr(R, f"{name}_emulated")(h, axis=axis, dtype=r, keepdims=keepdims)
                assert got.dtype == want.dtype and got.shape == want.shape, (name, r, axis)
                np.testing.assert_array_equal(got.astype(np.float64), want.astype(np.float64), err_msg=f"{name} {axis}")
            if name in ("sum", "mean") and r == np.float16:
                np.testing.assert_array_equal(getattr(cukern, name)(d, axis=2, dtype=r).get(),
                                              getattr(np, name)(h, axis=2, dtype=r))


@pytest.mark.gpu
def test_var_and_std_take_float_targets_as_numpy(rng):
    """var / std with a float ``dtype=`` convert x to it first, as NumPy computes in it: the same bits as the
    op on the converted x, and NumPy's dtype and values."""
    import cupy as cp

    import cukern

    h = (1e4 + rng.standard_normal((37, 1001))).astype(np.float32)
    for name in ("var", "std"):
        for t, r in (("float32", "float64"), ("int16", "float32"), ("float64", "float32")):
            x = (h if t == "float32" else (h - 1e4) * 100 if t == "int16" else h.astype(t)).astype(t)
            d = cp.asarray(x)
            for axis in (None, 1):
                got = getattr(cukern, name)(d, axis=axis, dtype=r, ddof=1)
                same = getattr(cukern, name)(d.astype(r), axis=axis, ddof=1)
                assert got.dtype == np.asarray(_NP[name](x, axis=axis, dtype=r)).dtype == np.dtype(r), (name, t, r)
                assert got.get().tobytes() == same.get().tobytes(), (name, t, r, axis)
                # against float64 (NumPy's own float32 pass is the less accurate one here)
                want = _NP[name](x.astype(np.float64).astype(r).astype(np.float64), axis=axis, ddof=1)
                np.testing.assert_allclose(got.get(), want, rtol=1e-5 if r == "float32" else 1e-12)


@pytest.mark.gpu
def test_out_of_another_dtype_against_numpy(rng):
    import cupy as cp

    import cukern

    h = rng.standard_normal((4, 6)) * 10
    d = cp.asarray(h)
    for name, out_dtype in (("sum", np.int64), ("mean", np.float32), ("amax", np.int16), ("sum", np.complex128)):
        o = cp.full(4, 7, out_dtype)
        r = getattr(cukern, name)(d, axis=1, out=o)
        assert r is o
        want = np.empty(4, out_dtype)
        (np.max if name == "amax" else _NP[name])(h, axis=1, out=want)
        np.testing.assert_allclose(o.get(), want, rtol=1e-6)
    with pytest.warns(np.exceptions.ComplexWarning):
        cukern.sum(cp.asarray(h.astype(np.complex64)), axis=1, out=cp.empty(4, np.float32))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "int8", "complex64"])
def test_f_order_results_keep_numpys_strides(rng, dtype):
    import cupy as cp

    import cukern

    h = np.asfortranarray(_data(rng, dtype, (6, 5, 4)))
    d = cp.asfortranarray(cp.asarray(h))
    for name in ("sum", "mean", "amax"):
        for axis in (0, 1, 2, (0, 2)):
            for keepdims in (False, True):
                want = _NP[name](h, axis=axis, keepdims=keepdims)
                got = getattr(cukern, name)(d, axis=axis, keepdims=keepdims)
                _check(got, np.asarray(want), exact=np.dtype(want.dtype).kind in "biu")
                big = [i for i, n in enumerate(want.shape) if n > 1]
                assert [got.strides[i] for i in big] == [want.strides[i] for i in big], (name, axis, keepdims)
    neg = d[::-1, :, ::-2]
    got = cukern.sum(neg, axis=1)
    _check(got, np.sum(h[::-1, :, ::-2], axis=1), exact=dtype == "int8")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "int32"])
def test_every_reduction_and_scan_keeps_numpys_memory_order(rng, dtype):
    """The ops that finish with a CuPy element-wise step (any, all, nanmean's quotient) or scan (cumsum,
    cumprod) lay their results out as NumPy's (K order) too: F-ordered and transposed inputs, every axis."""
    import cupy as cp

    import cukern

    base = _data(rng, dtype, (4, 5, 6))
    ops = {"any": np.any, "all": np.all, "nanmean": np.nanmean, "nansum": np.nansum, "var": np.var,
           "count_nonzero": np.count_nonzero, "prod": np.prod, "cumsum": np.cumsum, "cumprod": np.cumprod}
    for perm in ((0, 1, 2), (2, 1, 0), (1, 0, 2), (2, 0, 1)):
        h = np.transpose(np.asfortranarray(base), perm)
        d = cp.transpose(cp.asfortranarray(cp.asarray(base)), perm)
        for name, ref in ops.items():
            scan = name.startswith("cum")
            for axis in (0, 1, 2) if scan else (0, 1, 2, (0, 2)):
                for keepdims in (False,) if scan else (False, True):
                    kw = {} if scan else {"keepdims": keepdims}
                    with np.errstate(all="ignore"):
                        want = np.asarray(ref(h, axis=axis, **kw))
                    got = getattr(cukern, name)(d, axis=axis, **kw)
                    _check(got, want, exact=want.dtype.kind in "biu")
                    big = [i for i, n in enumerate(want.shape) if n > 1]
                    assert [got.strides[i] for i in big] == [want.strides[i] for i in big], (name, perm, axis)


@pytest.mark.gpu
def test_widened_bits_do_not_depend_on_knobs(rng):
    import cupy as cp

    d = cp.asarray(rng.standard_normal((3, 70001)).astype(np.complex64))
    first = None
    for knobs in (P.DEFAULT_KNOBS, P.Knobs(full_block=64, full_unroll=2, row_max_tpr=32, row_waves=None)):
        for sm in (1, 132):
            got = R._reduce("sum", d, 1, None, False, None, knobs=knobs, sm=sm).get()
            full = R._reduce("mean", d, None, None, False, None, knobs=knobs, sm=sm).get()
            if first is None:
                first = (got, full)
            assert got.tobytes() == first[0].tobytes() and full.tobytes() == first[1].tobytes()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "bfloat16"])
def test_nansum_into_an_integer_dtype_zeroes_nan_first(rng, dtype):
    """NumPy's nansum with an integer ``dtype=``: each NaN is 0 in x's dtype, then the sum converts each
    element (truncating) and adds in the target; cukern zeroes the NaNs by x's own mask, whatever the
    conversion makes of a NaN."""
    import cupy as cp

    import cukern

    t = P.parse_dtype(dtype)
    h = (rng.standard_normal((5, 7, 3)) * 20).astype(np.float32)
    h[rng.random(h.shape) < 0.3] = np.nan
    h[2] = np.nan  # all-NaN slices along axis 1
    x = h.astype(t)
    wide = x.astype(np.float32)  # exact for every input dtype here (NumPy has no bfloat16 nansum of its own)
    d = cp.asarray(x)
    for r in (np.int8, np.int32, np.int64):
        for axis in (None, 1, (0, 2)):
            want = np.asarray(np.nansum(wide, axis=axis, dtype=r))
            _check(cukern.nansum(d, axis=axis, dtype=r), want, exact=True)
        one = d[:, :1]  # a reduced axis of one element: converted elementwise
        _check(cukern.nansum(one, axis=1, dtype=r), np.asarray(np.nansum(wide[:, :1], axis=1, dtype=r)), exact=True)


@pytest.mark.gpu
@pytest.mark.parametrize("target", ["float16", "bfloat16"])
def test_var_and_std_into_half_types_against_float64(rng, target):
    """var / std with ``dtype=`` float16 or bfloat16 convert x to it first, as NumPy computes in it: values
    near 1000 with a spread of 1 lose most of their spread in the half type (its steps there are 0.5 and 4),
    so a result from the unconverted values would be far off. The same bits as the op on the converted x and
    as the emulator; within a few ulps of NumPy's var / std of the converted values in float64."""
    import cupy as cp

    import cukern
    from cukern import reference

    r = P.parse_dtype(target)
    rtol = 2e-3 if r == np.float16 else 1.6e-2  # a few ulps of the result: 2^-11 and 2^-8 relative
    h = (1e3 + rng.standard_normal((37, 1001))).astype(np.float32)
    for t in ("float32", "float64", target):
        x = h.astype(P.parse_dtype(t))
        exact = x.astype(r).astype(np.float64)  # the values the op reduces
        d = cp.asarray(x)
        converted = cp.asarray(x.astype(r))
        for name in ("var", "std"):
            for axis in (None, -1):
                for ddof in (0, 1):
                    got = getattr(cukern, name)(d, axis=axis, dtype=r, ddof=ddof)
                    assert got.dtype == r, (name, t, axis, ddof, got.dtype)
                    same = getattr(cukern, name)(converted, axis=axis, ddof=ddof)
                    emulated = getattr(reference, f"{name}_emulated")(x, axis, dtype=r, ddof=ddof)
                    assert got.get().tobytes() == same.get().tobytes() == np.asarray(emulated).tobytes(), \
                        (name, t, axis, ddof)
                    want = np.asarray(_NP[name](exact, axis=axis, ddof=ddof)).astype(r).astype(np.float64)
                    np.testing.assert_allclose(got.get().astype(np.float64), want, rtol=rtol,
                                               err_msg=f"{name} of {t} axis={axis} ddof={ddof}")


# ---------------------------------------------------------------------------------------------------------
# Complex var, std, nansum, nanmean and counts; nansum into bool.

_COMPLEX_OPS = ("var", "std", "nansum", "nanmean", "count_nonzero")


def _complex_cases(rng, dtype, shape=_SHAPE):
    """Complex data with NaNs in either part (a whole slice along axis 0 of them) and exact zeros in either
    part or both."""
    h = _data(rng, dtype, shape)
    pick = rng.random(shape)
    h[pick < 0.1] = complex(np.nan, 1.0)
    h[(pick >= 0.1) & (pick < 0.2)] = complex(-2.0, np.nan)
    h[1] = complex(np.nan, np.nan)
    h.real[(pick >= 0.2) & (pick < 0.3)] = 0
    h.imag[(pick >= 0.3) & (pick < 0.4)] = 0
    h[(pick >= 0.4) & (pick < 0.5)] = 0
    return h


def _numpy_of(name, h, axis, keepdims, ddof=0):
    kw = {"ddof": ddof} if name in ("var", "std") else {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with np.errstate(all="ignore"):
            if name == "count_nonzero":
                return np.asarray(np.count_nonzero(h, axis=axis, keepdims=keepdims), dtype=np.int64)
            return np.asarray(_NP[name](h, axis=axis, keepdims=keepdims, **kw))


def _emulated_of(name, h, axis, keepdims, ddof=0):
    from cukern import reference

    kw = {"ddof": ddof} if name in ("var", "std") else {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return np.asarray(getattr(reference, f"{name}_emulated")(h, axis=axis, keepdims=keepdims, **kw))


def _close(got, want, name):
    assert got.dtype == want.dtype and got.shape == want.shape, (name, got.dtype, want.dtype, got.shape)
    if want.dtype.kind in "biu":
        np.testing.assert_array_equal(got, want, err_msg=name)
    else:
        single = want.dtype in (np.float32, np.complex64)
        np.testing.assert_allclose(got, want, rtol=1e-5 if single else 1e-12, atol=1e-5 if single else 1e-12,
                                   err_msg=name)


@pytest.mark.parametrize("dtype", ["complex64", "complex128"])
def test_complex_emulators_against_numpy(rng, dtype):
    """The emulators' complex var and std (the parts' variances added), nansum and nanmean (an element with a
    NaN in either part zeroed and not counted) and count_nonzero (either part non-zero) give NumPy's dtypes,
    shapes and values; var and std on the NaN-free data."""
    h = _complex_cases(rng, dtype)
    clean = np.where(np.isnan(h), np.zeros((), h.dtype), h)
    for axis in (None, 0, 1, (0, 2), -1):
        for keepdims in (False, True):
            for name in _COMPLEX_OPS:
                x = clean if name in ("var", "std") else h
                for ddof in (0, 1) if name in ("var", "std") else (0,):
                    _close(_emulated_of(name, x, axis, keepdims, ddof), _numpy_of(name, x, axis, keepdims, ddof),
                           f"{name} {axis} {keepdims} {ddof}")


def test_nansum_into_bool_is_an_or_of_the_non_nan_values(rng):
    from cukern import reference

    h = np.array([[0.0, np.nan, 2.0], [np.nan, 0.0, -0.0], [np.nan, np.nan, np.nan], [0.0, 0.0, 0.5]], np.float32)
    for axis in (None, 0, 1):
        want = np.nansum(h, axis=axis, dtype=bool)
        got = reference.nansum_emulated(h, axis=axis, dtype=bool)
        assert got.dtype == np.bool_ and np.array_equal(got, want), axis


@pytest.mark.parametrize("dtype", ["float32", "int16"])
def test_nansum_of_real_x_into_a_complex_dtype_is_numpys(dtype):
    from cukern import reference

    h = np.array([[1.0, np.nan, 2.5], [np.nan, 0.0, -3.0]] if dtype == "float32" else [[1, 2, 3], [4, 0, -6]], dtype)
    for axis in (None, 0, 1):
        want = np.nansum(h, axis=axis, dtype=np.complex64)
        got = reference.nansum_emulated(h, axis=axis, dtype=np.complex64)
        assert got.dtype == want.dtype and np.array_equal(got, want), axis


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["complex64", "complex128"])
def test_complex_var_nan_ops_and_counts_on_the_gpu(rng, dtype):
    """cukern's complex var, std, nansum, nanmean and count_nonzero (and any / all): the emulators' bits and
    NumPy's values, dtypes, shapes and strides on C, F and negative-stride layouts; out of another dtype;
    empty slices; longer slices (the parts' trees over many chunks)."""
    import cupy as cp

    import cukern
    from _support import same_bits
    from cukern import reference

    h = _complex_cases(rng, dtype)
    clean = np.where(np.isnan(h), np.zeros((), h.dtype), h)
    for label, lay in {
        "c": lambda a: (a, cp.asarray(a)),
        "f": lambda a: (np.asfortranarray(a), cp.asfortranarray(cp.asarray(a))),
        "neg": lambda a: (a[::-1, :, ::-2], cp.asarray(a)[::-1, :, ::-2]),
    }.items():
        (xh, d), (xc, dc) = lay(h), lay(clean)
        for axis in (None, 0, 1, (0, 2), -1):
            for keepdims in (False, True):
                for name in _COMPLEX_OPS:
                    x, dx = (xc, dc) if name in ("var", "std") else (xh, d)
                    for ddof in (0, 1) if name in ("var", "std") else (0,):
                        kw = {"ddof": ddof} if name in ("var", "std") else {}
                        with warnings.catch_warnings():
                            warnings.simplefilter("ignore")
                            got = getattr(cukern, name)(dx, axis=axis, keepdims=keepdims, **kw)
                        where = f"{name} {label} axis={axis} keepdims={keepdims} ddof={ddof}"
                        assert same_bits(got, _emulated_of(name, x, axis, keepdims, ddof)), where
                        want = _numpy_of(name, x, axis, keepdims, ddof)
                        _close(got.get(), want, where)
                        big = [i for i, n in enumerate(want.shape) if n > 1]
                        assert [got.strides[i] for i in big] == [want.strides[i] for i in big], where
                for name, ref in (("any", np.any), ("all", np.all)):
                    got = getattr(cukern, name)(d, axis=axis, keepdims=keepdims)
                    np.testing.assert_array_equal(got.get(), ref(xh, axis=axis, keepdims=keepdims), err_msg=name)
    # complex targets: the variance in the parts' type, widened (NumPy's, with a zero imaginary part)
    real = clean.real.copy()
    for x in (clean, real, real.astype(np.int16)):
        for target in (np.complex64, np.complex128):
            for name in ("var", "std"):
                got = getattr(cukern, name)(cp.asarray(x), axis=1, dtype=target, ddof=1)
                emulated = getattr(reference, f"{name}_emulated")(x, axis=1, dtype=target, ddof=1)
                assert same_bits(got, emulated), (name, x.dtype, target)
                _close(got.get(), np.asarray(getattr(np, name)(x, axis=1, dtype=target, ddof=1)), name)
    # out of another dtype, cast as NumPy casts
    d = cp.asarray(clean)
    o = cp.full(_SHAPE[0], 7, np.float64)
    assert cukern.std(d, axis=(1, 2), ddof=1, out=o) is o
    np.testing.assert_allclose(o.get(), np.std(clean, axis=(1, 2), ddof=1), rtol=1e-5)
    o = cp.full(_SHAPE[1], 7, np.complex128)
    assert cukern.nansum(cp.asarray(h), axis=(0, 2), out=o) is o
    np.testing.assert_allclose(o.get(), np.nansum(h, axis=(0, 2)), rtol=1e-5)
    # empty slices: NaN variances and means with NumPy's warnings, zero sums and counts
    e = cp.zeros((3, 0), dtype)
    with pytest.warns(RuntimeWarning):
        assert np.isnan(cukern.var(e, axis=1).get()).all()
    with pytest.warns(RuntimeWarning):
        assert np.isnan(cukern.nanmean(e, axis=1).get()).all()
    assert (cukern.nansum(e, axis=1).get() == 0).all() and (cukern.count_nonzero(e, axis=1).get() == 0).all()
    # longer slices: many chunks of each part's tree
    long = _data(rng, dtype, (3, 70001)) + np.asarray(1e3 + 1e3j, dtype)
    dl = cp.asarray(long)
    for name in ("var", "std", "nansum", "nanmean"):
        for axis in (None, 1):
            got = getattr(cukern, name)(dl, axis=axis)
            assert same_bits(got, _emulated_of(name, long, axis, False)), (name, axis)
            want = np.asarray(_NP[name](long.astype(np.complex128), axis=axis))
            np.testing.assert_allclose(got.get(), want, rtol=1e-4 if dtype == "complex64" else 1e-11)


@pytest.mark.gpu
def test_nansum_into_bool_and_nanmean_into_complex_on_the_gpu(rng):
    import cupy as cp

    import cukern

    h = rng.standard_normal((6, 9)).astype(np.float32)
    h[rng.random(h.shape) < 0.3] = np.nan
    h[rng.random(h.shape) < 0.3] = 0
    h[2] = np.nan
    h[3] = 0
    h[4, ::2] = np.nan
    h[4, 1::2] = 0
    d = cp.asarray(h)
    for axis in (None, 0, 1):
        for keepdims in (False, True):
            got = cukern.nansum(d, axis=axis, dtype=bool, keepdims=keepdims)
            want = np.nansum(h, axis=axis, dtype=bool, keepdims=keepdims)
            assert got.dtype == np.bool_ and np.array_equal(got.get(), want), (axis, keepdims)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                got = cukern.nanmean(d, axis=axis, dtype=np.complex64, keepdims=keepdims)
                want = np.asarray(np.nanmean(h, axis=axis, dtype=np.complex64, keepdims=keepdims))
            assert got.dtype == want.dtype and got.shape == want.shape
            np.testing.assert_allclose(got.get(), want, rtol=1e-5, atol=1e-6)
    hi = rng.integers(-2, 3, size=(4, 5)).astype(np.int16)
    got = cukern.nansum(cp.asarray(hi), axis=1, dtype=bool)
    assert np.array_equal(got.get(), np.nansum(hi, axis=1, dtype=bool))
