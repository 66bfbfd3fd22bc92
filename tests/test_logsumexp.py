"""logsumexp's SciPy arguments: weights ``b`` and ``return_sign``. The result dtype rule, the weighted plan,
the emulator of the weighted kernel against the float64 reference and SciPy's answers on special values, the
weighted merge's commutativity, float16's correctly rounded answer and validation (CPU); bits against the
emulator on every dtype and layout, broadcast weights, special values, ``out`` and capture (GPU)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from _support import assert_close, fake_array, same_bits

from cukern import reduce as R
from cukern import reduce_plan as P
from cukern import reference
from cukern.reference import reductions as tree
from cukern._dtypes import BFLOAT16, dtype_name

FLOATS = (np.float32, np.float64, np.float16, BFLOAT16)
INF, NAN = np.inf, np.nan

# (x, b, SciPy's (result, sign)), as scipy.special.logsumexp(x, b=b, return_sign=True) gives them (1.17): a
# sum that cancels, a zero weight at a larger x, infinities with either sign of weight, weights that cancel at
# +inf, all -inf, a NaN at a zero weight, all-zero weights, a NaN weight.
SPECIAL = [
    ([1, 1, 1], [1, -1, -1], (1.0, -1.0)),
    ([1, 1], [1, -1], (-INF, 0.0)),
    ([1, 100], [1, 0], (1.0, 1.0)),
    ([INF, 1], [-1, 1], (INF, -1.0)),
    ([INF, 1], [2, 1], (INF, 1.0)),
    ([INF, INF], [-1, 1], (NAN, NAN)),
    ([-INF, -INF], [-1, 1], (-INF, 0.0)),
    ([NAN, 1], [0, 1], (1.0, 1.0)),
    ([NAN, 1], [1, 1], (NAN, NAN)),
    ([1, 2], [0, 0], (-INF, 0.0)),
    ([1, 2], [NAN, 1], (NAN, NAN)),
    ([0, math.log(2)], [3, -1], (0.0, 1.0)),
    ([0, math.log(3)], [1, -1], (math.log(2), -1.0)),
]


def _scipy_value(x, b, signed):
    """SciPy's answer without return_sign: the log, NaN for a negative sum."""
    r, g = (np.float64(v) for v in signed)
    return np.float64(NAN) if g < 0 else r


# ---------------------------------------------------------------------------------------------------------
# Dtypes and planning.


@pytest.mark.parametrize("x, b, want", [
    (np.float32, np.float32, np.float32), (np.float16, np.float16, np.float16), (np.float64, np.float32, np.float64),
    (np.float32, np.float16, np.float32), (np.int64, np.int64, np.float64), (np.int8, np.int8, np.float64),
    (np.bool_, np.bool_, np.float64), (np.int8, np.float16, np.float16), (np.int16, np.float16, np.float32),
    (np.uint64, np.float32, np.float64), (BFLOAT16, BFLOAT16, BFLOAT16), (BFLOAT16, np.bool_, BFLOAT16),
    (BFLOAT16, np.float16, np.float32), (np.float64, BFLOAT16, np.float64), (np.int32, BFLOAT16, np.float64),
])
def test_weighted_result_dtype_is_scipys_promotion(x, b, want):
    assert P.weighted_dtype(x, b) == np.dtype(want)
    assert P.weighted_dtype(b, x) == np.dtype(want)


