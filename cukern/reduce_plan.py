"""Reductions, planned: dtype rules, the op table, how a layout maps onto the kernels, launch plans and the
instantiations they need. Pure: nothing here touches a GPU, so all of it is tested on a CPU.

The tree. Every result is one fixed tree over its n reduced elements, numbered in C order over
the reduced axes as the caller sees them: leaves of :data:`TREE_LEAF` = 256 consecutive elements; in each
leaf, chain c of :data:`TREE_CHAINS` = 32 adds elements c, c + 32, ... (:data:`TREE_CHAIN_LENGTH` = 8 of
them) one after another (var and logsumexp form a chain's state from its elements at once: reduce.cu
``chain_state``); the chains, in order, are the leaves of a perfect binary tree with neighbours
paired first, padded with the identity to a power of two. It depends on n alone, so its bits depend only on
the values, n, the dtypes and the op: every plan below (any grid, block, knob or SM count) and every kernel
(full, rows, columns, strided, after a copy or not) is a split of that same tree over threads, warps,
blocks and launches, and :func:`cukern.reference.sum_emulated` and its siblings compute it on the host.
What a plan may choose is how many threads share a row, how long a span of chunks one warp takes (a power
of two, so that spans are subtrees), how many loads are in flight, the grid and the block.

Dispatch (:func:`classify`). The kept and the reduced dimensions are each collapsed, in their own order,
into as few (size, stride) levels as the strides allow. Then, in order:

* ``empty``: no outputs; nothing to compute;
* ``fill``: no element to reduce; every output is the op's value of an empty reduction (0, NaN for mean);
* ``none``: every reduced axis has size 1; each output is its one input element (an elementwise copy);
* ``full``: nothing kept, one reduced level of any stride: ``reduce_full``, one launch (last block done);
* ``rows``: the reduced level is contiguous: ``reduce_rows``;
* ``cols``: the reduced level is strided and the kept inner level contiguous: ``reduce_cols`` (coalesced
  across columns), and ``reduce_cols_fold`` over per-span partials when a column is split into spans; but
  ``copy`` for the lifted ops (nansum, nanmax, nanmin, the counts: only the full and row kernels lift) and
  the strided kernel for prod and logsumexp (which have no column kernel);
* ``strided``: any other layout of at most two kept and two reduced levels: ``reduce_strided`` (``copy`` for
  the lifted ops);
* ``copy``: deeper layouts, and reduced axes that do not collapse with nothing kept (a full reduction of a
  transposed array); the plan copies the input to contiguous (kept axes, then reduced ones, each in order)
  and reduces that.

Memory traffic, the count every GB/s figure uses: x read once, the result written once (:func:`bytes_moved`).
"""

from __future__ import annotations

import dataclasses
import math
import operator
from typing import Any
from dataclasses import dataclass

import numpy as np

from ._compile import Instantiation
from ._dtypes import BFLOAT16, COUNT, dtype_name, parse_dtype
from ._launch import LaunchConfig, Params
from ._layout import collapse, contiguous_strides, k_order

SOURCE = "reduce"

OP_SUM, OP_SUMSQ, OP_MAX, OP_MIN, OP_VAR, OP_PROD, OP_LSE = 0, 1, 2, 3, 4, 5, 6
FINISH_NONE, FINISH_DIVIDE, FINISH_SQRT, FINISH_EQUALS = 0, 1, 2, 3  # EQUALS: all (the count is n)
# What sum, max and min take of each element (reduce.cu LIFT_*), a run-time mode that rides in the kernels'
# ``finalize`` argument above FINISH_BITS: itself, the op's identity for a NaN, x != 0 as 1 or 0, x not NaN
# as 1 or 0. None of them adds a kernel.
LIFT_PLAIN, LIFT_SKIP_NAN, LIFT_NONZERO, LIFT_NOT_NAN = 0, 1, 2, 3
FINISH_BITS = 4

F32, F64, F16 = np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.float16)
I32, I64, BOOL = np.dtype(np.int32), np.dtype(np.int64), np.dtype(np.bool_)
C64, C128 = np.dtype(np.complex64), np.dtype(np.complex128)
FLOATS = (F32, F64, F16, BFLOAT16)
INTS = (I32, I64)

# The tree (reduce.cu's CHAINS, CHAIN_LENGTH and LEAF).
TREE_CHAINS = 32
TREE_CHAIN_LENGTH = 8
TREE_LEAF = TREE_CHAINS * TREE_CHAIN_LENGTH


def _pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


@dataclass(frozen=True)
class Knobs:
    """The tuning space of the full and row kernels (the lab's tuner sweeps it). Every setting is a split
    of the one tree (module notes), so every setting gives the same bits.

    Full reduction: blocks of ``full_block`` threads (a power of two, 64 to 1024), ``full_blocks_per_sm``
    of them per SM at most, ``full_unroll`` 16-byte loads in flight per thread (2, 4 or 8: a divisor of
    the chain length).

    Rows: threads per row, for rows longer than one warp's chunk, the smallest power of two from 32 to
    ``row_max_tpr`` that leaves each thread at most ``row_items`` 16-byte vectors (shorter rows take a
    sub-warp group that covers them); up to 32 threads per row share blocks of ``ROW_SMALL_BLOCK``, more
    get a block of their own. ``row_unroll`` 16-byte loads in flight per thread (2, 4 or 8).
    ``row_threads_per_sm`` caps the registers: ``__launch_bounds__(block, row_threads_per_sm / block)``
    (1024: 64 registers). ``row_waves``: grid cap in waves of those resident blocks, the blocks then
    looping over rows (None: a block per row group).

    The defaults are the H200 sweep's winners: the rows' in docs/design/reductions.md: the rows' from "Rows and columns"
    (their unroll counts the loads of one chain step batch), the full kernel's from "Groups combined in
    batches" (the best at 2^20 and 2^24 elements, within 1% of the best at 2^29 and 2^30).
    """

    full_block: int = 256
    full_blocks_per_sm: int = 4
    full_unroll: int = 8
    row_items: int = 8
    row_max_tpr: int = 256
    row_unroll: int = 4
    row_threads_per_sm: int = 1024
    row_waves: int | None = 32

    def __post_init__(self):
        if not (_pow2(self.full_block) and 64 <= self.full_block <= 1024):
            raise ValueError(f"full_block must be a power of two from 64 to 1024, got {self.full_block}")
        if not (_pow2(self.row_max_tpr) and 32 <= self.row_max_tpr <= 1024):
            raise ValueError(f"row_max_tpr must be a power of two from 32 to 1024, got {self.row_max_tpr}")
        for name in ("full_unroll", "row_unroll"):
            if getattr(self, name) not in (1, 2, 4, 8):
                raise ValueError(f"{name} must divide the chain length {TREE_CHAIN_LENGTH}, got {getattr(self, name)}")
        if self.full_blocks_per_sm < 1 or self.row_items < 1 or self.row_threads_per_sm < 32:
            raise ValueError(f"knobs out of range: {self}")
        if self.row_waves is not None and self.row_waves < 1:
            raise ValueError(f"row_waves must be None or positive, got {self.row_waves}")


