"""Sweep the RMSNorm tuning space (``cukern.rmsnorm.Knobs``) on the GPU and print µs and % of the copy
peak per shape and knob setting; the evidence behind ``DEFAULT_KNOBS`` (see bench/NOTES.md)."""

import itertools

import numpy as np

import cupy
from cukern import rmsnorm, timing
from cukern._dtypes import BFLOAT16
from cukern._compile import get_kernel

SHAPES = [(16384, 4096), (16384, 8192), (4096, 4096), (256, 4096), (16384 * 32, 128)]


def main():
    peak = timing.peak_bandwidth()
    print(f"copy peak {peak:.0f} GB/s")
    rng = cupy.random.default_rng()
    for fused in (False, True):
        for shape in SHAPES:
            x = rng.standard_normal(shape, dtype=np.float32).astype(BFLOAT16)
            r = rng.standard_normal(shape, dtype=np.float32).astype(BFLOAT16) if fused else None
            w = rng.standard_normal(shape[-1], dtype=np.float32).astype(BFLOAT16)
            out = cupy.empty_like(x)
            nbytes = rmsnorm.bytes_moved(shape, BFLOAT16, BFLOAT16, fused=fused)
            blocks = (64, 128) if shape[-1] <= 256 else (128,)
            for items, block, waves in itertools.product((2, 4), blocks, (None, 4, 8)):
                knobs = rmsnorm.Knobs(items, block, waves)
                p = rmsnorm.plan(shape[-1], shape[0], 8, 2, 132, knobs, fused=fused)
                t = timing.benchmark(rmsnorm._run, fused, x, r, w, 1e-6, 0.0, out, knobs, bytes_moved=nbytes)
                k = get_kernel(p.instantiation(BFLOAT16, BFLOAT16, fused))
                print(f"{'fused' if fused else 'plain':5} {str(shape):15} items={items} block={block:<3} "
                      f"waves={waves!s:4} tpr={p.tpr:<4} grid={p.grid:<6} regs={k.attributes['num_regs']:<3} "
                      f"{t.median_us:9.2f} µs  {100 * t.gbps / peak:6.1f} %", flush=True)
            del x, r, w, out
            cupy.get_default_memory_pool().free_all_blocks()


if __name__ == "__main__":
    main()