def test_weighted_plan_shares_levels_of_x_and_a_broadcast_b():
    # rows of x, one weight row for all of them (zero stride over the kept axis)
    pl = P.plan_weighted((64, 1000), (1000, 1), (0, 1), (1,))
    assert not pl.copy and (pl.outputs, pl.count) == (64, 1000)
    assert pl.kept == (64, 0, 1000, 0, 0) and pl.red == (1000, 0, 1, 0, 1)
    # a full reduction of a contiguous x with a scalar weight: one level each, nothing kept
    pl = P.plan_weighted((7, 9), (9, 1), (0, 0), (0, 1))
    assert pl.kept == (1, 0, 0, 0, 0) and pl.red == (63, 0, 1, 0, 0) and pl.outputs == 1
    # SciPy's test_b_multi_dims: x (4, 1, 2, 1) and b (3, 1, 5) broadcast to (4, 3, 2, 5), all reduced: the
    # levels of x and b do not merge into two, so both are copied
    pl = P.plan_weighted((4, 3, 2, 5), (2, 0, 1, 0), (0, 5, 0, 1), (0, 1, 2, 3))
    assert pl.copy and pl.red == (120, 0, 1, 0, 1) and pl.kept == (1, 0, 0, 0, 0)
    # two kept and two reduced levels of their own: no copy
    pl = P.plan_weighted((2, 3, 4, 5), (60, 20, 5, 1), (0, 5, 0, 1), (1, 3))
    assert not pl.copy and pl.kept == (4, 60, 5, 0, 0) and pl.red == (5, 20, 1, 5, 1)
    assert pl.outputs == 8 and pl.count == 15
    p = pl.params(True)
    assert p["signed_result"] == 1 and p["r_inner"] == 5 and p["rw_s0"] == 5
    assert pl.block == P.STRIDED_BLOCK and pl.grid == P.plan_strided(8).grid


def test_weighted_kernels_are_instantiated_for_each_float_result():
    names = {i.expression for i in P.instantiations() if i.name == "reduce_lse_weighted"}
    assert names == {P.weighted_instantiation(t).expression for t in FLOATS}
    assert len(names) == 4


# ---------------------------------------------------------------------------------------------------------
# Emulator and reference (CPU).


@pytest.mark.parametrize("x, b, signed", SPECIAL)
def test_special_values_are_scipys(x, b, signed):
    x, b = np.array(x, np.float64), np.array(b, np.float64)
    want = tuple(np.float64(v) for v in signed)
    for dtype in (np.float64, np.float32):
        got = reference.logsumexp_weighted_emulated(x.astype(dtype), b.astype(dtype), return_sign=True)
        assert got[0].dtype == dtype and got[1].dtype == dtype
        np.testing.assert_allclose(np.float64(got[0]), want[0], rtol=1e-6, atol=1e-7)
        np.testing.assert_array_equal(np.float64(got[1]), want[1])
        plain = reference.logsumexp_weighted_emulated(x.astype(dtype), b.astype(dtype))
        np.testing.assert_allclose(np.float64(plain), _scipy_value(x, b, signed), rtol=1e-6, atol=1e-7)
    ref = reference.reduce_logsumexp(x, b=b, return_sign=True)
    np.testing.assert_allclose(ref[0], want[0], rtol=1e-12, atol=1e-15)
    np.testing.assert_array_equal(ref[1], want[1])
    np.testing.assert_allclose(reference.reduce_logsumexp(x, b=b), _scipy_value(x, b, signed), rtol=1e-12,
                               atol=1e-15)


def test_empty_slices_give_minus_inf_with_sign_minus_one():
    for b in (None, np.ones((3, 0), np.float32)):
        x = np.ones((3, 0), np.float32)
        r, g = (reference.reduce_logsumexp(x, 1, b=b, return_sign=True) if b is not None
                else reference.reduce_logsumexp(x, 1, return_sign=True))
        assert (r == -INF).all() and (g == -1).all() and r.shape == (3,)
    r, g = reference.logsumexp_weighted_emulated(np.ones((3, 0), np.float16), np.ones((1, 0), np.float16), 1,
                                                 return_sign=True)
    assert r.dtype == np.float16 and (r == -INF).all() and (g == -1).all()


