"""LayerNorm (forward, fused add, backward): float64 references and exact emulators."""

from __future__ import annotations

from typing import cast

import numpy as np

from .._typing import Array, HostArray
from ._common import _f64, _numpy, _xp
from .norms import _class_tree_sum, column_tree_emulated


def layer_norm(x: Array, weight: Array | None = None, bias: Array | None = None, eps: float = 1e-5) -> Array:
    """``(x - mean) / sqrt(var + eps) * weight + bias`` over the last axis, in float64. Reads x, weight, bias;
    writes out.

    Examples
    --------
    >>> from cukern.reference import layer_norm
    >>> print(layer_norm(np.array([[1.0, 3.0]]), eps=0.0))
    [[-1.  1.]]
    """
    xp = _xp(x)
    x = _f64(x)
    mean = xp.mean(x, axis=-1, keepdims=True)
    y = (x - mean) / xp.sqrt(xp.mean((x - mean) ** 2, axis=-1, keepdims=True) + eps)
    if weight is not None:
        y = y * _f64(weight)
    return y if bias is None else y + _f64(bias)


def layer_norm_backward(dy: Array, x: Array, weight: Array | None = None, eps: float = 1e-5) -> tuple:
    """``(dx, dweight, dbias)`` of :func:`layer_norm` in float64 (dweight None without a weight). Reads dy, x,
    weight; writes dx, dweight, dbias.

    Examples
    --------
    >>> from cukern.reference import layer_norm_backward
    >>> dx, dw, db = layer_norm_backward(np.ones((2, 2)), np.array([[1.0, 3.0], [0.0, 2.0]]), np.ones(2), 0.0)
    >>> print(dx, dw, db)
    [[0. 0.]
     [0. 0.]] [-2.  2.] [2. 2.]
    """
    xp = _xp(x)
    x, dy = _f64(x), _f64(dy)
    mean = xp.mean(x, axis=-1, keepdims=True)
    rstd = 1 / xp.sqrt(xp.mean((x - mean) ** 2, axis=-1, keepdims=True) + eps)
    xhat = (x - mean) * rstd
    g = dy if weight is None else dy * _f64(weight)
    dx = rstd * (g - xp.mean(g, axis=-1, keepdims=True) - xhat * xp.mean(g * xhat, axis=-1, keepdims=True))
    lead = tuple(range(x.ndim - 1))
    return dx, None if weight is None else xp.sum(dy * xhat, axis=lead), xp.sum(dy, axis=lead)


def layer_norm_stats_emulated(x: HostArray, eps: float = 1e-5) -> tuple[HostArray, HostArray]:
    """``(mean, rstd)``, float32, as every layer_norm kernel computes them from float32 rows ``x`` (NumPy),
    in two passes over the rms_norm tree: each class's elements summed in index order from -0 and the class
    sums added as a perfect binary tree, neighbours first, the mean that sum divided by hidden; then the
    squares of ``x - mean`` the same way, M2; ``rstd = 1 / sqrt(M2 / hidden + eps)``. Each step one float32
    rounding.

    Examples
    --------
    >>> from cukern.reference import layer_norm_stats_emulated
    >>> mean, rstd = layer_norm_stats_emulated(np.array([[1.0, 2.0, 3.0, 6.0]], np.float32), eps=0.0)
    >>> print(mean, rstd)
    [3.] [0.5345225]
    """
    v = np.asarray(x, np.float32)
    hidden = np.float32(v.shape[-1])
    with np.errstate(all="ignore"):
        mean = (_class_tree_sum(v) / hidden).astype(np.float32)
        e = v - mean[..., None]
        m2 = _class_tree_sum(e * e)
        rstd = np.float32(1) / np.sqrt(m2 / hidden + np.float32(float(eps)))
    return mean, rstd.astype(np.float32)


def _normalized(v, weight, bias, mean, rstd):
    with np.errstate(all="ignore"):
        y = (v - mean[..., None]) * rstd[..., None]
        if weight is not None:
            y = y * _numpy(weight).astype(np.float32)
        return y + (_numpy(bias).astype(np.float32) if bias is not None else np.float32(-0.0))


def layer_norm_emulated(x: Array, weight: Array | None = None, bias: Array | None = None, eps: float = 1e-5,
                        return_stats: bool = False) -> HostArray | tuple:
    """The bits :func:`cukern.layer_norm` writes, from the values, dtypes and eps alone: mean and rstd from
    :func:`layer_norm_stats_emulated` of x widened to float32, then ``((x - mean) * rstd) * weight + bias``
    in float32, each step rounded (no weight: no product; no bias: + -0, which changes nothing), rounded once
    to x's dtype. With ``return_stats``: ``(out, mean, rstd)``. Reads x, weight, bias; writes out.

    Examples
    --------
    >>> from cukern.reference import layer_norm_emulated
    >>> y = layer_norm_emulated(np.array([[1.0, 2.0, 3.0, 6.0]], np.float16), eps=0.0)
    >>> print(y.dtype, y)
    float16 [[-1.069 -0.5347  0.      1.604 ]]
    """
    x = _numpy(x)
    v = x.astype(np.float32)
    if v.shape[-1] == 0:
        mean = rstd = np.full(v.shape[:-1], np.nan, np.float32)
    else:
        mean, rstd = layer_norm_stats_emulated(v, eps)
    out = _normalized(v, weight, bias, mean, rstd).astype(x.dtype)
    return (out, mean, rstd) if return_stats else out


