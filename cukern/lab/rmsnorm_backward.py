"""RMSNorm backward in the lab: the benchmark's cases, inputs and CuPy composite peer, and the card of
``rms_norm_backward``, each from :mod:`cukern.rmsnorm_backward`'s own rules (``plan``, ``bytes_moved``,
``chunk_rows``). No tunable: the kernel's only choices are rms_norm's row layout and the chunks, which
define dweight's bits."""

from __future__ import annotations

import math

import numpy as np

import cukern.lab.bench as bench
import cukern.lab.card as card

from .. import rmsnorm, rmsnorm_backward
from .._dtypes import dtype_name, parse_dtype
from .._layout import ArraySpec
from .bench import Case
from .device import fits_l2

OP = "rms_norm_backward"


def inputs(shape, dtype) -> dict:
    """Standard normal dy, x and weight of ``dtype``, the forward's rstd and an output for dx."""
    import cupy

    rng = cupy.random.default_rng(0)
    x, dy = (rng.standard_normal(shape, dtype=np.float32).astype(dtype) for _ in range(2))
    w = rng.standard_normal(shape[-1], dtype=np.float32).astype(dtype)
    _, rstd = rmsnorm.rms_norm(x, w, return_rstd=True)
    return {"dy": dy, "x": x, "w": w, "rstd": rstd, "out": cupy.empty_like(x)}


def _run(s):
    return rmsnorm_backward.rms_norm_backward(s["dy"], s["x"], s["w"], rstd=s["rstd"], dx=s["out"])


def _cupy(s):
    """The composite a CuPy user would write, in float32, from the same rstd."""
    import cupy

    x, dy, w = (s[k].astype(cupy.float32) for k in ("x", "dy", "w"))
    r = s["rstd"][..., None]
    xhat = x * r
    g = dy * w
    dx = r * (g - xhat * cupy.mean(g * xhat, axis=-1, keepdims=True))
    return dx.astype(s["x"].dtype), (dy * xhat).reshape(-1, x.shape[-1]).sum(axis=0).astype(s["w"].dtype)


def _bytes(case: Case) -> int:
    dt = parse_dtype(case.dtype)
    return rmsnorm_backward.bytes_moved(case.shape, dt, dt, rstd=True)


_CASES = [Case(OP, s, "bfloat16") for s in ((16384, 4096), (16384, 8192), (4096, 4096), (256, 4096), (524288, 128))]
_CASES += [Case(OP, (16384, 4096), d) for d in ("float16", "float32")]
bench.register(OP, bench.OpBench(lambda case: inputs(case.shape, parse_dtype(case.dtype)), _run, _cupy, _bytes,
                                 _CASES))


def _describe(shape, dt, params, device, knobs):
    w_dt = parse_dtype(params["weight_dtype"] or dtype_name(dt))
    hidden, rows, size = shape[-1], math.prod(shape[:-1]), dt.itemsize
    rmsnorm_backward.check_arrays({"dy": ArraySpec.fresh(shape, dt), "x": ArraySpec.fresh(shape, dt),
                                   "weight": ArraySpec.fresh((hidden,), w_dt),
                                   "rstd": ArraySpec.fresh(shape[:-1], np.float32)})
    vec = rmsnorm.vector_width(hidden, [ArraySpec.fresh(shape, dt)], ArraySpec.fresh((hidden,), w_dt))
    p = rmsnorm_backward.plan(hidden, rows, vec, size, w_dt.itemsize)
    r = p.row
    nbytes = rmsnorm_backward.bytes_moved(shape, dt, w_dt, rstd=True)
    partial = 4 * p.grid * hidden
    written = math.prod(shape) * size + hidden * w_dt.itemsize + partial
    tile = {"grid": p.grid, "block": r.block, "kernel": "rows, then column_tree", "threads_per_row": r.tpr,
            "chunk_rows": p.chunk_rows, "chunks": p.chunks, "chunks_per_block": p.chunks_per_block,
            "one_block_computes": (f"{p.chunks_per_block} chunk(s) of {p.chunk_rows} consecutive rows, a group of "
                                   f"{r.tpr} threads walking one chunk's rows in order; one float32 partial row of "
                                   "dweight"),
            "one_thread_computes": (f"{r.items} vectors of {r.vec} elements of dy and of x of each row (held in "
                                    f"registers from load to store) and {r.items * r.vec} float32 dweight columns "
                                    "across the chunk"),
            "second_stage": (f"column_tree: {p.tree_grid} blocks of {rmsnorm_backward.PARTIAL_COLS} columns x "
                             f"{rmsnorm_backward.PARTIAL_LANES} lanes, {p.per_lane} partial rows a lane")}
    traffic = {"bytes_read": nbytes - written, "bytes_written": written,
               "counted_by": "cukern.rmsnorm_backward.bytes_moved(shape, dtype, weight_dtype, rstd=True)",
               "access_bytes": r.vec * size,
               "coalesced": (f"yes: lane k of a row's {r.tpr} threads takes vector k + j*{r.tpr}; column_tree's "
                             "warps read 128 contiguous bytes of a partial row"),
               "re_read": [f"weight ({fits_l2(hidden * w_dt.itemsize, device)}) by every row, twice (sums, then "
                           "dx): from L1/L2",
                           f"the partial rows ({fits_l2(partial, device)}) written by the rows kernel, read once by "
                           "column_tree"]}
    if vec == 1:
        traffic["access_note"] = f"hidden={hidden} or the alignment allows element accesses only"
    accumulation = {"reduces": (f"per row: sum(x^2) (when rstd is not given) and sum(dy * (offset + w) * x) over "
                                f"{hidden} elements; dweight: dy * xhat over {rows} rows"),
                    "precision": ("float32, every product and sum rounded (no fused multiply-add); dx rounded once "
                                  f"to {dtype_name(dt)}, dweight once to {dtype_name(w_dt)}"),
                    "order": (f"row sums: rms_norm's tree fixed by hidden ({rmsnorm.tree_classes(hidden)} classes); "
                              f"dweight: each chunk of {p.chunk_rows} rows in row order, then the chunks' perfect "
                              "pairwise tree padded with -0 (a block's chunks in shared memory, the blocks' rows in "
                              "column_tree)"),
                    "combine": "butterflies and shared memory for the row sums; no atomics anywhere",
                    "passes": "two launches: the rows kernel (dx and partial rows), column_tree (dweight)",
                    "batch_invariant": ("yes: dx's row bits depend on that row only; dweight's on the values, hidden "
                                        "and the row count, never on the grid, SM count or GPU "
                                        "(cukern.reference.rms_norm_backward_emulated)")}
    launches = [card.Launch(p.instantiation(dt, w_dt), p.grid, r.block, "rows kernel: dx and partial rows"),
                card.Launch(rmsnorm_backward.tree_instantiation(w_dt), p.tree_grid,
                            rmsnorm_backward.PARTIAL_LANES * rmsnorm_backward.PARTIAL_COLS, "column_tree: dweight")]

    def measure():
        s = inputs(shape, dt)
        return lambda: _run(s)

    return card.Described(launches=launches, tile=tile, traffic=traffic, accumulation=accumulation, knobs={},
                          bytes=nbytes, bytes_written=written, flops=math.prod(shape) * 10, measure=measure)


card.register(card.CardSpec(OP, (16384, 4096), "bfloat16", _describe, {"weight_dtype": None}, "rms_norm_backward"))
