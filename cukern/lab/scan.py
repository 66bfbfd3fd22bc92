"""Scans in the lab: the benchmark's cases (cumsum of 2^28 float32 values, and of a [16384, 4096] float32
matrix along axis 0, against ``cupy.cumsum``, which is CUB's scan) and the cards of cumsum and cumprod, from
the op module's ``plan`` and ``bytes_moved`` (:mod:`cukern.scan`). No tunable: the tile is part of the
result's definition, and nothing else is left to choose."""

from __future__ import annotations

import numpy as np

import cukern.lab.bench as bench
import cukern.lab.card as card
import cukern.lab.pipeline as pipeline

from .. import scan
from .._dtypes import dtype_name, parse_dtype
from .bench import Case


def inputs(shape, dtype):
    """Uniform values in [0.5, 1.5) of ``dtype`` (integers: 0 or 1; bool: half True)."""
    import cupy

    x = cupy.random.default_rng(0).random(shape, dtype=np.float32) + np.float32(0.5)
    dt = np.dtype(dtype)
    if dt == np.bool_:
        return x > 1
    return x.astype(dt)


bench.register("cumsum", bench.OpBench(
    bench.array_setup(inputs), lambda s: scan.cumsum(s["x"], axis=s["axis"]), lambda s: s["x"].cumsum(axis=s["axis"]),
    lambda case: scan.bytes_moved(case.shape, parse_dtype(case.dtype)),
    [Case("cumsum", (1 << 28,), "float32"), Case("cumsum", (16384, 4096), "float32", (("axis", 0),))]))
pipeline.register_host_pair("host_overhead_cumsum", (4096,), "float32", inputs, scan.cumsum, lambda x: x.cumsum())


# the integer types the kernels do not read, which the op converts first (cukern.scan.route)
OTHER_INTEGERS = tuple(np.dtype(t) for t in (np.int8, np.int16, np.uint8, np.uint16, np.uint32, np.uint64))


def _kernel_view(name: str, shape: tuple, dt: np.dtype, axis):
    """``(shape, dtype, axis, note)`` of the kernels' launch for ``name`` of x of ``shape`` and ``dt`` along
    ``axis`` (normalized), as the op routes it: a complex cumsum scans the parts as a trailing axis of a float
    view, the integer types the kernels do not read are converted first."""
    if dt.kind == "c" and name == "cumsum":
        part = np.dtype(np.float32 if dt == np.complex64 else np.float64)
        view = ((int(np.prod(shape)), 2), 0) if axis is None else (shape + (2,), axis)
        return *view, part, (f"x's real and imaginary parts are scanned apart, as a trailing axis of "
                             f"{dtype_name(part)} (a view: no pass)")
    how = None if dt.kind == "c" else scan.route(dt)
    if how is None:
        return shape, axis, dt, None
    via, result = how
    return shape, axis, via, (f"x is first converted to {dtype_name(via)}, and the scan's result to "
                              f"{dtype_name(result)} (two more passes, not in the count)")


