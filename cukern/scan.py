"""Scans: cumsum and cumprod along an axis (kernels in ``cuda_src/scan.cu``).

References (float64, :mod:`cukern.reference`): ``np.cumsum`` and ``np.cumprod`` over the same axis. NumPy's
semantics: ``axis=None`` scans the flattened array (C order), an int axis (negative counts from the end)
scans each line along it; ``dtype`` picks the result dtype (default: x's for floats, int64 for bool and
signed integers, uint64 for unsigned ones; pairs without a kernel go through a conversion, :func:`route`);
``out`` receives the result.

Memory traffic, the count every GB/s figure uses: x read once, out written once (:func:`bytes_moved`).

Reproducibility: one pass with decoupled look-back over tiles of :func:`tile` elements (fixed by the
dtypes) in groups of :data:`GROUP` tiles, constants of the definition, not knobs. Every output is one fixed
expression of its line's values (``cuda_src/scan.cu``'s notes; :func:`cukern.reference.cumsum_emulated` and
``cumprod_emulated`` evaluate it on the host): the bits depend only on the values, the position in the line,
the dtypes and the op, never on the grid, the order in which blocks run, the SM count or the GPU.
Accumulation: float32 for float32 / float16 / bfloat16 results, float64 for float64, int64 (wrapping) for
int64. The sums' rounding is that of a sequential sum over groups of tiles, over the tiles of a group and a
tree-like sum inside a tile, so float32 results differ from NumPy's sequential sum within the usual error
bound.

Workspace: per (device, stream), a tile counter, a status word and a value per tile and per group (at most
as many groups as tiles: two 64-bit words and three 16-byte values per tile), grown to the largest call; status
words carry the launch's epoch, so eager calls never clear them. Buffers it outgrows are kept, never freed.

CUDA graphs. A call made while its stream is capturing records a clearing of the status words it will use
and its launch, tagged with an epoch no eager call uses (:data:`CAPTURED_EPOCH`), so every replay starts from
cleared words and leaves none that a later eager launch could take for its own. It allocates nothing but its
result when ``out`` is not given (the caller's: the graph writes it on every replay). It needs the stream's
workspace large enough already (one eager call of that size on the stream first), and replays must run in
order with that stream's scans, as the reductions' workspaces must. Calls that would go through a temporary
(a layout copied first, a conversion of x, an ``out`` of another dtype) are refused with a RuntimeError
before anything is recorded.

Layouts: the scanned axis may have any stride; the other axes of x and out are merged into at most two
levels of lines; anything else goes through C-contiguous temporaries. ``out`` may be x itself (in place):
each tile reads its elements before writing them, and touches no other tile's.
"""

from __future__ import annotations

import functools
import math
import operator
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import cukern._check as _check
import cukern._convert as _convert

from ._compile import Instantiation, get_kernel
from ._dtypes import BFLOAT16, dtype_name, parse_dtype
from ._interop import check_item_aligned
from ._launch import NULL, X_COPIED, CallCache, LaunchConfig, Params, launch, on_device, refuse_temporary_in_capture
from ._launch import SEQUENCE_LOCK, Prepared, sm_count, stream_key, struct_argument
from ._launch import cupy as _cupy
from ._layout import collapse, k_order
from ._typing import DeviceArray, DTypeLike

SOURCE = "scan"
BLOCK = 256  # SCAN_BLOCK in cuda_src/scan.cu: the definition's threads
GROUP = 32  # SCAN_GROUP: tiles a group
SPAN = 4096  # elements a scan_tiles block takes: one tile, or two of float32's 2048
# scan_columns walks each group of 32 lines whole in one block, so it takes lines of more than one tile only
# with at least this many bytes of each row of lines an SM (float32: 0.36 column groups an SM, the half types
# 0.73); below it, column_tiles spreads the tiles over blocks (docs/design/scan.md,
# "Columns": at 46.5 bytes an SM float32 43% walked against 45%, float16 34% against 35%; at 62, 53%
# against 44% and 41% against 34%)
COLUMN_WALK_BYTES_PER_SM = 48
# scan_columns' modes (cuda_src/scan.cu): a block walking a column group's tiles; a block a column group's tile,
# its aggregates; the same tile's results from the prefixes scan_column_prefixes forms between the two
COLUMN_WALK, COLUMN_AGGREGATES, COLUMN_FINISH = 0, 1, 2
SCAN_SUM, SCAN_PROD = 0, 1
OPS = {"cumsum": SCAN_SUM, "cumprod": SCAN_PROD}
_F32, _F64, _F16, _I32, _I64, _BOOL = (np.dtype(t) for t in (np.float32, np.float64, np.float16, np.int32, np.int64,
                                                              np.bool_))
_C64, _C128 = np.dtype(np.complex64), np.dtype(np.complex128)
DEFAULT_DTYPE = {_F32: _F32, _F64: _F64, _F16: _F16, BFLOAT16: BFLOAT16, _I32: _I64, _I64: _I64, _BOOL: _I64,
                 _C64: _C64, _C128: _C128}