@pytest.mark.parametrize("dtype", FLOATS, ids=dtype_name)
@pytest.mark.parametrize("shape, b_shape, axis", [
    ((5, 700), (1, 700), 1), ((5, 700), (5, 1), None), ((3, 4, 257), (257,), (0, 2)), ((1000,), (1000,), 0),
    ((4, 1, 2, 1), (3, 1, 5), None), ((6, 33), (), 0),
])
def test_weighted_emulator_is_close_to_float64(dtype, shape, b_shape, axis, rng):
    """Mostly positive weights (a well-conditioned sum), some negative and some zero."""
    xh = (5 * rng.standard_normal(shape)).astype(dtype)
    bh = rng.uniform(-0.2, 2.0, b_shape).astype(dtype)
    if bh.size > 3:
        bh.reshape(-1)[::3] = 0
    got, sign = reference.logsumexp_weighted_emulated(xh, bh, axis, return_sign=True)
    want, wsign = reference.reduce_logsumexp(xh, axis, b=bh, return_sign=True)
    assert got.dtype == np.dtype(dtype) and got.shape == np.shape(want)
    np.testing.assert_array_equal(sign.astype(np.float64), wsign)
    n = math.prod(np.broadcast_shapes(shape, b_shape)) // max(1, got.size)
    assert_close(got, want, dtype, terms=n)
    kept = reference.logsumexp_weighted_emulated(xh, bh, axis, keepdims=True)
    assert kept.ndim == np.broadcast_shapes(shape, b_shape).__len__()


def test_weights_of_one_give_the_unweighted_value_closely(rng):
    """Not the same bits (the weighted chain multiplies by w and adds from 0), the same value to rounding."""
    x = (5 * rng.standard_normal((4, 3000))).astype(np.float32)
    got = reference.logsumexp_weighted_emulated(x, np.ones(1, np.float32), 1)
    assert_close(got, reference.reduce_logsumexp(x, 1), np.float32, terms=3000)


def _weighted_state(t, m, s):
    return (np.array([m], t), np.array([s], t))


def test_weighted_merge_is_commutative_and_the_identity_exact(rng):
    for t in (np.float32, np.float64):
        vals = [(-INF, 0), (-INF, -0.0), (-INF, NAN), (INF, 1), (INF, -2), (INF, 0), (NAN, 1), (0.0, 1),
                (-0.0, -1), (3.5, 7), (3.5, -7), (-80.0, 3), (-200.0, -1e-3), (1e30, 2)]
        vals += list(zip(rng.standard_normal(12) * 10, rng.standard_normal(12)))
        states = [_weighted_state(t, m, s) for m, s in vals]
        identity = _weighted_state(t, -INF, 0)
        for a in states:
            for b in states:
                u, v = tree._lse_weighted_merge(a, b), tree._lse_weighted_merge(b, a)
                fu, fv = (tree._lse_weighted_finish(*w, True) for w in (u, v))
                assert same_bits(np.stack(fu), np.stack(fv)), (a, b)
            got = tree._lse_weighted_finish(*tree._lse_weighted_merge(a, identity), True)
            assert same_bits(np.stack(got), np.stack(tree._lse_weighted_finish(*a, True))), a
        # two +inf maxima add their weights' sums; equal finite maxima add theirs (e^0 = 1)
        m, s = tree._lse_weighted_merge(_weighted_state(t, INF, 2), _weighted_state(t, INF, -3))
        assert m[0] == INF and s[0] == -1
        m, s = tree._lse_weighted_merge(_weighted_state(t, 2.5, 2), _weighted_state(t, 2.5, -3))
        assert m[0] == 2.5 and s[0] == -1


def test_a_weighted_chain_by_hand():
    x = np.array([[0.0, 1.0, np.inf, 5.0, 2.0, -np.inf, 1.0, 3.0]], np.float64)
    w = np.array([[2.0, -1.0, 0.0, 0.0, 1.0, 4.0, 0.5, 0.0]], np.float64)
    # one chain of the eight (pad the leaf: chain 0 holds elements 0, 32, 64, ...): place them 32 apart
    xs = np.zeros((1, 256)), np.zeros((1, 256))
    xs[0][0, ::32], xs[1][0, ::32] = x[0], w[0]
    m, s = tree._lse_weighted_chains(*xs)
    assert m[0, 0] == 2.0  # +inf, 5 and 3 carry zero weight: dropped
    e = tree._exp_nonpositive
    want = np.float64(0)
    for xi, wi in zip(x[0], w[0]):
        if wi != 0:
            want = want + wi * e(np.array([xi - 2.0]))[0]
    assert s[0, 0] == want and all(m[0, 1:] == -INF) and all(s[0, 1:] == 0)


