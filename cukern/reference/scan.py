"""Scans (cuda_src/scan.cu): NumPy's cumsum and cumprod in float64 (or int64) as references; the emulators
evaluate the kernel's fixed expression over its tiles."""

from __future__ import annotations

import numpy as np

from .._typing import Array, DTypeLike, HostArray
from ._common import _astype, _numpy
from .reductions import _tree_complex_prod


def _scan_reference(fn, x, axis):
    x = _numpy(x)
    wide = x.astype(np.int64 if x.dtype.kind in "biu" else np.complex128 if x.dtype.kind == "c" else np.float64)
    return fn(wide, axis=axis)


def cumsum(x: Array, axis: int | None = None) -> HostArray:
    """``np.cumsum`` in float64 (int64 for integers and bool, complex128 for complex).

    Examples
    --------
    >>> from cukern.reference import cumsum
    >>> print(cumsum(np.array([[1, 2], [3, 4]], np.int8)), cumsum(np.array([0.5, 0.25]), axis=0))
    [ 1  3  6 10] [0.5  0.75]
    """
    return _scan_reference(np.cumsum, x, axis)


def cumprod(x: Array, axis: int | None = None) -> HostArray:
    """``np.cumprod`` in float64 (int64 for integers and bool, complex128 for complex).

    Examples
    --------
    >>> from cukern.reference import cumprod
    >>> print(cumprod(np.array([1.0, 2.0, 3.0, 4.0])))
    [ 1.  2.  6. 24.]
    """
    return _scan_reference(np.cumprod, x, axis)


def _accumulate(f, v):
    """The running combine of ``v`` along its last axis, in order: ``f.accumulate`` for a ufunc, a loop for
    the complex product (:func:`_tree_complex_prod`)."""
    if isinstance(f, np.ufunc):
        return f.accumulate(v, axis=-1)
    out = np.empty_like(v)
    out[..., 0] = v[..., 0]
    for i in range(1, v.shape[-1]):
        out[..., i] = f(out[..., i - 1], v[..., i])
    return out