def fused_add_layer_norm_emulated(x: Array, residual: Array, weight: Array | None = None,
                                  bias: Array | None = None, eps: float = 1e-5) -> tuple[HostArray, HostArray]:
    """``(new_residual, out)`` as :func:`cukern.fused_add_layer_norm` writes them: ``residual + x`` in float32
    rounded once to residual's dtype, then :func:`layer_norm_emulated` of that.

    Examples
    --------
    >>> from cukern.reference import fused_add_layer_norm_emulated
    >>> r, y = fused_add_layer_norm_emulated(np.ones((1, 2), np.float32), np.array([[0.0, 2.0]], np.float32), eps=0.0)
    >>> print(r, y)
    [[1. 3.]] [[-1.  1.]]
    """
    residual = _numpy(residual)
    r = (residual.astype(np.float32) + _numpy(x).astype(np.float32)).astype(residual.dtype)
    return r, cast(HostArray, layer_norm_emulated(r, weight, bias, eps))


def layer_norm_backward_emulated(dy: Array, x: Array, weight: Array | None = None, eps: float = 1e-5,
                                 mean: Array | None = None, rstd: Array | None = None,
                                 dresidual: Array | None = None) -> tuple:
    """``(dx, dweight, dbias)`` as :func:`cukern.layer_norm_backward` writes them (dweight None without a
    weight). In float32, each step rounded: mean and rstd as given, else :func:`layer_norm_stats_emulated`;
    ``xhat = (x - mean) * rstd``, ``g = dy * weight`` (dy without a weight); ``sum(g)`` and ``sum(g * xhat)``
    over the rms_norm tree (each class in index order from -0, the classes pairwise); with ``inv = 1 / hidden``
    rounded once, ``dx = rstd * ((g - sum(g) * inv) - xhat * (sum(g * xhat) * inv))`` (``+ dresidual``),
    rounded to x's dtype. dweight
    and dbias: the rows (leading axes flattened in C order) in chunks of
    :func:`cukern.layernorm.chunk_rows` rows, each chunk adding ``dy * xhat`` and ``dy`` in row order from -0,
    the chunks' partials then added pairwise, neighbours first, padded with -0 to a power of two; rounded to
    weight's dtype (x's without one).

    Examples
    --------
    >>> from cukern.reference import layer_norm_backward_emulated
    >>> x = np.array([[1.0, 3.0], [0.0, 2.0]], np.float32)
    >>> dx, dw, db = layer_norm_backward_emulated(np.ones_like(x), x, np.ones(2, np.float32), eps=0.0)
    >>> print(dx, dw, db)
    [[0. 0.]
     [0. 0.]] [-2.  2.] [2. 2.]
    """
    from ..layernorm import chunk_rows

    x, dy = _numpy(x), _numpy(dy)
    v, d = x.astype(np.float32), dy.astype(np.float32)
    hidden = v.shape[-1]
    w_dtype = x.dtype if weight is None else _numpy(weight).dtype
    if mean is None:
        mean, rstd = layer_norm_stats_emulated(v, eps) if hidden else (np.zeros(v.shape[:-1], np.float32),) * 2
    else:
        mean, rstd = _numpy(mean).astype(np.float32), _numpy(rstd).astype(np.float32)
    with np.errstate(all="ignore"):
        xhat = (v - mean[..., None]) * rstd[..., None]
        g = d if weight is None else d * _numpy(weight).astype(np.float32)
        sums = []
        for t in (g, g * xhat):
            sums.append(_class_tree_sum(t) if hidden else np.full(t.shape[:-1], -0.0, np.float32))
        inv = np.float32(1) / np.float32(max(hidden, 1))
        mg, mgx = (sums[0] * inv)[..., None], (sums[1] * inv)[..., None]
        dx = rstd[..., None] * ((g - mg) - xhat * mgx)
        if dresidual is not None:
            dx = dx + _numpy(dresidual).astype(np.float32)
        rows = int(np.prod(v.shape[:-1], dtype=np.int64))
        if rows == 0:
            zero = np.zeros(hidden, w_dtype)
            return dx.astype(x.dtype), None if weight is None else zero, zero
        r = chunk_rows(rows)
        chunks = -(-rows // r)
        grads = []
        for t in (d * xhat, d):
            flat = t.reshape(rows, hidden)
            part = np.full((chunks, hidden), -0.0, np.float32)
            for i in range(r):
                idx = np.arange(chunks) * r + i
                live = idx < rows
                part[live] = part[live] + flat[idx[live]]
            grads.append(column_tree_emulated(part).astype(w_dtype))
    return dx.astype(x.dtype), None if weight is None else grads[0], grads[1]
