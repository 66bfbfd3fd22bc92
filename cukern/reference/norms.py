"""RMSNorm (plain, fused add, Gemma offset, float8 outputs): float64 references and exact emulators."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .._typing import Array, HostArray
from ._common import _f64, _numpy, _xp


def rms_norm(x: Array, weight: Array | None = None, eps: float = 1e-6, offset: float = 0.0) -> Array:
    """``x / sqrt(mean(x**2, -1) + eps) * (offset + weight)`` in float64. Reads x, weight; writes out.

    Examples
    --------
    >>> from cukern.reference import rms_norm
    >>> x = np.array([[3.0, 4.0], [1.0, -1.0]])
    >>> print(rms_norm(x, eps=0.0))
    [[ 0.84852814  1.13137085]
     [ 1.         -1.        ]]
    >>> print(rms_norm(x, np.array([1.0, 0.5]), eps=0.0, offset=1.0))
    [[ 1.69705627  1.69705627]
     [ 2.         -1.5       ]]
    """
    xp = _xp(x)
    x = _f64(x)
    w = 1.0 if weight is None else _f64(weight)
    return x / xp.sqrt(xp.mean(x * x, axis=-1, keepdims=True) + eps) * (offset + w)


def fused_add_rms_norm(x: Array, residual: Array, weight: Array | None = None, eps: float = 1e-6,
                       offset: float = 0.0) -> tuple[Array, Array]:
    """``(new_residual, out)``: residual + x rounded to residual's dtype (as the kernel stores it), then
    the RMSNorm of that. Reads x, residual, weight; writes residual, out.

    Examples
    --------
    >>> from cukern.reference import fused_add_rms_norm
    >>> x = np.array([[1.0, 2.0]], np.float32)
    >>> residual = np.array([[2.0, 2.0]], np.float32)
    >>> new_residual, out = fused_add_rms_norm(x, residual, eps=0.0)
    >>> print(new_residual.dtype, new_residual)
    float32 [[3. 4.]]
    >>> print(out)
    [[0.84852814 1.13137085]]
    """
    r = (_f64(residual) + _f64(x)).astype(residual.dtype)
    return r, rms_norm(r, weight, eps, offset)


def rms_norm_sum_of_squares_emulated(x: HostArray) -> HostArray:
    """The float32 sum of squares of each row of ``x`` (a float32 NumPy array, reduced over its last axis) in
    the one tree every :func:`cukern.rms_norm` launch computes: with ``C = cukern.rmsnorm.tree_classes(hidden)``,
    class c holds the elements ``i % C == c`` and sums their squares in index order; the C class sums are
    then added pairwise, neighbours first, up a perfect binary tree. Every product and sum is one float32
    rounding (NumPy never fuses a multiply-add). It depends on the values and ``hidden`` alone.

    Examples
    --------
    >>> from cukern.reference import rms_norm_sum_of_squares_emulated
    >>> x = np.arange(8, dtype=np.float32).reshape(2, 4)
    >>> print(rms_norm_sum_of_squares_emulated(x))
    [ 14. 126.]
    """
    from ..rmsnorm import tree_classes

    hidden = x.shape[-1]
    c = tree_classes(hidden)
    part: HostArray = np.zeros(x.shape[:-1] + (c,), np.float32)
    for start in range(0, hidden, c):
        chunk = x[..., start:start + c]
        part[..., :chunk.shape[-1]] += chunk * chunk  # an empty class slot adds 0: its sum stays +0
    while part.shape[-1] > 1:
        part = part[..., 0::2] + part[..., 1::2]
    return part[..., 0]


def _rms_inv(v, eps):
    """``inv = 1 / sqrt(ss / hidden + eps)`` of float32 rows ``v``, one correctly rounded float32 step at a
    time, ``ss`` from :func:`rms_norm_sum_of_squares_emulated` (an empty row's is 0)."""
    ss = rms_norm_sum_of_squares_emulated(v) if v.shape[-1] else np.zeros(v.shape[:-1], np.float32)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return np.float32(1) / np.sqrt(ss / np.float32(v.shape[-1]) + np.float32(float(eps)))


def rms_norm_rstd_emulated(x: Array, eps: float = 1e-6) -> HostArray:
    """The float32 rstd ``1 / sqrt(ss / hidden + eps)`` of each row of ``x`` as :func:`cukern.rms_norm` forms it
    (and returns with ``return_rstd=True``), every step one float32 rounding (NaN for a row of no element).

    Examples
    --------
    >>> from cukern.reference import rms_norm_rstd_emulated
    >>> rstd = rms_norm_rstd_emulated(np.array([[3.0, 4.0], [1.0, -1.0]], np.float32), eps=0.0)
    >>> print(rstd.dtype, rstd)
    float32 [0.28284273 1.        ]
    """
    return _rms_inv(_numpy(x).astype(np.float32), eps)


def rms_norm_emulated(x: Array, weight: Array | None = None, eps: float = 1e-6,
                      offset: float = 0.0) -> HostArray:
    """The bits :func:`cukern.rms_norm` writes, as a NumPy array of x's dtype, from nothing but the values,
    the dtypes, ``eps`` and ``offset`` (no launch parameter exists here to pass): ``ss`` from
    :func:`rms_norm_sum_of_squares_emulated` on x widened to float32, ``inv = 1 / sqrt(ss / hidden + eps)``
    one correctly rounded float32 step at a time, ``out = (x * inv) * (offset + weight)`` in float32
    (weight None: 1), rounded once to the dtype (to nearest, ties to even). NaN inputs give NaN, whose
    payload may differ from the GPU's. Reads x, weight; writes out.

    Examples
    --------
    >>> from cukern.reference import rms_norm_emulated
    >>> x = np.array([[1.0, 2.0, 3.0, 4.0]], np.float16)
    >>> y = rms_norm_emulated(x)
    >>> print(y.dtype, y)
    float16 [[0.3652 0.7305 1.096  1.461 ]]
    """
    x = _numpy(x)
    v = x.astype(np.float32)
    inv = _rms_inv(v, eps)
    w = np.float32(1) if weight is None else _numpy(weight).astype(np.float32)
    return ((v * inv[..., None]) * (np.float32(float(offset)) + w)).astype(x.dtype)


def fused_add_rms_norm_emulated(x: Array, residual: Array, weight: Array | None = None, eps: float = 1e-6,
                                offset: float = 0.0) -> tuple[HostArray, HostArray]:
    """``(new_residual, out)`` as :func:`cukern.fused_add_rms_norm` writes them: ``residual + x`` added in
    float32 and rounded once to residual's dtype (the correctly rounded sum: float32 carries more than twice
    the bits of a 16-bit type), then :func:`rms_norm_emulated` of that rounded residual.

    Examples
    --------
    >>> from cukern.reference import fused_add_rms_norm_emulated
    >>> x = np.array([[0.5, -1.0]], np.float16)
    >>> residual = np.array([[1.0, 3.0]], np.float16)
    >>> new_residual, out = fused_add_rms_norm_emulated(x, residual)
    >>> print(new_residual, out)
    [[1.5 2. ]] [[0.8486 1.132 ]]
    """
    residual = _numpy(residual)
    r = (residual.astype(np.float32) + _numpy(x).astype(np.float32)).astype(residual.dtype)
    return r, rms_norm_emulated(r, weight, eps, offset)


def float8_e4m3fn_bits(v: Array) -> Array:
    """The float8 e4m3fn byte of each float32 of ``v`` as the kernels write it, as ``uint8`` (NumPy, or CuPy
    for a CuPy ``v``): round to nearest even, saturate to +-448 (infinities too), every NaN 0x7f. The
    integer and float32 steps of cuda_src/rms_norm.cu ``e4m3_arithmetic``; for every non-NaN float the
    byte of ``ml_dtypes.float8_e4m3fn`` of ``clip(v, -448, 448)`` (tests/test_rmsnorm_fp8.py checks both).

    Examples
    --------
    >>> from cukern.reference import float8_e4m3fn_bits
    >>> print(float8_e4m3fn_bits(np.array([1.0, -2.0, 0.0, 448.0, 1e6, np.nan])))
    [ 56 192   0 126 126 127]
    """
    xp = _xp(v)
    v = xp.asarray(v, dtype=np.float32)
    a = xp.minimum(xp.abs(v), np.float32(448))  # NaN kept
    b = a.view(np.uint32)
    normal = (b - np.uint32(120 << 23) + np.uint32(0x7FFFF) + ((b >> 20) & np.uint32(1))) >> 20  # wraps below 2^-6
    with np.errstate(invalid="ignore"):  # a NaN's sum (its code comes from the normal branch)
        subnormal = (a + np.float32(16384)).view(np.uint32) - np.float32(16384).view(np.uint32)
    code = xp.where(a < np.float32(2.0**-6), subnormal, xp.minimum(normal, np.uint32(0x7F)))
    sign = (v.view(np.uint32) >> 24) & np.uint32(0x80)
    return xp.where(code == 0x7F, code, code | sign).astype(np.uint8)


FP8_MAX = 448.0


FP8_MIN_SCALE = 2.0**-126


def rms_norm_fp8_values_emulated(x: Array, weight: Array | None = None, eps: float = 1e-6, offset: float = 0.0,
                                 scale: str | float = "per_token") -> tuple[HostArray, Any]:
    """``(v, s)``: the float32 values the float8 kernels convert to e4m3 and the scales, as
    :func:`rms_norm_fp8_emulated` defines them (``v = y * (1 / s)``).

    Examples
    --------
    >>> from cukern.reference import rms_norm_fp8_values_emulated
    >>> v, s = rms_norm_fp8_values_emulated(np.array([[1.0, -2.0]], np.float32), scale=0.5)
    >>> print(v, s)
    [[ 1.2649108 -2.5298216]] 0.5
    """
    v = _numpy(x).astype(np.float32)
    inv = _rms_inv(v, eps)
    one = np.float32(1)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        w = one if weight is None else _numpy(weight).astype(np.float32)
        t = v * (np.float32(float(offset)) + w)
        if isinstance(scale, str):
            if t.shape[-1]:
                tmax = np.abs(t).max(axis=-1)
                s = np.maximum((tmax * inv) / np.float32(FP8_MAX), np.float32(FP8_MIN_SCALE)).astype(np.float32)
            else:  # an empty row (whose inv is NaN) has no amax: the least scale, as the op writes
                s = np.full(t.shape[:-1], FP8_MIN_SCALE, np.float32)
        else:
            s = np.float32(scale)
        r = one / np.asarray(s, np.float32)
        return (t * inv[..., None]) * (r[..., None] if isinstance(scale, str) else r), s


def rms_norm_fp8_emulated(x: Array, weight: Array | None = None, eps: float = 1e-6, offset: float = 0.0,
                          scale: str | float = "per_token") -> HostArray | tuple[HostArray, HostArray]:
    """The bytes (and per-token scales) :func:`cukern.rms_norm` writes with ``out_dtype=float8_e4m3fn``, each
    step rounded to float32: ``inv`` as in :func:`rms_norm_emulated`, ``y = (x * (offset + weight)) * inv``
    (weight None: 1); ``s`` the static ``scale`` as float32, or per row ``max(amax / 448, 2^-126)`` with
    ``amax = max|x * (offset + weight)| * inv`` (NaN if any is NaN), which is the largest ``|y|`` (rounding
    is monotone) wherever ``inv`` is finite; ``q = float8_e4m3fn_bits(y * (1 / s))``. Returns ``q``
    (``uint8``), or ``(q, s)`` for ``scale="per_token"``.

    Examples
    --------
    >>> from cukern.reference import rms_norm_fp8_emulated
    >>> x = np.array([[1.0, -2.0, 4.0, 0.0]], np.float32)
    >>> q, s = rms_norm_fp8_emulated(x)
    >>> print(q, s)
    [[110 246 126   0]] [0.00389675]
    >>> print(rms_norm_fp8_emulated(x, scale=1.0))
    [[ 46 182  62   0]]
    """
    v, s = rms_norm_fp8_values_emulated(x, weight, eps, offset, scale)
    with np.errstate(invalid="ignore"):
        q = float8_e4m3fn_bits(v)
    return (q, s) if isinstance(scale, str) else q


def fused_add_rms_norm_fp8_emulated(x: Array, residual: Array, weight: Array | None = None, eps: float = 1e-6,
                                    offset: float = 0.0, scale: str | float = "per_token") -> tuple[HostArray, ...]:
    """``(new_residual, q)`` or ``(new_residual, q, s)``: the residual of :func:`fused_add_rms_norm_emulated`,
    then :func:`rms_norm_fp8_emulated` of it.

    Examples
    --------
    >>> from cukern.reference import fused_add_rms_norm_fp8_emulated
    >>> x = np.array([[1.0, 2.0]], np.float32)
    >>> residual, q, s = fused_add_rms_norm_fp8_emulated(x, np.ones((1, 2), np.float32))
    >>> print(residual, q, s)
    [[2. 3.]] [[121 126]] [0.00262656]
    """
    residual = _numpy(residual)
    r = (residual.astype(np.float32) + _numpy(x).astype(np.float32)).astype(residual.dtype)
    out = rms_norm_fp8_emulated(r, weight, eps, offset, scale)
    return (r,) + out if isinstance(out, tuple) else (r, out)


def rms_norm_fp8(x: Array, weight: Array | None = None, eps: float = 1e-6, offset: float = 0.0,
                 scale: str | float = "per_token") -> HostArray | tuple[HostArray, HostArray]:
    """The float64 reference of the float8 outputs, on the host: ``y`` = :func:`rms_norm` in float64, ``s`` the
    static scale or per row ``max(amax(|y|) / 448, 2^-126)`` in float64, and ml_dtypes' own float8_e4m3fn
    conversion of ``clip(y / s, -448, 448)``. Returns the bytes (``uint8``), or ``(bytes, s)`` per token.

    Examples
    --------
    >>> from cukern.reference import rms_norm_fp8
    >>> q, s = rms_norm_fp8(np.array([[1.0, -2.0, 4.0, 0.0]]))
    >>> print(q, s)
    [[110 246 126   0]] [0.00389675]
    """
    import ml_dtypes

    y = _numpy(rms_norm(_numpy(x), None if weight is None else _numpy(weight), eps, offset))
    per_token = isinstance(scale, str)
    with np.errstate(invalid="ignore"):
        if per_token:
            amax = np.abs(y).max(axis=-1) if y.shape[-1] else np.zeros(y.shape[:-1])
            s = np.maximum(amax / FP8_MAX, FP8_MIN_SCALE)
            q = np.clip(y / s[..., None], -FP8_MAX, FP8_MAX)
        else:
            s = float(np.float32(scale))
            q = np.clip(y / s, -FP8_MAX, FP8_MAX)
    q = q.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    return (q, s) if per_token else q


def rms_norm_backward(dy: Array, x: Array, weight: Array | None = None, eps: float = 1e-6, offset: float = 0.0,
                      dresidual: Array | None = None) -> tuple[Array, Array | None]:
    """``(dx, dweight)`` of :func:`rms_norm` in float64: with ``r = 1 / sqrt(mean(x**2) + eps)``,
    ``xhat = x * r``, ``g = dy * (offset + weight)``: ``dx = r * (g - xhat * mean(g * xhat)) + dresidual``,
    ``dweight = sum(dy * xhat)`` over every row (None without a weight). Reads dy, x, weight, dresidual;
    writes dx, dweight.

    Examples
    --------
    >>> from cukern.reference import rms_norm_backward
    >>> x = np.array([[3.0, 4.0], [1.0, -1.0]])
    >>> dy = np.array([[1.0, 0.0], [0.0, 1.0]])
    >>> dx, dweight = rms_norm_backward(dy, x, np.array([1.0, 0.5]), eps=0.0)
    >>> print(dx)
    [[ 0.18101934 -0.1357645 ]
     [ 0.25        0.25      ]]
    >>> print(dweight)
    [ 0.84852814 -1.        ]
    """
    xp = _xp(x)
    x, dy = _f64(x), _f64(dy)
    r = 1.0 / xp.sqrt(xp.mean(x * x, axis=-1, keepdims=True) + eps)
    xhat = x * r
    g = dy * (offset + (1.0 if weight is None else _f64(weight)))
    dx = r * (g - xhat * xp.mean(g * xhat, axis=-1, keepdims=True))
    if dresidual is not None:
        dx = dx + _f64(dresidual)
    dweight = None if weight is None else (dy * xhat).reshape(math.prod(x.shape[:-1]), x.shape[-1]).sum(axis=0)
    return dx, dweight


def _class_tree_sum(t: HostArray) -> HostArray:
    """Each row of float32 ``t`` summed in rms_norm's tree (:func:`rms_norm_sum_of_squares_emulated`'s classes
    and pairwise tree), each class from -0 (the identity that keeps a lone -0 term) in index order."""
    from ..rmsnorm import tree_classes

    hidden = t.shape[-1]
    c = tree_classes(hidden)
    part: HostArray = np.full(t.shape[:-1] + (c,), -0.0, np.float32)
    for start in range(0, hidden, c):
        chunk = t[..., start:start + c]
        part[..., :chunk.shape[-1]] += chunk
    while part.shape[-1] > 1:
        part = part[..., 0::2] + part[..., 1::2]
    return part[..., 0]


def column_tree_emulated(partials: HostArray) -> HostArray:
    """Column sums of float32 ``partials`` ``[leaves, cols]`` in the tree cuda_src/common/partials.cuh fixes:
    the perfect binary tree, neighbours first, over the leaves padded with -0 to a power of two (-0 is IEEE
    addition's identity, so how far they are padded changes nothing).

    Examples
    --------
    >>> from cukern.reference import column_tree_emulated
    >>> print(column_tree_emulated(np.array([[1.0, 2.0], [3.0, 4.0], [5.0, -0.0]], np.float32)))
    [9. 6.]
    >>> print(column_tree_emulated(np.array([[-0.0], [-0.0], [-0.0]], np.float32)))
    [-0.]
    """
    leaves = partials.shape[0]
    t = np.full((1 << max(0, (leaves - 1).bit_length()),) + partials.shape[1:], -0.0, np.float32)
    t[:leaves] = partials
    while t.shape[0] > 1:
        t = t[0::2] + t[1::2]
    return t[0]


def rms_norm_backward_emulated(dy: Array, x: Array, weight: Array | None = None, eps: float = 1e-6,
                               offset: float = 0.0, rstd: Array | None = None,
                               dresidual: Array | None = None) -> tuple[HostArray, HostArray | None]:
    """``(dx, dweight)`` as :func:`cukern.rms_norm_backward` writes them, from the values, the dtypes, eps, offset
    and the row count alone, every step one float32 rounding: ``r`` = rstd as given, or ``1 / sqrt(ss / hidden +
    eps)`` as :func:`rms_norm_emulated` forms it; ``w' = offset + weight`` (weight None: ``offset + 1``),
    ``g = dy * w'``; ``s`` = the row's sum of ``g * x`` in rms_norm's tree (:func:`_class_tree_sum`);
    ``m = (s * r) / hidden``; ``xhat = x * r``; ``dx = r * (g - xhat * m)``, ``+ dresidual``, rounded once to x's
    dtype. dweight: the rows (leading dimensions flattened in C order) cut into chunks of
    ``cukern.rmsnorm_backward.chunk_rows(rows, hidden)``, each chunk's ``dy * xhat`` summed row by row from -0,
    the chunks' partial rows summed by :func:`column_tree_emulated`, rounded once to weight's dtype.

    Examples
    --------
    >>> from cukern.reference import rms_norm_backward_emulated
    >>> x = np.array([[3.0, 4.0], [1.0, -1.0]], np.float16)
    >>> dy = np.array([[1.0, 0.0], [0.0, 1.0]], np.float16)
    >>> dx, dweight = rms_norm_backward_emulated(dy, x, np.array([1.0, 0.5], np.float16), eps=0.0)
    >>> print(dx.dtype, dx)
    float16 [[ 0.181  -0.1357]
     [ 0.25    0.25  ]]
    >>> print(dweight.dtype, dweight)
    float16 [ 0.8486 -1.    ]
    """
    from ..rmsnorm_backward import chunk_rows

    x, dy = _numpy(x), _numpy(dy)
    hidden = x.shape[-1]
    v, d = x.astype(np.float32), dy.astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        r = _rms_inv(v, eps) if rstd is None else _numpy(rstd).astype(np.float32)
        wp = np.float32(float(offset)) + (np.float32(1) if weight is None else _numpy(weight).astype(np.float32))
        g = d * wp
        s = _class_tree_sum(g * v) if hidden else np.zeros(x.shape[:-1], np.float32)
        m = (s * r) / np.float32(max(hidden, 1))
        xhat = v * r[..., None]
        o = r[..., None] * (g - xhat * m[..., None])
        if dresidual is not None:
            o = o + _numpy(dresidual).astype(np.float32)
        dx = o.astype(x.dtype)
        if weight is None:
            return dx, None
        rows = math.prod(x.shape[:-1])
        t = (d * xhat).reshape(rows, hidden)
        if rows == 0:
            return dx, np.zeros(hidden, _numpy(weight).dtype)
        each = chunk_rows(rows, hidden)
        chunks = -(-rows // each)
        partial = np.full((chunks, hidden), -0.0, np.float32)
        for i in range(each):
            idx = np.arange(chunks) * each + i
            live = idx < rows
            partial[live] += t[idx[live]]
        return dx, column_tree_emulated(partial).astype(_numpy(weight).dtype)
