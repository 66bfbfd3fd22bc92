"""Arg-reductions in the lab: the benchmark's case (argmax over 2^28 float32 values, against ``cupy.argmax``),
the tuning space of the whole-array search, and the cards of all four ops, each from the op module's own
rules (``TUNING``, ``SPACE``, ``plan`` and ``bytes_moved`` in :mod:`cukern.argreduce`)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

import cukern.lab.bench as bench
import cukern.lab.card as card
import cukern.lab.pipeline as pipeline
import cukern.lab.tune as tune

from .. import argreduce
from .._dtypes import parse_dtype
from .bench import Case


def inputs(shape, dtype):
    """Standard normal values of ``dtype`` (integers and bool from the same draw, rounded or thresholded)."""
    import cupy

    x = cupy.random.default_rng(0).standard_normal(shape, dtype=np.float32)
    dt = np.dtype(dtype)
    if dt == np.bool_:
        return x > 0
    if dt.kind in "iu":
        return (x * 16).astype(dt)
    return x.astype(dt)


# ---------------------------------------------------------------------------------------------------------
# The benchmark.


def _bench_bytes(case: Case) -> int:
    axis = bench.parse_axis(dict(case.params).get("axis"))
    return argreduce.bytes_moved(case.shape, parse_dtype(case.dtype), axis)


bench.register("argmax", bench.OpBench(bench.array_setup(inputs), lambda s: argreduce.argmax(s["x"], axis=s["axis"]),
                                       lambda s: s["x"].argmax(axis=s["axis"]), _bench_bytes,
                                       [Case("argmax", (1 << 28,), "float32")]))
pipeline.register_host_pair("host_overhead_argmax", (4096,), "float32", inputs, argreduce.argmax, lambda x: x.argmax())


# ---------------------------------------------------------------------------------------------------------
# Tuning: the search over everything, shape ``(n,)`` as the op looks it up. No point changes a result.


def _run(state, knobs):
    return lambda: argreduce._run("argmax", state, None, False, None, knobs=knobs)


tune.register(tune.Tunable(
    rule=argreduce.TUNING["argmax"], space=argreduce.SPACE, setup=inputs, run=_run,
    bytes=lambda shape, dtype: argreduce.bytes_moved(shape, dtype),
    signature=lambda shape, dtype, knobs, sm: argreduce.plan(shape, None, sm_count=sm, knobs=knobs),
    from_case=lambda shape, params: (math.prod(shape),)))


# ---------------------------------------------------------------------------------------------------------
# The cards: param axis (None or an int).


def _describe(name: str):
    def describe(shape, dt, params, device, knobs):
        axis = argreduce.normalize_axis(bench.parse_axis(params.get("axis")), len(shape))
        knobs = argreduce.DEFAULT_KNOBS if knobs is None else knobs
        pl = argreduce.plan(shape, axis, sm_count=device.sm_count, knobs=knobs)
        launches = []
        if pl.kernel is not None:
            role = {"span": (f"{pl.spans} span(s) a row, {pl.ways} block(s) a span interleaved; the last block "
                             "of a row combines them"),
                    "cols": "one row per thread"}[pl.kernel]
            launches.append(card.Launch(pl.instantiation(dt), pl.grid, pl.block, role))
        size = dt.itemsize
        if pl.kernel == "cols":
            thread = f"one row of {pl.n:,} elements, {pl.stride} elements apart"
            block = f"{pl.block} adjacent rows"
        else:
            thread = (f"about {-(-pl.span // (pl.block * pl.ways)):,} elements of a span, 16-byte vectors where "
                      "the stride is 1")
            block = (f"every {pl.ways}th step of {argreduce.BLOCK * argreduce.UNROLL} vectors (or elements) of a span "
                     f"of {pl.span:,} indices of one row" if pl.ways > 1 else f"a span of {pl.span:,} indices of one row")
        tile = {"kernel": pl.kernel, "grid": pl.grid, "block": pl.block, "rows": pl.rows,
                "elements_per_row": pl.n, "one_block_computes": block, "one_thread_computes": thread}
        nbytes = argreduce.bytes_moved(shape, dt, axis)
        written = 8 * pl.rows
        if pl.kernel == "cols":
            width, coalesced = f"{size} B", "yes: a warp's threads read adjacent rows at the same index"
        elif pl.stride == 1:
            width, coalesced = "16 B (element loads for the unaligned head and the tail)", "yes: contiguous steps"
        else:
            width, coalesced = f"{size} B", "no: the reduced axis is strided"
        re_read = ["nothing: every element is read once"]
        if pl.spans * pl.ways > 1:
            pair = argreduce.PAIR_BYTES.get(dt, 16)
            re_read = [f"the blocks' partials ({pl.grid * pair:,} B) from L2, by the last block of each row"]
        traffic = {"bytes_read": nbytes - written, "bytes_written": written,
                   "counted_by": "cukern.argreduce.bytes_moved(shape, dtype, axis)", "access_bytes": width,
                   "coalesced": coalesced, "re_read": re_read}
        accumulation = {
            "reduces": f"{name} over {pl.n:,} elements per result",
            "precision": "exact: unsigned keys ordered as the op orders values, int64 indices",
            "order": ("any: the best (key, index) pair under a total order (largest key, then least index) is "
                      "the same whichever pairs meet first (cukern.reference.arg_keys)"),
            "combine": "per thread, shuffles, shared memory across warps" + (
                ", then the last block of a row over its blocks' partials" if pl.spans * pl.ways > 1 else ""),
            "passes": 1}
        notes = []
        if pl.copy:
            notes.append("the input is first copied to C-contiguous; that copy is not in the count")
        if name.startswith("nan") and dt in argreduce.INEXACT:
            notes.append("the call waits for the GPU to read the all-NaN flag (a host synchronization)")

        def measure():
            x, fn = inputs(shape, dt), getattr(argreduce, name)
            return lambda: fn(x, axis=axis)

        return card.Described(launches=launches, tile=tile, traffic=traffic, accumulation=accumulation,
                              knobs=dataclasses.asdict(knobs), bytes=nbytes, bytes_written=written,
                              flops=0, measure=measure, notes=notes)

    return describe


for _name in argreduce.OPS:
    card.register(card.CardSpec(_name, (1 << 28,), "float32", _describe(_name), {"axis": None}, "argreduce",
                                tuning_op="argmax", dtypes=argreduce.DTYPES))
