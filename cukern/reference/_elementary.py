"""The reduce kernels' own elementary functions on the host, bit for bit: logsumexp's exp and log, and the
complex logsumexp's cos and sin (with their argument reduction), atan2 and log|s| (reduce.cu ``ExpLog``,
``Trig``). Every step is one correctly rounded IEEE operation (or an exact integer one) in the kernel's
order, so NumPy reproduces the GPU's bits."""

from __future__ import annotations

import functools

import numpy as np


# logsumexp's exp and log (reduce.cu ExpLog, exp_nonpositive, log_at_least_one): the same steps, each rounded
# once, in the same order, in the accumulator dtype (float32's exp multiply-adds by :func:`_fma32`). The
# constants are reduce.cu's hex literals.
_EXPLOG = {
    np.dtype(np.float32): {
        "underflow": -104.0, "inv_ln2": "0x1.715476p+0", "magic": "0x1.8p+23", "ln2_hi": "0x1.62e4p-1",
        "ln2_lo": "0x1.7f7d1cp-20", "ln2": "0x1.62e430p-1",
        "exp": ["0x1p+0", "0x1p+0", "0x1.fffdfcp-2", "0x1.5557aep-3", "0x1.5729e6p-5", "0x1.10625ap-7"],
        "sqrt_half": "0x1.6a09e6p-1",
        "log": ["0x1p+0", "0x1.555556p-2", "0x1.99999ap-3", "0x1.24924ap-3", "0x1.c71c72p-4"]},
    np.dtype(np.float64): {
        "underflow": -746.0, "inv_ln2": "0x1.71547652b82fep+0", "magic": "0x1.8p+52", "ln2_hi": "0x1.62e42feep-1",
        "ln2_lo": "0x1.a39ef35793c76p-33",
        "exp": ["0x1p+0", "0x1p+0", "0x1p-1", "0x1.5555555555555p-3", "0x1.5555555555555p-5", "0x1.1111111111111p-7",
             "0x1.6c16c16c16c17p-10", "0x1.a01a01a01a01ap-13", "0x1.a01a01a01a01ap-16", "0x1.71de3a556c734p-19",
             "0x1.27e4fb7789f5cp-22", "0x1.ae64567f544e4p-26", "0x1.1eed8eff8d898p-29", "0x1.6124613a86d09p-33"],
        "sqrt_half": "0x1.6a09e667f3bcdp-1",
        "log": ["0x1p+0", "0x1.5555555555555p-2", "0x1.999999999999ap-3", "0x1.2492492492492p-3",
             "0x1.c71c71c71c71cp-4", "0x1.745d1745d1746p-4", "0x1.3b13b13b13b14p-4", "0x1.1111111111111p-4",
             "0x1.e1e1e1e1e1e1ep-5", "0x1.af286bca1af28p-5", "0x1.8618618618618p-5"]},
}


@functools.cache
def _explog(dtype):
    """The constants of :data:`_EXPLOG` as ``dtype``'s scalars (made once a dtype: the tree simulations call
    the exp and log a value at a time)."""
    c = _EXPLOG[np.dtype(dtype)]
    t = np.dtype(dtype).type

    def f(h):
        return t(float.fromhex(h)) if isinstance(h, str) else t(h)

    return {k: [f(h) for h in v] if isinstance(v, list) else f(v) for k, v in c.items()}


def _fma32(a, b, c):
    """``__fmaf_rn(a, b, c)`` for float32 arrays (broadcast): a b + c rounded once, to nearest even. The
    product is exact in float64 (24 + 24 bits); the float64 sum is rounded to odd, not to nearest: TwoSum
    gives s = RN(x), x = a b + c, and its error e = x - s exactly; an inexact x rounds toward zero (s, or its
    neighbour toward zero when e and s differ in sign) and then sets the last bit, which keeps the sticky
    information a second rounding needs. 53 >= 24 + 2 bits, so rounding that to float32 is the correctly
    rounded x, subnormal results, overflow and signed zeros included. Infinite or NaN operands make e a NaN,
    neither positive nor negative: s stays as float64 forms it, by the same IEEE rules."""
    a, b, c = (np.asarray(v, np.float32).astype(np.float64) for v in (a, b, c))
    with np.errstate(all="ignore"):
        p = a * b
        s = p + c
        bv = s - p
        e = (p - (s - bv)) + (c - bv)
        inexact = (e > 0) | (e < 0)
        bits = s.view(np.int64)
        odd = (bits - (inexact & ((e > 0) != (s > 0)))) | inexact
        return odd.view(np.float64).astype(np.float32)