DEFAULT_KNOBS = Knobs()
# Rows of inputs of at most 4 bytes an element past 2048 16-byte vectors (32 KiB) take 512 threads where no
# tuning cache entry says otherwise, so each thread keeps 8 vectors in flight: rows [32768, 16384] float32
# on the H100 688.2 -> 680.6 us, ahead of torch's 684.5 and CuPy's 686.7 (docs/design/reductions.md,
# "Defaults for the largest arrays"); shorter rows plan as before. float64's maxima and minima spill at 512
# threads (64 registers), so 8-byte inputs keep 256.
WIDE_ROW_KNOBS = dataclasses.replace(DEFAULT_KNOBS, row_max_tpr=512)
WIDE_ROW_ITEMSIZE = 4
# var and std's own point (any point gives the same bits): rows of at most 128 threads, so that their rows
# kernels come in two blocks, not three (the instantiation table stays small); a full grid of 8 blocks an SM
# and rows capped at 16 waves (blocks walking about two long rows), measured on the H200 (docs/design/reductions.md,
# "var and std"): fp32 2^28 101.1% -> 102.1% of the copy, rows [32768, 16384] 98.7% -> 102.2%,
# [131072, 1024] 88.0% -> 95.0%, [32768, 4096] 73.3% -> 79.6%.
VAR_KNOBS = Knobs(full_blocks_per_sm=8, row_max_tpr=128, row_waves=16)
# prod and logsumexp's point: rows of at most 32 threads (one rows block size), and no column kernel (their
# column layouts take the strided kernel): four kernels a dtype, the fewest that cover every layout.
COMPACT_KNOBS = Knobs(row_max_tpr=32)
COMPACT_KERNEL_OPS = (OP_PROD, OP_LSE)
# The lifted ops' rows (nansum, nanmax, nanmin, the counts): at most 32 threads a row, so that they always
# take ROW_SMALL_BLOCK blocks, the only rows kernels that lift (reduce.cu ROW_LIFT_BLOCK); their other knobs
# are the tuning cache's.
LIFT_ROW_MAX_TPR = 32
_KNOB_NAMES = frozenset(f.name for f in dataclasses.fields(Knobs))


def make_knobs(d: dict) -> Knobs:
    """Knobs from a stored dict; names Knobs does not have are ignored (ValueError for values that do not
    fit)."""
    return Knobs(**{k: v for k, v in d.items() if k in _KNOB_NAMES})


FULL_BLOCK, FULL_BLOCKS_PER_SM, FULL_UNROLL = (
    DEFAULT_KNOBS.full_block, DEFAULT_KNOBS.full_blocks_per_sm, DEFAULT_KNOBS.full_unroll)
FULL_PARTIALS = 4096  # per-block partials the workspace holds (STATE_BYTES each at most)
STATE_BYTES = 24  # the largest state the tree carries: var's (count, mean, M2) in float64
FULL_FOLD = 8  # partials each thread of reduce_full's last block combines: the grid is at most 8 blocks
ROW_SMALL_BLOCK = 128
ROW_INDEX32_LIMIT = 2**30  # rows shorter than this index within the row in 32 bits (fewer registers)
COL_BLOCK = 256
COL_WAVES = 2  # target blocks for the column pass, in waves of resident blocks
COL_MAX_SPANS = 128  # spans a column is split into for the grid's sake at most
COL_STACK_DEPTH = 20  # reduce_cols' span stack: spans of up to 2^19 leaves
COL_FOLD_SPANS = 2048  # spans reduce_cols_fold's stack holds (reduce.cu FOLD_DEPTH): columns of 2^38 rows
FOLD_BLOCK = 128
STRIDED_BLOCK = 128
STRIDED_WAVES = 8


