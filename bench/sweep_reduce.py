"""Sweep the reduction tuning space (``cukern.reduce.Knobs``) on the GPU: for sum over 2^20, 2^24 and 2^29
float32 elements and sum over the rows of a [32768, 16384] float32 matrix, one line per knob setting with
µs, % of the copy peak, cupy.sum's time for the same case and OK/FAIL against a float64 reference; then
the host overhead of one call, and two timing variants that separate launch gap and L2 effects.

Run on the GPU machine from the repository root: ``PYTHONPATH=. python3 bench/sweep_reduce.py``
(under a minute; every kernel of the sweep is compiled up front in one NVRTC program).
"""

import itertools
import math
import statistics
import sys
import time

import numpy as np

import cupy
from cukern import reduce as R
from cukern import reference, timing
from cukern import _compile
from cukern._compile import read_source
from cukern._launch import sm_count

F32 = np.dtype(np.float32)
FULL_SIZES = (2**20, 2**24, 2**29)
ROWS_SHAPE = (32768, 16384)
SEED = 0


def full_knobs():
    out = []
    for block, bps, unroll in itertools.product((256, 512, 1024), (1, 2, 3, 4), (2, 4, 8)):
        if block * bps <= 2048:
            out.append(R.Knobs(full_block=block, full_blocks_per_sm=bps, full_unroll=unroll))
    return out


def row_knobs():
    # row_threads_per_sm 1024 caps registers at 64 (every unroll fits); with 32-bit row indices unroll 2
    # also fits 40 registers (1536 threads) and 32 (2048 threads, full occupancy); unroll 4 at 1536
    # spills: one setting shows what that costs.
    out = [R.DEFAULT_KNOBS]
    settings = list(itertools.product((32, 128, 256, 512, 1024), (2, 4, 8), (1024,), (None, 4, 8, 32)))
    settings += list(itertools.product((32, 128, 256, 512, 1024), (2,), (1536, 2048), (None, 4, 8)))
    settings += [(256, 4, 1536, 8)]
    for tpr, unroll, tps, waves in settings:
        k = R.Knobs(row_max_tpr=tpr, row_items=8, row_unroll=unroll, row_threads_per_sm=tps, row_waves=waves)
        if k != R.DEFAULT_KNOBS:
            out.append(k)
    return out


def describe_full(k, p):
    return f"block={k.full_block:<4} bps={k.full_blocks_per_sm} unroll={k.full_unroll} grid={p.grid:<4}"


def describe_rows(k, p):
    waves = "-" if k.row_waves is None else k.row_waves
    return (f"tpr={p.tpr:<4} block={p.block:<4} unroll={p.unroll} min_blocks={p.min_blocks:<2} "
            f"waves={waves!s:<3} grid={p.grid:<6}")


# ---------------------------------------------------------------------------------------------------------


def precompile(insts):
    """Compile every instantiation in one NVRTC program and seed cukern's kernel cache with them."""
    insts = sorted(set(insts), key=lambda i: i.expression)
    dev = cupy.cuda.Device().id
    todo = [i for i in insts if (dev, i, ()) not in _compile._kernels]
    if not todo:
        return
    t0 = time.perf_counter()
    module = cupy.RawModule(code=read_source(R.SOURCE), options=_compile._options(()),
                            name_expressions=[i.expression for i in todo])
    for i in todo:
        _compile._kernels[(dev, i, ())] = module.get_function(i.expression)
    print(f"# compiled {len(todo)} kernels in {time.perf_counter() - t0:.1f} s", flush=True)


