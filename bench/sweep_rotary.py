"""Sweep the rotary-embedding tuning space (``cukern.rotary.Knobs``) on the GPU.

Run from the repository root: ``PYTHONPATH=. python3 bench/sweep_rotary.py`` (well under a minute on an H200).
Prints, per shape and knob setting, the launch (block, grid, registers), the median µs and the % of the
copy peak (bytes from ``rotary.bytes_moved``), after checking every knob setting against the float64
reference on a case whose grid is small enough that blocks loop over tokens. Then the host overhead of one
decode call (wall time around the Python call).
"""

import itertools
import time

import numpy as np

import cupy
from cukern import reference, rotary, timing
from cukern.lab import rotary as lab_rotary
from cukern._compile import get_kernel
from cukern._dtypes import BFLOAT16
from cukern.rope_cache import rope_cache_host

NH, NKV, HD, MAX_POS = 32, 8, 128, 8192

# (label, tokens, is_neox, qkv_view)
LARGE = [("neox  T=16384", 16384, True, False), ("gptj  T=16384", 16384, False, False),
         ("neox  T=4096 ", 4096, True, False), ("qkv   T=16384", 16384, True, True)]
DECODE = [("neox  T=1    ", 1, True, False), ("neox  T=8    ", 8, True, False), ("neox  T=64   ", 64, True, False)]

# items with the register cap that keeps each spill-free (items 4 needs ~110 registers: min_blocks 1)
ITEMS = [(1, 2), (2, 2), (2, 1), (4, 1)]
BLOCKS = [128, 256, 512]
WAVES = [None, 2, 4, 8]
LARGE_KNOBS = [rotary.Knobs(i, b, w, m) for (i, m), b, w in itertools.product(ITEMS, BLOCKS, WAVES)]
QKV_KNOBS = [rotary.Knobs(), rotary.Knobs(4, 256, None, 1), rotary.Knobs(2, 256, 4, 2)]
DECODE_KNOBS = [rotary.Knobs(i, b, None, m) for (i, m), b in itertools.product([(1, 2), (2, 2)], [128, 256, 512])]


def make_case(tokens, qkv_view):
    """The benchmark's own inputs (:func:`cukern.lab.rotary.inputs`): q, k, cache, positions."""
    s = lab_rotary.inputs(tokens, NH, NKV, HD, BFLOAT16, qkv_view)
    return s["q"], s["k"], s["cache"], s["pos"]


def call(pos, q, k, cache, is_neox, knobs):
    rotary._run(pos, q, k, cache, is_neox, None, False, False, knobs)


def describe(tokens, is_neox, knobs):
    vec = 16 // BFLOAT16.itemsize
    p = rotary.plan(tokens, NH, NKV, HD, vec, is_neox, cupy.cuda.Device().attributes["MultiProcessorCount"], knobs)
    regs = get_kernel(p.instantiation(BFLOAT16, np.float32)).attributes["num_regs"]
    return p, regs


