"""Segmented reductions over CSR offsets: segment_sum, segment_max, segment_min, segment_mean (kernels in
``cuda_src/segment.cu``).

References (float64, :mod:`cukern.reference`)::

    out[s] = reduce(x[offsets[s] : offsets[s + 1]], axis=0)      s < len(offsets) - 1

An empty segment gives the identity: 0 for sums, -inf for max, +inf for min (an integer dtype's lowest and
highest values, False and True for bool), NaN for mean.

Result dtypes are NumPy's for the same reduction of a slice (:func:`result_dtype`): x's for floats, and
for the maxima and minima of integers and bool; int64 (uint64 for unsigned x) for integer and bool sums,
which wrap as NumPy's; float64 for their means.

Memory traffic, the count every GB/s figure uses: x read once, the offsets read once, out written once
(:func:`bytes_moved`).

Reproducibility: each segment is reduced by the tree of :mod:`cukern.reduce_plan`'s notes over its own
length (chains of 8 rows 32 apart, then pairs of neighbours), in float32 for float32 / float16 / bfloat16
and float64 for float64 and for the means of integers and bool (integer sums, maxima and minima are exact),
so its bits depend only on its values and its length: not on the other segments, the number of columns,
the launch or the GPU. They equal :func:`cukern.sum` (``amax``, ``amin``) of the same
slice along axis 0 (but for a one-row segment holding -0, which the tree's chain, started at +0, sums to
+0); :func:`cukern.reference.segment_sum_emulated` and its siblings compute them on the host.

Offsets: int32 or int64, 1-D, ``segments + 1`` values with ``0 <= offsets[0] <= ... <= offsets[-1] <=
x.shape[0]`` (rows outside ``[offsets[0], offsets[-1])`` are not read). With ``check_offsets=True`` (the
default) the call checks them on the GPU and waits for the answer (a host synchronization, refused under
CUDA-graph capture), raising ValueError before the reduction is launched. With ``check_offsets=False``
nothing waits; the kernels then clamp every bound into ``[0, x.shape[0]]`` and read an inverted pair as an
empty segment, so bad offsets give wrong values but never touch memory outside x.

Layouts: axis 0 may have any stride; the trailing axes must merge into one strided level (else x is first
copied to C-contiguous, one more read and write of x). ``out`` is written directly when C-contiguous, else
through a temporary.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

import cukern._check as _check

from ._compile import Instantiation, get_kernel
from ._dtypes import BFLOAT16, dtype_name
from ._launch import (
    OUT_STRIDED,
    X_COPIED,
    CallCache,
    LaunchConfig,
    Params,
    launch,
    on_device,
    refuse_temporary_in_capture,
    struct_argument,
)
from ._launch import cupy as _cupy
from ._layout import collapse
from ._typing import DeviceArray

SOURCE = "segment"
WARP_BLOCK = 64  # SEG_WARP_BLOCK in cuda_src/segment.cu: two runs a block (see there)
COL_BLOCK = 128  # SEG_COL_BLOCK: columns a block
COLS_KERNEL_MIN = 32  # columns from which a thread per column reads whole 32-column runs of a row
MAX_GRID_Y = 65535
# The warp kernel takes runs of consecutive segments, a run's bounds in one load (at most 32: a lane each),
# as long as the launch keeps at least RUN_WARPS warps: several waves on any GPU (an H200 holds 6,600; runs
# of 16 rather than 32 for 2^20 segments measured 0.5% faster, docs/design/segment.md).
RUN_MAX = 32
RUN_WARPS = 1 << 16

FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.float16), BFLOAT16)
INT_DTYPES = tuple(np.dtype(t) for t in (np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16,
                                         np.uint32, np.uint64))
DTYPES = FLOAT_DTYPES + INT_DTYPES
OFFSET_DTYPES = (np.dtype(np.int32), np.dtype(np.int64))
SEG_SUM, SEG_MAX, SEG_MIN = 0, 1, 2
OPS = {"segment_sum": (SEG_SUM, False), "segment_max": (SEG_MAX, False), "segment_min": (SEG_MIN, False),
       "segment_mean": (SEG_SUM, True)}



def result_dtype(op: str, dtype) -> np.dtype:
    """The result's dtype, NumPy's for the same reduction of a slice: x's for floats, and for the maxima and
    minima of integers and bool; int64 for the sums of bool and signed integers, uint64 for unsigned ones
    (NumPy's ``sum``); float64 for the means of integers and bool (NumPy's ``mean``)."""
    dtype = np.dtype(dtype)
    if dtype in FLOAT_DTYPES or op in ("segment_max", "segment_min"):
        return dtype
    if op == "segment_mean":
        return np.dtype(np.float64)
    return np.dtype(np.uint64 if dtype.kind == "u" else np.int64)


# The kernels' scalars, one struct (``SegParams`` in cuda_src/segment.cu).
PARAMS = Params((("segments", "i64"), ("cols", "i64"), ("rows", "i64"), ("row_stride", "i64"),
                 ("col_stride", "i64"), ("mean", "i32"), ("run", "i32")))


@dataclass(frozen=True)
class Plan:
    """One call's launch: ``kernel`` "warp" (a warp per ``run`` consecutive segments of a column) or "cols" (a
    thread per segment and column), ``grid`` (x, y), ``block``; ``copy``: x is first copied to
    C-contiguous."""

    kernel: str | None
    grid: tuple
    block: int
    copy: bool
    segments: int
    cols: int
    row_stride: int
    col_stride: int
    run: int = 1

    @property
    def config(self) -> LaunchConfig:
        return LaunchConfig(grid=self.grid, block=(self.block,))

    def instantiation(self, dtype, op: int, offsets_dtype, out_dtype) -> Instantiation:
        return Instantiation(SOURCE, f"segment_{self.kernel}",
                             (np.dtype(dtype), op, np.dtype(offsets_dtype), np.dtype(out_dtype)))


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def plan(shape, segments: int, *, strides=None) -> Plan:
    """The launch reducing ``segments`` segments of an array of ``shape`` (rows along axis 0), ``strides`` in
    elements (default C-contiguous): pure. No knob: the kernel and grid follow from the
    column count, and no launch changes a segment's tree."""
    shape = tuple(shape)
    contiguous = tuple(int(math.prod(shape[i + 1:])) for i in range(len(shape)))
    strides = contiguous if strides is None else tuple(strides)
    cols = math.prod(shape[1:])
    sizes, (sts,) = collapse(shape[1:], [strides[1:]])
    copy = len(sizes) > 1
    if copy:
        strides = contiguous
        sts = (1,)
    col_stride = sts[0] if sts else 0
    row_stride = strides[0] if shape else 0
    if segments == 0 or cols == 0:
        return Plan(None, (1, 1), 1, copy, segments, cols, row_stride, col_stride)
    if segments >= 2**31:
        raise ValueError(f"{segments} segments; at most 2**31 - 1 are supported")
    if cols >= COLS_KERNEL_MIN:
        gy = _cdiv(cols, COL_BLOCK)
        if gy > MAX_GRID_Y:
            raise ValueError(f"x has {cols} columns a row; at most {MAX_GRID_Y * COL_BLOCK} are supported")
        return Plan("cols", (segments, gy), COL_BLOCK, copy, segments, cols, row_stride, col_stride)
    run = min(RUN_MAX, max(1, segments * cols // RUN_WARPS))
    return Plan("warp", (_cdiv(segments, WARP_BLOCK // 32 * run), cols), WARP_BLOCK, copy, segments, cols,
                row_stride, col_stride, run)


def instantiations() -> list:
    """Both kernels for every dtype, op's combine and result dtype, and offsets dtype: what :func:`plan`
    chooses, from its kernel names and the tables above (a float mean is its sum's kernel)."""
    kinds = sorted({(dt, OPS[op][0], result_dtype(op, dt)) for dt in DTYPES for op in OPS}, key=str)
    return [Plan(kernel, (1, 1), 1, False, 1, 1, 1, 1).instantiation(dt, kind, o, rt)
            for kernel in ("warp", "cols") for dt, kind, rt in kinds for o in OFFSET_DTYPES]


def bytes_moved(shape, dtype, segments: int, offsets_dtype=np.int64, out_dtype=None) -> int:
    """Bytes the op must move: x read once (every row inside a segment), the offsets read once, out (of
    ``out_dtype``, default x's) written once."""
    written = np.dtype(dtype if out_dtype is None else out_dtype).itemsize
    cols = math.prod(shape[1:])
    return (math.prod(shape) * np.dtype(dtype).itemsize + (segments + 1) * np.dtype(offsets_dtype).itemsize
            + segments * cols * written)


# ---------------------------------------------------------------------------------------------------------
# Validation, the offsets check and the public ops.


@dataclass(frozen=True)
class _Call:
    kernel: object  # None: nothing to launch
    config: LaunchConfig | None
    params: object
    copy: bool
    shape: tuple
    out_dtype: np.dtype


_calls = CallCache()
_MISSING = CallCache.MISSING


def _validate(x, offsets):
    x = _check.as_array(x, "x")
    offsets = _check.as_array(offsets, "offsets")
    _check.check_dtype(x, "x", DTYPES)
    if x.ndim < 1:
        raise ValueError("x must have at least one dimension (axis 0 holds the segments' rows)")
    if offsets.dtype not in OFFSET_DTYPES:
        raise TypeError(f"offsets has dtype {dtype_name(offsets.dtype)}; it must be int32 or int64")
    if offsets.ndim != 1 or offsets.size < 1:
        raise ValueError(f"offsets has shape {offsets.shape}; it must be 1-D with segments + 1 values (at least one)")
    _check.check_same_device({"x": x, "offsets": offsets})
    return x, offsets


def _prepare(op: str, x, offsets) -> _Call:
    segments = offsets.size - 1
    shape = (segments,) + x.shape[1:]
    pl = plan(x.shape, segments, strides=tuple(s // x.itemsize for s in x.strides))
    rt = result_dtype(op, x.dtype)
    if pl.kernel is None:
        return _Call(None, None, None, pl.copy, shape, rt)
    kind, mean = OPS[op]
    params = struct_argument(PARAMS.struct(segments=segments, cols=pl.cols, rows=x.shape[0],
                                           row_stride=pl.row_stride, col_stride=pl.col_stride, mean=int(mean),
                                           run=pl.run))
    with on_device(x.data.device_id):
        kernel = get_kernel(pl.instantiation(x.dtype, kind, offsets.dtype, rt))
    return _Call(kernel, pl.config, params, pl.copy, shape, rt)


def check_offsets(offsets, rows: int) -> None:
    """ValueError naming the first bad offset unless ``0 <= offsets[0] <= ... <= offsets[-1] <= rows``: a
    few CuPy reductions on the current stream, then one wait for their one-value answer (the details are
    read back only when something is wrong). Refused while the stream captures a CUDA graph."""
    cp = _cupy()
    if cp.cuda.get_current_stream().is_capturing():
        raise RuntimeError("check_offsets=True waits for the GPU, which a CUDA graph capture cannot do; pass "
                           "check_offsets=False while capturing")
    bad = (offsets.min() < 0) | (offsets.max() > rows)
    if offsets.size > 1:
        bad |= (offsets[1:] < offsets[:-1]).any()
    if not bool(bad):
        return
    h = offsets.get()
    for i, v in enumerate(h.tolist()):
        if not 0 <= v <= rows:
            raise ValueError(f"offsets[{i}] = {v} is outside [0, {rows}] (x has {rows} rows along axis 0)")
        if i and v < h[i - 1]:
            raise ValueError(f"offsets[{i}] = {v} is below offsets[{i - 1}] = {int(h[i - 1])}; offsets must not "
                             "decrease")


def _validate_out(out, call: _Call, x, offsets):
    out = _check.check_out(out, call.shape, call.out_dtype, x)
    _check.check_no_overlap(out, "out", x, "x", identical_ok=False)
    _check.check_no_overlap(out, "out", offsets, "offsets", identical_ok=False)
    return out


def _run(op: str, x, offsets, out, check: bool):
    cp = _cupy()
    nd = cp.ndarray
    if type(check) is not bool:
        raise TypeError(f"check_offsets must be True or False, got {check!r}")
    key = None
    call = _MISSING
    if type(x) is nd and type(offsets) is nd:
        key = (op, x.shape, x.strides, x.dtype, x.data.ptr % 16, x.data.device_id, offsets.shape, offsets.strides,
               offsets.dtype, offsets.data.ptr % 16, offsets.data.device_id)
        call = _calls.get(key)
    if call is _MISSING:
        x, offsets = _validate(x, offsets)
        call = _prepare(op, x, offsets)
        if key is not None:
            _calls.put(key, call)
    if out is not None:
        out = _validate_out(out, call, x, offsets)
    direct = out is not None and out.flags.c_contiguous
    if not offsets.flags.c_contiguous:
        refuse_temporary_in_capture(op, "offsets are copied to contiguous first; pass contiguous offsets")
    if call.kernel is not None and (call.copy or not (out is None or direct)):
        refuse_temporary_in_capture(op, X_COPIED if call.copy else OUT_STRIDED)
    with on_device(x.data.device_id):
        if not offsets.flags.c_contiguous:  # the kernels read offsets[s] at unit stride
            offsets = cp.ascontiguousarray(offsets)
        if check:
            check_offsets(offsets, x.shape[0])
        dst = out if direct else cp.ndarray(call.shape, call.out_dtype)
        if call.kernel is not None:
            src = cp.ascontiguousarray(x) if call.copy else x
            launch(call.kernel, call.config, (dst, src, offsets, call.params))
        if out is None:
            return dst
        if not direct:
            cp.copyto(out, dst)
        return out


_DOC = """``out[s] = {formula}`` over rows ``offsets[s] : offsets[s + 1]`` of x, in {rdtype}.

{what} An empty segment gives {empty}. Accumulates in float32 (float64 for float64 x{mean64}) along the tree
fixed by the segment's length, so each result's bits depend only on that segment's values
(:func:`cukern.reference.{op}_emulated`); {ints}.

Parameters
----------
x : cupy.ndarray of float32, float16, bfloat16, float64, any integer type or bool, shape ``[rows, ...]``;
    any strides.
offsets : cupy.ndarray of int32 or int64, shape ``[segments + 1]``, non-decreasing, within ``[0, rows]``; any
    stride (a strided view is copied to a contiguous one first).
out : cupy.ndarray of the result's dtype and shape ``[segments, ...]``, optional; must not overlap x or
    offsets.
check_offsets : bool
    Check the offsets on the GPU first and wait for the answer (a host synchronization, refused under
    CUDA-graph capture). False skips it: nothing waits, and bad offsets give wrong values (bounds are
    clamped into x, never read outside it).

Returns
-------
out : shape ``[segments, ...]``, {rdtype}.

Raises
------
TypeError
    For a dtype outside those above (x, offsets or out) or a non-bool check_offsets.
ValueError
    For offsets that are not 1-D with at least one value, decrease or leave ``[0, rows]`` (checked on the
    GPU before the launch), an x without dimensions, or an out of the wrong shape or overlapping an input.

Examples
--------
>>> import cupy as cp
>>> import cukern
>>> x = cp.array([1.0, 2.0, 3.0, 4.0, 5.0])
>>> offsets = cp.array([0, 2, 2, 5])  # x[0:2], x[2:2] (empty) and x[2:5]
>>> print(cukern.{op}(x, offsets))
{example_result}
"""

_EXAMPLE_RESULTS = {"segment_sum": "[ 3.  0. 12.]", "segment_max": "[  2. -inf   5.]",
                    "segment_min": "[ 1. inf  3.]", "segment_mean": "[1.5 nan 4. ]"}


def segment_sum(x: DeviceArray, offsets: DeviceArray, *, out: DeviceArray | None = None,
                check_offsets: bool = True) -> DeviceArray:
    return _run("segment_sum", x, offsets, out, check_offsets)


def segment_max(x: DeviceArray, offsets: DeviceArray, *, out: DeviceArray | None = None,
                check_offsets: bool = True) -> DeviceArray:
    return _run("segment_max", x, offsets, out, check_offsets)


def segment_min(x: DeviceArray, offsets: DeviceArray, *, out: DeviceArray | None = None,
                check_offsets: bool = True) -> DeviceArray:
    return _run("segment_min", x, offsets, out, check_offsets)


def segment_mean(x: DeviceArray, offsets: DeviceArray, *, out: DeviceArray | None = None,
                 check_offsets: bool = True) -> DeviceArray:
    return _run("segment_mean", x, offsets, out, check_offsets)


_SAME = "x's dtype"
for _fn, _formula, _what, _empty, _rdtype, _ints in (
        (segment_sum, "sum(x[a:b], axis=0)", "Sums add each value once, rounded to nearest.", "0",
         "x's dtype for floats, int64 for bool and signed integers, uint64 for unsigned ones",
         "integer and bool sums are exact in 64 bits, wrapping as NumPy's"),
        (segment_max, "max(x[a:b], axis=0)", "A NaN in a segment gives NaN; +0 is above -0.",
         "-inf (an integer dtype's lowest value, False for bool)", _SAME, "integer maxima are exact"),
        (segment_min, "min(x[a:b], axis=0)", "A NaN in a segment gives NaN; -0 is below +0.",
         "+inf (an integer dtype's highest value, True for bool)", _SAME, "integer minima are exact"),
        (segment_mean, "sum(x[a:b], axis=0) / (b - a)",
         "The sum, widened to float64, divided once by the length, then rounded to the result dtype.", "NaN",
         "x's dtype for floats, float64 for integers and bool", "integer and bool values are summed as float64")):
    _fn.__doc__ = _DOC.format(formula=_formula, what=_what, empty=_empty, op=_fn.__name__, rdtype=_rdtype,
                              ints=_ints, mean64=" and for the means of integers and bool" if _fn is segment_mean
                              else "", example_result=_EXAMPLE_RESULTS[_fn.__name__])
