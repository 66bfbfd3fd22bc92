"""Reductions in the lab: the benchmark's cases (full, row and column sums), CuPy peer and the full sums'
``cukern-no-contract`` (:data:`cukern.ladder.BEYOND`), the tuning spaces of the full and row kernels, and the
cards of every reduction, each from the op's own rules (``TUNING`` in :mod:`cukern.reduce`; ``plan``,
``plan_instantiations`` and ``bytes_moved`` in :mod:`cukern.reduce_plan`)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

import cukern.lab.bench as bench
import cukern.lab.card as card
import cukern.lab.pipeline as pipeline
import cukern.lab.tune as tune

from .. import ladder, reduce, reduce_plan
from .._dtypes import dtype_name, parse_dtype
from .._layout import contiguous_strides
from .bench import Case


def inputs(shape, dtype):
    """Standard normal values of ``dtype``."""
    import cupy

    return cupy.random.default_rng(0).standard_normal(shape, dtype=np.float32).astype(dtype)


# ---------------------------------------------------------------------------------------------------------
# The benchmark: param axis (None: everything).


_bench_setup = bench.array_setup(inputs)
# a small call, where the host path is the cost: cukern.sum against cupy.sum
pipeline.register_host_pair("host_overhead_sum", (4096,), "float32", inputs, reduce.sum, lambda x: x.sum())


def _bench_bytes(case: Case) -> int:
    return reduce_plan.bytes_moved(case.shape, parse_dtype(case.dtype), dict(case.params).get("axis"))


_CASES = [Case("sum", (n,), "float32") for n in (1 << 29, 1 << 20, 1 << 24)]
_CASES += [Case("sum", (1 << 28,), "float64"),
           Case("sum", (1 << 30,), "bfloat16"), Case("sum_rows", (32768, 16384), "float32", (("axis", -1),)),
           Case("sum_cols", (16384, 32768), "float32", (("axis", 0),))]


def _no_contract(state) -> list:
    """A full sum's ``cukern-no-contract``: the ladder's rung past production (v10 without the fixed tree), so
    that a gap to a peer can be told apart as what the same-bits contract costs."""
    if state["axis"] is not None:
        return []
    return [("cukern-no-contract", lambda: ladder.BEYOND(state["x"]))]


bench.register("sum", bench.OpBench(_bench_setup, lambda s: reduce.sum(s["x"], axis=s["axis"]),
                                    lambda s: s["x"].sum(axis=s["axis"]), _bench_bytes, _CASES, _no_contract))


def _bench_bytes_of(name: str):
    def count(case: Case) -> int:
        return reduce_plan.bytes_moved(case.shape, parse_dtype(case.dtype), dict(case.params).get("axis"), op=name)

    return count


def _nan_setup(case: Case) -> dict:
    """Normal values with a NaN in about one element of 100."""
    import cupy

    s = _bench_setup(case)
    x = s["x"]
    flat = x.reshape(-1)
    flat[cupy.random.default_rng(1).random(flat.size, dtype=np.float32) < 0.01] = np.nan
    return s


def _cupy_logsumexp(x, axis):
    """cupyx.scipy.special.logsumexp when this CuPy has it, else the CuPy composite (max, exp, sum, log)."""
    try:
        from cupyx.scipy.special import logsumexp as lse
    except ImportError:
        import cupy

        m = x.max(axis=axis, keepdims=True)
        m = cupy.where(cupy.isfinite(m), m, 0)
        return cupy.squeeze(cupy.log(cupy.exp(x - m).sum(axis=axis, keepdims=True)) + m, axis=axis)
    return lse(x, axis=axis)


bench.register("nansum", bench.OpBench(
    _nan_setup, lambda s: reduce.nansum(s["x"], axis=s["axis"]),
    lambda s: __import__("cupy").nansum(s["x"], axis=s["axis"]), _bench_bytes_of("nansum"),
    [Case("nansum", (1 << 28,), "float32")]))
bench.register("logsumexp", bench.OpBench(
    _bench_setup, lambda s: reduce.logsumexp(s["x"], axis=s["axis"]), lambda s: _cupy_logsumexp(s["x"], s["axis"]),
    _bench_bytes_of("logsumexp"), [Case("logsumexp_rows", (32768, 16384), "float32", (("axis", -1),))]))
bench.register("var", bench.OpBench(
    _bench_setup, lambda s: reduce.var(s["x"], axis=s["axis"]), lambda s: s["x"].var(axis=s["axis"]),
    _bench_bytes_of("var"), [Case("var", (1 << 28,), "float32"),
                             Case("var_rows", (32768, 16384), "float32", (("axis", -1),))]))


# ---------------------------------------------------------------------------------------------------------
# Tuning: ``sum`` over everything (shape ``(n,)``, the full kernel) and ``sum_rows`` (shape ``(rows,
# length)``, axis -1, the rows kernel), as the ops look them up; every reduction uses the sum's knobs.

# Every point is a split of the one tree (cukern.reduce_plan's notes): the tuner chooses speed, never bits.
SPACES: dict[str, dict[str, list]] = {
    "sum": {"full_block": [256, 512, 1024], "full_blocks_per_sm": [1, 2, 4], "full_unroll": [2, 4, 8]},
    "sum_rows": {"row_items": [8, 16, 32], "row_max_tpr": [128, 256, 512], "row_unroll": [2, 4, 8],
                 "row_threads_per_sm": [1024, 2048], "row_waves": [None, 4, 8, 16]},
}


def _tunable(op: str) -> tune.Tunable:
    axis = None if op == "sum" else -1

    def run(s, knobs):
        return lambda: reduce._reduce("sum", s, axis, None, False, None, knobs=knobs)

    def signature(shape, dtype, knobs, sm):
        return reduce_plan.plan(shape, dtype, axis, sm_count=sm, knobs=knobs)

    return tune.Tunable(
        rule=reduce.TUNING[op], space=SPACES[op], setup=inputs, run=run,
        bytes=lambda shape, dtype: reduce_plan.bytes_moved(shape, dtype, axis), signature=signature,
        from_case=(lambda shape, params: (math.prod(shape),)) if op == "sum" else None)


tune.register(_tunable("sum"))
tune.register(_tunable("sum_rows"))


# ---------------------------------------------------------------------------------------------------------
# The cards: param axis, as an int, a tuple or text ("0", "(0, 1)", "none").

# the column and strided kernels take no knobs: their cards show the constants that size them
_FIXED = {"cols": {"col_block": reduce_plan.COL_BLOCK, "col_waves": reduce_plan.COL_WAVES,
                   "col_max_spans": reduce_plan.COL_MAX_SPANS},
          "strided": {"strided_block": reduce_plan.STRIDED_BLOCK, "strided_waves": reduce_plan.STRIDED_WAVES}}


# what x becomes before the kernels, for the dtypes they do not read as they are (cukern.reduce_plan.route)
_LOWERED = {"cast": "x is first converted to {via} (one more pass over x, not in the count)",
            "view": "x's bits are read as {via} (a view: no pass)",
            "flip": "x's bits are read as {via} with the sign bit flipped (one more pass over x, not in the count)",
            "complex": "x's real and imaginary parts are reduced as a trailing axis of {via} (a view: no pass)"}


def _lowered(name: str, shape: tuple, dt: np.dtype, axis):
    """``(kernel op, shape, dtype, axis, kernel result dtype or None, note)`` of the kernels' launch for
    ``name`` of x of ``shape`` and ``dt`` along ``axis``, as the op routes it; a ValueError where no kernel of
    this family runs."""
    rt = reduce_plan.route(name, dt, reduce_plan.default_dtype(name, dt))
    if rt.how == "direct" and rt.op == name:
        return name, shape, dt, axis, None, None
    if rt.how == "gather":
        raise ValueError(f"{name} of {dtype_name(dt)} runs no reduction kernel: it gathers the element that the "
                         "arg-reduction kernels find (their cards: argmax, argmin, nanargmax, nanargmin)")
    if rt.how == "complex":
        axes = reduce_plan.normalize_axis(axis, len(shape))
        axis, shape = axes + ((len(shape),) if name == "norm" else ()), shape + (2,)
    return rt.op, shape, rt.via, axis, rt.kernel, _LOWERED.get(rt.how, "").format(via=dtype_name(rt.via))


def _describe_complex_logsumexp(shape, dt, axis, device):
    """logsumexp of complex x: reduce_lse_complex, one warp an output over x's own strides (C-contiguous here),
    the plan of the weighted kernel."""
    axes = reduce_plan.normalize_axis(axis, len(shape))
    strides = contiguous_strides(tuple(shape))
    pl = reduce_plan.plan_weighted(shape, strides, strides, axes, device.sm_count)
    outputs, count = pl.outputs, pl.count
    written = outputs * dt.itemsize
    nbytes = reduce_plan.bytes_moved(shape, dt, axis, op="logsumexp")
    part = dtype_name(reduce_plan.real_of(dt))
    launches = [card.Launch(reduce_plan.complex_instantiation(dt), pl.grid, pl.block, "strided kernel, one pass")]
    tile = {"kind": "strided", "grid": pl.grid, "block": pl.block, "outputs": outputs, "elements_per_output": count,
            "one_block_computes": f"{pl.block // 32} outputs, one per warp",
            "one_thread_computes": "1/32 of one output's elements: a chain of 8 at a time, each an exp, a cos and a sin"}
    traffic = {"bytes_read": nbytes - written, "bytes_written": written,
               "counted_by": "cukern.reduce.bytes_moved(shape, dtype, axis, op='logsumexp')",
               "access_bytes": f"{dt.itemsize} B", "coalesced": "where the reduced inner stride is 1",
               "re_read": ["nothing: every element is read once"]}
    accumulation = {"reduces": f"complex logsumexp of {count:,} elements per output",
                    "precision": (f"{part} state (max of the real parts, complex scaled sum), cukern's own exp, cos, "
                                  f"sin, atan2 and log; result {dtype_name(dt)}"),
                    "order": (f"one fixed tree per reduced length (chains of {reduce_plan.TREE_CHAIN_LENGTH} "
                              f"elements {reduce_plan.TREE_CHAINS} apart, then pairs): the same bits for every launch "
                              "and GPU (cukern.reference.logsumexp_complex_emulated)"),
                    "combine": "pairs of neighbours: shuffles, a leaf stack per warp", "passes": 1}
    # floating operations an element, counted from reduce.cu's steps: the exp, the argument reduction (Cody and
    # Waite's), the sin and cos series, the products and the sums (float's fused steps count once)
    per_element = 50 if dt == np.dtype(np.complex64) else 100
    notes = [f"about {per_element} floating operations an element (an exp, a reduction of the phase, two series), "
             "where the real logsumexp takes about 15; one warp an output, so a full reduction runs on one warp"]
    if pl.copy:
        notes.append("the input is first copied to contiguous (reduced axes last); that copy is not in the count")

    def measure():
        x = inputs(shape, dt)
        return lambda: reduce.logsumexp(x, axis=axis)

    return card.Described(launches=launches, tile=tile, traffic=traffic, accumulation=accumulation,
                          knobs=dict(_FIXED["strided"]), bytes=nbytes, bytes_written=written,
                          flops=outputs * count * per_element, measure=measure, notes=notes)


def _describe(public: str):
    def describe(shape, x_dt, params, device, knobs):
        x_shape, x_axis = shape, bench.parse_axis(params["axis"])
        if public == "logsumexp" and np.dtype(x_dt) in reduce_plan.COMPLEX:
            return _describe_complex_logsumexp(shape, np.dtype(x_dt), x_axis, device)
        name, shape, dt, axis, lowered, note = _lowered(public, shape, x_dt, x_axis)
        op = reduce_plan.OPS[name]
        final = reduce_plan.default_dtype(name, dt)
        o = lowered or (dt if op.minmax else reduce_plan.kernel_dtype(name, dt, final))
        if knobs is None:
            knobs = reduce_plan.kernel_op_knobs(op.kernel_op)
            if axis == (len(shape) - 1,) or axis == len(shape) - 1 or axis == -1:
                knobs = reduce_plan.row_knobs(knobs, dt)  # the op's own choice for rows (reduce._tuned_knobs)
        pl = reduce_plan.plan(shape, dt, axis, op=name, sm_count=device.sm_count, knobs=knobs)
        insts = reduce_plan.plan_instantiations(pl, dt, o, op.kernel_op)
        kind, p = pl.layout.kind, pl.kernel
        launches = []
        if insts:
            role = f"{kind} kernel" + (", pass 1 of 2" if pl.fold else "")
            launches.append(card.Launch(insts[0], p.grid, p.block, role))
        if pl.fold is not None:
            launches.append(card.Launch(insts[1], pl.fold.grid, pl.fold.block, "fold of the column spans, pass 2 of 2"))
        outputs, count = pl.layout.outputs, pl.layout.count
        size, acc = dt.itemsize, reduce_plan.acc_dtype(o)
        leaf = reduce_plan.TREE_LEAF
        if kind == "full":
            chunk = reduce_plan.chunk_elements(size)
            chunks = -(-count // chunk)
            span = 1 << max(0, (-(-chunks // (p.grid * (p.block // 32))) - 1).bit_length())
            thread = (f"chains of {span} chunk(s) of {chunk:,} elements ({reduce_plan.lane_elements(size)} chains a "
                      f"lane), {p.unroll} 16-byte loads in flight")
            block = (f"{p.block // 32} warps, each an aligned span of {span} chunk(s), to one partial; the last block "
                     f"combines {p.grid}")
        elif kind == "rows":
            thread = f"1/{p.tpr} of a row ({-(-count // p.tpr)} elements), {p.unroll} 16-byte loads in flight"
            block = f"{p.block // p.tpr} row(s) at a time ({p.tpr} threads per row), looping when the grid is capped"
        elif kind == "cols":
            lanes = reduce_plan.TREE_CHAINS // p.q
            thread = f"{p.vec} adjacent columns, {p.q} chain(s) of every leaf ({p.span} leaves of {leaf} rows)"
            block = (f"a strip of {p.columns} columns x {p.span * leaf} rows, {lanes} row lanes "
                     f"({p.spans} span(s) a column)")
        elif kind == "strided":
            thread = "1/32 of one output's elements"
            block = f"{p.block // 32} outputs, one per warp"
        else:
            thread = block = "no kernel: each output is one input element"
        tile = {"kind": kind, "grid": getattr(p, "grid", None), "block": getattr(p, "block", None),
                "outputs": outputs, "elements_per_output": count, "one_block_computes": block,
                "one_thread_computes": thread}
        nbytes = reduce_plan.bytes_moved(shape, dt, axis, op=name)
        written = outputs * final.itemsize
        if kind == "cols":
            width = f"{p.vec * size} B per row ({p.vec} columns)" if p.vector else f"{size} B ({p.vec} scalar loads)"
            coalesced = "yes: a warp's threads own adjacent column packs, so each row read is contiguous"
        elif kind == "strided":
            width, coalesced = f"{size} B", "no: a warp walks one output's strided elements"
        else:
            width, coalesced = "16 B (scalar head and tail)", "yes: contiguous spans read as 16-byte vectors"
        re_read = ["nothing: every element is read once"]
        if pl.fold is not None:
            re_read = [f"partials ({outputs * p.spans * acc.itemsize:,} B) written by pass 1, read by pass 2 "
                       "from L2"]
        traffic = {"bytes_read": nbytes - written, "bytes_written": written,
                   "counted_by": f"cukern.reduce.bytes_moved(shape, dtype, axis, op={name!r})",
                   "access_bytes": width, "coalesced": coalesced, "re_read": re_read}
        combine = {"full": f"pairs of neighbours: in a lane, shuffles, a span stack per warp, shared memory "
                           f"across warps, then the last of {getattr(p, 'grid', 0)} blocks",
                   "rows": "pairs of neighbours: in a lane, shuffles, a span stack per warp, shared memory "
                           "across the row's warps",
                   "cols": "pairs of neighbours: in a thread, shuffles across row lanes, a span stack per column"
                           + (", then a second pass over the spans" if pl.fold else ""),
                   "strided": "pairs of neighbours: shuffles, a leaf stack per warp"}.get(kind, "none")
        accumulation = {"reduces": f"{name} of {count:,} elements per output",
                        "precision": f"{dtype_name(acc)} accumulators, result {dtype_name(final)}",
                        "order": (f"one fixed tree per reduced length (chains of {reduce_plan.TREE_CHAIN_LENGTH} "
                                  f"elements {reduce_plan.TREE_CHAINS} apart, then pairs): the same bits for every "
                                  "plan, knob, SM count and layout (cukern.reference.sum_emulated)"),
                        "combine": combine, "passes": len(launches)}
        notes = [note] if note else []
        if pl.copy:
            notes.append("the input is first copied to contiguous (reduced axes last); that copy is not in the count")
        prefix = {"full": "full_", "rows": "row_"}.get(kind)
        if prefix:
            knob_values = {k: v for k, v in dataclasses.asdict(knobs).items() if k.startswith(prefix)}
        else:
            knob_values = _FIXED.get(kind, {})
        flops = outputs * count * (2 if op.kernel_op == reduce_plan.OP_SUMSQ else 1)

        def measure():
            x, fn = inputs(x_shape, x_dt), getattr(reduce, public)
            return lambda: fn(x, axis=x_axis)

        return card.Described(launches=launches, tile=tile, traffic=traffic, accumulation=accumulation,
                              knobs=knob_values, bytes=nbytes, bytes_written=written, flops=flops,
                              measure=measure, notes=notes)

    return describe


for _name, _op in reduce_plan.OPS.items():
    if not hasattr(reduce, _name):  # count_not_nan: a building block of nanmean, not an op of its own
        continue
    card.register(card.CardSpec(_name, (1 << 29,), "float32", _describe(_name), {"axis": None}, "reduce",
                                dtypes=reduce_plan.PUBLIC_INPUTS[_name]))
card.register(card.CardSpec("sum_rows", (32768, 16384), "float32", _describe("sum"), {"axis": -1}, "reduce",
                            dtypes=reduce_plan.PUBLIC_INPUTS["sum"]))
card.register(card.CardSpec("sum_cols", (16384, 32768), "float32", _describe("sum"), {"axis": 0}, "reduce",
                            dtypes=reduce_plan.PUBLIC_INPUTS["sum"]))
card.register(card.CardSpec("logsumexp_rows", (32768, 16384), "float32", _describe("logsumexp"), {"axis": -1},
                            "reduce", dtypes=reduce_plan.PUBLIC_INPUTS["logsumexp"]))
card.register(card.CardSpec("var_rows", (32768, 16384), "float32", _describe("var"), {"axis": -1}, "reduce",
                            dtypes=reduce_plan.PUBLIC_INPUTS["var"]))
