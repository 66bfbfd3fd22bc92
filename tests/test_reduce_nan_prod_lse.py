"""NaN-aware reductions, counts, any and all (lift modes of the sum, max and min kernels), prod (real and
complex) and logsumexp: emulators, the exp and log routines, splits of the tree, planning and validation
(CPU); bits against the emulators, closeness to float64, layouts, special values, out and bad input (GPU)."""

import re
import warnings
from pathlib import Path

import numpy as np
import pytest
from _reduce_support import (ALL_DTYPES, LEAF, _Tree, _by_definition, _cdiv, _chunk, _col_leaf, _col_split,
                             _full_split, _row, _strided, _tuner_knobs)
from _support import capture, fake_array, same_bits

from cukern import reference
from cukern.reference import reductions as tree
from cukern import reduce as R
from cukern import reduce_plan as P
from cukern._dtypes import BFLOAT16, dtype_name


# ---------------------------------------------------------------------------------------------------------
# NaN-aware reductions, counts, any / all (lift modes of the sum, max and min kernels), prod and logsumexp.


NAN_DTYPES = (np.float32, np.float64, np.float16, BFLOAT16)


def _nan_data(rng, shape, dtype, where: str):
    """Normal values with NaNs: "none", "first" / "last" of each last-axis slice, "all" of slice 0 (or the
    whole array when 1-d), or "some" (about 10%)."""
    x = rng.standard_normal(shape).astype(np.float64)
    if where == "first":
        x[..., 0] = np.nan
    elif where == "last":
        x[..., -1] = np.nan
    elif where == "all" and x.size:
        x[slice(None) if x.ndim == 1 else 0] = np.nan
    elif where == "some":
        x[rng.random(shape) < 0.1] = np.nan
    return x.astype(dtype)


def _close(got, want, dtype, what, rtol=None, mag=None):
    """Complex results: the error's modulus on the scale of the reference's (a part alone may be near 0),
    rtol by the parts' dtype. ``mag``: the same reduction of ``|x|``, for sums whose terms may cancel (a
    rounded sum's error scales with the sum of the magnitudes, not with the result)."""
    wide = np.complex128 if np.dtype(dtype).kind == "c" else np.float64
    got = np.asarray(got).astype(wide)
    want = np.asarray(want, wide)
    assert np.array_equal(np.isnan(got), np.isnan(want)), what
    inf = np.isinf(want)
    assert np.array_equal(got[inf], want[inf]), what  # the same infinities
    ok = np.isfinite(want)
    rtol = rtol or {2: 1e-2, 4: 2e-5, 8: 1e-12}[P.real_of(dtype).itemsize]
    scale = np.abs(want[ok]) + 0.1 * (np.sqrt(np.mean(np.abs(want[ok]) ** 2)) if ok.any() else 0) + 1e-30
    if mag is not None:
        scale = scale + 0.1 * np.broadcast_to(np.asarray(mag, np.float64), want.shape)[ok]
    assert (np.abs(got[ok] - want[ok]) <= rtol * scale).all(), (what, np.max(np.abs(got[ok] - want[ok]) / scale))


@pytest.mark.parametrize("dtype", NAN_DTYPES, ids=dtype_name)
def test_nan_ops_and_counts_emulators_against_float64(rng, dtype):
    for shape, axis in (((1000,), None), ((5, 257), 1), ((300, 7), 0), ((4, 6, 33), (0, 2)), ((3, 1), 1)):
        for where in ("none", "first", "last", "all", "some"):
            xh = _nan_data(rng, shape, dtype, where)
            what = (shape, axis, where)
            mag = np.abs(xh.astype(np.float64))
            _close(reference.nansum_emulated(xh, axis), reference.reduce_nansum(xh, axis), dtype, what,
                   mag=reference.reduce_nansum(mag, axis))
            _close(reference.nanmean_emulated(xh, axis), reference.reduce_nanmean(xh, axis), dtype, what,
                   mag=reference.reduce_nanmean(mag, axis))
            for name in ("nanmax", "nanmin"):
                got = getattr(reference, f"{name}_emulated")(xh, axis)
                want = getattr(reference, f"reduce_{name}")(xh, axis)
                assert np.array_equal(got.astype(np.float64), want, equal_nan=True), (name, what)
            count = reference.count_nonzero_emulated(xh, axis)
            assert count.dtype == np.int64 and np.array_equal(count, np.count_nonzero(xh.astype(np.float64), axis))


def test_all_nan_and_empty_slices_follow_numpy():
    x = np.array([[np.nan, np.nan], [1.0, np.nan], [-np.inf, np.nan]], np.float32)
    assert np.array_equal(reference.nansum_emulated(x, 1), np.array([0, 1, -np.inf], np.float32))
    assert np.array_equal(reference.nanmax_emulated(x, 1), np.array([np.nan, 1, -np.inf], np.float32), equal_nan=True)
    assert np.array_equal(reference.nanmean_emulated(x, 1), np.array([np.nan, 1, -np.inf], np.float32), equal_nan=True)
    assert reference.nansum_emulated(np.zeros((0,), np.float32)) == 0
    assert np.isnan(reference.nanmean_emulated(np.zeros((0,), np.float32)))
    with pytest.raises(ValueError, match="zero-size"):
        reference.nanmax_emulated(np.zeros((0,), np.float32))
    assert reference.prod_emulated(np.zeros((0,), np.int32)) == 1
    assert reference.logsumexp_emulated(np.zeros((0,), np.float32)) == -np.inf
    z = np.array([0.0, -0.0, np.nan, 2.0], np.float32)
    assert reference.count_nonzero_emulated(z) == 2  # -0.0 is zero, NaN is not


def test_prod_emulator_against_float64(rng):
    for dtype in NAN_DTYPES:
        xh = (1 + 0.01 * rng.standard_normal((6, 3001))).astype(dtype)
        _close(reference.prod_emulated(xh, 1), reference.reduce_prod(xh, 1), dtype, dtype)
        assert reference.prod_emulated(xh, 1).dtype == np.dtype(dtype)
    xi = rng.integers(-9, 10, (5, 1000)).astype(np.int32)  # wraps in int64, as NumPy
    assert np.array_equal(reference.prod_emulated(xi, 1), np.prod(xi.astype(np.int64), 1))
    assert reference.prod_emulated(np.array([True, False])).dtype == np.int64


COMPLEX_DTYPES = (np.complex64, np.complex128)


def _complex(re, im, dtype):
    """Complex values with exactly these parts (``re + 1j * im`` would make NaNs of 1j * inf)."""
    z = np.empty(np.broadcast(re, im).shape, dtype)
    z.real, z.imag = re, im
    return z


def _near_one(rng, shape, dtype):
    return (1 + 0.01 * (rng.standard_normal(shape) + 1j * rng.standard_normal(shape))).astype(dtype)


@pytest.mark.parametrize("dtype", COMPLEX_DTYPES, ids=dtype_name)
def test_complex_prod_emulator_against_numpy(rng, dtype):
    """NumPy's complex products within rounding, NumPy's result dtypes and shapes for every axis form and
    keepdims, complex targets (x converted to them first, as NumPy multiplies in them) and 1+0j for an empty
    slice."""
    x = _near_one(rng, (6, 3001), dtype)
    for axis in (1, -1, (1,)):
        _close(reference.prod_emulated(x, axis), reference.reduce_prod(x, 1), dtype, axis)
    y = x[:, :60].reshape(6, 5, 12)
    for axis in (None, 0, -1, (0, 2)):
        for keepdims in (False, True):
            got = reference.prod_emulated(y, axis, keepdims=keepdims)
            want = np.prod(y, axis=axis, keepdims=keepdims)
            assert got.dtype == want.dtype and got.shape == want.shape, (axis, keepdims)
            _close(got, reference.reduce_prod(y, axis, keepdims), dtype, (axis, keepdims))
    for t in (np.complex64, np.complex128):
        assert same_bits(reference.prod_emulated(x, 1, dtype=t), reference.prod_emulated(x.astype(t), 1))
        real = x.real.copy()
        assert same_bits(reference.prod_emulated(real, 1, dtype=t), reference.prod_emulated(real.astype(t), 1))
        _close(reference.prod_emulated(real, 1, dtype=t), np.prod(real.astype(np.float64), 1), t, t)
    with pytest.raises(TypeError, match=f"dtype=float32 is not supported for prod of {dtype_name(dtype)}"):
        reference.prod_emulated(x, 1, dtype=np.float32)
    assert same_bits(reference.prod_emulated(x[:, :0], 1), np.ones(6, dtype))