def _describe(name: str):
    def describe(shape, x_dt, params, device, knobs):
        x_shape, x_axis = shape, scan.normalize_axis(bench.parse_axis(params.get("axis")), len(shape))
        shape, axis, dt, note = _kernel_view(name, shape, x_dt, x_axis)
        o = scan.result_dtype(dt)
        pl = scan.plan(shape, axis, dtypes=(dt, o))
        ahead, spread = pl.kernel == "ahead", pl.kernel == "column_tiles"
        columns = spread or pl.kernel == "columns"
        launches = []
        if pl.tiles and spread:
            aggregates, prefixes, finish = scan.column_instantiations(dt, scan.OPS[name])
            launches += [card.Launch(aggregates, pl.grid, pl.threads, "a tile of 32 neighbouring lines a block: "
                                     "each line's aggregate"),
                         card.Launch(prefixes, pl.prefix_config.grid[0], scan.BLOCK, "a thread a line: each "
                                     "tile's prefix from the aggregates before it"),
                         card.Launch(finish, pl.grid, pl.threads, "a tile of 32 neighbouring lines a block: "
                                     "its results from its prefix")]
        elif pl.tiles:
            launches.append(card.Launch(scan.instantiation(dt, o, scan.OPS[name], pl.kernel), pl.grid, pl.threads,
                                        "resident blocks walking the tiles, each tile's aggregate a round ahead of "
                                        "its scan" if ahead else "32 neighbouring lines a block, each walked whole"
                                        if columns else "a span of tiles a block, decoupled look-back"))
        items = pl.tile // scan.BLOCK
        runs = scan.BLOCK // pl.threads * (1 if ahead else scan.SPAN // pl.tile)
        block_computes = (f"tiles of {pl.tile} elements in the order it draws them, {pl.blocks_per_sm} blocks "
                          "an SM" if ahead else "one tile of 32 neighbouring lines (twice)" if spread
                          else "every tile of 32 neighbouring lines, in order" if columns
                          else f"{scan.SPAN // pl.tile} tile(s) of {pl.tile} elements of a line")
        tile = {"grid": pl.grid, "block": pl.threads, "lines": pl.rows, "elements_per_line": pl.n,
                "tile_elements": pl.tile, "one_block_computes": block_computes,
                "one_thread_computes": ("one line's 32 runs of the definition's warp (its warp's index) a tile"
                                        if columns else f"{runs} run(s) of {items} consecutive elements "
                                        f"(threads h + {pl.threads} j of the {scan.BLOCK}-thread definition)")}
        nbytes = scan.bytes_moved(shape, dt)
        written = int(np.prod(shape)) * o.itemsize
        if spread:
            re_read = ["each tile twice more in the results' launch: from DRAM (the aggregates' launch read it "
                       "first), then from L2", "a float a line and tile, three times, between the launches"]
        elif columns:
            re_read = ["each tile a second time for the results, from L2"]
        else:
            re_read = (["each tile's elements a second time, a round after the first, from L1 or L2 (streaming "
                        "loads and stores keep them there)"] if ahead else []) + [
                "the group's earlier tiles' and a few earlier groups' status words and values (8 bytes, 16 for "
                "8-byte accumulators) from L2 during the look-back"]
        traffic = {"bytes_read": nbytes - written, "bytes_written": written,
                   "counted_by": "cukern.scan.bytes_moved(shape, dtype)",
                   "access_bytes": (f"16 B vectors into registers, a thread's {items} consecutive elements"
                                    if ahead else f"{dt.itemsize} B a lane, a warp's 32 lines side by side, "
                                    "several runs' loads in flight together" if columns else
                                    f"{dt.itemsize} B in, {o.itemsize} B out, staged through shared memory"),
                   "coalesced": (f"each thread's {items * dt.itemsize} bytes in {items * dt.itemsize // 16} "
                                 f"16-byte accesses; a warp's {32 * items * dt.itemsize // 1024} KiB whole" if ahead
                                 else "yes: a warp moves 32 consecutive elements (its lanes' lines)" if columns
                                 else "yes for a unit-stride line: a warp moves 32 consecutive elements"),
                   "re_read": re_read}
        acc = "float64" if o == np.float64 else "int64" if o.kind in "iu" else "float32"
        accumulation = {"reduces": f"{name} over lines of {pl.n:,} elements", "precision": f"{acc} accumulators",
                        "order": (f"fixed by the tile of {pl.tile}: a thread's {items} in order, the lanes' ladder, "
                                  f"the warps in order, the tiles of a group of {scan.GROUP} in order, the groups in "
                                  "order (cukern.reference.cumsum_emulated)"),
                        "combine": ("each line's B_g (+) Q_t from its tiles' aggregates, by a thread a line, "
                                    "between the launches" if spread else
                                    "Q and B carried from tile to tile by the block that walks the lines"
                                    if columns else "look-back: the group's earlier aggregates; the nearest "
                                    "published group prefix, then the group totals after it, forward"),
                        "passes": 2 if spread else 1}
        notes = [note] if note else []
        if pl.copy:
            notes.append("the input is first copied to C-contiguous; that copy is not in the count")

        def measure():
            x, fn = inputs(x_shape, x_dt), getattr(scan, name)
            return lambda: fn(x, axis=x_axis)

        return card.Described(launches=launches, tile=tile, traffic=traffic, accumulation=accumulation,
                              knobs={"kernel": pl.kernel, "block": pl.threads, "items": pl.tile // pl.threads},
                              bytes=nbytes, bytes_written=written,
                              flops=int(np.prod(shape)), measure=measure, notes=notes)

    return describe


for _name in scan.OPS:
    card.register(card.CardSpec(_name, (1 << 28,), "float32", _describe(_name), {"axis": None}, "scan",
                                dtypes=scan.DTYPES + OTHER_INTEGERS))