def kernel_info(inst):
    """(registers, local bytes per thread, resident blocks per SM) of an instantiation."""
    k = _compile.get_kernel(inst)
    a = k.attributes
    regs, local = a["num_regs"], a["local_size_bytes"]
    block = inst.args[3]
    per_warp = math.ceil(max(regs, 1) * 32 / 256) * 256
    by_regs = 65536 // (per_warp * (block // 32))
    return regs, local, min(2048 // block, by_regs, 32)


def data(n):
    """n values in [0.5, 1.5) (positive: no cancellation, every element moves the sum)."""
    rs = cupy.random.RandomState(SEED)
    x = cupy.empty(n, dtype=F32)
    chunk = 1 << 26
    for lo in range(0, n, chunk):
        hi = min(n, lo + chunk)
        x[lo:hi] = rs.random_sample(hi - lo, dtype=np.float32) + np.float32(0.5)
    return x


def ref_full(x):
    chunk = 1 << 26
    return math.fsum(float(x[lo:lo + chunk].astype(np.float64).sum()) for lo in range(0, x.size, chunk))


def ref_rows(x):
    out = cupy.empty(x.shape[0], dtype=np.float64)
    step = max(1, (1 << 26) // x.shape[1])
    for lo in range(0, x.shape[0], step):
        out[lo:lo + step] = x[lo:lo + step].astype(np.float64).sum(axis=1)
    return out


def ok_full(got, ref, n):
    return abs(float(got) - ref) <= reference.reduction_tolerance(n, F32, abs(ref))


def ok_rows(got, ref, length):
    tol = reference.reduction_tolerance(length, F32, float(cupy.abs(ref).max()))
    return bool(cupy.all(cupy.abs(got.astype(np.float64) - ref) <= tol))


def launcher(x, axis, knobs):
    """The prepared single launch of sum(x, axis) under ``knobs`` (what the fast path calls)."""
    strides = tuple(s // x.itemsize for s in x.strides)
    axes = R.normalize_axis(axis, x.ndim)
    pl = R.plan(x.shape, x.dtype, axes, strides=strides, ptr=x.data.ptr % 16, out_dtype=F32,
                sm_count=sm_count(x.device.id), knobs=knobs)
    shape = R._result_shape(x.shape, axes, False)
    return pl, R._launcher(pl, x, x.dtype, F32, R.OP_SUM, R.FINISH_NONE, float(pl.layout.count), shape)


def bench(fn, *args, nbytes, repeat):
    return timing.benchmark(fn, *args, warmup=3, repeat=repeat, bytes_moved=nbytes)


def bench_dirty_l2(fn, *args, repeat):
    """Median µs with the overwrite-only flush (L2 left full of the flush's dirty lines, whose write-back
    lands in the timed window), for comparison with timing.benchmark's clean flush."""
    flush = timing.l2_flush()
    flush.clean = False
    try:
        return timing.benchmark(fn, *args, warmup=3, repeat=repeat).median_us
    finally:
        flush.clean = True


# ---------------------------------------------------------------------------------------------------------


def main():
    t_start = time.perf_counter()
    peak = timing.peak_bandwidth()
    sm = sm_count(cupy.cuda.Device().id)
    print(f"copy peak {peak:.0f} GB/s, {sm} SMs, cupy {cupy.__version__}", flush=True)

    fulls, rows = full_knobs(), row_knobs()
    insts = []
    for k in fulls:
        insts.append(R._full_inst(F32, F32, R.OP_SUM, R.plan_full(1 << 30, 4, sm, k)))
    for k in rows:
        insts.append(R._rows_inst(F32, F32, R.OP_SUM, R.plan_rows(ROWS_SHAPE[1], ROWS_SHAPE[0], 4, sm, k)))
    precompile(insts)

    # Host overhead: wall time of one call from Python (no sync inside), median of 1000.
    small = data(1 << 10)
    for name, fn in (("cukern.sum", R.sum), ("cupy.sum", cupy.sum),
                     ("cupy.ndarray((), f32) alone", lambda _x: cupy.ndarray((), F32))):
        for _ in range(50):
            fn(small)
        cupy.cuda.Device().synchronize()
        walls = []
        for _ in range(1000):
            t0 = time.perf_counter()
            fn(small)
            walls.append(time.perf_counter() - t0)
        cupy.cuda.Device().synchronize()
        print(f"host {name:28} median {1e6 * statistics.median(walls):6.2f} µs  "
              f"p10 {1e6 * np.percentile(walls, 10):6.2f}  p90 {1e6 * np.percentile(walls, 90):6.2f}", flush=True)
    print(f"host cukern.sum 2^10 correct: {'OK' if ok_full(R.sum(small), ref_full(small), small.size) else 'FAIL'}")

    # Full reductions.
    for n in FULL_SIZES:
        x = data(n)
        ref = ref_full(x)
        nbytes = R.bytes_moved((n,), F32)
        repeat = 30 if n >= 2**28 else 100
        case = f"sum 2^{int(math.log2(n))}"
        cub = bench(cupy.sum, x, nbytes=nbytes, repeat=repeat)
        cub_s = f"cupy {cub.median_us:8.2f} µs {100 * cub.gbps / peak:6.1f} %"
        t = bench(R.sum, x, nbytes=nbytes, repeat=repeat)
        print(f"{case:10} cukern.sum (defaults, public call){'':26} {t.median_us:9.2f} µs {100 * t.gbps / peak:6.1f} % "
              f"| {cub_s} | {'OK' if ok_full(R.sum(x), ref, n) else 'FAIL'}", flush=True)
        for k in fulls:
            pl, run = launcher(x, None, k)
            regs, local, res = kernel_info(R._full_inst(F32, F32, R.OP_SUM, pl.kernel))
            t = bench(run, x, nbytes=nbytes, repeat=repeat)
            ok = "OK" if ok_full(run(x), ref, n) else "FAIL"
            fits = "" if pl.kernel.grid <= res * sm else " OVER-RESIDENT"
            print(f"{case:10} {describe_full(k, pl.kernel)} regs={regs:<3} lmem={local:<3} res/SM={res:<2} "
                  f"{t.median_us:9.2f} µs {100 * t.gbps / peak:6.1f} % | {cub_s} | {ok}{fits}", flush=True)
        if n <= 2**24:
            # Variants: no flush (warm L2, back-to-back: exposes the host gap when the GPU is faster than
            # the host), and the overwrite-only flush (its dirty write-back inside the timed window).
            for name, fn in (("cukern.sum", R.sum), ("cupy.sum", cupy.sum)):
                warm = timing.benchmark(fn, x, warmup=3, repeat=100, flush_l2=False, bytes_moved=nbytes)
                dirty = bench_dirty_l2(fn, x, repeat=50)
                print(f"{case:10} variant {name:10} no-flush {warm.median_us:8.2f} µs   dirty-L2 flush "
                      f"{dirty:8.2f} µs ({100 * nbytes / (dirty * 1e3) / peak:6.1f} %)", flush=True)
        del x
        cupy.get_default_memory_pool().free_all_blocks()

    # Rows.
    x = data(math.prod(ROWS_SHAPE)).reshape(ROWS_SHAPE)
    ref = ref_rows(x)
    nbytes = R.bytes_moved(ROWS_SHAPE, F32, -1)
    case = "rows"
    cub = timing.benchmark(lambda a: cupy.sum(a, axis=-1), x, warmup=3, repeat=30, bytes_moved=nbytes)
    cub_s = f"cupy {cub.median_us:8.2f} µs {100 * cub.gbps / peak:6.1f} %"
    t = bench(lambda a: R.sum(a, axis=-1), x, nbytes=nbytes, repeat=30)
    print(f"{case:10} cukern.sum (defaults, public call){'':26} {t.median_us:9.2f} µs {100 * t.gbps / peak:6.1f} % "
          f"| {cub_s} | {'OK' if ok_rows(R.sum(x, axis=-1), ref, ROWS_SHAPE[1]) else 'FAIL'}", flush=True)
    for k in rows:
        pl, run = launcher(x, -1, k)
        regs, local, res = kernel_info(R._rows_inst(F32, F32, R.OP_SUM, pl.kernel))
        t = bench(run, x, nbytes=nbytes, repeat=30)
        ok = "OK" if ok_rows(run(x), ref, ROWS_SHAPE[1]) else "FAIL"
        mark = " (default)" if k == R.DEFAULT_KNOBS else ""
        print(f"{case:10} {describe_rows(k, pl.kernel)} regs={regs:<3} lmem={local:<3} res/SM={res:<2} "
              f"{t.median_us:9.2f} µs {100 * t.gbps / peak:6.1f} % | {cub_s} | {ok}{mark}", flush=True)
    print(f"# total {time.perf_counter() - t_start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
