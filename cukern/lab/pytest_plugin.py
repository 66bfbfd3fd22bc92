"""pytest plugin: the ``cuda_benchmark`` fixture, pytest-benchmark's statistics in GPU time.

pytest-benchmark times the host's wall clock around each call, which for GPU code is the launch (or, with a
synchronize, the launch plus the queue). ``cuda_benchmark`` times the calls with CUDA events instead
(:func:`cukern.timing.event_times_us`: warm-up, L2 flushed between rounds or not) and hands each round's GPU
seconds to pytest-benchmark as its data, so its table, ``--benchmark-json``, ``--benchmark-compare``,
``--benchmark-compare-fail`` and ``--benchmark-histogram`` all speak GPU time.

The ``pytest11`` entry point is named after this module, so ``-p cukern.lab.pytest_plugin`` (needed where
cukern runs from a source tree, not installed) and the installed entry point load it once, never twice. The
fixtures exist only in a session where pytest-benchmark's plugin is registered. Loading imports neither cupy
nor pytest-benchmark: this runs in every pytest session of an environment with cukern, GPU or not.
"""

from __future__ import annotations

import statistics
import sys

import pytest

# the parts of pytest-benchmark's BenchmarkFixture this plugin drives (present from 3.1 through 5.x)
BENCHMARK_FIXTURE_NEEDS = ("_make_stats", "_mode", "disabled", "has_error", "extra_info")


def has_cuda_gpu() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


class EventTimer:
    """The timer seam: each round's GPU seconds, and the copy peak that ``pct_of_peak`` is against.

    A test can stand in its own object with these two methods by overriding the ``cuda_benchmark_timer``
    fixture.
    """

    def round_seconds(self, fn, args, *, warmup: int, rounds: int, flush_l2: bool) -> list[float]:
        from cukern import timing

        us = timing.event_times_us(fn, *args, warmup=warmup, repeat=rounds, flush_l2=flush_l2)
        return [float(t) * 1e-6 for t in us]

    def peak_gbps(self) -> float:
        from cukern import timing

        return timing.peak_bandwidth()


def check_benchmark_fixture(benchmark) -> None:
    """Raise, naming the installed pytest-benchmark, when its fixture lacks a part this plugin drives."""
    missing = [name for name in BENCHMARK_FIXTURE_NEEDS if not hasattr(benchmark, name)]
    if missing:
        import pytest_benchmark

        raise RuntimeError(
            f"cuda_benchmark needs pytest-benchmark's BenchmarkFixture.{missing[0]}, which pytest-benchmark "
            f"{pytest_benchmark.__version__} lacks; install pytest-benchmark>=4,<6"
        )


class CudaBenchmark:
    """``cuda_benchmark(fn, *args, rounds=100, warmup=10, flush_l2=True, bytes_moved=None)``.

    Calls ``fn(*args)`` once and returns what it returns. With benchmarks enabled it then times ``warmup``
    untimed and ``rounds`` timed calls as :func:`cukern.timing.benchmark` does, one CUDA event pair per round,
    with L2 flushed and left clean before each round when ``flush_l2``; the rounds' GPU seconds become
    pytest-benchmark's statistics. ``bytes_moved`` (bytes read plus bytes written by one call) adds ``gbps``
    at the median, ``pct_of_peak`` and ``peak_copy_gbps`` (:func:`cukern.timing.peak_bandwidth`) to
    ``extra_info``. With ``--benchmark-disable`` nothing is timed, as with pytest-benchmark's own fixture.
    One call per test; keyword arguments of ``fn`` go through ``functools.partial``.
    """

    def __init__(self, benchmark, timer):
        self._benchmark = benchmark
        self._timer = timer

    @property
    def extra_info(self) -> dict:
        return self._benchmark.extra_info

    def __call__(self, fn, *args, rounds: int = 100, warmup: int = 10, flush_l2: bool = True, bytes_moved=None):
        if not isinstance(rounds, int) or rounds < 1:
            raise ValueError(f"rounds is {rounds!r}; pass a whole number of at least 1")
        if not isinstance(warmup, int) or warmup < 0:
            raise ValueError(f"warmup is {warmup!r}; pass a whole number of at least 0")
        if bytes_moved is not None and not bytes_moved > 0:
            raise ValueError(f"bytes_moved is {bytes_moved!r}; pass the bytes one call reads and writes, or None")
        bench = self._benchmark
        if bench._mode:
            bench.has_error = True  # as pytest-benchmark does: the test's numbers stay out of the results
            raise RuntimeError(f"this test's benchmark was already used ({bench._mode}); time one callable per test")
        bench._mode = "cuda_benchmark(...)"
        try:
            result = fn(*args)
            if not bench.disabled:
                self._record(fn, args, rounds, warmup, flush_l2, bytes_moved)
        except Exception:
            # as pytest-benchmark does: a failed benchmark stays out of the JSON and the comparison
            bench.has_error = True
            raise
        return result

    def _record(self, fn, args, rounds, warmup, flush_l2, bytes_moved) -> None:
        seconds = self._timer.round_seconds(fn, args, warmup=warmup, rounds=rounds, flush_l2=flush_l2)
        stats = self._benchmark._make_stats(1)
        # pytest-benchmark's own options (its host timer, calibration times) describe nothing measured here
        stats.options = {"timer": "cuda_event", "rounds": rounds, "warmup": warmup, "flush_l2": flush_l2}
        for s in seconds:
            stats.update(s)
        info = {"timer": "cuda_event", "flush_l2": flush_l2}
        if bytes_moved is not None:
            gbps = bytes_moved / statistics.median(seconds) / 1e9
            peak = self._timer.peak_gbps()
            info.update(bytes_moved=int(bytes_moved), gbps=gbps, pct_of_peak=100 * gbps / peak,
                        peak_copy_gbps=peak)
        self._benchmark.extra_info.update(info)


class Fixtures:
    @pytest.fixture
    def cuda_benchmark_timer(self):
        """The timer ``cuda_benchmark`` uses; a test without a CUDA GPU is skipped here."""
        if not has_cuda_gpu():
            pytest.skip("no CUDA GPU")
        return EventTimer()

    @pytest.fixture
    def cuda_benchmark(self, cuda_benchmark_timer, benchmark):  # the timer first: without a GPU it skips
        # before pytest-benchmark's fixture exists (which would warn that it was never used)
        """Time a callable with CUDA events; pytest-benchmark's statistics become GPU time (:class:`CudaBenchmark`)."""
        check_benchmark_fixture(benchmark)
        return CudaBenchmark(benchmark, cuda_benchmark_timer)


def pytest_configure(config) -> None:
    # pytest-benchmark absent, or blocked with -p no:benchmark: leave no fixture that would ask for it
    plugin = sys.modules.get("pytest_benchmark.plugin")
    if plugin is not None and config.pluginmanager.is_registered(plugin):
        config.pluginmanager.register(Fixtures(), "cukern-cuda-benchmark")
