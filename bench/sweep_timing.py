"""How the timing harness itself shapes small-kernel figures: each small benchmark case (cukern and the
CuPy composite) timed with the L2 flush and the stream hold on and off (``cukern.timing.benchmark``), plus
a one-element CuPy kernel as the launch floor, and a device-to-device copy moving the same bytes (read +
write) as each case: what the copy peak itself allows at that size. Large cases are included as a control:
the hold should not move them.

Run from the repository root: ``PYTHONPATH=. python3 bench/sweep_timing.py`` (about half a minute).
"""

import cupy
from cukern import timing
from cukern.lab import bench

SMALL = [("sum", (1 << 20,)), ("sum", (1 << 24,)), ("rms_norm", (256, 4096)), ("rms_norm", (4096, 4096)),
         ("rotary_embedding", (1, 32, 128)), ("rotary_embedding", (64, 32, 128)), ("rms_norm", (16384, 4096))]


def copy_bytes(dst, src):
    cupy.cuda.runtime.memcpyAsync(dst.data.ptr, src.data.ptr, src.nbytes, cupy.cuda.runtime.memcpyDeviceToDevice,
                                  cupy.cuda.get_current_stream().ptr)


def main():
    peak = timing.peak_bandwidth()
    print(f"copy peak {peak:.1f} GB/s")
    x = cupy.ones(1, dtype=cupy.float32)
    variants = [("flush+hold", True, True), ("flush", True, False), ("hold", False, True), ("bare", False, False)]
    floor = "  ".join(f"{name} {timing.benchmark(cupy.negative, x, repeat=200, flush_l2=f, hold=h).median_us:6.2f}"
                      for name, f, h in variants)
    print(f"{'launch floor (1-element negative)':44s} {floor}")
    for op, shape in SMALL:
        b = bench.OPS[op]
        case = next(c for c in b.cases if c.shape == shape)
        state = b.setup(case)
        nbytes = b.bytes(case)
        src = cupy.empty(nbytes // 2, dtype=cupy.uint8)
        dst = cupy.empty_like(src)
        copy = timing.benchmark(copy_bytes, dst, src, repeat=200, bytes_moved=nbytes)
        print(f"{op:18s} {'x'.join(map(str, shape)):14s} copy of the same {nbytes / 1e6:.1f} MB: "
              f"{copy.median_us:6.2f} µs = {100 * copy.gbps / peak:5.1f} % of the peak")
        for impl, fn in (("cukern", b.run), ("cupy", b.cupy)):
            row = "  ".join(
                f"{name} {timing.benchmark(fn, state, repeat=200, flush_l2=f, hold=h).median_us:6.2f}"
                for name, f, h in variants)
            print(f"{op:18s} {'x'.join(map(str, shape)):14s} {impl:8s} {row}")
        del state, src, dst


if __name__ == "__main__":
    main()
