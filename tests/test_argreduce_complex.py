"""Complex arg-reductions and complex maxima: argmax, argmin, nanargmax, nanargmin of complex64 /
complex128 (cuda_src/argreduce.cu's lexicographic keys) and amax, amin, nanmax, nanmin of complex x (the
element at that index, gathered in NumPy's visiting order). On the host: the key order, the emulators
against NumPy's own functions, the visiting order, the compiled kernels; on a GPU: bits against NumPy."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from _support import compiled, fake_array

from cukern import argreduce as A
from cukern import reduce_plan as P
from cukern import reference as R

COMPLEX = (np.complex64, np.complex128)
PARTS = [0.0, -0.0, 1.0, -1.0, 2.5, np.inf, -np.inf, np.nan, -np.nan]
EXTREMES = {"amax": np.max, "amin": np.min, "nanmax": np.nanmax, "nanmin": np.nanmin}


def _complex(re, im, dtype):
    z = np.empty(np.shape(re), dtype)
    z.real, z.imag = re, im
    return z


def _tied(rng, shape, dtype, nan=0.1):
    """Both parts from a few values (many ties, -0 beside +0, infinities), a fraction ``nan`` of NaNs."""
    values = [0.0, -0.0, 1.0, -1.0, 2.5, np.inf, -np.inf]
    re, im = rng.choice(values, size=shape), rng.choice(values, size=shape)
    u = rng.random(shape)
    re[u < nan / 2] = np.nan
    im[(u >= nan / 2) & (u < nan)] = -np.nan
    return _complex(re, im, dtype)


def _bits(a):
    return np.ascontiguousarray(np.asarray(a)).view(np.uint8).tobytes()


def _layouts(rng, dtype):
    """Host views of many layouts: transposed, reversed, stepped, F-ordered."""
    for trial in range(160):
        nd = 1 + trial % 3
        shape = tuple(int(s) for s in rng.integers(1, 5, nd))
        base = _tied(rng, tuple(2 * s for s in shape), dtype, nan=0.15)
        steps = tuple(slice(None, None, int(rng.choice([1, 2, -1, -2]))) for _ in shape)
        x = base[steps][tuple(slice(0, s) for s in shape)].transpose(rng.permutation(nd))
        yield np.asfortranarray(x) if trial % 5 == 0 else x


# ---------------------------------------------------------------------------------------------------------
# Host: keys, emulators, visiting order.


@pytest.mark.parametrize("dtype", COMPLEX)
def test_keys_order_lexicographically(dtype):
    numbers = [v for v in PARTS if not np.isnan(v)]
    z = _complex(*zip(*[(a, b) for a in numbers for b in numbers]), dtype)
    for op in ("argmax", "argmin"):
        k = R.arg_keys(z, op)
        pairs = [tuple(int(w) for w in np.atleast_1d(kk)) for kk in k]
        want = sorted(range(len(z)), key=lambda i: (z[i].real, z[i].imag))
        if op == "argmin":
            want = want[::-1]
        got = [pairs[i] for i in want]
        assert got == sorted(got), op
        for i in range(len(z)):
            for j in range(len(z)):  # equal exactly when NumPy calls them equal (-0 == +0 in either part)
                assert (pairs[i] == pairs[j]) == (z[i] == z[j]), (z[i], z[j])
    nans = _complex([np.nan, 1.0, -np.nan], [0.0, np.nan, np.nan], dtype)
    for op in A.OPS:
        k = R.arg_keys(nans, op)
        full = 0 if op.startswith("nan") else np.iinfo(np.uint64).max
        assert (k == full).all(), op


@pytest.mark.parametrize("dtype", COMPLEX)
def test_emulators_are_numpys_functions(dtype, rng):
    for x in _layouts(rng, dtype):
        nd = x.ndim
        axis = int(rng.integers(-nd, nd)) if rng.random() < 0.7 else None
        keepdims = bool(rng.integers(2))
        for op in ("argmax", "argmin"):
            want = getattr(np, op)(x, axis=axis, keepdims=keepdims)
            assert np.array_equal(getattr(R, f"{op}_emulated")(x, axis=axis, keepdims=keepdims), want), op
        axes = tuple(sorted(rng.choice(nd, size=int(rng.integers(1, nd + 1)), replace=False).tolist()))
        for a in (None, axes, axes[0] - nd):
            for name, fn in EXTREMES.items():
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", RuntimeWarning)
                    want = fn(x, axis=a, keepdims=keepdims)
                got = getattr(R, f"{name}_emulated")(x, axis=a, keepdims=keepdims)
                assert got.shape == np.shape(want) and _bits(got) == _bits(want), (name, x.strides, a)


@pytest.mark.parametrize("dtype", COMPLEX)
def test_nan_forms_differ_from_numpy_only_where_numpy_picks_a_nan(dtype, rng):
    """NumPy's nanargmax puts -inf+0j in a NaN's place (nanargmin +inf+0j); cukern skips every NaN."""
    for x in _layouts(rng, dtype):
        for a in [None] + list(range(x.ndim)):
            for op in ("nanargmax", "nanargmin"):
                try:
                    want = getattr(np, op)(x, axis=a)
                except ValueError:
                    with pytest.raises(ValueError, match="All-NaN"):
                        getattr(R, f"{op}_emulated")(x, axis=a)
                    continue
                got = getattr(R, f"{op}_emulated")(x, axis=a)
                differ = np.asarray(got != want)
                if differ.any():
                    picked = x.reshape(-1)[want] if a is None else np.take_along_axis(
                        x, np.expand_dims(want, a), axis=a).squeeze(a)
                    assert np.isnan(np.asarray(picked)[differ] if differ.ndim else picked).all(), (op, a)


def test_nan_rules():
    z = np.array([1 + 1j, complex(1, np.nan), 3 + 0j, complex(np.nan, 0)], np.complex128)
    assert R.argmax_emulated(z) == 1 and R.argmin_emulated(z) == 1
    assert R.nanargmax_emulated(z) == 2 and R.nanargmin_emulated(z) == 0
    # numbers ahead of NumPy's stand-in for a NaN: cukern returns the number
    w = np.array([complex(np.nan, 0), complex(-np.inf, -1)], np.complex64)
    assert np.nanargmax(w) == 0 and R.nanargmax_emulated(w) == 1
    with pytest.raises(ValueError, match="All-NaN"):
        R.nanargmin_emulated(np.full((2, 3), complex(1, np.nan), np.complex64), axis=1)
    all_nan = np.array([complex(np.nan, 1), complex(2, np.nan)], np.complex64)
    assert _bits(R.nanmax_emulated(all_nan)) == _bits(all_nan[0])  # the first NaN, as NumPy's nanmax
    assert R.amax_emulated(np.array([1 + 2j, 1 + 3j, 2 - 5j, 2 - 5j])) == 2 - 5j
    ties = np.array([complex(-0.0, 1), complex(0.0, 1)], np.complex128)
    assert np.signbit(R.amax_emulated(ties).real) and not np.signbit(R.amax_emulated(ties[::-1]).real)


def test_gather_axes_follow_memory():
    assert P.gather_axes((3, 4, 5), (80, 20, 4), (0, 2)) == (0, 2)
    assert P.gather_axes((3, 4, 5), (4, 12, 48), (0, 2)) == (2, 0)  # F order: the last axis outermost
    assert P.gather_axes((3, 4, 5), (-80, 20, -4), (0, 1, 2)) == (0, 1, 2)  # negative strides by magnitude
    assert P.gather_axes((4, 3), (8, 32), (0, 1)) == (1, 0)


def test_routes_and_inputs():
    for name in P.MINMAX_OPS:
        for t in P.COMPLEX:
            assert P.check_input(name, t) == t and P.result_dtype(name, t) == t
            assert P.route(name, t, t) == P.Route(name, "gather", t, t)
            assert not P.kernels_answer(name, t, t)
    assert set(P.COMPLEX) <= set(A.DTYPES) and set(P.COMPLEX) <= set(A.INEXACT)
    assert A.SEARCHES["nanmax"] == A.OPS["nanargmax"] and "nanmax" not in A.OPS


def test_plans_and_instantiations():
    insts = set(A.instantiations())
    for dt in COMPLEX:
        for shape, axis in (((1 << 20,), None), ((4096, 7), 1), ((7, 4096), 0)):
            assert A.plan(shape, axis).instantiation(dt) in insts
    assert A.Plan("span", False, 1, 1).instantiation(np.complex128).args == (A.KIND_COMPLEX, 16)
    assert A.PAIR_BYTES.get(np.dtype(np.complex128)) == 24


@pytest.mark.parametrize("shape, axis, err, match", [
    ((4, 5), (0,), TypeError, "axis must be None or an int"),
    ((4, 5), 2, np.exceptions.AxisError, "out of bounds"),
    ((0,), None, ValueError, "empty sequence"),
])
@pytest.mark.parametrize("dtype", COMPLEX)
def test_bad_input(dtype, shape, axis, err, match):
    with pytest.raises(err, match=match):
        A._prepare("argmax", fake_array(shape, dtype), axis, False, A.DEFAULT_KNOBS, 132)


@pytest.mark.nvrtc(A.SOURCE)
def test_complex_kernels_load_whole_elements():
    c = compiled(A.SOURCE, "sm_90")
    for inst in A.instantiations():
        if inst.args[0] != A.KIND_COMPLEX:
            continue
        body = c.kernel_ptx(inst)
        assert ".local" not in body, inst.expression
        if inst.name == "argreduce_span":  # 16-byte vectors: two complex64 or one complex128 per load
            assert "ld.global.v4.u32" in body or "ld.global.v2.u64" in body, inst.expression
        if inst.args[1] == 16:  # one 16-byte load an element on the strided paths too
            assert "ld.global.v2.u64" in body or "ld.global.v4.u32" in body, inst.expression


# ---------------------------------------------------------------------------------------------------------
# On a GPU: against NumPy, bit for bit (the emulators equal NumPy, above).


def _same(got, want, what):
    got = got.get()
    want = np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape, (what, got.dtype, want.dtype, got.shape, want.shape)
    assert _bits(got) == _bits(want), what


def _extremes(x, xh, axis, keepdims=False):
    import cukern

    for name, fn in EXTREMES.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            want = fn(xh, axis=axis, keepdims=keepdims)
            got = getattr(cukern, name)(x, axis=axis, keepdims=keepdims)
        _same(got, want, (name, axis, keepdims))


def _args(x, xh, axis, keepdims=False):
    for op in A.OPS:
        want = getattr(R, f"{op}_emulated")(xh, axis=axis, keepdims=keepdims)
        _same(getattr(A, op)(x, axis=axis, keepdims=keepdims), np.asarray(want, np.int64), (op, axis, keepdims))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", COMPLEX)
def test_every_op_axis_and_size(dtype, rng):
    import cupy

    for shape in [(1,), (7,), (4099,), (3, 5, 67)]:
        xh = _tied(rng, shape, dtype)
        for a in range(xh.ndim):  # every slice holds a number, so the nan arg-forms answer
            np.moveaxis(xh, a, 0)[-1] = 2 + 1j
        x = cupy.asarray(xh)
        for axis in [None] + list(range(-len(shape), len(shape))):
            _args(x, xh, axis)
            _extremes(x, xh, axis)
        _args(x, xh, len(shape) - 1, keepdims=True)
        _extremes(x, xh, None, keepdims=True)
        if len(shape) == 3:
            for axes in ((0, 2), (-1, 0), (0, 1, 2)):
                _extremes(x, xh, axes)
                _extremes(x, xh, axes, keepdims=True)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", COMPLEX)
def test_views_in_numpys_visiting_order(dtype, rng):
    """Strided, reversed, transposed and F-ordered views: NumPy keeps the first of equal elements in memory
    order (-0 beside +0, the first NaN), and so does the gather."""
    import cupy

    base_h = _tied(rng, (24, 37, 5), dtype, nan=0.05)
    base = cupy.asarray(base_h)
    views = [lambda a: a[::-1, 1:, ::-2], lambda a: a.transpose(2, 0, 1), lambda a: a[:, ::3].transpose(1, 2, 0),
             lambda a: a[5:6, ::-1], lambda a: a[::2, ::-5, 1:4]]
    for view in views:
        x, xh = view(base), view(base_h)
        for axis in (None, 0, -1, (0, 2), (1, 2)):
            _extremes(x, xh, axis)
        _args(x, xh, None)
        _args(x, xh, 1)
    f = cupy.asfortranarray(base)
    fh = np.asfortranarray(base_h)
    for axis in (None, 0, (1, 2)):
        _extremes(f, fh, axis)
    flat_h = base_h.reshape(-1)[1:]  # complex64: 8 bytes past a 16-byte boundary (the vector loop's head)
    _extremes(base.reshape(-1)[1:], flat_h, None)
    _args(base.reshape(-1)[1:], flat_h, None)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", COMPLEX)
def test_long_rows_split_into_spans(dtype, rng):
    import cupy

    n = (1 << 20) + 3
    xh = _tied(rng, (n,), dtype, nan=0.0)
    for where in (None, 0, n // 2 + 1, n - 1):
        yh = xh.copy()
        if where is not None:
            yh[where] = complex(1, np.nan)
        y = cupy.asarray(yh)
        for op in ("argmax", "argmin", "nanargmax"):
            want = int(getattr(R, f"{op}_emulated")(yh))
            for knobs, sm in ((A.DEFAULT_KNOBS, None), (A.Knobs(1, 64), 3)):
                assert int(A._run(op, y, None, False, None, knobs=knobs, sm=sm)) == want, (op, where, knobs)
        _extremes(y, yh, None)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", COMPLEX)
def test_nan_slices_empty_and_out(dtype, rng):
    import cupy

    import cukern

    all_nan_h = np.full((3, 7), complex(np.nan, 1), dtype)
    all_nan_h[:, 3] = complex(2, np.nan)
    all_nan = cupy.asarray(all_nan_h)
    for op in ("nanargmax", "nanargmin"):
        with pytest.raises(ValueError, match="All-NaN slice encountered"):
            getattr(A, op)(all_nan, axis=1)
    assert (A.argmax(all_nan, axis=1).get() == 0).all()
    with pytest.warns(RuntimeWarning, match="All-NaN slice encountered"):
        got = cukern.nanmax(all_nan, axis=1)
    _same(got, all_nan_h[:, 0], "nanmax of all-NaN rows: the first NaN")
    for name in ("amax", "nanmin"):
        with pytest.raises(ValueError, match="zero-size"):
            getattr(cukern, name)(cupy.zeros((4, 0), dtype), axis=1)
    with pytest.raises(ValueError, match="empty sequence"):
        A.argmax(cupy.zeros(0, dtype))
    _same(cukern.amax(cupy.asarray(np.asarray(1 - 2j, dtype))), np.asarray(1 - 2j, dtype), "0-d")
    _same(cukern.amin(cupy.zeros((0, 3), dtype), axis=1), np.zeros(0, dtype), "no rows")

    xh = _tied(rng, (37, 129), dtype, nan=0.02)
    x = cupy.asarray(xh)
    out = cupy.full(37, 7 + 7j, dtype)  # poisoned
    assert cukern.amax(x, axis=1, out=out) is out
    _same(out, np.max(xh, axis=1), "out")
    strided = cupy.full((37, 2), 7 + 7j, dtype)
    cukern.nanmin(x, axis=-1, out=strided[:, 1])
    _same(strided[:, 1], np.nanmin(xh, axis=-1), "strided out")
    assert (strided[:, 0] == 7 + 7j).all()
    kept = cupy.full((1, 129), 7 + 7j, dtype)
    cukern.amin(x, axis=0, keepdims=True, out=kept)
    _same(kept, np.min(xh, axis=0, keepdims=True), "keepdims out")
    real = cupy.zeros(37, np.float64)
    with pytest.warns(np.exceptions.ComplexWarning):
        cukern.amax(x, axis=1, out=real)
    np.testing.assert_array_equal(real.get(), np.max(xh, axis=1).real)
    index = cupy.full(129, -7, np.int64)
    A.argmin(x, axis=0, out=index)
    np.testing.assert_array_equal(index.get(), R.argmin_emulated(xh, axis=0))
    with pytest.raises(ValueError, match="shape"):
        cukern.amax(x, axis=1, out=cupy.empty(36, dtype))
