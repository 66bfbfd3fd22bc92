"""Arg-reductions: argmax, argmin, nanargmax, nanargmin (kernels in ``cuda_src/argreduce.cu``).

References (:mod:`cukern.reference`): ``np.argmax``, ``np.argmin``, ``np.nanargmax``, ``np.nanargmin`` over
the same axis. NumPy's semantics: ``axis`` None (the flat C-order index) or one int (negative counts from
the end), ``keepdims``, ``out`` (int64); ties give the first occurrence; for argmax and argmin a NaN wins
(the first NaN's index); the nan forms skip NaNs and raise ValueError for an all-NaN slice; an empty
reduction raises ValueError. Complex inputs are ordered as NumPy orders them: lexicographically, the real
parts first, then the imaginary parts, and a NaN in either part makes the element a NaN.

Complex maxima and minima: :func:`cukern.amax`, ``amin``, ``nanmax`` and ``nanmin`` of complex x gather the
element at the index these kernels find (:func:`extreme_index`, the internal entry point they use; the
module notes of :mod:`cukern.reduce` say how).

Memory traffic, the count every GB/s figure uses: every element read once, the int64 result written once
(:func:`bytes_moved`).

Reproducibility: each element becomes an unsigned key whose order is the op's order (``element_key`` in
the kernel, :func:`cukern.reference.arg_keys` on the host), and the result is the pair (key, index) with
the largest key and the least index among equal keys. That is a total order, so its winner does not
depend on which pairs meet first: any grid, block, span or knob gives the same index
(:func:`cukern.reference.argmax_emulated` and its siblings compute it on the host from the same keys).

All-NaN slices: the kernel raises a flag in pinned host memory; ``nanargmax`` and ``nanargmin`` of a float
array wait for the stream and read it, so those two calls synchronize the host with the GPU (no other call
here does). While a CUDA graph is being captured they are refused (the host cannot wait); use ``argmax``
on data known to hold a number in each slice.

Layouts: the reduced axis may have any stride; the other axes are merged into at most two levels of rows
(``row // inner * s0 + row % inner * s1``). Layouts that do not merge that far (and ``axis=None`` over an
array that is not one strided run, such as a transposed matrix) are first copied to a C-contiguous
temporary, which costs one more read and write of x.
"""

from __future__ import annotations

import math
import operator
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import cukern._check as _check
import cukern._tuned as _tuned

from ._compile import Instantiation, get_kernel
from ._dtypes import BFLOAT16, dtype_name, parse_dtype
from ._launch import (
    OUT_STRIDED,
    X_COPIED,
    CallCache,
    LaunchConfig,
    Params,
    launch,
    on_device,
    refuse_temporary_in_capture,
    sm_count,
    stream_key,
    struct_argument,
)
from ._launch import cupy as _cupy
from ._layout import collapse
from ._typing import DeviceArray, DTypeLike

SOURCE = "argreduce"
BLOCK = 256  # ARG_BLOCK in cuda_src/argreduce.cu
UNROLL = 4  # ARG_UNROLL: a block's step is BLOCK x UNROLL vectors (or elements)
MAX_SPAN = 1 << 30  # indices a span holds at most: the kernel counts within a span in 32 bits
MAX_WAYS = 1 << 20  # blocks a span at most: a block's step through it stays a 32-bit count
MAX_SPLIT_ROWS = 4096  # rows searched by several blocks at most (one counter each in the workspace)
SPAN_ALIGN = 64  # spans start on multiples of this many indices, so a 16-byte vector never straddles two
COLS_MIN_ROWS = 64  # fewer adjacent rows than this leave the column kernel's warps mostly idle
COLS_MAX_LENGTH = 32  # rows this short take a thread each: a block a row would leave most threads idle

