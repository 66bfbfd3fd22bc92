"""Fused QK-norm + RoPE in the lab: the benchmark's cases, inputs, CuPy composite peer and cukern's own unfused
composition (``cukern-composed``), the tuning space and the card, each from
:mod:`cukern.qknorm`'s own rules (its ``TUNING``, ``widest_vector``, ``vector_width``, ``plan`` and
``bytes_moved``)."""

from __future__ import annotations

import dataclasses

import numpy as np

import cukern.lab.bench as bench
import cukern.lab.card as card
import cukern.lab.pipeline as pipeline
import cukern.lab.rotary as rope_lab
import cukern.lab.tune as tune

from .. import qknorm as op
from .. import rmsnorm, rotary
from .._dtypes import BFLOAT16, dtype_name, parse_dtype
from .._layout import ArraySpec
from .bench import Case

MAX_POSITION = rope_lab.MAX_POSITION  # cache rows; positions are drawn below it


def inputs(tokens: int, num_heads: int, num_kv_heads: int, head_size: int, dtype, qkv_view: bool = False) -> dict:
    """The rotary benchmark's inputs (:func:`cukern.lab.rotary.inputs`: query and key, fused-qkv views when
    ``qkv_view``, positions, a float32 cache) plus the two norms' weights ``1 + 0.1 N(0, 1)`` of the dtype (as
    trained norms are: repeated in-place calls keep the values in range)."""
    import cupy

    s = rope_lab.inputs(tokens, num_heads, num_kv_heads, head_size, dtype, qkv_view)
    rng = cupy.random.default_rng(1)
    s["qw"], s["kw"] = ((1 + 0.1 * rng.standard_normal(head_size, dtype=np.float32)).astype(dtype) for _ in range(2))
    return s


def _fused(s) -> None:
    """The public call on the inputs of :func:`inputs`, without the position check (as a decode loop calls it)."""
    op.qk_norm_rope(s["pos"], s["q"], s["k"], s["qw"], s["kw"], s["cache"], check_positions=False)


def _composed(s) -> None:
    """The same with cukern's unfused calls: rms_norm over query's heads, over key's, then rotary_embedding."""
    rmsnorm.rms_norm(s["q"], s["qw"], out=s["q"])
    rmsnorm.rms_norm(s["k"], s["kw"], out=s["k"])
    rotary.rotary_embedding(s["pos"], s["q"], s["k"], s["cache"], check_positions=False)


# ---------------------------------------------------------------------------------------------------------
# The benchmark: case shape (tokens, num_heads, head_size), params kv_heads.


def _bench_setup(case: Case) -> dict:
    tokens, nh, hd = case.shape
    return inputs(tokens, nh, dict(case.params)["kv_heads"], hd, parse_dtype(case.dtype))


def _cupy(s) -> None:
    """The composite a CuPy user would write: float32 RMS per head, scale, gather cos/sin, rotate, write back."""
    import cupy

    half = s["cache"].shape[1] // 2
    cos = s["cache"][s["pos"], :half][:, None, :]
    sin = s["cache"][s["pos"], half:][:, None, :]
    for t, w in ((s["q"], s["qw"]), (s["k"], s["kw"])):
        x = t.astype(cupy.float32)
        x = (x / cupy.sqrt(cupy.mean(x * x, axis=-1, keepdims=True) + 1e-6) * w.astype(cupy.float32))
        x1, x2 = x[..., :half], x[..., half:]
        t[...] = cupy.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(t.dtype)


def _bench_bytes(case: Case) -> int:
    tokens, nh, hd = case.shape
    return op.bytes_moved(tokens, nh, dict(case.params)["kv_heads"], hd, parse_dtype(case.dtype))


_CASES = [Case("qk_norm_rope", (t, 32, 128), "bfloat16", (("kv_heads", 8),)) for t in (16384, 1)]
bench.register("qk_norm_rope", bench.OpBench(_bench_setup, _fused, _cupy, _bench_bytes, _CASES,
                                             variants=lambda s: [("cukern-composed", lambda: _composed(s))]))


def _host():
    """One decode token's call (Qwen3's 32 query and 8 key heads of 128), without the position check."""
    s = inputs(1, rope_lab.DECODE_HEADS, rope_lab.DECODE_KV_HEADS, rope_lab.DECODE_HEAD_SIZE, BFLOAT16)
    return op.qk_norm_rope, (s["pos"], s["q"], s["k"], s["qw"], s["kw"], s["cache"]), {"check_positions": False}


# torch's composite on the same call is bench/peers.py's host_calls() (impl "torch" beside it)
pipeline.register_host(pipeline.HostCall("host_overhead_qk_norm_rope", "cukern",
                                         (1, rope_lab.DECODE_HEADS, rope_lab.DECODE_HEAD_SIZE), _host))


# ---------------------------------------------------------------------------------------------------------
# Tuning: shape (tokens, num_heads, num_kv_heads, head_size), contiguous q and k, float32 cache, as the op
# looks it up.

SPACE = {name: list(values) for name, values in op.SPACE.items()}


def _run(s, knobs):
    return lambda: op._run(s["pos"], s["q"], s["k"], s["qw"], s["kw"], s["cache"], 1e-6, 0.0, True, None, False,
                           knobs)