def _scan_emulated(op: str, x, axis, dtype):
    from .._check import check_dtype
    from .._dtypes import BFLOAT16
    from ..scan import BLOCK, DTYPES, GROUP, items, normalize_axis, result_dtype, route

    x = _numpy(x)
    if x.ndim == 0:
        x = x.reshape(1)  # NumPy scans a 0-d array as one of shape (1,), as the op does
    axis = normalize_axis(axis, x.ndim)  # the op's TypeError or AxisError
    if x.dtype.kind == "c" and dtype is not None and np.dtype(dtype).kind != "c":
        raise TypeError(f"dtype={np.dtype(dtype).name} is not supported for {op} of {x.dtype.name}: NumPy does "
                        "not cast complex to real")
    if op == "cumsum" and (x.dtype.kind == "c" or (dtype is not None and np.dtype(dtype).kind == "c")):
        # the real and imaginary parts scanned apart, x converted to the complex result dtype first
        z = x.astype(x.dtype if dtype is None else np.dtype(dtype))
        r = np.empty((z.size,) if axis is None else z.shape, z.dtype)
        r.real, r.imag = (_scan_emulated(op, np.ascontiguousarray(p), axis, None) for p in (z.real, z.imag))
        return r
    if op == "cumprod" and dtype is not None and np.dtype(dtype).kind == "c" and x.dtype != np.dtype(dtype):
        x, dtype = (x.astype(np.float32) if x.dtype == BFLOAT16 else x).astype(dtype), None  # converted first
    if x.dtype.kind != "c" and (dtype is not None or x.dtype not in DTYPES):
        how = route(x.dtype, dtype)  # the public op's TypeError for a dtype it does not scan
        if how is not None:  # scan.route's conversions: x to via (uint64 viewed), its scan, then to the result
            via, final = how
            if x.dtype.kind == "u" and x.itemsize == 8 and via == np.int64:
                v = x.view(np.int64)
            elif final == np.uint64 and via == np.int64 and (x.dtype.kind == "f" or x.dtype == BFLOAT16):
                # a float as NumPy (x86) converts it to uint64: past int64's range by value, a negative one
                # wrapped (bfloat16's, as ml_dtypes 0.7 and the GPU do it, 0)
                f = x.astype(np.float32) if x.dtype == BFLOAT16 else x
                with np.errstate(invalid="ignore"):
                    big = np.where(f < 0, 0, f).astype(np.uint64).view(np.int64)
                    v = big if x.dtype == BFLOAT16 else np.where(f < 0, f.astype(np.int64), big)
            else:
                v = _astype(x, via)
            r = _scan_emulated(op, v, axis, None)
            return r.view(final) if final.kind == "u" and final.itemsize == 8 else _astype(r, final)
    check_dtype(x, "x", DTYPES)  # the public op's TypeError
    o = result_dtype(x.dtype, dtype)
    if x.size == 0:
        return np.empty((0,) if axis is None else x.shape, o)
    acc = o if o.kind == "c" else np.dtype(np.float64 if o == np.float64 else np.int64 if o.kind in "iu"
                                           else np.float32)
    f = _tree_complex_prod if acc.kind == "c" else np.multiply if op == "cumprod" else np.add
    identity = np.array(1 if op == "cumprod" else (-0.0 if acc.kind == "f" else 0), acc)
    if axis is None:
        shape, lines = (x.size,), x.reshape(1, -1)
    else:
        axis = axis % x.ndim
        moved = np.moveaxis(x, axis, -1)
        shape, lines = moved.shape, moved.reshape(-1, x.shape[axis])
    rows, n = lines.shape
    k = items(x.dtype, o)
    tiles = max(1, -(-n // (BLOCK * k)))
    # A line of one tile keeps only the warps, and a line of one warp only the lanes, that hold its elements:
    # nothing flows from a later lane or warp into an earlier one, and the identities past the line would
    # only cost time (many short lines: each padded to a whole tile).
    lanes = -(-n // k)
    held = BLOCK // 32 if tiles > 1 else -(-lanes // 32)
    width = 32 if held > 1 or tiles > 1 else lanes
    a = np.full((rows, tiles * held * width * k), identity, acc)
    a[:, :n] = lines.astype(acc)
    a = a.reshape(rows, tiles, held, width, k)
    with np.errstate(all="ignore"):
        s = _accumulate(f, a)  # each thread's k elements, in order
        u = s[..., -1]
        for d in (1, 2, 4, 8, 16):  # the lanes' ladder, every lane at once from the old values
            nxt = u.copy()
            nxt[..., d:] = f(u[..., :-d], u[..., d:])
            u = nxt
        lane_before = np.concatenate([np.broadcast_to(identity, u.shape[:-1] + (1,)), u[..., :-1]], axis=-1)
        warps = _accumulate(f, u[..., -1])
        warp_before = np.concatenate([np.broadcast_to(identity, warps.shape[:-1] + (1,)), warps[..., :-1]], axis=-1)
        # tiles in groups of GROUP: Q, the fold of a group's aggregates before each tile; S, each group's total;
        # B, the fold of the row's earlier totals; a tile's prefix B + Q
        groups = -(-tiles // GROUP)
        agg = np.full((rows, groups * GROUP), identity, acc)
        agg[:, :tiles] = warps[..., -1]
        within = _accumulate(f, agg.reshape(rows, groups, GROUP))
        q = np.concatenate([np.broadcast_to(identity, (rows, groups, 1)), within[..., :-1]], axis=-1)
        b = np.concatenate([np.broadcast_to(identity, (rows, 1)), _accumulate(f, within[..., -1])[:, :-1]],
                           axis=-1)
        tile_before = f(b[..., None], q).reshape(rows, -1)[:, :tiles]
        base = f(f(tile_before[:, :, None], warp_before)[..., None], lane_before)
        out = f(base[..., None], s)
    out = out.reshape(rows, -1)[:, :n].astype(o).reshape(shape)
    return out if axis is None else np.moveaxis(out, -1, axis)


def cumsum_emulated(x: Array, axis: int | None = None, dtype: DTypeLike | None = None) -> HostArray:
    """The bits :func:`cukern.cumsum` returns: per thread a running sum of :func:`cukern.scan.items` elements
    (8 for float32 scanned into float32, 16 otherwise), the lanes' ladder, the warps in order, the tiles of a
    group in order, the groups in order, combined as ``((P + W) + L) + s`` with ``P = B + Q``
    (cuda_src/scan.cu's notes). Complex x or ``dtype``: each part so, apart.

    Examples
    --------
    >>> from cukern.reference import cumsum_emulated
    >>> y = cumsum_emulated(np.full(4, 0.1, np.float32))
    >>> print(y.dtype, y)
    float32 [0.1 0.2 0.3 0.4]
    >>> print(cumsum_emulated(np.array([[1, 2], [3, 4]], np.uint8), axis=1).dtype)
    uint64
    """
    return _scan_emulated("cumsum", x, axis, dtype)


def cumprod_emulated(x: Array, axis: int | None = None, dtype: DTypeLike | None = None) -> HostArray:
    """The bits :func:`cukern.cumprod` returns: :func:`cumsum_emulated`'s expression with products (complex
    ones as prod's, :func:`_tree_complex_prod`: correctly rounded steps, 1 + 0i an exact identity).

    Examples
    --------
    >>> from cukern.reference import cumprod_emulated
    >>> print(cumprod_emulated(np.array([1.5, 2.0, -1.0], np.float16)))
    [ 1.5  3.  -3. ]
    """
    return _scan_emulated("cumprod", x, axis, dtype)