@pytest.mark.parametrize("dtype", COMPLEX_DTYPES, ids=dtype_name)
def test_complex_product_is_commutative_and_keeps_one_exact(rng, dtype):
    """reduce.cu's complex mul_rn, as the emulator applies it: commutative bit for bit (a shuffle tree forms a b
    in one lane and b a in its partner), and exactly 1 + 0i returns the other operand as it is, -0, infinite
    and NaN parts included, where the formula alone would not; 1 - 0i is no identity."""
    part = np.array([0.0, -0.0, 1.0, -1.0, 0.5, -3.25, 1e30, np.inf, -np.inf, np.nan], P.real_of(dtype))
    z = _complex(part[:, None], part[None, :], dtype).ravel()
    z = np.concatenate([z, _near_one(rng, 200, dtype), (10 * rng.standard_normal(200) * (1 - 2j)).astype(dtype)])
    a, b = (v.ravel() for v in np.meshgrid(z, z))
    one = _complex(1.0, 0.0, dtype)
    mul = tree._tree_complex_prod
    with np.errstate(all="ignore"):
        assert same_bits(mul(a, b), mul(b, a))
        assert same_bits(mul(z, one), z) and same_bits(mul(one, z), z)
        assert same_bits(mul(_complex(-0.0, -0.0, dtype), _complex(1.0, -0.0, dtype)), _complex(-0.0, 0.0, dtype))
        # NumPy's own product gives nan+nanj here (inf - inf in one part, inf * 0 in the other)
        inf = _complex(np.inf, np.inf, dtype)
        assert same_bits(reference.prod_emulated(np.array([inf, one])), inf)


def _f32_of(x):
    """The float32 nearest the rational ``x`` (a nonzero Fraction), ties to even: subnormals on their fixed
    grid of 2^-149, past the largest finite value infinity."""
    from fractions import Fraction

    a = abs(x)
    e = a.numerator.bit_length() - a.denominator.bit_length()  # 2^(e - 1) < a < 2^(e + 1)
    if a < Fraction(2) ** e:
        e -= 1
    q = Fraction(2) ** max(e - 23, -149)
    v = round(a / q) * q  # Fraction rounds half to even
    f = np.float32(np.inf) if v >= 2**128 else np.float32(float(v))
    return -f if x < 0 else f


