"""Reductions: sum, amax, amin, mean, sum_of_squares, norm (kernels in ``cuda_src/reduce.cu``; planning, pure,
in :mod:`cukern.reduce_plan`, whose notes list the layouts and the kernel each gets).

References (float64, :mod:`cukern.reference`): ``np.sum``, ``np.max``, ``np.min``, ``np.mean``,
``np.sum(x * x)``, ``sqrt(np.sum(x * x))`` over the same axes. Zero-size reductions answer as NumPy: sum,
sum_of_squares and norm 0, mean NaN (with NumPy's "Mean of empty slice." RuntimeWarning), amax and amin
raise ValueError.

Host path: the first call for a given (op, arguments, shape, strides, dtype, 16-byte alignment, device,
stream, tuning knobs, and ``out``'s shape, strides, dtype, device and item alignment) validates, plans and
prepares its launches; later such calls find them in a :class:`~cukern._launch.CallCache` and go straight to
allocating the result (or checking ``out`` against ``x``) and launching. Tuning knobs:
:class:`~cukern.reduce_plan.Knobs`; the tuning cache's winner is used where there is one
(:func:`_tuned_knobs`), looked up once per call.

Accumulation: float32 for float16/bfloat16/float32 results, float64 for float64, int64 for integer results.
Every result is one fixed tree over its n reduced elements (:mod:`cukern.reduce_plan`'s notes): chains of 8
elements 32 apart, then pairs of neighbours. Its bits depend only on the values, n, the dtypes and the op:
not on the number of outputs, the layout of x (strides, alignment, memory order), the grid, the tuning
knobs, the SM count, the stream or the GPU; :func:`cukern.reference.sum_emulated` and its siblings give the
same bits on the host. A float sum's error is bounded by roughly ``(8 + log2(n / 8)) * eps * sum|x|``.
Reductions of one element per output are elementwise (no tree): a sum of -0.0 stays -0.0 there, where the
tree's chains, which start from +0.0, give +0.0.

CUDA graphs. A call made while its stream is capturing records launches into the graph and allocates
nothing but its result when ``out`` is not given (that array is the caller's: the graph writes it on every
replay, so keep it as long as the graph). Per layout (see :mod:`cukern.reduce_plan`):

* full, rows, strided and one-pass column reductions: the kernel writes the result, or any C-contiguous
  ``out`` of the result's dtype, directly;
* full reductions and two-pass column reductions also use the stream's workspace (below): capturable once
  an eager call on that stream has made it large enough; a capture that would have to create or grow it is
  refused;
* reductions over size-1 axes only (each output is one element) and zero-size reductions: written
  elementwise (copied, squared or made absolute; or filled) into the result or any ``out``;
* refused under capture, because they go through a temporary whose memory would return to the pool while
  the graph keeps writing it: layouts copied to contiguous first (more than two kept or reduced levels that
  do not merge, or two reduced levels with nothing kept, such as a full reduction of a transposed array),
  an x not aligned to its item size, an ``out`` that is not C-contiguous, and amax or amin with ``dtype=``
  (a conversion).

A refusal is a RuntimeError raised before anything is recorded (the capture stays valid); it names the
reason and the way around it.

Workspaces: per (device, stream), made by the first full or two-pass column reduction on that stream: 32 KiB
of per-block partials, a counter (the last block resets it, so no memset per call) and scratch for the
per-span column partials, grown to the largest need seen (at least doubling). They are never freed, nor are
buffers they outgrow: a graph may replay a captured reduction at any time and cukern cannot see the graph
end. Kernels on one stream run in order, so its calls share its workspace safely; a graph's reductions use
the workspace of the stream they were captured on, so replay it in order with that stream's reductions
(on that stream, or synchronized with it), never concurrently with them.
"""

from __future__ import annotations

import math
import threading
import warnings
from dataclasses import dataclass, field

import numpy as np