def lane_elements(itemsize: int) -> int:
    """Elements one lane reads per chain step (reduce.cu ``lane_elements``): a 16-byte vector, 8 bytes for
    1-byte types."""
    return min(16 // itemsize, 8)


def chunk_elements(itemsize: int, lanes: int = 32) -> int:
    """Elements of one chunk of ``lanes`` lanes: ``lanes / (32 / lane_elements)`` leaves."""
    return lanes * lane_elements(itemsize) * TREE_CHAIN_LENGTH


# ---------------------------------------------------------------------------------------------------------
# Ops and dtypes.


@dataclass(frozen=True)
class Op:
    name: str
    kernel_op: int
    finalize: int
    inputs: tuple  # accepted input dtypes
    lift: int = LIFT_PLAIN

    @property
    def minmax(self) -> bool:
        return self.kernel_op in (OP_MAX, OP_MIN)

    @property
    def mode(self) -> int:
        """The kernels' ``finalize`` argument: the finish, and the lift above FINISH_BITS."""
        return self.finalize | self.lift << FINISH_BITS


_ALL = FLOATS + INTS + (BOOL,)
_NO_BOOL = FLOATS + INTS
OPS = {
    "sum": Op("sum", OP_SUM, FINISH_NONE, _ALL),
    "mean": Op("mean", OP_SUM, FINISH_DIVIDE, _ALL),
    "sum_of_squares": Op("sum_of_squares", OP_SUMSQ, FINISH_NONE, _NO_BOOL),
    "norm": Op("norm", OP_SUMSQ, FINISH_SQRT, _NO_BOOL),
    "amax": Op("amax", OP_MAX, FINISH_NONE, _NO_BOOL),
    "amin": Op("amin", OP_MIN, FINISH_NONE, _NO_BOOL),
    "var": Op("var", OP_VAR, FINISH_DIVIDE, _ALL),
    "std": Op("std", OP_VAR, FINISH_SQRT, _ALL),
    "nansum": Op("nansum", OP_SUM, FINISH_NONE, _ALL, LIFT_SKIP_NAN),
    "nanmax": Op("nanmax", OP_MAX, FINISH_NONE, _NO_BOOL, LIFT_SKIP_NAN),
    "nanmin": Op("nanmin", OP_MIN, FINISH_NONE, _NO_BOOL, LIFT_SKIP_NAN),
    "count_nonzero": Op("count_nonzero", OP_SUM, FINISH_NONE, _ALL, LIFT_NONZERO),
    # nanmean's denominator and the all-NaN test of nanmax / nanmin (not public): float64, exact below 2^53
    "count_not_nan": Op("count_not_nan", OP_SUM, FINISH_NONE, FLOATS, LIFT_NOT_NAN),
    # any and all: the count of non-zero elements stored as bool by the kernels themselves (count != 0,
    # count == n)
    "any": Op("any", OP_SUM, FINISH_NONE, _ALL, LIFT_NONZERO),
    "all": Op("all", OP_SUM, FINISH_EQUALS, _ALL, LIFT_NONZERO),
    "prod": Op("prod", OP_PROD, FINISH_NONE, _ALL + (C64, C128)),
    "logsumexp": Op("logsumexp", OP_LSE, FINISH_NONE, FLOATS),
}
VAR_OPS = ("var", "std")
MINMAX_OPS = ("amax", "amin", "nanmax", "nanmin")
# The ops that count elements (x != 0, not NaN) and store the count or a test of it: float64 accumulators of
# the lifted 1s, results of their own kind (int64, float64, bool), no dtype=.
COUNT_OPS = ("count_nonzero", "count_not_nan", "any", "all")


def acc_dtype(result_dtype) -> np.dtype:
    """The accumulator for a result dtype (``acc_t`` in reduce.cu): complex products carry their own dtype."""
    r = np.dtype(result_dtype)
    if r in (F64, C64, C128):
        return r
    if r in (COUNT, BOOL):  # counts, any and all: the lifted 1s add in double (reduce.cu Acc)
        return F64
    if r in INTS:
        return I64
    return F32


def state_itemsize(kernel_op: int, result_dtype) -> int:
    """Bytes of the value the tree carries (reduce.cu ``state_t``): the accumulator, three of them for var."""
    a = acc_dtype(result_dtype).itemsize
    return 3 * a if kernel_op == OP_VAR else 2 * a if kernel_op == OP_LSE else a


# Input dtypes the public ops take beyond the kernels' own (each Op's ``inputs``): lowered on the device to a
# kernel input before the kernels run (:func:`route`), so they add no kernel.
I8, I16, U8, U16, U32, U64 = (np.dtype(t) for t in ("int8", "int16", "uint8", "uint16", "uint32", "uint64"))
SMALL_INTS = (I8, I16, U8, U16)
EVERY_INT = (I8, I16, I32, I64, U8, U16, U32, U64)
COMPLEX = (C64, C128)
# Every dtype a ``dtype=`` or ``out=`` may name (NumPy's numeric types and bool; bfloat16 too).
NUMERIC = (BOOL,) + EVERY_INT + FLOATS + COMPLEX
_REAL = (BOOL,) + EVERY_INT + FLOATS
# The public ops' inputs: every integer and bool where NumPy takes them, complex for sum, mean, norm, prod, the
# maxima and minima and logsumexp (SciPy's complex logsumexp: its own kernel, complex_instantiation).
PUBLIC_INPUTS = {
    "sum": NUMERIC, "mean": NUMERIC, "norm": NUMERIC, "amax": NUMERIC, "amin": NUMERIC, "nanmax": NUMERIC,
    "nanmin": NUMERIC, "prod": NUMERIC,
    "var": NUMERIC, "std": NUMERIC, "nansum": NUMERIC, "nanmean": NUMERIC, "count_nonzero": NUMERIC,
    "sum_of_squares": _REAL, "logsumexp": _REAL + COMPLEX,
    "count_not_nan": FLOATS, "any": NUMERIC, "all": NUMERIC,
}
# Why an accepted-by-NumPy input is refused (the message names the way around it).
_REFUSED = {
    ("sum_of_squares", "c"): "NumPy's sum(x * x) of complex x is complex (z**2, not |z|**2); use norm(x)**2 or "
                             "cupy.sum(x * x)",
}


def public_inputs(op: str) -> tuple:
    """The input dtypes public ``op`` takes (the kernels' own plus those :func:`route` lowers)."""
    return PUBLIC_INPUTS[op]


def check_input(op: str, dtype) -> np.dtype:
    """``dtype`` as an input of ``op``, or a one-line TypeError naming what is supported."""
    t = np.dtype(dtype)
    if t in PUBLIC_INPUTS[op]:
        return t
    why = _REFUSED.get((op, t.kind))
    if why is not None:
        raise TypeError(f"{op} of {dtype_name(t)} is not supported: {why}")
    raise TypeError(f"x has dtype {dtype_name(t)}; {op} supports {_names(PUBLIC_INPUTS[op])}")


def real_of(dtype) -> np.dtype:
    """The dtype of a complex dtype's real and imaginary parts; other dtypes as they are."""
    t = np.dtype(dtype)
    parts: dict[np.dtype, np.dtype] = {C64: F32, C128: F64}
    return parts.get(t, t)


def default_dtype(op: str, dtype) -> np.dtype:
    """NumPy's result dtype when ``dtype=None``: sums and products of bool and signed integers are int64, of
    unsigned integers uint64; means, norms, variances and standard deviations of integers and bool float64;
    floats and complex types keep their dtype (a complex norm is real: float32 or float64); maxima and
    minima keep x's dtype; counts int64 (count_not_nan: float64)."""
    t = np.dtype(dtype)
    if op in MINMAX_OPS:
        return t
    if op == "count_nonzero":
        return I64
    if op == "count_not_nan":
        return F64
    if op in ("any", "all"):
        return BOOL
    if t in COMPLEX:
        return real_of(t) if op in ("norm", "var", "std") else t
    if t in FLOATS:
        return t
    if op in ("sum", "sum_of_squares", "nansum", "prod"):
        return U64 if t.kind == "u" else I64
    return F64


def kernel_dtypes(op: str, dtype) -> tuple:
    """The result dtypes the kernels produce directly for ``op`` on kernel input ``dtype`` (one of the Op's
    ``inputs``)."""
    t = np.dtype(dtype)
    if op in MINMAX_OPS:
        return (t,)
    if op in COUNT_OPS:
        # Counts add 1.0s in float64 (exact below 2^53) with the sums' kernels (int64 accumulators with the
        # lift would spill), stored by the kernel as the result: int64 (COUNT), bool for any and all.
        return ({"count_nonzero": COUNT, "count_not_nan": F64}.get(op, BOOL),)
    if op in ("prod", "logsumexp"):
        return (default_dtype(op, t),)
    if op in VAR_OPS:
        # One on purpose (every one is a set of kernels; the shift keeps float32 accurate).
        return (t,) if t in FLOATS else (F64,)
    floats = tuple(dict.fromkeys((t, F32, F64))) if t in FLOATS else (F32, F64)
    if op in ("mean", "norm"):
        return floats
    return floats if t in FLOATS else (I32, I64, F32, F64)


def kernel_dtype(op: str, dtype, final) -> np.dtype:
    """The dtype the kernels write for ``op`` on ``dtype`` when the result is ``final``: ``final`` where they
    can, else the op's one kernel dtype (counts: float64), converted afterwards."""
    allowed = kernel_dtypes(op, dtype)
    return np.dtype(final) if np.dtype(final) in allowed else allowed[0]


def targets(op: str, dtype) -> tuple:
    """The ``dtype=`` values ``op`` takes for input ``dtype``: NumPy's, but for the refusals named in the
    TypeError (:func:`result_dtype`). Sums, means, sums of squares and products take every numeric type and
    bool (a complex input only complex ones), maxima and minima any (a conversion of the result), norms the
    float types, as do var and std; logsumexp its default; counts none."""
    t = np.dtype(dtype)
    if op in COUNT_OPS:
        return ()
    if op in MINMAX_OPS:
        return NUMERIC
    if op in ("sum", "mean", "sum_of_squares", "prod", "nansum"):  # nansum's bool: an "or" of the non-NaN values
        return COMPLEX if t in COMPLEX else NUMERIC
    if op in VAR_OPS:
        # x converted to a float target first, as NumPy computes in it; a complex target is the variance in its
        # parts' type, widened (NumPy's is complex with a zero imaginary part). NumPy's var of complex x in a
        # float dtype= takes the mean of the real parts only (a ComplexWarning): not a variance, not offered.
        return COMPLEX if t in COMPLEX else FLOATS + COMPLEX
    if op == "norm":
        return FLOATS
    return (default_dtype(op, t),)  # logsumexp


def result_dtype(op: str, dtype, requested=None) -> np.dtype:
    """The result dtype of ``op`` on ``dtype`` with ``dtype=requested`` (NumPy's), or a TypeError for a
    requested dtype it does not give."""
    t = np.dtype(dtype)
    if requested is None:
        return default_dtype(op, t)
    r = parse_dtype(requested)
    allowed = targets(op, t)
    if r not in allowed:
        raise TypeError(
            f"dtype={dtype_name(r)} is not supported for {op} of {dtype_name(t)}; use one of {_names(allowed)} "
            f"(or convert the result with .astype)"
        )
    return r


@dataclass(frozen=True)
class Route:
    """How the public op ``op`` computes a ``final`` result from an input of any accepted dtype with the
    kernels of their own inputs (:func:`route`).

    ``how``: what x becomes before the kernels (each but "direct" and "view" one more pass over x):

    * ``direct``: x as it is;
    * ``cast``: x converted exactly to ``via`` (a narrower integer to int32, uint32 to int64, uint64 to
      float64 where the result is a float, as NumPy converts it; a float to int64 for an integer target,
      as NumPy truncates each element into it; for prod, any x to a complex target, as NumPy multiplies in it);
    * ``view``: x's bits read as ``via`` (uint64 as int64: sums and products wrap the same modulo 2^64);
    * ``flip``: x's bits with the sign bit flipped, read as ``via`` (uint64 to int64, preserving order,
      for maxima and minima; flipped back after);
    * ``complex``: the real and imaginary parts as a trailing axis of ``via`` (a view: each part its own
      tree over the same elements; the norm reduces that axis too; var and std add the parts' variances,
      as ``|z - mean|**2`` is the sum of the parts' squares; nansum zeroes a complex NaN's both parts
      first, one more pass). Not for prod, whose kernels read complex x as it is. For a count: x != 0 as
      bool (``cast``).
    * ``gather``: complex maxima and minima (``via`` x's dtype): the element at the index the arg-reduction
      kernels (cuda_src/argreduce.cu) find along the reduced axes merged into one, ordered as NumPy
      iterates them (:func:`gather_axes`); a gather, no kernel of this family.

    ``op``: the op the kernels run: the public one, ``sum`` for a mean with an integer target, ``var`` for a
    complex std (the square root taken after the parts' variances are added), or ``count_nonzero`` for a
    bool target of a sum, mean, nansum or product (NumPy accumulates in bool: an "or" for sums and means,
    an "and" for products; nansum's NaNs, counted with the non-NaN values, are taken off), whose count is
    compared with 0 or n.

    ``kernel``: the dtype the kernels write (then converted to ``final``; an integer target takes the
    int64 result modulo its width, as NumPy's accumulation in that width wraps). ``mean_int``: a mean with
    an integer target, NumPy's way: the sum in that integer type, divided in float64, truncated into it.
    """

    op: str
    how: str
    via: np.dtype
    kernel: np.dtype
    mean_int: bool = False


def _int_via(op: str, t) -> tuple:
    """(how, via) for reading integer, bool or float ``t`` as a kernel integer input (bool stays bool
    where the op's kernels take it)."""
    if t in OPS[op].inputs and t.kind in "biu":
        return "direct", t
    if t == U64:
        return "view", I64
    if t == U32 or t.kind == "f" or t == BFLOAT16:
        return "cast", I64
    return "cast", I32


def route(op: str, dtype, final) -> Route:
    """How ``op`` gives a ``final`` result (from :func:`result_dtype`) for input ``dtype`` (from
    :func:`check_input`). Pure; the extra passes it implies are named in :class:`Route`."""
    t, final = np.dtype(dtype), np.dtype(final)
    kin = OPS[op].inputs
    if op in MINMAX_OPS and t in COMPLEX:
        return Route(op, "gather", t, t)
    if op in COUNT_OPS and t in COMPLEX:
        # x != 0 (either part), as NumPy's count_nonzero and bool of complex
        return Route(op, "cast", BOOL, kernel_dtypes(op, BOOL)[0])
    if op in MINMAX_OPS or op in COUNT_OPS:
        if t in kin:
            how, via = "direct", t
        elif t == U64:
            how, via = ("flip" if op in MINMAX_OPS else "view"), I64
        else:
            how, via = "cast", (I64 if t == U32 else I32)
        return Route(op, how, via, via if op in MINMAX_OPS else kernel_dtypes(op, via)[0])
    if op == "logsumexp" and t in COMPLEX:
        # SciPy's complex logsumexp: a kernel of its own (complex_instantiation) reads x as it is
        return Route(op, "direct", t, t)
    if op == "prod" and final in COMPLEX:
        # A complex product mixes the parts, so it is no pair of real trees: the complex kernels, on x converted
        # to the target when that is another dtype, as NumPy multiplies in it.
        return Route(op, "direct" if t == final else "cast", final, final)
    if t in COMPLEX:
        inner = route("var" if op in VAR_OPS else op, real_of(t), real_of(final))
        return Route(inner.op, "complex", inner.via, inner.kernel)
    if final == BOOL:
        how, via = ("direct", t) if t in OPS["count_nonzero"].inputs else _int_via("count_nonzero", t)
        return Route("count_nonzero", how, via, COUNT)
    if final.kind in "iu":
        how, via = _int_via(op, t)
        if op == "mean":
            return Route("sum", how, via, I64, mean_int=True)
        return Route(op, how, via, I64)
    fr = real_of(final)
    if t in kin:
        how, via = "direct", t
    elif t == U64:
        how, via = "cast", F64  # as NumPy converts it; the int64 view would read large values as negative
    else:
        how, via = _int_via(op, t)
    allowed = kernel_dtypes(op, via)
    if fr in allowed:
        return Route(op, how, via, fr)
    if op in ("prod",) + VAR_OPS:
        # One kernel dtype for each input: convert x to the target itself, as NumPy multiplies in it.
        return Route(op, "cast", fr, fr)
    # A float target the kernels do not write (float16 from float32, say): our accumulator's, then rounded.
    kernel = F32 if F32 in allowed and fr.itemsize <= 4 else F64
    return Route(op, how, via, kernel)


def kernels_answer(op: str, dtype, final) -> bool:
    """Whether ``op`` of ``dtype`` into ``final`` runs the kernels on x as it is with no host step of
    :func:`route` (the call cache's calls)."""
    t = np.dtype(dtype)
    if t not in OPS[op].inputs:
        return False
    if op in MINMAX_OPS or op in COUNT_OPS:
        return True
    return np.dtype(final) in kernel_dtypes(op, t)


def gather_axes(shape, strides, axes) -> tuple:
    """The reduced ``axes`` in the order NumPy's reductions visit them: memory order, outermost first (the
    |stride| sort of :func:`k_order` over every axis; each axis itself walked in its own index order, a
    negative stride too). NumPy's max and min of complex x keep the first element, in this order, of those
    that compare equal (0j and -0j, say; or the first NaN), so the complex maxima search the reduced axes
    merged in this order to return the same bits."""
    perm = k_order(shape, strides, ()) or range(len(shape))
    return tuple(a for a in perm if a in axes)


def k_strides(shape, strides, axes, itemsize: int, keepdims: bool) -> tuple:
    """The strides (bytes) of the result cukern allocates for reducing ``axes`` (sorted) of an array of
    ``shape`` and ``strides``: C-contiguous in :func:`k_order`'s order."""
    shape = tuple(shape)
    perm = k_order(shape, strides, axes) or tuple(i for i in range(len(shape)) if i not in axes) + tuple(axes)
    out_axes = list(perm if keepdims else [a for a in perm if a not in axes])
    sizes = [1 if a in axes else shape[a] for a in out_axes]
    st, acc = {}, itemsize
    for a, n in zip(reversed(out_axes), reversed(sizes)):
        st[a] = acc
        acc *= n
    return tuple(st[a] for a in sorted(out_axes))


def out_cast(final, out_dtype) -> str | None:
    """Writing a ``final`` result into an ``out`` of ``out_dtype``: NumPy's and CuPy's reductions cast into
    ``out`` unsafely (a float result is truncated into an integer out). None, or the name of the warning
    NumPy gives ("ComplexWarning": a complex result into a real out drops the imaginary part)."""
    if np.dtype(final) in COMPLEX and np.dtype(out_dtype) not in COMPLEX:
        return "ComplexWarning"
    return None


def _names(dtypes) -> str:
    return ", ".join(dtype_name(d) for d in dtypes)


# ---------------------------------------------------------------------------------------------------------
# Layout analysis.


@dataclass(frozen=True)
class Layout:
    """How a reduction maps onto the kernels.

    ``kind``: one of the module notes' kinds. ``kept`` and ``red`` are the (size, stride-in-elements) levels
    of the kept and the reduced dimensions, outermost first: collapsed, except for ``empty`` and ``fill``,
    whose levels are the axes as they are (only their sizes matter).
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
    """``axis`` (None, an int or a tuple of ints) as a sorted tuple of distinct non-negative axes. An int 0 or -1
    of a 0-d array is no axis, as NumPy's ufunc reductions read it (a tuple holding one is out of range)."""
    if axis is None:
        return tuple(range(ndim))
    if ndim == 0 and isinstance(axis, (int, np.integer)) and not isinstance(axis, (bool, np.bool_)) and axis in (0, -1):
        return ()
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


def result_shape(shape, axes, keepdims: bool) -> tuple:
    """The result's shape: ``shape`` without the reduced ``axes``, or with them as size 1 (``keepdims``)."""
    if keepdims:
        return tuple(1 if i in axes else n for i, n in enumerate(shape))
    return tuple(n for i, n in enumerate(shape) if i not in axes)


def _levels(shape, strides) -> tuple:
    sizes, (sts,) = collapse(tuple(shape), [tuple(strides)])
    return tuple(zip(sizes, sts))


def classify(shape, strides, axes) -> Layout:
    """Which kernel reduces ``axes`` of an array of ``shape`` with ``strides`` (in elements)."""
    kept_axes = [i for i in range(len(shape)) if i not in axes]
    if any(shape[i] == 0 for i in range(len(shape))):
        # Checked before any collapsing: a zero-size dimension merges with anything, so levels would lie.
        kept = tuple((shape[i], strides[i]) for i in kept_axes)
        red = tuple((shape[i], strides[i]) for i in axes)
        return Layout("empty" if math.prod(n for n, _ in kept) == 0 else "fill", kept, red)
    kept = _levels([shape[i] for i in kept_axes], [strides[i] for i in kept_axes])
    # Reduced dimensions in their own order, whatever their strides: that order numbers the elements of
    # each result's tree, so a layout that is not C-ordered over them (a full sum of a transposed array)
    # keeps two levels, and is copied, rather than being reduced in memory order.
    red = _levels([shape[i] for i in axes], [strides[i] for i in axes])
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
# Launch plans.


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _pow2_ceil(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


class _OneLaunch:
    """A plan launching ``grid`` blocks of ``block`` threads (fields of the dataclasses below)."""

    grid: int
    block: int

    @property
    def config(self) -> LaunchConfig:
        return LaunchConfig(grid=(self.grid,), block=(self.block,))


@dataclass(frozen=True)
class FullPlan(_OneLaunch):
    block: int
    grid: int
    unroll: int


def plan_full(n: int, itemsize: int, sm_count: int = 132, knobs: Knobs = DEFAULT_KNOBS) -> FullPlan:
    """Grid for ``reduce_full``: a warp for each chunk (:func:`chunk_elements`), at most
    ``knobs.full_blocks_per_sm`` blocks per SM, and no more partials than the last block combines
    (``FULL_FOLD`` a thread) or the workspace holds; the warps then take spans of several chunks. Any grid
    computes the same tree."""
    block = knobs.full_block
    chunks = _cdiv(n, chunk_elements(itemsize))
    grid = min(_cdiv(chunks, block // 32), knobs.full_blocks_per_sm * sm_count, FULL_FOLD * block, FULL_PARTIALS)
    return FullPlan(block, max(1, grid), knobs.full_unroll)


@dataclass(frozen=True)
class RowsPlan(_OneLaunch):
    tpr: int
    block: int
    grid: int
    unroll: int = 4
    min_blocks: int = 8  # __launch_bounds__ minimum resident blocks per SM (the register cap)
    index32: bool = True  # 32-bit indices within a row (rows shorter than ROW_INDEX32_LIMIT)


def row_tpr(length: int, itemsize: int, knobs: Knobs = DEFAULT_KNOBS) -> int:
    """Threads per row: rows of at most one warp's chunk (:func:`chunk_elements`) take the sub-warp group
    whose one chunk covers them; longer rows the smallest power of two from 32 to ``knobs.row_max_tpr``
    whose warps each take at most ``knobs.row_items`` 16-byte vectors a thread (spans of chunks rounded up
    to a power of two)."""
    cv = lane_elements(itemsize)
    leaves = max(1, _cdiv(length, TREE_LEAF))
    if leaves <= cv:
        return TREE_CHAINS // cv * _pow2_ceil(leaves)
    chunks = _cdiv(leaves, cv)
    tpr = 32
    while tpr < knobs.row_max_tpr and _pow2_ceil(_cdiv(chunks, tpr // 32)) * TREE_CHAIN_LENGTH > knobs.row_items:
        tpr *= 2
    return tpr


def row_block(tpr: int) -> int:
    """Threads per block for rows of ``tpr`` threads: rows of up to 32 share ROW_SMALL_BLOCK, longer ones
    get a block each."""
    return ROW_SMALL_BLOCK if tpr <= 32 else tpr


def _row_min_blocks(block: int, knobs: Knobs) -> int:
    return max(1, min(2048 // block, knobs.row_threads_per_sm // block))


def plan_rows(length: int, rows: int, itemsize: int, sm_count: int = 132, knobs: Knobs = DEFAULT_KNOBS) -> RowsPlan:
    """Threads per row from :func:`row_tpr`; the grid covers the rows, capped at ``knobs.row_waves`` waves
    of resident blocks (``min_blocks`` per SM, guaranteed by the register cap). Any of them computes each
    row's tree, so a row's result depends on neither the batch nor the knobs."""
    tpr = row_tpr(length, itemsize, knobs)
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
    q: int  # chains a thread owns (32 / q row lanes, COL_BLOCK * q / 32 column lanes)
    span: int  # leaves a block takes (a power of two)
    spans: int  # spans a column is split into (reduce_cols_fold combines them when more than one)
    strips: int
    outer: int

    block: int = COL_BLOCK

    @property
    def grid(self) -> int:
        return self.strips * self.spans * self.outer

    @property
    def columns(self) -> int:
        """Columns one block owns."""
        return COL_BLOCK * self.q // TREE_CHAINS * self.vec

    @property
    def config(self) -> LaunchConfig:
        return LaunchConfig(grid=(self.grid,), block=(self.block,))


def col_vector_width(itemsize: int, acc_itemsize: int) -> int:
    """Columns a thread owns: a 16-byte pack, but no more than 16 bytes of accumulators a chain (a column
    thread holds its chains and its loads in flight in registers), and at least one column."""
    return max(1, min(16 // itemsize, 16 // acc_itemsize))


def col_chains(cols: int, vec: int) -> int:
    """Chains a column thread owns: 4 (8 row lanes by 32 column lanes, a warp reading one row's 32 packs)
    when the columns fill those lanes, else 1 (32 row lanes by 8 column lanes)."""
    return 4 if cols >= 32 * vec else 1


def plan_cols(outer: int, rows: int, cols: int, vec: int, vector: bool, q: int,
              sm_count: int = 132) -> ColsPlan | None:
    """Spans: enough that the grid makes ``COL_WAVES`` waves of resident blocks, at most one per leaf and
    ``COL_MAX_SPANS``, but more where a span would pass the span stack (columns past 2^34 rows); each span a
    power of two of leaves, so that every split is the same tree. None when the spans pass the fold's stack or
    the grid passes 2^31 - 1 blocks (2^31 matrices of a strip, say)."""
    strips = _cdiv(cols, COL_BLOCK * q // TREE_CHAINS * vec)
    leaves = _cdiv(rows, TREE_LEAF)
    target = COL_WAVES * sm_count * (2048 // COL_BLOCK)
    want = max(1, min(_cdiv(target, strips * outer), leaves, COL_MAX_SPANS))
    span = min(_pow2_ceil(_cdiv(leaves, want)), 2 ** (COL_STACK_DEPTH - 1))
    spans = _cdiv(leaves, span)
    if spans > COL_FOLD_SPANS or strips * spans * outer >= 2**31:
        return None
    return ColsPlan(vec, vector, q, span, spans, strips, outer)


@dataclass(frozen=True)
class FoldPlan(_OneLaunch):
    """``reduce_cols_fold``: a thread per column and matrix."""

    block: int
    grid: int


def plan_fold(outer: int, cols: int) -> FoldPlan:
    return FoldPlan(FOLD_BLOCK, max(1, _cdiv(outer * cols, FOLD_BLOCK)))


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
    """A rows plan for each block the planner can pick under ``knobs`` and each index width (the
    instantiation depends on the block and the index width only)."""
    out = []
    tprs = [16] + [t for t in (32, 64, 128, 256, 512, 1024) if t <= knobs.row_max_tpr]
    for tpr in tprs:
        block = row_block(tpr)
        for index32 in (True, False):
            out.append(RowsPlan(tpr, block, 1, knobs.row_unroll, _row_min_blocks(block, knobs), index32))
    return out


def _cols_inst(t, p_dtype, op: int, vec: int, q: int) -> Instantiation:
    return Instantiation(SOURCE, "reduce_cols", (t, p_dtype, op, vec, q))


def _fold_inst(a, o, op: int) -> Instantiation:
    return Instantiation(SOURCE, "reduce_cols_fold", (a, o, op))


def _strided_inst(t, o, op: int) -> Instantiation:
    return Instantiation(SOURCE, "reduce_strided", (t, o, op, STRIDED_BLOCK))


def weighted_instantiation(t) -> Instantiation:
    """The weighted logsumexp kernel of result dtype ``t`` (x and b converted to it)."""
    t = np.dtype(t)
    return Instantiation(SOURCE, "reduce_lse_weighted", (t, t, OP_LSE, STRIDED_BLOCK))


def complex_instantiation(t) -> Instantiation:
    """The complex logsumexp kernel of result dtype ``t`` (complex64 or complex128; x and b converted to it),
    weighted or not."""
    t = np.dtype(t)
    return Instantiation(SOURCE, "reduce_lse_complex", (t, t, OP_LSE, STRIDED_BLOCK))


def lift_modes(t, o, kernel_op: int) -> int:
    """reduce.cu ``lift_modes``: the lift modes (bits 1 << LIFT_*) that the kernels for input ``t``, kernel
    result ``o`` and ``kernel_op`` implement: non-zero counting alone for count results (int64 counts and
    bool, of inputs other than bool), NaN skipping for float inputs' sums, maxima and minima, every mode for
    their float64 sums, non-zero counting for integer inputs' float64 sums (skipping NaN is plain there),
    plain elsewhere (bool inputs are their own count)."""
    plain, skip = 1 << LIFT_PLAIN, 1 << LIFT_SKIP_NAN
    if kernel_op not in (OP_SUM, OP_MAX, OP_MIN):
        return plain
    a = acc_dtype(o)
    if np.dtype(t) == BOOL:
        return plain  # bool values are their own non-zero count
    if np.dtype(o) in (COUNT, BOOL):
        return 1 << LIFT_NONZERO  # count_nonzero, any, all: only counting
    if np.dtype(t) not in FLOATS:
        return plain | (1 << LIFT_NONZERO) if kernel_op == OP_SUM and a == F64 else plain
    if kernel_op == OP_SUM and a == F64:
        return plain | skip | (1 << LIFT_NONZERO) | (1 << LIFT_NOT_NAN)
    return plain | skip


def row_knobs(knobs: Knobs, dtype) -> Knobs:
    """The knobs of a rows reduction of ``dtype``: ``knobs`` (the tuning cache's, or :data:`DEFAULT_KNOBS`
    where it has no entry), but :data:`WIDE_ROW_KNOBS` in place of the defaults for inputs of at most
    :data:`WIDE_ROW_ITEMSIZE` bytes an element."""
    if knobs is DEFAULT_KNOBS and np.dtype(dtype).itemsize <= WIDE_ROW_ITEMSIZE:
        return WIDE_ROW_KNOBS
    return knobs


def kernel_op_knobs(kernel_op: int) -> Knobs:
    """The knobs an op plans with when the call gives none (every op but var, std, prod and logsumexp may
    take the tuning cache's instead)."""
    if kernel_op == OP_VAR:
        return VAR_KNOBS
    return COMPACT_KNOBS if kernel_op in COMPACT_KERNEL_OPS else DEFAULT_KNOBS


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
    """Every production instantiation the dispatcher can launch with the default knobs: for each combo, the
    full, rows and strided kernels, and (but for prod and logsumexp) for each chain count the column kernel
    writing results (one pass) and writing partials (first of two passes), and the fold of those partials;
    the count and bool results of the lifted ops, the full and rows kernels only."""
    out = set()
    for t, o, op in kernel_combos():
        a = acc_dtype(o)
        out.add(_full_inst(t, o, op, plan_full(1, t.itemsize)))
        if o in (COUNT, BOOL):
            # Results of the lifted ops only (count_nonzero, any, all): their other layouts are copied to rows
            # (plan), whose rows take at most LIFT_ROW_MAX_TPR threads.
            for rp in _row_plans(dataclasses.replace(kernel_op_knobs(op), row_max_tpr=LIFT_ROW_MAX_TPR)):
                out.add(_rows_inst(t, o, op, rp))
            continue
        for rp in _row_plans(row_knobs(kernel_op_knobs(op), t)):
            out.add(_rows_inst(t, o, op, rp))
        out.add(_strided_inst(t, o, op))
        if op in COMPACT_KERNEL_OPS:
            continue
        vec = col_vector_width(t.itemsize, state_itemsize(op, o))
        for q in (1, 4):
            out.add(_cols_inst(t, o, op, vec, q))
            out.add(_cols_inst(t, a, op, vec, q))
        out.add(_fold_inst(a, o, _combine_op(op)))
    for t in FLOATS:
        out.add(weighted_instantiation(t))
    for t in COMPLEX:
        out.add(complex_instantiation(t))
    return sorted(out, key=lambda i: (i.name, i.expression))


# ---------------------------------------------------------------------------------------------------------
# The whole plan of one reduction.


def _cols_aligned(ptr: int, vec: int, itemsize: int, strides) -> bool:
    """Whether the base address and the row and matrix strides keep every column pack aligned."""
    return ptr % (vec * itemsize) == 0 and all(s % vec == 0 for s in strides)


KERNEL_KINDS = ("full", "rows", "cols", "strided")


@dataclass(frozen=True)
class Plan:
    """Every launch one reduction makes: ``copy`` (the input is first copied to contiguous, kept axes then
    reduced ones; ``layout`` then describes the copy), then the kernel for ``layout.kind`` with its plan;
    ``fold`` is the second column pass over the per-span partials (None when a column is one span), which
    need ``partials`` bytes of the stream's workspace."""

    layout: Layout
    copy: bool
    kernel: Any  # FullPlan, RowsPlan, ColsPlan, StridedPlan; None for "empty", "fill" and "none"
    fold: FoldPlan | None = None
    partials: int = 0


def plan(shape, dtype, axis=None, *, strides=None, ptr: int = 0, op: str = "sum", out_dtype=None,
         sm_count: int = 132, knobs: Knobs | None = None) -> Plan:
    """The launches for reducing ``axis`` of an array of ``shape`` and ``dtype`` with ``strides`` (in
    elements; default contiguous) at address ``ptr`` (only its alignment matters), for ``op`` producing
    ``out_dtype`` (default: ``op``'s NumPy result dtype), with ``knobs`` (default: :func:`kernel_op_knobs`).
    Depends on nothing else, and whatever ``sm_count`` and ``knobs`` are, every result is the same tree
    (module notes)."""
    shape = tuple(shape)
    t = np.dtype(dtype)
    o = np.dtype(out_dtype) if out_dtype is not None else default_dtype(op, t)
    if knobs is None:
        knobs = kernel_op_knobs(OPS[op].kernel_op)
    if OPS[op].lift != LIFT_PLAIN and knobs.row_max_tpr > LIFT_ROW_MAX_TPR:
        knobs = dataclasses.replace(knobs, row_max_tpr=LIFT_ROW_MAX_TPR)
    strides = contiguous_strides(shape) if strides is None else tuple(strides)
    axes = normalize_axis(axis, len(shape))
    layout = classify(shape, strides, axes)
    if layout.kind in ("cols", "strided") and OPS[op].lift != LIFT_PLAIN:
        # The column and strided kernels have no lift (reduce.cu reduce_cols): such layouts are copied to rows.
        layout = dataclasses.replace(layout, kind="copy")
    copy = layout.kind == "copy"
    if copy:
        # Kept axes first, reduced last, contiguous: one kept and one reduced level, so "rows" or "full".
        order = [i for i in range(len(shape)) if i not in axes] + list(axes)
        moved = tuple(shape[i] for i in order)
        layout = classify(moved, contiguous_strides(moved), tuple(range(len(shape) - len(axes), len(shape))))
        ptr = 0
    kind = layout.kind
    if kind not in KERNEL_KINDS:
        return Plan(layout, copy, None)
    if kind == "full":
        return Plan(layout, copy, plan_full(layout.count, t.itemsize, sm_count, knobs))
    if kind == "rows":
        return Plan(layout, copy, plan_rows(layout.count, layout.outputs, t.itemsize, sm_count, knobs))
    if kind == "cols" and OPS[op].kernel_op in COMPACT_KERNEL_OPS:
        # prod and logsumexp have no column kernel: their columns take the strided kernel (one warp an
        # output, the same tree).
        layout, kind = dataclasses.replace(layout, kind="strided"), "strided"
    if kind == "strided":
        return Plan(layout, copy, plan_strided(layout.outputs, sm_count))
    outer, s_outer, rows, s_row, cols = cols_geometry(layout)
    state = state_itemsize(OPS[op].kernel_op, o)
    vec = col_vector_width(t.itemsize, state)
    q = col_chains(cols, vec)
    first = plan_cols(outer, rows, cols, vec, _cols_aligned(ptr, vec, t.itemsize, (s_row, s_outer)), q, sm_count)
    if first is None:  # past one launch: the strided kernel (a warp an output, the same tree)
        return Plan(dataclasses.replace(layout, kind="strided"), copy, plan_strided(layout.outputs, sm_count))
    if first.spans == 1:
        return Plan(layout, copy, first)
    return Plan(layout, copy, first, plan_fold(outer, cols), outer * first.spans * cols * state)


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
        if pl.fold is None:
            return [_cols_inst(t, o, op, p.vec, p.q)]
        a = acc_dtype(o)
        return [_cols_inst(t, a, op, p.vec, p.q), _fold_inst(a, o, _combine_op(op))]
    return []


# ---------------------------------------------------------------------------------------------------------
# Weighted logsumexp (reduce.cu reduce_lse_weighted), and complex logsumexp, weighted or not (reduce_lse_complex,
# the same scalars and plan): x and the weights b, broadcast to one shape, reduced by one warp an output over
# at most two kept and two reduced levels that both arrays share; deeper layouts are first copied (x and b,
# kept axes then reduced ones, the broadcast b made whole).

LSE_WEIGHTED_PARAMS = Params((("outputs", "i64"), ("o_inner", "i64"), ("o_s0", "i64"), ("o_s1", "i64"),
                              ("ow_s0", "i64"), ("ow_s1", "i64"), ("count", "i64"), ("r_inner", "i64"),
                              ("r_s0", "i64"), ("r_s1", "i64"), ("rw_s0", "i64"), ("rw_s1", "i64"),
                              ("signed_result", "i32"), ("weighted", "i32")))


def weighted_dtype(x_dtype, b_dtype) -> np.dtype:
    """The result dtype of logsumexp of ``x_dtype`` weighted by ``b_dtype``: SciPy's, the two promoted, integer
    and bool results made float64 (complex ones stay complex: int64 with complex64 gives complex128, as NumPy
    promotes); bfloat16 promotes as float32 would, but with bool or itself it stays."""
    t, u = np.dtype(x_dtype), np.dtype(b_dtype)
    if BFLOAT16 in (t, u):
        other = u if t == BFLOAT16 else t
        if other in (BFLOAT16, BOOL):
            return BFLOAT16
        r = np.result_type(F32, other)
    else:
        r = np.result_type(t, u)
    return r if r.kind in "fc" else F64


def _shared_levels(shape, x_strides, b_strides) -> tuple:
    """The (size, x stride, b stride) levels of dimensions ``shape`` merged where both arrays allow."""
    sizes, (xs, bs) = collapse(tuple(shape), [tuple(x_strides), tuple(b_strides)])
    return tuple(zip(sizes, xs, bs))


def _two_levels(levels) -> tuple:
    """(inner, x s0, x s1, b s0, b s1) of at most two shared levels; no level is one element at offset 0."""
    if not levels:
        return 1, 0, 0, 0, 0
    if len(levels) == 1:
        (n, xs, bs), = levels
        return n, 0, xs, 0, bs
    (_, x0, b0), (n, x1, b1) = levels
    return n, x0, x1, b0, b1


@dataclass(frozen=True)
class WeightedPlan(_OneLaunch):
    """reduce_lse_weighted's launch: ``copy`` (x and b first copied to contiguous, kept axes then reduced ones),
    ``outputs`` results of ``count`` elements each, ``kept`` and ``red`` as (inner, x s0, x s1, b s0, b s1)."""

    copy: bool
    outputs: int
    count: int
    kept: tuple
    red: tuple
    block: int
    grid: int

    def params(self, signed_result: bool, weighted: bool = True) -> np.ndarray:
        """The kernel's scalars; ``weighted`` False (reduce_lse_complex only): b is not read, every weight 1."""
        (oi, o0, o1, ow0, ow1), (ri, r0, r1, rw0, rw1) = self.kept, self.red
        return LSE_WEIGHTED_PARAMS.struct(outputs=self.outputs, o_inner=oi, o_s0=o0, o_s1=o1, ow_s0=ow0,
                                          ow_s1=ow1, count=self.count, r_inner=ri, r_s0=r0, r_s1=r1, rw_s0=rw0,
                                          rw_s1=rw1, signed_result=int(signed_result), weighted=int(weighted))


def plan_weighted(shape, x_strides, b_strides, axes, sm_count: int = 132) -> WeightedPlan:
    """The launch reducing ``axes`` (normalized) of x and b, both of ``shape`` (b broadcast: zero strides), with
    strides in elements; outputs and count above zero. The tree numbers each output's elements in C order
    over ``axes``, as every reduction's, whatever the strides."""
    shape = tuple(shape)
    kept_axes = [i for i in range(len(shape)) if i not in axes]
    kept = _shared_levels([shape[i] for i in kept_axes], [x_strides[i] for i in kept_axes],
                          [b_strides[i] for i in kept_axes])
    red = _shared_levels([shape[i] for i in axes], [x_strides[i] for i in axes], [b_strides[i] for i in axes])
    outputs = math.prod(shape[i] for i in kept_axes)
    count = math.prod(shape[i] for i in axes)
    copy = len(kept) > 2 or len(red) > 2
    if copy:
        moved = [shape[i] for i in kept_axes] + [shape[i] for i in axes]
        contiguous = contiguous_strides(tuple(moved))
        nk = len(kept_axes)
        kept = _shared_levels(moved[:nk], contiguous[:nk], contiguous[:nk])
        red = _shared_levels(moved[nk:], contiguous[nk:], contiguous[nk:])
    sp = plan_strided(outputs, sm_count)
    return WeightedPlan(copy, outputs, count, _two_levels(kept), _two_levels(red), sp.block, sp.grid)


def temporary(pl: Plan, *, converts: bool, out_direct: bool | None) -> str | None:
    """Why a call with plan ``pl`` would go through a temporary array (a copy of x, or a result written
    before it is converted or copied into ``out``), with the way around it; None when it writes its result
    straight into its destination. A CUDA-graph capture must not record such a call: the temporary returns
    to the memory pool when the call ends while the graph keeps writing it.

    ``converts``: the kernels write another dtype than the result's (amax or amin with ``dtype=``;
    count_nonzero). ``out_direct``: None without ``out``, else whether ``out`` is C-contiguous. Zero-size and
    size-1 reductions write any destination elementwise."""
    kind = pl.layout.kind
    if kind in ("empty", "fill"):
        return None
    if kind == "none":
        return None
    if pl.copy:
        return ("x's layout is first copied to contiguous, kept axes then reduced ones; make that copy before the "
                "capture (cupy.ascontiguousarray(x.transpose(...))) and reduce its last axes")
    if converts:
        return ("the result is converted from the kernels' dtype afterwards (amax / amin with dtype=, counts of "
                "count_nonzero); leave dtype=None, pass an out of the kernels' dtype, or convert outside the graph")
    if out_direct is False:
        return "out is not C-contiguous; pass a C-contiguous out"
    return None


def bytes_moved(shape, dtype, axis=None, *, op: str = "sum", keepdims: bool = False) -> int:
    """Bytes the reduction must move: x read once, the result written once (in ``op``'s default dtype)."""
    shape = tuple(shape)
    axes = normalize_axis(axis, len(shape))
    out = math.prod(result_shape(shape, axes, keepdims))
    return math.prod(shape) * np.dtype(dtype).itemsize + out * default_dtype(op, dtype).itemsize