def test_float16_logsumexp_is_correctly_rounded_where_scipys_is_not():
    """CuPy's test_array_inputs[float16]: 100 x 1000 float16 values in [0, 10) (numpy.random.rand with seed 0,
    times 10). The exact value lies below the midpoint of its float16 neighbours, so 19.203125 is correctly
    rounded; SciPy's float16 steps give 19.21875. cukern's float32 accumulation gives the former."""
    state = np.random.RandomState(0)
    x = (state.rand(100, 1000) * 10).astype(np.float16)
    wide = x.astype(np.float64)
    m = wide.max()
    exact = m + math.log(math.fsum(np.exp(wide - m).ravel()))  # float64 terms: error near 1e-15, far below
    lo, hi = np.float16(19.203125), np.float16(19.21875)
    assert np.nextafter(lo, hi) == hi and float(lo) < exact < (float(lo) + float(hi)) / 2
    assert abs(exact - 19.2104836) < 1e-6
    assert reference.logsumexp_emulated(x) == lo
    assert reference.logsumexp_weighted_emulated(x, np.ones(1, np.float16)) == lo


def test_unweighted_signs():
    x = np.array([[1.0, 2.0], [-INF, -INF], [NAN, 1.0], [INF, 1.0]])
    r, g = reference.reduce_logsumexp(x, 1, return_sign=True)
    np.testing.assert_array_equal(g, [1.0, 0.0, NAN, 1.0])
    assert r[1] == -INF and r[3] == INF


# ---------------------------------------------------------------------------------------------------------
# Validation before any launch (CPU: fake arrays).


@pytest.mark.parametrize("b, kw, err, match", [
    (fake_array((4, 5), np.dtype("M8[s]")), {}, TypeError, r"b has dtype datetime64\[s\]; logsumexp supports"),
    (fake_array((3,), np.float32), {}, ValueError,
     r"b has shape \(3,\), which does not broadcast against x's \(4, 5\)"),
    (fake_array((5,), np.float32), {"return_sign": 1}, TypeError, "return_sign must be True or False"),
    (fake_array((5,), np.float32), {"keepdims": "yes"}, TypeError, "keepdims must be a bool"),
    (fake_array((5,), np.float32), {"axis": 2}, np.exceptions.AxisError, "out of bounds"),
])
def test_weighted_arguments_are_checked(b, kw, err, match, monkeypatch):
    monkeypatch.setattr(R._check, "as_array", lambda a, name, **_: a)  # fake arrays stand in for CuPy's
    with pytest.raises(err, match=match):
        R.logsumexp(fake_array((4, 5), np.float32), b=b, **kw)


# ---------------------------------------------------------------------------------------------------------
# GPU: bits against the emulator.


def _both(cupy, xh, bh):
    return cupy.asarray(xh), cupy.asarray(bh)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", FLOATS, ids=dtype_name)
def test_weighted_bits_match_the_emulator(dtype, rng):
    """Every layout the plan tells apart (one or two kept and reduced levels, a broadcast b with zero strides,
    deeper layouts copied first), leaves and chains partly filled, zero and negative weights, with and without
    return_sign, keepdims; and closeness to float64 where the sum is well conditioned."""
    import cupy

    for shape, b_shape, axis in (((100003,), (100003,), None), ((33, 4099), (1, 4099), 1),
                                 ((5000, 33), (5000, 1), 0), ((6, 7, 65), (7, 1), (0, 2)), ((17, 1), (1,), 1),
                                 ((64, 300), (), -1), ((4, 1, 2, 1), (3, 1, 5), None),
                                 ((2, 3, 4, 5), (3, 1, 5), (1, 3)),
                                 ((3, 4, 5, 6), (4, 5, 6), (0, 2))):
        xh = (8 * rng.standard_normal(shape)).astype(dtype)
        bh = rng.uniform(-0.1, 2.0, b_shape).astype(dtype)
        if bh.size > 4:
            bh.reshape(-1)[::5] = 0
        x, b = _both(cupy, xh, bh)
        for signed in (False, True):
            for keepdims in (False, True):
                got = R.logsumexp(x, axis, b=b, keepdims=keepdims, return_sign=signed)
                want = reference.logsumexp_weighted_emulated(xh, bh, axis, keepdims, signed)
                if signed:
                    assert isinstance(got, tuple) and same_bits(got[0], want[0]) and same_bits(got[1], want[1]), \
                        (shape, b_shape, axis, keepdims)
                else:
                    assert same_bits(got, want), (shape, b_shape, axis, keepdims)
        r, g = R.logsumexp(x, axis, b=b, return_sign=True)
        ref, rsign = reference.reduce_logsumexp(xh, axis, b=bh, return_sign=True)
        np.testing.assert_array_equal(cupy.asnumpy(g).astype(np.float64), rsign)
        n = math.prod(np.broadcast_shapes(shape, b_shape)) // max(1, r.size)
        assert_close(r, ref, dtype, terms=n)