def _exp_nonpositive(d):
    """reduce.cu ``exp_nonpositive``: e^d for d <= 0 (an array of float32 or float64), 0 below the underflow
    bound. k = rint(d / ln2) by adding and subtracting the magic constant (its integer also read from the
    sum's bits), r = d - k ln2 (in one fused step for float32, two for float64), e^r by Horner with the
    coefficients scaled by 2^-64, then that times 2^(k + 64), rounded once. Float32 forms every multiply-add
    with one rounding (:func:`_fma32`, as ``__fmaf_rn``), float64 as a correctly rounded product and a
    correctly rounded sum."""
    c = _explog(d.dtype)
    t = d.dtype.type
    mad = _fma32 if t is np.float32 else (lambda a, b, c: a * b + c)
    bits = np.dtype(f"i{d.dtype.itemsize}")
    scale = t(2.0**-64)
    with np.errstate(all="ignore"):
        live = d >= c["underflow"]
        dd = np.where(live, d, t(0))
        km = mad(dd, c["inv_ln2"], c["magic"])
        kf = km - c["magic"]
        ki = km.view(bits).astype(np.int64) - np.asarray(c["magic"]).view(bits).astype(np.int64)
        if "ln2" in c:  # float32: r in one fused step
            r = mad(kf, -c["ln2"], dd)
        else:
            r = mad(kf, -c["ln2_lo"], mad(kf, -c["ln2_hi"], dd))
        p = np.full_like(d, c["exp"][-1] * scale)
        for coef in reversed(c["exp"][:-1]):
            p = mad(p, r, coef * scale)
        out = p * np.ldexp(np.ones_like(d), ki + 64)
    return np.where(live, out, t(0))


def _log_parts(f, e):
    """reduce.cu ``log_parts``: log(f 2^e) for f in [sqrt(1/2), sqrt(2)) (float32 or float64) and integer
    e: e ln2 (in two parts) plus 2 atanh((f - 1) / (f + 1)), its series in u^2."""
    c = _explog(f.dtype)
    t = f.dtype.type
    with np.errstate(all="ignore"):
        u = (f - t(1)) / (f + t(1))
        w = u * u
        p = np.full_like(f, c["log"][-1])
        for coef in reversed(c["log"][:-1]):
            p = p * w + coef
        se = np.asarray(e).astype(f.dtype)
        return se * c["ln2_hi"] + (se * c["ln2_lo"] + (u + u) * p)


def _log_split(s):
    """s > 0 (finite, normal) as (f, e), s = f 2^e with f in [sqrt(1/2), sqrt(2)): frexp's fraction, doubled
    below sqrt(1/2)."""
    c = _explog(s.dtype)
    f, e = np.frexp(s)
    low = f < c["sqrt_half"]
    return np.where(low, f * s.dtype.type(2), f), np.where(low, e - 1, e)


def _log_at_least_one(s):
    """reduce.cu ``log_at_least_one``: log(s) for finite s >= 1 (an array of float32 or float64)."""
    with np.errstate(all="ignore"):
        return _log_parts(*_log_split(s))