from . import _check, _tuned
from ._compile import get_kernel
from ._dtypes import dtype_name
from ._launch import CallCache, Signature, launch, on_device, sm_count
from ._launch import cupy as _cupy
from .reduce_plan import (
    DEFAULT_KNOBS,
    FINISH_DIVIDE,
    FINISH_NONE,
    FINISH_SQRT,
    FULL_PARTIALS,
    KERNEL_KINDS,
    OP_SUMSQ,
    OPS,
    Knobs,
    Op,
    Plan,
    cols_geometry,
    make_knobs,
    normalize_axis,
    plan,
    plan_instantiations,
    result_dtype,
    result_shape,
    temporary,
    two_level,
)

# The kernel families (cukern.families) read SOURCE and instantiations on the op module, the benchmarks
# bytes_moved.
from .reduce_plan import SOURCE, bytes_moved, instantiations  # noqa: F401

# Full sums keyed by element count (shape ``(n,)``); row sums by ``(rows, length)``. No knob changes the
# order of a reduction (every plan is the one tree), so no knob needs keeping across the buckets of a
# length. Every op uses the sum's knobs.
TUNING = {
    "sum": _tuned.Rule("sum", DEFAULT_KNOBS, make_knobs,
                       bucket=lambda s: f"n<={_tuned.rows_bucket(math.prod(s))}"),
    "sum_rows": _tuned.Rule("sum_rows", DEFAULT_KNOBS, make_knobs,
                            bucket=lambda s: f"length={s[-1]},rows<={_tuned.rows_bucket(math.prod(s[:-1]))}"),
}

_FULL_SIG = Signature(("ptr", "ptr", "ptr", "ptr", "i64", "i64", "i32", "f64"))
_ROWS_SIG = Signature(("ptr", "ptr", "i64", "i64", "i64", "i64", "i64", "i32", "i32", "f64"))
_COLS_SIG = Signature(("ptr", "ptr", "i64", "i64", "i64", "i64", "i64", "i64", "i32", "i32", "i32", "i32", "f64"))
_FOLD_SIG = Signature(("ptr", "ptr", "i64", "i64", "i32", "i32", "f64"))
_STRIDED_SIG = Signature(("ptr", "ptr", "i64", "i64", "i64", "i64", "i64", "i64", "i64", "i64", "i32", "f64"))

# ---------------------------------------------------------------------------------------------------------
# Workspaces (see the module notes).


@dataclass
class Workspace:
    partials: object  # cupy uint8[FULL_PARTIALS * 8]: per-block partials of a full reduction
    counter: object  # cupy uint32[1], zero between launches
    scratch: object  # cupy uint8: per-slice partials of a two-pass column reduction
    outgrown: list = field(default_factory=list)  # earlier scratch buffers, kept for graphs that use them


_workspaces: dict = {}
_work_lock = threading.Lock()


def workspace(scratch: int = 0) -> Workspace:
    """The current stream's workspace on the current device, with at least ``scratch`` bytes of scratch.
    Making or growing it allocates (and zeroes the counter), which must not happen inside a stream capture:
    the allocation would be recorded and the zeroing would not run before later eager calls. So under
    capture a workspace that is missing or too small is a RuntimeError, raised before anything is recorded."""
    cp = _cupy()
    stream = cp.cuda.get_current_stream()
    key = (cp.cuda.runtime.getDevice(), stream.ptr)
    ws = _workspaces.get(key)
    if ws is not None and ws.scratch.nbytes >= scratch:
        return ws
    if stream.is_capturing():
        have = "none" if ws is None else f"one with {ws.scratch.nbytes}"
        raise RuntimeError(
            f"this reduction needs the current stream's workspace with {scratch} bytes of scratch (it has "
            f"{have}), and a CUDA-graph capture cannot allocate it; make the same call once on this stream "
            f"before capturing"
        )
    with _work_lock:
        ws = _workspaces.get(key)
        if ws is None:
            ws = Workspace(cp.empty(FULL_PARTIALS * 8, dtype=np.uint8), cp.zeros(1, dtype=np.uint32),
                           cp.empty(0, dtype=np.uint8))
            _workspaces[key] = ws
        if ws.scratch.nbytes < scratch:
            if ws.scratch.nbytes:
                ws.outgrown.append(ws.scratch)
            ws.scratch = cp.empty(max(scratch, 2 * ws.scratch.nbytes), dtype=np.uint8)
    return ws