# Element kinds of cuda_src/argreduce.cu: how a dtype's bits are ordered.
KIND_FLOAT, KIND_HALF, KIND_BFLOAT, KIND_SIGNED, KIND_UNSIGNED, KIND_BOOL, KIND_COMPLEX = range(7)
KINDS = {
    np.dtype(np.float64): KIND_FLOAT, np.dtype(np.float32): KIND_FLOAT, np.dtype(np.float16): KIND_HALF,
    BFLOAT16: KIND_BFLOAT,
    **{np.dtype(t): KIND_SIGNED for t in (np.int8, np.int16, np.int32, np.int64)},
    **{np.dtype(t): KIND_UNSIGNED for t in (np.uint8, np.uint16, np.uint32, np.uint64)},
    np.dtype(np.bool_): KIND_BOOL,
    np.dtype(np.complex64): KIND_COMPLEX, np.dtype(np.complex128): KIND_COMPLEX,
}
DTYPES = tuple(KINDS)
FLOATS = (np.dtype(np.float64), np.dtype(np.float32), np.dtype(np.float16), BFLOAT16)
COMPLEX = (np.dtype(np.complex64), np.dtype(np.complex128))
INEXACT = FLOATS + COMPLEX  # the dtypes that hold NaNs

# op -> (argmin: the key order reversed, a NaN loses instead of winning)
OPS = {"argmax": (False, False), "argmin": (True, False), "nanargmax": (False, True), "nanargmin": (True, True)}
# Every search the kernels run: the public ops, and "nanmax" and "nanmin", the index cukern.nanmax / nanmin
# of complex x gather: the nan forms' search without the all-NaN error (an all-NaN slice gives its first
# index, whose NaN is what NumPy's nanmax returns there).
SEARCHES = {**OPS, "nanmax": (False, True), "nanmin": (True, True)}
# The bytes of a (key, index) pair in the spans' partials (Best<K> in the kernel): a key of 16 bytes for
# complex128, else of at most 8 (8-byte aligned either way).
PAIR_BYTES = {np.dtype(np.complex128): 24}

# The kernels' scalars, one struct (``ArgParams`` in cuda_src/argreduce.cu).
PARAMS = Params((("inner", "i64"), ("s0", "i64"), ("s1", "i64"), ("n", "i64"), ("stride", "i64"),
                 ("span", "i64"), ("spans", "i64"), ("ways", "i64"), ("rows", "i64"), ("flip", "u64"),
                 ("nan_key", "u64"), ("check_nan", "i32")))


@dataclass(frozen=True)
class Knobs:
    """The tuning space; no knob can change a result (the search is a total order). ``blocks_per_sm``: the
    span kernel's target grid, in blocks per SM, when rows are too few to fill it one block a row;
    ``min_span``: the least number of indices a block searches when a row takes several. The default grid is
    two full waves: the span kernel's registers leave room for 6 blocks of 256 an SM on sm_90, and the H200
    sweep (docs/design/argreduce.md) put 12 blocks an SM ahead of 6 and 4 at 2^28 float32 elements."""

    blocks_per_sm: int = 12
    min_span: int = 8192

    def __post_init__(self):
        _check.check_least_int(self, "blocks_per_sm", 1)
        _check.check_least_int(self, "min_span", SPAN_ALIGN)


DEFAULT_KNOBS = Knobs()
SPACE = {"blocks_per_sm": [2, 4, 6, 12], "min_span": [4096, 8192, 32768]}


def make_knobs(d: dict) -> Knobs:
    return Knobs(**d)


# Keyed by element count, for reductions over everything (the shape the benchmark's case has). Every op and
# dtype shares the rule: they are one kernel.
TUNING = {"argmax": _tuned.Rule("argmax", DEFAULT_KNOBS, make_knobs,
                                bucket=lambda s: f"n<={_tuned.rows_bucket(math.prod(s))}")}


# ---------------------------------------------------------------------------------------------------------
# Planning (pure).


def normalize_axis(axis, ndim: int):
    """``axis`` as None or a non-negative int below ``ndim``; TypeError for anything but None or an int
    (a tuple included: NumPy's arg-reductions take one axis), AxisError when out of range."""
    if axis is None:
        return None
    if isinstance(axis, (bool, np.bool_)) or not isinstance(axis, (int, np.integer)):
        raise TypeError(f"axis must be None or an int, got {axis!r}")
    a = operator.index(axis)
    if not -max(ndim, 1) <= a < max(ndim, 1):
        raise np.exceptions.AxisError(f"axis {a} is out of bounds for an array of dimension {ndim}")
    return a % max(ndim, 1)


def result_shape(shape, axis, keepdims: bool) -> tuple:
    if axis is None:
        return tuple(1 for _ in shape) if keepdims else ()
    if keepdims:
        return tuple(1 if i == axis else n for i, n in enumerate(shape))
    return tuple(n for i, n in enumerate(shape) if i != axis)


