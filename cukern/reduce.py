"""Reductions: sum, amax, amin, mean, sum_of_squares, norm (kernels in ``cuda_src/reduce.cu``).

References (float64, :mod:`cukern.reference`): ``np.sum``, ``np.max``, ``np.min``, ``np.mean``,
``np.sum(x * x)``, ``sqrt(np.sum(x * x))`` over the same axes.

Memory traffic, the count every GB/s figure uses: read x once, write the result once: ``bytes_moved``.

Dispatch. The reduced axes are moved last (a view, no copy) and kept and reduced dimensions are each
collapsed (:func:`classify`, pure). Then:

* nothing kept: ``reduce_full``, one launch (last block done), any single stride;
* reduced dimension contiguous: ``reduce_rows``;
* reduced dimension strided, kept inner dimension contiguous: ``reduce_cols`` (coalesced across columns),
  plus a second small launch over row slices when the rows are split;
* any other layout of at most two kept and two reduced levels: ``reduce_strided``; deeper layouts are
  copied to contiguous first.

Host path: the first call for a given (op, arguments, shape, strides, dtype, 16-byte alignment, device,
stream, tuning knobs, and ``out``'s shape, strides, dtype and device) validates, plans and prepares the
launch; later such calls skip straight to allocating the result (or checking ``out`` against ``x``) and
launching (``_fast``). A C-contiguous ``out`` of the result's dtype is written by the kernel directly (no
temporary, no copy: capturable in a CUDA graph). Tuning knobs: :class:`Knobs` (swept by
bench/sweep_reduce.py); the tuning cache's winner is used where there is one (:func:`_tuned_knobs`).

Accumulation: float32 for float16/bfloat16/float32 results, float64 for float64, int64 for integer results.
No float atomics: the same input gives bit-identical results every run. A float32 full sum of n elements
is one sequential sum per thread over about n / (threads in the grid) elements, in up to 4 interleaved
accumulators, then trees: its error is bounded by roughly ``(n / threads + log2(threads)) * eps * sum|x|``
and in practice (random rounding) far smaller.
"""

from __future__ import annotations

import functools
import math
import operator
import threading
from dataclasses import dataclass

import numpy as np

from . import _check
from . import tuning as _tuning
from ._compile import Instantiation, get_kernel
from ._dtypes import BFLOAT16, dtype_name, parse_dtype
from ._launch import LaunchConfig, Signature, launch, sm_count
from ._layout import collapse

SOURCE = "reduce"

OP_SUM, OP_SUMSQ, OP_MAX, OP_MIN = 0, 1, 2, 3
FINISH_NONE, FINISH_DIVIDE, FINISH_SQRT = 0, 1, 2

F32, F64, F16 = np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.float16)
I32, I64, BOOL = np.dtype(np.int32), np.dtype(np.int64), np.dtype(np.bool_)
FLOATS = (F32, F64, F16, BFLOAT16)
INTS = (I32, I64)



@dataclass(frozen=True)
class Knobs:
    """The tuning space of the full and row kernels (bench/sweep_reduce.py sweeps it).

    Full reduction: blocks of ``full_block`` threads, ``full_blocks_per_sm`` of them per SM at most,
    ``full_unroll`` 16-byte loads in flight per thread. Two 512-thread blocks fill an SM's 2048 threads by
    half, which keeps 2 * 512 * 4 * 16 = 64 KiB of loads in flight per SM, about twice the latency-bandwidth
    product.

    Rows: threads per row from (4, 32, 128, ``row_max_tpr``), the smallest that leaves each thread about
    ``row_items`` 16-byte vectors; up to 32 threads per row share blocks of ``ROW_SMALL_BLOCK``, more get a
    block of their own. ``row_unroll`` independent 16-byte loads in flight per thread. ``row_threads_per_sm``
    caps the registers: ``__launch_bounds__(block, row_threads_per_sm / block)`` (1024: 64 registers).
    ``row_waves``: grid cap in waves of those resident blocks, the blocks then looping over rows (None: a
    block per row group).

    Defaults from the H200 sweep (bench/results/sweeps/reduce_h200.log): rows [32768, 16384] float32 with
    tpr 256, unroll 4, 4 blocks per SM took 475.0 µs at 8 waves and 470.5 µs at 32 waves (cupy: 470.7 µs),
    so ``row_waves`` is 32. The full-sum defaults match or beat cupy.sum there (2^20: 7.76 vs 8.22 µs,
    2^24: 22.74 vs 22.83 µs, 2^29: 478.8 vs 477.6 µs).
    """

    full_block: int = 512
    full_blocks_per_sm: int = 2
    full_unroll: int = 4
    row_items: int = 8
    row_max_tpr: int = 256
    row_unroll: int = 4
    row_threads_per_sm: int = 1024
    row_waves: int | None = 32


DEFAULT_KNOBS = Knobs()
FULL_BLOCK, FULL_BLOCKS_PER_SM, FULL_UNROLL = (
    DEFAULT_KNOBS.full_block, DEFAULT_KNOBS.full_blocks_per_sm, DEFAULT_KNOBS.full_unroll)
