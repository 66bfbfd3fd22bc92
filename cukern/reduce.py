"""Reductions: sum, amax, amin, mean, sum_of_squares, norm, var, std, nansum, nanmax, nanmin, nanmean,
count_nonzero, any, all, prod, logsumexp (kernels in ``cuda_src/reduce.cu``; planning, pure, in
:mod:`cukern.reduce_plan`, whose notes list the layouts and the kernel each gets).

References (float64, :mod:`cukern.reference`): ``np.sum``, ``np.max``, ``np.min``, ``np.mean``,
``np.sum(x * x)``, ``sqrt(np.sum(x * x))``, ``np.var``, ``np.std`` over the same axes. Zero-size reductions
answer as NumPy: sum, sum_of_squares and norm 0, mean NaN (with NumPy's "Mean of empty slice."
RuntimeWarning), var and std NaN (with "Degrees of freedom <= 0 for slice", also given whenever
``n - ddof <= 0``), amax and amin raise ValueError.

var and std are one pass: the tree carries (count, mean, M2) of the values less the slice's first element,
each chain of 8 forming its own (count, mean, M2) directly (one division) and the chains merged by Chan's
formula (reduce.cu ``Chan``), so an offset far larger than the spread costs no accuracy.

nansum, nanmax and nanmin are the sum, max and min kernels with a run-time lift (a NaN becomes the identity),
no kernels of their own; count_nonzero, any and all are the float64 sum kernels' code with the lift x != 0 ->
1 or 0, storing the count as their result themselves (int64; any: count != 0; all: count == n, bool); nanmean
is two such passes (the sum, the count of non-NaN values). nanmax, nanmin and nanmean check their result on the
host for all-NaN slices (NumPy's warning), so a CUDA-graph capture refuses them. prod and logsumexp have
kernels of their own at one tuning point (:data:`~cukern.reduce_plan.COMPACT_KNOBS`); their column layouts
take the strided kernel. logsumexp with weights ``b`` (SciPy's) has one more, ``reduce_lse_weighted``: a
warp an output, as the strided kernel, reading x and b through their own strides
(:func:`~cukern.reduce_plan.plan_weighted`); complex logsumexp, weighted or not, ``reduce_lse_complex``, the
same plan with a complex sum and cukern's own cos, sin and atan2.

NumPy's dtypes and memory order. Every op takes the input dtypes NumPy takes for it
(:data:`~cukern.reduce_plan.PUBLIC_INPUTS`: int8, int16 and the unsigned types too, bool for maxima, minima
and norms, complex64 / complex128 for every op but sum_of_squares) and gives NumPy's result
dtype, and ``dtype=`` takes NumPy's targets (:func:`~cukern.reduce_plan.targets`). The kernels read only their
own dtypes, so the others are lowered on the device first (:func:`~cukern.reduce_plan.route`): narrower
integers and bool converted exactly to int32, uint32 to int64 (one more pass over x); uint64 sums and products
read as int64 (a view: both wrap modulo 2^64); uint64 maxima and minima with the sign bit flipped (one more
pass); complex inputs as their real and imaginary parts, a trailing axis of a float view (no pass: each part
its own tree, the norm one tree over both, var and std the parts' variances added; nansum zeroes a complex
NaN first, counts read x != 0, one more pass each); complex products with kernels of their own, which read and
multiply the (real, imaginary) pairs (reduce.cu ``Complex``), x converted first only for a target of another
dtype, as NumPy multiplies in it; complex maxima and minima as the element at the index the arg-reduction
kernels find (cuda_src/argreduce.cu: NumPy's lexicographic order, a NaN in either part winning, or skipped by
nanmax and nanmin), gathered (:func:`_gather_extreme`), so they return one of x's elements, bit for bit
NumPy's. A ``dtype=`` the kernels do not write is computed in their accumulator and
converted: an integer target from the int64 sum or product modulo its width (NumPy's accumulation in it
wraps the same), a float target narrower than the accumulator rounded once (NumPy accumulates in the target:
cukern's result is the more accurate), a bool target from ``count_nonzero`` (NumPy's "or" and "and"). An
``out`` of another dtype receives the result cast into it, unsafely, as NumPy's and CuPy's reductions cast.
Without ``out`` the result keeps NumPy's K order: its kept axes are laid out as x's
(:func:`~cukern._layout.k_order`; an F-ordered input gives an F-ordered result); the reduced axes keep
their order, so the bits do not change. None of this adds a kernel but the complex products'; the lowered
calls are refused under a CUDA-graph capture (temporaries).

Host path: the first call for a given (op, arguments, shape, strides, dtype, 16-byte alignment, device,
stream, the tuning cache's generation, and ``out``'s shape, strides, dtype, device and item alignment)
validates, plans and prepares its launches; later such calls find them in a
:class:`~cukern._launch.CallCache` and go straight to allocating the result (or checking ``out`` against
``x``) and launching. Tuning knobs: :class:`~cukern.reduce_plan.Knobs`; the tuning cache's winner is used
where there is one (:func:`_tuned_knobs`), looked up by the first call of a key (the knobs follow from the
key and the cache's generation, so a hit looks up nothing).

Accumulation: float32 for float16/bfloat16/float32 results, float64 for float64, int64 for integer results,
complex64 / complex128 for complex products.
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
  an ``out`` that is not C-contiguous, amax or amin with ``dtype=``
  (a conversion), and complex maxima and minima (an index, then a gather).

A refusal is a RuntimeError raised before anything is recorded (the capture stays valid); it names the
reason and the way around it.

Workspaces: per (device, stream), made by the first full or two-pass column reduction on that stream: 96 KiB
of per-block partials, a counter (the last block resets it, so no memset per call) and scratch for the
per-span column partials, grown to the largest need seen (at least doubling). They are never freed, nor are
buffers they outgrow: a graph may replay a captured reduction at any time and cukern cannot see the graph
end. Kernels on one stream run in order, so its calls share its workspace safely; a graph's reductions use
the workspace of the stream they were captured on, so replay it in order with that stream's reductions
(on that stream, or synchronized with it), never concurrently with them.
"""

from __future__ import annotations

import builtins
import math
import threading
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import cukern._check as _check
import cukern._convert as _convert
import cukern._tuned as _tuned

from ._compile import get_kernel
from ._dtypes import BFLOAT16, dtype_name, storage
from ._launch import NULL, SEQUENCE_LOCK, CallCache, Prepared, Signature, launch, on_device, refuse_temporary_in_capture
from ._launch import sm_count, stream_key, struct_argument
from ._launch import cupy as _cupy
from ._layout import k_order
from ._typing import Axis, DeviceArray, DTypeLike
from .argreduce import extreme_index

