"""Helpers the reference modules share: array namespaces, float64 upcasts, bfloat16 rounding."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from .._typing import HostArray


def _xp(a):
    if type(a).__module__.split(".")[0] == "cupy":
        import cupy

        return cupy
    return np


def _f64(a):
    return None if a is None else _xp(a).asarray(a).astype(np.float64)


def _numpy(a):
    return a.get() if type(a).__module__.split(".")[0] == "cupy" else np.asarray(a)


def _odd_float64(v):
    """64-bit integers as float64 rounded to odd (toward zero, an inexact result's last bit set): the two
    32-bit halves added (each exact), the sum's error found exactly (Knuth's two-sum)."""
    hi = (v >> 32).astype(np.float64) * 2.0**32
    lo = (v & 0xFFFFFFFF).astype(np.float64)
    s = hi + lo
    t = s - hi
    err = (hi - (s - t)) + (lo - t)  # s + err is v exactly
    s = np.where((err != 0) & (np.signbit(err) != np.signbit(s)), np.nextafter(s, 0.0), s)  # past v: step back
    return (s.view(np.uint64) | (err != 0).astype(np.uint64)).view(np.float64)


def to_bfloat16(a: npt.ArrayLike) -> HostArray:
    """float64 or integer values as bfloat16, rounded once as cuda_src/convert.cu rounds them (and NumPy with
    ml_dtypes 0.7; earlier ml_dtypes went through float32, two roundings): toward zero to float32 with an
    inexact result's last bit set (round to odd), then to nearest even. A 64-bit integer goes through float64
    rounded to odd too (float64's 53 bits hold float32's 24 and two more, so that step changes nothing), where a
    plain conversion would round it past 2^53.

    Examples
    --------
    >>> from cukern.reference import to_bfloat16
    >>> b = to_bfloat16(np.array([1.0, 1.00390625, 2**24 + 1]))
    >>> print(b.dtype, b.astype(np.float64))
    bfloat16 [1.0000000e+00 1.0000000e+00 1.6777216e+07]
    """
    from .._dtypes import BFLOAT16

    v = np.asarray(a)
    v = _odd_float64(v) if v.dtype.kind in "iu" and v.itemsize == 8 else v.astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        f = v.astype(np.float32)
        away = np.isfinite(v) & (np.abs(f.astype(np.float64)) > np.abs(v))  # nearest went past v: step back
        f = np.where(away, np.nextafter(f, np.float32(0)), f).astype(np.float32)
        odd = (f.astype(np.float64) != v) & ~np.isnan(v)
    return (f.view(np.uint32) | odd.astype(np.uint32)).view(np.float32).astype(BFLOAT16)


def _astype(a, dtype):
    """``a.astype(dtype)`` as cukern's own conversions make it on the GPU (cukern._convert): a float64 or
    integer value into bfloat16 by :func:`to_bfloat16`, everything else as NumPy converts."""
    from .._dtypes import BFLOAT16

    a, dtype = np.asarray(a), np.dtype(dtype)
    if dtype == BFLOAT16 and (a.dtype == np.float64 or a.dtype.kind in "iu"):
        return to_bfloat16(a)
    return a.astype(dtype)
