"""Segmented reductions (cuda_src/segment.cu): rows offsets[s] : offsets[s + 1] of x along axis 0."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from .._typing import Array, HostArray
from ._common import _numpy
from .reductions import _tree_max, _tree_min, _tree_sum, reduction_tree

_EXACT: dict[str, Callable[..., Any]] = {"segment_sum": np.sum, "segment_max": np.max, "segment_min": np.min}


def _segments(x, offsets):
    x = _numpy(x)
    o = np.asarray(_numpy(offsets)).astype(np.int64)
    return x, o, x.reshape(x.shape[0], int(np.prod(x.shape[1:], dtype=np.int64)))  # -1 fails for no rows


def _segment_reference(x, offsets, fn, empty):
    x, o, v = _segments(x, offsets)
    out = np.full((len(o) - 1, v.shape[1]), empty, np.float64)
    for s in range(len(o) - 1):
        if o[s + 1] > o[s]:
            out[s] = fn(v[o[s]:o[s + 1]].astype(np.float64), axis=0)
    return out.reshape((len(o) - 1,) + x.shape[1:])


def segment_sum(x: Array, offsets: Array) -> HostArray:
    """Each segment's float64 sum along axis 0 (0 for an empty segment).

    Examples
    --------
    >>> from cukern.reference import segment_sum
    >>> x = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    >>> offsets = np.array([0, 2, 2, 5])  # segments x[0:2], x[2:2] (empty) and x[2:5]
    >>> print(segment_sum(x, offsets))
    [ 3.  0. 12.]
    """
    return _segment_reference(x, offsets, np.sum, 0.0)


def segment_max(x: Array, offsets: Array) -> HostArray:
    """Each segment's maximum along axis 0 (-inf for an empty segment; NaN if it holds a NaN).

    Examples
    --------
    >>> from cukern.reference import segment_max
    >>> x = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    >>> offsets = np.array([0, 2, 2, 5])  # segments x[0:2], x[2:2] (empty) and x[2:5]
    >>> print(segment_max(x, offsets))
    [  2. -inf   5.]
    """
    return _segment_reference(x, offsets, np.max, -np.inf)


def segment_min(x: Array, offsets: Array) -> HostArray:
    """Each segment's minimum along axis 0 (+inf for an empty segment; NaN if it holds a NaN).

    Examples
    --------
    >>> from cukern.reference import segment_min
    >>> x = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    >>> offsets = np.array([0, 2, 2, 5])  # segments x[0:2], x[2:2] (empty) and x[2:5]
    >>> print(segment_min(x, offsets))
    [ 1. inf  3.]
    """
    return _segment_reference(x, offsets, np.min, np.inf)


def segment_mean(x: Array, offsets: Array) -> HostArray:
    """Each segment's float64 mean along axis 0 (NaN for an empty segment).

    Examples
    --------
    >>> from cukern.reference import segment_mean
    >>> x = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    >>> offsets = np.array([0, 2, 2, 5])  # segments x[0:2], x[2:2] (empty) and x[2:5]
    >>> print(segment_mean(x, offsets))
    [1.5 nan 4. ]
    """
    return _segment_reference(x, offsets, np.mean, np.nan)


def _segment_emulated(op: str, x, offsets):
    """Each segment through :func:`reduction_tree` over its own length, segments of one length at a time,
    in float32 (float64 for float64 x and for the means of integers and bool), then rounded to the result
    dtype (a mean: the sum widened to float64, divided by the length, rounded through float32 for the half
    types). Integer and bool sums, maxima and minima are exact (sums wrap at 64 bits, as NumPy's), so
    their values do not depend on any order."""
    from ..segment import result_dtype

    x, o, v = _segments(x, offsets)
    rt = result_dtype(op, x.dtype)
    exact = x.dtype.kind in "biu" and op != "segment_mean"
    acc = rt if exact else np.float64 if rt == np.float64 else np.float32
    combine, identity = {"segment_sum": (_tree_sum, 0), "segment_mean": (_tree_sum, 0),
                         "segment_max": (_tree_max, -np.inf), "segment_min": (_tree_min, np.inf)}[op]
    if exact and op != "segment_sum":
        limits = (False, True) if x.dtype == np.bool_ else (np.iinfo(x.dtype).min, np.iinfo(x.dtype).max)
        identity = limits[op == "segment_min"]
    rows = x.shape[0]
    start = np.clip(o[:-1], 0, rows)
    length = np.clip(o[1:], start, rows) - start
    out = np.empty((len(o) - 1, v.shape[1]), acc)
    for n in np.unique(length):
        which = np.flatnonzero(length == n)
        idx = start[which, None] + np.arange(n)[None, :]
        seg = v[idx].astype(acc)  # [segments of this length, n, cols]
        if not n:
            out[which] = identity
        elif exact:
            out[which] = _EXACT[op](seg, axis=1)
        else:
            out[which] = reduction_tree(np.moveaxis(seg, 1, 2), combine, identity)
    if op == "segment_mean":
        with np.errstate(invalid="ignore", divide="ignore"):
            wide = out.astype(np.float64) / length[:, None]
        out = wide if acc == np.float64 else wide.astype(np.float32)
    return out.astype(rt).reshape((len(o) - 1,) + x.shape[1:])


def segment_sum_emulated(x: Array, offsets: Array) -> HostArray:
    """The bits :func:`cukern.segment_sum` returns: each segment's :func:`reduction_tree` sum, the same
    bits as :func:`sum_emulated` of that slice along axis 0 (but for one row of -0, which the tree's chain
    adds to +0 where a one-row sum copies it).

    Examples
    --------
    >>> from cukern.reference import segment_sum_emulated
    >>> x = np.array([[1, 2], [3, 4], [5, 6]], np.int8)
    >>> y = segment_sum_emulated(x, np.array([0, 1, 3]))
    >>> print(y.dtype, y.tolist())
    int64 [[1, 2], [8, 10]]
    """
    return _segment_emulated("segment_sum", x, offsets)


def segment_max_emulated(x: Array, offsets: Array) -> HostArray:
    """The bits :func:`cukern.segment_max` returns (reduce.cu's max: NaN propagates, +0 over -0).

    Examples
    --------
    >>> from cukern.reference import segment_max_emulated
    >>> print(segment_max_emulated(np.array([-0.0, 0.0, np.nan], np.float32), np.array([0, 2, 3])))
    [ 0. nan]
    """
    return _segment_emulated("segment_max", x, offsets)


def segment_min_emulated(x: Array, offsets: Array) -> HostArray:
    """The bits :func:`cukern.segment_min` returns (NaN propagates, -0 under +0).

    Examples
    --------
    >>> from cukern.reference import segment_min_emulated
    >>> print(segment_min_emulated(np.array([0.0, -0.0, 2.0], np.float32), np.array([0, 2, 3])))
    [-0.  2.]
    """
    return _segment_emulated("segment_min", x, offsets)


def segment_mean_emulated(x: Array, offsets: Array) -> HostArray:
    """The bits :func:`cukern.segment_mean` returns: the tree's sum widened to float64, divided once by the
    length, rounded to x's dtype (through float32 for the half types; NaN for an empty segment).

    Examples
    --------
    >>> from cukern.reference import segment_mean_emulated
    >>> print(segment_mean_emulated(np.array([1.0, 2.0, 4.0], np.float16), np.array([0, 3, 3])))
    [2.334   nan]
    """
    return _segment_emulated("segment_mean", x, offsets)
