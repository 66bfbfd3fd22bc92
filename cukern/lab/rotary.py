"""Rotary embedding in the lab: the benchmark's cases, inputs and CuPy composite peer, the tuning spaces of
both styles, the decode-step call and the cards, each from :mod:`cukern.rotary`'s own rules (its
``TUNING``, ``widest_vector``, ``vector_width``, ``plan`` and ``bytes_moved``)."""

from __future__ import annotations

import dataclasses

import numpy as np

import cukern.lab.bench as bench
import cukern.lab.card as card
import cukern.lab.pipeline as pipeline
import cukern.lab.tune as tune

from .. import rotary
from .._dtypes import BFLOAT16, dtype_name, parse_dtype
from .._layout import ArraySpec
from ..rope_cache import rope_cache
from .bench import Case
from .device import fits_l2

MAX_POSITION = 8192  # cache rows; positions are drawn below it
DECODE_HEADS, DECODE_KV_HEADS, DECODE_HEAD_SIZE = 32, 8, 128


def inputs(tokens: int, num_heads: int, num_kv_heads: int, head_size: int, dtype, qkv_view: bool = False) -> dict:
    """Query and key as views into one fused [tokens, (nh + 2 nkv) hd] qkv buffer when ``qkv_view``, else
    separate contiguous arrays; random positions below :data:`MAX_POSITION` into a float32 cache."""
    import cupy

    rng = cupy.random.default_rng(0)
    nh, nkv, hd = num_heads, num_kv_heads, head_size
    if qkv_view:
        qkv = rng.standard_normal((tokens, (nh + 2 * nkv) * hd), dtype=np.float32).astype(dtype)
        q = qkv[:, : nh * hd].reshape(tokens, nh, hd)
        k = qkv[:, nh * hd: (nh + nkv) * hd].reshape(tokens, nkv, hd)
    else:
        q = rng.standard_normal((tokens, nh, hd), dtype=np.float32).astype(dtype)
        k = rng.standard_normal((tokens, nkv, hd), dtype=np.float32).astype(dtype)
    return {"q": q, "k": k, "cache": rope_cache(MAX_POSITION, hd),
            "pos": rng.integers(0, MAX_POSITION, tokens, dtype=np.int64)}


def _rotate(s, neox: bool) -> None:
    """The public call on the inputs of :func:`inputs`, without the position check (as a decode loop calls it)."""
    rotary.rotary_embedding(s["pos"], s["q"], s["k"], s["cache"], is_neox=neox, check_positions=False)


# ---------------------------------------------------------------------------------------------------------
# The benchmark: case shape (tokens, num_heads, head_size), params kv_heads, neox and qkv_view.


def _bench_setup(case: Case) -> dict:
    p = dict(case.params)
    tokens, nh, hd = case.shape
    return {**inputs(tokens, nh, p["kv_heads"], hd, parse_dtype(case.dtype), p.get("qkv_view", False)),
            "neox": p.get("neox", True)}


def _cupy(s) -> None:
    """The composite a CuPy user would write: gather cos/sin rows, rotate in float32, write back."""
    import cupy

    half = s["cache"].shape[1] // 2
    cos = s["cache"][s["pos"], :half][:, None, :]
    sin = s["cache"][s["pos"], half:][:, None, :]
    for t in (s["q"], s["k"]):
        x = t.astype(cupy.float32)
        if s["neox"]:
            x1, x2 = x[..., :half], x[..., half:]
            t[...] = cupy.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(t.dtype)
        else:
            x1, x2 = x[..., 0::2], x[..., 1::2]
            t[..., 0::2] = (x1 * cos - x2 * sin).astype(t.dtype)
            t[..., 1::2] = (x2 * cos + x1 * sin).astype(t.dtype)


def _bench_bytes(case: Case) -> int:
    tokens, nh, hd = case.shape
    return rotary.bytes_moved(tokens, nh, dict(case.params)["kv_heads"], hd, parse_dtype(case.dtype))


def _case(op, tokens, **params) -> Case:
    return Case(op, (tokens, 32, 128), "bfloat16", tuple(sorted({"kv_heads": 8, **params}.items())))


_CASES = [_case("rotary_embedding", 16384), _case("rotary_embedding_gptj", 16384, neox=False),
          _case("rotary_embedding_qkv_view", 16384, qkv_view=True)]
_CASES += [_case("rotary_embedding", t) for t in (1, 8, 64, 4096)]
bench.register("rotary_embedding", bench.OpBench(_bench_setup, lambda s: _rotate(s, s["neox"]), _cupy, _bench_bytes,
                                                 _CASES))


