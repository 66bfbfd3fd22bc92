"""Many host threads and a long mixed soak.

* Eight threads, each on its own non-blocking stream, call every public op at the same moment, on shapes
  and dtypes no other test uses, so their first calls compile and plan concurrently; every result must be
  bit-identical to the same calls made afterwards from one thread.
* 100,000 mixed calls on small shapes: the memory pool's bytes in use are the same after the soak as after
  a warm-up round (nothing is kept per call).
"""

from __future__ import annotations

import gc
import threading
import time

import numpy as np
import pytest

import cukern
from cukern._dtypes import BFLOAT16

F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
I32, I64 = np.dtype(np.int32), np.dtype(np.int64)

THREADS = 8
ROUNDS = 3
JOIN_S = 600


def _inputs(rng) -> dict:
    """Host inputs of the threaded workload (uncommon sizes and dtype pairs, so the kernels and plans they
    need are first made inside the threads)."""
    def normal(shape, dtype):
        return rng.standard_normal(shape).astype(dtype)

    return {
        "x16": normal((9, 1531), F16), "w32": normal(1531, F32),
        "xb": normal((5, 2050), BFLOAT16), "rb": normal((5, 2050), BFLOAT16),
        "q": normal((11, 6, 80), F16), "k": normal((11, 2, 80), F16),
        "pos": rng.integers(0, 61, 11).astype(I32),
        "i32": rng.integers(-100, 101, (37, 1029)).astype(I32),
        "h": normal((13, 4999), F16),
        "i64": rng.integers(-100, 101, 100003).astype(I64),
        "b16": normal((7, 3, 257), BFLOAT16),
        "f64": normal((301, 17), F64),
        "f32": normal(70001, F32),
        "bool": rng.random(1000) < 0.3,
    }


def _workload(a: dict) -> list:
    """Every public op once on the device arrays ``a`` (which it updates in place where the ops do): the
    results and the in-place arrays, in a fixed order."""
    cache = cukern.rope_cache(61, 48, 500000.0, scaling={"type": "linear", "factor": 2.0}, dtype=F16)
    out = [
        cukern.rms_norm(a["x16"], a["w32"], 1e-5, offset=1.0),
        cukern.fused_add_rms_norm(a["xb"], a["rb"], out=a["xb"]),
        cache,
        cukern.sum(a["i32"], axis=0),
        cukern.mean(a["h"], axis=1),
        cukern.sum_of_squares(a["i64"]),
        cukern.norm(a["b16"], axis=(0, 2)),
        cukern.amax(a["f64"], axis=0),
        cukern.amin(a["f32"][::-1]),
        cukern.sum(a["bool"]),
        cukern.mean(a["f64"][::3], axis=-1, keepdims=True, dtype=F32),
    ]
    cukern.rotary_embedding(a["pos"], a["q"], a["k"], cache, is_neox=False, rotary_dim=48)
    return out + [a["xb"], a["rb"], a["q"], a["k"]]


def _on_device(host: dict) -> dict:
    import cupy

    return {n: cupy.asarray(v) for n, v in host.items()}


def _rounds(stream, host: dict) -> list:
    """ROUNDS workloads on ``stream`` from a fresh copy of ``host``: every round's results as host bytes."""
    import cupy

    got = []
    with stream:
        a = _on_device(host)
        for _ in range(ROUNDS):
            results = _workload(a)
            stream.synchronize()
            got.append([cupy.asnumpy(r).tobytes() for r in results])
    return got


