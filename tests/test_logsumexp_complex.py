"""Complex logsumexp (SciPy's: the principal log of sum(b exp(x)), or log|sum| and sum / |sum| with
return_sign). CPU: cukern's own cos, sin, atan2 and log|s| (reduce.cu ``Trig``) against long double and exact
rationals, their constants against the kernel's and against exact values, the emulator against a long-double
reference within a bound scaled by the sum's condition, SciPy's semantics on special values and on SciPy's and
CuPy's own cases, the dtype rule, the merge's commutativity, the plan and validation; NVRTC: the two kernels on
every architecture; GPU: bits against the emulator."""

from __future__ import annotations

import math
import re
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from _support import ARCHS, fake_array, same_bits

from cukern import reduce as R
from cukern import reduce_plan as P
from cukern import reference
from cukern._dtypes import BFLOAT16
from cukern.reference import _elementary as E
from cukern.reference import reductions as tree

INF, NAN = np.inf, np.nan
C64, C128 = np.dtype(np.complex64), np.dtype(np.complex128)
SRC = (Path(P.__file__).parent.parent / "cuda_src" / "reduce.cu").read_text()
# long double's significand: 64 bits on x86 (the accuracy tests' reference), 53 where it is double
WIDE = np.finfo(np.longdouble).nmant >= 63
needs_wide = pytest.mark.skipif(not WIDE, reason="long double is double here: no wider reference")


# ---------------------------------------------------------------------------------------------------------
# Exact values: pi by Machin's formula in integers, atan by argument halving and its series (rationals).