# ---------------------------------------------------------------------------------------------------------
# Prepared launches: what the call cache holds.


class _Single:
    """One kernel launch, prepared: the kernel, its launch shape and every argument but the output and the
    input address, typed once. ``run(out, x)`` launches into ``out`` (an array or a device address);
    calling it on ``x`` allocates the result of ``shape`` and ``dtype`` first. Valid for inputs of the
    shape, strides, dtype, 16-byte alignment, device and stream it was prepared for (the cache key)."""

    __slots__ = ("kernel", "config", "head", "offset", "tail", "shape", "dtype")

    def __init__(self, kernel, config, signature: Signature, head, offset: int, tail, shape, dtype):
        args = signature.convert((None, *head, 0, *tail))
        self.kernel, self.config = kernel, config
        self.head, self.tail = args[1:1 + len(head)], args[2 + len(head):]
        self.offset, self.shape, self.dtype = offset, shape, np.dtype(dtype)

    def run(self, out, x) -> None:
        # The array itself is passed as the pointer when no offset applies: cheaper than a NumPy scalar.
        src = np.uint64(x.data.ptr + self.offset) if self.offset else x
        launch(self.kernel, self.config, (out, *self.head, src, *self.tail))

    def __call__(self, x):
        out = _cupy().ndarray(self.shape, self.dtype)
        src = np.uint64(x.data.ptr + self.offset) if self.offset else x
        launch(self.kernel, self.config, (out, *self.head, src, *self.tail))
        return out


class _TwoPass:
    """The two-pass column reduction, prepared: pass one writes per-span partials into the stream's
    workspace scratch, pass two combines them into the result. Same interface as :class:`_Single`."""

    __slots__ = ("first", "second", "partials", "shape", "dtype")

    def __init__(self, first: _Single, second: _Single, partials: int, shape, dtype):
        self.first, self.second, self.partials = first, second, np.uint64(partials)
        self.shape, self.dtype = shape, np.dtype(dtype)

    def run(self, out, x) -> None:
        self.first.run(self.partials, x)
        self.second.run(out, self.partials)

    def __call__(self, x):
        out = _cupy().ndarray(self.shape, self.dtype)
        self.run(out, x)
        return out


def _prepare(pl: Plan, x, o, op: Op, count: int, shape):
    """The prepared launches of plan ``pl`` (a kernel kind) for arrays like ``x``, producing ``count``-element
    reductions in dtype ``o`` as a C-contiguous result of ``shape``. Takes the stream's workspace first, so a
    capture that cannot have it is refused before a kernel is even loaded."""
    layout, p = pl.layout, pl.kernel
    kind = layout.kind
    ws = workspace(pl.partials) if kind == "full" or pl.fold is not None else None
    kernels = [get_kernel(i) for i in plan_instantiations(pl, x.dtype, o, op.kernel_op)]
    tail = (op.finalize, float(count))
    if kind == "full":
        # Element i at x[i * stride] from x's own first element, whatever the stride's sign: the tree
        # numbers elements in x's order, never in memory order.
        (n, stride), = layout.red
        return _Single(kernels[0], p.config, _FULL_SIG, (ws.partials.data.ptr, ws.counter.data.ptr), 0,
                       (n, stride) + tail, shape, o)
    if kind == "rows":
        inner, s0, s1 = two_level(layout.kept)
        return _Single(kernels[0], p.config, _ROWS_SIG, (), 0,
                       (layout.outputs, layout.count, inner, s0, s1, p.tpr) + tail, shape, o)
    if kind == "strided":
        o_inner, o_s0, o_s1 = two_level(layout.kept)
        r_inner, r_s0, r_s1 = two_level(layout.red)
        return _Single(kernels[0], p.config, _STRIDED_SIG, (), 0,
                       (layout.outputs, o_inner, o_s0, o_s1, layout.count, r_inner, r_s0, r_s1) + tail, shape, o)
    outer, s_outer, rows, s_row, cols = cols_geometry(layout)
    geometry = (outer, rows, cols, s_outer, s_row, p.span, p.spans, p.strips, p.vector)
    if pl.fold is None:
        return _Single(kernels[0], p.config, _COLS_SIG, (), 0, geometry + tail, shape, o)
    first = _Single(kernels[0], p.config, _COLS_SIG, (), 0, geometry + (FINISH_NONE, 1.0), shape, o)
    second = _Single(kernels[1], pl.fold.config, _FOLD_SIG, (), 0, (outer, cols, p.spans) + tail, shape, o)
    return _TwoPass(first, second, ws.scratch.data.ptr, shape, o)