@pytest.mark.gpu
def test_threads_on_their_own_streams_match_one_thread():
    import cupy

    host = _inputs(np.random.default_rng(12))
    start = threading.Barrier(THREADS)
    results: list = [None] * THREADS
    errors: list = []

    def worker(i):
        try:
            stream = cupy.cuda.Stream(non_blocking=True)
            start.wait()
            results[i] = _rounds(stream, host)
        except BaseException as err:  # re-raised on the main thread
            errors.append(err)
            start.abort()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(JOIN_S)
    assert not any(t.is_alive() for t in threads), f"threads still running after {JOIN_S} s"
    if errors:
        raise errors[0]
    want = _rounds(cupy.cuda.Stream.null, host)
    for i, got in enumerate(results):
        for r, (g, w) in enumerate(zip(got, want)):
            differ = [k for k, (gb, wb) in enumerate(zip(g, w)) if gb != wb]
            assert not differ, f"thread {i}, round {r}: results {differ} differ from the one-thread run"
    cupy.cuda.Device().synchronize()


def _soak_calls(rng) -> list:
    """Small calls of every op, some writing in place, some allocating their result (dropped at once)."""
    import cupy

    def dev(shape, dtype):
        return cupy.asarray(rng.standard_normal(shape).astype(dtype))

    x, w = dev((4, 512), BFLOAT16), dev(512, BFLOAT16)
    xo, r = dev((3, 100), F32), dev((3, 100), F32)
    q, k = dev((2, 4, 64), BFLOAT16), dev((2, 1, 64), BFLOAT16)
    cache = cukern.rope_cache(32, 64)
    pos = cupy.asarray(np.array([3, 17], I64))
    m = dev((33, 65), F32)
    v = dev(4097, F16)
    i = cupy.asarray(rng.integers(-9, 10, (6, 7)).astype(I32))
    out = cupy.empty(33, F32)
    return [
        lambda: cukern.rms_norm(x, w),
        lambda: cukern.rms_norm(x, w, out=x),
        lambda: cukern.fused_add_rms_norm(xo, r, offset=1.0),
        lambda: cukern.fused_add_rms_norm(xo, r, out=xo),
        lambda: cukern.rotary_embedding(pos, q, k, cache, check_positions=False),
        lambda: cukern.rotary_embedding(pos, q, None, cache, is_neox=False, rotary_dim=32),
        lambda: cukern.rotary_embedding(pos, q, k, cache, inverse=True),
        lambda: cukern.sum(m),
        lambda: cukern.sum(m, axis=1, out=out),
        lambda: cukern.mean(m, axis=0),
        lambda: cukern.sum_of_squares(v),
        lambda: cukern.norm(v, dtype=F32),
        lambda: cukern.amax(m, axis=-1, keepdims=True),
        lambda: cukern.amin(i, axis=(0, 1)),
        lambda: cukern.sum(i, axis=0),
        lambda: cukern.mean(m[::2, 1:], axis=1),
    ]


@pytest.mark.gpu
def test_soak_keeps_memory_flat():
    import cupy

    calls = _soak_calls(np.random.default_rng(7))
    pool = cupy.get_default_memory_pool()
    for call in calls:  # warm-up: compile, plan, allocate per-stream workspaces
        call()
    cupy.cuda.Device().synchronize()
    gc.collect()
    used = pool.used_bytes()
    start = time.perf_counter()
    for n in range(100_000):
        calls[n % len(calls)]()
    cupy.cuda.Device().synchronize()
    elapsed = time.perf_counter() - start
    gc.collect()
    print(f"100,000 calls in {elapsed:.1f} s")
    assert pool.used_bytes() == used, f"{pool.used_bytes() - used} bytes more in use after the soak"


@pytest.mark.gpu
def test_a_threads_first_cuda_call_may_be_a_cached_launch():
    """A thread that has made no CUDA call yet (a Dask worker's) has no current context: the prepared launches
    of cached reductions and look-back scans make it current before launching."""
    import cupy

    x = cupy.arange(100003, dtype=F32)
    want = [cukern.sum(x).get(), cukern.cumsum(x).get()]
    cupy.get_default_memory_pool().free_all_blocks()
    cupy.zeros(200000, F32)  # a freed block the thread's results take without a runtime call
    got, errors = [], []

    def first_calls():
        try:
            got.extend(r.get() for r in (cukern.sum(x), cukern.cumsum(x)))
        except Exception as e:  # noqa: BLE001 - reported below, in the test's thread
            errors.append(repr(e))

    t = threading.Thread(target=first_calls)
    t.start()
    t.join(JOIN_S)
    assert not errors, errors
    assert all(np.array_equal(g, w) for g, w in zip(got, want)) and len(got) == 2


