"""pytest-benchmark entry points: each case of ``cukern.bench`` timed on the GPU with CUDA events
(``cukern.timing``), GPU µs, GB/s and % of the copy peak in ``extra_info``. Run with
``python -m pytest bench --benchmark-enable`` on a machine with a GPU."""

import pytest

from cukern import bench, timing

CASES = [(op, case) for op, b in bench.OPS.items() for case in b.cases]


@pytest.mark.gpu
@pytest.mark.parametrize("op,case", CASES, ids=[f"{c.op}-{'x'.join(map(str, c.shape))}-{c.dtype}" for _, c in CASES])
def test_op(benchmark, op, case):
    import cupy

    b = bench.OPS[op]
    state = b.setup(case)
    t = timing.benchmark(b.run, state, bytes_moved=b.bytes(case))
    peak = timing.peak_bandwidth()
    benchmark.extra_info.update(gpu_median_us=t.median_us, gpu_p20_us=t.p20_us, gpu_p80_us=t.p80_us,
                                gbps=t.gbps, pct_of_peak=100 * t.gbps / peak, peak_copy_gbps=peak)

    def call():
        b.run(state)
        cupy.cuda.get_current_stream().synchronize()

    benchmark.pedantic(call, rounds=20, warmup_rounds=2)