@pytest.mark.gpu
def test_weighted_views_and_mixed_dtypes_match_the_emulator(rng):
    """Strided, negative-stride and transposed x and b (their own strides), integer and bool x (converted to
    float64), x and b of different dtypes (promoted first)."""
    import cupy

    xh = (6 * rng.standard_normal((40, 90))).astype(np.float32)
    bh = rng.uniform(-1, 2, (40, 90)).astype(np.float32)
    x, b = _both(cupy, xh, bh)
    for xv, bv, xvh, bvh, axis in ((x[:, ::3], b[:, 1::3], xh[:, ::3], bh[:, 1::3], 1),
                                   (x[::-1], b, xh[::-1], bh, 0), (x.T, b.T, xh.T, bh.T, 1),
                                   (x[::2, 5:], b[1::2, :-5], xh[::2, 5:], bh[1::2, :-5], None)):
        got = R.logsumexp(xv, axis, b=bv, return_sign=True)
        want = reference.logsumexp_weighted_emulated(xvh, bvh, axis, return_sign=True)
        assert same_bits(got[0], want[0]) and same_bits(got[1], want[1]), axis
    ih = rng.integers(-5, 5, (8, 300)).astype(np.int64)
    for bt in (np.float32, np.int8, np.bool_, np.float16):
        wh = rng.integers(0, 3, (300,)).astype(bt)
        got = R.logsumexp(cupy.asarray(ih), 1, b=cupy.asarray(wh))
        assert got.dtype == np.float64
        assert same_bits(got, reference.logsumexp_weighted_emulated(ih, wh, 1))
    got = R.logsumexp(cupy.asarray(xh.astype(np.float16)), 1, b=cupy.asarray(bh.astype(np.float64)))
    assert got.dtype == np.float64
    assert same_bits(got, reference.logsumexp_weighted_emulated(xh.astype(np.float16), bh.astype(np.float64), 1))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", (np.float32, np.float64, np.float16, BFLOAT16), ids=dtype_name)
