"""Segmented reductions (cuda_src/segment.cu): rows offsets[s] : offsets[s + 1] of x along axis 0."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

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


def segment_sum(x, offsets):
    """Each segment's float64 sum along axis 0 (0 for an empty segment)."""
    return _segment_reference(x, offsets, np.sum, 0.0)


def segment_max(x, offsets):
    """Each segment's maximum along axis 0 (-inf for an empty segment; NaN if it holds a NaN)."""
    return _segment_reference(x, offsets, np.max, -np.inf)


def segment_min(x, offsets):
    """Each segment's minimum along axis 0 (+inf for an empty segment; NaN if it holds a NaN)."""
    return _segment_reference(x, offsets, np.min, np.inf)


def segment_mean(x, offsets):
    """Each segment's float64 mean along axis 0 (NaN for an empty segment)."""
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


def segment_sum_emulated(x, offsets):
    """The bits :func:`cukern.segment_sum` returns: each segment's :func:`reduction_tree` sum, the same
    bits as :func:`sum_emulated` of that slice along axis 0 (but for one row of -0, which the tree's chain
    adds to +0 where a one-row sum copies it)."""
    return _segment_emulated("segment_sum", x, offsets)


def segment_max_emulated(x, offsets):
    """The bits :func:`cukern.segment_max` returns (reduce.cu's max: NaN propagates, +0 over -0)."""
    return _segment_emulated("segment_max", x, offsets)


def segment_min_emulated(x, offsets):
    """The bits :func:`cukern.segment_min` returns (NaN propagates, -0 under +0)."""
    return _segment_emulated("segment_min", x, offsets)


def segment_mean_emulated(x, offsets):
    """The bits :func:`cukern.segment_mean` returns: the tree's sum widened to float64, divided once by the
    length, rounded to x's dtype (through float32 for the half types; NaN for an empty segment)."""
    return _segment_emulated("segment_mean", x, offsets)
