"""LayerNorm in the lab: the benchmark's cases, inputs and CuPy composite peers, and the cards of
``layer_norm``, ``fused_add_layer_norm`` and ``layer_norm_backward``, each from :mod:`cukern.layernorm`'s own
rules (its ``plan``, ``vector_width``, ``chunk_rows`` and ``bytes_moved``). torch and Liger-Kernel peers:
bench/peers.py."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

import cukern.lab.bench as bench
import cukern.lab.card as card

from .. import layernorm, rmsnorm
from .._dtypes import dtype_name, parse_dtype
from .._layout import ArraySpec
from .bench import Case
from .device import fits_l2

OPS = ("layer_norm", "fused_add_layer_norm", "layer_norm_backward")
EPS = 1e-5


def inputs(shape, dtype, op: str) -> dict:
    """Standard normal x (and residual, or dy and the forward's statistics), weight and bias of ``dtype``."""
    import cupy

    rng = cupy.random.default_rng(0)
    x = rng.standard_normal(shape, dtype=np.float32).astype(dtype)
    s = {"x": x, "w": rng.standard_normal(shape[-1], dtype=np.float32).astype(dtype),
         "b": rng.standard_normal(shape[-1], dtype=np.float32).astype(dtype), "out": cupy.empty_like(x)}
    if op == "fused_add_layer_norm":
        s["r"] = rng.standard_normal(shape, dtype=np.float32).astype(dtype)
    if op == "layer_norm_backward":
        s["dy"] = rng.standard_normal(shape, dtype=np.float32).astype(dtype)
        _, s["mean"], s["rstd"] = layernorm.layer_norm(x, s["w"], s["b"], eps=EPS, return_stats=True)
    return s


def _run_op(op: str):
    def run(s):
        if op == "layer_norm":
            return layernorm.layer_norm(s["x"], s["w"], s["b"], eps=EPS, out=s["out"])
        if op == "fused_add_layer_norm":
            return layernorm.fused_add_layer_norm(s["x"], s["r"], s["w"], s["b"], eps=EPS, out=s["out"])
        return layernorm.layer_norm_backward(s["dy"], s["x"], s["w"], mean=s["mean"], rstd=s["rstd"], dx=s["out"])

    return run


def _cupy_op(op: str):
    """The composite a CuPy user would write, in float32."""

    def composite(s):
        import cupy

        dt = s["x"].dtype
        x = s["x"].astype(cupy.float32)
        if op == "fused_add_layer_norm":
            x = (x + s["r"].astype(cupy.float32)).astype(dt)
            s["r"][...] = x
            x = x.astype(cupy.float32)
        w, b = s["w"].astype(cupy.float32), s["b"].astype(cupy.float32)
        if op != "layer_norm_backward":
            mean = x.mean(axis=-1, keepdims=True)
            rstd = cupy.reciprocal(cupy.sqrt(((x - mean) ** 2).mean(axis=-1, keepdims=True) + EPS))
            return ((x - mean) * rstd * w + b).astype(dt)
        dy = s["dy"].astype(cupy.float32)
        xhat = (x - s["mean"][..., None]) * s["rstd"][..., None]
        g = dy * w
        dx = s["rstd"][..., None] * (g - g.mean(axis=-1, keepdims=True)
                                     - xhat * (g * xhat).mean(axis=-1, keepdims=True))
        return dx.astype(dt), (dy * xhat).sum(axis=0).astype(dt), dy.sum(axis=0).astype(dt)

    return composite


def _bytes(op: str, shape, dt) -> int:
    if op == "layer_norm_backward":
        return layernorm.bytes_moved(shape, dt, dt, backward=True, stats=True)
    return layernorm.bytes_moved(shape, dt, dt, fused=op == "fused_add_layer_norm", bias=True)


def _register(op: str, cases) -> None:
    bench.register(op, bench.OpBench(lambda case: inputs(case.shape, parse_dtype(case.dtype), op), _run_op(op),
                                     _cupy_op(op), lambda case: _bytes(op, case.shape, parse_dtype(case.dtype)),
                                     cases))


_SHAPES = ((16384, 4096), (16384, 8192), (4096, 4096), (256, 4096))
_register("layer_norm", [Case("layer_norm", s, "bfloat16") for s in _SHAPES]
          + [Case("layer_norm", (16384, 4096), d) for d in ("float16", "float32")])
_register("fused_add_layer_norm", [Case("fused_add_layer_norm", (16384, 4096), "bfloat16")])
_register("layer_norm_backward", [Case("layer_norm_backward", s, "bfloat16") for s in _SHAPES]
          + [Case("layer_norm_backward", (16384, 4096), d) for d in ("float16", "float32")])


# ---------------------------------------------------------------------------------------------------------
# The cards.


def _describe(op: str):
    kind = {"layer_norm": "forward", "fused_add_layer_norm": "fused", "layer_norm_backward": "backward"}[op]

    def describe(shape, dt, params, device, knobs):
        knobs = layernorm.DEFAULT_KNOBS if knobs is None else knobs
        hidden, rows, size = shape[-1], math.prod(shape[:-1]), dt.itemsize
        vec = layernorm.vector_width(hidden, [ArraySpec.fresh(shape, dt)])
        p = layernorm.plan(kind, hidden, rows, vec, size, device.sm_count, knobs)
        t = p.tile
        launches = [card.Launch(p.instantiation(dt, dt), p.grid, t.block, "rows kernel")]
        nbytes = _bytes(op, shape, dt)
        n = math.prod(shape)
        thread = (f"{t.items} vectors of {t.vec} elements ({t.items * t.vec * size} B) of one row, held in registers "
                  "from load to store")
        tile = {"grid": p.grid, "block": t.block, "rows_per_block": t.rows_per_block, "threads_per_row": t.tpr,
                "one_thread_computes": thread}
        classes = rmsnorm.tree_classes(hidden)
        order = (f"element i in class i % {classes}, each class in index order, the {classes} class sums "
                 "pairwise, neighbours first: the sum (the mean: it over hidden), then the squares of x - mean")
        params = f"weight and bias ({fits_l2(2 * hidden * size, device)})"
        if kind == "backward":
            params = (f"weight ({fits_l2(hidden * size, device)}) once a thread, held across its chunks' rows"
                      if t.vec >= 4 else f"weight ({fits_l2(hidden * size, device)}) by every row: from L1/L2")
        elif p.hold:
            params += " by every row, with the row, before the statistics (a grid of one wave): from L1/L2"
        else:
            params += " by every row, after the statistics: from L1/L2"
        re_read = [params]
        if kind == "backward":
            written = n * size + 2 * hidden * size
            partials = 2 * 4 * p.chunks * hidden
            launches.append(card.Launch(layernorm.param_grads_instantiation(dt), hidden // 32 + (hidden % 32 > 0),
                                        32 * layernorm.PARAM_LANES, "dweight and dbias over the chunks"))
            tile.update({"chunks": p.chunks, "chunk_rows": p.chunk_rows,
                         "one_block_computes": (f"{t.rows_per_block} chunk(s) of {p.chunk_rows} rows, each walked "
                                                "in row order by its row group")})
            re_read.append(f"{partials:,} B of float32 partials written and read back once "
                           f"({fits_l2(partials, device)})")
            accumulation = {
                "reduces": f"sum(dy * weight) and sum(dy * weight * xhat) of each row's {hidden} elements; "
                           f"dy * xhat and dy over {rows} rows for dweight and dbias",
                "precision": "float32, every step rounded (no fused multiply-add)",
                "order": (f"row sums: element i in class i % {classes}, each class in index order, classes "
                          f"pairwise; dweight, dbias: chunks of {p.chunk_rows} rows (from the row count alone) "
                          f"in row order, then the {p.chunks} partials pairwise (padded with -0)"),
                "combine": "butterflies and shared memory for the row sums; a second kernel for the partials",
                "passes": "two launches (rows, then the partials); no float atomics",
                "batch_invariant": ("dx of a row depends on that row only; dweight and dbias on the values and the "
                                    "row count, not on the grid, knobs, SM count or GPU "
                                    "(cukern.reference.layer_norm_backward_emulated)")}
            flops = 14 * n
        else:
            fused = kind == "fused"
            written = n * size * (2 if fused else 1)
            tile["one_block_computes"] = f"{t.rows_per_block} row(s) at a time, {t.tpr} threads per row"
            accumulation = {
                "reduces": f"mean and M2 of each row's {hidden} elements",
                "precision": ("float32, every step rounded (no fused multiply-add), rstd = 1 / sqrt(M2 / hidden + "
                              f"eps) correctly rounded step by step, output rounded once to {dtype_name(dt)}"),
                "order": order,
                "combine": "sums up the tree, twice: a thread's classes, a butterfly over the row's lanes, then "
                           "the block's warps through shared memory",
                "passes": "one launch; the row never leaves registers",
                "batch_invariant": ("a row's bits depend on its values, hidden, the dtypes and eps only "
                                    "(cukern.reference.layer_norm_emulated)")}
            flops = n * (9 if fused else 8)
        traffic = {"bytes_read": nbytes - written, "bytes_written": written,
                   "counted_by": f"cukern.layernorm.bytes_moved (op {op})", "access_bytes": t.vec * size,
                   "coalesced": (f"yes: lane k of a row's {t.tpr} threads takes vector k + j*{t.tpr}"),
                   "re_read": re_read}
        return card.Described(launches=launches, tile=tile, traffic=traffic, accumulation=accumulation,
                              knobs=dataclasses.asdict(knobs), bytes=nbytes, bytes_written=written, flops=flops,
                              measure=lambda: _measure(op, shape, dt))

    return describe


def _measure(op: str, shape, dt):
    s = inputs(shape, dt, op)
    run = _run_op(op)
    return lambda: run(s)


for _op in OPS:
    card.register(card.CardSpec(_op, (16384, 4096), "bfloat16", _describe(_op), {}, "layer_norm"))
