"""cukern inside a pipeline: host time per call, and CUDA-graph capture and replay.

``host_overhead`` is the Python-side cost of one call (validation, planning, launch), measured on the host
with ``perf_counter``; the GPU is never waited on inside a timed call. ``capture`` records calls into a
CUDA graph on a stream of their own, after eager warm-up calls on that same stream (first compiles, plan
caches and per-stream workspaces), so the captured calls neither compile, nor allocate workspaces, nor
synchronize; arrays they return are kept with the graph, which writes into them on every replay.
``graph_replay_time`` times replays of such a graph with :func:`cukern.timing.benchmark`'s CUDA events: the
time a decode step sees once its launches are in a graph.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass, replace

import numpy as np

from . import timing


def host_overhead_rounds(fn, *args, n: int = 2000, rounds: int = 5, warmup: int = 100, sync_every: int = 256,
                         sync=None, **kwargs) -> list:
    """Median host microseconds of one ``fn(*args, **kwargs)`` over ``n`` individually timed calls, for
    each of ``rounds`` rounds.

    ``warmup`` untimed calls first (compilation, caches). The queued GPU work is drained every
    ``sync_every`` calls, outside the timed calls, so a full launch queue never blocks one; ``sync`` drains
    it (default: the current CuPy stream's ``synchronize``). The garbage collector is paused while timing.
    """
    if n < 1 or rounds < 1:
        raise ValueError("n and rounds must be at least 1")
    if sync is None:
        import cupy

        sync = cupy.cuda.get_current_stream().synchronize
    for _ in range(warmup):
        fn(*args, **kwargs)
    sync()
    times = np.empty(n)
    clock = time.perf_counter
    medians = []
    enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(rounds):
            for i in range(n):
                t0 = clock()
                fn(*args, **kwargs)
                times[i] = clock() - t0
                if (i + 1) % sync_every == 0:
                    sync()
            sync()
            medians.append(float(np.median(times) * 1e6))
    finally:
        if enabled:
            gc.enable()
    return medians


def host_overhead(fn, *args, **kwargs) -> float:
    """The lowest of :func:`host_overhead_rounds`' medians (same arguments). The rounds of one process
    differ by up to a few microseconds on the lent machine's host (other work on its cores, not the call
    under test), so, as ``timeit`` advises for its repeats, the quietest round is the call's cost."""
    return min(host_overhead_rounds(fn, *args, **kwargs))


@dataclass
class Captured:
    """A CUDA graph of captured calls. ``results`` holds what the captured calls returned (arrays allocated
    during the capture): each replay writes into them again, so they live as long as the graph does."""

    graph: object
    stream: object
    results: list

    def replay(self) -> None:
        """Launch the graph on its stream (no synchronization)."""
        self.graph.launch(self.stream)


def capture(fn, *args, calls: int = 1, warmup: int = 2, stream=None, **kwargs) -> Captured:
    """Capture ``calls`` back-to-back calls of ``fn(*args, **kwargs)`` into a CUDA graph.

    Runs on ``stream`` (default: a new non-blocking stream): ``warmup`` eager calls, a synchronization, then
    the capture, so compilation, plan caches and per-stream workspaces are settled before it. The calls must
    not synchronize the host (``rotary_embedding`` needs ``check_positions=False``).
    """
    import cupy

    if stream is None:
        stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        for _ in range(warmup):
            fn(*args, **kwargs)
        stream.synchronize()
        stream.begin_capture()
        try:
            results = [fn(*args, **kwargs) for _ in range(calls)]
        except BaseException:
            try:
                stream.end_capture()
            except Exception:  # the capture is already invalid; the first error is the one to report
                pass
            raise
        graph = stream.end_capture()
        graph.upload(stream)
    return Captured(graph, stream, results)


def graph_replay_time(fn, *args, calls: int = 1, warmup: int = 10, repeat: int = 100, flush_l2: bool = True,
                      bytes_moved=None, **kwargs) -> timing.Timing:
    """Per-call GPU time of ``fn(*args, **kwargs)`` replayed from a CUDA graph of ``calls`` calls.

    Captured by :func:`capture`, then timed like :func:`cukern.timing.benchmark` (``warmup`` untimed
    replays, ``repeat`` timed ones, L2 flushed before each with ``flush_l2``); every figure is divided by
    ``calls``. ``bytes_moved`` is one call's.
    """
    if calls < 1:
        raise ValueError("calls must be at least 1")
    captured = capture(fn, *args, calls=calls, **kwargs)
    with captured.stream:
        t = timing.benchmark(captured.graph.launch, warmup=warmup, repeat=repeat, flush_l2=flush_l2)
    captured.stream.synchronize()
    return per_call(t, calls, bytes_moved)