_PER_THREAD_SCRIPT = r"""
import threading, numpy as np, cupy, cukern
assert cupy.cuda.get_current_stream().ptr == 2  # the per-thread default stream's one handle
rng = np.random.default_rng(5)
xs = [cupy.asarray(rng.standard_normal(1 << 22).astype(np.float32)) for _ in range(8)]
ops = (lambda x: cukern.sum(x), lambda x: cukern.cumsum(x), lambda x: cukern.argmax(x), lambda x: cukern.var(x))
want = [[op(x).get().tobytes() for op in ops] for x in xs]
bad = []
def work(i):
    for _ in range(20):
        got = [op(xs[i]) for op in ops]
        cupy.cuda.get_current_stream().synchronize()
        if [g.get().tobytes() for g in got] != want[i]:
            bad.append(i)
threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
[t.start() for t in threads]
[t.join() for t in threads]
print("BAD", sorted(set(bad)))
"""


@pytest.mark.gpu
def test_threads_on_the_per_thread_default_stream_keep_their_workspaces_apart():
    """With CUPY_CUDA_PER_THREAD_DEFAULT_STREAM=1 every thread's current stream has one handle, though the
    streams run at once: the reductions' and scans' workspaces are kept per thread there."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "CUPY_CUDA_PER_THREAD_DEFAULT_STREAM": "1"}
    done = subprocess.run([sys.executable, "-c", _PER_THREAD_SCRIPT], env=env, capture_output=True, text=True,
                          timeout=JOIN_S)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().endswith("BAD []"), done.stdout[-2000:]


@pytest.mark.gpu
def test_nanargmax_on_one_stream_from_many_threads_reads_its_own_all_nan_flag():
    """Threads sharing the legacy null stream: one's all-NaN slice raises in that thread only."""
    import cupy

    nan = cupy.full(1000, cupy.nan, F32)
    ok = cupy.arange(1000, dtype=F32)
    raised, wrong = [0] * THREADS, [0] * THREADS  # each thread its own counters
    start = threading.Barrier(THREADS)

    def worker(i):
        start.wait()
        for _ in range(50):
            try:
                got = cukern.nanargmax(nan if i % 2 else ok)
                wrong[i] += bool(i % 2) or int(got) != 999
            except ValueError:
                raised[i] += 1
                wrong[i] += not i % 2

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(JOIN_S)
    assert sum(raised) == THREADS // 2 * 50 and sum(wrong) == 0, (raised, wrong)


@pytest.mark.gpu
def test_threads_on_one_stream_keep_their_launch_sequences_whole():
    """Threads on the legacy null stream share its workspace: a two-pass column sum and a scan's column
    tiles hand data between their launches through it, so each call enqueues its launches together."""
    import cupy

    rng = np.random.default_rng(21)
    xs = [cupy.asarray(rng.standard_normal((65536, 16)).astype(F32)) for _ in range(THREADS)]
    cs = [cupy.asarray(rng.standard_normal((4096, 64)).astype(F32)) for _ in range(THREADS)]
    want = [(cukern.sum(x, axis=0).get(), cukern.cumsum(c, axis=0).get()) for x, c in zip(xs, cs)]
    bad = [0] * THREADS
    start = threading.Barrier(THREADS)

    def worker(i):
        start.wait()
        for _ in range(40):
            s, c = cukern.sum(xs[i], axis=0), cukern.cumsum(cs[i], axis=0)
            bad[i] += not (np.array_equal(s.get(), want[i][0]) and np.array_equal(c.get(), want[i][1]))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(JOIN_S)
    assert bad == [0] * THREADS