# (input, result) pairs with a kernel: each input's default, and float32 scanned in float64. Complex pairs
# are cumprod's only (cumsum scans a complex array's parts apart, as float lines: :func:`_complex`).
PAIRS = tuple(DEFAULT_DTYPE.items()) + ((_F32, _F64),)
DTYPES = tuple(DEFAULT_DTYPE)
AHEAD_DTYPES = (_F32, _F16, BFLOAT16)  # scan_ahead's: each scanned into itself, accumulated in float32

# The kernel's scalars, one struct (``ScanParams`` in cuda_src/scan.cu; its unsigned epoch, below 2^30, packs
# as an i32).
PARAMS = Params((("inner", "i64"), ("x_s0", "i64"), ("x_s1", "i64"), ("x_step", "i64"), ("o_s0", "i64"),
                 ("o_s1", "i64"), ("o_step", "i64"), ("n", "i64"), ("tiles_per_row", "i64"), ("tiles", "i64"),
                 ("epoch", "i32")))
EPOCHS = 1 << 30  # status words keep an epoch in their top 30 bits
CAPTURED_EPOCH = EPOCHS - 1  # captured launches' (after clearing the words); eager ones cycle through 1 .. EPOCHS - 2


def items(dtype, out_dtype) -> int:
    """Elements each of the definition's :data:`BLOCK` threads holds (cuda_src/scan.cu ``scan_items``), part of
    the result's definition: 8 for float32 scanned into float32, 16 for every other pair."""
    return 8 if np.dtype(dtype) == _F32 and np.dtype(out_dtype) == _F32 else 16


def tile(dtype, out_dtype) -> int:
    """Elements a tile: 2048 for float32 scanned into float32, 4096 for every other pair."""
    return BLOCK * items(dtype, out_dtype)


def ahead_blocks(dtype) -> int:
    """scan_ahead's resident blocks an SM for x of ``dtype`` (cuda_src/scan.cu ``scan_ahead_blocks``), its
    grid's unit: 6 for float32, 5 for the half types."""
    return 6 if np.dtype(dtype).itemsize == 4 else 5


def result_dtype(dtype, requested=None) -> np.dtype:
    """The result dtype: ``requested`` when given (it must make a pair of :data:`PAIRS` with ``dtype``), else
    NumPy's default for cumsum and cumprod."""
    t = np.dtype(dtype)
    if requested is None:
        return DEFAULT_DTYPE[t]
    r = parse_dtype(requested)
    if (t, r) not in PAIRS:
        allowed = ", ".join(dtype_name(o) for i, o in PAIRS if i == t)
        raise TypeError(f"dtype={dtype_name(r)} is not supported for x of {dtype_name(t)}; use one of {allowed}")
    return r


def _numeric(t: np.dtype) -> bool:
    return t.kind in "biuf" or t == BFLOAT16


def route(dtype, requested=None):
    """How x of ``dtype`` is scanned into NumPy's result dtype for ``requested`` (None: NumPy's default, int64
    for bool and signed integers, uint64 for unsigned ones, a float's own): None where a pair of :data:`PAIRS`
    does it, else ``(via, result)``: x converted to ``via`` (NumPy's element conversion; uint64 only viewed
    as int64, and a float into a uint64 result converted as NumPy converts it, since its values may pass
    int64's range), scanned into ``via`` (int64 for integer results), and that converted to ``result``. Integer
    sums and products wrap, so their low bits are those of the narrower integer arithmetic NumPy would do.
    A bool result goes through bool: NumPy adds bools as "or" and multiplies them as "and", and an int64
    count of the nonzero elements so far (a product of zeros and ones) is nonzero exactly where that is
    True. TypeError for complex and other non-numeric dtypes, either side."""
    t = np.dtype(dtype)
    if not _numeric(t):
        names = ", ".join(dtype_name(d) for d in DTYPES)
        raise TypeError(f"x has dtype {dtype_name(t)}; supported: {names}, and the other integer types")
    if requested is None:
        r = DEFAULT_DTYPE.get(t) or np.dtype(np.uint64 if t.kind == "u" else np.int64)
    else:
        r = parse_dtype(requested)
        if r.kind == "b":
            return _BOOL, r
        if not _numeric(r):
            raise TypeError(f"dtype={dtype_name(r)} is not supported; use a float, integer or bool type")
    if (t, r) in PAIRS:
        return None
    if r.kind in "iu":
        return (t if t in (_I32, _I64, _BOOL) else _I64), r
    return r, r


def normalize_axis(axis, ndim: int):
    """None, or ``axis`` as a non-negative int below ``ndim`` (TypeError for anything but None or an int,
    AxisError when out of range)."""
    if axis is None:
        return None
    if isinstance(axis, (bool, np.bool_)) or not isinstance(axis, (int, np.integer)):
        raise TypeError(f"axis must be None or an int, got {axis!r}")
    a = operator.index(axis)
    if not -ndim <= a < ndim:
        raise np.exceptions.AxisError(f"axis {a} is out of bounds for an array of dimension {ndim}")
    return a % ndim