def per_call(t: timing.Timing, calls: int, bytes_moved=None) -> timing.Timing:
    """``t`` (the time of ``calls`` calls) as the time of one call moving ``bytes_moved`` bytes."""
    return replace(t, median_us=t.median_us / calls, min_us=t.min_us / calls, max_us=t.max_us / calls,
                   p20_us=t.p20_us / calls, p80_us=t.p80_us / calls,
                   bytes_moved=None if bytes_moved is None else int(bytes_moved))


DECODE_TOKENS = (1, 8, 64)
HIDDEN, HEADS, KV_HEADS, HEAD_DIM = 4096, 32, 8, 128


def _decode_inputs(tokens: int):
    import cupy

    from ._dtypes import BFLOAT16
    from .rotary import rope_cache

    rng = cupy.random.default_rng(0)

    def bf16(*shape):
        return rng.standard_normal(shape, dtype=np.float32).astype(BFLOAT16)

    return {"x": bf16(tokens, HIDDEN), "r": bf16(tokens, HIDDEN), "w": bf16(HIDDEN), "out": bf16(tokens, HIDDEN),
            "q": bf16(tokens, HEADS, HEAD_DIM), "k": bf16(tokens, KV_HEADS, HEAD_DIM),
            "pos": rng.integers(0, 8192, tokens, dtype=np.int64), "cache": rope_cache(8192, HEAD_DIM)}


def records(peak: float, *, repeat: int = 100, warmup: int = 10, n: int = 2000) -> list:
    """The benchmark's pipeline records: host overhead per call (``op`` ``host_overhead`` for ``rms_norm``
    on ``[1, 4096]``, ``host_overhead_rotary`` for one token of 32 + 8 heads of 128, bfloat16; the rotation
    with ``check_positions=False``, the form a decode loop uses; ``median_us`` the lowest of five rounds'
    medians, see :func:`host_overhead`), then for 1, 8 and 64 tokens the
    graph-replayed time of ``rms_norm`` (into a preallocated ``out``), ``fused_add_rms_norm`` and
    ``rotary_embedding`` (``impl`` ``cukern-graph``), each captured 8 calls to a graph. ``peak``: the copy
    bandwidth in GB/s the percentages are of."""
    from .rmsnorm import bytes_moved as rms_bytes
    from .rmsnorm import fused_add_rms_norm, rms_norm
    from .rotary import bytes_moved as rope_bytes
    from .rotary import rotary_embedding

    one = _decode_inputs(1)
    out = [
        {"op": "host_overhead", "impl": "cukern", "shape": [1, HIDDEN], "dtype": "bfloat16",
         "median_us": round(host_overhead(rms_norm, one["x"], one["w"], n=n), 3)},
        {"op": "host_overhead_rotary", "impl": "cukern", "shape": [1, HEADS, HEAD_DIM], "dtype": "bfloat16",
         "median_us": round(host_overhead(rotary_embedding, one["pos"], one["q"], one["k"], one["cache"], n=n,
                                          check_positions=False), 3)},
    ]
    for tokens in DECODE_TOKENS:
        a = _decode_inputs(tokens)
        cases = [
            ("rms_norm", [tokens, HIDDEN], rms_bytes((tokens, HIDDEN), "bfloat16", "bfloat16"),
             rms_norm, (a["x"], a["w"]), {"out": a["out"]}),
            ("fused_add_rms_norm", [tokens, HIDDEN], rms_bytes((tokens, HIDDEN), "bfloat16", "bfloat16", fused=True),
             fused_add_rms_norm, (a["x"], a["r"], a["w"]), {"out": a["out"]}),
            ("rotary_embedding", [tokens, HEADS, HEAD_DIM], rope_bytes(tokens, HEADS, KV_HEADS, HEAD_DIM, "bfloat16"),
             rotary_embedding, (a["pos"], a["q"], a["k"], a["cache"]), {"check_positions": False}),
        ]
        for op, shape, nbytes, fn, args, kwargs in cases:
            t = graph_replay_time(fn, *args, calls=8, warmup=warmup, repeat=repeat, bytes_moved=nbytes, **kwargs)
            out.append({"op": op, "impl": "cukern-graph", "shape": shape, "dtype": "bfloat16",
                        "median_us": round(t.median_us, 3), "gbps": round(t.gbps, 1),
                        "pct_of_peak": round(100 * t.gbps / peak, 1)})
    return out