def test_weighted_special_values_on_the_gpu(dtype):
    import cupy

    for x, b, signed in SPECIAL:
        xh, bh = np.array(x, np.float64).astype(dtype), np.array(b, np.float64).astype(dtype)
        got = R.logsumexp(cupy.asarray(xh), b=cupy.asarray(bh), return_sign=True)
        want = reference.logsumexp_weighted_emulated(xh, bh, return_sign=True)
        assert same_bits(got[0], want[0]) and same_bits(got[1], want[1]), (x, b)
        np.testing.assert_array_equal(cupy.asnumpy(got[1]).astype(np.float64), np.float64(signed[1]))
        plain = R.logsumexp(cupy.asarray(xh), b=cupy.asarray(bh))
        assert same_bits(plain, reference.logsumexp_weighted_emulated(xh, bh)), (x, b)
    # the same special chains spread over several leaves and rows: +inf, NaN and -inf far apart
    n = 5000
    xh = np.zeros((6, n), np.float32)
    bh = np.ones((6, n), np.float32)
    xh[0, 4000], bh[0, 4000] = np.inf, -2
    xh[1, 7], xh[1, 4999], bh[1, 4999] = np.inf, np.inf, -1
    xh[2, 2500] = np.nan
    xh[3, 2500], bh[3, 2500] = np.nan, 0
    xh[4] = -np.inf
    bh[5] = 0
    xh, bh = xh.astype(dtype), bh.astype(dtype)
    got = R.logsumexp(cupy.asarray(xh), 1, b=cupy.asarray(bh), return_sign=True)
    want = reference.logsumexp_weighted_emulated(xh, bh, 1, return_sign=True)
    assert same_bits(got[0], want[0]) and same_bits(got[1], want[1])
    r, g = (cupy.asnumpy(v).astype(np.float64) for v in got)
    assert r[0] == INF and g[0] == -1 and np.isnan(r[1]) and np.isnan(r[2]) and np.isfinite(r[3])
    assert r[4] == -INF and g[4] == 0 and r[5] == -INF and g[5] == 0


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", (np.float32, np.float64, np.float16, BFLOAT16, np.int32), ids=dtype_name)
def test_unweighted_return_sign(dtype):
    import cupy

    xh = np.array([[1, 2, 3], [-1, -2, -3], [5, 5, 5]], np.float64)
    if np.dtype(dtype).kind == "f" or dtype == BFLOAT16:
        xh[1] = -np.inf
        xh[2, 1] = np.nan
    xh = xh.astype(dtype)
    r, g = R.logsumexp(cupy.asarray(xh), 1, return_sign=True)
    assert same_bits(r, reference.logsumexp_emulated(xh, 1))
    assert g.dtype == r.dtype
    _, want = reference.reduce_logsumexp(xh, 1, return_sign=True)
    np.testing.assert_array_equal(cupy.asnumpy(g).astype(np.float64), want)
    r, g = R.logsumexp(cupy.zeros((2, 0), np.float32), 1, return_sign=True)
    assert (cupy.asnumpy(r) == -INF).all() and (cupy.asnumpy(g) == -1).all()


@pytest.mark.gpu
def test_weighted_out_empty_and_errors_before_launch():
    import cupy

    x = cupy.asarray(np.arange(20, dtype=np.float32).reshape(4, 5))
    b = cupy.asarray(np.array([1, -1, 0, 2, 1], np.float32))
    out = cupy.full(4, 7, np.float64)
    assert R.logsumexp(x, 1, b=b, out=out) is out
    want = reference.logsumexp_weighted_emulated(x.get(), b.get(), 1)
    np.testing.assert_array_equal(out.get(), want.astype(np.float64))
    r, g = R.logsumexp(cupy.zeros((3, 0), np.float16), 1, b=cupy.ones((0,), np.float16), return_sign=True)
    assert r.dtype == np.float16 and (r.get() == -INF).all() and (g.get() == -1).all()
    out.fill(7)
    for kw, err, match in (({"b": b[:3]}, ValueError, "does not broadcast"),
                           ({"b": b, "out": cupy.empty(5, np.float32)}, ValueError, "out has shape"),
                           ({"b": b, "return_sign": None}, TypeError, "return_sign must be True or False")):
        with pytest.raises(err, match=match):
            R.logsumexp(x, 1, **kw)
    with pytest.raises(ValueError, match="out overlaps b"):
        R.logsumexp(x, 1, b=b, out=b[:4])
    assert (out.get() == 7).all()


@pytest.mark.gpu
def test_weighted_capture_replays_and_refuses_temporaries(rng):
    import cupy

    from _support import refused_in_capture, replayed_alone

    x = cupy.asarray(rng.standard_normal((64, 500)).astype(np.float32))
    b = cupy.asarray(rng.uniform(0, 1, (500,)).astype(np.float32))
    wide = b.astype(np.float64)
    stream = cupy.cuda.Stream(non_blocking=True)
    for call in (lambda: R.logsumexp(x, 1, b=wide),  # x converted to float64 first
                 lambda: R.logsumexp(x.reshape(4, 4, 4, 500).transpose(1, 0, 2, 3), 3, b=b)):  # 3 kept levels
        with stream:
            call()
        refused_in_capture(stream, call)

    def refill():
        x[...] = cupy.asarray(rng.standard_normal(x.shape).astype(np.float32))

    got = replayed_alone(stream, lambda: [R.logsumexp(x, 1, b=b, return_sign=True)], refill)
    want = reference.logsumexp_weighted_emulated(x.get(), b.get(), 1, return_sign=True)
    assert same_bits(got[0][0], want[0]) and same_bits(got[0][1], want[1])
