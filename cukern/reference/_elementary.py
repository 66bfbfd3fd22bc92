"""The reduce kernels' own elementary functions on the host, bit for bit: logsumexp's exp and log (reduce.cu
``ExpLog``). Every step is one correctly rounded IEEE operation in the kernel's order, so NumPy reproduces the
GPU's bits."""

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

