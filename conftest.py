import sys

import numpy as np
import pytest


def _gpu_available() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


HAS_GPU = _gpu_available()


def pytest_addoption(parser):
    parser.addoption("--every-instantiation", action="store_true",
                     help="compile and inspect every kernel instantiation, not a covering sample (.ci/run)")
    parser.addoption("--wheel", action="store_true",
                     help="build the wheel and install it into a fresh venv (tests marked wheel; .ci/run)")


def pytest_collection_modifyitems(config, items):
    support = sys.modules.get("_support")  # imported by the test modules that compile
    if support is not None:
        support.EVERY = config.getoption("every_instantiation")
    # Tests that wait on NVRTC go last: the workers compile (see pytest_collection_finish) while the rest run,
    # biggest family first, so those tests follow that order, each placed by the last of its families to be
    # compiled (its smallest): each family's checks then run while the workers compile the smaller ones, and
    # a test of every family waits at the end, not ahead of the checks it would hold up.
    def order(item):
        mark = item.get_closest_marker("nvrtc")
        if mark is None:
            return (0, 0)
        import _support

        return (1, -min(len(_support.checked_instantiations(s)) for s in mark.args))

    items.sort(key=order)
    if not config.getoption("wheel"):
        later = pytest.mark.skip(reason="builds and installs the wheel: --wheel (.ci/run runs it)")
        for item in items:
            if "wheel" in item.keywords:
                item.add_marker(later)
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason="no CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_runtest_teardown(item):
    # The GPU job runs tests in several processes on one GPU (bench/run_h200.sh): each gives its pool's
    # memory back after a GPU test, so the largest tests of several processes never meet in CuPy's pools.
    if HAS_GPU and "gpu" in item.keywords:
        import cupy

        cupy.get_default_memory_pool().free_all_blocks()


@pytest.fixture
def rng():
    """Fresh random data every run; the seed is printed on failure so a case can be replayed."""
    seed = np.random.SeedSequence().entropy % 2**32
    print(f"rng seed {seed}")
    return np.random.default_rng(seed)


def pytest_collection_finish(session):
    """NVRTC is most of the suite's time and keeps one core busy: compile the families the selected tests mark
    with ``nvrtc`` in worker processes from the start, so each is compiled once per run, on every core, while
    the unmarked tests run; and start the recordings they mark with ``records``."""
    sources = [s for item in session.items for mark in item.iter_markers("nvrtc") for s in mark.args]
    recorders = [mark.args for item in session.items for mark in item.iter_markers("records")]
    if (sources or recorders) and not session.config.option.collectonly:
        import _support

        _support.start_recordings(recorders)
        _support.prefetch(sources)


def pytest_sessionfinish(session):
    support = sys.modules.get("_support")
    if support is not None:
        support.stop_prefetch()
        support.stop_recordings()