@dataclass(frozen=True)
class Plan:
    """One call's launch. ``kernel``: "span" or "cols" (None: nothing to launch, no rows); ``copy``: x is
    first copied to C-contiguous and planned as that; ``rows`` results, each over ``n`` indices at
    ``stride`` elements, row r at ``r // inner * s0 + r % inner * s1``; ``spans`` spans of ``span`` indices a
    row, each searched by ``ways`` blocks interleaved (span kernel)."""

    kernel: str | None
    copy: bool
    rows: int
    n: int
    inner: int = 1
    s0: int = 0
    s1: int = 0
    stride: int = 1
    span: int = 0
    spans: int = 1
    ways: int = 1
    grid: int = 1
    block: int = BLOCK

    @property
    def config(self) -> LaunchConfig:
        return LaunchConfig(grid=(self.grid,), block=(self.block,))

    def instantiation(self, dtype) -> Instantiation:
        dt = np.dtype(dtype)
        return Instantiation(SOURCE, f"argreduce_{self.kernel}", (KINDS[dt], dt.itemsize))


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _layout(shape, strides, axis):
    """(rows, n, levels of the rows as (size, stride) pairs, reduced stride), or None when the rows need
    more than two levels or ``axis=None`` is not one strided run."""
    if axis is None:
        sizes, (sts,) = collapse(tuple(shape), [tuple(strides)])
        if len(sizes) > 1:
            return None
        return 1, math.prod(shape), (), (sts[0] if sts else 1)
    kept = [i for i in range(len(shape)) if i != axis]
    sizes, (sts,) = collapse(tuple(shape[i] for i in kept), [tuple(strides[i] for i in kept)])
    if len(sizes) > 2:
        return None
    return math.prod(shape[i] for i in kept), shape[axis], tuple(zip(sizes, sts)), strides[axis]


def plan(shape, axis=None, *, strides=None, sm_count: int = 132, knobs: Knobs = DEFAULT_KNOBS) -> Plan:
    """The launch for reducing ``axis`` (None or a normalized int) of an array of ``shape``, ``strides`` in
    elements (default C-contiguous): pure, from these numbers alone (the dtype picks only the instantiation,
    :meth:`Plan.instantiation`). The caller has checked that the reduction is not empty."""
    shape = tuple(shape)
    contiguous = tuple(int(math.prod(shape[i + 1:])) for i in range(len(shape)))
    strides = contiguous if strides is None else tuple(strides)
    laid = _layout(shape, strides, axis)
    copy = laid is None
    if copy:
        laid = _layout(shape, contiguous, axis)
    rows, n, levels, stride = laid
    if rows == 0:
        return Plan(None, copy, 0, n)
    if rows >= 2**31:
        raise ValueError(f"the result has {rows} elements; at most 2**31 - 1 are supported")
    inner, s0, s1 = 1, 0, 0
    if len(levels) == 1:
        (inner, s1), = levels
    elif len(levels) == 2:
        (_, s0), (inner, s1) = levels
    if n == 1:
        stride = 1
    if rows >= COLS_MIN_ROWS and ((abs(s1) == 1 and stride != 1) or n <= COLS_MAX_LENGTH):
        return Plan("cols", copy, rows, n, inner, s0, s1, stride, grid=_cdiv(rows, BLOCK))
    target = sm_count * knobs.blocks_per_sm
    blocks = 1  # a row's
    if rows <= MAX_SPLIT_ROWS:
        blocks = max(1, min(_cdiv(target, rows), _cdiv(n, knobs.min_span)))
    spans = _cdiv(n, MAX_SPAN)
    span = _cdiv(_cdiv(n, spans), SPAN_ALIGN) * SPAN_ALIGN
    spans = _cdiv(n, span)
    ways = min(_cdiv(blocks, spans), MAX_WAYS)
    if rows * spans * ways >= 2**31:
        raise ValueError(f"{rows} rows of {n} elements need more than 2**31 - 1 blocks")
    if spans > 1 and rows > MAX_SPLIT_ROWS:
        raise ValueError(f"{rows} rows of {n} elements: rows past 2**30 elements are split, at most "
                         f"{MAX_SPLIT_ROWS} rows of them")
    return Plan("span", copy, rows, n, inner, s0, s1, stride, span, spans, ways, grid=rows * spans * ways)