# The complex logsumexp's cos and sin, atan2 and log|s| (reduce.cu Trig, cis, phase, log_abs): reduce.cu's hex
# literals; Taylor coefficients (1 / n! and 1 / (2k + 1), rounded), truncated where the next term falls below a
# hundredth of an ulp over their intervals; pi / 2 and pi, and atan(j / 16), as hi + lo.
_TRIG = {
    np.dtype(np.float32): {
        "two_over_pi": "0x1.45f306p-1", "magic": "0x1.8p+23", "cody_waite_max": "0x1p+17", "rest_min": "0x1p-60",
        "pio2_parts": ["0x1.921fb6p+0", "-0x1.777a5cp-25", "-0x1.ee59dap-50"],
        "pio2": ["0x1.921fb6p+0", "-0x1.777a5cp-25"], "pi": ["0x1.921fb6p+1", "-0x1.777a5cp-24"],
        "sin": ["-0x1.555556p-3", "0x1.111112p-7", "-0x1.a01a02p-13", "0x1.71de3ap-19"],
        "cos": ["0x1.555556p-5", "-0x1.6c16c2p-10", "0x1.a01a02p-16", "-0x1.27e4fcp-22"],
        "atan": ["-0x1.555556p-2", "0x1.99999ap-3", "-0x1.24924ap-3"],
        "atan_hi": ["0x0p+0", "0x1.ff55bcp-5", "0x1.fd5baap-4", "0x1.7b97b4p-3", "0x1.f5b760p-3", "0x1.362774p-2",
                    "0x1.6f6194p-2", "0x1.a64eecp-2", "0x1.dac670p-2", "0x1.0657eap-1", "0x1.1e00bap-1",
                    "0x1.345f02p-1", "0x1.4978fap-1", "0x1.5d5898p-1", "0x1.700a7cp-1", "0x1.819d0cp-1",
                    "0x1.921fb6p-1"],
        "atan_lo": ["0x0p+0", "-0x1.1a6042p-30", "-0x1.54f424p-30", "0x1.79cb60p-28", "-0x1.b4dfc8p-29",
                    "-0x1.1f0286p-27", "0x1.e4def0p-30", "0x1.e611fep-29", "0x1.586ed4p-28", "-0x1.6499e6p-26",
                    "0x1.7bdfd6p-26", "-0x1.98e422p-28", "0x1.934f70p-28", "0x1.c5a6c6p-27", "0x1.5e118cp-27",
                    "-0x1.1d4eb6p-26", "-0x1.777a5cp-26"]},
    np.dtype(np.float64): {
        "two_over_pi": "0x1.45f306dc9c883p-1", "magic": "0x1.8p+52", "cody_waite_max": "0x1p+20",
        "rest_min": "0x1p-500",
        "pio2_parts": ["0x1.921fb544p+0", "0x1.0b4611a6p-34", "0x1.3198a2ep-69", "0x1.b839a252049c1p-104"],
        "pio2": ["0x1.921fb54442d18p+0", "0x1.1a62633145c07p-54"],
        "pi": ["0x1.921fb54442d18p+1", "0x1.1a62633145c07p-53"],
        "sin": ["-0x1.5555555555555p-3", "0x1.1111111111111p-7", "-0x1.a01a01a01a01ap-13", "0x1.71de3a556c734p-19",
                "-0x1.ae64567f544e4p-26", "0x1.6124613a86d09p-33", "-0x1.ae7f3e733b81fp-41", "0x1.952c77030ad4ap-49"],
        "cos": ["0x1.5555555555555p-5", "-0x1.6c16c16c16c17p-10", "0x1.a01a01a01a01ap-16", "-0x1.27e4fb7789f5cp-22",
                "0x1.1eed8eff8d898p-29", "-0x1.93974a8c07c9dp-37", "0x1.ae7f3e733b81fp-45"],
        "atan": ["-0x1.5555555555555p-2", "0x1.999999999999ap-3", "-0x1.2492492492492p-3", "0x1.c71c71c71c71cp-4",
                 "-0x1.745d1745d1746p-4", "0x1.3b13b13b13b14p-4", "-0x1.1111111111111p-4"],
        "atan_hi": ["0x0p+0", "0x1.ff55bb72cfdeap-5", "0x1.fd5ba9aac2f6ep-4", "0x1.7b97b4bce5b02p-3",
                    "0x1.f5b75f92c80ddp-3", "0x1.362773707ebccp-2", "0x1.6f61941e4def1p-2", "0x1.a64eec3cc23fdp-2",
                    "0x1.dac670561bb4fp-2", "0x1.0657e94db30d0p-1", "0x1.1e00babdefeb4p-1", "0x1.345f01cce37bbp-1",
                    "0x1.4978fa3269ee1p-1", "0x1.5d58987169b18p-1", "0x1.700a7c5784634p-1", "0x1.819d0b7158a4dp-1",
                    "0x1.921fb54442d18p-1"],
        "atan_lo": ["0x0p+0", "-0x1.c934d86d23f1dp-60", "-0x1.cd37686760c17p-59", "0x1.347b0b4f881cap-58",
                    "0x1.8ab6e3cf7afbdp-57", "-0x1.963a544b672d8p-57", "-0x1.c63aae6f6e918p-56",
                    "-0x1.24dec1b50b7ffp-56", "0x1.a2b7f222f65e2p-56", "-0x1.d5b495f6349e6p-56",
                    "-0x1.928df287a668fp-58", "0x1.1021137c71102p-55", "0x1.2419a87f2a458p-56", "0x1.0028e4bc5e7cap-57",
                    "-0x1.8c34d25aadef6p-56", "-0x1.bf76229d3b917p-56", "0x1.1a62633145c07p-55"]},
}
# 2/pi in 64-bit words (reduce.cu kTwoOverPiWords): 64 zero bits, then its first 1216 bits after the point.
TWO_OVER_PI_WORDS = (
    0x0000000000000000, 0xa2f9836e4e441529, 0xfc2757d1f534ddc0, 0xdb6295993c439041, 0xfe5163abdebbc561,
    0xb7246e3a424dd2e0, 0x06492eea09d1921c, 0xfe1deb1cb129a73e, 0xe88235f52ebb4484, 0xe99c7026b45f7e41,
    0x3991d639835339f4, 0x9c845f8bbdf9283b, 0x1ff897ffde05980f, 0xef2f118b5a0a6d1f, 0x6d367ecf27cb09b7,
    0x4f463f669e5fea2d, 0x7527bac7ebe5f17b, 0x3d0739f78a5292ea, 0x6bfb5fb11f8d5d08, 0x56033046fc7b6bab)