# ---------------------------------------------------------------------------------------------------------
# Tuning: shape (tokens, num_heads, num_kv_heads, head_size), contiguous q and k, float32 cache, as the op
# looks it up.

SPACE = {"items": [1, 2, 4], "target_block": [128, 256], "waves": [None, 4], "min_blocks": [1, 2, 4]}


def _tunable(neox: bool) -> tune.Tunable:
    def run(s, knobs):
        return lambda: rotary._run(s["pos"], s["q"], s["k"], s["cache"], neox, None, False, False, knobs)

    def signature(shape, dtype, knobs, sm):
        tokens, nh, nkv, hd = shape
        return rotary.plan(tokens, nh, nkv, hd, rotary.widest_vector(hd, dtype.itemsize), neox, sm, knobs)

    return tune.Tunable(
        rule=rotary.TUNING[neox], space=SPACE,
        # mypy counts an unsized *shape as able to fill dtype's place too; shape has ndim=4
        setup=lambda shape, dtype: inputs(*shape, dtype),  # type: ignore[call-arg]
        run=run, bytes=lambda shape, dtype: rotary.bytes_moved(*shape, dtype),  # type: ignore[call-arg]
        signature=signature,
        from_case=lambda shape, params: (shape[0], shape[1], params.get("kv_heads", 8), shape[2]), ndim=4)


tune.register(_tunable(True))
tune.register(_tunable(False))


# ---------------------------------------------------------------------------------------------------------
# The decode step: one NeoX rotation of 32 + 8 heads of 128 per layer.


def _decode(tokens: int):
    s = inputs(tokens, DECODE_HEADS, DECODE_KV_HEADS, DECODE_HEAD_SIZE, BFLOAT16)
    return rotary.rotary_embedding, (s["pos"], s["q"], s["k"], s["cache"]), {"check_positions": False}


pipeline.register(pipeline.DecodeCall(
    "rotary_embedding", shape=lambda tokens: (tokens, DECODE_HEADS, DECODE_HEAD_SIZE), make=_decode,
    bytes=lambda tokens: rotary.bytes_moved(tokens, DECODE_HEADS, DECODE_KV_HEADS, DECODE_HEAD_SIZE, BFLOAT16)))


def _host(check_positions: bool):
    """One token's call, without and with the position check (which waits for the GPU)."""
    def make():
        fn, args, _ = _decode(1)
        return fn, args, {"check_positions": check_positions}

    return make


pipeline.register_host(pipeline.HostCall("host_overhead_rotary", "cukern", (1, DECODE_HEADS, DECODE_HEAD_SIZE),
                                         _host(False)))
pipeline.register_host(pipeline.HostCall("host_overhead_rotary_checked", "cukern",
                                         (1, DECODE_HEADS, DECODE_HEAD_SIZE), _host(True)))


# ---------------------------------------------------------------------------------------------------------
# The cards: shape (tokens, num_heads, head_size), params as the benchmark's.


def _measure(tokens, nh, nkv, hd, dtype, neox: bool, qkv_view: bool):
    s = inputs(tokens, nh, nkv, hd, dtype, qkv_view)
    return lambda: _rotate(s, neox)


def flag(params, key: str) -> bool:
    """A 0 or 1 param (the command line's form of True and False) as a bool."""
    if params[key] not in (0, 1):
        raise ValueError(f"param {key}={params[key]} must be 0 or 1")
    return bool(params[key])


def heads_of(shape, dt, params, validate=rotary._validate):
    """The card's query and key from its shape and params (also the fused QK-norm card's): (tokens, query
    heads, head size, kv heads, NeoX, rotary_dim, the float32 cache dtype, query spec, key spec), query and key
    views into one fused qkv buffer when ``qkv_view``. ``validate(positions, query, key, cache, rotary_dim)``:
    the op's own checks, on stand-ins for int64 positions and a float32 cache as wide as a head."""
    tokens, nh, hd = shape
    nkv, neox = params["kv_heads"], flag(params, "neox")
    if nkv < 0:
        raise ValueError(f"param kv_heads={nkv} must be at least 0")
    heads = nh + 2 * nkv if flag(params, "qkv_view") else nh
    strides = tuple(s * dt.itemsize for s in (heads * hd, hd, 1))
    q = ArraySpec((tokens, nh, hd), strides, dt)
    k = ArraySpec((tokens, nkv, hd), strides, dt)
    cache_dt = np.dtype(np.float32)
    rot = validate(ArraySpec.fresh((tokens,), np.int64), q, k, ArraySpec.fresh((MAX_POSITION, hd), cache_dt),
                   params["rotary_dim"]).rotary_dim
    return tokens, nh, hd, nkv, neox, rot, cache_dt, q, k