@dataclass(frozen=True)
class Plan:
    """One call's launch: ``rows`` lines of ``n`` elements, line r of x at ``r // inner * x_s0 + r % inner *
    x_s1`` with elements ``x_step`` apart (out likewise), ``tiles_per_row`` tiles of ``tile`` elements a line.
    ``copy``: x is first copied to C-contiguous and the scan goes into a C-contiguous temporary. ``kernel``:
    "tiles" (scan_tiles, one block a span of :data:`SPAN` elements: one tile, or two of float32's) or "ahead"
    (scan_ahead, ``blocks_per_sm`` resident blocks an SM of ``sm_count`` walking the tiles); both compute the
    same expression."""

    rows: int
    n: int
    copy: bool
    inner: int = 1
    x: tuple = (0, 0, 1)  # s0, s1, step
    o: tuple = (0, 0, 1)

    tile: int = BLOCK * 16

    @property
    def tiles_per_row(self) -> int:
        return -(-self.n // self.tile)

    @property
    def tiles(self) -> int:
        return self.rows * self.tiles_per_row

    threads: int = BLOCK
    kernel: str = "tiles"
    sm_count: int = 132
    shared: int = 0  # dynamic shared memory (:func:`stage_bytes`)
    blocks_per_sm: int = 5  # scan_ahead's (:func:`ahead_blocks`)

    @property
    def grid(self) -> int:
        if self.kernel == "ahead":
            return min(self.tiles, self.blocks_per_sm * self.sm_count)
        if self.kernel == "columns":
            return column_groups(self.rows, self.inner)
        if self.kernel == "column_tiles":
            return column_groups(self.rows, self.inner) * self.tiles_per_row
        return self.rows * -(-self.tiles_per_row // (SPAN // self.tile))

    @functools.cached_property  # read on every call of a cached plan
    def config(self) -> LaunchConfig:
        return LaunchConfig(grid=(self.grid,), block=(self.threads,), shared_mem=self.shared)

    @property
    def column_values(self) -> int:
        """column_tiles: the floats between its launches, one a tile of every line slot (column groups of 32)."""
        return column_groups(self.rows, self.inner) * 32 * self.tiles_per_row

    @property
    def prefix_config(self) -> LaunchConfig:
        """column_tiles: scan_column_prefixes' launch, a thread a line slot."""
        slots = column_groups(self.rows, self.inner) * 32
        return LaunchConfig(grid=(-(-slots // BLOCK),), block=(BLOCK,))


def column_groups(rows: int, inner: int) -> int:
    """Groups of 32 neighbouring lines (the last part empty) of ``rows`` lines, ``inner`` side by side."""
    return rows // inner * -(-inner // 32)


def threads(dtype, out_dtype) -> int:
    """Threads a tile (the kernel's THREADS), each standing for ``BLOCK // threads`` threads of the definition:
    128 where x and the result have one size of 4 or 8 bytes (loaded by cp.async; more tiles in flight), else
    256. No effect on the result."""
    t = np.dtype(dtype)
    return 128 if t.itemsize == np.dtype(out_dtype).itemsize and t.itemsize >= 4 and t.kind != "c" else BLOCK


def stage_bytes(dtype, out_dtype) -> int:
    """scan_tiles' dynamic shared memory: complex128's stage (a tile of 16-byte elements and its padding,
    over the 48 KiB of static shared memory); 0 for every other pair, whose stage is static."""
    size = max(np.dtype(dtype).itemsize, np.dtype(out_dtype).itemsize)
    words = tile(dtype, out_dtype) * size // 4
    return 4 * (words + words // 32 + 1) if size > 8 else 0


def instantiation(dtype, out_dtype, op: int, kernel: str = "tiles") -> Instantiation:
    if kernel == "ahead":
        return Instantiation(SOURCE, "scan_ahead", (np.dtype(dtype), op))
    if kernel in ("columns", "column_tiles"):  # column_tiles: its last launch (column_instantiations)
        mode = COLUMN_WALK if kernel == "columns" else COLUMN_FINISH
        return Instantiation(SOURCE, "scan_columns", (np.dtype(dtype), np.dtype(out_dtype), op, mode))
    return Instantiation(SOURCE, "scan_tiles", (np.dtype(dtype), np.dtype(out_dtype), op, threads(dtype, out_dtype)))


def column_instantiations(dtype, op: int) -> tuple:
    """column_tiles' three launches, in order: the aggregates, the prefixes, the results."""
    t = np.dtype(dtype)
    return (Instantiation(SOURCE, "scan_columns", (t, t, op, COLUMN_AGGREGATES)),
            Instantiation(SOURCE, "scan_column_prefixes", (op,)),
            Instantiation(SOURCE, "scan_columns", (t, t, op, COLUMN_FINISH)))


def instantiations() -> list:
    """One scan_tiles kernel per (input, result) pair of :data:`PAIRS` and op (complex pairs: cumprod only);
    per type of :data:`AHEAD_DTYPES` and op, one scan_ahead kernel and scan_columns in each mode; and one
    scan_column_prefixes kernel per op: all that :func:`plan`'s launches use."""
    columns = [i for t in AHEAD_DTYPES for op in (SCAN_SUM, SCAN_PROD)
               for i in (instantiation(t, t, op, "columns"),) + column_instantiations(t, op)]
    return ([instantiation(t, o, op) for t, o in PAIRS for op in (SCAN_SUM, SCAN_PROD)
             if o.kind != "c" or op == SCAN_PROD]
            + [instantiation(t, t, op, "ahead") for t in AHEAD_DTYPES for op in (SCAN_SUM, SCAN_PROD)]
            + list(dict.fromkeys(columns)))


def kernel_for(dtypes, x: tuple, o: tuple, vector: bool, inner: int = 1, rows: int = 1,
               sm_count: int = 132, tiles_per_line: int = 1) -> str:
    """The kernel: for lines of an :data:`AHEAD_DTYPES` type scanned into the same type, side by side in
    memory (x's and out's lines one element apart, at least 32 of them) and strided along their length
    (``rows`` lines in groups of ``inner``), "columns" (scan_columns walking each column group of 32 lines
    whole) for lines of one tile, or with at least :data:`COLUMN_WALK_BYTES_PER_SM` bytes of each row of
    lines an SM, else "column_tiles" (the same kernel a tile a block in two launches around
    scan_column_prefixes);
    "ahead" for lines of an :data:`AHEAD_DTYPES` type scanned into the same type, read and written with unit
    steps, each line starting 16-byte aligned (``vector``: x's and out's data are, and every line stride is a
    multiple of 16 bytes); else "tiles". scan_columns reads 32 neighbouring lines a warp, each thread
    evaluating its own line's expression; scan_ahead reads a tile twice (the second time from L1 or L2) as
    16-byte vectors; a line that it would read one element at a time stays with scan_tiles, which stages it
    through shared memory."""
    if dtypes is None:
        return "tiles"
    t, o_dtype = (np.dtype(d) for d in dtypes)
    if (t == o_dtype and t in AHEAD_DTYPES and x[1] == 1 and o[1] == 1 and (x[2] != 1 or o[2] != 1)
            and inner >= 32):
        if tiles_per_line <= 1 or column_groups(rows, inner) * 32 * t.itemsize >= COLUMN_WALK_BYTES_PER_SM * sm_count:
            return "columns"
        return "column_tiles"
    if not vector:
        return "tiles"
    if t != o_dtype or t not in AHEAD_DTYPES or x[2] != 1 or o[2] != 1:
        return "tiles"
    per_vector = 16 // t.itemsize
    return "tiles" if any(s % per_vector for s in x[:2] + o[:2]) else "ahead"


def _contiguous(shape) -> tuple:
    return tuple(int(math.prod(shape[i + 1:])) for i in range(len(shape)))


def _lines(shape, x_strides, o_strides, axis):
    """(rows, n, inner, x levels, out levels) over the kept axes, or None past two levels."""
    if axis is None:
        sizes, (xs, os) = collapse(tuple(shape), [tuple(x_strides), tuple(o_strides)])
        if len(sizes) > 1:
            return None
        return 1, math.prod(shape), 1, (0, 0, xs[0] if xs else 1), (0, 0, os[0] if os else 1)
    kept = [i for i in range(len(shape)) if i != axis]
    sizes, (xs, os) = collapse(tuple(shape[i] for i in kept), [tuple(x_strides[i] for i in kept),
                                                             tuple(o_strides[i] for i in kept)])
    if len(sizes) > 2:
        return None
    inner, xl, ol = 1, (0, 0), (0, 0)
    if len(sizes) == 1:
        inner, xl, ol = sizes[0], (0, xs[0]), (0, os[0])
    elif len(sizes) == 2:
        inner, xl, ol = sizes[1], (xs[0], xs[1]), (os[0], os[1])
    rows = math.prod(shape[i] for i in kept)
    return rows, shape[axis], inner, xl + (x_strides[axis],), ol + (o_strides[axis],)


def plan(shape, axis=None, *, x_strides=None, out_strides=None, dtypes=None, vector: bool = True,
         sm_count: int = 132) -> Plan:
    """The launch scanning ``axis`` (None or a normalized int) of an array of ``shape``; strides in elements
    (default C-contiguous; ``out_strides``: the destination's, for ``axis=None`` those of an array of
    ``shape``, the flattened result's order); ``dtypes``: (x's, the result's), for the tile, the kernel and
    its block size (None: a tile of 4096, the block of the definition); ``vector``: x's and out's data start
    16-byte aligned; ``sm_count``: the device's SMs (the grid of scan_ahead). Pure."""
    shape = tuple(shape)
    c = _contiguous(shape)
    xs = c if x_strides is None else tuple(x_strides)
    os = c if out_strides is None else tuple(out_strides)
    laid = _lines(shape, xs, os, axis)
    copy = laid is None
    if copy:
        laid = _lines(shape, c, c, axis)
    rows, n, inner, xl, ol = laid
    size = BLOCK * 16 if dtypes is None else tile(*dtypes)
    if rows * -(-n // size) >= 2**31:
        raise ValueError(f"{rows} lines of {n} elements make more than 2**31 - 1 tiles")
    kernel = kernel_for(dtypes, xl, ol, vector or copy, inner, rows, sm_count, -(-n // size))
    block = BLOCK if dtypes is None or kernel != "tiles" else threads(*dtypes)
    shared = 0 if dtypes is None or kernel != "tiles" else stage_bytes(*dtypes)
    blocks = 5 if dtypes is None else ahead_blocks(dtypes[0])
    return Plan(rows, n, copy, inner, xl, ol, size, block, kernel, sm_count, shared, blocks)


def bytes_moved(shape, dtype, out_dtype=None) -> int:
    """Bytes the op must move: x read once, out written once."""
    n = math.prod(shape)
    o = DEFAULT_DTYPE[np.dtype(dtype)] if out_dtype is None else np.dtype(out_dtype)
    return n * (np.dtype(dtype).itemsize + o.itemsize)


# ---------------------------------------------------------------------------------------------------------
# Workspaces (see the module notes).


@dataclass
class Workspace:
    counter: DeviceArray  # uint32[1], zero between launches (the block drawing the last tile resets it)
    status: DeviceArray  # uint64[2 * tiles], epoch-tagged words: the tiles', then the groups'
    # uint64[6 * tiles]: the tiles' aggregates, the groups' totals, the groups' prefixes (16 bytes each)
    values: DeviceArray
    epoch: int = 0
    outgrown: list = field(default_factory=list)  # buffers a graph captured before may still use

    @property
    def tiles(self) -> int:
        return self.status.size // 2


_workspaces: dict = {}
_work_lock = threading.Lock()


def workspace(tiles: int):
    """(workspace, epoch) for a launch of ``tiles`` tiles on the current stream. Eagerly: made or grown (at
    least doubling) as needed, and the next epoch of the cycle. Under a CUDA-graph capture it must already be
    large enough (a RuntimeError otherwise, before anything is recorded); the capture then records the
    clearing of the words the launch uses and gets :data:`CAPTURED_EPOCH`."""
    cp = _cupy()
    stream = cp.cuda.get_current_stream()
    key = (cp.cuda.runtime.getDevice(), *stream_key(stream))
    if stream.is_capturing():
        ws = _workspaces.get(key)
        if ws is None or ws.tiles < tiles:
            have = "none" if ws is None else f"one for {ws.tiles}"
            raise RuntimeError(f"this scan needs the current stream's workspace for {tiles} tiles (it has {have}), "
                               "and a CUDA-graph capture cannot allocate it; make the same call once on this stream "
                               "before capturing")
        for words in (ws.status.data.ptr, ws.status.data.ptr + 8 * ws.tiles):  # the tiles', the groups'
            cp.cuda.runtime.memsetAsync(words, 0, 8 * tiles, stream.ptr)
        return ws, CAPTURED_EPOCH
    with _work_lock:
        ws = _workspaces.get(key)
        if ws is None:
            ws = _workspaces[key] = Workspace(cp.zeros(1, np.uint32), cp.zeros(2 * tiles, np.uint64),
                                              cp.empty(6 * tiles, np.uint64))
        elif ws.tiles < tiles:
            ws.outgrown += [ws.status, ws.values]
            size = max(tiles, 2 * ws.tiles)
            ws.status, ws.values = cp.zeros(2 * size, np.uint64), cp.empty(6 * size, np.uint64)
        ws.epoch = ws.epoch % (EPOCHS - 2) + 1
        if ws.epoch == 1:  # a new cycle of epochs: status words of the last one must not match
            ws.status.fill(0)
        return ws, ws.epoch


# ---------------------------------------------------------------------------------------------------------
# The public ops.


@dataclass(frozen=True)
class _Call:
    kernel: object
    plan: Plan
    struct: np.ndarray  # PARAMS packed once, epoch 0 (a look-back launch writes each call's epoch into it)
    out_dtype: np.dtype
    shape: tuple  # the result's
    params: object = None  # the column kernels' PARAMS argument, made once (no look-back: no epoch)
    # the look-back launch prepared for each workspace it ran with, by the workspace's addresses
    launches: dict = field(default_factory=dict)


_calls = CallCache()
_MISSING = CallCache.MISSING
# Why a call cannot be captured (refuse_temporary_in_capture): the temporary it would go through.
CONVERTED = ("x is scanned through a converted temporary (its dtype, or dtype=, has no kernel of its own); convert "
             "x to the result's dtype before capturing")
CAST_OUT = "the result is cast into out through a temporary; pass an out of the result's dtype"


def _prepare(op: str, x, axis, dtype, out) -> _Call:
    _check.check_dtype(x, "x", DTYPES)
    a = normalize_axis(axis, x.ndim)
    o = result_dtype(x.dtype, dtype)
    shape = (x.size,) if a is None else x.shape
    x_strides = tuple(s // x.itemsize for s in x.strides)
    out_strides = None
    if out is not None and out.shape != shape:
        out = None  # refused by _validate_out before any launch; plan as for a fresh result meanwhile
    if out is not None and a is not None:
        out_strides = tuple(s // out.itemsize for s in out.strides)
    elif out is not None and out.ndim == 1:
        out_strides = tuple(out.strides[0] // out.itemsize * c for c in _contiguous(x.shape))
    vector = x.data.ptr % 16 == 0 and (out is None or out.data.ptr % 16 == 0)
    pl = plan(x.shape, a, x_strides=x_strides, out_strides=out_strides, dtypes=(x.dtype, o), vector=vector,
              sm_count=sm_count(x.data.device_id))
    (x_s0, x_s1, x_step), (o_s0, o_s1, o_step) = pl.x, pl.o
    fields = {"inner": pl.inner, "x_s0": x_s0, "x_s1": x_s1, "x_step": x_step, "o_s0": o_s0, "o_s1": o_s1,
              "o_step": o_step, "n": pl.n, "tiles_per_row": pl.tiles_per_row, "tiles": pl.tiles}
    with on_device(x.data.device_id):
        kernel: Any
        if not pl.tiles:
            kernel = None
        elif pl.kernel == "column_tiles":
            kernel = tuple(get_kernel(i) for i in column_instantiations(x.dtype, OPS[op]))
        else:
            kernel = get_kernel(instantiation(x.dtype, o, OPS[op], pl.kernel))
        if kernel is not None and pl.shared:
            kernel.max_dynamic_shared_size_bytes = pl.shared
    struct = PARAMS.struct(**fields, epoch=0)
    params = struct_argument(struct) if pl.kernel in ("columns", "column_tiles") else None
    return _Call(kernel, pl, struct, o, shape, params)


def _lookback(ws: Workspace, call: _Call) -> Prepared:
    """``call``'s look-back launch prepared for workspace ``ws`` (made on its first use): per call it takes
    the output's and the input's addresses and the epoch (a field of the struct)."""
    at = (ws.counter.data.ptr, ws.status.data.ptr, ws.values.data.ptr, ws.tiles)
    prepared = call.launches.get(at)
    if prepared is None:
        _, status, values, size = at
        words = (status, values, status + 8 * size, values + 16 * size, values + 32 * size)
        prepared = call.launches[at] = Prepared(call.kernel, call.plan.config, (
            0, 0, ws.counter, *map(np.uint64, words), call.struct), (0, 1, (8, "epoch")))
    return prepared


def _validate_out(out, call: _Call, x):
    out = _check.check_out(out, call.shape, call.out_dtype, x)
    same = out.data.ptr == x.data.ptr and out.dtype == x.dtype and (  # in place: x itself, or its flat run
        out.strides == x.strides or (out.ndim == 1 and out.flags.c_contiguous and x.flags.c_contiguous))
    if not same:
        _check.check_no_overlap(out, "out", x, "x", identical_ok=False)
    return out


def _check_cast_out(out, x, a):
    """An ``out`` the result is cast into (any dtype): the result's shape, and x whole or apart (x is read
    whole before out is written)."""
    out = _check.check_out(out, (x.size,) if a is None else x.shape, None, x)
    _check.check_no_overlap(out, "out", x, "x", identical_ok=True)
    return out


def _routed(op: str, x, axis, via, final, out):
    """A scan :func:`route` sends through a conversion: every check first, then x converted to ``via``, its
    scan, and the result converted to ``final`` (cast into ``out`` of any dtype, as NumPy casts, unsafely;
    ``out`` may be x itself)."""
    a = normalize_axis(axis, x.ndim)
    if out is not None:
        out = _check_cast_out(out, x, a)
    refuse_temporary_in_capture(op, CONVERTED)
    with on_device(x.data.device_id):
        if x.dtype == via:
            src = x
        elif x.dtype.kind == "u" and x.itemsize == 8 and via == _I64:
            src = x.view(_I64)
        elif final == np.uint64 and via == _I64 and (x.dtype.kind == "f" or x.dtype == BFLOAT16):
            # NumPy's float -> uint64: values past int64's range by uint64's conversion, negative ones wrapped
            # by int64's (CUDA's conversions saturate, so each takes its own); ml_dtypes' bfloat16 makes a
            # negative value 0, as CUDA's uint64 conversion does
            f = _convert.astype(x, _F32) if x.dtype == BFLOAT16 else x
            src = f.astype(final).view(_I64)
            if x.dtype != BFLOAT16:
                src = _cupy().where(f < 0, f.astype(_I64), src)
        else:
            src = _convert.astype(x, via)
        scanned = DEFAULT_DTYPE[via]
        if out is not None and scanned == final == out.dtype and src is not x:
            return _run(op, src, a, scanned, out)  # src is a new array: out may be x's memory
        r = _run(op, src, a, scanned, None)
        if r.dtype != final and (out is None or out.dtype != final):  # NumPy's result (wrapped) first
            r = r.view(final) if final.kind == "u" and final.itemsize == 8 else _convert.astype(r, final)
        if out is None:
            return r
        _convert.copyto(out, r)
        return out


def _complex(op: str, x, axis, final, out):
    """cumsum of complex x, or into a complex ``dtype=``: the real and imaginary parts scanned as a trailing
    axis of a float view by the float kernels (each part its own line, as NumPy adds the parts apart), x
    converted first where it is not of ``final`` (a real x's imaginary parts are zeros). cumprod into a
    complex ``final`` of another dtype than x's: x converted, then the complex kernels (a product mixes the
    parts). Everything is checked first: a real dtype= for complex x (NumPy does not cast complex to real)
    raises TypeError."""
    cp = _cupy()
    a = normalize_axis(axis, x.ndim)  # a bad axis is an AxisError first, as NumPy's
    if final.kind != "c":
        raise TypeError(f"dtype={dtype_name(final)} is not supported for {op} of {dtype_name(x.dtype)}: NumPy "
                        "does not cast complex to real; use a complex dtype, or scan x.real")
    if op == "cumprod":
        if out is not None:
            out = _check_cast_out(out, x, a)
        refuse_temporary_in_capture(op, CONVERTED)
        with on_device(x.data.device_id):
            return _run(op, _convert.astype(x, final), a, None, out)
    shape = (x.size,) if a is None else x.shape
    if out is not None:
        out = _check_cast_out(out, x, a)
    flat_copy = a is None and not x.flags.c_contiguous
    refuse_temporary_in_capture(op, CONVERTED if x.dtype != final else X_COPIED if flat_copy
                                else CAST_OUT if out is not None and out.dtype != final else None)
    with on_device(x.data.device_id):
        src = x if x.dtype == final else _convert.astype(x, final)
        if a is None:
            src, a = cp.ascontiguousarray(src).reshape(-1), 0
        direct = out is not None and out.dtype == final
        r = out if direct else cp.empty(shape, final)
        part = np.dtype(np.float32 if final == np.complex64 else np.float64)
        parts = [cp.ndarray(v.shape + (2,), part, memptr=v.data, strides=v.strides + (part.itemsize,))
                 for v in (src, r)]
        _run(op, parts[0], a, None, parts[1], korder=False)
        if out is None or direct:
            return r
        _convert.copyto(out, r)
        return out


def _run(op: str, x, axis, dtype, out, korder: bool = True):
    """The scans' body; ``korder``: a result without ``out`` in NumPy's K order (False: C order, the inner
    call of that step)."""
    cp = _cupy()
    if type(x) is not cp.ndarray:
        x = _check.as_array(x, "x")
    if x.ndim == 0:
        x = x.reshape(1)  # NumPy scans a 0-d array as one of shape (1,): axis 0, -1 or None
    if korder and out is None and axis is not None and x.ndim > 1 and not x.flags.c_contiguous:
        perm = k_order(x.shape, x.strides, ())
        if perm is not None:  # NumPy's K order: scan x with its axes in memory order, give the result back
            r = _run(op, x.transpose(perm), perm.index(normalize_axis(axis, x.ndim)), dtype, None, korder=False)
            return r.transpose([perm.index(i) for i in range(x.ndim)])
    key = None
    call = _MISSING
    if (axis is None or type(axis) is int) and (dtype is None or isinstance(dtype, (str, type, np.dtype))) and (
            out is None or type(out) is cp.ndarray):
        okey = None if out is None else (out.shape, out.strides, out.dtype, out.data.ptr % 16)
        key = (op, x.shape, x.strides, x.dtype, x.data.ptr % 16, x.data.device_id, axis, str(dtype), okey)
        call = _calls.get(key)  # only pairs a kernel scans are ever stored
    if call is _MISSING:
        check_item_aligned(x, "x")  # (a stored call's key holds x's alignment: none was stored off it)
        if x.dtype.kind == "c" or (dtype is not None and parse_dtype(dtype).kind == "c"):
            final = x.dtype if dtype is None else parse_dtype(dtype)
            if op == "cumsum" or x.dtype != final:
                return _complex(op, x, axis, final, out)
            dtype = None  # cumprod of complex into its own dtype: a pair of the complex kernels
        how = route(x.dtype, dtype) if dtype is not None or x.dtype not in DEFAULT_DTYPE else None
        if how is not None:
            via, final = how
            return _routed(op, x, axis, via, final, out)
        if out is not None:
            out = _check.as_array(out, "out", writable=True)
            if x.dtype in DTYPES and out.dtype != result_dtype(x.dtype, dtype):  # NumPy casts into out
                a = normalize_axis(axis, x.ndim)
                out = _check_cast_out(out, x, a)
                refuse_temporary_in_capture(op, CAST_OUT)
                _convert.copyto(out, _run(op, x, a, dtype, None, korder=False))
                return out
        call = _prepare(op, x, axis, dtype, out)
        if key is not None:
            _calls.put(key, call)
    if out is not None:
        out = _validate_out(out, call, x)
    with on_device(x.data.device_id):
        pl = call.plan
        if pl.copy:
            refuse_temporary_in_capture(op, X_COPIED)
        walks = pl.kernel == "columns"  # no look-back: no workspace
        spread = pl.kernel == "column_tiles"  # no look-back: the workspace's values hold the tiles' values
        if call.kernel is not None and not walks:
            # under capture: refused (nothing recorded) or the words cleared
            ws, epoch = workspace(-(-pl.column_values // 12) if spread else pl.tiles)  # 48 value bytes a tile
        dst = out if out is not None and not pl.copy else cp.ndarray(call.shape, call.out_dtype)
        if call.kernel is not None:
            src = cp.ascontiguousarray(x) if pl.copy else x
            if walks:
                launch(call.kernel, pl.config, (dst, src, NULL, call.params))
            elif spread:
                values = np.uint64(ws.values.data.ptr)
                with SEQUENCE_LOCK:
                    launch(call.kernel[0], pl.config, (dst, src, values, call.params))
                    launch(call.kernel[1], pl.prefix_config, (values, call.params))
                    launch(call.kernel[2], pl.config, (dst, src, values, call.params))
            else:
                _lookback(ws, call)(cp.cuda.get_current_stream().ptr, dst.data.ptr, src.data.ptr, epoch)
        if out is None:
            return dst
        if dst is not out:
            cp.copyto(out, dst)
        return out


_DOC = """``out = {formula}`` along ``axis``; result dtype ``dtype`` (default: NumPy's, x's for floats, int64 for
bool and signed integers, uint64 for unsigned ones).

``out[..., i, ...] = x[..., 0, ...] {sym} ... {sym} x[..., i, ...]``, accumulated in float32 (float32, float16,
bfloat16 results), float64 or int64 (wrapping), in the fixed order of ``cuda_src/scan.cu`` (tiles of
:func:`cukern.scan.tile` elements, 2048 for float32, 4096 otherwise), so the bits do not depend on the launch
(:func:`cukern.reference.{op}_emulated`).

Parameters
----------
x : cupy.ndarray of float32, float64, float16, bfloat16, any integer type or bool, complex64 or complex128
    (cumsum scans the real and imaginary parts apart, a view, as NumPy adds them; cumprod multiplies the
    pairs, each product in correctly rounded steps); any strides.
axis : None or int
    The axis scanned (negative counts from the end); None scans the flattened array (C order).
dtype : optional
    The result dtype, any float, integer, bool or complex type. Kernels scan float32, float64, float16,
    bfloat16, complex64 and complex128 into themselves, float32 into float64, int32, int64 and bool into
    int64 (complex x into another complex dtype, or real x into a complex one, converts x first); any
    other pair first converts x (NumPy's element conversion; one more pass) to the result's float type, or
    to int64 for an integer result, which is then converted to that type: integer sums and products wrap,
    so the low bits are NumPy's (:func:`cukern.scan.route`).
out : cupy.ndarray of the result's shape (x's, or ``(x.size,)`` for None), optional; may be x itself (in
    place), must not overlap it otherwise. Of another dtype than the result, it takes the result cast (as
    NumPy's unsafe casting), through a temporary.

Returns
-------
out, or a new array laid out as x (NumPy's K order: an F-ordered x gives an F-ordered result)

Raises
------
TypeError
    For a real ``dtype=`` for complex x, or a non-int axis.
ValueError
    For an ``out`` of the wrong shape or partially overlapping x; AxisError (a ValueError) for an axis out of
    range. Every check runs before anything is launched.
RuntimeError
    Under CUDA-graph capture, for a call that would go through a temporary or whose stream has no workspace
    large enough yet (module notes).

Examples
--------
{examples}
"""

_EXAMPLES = {
    "cumsum": """\
>>> import cupy as cp
>>> import cukern
>>> y = cukern.cumsum(cp.array([1, 2, 3, 4], dtype=cp.int8))
>>> print(y.dtype, y)
int64 [ 1  3  6 10]
>>> print(cukern.cumsum(cp.array([[1.0, 2.0], [3.0, 4.0]]), axis=0))
[[1. 2.]
 [4. 6.]]""",
    "cumprod": """\
>>> import cupy as cp
>>> import cukern
>>> print(cukern.cumprod(cp.array([1.5, 2.0, -1.0], dtype=cp.float16)))
[ 1.5  3.  -3. ]""",
}


def cumsum(x: DeviceArray, axis: int | None = None, dtype: DTypeLike | None = None,
           out: DeviceArray | None = None) -> DeviceArray:
    return _run("cumsum", x, axis, dtype, out)


def cumprod(x: DeviceArray, axis: int | None = None, dtype: DTypeLike | None = None,
            out: DeviceArray | None = None) -> DeviceArray:
    return _run("cumprod", x, axis, dtype, out)


cumsum.__doc__ = _DOC.format(formula="cumsum(x, axis)", sym="+", op="cumsum", examples=_EXAMPLES["cumsum"])
cumprod.__doc__ = _DOC.format(formula="cumprod(x, axis)", sym="*", op="cumprod", examples=_EXAMPLES["cumprod"])