_U64 = np.uint64


@functools.cache
def _trig(dtype):
    """The constants of :data:`_TRIG` as ``dtype``'s scalars."""
    t = np.dtype(dtype).type
    return {k: [t(float.fromhex(h)) for h in v] if isinstance(v, list) else t(float.fromhex(v))
            for k, v in _TRIG[np.dtype(dtype)].items()}


def _mad(a, b, c):
    """The Horner step of the dtype: float32's fused multiply-add (``__fmaf_rn``), float64's product then sum."""
    return _fma32(a, b, c) if np.asarray(a).dtype == np.float32 else a * b + c


def _horner(coefs, z):
    p = np.full_like(z, coefs[-1])
    for coef in reversed(coefs[:-1]):
        p = _mad(p, z, coef)
    return p


def _two_sum(a, b):
    """(s, e): s = a + b rounded, e its error exactly (Knuth)."""
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


def _two_product(a, b):
    """(p, e): p = a b rounded, e = a b - p exactly: reduce.cu's fused multiply-add ``fma(a, b, -p)``, exact
    wherever e is representable (no underflow). float32: the float64 product is exact; float64: Dekker's
    splitting."""
    p = a * b
    if p.dtype == np.float32:
        return p, (a.astype(np.float64) * b.astype(np.float64) - p.astype(np.float64)).astype(np.float32)
    split = np.float64(134217729.0)  # 2^27 + 1

    def halves(v):
        c = split * v
        hi = c - (c - v)
        return hi, v - hi

    ah, al = halves(a)
    bh, bl = halves(b)
    return p, ((ah * bh - p) + ah * bl + al * bh) + al * bl


def _fma_exact(a, b, c):
    """a b + c where it is representable and c + RN(a b) is exact (a division's remainder c - q b): reduce.cu's
    ``fma(a, b, c)``, exact there, from :func:`_two_product`."""
    p, e = _two_product(a, b)
    return (c + p) + e