def _describe(shape, dt, params, device, knobs):
    tokens, nh, hd, nkv, neox, rot, cache_dt, q, k = heads_of(shape, dt, params)
    vec = rotary.vector_width(q, k, ArraySpec.fresh((MAX_POSITION, rot), cache_dt), rot, neox, rot // 2)
    knobs = rotary.DEFAULT_KNOBS if knobs is None else knobs
    p = rotary.plan(tokens, nh, nkv, rot, vec, neox, device.sm_count, knobs)
    launches = []
    if flag(params, "check_positions"):
        launches.append(card.Launch(rotary.check_instantiation(np.int64), 1, rotary.CHECK_BLOCK,
                                    "position check (then one host synchronization)"))
    launches.append(card.Launch(p.instantiation(dt, cache_dt), p.grid, p.block, "rotation"))
    elems = tokens * (nh + nkv) * rot
    nbytes = rotary.bytes_moved(tokens, nh, nkv, rot, dt, cache_dt, np.int64)
    written = elems * dt.itemsize
    tile = {"grid": p.grid, "block": p.block, "tokens_per_block": p.tokens_per_block,
            "threads_per_token": f"{p.threads_per_token} ({p.lanes} lanes x {p.groups} head groups)",
            "one_block_computes": f"{p.tokens_per_block} token(s): all {p.heads} q and k heads of each",
            "one_thread_computes": (f"unit u of {p.heads_per_thread} head(s): {p.pairs} pair(s) a head, "
                                    f"{p.items} head(s) loaded before any is rotated"),
            "style": "NeoX (halves)" if neox else "GPT-J (interleaved)", "rotary_dim": rot}
    traffic = {"bytes_read": nbytes - written, "bytes_written": written,
               "counted_by": "cukern.rotary.bytes_moved(tokens, num_heads, num_kv_heads, rotary_dim, dtype)",
               "access_bytes": vec * dt.itemsize,
               "coalesced": "yes: the lanes of a warp take consecutive units of a head, then the next head",
               "re_read": [f"the token's cos/sin row ({rot * cache_dt.itemsize} B) by each of its {p.groups} head "
                           "groups, from L1", "positions once per thread, from L1",
                           "cos/sin rows repeat across tokens at equal positions: the cache should sit in L2 "
                           f"({fits_l2(MAX_POSITION * rot * cache_dt.itemsize, device)} for {MAX_POSITION} "
                           "positions)"]}
    accumulation = {"reduces": "nothing: each output is two float32 products and one add",
                    "precision": "float32, rounded once to " + dtype_name(dt), "combine": "none", "passes": "one"}
    notes = []
    if flag(params, "check_positions"):
        notes.append("the profile measures the rotation (check_positions=False, as the benchmark does)")
    return card.Described(
        launches=launches, tile=tile, traffic=traffic, accumulation=accumulation, knobs=dataclasses.asdict(knobs),
        bytes=nbytes, bytes_written=written, flops=3 * elems,
        measure=lambda: _measure(tokens, nh, nkv, hd, dt, neox, flag(params, "qkv_view")), notes=notes)


_PARAMS = {"kv_heads": 8, "neox": 1, "rotary_dim": None, "check_positions": 1, "qkv_view": 0}
card.register(card.CardSpec("rotary_embedding", (16384, 32, 128), "bfloat16", _describe, _PARAMS, "rotary", ndim=3))
card.register(card.CardSpec("rotary_embedding_gptj", (16384, 32, 128), "bfloat16", _describe, {**_PARAMS, "neox": 0},
                            "rotary", ndim=3))
card.register(card.CardSpec("rotary_embedding_qkv_view", (16384, 32, 128), "bfloat16", _describe,
                            {**_PARAMS, "qkv_view": 1}, "rotary", tuning_op="rotary_embedding", ndim=3))


# ---------------------------------------------------------------------------------------------------------
# rotary_embedding_positions: cos and sin computed in the kernel, no cache; positions up to 2^20.


def _positions_setup(case: Case) -> dict:
    import cupy

    tokens, nh, hd = case.shape
    s = inputs(tokens, nh, dict(case.params)["kv_heads"], hd, parse_dtype(case.dtype))
    s["pos"] = cupy.random.default_rng(1).integers(0, 2**20, tokens, dtype=np.int64)
    return s


def _positions_run(s) -> None:
    rotary.rotary_embedding_positions(s["pos"], s["q"], s["k"], rotary_dim=s["q"].shape[-1])


def _positions_cupy(s) -> None:
    """The composite a CuPy user would write: float32 angles from the positions, cos and sin, rotate."""
    import cupy

    hd = s["q"].shape[-1]
    inv = 1.0 / (10000.0 ** (cupy.arange(0, hd, 2, dtype=cupy.float32) / hd))
    angle = s["pos"].astype(cupy.float32)[:, None] * inv
    cos, sin = cupy.cos(angle)[:, None, :], cupy.sin(angle)[:, None, :]
    half = hd // 2
    for t in (s["q"], s["k"]):
        x = t.astype(cupy.float32)
        x1, x2 = x[..., :half], x[..., half:]
        t[...] = cupy.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(t.dtype)


def _positions_bytes(case: Case) -> int:
    tokens, nh, hd = case.shape
    return rotary.positions_bytes_moved(tokens, nh, dict(case.params)["kv_heads"], hd, parse_dtype(case.dtype))


bench.register("rotary_embedding_positions", bench.OpBench(
    _positions_setup, _positions_run, _positions_cupy, _positions_bytes,
    [Case("rotary_embedding_positions", (t, 32, 128), "bfloat16", (("kv_heads", 8),)) for t in (16384, 1)]))


def _positions_describe(shape, dt, params, device, knobs):
    tokens, nh, hd, nkv, neox, rot, _, _, _ = heads_of(shape, dt, {**params, "qkv_view": 0})
    vec = rotary.widest_vector(rot, dt.itemsize)
    p, shared = rotary.positions_plan(tokens, nh, nkv, rot, vec, neox, device.sm_count)
    elems = tokens * (nh + nkv) * rot
    nbytes = rotary.positions_bytes_moved(tokens, nh, nkv, rot, dt)
    written = elems * dt.itemsize
    tile = {"grid": p.grid, "block": p.block, "tokens_per_block": p.tokens_per_block,
            "threads_per_token": f"{p.threads_per_token} ({p.lanes} lanes x {p.groups} head groups)",
            "one_block_computes": (f"cos and sin of its {p.tokens_per_block} token(s) into shared memory "
                                   f"({shared} B), then all {p.heads} q and k heads of each"),
            "one_thread_computes": f"unit u of {p.heads_per_thread} head(s): {p.pairs} pair(s) a head",
            "style": "NeoX (halves)" if neox else "GPT-J (interleaved)", "rotary_dim": rot}
    traffic = {"bytes_read": nbytes - written, "bytes_written": written,
               "counted_by": "cukern.rotary.positions_bytes_moved(tokens, num_heads, num_kv_heads, rotary_dim, dtype)",
               "access_bytes": vec * dt.itemsize,
               "coalesced": "yes: the lanes of a warp take consecutive units of a head, then the next head",
               "re_read": ["the frequencies (rot / 2 float64 pairs) by every block, from L1",
                           "the block's cos/sin table from shared memory by every head group"]}
    accumulation = {"reduces": "nothing: each output is two float32 products and one add",
                    "precision": ("cos and sin in float64 (exact argument reduction below 2^24, Taylor series), "
                                  "rounded to float32; the rotation in float32, rounded once to " + dtype_name(dt)),
                    "combine": "none", "passes": "one"}
    inst = rotary.positions_instantiation(dt, vec, neox, p.items)
    return card.Described(
        launches=[card.Launch(inst, p.grid, p.block, "cos/sin table, then rotation", shared)], tile=tile,
        traffic=traffic, accumulation=accumulation, knobs=dataclasses.asdict(rotary.DEFAULT_KNOBS), bytes=nbytes,
        bytes_written=written, flops=3 * elems + tokens * (rot // 2) * 60,
        measure=lambda: _positions_measure(shape, dtype_name(dt), nkv))


def _positions_measure(shape, dtype: str, kv_heads: int):
    s = _positions_setup(Case("rotary_embedding_positions", shape, dtype, (("kv_heads", kv_heads),)))
    return lambda: _positions_run(s)


card.register(card.CardSpec("rotary_embedding_positions", (16384, 32, 128), "bfloat16", _positions_describe,
                            {"kv_heads": 8, "neox": 1, "rotary_dim": None}, "rotary", ndim=3))