def _atan_inv(n: int, bits: int) -> int:
    """atan(1/n) 2^bits, truncated terms."""
    total, term, k, sign = 0, (1 << bits) // n, 1, 1
    while term:
        total += sign * (term // k)
        term //= n * n
        k, sign = k + 2, -sign
    return total


def _pi(bits: int = 1600) -> Fraction:
    guard = bits + 32
    return Fraction((16 * _atan_inv(5, guard) - 4 * _atan_inv(239, guard)) >> 32, 1 << bits)


PI = _pi()


def _sqrt(x: Fraction, bits: int = 400) -> Fraction:
    return Fraction(math.isqrt(int(x * (1 << (2 * bits)))), 1 << bits)


def _atan(x: Fraction, bits: int = 300) -> Fraction:
    """atan(x) for 0 <= x <= 1 to about 2^-bits: three halvings (atan x = 2 atan(x / (1 + sqrt(1 + x^2)))), then
    the series."""
    for _ in range(3):
        x = Fraction(int(x / (1 + _sqrt(1 + x * x)) * (1 << bits)), 1 << bits)
    total, p, k, x2 = Fraction(0), x, 1, x * x
    while p > Fraction(1, 1 << (bits + 8)):
        total += p / k if k % 4 == 1 else -p / k
        p = Fraction(int(p * x2 * (1 << bits)), 1 << bits)
        k += 2
    return 8 * total


def _ulp(v: float, dtype) -> float:
    """The spacing of ``dtype`` at |v| (its smallest normal's below that)."""
    t = np.dtype(dtype).type
    return float(np.spacing(t(max(abs(v), np.finfo(t).tiny))))


def _ulps(got, want, dtype):
    """|got - want| in ulps of ``dtype`` at want (long double arithmetic)."""
    got, want = np.asarray(got).astype(np.longdouble), np.asarray(want).astype(np.longdouble)
    t = np.dtype(dtype)
    scale = np.exp2(np.floor(np.log2(np.maximum(np.abs(want), np.finfo(t).tiny).astype(np.float64))))
    return np.abs(got - want) / (scale.astype(np.longdouble) * np.finfo(t).eps)


def _circular(a, b):
    """|a - b| for angles, around the circle (SciPy's branch puts -pi at +pi)."""
    d = np.abs(a - b)
    return np.minimum(d, 2 * np.arctan2(d.dtype.type(0), d.dtype.type(-1)) - d)


def _arguments(rng, dtype):
    """Arguments for cos and sin: small ones, the Cody-Waite range, huge ones (every exponent), subnormal
    ones, the known hardest reductions and the floats nearest k pi/2 (k past the bound) with neighbours."""
    t = np.dtype(dtype).type
    big = float(np.finfo(t).max)
    bound = float(E._trig(dtype)["cody_waite_max"])
    a = [rng.uniform(-10, 10, 60000), rng.uniform(-bound, bound, 60000),
         np.exp(rng.uniform(0, math.log(big), 60000)) * rng.choice([-1, 1], 60000),
         rng.uniform(0.5, 1, 2000) * big, rng.uniform(-1, 1, 2000) * float(np.finfo(t).tiny)]
    k = np.unique(np.concatenate([np.arange(1, 5000), rng.integers(1, int(bound * 2), 20000)]))
    near = (k * (math.pi / 2)).astype(t)
    a += [near, np.nextafter(near, t(0)), np.nextafter(near, t(np.inf))]
    hard = [6381956970095103 * 2.0**797, 5261692873635770 * 2.0**499] if t is np.float64 else [16367173 * 2.0**72]
    return np.concatenate([np.asarray(v, np.float64).astype(t) for v in a + [hard]])


# ---------------------------------------------------------------------------------------------------------
# The elementary functions (CPU).

@needs_wide
@pytest.mark.parametrize("dtype", (np.float32, np.float64))
def test_cos_and_sin_are_within_0_9_ulp_for_every_finite_argument(dtype, rng):
    """Against glibc's long double cos and sin (64-bit significands, their own exact reduction): Cody and Waite
    below the bound, the exact reduction by 2/pi's bits above, the floats nearest k pi/2 (where a reduction
    loses most) and the worst cases known for the exact reduction. The most seen over 2.6 * 10^8 arguments of
    each type (1000 seeds of these draws): 0.79 ulp (float32), 0.81 (float64); the bound leaves a tenth above."""
    x = _arguments(rng, dtype)
    c, s = E._cis(x)
    assert c.dtype == s.dtype == np.dtype(dtype)
    wide = x.astype(np.longdouble)
    assert _ulps(c, np.cos(wide), dtype).max() <= 0.9
    assert _ulps(s, np.sin(wide), dtype).max() <= 0.9
    far = np.abs(x) >= E._trig(dtype)["cody_waite_max"]
    assert far.sum() > 1000 and (~far).sum() > 1000


@pytest.mark.parametrize("dtype", (np.float32, np.float64))
def test_the_reductions_are_exact_where_it_is_hardest(dtype):
    """x - q pi/2 as hi + lo against the exact remainder (pi to 1600 bits): the hardest doubles (x within 2^-61
    of a multiple of pi/2) and floats, each side of the Cody-Waite bound, the largest value, multiples near the
    bound: relative error below 2^-p (p the significand's bits), q the nearest multiple's."""
    t = np.dtype(dtype).type
    bound = float(E._trig(dtype)["cody_waite_max"])
    cases = [bound, float(np.nextafter(t(bound), t(0))), float(np.finfo(t).max), 1.5707963267948966, 1e6, 1e22]
    cases += [6381956970095103 * 2.0**797, 5261692873635770 * 2.0**499] if t is np.float64 else [16367173 * 2.0**72]
    for k in (1, 2, 3, 7, 1000, int(bound * 2 / math.pi)):
        cases.append(k * math.pi / 2)
    x = np.array(cases, np.float64).astype(t)
    near = x < bound
    got = [None] * len(x)
    for mask, fn in ((near, E._cody_waite), (~near, E._reduce_exact)):
        hi, lo, q = fn(x[mask])
        for i, h, low, qq in zip(np.flatnonzero(mask), hi, lo, q):
            got[i] = (Fraction(float(h)) + Fraction(float(low)), int(qq))
    for xi, (r, q) in zip(x, got):
        k = round(Fraction(float(xi)) / (PI / 2))
        exact = Fraction(float(xi)) - k * PI / 2
        assert q == k % 4, xi
        assert abs(r - exact) <= abs(exact) * Fraction(1, 1 << (np.finfo(t).nmant + 1)), (xi, float(exact))


def test_cos_and_sin_special_values():
    for t in (np.float32, np.float64):
        x = np.array([0.0, -0.0, INF, -INF, NAN, np.finfo(t).smallest_subnormal, -np.finfo(t).max], t)
        c, s = E._cis(x)
        assert same_bits(c[:2], np.ones(2, t)) and same_bits(s[:2], x[:2])  # sin(-0) = -0
        assert np.isnan(c[2:5]).all() and np.isnan(s[2:5]).all()
        assert c[5] == 1 and s[5] == x[5]
        cm, sm = E._cis(-x[[5, 6]])
        assert same_bits(cm, c[[5, 6]]) and same_bits(sm, -s[[5, 6]])  # cos even, sin odd, bit for bit


@needs_wide
@pytest.mark.parametrize("dtype", (np.float32, np.float64))
def test_phase_log_abs_and_sign_are_accurate(dtype, rng):
    """atan2 within 2 ulp (its phase at -pi given as +pi), log|s| within 1.25 ulp where |log|s|| >= 1 and
    1 eps absolute below, the sign s / |s| within 2.75 ulp, over parts of any magnitude (subnormal to the
    largest, either much larger than the other) and near |s| = 1. The most seen over 6 * 10^8 values of each
    type (1500 seeds of these draws), float32 / float64: 1.78 / 1.76, 1.12 / 1.12, 0.86 / 0.88 and 2.44 /
    2.44; each bound leaves a tenth or more above them, so that a fresh draw does not fail on a rare value."""
    t = np.dtype(dtype).type
    n = 200000
    mag = np.exp(rng.uniform(-80, 80, (2, n)))
    re = rng.standard_normal(n) * mag[0]
    im = rng.standard_normal(n) * np.where(rng.random(n) < 0.5, mag[0], mag[1])
    ang = rng.uniform(-np.pi, np.pi, n)
    rad = np.exp(rng.uniform(-2, 2, n))
    tiny, big = float(np.finfo(t).smallest_subnormal), float(np.finfo(t).max)
    re = np.concatenate([re, rad * np.cos(ang), [1, -1, -1, 0, 0, 1e-30, tiny, big, -big]])
    im = np.concatenate([im, rad * np.sin(ang), [0, 0, -0.0, 1, -1, 1e-30, 3 * tiny, big, tiny]])
    inside = (np.abs(re) <= big) & (np.abs(im) <= big)
    re, im = re[inside].astype(t), im[inside].astype(t)
    keep = (re != 0) | (im != 0)
    re, im = re[keep], im[keep]
    log_abs, scaled, sr, si = E._log_abs(re, im)
    phase = E._phase(*scaled)
    wr, wi = re.astype(np.longdouble), im.astype(np.longdouble)
    want = np.arctan2(wi, wr)
    # around the circle (SciPy's branch gives -pi as +pi, so an angle a rounding away from -pi may land on
    # either side of the cut), in ulps of the angle
    d = _circular(phase.astype(np.longdouble), want)
    assert _ulps(want + np.sign(want) * d, want, dtype).max() <= 2.0
    lw = np.log(np.hypot(wr, wi))
    err = np.abs(log_abs.astype(np.longdouble) - lw)
    big = np.abs(lw) >= 1
    assert _ulps(log_abs, lw, dtype)[big].max() <= 1.25
    assert (err[~big] / np.finfo(t).eps).max() <= 1.0
    absl = np.hypot(wr, wi)
    for got, part in ((sr, wr / absl), (si, wi / absl)):
        live = np.abs(part) > 1e-3
        assert _ulps(got, part, dtype)[live].max() <= 2.75
    assert (phase[:] <= np.float64(t(np.pi))).all() and (phase > -np.float64(t(np.pi))).all()


def test_phase_on_the_axes_and_the_branch_cut():
    for t in (np.float32, np.float64):
        c = E._trig(t)
        re = np.array([1, 0, -1, -1, 0, 1, -1, 3], t)
        im = np.array([0, 1, 0, -0.0, -1, 1, 1, -4], t)
        got = E._phase(*E._log_abs(re, im)[1])
        pi, pio2 = c["pi"][0], c["pio2"][0]
        want = [0, pio2, pi, pi, -pio2, pio2 / 2, 3 * pio2 / 2]
        assert same_bits(got[:7], np.array(want, t)), t
        assert abs(float(got[7]) - math.atan2(-4, 3)) <= _ulp(math.atan2(-4, 3), t)


def test_elementary_constants_are_the_kernels():
    """_elementary._TRIG and TWO_OVER_PI_WORDS hold reduce.cu's literals (the emulator's bits depend on them)."""
    for name, dtype, suffix in (("Trig<float>", np.float32, "f"), ("Trig<double>", np.float64, "")):
        body = SRC[SRC.index(f"template <> struct {name}"):]
        body = body[:body.index("kLimbs")]
        c = E._trig(dtype)
        lits = [dtype(float.fromhex(v)) for v in re.findall(r"(-?0x[0-9a-f.]+p[-+]\d+)" + suffix, body)]
        want = [c["two_over_pi"], c["magic"], c["cody_waite_max"], c["rest_min"], *c["pio2_parts"], *c["pio2"],
                *c["pi"], *c["sin"], *c["cos"], *c["atan"]]
        assert lits == want, name
        table = "kAtanSixteenthsF" if dtype is np.float32 else "kAtanSixteenthsD"
        rows = SRC[SRC.index(f"__constant__ {'float' if suffix else 'double'} {table}"):]
        rows = rows[:rows.index("};")]
        got = [dtype(float.fromhex(v)) for v in re.findall(r"(-?0x[0-9a-f.]+p[-+]\d+)" + suffix, rows)]
        assert got == c["atan_hi"] + c["atan_lo"], table
    words = SRC[SRC.index("__constant__ unsigned long long kTwoOverPiWords"):]
    words = words[:words.index("};")]
    assert [int(w, 16) for w in re.findall(r"0x([0-9a-f]{16})ull", words)] == list(E.TWO_OVER_PI_WORDS)


def test_elementary_constants_are_exact():
    """2/pi's words are its bits; pi/2, pi and atan(j/16) are hi + lo with hi the nearest float and lo the
    nearest to the rest; Cody and Waite's parts of pi/2 leave less than 2^-72 (float) and 2^-156 (double);
    the series' coefficients are Taylor's rounded, and truncating them costs below 0.025 ulp on their
    intervals."""
    bits = 64 * (len(E.TWO_OVER_PI_WORDS) - 1)
    assert int("".join(f"{w:016x}" for w in E.TWO_OVER_PI_WORDS), 16) == int(2 / PI * (1 << bits))

    def nearest(v: Fraction, t):
        f = t(float(v))  # float64 correctly rounded, then float32: check both neighbours for the nearest
        cands = [np.nextafter(f, t(-INF)), f, np.nextafter(f, t(INF))]
        return min(cands, key=lambda u: abs(Fraction(float(u)) - v))

    for t, slack in ((np.float32, 72), (np.float64, 156)):
        c = E._trig(t)
        for (hi, lo), v in ((c["pio2"], PI / 2), (c["pi"], PI)):
            assert hi == nearest(v, t) and lo == nearest(v - Fraction(float(hi)), t)
        for j in range(17):
            v = _atan(Fraction(j, 16))
            hi, lo = c["atan_hi"][j], c["atan_lo"][j]
            assert hi == nearest(v, t) and lo == nearest(v - Fraction(float(hi)), t), (t, j)
        assert abs(sum(Fraction(float(p)) for p in c["pio2_parts"]) - PI / 2) < Fraction(1, 1 << slack)
        assert c["two_over_pi"] == nearest(2 / PI, t)
        eps = np.finfo(t).eps
        for key, first, step, interval in (("sin", 3, 2, math.pi / 4), ("cos", 4, 2, math.pi / 4),
                                           ("atan", 3, 2, 1 / 16)):
            coefs = c[key]
            for i, v in enumerate(coefs):
                n = first + step * i
                exact = Fraction((-1) ** (n // 2), n if key == "atan" else math.factorial(n))
                assert v == nearest(exact, t), (key, i)
            n = first + step * len(coefs)
            nxt = interval**n / (n if key == "atan" else math.factorial(n))
            lead = {"sin": math.sin, "cos": math.cos, "atan": math.atan}[key](interval)
            assert nxt < 0.025 * eps * lead, (t, key)


def test_float32_fused_steps_and_exact_errors():
    """The emulator's exact pieces: two-product's error is a b - p exactly; the float32 Cody-Waite remainder
    and the exact reduction agree with exact arithmetic on sampled floats."""
    rng = np.random.default_rng(7)
    for t in (np.float32, np.float64):
        a, b = (rng.standard_normal(2000) * 10.0 ** rng.integers(-20, 20, 2000)).astype(t), rng.standard_normal(2000).astype(t)
        p, e = E._two_product(a, b)
        for i in range(0, 2000, 97):
            assert Fraction(float(p[i])) + Fraction(float(e[i])) == Fraction(float(a[i])) * Fraction(float(b[i]))
        s, err = E._two_sum(a, b)
        for i in range(0, 2000, 97):
            assert Fraction(float(s[i])) + Fraction(float(err[i])) == Fraction(float(a[i])) + Fraction(float(b[i]))


# ---------------------------------------------------------------------------------------------------------
# The emulator against long double (CPU).

def _condition(x, b, axis):
    """sum |terms| / |sum| of each output (long double): the sum's condition, which bounds the relative error
    of |sum| and the absolute error of its log and phase."""
    z, g = np.broadcast_arrays(np.asarray(x).astype(np.clongdouble),
                               np.ones(1, np.clongdouble) if b is None else np.asarray(b).astype(np.clongdouble))
    m = np.max(z.real, axis=axis, keepdims=True)
    terms = g * np.exp(z - m)
    return (np.sum(np.abs(terms), axis=axis) / np.abs(np.sum(terms, axis=axis))).astype(np.float64)


def _bound(dtype, kappa, n, value):
    """The error bound of the complex logsumexp. Each term w e^(x - m) (cos, sin) is within about 4.5 ulps
    (exp 2.5 for float32, cos and sin 0.77, the products one each), the tree adds 8 + log2(n / 8) roundings
    to each (chains of 8, then pairs), so the sum's error is below u (13 + log2 n) sum|terms| and that of log|s|
    and the phase below u (13 + log2 n) kappa; the finish adds a few ulps of the value (log|s| and the phase
    within 1.6, m + log|s| one more)."""
    u = float(np.finfo(P.real_of(dtype)).eps)
    return u * (kappa * (13 + math.log2(max(n, 1))) + 4 * np.abs(value))


@needs_wide
@pytest.mark.parametrize("dtype", (C64, C128), ids=str)
@pytest.mark.parametrize("shape, axis, weights", [
    ((64, 3000), 1, None), ((2000, 16), 0, None), ((100003,), None, None), ((7, 1), 1, None),
    ((5, 700), 1, (1, 700)), ((3, 4, 257), (0, 2), (257,)), ((4, 1, 2, 1), None, (3, 1, 5)), ((6, 33), 0, ()),
])
def test_emulator_is_close_to_long_double(dtype, shape, axis, weights, rng):
    """Random phases over several turns (a sum that partly cancels) and small ones, complex weights of either
    sign and some zero, within :func:`_bound`; the sign with return_sign too."""
    for spread in (20.0, 0.5):
        x = (3 * rng.standard_normal(shape) + 1j * rng.uniform(-spread, spread, shape)).astype(dtype)
        b = None
        if weights is not None:
            b = (rng.uniform(-0.3, 2, weights) + 1j * rng.uniform(-0.5, 0.5, weights)).astype(dtype)
            if b.size > 3:
                b.reshape(-1)[::4] = 0
        got = reference.logsumexp_complex_emulated(x, b, axis)
        want = reference.reduce_logsumexp(x, axis, b=b)
        assert got.dtype == dtype and got.shape == want.shape
        full = np.broadcast_shapes(shape, () if b is None else b.shape)
        n = math.prod(full) // max(1, got.size)
        kappa = _condition(x, b, axis)
        tol = _bound(dtype, kappa, n, want.real)
        assert (np.abs(got.real - want.real) <= tol).all()
        assert (_circular(got.imag.astype(np.float64), want.imag) <= tol + 2 * np.finfo(P.real_of(dtype)).eps).all()
        r, sign = reference.logsumexp_complex_emulated(x, b, axis, return_sign=True)
        assert r.dtype == P.real_of(dtype) and sign.dtype == dtype
        assert same_bits(r, got.real)
        wr, wsign = reference.reduce_logsumexp(x, axis, b=b, return_sign=True)
        assert (np.abs(sign - wsign) <= tol + 4 * np.finfo(P.real_of(dtype)).eps).all()


@needs_wide
def test_huge_and_tiny_phases_are_reduced_exactly():
    """Imaginary parts up to the largest float (the exact reduction) and tiny ones (SciPy's gh-21709: relative
    precision kept): the emulator against long double."""
    for dtype in (C64, C128):
        t = P.real_of(dtype).type
        im = np.array([1e30, -3e37, 2.5e38, 1e5, 2.0**17 + 0.5, 7.0e4], np.float64)
        if t is np.float64:
            im = np.concatenate([im, [1e300, -1.7e308, 6381956970095103 * 2.0**797]])
        x = (np.zeros_like(im) + 1j * im).astype(dtype)
        got = reference.logsumexp_complex_emulated(x.reshape(-1, 1), axis=1)
        want = np.log(np.exp(x.astype(np.clongdouble)))
        assert (np.abs(got.real) <= 2 * np.finfo(t).eps).all()
        assert (_circular(got.imag.astype(np.float64), want.imag.astype(np.float64)) <= 4 * np.finfo(t).eps).all()
    x = np.array([0, 2.2204460492503132e-17j])
    got = reference.logsumexp_complex_emulated(x)
    assert got.real == math.log(2) and abs(got.imag - 1.1102230246251566e-17) <= 1e-15 * 1.1102230246251566e-17


# ---------------------------------------------------------------------------------------------------------
# SciPy's semantics (CPU).

def _c(re, im=0.0):
    return complex(re, im)


# (x, b, the complex result, the return_sign pair): SciPy's principal log and sign where they are defined; the
# rules of reduce.cu's finish_complex elsewhere (an element of real part -inf adds 0 whatever its imaginary part
# is, as C's cexp gives; one of +inf adds b e^(i x_im); NaN for a NaN part or +inf that cancels).
SPECIAL = [
    ([1000, 1000], None, _c(1000 + math.log(2)), (1000 + math.log(2), 1)),
    ([1, 1, 1], [1, -1, -1], _c(1, math.pi), (1.0, -1)),
    ([1, 100], [1, 0], _c(1), (1.0, 1)),
    ([0, math.log(2)], [_c(0, 1), _c(0, -1)], _c(0, -math.pi / 2), (0.0, _c(0, -1))),
    ([1, 1], [1, -1], _c(-INF), (-INF, 0)),
    ([_c(INF, 1), 0], None, _c(INF, 1), (INF, _c(math.cos(1), math.sin(1)))),
    ([_c(-INF, NAN), 0], None, _c(0), (0.0, 1)),
    ([_c(-INF, INF), -INF], None, _c(-INF), (-INF, 0)),
    ([_c(NAN, 0), 1], None, _c(NAN, NAN), (NAN, _c(NAN, NAN))),
    ([_c(1, NAN), 0], None, _c(NAN, NAN), (NAN, _c(NAN, NAN))),
    ([_c(1, INF), 0], None, _c(NAN, NAN), (NAN, _c(NAN, NAN))),
    ([INF, INF], [1, -1], _c(NAN, NAN), (NAN, _c(NAN, NAN))),
    ([INF, 1], [_c(0, 2), 1], _c(INF, math.pi / 2), (INF, _c(0, 1))),
    ([_c(NAN, NAN), 3], [0, 1], _c(3), (3.0, 1)),
    ([1, 2], [0, 0], _c(-INF), (-INF, 0)),
    ([0, 0], [1e308, _c(0, 1e308)], _c(0.5 * math.log(2) + math.log(1e308), math.pi / 4),
     (0.5 * math.log(2) + math.log(1e308), _c(math.sqrt(0.5), math.sqrt(0.5)))),
    ([0, 0], [1e308, 1e308], _c(INF), (INF, 1)),
]


@pytest.mark.parametrize("x, b, value, signed", SPECIAL)
def test_special_values(x, b, value, signed):
    xs = np.array(x, np.complex128)
    bs = None if b is None else np.array(b, np.complex128)
    for dtype in (C128, C64):
        if dtype == C64 and any(abs(v) > 1e38 for v in (b or []) if np.isfinite(v)):
            continue
        got = reference.logsumexp_complex_emulated(xs.astype(dtype), None if bs is None else bs.astype(dtype))
        r, sign = reference.logsumexp_complex_emulated(xs.astype(dtype), None if bs is None else bs.astype(dtype),
                                                       return_sign=True)
        assert got.dtype == dtype and r.dtype == P.real_of(dtype) and sign.dtype == dtype
        tol = 8 * np.finfo(P.real_of(dtype)).eps * max(1, abs(value.real) if np.isfinite(value.real) else 1)
        for g, w in ((got.real, value.real), (got.imag, value.imag), (r, signed[0]),
                     (sign.real, complex(signed[1]).real), (sign.imag, complex(signed[1]).imag)):
            if np.isnan(w) or np.isinf(w):
                assert np.isnan(g) if np.isnan(w) else g == w, (x, b, dtype, g, w)
            else:
                assert abs(float(g) - w) <= tol, (x, b, dtype, g, w)
        want = reference.reduce_logsumexp(xs, b=bs)
        assert np.isnan(want) == np.isnan(value), (x, b, want)
        if not np.isnan(value) and not (np.isinf(value.real) and np.isfinite(want.real)):  # long double's wider range
            assert want == value or (np.isfinite(value) and abs(want - value) <= 1e-12 * max(1, abs(value))), (x, b)


def test_the_branch_cut_is_scipys():
    """The imaginary part lies in (-pi, pi]: a phase of -pi (a negative real sum with a zero or negative zero
    imaginary part, or an angle that rounds to -pi) is given as +pi, as SciPy's _wrap_radians gives it; a
    complex64 imaginary part of float32's pi (above pi) is one turn past the cut: its principal value is
    pi_f - 2 pi, where SciPy's float32 arithmetic gives pi_f."""
    pi = np.float64(np.pi)
    for x, want in (([_c(0, pi)], pi), ([_c(0, -pi)], pi), ([0, _c(0, 1e-300)], 5e-301), ([_c(0, -pi / 2)], -pi / 2)):
        got = reference.logsumexp_complex_emulated(np.array(x, C128))
        assert got.imag == want and abs(got.real - (math.log(2) if len(x) == 2 else 0)) <= 1e-16, x
    for b in ([-1, -1], [_c(-1, -0.0), _c(-1, -0.0)]):  # a sum of -2 + 0i: +pi, whatever the zeros' signs
        got = reference.logsumexp_complex_emulated(np.zeros(2, C128), np.array(b, C128))
        assert got.imag == pi and got.real == math.log(2)
    got = reference.logsumexp_complex_emulated(np.array([_c(0, np.pi)], C64))
    assert got.imag == np.float32(np.pi) - np.float32(2 * np.pi) + np.float32(np.pi) - np.float32(np.pi) or \
        abs(float(got.imag) - (float(np.float32(np.pi)) - 2 * np.pi)) <= 2.4e-7


def test_empty_slices_give_minus_inf_and_sign_minus_one():
    for b in (None, np.ones((1, 0), np.complex64)):
        x = np.ones((3, 0), np.complex64)
        got = reference.logsumexp_complex_emulated(x, b, 1)
        assert got.dtype == C64 and got.shape == (3,) and (got == -INF).all()
        r, g = reference.logsumexp_complex_emulated(x, b, 1, return_sign=True)
        assert r.dtype == np.float32 and (r == -INF).all() and g.dtype == C64 and (g == -1).all()
        r, g = reference.reduce_logsumexp(x, 1, b=b, return_sign=True)
        assert (r == -INF).all() and (g == -1).all()


def test_scipys_own_complex_cases():
    """scipy/special/tests/test_logsumexp.py (1.15-1.17): the complex sign (s exp(r) is the sum of exps, s its
    direction); gh-21610 (phases within (-pi, pi], close to log(sum(exp(x)))); small imaginary parts kept
    (gh-21709); the dtypes of a and b promoted (a complex one stays complex)."""
    a = np.array([1 + 1j, 2 - 1j, -2 + 3j])
    r, s = reference.logsumexp_complex_emulated(a, return_sign=True)
    total = np.sum(np.exp(a))
    np.testing.assert_allclose(s, total / abs(total), rtol=1e-14)
    np.testing.assert_allclose(s * np.exp(r), total, rtol=1e-14)
    rng = np.random.default_rng(324984329582349862)
    x = rng.uniform(1, 40, (10, 100)) + 1j * rng.uniform(1, 40, (10, 100))
    for dtype in (C64, C128):
        xd = x.astype(dtype)
        res = reference.logsumexp_complex_emulated(xd, axis=1)
        ref = np.log(np.sum(np.exp(xd.astype(np.complex128)), axis=1))
        assert (np.abs(res.imag) <= np.float32(np.pi)).all()
        np.testing.assert_allclose(res, ref, rtol=1e-6 if dtype == C64 else 1e-13)
        out, sgn = reference.logsumexp_complex_emulated(xd, axis=1, return_sign=True)
        np.testing.assert_allclose(out, np.real(np.log(np.sum(np.exp(xd.astype(np.complex128)), axis=1))),
                                   rtol=1e-6 if dtype == C64 else 1e-13)
        total = np.sum(np.exp(xd.astype(np.complex128)), axis=1)
        np.testing.assert_allclose(sgn, total / np.abs(total), rtol=1e-5 if dtype == C64 else 1e-12)
    for ta in ("float32", "float64", "int32", "int64", "complex64", "complex128"):
        for tb in ("float32", "float64", "int32", "int64", "complex64", "complex128"):
            want = np.result_type(ta, tb, np.float32)
            assert P.weighted_dtype(np.dtype(ta), np.dtype(tb)) == want, (ta, tb)
            if want.kind == "c":
                got = reference.logsumexp_complex_emulated(np.array([2, 1], ta), np.array([1, -1], tb))
                assert got.dtype == want
                np.testing.assert_allclose(got, math.log(math.exp(2) - math.exp(1)), rtol=1e-6)


def _shaped_random(shape, dtype):
    """cupy.testing.shaped_random's complex values (v14.2.0): a fresh RandomState(0), real parts then imaginary
    parts from rand, times 10."""
    state = np.random.RandomState(0)
    return ((state.rand(*shape) + 1j * state.rand(*shape)) * 10).astype(dtype)


def _shaped_arange(shape, dtype):
    """cupy.testing.shaped_arange's complex values: k + kj, k = 1..size."""
    a = np.arange(1, math.prod(shape) + 1)
    return (a + a * 1j).astype(dtype).reshape(shape)


def test_cupys_complex_cases():
    """CuPy v14.2.0's tests of cupyx.scipy.special.logsumexp (special_tests/test_logsumexp.py) with complex64
    and complex128 inputs, which cukern refused before: their inputs, SciPy's dtypes (complex results; a real
    log|sum| and a complex sign with return_sign), and within their tolerance (rtol 1e-6 where they state it,
    else 1e-7) of the long-double reference, which SciPy's value meets up to its own rounding."""
    for dtype in (C64, C128):
        cases = [  # (name, x, b, axis, return_sign, rtol)
            ("large_numbers", np.array([1000, 1000], dtype), None, None, False, 1e-7),
            ("array_inputs", _shaped_random((100, 1000), dtype), None, None, False, 1e-6),
            ("sign_argument", np.array([1, 1, 1], dtype), np.array([1, -1, -1], dtype), None, True, 1e-7),
            ("sign_multi_dims", _shaped_random((1, 1, 3, 4), dtype), _shaped_random((1, 1, 1, 4), dtype), None,
             True, 1e-6),
            ("sign_multi_dims_axis", _shaped_random((1, 2, 3, 4), dtype), _shaped_random((1, 2, 3, 4), dtype), 2,
             True, 1e-6),
            ("sign_multi_dims_axis_2d", _shaped_random((1, 2, 3, 4), dtype), _shaped_random((1, 2, 3, 4), dtype),
             (1, 3), True, 1e-6),
            ("b_zero", np.array([1, 100], dtype), np.array([1, 0], dtype), None, False, 1e-7),
            ("b_multi_dims", _shaped_arange((4, 1, 2, 1), dtype), _shaped_arange((3, 1, 5), dtype), None, False,
             1e-7),
        ]
        for name, x, b, axis, signed, rtol in cases:
            got = reference.logsumexp_complex_emulated(x, b, axis, return_sign=signed)
            want = reference.reduce_logsumexp(x, axis, b=b, return_sign=signed)
            if signed:
                assert got[0].dtype == P.real_of(dtype) and got[1].dtype == dtype, name
                np.testing.assert_allclose(got[0], want[0], rtol=rtol, err_msg=name)
                np.testing.assert_allclose(got[1], want[1], rtol=rtol, atol=1e-7, err_msg=name)
            else:
                assert got.dtype == dtype, name
                np.testing.assert_allclose(got, want, rtol=rtol, err_msg=name)


def test_against_scipy_where_it_is_installed(rng):
    special = pytest.importorskip("scipy.special")
    for dtype in (C64, C128):
        x = (rng.standard_normal((6, 500)) * 4 + 1j * rng.uniform(-3, 3, (6, 500))).astype(dtype)
        b = (rng.uniform(0.1, 2, (500,)) + 1j * rng.uniform(-1, 1, (500,))).astype(dtype)
        for kw in ({}, {"b": b}):
            got = reference.logsumexp_complex_emulated(x, kw.get("b"), 1)
            want = special.logsumexp(x, axis=1, **kw)
            assert got.dtype == want.dtype
            np.testing.assert_allclose(got, want, rtol=1e-5 if dtype == C64 else 1e-12)
            r, s = reference.logsumexp_complex_emulated(x, kw.get("b"), 1, return_sign=True)
            wr, ws = special.logsumexp(x, axis=1, return_sign=True, **kw)
            assert r.dtype == wr.dtype and s.dtype == ws.dtype
            np.testing.assert_allclose(r, wr, rtol=1e-5 if dtype == C64 else 1e-12)
            np.testing.assert_allclose(s, ws, rtol=1e-5 if dtype == C64 else 1e-12)


# ---------------------------------------------------------------------------------------------------------
# The tree's pieces (CPU).

def _state(t, m, sr, si):
    return (np.array([m], t), np.array([sr], t), np.array([si], t))


def test_complex_merge_is_commutative_and_the_identity_exact(rng):
    """The shuffle trees need a merge that gives the same bits either way round, and the tree's padding an
    identity that changes nothing (for every state the chains form: no part of s is -0)."""
    for t in (np.float32, np.float64):
        vals = [(-INF, 0, 0), (-INF, NAN, 0), (INF, 1, -2), (INF, 0, 0), (INF, -1, 0), (NAN, 1, 1), (0.0, 1, 0),
                (-0.0, -1, 3), (3.5, 7, -1), (3.5, -7, 1), (-80.0, 3, 0), (-200.0, -1e-3, 2e-3), (1e30, 2, 2)]
        vals += list(zip(rng.standard_normal(10) * 10, rng.standard_normal(10), rng.standard_normal(10)))
        states = [_state(t, *v) for v in vals]
        identity = _state(t, -INF, 0, 0)
        for a in states:
            for b in states:
                u, v = tree._lse_weighted_merge(a, b), tree._lse_weighted_merge(b, a)
                assert same_bits(np.stack(tree._lse_complex_finish(*u)), np.stack(tree._lse_complex_finish(*v))), (a, b)
            got = tree._lse_weighted_merge(a, identity)
            assert same_bits(np.stack(got), np.stack(a)) or np.isnan(a[0][0]) or np.isnan(a[1][0]), a
        m, sr, si = tree._lse_weighted_merge(_state(t, INF, 2, 1), _state(t, INF, -3, 1))
        assert m[0] == INF and sr[0] == -1 and si[0] == 2


def test_a_complex_chain_by_hand():
    """One chain of eight (elements 32 apart in a leaf), weights of zero drop their element, +inf in another
    chain: m the largest real part kept, s the terms summed left to right from 0."""
    x = np.array([0.5 + 1j, 2 - 1j, _c(INF), 3 + 0.25j, _c(-INF, NAN), 1 + 2j, 2 + 0j, -1 - 1j])
    w = np.array([2, 1j, 0, 0, 3, 1, 0.5 - 0.5j, 0], np.complex128)
    xs, ws = np.zeros((1, 256), np.complex128), np.zeros((1, 256), np.complex128)
    xs[0, ::32], ws[0, ::32] = x, w
    m, sr, si = tree._lse_complex_chains(xs, ws)
    assert m[0, 0] == 2.0 and (m[0, 1:] == -INF).all() and (sr[0, 1:] == 0).all() and (si[0, 1:] == 0).all()
    e = tree._exp_nonpositive
    want_r = want_i = np.float64(0)
    for xi, wi in zip(x, w):
        if wi == 0:
            continue
        c, s = E._cis(np.array([0.0 if xi.real == -INF else xi.imag]))
        ex = e(np.array([xi.real - 2.0]))[0]
        tr, ti = ex * c[0], ex * s[0]
        tr, ti = wi.real * tr - wi.imag * ti, wi.real * ti + wi.imag * tr
        want_r, want_i = want_r + tr, want_i + ti
    assert sr[0, 0] == want_r and si[0, 0] == want_i
    m, sr, si = tree._lse_complex_chains(xs, None)  # unweighted: every present element, +inf included
    assert m[0, 0] == INF and np.isfinite(sr[0, 0])


# ---------------------------------------------------------------------------------------------------------
# Dtypes, plans, instantiations and validation (CPU).

@pytest.mark.parametrize("x, b, want", [
    (np.complex64, np.complex64, np.complex64), (np.complex64, np.float32, np.complex64),
    (np.float32, np.complex64, np.complex64), (np.complex64, np.float64, np.complex128),
    (np.int64, np.complex64, np.complex128), (np.int8, np.complex64, np.complex64), (np.bool_, np.complex128, np.complex128),
    (np.float16, np.complex64, np.complex64), (BFLOAT16, np.complex64, np.complex64),
    (BFLOAT16, np.complex128, np.complex128),
])
def test_complex_result_dtypes_are_scipys_promotion(x, b, want):
    assert P.weighted_dtype(x, b) == np.dtype(want) and P.weighted_dtype(b, x) == np.dtype(want)
    assert P.result_dtype("logsumexp", np.complex64) == C64 and P.result_dtype("logsumexp", np.complex128) == C128


def test_two_kernels_serve_every_complex_call():
    insts = P.instantiations()
    mine = sorted(i.expression for i in insts if i.name == "reduce_lse_complex")
    assert mine == sorted(P.complex_instantiation(t).expression for t in (C64, C128))
    assert len(insts) <= 800
    pl = P.plan_weighted((64, 1000), (1000, 1), (1000, 1), (1,))
    p = pl.params(False, weighted=False)
    assert p["weighted"] == 0 and p["signed_result"] == 0
    assert pl.params(True)["weighted"] == 1


@pytest.mark.parametrize("x, b, kw, err, match", [
    (fake_array((4, 5), np.complex64), fake_array((3,), np.complex64), {}, ValueError,
     r"b has shape \(3,\), which does not broadcast against x's \(4, 5\)"),
    (fake_array((4, 5), np.complex64), None, {"return_sign": 1}, TypeError, "return_sign must be True or False"),
    (fake_array((4, 5), np.complex128), None, {"keepdims": "yes"}, TypeError, "keepdims must be a bool"),
    (fake_array((4, 5), np.complex64), None, {"axis": 2}, np.exceptions.AxisError, "out of bounds"),
    (fake_array((4, 5), np.float32), fake_array((5,), np.dtype("M8[s]")), {}, TypeError,
     "b has dtype datetime64.s.; logsumexp supports"),
    (fake_array((4, 5), np.dtype("M8[s]")), None, {}, TypeError, "x has dtype datetime64.s.; logsumexp supports"),
])
def test_complex_arguments_are_checked(x, b, kw, err, match, monkeypatch):
    monkeypatch.setattr(R._check, "as_array", lambda a, name, **_: a)  # fake arrays stand in for CuPy's
    with pytest.raises(err, match=match) as info:
        R.logsumexp(x, b=b, **kw)
    assert "\n" not in str(info.value)


# ---------------------------------------------------------------------------------------------------------
# NVRTC: the two kernels, in the reductions' compilation (sm_90 here; .ci/run compiles them to machine code for
# sm_80, sm_90, sm_100 and sm_120 with no local memory).

@pytest.mark.nvrtc("reduce")
@pytest.mark.parametrize("arch", ARCHS)
def test_complex_kernels_compile_without_local_memory_or_cuda_math(arch):
    """No local memory and no spill; no instruction of CUDA's approximate math (sin.approx, cos.approx,
    ex2.approx, lg2.approx) and no rounding to an integer by cvt.rni: every step is one whose bits the emulator
    repeats."""
    from _support import assert_no_spills, compiled, ptxas_ran

    c = compiled(P.SOURCE, arch)
    for inst in (P.complex_instantiation(t) for t in (C64, C128)):
        ptx = c.kernel_ptx(inst)
        assert ".local" not in ptx
        assert not re.search(r"\b(sin|cos|ex2|lg2|rsqrt)\.approx|cvt\.rni", ptx), inst.expression
        if ptxas_ran(c):  # else .ci/run checks the machine code (tests/_support.py, PART)
            assert_no_spills(c.resources()[c.lowered[inst.expression]], arch, inst.expression)


# ---------------------------------------------------------------------------------------------------------
# GPU: bits against the emulator.

def _complex(rng, shape, dtype, spread=20.0, scale=4.0):
    return (scale * rng.standard_normal(shape) + 1j * rng.uniform(-spread, spread, shape)).astype(dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", (C64, C128), ids=str)
def test_complex_bits_match_the_emulator(dtype, rng):
    """Every layout the plan tells apart (one or two kept and reduced levels, deeper ones copied), leaves and
    chains partly filled, with and without weights (complex, real, broadcast, zero), return_sign, keepdims."""
    import cupy

    for shape, b_shape, axis in (((100003,), None, None), ((33, 4099), None, 1), ((5000, 33), None, 0),
                                 ((6, 7, 65), None, (0, 2)), ((17, 1), None, 1), ((4, 1, 2, 1), (3, 1, 5), None),
                                 ((33, 4099), (1, 4099), 1), ((64, 300), (), -1), ((2, 3, 4, 5), (3, 1, 5), (1, 3)),
                                 ((3, 4, 5, 6), (4, 5, 6), (0, 2))):
        xh = _complex(rng, shape, dtype)
        bh = None
        if b_shape is not None:
            bh = (rng.uniform(-0.2, 2, b_shape) + 1j * rng.uniform(-1, 1, b_shape)).astype(dtype)
            if bh.size > 4:
                bh.reshape(-1)[::5] = 0
        x = cupy.asarray(xh)
        b = None if bh is None else cupy.asarray(bh)
        for signed in (False, True):
            for keepdims in (False, True):
                got = R.logsumexp(x, axis, b=b, keepdims=keepdims, return_sign=signed)
                want = reference.logsumexp_complex_emulated(xh, bh, axis, keepdims, signed)
                if signed:
                    assert same_bits(got[0], want[0]) and same_bits(got[1], want[1]), (shape, b_shape, axis)
                else:
                    assert same_bits(got, want), (shape, b_shape, axis, keepdims)


@pytest.mark.gpu
def test_complex_views_huge_phases_and_mixed_dtypes_match_the_emulator(rng):
    """Strided, negative-stride and transposed x and b; imaginary parts past the Cody-Waite bound up to the
    largest float (the exact reduction, a branch some lanes of a warp take); real x with complex b, integer x
    with complex b, complex x with real b (promoted first)."""
    import cupy

    for dtype in (C64, C128):
        xh = _complex(rng, (40, 90), dtype)
        bh = (rng.uniform(-1, 2, (40, 90)) + 1j * rng.uniform(-1, 1, (40, 90))).astype(dtype)
        x, b = cupy.asarray(xh), cupy.asarray(bh)
        for xv, bv, xvh, bvh, axis in ((x[:, ::3], b[:, 1::3], xh[:, ::3], bh[:, 1::3], 1),
                                       (x[::-1], None, xh[::-1], None, 0), (x.T, b.T, xh.T, bh.T, 1),
                                       (x[::2, 5:], b[1::2, :-5], xh[::2, 5:], bh[1::2, :-5], None)):
            got = R.logsumexp(xv, axis, b=bv, return_sign=True)
            want = reference.logsumexp_complex_emulated(xvh, bvh, axis, return_sign=True)
            assert same_bits(got[0], want[0]) and same_bits(got[1], want[1]), (dtype, axis)
        t = P.real_of(dtype).type
        top = 308 if t is np.float64 else 38
        huge = (rng.standard_normal((8, 700)) + 1j * 10.0 ** rng.uniform(-3, top, (8, 700))
                * rng.choice([-1, 1], (8, 700))).astype(dtype)
        got = R.logsumexp(cupy.asarray(huge), 1)
        assert same_bits(got, reference.logsumexp_complex_emulated(huge, None, 1))
    xh = rng.standard_normal((8, 300)).astype(np.float32)
    bh = (rng.uniform(0, 1, 300) + 1j * rng.uniform(-1, 1, 300)).astype(np.complex64)
    for xv, bv in ((xh, bh), (rng.integers(-5, 5, (8, 300)), bh), (xh.astype(np.complex64), bh.real)):
        got = R.logsumexp(cupy.asarray(xv), 1, b=cupy.asarray(bv))
        want = reference.logsumexp_complex_emulated(xv, bv, 1)
        assert got.dtype == want.dtype and same_bits(got, want)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", (C64, C128), ids=str)
def test_complex_special_values_on_the_gpu(dtype):
    import cupy

    for x, b, value, signed in SPECIAL:
        if dtype == C64 and b is not None and any(np.isfinite(v) and abs(v) > 1e38 for v in b):
            continue
        xh = np.array(x, np.complex128).astype(dtype)
        bh = None if b is None else np.array(b, np.complex128).astype(dtype)
        bd = None if bh is None else cupy.asarray(bh)
        got = R.logsumexp(cupy.asarray(xh), b=bd)
        assert same_bits(got, reference.logsumexp_complex_emulated(xh, bh)), (x, b)
        got = R.logsumexp(cupy.asarray(xh), b=bd, return_sign=True)
        want = reference.logsumexp_complex_emulated(xh, bh, return_sign=True)
        assert same_bits(got[0], want[0]) and same_bits(got[1], want[1]), (x, b)
    # the special elements spread over leaves and rows
    xh = np.zeros((6, 5000), dtype)
    xh[0, 4000] = _c(INF, 2)
    xh[1, 7], xh[1, 4999] = _c(INF, 0), _c(INF, math.pi)
    xh[2, 2500] = _c(1, NAN)
    xh[3, 2500] = _c(-INF, NAN)
    xh[4] = -INF
    xh[5, 123] = _c(NAN, 0)
    got = R.logsumexp(cupy.asarray(xh), 1, return_sign=True)
    want = reference.logsumexp_complex_emulated(xh, None, 1, return_sign=True)
    assert same_bits(got[0], want[0]) and same_bits(got[1], want[1])


@pytest.mark.gpu
def test_complex_out_empty_and_errors_before_launch():
    import cupy

    x = cupy.asarray((np.arange(20) + 1j * np.arange(20)[::-1]).reshape(4, 5).astype(np.complex64))
    out = cupy.full(4, 7, np.complex128)
    assert R.logsumexp(x, 1, out=out) is out
    want = reference.logsumexp_complex_emulated(x.get(), None, 1)
    np.testing.assert_array_equal(out.get(), want.astype(np.complex128))
    mag = cupy.full(4, 7, np.float32)
    r, g = R.logsumexp(x, 1, return_sign=True, out=mag)
    assert r is mag and same_bits(r, reference.logsumexp_complex_emulated(x.get(), None, 1, return_sign=True)[0])
    r, g = R.logsumexp(cupy.zeros((3, 0), np.complex128), 1, return_sign=True)
    assert r.dtype == np.float64 and (r.get() == -INF).all() and g.dtype == C128 and (g.get() == -1).all()
    r = R.logsumexp(cupy.zeros((3, 0), np.complex64), 1)
    assert r.dtype == C64 and (r.get() == -INF).all()
    out.fill(7)
    for kw, err, match in (({"b": x[:, :3]}, ValueError, "does not broadcast"),
                           ({"out": cupy.empty(5, np.complex64)}, ValueError, "out has shape"),
                           ({"return_sign": None}, TypeError, "return_sign must be True or False")):
        with pytest.raises(err, match=match):
            R.logsumexp(x, 1, **kw)
    with pytest.raises(ValueError, match="out overlaps x"):
        R.logsumexp(x, 1, out=x[:, 0])
    assert (out.get() == 7).all()


@pytest.mark.gpu
def test_complex_capture_replays_and_refuses_temporaries(rng):
    import cupy

    from _support import refused_in_capture, replayed_alone

    x = cupy.asarray(_complex(rng, (64, 500), C64))
    b = cupy.asarray(rng.uniform(0, 1, (500,)).astype(np.float32))
    stream = cupy.cuda.Stream(non_blocking=True)
    deep = cupy.asarray(_complex(rng, (8, 8, 8, 50), C64))[::2, ::2, ::2]  # kept axes in 3 levels, in K order
    for call in (lambda: R.logsumexp(x, 1, b=b),  # b converted to complex64 first
                 lambda: R.logsumexp(deep, 3)):
        with stream:
            call()
        refused_in_capture(stream, call)

    def refill():
        x[...] = cupy.asarray(_complex(rng, x.shape, C64))

    got = replayed_alone(stream, lambda: [R.logsumexp(x, 1, return_sign=True)], refill)
    want = reference.logsumexp_complex_emulated(x.get(), None, 1, return_sign=True)
    assert same_bits(got[0][0], want[0]) and same_bits(got[0][1], want[1])