def _scale2(v, k):
    """v 2^k as reduce.cu ``scale2`` forms it: two multiplications by powers of two (each exact unless the
    product is subnormal), k split as k / 2 (toward zero) and the rest."""
    t = v.dtype.type
    k = np.asarray(k, np.int64)
    k1 = np.sign(k) * (np.abs(k) // 2)
    return (v * np.ldexp(t(1), k1).astype(v.dtype)) * np.ldexp(t(1), k - k1).astype(v.dtype)


def _cody_waite(a):
    """reduce.cu ``Trig::cody_waite``: (r_hi, r_lo, q) with a - k pi/2 = r_hi + r_lo, q = k mod 4, for 0 <= a
    below the Cody-Waite bound. k = rint(a 2/pi) by the magic constant. pi/2 in parts P: float32 three floats,
    a - k P1 one fused step (exact), k P2 as two floats (a product and its exact error), their differences
    carried by a two-sum, then k P3; float64 four, the first three of 33 bits (k < 2^20: each k P exact), the
    differences carried exactly by two-sums."""
    c = _trig(a.dtype)
    t = a.dtype.type
    bits = np.dtype(f"i{a.dtype.itemsize}")
    p = c["pio2_parts"]
    with np.errstate(all="ignore"):
        km = _mad(a, c["two_over_pi"], c["magic"])
        k = km - c["magic"]
        q = (km.view(bits).astype(np.int64) - np.asarray(c["magic"]).view(bits).astype(np.int64)) & 3
        if t is np.float32:
            t1 = _fma32(k, -p[0], a)
            yh, yl = _two_product(k, p[1])
            h, e = _two_sum(t1, -yh)
            tail = _fma32(k, -p[2], e - yl)
            hi = h + tail
            return hi, tail - (hi - h), q
        t1 = a - k * p[0]
        h2, e2 = _two_sum(t1, -(k * p[1]))
        h3, e3 = _two_sum(h2, -(k * p[2]))
        tail = (e2 + e3) - k * p[3]
        hi = h3 + tail
        return hi, tail - (hi - h3), q


def _mulhi(a, b):
    """The high 64 bits of the product of uint64 arrays (``__umul64hi``)."""
    m = _U64(0xFFFFFFFF)
    a0, a1, b0, b1 = a & m, a >> _U64(32), b & m, b >> _U64(32)
    p00, p01, p10 = a0 * b0, a0 * b1, a1 * b0
    mid = (p00 >> _U64(32)) + (p01 & m) + (p10 & m)
    return a1 * b1 + (p01 >> _U64(32)) + (p10 >> _U64(32)) + (mid >> _U64(32))


def _funnel(hi, lo, sh):
    """The top 64 bits of the 128-bit (hi, lo) shifted left by sh in [0, 64)."""
    sh = sh.astype(_U64)
    return np.where(sh == 0, hi, (hi << sh) | (lo >> ((_U64(64) - sh) & _U64(63))))


def _clz64(v):
    """Leading zeros of nonzero uint64 values (``__clzll``)."""
    n = np.zeros(v.shape, np.int64)
    for s in (32, 16, 8, 4, 2, 1):
        top = (v >> _U64(64 - s)) == 0
        n = np.where(top, n + s, n)
        v = np.where(top, v << _U64(s), v)
    return n


def _reduce_exact(a):
    """reduce.cu ``Trig::reduce_exact``: (r_hi, r_lo, q) for finite a at or above the Cody-Waite bound, from the
    exact product of a's integer significand M (a = M 2^E) and a window of 2/pi's bits: those from bit E - 1
    after the point (earlier ones add multiples of 4 to a 2/pi), 192 of them for float64 (128 for float32),
    so that M times the window, modulo 2^192, is a 2/pi modulo 4 with 190 fraction bits (126), its error below
    2^-135 (2^-100). q is that rounded to the nearest integer; the rest, in [-1/2, 1/2], is normalized, read as
    a two-float value (its top 106 bits, 48 for float32) and multiplied by pi/2 in two floats."""
    c = _trig(a.dtype)
    t = a.dtype.type
    words = np.array(TWO_OVER_PI_WORDS, _U64)
    one = _U64(1)
    with np.errstate(all="ignore"):
        if t is np.float32:
            bits = a.view(np.uint32).astype(_U64)
            e = (bits >> _U64(23)).astype(np.int64) - 150
            m = (bits & _U64(0x7FFFFF)) | _U64(0x800000)
            limbs = 2
        else:
            bits = a.view(_U64)
            e = (bits >> _U64(52)).astype(np.int64) - 1075
            m = (bits & _U64((1 << 52) - 1)) | _U64(1 << 52)
            limbs = 3
        pos = e + 62
        w, sh = pos >> 6, pos & 63
        win = [_funnel(words[w + i], words[w + i + 1], sh) for i in range(limbs)]  # most significant first
        # m times the window, modulo 2^(64 limbs), least significant limb first
        low = m * win[-1]
        carry = _mulhi(m, win[-1])
        prod = [low]
        for i in range(limbs - 2, -1, -1):
            v = m * win[i] + carry
            if i > 0:
                carry = _mulhi(m, win[i]) + (v < carry).astype(_U64)
            prod.append(v)
        top = prod[-1]
        q = (top + (one << _U64(61))) >> _U64(62)
        prod[-1] = top - (q << _U64(62))
        neg = (prod[-1] >> _U64(63)) == one
        # |rest|: two's complement negation where negative, limb by limb from the least significant
        mag, add = [], np.ones(a.shape, _U64)
        for v in prod:
            n = ~v + add
            add = add & (n == 0)
            mag.append(np.where(neg, n, v))
        mag = mag[::-1]  # most significant first
        shift = np.zeros(a.shape, np.int64)
        for _ in range(limbs - 1):
            z = mag[0] == 0
            mag = [np.where(z, mag[i + 1], mag[i]) for i in range(limbs - 1)] + [np.where(z, _U64(0), mag[-1])]
            shift = shift + 64 * z
        lz = _clz64(mag[0])
        h = _funnel(mag[0], mag[1], lz)
        nxt = _funnel(mag[1], mag[2] if limbs > 2 else np.zeros_like(mag[1]), lz)
        if t is np.float32:
            fh, fl, scale, step = h >> _U64(40), (h >> _U64(16)) & _U64(0xFFFFFF), -22 - lz - shift, 24
        else:
            fh = h >> _U64(11)
            fl = ((h & _U64(0x7FF)) << _U64(42)) | (nxt >> _U64(22))
            scale, step = -51 - lz - shift, 53
        rh = _scale2(fh.astype(a.dtype), scale)
        rl = _scale2(fl.astype(a.dtype), scale - step)
        rh, rl = np.where(neg, -rh, rh), np.where(neg, -rl, rl)
        hi, lo = _two_product(rh, c["pio2"][0])
        lo = lo + (rh * c["pio2"][1] + rl * c["pio2"][0])
        r = hi + lo
        return r, lo - (r - hi), (q & _U64(3)).astype(np.int64)


def _cos_sin_reduced(h, lo):
    """reduce.cu ``Trig::cos_sin``: (cos, sin) of h + lo, |h| <= pi/4 (a little more), lo below half an ulp of
    h: sin = h + (h z s(z) + lo (1 - z / 2)) and cos = (1 - z / 2) + (its rounding error exactly + z^2 c(z) -
    h lo), z = h^2, s and c Taylor's."""
    c = _trig(h.dtype)
    t = h.dtype.type
    half = t(0.5)
    with np.errstate(all="ignore"):
        z = h * h
        hz = half * z
        sin = h + _mad(h * z, _horner(c["sin"], z), lo - hz * lo)
        w = t(1) - hz
        corr = (t(1) - w) - hz
        cos = w + (corr + ((z * z) * _horner(c["cos"], z) - h * lo))
    return cos, sin


def _cis(theta):
    """reduce.cu ``cis``: (cos theta, sin theta) of a float32 or float64 array. |theta| is reduced (Cody and
    Waite below the bound, the exact reduction above), cos and sin of the rest taken by their series and
    swapped and negated by the quadrant; sin takes theta's sign (sin(-0) = -0). inf and NaN give NaN."""
    t = theta.dtype.type
    c = _trig(theta.dtype)
    a = np.abs(theta)
    finite = a <= np.finfo(t).max
    hi, lo, q = np.zeros_like(a), np.zeros_like(a), np.zeros(a.shape, np.int64)
    near = finite & (a < c["cody_waite_max"])
    far = finite & ~near
    if near.any():
        hi[near], lo[near], q[near] = _cody_waite(a[near])
    if far.any():
        hi[far], lo[far], q[far] = _reduce_exact(a[far])
    cos, sin = _cos_sin_reduced(hi, lo)
    odd, back = (q & 1) == 1, (q & 2) == 2  # theta = q pi/2 + r: a quarter turn, then a half turn
    c2, s2 = np.where(odd, -sin, cos), np.where(odd, cos, sin)
    c2, s2 = np.where(back, -c2, c2), np.where(back, -s2, s2)
    s2 = np.where(np.signbit(theta), -s2, s2)
    with np.errstate(invalid="ignore"):
        nan = theta - theta
    return np.where(finite, c2, nan), np.where(finite, s2, nan)


def _frexp_exponent(v):
    """E with v = f 2^E, f in [1/2, 1), for finite v > 0 (subnormal ones too): frexp's exponent."""
    return np.frexp(v)[1].astype(np.int64)


def _phase(re, im):
    """reduce.cu ``Trig::phase``: atan2(im, re) in (-pi, pi] for (re, im) scaled by :func:`_log_abs` (the
    larger magnitude in [1/2, 1)). t = min / max
    of the magnitudes (one correctly rounded division), j = floor(16 t), atan t = atan(j / 16) (two floats) +
    atan v, v = (t - j / 16) / (1 + t j / 16) in [0, 1/16) (t - j / 16 exact; the denominator one Horner step),
    by its series; then the octant:
    K + sigma atan t with K in {0, pi/2, pi} (two floats each, the leading parts added by a two-sum) and the
    sign of im; -pi (a negative zero im, or an angle that rounds to -pi) given as +pi. The division's remainder
    (exact, one fused multiply-add, for t at or above ``rest_min``) is carried into v's numerator."""
    c = _trig(re.dtype)
    t = re.dtype.type
    with np.errstate(all="ignore"):
        a, b = np.abs(re), np.abs(im)
        swap = b > a
        neg = re < 0
        small, big = np.where(swap, a, b), np.where(swap, b, a)
        ratio = small / big
        # what the division rounded away: exact (one fused multiply-add) for parts scaled into [1/2, 1) and a
        # ratio not below the bound (no underflow); below it, the ratio alone
        live = ratio >= c["rest_min"]
        rest = np.where(live, _fma_exact(-np.where(live, ratio, t(0)), big, small) / big, t(0))
        j = (ratio * t(16)).astype(np.int64)
        cj = j.astype(re.dtype) * t(0.0625)
        v = ((ratio - cj) + rest) / _mad(cj, ratio, t(1))
        z = v * v
        p = _mad(v * z, _horner(c["atan"], z), v)
        hi, lo = np.array(c["atan_hi"])[j], np.array(c["atan_lo"])[j]
        sigma = np.where(swap != neg, t(-1), t(1))
        k_hi = np.where(swap, c["pio2"][0], np.where(neg, c["pi"][0], t(0)))
        k_lo = np.where(swap, c["pio2"][1], np.where(neg, c["pi"][1], t(0)))
        s, e = _two_sum(k_hi, sigma * hi)
        phi = s + (e + (k_lo + sigma * (lo + p)))
        phi = np.where(im < 0, -phi, phi)
        return np.where(phi == -c["pi"][0], c["pi"][0], phi)


def _log_abs(re, im):
    """reduce.cu ``Trig::log_abs``: (log|s|, (re', im'), re / |s|, im / |s|) for finite s = (re, im), not both
    zero. Both parts scaled by 2^-E (:func:`_scale2`): (re', im'), E the exponent of the larger magnitude, so
    that q = re'^2 + im'^2 lies in [1/4, 2) (each step rounded once); log|s| = log(q 2^(2E)) / 2 by
    :func:`_log_parts`, the sign (re', im') / sqrt(q)."""
    with np.errstate(all="ignore"):
        e = _frexp_exponent(np.maximum(np.abs(re), np.abs(im)))
        r, i = _scale2(re, -e), _scale2(im, -e)
        q = r * r + i * i
        f, eq = _log_split(q)
        root = np.sqrt(q)
        return re.dtype.type(0.5) * _log_parts(f, eq + 2 * e), (r, i), r / root, i / root