def instantiations() -> list:
    """Both kernels for every dtype: what :func:`plan` can choose, generated from its kernel names and
    :data:`KINDS` (the knobs change no code)."""
    out = []
    for dt in DTYPES:
        for kernel in ("span", "cols"):
            out.append(Plan(kernel, False, 1, 1).instantiation(dt))
    return out


def bytes_moved(shape, dtype, axis=None, *, keepdims: bool = False) -> int:
    """Bytes the op must move: x read once, the int64 result written once."""
    n = math.prod(shape)
    a = normalize_axis(axis, len(shape))
    return n * np.dtype(dtype).itemsize + 8 * math.prod(result_shape(shape, a, keepdims))


# ---------------------------------------------------------------------------------------------------------
# Workspaces: per (device, stream), a counter per split row (zero between launches: the last block of a row
# resets it) and the blocks' partials (PAIR_BYTES each: 16, or 24 for complex128; grown as needed). The
# all-NaN flag is per thread, in pinned mapped host memory: the host reads it after waiting for the stream
# (the call that finds it set clears it), so two threads launching on one stream must not share it.


@dataclass
class Workspace:
    counters: DeviceArray
    partials: DeviceArray
    outgrown: list = field(default_factory=list)  # earlier partials, kept for graphs that may still use them


_workspaces: dict = {}
_work_lock = threading.Lock()
_flags = threading.local()
_NO_FLAG = np.uint64(0)  # the flag pointer of a call that never checks for all-NaN slices


def _flag():
    """This thread's all-NaN flag: ``(int32[1] host view, device address)`` of pinned mapped memory (unified
    addressing: the host address is the device address on every GPU), made on first use."""
    pair = getattr(_flags, "pair", None)
    if pair is None:
        cuda = _cupy().cuda
        flags = cuda.runtime.hostAllocPortable | cuda.runtime.hostAllocMapped
        mem = cuda.PinnedMemoryPointer(cuda.PinnedMemory(16, flags), 0)
        host = np.frombuffer(mem, np.int32, 1)
        host[0] = 0
        pair = _flags.pair = (host, np.uint64(mem.ptr))
    return pair


def workspace(words: int) -> Workspace:
    """The current stream's workspace with room for ``words`` 8-byte words of partials (two a pair, three
    for complex128's); making or growing it allocates, which a CUDA-graph capture cannot: then a
    RuntimeError, before anything is recorded."""
    cp = _cupy()
    stream = cp.cuda.get_current_stream()
    key = (cp.cuda.runtime.getDevice(), *stream_key(stream))
    ws = _workspaces.get(key)
    if ws is not None and ws.partials.size >= words:
        return ws
    if stream.is_capturing():
        raise RuntimeError("this arg-reduction needs a workspace that a CUDA-graph capture cannot allocate; make "
                           "the same call once on this stream before capturing")
    with _work_lock:
        ws = _workspaces.get(key)
        if ws is None:
            ws = _workspaces[key] = Workspace(cp.zeros(MAX_SPLIT_ROWS, np.uint32), cp.empty(0, np.uint64))
        if ws.partials.size < words:
            ws.outgrown.append(ws.partials)
            ws.partials = cp.empty(max(words, 2 * ws.partials.size), np.uint64)
    return ws


# ---------------------------------------------------------------------------------------------------------
# Validation, the call cache and the public ops.


@dataclass(frozen=True)
class _Call:
    """A prepared call: valid for inputs of the shape, strides, dtype, alignment, device and stream it was
    made for (its cache key)."""

    kernel: object  # None: nothing to launch (no rows)
    span: bool
    config: LaunchConfig | None
    params: object
    copy: bool
    shape: tuple  # the result's
    check_nan: bool
    workspace: Workspace | None


_calls = CallCache()
_MISSING = CallCache.MISSING


def _empty_message(op: str) -> str:
    return f"attempt to get {op} of an empty sequence"