# ---------------------------------------------------------------------------------------------------------
# The call cache. Entries are made only after the general path validated and prepared such a call, and only
# for calls that launch kernels straight from x into their destination (no copy, no temporary).

_calls = CallCache(4096)
_MISSING = CallCache.MISSING


def _fast_key(name: str, x, axis, dtype, keepdims):
    """The cache key of a call, or None for arguments the cache does not take (axis and dtype values that
    compare equal to valid ones without being valid, such as axis=True, go the general path)."""
    ta = type(axis)
    if not (axis is None or ta is int or (ta is tuple and all(type(a) is int for a in axis))):
        return None
    if not (dtype is None or type(dtype) in (str, type) or isinstance(dtype, np.dtype)):
        return None
    if type(keepdims) is not bool:
        return None
    mem = x.data
    dev = mem.device_id
    if dev != _cupy().cuda.runtime.getDevice():
        return None
    return (name, x.shape, x.strides, x.dtype, mem.ptr % 16, axis, dtype, keepdims, dev,
            _cupy().cuda.get_current_stream().ptr)


def _out_key(out) -> tuple:
    """What a cached launch into ``out`` depends on: its shape, strides, dtype, device and item alignment
    (whether it overlaps ``x`` is checked on every call)."""
    mem = out.data
    return (out.shape, out.strides, out.dtype, mem.device_id, mem.ptr % out.itemsize)


