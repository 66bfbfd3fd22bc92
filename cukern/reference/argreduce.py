"""Arg-reductions (cuda_src/argreduce.cu): NumPy's own functions as references; the emulators search the
kernel's keys."""

from __future__ import annotations

import numpy as np

from .._typing import Array, HostArray, HostResult


def _arg_reference(fn, x, axis, keepdims):
    x = np.asarray(x)
    wide = x if x.dtype.kind in "biuc" else x.astype(np.float64)
    return fn(wide, axis=axis, keepdims=keepdims)


def argmax(x: Array, axis: int | None = None, keepdims: bool = False) -> HostResult:
    """``np.argmax`` of x (floats widened to float64).

    Examples
    --------
    >>> from cukern.reference import argmax
    >>> print(argmax(np.array([[1, 7, 7], [9, 0, 9]]), axis=1))
    [1 0]
    """
    return _arg_reference(np.argmax, x, axis, keepdims)


def argmin(x: Array, axis: int | None = None, keepdims: bool = False) -> HostResult:
    """``np.argmin`` of x (floats widened to float64).

    Examples
    --------
    >>> from cukern.reference import argmin
    >>> print(argmin(np.array([3.0, -1.0, -1.0])))
    1
    """
    return _arg_reference(np.argmin, x, axis, keepdims)


def nanargmax(x: Array, axis: int | None = None, keepdims: bool = False) -> HostResult:
    """``np.nanargmax`` of x (floats widened to float64; ValueError for an all-NaN slice).

    Examples
    --------
    >>> from cukern.reference import nanargmax
    >>> print(nanargmax(np.array([np.nan, 2.0, 5.0])))
    2
    """
    return _arg_reference(np.nanargmax, x, axis, keepdims)


def nanargmin(x: Array, axis: int | None = None, keepdims: bool = False) -> HostResult:
    """``np.nanargmin`` of x (floats widened to float64; ValueError for an all-NaN slice).

    Examples
    --------
    >>> from cukern.reference import nanargmin
    >>> print(nanargmin(np.array([np.nan, 2.0, 5.0])))
    1
    """
    return _arg_reference(np.nanargmin, x, axis, keepdims)


def arg_keys(x: HostArray, op: str) -> HostArray:
    """The key cuda_src/argreduce.cu's ``element_key`` gives each element of the host array ``x``, unsigned of
    x's width: its unsigned order is ``op``'s order (reversed for argmin and nanargmin), -0 keyed as +0,
    a NaN's key all ones (argmax, argmin: it wins) or 0 (the nan forms: it loses); no number's key is 0 or
    all ones. Complex x (NumPy's lexicographic order, a NaN in either part a NaN): complex64's keys are
    uint64, the real part's 32-bit key over the imaginary part's; complex128's are x.shape + (2,) uint64,
    the real part's key then the imaginary part's, compared lexicographically (the kernel's Key128).

    Examples
    --------
    >>> from cukern.reference import arg_keys
    >>> k = arg_keys(np.array([-1.0, 0.0, 2.0], np.float32), "argmax")
    >>> print(k.dtype, bool(k[0] < k[1] < k[2]))
    uint32 True
    """
    import cukern.argreduce as A

    dt = np.dtype(x.dtype)
    kind, width = A.KINDS[dt], dt.itemsize
    flip, nan_loses = A.SEARCHES[op]
    if kind == A.KIND_COMPLEX:
        return _complex_arg_keys(x, flip, nan_loses)
    u = np.dtype(f"u{width}")
    b = np.asarray(x, order="C").view(u)  # ascontiguousarray would make a 0-d x 1-d
    sign = u.type(1 << (8 * width - 1))
    if kind == A.KIND_BOOL:
        k = (b != 0).astype(u)
    elif kind == A.KIND_SIGNED:
        k = b ^ sign
    elif kind == A.KIND_UNSIGNED:
        k = b.copy()
    else:
        wide = 0x7F800000 if width == 4 else 0x7FF0000000000000
        infinity = {A.KIND_HALF: 0x7C00, A.KIND_BFLOAT: 0x7F80}.get(kind, wide)
        mag = b & ~sign
        k = np.where(((b & sign) != 0) & (mag != 0), ~b, mag | sign).astype(u)
    if flip:
        k = ~k
    if kind in (A.KIND_FLOAT, A.KIND_HALF, A.KIND_BFLOAT):
        k = np.where(mag > u.type(infinity), u.type(0) if nan_loses else ~u.type(0), k).astype(u)
    return k