ROW_SMALL_BLOCK = 128
ROW_INDEX32_LIMIT = 2**30  # rows shorter than this index within the row in 32 bits (fewer registers)
COL_BLOCK = 256
COL_ACC_BYTES = 32  # column packs: at most this many accumulator bytes a thread (VEC accumulators)
COL_WAVES = 2  # target blocks for the column pass, in waves of resident blocks
COL_MIN_ROWS = 64  # fewest rows a slice is given (fewer slices for short columns)
STRIDED_BLOCK = 128
STRIDED_WAVES = 8

_FULL_SIG = Signature(("ptr", "ptr", "ptr", "ptr", "i64", "i64", "i32", "f64"))
_ROWS_SIG = Signature(("ptr", "ptr", "i64", "i64", "i64", "i64", "i64", "i32", "i32", "f64"))
_COLS_SIG = Signature(
    ("ptr", "ptr", "i64", "i64", "i64", "i64", "i64", "i64", "i32", "i32", "i32", "i32", "i32", "f64")
)
_STRIDED_SIG = Signature(("ptr", "ptr", "i64", "i64", "i64", "i64", "i64", "i64", "i64", "i64", "i32", "f64"))


# ---------------------------------------------------------------------------------------------------------
# Ops and dtypes.


@dataclass(frozen=True)
class Op:
    name: str
    kernel_op: int
    finalize: int
    inputs: tuple  # accepted input dtypes


_ALL = FLOATS + INTS + (BOOL,)
_NO_BOOL = FLOATS + INTS
OPS = {
    "sum": Op("sum", OP_SUM, FINISH_NONE, _ALL),
    "mean": Op("mean", OP_SUM, FINISH_DIVIDE, _ALL),
    "sum_of_squares": Op("sum_of_squares", OP_SUMSQ, FINISH_NONE, _NO_BOOL),
    "norm": Op("norm", OP_SUMSQ, FINISH_SQRT, _NO_BOOL),
    "amax": Op("amax", OP_MAX, FINISH_NONE, _NO_BOOL),
    "amin": Op("amin", OP_MIN, FINISH_NONE, _NO_BOOL),
}


def acc_dtype(result_dtype) -> np.dtype:
    """The accumulator for a result dtype (``acc_t`` in reduce.cu)."""
    r = np.dtype(result_dtype)
    if r == F64:
        return F64
    if r in INTS:
        return I64
    return F32


def default_dtype(op: str, dtype) -> np.dtype:
    """NumPy's result dtype when ``dtype=None``: integer sums widen to int64, integer means and norms are
    float64, floats (half types included) keep their dtype."""
    t = np.dtype(dtype)
    if op in ("amax", "amin"):
        return t
    if t in FLOATS:
        return t
    return I64 if op in ("sum", "sum_of_squares") else F64


def kernel_dtypes(op: str, dtype) -> tuple:
    """The result dtypes the kernels produce directly for ``op`` on ``dtype`` (``dtype=`` may pick any)."""
    t = np.dtype(dtype)
    if op in ("amax", "amin"):
        return (t,)
    floats = tuple(dict.fromkeys((t, F32, F64))) if t in FLOATS else (F32, F64)
    if op in ("mean", "norm"):
        return floats
    return floats if t in FLOATS else (I32, I64, F32, F64)


def result_dtype(op: str, dtype, requested=None) -> np.dtype:
    t = np.dtype(dtype)
    if requested is None:
        return default_dtype(op, t)
    r = parse_dtype(requested)
    if op in ("amax", "amin"):
        if r not in _NO_BOOL:
            raise TypeError(f"dtype={dtype_name(r)} is not supported; use one of {_names(_NO_BOOL)}")
        return r
    allowed = kernel_dtypes(op, t)
    if r not in allowed:
        raise TypeError(
            f"dtype={dtype_name(r)} is not supported for {op} of {dtype_name(t)}; use one of {_names(allowed)} "
            f"(or convert the result with .astype)"
        )
    return r


def _names(dtypes) -> str:
    return ", ".join(dtype_name(d) for d in dtypes)


# ---------------------------------------------------------------------------------------------------------
# Layout analysis (pure).


@dataclass(frozen=True)
class Layout:
    """How a reduction maps onto the kernels.

    ``kind``: "none" (no reduced elements besides size-1 axes: an elementwise result), "full", "rows",
    "cols", "strided" or "copy" (too many levels; copy to contiguous first). ``kept`` and ``red`` are the
    collapsed (size, stride-in-elements) levels of the kept and the reduced dimensions, outermost first.
    """

    kind: str
    kept: tuple
    red: tuple

    @property
    def outputs(self) -> int:
        return math.prod(n for n, _ in self.kept)

    @property
    def count(self) -> int:
        return math.prod(n for n, _ in self.red)


