"""RMSNorm and fused residual-add + RMSNorm (kernels in ``cuda_src/rms_norm.cu``).

Reference (float64, :func:`cukern.reference.rms_norm`)::

    out = x / sqrt(mean(x**2, axis=-1) + eps) * (offset + weight)

Memory traffic, the count every GB/s figure uses: read x (and residual), write out (and residual), read
weight once: ``bytes_moved``.

Reproducibility: a row's sum of squares is one tree fixed by the hidden size (:func:`tree_classes`) and every
float32 step is rounded to nearest, so the bits never depend on the launch (the exact emulators:
:func:`cukern.reference.rms_norm_emulated`, :func:`cukern.reference.fused_add_rms_norm_emulated`).

Float8 outputs (``out_dtype=ml_dtypes.float8_e4m3fn``): the same float32 values with the two products taken
in the other order (``(x * (offset + weight)) * inv``), divided by a static or a per-token scale and rounded
to e4m3fn, stored as ``uint8`` (CuPy 14 refuses ml_dtypes' float8 dtypes as an
array dtype; ``out.get().view(ml_dtypes.float8_e4m3fn)`` reads them on the host). Exact emulator:
:func:`cukern.reference.rms_norm_fp8_emulated`.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

import cukern._check as _check
import cukern._tuned as _tuned

from ._compile import Instantiation, get_kernel
from ._dtypes import BFLOAT16, FLOAT_TYPES
from ._interop import as_array
from ._launch import _NO_SWITCH
from ._launch import cupy as _cupy
from ._launch import NULL as _NULL
from ._launch import CallCache, LaunchConfig, Params, Prepared, launch, on_device, sm_count, struct_argument
from ._layout import ArraySpec, extent, rows_layout
from ._typing import DeviceArray, DTypeLike

SOURCE = "rms_norm"
MAX_TPR = 512
MAX_ITEMS = 16
MAX_BYTES = 64  # of the row a thread holds in registers (see plan)
WIDE_BLOCK, WIDE_ITEMS = 512, 4
MIN_CLASSES, MAX_CLASSES = 8, 4096  # the summation tree's leaves (see tree_classes)
MAX_HIDDEN = 2**31 - 2**20

# The kernels' scalars, one struct (``RmsNormParams`` in cuda_src/rms_norm.cu): strides in elements, rstd's in
# floats.
PARAMS = Params((("rows", "i64"), ("inner", "i64"), ("out_s0", "i64"), ("out_s1", "i64"), ("res_s0", "i64"),
                 ("res_s1", "i64"), ("x_s0", "i64"), ("x_s1", "i64"), ("hidden", "i32"), ("eps", "f32"),
                 ("offset", "f32"), ("rs_s0", "i64"), ("rs_s1", "i64")))


# Float8 outputs. CuPy 14 has no float8 array dtype (its array creation refuses ml_dtypes.float8_e4m3fn as
# "Unsupported dtype"), so the bytes are returned as uint8.
FLOAT8_E4M3FN = np.dtype(ml_dtypes.float8_e4m3fn)
FP8_MAX = 448.0  # the largest finite e4m3fn value: outputs saturate there
MIN_SCALE = 2.0**-126  # the least normal float32, the smallest scale (its reciprocal is finite)
FP8_PARAMS = Params(PARAMS.fields + (("sc_s0", "i64"), ("sc_s1", "i64"), ("scale", "f32")))


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(n, 1))))


def _pow2_at_most(n: int) -> int:
    return 1 << (max(n, 1).bit_length() - 1)


def tree_classes(hidden: int) -> int:
    """C, the leaves of a row's summation tree, from the row length alone: element i of a row belongs to class
    ``i % C``; each class sums its squares in index order (each square and sum rounded to float32, no fused
    multiply-add) and the C class sums are added as a perfect binary tree, neighbours first. C is the least
    power of two at or above ``hidden / 4`` (so a class holds three or four elements and the 16-byte path
    keeps that many loads in flight per thread), between 8 (at least one 16-byte vector of classes) and 4096 (the wide
    kernel's block of 512 threads times 8 lanes). Every plan computes exactly this tree, which is why a
    row's bits do not depend on the launch: ``cukern.reference.rms_norm_emulated`` follows it on the host."""
    return min(MAX_CLASSES, max(MIN_CLASSES, _pow2_at_least(math.ceil(hidden / 4))))


@dataclass(frozen=True)
class Plan:
    """The launch for one call: which kernel, its tile and its grid.

    ``vec`` elements per access, ``tpr`` threads per row, ``groups`` groups of ``vec`` summation classes a
    thread owns (``groups * tpr * vec`` is :func:`tree_classes`), ``items`` vectors per thread (rows
    kernel) or per chunk (wide kernel), a multiple of ``groups``, ``block`` threads per block, ``grid``
    blocks, ``rows_per_block`` rows one block holds at a time.
    """

    kernel: str  # "rows" (row held in registers) or "wide" (row streamed twice)
    hidden: int
    rows: int
    vec: int
    tpr: int
    groups: int
    items: int
    block: int
    grid: int

    @property
    def rows_per_block(self) -> int:
        return self.block // self.tpr

    @property
    def classes(self) -> int:
        """The leaves of the summation tree this launch computes: :func:`tree_classes` of ``hidden``."""
        return self.groups * self.tpr * self.vec

    @property
    def config(self) -> LaunchConfig:
        return LaunchConfig(grid=(self.grid,), block=(self.block,))

    def instantiation(self, dtype, weight_dtype, fused: bool, fp8: bool = False, rstd: bool = False) -> Instantiation:
        """The kernel of this plan: x's dtype out, or float8 bytes with ``fp8`` (static or per-token scales
        alike: the kernel takes the choice at run time); ``rstd``: the plain or fused kernel that also stores
        each row's rstd."""
        name = ("fused_add_rms_norm_" if fused else "rms_norm_") + ("fp8_" if fp8 else "") + self.kernel
        args: tuple
        if self.kernel == "rows":
            args = (dtype, weight_dtype, self.vec, self.tpr, self.groups, self.items, self.block)
        else:
            args = (dtype, weight_dtype, self.vec, self.groups, self.items, self.block)
        return Instantiation(SOURCE, name, args + ((True,) if rstd else ()))


@dataclass(frozen=True)
class Knobs:
    """The tuning space; no knob changes a row's summation tree (:func:`tree_classes`), only which threads
    compute which part of it. ``items_target``: vectors a thread keeps in flight, at least one per element
    of each class it owns (a class is never split), more by owning more classes (fewer threads per row);
    ``small_block``: threads per block when several rows share one; ``waves``: grid cap in waves of
    resident blocks (None: a block per row group). The defaults are what the H200 measurements chose
    (docs/design/rms_norm.md)."""

    items_target: int = 4
    small_block: int = 128
    waves: int | None = 8


DEFAULT_KNOBS = Knobs()
# rms_norm to float8 (no residual) where no tuning cache entry says otherwise: a grid of 4 waves, each block
# walking two rows or so, measured faster than 8 at [16384, 4096] bf16 (84.0% of the copy against 81.2%
# per token, 86.4% against 84.0% static; 2 waves 83.5%, 1 81.2%: docs/design/rms_norm.md)
FP8_DEFAULT_KNOBS = Knobs(waves=4)


def _tuning_rule(op: str, default: Knobs = DEFAULT_KNOBS) -> _tuned.Rule:
    """Cache entries per hidden size and power-of-two row bucket. Buckets of one hidden size may hold
    different knobs: none of them decides a row's summation order (no ``invariant`` knobs). ``default``: the
    knobs where the cache has no entry."""
    return _tuned.Rule(op, default, lambda d: Knobs(**d),
                       bucket=lambda shape: f"hidden={shape[-1]},rows<={_tuned.rows_bucket(math.prod(shape[:-1]))}")


TUNING = {False: _tuning_rule("rms_norm"), True: _tuning_rule("fused_add_rms_norm")}
# The float8 outputs read the entries of their op (rms_norm, fused_add_rms_norm) and take an entry as it is;
# where there is none, rms_norm to float8 has its own default (the fused form, not measured otherwise, keeps
# the heuristic's).
FP8_TUNING = {False: _tuning_rule("rms_norm", FP8_DEFAULT_KNOBS), True: TUNING[True]}


def plan(hidden: int, rows: int, vec: int, itemsize: int, sm_count: int = 132, knobs: Knobs = DEFAULT_KNOBS,
         *, fused: bool = False) -> Plan:
    """Pure launch planning from the row length, the row count and the usable vector width.

    The summation tree is fixed by ``hidden`` (:func:`tree_classes`: C classes of three or four elements
    each); the plan only splits its classes over threads. Thread t of a row owns ``groups`` groups of
    ``vec`` neighbouring classes (vector columns t + k * tpr, k < items), so ``tpr = C / (groups * vec)``
    threads per row and ``items = groups * s`` vectors per thread, s the power of two at or above
    ``ceil(hidden / C)`` (slots past the row stay empty). ``groups`` is the fewest that keep a row within
    512 threads, raised towards ``knobs.items_target`` vectors per thread. Rows of up to 32
    threads share a block of ``knobs.small_block`` threads; longer rows get a block each. A thread holds at
    most 64 bytes of its row (16 accesses; 4 fused, which also holds the residual loads in flight), so the
    weight (or residual) loads in flight beside it fit in registers without spills; longer rows go to the
    wide kernel, whose 512 threads walk the same classes chunk by chunk. Everything but the grid depends on
    ``hidden``, ``vec`` and the knobs, never on ``rows``; and none of them changes the tree, so a row's bits
    do not depend on the plan at all. The grid covers every row group once, or with ``knobs.waves`` at most
    that many full waves of resident blocks (``sm_count`` x 2048 / block), the blocks then looping over rows.
    """
    if vec not in (1, 2, 4, 8):
        raise ValueError(f"vec={vec}; it must be 1, 2, 4 or 8 (a vector holds whole summation classes)")
    if hidden < 1 or hidden % vec:
        raise ValueError(f"hidden={hidden} is not a positive multiple of vec={vec}")
    classes = tree_classes(hidden)
    per_class = _pow2_at_least(math.ceil(hidden / classes))  # vectors per group: slots past the row stay empty
    columns = classes // vec  # threads per row times groups
    fit = min(MAX_ITEMS // 4 if fused else MAX_ITEMS, MAX_BYTES // (vec * itemsize))  # vectors a thread may hold
    fewest = max(1, columns // MAX_TPR)
    most = min(columns, fit // per_class)
    if fewest > most:
        kernel, block = "wide", min(WIDE_BLOCK, columns)
        tpr, groups = block, columns // block
        items = max(WIDE_ITEMS, groups)
    else:
        groups = min(most, max(fewest, _pow2_at_most(knobs.items_target // per_class)))
        tpr, items = columns // groups, groups * per_class
        kernel, block = "rows", (tpr if tpr > 32 else knobs.small_block)
    grid = math.ceil(rows / (block // tpr))
    if knobs.waves is not None:
        grid = min(grid, knobs.waves * sm_count * (2048 // block))
    return Plan(kernel, hidden, rows, vec, tpr, groups, items, block, max(1, min(grid, 2**31 - 1)))


def widest_vector(hidden: int, itemsize: int) -> int:
    """The vector width the shape allows (alignment may still lower it to 1): 16 bytes' worth of elements
    when ``hidden`` is a multiple of it, else 1. The tuner plans with this rule too."""
    vec = 16 // itemsize
    return vec if hidden % vec == 0 else 1


def vector_width(hidden: int, arrays, weight=None) -> int:
    """:func:`widest_vector` when every array's base address and every leading stride allow it, else 1.
    ``weight`` (which may be wider than the others) must be aligned to its own chunk."""
    itemsize = arrays[0].itemsize
    vec = widest_vector(hidden, itemsize)
    if vec == 1:
        return 1
    for a in arrays:
        if a.data.ptr % 16 or any((s // itemsize) % vec for s in a.strides[:-1]):
            return 1
    if weight is not None and weight.data.ptr % min(16, vec * weight.itemsize):
        return 1
    return vec


# The knob values the tuner tries (cukern/lab/rmsnorm.py tunes over exactly these). Other items_target
# values change few plans: larger ones only the element path's (a thread holds at most 64 bytes), smaller
# ones only rows of at most 16 elements (a class is never split over threads).
SPACE = {"items_target": (4, 8), "small_block": (64, 128, 256), "waves": (None, 2, 4, 8)}


def plan_lengths() -> list:
    """One row length per (classes, elements per class) pair: every distinct thing ``plan`` reads of
    ``hidden``, so planning these covers every kernel a row length can choose."""
    return [c * k for c in (MIN_CLASSES << i for i in range((MAX_CLASSES // MIN_CLASSES).bit_length()))
            for k in range(1, MAX_ITEMS + 2) if tree_classes(c * k) == c]


def instantiations():
    """The instantiations ``plan`` chooses, generated by planning every supported dtype pair, both kernels,
    both vector widths and every ``items_target`` of :data:`SPACE` over one row length per (classes,
    elements per class) pair, which is all ``plan`` reads of ``hidden``. Only the default ``small_block`` is
    listed: the others change how many rows share a block, not the code, and compile on first use. The
    float8 kernels are listed for bfloat16 inputs, with bfloat16 or float32 weights (whose wider loads take
    more registers), at the default knobs (what a quantizing model runs; float16 plans are the same shapes);
    so are the kernels that also store rstd (``return_rstd``, what a training step runs), for every dtype pair
    with 16-byte accesses; other points compile on first use."""
    lengths = plan_lengths()
    knobs = [Knobs(items_target=i) for i in SPACE["items_target"]]
    out = set()
    dtypes = [(t, t) for t in FLOAT_TYPES] + [(t, np.dtype(np.float32)) for t in FLOAT_TYPES[1:]]
    for t, w in dtypes:
        for vec in sorted({16 // t.itemsize, 1}):
            for hidden in lengths:
                for k in knobs:
                    for fused in (False, True):
                        out.add(plan(hidden, 1, vec, t.itemsize, knobs=k, fused=fused).instantiation(t, w, fused))
    for w in (BFLOAT16, np.dtype(np.float32)):
        for vec in (8, 1):
            for hidden in lengths:
                for fused in (False, True):
                    p = plan(hidden, 1, vec, BFLOAT16.itemsize, fused=fused)
                    out.add(p.instantiation(BFLOAT16, w, fused, fp8=True))
    for t, w in dtypes:
        for hidden in lengths:
            for fused in (False, True):
                p = plan(hidden, 1, 16 // t.itemsize, t.itemsize, fused=fused)
                out.add(p.instantiation(t, w, fused, rstd=True))
    return sorted(out, key=lambda i: (i.name, i.expression))


def bytes_moved(shape, dtype, weight_dtype=None, *, fused: bool = False, out_dtype=None,
                per_token: bool = False) -> int:
    """Bytes the op must move: x (and residual) read, out (of ``out_dtype``, default x's) and residual
    written, weight read once, and with ``per_token`` one float32 scale written per row."""
    n = math.prod(shape)
    size = np.dtype(dtype).itemsize
    out = size if out_dtype is None else np.dtype(out_dtype).itemsize
    w = shape[-1] * np.dtype(weight_dtype).itemsize if weight_dtype is not None else 0
    scales = 4 * math.prod(shape[:-1]) if per_token else 0
    return (3 if fused else 1) * n * size + n * out + w + scales


def check_like_x(arrays: dict, names, like: str = "x") -> None:
    """The checks of ``arrays[like]`` (at least one dimension, a float type) and, against it, of the arrays
    ``names`` (its dtype and shape) and of ``arrays["weight"]`` (``[hidden]`` of x's dtype or float32); an
    array that is None or missing is not checked."""
    x = arrays[like]
    if x.ndim < 1:
        raise ValueError(f"{like} must have at least one dimension (the normalized one)")
    _check.check_dtype(x, like, FLOAT_TYPES)
    for n in names:
        a = arrays.get(n)
        if a is None:
            continue
        if a.dtype != x.dtype:
            raise TypeError(f"{n} has dtype {a.dtype}, {like} has {x.dtype}; they must match")
        if a.shape != x.shape:
            raise ValueError(f"{n} has shape {a.shape}, {like} has {x.shape}; they must match")
    w = arrays.get("weight")
    if w is not None:
        if w.dtype not in (x.dtype, np.dtype(np.float32)):
            raise TypeError(f"weight has dtype {w.dtype}; it must be x's dtype ({x.dtype}) or float32")
        if w.ndim != 1 or w.shape[0] != x.shape[-1]:
            raise ValueError(f"weight has shape {w.shape}; it must be 1-D with x's last dimension ({x.shape[-1]})")


def _validate(fused: bool, x, weight, out, residual):
    if fused and residual is None:
        raise TypeError("residual is None; fused_add_rms_norm adds x into residual in place, so pass an array "
                        "shaped like x (or call rms_norm)")
    names = {"x": x, "weight": weight, "out": out, "residual": residual}
    return check_arrays({n: as_array(a, n, writable=n in ("out", "residual")) for n, a in names.items()
                         if a is not None or n == "x"})


def check_arrays(arrays: dict) -> dict:
    """Every check of the arrays by name (``x``, and any of ``weight``, ``out`` and ``residual``), already
    converted; reads only shape, strides, dtype and device, so the ``explain`` card's stand-ins go through it."""
    x = arrays["x"]
    check_like_x(arrays, ("out", "residual"))
    _check.check_same_device(arrays)
    for n, a in arrays.items():
        _check.check_unit_last_stride(a, n)
    if x.shape[-1] > MAX_HIDDEN:
        raise ValueError(f"x's last dimension {x.shape[-1]} is over the supported {MAX_HIDDEN}")
    return arrays


_F32_MAX = float(np.finfo(np.float32).max)


def _scalar(value, name: str) -> float:
    """``value`` as the float the kernel gets, refused unless it is a finite real number in float32's range.
    Arrays are refused even with one element: reading a device value would synchronize the host."""
    if not isinstance(value, numbers.Real):
        hint = f" (float({name}) reads a one-element array)" if hasattr(value, "shape") else ""
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}; pass a Python or NumPy "
                        f"scalar{hint}")
    try:
        v = float(value)
    except OverflowError:  # an int past float64
        v = math.inf
    if not -_F32_MAX <= v <= _F32_MAX:
        raise ValueError(f"{name}={value!r} is not a finite float32 value; pass a finite number")
    return v


def _scalars(eps, offset) -> tuple:
    """``(eps, offset)`` checked (TypeError for a non-number, ValueError for a bad value) and as floats."""
    e, o = _scalar(eps, "eps"), _scalar(offset, "offset")
    if e < 0:
        raise ValueError(f"eps={eps!r} is negative; it must be at least 0 (1e-6 is usual)")
    return e, o


# Pairs of (out, residual, x, weight) that must not share memory: index, index, whether the same view is
# allowed, what to say. residual is written while x and weight are read; out is written.
_ALIASING = ((1, 2, False, "residual overlaps x; pass a separate array"),
             (3, 1, False, "weight overlaps residual, which this op writes; pass a separate array"),
             (0, 2, True, "out partially overlaps x; pass a separate array or the same one"),
             (0, 3, False, "out overlaps weight; pass a separate array"),
             (0, 1, False, "out overlaps residual; pass a separate array"))


def _aliasing(out, residual, x, weight) -> tuple:
    """The overlap checks a call needs, as ``(i, j, lo, hi, same_ok, message)``: arrays ``i`` and ``j`` of
    ``(out, residual, x, weight)`` overlap when ``lo < ptr_j - ptr_i < hi``, and ``same_ok`` allows the
    offset 0 (the same view). Extents relative to an array's pointer follow from its shape and strides, so
    a cached call compares one pointer offset per pair instead of two extents (None: an array not given,
    or not written; empty arrays overlap nothing)."""
    arrays = (out, residual, x, weight)
    spans: list[Any] = [None if a is None or a.size == 0 else extent(0, a.shape, a.strides, a.itemsize) for a in arrays]
    pairs = []
    for i, j, same_ok, message in _ALIASING:
        if spans[i] is None or spans[j] is None:
            continue
        (ilo, ihi), (jlo, jhi) = spans[i], spans[j]
        same_ok = same_ok and arrays[i].strides == arrays[j].strides
        pairs.append((i, j, ilo - jhi, ihi - jlo, same_ok, message))
    return tuple(pairs)


def _check_aliasing(pairs, arrays) -> None:
    """:func:`_aliasing`'s pairs against this call's pointers, ``arrays`` = ``(out, residual, x, weight)``;
    where two extents meet, whether the arrays share an element is decided exactly (views of one buffer
    interleaved, such as ``buf[:, 0]`` and ``buf[:, 1]``, share none)."""
    for i, j, lo, hi, same_ok, message in pairs:
        d = arrays[j].data.ptr - arrays[i].data.ptr
        if lo < d < hi and not (same_ok and d == 0) and _check.shares_elements(arrays[i], arrays[j]):
            raise ValueError(message)


@dataclass(frozen=True)
class _Call:
    """Everything about a call that depends only on the arguments' shapes, strides, dtypes, alignment and
    device: validated once, then reused by every call that matches (the host path of a hot loop)."""

    kernel: object  # cupy.cuda.Function on the arrays' device; None: an empty x, nothing to launch
    config: LaunchConfig | None
    device: int
    outer: tuple | None  # per launch, per rowed array then rstd: byte offset; None: one launch at offset 0
    layout: dict  # PARAMS' fields but eps and offset
    aliasing: tuple  # _aliasing's pairs
    packed: dict  # (eps, offset) as given -> (PARAMS as the kernel argument, the struct)
    prepared: dict  # (eps, offset) as given -> the one launch, prepared (outer is None only)

    def pack(self, eps, offset):
        """PARAMS for a new ``(eps, offset)``, stored under the pair as given. They are checked here, once
        per new pair rather than on every call, and a pair that fails is never stored, so no later call can
        find it."""
        e, o = _scalars(eps, offset)
        if len(self.packed) >= 64:
            self.packed.clear()
            self.prepared.clear()
        struct = PARAMS.struct(**self.layout, eps=e, offset=o)
        p = self.packed[eps, offset] = (struct_argument(struct), struct)
        return p

    def prepare(self, eps, offset, struct, addresses: int) -> Prepared:
        """The single launch for ``(eps, offset)`` (packed as ``struct``), prepared on the current device
        (the call's): its ``addresses`` array arguments (rowed arrays, weight, rstd) are written per call."""
        assert self.config is not None  # a call with something to launch
        run = self.prepared[eps, offset] = Prepared(self.kernel, self.config, (0,) * addresses + (struct,),
                                                    tuple(range(addresses)))
        return run


_calls = CallCache()
_MISSING = CallCache.MISSING


def _desc(a):
    d = a.data
    return a.shape, a.strides, a.dtype, d.ptr & 15, d.device_id


def _run(fused: bool, x, residual, weight, eps, offset, out, knobs: Knobs | None = None, rstd: bool = False):
    """The call in x's dtype; ``rstd``: also each row's rstd, returned as ``(out, rstd)``."""
    nd = _cupy().ndarray
    key = None
    call = _MISSING
    if (type(x) is nd and (weight is None or type(weight) is nd) and (out is None or type(out) is nd)
            and (residual is None or type(residual) is nd)):
        # The knobs as asked (None: the tuning cache's, looked up when the call is planned) and the tuning
        # cache's generation, so that a call found here needs no lookup.
        xd = x.data
        key = (fused, rstd, x.shape, x.strides, x.dtype, xd.ptr & 15, xd.device_id, knobs, _tuned.generation,
               None if weight is None else _desc(weight), None if out is None else _desc(out),
               None if residual is None else _desc(residual))
        call = _calls.get(key)
    if call is _MISSING:
        arrays = _validate(fused, x, weight, out, residual)
        x, weight, out, residual = (arrays.get(n) for n in ("x", "weight", "out", "residual"))
        chosen = knobs if knobs is not None else _tuned.lookup(TUNING[fused], x.data.device_id, x.dtype, x.shape)
        call = _plan_call(fused, x, residual, weight, out, chosen, rstd)
        if key is not None:
            _calls.put(key, call)
    if call.aliasing:  # what depends on the addresses themselves is checked on every call
        _check_aliasing(call.aliasing, (out, residual, x, weight))
    if call.kernel is None:
        _scalars(eps, offset)
        params = None
    else:
        try:
            params = call.packed.get((eps, offset))
        except TypeError:  # unhashable (an array, a list): pack says what to pass instead
            params = None
        if params is None:
            params = call.pack(eps, offset)
    switch = on_device(call.device)
    if switch is not _NO_SWITCH:  # the allocation and the launches go to x's device: the same call there
        with switch:
            return _run(fused, x, residual, weight, eps, offset, out, knobs, rstd)
    if out is None:
        out = nd(x.shape, x.dtype)
    r = nd(x.shape[:-1], np.float32) if rstd else None
    if params is None:
        if r is not None and r.size:  # rows of no element: 1 / sqrt(0 / 0 + eps), NaN, as an emulated empty row
            r.fill(math.nan)
        return (out, r) if rstd else out
    if call.outer is None:
        run = call.prepared.get((eps, offset))
        if run is None:
            run = call.prepare(eps, offset, params[1], 5 if fused else 4)  # the rowed arrays, weight, rstd
        stream = _cupy().cuda.get_current_stream().ptr
        w_ptr = 0 if weight is None else weight.data.ptr
        r_ptr = 0 if r is None else r.data.ptr
        if fused:
            run(stream, out.data.ptr, residual.data.ptr, x.data.ptr, w_ptr, r_ptr)
        else:
            run(stream, out.data.ptr, x.data.ptr, w_ptr, r_ptr)
    else:
        w = _NULL if weight is None else weight
        rowed = (out, residual, x) if fused else (out, x)
        for offs in call.outer:
            launch(call.kernel, call.config, tuple(a.data + o for a, o in zip(rowed, offs))
                   + (w, _NULL if r is None else r.data + offs[-1], params[0]))
    return (out, r) if rstd else out


def _plan_call(fused: bool, x, residual, weight, out, knobs: Knobs, rstd: bool = False) -> _Call:
    """Validate what the shapes and strides decide, plan the launch and fetch the kernel."""
    if fused:
        _check.check_writable(residual, "residual")
    if out is not None:
        _check.check_writable(out, "out")
    device = x.data.device_id
    aliasing = _aliasing(out, residual, x, weight)
    if x.size == 0:
        return _Call(None, None, device, None, {}, aliasing, {}, {})
    planned_out = out if out is not None else ArraySpec.fresh(x.shape, x.dtype)
    rowed = [planned_out, residual, x] if fused else [planned_out, x]
    hidden = x.shape[-1]
    # rstd (fresh, a float a row) joins the layout last whether asked or not: a C-contiguous array merges every
    # level the others merge, so it changes nothing of theirs
    layout = rows_layout(rowed + [ArraySpec.fresh(x.shape[:-1] + (1,), np.float32)])
    p = plan(hidden, layout.rows, vector_width(hidden, rowed, weight), x.itemsize, sm_count(device), knobs,
             fused=fused)
    with on_device(device):  # the compiled function on x's device (the call is cached per device)
        kernel = get_kernel(p.instantiation(x.dtype, weight.dtype if weight is not None else x.dtype, fused,
                                            rstd=rstd)).kernel
    (out_s0, out_s1), (x_s0, x_s1), (rs_s0, rs_s1) = layout.strides[0], layout.strides[-2], layout.strides[-1]
    res_s0, res_s1 = layout.strides[1] if fused else (0, 0)
    fields = dict(rows=layout.rows, inner=layout.inner, out_s0=out_s0, out_s1=out_s1, res_s0=res_s0, res_s1=res_s1,
                  x_s0=x_s0, x_s1=x_s1, hidden=hidden, rs_s0=rs_s0, rs_s1=rs_s1)
    outer = None
    if layout.outer != (tuple(0 for _ in layout.strides),):
        outer = tuple(tuple(o * x.itemsize for o in offs[:-1]) + (offs[-1] * 4,) for offs in layout.outer)
    return _Call(kernel, p.config, device, outer, fields, aliasing, {}, {})


# ---------------------------------------------------------------------------------------------------------
# Float8 outputs.


def _is_fp8(out_dtype) -> bool:
    """Whether ``out_dtype`` names float8 e4m3fn (the dtype, its type or the string)."""
    if isinstance(out_dtype, str):
        return out_dtype == "float8_e4m3fn"
    try:
        return np.dtype(out_dtype) == FLOAT8_E4M3FN
    except TypeError:
        return False


def _fp8_scale(scale):
    """``(per_token, value)`` for the ``scale`` argument: ``"per_token"``, or a static scale (a real number or
    a one-element array; a CuPy array is read to the host, which waits for the GPU) as the float32 the
    kernel divides by. Refused unless finite and at least 2^-126 after rounding to float32 (the least
    normal float32: a smaller scale's reciprocal overflows)."""
    if isinstance(scale, str):
        if scale != "per_token":
            raise ValueError(f"scale={scale!r}; pass 'per_token' or a positive float32 number")
        return True, 1.0
    if scale is None:
        raise TypeError("scale is None; a float8 output needs scale='per_token' or a positive number")
    if not isinstance(scale, numbers.Real):
        if not hasattr(scale, "shape") or not hasattr(scale, "dtype"):
            raise TypeError(f"scale must be a real number, a one-element array or 'per_token', got "
                            f"{type(scale).__name__}")
        if math.prod(scale.shape) != 1:
            raise ValueError(f"scale has shape {tuple(scale.shape)}; a static scale has one element")
        if np.dtype(scale.dtype).kind not in "fiu":
            raise TypeError(f"scale has dtype {scale.dtype}; it must be a real number type (float32)")
        if not isinstance(scale, np.ndarray) and _cupy().cuda.get_current_stream().is_capturing():
            raise RuntimeError("a scale in a GPU array is read to the host, which waits for the GPU and a CUDA "
                               "graph capture cannot; pass the scale as a number (float(scale) before capturing)")
        scale = (scale.get() if hasattr(scale, "get") else np.asarray(scale)).reshape(())[()]
    try:
        with np.errstate(over="ignore"):  # past float32: inf, refused below
            v = float(np.float32(scale))
    except OverflowError:  # an int past float64
        v = math.inf
    if not (MIN_SCALE <= v < math.inf):
        raise ValueError(f"scale={scale!r} is not a finite float32 of at least 2^-126; pass a positive number")
    return False, v


def _check_fp8_out(out, x):
    out = as_array(out, "out", writable=True)
    if out.dtype != np.uint8:
        raise TypeError(f"out has dtype {out.dtype}; float8 outputs are stored as uint8 (CuPy has no float8 "
                        "dtype), pass a uint8 array shaped like x")
    if out.shape != x.shape:
        raise ValueError(f"out has shape {out.shape}, x has {x.shape}; they must match")
    _check.check_same_device({"x": x, "out": out})
    _check.check_unit_last_stride(out, "out")
    _check.check_writable(out, "out")
    return out


@dataclass(frozen=True)
class _Fp8Call:
    """A validated, planned float8 call: what depends only on the arguments' shapes, strides, dtypes, alignment,
    device, the scale, eps and offset (the key of ``_fp8_calls``), so that a repeated call only allocates its
    outputs, checks overlap and launches."""

    kernel: object  # None: an empty x, nothing to launch
    config: LaunchConfig | None
    device: int
    shape: tuple
    per_token: bool
    offsets: tuple  # per launch: (out, scales, inputs...) offsets in bytes
    aliasing: tuple  # _aliasing's pairs, none allowed to be the same view
    params: object  # FP8_PARAMS packed


_fp8_calls = CallCache()


def _plan_fp8_call(fused: bool, x, residual, weight, out, scale, eps, offset, knobs: Knobs | None):
    """Every check of a float8 call (the scale, the arrays, eps and offset), then its plan and kernel: the
    :class:`_Fp8Call` and ``(x, residual, weight, out)`` as CuPy arrays."""
    per_token, value = _fp8_scale(scale)
    arrays = _validate(fused, x, weight, None, residual)
    x, weight, residual = (arrays.get(n) for n in ("x", "weight", "residual"))
    if out is not None:
        out = _check_fp8_out(out, x)
    if fused:
        _check.check_writable(residual, "residual")
    aliasing = tuple((i, j, lo, hi, False, message.replace(" or the same one", ""))
                     for i, j, lo, hi, _, message in _aliasing(out, residual, x, weight))
    e, o = _scalars(eps, offset)
    device = x.data.device_id
    arrays = (x, residual, weight, out)
    if x.size == 0:
        return _Fp8Call(None, None, device, x.shape, per_token, (), aliasing, None), arrays
    if knobs is None:
        knobs = _tuned.lookup(FP8_TUNING[fused], device, x.dtype, x.shape)
    hidden, lead = x.shape[-1], x.shape[:-1]
    planned_out = out if out is not None else ArraySpec.fresh(x.shape, np.uint8)
    vec = vector_width(hidden, [residual, x] if fused else [x], weight)
    if planned_out.data.ptr % vec or any(st % vec for st in planned_out.strides[:-1]):
        vec = 1
    rowed = [planned_out, residual, x] if fused else [planned_out, x]
    layout = rows_layout(rowed + [ArraySpec.fresh(lead + (1,), np.float32)])  # the scales: fresh, a row each
    p = plan(hidden, layout.rows, vec, x.itemsize, sm_count(device), knobs, fused=fused)
    with on_device(device):
        kernel = get_kernel(p.instantiation(x.dtype, weight.dtype if weight is not None else x.dtype, fused,
                                            fp8=True)).kernel
    (out_s0, out_s1), (x_s0, x_s1), (sc_s0, sc_s1) = layout.strides[0], layout.strides[-2], layout.strides[-1]
    res_s0, res_s1 = layout.strides[1] if fused else (0, 0)
    params = struct_argument(FP8_PARAMS.struct(
        rows=layout.rows, inner=layout.inner, out_s0=out_s0, out_s1=out_s1, res_s0=res_s0, res_s1=res_s1,
        x_s0=x_s0, x_s1=x_s1, hidden=hidden, eps=e, offset=o, rs_s0=0, rs_s1=0, sc_s0=sc_s0, sc_s1=sc_s1,
        scale=value))
    # layout.outer is in rowed's order (out, inputs..., scales), in elements; the kernel takes (out, scales,
    # inputs...)
    offsets = tuple((o_out, o_sc * 4, *(k * x.itemsize for k in o_in)) for o_out, *o_in, o_sc in layout.outer)
    return _Fp8Call(kernel, p.config, device, x.shape, per_token, offsets, aliasing, params), arrays


def _run_fp8(fused: bool, x, residual, weight, eps, offset, out, out_dtype, scale, knobs: Knobs | None = None):
    """The float8 call: every check first (out_dtype, scale, arrays, overlap, eps and offset; once per kind of
    call, then from ``_fp8_calls``), then the launch(es)."""
    if not _is_fp8(out_dtype):
        try:
            own = out_dtype is None or np.dtype(out_dtype) == np.dtype(x.dtype)
        except (TypeError, AttributeError):
            own = False
        if not own:
            raise TypeError(f"out_dtype={out_dtype!r}; it must be None, x's dtype or ml_dtypes.float8_e4m3fn")
        if scale is not None:
            raise TypeError("scale is only for out_dtype=ml_dtypes.float8_e4m3fn; leave it None")
        return _run(fused, x, residual, weight, eps, offset, out, knobs)
    nd = _cupy().ndarray
    key = None
    call = _MISSING
    if (type(x) is nd and all(a is None or type(a) is nd for a in (weight, out, residual))
            and type(scale) in (str, float, int) and type(eps) in (float, int) and type(offset) in (float, int)):
        key = (fused, scale, eps, offset, _desc(x), knobs, _tuned.generation,
               None if weight is None else _desc(weight), None if out is None else _desc(out),
               None if residual is None else _desc(residual))
        call = _fp8_calls.get(key)
    if call is _MISSING:
        call, (x, residual, weight, out) = _plan_fp8_call(fused, x, residual, weight, out, scale, eps, offset, knobs)
        if key is not None:
            _fp8_calls.put(key, call)
    _check_aliasing(call.aliasing, (out, residual, x, weight))
    cp = _cupy()
    with on_device(call.device):
        if out is None:
            out = cp.empty(call.shape, np.uint8)
        scales = cp.empty(call.shape[:-1], np.float32) if call.per_token else None
        if call.kernel is None:
            if scales is not None and scales.size:
                scales.fill(MIN_SCALE)  # rows with no element: the all-zero row's scale
        else:
            w = _NULL if weight is None else weight
            inputs = (residual, x) if fused else (x,)
            for o_out, o_sc, *o_in in call.offsets:
                ptrs = (out.data + o_out, scales.data + o_sc if scales is not None else _NULL,
                        *(a.data + k for a, k in zip(inputs, o_in)))
                launch(call.kernel, call.config, ptrs + (w, call.params))
    return (out, scales) if call.per_token else out


def _rstd_flag(return_rstd, out_dtype, scale) -> bool:
    """``return_rstd`` checked: a bool, and only for outputs in x's dtype (a float8 call's rstd is not kept)."""
    rstd = _check.check_flag(return_rstd, "return_rstd")
    if rstd and (out_dtype is not None or scale is not None):
        raise TypeError("return_rstd=True is for outputs in x's dtype; leave out_dtype and scale None with it")
    return rstd


def rms_norm(x: DeviceArray, weight: DeviceArray | None = None, eps: float = 1e-6, *, offset: float = 0.0,
             out: DeviceArray | None = None, out_dtype: DTypeLike | None = None,
             scale: str | float | DeviceArray | None = None,
             return_rstd: bool = False) -> DeviceArray | tuple[DeviceArray, DeviceArray]:
    """Root-mean-square normalization over the last axis.

    ``out = x / sqrt(mean(x**2, axis=-1) + eps) * (offset + weight)``, computed in float32 and rounded
    once to x's dtype, or with ``out_dtype=ml_dtypes.float8_e4m3fn`` to float8 e4m3fn bytes
    ``e4m3(y * (1 / s))`` (``y = (x * (offset + weight)) * inv`` in float32, ``s`` the scale; below).
    ``weight=None`` means 1; ``offset=1.0`` is the Gemma form. A row's bits depend only on its values, the
    hidden size, the dtypes, eps and offset: not on the other rows, the layout, the tuning, the stream or
    the GPU (:func:`cukern.reference.rms_norm_emulated` computes them on the host).

    Parameters
    ----------
    x : cupy.ndarray, float32, float16 or bfloat16, shape ``[..., hidden]``; leading dimensions may be
        strided, the last must have unit stride.
    weight : cupy.ndarray of shape ``[hidden]``, x's dtype or float32, optional; must not overlap out.
    eps : float
        Finite and at least 0. A real number (Python or NumPy scalar); an array, even of one element, is
        refused, since reading a device value would synchronize the host.
    offset : float
        Finite; a real number, as eps.
    out : cupy.ndarray like x, optional; may be x itself (in place), must not overlap it otherwise. For
        float8 outputs a ``uint8`` array of x's shape, overlapping no input.
    out_dtype : None (x's dtype), x's dtype, or ``ml_dtypes.float8_e4m3fn`` (also the string
        ``"float8_e4m3fn"``): float8 outputs come back as ``uint8`` arrays holding the e4m3fn bytes
        (CuPy 14 has no float8 array dtype; ``out.get().view(ml_dtypes.float8_e4m3fn)`` on the host).
        Rounding is to nearest even, values beyond +-448 (infinities too) saturate to +-448, every NaN
        becomes 0x7f (whatever its sign); the bytes are the same on every GPU.
    scale : float8 outputs only. A static per-tensor scale: a real number or a one-element array (a CuPy
        array is read to the host, which waits for the GPU: RuntimeError under CUDA-graph capture, before
        anything is recorded), used as float32, finite and at least 2^-126,
        else ValueError before any launch. Or ``"per_token"``: each row gets ``s = max(amax / 448, 2^-126)``,
        amax the row's largest ``|y|`` (so an all-zero row gets ``s = 2^-126`` and zeros; a row holding a
        NaN or infinity gets a NaN scale and NaN bytes), each step correctly rounded in float32.
    return_rstd : bool
        True: also return each row's ``rstd = 1 / sqrt(mean(x**2) + eps)``, the float32 the kernel scaled
        by, for :func:`cukern.rms_norm_backward` to reuse (outputs in x's dtype only; TypeError otherwise).

    Returns
    -------
    out, or ``(out, scales)`` for ``scale="per_token"``: scales float32 of shape ``x.shape[:-1]``. A row's
    bytes and scale depend only on its values, hidden, the dtypes, eps, offset and scale
    (:func:`cukern.reference.rms_norm_fp8_emulated`). ``(out, rstd)`` for ``return_rstd=True``: rstd float32
    of shape ``x.shape[:-1]``, a fresh C-contiguous array (NaN for rows of no element).

    Raises
    ------
    TypeError
        For a non-array, a dtype outside those above, or an eps, offset or scale that is not a real number.
    ValueError
        For mismatched shapes, a bad stride, overlapping arrays, or an eps or offset out of range (NaN,
        infinite, beyond float32, a negative eps). Every check runs before anything is launched.
    RuntimeError
        For a static scale in a GPU array while the current stream captures a CUDA graph.

    Examples
    --------
    >>> import cupy as cp
    >>> import cukern
    >>> from cukern.reference import rms_norm_emulated
    >>> x = cp.array([[3.0, 4.0], [1.0, -1.0]], dtype=cp.float32)
    >>> y = cukern.rms_norm(x, eps=0.0)
    >>> print(y)
    [[ 0.84852815  1.1313709 ]
     [ 1.         -1.        ]]
    >>> bool((cp.asnumpy(y) == rms_norm_emulated(cp.asnumpy(x), eps=0.0)).all())
    True
    >>> q, scales = cukern.rms_norm(x, eps=0.0, out_dtype="float8_e4m3fn", scale="per_token")
    >>> print(q.dtype, q, scales.shape)
    uint8 [[122 126]
     [126 254]] (2,)
    >>> y, rstd = cukern.rms_norm(x, eps=0.0, return_rstd=True)
    >>> print(rstd.dtype, rstd)
    float32 [0.28284273 1.        ]
    """
    if _rstd_flag(return_rstd, out_dtype, scale):
        return _run(False, x, None, weight, eps, offset, out, rstd=True)
    if out_dtype is None and scale is None:
        return _run(False, x, None, weight, eps, offset, out)
    return _run_fp8(False, x, None, weight, eps, offset, out, out_dtype, scale)


def fused_add_rms_norm(x: DeviceArray, residual: DeviceArray, weight: DeviceArray | None = None, eps: float = 1e-6,
                       *, offset: float = 0.0, out: DeviceArray | None = None, out_dtype: DTypeLike | None = None,
                       scale: str | float | DeviceArray | None = None, return_rstd: bool = False
                       ) -> DeviceArray | tuple[DeviceArray, DeviceArray]:
    """``residual += x`` in place (rounded to residual's dtype), then ``out = rms_norm(residual)``.

    ``out=x`` is allowed (the in-place form LLM servers use). Same dtypes, layouts, eps and offset as
    :func:`rms_norm`; residual (an array, never None) must not overlap x, out or weight. ``out_dtype`` and
    ``scale`` as for :func:`rms_norm` (float8 outputs: out a separate uint8 array; returns ``(out, scales)``
    for per-token scales). ``return_rstd=True`` returns ``(out, rstd)``, rstd the float32 ``1 / rms`` of each
    row of the updated residual (what :func:`cukern.rms_norm_backward` takes with ``x=residual``).

    Examples
    --------
    >>> import cupy as cp
    >>> import cukern
    >>> x = cp.array([[3.0, 4.0], [1.0, -1.0]], dtype=cp.float32)
    >>> residual = cp.array([[1.0, 1.0], [0.0, 2.0]], dtype=cp.float32)
    >>> out, rstd = cukern.fused_add_rms_norm(x, residual, eps=0.0, return_rstd=True)
    >>> print(residual)
    [[4. 5.]
     [1. 1.]]
    >>> print(out)
    [[0.8834522 1.1043153]
     [1.        1.       ]]
    >>> print(rstd)
    [0.22086304 1.        ]
    """
    if _rstd_flag(return_rstd, out_dtype, scale):
        return _run(True, x, residual, weight, eps, offset, out, rstd=True)
    if out_dtype is None and scale is None:
        return _run(True, x, residual, weight, eps, offset, out)
    return _run_fp8(True, x, residual, weight, eps, offset, out, out_dtype, scale)
