"""RMSNorm in the lab: the benchmark's cases, inputs and CuPy composite peer, the tuning space, the
decode-step calls and the cards of ``rms_norm`` and ``fused_add_rms_norm`` (and of their float8 outputs with
per-token scales, ``rms_norm_fp8`` and ``fused_add_rms_norm_fp8``), each from
:mod:`cukern.rmsnorm`'s own rules (its ``TUNING``, ``widest_vector``, ``vector_width``, ``plan`` and
``bytes_moved``)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

import cukern.lab.bench as bench
import cukern.lab.card as card
import cukern.lab.pipeline as pipeline
import cukern.lab.tune as tune

from .. import reference, rmsnorm
from .._dtypes import BFLOAT16, dtype_name, parse_dtype
from .._layout import ArraySpec
from .bench import Case
from .device import fits_l2

OPS = {False: "rms_norm", True: "fused_add_rms_norm"}
FP8_OPS = {False: "rms_norm_fp8", True: "fused_add_rms_norm_fp8"}
DECODE_HIDDEN = 4096


def inputs(shape, dtype, fused: bool) -> dict:
    """Standard normal x and weight of ``dtype``, the residual (None unless ``fused``) and an output."""
    import cupy

    rng = cupy.random.default_rng(0)
    x = rng.standard_normal(shape, dtype=np.float32).astype(dtype)
    w = rng.standard_normal(shape[-1], dtype=np.float32).astype(dtype)
    r = rng.standard_normal(shape, dtype=np.float32).astype(dtype) if fused else None
    return {"x": x, "w": w, "r": r, "out": cupy.empty_like(x)}


def fp8_inputs(shape, dtype, fused: bool) -> dict:
    """:func:`inputs` with a uint8 output for float8 bytes."""
    import cupy

    s = inputs(shape, dtype, fused)
    s["out"] = cupy.empty(shape, np.uint8)
    return s


def _run_fp8(s):
    """The public call with float8 outputs and per-token scales on the inputs of :func:`fp8_inputs`."""
    kw = {"out": s["out"], "out_dtype": rmsnorm.FLOAT8_E4M3FN, "scale": "per_token"}
    if s["r"] is not None:
        return rmsnorm.fused_add_rms_norm(s["x"], s["r"], s["w"], **kw)
    return rmsnorm.rms_norm(s["x"], s["w"], **kw)


def _run(s):
    """The public call on the inputs of :func:`inputs`."""
    if s["r"] is not None:
        return rmsnorm.fused_add_rms_norm(s["x"], s["r"], s["w"], out=s["out"])
    return rmsnorm.rms_norm(s["x"], s["w"], out=s["out"])


# ---------------------------------------------------------------------------------------------------------
# The benchmark.


def _bench_setup(case: Case) -> dict:
    return inputs(case.shape, parse_dtype(case.dtype), case.op == OPS[True])


def _cupy(s):
    """The composite a CuPy user would write: float32 mean of squares, reciprocal square root, scale."""
    import cupy

    dt = s["x"].dtype
    x = s["x"].astype(cupy.float32)
    if s["r"] is not None:
        x = (x + s["r"].astype(cupy.float32)).astype(dt)
        s["r"][...] = x
        x = x.astype(cupy.float32)
    rstd = cupy.reciprocal(cupy.sqrt(cupy.mean(x * x, axis=-1, keepdims=True) + 1e-6))
    return (x * rstd * s["w"].astype(cupy.float32)).astype(dt)


def _bench_bytes(case: Case) -> int:
    dt = parse_dtype(case.dtype)
    return rmsnorm.bytes_moved(case.shape, dt, dt, fused=case.op == OPS[True])


_CASES = [Case("rms_norm", s, "bfloat16") for s in ((16384, 4096), (16384, 8192), (4096, 4096), (256, 4096))]
_CASES += [Case("rms_norm", (16384, 4096), d) for d in ("float16", "float32")]
bench.register("rms_norm", bench.OpBench(_bench_setup, _run, _cupy, _bench_bytes, _CASES))
bench.register("fused_add_rms_norm", bench.OpBench(_bench_setup, _run, _cupy, _bench_bytes,
                                                   [Case("fused_add_rms_norm", (16384, 4096), "bfloat16")]))


def _fp8_setup(case: Case) -> dict:
    return fp8_inputs(case.shape, parse_dtype(case.dtype), case.op == FP8_OPS[True])


def _cupy_fp8(s):
    """cukern's RMSNorm in x's dtype, then the per-token cast in CuPy array operations (CuPy has no float8
    dtype: the bytes come from :func:`cukern.reference.float8_e4m3fn_bits` on CuPy arrays)."""
    import cupy

    if s["r"] is not None:
        y = rmsnorm.fused_add_rms_norm(s["x"], s["r"], s["w"]).astype(cupy.float32)
    else:
        y = rmsnorm.rms_norm(s["x"], s["w"]).astype(cupy.float32)
    scales = cupy.maximum(cupy.abs(y).max(axis=-1) / np.float32(rmsnorm.FP8_MAX), np.float32(rmsnorm.MIN_SCALE))
    return reference.float8_e4m3fn_bits(y * (np.float32(1) / scales)[..., None]), scales


def _fp8_bytes(case: Case) -> int:
    dt = parse_dtype(case.dtype)
    return rmsnorm.bytes_moved(case.shape, dt, dt, fused=case.op == FP8_OPS[True], out_dtype=rmsnorm.FLOAT8_E4M3FN,
                               per_token=True)


for _fused, _op in FP8_OPS.items():
    bench.register(_op, bench.OpBench(_fp8_setup, _run_fp8, _cupy_fp8, _fp8_bytes,
                                      [Case(_op, (16384, 4096), "bfloat16")]))


# ---------------------------------------------------------------------------------------------------------
# Tuning: shapes are the input's shape, as the op looks them up. The space is the op's own (its
# instantiations cover it); no point of it changes a row's bits.

SPACE = {name: list(values) for name, values in rmsnorm.SPACE.items()}


def _tunable(fused: bool) -> tune.Tunable:
    def run(s, knobs):
        return lambda: rmsnorm._run(fused, s["x"], s["r"], s["w"], 1e-6, 0.0, s["out"], knobs)

    def signature(shape, dtype, knobs, sm):
        hidden, itemsize = shape[-1], dtype.itemsize
        return rmsnorm.plan(hidden, math.prod(shape[:-1]), rmsnorm.widest_vector(hidden, itemsize), itemsize, sm,
                            knobs, fused=fused)

    return tune.Tunable(rule=rmsnorm.TUNING[fused], space=SPACE, setup=lambda shape, dtype: inputs(shape, dtype, fused),
                        run=run, bytes=lambda shape, dtype: rmsnorm.bytes_moved(shape, dtype, dtype, fused=fused),
                        signature=signature)


tune.register(_tunable(False))
tune.register(_tunable(True))


# ---------------------------------------------------------------------------------------------------------
# The decode step: one call of each op per layer, into a preallocated output; the host cost is timed on
# the plain call, with ``out`` (the decode step's form) and for PyTorch's.


def _decode_shape(tokens: int) -> tuple:
    return (tokens, DECODE_HIDDEN)


def _decode_call(fused: bool) -> pipeline.DecodeCall:
    def make(tokens):
        s = inputs(_decode_shape(tokens), BFLOAT16, fused)
        if fused:
            return rmsnorm.fused_add_rms_norm, (s["x"], s["r"], s["w"]), {"out": s["out"]}
        return rmsnorm.rms_norm, (s["x"], s["w"]), {"out": s["out"]}

    return pipeline.DecodeCall(
        OPS[fused], shape=_decode_shape, make=make,
        bytes=lambda tokens: rmsnorm.bytes_moved(_decode_shape(tokens), BFLOAT16, BFLOAT16, fused=fused))


pipeline.register(_decode_call(False))
pipeline.register(_decode_call(True))


def _host(with_out: bool):
    def make():
        s = inputs(_decode_shape(1), BFLOAT16, False)
        return rmsnorm.rms_norm, (s["x"], s["w"]), {"out": s["out"]} if with_out else {}

    return make


# torch's F.rms_norm on the same shape is bench/peers.py's host_calls() (recorded as impl "torch" beside it)
pipeline.register_host(pipeline.HostCall("host_overhead", "cukern", _decode_shape(1), _host(False)))
pipeline.register_host(pipeline.HostCall("host_overhead_out", "cukern", _decode_shape(1), _host(True)))


# ---------------------------------------------------------------------------------------------------------
# The card.


def _measure(shape, dtype, fused: bool, fp8: bool = False):
    if fp8:
        s = fp8_inputs(shape, dtype, fused)
        return lambda: _run_fp8(s)
    s = inputs(shape, dtype, fused)
    return lambda: _run(s)


def _describe(fused: bool, fp8: bool = False):
    """The card of one op; ``fp8``: float8 outputs with per-token scales."""

    def describe(shape, dt, params, device, knobs):
        knobs = (rmsnorm.FP8_TUNING if fp8 else rmsnorm.TUNING)[fused].default if knobs is None else knobs
        w_dt = parse_dtype(params["weight_dtype"] or dtype_name(dt))
        hidden, rows, size = shape[-1], math.prod(shape[:-1]), dt.itemsize
        rmsnorm.check_arrays({"x": ArraySpec.fresh(shape, dt), "weight": ArraySpec.fresh((hidden,), w_dt)})
        vec = rmsnorm.vector_width(hidden, [ArraySpec.fresh(shape, dt)], ArraySpec.fresh((hidden,), w_dt))
        p = rmsnorm.plan(hidden, rows, vec, size, device.sm_count, knobs, fused=fused)
        inst = p.instantiation(dt, w_dt, fused, fp8=fp8)
        groups = -(-rows // p.rows_per_block)
        per_block = -(-groups // p.grid)
        tensors = "residual + x" if fused else "x"
        if p.kernel == "rows":
            thread = (f"{p.items} vectors of {p.vec} elements ({p.items * p.vec * size} B) of one row, held in "
                      "registers from load to store")
            block = f"{p.rows_per_block} row(s) at a time, {p.tpr} threads per row"
        else:
            thread = (f"{p.items} vectors of {p.vec} elements per {p.block * p.items * p.vec}-element chunk of one "
                      "row, streamed twice (sum of squares, then scale)")
            block = "one row at a time, the whole block on it"
        tile = {"grid": p.grid, "block": p.block, "kernel": p.kernel, "rows_per_block": p.rows_per_block,
                "threads_per_row": p.tpr, "one_block_computes": block, "one_thread_computes": thread,
                "row_groups": groups, "row_groups_per_block": per_block,
                "grid_rule": ("capped at knobs.waves x resident blocks; blocks loop over row groups"
                              if per_block > 1 else "one block per row group")}
        out_dt = rmsnorm.FLOAT8_E4M3FN if fp8 else None
        nbytes = rmsnorm.bytes_moved(shape, dt, w_dt, fused=fused, out_dtype=out_dt, per_token=fp8)
        written = math.prod(shape) * ((size if fused else 0) + (1 if fp8 else size)) + (4 * rows if fp8 else 0)
        re_read = [f"weight ({fits_l2(hidden * w_dt.itemsize, device)}) by every row group: "
                   f"{rows * hidden * w_dt.itemsize:,} B from L1/L2, should stay in L2"]
        if p.kernel == "wide":
            row_bytes = hidden * size * (2 if fused else 1)
            live = min(p.grid, device.sm_count * (2048 // p.block)) * row_bytes
            re_read.append(f"each row of {tensors} a second time for the scaling pass: {rows * row_bytes:,} B "
                           f"from L2 (rows in flight: {fits_l2(live, device)})")
        traffic = {"bytes_read": nbytes - written, "bytes_written": written,
                   "counted_by": (f"cukern.rmsnorm.bytes_moved(shape, dtype, weight_dtype, fused={fused}"
                                  + (", out_dtype=float8_e4m3fn, per_token=True)" if fp8 else ")")),
                   "access_bytes": p.vec * size,
                   "coalesced": (f"yes: lane k of a row's {p.tpr} threads takes vector k + j*{p.tpr}, so a warp "
                                 f"reads {min(p.tpr, 32) * p.vec * size} contiguous bytes per row per access"),
                   "re_read": re_read}
        if vec == 1:
            traffic["access_note"] = f"hidden={hidden} is not a multiple of {16 // size}: element accesses"
        steps = int(math.log2(min(p.tpr, 32))) if p.tpr > 1 else 0
        shuffles = f"{p.groups} x " if p.groups > 1 else ""
        combine = (f"tree over each thread's {p.vec} lane sums, {shuffles}butterfly over {min(p.tpr, 32)} lanes "
                   f"(distances 1, 2, 4, ...: {steps} steps)")
        if p.tpr > 32 or p.kernel == "wide":
            combine += (f", then a tree over the {p.groups * (p.block // 32)} warp values through shared memory "
                        f"({2 * p.groups * (p.block // 32)} floats)")
        elif p.groups > 1:
            combine += f", then a tree over the thread's {p.groups} groups"
        classes = rmsnorm.tree_classes(hidden)
        rounding = "output rounded once to " + dtype_name(dt)
        emulator = "rms_norm_fp8_emulated" if fp8 else "rms_norm_emulated"
        if fp8:
            rounding = ("each row's amax of |y| (a max: no order to fix) combined by the same helpers in the same "
                        "pass, scale max(amax / 448, 2^-126), y times its correctly rounded reciprocal rounded "
                        "to float8 e4m3fn (saturating, the same byte on every GPU)")
        passes = "one launch; the row never leaves registers" if p.kernel == "rows" else "one launch; the row is read twice"
        if fp8 and p.kernel == "wide":
            passes = ("one launch; the row is read twice (sum of squares with max |x * (offset + weight)| beside "
                      "it, then the float8 bytes)")
        accumulation = {"reduces": f"sum of squares of each row's {hidden} elements of {tensors}",
                        "precision": ("float32 (inputs widened on load), every product and sum rounded (no fused "
                                      "multiply-add), 1 / sqrt(ss / hidden + eps) correctly rounded step by step, "
                                      + rounding),
                        "order": (f"one tree fixed by hidden: element i in class i % {classes}, each class summed "
                                  f"in index order ({-(-hidden // classes)} elements), the {classes} class sums "
                                  f"added pairwise, neighbours first; each thread owns {p.groups * p.vec} classes"
                                  + (f" ({p.groups} groups of {p.vec})" if p.groups > 1 else "")),
                        "combine": combine,
                        "passes": passes,
                        "batch_invariant": ("yes, and more: a row's bits depend on its values, hidden, the dtypes, "
                                            "eps and offset only, not on rows, knobs, grid, alignment, SM count or "
                                            f"GPU (cukern.reference.{emulator} gives them on the host)")}
        return card.Described(
            launches=[card.Launch(inst, p.grid, p.block, f"{p.kernel} kernel")], tile=tile, traffic=traffic,
            accumulation=accumulation, knobs=dataclasses.asdict(knobs), bytes=nbytes, bytes_written=written,
            flops=math.prod(shape) * (5 if fused else 4),
            measure=lambda: _measure(shape, dt, fused, fp8),
        )

    return describe


_PARAMS = {"weight_dtype": None}
card.register(card.CardSpec("rms_norm", (16384, 4096), "bfloat16", _describe(False), _PARAMS, "rms_norm"))
card.register(card.CardSpec("fused_add_rms_norm", (16384, 4096), "bfloat16", _describe(True), _PARAMS, "rms_norm"))
for _fused, _op in FP8_OPS.items():
    card.register(card.CardSpec(_op, (16384, 4096), "bfloat16", _describe(_fused, fp8=True), _PARAMS, "rms_norm",
                                tuning_op=OPS[_fused]))