def normalize_axis(axis, ndim: int) -> tuple:
    """``axis`` (None, an int or a tuple of ints) as a sorted tuple of distinct non-negative axes."""
    if axis is None:
        return tuple(range(ndim))
    items = axis if isinstance(axis, tuple) else (axis,)
    out = []
    for a in items:
        if isinstance(a, (bool, np.bool_)) or not isinstance(a, (int, np.integer)):
            raise TypeError(f"axis must be None, an int or a tuple of ints, got {axis!r}")
        a = operator.index(a)
        if not -ndim <= a < ndim:
            raise np.exceptions.AxisError(f"axis {a} is out of bounds for an array of dimension {ndim}")
        out.append(a % ndim if ndim else a)
    if len(set(out)) != len(out):
        raise ValueError(f"axis {axis!r} repeats an axis")
    return tuple(sorted(out))


def _levels(shape, strides) -> tuple:
    sizes, (sts,) = collapse(tuple(shape), [tuple(strides)])
    return tuple(zip(sizes, sts))


def classify(shape, strides, axes) -> Layout:
    """Which kernel reduces ``axes`` of an array of ``shape`` with ``strides`` (in elements). Pure."""
    kept_axes = [i for i in range(len(shape)) if i not in axes]
    kept = _levels([shape[i] for i in kept_axes], [strides[i] for i in kept_axes])
    # Reduced dimensions may be visited in any order: largest stride first lets a transposed contiguous
    # array collapse to one level.
    red_axes = sorted(axes, key=lambda i: -abs(strides[i]))
    red = _levels([shape[i] for i in red_axes], [strides[i] for i in red_axes])
    if not red:
        return Layout("none", kept, red)
    if not kept:
        return Layout("full" if len(red) == 1 else "copy", kept, red)
    if len(kept) > 2 or len(red) > 2:
        return Layout("copy", kept, red)
    if len(red) == 1 and red[0][1] == 1:
        return Layout("rows", kept, red)
    if len(red) == 1 and kept[-1][1] == 1:
        return Layout("cols", kept, red)
    return Layout("strided", kept, red)


def cols_geometry(layout: Layout) -> tuple:
    """(outer, s_outer, rows, s_row, cols) of a "cols" layout: ``outer`` matrices ``s_outer`` apart, each
    ``rows`` rows ``s_row`` apart of ``cols`` contiguous columns."""
    (rows, s_row), = layout.red
    outer, s_outer = layout.kept[0] if len(layout.kept) == 2 else (1, 0)
    return outer, s_outer, rows, s_row, layout.kept[-1][0]


def two_level(levels) -> tuple:
    """(inner, s0, s1) addressing index i as (i // inner) * s0 + (i % inner) * s1 over one or two levels."""
    if len(levels) == 1:
        return levels[0][0], 0, levels[0][1]
    (_, s0), (n1, s1) = levels
    return n1, s0, s1


# ---------------------------------------------------------------------------------------------------------
# Launch plans (pure).


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class _OneLaunch:
    """A plan launching ``grid`` blocks of ``block`` threads (fields of the dataclasses below)."""

    @property
    def config(self) -> LaunchConfig:
        return LaunchConfig(grid=(self.grid,), block=(self.block,))


@dataclass(frozen=True)
class FullPlan(_OneLaunch):
    block: int
    grid: int
    unroll: int


