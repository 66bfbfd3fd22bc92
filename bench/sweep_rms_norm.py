"""Sweep the RMSNorm tuning space (``cukern.rmsnorm.Knobs``) on the GPU and print µs and % of the copy
peak per shape and knob setting; the evidence behind ``DEFAULT_KNOBS`` (see docs/design/rms_norm.md)."""

import itertools
import time

import numpy as np

import cupy
from cukern import rmsnorm, timing
from cukern._compile import get_kernel
from cukern._dtypes import BFLOAT16

SHAPES = [((16384, 4096), BFLOAT16), ((16384, 8192), BFLOAT16), ((4096, 4096), BFLOAT16), ((256, 4096), BFLOAT16),
          ((16384 * 32, 128), BFLOAT16), ((16384, 4096), np.dtype(np.float32)), ((1024, 32768), BFLOAT16)]


def host_overhead(n=2000):
    x = cupy.ones((1, 4096), dtype=BFLOAT16)
    w = cupy.ones(4096, dtype=BFLOAT16)
    out = cupy.empty_like(x)
    for _ in range(100):
        rmsnorm.rms_norm(x, w, out=out)
    cupy.cuda.get_current_stream().synchronize()
    times = []
    for _ in range(n):
        t = time.perf_counter()
        rmsnorm.rms_norm(x, w, out=out)
        times.append(time.perf_counter() - t)
    cupy.cuda.get_current_stream().synchronize()
    return 1e6 * float(np.median(times))


def main():
    peak = timing.peak_bandwidth()
    print(f"copy peak {peak:.0f} GB/s; host overhead rms_norm [1, 4096] bf16: {host_overhead():.1f} µs")
    rng = cupy.random.default_rng()
    for fused in (False, True):
        for shape, dt in SHAPES:
            x = rng.standard_normal(shape, dtype=np.float32).astype(dt)
            r = rng.standard_normal(shape, dtype=np.float32).astype(dt) if fused else None
            w = rng.standard_normal(shape[-1], dtype=np.float32).astype(dt)
            out = cupy.empty_like(x)
            nbytes = rmsnorm.bytes_moved(shape, dt, dt, fused=fused)
            vec = 16 // dt.itemsize
            blocks = (64, 128) if shape[-1] <= 256 else (128,)
            for items, block, waves in itertools.product((1, 2, 4), blocks, (None, 2, 4, 8)):
                knobs = rmsnorm.Knobs(items, block, waves)
                p = rmsnorm.plan(shape[-1], shape[0], vec, dt.itemsize, 132, knobs, fused=fused)
                t = timing.benchmark(rmsnorm._run, fused, x, r, w, 1e-6, 0.0, out, knobs, bytes_moved=nbytes)
                k = get_kernel(p.instantiation(dt, dt, fused))
                print(f"{'fused' if fused else 'plain':5} {str(shape):15} {dt.name:8} items={items} block={block:<3} "
                      f"waves={waves!s:4} {p.kernel:4} tpr={p.tpr:<4} it={p.items:<2} grid={p.grid:<6} "
                      f"regs={k.attributes['num_regs']:<3} {t.median_us:9.2f} µs  {100 * t.gbps / peak:6.1f} %",
                      flush=True)
            if not fused:
                timing.l2_flush().clean = False
                t = timing.benchmark(rmsnorm._run, fused, x, r, w, 1e-6, 0.0, out, rmsnorm.DEFAULT_KNOBS,
                                     bytes_moved=nbytes)
                timing.l2_flush().clean = True
                print(f"dirty-L2 flush {str(shape):15} {dt.name:8} defaults {t.median_us:9.2f} µs  "
                      f"{100 * t.gbps / peak:6.1f} %")
            del x, r, w, out
            cupy.get_default_memory_pool().free_all_blocks()


if __name__ == "__main__":
    main()
