"""Complex logsumexp's elementary functions: cukern's own cos, sin, atan2 and log|s| (reduce.cu ``Trig``; the
host's in cukern/reference/_elementary.py) against long double and exact rationals, and their constants
against the kernel's and against exact values (CPU)."""

from __future__ import annotations

import math
import re
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from _support import same_bits

from cukern import reduce_plan as P
from cukern.reference import _elementary as E

INF, NAN = np.inf, np.nan
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
def test_cos_and_sin_are_within_0_82_ulp_for_every_finite_argument(dtype, rng):
    """Against glibc's long double cos and sin (64-bit significands, their own exact reduction): Cody and Waite
    below the bound, the exact reduction by 2/pi's bits above, the floats nearest k pi/2 (where a reduction
    loses most) and the worst cases known for the exact reduction. 0.79 ulp was the most over 10^7 random
    arguments of each type."""
    x = _arguments(rng, dtype)
    c, s = E._cis(x)
    assert c.dtype == s.dtype == np.dtype(dtype)
    wide = x.astype(np.longdouble)
    assert _ulps(c, np.cos(wide), dtype).max() <= 0.82
    assert _ulps(s, np.sin(wide), dtype).max() <= 0.82
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
    """atan2 within 1.8 ulp (its phase at -pi given as +pi), log|s| within 1.1 ulp where |log|s|| >= 1 and
    0.9 eps absolute below, the sign s / |s| within 2.5 ulp, over parts of any magnitude (subnormal to the
    largest, either much larger than the other) and near |s| = 1. The most seen over 10^7 random values of each
    type: 1.75, 1.07, 0.84 and 2.41."""
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
    assert _ulps(want + np.sign(want) * d, want, dtype).max() <= 1.8
    lw = np.log(np.hypot(wr, wi))
    err = np.abs(log_abs.astype(np.longdouble) - lw)
    big = np.abs(lw) >= 1
    assert _ulps(log_abs, lw, dtype)[big].max() <= 1.1
    assert (err[~big] / np.finfo(t).eps).max() <= 0.9
    absl = np.hypot(wr, wi)
    for got, part in ((sr, wr / absl), (si, wi / absl)):
        live = np.abs(part) > 1e-3
        assert _ulps(got, part, dtype)[live].max() <= 2.5
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
