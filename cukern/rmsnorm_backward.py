"""RMSNorm backward (kernels in ``cuda_src/rms_norm_backward.cu``, the second stage in
``cuda_src/common/partials.cuh``).

Reference (float64, :func:`cukern.reference.rms_norm_backward`), with ``r = 1 / sqrt(mean(x**2) + eps)``,
``xhat = x * r`` and ``g = dy * (offset + weight)``::

    dx = r * (g - xhat * mean(g * xhat, axis=-1)) (+ dresidual)
    dweight = sum(dy * xhat over every row)

Memory traffic, the count every GB/s figure uses (``bytes_moved``): dy and x read, dx written, weight read
once and dweight written (with a weight), dresidual and rstd read when given, and the float32 partial rows
of dweight written once and read once.

Reproducibility: dx's row is computed from that row alone in rms_norm's fixed tree (a recomputed rstd has the
forward's bits); dweight sums the rows in chunks of :func:`chunk_rows` consecutive rows, each in row order,
then the chunks in a tree fixed by their count: the bits depend on the values and the row count, never on the
grid, the SM count or the GPU, and no atomics are used (:func:`cukern.reference.rms_norm_backward_emulated`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

import cukern._check as _check
import cukern.reduce as _reduce
import cukern.rmsnorm as rmsnorm

from ._compile import Instantiation, get_kernel
from ._dtypes import FLOAT_TYPES, dtype_name
from ._interop import as_array
from ._launch import NULL as _NULL
from ._launch import SEQUENCE_LOCK, CallCache, LaunchConfig, Params, launch, on_device, refuse_temporary_in_capture
from ._launch import cupy as _cupy
from ._launch import struct_argument
from ._layout import ArraySpec, rows_layout
from ._typing import DeviceArray

SOURCE = "rms_norm_backward"
MIN_CHUNKS, CHUNK_ELEMENTS = 512, 1 << 21  # chunk_rows' targets (see there)
PAIR_ROWS, PAIR_ELEMENTS = 256, 1 << 19  # above both, two-row chunks where the targets give one (chunk_rows)
PARTIAL_LANES, PARTIAL_COLS = 16, 32  # common/partials.cuh kPartialLanes, kPartialCols
MAX_LEAVES_PER_LANE = 1 << 16  # common/partials.cuh kPartialLevels
_F32 = np.dtype(np.float32)

# The rows kernel's scalars (``RmsNormBackwardParams``): strides in elements, rs_* in floats.
PARAMS = Params((("rows", "i64"), ("inner", "i64"), ("chunk_rows", "i64"), ("chunks", "i64"), ("dx_s0", "i64"),
                 ("dx_s1", "i64"), ("dy_s0", "i64"), ("dy_s1", "i64"), ("x_s0", "i64"), ("x_s1", "i64"),
                 ("dr_s0", "i64"), ("dr_s1", "i64"), ("rs_s0", "i64"), ("rs_s1", "i64"), ("hidden", "i32"),
                 ("eps", "f32"), ("offset", "f32")))


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(n, 1))))


def target_chunks(hidden: int) -> int:
    """The most chunks :func:`chunk_rows` cuts the rows into: 512, or for short rows enough that a chunk's
    partial row and its threads stay many (``2^21 / hidden``: per-head norms have many short rows)."""
    return max(MIN_CHUNKS, CHUNK_ELEMENTS // max(hidden, 1))


def chunk_rows(rows: int, hidden: int) -> int:
    """R, the rows of one chunk of dweight's first stage: the least power of two that cuts ``rows`` into at most
    :func:`target_chunks` chunks. A function of the row count and hidden alone (never of the grid, the
    alignment, the SM count or the GPU), so dweight's summation order, and its bits, are too. At [16384, 4096]
    512 chunks of 32 rows fill an H100 or H200 with a block each while the partial rows stay small beside dy,
    x and dx.

    Where that gives one-row chunks to more than :data:`PAIR_ROWS` rows of more than :data:`PAIR_ELEMENTS`
    elements in all, chunks take two rows: half the partial rows to write and read back, for the same bits,
    since a two-row chunk's sum ``(-0 + a) + b`` is ``a + b``, the first level of the tree over one-row
    chunks."""
    r = _pow2_at_least(math.ceil(rows / target_chunks(hidden)))
    return 2 if r == 1 and rows > PAIR_ROWS and rows * hidden > PAIR_ELEMENTS else r


def leaves_per_lane(leaves: int) -> int:
    """S, the leaves of each of the second stage's :data:`PARTIAL_LANES` subtrees: the least power of two with
    ``PARTIAL_LANES * S >= leaves`` (padded with -0, which changes no sum)."""
    return _pow2_at_least(math.ceil(leaves / PARTIAL_LANES))


@dataclass(frozen=True)
class Plan:
    """The two launches of one call: ``row`` is rms_norm's rows-kernel layout of a row (:func:`rmsnorm.plan` at
    the default knobs: threads per row, classes a thread owns, vectors it holds), ``chunk_rows`` and ``chunks``
    the first stage's chunks (one per group of ``row.tpr`` threads), ``grid`` its blocks, each writing one
    partial row; ``tree_grid`` the second stage's blocks (32 columns each), ``per_lane`` its leaves (the
    ``grid`` partial rows) per subtree."""

    row: rmsnorm.Plan
    chunk_rows: int
    chunks: int
    grid: int
    tree_grid: int
    per_lane: int

    @property
    def config(self) -> LaunchConfig:
        return LaunchConfig(grid=(self.grid,), block=(self.row.block,))

    @property
    def tree_config(self) -> LaunchConfig:
        return LaunchConfig(grid=(self.tree_grid,), block=(PARTIAL_LANES * PARTIAL_COLS,))

    @property
    def chunks_per_block(self) -> int:
        return self.row.block // self.row.tpr

    def instantiation(self, dtype, weight_dtype) -> Instantiation:
        r = self.row
        return Instantiation(SOURCE, "rms_norm_backward_rows",
                             (dtype, weight_dtype, r.vec, r.tpr, r.groups, r.items, r.block))


def tree_instantiation(weight_dtype) -> Instantiation:
    """The second stage, rounding to ``weight_dtype``."""
    return Instantiation(SOURCE, "column_tree", (np.dtype(weight_dtype),))


MAX_BLOCK_ITEMS, MAX_BLOCK_BYTES = 8, 128  # a 512-thread block's rows: see _holds


def _row_plan(hidden: int, vec: int, itemsize: int) -> rmsnorm.Plan:
    return rmsnorm.plan(hidden, 1, vec, itemsize, knobs=rmsnorm.Knobs(waves=None))


def _holds(r: rmsnorm.Plan, itemsize: int, weight_itemsize: int) -> bool:
    """Whether the rows kernel holds row plan ``r`` without spilling: rms_norm's rows kernel, and in a
    512-thread block (128 registers a thread) at most 8 vectors and 128 bytes of x and weight a thread (more
    spilled on sm_90: 16 element vectors, or 16-bit x with float32 weights in 16-byte vectors)."""
    if r.kernel != "rows":
        return False
    return r.block < 512 or (r.items <= MAX_BLOCK_ITEMS
                             and r.items * r.vec * (itemsize + weight_itemsize) <= MAX_BLOCK_BYTES)


def max_hidden(vec: int, itemsize: int, weight_itemsize: int | None = None) -> int:
    """The longest row of ``vec``-element accesses the rows kernel holds (the backward has no streaming kernel):
    with 16-byte accesses 8192 elements of float32, 16384 of a 16-bit type (8192 with float32 weights); with
    element accesses 4096."""
    w = itemsize if weight_itemsize is None else weight_itemsize
    return max(h for h in rmsnorm.plan_lengths() if h % vec == 0 and _holds(_row_plan(h, vec, itemsize), itemsize, w))


def plan(hidden: int, rows: int, vec: int, itemsize: int, weight_itemsize: int | None = None) -> Plan:
    """Pure launch planning from the row length, the row count, the usable vector width and the element sizes.
    The row layout is rms_norm's (so the row sums take its tree); each group of ``tpr`` threads owns one chunk
    of :func:`chunk_rows` rows and the grid covers the chunks once. Rows the kernel cannot hold in registers
    (:func:`max_hidden`) are refused: ValueError naming the limit."""
    w = itemsize if weight_itemsize is None else weight_itemsize
    r = _row_plan(hidden, vec, itemsize)
    if not _holds(r, itemsize, w):
        raise ValueError(f"x's last dimension {hidden} is over rms_norm_backward's {max_hidden(vec, itemsize, w)} "
                         f"for {itemsize}-byte elements and {w}-byte weights with {vec}-element accesses; split "
                         "the rows or align them to 16 bytes")
    rows_each = chunk_rows(rows, hidden)
    chunks = max(1, math.ceil(rows / rows_each))
    grid = math.ceil(chunks / (r.block // r.tpr))
    return Plan(r, rows_each, chunks, grid, math.ceil(hidden / PARTIAL_COLS), leaves_per_lane(grid))


def instantiations():
    """Every rows kernel :func:`plan` can choose (each supported dtype pair, both vector widths, one row length
    per thing the row plan reads of ``hidden``) and the second stage for each weight dtype."""
    out = set()
    dtypes = [(t, t) for t in FLOAT_TYPES] + [(t, _F32) for t in FLOAT_TYPES[1:]]
    for t, w in dtypes:
        for vec in sorted({16 // t.itemsize, 1}):
            for hidden in rmsnorm.plan_lengths():
                if hidden % vec == 0 and _holds(_row_plan(hidden, vec, t.itemsize), t.itemsize, w.itemsize):
                    out.add(plan(hidden, 1, vec, t.itemsize, w.itemsize).instantiation(t, w))
    out.update(tree_instantiation(t) for t in FLOAT_TYPES)
    return sorted(out, key=lambda i: (i.name, i.expression))


def bytes_moved(shape, dtype, weight_dtype=None, *, dresidual: bool = False, rstd: bool = False) -> int:
    """Bytes the op must move: dy and x read and dx written; with ``dresidual`` that read; with ``rstd`` one
    float32 a row read; with a weight, weight read, dweight written and the float32 partial rows (one a block
    of an aligned call's plan) written and read once each."""
    n, size = math.prod(shape), np.dtype(dtype).itemsize
    rows, hidden = math.prod(shape[:-1]), shape[-1]
    total = (4 if dresidual else 3) * n * size + (4 * rows if rstd else 0)
    if weight_dtype is not None and n:
        blocks = plan(hidden, rows, rmsnorm.widest_vector(hidden, size), size, np.dtype(weight_dtype).itemsize).grid
        total += 2 * hidden * np.dtype(weight_dtype).itemsize + 2 * 4 * blocks * hidden
    return total


# ---------------------------------------------------------------------------------------------------------
# Validation and the call.


def _validate(dy, x, weight, rstd, dresidual, dx) -> dict:
    """Every argument as a CuPy view, checked against x: dtypes, shapes, device, unit last strides."""
    names = {"dy": dy, "x": x, "weight": weight, "rstd": rstd, "dresidual": dresidual, "dx": dx}
    arrays = check_arrays({n: as_array(a, n, writable=n == "dx") for n, a in names.items()
                           if a is not None or n in ("dy", "x")})
    if dx is not None:
        _check.check_writable(arrays["dx"], "dx")
    return arrays


def check_arrays(arrays: dict) -> dict:
    """Every check of the arrays by name (``dy``, ``x``, and any of ``weight``, ``rstd``, ``dresidual`` and
    ``dx``), already converted; reads only shape, strides, dtype and device, so the ``explain`` card's
    stand-ins go through it."""
    x = arrays["x"]
    rmsnorm.check_like_x(arrays, ("dy", "dresidual", "dx"))
    r = arrays.get("rstd")
    if r is not None:
        if r.dtype != _F32:
            raise TypeError(f"rstd has dtype {dtype_name(r.dtype)}; it must be float32 (rms_norm's return_rstd)")
        if r.shape != x.shape[:-1]:
            raise ValueError(f"rstd has shape {r.shape}; it must be x's leading shape {x.shape[:-1]}")
    _check.check_same_device(arrays)
    for n, a in arrays.items():
        if n != "rstd":
            _check.check_unit_last_stride(a, n)
    return arrays


def _check_overlaps(dx, dy, x, weight, rstd, dresidual) -> None:
    """dx may be dy or dresidual itself (a thread reads each element before it writes it), and must share
    no element with any other input or partially overlap those two."""
    if dx is None:
        return
    for a, name, same_ok in ((dy, "dy", True), (dresidual, "dresidual", True), (x, "x", False),
                             (weight, "weight", False), (rstd, "rstd", False)):
        if a is not None:
            _check.check_no_overlap(dx, "dx", a, name, identical_ok=same_ok)


@dataclass(frozen=True)
class _Call:
    """A validated, planned call (everything but the addresses): the two kernels, their launches, the packed
    scalars and the partials' bytes; ``kernel`` None: no row or no column, nothing to launch."""

    kernel: object
    tree_kernel: object
    plan: Plan | None
    params: object
    partial_bytes: int
    copy: bool  # a layout of more than two row levels: inputs copied C-contiguous, dx computed apart


_calls = CallCache()


def _desc(a):
    return None if a is None else (a.shape, a.strides, a.dtype, a.data.ptr & 15, a.data.device_id)


def _spec(a, shape):
    return ArraySpec.fresh(shape, np.float32) if a is None else ArraySpec(shape, a.strides + (4,), a.dtype, a.data.ptr)


def _plan_call(dy, x, weight, rstd, dresidual, dx, eps: float, offset: float) -> _Call:
    device = x.data.device_id
    hidden, lead = x.shape[-1], x.shape[:-1]
    rows = math.prod(lead)
    if x.size == 0:
        return _Call(None, None, None, None, 0, False)
    target = dx if dx is not None else ArraySpec.fresh(x.shape, x.dtype)
    rowed = [target, dy, x] + ([dresidual] if dresidual is not None else [])
    layout = rows_layout(rowed + [_spec(rstd, lead + (1,))])
    copy = len(layout.outer) > 1
    if copy:  # every row array C-contiguous: two levels of strides then hold every row
        rowed = [ArraySpec.fresh(x.shape, x.dtype) for _ in rowed]
        layout = rows_layout(rowed + [_spec(None, lead + (1,))])
    vec = rmsnorm.vector_width(hidden, rowed, weight)
    w_dt = weight.dtype if weight is not None else x.dtype
    p = plan(hidden, rows, vec, x.itemsize, w_dt.itemsize)
    with on_device(device):
        kernel = get_kernel(p.instantiation(x.dtype, w_dt)).kernel
        tree = get_kernel(tree_instantiation(w_dt)).kernel if weight is not None else None
    st = layout.strides
    dr = st[3] if dresidual is not None else (0, 0)
    params = struct_argument(PARAMS.struct(
        rows=layout.rows, inner=layout.inner, chunk_rows=p.chunk_rows, chunks=p.chunks, dx_s0=st[0][0],
        dx_s1=st[0][1], dy_s0=st[1][0], dy_s1=st[1][1], x_s0=st[2][0], x_s1=st[2][1], dr_s0=dr[0], dr_s1=dr[1],
        rs_s0=st[-1][0], rs_s1=st[-1][1], hidden=hidden, eps=eps, offset=offset))
    return _Call(kernel, tree, p, params, 4 * p.grid * hidden if weight is not None else 0, copy)


def _run(dy, x, weight, eps, offset, rstd, dresidual, dx):
    e, o = rmsnorm._scalars(eps, offset)
    nd = _cupy().ndarray
    key = None
    call = CallCache.MISSING
    if all(a is None or type(a) is nd for a in (dy, x, weight, rstd, dresidual, dx)):
        key = (e, o, _desc(dy), _desc(x), _desc(weight), _desc(rstd), _desc(dresidual), _desc(dx))
        call = _calls.get(key)
    if call is CallCache.MISSING:
        arrays = _validate(dy, x, weight, rstd, dresidual, dx)
        dy, x, weight, rstd, dresidual, dx = (arrays.get(n) for n in ("dy", "x", "weight", "rstd", "dresidual",
                                                                         "dx"))
        _check_overlaps(dx, dy, x, weight, rstd, dresidual)
        call = _plan_call(dy, x, weight, rstd, dresidual, dx, e, o)
        if key is not None:
            _calls.put(key, call)
    else:
        _check_overlaps(dx, dy, x, weight, rstd, dresidual)
    cp = _cupy()
    with on_device(x.data.device_id):
        if call.copy:
            refuse_temporary_in_capture("rms_norm_backward", "its arrays have more than two levels of row "
                                        "strides and are copied C-contiguous; pass C-contiguous arrays")
        ws = _reduce.workspace(call.partial_bytes) if call.partial_bytes else None
        dweight = None if weight is None else cp.empty(weight.shape, weight.dtype)
        if call.kernel is None:
            if dx is None:
                dx = cp.empty(x.shape, x.dtype)
            if dweight is not None:
                dweight.fill(0)  # a sum over no rows
            return dx, dweight
        target = dx if dx is not None and not call.copy else cp.empty(x.shape, x.dtype)
        if call.copy:
            dy, x, rstd, dresidual = (None if a is None else cp.ascontiguousarray(a) for a in (dy, x, rstd, dresidual))
        p = call.plan
        with SEQUENCE_LOCK:
            launch(call.kernel, p.config, (target, _NULL if ws is None else ws.scratch, dy, x,
                                           _NULL if weight is None else weight, _NULL if rstd is None else rstd,
                                           _NULL if dresidual is None else dresidual, call.params))
            if weight is not None:
                launch(call.tree_kernel, p.tree_config, (dweight, ws.scratch, np.int64(1), np.int32(x.shape[-1]),
                                                         np.uint32(p.grid), np.uint32(p.per_lane)))
        if dx is not None and call.copy:
            dx[...] = target
        else:
            dx = target
    return dx, dweight


def rms_norm_backward(dy: DeviceArray, x: DeviceArray, weight: DeviceArray | None = None, *, eps: float = 1e-6,
                      offset: float = 0.0, rstd: DeviceArray | None = None, dresidual: DeviceArray | None = None,
                      dx: DeviceArray | None = None) -> tuple[DeviceArray, DeviceArray | None]:
    """Gradients of :func:`cukern.rms_norm` (plain, Gemma offset, fused residual) over the last axis.

    With ``r = 1 / sqrt(mean(x**2) + eps)``, ``xhat = x * r`` and ``g = dy * (offset + weight)``:
    ``dx = r * (g - xhat * mean(g * xhat)) (+ dresidual)`` rounded once to x's dtype, and
    ``dweight = sum(dy * xhat)`` over every row, rounded once to weight's dtype (for the Gemma form too:
    d(offset + weight) / dweight is 1). Every step is a float32 operation rounded to nearest, in a fixed
    order: a row of dx depends on that row's values (and hidden, the dtypes, eps and offset) only, dweight on
    the values and the row count only: not on the batch around a row, the layout, the grid, the SM count or
    the GPU, and no atomics (:func:`cukern.reference.rms_norm_backward_emulated` gives the same bits).

    Parameters
    ----------
    dy : cupy.ndarray like x, the gradient arriving at the output (any GPU array: DLPack or the CUDA array
        interface).
    x : cupy.ndarray, float32, float16 or bfloat16, ``[..., hidden]``: the forward's input (for the fused form
        the residual it normalized, as updated). Leading dimensions may be strided, the last must have unit
        stride; hidden at most 4096 with element accesses, 8192 with 16-byte aligned rows, 16384 when x and
        weight are both 16-bit (:func:`max_hidden`).
    weight : cupy.ndarray ``[hidden]`` of x's dtype or float32, optional (None: a weight of 1 and no dweight).
    eps : float
        The forward's eps: finite, at least 0 (a real number, never an array).
    offset : float
        The forward's offset (``1.0`` for Gemma's ``1 + weight``): finite.
    rstd : cupy.ndarray float32 of shape ``x.shape[:-1]``, optional: the forward's
        (``rms_norm(..., return_rstd=True)``). None recomputes it in the forward's own tree, with the bits the
        forward used.
    dresidual : cupy.ndarray like x, optional: for the fused form, the gradient arriving at the residual
        output, added into dx.
    dx : cupy.ndarray like x, optional: where dx goes. It may be dy or dresidual itself; it must share no
        element with x, weight or rstd and not partially overlap dy or dresidual.

    Returns
    -------
    (dx, dweight): dx of x's dtype and shape (for the fused form, the gradient of both x and the residual
    input); dweight of weight's dtype and shape, or None without a weight.

    Raises
    ------
    TypeError
        For a non-array or a dtype outside those above, or an eps or offset that is not a real number.
    ValueError
        For mismatched shapes, a bad stride, overlapping arrays, a row longer than supported, or an eps or
        offset out of range (NaN, infinite, a negative eps). Every check runs before anything is launched.
    RuntimeError
        Under CUDA-graph capture when this stream's workspace (for dweight's partial rows) does not exist yet
        or is too small (make the same call once before capturing), or for arrays that must be copied.

    Examples
    --------
    >>> import cupy as cp
    >>> import cukern
    >>> from cukern.reference import rms_norm_backward_emulated
    >>> x = cp.array([[3.0, 4.0], [1.0, -1.0]], dtype=cp.float32)
    >>> w = cp.array([1.0, 0.5], dtype=cp.float32)
    >>> y, rstd = cukern.rms_norm(x, w, eps=0.0, return_rstd=True)
    >>> dy = cp.array([[1.0, 0.0], [0.0, 1.0]], dtype=cp.float32)
    >>> dx, dweight = cukern.rms_norm_backward(dy, x, w, eps=0.0, rstd=rstd)
    >>> print(dx.dtype, dx.shape, dweight.dtype, dweight.shape)
    float32 (2, 2) float32 (2,)
    >>> print(dweight)
    [ 0.84852815 -1.        ]
    >>> ex, ew = rms_norm_backward_emulated(cp.asnumpy(dy), cp.asnumpy(x), cp.asnumpy(w), eps=0.0)
    >>> bool((cp.asnumpy(dx) == ex).all() and (cp.asnumpy(dweight) == ew).all())
    True
    """
    return _run(dy, x, weight, eps, offset, rstd, dresidual, dx)