def _complex_arg_keys(x, flip: bool, nan_loses: bool):
    part = np.dtype(np.float32 if x.dtype == np.complex64 else np.float64)
    u = np.dtype(f"u{part.itemsize}")
    z = np.asarray(x, order="C")
    re, im = z.real.astype(part).view(u), z.imag.astype(part).view(u)
    sign = u.type(1 << (8 * part.itemsize - 1))

    def order(b):
        mag = b & ~sign
        return np.where(((b & sign) != 0) & (mag != 0), ~b, mag | sign).astype(u)

    nan = np.isnan(z.real) | np.isnan(z.imag)
    nan_key = np.uint64(0) if nan_loses else ~np.uint64(0)
    if u == np.uint32:
        k = (order(re).astype(np.uint64) << np.uint64(32)) | order(im).astype(np.uint64)
        if flip:
            k = ~k
        return np.where(nan, nan_key, k).astype(np.uint64)
    k = np.stack([order(re), order(im)], axis=-1)
    if flip:
        k = ~k
    return np.where(nan[..., None], nan_key, k).astype(np.uint64)


def _first_largest(k, ndim: int, axis, keepdims: bool):
    """The first index of the largest key along ``axis`` (None: flattened); ``k`` of ``ndim`` dimensions, or
    one more for complex128's (hi, lo) pairs, whose largest is the largest lo among the largest hi."""
    if k.ndim == ndim:
        return np.argmax(k, axis=axis, keepdims=keepdims)
    hi, lo = k[..., 0], k[..., 1]
    if axis is None:
        i = _first_largest(np.stack([hi.reshape(-1), lo.reshape(-1)], axis=-1), 1, 0, False)
        return i.reshape((1,) * ndim) if keepdims else i
    # lo is 0 only for a NaN keyed 0, and such a NaN's hi is the largest only in an all-NaN slice
    top = hi.max(axis=axis, keepdims=True)
    return np.argmax(np.where(hi == top, lo, np.uint64(0)), axis=axis, keepdims=keepdims)


def _arg_emulated(op: str, x, axis, keepdims):
    from ..argreduce import INEXACT, SEARCHES

    x = np.asarray(x)
    k = arg_keys(x, op)
    if x.ndim == 0:
        axis = None
    elif axis is not None:
        axis = axis % x.ndim
    hi = k if k.ndim == x.ndim else k[..., 0]
    if SEARCHES[op][1] and op.startswith("nanarg") and x.dtype in INEXACT and hi.size \
            and (np.max(hi, axis=axis) == 0).any():
        raise ValueError("All-NaN slice encountered")
    return _first_largest(k, x.ndim, axis, keepdims)  # the first of the largest keys


def argmax_emulated(x: Array, axis: int | None = None, keepdims: bool = False) -> HostArray:
    """The indices :func:`cukern.argmax` returns: the first index of the largest :func:`arg_keys`.

    Examples
    --------
    >>> from cukern.reference import argmax_emulated
    >>> print(argmax_emulated(np.array([1.0, np.nan, 3.0, np.nan], np.float32)))
    1
    >>> print(argmax_emulated(np.array([[-0.0, 0.0], [2.0, 2.0]], np.float32), axis=1))
    [0 0]
    """
    return _arg_emulated("argmax", x, axis, keepdims)


def argmin_emulated(x: Array, axis: int | None = None, keepdims: bool = False) -> HostArray:
    """The indices :func:`cukern.argmin` returns (keys in reversed order, so the largest key is the least
    value).

    Examples
    --------
    >>> from cukern.reference import argmin_emulated
    >>> print(argmin_emulated(np.array([4, 1, 1, 3], np.int8)))
    1
    """
    return _arg_emulated("argmin", x, axis, keepdims)


def nanargmax_emulated(x: Array, axis: int | None = None, keepdims: bool = False) -> HostArray:
    """The indices :func:`cukern.nanargmax` returns (NaNs keyed 0; an all-NaN slice raises ValueError).

    Examples
    --------
    >>> from cukern.reference import nanargmax_emulated
    >>> print(nanargmax_emulated(np.array([np.nan, 1.0, 3.0], np.float16)))
    2
    """
    return _arg_emulated("nanargmax", x, axis, keepdims)


def nanargmin_emulated(x: Array, axis: int | None = None, keepdims: bool = False) -> HostArray:
    """The indices :func:`cukern.nanargmin` returns (NaNs keyed 0; an all-NaN slice raises ValueError).

    Examples
    --------
    >>> from cukern.reference import nanargmin_emulated
    >>> print(nanargmin_emulated(np.array([[np.nan, 1.0], [2.0, np.nan]], np.float32), axis=1))
    [1 0]
    """
    return _arg_emulated("nanargmin", x, axis, keepdims)