def _tuned_knobs(x, axis) -> Knobs:
    """The tuning cache's knobs for reducing ``axis`` of ``x`` (a cupy array), else :data:`DEFAULT_KNOBS`:
    ``axis=None`` looks up ``sum`` for ``(x.size,)``; only the last axis of an array of 2 or more dimensions
    (``-1``, ``ndim - 1`` or a 1-tuple of either) looks up ``sum_rows`` for ``(rows, length)``; anything
    else uses the defaults. Every op uses the sum's knobs (same kernels). Never raises for odd ``axis``."""
    if axis is None:
        return _tuned.lookup(TUNING["sum"], x.data.device_id, x.dtype, (x.size,))
    nd = x.ndim
    if nd < 2:
        return DEFAULT_KNOBS
    a = axis
    if type(a) is tuple:
        if len(a) != 1:
            return DEFAULT_KNOBS
        a = a[0]
    if isinstance(a, (bool, np.bool_)) or not isinstance(a, (int, np.integer)) or (a != -1 and a != nd - 1):
        return DEFAULT_KNOBS
    length = x.shape[-1]
    if length == 0:
        return DEFAULT_KNOBS
    return _tuned.lookup(TUNING["sum_rows"], x.data.device_id, x.dtype, (x.size // length, length))


# ---------------------------------------------------------------------------------------------------------
# Validation and the public ops.


def _validate_out(out, shape, dtype, x):
    out = _check.as_array(out, "out", writable=True)
    if out.shape != shape:
        raise ValueError(f"out has shape {out.shape}; the result has shape {shape}")
    if out.dtype != dtype:
        raise TypeError(f"out has dtype {dtype_name(out.dtype)}; the result has dtype {dtype_name(dtype)}")
    _check.check_same_device({"x": x, "out": out})
    _check.check_writable(out, "out")
    _check.check_no_overlap(out, "out", x, "x", identical_ok=False)
    return out


def _drop(a, axes):
    """``a`` without its (size-1) ``axes``: a view."""
    return a[tuple(0 if i in axes else slice(None) for i in range(a.ndim))]


def _elementwise(op: Op, x, dst) -> None:
    """Every reduced axis has size 1: each output is its one element of ``x`` (both in the kept shape),
    written into ``dst`` in place, with no temporary: converted to the result dtype, then squared there
    (sum_of_squares: for one element the same bits as the kernels' square in the accumulator, rounded once)
    or made absolute (norm)."""
    cp = _cupy()
    cp.copyto(dst, x, casting="unsafe")
    if op.finalize == FINISH_SQRT:
        cp.abs(dst, out=dst)
    elif op.kernel_op == OP_SUMSQ:
        cp.multiply(dst, dst, out=dst)


def _reduce(name: str, x, axis, dtype, keepdims: bool, out, knobs: Knobs | None = None, sm: int | None = None):
    """The public ops' body. ``knobs`` picks the tuning (for sweeps); None: the tuning cache's winner for
    this call (:func:`_tuned_knobs`), else :data:`DEFAULT_KNOBS`. ``sm`` plans as if the device had that
    many SMs (tests: the bits must not change); such calls bypass the call cache."""
    cp = _cupy()
    key = None
    nd = cp.ndarray
    if sm is None and type(x) is nd and (out is None or type(out) is nd):
        if knobs is None:
            knobs = _tuned_knobs(x, axis)
        try:
            key = _fast_key(name, x, axis, dtype, keepdims)
            if key is not None:
                key += (knobs,) if out is None else (knobs, *_out_key(out))
            call = _calls.get(key)
        except TypeError:  # unhashable arguments: the general path reports them
            key, call = None, _MISSING
        if call is not _MISSING:
            if out is None:
                return call(x)
            _check.check_no_overlap(out, "out", x, "x", identical_ok=False)
            call.run(out, x)
            return out
    op = OPS[name]
    x = _check.as_array(x, "x")
    _check.check_dtype(x, "x", op.inputs)
    if knobs is None:
        knobs = _tuned_knobs(x, axis)
    axes = normalize_axis(axis, x.ndim)
    final = result_dtype(name, x.dtype, dtype)
    o = x.dtype if op.minmax else final
    shape = result_shape(x.shape, axes, keepdims)
    if out is not None:
        out = _validate_out(out, shape, final, x)
    count = math.prod(x.shape[i] for i in axes)
    if count == 0 and op.minmax:
        raise ValueError(f"zero-size array to reduction operation {name} which has no identity")
    device = x.data.device_id
    with on_device(device):
        pl = _plan_of(x, axes, o, knobs, sm)
        aligned = x.data.ptr % x.itemsize == 0
        direct = None if out is None else bool(out.flags.c_contiguous and out.data.ptr % out.itemsize == 0)
        why = temporary(pl, aligned=aligned, converts=o != final, out_direct=direct)
        if why is not None and cp.cuda.get_current_stream().is_capturing():
            raise RuntimeError(f"{name} cannot be captured in a CUDA graph here: {why}")
        if count == 0 and op.finalize == FINISH_DIVIDE:
            warnings.warn("Mean of empty slice.", RuntimeWarning, stacklevel=3)
        kind = pl.layout.kind
        if kind not in KERNEL_KINDS:
            dst = cp.empty(shape, final) if out is None else out
            if kind == "fill":
                dst.fill(np.nan if op.finalize == FINISH_DIVIDE else 0)
            elif kind == "none":
                if not aligned:
                    x = x.copy()
                _elementwise(op, _drop(x, axes), _drop(dst, axes) if keepdims else dst)
            return dst
        if why is None:
            call = _prepare(pl, x, o, op, count, shape)
            if key is not None:
                _calls.put(key, call)
            if out is None:
                return call(x)
            call.run(out, x)
            return out
        if not aligned:
            x = x.copy()
            pl = _plan_of(x, axes, o, knobs, sm)
        if pl.copy:
            order = [i for i in range(x.ndim) if i not in axes] + list(axes)
            x = cp.ascontiguousarray(x.transpose(order))
        kept = result_shape(shape, axes, False) if keepdims else shape
        result = cp.empty(kept, o)
        _prepare(pl, x, o, op, count, kept).run(result, x)
        result = result.reshape(shape)
        if out is None:
            return result.astype(final)
        out[...] = result
        return out


def _plan_of(x, axes, o, knobs: Knobs, sm: int | None = None) -> Plan:
    return _plan_cached(x.shape, x.dtype, axes, tuple(s // x.itemsize for s in x.strides), x.data.ptr % 16, o,
                        sm_count(x.data.device_id) if sm is None else sm, knobs)


_plans = CallCache(1024)


def _plan_cached(shape, dtype, axes, strides, ptr_mod16, out_dtype, sm, knobs=DEFAULT_KNOBS) -> Plan:
    """:func:`~cukern.reduce_plan.plan`, memoized: host time per call matters at mid sizes, where the kernel
    takes microseconds."""
    key = (shape, dtype, axes, strides, ptr_mod16, out_dtype, sm, knobs)
    pl = _plans.get(key)
    if pl is _MISSING:
        pl = _plans.put(key, plan(shape, dtype, axes, strides=strides, ptr=ptr_mod16, out_dtype=out_dtype,
                                  sm_count=sm, knobs=knobs))
    return pl


def sum(x, axis=None, *, dtype=None, keepdims=False, out=None):  # noqa: A001 - mirrors numpy.sum
    """Sum of elements over ``axis``: ``sum_i x[i]``.

    Parameters
    ----------
    x : cupy.ndarray of float32, float64, float16, bfloat16, int32, int64 or bool; any strides.
    axis : None, int or tuple of ints. None reduces everything.
    dtype : result dtype. Default as NumPy: int32 and bool give int64, floats keep theirs. Half types
        always accumulate in float32, float32 in float32, float64 in float64, integers in int64.
    keepdims : keep reduced axes as size 1.
    out : cupy.ndarray with the result's shape and dtype, optional, not overlapping ``x``; written by the
        kernel directly when C-contiguous, else through a temporary. The module notes say which calls a
        CUDA graph can capture.

    Reproducible: the bits depend only on the values, the reduced length, the dtypes and the op (one fixed
    tree per reduced length; the module notes), as :func:`cukern.reference.sum_emulated` computes them.
    """
    return _reduce("sum", x, axis, dtype, keepdims, out)


def mean(x, axis=None, *, dtype=None, keepdims=False, out=None):
    """Arithmetic mean over ``axis``: ``sum(x) / count``, accumulated as :func:`sum`; integer and bool
    inputs give float64. An empty reduction gives NaN with NumPy's RuntimeWarning "Mean of empty slice."."""
    return _reduce("mean", x, axis, dtype, keepdims, out)


def sum_of_squares(x, axis=None, *, dtype=None, keepdims=False, out=None):
    """``sum_i x[i]**2`` over ``axis``, squares formed in the accumulator type (so float16 squares do not
    overflow and int32 squares are taken in int64). Result dtypes as :func:`sum`."""
    return _reduce("sum_of_squares", x, axis, dtype, keepdims, out)


def norm(x, axis=None, *, dtype=None, keepdims=False, out=None):
    """L2 norm over ``axis``: ``sqrt(sum_i x[i]**2)``; integer inputs give float64, floats keep their
    dtype. (Unlike ``numpy.linalg.norm``, any ``axis`` tuple means the 2-norm of the flattened axes.)"""
    return _reduce("norm", x, axis, dtype, keepdims, out)


def amax(x, axis=None, *, dtype=None, keepdims=False, out=None):
    """Maximum over ``axis``; NaN propagates (any NaN gives NaN), as ``numpy.amax``. Raises ValueError on
    a zero-size reduction. ``dtype`` converts the result."""
    return _reduce("amax", x, axis, dtype, keepdims, out)


def amin(x, axis=None, *, dtype=None, keepdims=False, out=None):
    """Minimum over ``axis``; NaN propagates, as ``numpy.amin``. Raises ValueError on a zero-size
    reduction. ``dtype`` converts the result."""
    return _reduce("amin", x, axis, dtype, keepdims, out)