def _prepare(op: str, x, axis, keepdims, knobs: Knobs | None, sm: int | None) -> _Call:
    _check.check_dtype(x, "x", DTYPES)
    a = normalize_axis(axis, x.ndim)
    if x.ndim == 0:  # NumPy takes axis 0 or -1 of a 0-d array as the whole of it
        a = None
    n = x.size if a is None else x.shape[a]
    if n == 0:
        raise ValueError(_empty_message(op))
    device = x.data.device_id
    if knobs is None:
        knobs = _tuned.lookup(TUNING["argmax"], device, x.dtype, (x.size,)) if a is None else DEFAULT_KNOBS
    pl = plan(x.shape, a, strides=tuple(s // x.itemsize for s in x.strides),
              sm_count=sm if sm is not None else sm_count(device), knobs=knobs)
    shape = result_shape(x.shape, a, keepdims)
    flip, nan_loses = SEARCHES[op]
    check_nan = nan_loses and x.dtype in INEXACT and op.startswith("nanarg")
    if pl.kernel is None:
        return _Call(None, False, None, None, pl.copy, shape, False, None)
    # All ones in the key's words: 32 bits for the narrow keys, 64 for the rest (the kernel repeats the
    # value in both words of a complex128 key).
    ones = (1 << (32 if x.itemsize < 8 else 64)) - 1
    params = struct_argument(PARAMS.struct(
        inner=pl.inner, s0=pl.s0, s1=pl.s1, n=pl.n, stride=pl.stride, span=pl.span, spans=pl.spans,
        ways=pl.ways, rows=pl.rows, flip=ones if flip else 0, nan_key=0 if nan_loses else ones,
        check_nan=int(check_nan)))
    with on_device(device):
        ws = workspace((pl.grid if pl.spans * pl.ways > 1 else 0) * PAIR_BYTES.get(x.dtype, 16) // 8)
        kernel = get_kernel(pl.instantiation(x.dtype))
    return _Call(kernel, pl.kernel == "span", pl.config, params, pl.copy, shape, check_nan, ws)


# Why a call into an out of another integer type cannot be captured (its indices go through a temporary).
OUT_CAST = "out is not int64 (the indices go through an int64 temporary); pass an int64 out"
DTYPE_CAST = "dtype= is not int64 (the indices go through an int64 temporary); leave dtype=None"
# The index dtypes ``dtype=`` takes: CuPy's (its arg-reductions write signed integers only).
INDEX_DTYPES = tuple(np.dtype(t) for t in (np.int8, np.int16, np.int32, np.int64))


def index_dtype(dtype, shape, axis) -> np.dtype | None:
    """``dtype=`` of an arg-reduction over ``axis`` (None or a normalized int) of an array of ``shape``: None
    for None, else one of :data:`INDEX_DTYPES` that holds the largest index, ``n - 1`` (n the axis's length,
    the size for None); TypeError for another dtype, ValueError for one too narrow."""
    if dtype is None:
        return None
    t = parse_dtype(dtype)
    if t not in INDEX_DTYPES:
        raise TypeError(f"dtype={dtype_name(t)} is not an index dtype; use one of "
                        + ", ".join(dtype_name(d) for d in INDEX_DTYPES))
    n = math.prod(shape) if axis is None or not shape else shape[axis]
    if n - 1 > np.iinfo(t).max:
        wide = next(d for d in INDEX_DTYPES if np.iinfo(d).max >= n - 1)
        where = "x" if axis is None else f"axis {axis}"
        raise ValueError(f"dtype={dtype_name(t)} holds indices up to {np.iinfo(t).max}, and {where} has {n} "
                         f"elements; use {dtype_name(wide)} or wider")
    return t


def _validate_out(out, shape, x):
    """``out``: int64, or another type NumPy casts the indices into, one int64 can hold every value of
    (``numpy.can_cast(out.dtype, int64)``: bool, the narrower integer types), the int64 result then cast
    into it as NumPy's (unsafe: wrapping)."""
    out = _check.check_out(out, shape, None, x)
    if out.dtype != np.int64 and not np.can_cast(out.dtype, np.int64):
        raise TypeError(f"out has dtype {dtype_name(out.dtype)}; the result has dtype int64 (an out of a "
                        "narrower integer type or bool takes it cast, as NumPy's)")
    _check.check_no_overlap(out, "out", x, "x", identical_ok=False)
    return out


def _check_all_nan(flag: np.ndarray) -> None:
    _cupy().cuda.get_current_stream().synchronize()
    if flag[0]:
        flag[0] = 0
        raise ValueError("All-NaN slice encountered")


def _run(op: str, x, axis, keepdims, out, knobs: Knobs | None = None, sm: int | None = None, dtype=None):
    cp = _cupy()
    nd = cp.ndarray
    key = None
    call = _MISSING
    # Only for x on the current device: the key's stream (and its wait, stream_key) is the current device's, and
    # a cached call holds the workspace of the stream it launches on.
    if (type(x) is nd and sm is None and (axis is None or type(axis) is int) and type(keepdims) is bool
            and x.data.device_id == cp.cuda.runtime.getDevice()):
        mem = x.data
        key = (op, x.shape, x.strides, x.dtype, mem.ptr % 16, axis, keepdims, mem.device_id, knobs,
               _tuned.generation, *stream_key(cp.cuda.get_current_stream()))
        call = _calls.get(key)
    if call is _MISSING:
        x = _check.as_array(x, "x")
        call = _prepare(op, x, axis, _check.check_keepdims(keepdims), knobs, sm)
        if key is not None:
            _calls.put(key, call)
    if out is not None:
        out = _validate_out(out, call.shape, x)
    if dtype is not None:
        x = _check.as_array(x, "x")
        a = normalize_axis(axis, x.ndim)
        dtype = index_dtype(dtype, x.shape, None if x.ndim == 0 else a)
        if out is not None and out.dtype != dtype:
            raise TypeError(f"dtype={dtype_name(dtype)} and out's dtype {dtype_name(out.dtype)} differ; "
                            "pass one of them")
        if out is None and dtype != np.int64:
            refuse_temporary_in_capture(op, DTYPE_CAST)
    if call.check_nan and cp.cuda.get_current_stream().is_capturing():
        raise RuntimeError(f"{op} waits for the GPU to learn whether a slice is all NaN, which a CUDA graph "
                           "capture cannot do; capture argmax / argmin instead")
    direct = out is not None and out.flags.c_contiguous and out.dtype == np.int64
    if call.kernel is not None and (call.copy or not (out is None or direct)):
        refuse_temporary_in_capture(op, X_COPIED if call.copy else OUT_STRIDED if out.dtype == np.int64 else OUT_CAST)
    with on_device(x.data.device_id):
        dst = out if direct else cp.ndarray(call.shape, np.int64)
        if call.kernel is not None:
            src = cp.ascontiguousarray(x) if call.copy else x
            ws = call.workspace
            flag: Any
            flag, flag_ptr = _flag() if call.check_nan else (None, _NO_FLAG)  # (only nanarg's kernels write it)
            if call.span:
                launch(call.kernel, call.config, (dst, ws.partials, ws.counters, flag_ptr, src, call.params))
            else:
                launch(call.kernel, call.config, (dst, flag_ptr, src, call.params))
            if call.check_nan:
                _check_all_nan(flag)
        if out is None:
            return dst if dtype is None or dtype == np.int64 else dst.astype(dtype)
        if not direct:
            cp.copyto(out, dst, casting="unsafe")
        return out


_DOC = """``out = {formula}``, int64 (or ``dtype``): {title}{into}.

{nan} Ties give the first index. Complex x is ordered as NumPy orders it:
by the real parts, then the imaginary parts (a NaN in either part makes a NaN). The result depends only on
x's values (any launch gives the same index; :func:`cukern.reference.{op}_emulated` computes it on the
host).

Parameters
----------
x : cupy.ndarray of float64, float32, float16, bfloat16, complex64, complex128, any signed or unsigned
    integer type, or bool; any strides.
axis : None or int
    The axis searched (negative counts from the end); None searches the flattened array (C order).
dtype : None or a signed integer dtype (int8, int16, int32, int64), as CuPy's ``dtype``
    The index dtype (NumPy's arg-reductions have no such argument). It must hold the largest index, the
    searched axis's length less one (the size less one for None); a narrower one is a ValueError. The
    indices are found in int64 and converted (through a temporary unless int64: not under a CUDA-graph
    capture). With ``out`` it must be ``out``'s dtype.
keepdims : bool
    Keep the searched axis (every axis, for None) as size 1.
out : cupy.ndarray of int64 with the result's shape, optional; must not overlap x. Or of bool or an integer
    type narrower than int64 (NumPy's rule: one whose values int64 holds), which takes the indices cast
    (wrapping), through an int64 temporary (so not under a CUDA-graph capture).

Returns
-------
out : int64 (or ``dtype``) indices along ``axis`` (flat indices for None).

Raises
------
TypeError
    For a dtype outside those above, a non-int axis, an ``out`` of a float, complex or 64-bit unsigned
    type, a ``dtype=`` that is not a signed integer type, or one that is not ``out``'s.
ValueError
    For an empty search{all_nan}, or an ``out`` of the wrong shape or overlapping x. AxisError (a
    ValueError) for an axis out of range, or a ``dtype`` too narrow for the indices. Every check runs before
    anything is launched{after}.

Examples
--------
{examples}
"""

_EXAMPLES = {
    "argmax": """\
>>> import cupy as cp
>>> import cukern
>>> x = cp.array([[1, 7, 7], [9, 0, 9]])
>>> print(cukern.argmax(x), cukern.argmax(x, axis=1))
3 [1 0]
>>> cukern.argmax(x, axis=1, dtype=cp.int8).dtype
dtype('int8')""",
    "argmin": """\
>>> import cupy as cp
>>> import cukern
>>> x = cp.array([[3.0, -1.0], [-1.0, 5.0]], dtype=cp.float32)
>>> print(cukern.argmin(x), cukern.argmin(x, axis=0, keepdims=True))
1 [[1 0]]""",
    "nanargmax": """\
>>> import cupy as cp
>>> import cukern
>>> print(cukern.nanargmax(cp.array([cp.nan, 2.0, 5.0])))
2""",
    "nanargmin": """\
>>> import cupy as cp
>>> import cukern
>>> print(cukern.nanargmin(cp.array([[cp.nan, 1.0], [2.0, cp.nan]]), axis=1))
[1 0]""",
}

_NAN = {False: "A NaN beats every number (the first NaN's index is the result), as in NumPy.",
        True: "NaNs are skipped; a slice holding nothing but NaNs is an error. For float and complex dtypes the "
              "call waits for the GPU to read the kernel's all-NaN flag (a host synchronization; refused under "
              "CUDA-graph capture). Where NumPy (which puts -inf, or +inf for the minimum, in a NaN's place; "
              "complex: that infinity + 0j) returns a NaN's index ahead of the best number, cukern returns "
              "that number's index."}


def extreme_index(op: str, x, axis: int):
    """The int64 index along ``axis`` (an int) of each slice's extreme for ``op`` ("argmax", "argmin",
    "nanmax", "nanmin"): what :func:`cukern.amax` and its siblings gather for complex x. As the public
    arg-ops, but "nanmax" and "nanmin" skip NaNs without the all-NaN check (no error, no synchronization):
    an all-NaN slice gives 0, its first element, which is the NaN NumPy's nanmax returns."""
    return _run(op, x, axis, False, None)


def argmax(x: DeviceArray, axis: int | None = None, *, dtype: DTypeLike | None = None, keepdims: bool = False,
           out: DeviceArray | None = None) -> DeviceArray:
    return _run("argmax", x, axis, keepdims, out, dtype=dtype)


def argmin(x: DeviceArray, axis: int | None = None, *, dtype: DTypeLike | None = None, keepdims: bool = False,
           out: DeviceArray | None = None) -> DeviceArray:
    return _run("argmin", x, axis, keepdims, out, dtype=dtype)


def nanargmax(x: DeviceArray, axis: int | None = None, *, dtype: DTypeLike | None = None, keepdims: bool = False,
              out: DeviceArray | None = None) -> DeviceArray:
    return _run("nanargmax", x, axis, keepdims, out, dtype=dtype)


def nanargmin(x: DeviceArray, axis: int | None = None, *, dtype: DTypeLike | None = None, keepdims: bool = False,
              out: DeviceArray | None = None) -> DeviceArray:
    return _run("nanargmin", x, axis, keepdims, out, dtype=dtype)


for _fn, _title, _formula in (
        (argmax, "the index of the largest value along an axis", "argmax(x, axis)"),
        (argmin, "the index of the smallest value along an axis", "argmin(x, axis)"),
        (nanargmax, "the index of the largest value along an axis, NaNs skipped", "nanargmax(x, axis)"),
        (nanargmin, "the index of the smallest value along an axis, NaNs skipped", "nanargmin(x, axis)")):
    _nan = _fn.__name__.startswith("nan")
    _fn.__doc__ = _DOC.format(title=_title, formula=_formula, into=", written into ``out`` when given",
                              nan=_NAN[_nan], op=_fn.__name__,
                              all_nan=", an all-NaN slice (found after the launch; out may then hold that "
                                      "slice's first NaN index)" if _nan else "",
                              after=" (but the all-NaN check, which needs the kernel's answer)" if _nan else "",
                              examples=_EXAMPLES[_fn.__name__])