def plan_full(n: int, itemsize: int, sm_count: int = 132, knobs: Knobs = DEFAULT_KNOBS) -> FullPlan:
    """Grid for ``reduce_full``: enough blocks that each thread has at least one unrolled iteration
    (``knobs.full_unroll`` 16-byte vectors), at most ``knobs.full_blocks_per_sm`` per SM. Depends only on
    ``n``, the item size, the SM count and the knobs, so the combine order, and the result, never depend
    on timing."""
    block, unroll = knobs.full_block, knobs.full_unroll
    per_block = block * unroll * (16 // itemsize)
    grid = max(1, min(_cdiv(n, per_block), knobs.full_blocks_per_sm * sm_count))
    return FullPlan(block, grid, unroll)


@dataclass(frozen=True)
class RowsPlan(_OneLaunch):
    tpr: int
    block: int
    grid: int
    unroll: int = 4
    min_blocks: int = 8  # __launch_bounds__ minimum resident blocks per SM (the register cap)
    index32: bool = True  # 32-bit indices within a row (rows shorter than ROW_INDEX32_LIMIT)


def row_tprs(knobs: Knobs = DEFAULT_KNOBS) -> tuple:
    """Threads per row the planner picks from."""
    return tuple(sorted({t for t in (4, 32, 128) if t < knobs.row_max_tpr} | {knobs.row_max_tpr}))


def row_block(tpr: int) -> int:
    """Threads per block for rows of ``tpr`` threads: rows of up to 32 share ROW_SMALL_BLOCK, longer ones
    get a block each."""
    return ROW_SMALL_BLOCK if tpr <= 32 else tpr


def _row_min_blocks(block: int, knobs: Knobs) -> int:
    return max(1, min(2048 // block, knobs.row_threads_per_sm // block))


def plan_rows(length: int, rows: int, itemsize: int, sm_count: int = 132, knobs: Knobs = DEFAULT_KNOBS) -> RowsPlan:
    """Threads per row: the smallest of :func:`row_tprs` that leaves each thread about ``knobs.row_items``
    16-byte vectors (so several loads are in flight). The grid covers the rows, capped at
    ``knobs.row_waves`` waves of resident blocks (``min_blocks`` per SM, guaranteed by the register cap).
    ``tpr`` depends only on the row length: a row's result does not depend on the batch."""
    nvec = _cdiv(length, 16 // itemsize)
    tprs = row_tprs(knobs)
    tpr = next((t for t in tprs if t * knobs.row_items >= nvec), tprs[-1])
    block = row_block(tpr)
    min_blocks = _row_min_blocks(block, knobs)
    per_block = block // tpr
    grid = _cdiv(rows, per_block)
    if knobs.row_waves is not None:
        grid = min(grid, knobs.row_waves * sm_count * min_blocks)
    # RowCursor splits row indices below 2^31 with 32-bit division.
    grid = max(1, min(grid, (2**31 - 1) // per_block))
    return RowsPlan(tpr, block, grid, knobs.row_unroll, min_blocks, length < ROW_INDEX32_LIMIT)


@dataclass(frozen=True)
class ColsPlan:
    vec: int  # adjacent columns a thread owns
    vector: bool  # one aligned pack load per row (else vec scalar loads)
    cw: int  # column lanes per block (the other BLOCK / cw lanes split the rows)
    slices: int
    rows_per_slice: int
    strips: int
    outer: int

    block: int = COL_BLOCK

    @property
    def grid(self) -> int:
        return self.strips * self.slices * self.outer

    @property
    def config(self) -> LaunchConfig:
        return LaunchConfig(grid=(self.grid,), block=(self.block,))


def col_vector_width(itemsize: int, acc_itemsize: int) -> int:
    """Columns a thread owns: a 16-byte pack, but at most COL_ACC_BYTES of accumulators."""
    return min(16 // itemsize, COL_ACC_BYTES // acc_itemsize)


def plan_cols(outer: int, rows: int, cols: int, vec: int, vector: bool, sm_count: int = 132, *,
              slices: int | None = None) -> ColsPlan:
    """Column lanes: 256 (a block spans 256 * vec columns) when the columns fill that, else 32 with 8 row
    lanes. Slices: enough row slices that the grid makes ``COL_WAVES`` waves of resident blocks, each slice
    at least ``COL_MIN_ROWS`` rows. ``slices`` forces a count (1 for the second pass over the partials,
    which is short, so it takes 32 column lanes: 8x the blocks of 256)."""
    cw = COL_BLOCK if cols >= COL_BLOCK * vec and slices is None else 32
    strips = _cdiv(cols, cw * vec)
    if slices is None:
        target = COL_WAVES * sm_count * (2048 // COL_BLOCK)
        slices = max(1, min(_cdiv(target, strips * outer), rows // COL_MIN_ROWS))
    rows_per_slice = _cdiv(rows, slices) if rows else 1
    slices = max(1, _cdiv(rows, rows_per_slice))
    if strips * slices * outer >= 2**31:
        raise ValueError(f"column reduction of {outer} x {rows} x {cols} needs too many blocks")
    return ColsPlan(vec, vector, cw, slices, rows_per_slice, strips, outer)


@dataclass(frozen=True)
class StridedPlan(_OneLaunch):
    block: int
    grid: int


def plan_strided(outputs: int, sm_count: int = 132) -> StridedPlan:
    warps = STRIDED_BLOCK // 32
    resident = sm_count * (2048 // STRIDED_BLOCK)
    return StridedPlan(STRIDED_BLOCK, max(1, min(_cdiv(outputs, warps), STRIDED_WAVES * resident)))


# ---------------------------------------------------------------------------------------------------------
# Instantiations, generated from the same tables the dispatcher uses.


def _full_inst(t, o, op: int, p: FullPlan) -> Instantiation:
    return Instantiation(SOURCE, "reduce_full", (t, o, op, p.block, p.unroll))


def _rows_inst(t, o, op: int, p: RowsPlan) -> Instantiation:
    index = I32 if p.index32 else I64
    return Instantiation(SOURCE, "reduce_rows", (t, o, op, p.block, p.unroll, p.min_blocks, index))


def _row_plans(knobs: Knobs = DEFAULT_KNOBS) -> list:
    """A rows plan for each threads-per-row choice and index width (the instantiation depends on the block
    and the index width only)."""
    out = []
    for tpr in row_tprs(knobs):
        block = row_block(tpr)
        for index32 in (True, False):
            out.append(RowsPlan(tpr, block, 1, knobs.row_unroll, _row_min_blocks(block, knobs), index32))
    return out


def _cols_inst(t, p_dtype, op: int, vec: int) -> Instantiation:
    return Instantiation(SOURCE, "reduce_cols", (t, p_dtype, op, vec, COL_BLOCK))


def _strided_inst(t, o, op: int) -> Instantiation:
    return Instantiation(SOURCE, "reduce_strided", (t, o, op, STRIDED_BLOCK))


def _combine_op(op: int) -> int:
    return OP_SUM if op == OP_SUMSQ else op


def kernel_combos() -> list:
    """Every (input dtype, kernel result dtype, kernel op) the public ops can ask for."""
    out = set()
    for name, op in OPS.items():
        for t in op.inputs:
            for o in kernel_dtypes(name, t):
                out.add((t, o, op.kernel_op))
    return sorted(out, key=lambda c: (c[2], dtype_name(c[0]), dtype_name(c[1])))


def instantiations() -> list:
    """Every production instantiation the dispatcher can launch: for each combo, the full, rows and strided
    kernels, and the column kernel writing results (one pass), writing partials (first of two passes) and
    reading partials (second pass)."""
    out = set()
    for t, o, op in kernel_combos():
        a = acc_dtype(o)
        out.add(_full_inst(t, o, op, plan_full(1, t.itemsize)))
        for rp in _row_plans():
            out.add(_rows_inst(t, o, op, rp))
        out.add(_strided_inst(t, o, op))
        vec = col_vector_width(t.itemsize, a.itemsize)
        out.add(_cols_inst(t, o, op, vec))
        out.add(_cols_inst(t, a, op, vec))
        out.add(_cols_inst(a, o, _combine_op(op), col_vector_width(a.itemsize, a.itemsize)))
    return sorted(out, key=lambda i: (i.name, i.expression))


# ---------------------------------------------------------------------------------------------------------
# Workspace: a partials buffer and a zeroed counter per (device, stream), allocated once. Kernels on one
# stream run in order, so they share it safely; the last block resets the counter, so no memset per call.
#
# Bounded: at most _WORKSPACE_MAX entries (32 KiB + 4 bytes each); a new stream beyond that evicts the
# oldest entry (insertion order). Eviction only drops this dict's reference; the buffers are freed once
# nothing else holds them (fast-path launchers keep theirs, ``_Launcher.keep``). Freeing while a kernel on
# that stream may still be using the buffers is safe because they were allocated on that very stream (the
# current stream at ``workspace()`` time) and CuPy's memory pool returns a freed block to the arena of the
# stream that allocated it: only later allocations on the same stream reuse it, and those run after the
# in-flight kernel in stream order; another stream never gets it (the pool gives cached blocks back to the
# driver only through cudaFree, which waits for the device). An evicted stream that reduces again simply
# gets a fresh workspace. (With an allocator that is not stream-ordered this way, 64 concurrently active
# streams per process is the assumption; CuPy's own pool has the same stream-pointer-reuse caveat.)

_WORK_ELEMENTS = 4096  # partials (8 bytes each) room; plans use at most blocks_per_sm * sm_count
_WORKSPACE_MAX = 64  # (device, stream) entries kept
_workspaces: dict = {}
_work_lock = threading.Lock()


@dataclass
class Workspace:
    partials: object  # cupy uint8 buffer, 8-byte slots
    counter: object  # cupy uint32[1], zero between launches


def workspace():
    """The current stream's workspace on the current device."""
    import cupy

    key = (cupy.cuda.Device().id, cupy.cuda.get_current_stream().ptr)
    ws = _workspaces.get(key)
    if ws is None:
        with _work_lock:
            ws = _workspaces.get(key)
            if ws is None:
                while len(_workspaces) >= _WORKSPACE_MAX:  # the oldest first (see the note above)
                    del _workspaces[next(iter(_workspaces))]
                ws = Workspace(cupy.empty(_WORK_ELEMENTS * 8, dtype=np.uint8), cupy.zeros(1, dtype=np.uint32))
                _workspaces[key] = ws
    return ws


# ---------------------------------------------------------------------------------------------------------
# The whole plan of one reduction (pure), and its launches.


def _cols_aligned(ptr: int, vec: int, itemsize: int, strides) -> bool:
    """Whether the base address and the row and matrix strides keep every column pack aligned."""
    return ptr % (vec * itemsize) == 0 and all(s % vec == 0 for s in strides)


def _contiguous_strides(shape) -> tuple:
    out, step = [], 1
    for n in reversed(shape):
        out.append(step)
        step *= max(n, 1)
    return tuple(reversed(out))


@dataclass(frozen=True)
class Plan:
    """Every launch one reduction makes: ``copy`` (the input is first copied to contiguous, reduced axes
    last), then the kernel for ``layout.kind`` with its plan; ``cols2`` is the second column pass over the
    per-slice partials (None when the rows were not split)."""

    layout: Layout
    copy: bool
    kernel: object  # FullPlan, RowsPlan, ColsPlan, StridedPlan, or None for kind "none"
    cols2: ColsPlan | None = None


def plan(shape, dtype, axis=None, *, strides=None, ptr: int = 0, op: str = "sum", out_dtype=None,
         sm_count: int = 132, knobs: Knobs = DEFAULT_KNOBS) -> Plan:
    """The launches for reducing ``axis`` of an array of ``shape`` and ``dtype`` with ``strides`` (in
    elements; default contiguous) at address ``ptr`` (only its alignment matters), for ``op`` producing
    ``out_dtype`` (default: ``op``'s NumPy result dtype). Pure: depends on nothing else."""
    shape = tuple(shape)
    t = np.dtype(dtype)
    o = np.dtype(out_dtype) if out_dtype is not None else default_dtype(op, t)
    strides = _contiguous_strides(shape) if strides is None else tuple(strides)
    axes = normalize_axis(axis, len(shape))
    layout = classify(shape, strides, axes)
    copy = layout.kind == "copy"
    if copy:
        order = [i for i in range(len(shape)) if i not in axes] + list(axes)
        moved = tuple(shape[i] for i in order)
        layout = classify(moved, _contiguous_strides(moved), tuple(range(len(shape) - len(axes), len(shape))))
        ptr = 0
    kind = layout.kind
    if kind == "none":
        return Plan(layout, copy, None)
    if kind == "full":
        return Plan(layout, copy, plan_full(layout.count, t.itemsize, sm_count, knobs))
    if kind == "rows":
        return Plan(layout, copy, plan_rows(layout.count, layout.outputs, t.itemsize, sm_count, knobs))
    if kind == "strided":
        return Plan(layout, copy, plan_strided(layout.outputs, sm_count))
    outer, s_outer, rows, s_row, cols = cols_geometry(layout)
    a = acc_dtype(o)
    vec = col_vector_width(t.itemsize, a.itemsize)
    first = plan_cols(outer, rows, cols, vec, _cols_aligned(ptr, vec, t.itemsize, (s_row, s_outer)), sm_count)
    if first.slices == 1:
        return Plan(layout, copy, first)
    vec2 = col_vector_width(a.itemsize, a.itemsize)
    second = plan_cols(outer, first.slices, cols, vec2, _cols_aligned(0, vec2, a.itemsize, (cols,)), sm_count,
                       slices=1)
    return Plan(layout, copy, first, second)


@functools.lru_cache(maxsize=1024)
def _plan_cached(shape, dtype, axes, strides, ptr_mod16, out_dtype, sm, knobs=DEFAULT_KNOBS):
    """:func:`plan`, memoized: host time per call matters at mid sizes, where the kernel takes microseconds."""
    return plan(shape, dtype, axes, strides=strides, ptr=ptr_mod16, out_dtype=out_dtype, sm_count=sm, knobs=knobs)


def plan_instantiations(pl: Plan, t, o, op: int) -> list:
    """The kernels plan ``pl`` launches, in order, for input dtype ``t``, kernel result dtype ``o`` and
    kernel op ``op``."""
    t, o = np.dtype(t), np.dtype(o)
    p, kind = pl.kernel, pl.layout.kind
    if kind == "full":
        return [_full_inst(t, o, op, p)]
    if kind == "rows":
        return [_rows_inst(t, o, op, p)]
    if kind == "strided":
        return [_strided_inst(t, o, op)]
    if kind == "cols":
        if pl.cols2 is None:
            return [_cols_inst(t, o, op, p.vec)]
        a = acc_dtype(o)
        return [_cols_inst(t, a, op, p.vec), _cols_inst(a, o, _combine_op(op), pl.cols2.vec)]
    return []


class _Launcher:
    """One single-kernel reduction, prepared: the kernel, its launch shape and every argument but the output
    and the input address, converted once. ``run(out, x)`` launches into ``out``; calling it on ``x``
    allocates the result of ``shape`` and ``dtype`` first. Valid for arrays of the shape, strides, dtype,
    16-byte alignment, device and stream it was built for (the fast-path cache key)."""

    __slots__ = ("kernel", "grid", "block", "head", "offset", "tail", "shape", "dtype", "new", "keep")

    def __init__(self, kernel, config: LaunchConfig, signature: Signature, head, offset: int, tail, shape, dtype,
                 keep=None):
        import cupy

        args = signature.convert((None, *head, 0, *tail))
        self.kernel, self.grid, self.block = kernel, config.grid, config.block
        self.head, self.tail = args[1:1 + len(head)], args[2 + len(head):]
        self.offset, self.shape, self.dtype = offset, shape, np.dtype(dtype)
        self.new, self.keep = cupy.ndarray, keep

    def run(self, out, x) -> None:
        # The array itself is passed as the pointer when no offset applies: cheaper than a NumPy scalar.
        src = np.uint64(x.data.ptr + self.offset) if self.offset else x
        self.kernel(self.grid, self.block, (out, *self.head, src, *self.tail))

    def __call__(self, x):
        out = self.new(self.shape, self.dtype)
        src = np.uint64(x.data.ptr + self.offset) if self.offset else x
        self.kernel(self.grid, self.block, (out, *self.head, src, *self.tail))
        return out


def _launcher(pl: Plan, x, t, o, op: int, finalize: int, divisor: float, shape) -> _Launcher | None:
    """The prepared launch of plan ``pl`` for arrays like ``x`` (None for the two-pass column plan)."""
    layout, p = pl.layout, pl.kernel
    if pl.cols2 is not None:
        return None
    kernel = get_kernel(plan_instantiations(pl, t, o, op)[0])
    tail = (finalize, divisor)
    if layout.kind == "full":
        (n, stride), = layout.red
        offset = 0
        if stride < 0:
            offset, stride = (n - 1) * stride * x.itemsize, -stride
        if p.grid > _WORK_ELEMENTS:
            raise ValueError(f"full-reduction grid {p.grid} exceeds the workspace ({_WORK_ELEMENTS} partials)")
        ws = workspace()
        return _Launcher(kernel, p.config, _FULL_SIG, (ws.partials.data.ptr, ws.counter.data.ptr), offset,
                         (n, stride) + tail, shape, o, keep=ws)
    if layout.kind == "rows":
        inner, s0, s1 = two_level(layout.kept)
        return _Launcher(kernel, p.config, _ROWS_SIG, (), 0,
                         (layout.outputs, layout.count, inner, s0, s1, p.tpr) + tail, shape, o)
    if layout.kind == "strided":
        o_inner, o_s0, o_s1 = two_level(layout.kept)
        r_inner, r_s0, r_s1 = two_level(layout.red)
        return _Launcher(kernel, p.config, _STRIDED_SIG, (), 0,
                         (layout.outputs, o_inner, o_s0, o_s1, layout.count, r_inner, r_s0, r_s1) + tail, shape, o)
    outer, s_outer, rows, s_row, cols = cols_geometry(layout)
    return _Launcher(kernel, p.config, _COLS_SIG, (), 0,
                     (outer, rows, cols, s_outer, s_row, p.rows_per_slice, 1, p.strips, p.cw, p.vector) + tail,
                     shape, o)


def _launch(pl: Plan, out, x, t, o, op: int, finalize: int, divisor: float) -> None:
    """Run plan ``pl`` for the validated array ``x`` into the contiguous ``out``."""
    import cupy

    one = _launcher(pl, x, t, o, op, finalize, divisor, out.shape)
    if one is not None:
        one.run(out, x)
        return
    # Columns with the rows split: per-slice partials, then a second pass over them.
    layout, p, q = pl.layout, pl.kernel, pl.cols2
    kernels = [get_kernel(i) for i in plan_instantiations(pl, t, o, op)]
    outer, s_outer, rows, s_row, cols = cols_geometry(layout)
    partials = cupy.empty((outer, p.slices, cols), dtype=acc_dtype(o))
    launch(kernels[0], p.config, _COLS_SIG,
           (partials, x.data.ptr, outer, rows, cols, s_outer, s_row, p.rows_per_slice, p.slices, p.strips, p.cw,
            p.vector, FINISH_NONE, 1.0))
    launch(kernels[1], q.config, _COLS_SIG,
           (out, partials, outer, p.slices, cols, p.slices * cols, cols, q.rows_per_slice, 1, q.strips, q.cw,
            q.vector, finalize, divisor))


# ---------------------------------------------------------------------------------------------------------
# The host fast path. A call that has been seen before (same op, arguments, shape, strides, dtype, 16-byte
# alignment, device, stream and knobs; with ``out``, also its shape, strides, dtype, device and item
# alignment) skips validation and planning: one dict lookup, the result allocation (or, with ``out``, the
# overlap check) and the launch. Entries are made only after the general path validated and planned such a
# call.

_fast: dict = {}
_FAST_MAX = 4096
_cp = None


def _fast_key(name: str, x, axis, dtype, keepdims):
    """The cache key of a call, or None for arguments the fast path does not take (axis and dtype values
    that compare equal to valid ones without being valid, such as axis=True, go the general path)."""
    ta = type(axis)
    if not (axis is None or ta is int or (ta is tuple and all(type(a) is int for a in axis))):
        return None
    if not (dtype is None or type(dtype) in (str, type) or isinstance(dtype, np.dtype)):
        return None
    if type(keepdims) is not bool:
        return None
    mem = x.data
    dev = mem.device_id
    if dev != _cp.cuda.runtime.getDevice():
        return None
    return (name, x.shape, x.strides, x.dtype, mem.ptr % 16, axis, dtype, keepdims, dev,
            _cp.cuda.get_current_stream().ptr)


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
        return _tuning.lookup("sum", x.data.device_id, x.dtype, (x.size,)) or DEFAULT_KNOBS
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
    return _tuning.lookup("sum_rows", x.data.device_id, x.dtype, (x.size // length, length)) or DEFAULT_KNOBS


# ---------------------------------------------------------------------------------------------------------
# Validation and the public ops.


def _result_shape(shape, axes, keepdims: bool) -> tuple:
    if keepdims:
        return tuple(1 if i in axes else n for i, n in enumerate(shape))
    return tuple(n for i, n in enumerate(shape) if i not in axes)


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


def _elementwise(op: Op, x, o):
    """Reductions over no elements besides size-1 axes: each output is its one input element."""
    import cupy

    v = x.astype(o)
    if op.finalize == FINISH_SQRT:
        return cupy.abs(v)
    return v * v if op.kernel_op == OP_SUMSQ else v


def _reduce(name: str, x, axis, dtype, keepdims: bool, out, knobs: Knobs | None = None):
    """The public ops' body. ``knobs`` picks the tuning (for sweeps); None: the tuning cache's winner for
    this call (:func:`_tuned_knobs`), else :data:`DEFAULT_KNOBS`."""
    global _cp
    if _cp is None:
        import cupy

        _cp = cupy
    key = None
    nd = _cp.ndarray
    if type(x) is nd and (out is None or type(out) is nd):
        if knobs is None:
            knobs = _tuned_knobs(x, axis)
        try:
            key = _fast_key(name, x, axis, dtype, keepdims)
            if key is not None:
                key += (knobs,) if out is None else (knobs, *_out_key(out))
            fast = _fast.get(key)
        except TypeError:  # unhashable arguments: the general path reports them
            key = fast = None
        if fast is not None:
            if out is None:
                return fast(x)
            _check.check_no_overlap(out, "out", x, "x", identical_ok=False)
            fast.run(out, x)
            return out
    op = OPS[name]
    x = _check.as_array(x, "x")
    _check.check_dtype(x, "x", op.inputs)
    if knobs is None:
        knobs = _tuned_knobs(x, axis)
    axes = normalize_axis(axis, x.ndim)
    final = result_dtype(name, x.dtype, dtype)
    o = x.dtype if op.kernel_op in (OP_MAX, OP_MIN) else final
    shape = _result_shape(x.shape, axes, keepdims)
    if out is not None:
        out = _validate_out(out, shape, final, x)
    count = math.prod(x.shape[i] for i in axes)
    if count == 0 and op.kernel_op in (OP_MAX, OP_MIN):
        raise ValueError(f"zero-size array to reduction operation {name} which has no identity")
    # The kernels write a C-contiguous out of the final dtype directly: no temporary, no copy.
    direct = (out is not None and o == final and count > 0 and out.flags.c_contiguous
              and out.data.ptr % out.itemsize == 0)

    with x.device:
        if key is not None and o == final and count > 0 and (out is None or direct):
            fast = _fast_launcher(op, x, axes, o, count, shape, knobs)
            if fast is not None:
                if len(_fast) >= _FAST_MAX:
                    _fast.clear()
                _fast[key] = fast
                if out is None:
                    return fast(x)
                fast.run(out, x)
                return out
        if direct:
            kept_shape = tuple(n for i, n in enumerate(x.shape) if i not in axes)
            _compute(op, x, axes, o, count, knobs, into=out.reshape(kept_shape))
            return out
        result = _compute(op, x, axes, o, count, knobs).reshape(shape)
        if result.dtype != final:
            result = result.astype(final)
        if out is None:
            return result
        out[...] = result
        return out


def _fast_launcher(op: Op, x, axes, o, count: int, shape, knobs: Knobs = DEFAULT_KNOBS) -> _Launcher | None:
    """The prepared single launch producing the result of ``shape`` directly, when the plan is one kernel
    on ``x`` as it is (no copy, not the two-pass column plan, a non-empty result)."""
    if x.data.ptr % x.itemsize or math.prod(shape) == 0:
        return None
    strides = tuple(s // x.itemsize for s in x.strides)
    pl = _plan_cached(x.shape, x.dtype, axes, strides, x.data.ptr % 16, o, sm_count(x.device.id), knobs)
    if pl.copy or pl.layout.kind == "none" or pl.cols2 is not None:
        return None
    return _launcher(pl, x, x.dtype, o, op.kernel_op, op.finalize, float(count), shape)


def _compute(op: Op, x, axes, o, count: int, knobs: Knobs = DEFAULT_KNOBS, into=None):
    """The reduction as a contiguous array in the kept axes' order: a fresh one, or ``into`` (C-contiguous,
    of the kept shape and dtype ``o``) filled in place and returned."""
    import cupy

    kept_shape = tuple(n for i, n in enumerate(x.shape) if i not in axes)
    result = cupy.empty(kept_shape, dtype=o) if into is None else into
    if result.size == 0:
        return result
    if x.data.ptr % x.itemsize:
        x = x.copy()
    strides = tuple(s // x.itemsize for s in x.strides)
    pl = _plan_cached(x.shape, x.dtype, axes, strides, x.data.ptr % 16, o, sm_count(x.device.id), knobs)
    if pl.layout.kind == "none":
        if into is None:
            return _elementwise(op, x, o).reshape(kept_shape)
        into[...] = _elementwise(op, x, o).reshape(kept_shape)
        return into
    if pl.copy:
        order = [i for i in range(x.ndim) if i not in axes] + list(axes)
        x = cupy.ascontiguousarray(x.transpose(order))
    _launch(pl, result, x, x.dtype, o, op.kernel_op, op.finalize, float(count))
    return result


def bytes_moved(shape, dtype, axis=None, *, op: str = "sum", keepdims: bool = False) -> int:
    """Bytes the reduction must move: x read once, the result written once (in ``op``'s default dtype)."""
    shape = tuple(shape)
    axes = normalize_axis(axis, len(shape))
    out = math.prod(_result_shape(shape, axes, keepdims))
    return math.prod(shape) * np.dtype(dtype).itemsize + out * default_dtype(op, dtype).itemsize


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
        kernel directly when C-contiguous (CUDA-graph capturable), else through a temporary.

    Deterministic: the same input gives bit-identical results on every run.
    """
    return _reduce("sum", x, axis, dtype, keepdims, out)


def mean(x, axis=None, *, dtype=None, keepdims=False, out=None):
    """Arithmetic mean over ``axis``: ``sum(x) / count``, accumulated as :func:`sum`; integer and bool
    inputs give float64. An empty reduction gives NaN, as NumPy (without its warning)."""
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