def check(knobs_list):
    """Each knob setting, both styles, against the float64 reference: 20000 tokens of 4 + 2 heads (with
    waves = 1 the blocks loop over tokens), some positions out of range (those tokens must stay as they
    are); a sample of 256 tokens compared."""
    host = np.random.default_rng(0)
    tokens, nh, nkv = 20000, 4, 2
    q0 = host.standard_normal((tokens, nh, HD)).astype(np.float32).astype(BFLOAT16)
    k0 = host.standard_normal((tokens, nkv, HD)).astype(np.float32).astype(BFLOAT16)
    pos = host.integers(0, MAX_POS, tokens)
    pos[host.choice(tokens, 50, replace=False)] = -1
    pos[host.choice(tokens, 50, replace=False)] = MAX_POS + 3
    cache_h = rope_cache_host(MAX_POS, HD).astype(np.float32)
    rows = np.unique(np.concatenate([host.choice(tokens, 256, replace=False), np.nonzero(pos < 0)[0][:8],
                                     np.nonzero(pos >= MAX_POS)[0][:8], [0, tokens - 1]]))
    cache = cupy.asarray(cache_h)
    dpos = cupy.asarray(pos)
    all_ok = True
    for knobs in knobs_list + [rotary.Knobs(2, 256, 1, 2), rotary.Knobs(4, 512, 1, 1)]:
        status = []
        for is_neox in (True, False):
            q, k = cupy.asarray(q0), cupy.asarray(k0)
            call(dpos, q, k, cache, is_neox, knobs)
            want_q, want_k = reference.rotary_embedding(pos[rows], q0[rows], k0[rows], cache_h, is_neox=is_neox)
            got_q, got_k = q.get()[rows].astype(np.float64), k.get()[rows].astype(np.float64)
            ok = all(np.all(np.abs(g - w) <= 1e-5 + 2.0**-7 * np.abs(w)) for g, w in ((got_q, want_q), (got_k, want_k)))
            all_ok &= bool(ok)
            status.append(f"{'neox' if is_neox else 'gptj'} {'OK' if ok else 'FAIL'}")
        print(f"check items={knobs.items} block={knobs.target_block:<3} waves={knobs.waves!s:4} "
              f"min_blocks={knobs.min_blocks}: {', '.join(status)}", flush=True)
    print(f"correctness, all settings: {'OK' if all_ok else 'FAIL'}", flush=True)


def sweep(cases, knobs_list, peak):
    for label, tokens, is_neox, qkv_view in cases:
        q, k, cache, pos = make_case(tokens, qkv_view)
        nbytes = rotary.bytes_moved(tokens, NH, NKV, HD, BFLOAT16)
        for knobs in knobs_list:
            p, regs = describe(tokens, is_neox, knobs)
            t = timing.benchmark(call, pos, q, k, cache, is_neox, knobs, bytes_moved=nbytes)
            print(f"{label} items={knobs.items} block={knobs.target_block:<3} waves={knobs.waves!s:4} "
                  f"min_blocks={knobs.min_blocks} | block={p.block:<3} grid={p.grid:<6} regs={regs:<3} "
                  f"{t.median_us:8.2f} µs {100 * t.gbps / peak:6.1f} %", flush=True)
        del q, k, cache, pos
        cupy.get_default_memory_pool().free_all_blocks()


def host_overhead(n=1000):
    q, k, cache, pos = make_case(1, False)
    for _ in range(20):
        rotary.rotary_embedding(pos, q, k, cache, check_positions=False)
    stream = cupy.cuda.get_current_stream()
    wall = np.empty(n)
    for i in range(n):
        stream.synchronize()
        t0 = time.perf_counter()
        rotary.rotary_embedding(pos, q, k, cache, check_positions=False)
        wall[i] = time.perf_counter() - t0
    stream.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        rotary._prepare(pos, q, k, cache, True, None, False)
    prep = (time.perf_counter() - t0) / n
    print(f"host overhead, 1 token: rotary_embedding median {np.median(wall) * 1e6:.2f} µs "
          f"(p10 {np.percentile(wall, 10) * 1e6:.2f}, p90 {np.percentile(wall, 90) * 1e6:.2f}); "
          f"of which _prepare (key + lookup) {prep * 1e6:.2f} µs", flush=True)


def main():
    start = time.perf_counter()
    peak = timing.peak_bandwidth()
    print(f"copy peak {peak:.0f} GB/s; defaults {rotary.DEFAULT_KNOBS}", flush=True)
    check(sorted(set(LARGE_KNOBS) | set(QKV_KNOBS) | set(DECODE_KNOBS), key=str))
    sweep(LARGE[:3], LARGE_KNOBS, peak)
    sweep(LARGE[3:], QKV_KNOBS, peak)
    sweep(DECODE, DECODE_KNOBS, peak)
    host_overhead()
    print(f"done in {time.perf_counter() - start:.1f} s", flush=True)


if __name__ == "__main__":
    main()
