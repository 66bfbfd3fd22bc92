"""cukern inside a pipeline: host time per call, and CUDA-graph capture and replay.

``host_overhead`` is the Python-side cost of one call (validation, planning, launch), measured on the host
with ``perf_counter``; the GPU is never waited on inside a timed call. ``capture`` records calls into a
CUDA graph on a stream of their own, after eager warm-up calls on that same stream (first compiles, plan
caches and per-stream workspaces), so the captured calls neither compile, nor allocate workspaces, nor
synchronize; arrays they return are kept with the graph, which writes into them on every replay.
``graph_replay_time`` times replays of such a graph with :func:`cukern.timing.benchmark`'s CUDA events: the
time a decode step sees once its launches are in a graph.

The benchmark's pipeline records come from what the families register: the host cost of one call of some
ops and peers (:func:`register_host`), then each call of a decode step (:func:`register`) graph-replayed at 1,
8 and 64 tokens.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass, replace
from typing import Any, Callable

import numpy as np

from .. import timing


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

    graph: Any  # cupy.cuda.Graph
    stream: Any  # cupy.cuda.Stream
    results: list

    def replay(self) -> None:
        """Launch the graph on its stream (no synchronization)."""
        self.graph.launch(self.stream)


def capture(fn, *args, calls: int = 1, warmup: int = 2, stream=None, **kwargs) -> Captured:
    """Capture ``calls`` back-to-back calls of ``fn(*args, **kwargs)`` into a CUDA graph.

    Runs on ``stream`` (default: a new non-blocking stream): ``warmup`` eager calls, a synchronization, then
    the capture, so compilation, plan caches and per-stream workspaces are settled before it. The calls must
    not synchronize the host (``rotary_embedding`` needs ``check_positions=False``: it raises RuntimeError
    otherwise, before anything is recorded).
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


@dataclass(frozen=True)
class DecodeCall:
    """One bfloat16 call of a decode step. ``make(tokens)`` -> ``(fn, args, kwargs)`` on fresh inputs, as a
    graph captures it; ``shape(tokens)``: the record's shape; ``bytes(tokens)``: what one call moves."""

    op: str
    shape: Callable
    bytes: Callable
    make: Callable


@dataclass(frozen=True)
class HostCall:
    """One record of the host cost of a call: ``op`` names the record (``host_overhead...``), ``impl`` who is
    called (``cukern`` or a peer), ``shape`` and ``dtype`` are the record's. ``make()`` -> ``(fn, args,
    kwargs)`` on fresh inputs, or None where ``impl`` cannot run (a peer's framework is not installed): no
    record then."""

    op: str
    impl: str
    shape: tuple
    make: Callable
    dtype: str = "bfloat16"


CALLS: list = []
HOST_CALLS: list = []


def register(call: DecodeCall) -> None:
    CALLS.append(call)


def register_host(call: HostCall) -> None:
    HOST_CALLS.append(call)


def register_host_pair(op: str, shape: tuple, dtype: str, inputs: Callable, ours: Callable, cupy_fn: Callable) -> None:
    """The host cost of ``ours(x)`` (impl ``cukern``) and of the CuPy call a user would make in its place,
    ``cupy_fn(x)`` (impl ``cupy``), each on its own ``x = inputs(shape, dtype)``."""
    for impl, fn in (("cukern", ours), ("cupy", cupy_fn)):
        register_host(HostCall(op, impl, shape, lambda fn=fn: (fn, (inputs(shape, dtype),), {}), dtype))


def records(peak: float, *, repeat: int = 100, warmup: int = 10, n: int = 2000, peers=()) -> list:
    """The benchmark's pipeline records: each registered host call's cost in its order, then each of ``peers``
    (:class:`HostCall` s of other frameworks, from ``bench/peers.py``) (``median_us`` the lowest of five
    rounds' medians, see :func:`host_overhead`; none for a peer that cannot run here); then for 1, 8 and 64
    tokens each decode call's graph-replayed time (``impl`` ``cukern-graph``, 8 calls captured to a graph).
    ``peak``: the copy bandwidth in GB/s the percentages are of."""
    out = []
    for c in [*HOST_CALLS, *peers]:
        made = c.make()
        if made is None:
            continue
        fn, args, kwargs = made
        out.append({"op": c.op, "impl": c.impl, "shape": list(c.shape), "dtype": c.dtype,
                    "median_us": round(host_overhead(fn, *args, n=n, **kwargs), 3)})
    for tokens in DECODE_TOKENS:
        for c in CALLS:
            fn, args, kwargs = c.make(tokens)
            t = graph_replay_time(fn, *args, calls=8, warmup=warmup, repeat=repeat, bytes_moved=c.bytes(tokens),
                                  **kwargs)
            gbps = t.gbps
            assert gbps is not None  # bytes_moved was given
            out.append({"op": c.op, "impl": "cukern-graph", "shape": list(c.shape(tokens)), "dtype": "bfloat16",
                        "median_us": round(t.median_us, 3), "gbps": round(gbps, 1),
                        "pct_of_peak": round(100 * gbps / peak, 1)})
    return out