# The kernel families (cukern.families) read SOURCE and instantiations on the op module, the benchmarks
# bytes_moved.
from .reduce_plan import (  # noqa: F401
    BOOL,
    COMPACT_KERNEL_OPS,
    COMPLEX,
    COUNT_OPS,
    DEFAULT_KNOBS,
    row_knobs,
    FINISH_BITS,
    FINISH_DIVIDE,
    FINISH_EQUALS,
    FINISH_SQRT,
    FLOATS,
    FULL_PARTIALS,
    KERNEL_KINDS,
    LIFT_NONZERO,
    LIFT_NOT_NAN,
    LIFT_SKIP_NAN,
    MINMAX_OPS,
    NUMERIC,
    OP_LSE,
    OP_PROD,
    OP_SUM,
    OP_SUMSQ,
    OP_VAR,
    OPS,
    PUBLIC_INPUTS,
    SOURCE,
    STATE_BYTES,
    U64,
    VAR_OPS,
    Knobs,
    Op,
    Plan,
    acc_dtype,
    bytes_moved,
    check_input,
    cols_geometry,
    complex_instantiation,
    gather_axes,
    instantiations,
    kernel_dtype,
    kernel_op_knobs,
    kernels_answer,
    make_knobs,
    normalize_axis,
    out_cast,
    plan,
    plan_instantiations,
    plan_weighted,
    real_of,
    result_dtype,
    result_shape,
    route,
    temporary,
    two_level,
    weighted_dtype,
    weighted_instantiation,
)

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
    partials: DeviceArray  # cupy uint8[FULL_PARTIALS * STATE_BYTES]: per-block partials of a full reduction
    counter: DeviceArray  # cupy uint32[1], zero between launches
    scratch: DeviceArray  # cupy uint8: per-slice partials of a two-pass column reduction
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
    key = (cp.cuda.runtime.getDevice(), *stream_key(stream))
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
            ws = Workspace(cp.empty(FULL_PARTIALS * STATE_BYTES, dtype=np.uint8), cp.zeros(1, dtype=np.uint32),
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
    """One kernel launch, prepared (:class:`~cukern._launch.Prepared`): the kernel, its launch shape and
    every argument but the output's and the input's addresses, laid out once. ``run(out, x)`` launches
    from address ``x`` into address ``out`` on the current stream; calling it on an array ``x`` allocates
    the result of ``shape`` and ``dtype`` first. Valid for inputs of the shape, strides, dtype, 16-byte
    alignment, device and stream it was prepared for (the cache key)."""

    __slots__ = ("launch", "shape", "dtype")

    def __init__(self, kernel, config, signature: Signature, head, tail, shape, dtype):
        args = signature.convert((0, *head, 0, *tail))  # the two addresses: slots written per call
        self.launch = Prepared(kernel, config, args, (0, 1 + len(head)))
        self.shape, self.dtype = shape, storage(dtype)

    def run(self, out: int, x: int) -> None:
        self.launch(_cupy().cuda.get_current_stream().ptr, out, x)

    def __call__(self, x):
        cp = _cupy()
        out = cp.ndarray(self.shape, self.dtype)
        self.launch(cp.cuda.get_current_stream().ptr, out.data.ptr, x.data.ptr)
        return out


class _TwoPass:
    """The two-pass column reduction, prepared: pass one writes per-span partials into the stream's
    workspace scratch, pass two combines them into the result. Same interface as :class:`_Single`."""

    __slots__ = ("first", "second", "partials", "shape", "dtype")

    def __init__(self, first: _Single, second: _Single, partials: int, shape, dtype):
        self.first, self.second, self.partials = first, second, partials
        self.shape, self.dtype = shape, storage(dtype)

    def run(self, out: int, x: int) -> None:
        with SEQUENCE_LOCK:
            self.first.run(self.partials, x)
            self.second.run(out, self.partials)

    def __call__(self, x):
        out = _cupy().ndarray(self.shape, self.dtype)
        self.run(out.data.ptr, x.data.ptr)
        return out


def _prepare(pl: Plan, x, o, op: Op, divisor: float, shape):
    """The prepared launches of plan ``pl`` (a kernel kind) for arrays like ``x``, producing reductions in
    dtype ``o`` as a C-contiguous result of ``shape``, ``divisor`` dividing mean's sum and var's M2. Takes the
    stream's workspace first, so a capture that cannot have it is refused before a kernel is even loaded."""
    layout, p = pl.layout, pl.kernel
    kind = layout.kind
    ws: Any = workspace(pl.partials) if kind == "full" or pl.fold is not None else None
    kernels = [get_kernel(i) for i in plan_instantiations(pl, x.dtype, o, op.kernel_op)]
    tail = (op.mode, divisor)
    if kind == "full":
        # Element i at x[i * stride] from x's own first element, whatever the stride's sign: the tree
        # numbers elements in x's order, never in memory order.
        (n, stride), = layout.red
        return _Single(kernels[0], p.config, _FULL_SIG, (ws.partials.data.ptr, ws.counter.data.ptr),
                       (n, stride) + tail, shape, o)
    if kind == "rows":
        inner, s0, s1 = two_level(layout.kept)
        return _Single(kernels[0], p.config, _ROWS_SIG, (),
                       (layout.outputs, layout.count, inner, s0, s1, p.tpr) + tail, shape, o)
    if kind == "strided":
        o_inner, o_s0, o_s1 = two_level(layout.kept)
        r_inner, r_s0, r_s1 = two_level(layout.red)
        return _Single(kernels[0], p.config, _STRIDED_SIG, (),
                       (layout.outputs, o_inner, o_s0, o_s1, layout.count, r_inner, r_s0, r_s1) + tail, shape, o)
    outer, s_outer, rows, s_row, cols = cols_geometry(layout)
    geometry = (outer, rows, cols, s_outer, s_row, p.span, p.spans, p.strips, p.vector)
    if pl.fold is None:
        return _Single(kernels[0], p.config, _COLS_SIG, (), geometry + tail, shape, o)
    first = _Single(kernels[0], p.config, _COLS_SIG, (), geometry + (op.lift << FINISH_BITS, 1.0), shape, o)
    second = _Single(kernels[1], pl.fold.config, _FOLD_SIG, (), (outer, cols, p.spans) + tail, shape, o)
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
    if not (axis is None or ta is int or (ta is tuple and builtins.all(type(a) is int for a in axis))):
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
            *stream_key(_cupy().cuda.get_current_stream()))  # a call holds its stream's workspace


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
    return row_knobs(_tuned.lookup(TUNING["sum_rows"], x.data.device_id, x.dtype, (x.size // length, length)),
                     x.dtype)


# ---------------------------------------------------------------------------------------------------------
# Validation and the public ops.


def _validate_out(out, shape, dtype, x):
    """``out`` checked for the result's ``shape``; any dtype, into which the ``dtype`` result is cast as
    NumPy's and CuPy's reductions cast (unsafely: a float result truncated into an integer ``out``; a
    complex result into a real one drops the imaginary part, with NumPy's ComplexWarning)."""
    out = _check.check_out(out, shape, None, x)
    _check.check_dtype(out, "out", NUMERIC)
    if out_cast(dtype, out.dtype) == "ComplexWarning":
        warnings.warn("Casting complex values to real discards the imaginary part", np.exceptions.ComplexWarning,
                      stacklevel=4)
    _check.check_no_overlap(out, "out", x, "x", identical_ok=False)
    return out


def _drop(a, axes):
    """``a`` without its (size-1) ``axes``: a view."""
    return a[tuple(0 if i in axes else slice(None) for i in range(a.ndim))]


def _elementwise(op: Op, x, axes, dst, keepdims: bool, divisor: float) -> None:
    """Every reduced axis (``axes``) has size 1: each output is its one element of ``x``, written into
    ``dst`` (the kept shape, with the size-1 axes where ``keepdims``) in place, with no temporary: converted
    to the result dtype, then squared
    there (sum_of_squares: for one element the same bits as the kernels' square in the accumulator, rounded
    once) or made absolute (norm); var and std: 0 for a finite element (|x * 0|), NaN otherwise, over
    ``divisor`` (0 / 0 is NaN)."""
    cp = _cupy()
    nan_mask = op.lift == LIFT_SKIP_NAN and op.kernel_op == OP_SUM and dst.dtype == BFLOAT16
    if nan_mask:  # before anything is recorded
        refuse_temporary_in_capture(op.name, "a bfloat16 nansum over axes of one element zeroes its NaNs "
                                    "through a mask temporary; reduce outside the graph or in float32")
    x, dst = _drop(x, axes), _drop(dst, axes) if keepdims else dst
    if op.lift == LIFT_NONZERO:
        _convert.nonzero(x, dst)
        return
    if op.lift == LIFT_NOT_NAN:
        cp.equal(x, x, out=dst)
        return
    _convert.copyto(dst, x)
    if op.lift == LIFT_SKIP_NAN and op.kernel_op == OP_SUM:
        if dst.dtype.kind == "f":
            cp.nan_to_num(dst, copy=False, nan=0.0, posinf=np.inf, neginf=-np.inf)
        elif nan_mask:
            cp.copyto(dst, 0, where=cp.isnan(dst))
    if op.kernel_op == OP_VAR:
        cp.multiply(dst, 0, out=dst)
        cp.abs(dst, out=dst)
        cp.true_divide(dst, divisor, out=dst)
        return
    if op.finalize == FINISH_SQRT:
        _convert.absolute(dst)
    elif op.kernel_op == OP_SUMSQ:
        _convert.square(dst)


# What an empty reduction gives, where it is not 0 (sums, counts, any) or NaN (mean, var, std).
_EMPTY = {OP_VAR: np.nan, OP_PROD: 1, OP_LSE: -np.inf}


def _empty_value(op: Op, divisor: float):
    if op.finalize == FINISH_EQUALS:
        return True  # all of nothing
    if op.kernel_op == OP_VAR and divisor > 0:
        return 0.0  # NumPy: the empty M2, 0, over max(n - ddof, 0) = -ddof for a negative ddof
    return _EMPTY.get(op.kernel_op, np.nan if op.finalize == FINISH_DIVIDE else 0)


def _own_knobs(name: str) -> Knobs | None:
    """var, std, prod and logsumexp plan with their own knobs (their kernels exist at that point only);
    None for the ops that use the tuning cache's."""
    k = OPS[name].kernel_op
    return kernel_op_knobs(k) if k in (OP_VAR,) + COMPACT_KERNEL_OPS else None


def _check_ddof(ddof):
    if isinstance(ddof, (bool, np.bool_)) or not isinstance(ddof, (int, float, np.integer, np.floating)):
        raise TypeError(f"ddof must be an int or a float, got {type(ddof).__name__}")
    try:
        finite = math.isfinite(ddof)
    except OverflowError:  # an int past float64
        finite = False
    if not finite:
        raise ValueError(f"ddof must be finite (within float64's range), got {ddof}")


def _reduce(name: str, x, axis, dtype, keepdims: bool, out, knobs: Knobs | None = None, sm: int | None = None,
            ddof=0, *, korder: bool = True):
    """The public ops' body. ``knobs`` picks the tuning (for sweeps); None: the tuning cache's winner for
    this call (:func:`_tuned_knobs`), else :data:`DEFAULT_KNOBS`. ``sm`` plans as if the device had that
    many SMs (tests: the bits must not change); such calls bypass the call cache. ``ddof``: var and std.
    ``korder``: a result without ``out`` keeps NumPy's K order (:func:`_keep_order`); False gives it in C
    order (the inner calls of :func:`_keep_order` and :func:`_lowered`)."""
    cp = _cupy()
    key = None
    nd = cp.ndarray
    if sm is None and type(x) is nd and (out is None or type(out) is nd):
        try:
            key = _fast_key(name, x, axis, dtype, keepdims)
            if key is not None:
                # None knobs follow from the key and the tuning cache's generation: no lookup on a hit
                key += (knobs, _tuned.generation, type(ddof), ddof)
                if out is not None:
                    key += _out_key(out)
            call = _calls.get(key)
        except TypeError:  # unhashable arguments: the general path reports them
            key, call = None, _MISSING
        if call is not _MISSING:
            if out is None:
                return call(x)
            _check.check_no_overlap(out, "out", x, "x", identical_ok=False)
            call.run(out.data.ptr, x.data.ptr)
            return out
    op = OPS[name]
    x = _check.as_array(x, "x")
    check_input(name, x.dtype)
    if op.kernel_op == OP_VAR:
        _check_ddof(ddof)
    keepdims = _check.check_keepdims(keepdims)
    if knobs is None:
        knobs = _own_knobs(name) or _tuned_knobs(x, axis)
    axes = normalize_axis(axis, x.ndim)
    final = result_dtype(name, x.dtype, dtype)
    shape = result_shape(x.shape, axes, keepdims)
    if out is not None:
        out = _validate_out(out, shape, final, x)
    count = math.prod(x.shape[i] for i in axes)
    if count == 0 and op.minmax:
        raise ValueError(f"zero-size array to reduction operation {name} which has no identity")
    perm = k_order(x.shape, x.strides, axes)
    if perm is not None and out is None and korder:
        return _keep_order(lambda v, a: _reduce(name, v, a, dtype, keepdims, None, knobs, sm, ddof, korder=False),
                           x, axes, perm, keepdims)
    if not kernels_answer(name, x.dtype, final) or (out is not None and out.dtype != final):
        return _lowered(name, x, axes, final, keepdims, out, knobs, sm, ddof, count)
    # A result in C order is NumPy's only where K order is C order (or out decides): only such calls are
    # cached, so that the cache never answers a call whose result K order would lay out otherwise.
    if perm is not None and out is None:
        key = None
    o = x.dtype if op.minmax else kernel_dtype(name, x.dtype, final)
    divisor = float(max(count - ddof, 0)) if op.kernel_op == OP_VAR else float(count)
    device = x.data.device_id
    with on_device(device):
        pl = _plan_of(x, axes, o, knobs, sm, name)
        direct = None if out is None else bool(out.flags.c_contiguous)
        why = temporary(pl, converts=storage(o) != final, out_direct=direct)
        refuse_temporary_in_capture(name, why)
        if op.kernel_op == OP_VAR:
            if divisor <= 0:
                warnings.warn("Degrees of freedom <= 0 for slice", RuntimeWarning, stacklevel=3)
        elif count == 0 and op.finalize == FINISH_DIVIDE:
            warnings.warn("Mean of empty slice.", RuntimeWarning, stacklevel=3)
        kind = pl.layout.kind
        if kind not in KERNEL_KINDS:
            dst = cp.empty(shape, final) if out is None else out
            if kind == "fill":
                dst.fill(_empty_value(op, divisor))
            elif kind == "none":
                _elementwise(op, x, axes, dst, keepdims, divisor)
            return dst
        if why is None:
            call = _prepare(pl, x, o, op, divisor, shape)
            if key is not None:
                _calls.put(key, call)
            if out is None:
                return call(x)
            call.run(out.data.ptr, x.data.ptr)
            return out
        if pl.copy:
            order = [i for i in range(x.ndim) if i not in axes] + list(axes)
            x = cp.ascontiguousarray(x.transpose(order))
        kept = result_shape(shape, axes, False) if keepdims else shape
        result = cp.empty(kept, storage(o))
        _prepare(pl, x, o, op, divisor, kept).run(result.data.ptr, x.data.ptr)
        result = result.reshape(shape)
        if out is None:
            return result if result.dtype == final else _convert.astype(result, final)
        _convert.copyto(out, result)
        return out


def _keep_order(reduce_c, x, axes, perm, keepdims: bool):
    """NumPy's K order: ``reduce_c(view, axes)`` (a reduction giving a C-contiguous result, or a pair of them) of x
    with its kept axes in memory order (``perm``, from :func:`~cukern._layout.k_order`; the reduced axes keep
    their order, so every result's tree and bits are unchanged), transposed back: an F-ordered input gives an
    F-ordered result, as NumPy's."""
    nd, nk = x.ndim, x.ndim - len(axes)
    r = reduce_c(x.transpose(perm), tuple(range(nk, nd)))
    if keepdims:
        back = [perm.index(a) for a in range(nd)]
    else:
        kept = perm[:nk]
        back = [kept.index(a) for a in sorted(kept)]
    if isinstance(r, tuple):  # logsumexp's (result, sign)
        return tuple(v.transpose(back) for v in r)
    return r.transpose(back)


_SIGN = np.uint64(1 << 63)


def _gather_extreme(name: str, x, axes, keepdims: bool, count: int):
    """amax, amin, nanmax or nanmin of complex ``x``: the element at the index the arg-reduction kernels
    find. The reduced axes are merged into one last axis in the order NumPy's reduction visits them
    (:func:`~cukern.reduce_plan.gather_axes`; a view where they merge, else a copy), so that "the first
    of equal elements" is NumPy's first: elements that compare equal may differ in their bits (a -0.0 part,
    the NaN NumPy returns), and NumPy's max keeps the first it meets. The index is exact and the gather
    copies bits, so the result is one of x's elements whatever the launch."""
    cp = _cupy()
    kept = [a for a in range(x.ndim) if a not in axes]
    shape = tuple(x.shape[a] for a in kept)
    merged = x.transpose(kept + list(gather_axes(x.shape, x.strides, axes))).reshape(shape + (count,))
    op = {"amax": "argmax", "amin": "argmin"}.get(name, name)
    at = extreme_index(op, merged, merged.ndim - 1)
    r = cp.take_along_axis(merged, at[..., None], axis=-1)
    return r.reshape(result_shape(x.shape, axes, keepdims))


def _lowered(name: str, x, axes, final, keepdims: bool, out, knobs, sm, ddof, count: int):
    """The calls the kernels do not answer directly (:func:`~cukern.reduce_plan.route`): inputs of other
    dtypes than the kernels' (lowered on the device first: one more pass, but for uint64 sums and products,
    which are a view), ``dtype=`` targets the kernels do not write (the result computed in the kernels'
    dtype, then converted), and ``out`` of another dtype than the result's (cast into it, as NumPy). Each
    result is still one tree of the kernels, so its bits depend only on the values, n and the dtypes.
    Everything was validated by the caller; a CUDA-graph capture is refused (temporaries)."""
    cp = _cupy()
    rt = route(name, x.dtype, final)
    if cp.cuda.get_current_stream().is_capturing():
        raise RuntimeError(
            f"{name} of {dtype_name(x.dtype)} into {dtype_name(final)}"
            f"{'' if out is None else ' (out ' + dtype_name(out.dtype) + ')'} cannot be captured in a CUDA graph: "
            "it goes through temporaries; convert x (or the result) outside the graph")
    with on_device(x.data.device_id):
        if rt.how == "gather":
            r = _gather_extreme(name, x, axes, keepdims, count)
        else:
            inner_axes = axes
            if rt.how == "complex":
                part = real_of(x.dtype)
                src = x
                if name == "nansum":  # NumPy's nansum zeroes a complex element with a NaN in either part
                    src = cp.where(cp.isnan(x), cp.zeros((), x.dtype), x)
                xl = cp.ndarray(x.shape + (2,), part, memptr=src.data, strides=src.strides + (part.itemsize,))
                if name == "norm":
                    inner_axes = axes + (x.ndim,)
            elif rt.how == "cast" and x.dtype in COMPLEX and rt.via == BOOL:  # a count: x != 0, either part
                xl = cp.empty(x.shape, BOOL)
                _convert.nonzero(x, xl)
            elif rt.how == "cast":
                xl = _convert.astype(x, rt.via)
                if name == "nansum" and rt.via.kind in "iu" and (x.dtype.kind == "f" or x.dtype == BFLOAT16):
                    # NumPy's nansum into an integer dtype: each NaN is 0 in x's dtype, then converted. Zero
                    # them by x's own mask, whatever the conversion made of a NaN (one more pass; this case only).
                    cp.copyto(xl, 0, where=cp.isnan(x))
            elif rt.how == "view":
                xl = x.view(rt.via)
            elif rt.how == "flip":
                xl = cp.bitwise_xor(x, _SIGN).view(rt.via)
            else:
                xl = x
            if count == 1 and rt.how in ("direct", "cast", "view") and rt.op == name and not rt.mean_int:
                # Every reduced axis has size 1: each result is its element, converted once into the result
                # dtype, as where the kernels answer (through their dtype it would round twice: float64 ->
                # float32 -> float16).
                if name in VAR_OPS and ddof >= 1:
                    warnings.warn("Degrees of freedom <= 0 for slice", RuntimeWarning, stacklevel=4)
                r = cp.empty(result_shape(x.shape, axes, keepdims), final)
                _elementwise(OPS[name], xl, axes, r, keepdims, float(max(1 - ddof, 0)))
            elif rt.op == "count_nonzero" and name != "count_nonzero":
                c = _reduce("count_nonzero", xl, inner_axes, None, keepdims, None, knobs, sm, korder=False)
                if name == "nansum" and xl.dtype in FLOATS:  # NumPy's nansum zeroes the NaNs, which count here
                    c = c - (count - _reduce("count_not_nan", xl, inner_axes, None, keepdims, None, knobs, sm,
                                             korder=False).astype(np.int64))
                r = cp.equal(c, count) if name == "prod" else cp.greater(c, 0)
                if name == "mean" and count == 0:
                    warnings.warn("Mean of empty slice.", RuntimeWarning, stacklevel=3)
                    r.fill(True)  # NumPy: the empty "or" (False) divided by 0 is NaN, which is True
            else:
                inner_dtype = None if rt.op in COUNT_OPS else rt.kernel
                # complex var with ddof >= n: NumPy's (M2_re + M2_im) / 0, inf unless both are 0, so the parts'
                # M2 (over a divisor of 1), added, then divided by 0
                no_freedom = rt.how == "complex" and name in VAR_OPS and 0 < count <= ddof
                if no_freedom:
                    warnings.warn("Degrees of freedom <= 0 for slice", RuntimeWarning, stacklevel=4)
                r = _reduce(rt.op, xl, inner_axes, inner_dtype, keepdims, None, knobs, sm,
                            count - 1 if no_freedom else ddof, korder=False)
                if rt.how == "complex" and name in VAR_OPS:
                    r = _convert.astype(r, np.float64)
                    r = r[..., 0] + r[..., 1]  # var(z) = var(z.real) + var(z.imag)
                    if no_freedom:
                        r = r / 0.0
                    if name == "std":
                        r = cp.sqrt(r)
                elif rt.how == "complex" and name != "norm":
                    r = cp.ndarray(r.shape[:-1], np.result_type(r.dtype, np.complex64), memptr=r.data)
                elif rt.how == "complex" and keepdims:  # the norm reduced the parts' axis too: not one of x's
                    r = r.reshape(r.shape[:-1])
                elif rt.how == "flip":
                    r = cp.bitwise_xor(r.view(U64), _SIGN)
                elif name in MINMAX_OPS:
                    r = _convert.astype(r, x.dtype)
                if rt.mean_int:
                    if count == 0:
                        warnings.warn("Mean of empty slice.", RuntimeWarning, stacklevel=3)
                    r = _convert.astype(_convert.astype(r, final).astype(np.float64) / count, final)
        if r.dtype != final:
            r = _convert.astype(r, final)
        if out is None:
            return r
        _convert.copyto(out, r)
        return out


def _plan_of(x, axes, o, knobs: Knobs, sm: int | None = None, name: str = "sum") -> Plan:
    return _plan_cached(x.shape, x.dtype, axes, tuple(s // x.itemsize for s in x.strides), x.data.ptr % 16, o,
                        sm_count(x.data.device_id) if sm is None else sm, knobs, name)


_plans = CallCache(1024)


def _plan_cached(shape, dtype, axes, strides, ptr_mod16, out_dtype, sm, knobs=DEFAULT_KNOBS, name="sum") -> Plan:
    """:func:`~cukern.reduce_plan.plan`, memoized: host time per call matters at mid sizes, where the kernel
    takes microseconds."""
    key = (shape, dtype, axes, strides, ptr_mod16, out_dtype, sm, knobs, name)
    pl = _plans.get(key)
    if pl is _MISSING:
        pl = _plans.put(key, plan(shape, dtype, axes, strides=strides, ptr=ptr_mod16, op=name, out_dtype=out_dtype,
                                  sm_count=sm, knobs=knobs))
    return pl


def sum(  # noqa: A001 - mirrors numpy.sum
        x: DeviceArray, axis: Axis = None, *, dtype: DTypeLike | None = None, keepdims: bool = False,
        out: DeviceArray | None = None,
) -> DeviceArray:
    """Sum of elements over ``axis``: ``sum_i x[i]``.

    Parameters
    ----------
    x : cupy.ndarray of any numeric dtype or bool (float32, float64, float16, bfloat16, int8 to int64,
        uint8 to uint64, complex64, complex128); any strides. Narrower integers, uint32 and uint64 are
        lowered on the device first (module notes: one more pass, none for uint64), complex as the sums
        of the real and imaginary parts.
    axis : None, int or tuple of ints. None reduces everything.
    dtype : result dtype, any NumPy takes. Default as NumPy: bool and signed integers give int64, unsigned
        ones uint64, floats and complex types keep theirs. Half types always accumulate in float32, float32
        in float32, float64 in float64, integers in int64 (an integer target takes that modulo its width, a
        bool target is NumPy's "or").
    keepdims : keep reduced axes as size 1.
    out : cupy.ndarray with the result's shape, optional, not overlapping ``x``; another dtype receives
        the result cast into it (as NumPy). Written by the kernel directly when C-contiguous and of the
        result's dtype, else through a temporary. The module notes say which calls a CUDA graph can
        capture. Without it, the result keeps NumPy's K order.

    Reproducible: the bits depend only on the values, the reduced length, the dtypes and the op (one fixed
    tree per reduced length; the module notes), as :func:`cukern.reference.sum_emulated` computes them.

    Examples
    --------
    >>> import cupy as cp
    >>> import cukern
    >>> x = cp.arange(6, dtype=cp.float32).reshape(2, 3)
    >>> print(cukern.sum(x), cukern.sum(x, axis=1))
    15.0 [ 3. 12.]
    >>> print(cukern.sum(cp.ones(4, dtype=cp.int8)).dtype)
    int64
    """
    return _reduce("sum", x, axis, dtype, keepdims, out)


def mean(x: DeviceArray, axis: Axis = None, *, dtype: DTypeLike | None = None, keepdims: bool = False,
         out: DeviceArray | None = None) -> DeviceArray:
    """Arithmetic mean over ``axis``: ``sum(x) / count``, accumulated as :func:`sum`; integer and bool
    inputs give float64, complex inputs their dtype (the means of the two parts). An empty reduction gives
    NaN with NumPy's RuntimeWarning "Mean of empty slice.". ``dtype`` as NumPy: an integer target is the
    sum in that type divided in float64 and truncated into it; other inputs and ``out`` as :func:`sum`.

    Examples
    --------
    >>> import cupy as cp
    >>> import cukern
    >>> m = cukern.mean(cp.array([[1, 2], [3, 5]], dtype=cp.int32), axis=1)
    >>> print(m.dtype, m)
    float64 [1.5 4. ]
    """
    return _reduce("mean", x, axis, dtype, keepdims, out)


def sum_of_squares(x: DeviceArray, axis: Axis = None, *, dtype: DTypeLike | None = None, keepdims: bool = False,
                   out: DeviceArray | None = None) -> DeviceArray:
    """``sum_i x[i]**2`` over ``axis``, squares formed in the accumulator type (so float16 squares do not
    overflow and integer squares are taken in int64). Result dtypes as :func:`sum` (no complex input:
    NumPy's ``sum(x * x)`` of complex x is not a sum of squared magnitudes).

    Examples
    --------
    >>> import cupy as cp
    >>> import cukern
    >>> print(cukern.sum_of_squares(cp.array([3.0, 4.0], dtype=cp.float16)))
    25.0
    """
    return _reduce("sum_of_squares", x, axis, dtype, keepdims, out)


def norm(x: DeviceArray, axis: Axis = None, *, dtype: DTypeLike | None = None, keepdims: bool = False,
         out: DeviceArray | None = None) -> DeviceArray:
    """L2 norm over ``axis``: ``sqrt(sum_i |x[i]|**2)``; integer and bool inputs give float64, floats keep
    their dtype, complex64 / complex128 give float32 / float64 (one tree over the real and imaginary parts,
    element by element). (Unlike ``numpy.linalg.norm``, any ``axis`` tuple means the 2-norm of the flattened
    axes.)

    Examples
    --------
    >>> import cupy as cp
    >>> import cukern
    >>> print(cukern.norm(cp.array([[3.0, 4.0], [5.0, 12.0]], dtype=cp.float32), axis=1))
    [ 5. 13.]
    """
    return _reduce("norm", x, axis, dtype, keepdims, out)


def amax(x: DeviceArray, axis: Axis = None, *, dtype: DTypeLike | None = None, keepdims: bool = False,
         out: DeviceArray | None = None) -> DeviceArray:
    """Maximum over ``axis``; NaN propagates (any NaN gives NaN), as ``numpy.amax``; x's dtype (any real
    one, bool included: narrower integers and bool are converted to int32 first, uint32 to int64, uint64
    has its sign bit flipped; one more pass). Complex64 / complex128: NumPy's lexicographic order (real
    parts, then imaginary parts), the first NaN (either part) winning, the first of equal elements (in
    NumPy's order of visiting them) kept: the element at the arg-reduction kernels' index, gathered (module
    notes), bit for bit NumPy's. Raises ValueError on a zero-size reduction. ``dtype`` converts the
    result.

    Examples
    --------
    >>> import cupy as cp
    >>> import cukern
    >>> x = cp.array([[1, 7], [9, -2]], dtype=cp.int8)
    >>> print(cukern.amax(x), cukern.amax(x, axis=0))
    9 [9 7]
    >>> print(cukern.amax(cp.array([1.0, cp.nan])))
    nan
    """
    return _reduce("amax", x, axis, dtype, keepdims, out)


def amin(x: DeviceArray, axis: Axis = None, *, dtype: DTypeLike | None = None, keepdims: bool = False,
         out: DeviceArray | None = None) -> DeviceArray:
    """Minimum over ``axis``; NaN propagates, as ``numpy.amin``; dtypes (complex too) as :func:`amax`.
    Raises ValueError on a zero-size reduction. ``dtype`` converts the result.

    Examples
    --------
    >>> import cupy as cp
    >>> import cukern
    >>> print(cukern.amin(cp.array([[1.0, 5.0], [-2.0, 0.0]]), axis=1, keepdims=True))
    [[ 1.]
     [-2.]]
    """
    return _reduce("amin", x, axis, dtype, keepdims, out)


def var(x: DeviceArray, axis: Axis = None, *, dtype: DTypeLike | None = None, ddof: int = 0, keepdims: bool = False,
        out: DeviceArray | None = None) -> DeviceArray:
    """Variance over ``axis``: ``sum_i (x[i] - mean)**2 / (n - ddof)``, in one pass.

    The result dtype is x's for floating x, float64 for integer and bool x (as ``numpy.var``); ``dtype`` may
    be any float type, x converted to it first (one more pass), as NumPy computes in it: float64
    accumulates in float64, the half types in float32. ``ddof`` (an int or a
    float): ``n - ddof <= 0`` gives inf or NaN with NumPy's RuntimeWarning; an empty slice gives NaN; an
    infinity or a NaN in a slice gives NaN. Each slice's values are shifted by its first element and merged
    as (count, mean, M2) along the one tree (module notes), so an offset far above the spread costs no
    accuracy; the bits depend only on the values, n, ``ddof`` and the dtypes, as
    :func:`cukern.reference.var_emulated` computes them. ``axis``, ``keepdims`` and ``out`` as :func:`sum`.
    Complex x: the real and imaginary parts' variances (each its own tree, as above), added in float64 and
    rounded to the real result dtype (float32 for complex64, float64 for complex128), as ``numpy.var``'s
    mean of ``|x - mean|**2``. A complex ``dtype=`` (any x) is the variance in its parts' type, widened to it
    (NumPy's has a zero imaginary part); a float one is refused for complex x (NumPy's drops the imaginary
    parts of the mean).

    Examples
    --------
    >>> import cupy as cp
    >>> import cukern
    >>> x = cp.array([1.0, 2.0, 3.0, 4.0], dtype=cp.float32)
    >>> print(cukern.var(x), cukern.var(x, ddof=1))
    1.25 1.6666666
    """
    return _reduce("var", x, axis, dtype, keepdims, out, ddof=ddof)


def std(x: DeviceArray, axis: Axis = None, *, dtype: DTypeLike | None = None, ddof: int = 0, keepdims: bool = False,
        out: DeviceArray | None = None) -> DeviceArray:
    """Standard deviation over ``axis``: ``sqrt(var(x, axis, ddof=ddof))``, the square root taken once in
    float64 and rounded to the result dtype (x's for floating x, float64 for integer and bool x; complex x:
    of the parts' variances added in float64). Everything else as :func:`var`
    (:func:`cukern.reference.std_emulated` gives its bits).

    Examples
    --------
    >>> import cupy as cp
    >>> import cukern
    >>> print(cukern.std(cp.array([2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0])))
    2.0
    """
    return _reduce("std", x, axis, dtype, keepdims, out, ddof=ddof)


# ---------------------------------------------------------------------------------------------------------
# NaN-aware reductions, counts and truth tests: the sum, max and min kernels with a lift mode
# (reduce_plan.LIFT_*), no kernel of their own.


def _refuse_capture(name: str, why: str) -> None:
    if _cupy().cuda.get_current_stream().is_capturing():
        raise RuntimeError(f"{name} cannot be captured in a CUDA graph: {why}")


def _result_of(x, axis, keepdims: bool, dtype, out):
    """(x as a checked array, the result shape, ``out`` checked against it and ``dtype``) before any launch."""
    x = _check.as_array(x, "x")
    shape = result_shape(x.shape, normalize_axis(axis, x.ndim), _check.check_keepdims(keepdims))
    if out is not None:
        out = _validate_out(out, shape, np.dtype(dtype), x)
    return x, shape, out


def nansum(x: DeviceArray, axis: Axis = None, *, dtype: DTypeLike | None = None, keepdims: bool = False,
           out: DeviceArray | None = None) -> DeviceArray:
    """Sum over ``axis`` treating NaN as 0: ``sum_i (0 if isnan(x[i]) else x[i])``.

    Result dtype, accumulation, ``axis``, ``keepdims`` and ``out`` as :func:`sum` (an all-NaN or empty slice
    gives 0, as ``numpy.nansum``). Each NaN becomes the sum's identity before the one tree, so the bits are
    :func:`cukern.reference.nansum_emulated`'s, reproducible as :func:`sum`'s. Complex x: an element with a
    NaN in either part is 0 (one more pass, zeroing them), as NumPy's. ``dtype=bool``: whether any non-NaN
    element is non-zero (NumPy's "or" after zeroing the NaNs: counts of the non-zero and of the non-NaN
    elements).

    Examples
    --------
    >>> import cupy as cp
    >>> import cukern
    >>> print(cukern.nansum(cp.array([1.5, cp.nan, 2.0], dtype=cp.float32)))
    3.5
    """
    return _reduce("nansum", x, axis, dtype, keepdims, out)


def _nan_minmax(name: str, x, axis, dtype, keepdims, out):
    # A slice whose result is the identity (-inf for max) or NaN may be all NaN: only then count its non-NaN
    # values, one more pass, and make those slices NaN with NumPy's warning.
    x = _check.as_array(x, "x")
    check_input(name, x.dtype)
    _refuse_capture(name, "it checks its result for all-NaN slices on the host; use amax / amin, or nanmax outside")
    r = _reduce(name, x, axis, dtype, keepdims, out)
    with on_device(x.data.device_id):  # the check's CuPy steps on x's device, whichever is current
        cp = _cupy()
        if x.dtype in COMPLEX:
            # The gathered element of an all-NaN slice is its first NaN, as NumPy's; NumPy warns on any NaN result.
            if bool(cp.any(cp.isnan(r))):
                warnings.warn("All-NaN slice encountered", RuntimeWarning, stacklevel=3)
            return r
        if (r.dtype not in FLOATS and r.dtype not in COMPLEX) or x.dtype not in FLOATS:
            return r  # a result that cannot hold a NaN (an integer dtype= or out)
        identity = -np.inf if name == "nanmax" else np.inf
        if bool(cp.any((r == identity) | cp.isnan(r))):
            empty = _reduce("count_not_nan", x, axis, None, keepdims, None) == 0
            if bool(cp.any(empty)):
                cp.copyto(r, np.nan, where=empty)
                warnings.warn("All-NaN slice encountered", RuntimeWarning, stacklevel=3)
        return r


def nanmax(x: DeviceArray, axis: Axis = None, *, dtype: DTypeLike | None = None, keepdims: bool = False,
           out: DeviceArray | None = None) -> DeviceArray:
    """Maximum over ``axis`` ignoring NaN: ``max_i x[i]`` over the non-NaN ``x[i]``; x's dtype.

    An all-NaN slice gives NaN with NumPy's RuntimeWarning "All-NaN slice encountered" (found by a count of
    the non-NaN values, a second pass made only when some result is -inf or NaN, after a synchronization;
    so a CUDA-graph capture is refused); a zero-size reduction raises ValueError. Integer inputs are
    :func:`amax`. Complex inputs as :func:`amax`'s but NaNs skipped (NumPy's ``fmax`` order): an all-NaN
    slice gives its first element, with the warning. Bits: :func:`cukern.reference.nanmax_emulated`.
    ``dtype`` converts the result.

    Examples
    --------
    >>> import cupy as cp
    >>> import cukern
    >>> print(cukern.nanmax(cp.array([cp.nan, 1.0, 3.0])))
    3.0
    """
    return _nan_minmax("nanmax", x, axis, dtype, keepdims, out)


def nanmin(x: DeviceArray, axis: Axis = None, *, dtype: DTypeLike | None = None, keepdims: bool = False,
           out: DeviceArray | None = None) -> DeviceArray:
    """Minimum over ``axis`` ignoring NaN; everything else as :func:`nanmax` (+inf in place of -inf).

    Examples
    --------
    >>> import cupy as cp
    >>> import cukern
    >>> print(cukern.nanmin(cp.array([cp.nan, 1.0, -2.0])))
    -2.0
    """
    return _nan_minmax("nanmin", x, axis, dtype, keepdims, out)


def nanmean(x: DeviceArray, axis: Axis = None, *, dtype: DTypeLike | None = None, keepdims: bool = False,
            out: DeviceArray | None = None) -> DeviceArray:
    """Mean over ``axis`` ignoring NaN: ``nansum(x) / count(not isnan(x))``; x's dtype for floats, float64
    for integer and bool x (which are :func:`mean`).

    Two passes: the NaN-skipping sum in the accumulator dtype (float32 for float32 and half types, float64
    for float64 or ``dtype=float64``) and the count of non-NaN values (float64, exact), divided in float64
    and rounded to the result dtype (through float32 for half types), as
    :func:`cukern.reference.nanmean_emulated` computes. An all-NaN or empty slice gives NaN with NumPy's
    RuntimeWarning "Mean of empty slice." (a host check after a synchronization; a CUDA-graph capture is
    refused). ``dtype``: as :func:`mean`. Complex x: each part of the sum (NaN elements, either part, zeroed)
    divided in float64 by the count of elements with no NaN part, rounded to the part's dtype.

    Examples
    --------
    >>> import cupy as cp
    >>> import cukern
    >>> print(cukern.nanmean(cp.array([[1.0, cp.nan, 2.0], [4.0, 4.0, cp.nan]]), axis=1))
    [1.5 4. ]
    """
    return _nanmean(x, axis, dtype, keepdims, out)


def _nanmean(x, axis, dtype, keepdims: bool, out, korder: bool = True):
    """nanmean's body; ``korder`` as :func:`_reduce`'s."""
    cp = _cupy()
    x = _check.as_array(x, "x")
    check_input("nanmean", x.dtype)
    if x.dtype.kind in "biu":
        return _reduce("mean", x, axis, dtype, keepdims, out)
    final = result_dtype("mean", x.dtype, dtype)
    if final not in FLOATS + COMPLEX:
        raise TypeError(f"dtype={dtype_name(final)} is not supported for nanmean; use one of float32, float64, "
                        "float16, bfloat16, complex64, complex128")
    x, _, out = _result_of(x, axis, keepdims, final, out)
    if final in COMPLEX and x.dtype not in COMPLEX:  # a real mean, widened: NumPy's values
        r = _nanmean(x, axis, real_of(final), keepdims, None, korder)
        if out is None:
            return _convert.astype(r, final)
        _convert.copyto(out, r)
        return out
    _refuse_capture("nanmean", "it checks for all-NaN slices on the host; use mean, or nanmean outside")
    axes = normalize_axis(axis, x.ndim)
    perm = k_order(x.shape, x.strides, axes) if out is None and korder else None
    if perm is not None:  # the quotient below is an element-wise CuPy result, in C order: divide in x's order
        return _keep_order(lambda v, a: _nanmean(v, a, dtype, keepdims, None, korder=False), x, axes, perm,
                           keepdims)
    with on_device(x.data.device_id):  # the quotient's CuPy steps and arrays on x's device, whichever is current
        acc = acc_dtype(final)
        total = _reduce("nansum", x, axis, acc, keepdims, None)
        if x.dtype in COMPLEX:
            # Each part of the sum over the count of elements with no NaN part, in float64, rounded to the part's
            # dtype: NumPy's complex quotient by a real count, which divides each part.
            count = _reduce("count_nonzero", cp.logical_not(cp.isnan(x)), axis, None, keepdims, None)
            part = real_of(final)
            sums = cp.ndarray(total.shape + (2,), part, memptr=total.data, strides=total.strides + (part.itemsize,))
            q = cp.empty(total.shape, final)
            parts = cp.ndarray(q.shape + (2,), part, memptr=q.data, strides=q.strides + (part.itemsize,))
            _convert.copyto(parts, _convert.astype(sums, np.float64) / count[..., None].astype(np.float64))
        else:
            count = _reduce("count_not_nan", x, axis, None, keepdims, None)
            q = _convert.astype(total, np.float64) / count
        if final.itemsize == 2:
            q = _convert.astype(q, np.float32)  # as the mean kernels round a double result: to float, then to half
        if bool(cp.any(count == 0)):
            warnings.warn("Mean of empty slice.", RuntimeWarning, stacklevel=3)
        if out is None:
            return _convert.astype(q, final)
        _convert.copyto(out, q)
        return out


def count_nonzero(x: DeviceArray, axis: Axis = None, *, keepdims: bool = False) -> DeviceArray:
    """Number of non-zero elements over ``axis``: ``sum_i (x[i] != 0)`` (a NaN counts, -0.0 does not); an
    int64 array (0-d for ``axis=None``), as ``numpy.count_nonzero``: the 1s add in float64 (exact below 2^53)
    with the sum kernels, which store the count as int64 themselves. A complex element is non-zero where
    either part is (x != 0 first, one more pass).

    Examples
    --------
    >>> import cupy as cp
    >>> import cukern
    >>> x = cp.array([[0.0, -0.0, cp.nan], [1.0, 2.0, 0.0]])
    >>> print(cukern.count_nonzero(x), cukern.count_nonzero(x, axis=1))
    3 [1 2]
    """
    return _reduce("count_nonzero", x, axis, None, keepdims, None)


def any(  # noqa: A001 - mirrors numpy.any
        x: DeviceArray, axis: Axis = None, *, keepdims: bool = False, out: DeviceArray | None = None,
) -> DeviceArray:
    """Whether any element over ``axis`` is non-zero (a NaN is); bool: the count of non-zero elements, as
    :func:`count_nonzero` forms it, stored as ``count != 0`` by the kernel itself. An empty slice gives False.
    ``out``: an array of the result's shape (another dtype receives the result cast into it).

    Examples
    --------
    >>> import cupy as cp
    >>> import cukern
    >>> print(cukern.any(cp.array([[0, 0], [0, 3]]), axis=1))
    [False  True]
    """
    return _reduce("any", x, axis, None, keepdims, out)


def all(  # noqa: A001 - mirrors numpy.all
        x: DeviceArray, axis: Axis = None, *, keepdims: bool = False, out: DeviceArray | None = None,
) -> DeviceArray:
    """Whether every element over ``axis`` is non-zero: the count of non-zero elements stored as
    ``count == n`` (n the slice's length) by the kernel itself; bool. An empty slice gives True. ``out`` as
    :func:`any`.

    Examples
    --------
    >>> import cupy as cp
    >>> import cukern
    >>> print(cukern.all(cp.array([[1, 2], [0, 3]]), axis=1))
    [ True False]
    """
    return _reduce("all", x, axis, None, keepdims, out)


# ---------------------------------------------------------------------------------------------------------
# prod and logsumexp: kernels of their own at one tuning point (reduce_plan.COMPACT_KNOBS).


def prod(x: DeviceArray, axis: Axis = None, *, dtype: DTypeLike | None = None, keepdims: bool = False,
         out: DeviceArray | None = None) -> DeviceArray:
    """Product over ``axis``: ``prod_i x[i]``.

    NumPy's result dtypes: floats keep theirs (half types multiply in float32, float32 in float32, float64 in
    float64, each step correctly rounded), complex64 and complex128 theirs, bool and signed integer inputs give
    int64, unsigned ones uint64, wrapping as NumPy's do; ``dtype`` may name any type NumPy takes (x converted
    to a float or complex target first, as NumPy multiplies in it; an integer target is the int64 product
    modulo its width; bool is NumPy's "and"; a complex x takes complex targets only). An empty slice gives 1
    (1+0j). One fixed tree per reduced length: the bits are :func:`cukern.reference.prod_emulated`'s. Column
    layouts use the strided kernel.

    Complex products use NumPy's formula, ``(a.real*b.real - a.imag*b.imag) + (a.real*b.imag +
    a.imag*b.real)j``, each product, difference and sum correctly rounded (none fused), so finite values
    agree with ``numpy.prod`` to rounding. Infinities and NaNs propagate as that formula propagates them (no
    C99 Annex G recovery, in NumPy neither), but the product's order is cukern's tree, not NumPy's left to
    right, and a factor of exactly 1+0j (the tree's identity) leaves the other factor as it is where the
    formula would not (``(inf+infj) * (1+0j)`` is inf+infj here, nan+nanj in NumPy): products holding an
    infinity or a NaN may therefore differ from NumPy's in which parts are NaN or infinite.

    Examples
    --------
    >>> import cupy as cp
    >>> import cukern
    >>> print(cukern.prod(cp.array([1.5, 2.0, -4.0], dtype=cp.float32)))
    -12.0
    >>> print(cukern.prod(cp.array([[1, 2], [3, 4]], dtype=cp.int8), axis=1))
    [ 2 12]
    """
    return _reduce("prod", x, axis, dtype, keepdims, out)


def logsumexp(x: DeviceArray, axis: Axis = None, *, b: DeviceArray | None = None, keepdims: bool = False,
              return_sign: bool = False,
              out: DeviceArray | None = None) -> DeviceArray | tuple[DeviceArray, DeviceArray]:
    """``log(sum_i b[i] * exp(x[i]))`` over ``axis``, as ``scipy.special.logsumexp``, in one pass.

    Parameters
    ----------
    x : cupy.ndarray of a float type, an integer type, bool, complex64 or complex128; any strides.
    axis : None, int or tuple of ints. None reduces everything.
    b : cupy.ndarray of a float, integer, bool or complex type, optional
        Weights broadcast against x (the reduction runs over the broadcast shape). An element of zero weight
        is dropped, whatever x holds there; negative weights subtract, complex ones turn the term.
    keepdims : keep reduced axes as size 1.
    return_sign : bool
        Return ``(log|s|, sign(s))``, s the weighted sum; without it a negative real s gives NaN (a complex
        result is the logarithm of any s).
    out : cupy.ndarray with the result's shape, optional, not overlapping x or b; receives ``log|s|`` (the
        complex logarithm for a complex result without ``return_sign``).

    Returns
    -------
    res : cupy.ndarray
        x's dtype for floats (half types accumulate in float32), float64 for integer and bool x (converted
        first); with ``b`` SciPy's promotion of the two (integer and bool results float64). Complex x (or
        ``b``) gives complex64 or complex128: the principal logarithm, its imaginary part in (-pi, pi]; with
        ``return_sign``, ``log|s|`` in the parts' dtype (float32, float64).
    sgn : cupy.ndarray, with ``return_sign`` only
        The sign of s in res's dtype: 1, -1, 0 for a zero sum (res -inf), NaN where res is NaN; -1 for an
        empty slice, as SciPy's. Complex results: ``s / |s|`` (complex, 0 for a zero sum, -1 + 0j for an empty
        slice).

    Notes
    -----
    Without ``b`` the tree carries (m, s), the running maximum and the sum of ``exp(x - m)``: each chain of 8
    elements forms its own (its maximum, then one exp an element), and the chains merge by a fixed,
    commutative sequence of correctly rounded steps; exp and log are cukern's own routines of such steps
    (a few ulps), so the bits depend only on the values and the reduced length, as
    :func:`cukern.reference.logsumexp_emulated` computes them. A slice of -inf (or an empty slice) gives
    -inf, any +inf +inf, any NaN NaN.

    With ``b``, x and b are converted to the result dtype and reduced together (reduce.cu
    ``reduce_lse_weighted``, a warp an output, b read through its own strides: a broadcast b is never
    made whole, but for layouts of more than two kept or two reduced levels, copied first): m is the maximum
    of the elements of non-zero weight, s the signed sum of ``b * exp(x - m)`` along the same tree, merged
    as above; the result is ``m + log|s|``, its bits :func:`cukern.reference.logsumexp_weighted_emulated`'s.
    s == 0 (a cancelled sum, all-zero weights, or -inf at every weighted element) gives -inf with sign 0; a
    +inf element gives +inf with the sign of the weights at +inf (NaN if they cancel); a NaN in x at a
    non-zero weight, or in b, gives NaN. Where every weighted element is -inf and some weight is zero at a
    +inf or NaN x, SciPy's fallback sum reads the dropped element and returns NaN; cukern keeps it
    dropped (-inf).

    Complex x or ``b`` (``reduce_lse_complex``, SciPy 1.15-1.17's semantics): m is the maximum of the real
    parts of the elements of non-zero weight, s the complex sum of ``b * exp(x - m)`` along the same tree,
    each term's ``exp(x_re - m) * (cos x_im, sin x_im)`` by cukern's own exp, cos and sin (an exact argument
    reduction for every finite ``x_im``), and the result ``m + log|s| + i atan2(s_im, s_re)`` with cukern's own
    log and atan2 (-pi given as +pi); its bits are :func:`cukern.reference.logsumexp_complex_emulated`'s. An
    element of real part -inf adds 0, one of +inf makes the result +inf with the phase of those elements'
    terms (NaN if they cancel), a NaN in either part NaN; a complex x is converted from real weights, real x
    from complex ones. Without ``b`` and ``out`` the result keeps NumPy's K order.

    float16: the sum accumulates in float32 and the result is rounded to float16 once, so it is the
    correctly rounded value unless the float32 steps' few ulps fall across a rounding boundary. SciPy
    computes each step in float16: over CuPy's ``test_array_inputs`` array (100 x 1000 float16 values in
    [0, 10)) the exact logsumexp is 19.2104836..., between the float16 values 19.203125 and 19.21875 whose
    midpoint is 19.2109375; cukern gives 19.203125 (19.2), the correctly rounded one, and SciPy 19.21875
    (19.22), one ulp above it (docs/design/reductions.md).

    Examples
    --------
    >>> import cupy as cp
    >>> import cukern
    >>> x = cp.array([[0.0, -cp.inf], [1000.0, 1000.0]])
    >>> print(cukern.logsumexp(x, axis=1) - cp.array([0.0, 1000.0]))
    [0.         0.69314718]
    >>> r, sign = cukern.logsumexp(cp.array([1.0, 2.0, 3.0]), b=cp.array([1.0, -1.0, 0.0]), return_sign=True)
    >>> print(float(sign))
    -1.0
    >>> z = cukern.logsumexp(cp.array([0.0, 1j * cp.pi / 2]))
    >>> print(z.dtype, round(float(z.real), 6), round(float(z.imag), 6))
    complex128 0.346574 0.785398
    """
    x = _check.as_array(x, "x")
    check_input("logsumexp", x.dtype)
    return_sign = _check.check_flag(return_sign, "return_sign")
    if b is None and x.dtype in COMPLEX and out is None:
        keepdims = _check.check_keepdims(keepdims)
        axes = normalize_axis(axis, x.ndim)
        perm = k_order(x.shape, x.strides, axes)
        if perm is not None:  # NumPy's K order, as the other reductions keep it
            return _keep_order(lambda v, a: _weighted_logsumexp(v, a, None, keepdims, return_sign, None), x, axes,
                               perm, keepdims)
    if b is not None or x.dtype in COMPLEX:
        return _weighted_logsumexp(x, axis, b, _check.check_keepdims(keepdims), return_sign, out)
    if x.dtype.kind in "biu":
        x, _, out = _result_of(x, axis, keepdims, np.float64, out)
        _refuse_capture("logsumexp", "an integer x is converted to a temporary float64 copy; convert it first")
        with on_device(x.data.device_id):
            x = x.astype(np.float64)
    if return_sign:
        _refuse_capture("logsumexp", "return_sign makes the sign from the result through temporaries; take "
                        "it outside the graph")
    r = _reduce("logsumexp", x, axis, None, keepdims, out)
    if not return_sign:
        return r
    empty = math.prod(x.shape[i] for i in normalize_axis(axis, x.ndim)) == 0
    with on_device(x.data.device_id):
        # The sign of the sum of exps: 1, 0 where it is 0 (the result -inf), NaN for NaN; -1 for an empty
        # slice, as SciPy's. Formed in float32 (every value exact), for bfloat16 results too.
        cp = _cupy()
        v = _convert.astype(r, np.float32)
        sign = cp.where(cp.isnan(v), v, (v != -np.inf).astype(np.float32))
        if empty:
            sign.fill(-1)
        return r, _convert.astype(sign, r.dtype)


def _weighted_logsumexp(x, axis, b, keepdims: bool, return_sign: bool, out):
    """logsumexp with weights ``b``, or of complex x (``b`` then may be None): checked, then x and b converted
    to the result dtype, broadcast, and reduced by ``reduce_lse_weighted`` (real results) or
    ``reduce_lse_complex`` (complex ones), after a copy for deeper layouts."""
    cp = _cupy()
    if b is None:
        shape, final = x.shape, x.dtype
    else:
        b = _check.as_array(b, "b")
        if b.dtype not in PUBLIC_INPUTS["logsumexp"]:
            raise TypeError(f"b has dtype {dtype_name(b.dtype)}; logsumexp supports "
                            + ", ".join(dtype_name(t) for t in PUBLIC_INPUTS["logsumexp"]))
        _check.check_same_device({"x": x, "b": b})
        try:
            shape = np.broadcast_shapes(x.shape, b.shape)
        except ValueError:
            raise ValueError(f"b has shape {b.shape}, which does not broadcast against x's {x.shape}") from None
        final = weighted_dtype(x.dtype, b.dtype)
    is_complex = final in COMPLEX
    # a complex result with return_sign: log|sum| in the parts' dtype, the sign complex (SciPy's)
    res_dtype = real_of(final) if is_complex and return_sign else final
    axes = normalize_axis(axis, len(shape))
    rshape = result_shape(shape, axes, keepdims)
    if out is not None:
        out = _validate_out(out, rshape, res_dtype, x)
        if b is not None:
            _check.check_no_overlap(out, "out", b, "b", identical_ok=False)
    count = math.prod(shape[i] for i in axes)
    outputs = math.prod(shape[i] for i in range(len(shape)) if i not in axes)
    with on_device(x.data.device_id):
        if count == 0 or outputs == 0:
            r = cp.empty(rshape, res_dtype)
            r.fill(-np.inf)
            sign = cp.empty(rshape, final) if return_sign else None
            if sign is not None:
                sign.fill(-1)  # SciPy's sign of its empty result, -inf
        else:
            if x.dtype != final or (b is not None and b.dtype != final):
                refuse_temporary_in_capture("logsumexp", "x or b is converted to the result dtype first; pass "
                                            f"both as {dtype_name(final)}")
            xv = cp.broadcast_to(_lse_operand(x, final), shape)
            bv = xv if b is None else cp.broadcast_to(_lse_operand(b, final), shape)
            device = x.data.device_id
            pl = plan_weighted(shape, _elements(xv), _elements(bv), axes, sm_count(device))
            if pl.copy:
                refuse_temporary_in_capture("logsumexp", "x and b are first copied to contiguous, kept axes "
                                            "then reduced ones; make those copies before the capture")
                order = [i for i in range(len(shape)) if i not in axes] + list(axes)
                xv = cp.ascontiguousarray(xv.transpose(order))
                bv = xv if b is None else cp.ascontiguousarray(bv.transpose(order))
            kept = result_shape(shape, axes, False)
            r = cp.empty(kept, res_dtype)
            sign = cp.empty(kept, final) if return_sign else None
            signs = NULL if sign is None else sign
            if is_complex:
                # the complex log into r, or log|sum| into r (the third pointer) and the sign
                args = (NULL, signs, r) if return_sign else (r, NULL, NULL)
                launch(get_kernel(complex_instantiation(final)), pl.config,
                       (*args, xv, bv, struct_argument(pl.params(return_sign, weighted=b is not None))))
            else:
                launch(get_kernel(weighted_instantiation(final)), pl.config,
                       (r, signs, xv, bv, struct_argument(pl.params(return_sign))))
            r = r.reshape(rshape)
            sign = None if sign is None else sign.reshape(rshape)
        if out is not None:
            _convert.copyto(out, r)
            r = out
    return (r, sign) if return_sign else r


def _lse_operand(a, final):
    """x or b in logsumexp's result dtype: as it is, or converted (a real array to a complex result through
    its parts' dtype, exactly)."""
    if a.dtype == final:
        return a
    if final in COMPLEX and a.dtype not in COMPLEX:
        return _convert.astype(a, real_of(final)).astype(final)
    return _convert.astype(a, final)


def _elements(a) -> tuple:
    """``a``'s strides in elements."""
    return tuple(s // a.itemsize for s in a.strides)
