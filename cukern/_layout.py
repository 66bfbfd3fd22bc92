"""Array geometry: the one stride and extent arithmetic, the one stand-in array planning uses, and row
layouts (how the leading dimensions of several same-shaped arrays map to rows).

Kernels address a row through two leading levels (``row // inner * s0 + row % inner * s1``, in elements);
:func:`rows_layout` merges leading dimensions wherever every array allows it, so contiguous arrays,
per-head layouts ``[tokens, heads, dim]`` and views into fused buffers all become one launch. Layouts that
still need more levels are split into several launches over the extra outer dimensions.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np


def contiguous_strides(shape, itemsize: int = 1) -> tuple:
    """C-order strides of ``shape``, in units of ``itemsize`` (1: elements; an item size: bytes)."""
    out, step = [], itemsize
    for n in reversed(shape):
        out.append(step)
        step *= max(n, 1)
    return tuple(reversed(out))


def extent(ptr: int, shape, strides, itemsize: int) -> tuple:
    """The byte range ``[lo, hi)`` an array with element 0 at ``ptr`` touches (``strides`` in bytes, any sign;
    a non-empty shape)."""
    lo = hi = ptr
    for n, s in zip(shape, strides):
        if s > 0:
            hi += (n - 1) * s
        else:
            lo += (n - 1) * s
    return lo, hi + itemsize


def item_aligned(ptr: int, shape, strides, itemsize: int) -> bool:
    """Whether every element starts at a multiple of ``itemsize``: the address and the stride (bytes) of each
    axis longer than one, as the GPU's loads of the dtype need (an empty array holds no element)."""
    if 0 in shape:
        return True
    return ptr % itemsize == 0 and all(s % itemsize == 0 for n, s in zip(shape, strides) if n > 1)


class _Address:
    __slots__ = ("ptr",)

    def __init__(self, ptr: int):
        self.ptr = ptr


class _Device:
    __slots__ = ("id",)

    def __init__(self, id: int):
        self.id = id


@dataclass(frozen=True)
class ArraySpec:
    """What planning and validation read of an array, without the array: shape, byte strides, dtype and
    address (for alignment). It answers ``.shape``, ``.strides``, ``.itemsize``, ``.dtype``, ``.ndim``,
    ``.size``, ``.data.ptr`` and ``.device.id`` (0: stand-ins share one device) like a ``cupy.ndarray``, so a
    planner or an op's checks take either. :meth:`fresh` is an output not allocated
    yet: C-contiguous at an allocation-aligned address (CuPy's allocations are 256-byte aligned)."""

    shape: tuple
    strides: tuple
    dtype: np.dtype
    ptr: int = 0

    @classmethod
    def fresh(cls, shape, dtype) -> "ArraySpec":
        dtype = np.dtype(dtype)
        return cls(tuple(shape), contiguous_strides(shape, dtype.itemsize), dtype)

    @classmethod
    def of(cls, a) -> "ArraySpec":
        return cls(tuple(a.shape), tuple(a.strides), np.dtype(a.dtype), a.data.ptr)

    @property
    def itemsize(self) -> int:
        return np.dtype(self.dtype).itemsize

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def data(self) -> _Address:
        return _Address(self.ptr)

    @property
    def device(self) -> _Device:
        return _Device(0)


@dataclass(frozen=True)
class RowsLayout:
    rows: int  # rows per launch
    inner: int
    strides: tuple  # per array: (s0, s1) in elements
    outer: tuple  # per launch: per array element offset


def k_order(shape, strides, axes) -> tuple | None:
    """NumPy's ``K`` order of a reduction's result (or, with no ``axes``, of a scan's): the permutation (kept
    axes outermost first, then the reduced ``axes`` in their order) that lays the kept axes out as x's memory
    does, or None when that is C order. NumPy's iterator sorts the axes by |stride|, a stable insertion sort
    from the last axis inwards in which an axis of stride 0 or size 1 compares with nothing; the result is
    allocated contiguous in that order (positive strides)."""
    nd = len(shape)
    mag = [0 if shape[i] == 1 else abs(strides[i]) for i in range(nd)]
    perm = list(range(nd))[::-1]  # innermost first
    for i0 in range(1, nd):
        a0, pos = perm[i0], i0
        for i1 in range(i0 - 1, -1, -1):
            a1 = perm[i1]
            if mag[a0] and mag[a1]:
                if mag[a1] <= mag[a0]:
                    break
                pos = i1
        if pos != i0:
            del perm[i0]
            perm.insert(pos, a0)
    kept = [a for a in reversed(perm) if a not in axes]
    if kept == sorted(kept):
        return None
    return tuple(kept) + tuple(axes)


def collapse(shape: tuple, strides: list) -> tuple:
    """Merge adjacent dimensions that are contiguous with each other in every array and drop size-1 ones.
    ``strides`` holds one stride tuple (in elements) per array. Returns (shape, per-array strides)."""
    dims = [(n, [s[i] for s in strides]) for i, n in enumerate(shape) if n != 1]
    merged: list = []
    for n, ss in dims:
        if merged:
            pn, pss = merged[-1]
            if all(ps == s * n for ps, s in zip(pss, ss)):
                merged[-1] = (pn * n, ss)
                continue
        merged.append((n, ss))
    return tuple(n for n, _ in merged), [tuple(ss[k] for _, ss in merged) for k in range(len(strides))]


def rows_layout(arrays) -> RowsLayout:
    """Row layout of same-shaped arrays over all but their last dimension."""
    lead = arrays[0].shape[:-1]
    shape, strides = collapse(lead, [tuple(s // a.itemsize for s in a.strides[:-1]) for a in arrays])
    if not shape:
        return RowsLayout(rows=1, inner=1, strides=tuple((0, 0) for _ in arrays), outer=(tuple(0 for _ in arrays),))
    if len(shape) == 1:
        return RowsLayout(shape[0], shape[0], tuple((0, s[0]) for s in strides), (tuple(0 for _ in arrays),))
    extra = shape[:-2]
    outer = tuple(
        tuple(sum(i * s for i, s in zip(idx, st[:-2])) for st in strides)
        for idx in itertools.product(*(range(n) for n in extra))
    )
    return RowsLayout(math.prod(shape[-2:]), shape[-1], tuple((s[-2], s[-1]) for s in strides), outer)
