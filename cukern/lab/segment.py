"""Segmented reductions in the lab: the benchmark's case (segment_sum of 2^28 float32 values in 2^20 segments of
random length, against a CuPy composite: a float64 running sum differenced at the offsets) and the cards of
all four ops, from the op module's ``plan`` and ``bytes_moved`` (:mod:`cukern.segment`). No tunable: no knob
(the launch follows from the shape)."""

from __future__ import annotations

import math

import numpy as np

import cukern.lab.bench as bench
import cukern.lab.card as card

from .. import segment
from .._dtypes import parse_dtype
from .bench import Case


def inputs(shape, dtype, segments: int):
    """Standard normal x of ``shape`` and ``dtype``, and int64 offsets cutting axis 0 into ``segments``
    segments of random length (uniform cut points, so lengths are roughly exponential; some are empty)."""
    import cupy

    rng = cupy.random.default_rng(0)
    x = rng.standard_normal(shape, dtype=np.float32).astype(dtype)
    rows = shape[0]
    cuts = cupy.sort(rng.integers(0, rows + 1, segments - 1, dtype=np.int64)) if segments > 1 else cupy.empty(0, np.int64)
    offsets = cupy.concatenate([cupy.zeros(1, np.int64), cuts, cupy.full(1, rows, np.int64)])
    return x, offsets


def _segments(params: dict) -> int:
    segments = int(params.get("segments", 1 << 20))
    if segments < 0:  # the op takes offsets of segments + 1 values, at least one
        raise ValueError(f"param segments={segments} must be at least 0")
    return segments


def _bench_setup(case: Case) -> dict:
    x, offsets = inputs(case.shape, parse_dtype(case.dtype), _segments(dict(case.params)))
    return {"x": x, "offsets": offsets}


def _composite(s):
    """What a CuPy user writes for a segmented sum: a float64 running sum, differenced at the offsets."""
    import cupy

    x = s["x"]
    flat = x.reshape(x.shape[0], -1).astype(np.float64)
    run = cupy.concatenate([cupy.zeros((1, flat.shape[1])), cupy.cumsum(flat, axis=0)])
    return (run[s["offsets"][1:]] - run[s["offsets"][:-1]]).astype(x.dtype)


bench.register("segment_sum", bench.OpBench(
    _bench_setup, lambda s: segment.segment_sum(s["x"], s["offsets"], check_offsets=False), _composite,
    lambda case: segment.bytes_moved(case.shape, parse_dtype(case.dtype), _segments(dict(case.params))),
    [Case("segment_sum", (1 << 28,), "float32", (("segments", 1 << 20),))]))


def _describe(name: str):
    def describe(shape, dt, params, device, knobs):
        segments = _segments(params)
        pl = segment.plan(shape, segments)
        rt = segment.result_dtype(name, dt)
        launches = []
        if pl.kernel is not None:
            role = {"warp": f"a warp per {pl.run} segment(s) of a column",
                    "cols": "a thread per segment and column"}[pl.kernel]
            launches.append(card.Launch(pl.instantiation(dt, segment.OPS[name][0], np.int64, rt),
                                        pl.grid[0] * pl.grid[1], pl.block, role))
        rows, cols = shape[0], math.prod(shape[1:])
        mean_length = rows / max(segments, 1)
        if pl.kernel == "cols":
            thread = f"one column of one segment (about {mean_length:,.0f} rows), 8 chains at a time"
            block = f"one segment x {segment.COL_BLOCK} adjacent columns"
        else:
            thread = (f"chain (lane) of every leaf of {pl.run} segment(s) of a column, in turn: about "
                      f"{mean_length / 32:,.1f} elements a segment")
            block = f"{segment.WARP_BLOCK // 32} runs of {pl.run} consecutive segments of one column, a warp each"
        tile = {"kernel": pl.kernel, "grid": pl.grid, "block": pl.block, "segments": segments, "columns": cols,
                "one_block_computes": block, "one_thread_computes": thread}
        nbytes = segment.bytes_moved(shape, dt, segments, out_dtype=rt)
        written = segments * cols * rt.itemsize
        coalesced = ("yes: a warp's threads read adjacent columns of a row" if pl.kernel == "cols" else
                     "yes for a 1-D x: a warp's 32 loads are 32 consecutive rows" if cols == 1 else
                     "no: lanes read rows of a column with few columns a row")
        traffic = {"bytes_read": nbytes - written, "bytes_written": written,
                   "counted_by": "cukern.segment.bytes_moved(shape, dtype, segments, out_dtype=result)",
                   "access_bytes": f"{dt.itemsize} B", "coalesced": coalesced,
                   "re_read": ["each offset twice (the end of one segment, the start of the next), from L1/L2"]}
        accumulation = {
            "reduces": f"{name} of about {mean_length:,.0f} rows per segment, {cols} column(s)",
            "precision": (("float64" if rt == np.float64 else "float32") if rt.kind == "f" or dt.kind == "f" else
                          "64-bit integer") + f" accumulators, result {rt}",
            "order": ("one fixed tree per segment length (chains of 8 rows 32 apart, then pairs): cukern.sum's "
                      "tree of the slice (cukern.reference.segment_sum_emulated)"),
            "combine": ("chains in lanes, shuffles, a leaf stack per warp" if pl.kernel == "warp" else
                        "8 chains in registers, a stack of groups per thread in shared memory"),
            "passes": 1}
        notes = []
        if pl.copy:
            notes.append("the input is first copied to C-contiguous; that copy is not in the count")
        notes.append("check_offsets=True (the default) adds a few small CuPy reductions and a host wait; the "
                     "benchmark passes check_offsets=False")

        def measure():
            x, offsets = inputs(shape, dt, segments)
            fn = getattr(segment, name)
            return lambda: fn(x, offsets, check_offsets=False)

        fixed = {"warp_block": segment.WARP_BLOCK, "col_block": segment.COL_BLOCK,
                 "cols_kernel_min": segment.COLS_KERNEL_MIN}
        return card.Described(launches=launches, tile=tile, traffic=traffic, accumulation=accumulation,
                              knobs=fixed, bytes=nbytes, bytes_written=written, flops=rows * cols,
                              measure=measure, notes=notes)

    return describe


for _name in segment.OPS:
    card.register(card.CardSpec(_name, (1 << 28,), "float32", _describe(_name), {"segments": 1 << 20}, "segment",
                                dtypes=segment.DTYPES))
