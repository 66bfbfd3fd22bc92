"""pytest-benchmark entry points: each case of ``cukern.lab.bench`` timed on the GPU with CUDA events through the
``cuda_benchmark`` fixture (``cukern.lab.pytest_plugin``), so pytest-benchmark's statistics are GPU time; GB/s
and % of the copy peak in ``extra_info``. Run with ``python -m pytest bench --benchmark-enable`` on a machine
with a GPU."""

import pytest

from cukern.lab import bench

# the GPU job runs from the source tree, where no installed entry point loads the plugin
pytest_plugins = ["cukern.lab.pytest_plugin"]

CASES = [(op, case) for op, b in bench.OPS.items() for case in b.cases]


@pytest.mark.gpu
@pytest.mark.serial
@pytest.mark.parametrize("op,case", CASES, ids=[f"{c.op}-{'x'.join(map(str, c.shape))}-{c.dtype}" for _, c in CASES])
def test_op(cuda_benchmark, op, case):
    b = bench.OPS[op]
    cuda_benchmark(b.run, b.setup(case), bytes_moved=b.bytes(case))