def _signature(shape, dtype, knobs, sm):
    tokens, nh, nkv, hd = shape
    return op.plan(tokens, nh, nkv, hd, hd, op.widest_vector(hd, hd, True, dtype.itemsize), True, dtype.itemsize, sm,
                   knobs)


tune.register(tune.Tunable(
    rule=op.TUNING, space=SPACE,
    # mypy counts an unsized *shape as able to fill dtype's place too; shape has ndim=4
    setup=lambda shape, dtype: inputs(*shape, dtype),  # type: ignore[call-arg]
    run=_run, bytes=lambda shape, dtype: op.bytes_moved(*shape, dtype),  # type: ignore[call-arg]
    signature=_signature,
    from_case=lambda shape, params: (shape[0], shape[1], params.get("kv_heads", 8), shape[2]), ndim=4))


# ---------------------------------------------------------------------------------------------------------
# The card: shape (tokens, num_heads, head_size), params as the benchmark's plus style, rotary_dim and layout.


def _measure(tokens, nh, nkv, hd, dtype, qkv_view: bool):
    s = inputs(tokens, nh, nkv, hd, dtype, qkv_view)
    return lambda: _fused(s)


def _describe(shape, dt, params, device, knobs):
    w = ArraySpec.fresh((shape[-1],), dt)
    tokens, nh, hd, nkv, neox, rot, cache_dt, q, k = rope_lab.heads_of(
        shape, dt, params, lambda positions, q, k, cache, rot: op._validate(positions, q, k, w, w, cache, rot))
    vec = op.vector_width(q, k, w, w, ArraySpec.fresh((MAX_POSITION, rot), cache_dt), rot, neox, rot // 2)
    knobs = op.DEFAULT_KNOBS if knobs is None else knobs
    p = op.plan(tokens, nh, nkv, hd, rot, vec, neox, dt.itemsize, device.sm_count, knobs)
    launches = []
    if rope_lab.flag(params, "check_positions"):
        launches.append(card.Launch(rotary.check_instantiation(np.int64), 1, rotary.CHECK_BLOCK,
                                    "position check (then one host synchronization)"))
    launches.append(card.Launch(p.instantiation(dt, dt, cache_dt), p.grid, p.block, "norm and rotation",
                                p.shared))
    elems = tokens * (nh + nkv) * hd
    nbytes = op.bytes_moved(tokens, nh, nkv, hd, dt, rot, dt, cache_dt, np.int64)
    written = elems * dt.itemsize
    if p.pair:
        exchange = f"none: a NeoX pair's halves are {p.pair} item(s) apart in one thread"
    elif neox:
        exchange = f"the normalized head through shared memory ({p.shared} B a block)"
    else:
        exchange = "none: GPT-J pairs sit in one vector" if vec > 1 else "one shuffle with the neighbouring lane"
    tile = {"grid": p.grid, "block": p.block, "heads_per_block": p.heads_per_block,
            "one_block_computes": f"{p.heads_per_block} (token, head) slots at a time, q's heads then k's",
            "one_thread_computes": (f"{p.items} vector(s) of {p.vec} elements of one head, held in registers from "
                                    f"load to store; {p.lanes} lanes a head"),
            "pair_exchange": exchange, "style": "NeoX (halves)" if neox else "GPT-J (interleaved)",
            "rotary_dim": rot}
    traffic = {"bytes_read": nbytes - written, "bytes_written": written,
               "counted_by": "cukern.qknorm.bytes_moved(tokens, num_heads, num_kv_heads, head_size, dtype, ...)",
               "access_bytes": vec * dt.itemsize,
               "coalesced": f"yes: a head's {p.lanes} lanes take consecutive vectors of it",
               "re_read": ["the weights (head_size values each) by every head, from L1",
                           f"the token's cos/sin row ({rot * cache_dt.itemsize} B) by each of its heads, from L1",
                           "positions once per head, from L1"]}
    classes = rmsnorm.tree_classes(hd)
    accumulation = {"reduces": f"sum of squares of each head's {hd} elements",
                    "precision": ("float32, every product and sum rounded (no fused multiply-add); the normalized "
                                  f"head rounded to {dtype_name(dt)} before it is turned, then rounded once more"),
                    "order": (f"rms_norm's tree fixed by head_size: element i in class i % {classes}, each class "
                              f"summed in index order, the class sums added pairwise, neighbours first"),
                    "combine": f"tree over a thread's classes, then over the head's {p.lanes} lanes (shuffles)",
                    "passes": "one launch; the head never leaves registers",
                    "batch_invariant": ("yes: a head's bits are those of rms_norm then rotary_embedding "
                                        "(cukern.reference.qk_norm_rope_emulated), whatever the launch")}
    return card.Described(
        launches=launches, tile=tile, traffic=traffic, accumulation=accumulation, knobs=dataclasses.asdict(knobs),
        bytes=nbytes, bytes_written=written, flops=10 * elems,
        measure=lambda: _measure(tokens, nh, nkv, hd, dt, rope_lab.flag(params, "qkv_view")))


_PARAMS = {"kv_heads": 8, "neox": 1, "rotary_dim": None, "check_positions": 0, "qkv_view": 0}
card.register(card.CardSpec("qk_norm_rope", (16384, 32, 128), "bfloat16", _describe, _PARAMS, "qk_norm_rope", ndim=3))