def _fma_triples(rng, n):
    """float32 (a, b, c) for the fma: random bits over every exponent (subnormals, near overflow), c
    cancelling a b, exact ties between float32 neighbours with and without a tiny c to break them, zeros."""
    def floats(k, lo, hi):
        e = rng.integers(lo, hi, k)
        f = (1 + rng.integers(0, 2**23, k) / 2**23) * np.exp2(e.astype(np.float64))
        return (f * rng.choice([-1.0, 1.0], k)).astype(np.float32)

    a, b, c = floats(n, -75, 64), floats(n, -75, 64), floats(n, -150, 128)
    a[: n // 8], b[: n // 8] = floats(n // 8, -150, -60), floats(n // 8, -10, 40)  # subnormal products
    k = slice(n // 8, n // 4)  # c is minus a b rounded, or a neighbour: massive cancellation
    c[k] = -(a[k].astype(np.float64) * b[k]).astype(np.float32)
    c[k][::2] = np.nextafter(c[k][::2], np.float32(np.inf))
    k = slice(n // 4, 3 * n // 8)  # odd a b in (2^24, 2^25), times 2^e, lies halfway between float32s: ties
    i = rng.integers(2**12, 5792, n // 8) | 1
    j = rng.integers(2**12, 5792, n // 8) | 1
    a[k], b[k] = (i * 2.0 ** rng.integers(-20, 20, n // 8)).astype(np.float32), j.astype(np.float32)
    tiny = rng.choice([-1.0, 1.0], n // 8) * 2.0 ** rng.integers(-149, -30, n // 8)
    c[k] = np.where(rng.random(n // 8) < 0.5, 0.0, tiny)  # 0 keeps the tie, a tiny c breaks it
    k = slice(3 * n // 8, n // 2)  # the largest products: overflow to infinity or just below
    a[k], b[k] = floats(n // 8, 63, 64), floats(n // 8, 63, 65)
    c[k] = -np.sign(a[k] * b[k].astype(np.float64)) * floats(n // 8, 126, 128) * rng.choice([0, 1], n // 8)
    zero = np.array([0.0, -0.0], np.float32)
    a[-8:], b[-8:], c[-8:] = np.repeat(zero, 4), np.tile(np.repeat(zero, 2), 2), np.tile(zero, 4)
    return a, b, c


def test_fma32_is_the_correctly_rounded_fma(rng):
    """tree._fma32 (the host's __fmaf_rn, which float32's exp multiply-adds with) against exact rational
    arithmetic: a b + c rounded once to float32, ties to even; an exact zero is -0 only for -0 + -0."""
    from fractions import Fraction

    a, b, c = _fma_triples(rng, 4000)
    got = tree._fma32(a, b, c)
    assert got.dtype == np.float32 and got.shape == a.shape
    for i in range(a.size):
        x = Fraction(float(a[i])) * Fraction(float(b[i])) + Fraction(float(c[i]))
        if x == 0:
            zeros = (a[i] == 0 or b[i] == 0) and c[i] == 0  # else a b and c cancel: +0
            neg = zeros and np.signbit(a[i]) != np.signbit(b[i]) and np.signbit(c[i])
            want = np.float32(-0.0 if neg else 0.0)
        else:
            want = _f32_of(x)
        assert same_bits(got[i], want), (a[i], b[i], c[i], got[i], want)
    # ties broken by a c below half a float64 ulp of a b: what rounding the float64 sum to nearest would miss
    tie = tree._fma32(np.float32(4097), np.float32(4097), np.float32([2.0**-40, -(2.0**-40), 0]))
    assert list(tie) == [16785410, 16785408, 16785408]  # a b = 2^24 + 8193
    with np.errstate(invalid="ignore"):
        special = tree._fma32(np.float32([np.inf, np.inf, 0, np.nan, 2.0**100, 1]),
                                   np.float32([1, 0, np.inf, 1, 2.0**100, 1]),
                                   np.float32([-np.inf, 1, 1, 1, -np.inf, np.inf]))
    assert same_bits(special, np.float32([np.nan, np.nan, np.nan, np.nan, -np.inf, np.inf]))


def test_exp_rounds_and_scales_exactly():
    """exp_nonpositive's exact steps, as reduce.cu argues them: adding and subtracting the magic 1.5 2^23
    (1.5 2^52) rounds any |v| < 2^22 (2^51) to its nearest integer, ties to even, the integer also read from
    the sum's bits; and p 2^-64 times 2^(k + 64) is p 2^k rounded once (subnormal results included) for p in
    [1/2, 2) and every k the exp can form, as p 2^(k + 64) (exact) times 2^-64 is."""
    for t, kmin in ((np.float32, -150), (np.float64, -1076)):
        c = tree._explog(t)
        magic = c["magic"]
        ibits = np.dtype(f"i{np.dtype(t).itemsize}")
        v = np.concatenate([np.arange(-2 * kmin + 1) / t(2) + kmin, np.arange(kmin, 1) + t(0.25)]).astype(t)
        v = np.concatenate([v, np.nextafter(v, t(np.inf)), np.nextafter(v, t(-np.inf))])
        m = v + magic
        assert same_bits(m - magic, np.rint(v) + t(0))  # rint keeps -0.0: the sum gives +0
        assert (m.view(ibits).astype(np.int64) - np.asarray(magic).view(ibits) == np.rint(v)).all()
        assert np.rint(c["underflow"] * c["inv_ln2"]) == kmin  # the least k: d >= the underflow bound
        p = np.linspace(0.5, 2, 4001, dtype=t)[:-1]
        for k in range(kmin, 1):
            one = np.ones_like(p)
            assert same_bits((p * np.ldexp(one, k + 64)) * np.ldexp(one, -64), np.ldexp(p, k)), (t, k)
            assert same_bits((p * np.ldexp(one, -64)) * np.ldexp(one, k + 64), np.ldexp(p, k)), (t, k)


def test_exp_scaled_by_its_coefficients_keeps_its_bits():
    """reduce.cu's exp_nonpositive scales Horner's coefficients by 2^-64 and multiplies once by 2^(k + 64):
    the bits of the unscaled Horner's p times 2^(k + 64), then 2^-64 (its form before), on every 997th
    float32 in [-104, 0], on float64 values over [-746, 0], and at the ends."""
    rng = np.random.default_rng(11)
    f32 = np.arange(0x80000000, np.float32(-104).view(np.uint32) + 1, 997).astype(np.uint32).view(np.float32)
    f64 = -np.abs(rng.standard_normal(300000) * 200)
    for d in (f32, f64, np.array([0.0, -0.0, -1e-30, -1e-300, -745.5, -746.0, -np.inf])):
        c = tree._explog(d.dtype)
        t = d.dtype.type
        mad = tree._fma32 if t is np.float32 else (lambda a, b, c: a * b + c)
        with np.errstate(all="ignore"):
            live = d >= c["underflow"]
            dd = np.where(live, d, t(0))
            km = mad(dd, c["inv_ln2"], c["magic"])
            kf = km - c["magic"]
            bits = np.dtype(f"i{d.dtype.itemsize}")
            ki = km.view(bits).astype(np.int64) - np.asarray(c["magic"]).view(bits).astype(np.int64)
            r = mad(kf, -c["ln2"], dd) if t is np.float32 else mad(kf, -c["ln2_lo"], mad(kf, -c["ln2_hi"], dd))
            p = np.full_like(d, c["exp"][-1])
            for coef in reversed(c["exp"][:-1]):
                p = mad(p, r, coef)
            one = np.ones_like(d)
            before = np.where(live, (p * np.ldexp(one, ki + 64)) * np.ldexp(one, -64), t(0))
        assert same_bits(tree._exp_nonpositive(d), before), d.dtype


def test_exp_and_log_routines_are_accurate():
    """The exp and log against float64's, within 2 ulps; float32's exp (a degree-5 polynomial, its r in one
    step with ln2 rounded to float) within 2.5 plus |d| 2^-28 relative (k (ln2 - kLn2) < |d| 2^-28.4)."""
    rng = np.random.default_rng(5)
    for dtype, ulps, exp_ulps in ((np.float32, 2, 2.5), (np.float64, 2, 2)):
        eps = np.finfo(dtype).eps
        d = -np.abs(rng.standard_normal(200000) * 40).astype(dtype)
        d[:4] = [0.0, -0.0, -1e-30, -np.inf]
        got = tree._exp_nonpositive(d)
        want = np.exp(d.astype(np.float64))
        step = np.abs(np.where(np.isfinite(d), d, 0).astype(np.float64)) * 2.0**-28 * want if dtype == np.float32 else 0
        normal = want > np.finfo(dtype).tiny
        assert (np.abs(got - want) <= np.where(normal, exp_ulps * eps * want, np.finfo(dtype).smallest_subnormal * 2)
                + step).all()
        assert got[0] == 1 and got[1] == 1 and got[3] == 0
        s = (1 + np.abs(rng.standard_normal(200000)) * 1e6).astype(dtype)
        s[:2] = [1.0, 2.0]
        ls = tree._log_at_least_one(s)
        w = np.log(s.astype(np.float64))
        assert (np.abs(ls - w) <= ulps * eps * np.maximum(w, 1)).all() and ls[0] == 0
    # float32's exp on a lattice over every float32 in [-104, 0]: within 2.25 ulps of e^d (of 2^-149 for
    # subnormal results) plus |d| 2^-28 relative; within 2.25 ulps alone for d > -11 (2.22 there)
    d = np.arange(0x80000000, np.float32(-104).view(np.uint32) + 1, 1117).astype(np.uint32).view(np.float32)
    got = tree._exp_nonpositive(d).astype(np.float64)
    want = np.exp(d.astype(np.float64))
    ulp = np.exp2(np.maximum(np.floor(np.log2(np.maximum(want, 2.0**-126))) - 23, -149))
    assert (np.abs(got - want) <= 2.25 * ulp + np.abs(d.astype(np.float64)) * 2.0**-28 * want).all()
    assert (np.abs(got - want) <= 2.25 * ulp)[d > -11].all()


def test_exp_is_zero_from_the_underflow_bound_down():
    """reduce.cu's exp_nonpositive raises d to kUnderflow rather than testing it: the same bits as the
    emulator's test (0 below the bound) because its steps already give 0 at the bound and just above it."""
    for dtype in (np.float32, np.float64):
        bound = np.array([tree._explog(dtype)["underflow"]], dtype)
        d = np.concatenate([bound, np.nextafter(bound, 0), bound - 1, [-np.inf, np.nan]]).astype(dtype)
        got = tree._exp_nonpositive(d)
        clamped = tree._exp_nonpositive(np.fmax(d, bound[0]))
        assert got.tobytes() == clamped.tobytes() and (got[:2] == 0).all()


def test_explog_constants_are_the_kernels():
    """tree._EXPLOG holds reduce.cu's hex literals (the emulator's bits depend on them)."""
    src = (Path(P.__file__).parent.parent / "cuda_src" / "reduce.cu").read_text()
    for name, dtype, suffix in (("ExpLog<float>", np.float32, "f"), ("ExpLog<double>", np.float64, "")):
        body = src[src.index(f"template <> struct {name}"):]
        body = body[:body.index("pow2")]
        c = tree._explog(dtype)
        lits = re.findall(r"(0x[0-9a-f.]+p[-+]\d+)" + suffix, body)
        one_step = [c["ln2"]] if "ln2" in c else []  # float's r in one step
        want = [c["inv_ln2"], c["magic"], c["ln2_hi"], c["ln2_lo"], *one_step, *c["exp"], c["sqrt_half"], *c["log"]]
        assert [dtype(float.fromhex(v)) for v in lits] == want, name
        assert f"kUnderflow = {c['underflow']:.1f}" in body.replace("f;", ";")


def test_logsumexp_emulator_against_float64(rng):
    for dtype in NAN_DTYPES:
        for shape, axis, scale in (((3001,), None, 1), ((7, 4099), 1, 30), ((600, 5), 0, 1e3), ((2, 3, 300), (0, 2), 5)):
            xh = (scale * rng.standard_normal(shape)).astype(dtype)
            got = reference.logsumexp_emulated(xh, axis)
            assert got.dtype == np.dtype(dtype)
            _close(got, reference.reduce_logsumexp(xh, axis), dtype, (dtype, shape))
    x = np.array([[-np.inf, -np.inf, -np.inf], [np.inf, 1, 2], [np.nan, 1, np.inf], [np.inf, np.inf, 0],
                  [0.0, -0.0, -np.inf], [1e30, 1e30, -1e30]], np.float32)
    want = np.array([-np.inf, np.inf, np.nan, np.inf, np.log(2), 1e30 + np.log(2)], np.float32)
    assert np.array_equal(reference.logsumexp_emulated(x, 1), want, equal_nan=True)
    assert np.array_equal(reference.reduce_logsumexp(x, 1).astype(np.float32), want, equal_nan=True)
    assert reference.logsumexp_emulated(np.array([3, 3], np.int32)).dtype == np.float64


def test_var_and_logsumexp_chains_by_hand():
    """The chain states reduce.cu's chain_state forms, on values whose arithmetic is exact: chain c of leaf 0
    of 0, 1, ..., 255 holds c + 32 m, m = 0..7 (sum 8 c + 896, mean c + 112, M2 = 1024 * 42); leaf 1 of
    n = 259 has three chains of one value and 29 empty ones."""
    for dt in (np.float32, np.float64):
        d = np.arange(259, dtype=dt)[None]
        n, mean, m2 = tree._moment_chains(d)
        c = np.arange(32)
        assert (n[0, :32] == 8).all() and (mean[0, :32] == c + 112).all() and (m2[0, :32] == 43008).all()
        assert (n[0, 32:35] == 1).all() and (mean[0, 32:35] == 256 + np.arange(3)).all() and (m2[0, 32:] == 0).all()
        assert (n[0, 35:] == 0).all() and (mean[0, 35:] == 0).all()
        e = tree._exp_nonpositive(np.array([-1.0, -2.0], dt))
        inf, nan = np.inf, np.nan
        rows = np.full((7, 64), -inf, dt)  # n = 64: chains of two values (c, c + 32)
        rows[0, [0, 32]] = 5.0  # (5, 1 + 1)
        rows[1, [0, 32]] = [3.0, 2.0]  # (3, 1 + e^-1)
        rows[2, [0, 32]] = [0.0, -1.0]  # (0, 1 + e^-1)
        rows[3, [0, 32]] = [inf, 1.0]  # (inf, 1)
        rows[4, [0, 32]] = [nan, inf]  # (nan, 1)
        rows[5, [0, 32]] = [-inf, 1.0]  # (1, 0 + 1): a -inf term adds 0
        rows[6, [0, 32]] = [1.0, -2.0]  # (1, 1 + e^-3)
        m, s = tree._lse_chains(rows)
        want_m = np.array([5, 3, 0, inf, nan, 1, 1], dt)
        want_s = np.array([2, 1 + e[0], 1 + e[0], 1, 1, 1, 1 + tree._exp_nonpositive(np.array([-3.0], dt))[0]], dt)
        assert np.array_equal(m[:, 0], want_m, equal_nan=True) and np.array_equal(s[:, 0], want_s)
        # a chain of -inf alone is (-inf, 1); an empty chain (n = 1: chains 1..31) the identity (-inf, 0)
        assert (m[:, 1:] == -inf).all() and (s[:, 1:] == 1).all()
        m, s = tree._lse_chains(np.array([[2.0]], dt))
        assert m[0, 0] == 2 and s[0, 0] == 1 and (m[0, 1:] == -inf).all() and (s[0, 1:] == 0).all()


@pytest.mark.parametrize("n", [1, 7, 255, 257, 4099])
def test_logsumexp_emulator_odd_lengths_and_special_values(n):
    """Within a few ulps of the float64 reference (relative to max(1, |result|): the sum's rounding, the
    exp's and the log's), and NumPy's answers for slices holding -inf, +inf or NaN."""
    rng = np.random.default_rng(n)
    for dt in (np.float32, np.float64):
        x = (10 * rng.standard_normal((9, n))).astype(dt)
        x[1] = -np.inf
        x[2, ::3] = -np.inf
        x[3, n // 2] = np.inf
        x[4, n - 1] = np.nan
        x[5, 0], x[5, n - 1] = np.inf, np.nan
        x[6, 0], x[6, n - 1] = -np.inf, np.inf
        x[7] = 3.5  # equal maxima everywhere: exactly 3.5 + log(n) as cukern's log gives it
        x[8, ::2] = -np.inf
        got = reference.logsumexp_emulated(x, axis=1)
        want = reference.reduce_logsumexp(x, axis=1)
        assert np.array_equal(np.isnan(got), np.isnan(want)) and np.array_equal(np.isinf(got), np.isinf(want))
        assert (got[np.isinf(want)] == want[np.isinf(want)]).all()
        ok = np.isfinite(want)
        eps = np.finfo(dt).eps
        bound = (6 + np.log2(n)) * eps * np.maximum(1, np.abs(want[ok]))
        assert (np.abs(got[ok] - want[ok]) <= bound).all(), (n, dt, np.abs(got[ok] - want[ok]) / bound)
        assert got[7] == dt(3.5) + tree._log_at_least_one(np.array([n], dt))[0]
        if n > 1:  # var: an infinity or a NaN anywhere gives NaN (rows 3 to 6), a constant slice 0 (row 7)
            with np.errstate(invalid="ignore"):
                v = reference.var_emulated(x[3:], axis=1)
            assert np.isnan(v[:4]).all() and v[4] == 0


class _LseTree:
    """The LogSumExp merge on (m, s) pairs, as _Tree's interface wants it (for _by_definition and the
    kernels' splits), with the chain written out from its definition (reduce.cu chain_state)."""

    def __init__(self, a):
        self.a = np.dtype(a)
        self.identity = (self.a.type(-np.inf), self.a.type(0))

    def __call__(self, x, y):
        m, s = tree._lse_merge(tuple(np.asarray(v, self.a) for v in x), tuple(np.asarray(v, self.a) for v in y))
        return (self.a.type(m), self.a.type(s))

    def chain(self, values):
        """The maximum m of the present values (NaN-propagating), (m, 1) if it is not finite, else the sum
        from 0, left to right, of exp(v - m) by cukern's exp; no values: the identity."""
        t = self.a.type
        if not values:
            return self.identity
        m = t(values[0])
        for v in values[1:]:
            m = t(tree._tree_max(np.asarray(m, self.a), np.asarray(v, self.a)))
        if not np.isfinite(m):
            return (m, t(1))
        s = t(0)
        for v in values:
            s = t(s + tree._exp_nonpositive(np.asarray([t(v) - m], self.a))[0])
        return (m, s)

    merge = __call__
    pairs, lanes, block, stack = _Tree.pairs, _Tree.lanes, _Tree.block, _Tree.stack


class _VarTree:
    """The Chan merge on (count, mean, M2), as _Tree's interface wants it, with the chain written out from
    its definition (reduce.cu chain_state) over already shifted values."""

    def __init__(self, a):
        self.a = np.dtype(a)
        self.identity = (self.a.type(0),) * 3

    def __call__(self, x, y):
        with np.errstate(all="ignore"):
            r = tree._chan(tuple(np.asarray(v, self.a) for v in x), tuple(np.asarray(v, self.a) for v in y))
        return tuple(self.a.type(v) for v in r)

    def chain(self, values):
        """S1 the sum of the c present values from the first, left to right; mean = S1 / c; M2 the sum from
        0, left to right, of (v - mean)^2; no values: the identity."""
        t = self.a.type
        if not values:
            return self.identity
        with np.errstate(all="ignore"):
            s1 = t(values[0])
            for v in values[1:]:
                s1 = t(s1 + t(v))
            mean = t(s1 / t(len(values)))
            m2 = t(0)
            for v in values:
                m2 = t(m2 + t(t(v) - mean) * t(t(v) - mean))
        return (t(len(values)), mean, m2)

    merge = __call__
    pairs, lanes, block, stack = _Tree.pairs, _Tree.lanes, _Tree.block, _Tree.stack


class _ProdTree(_Tree):
    def __init__(self, a):
        self.a = np.dtype(a)
        self.combine = tree._tree_complex_prod if self.a.kind == "c" else tree._tree_prod
        self.identity = self.a.type(1)


def _lse_finish(state):
    """logsumexp's finish of one state, as reduce.cu's and the emulator's: m + log(s) for a finite m, m itself
    for an infinite or NaN one, -inf for the identity (s == 0)."""
    m, s = state
    if s == 0:
        return type(m)(-np.inf)
    if not np.isfinite(m):
        return m
    return type(m)(m + tree._log_at_least_one(np.asarray([s]))[0])


def test_lse_merge_is_commutative_where_the_result_reads_it_and_exact_with_the_identity(rng):
    """The branch-free merge: for finite maxima (and the identity) the same bits in either order and the other
    operand unchanged by the identity; with an infinite or NaN m the order may change the state's s, never
    what finish makes of it."""
    for a in (np.float32, np.float64):
        t = _LseTree(a)
        vals = [(-np.inf, 0), (-np.inf, 1), (-np.inf, 3), (np.inf, 1), (np.inf, 5), (np.nan, 1), (np.nan, 2),
                (0.0, 1), (-0.0, 1), (0.0, 2), (3.5, 7), (3.5, 2), (-80.0, 3), (-200.0, 1), (1e30, 1),
                (-np.finfo(a).max, 1), (np.finfo(a).max, 2)]
        vals = [(a(m), a(s)) for m, s in vals] + [(a(m), a(s)) for m, s in zip(rng.standard_normal(20) * 10,
                                                                               rng.integers(1, 9, 20))]
        for x in vals:
            if np.isfinite(x[0]):
                assert t(x, t.identity) == x and t(t.identity, x) == x
            same = np.asarray(_lse_finish(t(x, t.identity))).tobytes() == np.asarray(_lse_finish(x)).tobytes()
            assert same or np.isnan(x[0]) and np.isnan(_lse_finish(t(x, t.identity)))
            for y in vals:
                u, v = t(x, y), t(y, x)
                if all(np.isfinite(z[0]) or z[1] == 0 for z in (x, y)):
                    assert np.asarray(u).tobytes() == np.asarray(v).tobytes() or np.isnan(u[0]) and np.isnan(v[0])
                fu, fv = _lse_finish(u), _lse_finish(v)
                assert np.asarray(fu).tobytes() == np.asarray(fv).tobytes() or np.isnan(fu) and np.isnan(fv), (x, y)


def _lse_values(rng, n, dtype, special):
    v = (5 * rng.standard_normal(n)).astype(dtype)
    if special and n > 300:
        v[::97] = -np.inf  # chains mixing -inf with finite values, and one of -inf alone
        v[256 + 5:256 + 5 + 8 * 32:32] = -np.inf
        v[3 * 256 + 7] = np.inf
        v[2 * 256 + 1] = np.nan
    return v


def test_prod_var_and_logsumexp_are_splits_of_the_tree(rng):
    """The emulators compute the documented tree (var's and logsumexp's chains formed at once, as
    chain_state defines them), and the full, rows and strided kernels' splits (and var's column kernel)
    give their bits; complex products with factors of exactly 1 + 0i and -0 parts among them."""
    for n in (40, 1100):  # 1100: 5 leaves, 2 chunks of float32, the last one partial
        complex_factors = []
        for dtype in COMPLEX_DTYPES:
            v = _near_one(rng, n, dtype)
            v[::7] = 1
            v[3::11].imag = -0.0
            complex_factors.append((_ProdTree(dtype), v))
        for t, v in ((_ProdTree(np.float32), (1 + 0.1 * rng.standard_normal(n)).astype(np.float32)),
                     *complex_factors,
                     (_LseTree(np.float32), _lse_values(rng, n, np.float32, False)),
                     (_LseTree(np.float64), _lse_values(rng, n, np.float64, True)),
                     (_VarTree(np.float32), (1e4 + rng.standard_normal(n)).astype(np.float32) - np.float32(1e4)),
                     (_VarTree(np.float64), rng.standard_normal(n))):
            if isinstance(t, _LseTree) and v.dtype == np.float64 and n > 40:
                continue  # float64's emulated exp is the slowest step here; float32's 1100 splits the same way
            if isinstance(t, _LseTree):
                m, s = tree._lse_tree(v[None])
                want = (v.dtype.type(m[0]), v.dtype.type(s[0]))
            elif isinstance(t, _VarTree):
                want = tuple(v.dtype.type(u[0]) for u in tree._moments_tree(v[None]))
            else:
                want = reference.reduction_tree(v[None], t.combine, t.identity)[0]
            want = np.asarray(want).tobytes()
            assert np.asarray(_by_definition(t, v)).tobytes() == want, (n, type(t))
            # the chunks of 2-byte inputs too (float trees' half types); complex inputs come in one size
            halves = isinstance(t, (_ProdTree, _VarTree)) and v.dtype.kind == "f"
            for itemsize in (v.itemsize, 2) if halves else (v.itemsize,):
                cv, size = P.lane_elements(itemsize), P.chunk_elements(itemsize)
                chunks = [_chunk(t, v, q * size, 32, cv) for q in range(_cdiv(n, size))]
                for block, grid in ((64, 2),):
                    assert np.asarray(_full_split(t, chunks, block, grid)).tobytes() == want
                for tpr in sorted({P.row_tpr(n, itemsize, P.COMPACT_KNOBS), 32, 64}):
                    assert np.asarray(_row(t, v, itemsize, tpr)).tobytes() == want
            if isinstance(t, _VarTree):
                for q in (1, 4):
                    leaves = [_col_leaf(t, v, k, q) for k in range(_cdiv(n, LEAF))]
                    for span in (1, 2):
                        assert np.asarray(_col_split(t, leaves, span, _cdiv(len(leaves), span))).tobytes() == want
            assert np.asarray(_strided(t, v)).tobytes() == want


def test_lift_modes_add_no_kernels_and_compact_ops_few():
    """The NaN-aware ops reuse the sum / max / min kernels (a run-time lift mode in ``finalize``); the counts,
    any and all the sum kernels' code with float64 accumulators, stored as their results (float64, int64,
    bool: full and rows kernels only); prod and logsumexp have four kernels a dtype (full, two rows,
    strided), no column kernel."""
    lifted = {"nansum": "sum", "nanmax": "amax", "nanmin": "amin"}
    for name, base in lifted.items():
        for t in P.OPS[name].inputs:
            assert P.kernel_dtypes(name, t) == P.kernel_dtypes(base, t)
    combos = {(t, o, op) for t, o, op in P.kernel_combos()}
    for name in P.COUNT_OPS:
        for t in P.OPS[name].inputs:
            (o,) = P.kernel_dtypes(name, t)
            assert (t, o, P.OP_SUM) in combos and P.acc_dtype(o) == P.F64, (name, t, o)
            assert o == {"count_nonzero": P.COUNT, "count_not_nan": P.F64}.get(name, P.BOOL)
    own = [i for i in P.instantiations() if i.args[1] in (P.COUNT, P.BOOL)]
    assert own and all(i.name in ("reduce_full", "reduce_rows") for i in own)
    insts = P.instantiations()
    for op, dtypes in ((P.OP_PROD, 9), (P.OP_LSE, 4)):
        # logsumexp's b and complex x: kernels of their own (reduce_lse_weighted, reduce_lse_complex)
        mine = [i for i in insts if i.args[2] == op and i.name not in ("reduce_lse_weighted", "reduce_lse_complex")]
        assert len(mine) == 4 * dtypes and not any(i.name.startswith("reduce_cols") for i in mine)
    assert P.OPS["nansum"].mode == P.LIFT_SKIP_NAN << P.FINISH_BITS
    assert P.OPS["count_nonzero"].mode == P.LIFT_NONZERO << P.FINISH_BITS
    src = (Path(P.__file__).parent.parent / "cuda_src" / "reduce.cu").read_text()
    assert (f"LIFT_PLAIN = {P.LIFT_PLAIN}, LIFT_SKIP_NAN = {P.LIFT_SKIP_NAN}, LIFT_NONZERO = {P.LIFT_NONZERO}, "
            f"LIFT_NOT_NAN = {P.LIFT_NOT_NAN}") in src
    assert f"FINISH_BITS = {P.FINISH_BITS};" in src and f"OP_PROD = {P.OP_PROD}, OP_LSE = {P.OP_LSE}" in src
    # Every lifted op's kernels implement its lift (integer inputs never hold a NaN: skipping is plain there),
    # and only the full and row kernels lift: other layouts are copied to rows.
    for name, op in P.OPS.items():
        for t in op.inputs:
            for o in P.kernel_dtypes(name, t):
                modes = P.lift_modes(t, o, op.kernel_op)
                assert modes >> op.lift & 1 or (op.lift == P.LIFT_SKIP_NAN and t not in P.FLOATS) or (
                    op.lift == P.LIFT_NONZERO and t == np.bool_), (name, t, o)
                if op.lift != P.LIFT_PLAIN:
                    for shape, axis in (((300, 40), 0), ((9, 8, 7), (0, 2)), ((5, 6), 1), ((50,), None)):
                        assert P.plan(shape, t, axis, op=name).layout.kind in ("rows", "full"), (name, shape)
    # Lifted rows always take the one rows block that lifts, whatever the knobs (the tuner's included).
    assert f"ROW_LIFT_BLOCK = {P.ROW_SMALL_BLOCK};" in src
    for knobs in [P.DEFAULT_KNOBS, P.Knobs(row_max_tpr=1024, row_items=8), *_tuner_knobs()]:
        for length in (1, 100, 5000, 1 << 20):
            pl = P.plan((7, length), np.float32, 1, op="nansum", knobs=knobs)
            assert pl.layout.kind != "rows" or pl.kernel.block == P.ROW_SMALL_BLOCK, (knobs, length)
    # The full kernel hands the lift to its chunks (the one line reduce_full's body needs for it).
    assert "lift_of(finalize)" in src[src.index("void full_reduce_body"):src.index("__global__ void CUKERN_BOUNDS(BLOCK)\n    reduce_full")]


def test_new_ops_plan_only_instantiated_kernels():
    insts = set(P.instantiations())
    cases = (((1 << 20,), None), ((64, 4096), 1), ((1 << 18, 8), 0), ((300, 40), 0), ((7, 9, 11), (0, 2)),
             ((9, 8, 7, 6), (1, 3)), ((3, 1 << 16), 1))
    for name in ("nansum", "nanmax", "nanmin", "count_nonzero", "count_not_nan", "any", "all", "prod", "logsumexp"):
        for t in P.OPS[name].inputs:
            for shape, axis in cases:
                pl = P.plan(shape, t, axis, op=name)
                final = P.default_dtype(name, t)
                o = t if name in P.MINMAX_OPS else P.kernel_dtype(name, t, final)
                if P.OPS[name].kernel_op in P.COMPACT_KERNEL_OPS:
                    assert pl.layout.kind != "cols" and pl.fold is None
                for inst in P.plan_instantiations(pl, t, o, P.OPS[name].kernel_op):
                    assert inst in insts, (name, inst)


def test_new_ops_result_dtypes_follow_numpy():
    for t in (np.float32, np.float64, np.float16, np.int32, np.int64, np.bool_):
        x = np.ones(3, t)
        assert P.default_dtype("prod", t) == np.prod(x).dtype
        assert P.default_dtype("nansum", t) == np.nansum(x).dtype
        if t != np.bool_:
            assert P.default_dtype("nanmax", t) == np.nanmax(x).dtype
        assert P.default_dtype("count_nonzero", t) == np.int64
    assert P.result_dtype("nansum", np.float32, np.float64) == np.float64


def test_new_ops_validate_before_any_launch():
    for fn, bad in ((R.nansum, fake_array((4,), "datetime64[s]")), (R.nanmax, fake_array((4,), "datetime64[s]")),
                    (R.prod, fake_array((4,), "datetime64[s]")), (R.logsumexp, fake_array((4,), np.complex64)),
                    (R.count_nonzero, fake_array((4,), "timedelta64[s]")),
                    (R.nanmean, fake_array((4,), "datetime64[s]")), (R.var, fake_array((4,), "timedelta64[s]"))):
        with pytest.raises(TypeError):
            fn(bad)
    with pytest.raises(TypeError):
        R.any(np.ones(3, np.float32))  # a host array


def _gpu_views(cupy, xh):
    """x as a C-contiguous array; for float32 also a negative-stride view and a view 4 bytes off 16-byte
    alignment (the other dtypes take the same code paths)."""
    x = cupy.asarray(xh)
    if xh.dtype != np.float32:
        return {"c": x}
    flipped = cupy.asarray(np.ascontiguousarray(xh[::-1]))[::-1]
    buf = cupy.empty(xh.size * xh.itemsize + 16, np.uint8)
    off = buf[4:4 + xh.size * xh.itemsize].view(xh.dtype).reshape(xh.shape) if xh.itemsize <= 4 else x
    off[...] = x
    return {"c": x, "flipped": flipped, "misaligned": off}


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", NAN_DTYPES, ids=dtype_name)
def test_nan_ops_bits_match_the_emulators(dtype):
    import cupy

    rng = np.random.default_rng(71)
    for shape, axis in (((100003,), None), ((33, 4099), 1), ((5000, 33), 0), ((17, 1), 1), ((0, 5), 1)):
        for where in ("some", "all"):
            xh = _nan_data(rng, shape, dtype, where)
            for label, x in _gpu_views(cupy, xh).items():
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", RuntimeWarning)
                    for name in ("nansum", "nanmean", "nanmax", "nanmin", "count_nonzero", "any", "all"):
                        if name in ("nanmax", "nanmin") and 0 in shape:
                            continue
                        got = cupy.asnumpy(getattr(R, name)(x, axis=axis))
                        want = getattr(reference, f"{name}_emulated")(xh, axis=axis)
                        assert same_bits(got, want), (name, shape, axis, where, label)
                    ref = reference.reduce_nansum(xh, axis)
                    _close(cupy.asnumpy(R.nansum(x, axis=axis)), ref, dtype, ("nansum", shape, label))
                    hits = np.count_nonzero(xh.astype(np.float64), axis=axis)
                    assert np.array_equal(cupy.asnumpy(R.any(x, axis=axis)), hits > 0)
                    n = xh.size // max(1, np.asarray(hits).size)
                    assert np.array_equal(cupy.asnumpy(R.all(x, axis=axis)), hits == n)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64, np.int32, np.bool_], ids=dtype_name)
def test_counts_any_and_all_are_one_launch_into_their_result_and_captured(dtype):
    """count_nonzero, any and all: the kernels store the count (int64) or its test (bool) themselves, so the
    full and rows layouts run with no temporary: the emulators' bits eagerly, into ``out`` and replayed from a
    CUDA graph on new contents (no pool block freed while capturing); a column layout still copies first."""
    import cupy

    rng = np.random.default_rng(17)

    def fresh(shape):
        v = rng.choice([0, 0, 1, -2], shape).astype(np.float64)
        if np.dtype(dtype).kind == "f":
            v[rng.random(shape) < 0.1] = np.nan
        h = v.astype(dtype)
        h[:2] = 1  # every element of some rows non-zero: all is True there
        return h

    cases = [((100003,), None), ((64, 4099), 1), ((9, 5, 33), (1, 2)), ((5, 1), 1), ((0, 7), 1), ((7, 0), 1)]
    stream = cupy.cuda.Stream(non_blocking=True)
    for shape, axis in cases:
        xh = fresh(shape)
        x = cupy.asarray(xh)
        for name in ("count_nonzero", "any", "all"):
            fn, emulated = getattr(R, name), getattr(reference, f"{name}_emulated")
            want = emulated(xh, axis=axis)
            got = fn(x, axis=axis)
            assert same_bits(got, want) and got.dtype == want.dtype, (name, shape, axis)
            assert np.array_equal(cupy.asnumpy(got), getattr(np, name)(xh, axis=axis)), (name, shape, axis)
            kw = {} if name == "count_nonzero" else {"out": cupy.zeros(want.shape, np.bool_)}
            with stream:
                fn(x, axis=axis, **kw)  # the stream's workspace
                stream.synchronize()
                graph, got, freed = capture(stream, lambda: fn(x, axis=axis, **kw))
                assert not freed, (name, shape, axis)
                xh2 = fresh(shape)
                x[...] = cupy.asarray(xh2)
                graph.launch(stream)
                stream.synchronize()
            assert same_bits(got, emulated(xh2, axis=axis)), (name, shape, axis)
            if kw:
                assert got is kw["out"]
            xh = xh2  # x holds the replay's contents for the next op
    xc = cupy.asarray(fresh((3000, 40)))
    for name in ("count_nonzero", "any", "all"):
        got = getattr(R, name)(xc, axis=0)  # copied to rows first: eager only
        assert same_bits(got, getattr(reference, f"{name}_emulated")(cupy.asnumpy(xc), axis=0)), name


@pytest.mark.gpu
def test_nan_ops_warn_as_numpy_and_write_out():
    import cupy

    x = cupy.asarray(np.array([[np.nan, np.nan], [1.0, np.nan]], np.float32))
    with pytest.warns(RuntimeWarning, match="All-NaN slice encountered"):
        r = R.nanmax(x, axis=1)
    assert np.array_equal(cupy.asnumpy(r), np.array([np.nan, 1], np.float32), equal_nan=True)
    for dtype, out in ((np.complex64, None), (None, cupy.zeros(2, np.complex128)), (np.float16, None)):
        with pytest.warns(RuntimeWarning, match="All-NaN slice encountered"):  # a NaN in any float result
            r = R.nanmin(x, axis=1, dtype=dtype, out=out)
        assert np.array_equal(cupy.asnumpy(r), np.array([np.nan, 1]).astype(r.dtype), equal_nan=True), r.dtype
    with pytest.warns(RuntimeWarning, match="Mean of empty slice"):
        R.nanmean(x, axis=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert float(R.nanmax(x[1])) == 1 and float(R.nansum(x)) == 1
    out = cupy.full(2, 7.0, np.float32)
    assert R.nansum(x, axis=1, out=out) is out and cupy.asnumpy(out).tolist() == [0, 1]
    b = cupy.zeros(2, np.bool_)
    assert R.any(x, axis=0, out=b) is b and cupy.asnumpy(b).all()
    assert bool(R.all(cupy.zeros((0,), np.float32))) and not bool(R.any(cupy.zeros((0,), np.float32)))
    assert int(R.count_nonzero(cupy.asarray(np.array([0, -0.0, np.nan, 2], np.float32)))) == 2
    xi = cupy.arange(-3, 4, dtype=np.int32)
    assert int(R.count_nonzero(xi)) == 6 and R.count_nonzero(xi).dtype == np.int64
    assert float(R.nanmean(xi)) == 0.0 and R.nanmean(xi).dtype == np.float64
    assert int(R.nanmax(xi)) == 3 and int(R.nansum(xi)) == 0 and R.nansum(xi).dtype == np.int64
    # A column layout of a lifted op is copied to rows first: the same bits as the emulator's.
    xc = _nan_data(np.random.default_rng(3), (3000, 40), np.float32, "some")
    got = cupy.asnumpy(R.nansum(cupy.asarray(xc), axis=0))
    assert got.tobytes() == reference.nansum_emulated(xc, axis=0).tobytes()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_name)
def test_prod_bits_match_the_emulator(dtype):
    import cupy

    rng = np.random.default_rng(72)
    for shape, axis in (((100003,), None), ((33, 4099), 1), ((5000, 33), 0), ((6, 7, 65), (0, 2)), ((17, 1), 1),
                        ((0, 5), 0)):
        if np.dtype(dtype).kind in "biu":
            xh = rng.integers(-3, 4, shape).astype(dtype)
        else:
            xh = (1 + 0.01 * rng.standard_normal(shape)).astype(dtype)
        want = reference.prod_emulated(xh, axis=axis)
        for label, x in _gpu_views(cupy, xh).items():
            got = cupy.asnumpy(R.prod(x, axis=axis))
            assert same_bits(got, want), (shape, axis, label)
        if np.dtype(dtype).kind not in "biu":
            _close(got, reference.reduce_prod(xh, axis), dtype, shape, rtol=1e-3 if xh.itemsize == 4 else None)
        v = R._reduce("prod", cupy.asarray(xh), axis, None, False, None, knobs=P.DEFAULT_KNOBS, sm=7)
        assert same_bits(cupy.asnumpy(v), want), ("knobs", shape, axis)


def _complex_views(cupy, xh):
    """(device array, the host array it shows) pairs: x as it is, every axis reversed, every other element
    of the last axis, and for complex64 a view 8 bytes off 16-byte alignment (one element a load)."""
    x = cupy.asarray(xh)
    back = (slice(None, None, -1),) * xh.ndim
    views = {"c": (x, xh), "reversed": (x[back], xh[back]), "every other": (x[..., ::2], xh[..., ::2])}
    if xh.dtype == np.complex64:
        buf = cupy.empty(xh.nbytes + 16, np.uint8)
        off = buf[8:8 + xh.nbytes].view(xh.dtype).reshape(xh.shape)
        off[...] = x
        views["misaligned"] = (off, xh)
    return views


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", COMPLEX_DTYPES, ids=dtype_name)
def test_complex_prod_bits_match_the_emulator(dtype):
    """Every layout (full, rows, strided for columns, copied), strides of either sign, misalignment, keepdims,
    out, complex targets, empty slices (1+0j) and infinite, NaN and -0 parts: the emulator's bits, whatever
    the knobs and the SM count; NumPy's product within rounding."""
    import cupy

    rng = np.random.default_rng(74)
    for shape, axis in (((100003,), None), ((33, 4099), 1), ((5000, 33), 0), ((6, 7, 65), (0, 2)), ((17, 1), 1),
                        ((0, 5), 0), ((64, 300), -1), ((9, 8, 7), (1, 2)), ((4, 5, 6), None)):
        xh = _near_one(rng, shape, dtype)
        if xh.size > 10:
            xh.reshape(-1)[::97] = 1  # exact identities among the factors
        for label, (x, h) in _complex_views(cupy, xh).items():
            assert same_bits(R.prod(x, axis=axis), reference.prod_emulated(h, axis=axis)), (shape, axis, label)
        x = cupy.asarray(xh)
        want = reference.prod_emulated(xh, axis=axis)
        _close(cupy.asnumpy(R.prod(x, axis=axis)), reference.reduce_prod(xh, axis), dtype, shape,
               rtol=1e-3 if dtype == np.complex64 else None)
        assert same_bits(R.prod(x, axis=axis, keepdims=True), reference.prod_emulated(xh, axis=axis, keepdims=True))
        out = cupy.full(want.shape, 7, dtype)
        assert R.prod(x, axis=axis, out=out) is out and same_bits(out, want), (shape, axis)
        wide = reference.prod_emulated(xh, axis=axis, dtype=np.complex128)
        assert same_bits(R.prod(x, axis=axis, dtype=np.complex128), wide), (shape, axis)
        real = xh.real.copy()
        got = R.prod(cupy.asarray(real), axis=axis, dtype=dtype)
        assert same_bits(got, reference.prod_emulated(real, axis=axis, dtype=dtype)), (shape, axis)
        for knobs, sm in ((P.DEFAULT_KNOBS, 7), (P.Knobs(full_block=64, full_unroll=2, row_max_tpr=256), 142)):
            v = R._reduce("prod", x, axis, None, False, None, knobs=knobs, sm=sm)
            assert same_bits(v, want), (shape, axis, knobs, sm)
    special = _near_one(rng, (5, 300), dtype)
    special[0, 5] = _complex(np.inf, 0.0, dtype)
    special[1, 7] = _complex(np.nan, 1.0, dtype)
    special[2, :8] = _complex(-0.0, -0.0, dtype)
    special[3, 33] = _complex(0.5, -np.inf, dtype)
    special[4, ::2] = _complex(-1.0, -0.0, dtype)
    for layout, axis in ((special, 1), (np.ascontiguousarray(special.T), 0)):
        got = R.prod(cupy.asarray(layout), axis=axis)
        assert same_bits(got, reference.prod_emulated(layout, axis=axis)), axis


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", NAN_DTYPES, ids=dtype_name)
def test_logsumexp_bits_match_the_emulator(dtype):
    import cupy

    rng = np.random.default_rng(73)
    for shape, axis in (((100003,), None), ((33, 4099), 1), ((5000, 33), 0), ((6, 7, 65), (0, 2)), ((17, 1), 1),
                        ((0, 5), 0), ((64, 300), -1)):
        xh = (20 * rng.standard_normal(shape)).astype(dtype)
        if xh.size > 10:
            xh.reshape(-1)[::97] = -np.inf
        want = reference.logsumexp_emulated(xh, axis=axis)
        for label, x in _gpu_views(cupy, xh).items():
            got = cupy.asnumpy(R.logsumexp(x, axis=axis))
            assert same_bits(got, want), (shape, axis, label)
        _close(got, reference.reduce_logsumexp(xh, axis), dtype, shape)
        # The same bits for other knobs (kernels compiled on the fly) and SM counts.
        points = ((P.COMPACT_KNOBS, 7), (P.Knobs(full_block=256, full_unroll=2, row_max_tpr=256), 142))
        for knobs, sm in points if dtype == np.float32 else points[:1]:
            v = R._reduce("logsumexp", cupy.asarray(xh), axis, None, False, None, knobs=knobs, sm=sm)
            assert same_bits(cupy.asnumpy(v), want), (shape, knobs, sm)
    special = np.array([[-np.inf] * 300, [np.inf] + [1.0] * 299, [np.nan] + [1.0] * 299], dtype)
    got = cupy.asnumpy(R.logsumexp(cupy.asarray(special), axis=1)).astype(np.float64)
    assert got[0] == -np.inf and got[1] == np.inf and np.isnan(got[2])


@pytest.mark.gpu
def test_var_and_logsumexp_special_chains_match_the_emulator():
    """Chains formed at once (chain_state) on every kernel path: partial chains (odd lengths), chains of
    -inf alone or mixed, +inf, NaN, constant slices; full, rows, columns (var) and strided layouts."""
    import cupy

    rng = np.random.default_rng(29)
    for dt in (np.float32, np.float64, BFLOAT16):
        for n in (7, 257, 4099):
            x = (10 * rng.standard_normal((8, n))).astype(np.float32)
            x[1] = -np.inf
            x[2, ::3] = -np.inf
            x[3, n // 2] = np.inf
            x[4, n - 1] = np.nan
            x[5, 0], x[5, n - 1] = -np.inf, np.inf
            x[6] = 3.5
            x[7, 1::2] = -np.inf
            xh = x.astype(dt)
            for layout, axis in ((xh, 1), (np.ascontiguousarray(xh.T), 0), (xh.reshape(2, 4, n), (0, 2))):
                d = cupy.asarray(layout)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    assert same_bits(R.logsumexp(d, axis=axis), reference.logsumexp_emulated(layout, axis=axis)), \
                        (dt, n, axis)
                    assert same_bits(R.var(d, axis=axis), reference.var_emulated(layout, axis=axis)), (dt, n, axis)
            row = cupy.asarray(xh[2])
            assert same_bits(R.logsumexp(row), reference.logsumexp_emulated(xh[2])), (dt, n)
            assert same_bits(R.var(cupy.asarray(xh[0])[1:]), reference.var_emulated(xh[0, 1:])), (dt, n)


@pytest.mark.gpu
def test_new_ops_bad_input_raises_before_launch():
    import cupy

    x = cupy.ones((4, 5), np.float32)
    for call, err in ((lambda: R.nansum(x, axis=2), np.exceptions.AxisError),
                      (lambda: R.nanmean(x, axis=0, out=cupy.empty(4, np.float32)), ValueError),
                      (lambda: R.any(x, axis=0, out=cupy.empty(4, np.bool_)), ValueError),
                      (lambda: R.all(x, axis=1, out=cupy.empty(5, np.bool_)), ValueError),
                      (lambda: R.prod(cupy.ones(3, np.complex64), dtype=np.float32), TypeError),
                      (lambda: R.logsumexp(x, out=x[0, 0]), ValueError),
                      (lambda: R.nansum(cupy.ones(3, np.complex64), dtype=np.float32), TypeError),
                      (lambda: R.nanmax(cupy.zeros((0, 3), np.float32), axis=0), ValueError)):
        with pytest.raises(err):
            call()
    assert float(x.sum()) == 20


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["var", "std"])
def test_variances_without_freedom_are_numpys(name):
    """ddof >= n: NumPy's values (an empty slice over a negative ddof is 0; complex (M2_re + M2_im) / 0 is inf
    unless both are 0) and its "Degrees of freedom <= 0" warning, also where a size-1 slice is lowered (an
    integer x, a float64 dtype= of float32) or the parts of complex x are reduced."""
    import cupy

    cases = [(np.zeros(0, np.float32), None, -1, {}), (np.zeros((3, 0)), 1, -2, {}),
             (np.array([1 + 2j, 3 + 0j], np.complex64), None, 2, {}), (np.array([1 + 0j, 1 + 0j]), None, 5, {}),
             (np.array([[1 + 1j], [2 + 0j]], np.complex64), 1, 1, {}),
             (np.arange(-3, 4, dtype=np.int8)[:, None], 1, 1, {}),
             (np.float32([[1.5], [2.0]]), 1, 1, {"dtype": np.float64})]
    for x, axis, ddof, kw in cases:
        with warnings.catch_warnings(record=True) as theirs, np.errstate(all="ignore"):
            warnings.simplefilter("always")
            want = getattr(np, name)(x, axis=axis, ddof=ddof, **kw)
        with warnings.catch_warnings(record=True) as ours:
            warnings.simplefilter("always")
            got = getattr(R, name)(cupy.asarray(x), axis=axis, ddof=ddof, **kw)
        label = (x.dtype, axis, ddof)
        assert got.shape == np.shape(want) and got.dtype == np.asarray(want).dtype, label
        assert same_bits(got, getattr(reference, f"{name}_emulated")(x, axis=axis, ddof=ddof, **kw)), label
        np.testing.assert_array_equal(got.get(), want, err_msg=str(label))
        freedom = [str(w.message) for w in ours if "Degrees of freedom" in str(w.message)]
        assert len(freedom) == any("Degrees of freedom" in str(w.message) for w in theirs), (label, freedom)
