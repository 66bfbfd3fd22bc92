"""The ``cuda_benchmark`` pytest plugin: pytest-benchmark's table, JSON and comparison carry the timer's GPU
seconds (a fake timer on the CPU), ``--benchmark-disable`` calls once, no GPU skips, no pytest-benchmark
leaves it inert; on a GPU a 2 GiB copy timed through it lands at the copy peak."""

import json
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from cukern.lab import pytest_plugin

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parent.parent
# also where cukern is not installed (the GPU job runs from the source tree); once only where it is
PLUGIN = ("-p", "cukern.lab.pytest_plugin")
SECONDS = [0.004, 0.001, 0.003, 0.002]

FAKE_TIMER = """
import os
import pytest


class FakeTimer:
    def __init__(self):
        self.calls = []

    def round_seconds(self, fn, args, *, warmup, rounds, flush_l2):
        self.calls.append(dict(warmup=warmup, rounds=rounds, flush_l2=flush_l2))
        scale = float(os.environ.get("FAKE_GPU_SCALE", "1"))
        return [scale * s for s in %r][:rounds]

    def peak_gbps(self):
        return 2000.0


@pytest.fixture
def cuda_benchmark_timer():
    return FakeTimer()
""" % (SECONDS,)

TIMED_TEST = """
def test_copy(cuda_benchmark, cuda_benchmark_timer):
    calls = []
    assert cuda_benchmark(calls.append, 7, rounds=4, warmup=2, flush_l2=False, bytes_moved=2_500_000_000) is None
    assert calls == [7]
    assert cuda_benchmark_timer.calls == [dict(warmup=2, rounds=4, flush_l2=False)]
"""


def run_fake(pytester, *args):
    pytester.makeconftest(FAKE_TIMER)
    pytester.makepyfile(test_timed=TIMED_TEST)
    return pytester.runpytest_inprocess(*PLUGIN, *args)


def test_table_and_json_carry_the_timers_gpu_seconds(pytester):
    out = pytester.path / "bench.json"
    result = run_fake(pytester, "--benchmark-enable", f"--benchmark-json={out}",
                      "--benchmark-columns=min,max,median,rounds")
    result.assert_outcomes(passed=1)
    # the table in milliseconds: min 1, max 4, median 2.5 over 4 rounds
    assert re.search(r"test_copy\s+1\.0000\s+4\.0000\s+2\.5000\s+4\b", result.stdout.str()), result.stdout.str()
    (bench,) = json.loads(out.read_text())["benchmarks"]
    assert bench["stats"]["data"] == SECONDS
    assert (bench["stats"]["min"], bench["stats"]["max"], bench["stats"]["median"]) == (0.001, 0.004, 0.0025)
    assert bench["stats"]["iterations"] == 1
    assert bench["options"] == {"timer": "cuda_event", "rounds": 4, "warmup": 2, "flush_l2": False}
    info = bench["extra_info"]
    assert info["gbps"] == pytest.approx(1000.0)  # 2.5 GB in the median's 2.5 ms
    assert info["pct_of_peak"] == pytest.approx(50.0)
    assert (info["peak_copy_gbps"], info["bytes_moved"], info["timer"]) == (2000.0, 2_500_000_000, "cuda_event")


def test_compare_fail_judges_gpu_time(pytester, monkeypatch):
    store = f"file://{pytester.path / 'store'}"
    run_fake(pytester, "--benchmark-enable", f"--benchmark-storage={store}", "--benchmark-save=base"
             ).assert_outcomes(passed=1)
    same = pytester.runpytest_inprocess(*PLUGIN, "--benchmark-enable", f"--benchmark-storage={store}",
                                        "--benchmark-compare=0001", "--benchmark-compare-fail=median:5%")
    assert same.ret == 0, same.stdout.str()
    monkeypatch.setenv("FAKE_GPU_SCALE", "1.2")
    slower = pytester.runpytest_inprocess(*PLUGIN, "--benchmark-enable", f"--benchmark-storage={store}",
                                          "--benchmark-compare=0001", "--benchmark-compare-fail=median:5%")
    assert slower.ret != 0
    slower.stderr.fnmatch_lines(["Performance has regressed:",
                                 "*Field 'median' has failed PercentageRegressionCheck: 20.0* > 5.0*"])


def test_disabled_calls_once_and_times_nothing(pytester):
    pytester.makeconftest(FAKE_TIMER)
    pytester.makepyfile(test_timed="""
def test_copy(cuda_benchmark, cuda_benchmark_timer):
    calls = []
    assert cuda_benchmark(lambda x: calls.append(x) or x + 1, 7, bytes_moved=10) == 8
    assert calls == [7]
    assert cuda_benchmark_timer.calls == []
    assert cuda_benchmark.extra_info == {}
""")
    out = pytester.path / "bench.json"
    result = pytester.runpytest_inprocess(*PLUGIN, "--benchmark-disable", f"--benchmark-json={out}")
    result.assert_outcomes(passed=1)
    assert not out.exists() or json.loads(out.read_text())["benchmarks"] == []


def test_without_a_gpu_the_test_is_skipped(pytester):
    pytester.makeconftest("""
import pytest
from cukern.lab import pytest_plugin


@pytest.fixture(autouse=True)
def no_gpu(monkeypatch):
    monkeypatch.setattr(pytest_plugin, "has_cuda_gpu", lambda: False)
""")
    pytester.makepyfile(test_timed="""
def test_copy(cuda_benchmark):
    raise AssertionError("a test without a GPU must not run")
""")
    result = pytester.runpytest_inprocess(*PLUGIN, "-rs", "-W", "error")
    result.assert_outcomes(skipped=1)  # and no warning of pytest-benchmark's fixture left unused
    result.stdout.fnmatch_lines(["*no CUDA GPU*"])


def test_inert_without_pytest_benchmark(pytester):
    pytester.makepyfile(test_plain="""
def test_plain():
    pass
""")
    present = pytester.runpytest_inprocess(*PLUGIN, "--fixtures")
    present.stdout.fnmatch_lines(["cuda_benchmark_timer -- *", "cuda_benchmark -- *"])
    # pytest-benchmark cannot be imported and its entry point is not loaded: as if it were not installed
    pytester.makepyfile(run_without=f"""
import sys

sys.path.insert(0, {str(ROOT)!r})


class NoPytestBenchmark:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == "pytest_benchmark":
            raise ImportError(name)


sys.meta_path.insert(0, NoPytestBenchmark())
import pytest

args = ["-p", "no:benchmark", "-p", "cukern.lab.pytest_plugin", "-p", "no:cacheprovider", "test_plain.py"]
# the test, then the fixtures list, one session after the other in one process (a second process costs seconds)
sys.exit(pytest.main(args) or pytest.main(args + ["--fixtures"]))
""")
    result = pytester.run(sys.executable, "run_without.py")
    assert result.ret == 0, result.stdout.str() + result.stderr.str()
    result.stdout.fnmatch_lines(["*1 passed*", "monkeypatch -- *"])  # the test passed, then the list
    assert "cuda_benchmark" not in result.stdout.str(), result.stdout.str()


def test_loading_imports_neither_cupy_nor_pytest_benchmark(pytester):
    code = (f"import sys; sys.path.insert(0, {str(ROOT)!r}); "
            "import cukern.lab.pytest_plugin as p; "
            "assert 'cupy' not in sys.modules and 'pytest_benchmark' not in sys.modules, 'heavy import'; "
            "sys.modules['cupy'] = None; assert not p.has_cuda_gpu(); print('light')")
    result = pytester.run(sys.executable, "-c", code)
    assert result.ret == 0, result.stderr.str()
    result.stdout.fnmatch_lines(["light"])


def fake_fixture(**fields):
    return SimpleNamespace(**{"_mode": None, "disabled": False, "has_error": False, "extra_info": {}, **fields})


@pytest.mark.parametrize("kwargs,message", [
    (dict(rounds=0), "rounds is 0; pass a whole number of at least 1"),
    (dict(rounds=2.5), "rounds is 2.5"),
    (dict(warmup=-1), "warmup is -1; pass a whole number of at least 0"),
    (dict(bytes_moved=0), "bytes_moved is 0; pass the bytes one call reads and writes, or None"),
])
def test_bad_arguments_raise_before_any_call(kwargs, message):
    calls = []
    with pytest.raises(ValueError, match=re.escape(message)):
        pytest_plugin.CudaBenchmark(fake_fixture(), None)(calls.append, 1, **kwargs)
    assert calls == []


def test_one_callable_per_test():
    calls = []
    bench = fake_fixture(_mode="benchmark(...)")
    with pytest.raises(RuntimeError, match=r"already used \(benchmark\(\.\.\.\)\); time one callable per test"):
        pytest_plugin.CudaBenchmark(bench, None)(calls.append, 1)
    assert calls == [] and bench.has_error  # the first call's numbers stay out of the results, as pytest-benchmark


def test_a_failing_call_is_kept_out_of_the_results():
    bench = fake_fixture(disabled=True)

    def fail():
        raise KeyError("boom")

    with pytest.raises(KeyError):
        pytest_plugin.CudaBenchmark(bench, None)(fail)
    assert bench.has_error


def test_a_pytest_benchmark_without_the_parts_it_drives_is_named():
    import pytest_benchmark

    with pytest.raises(RuntimeError, match=re.escape(
            f"BenchmarkFixture._make_stats, which pytest-benchmark {pytest_benchmark.__version__} lacks; "
            "install pytest-benchmark>=4,<6")):
        pytest_plugin.check_benchmark_fixture(fake_fixture())


@pytest.mark.gpu
@pytest.mark.serial
def test_a_copy_times_at_the_copy_peak(pytester):
    # pytest-benchmark runs disabled under this project's addopts; an inner session with it enabled is the
    # path a user takes, --benchmark-json included, and in this process, so the peak is the one measured here
    pytester.makepyfile(test_copy="""
import cupy


def test_copy(cuda_benchmark):
    nbytes = 1 << 31
    src = cupy.ones(nbytes, dtype=cupy.uint8)
    dst = cupy.empty_like(src)
    cuda_benchmark(dst.data.copy_from_device_async, src.data, nbytes, bytes_moved=2 * nbytes)
""")
    out = pytester.path / "bench.json"
    result = pytester.runpytest_inprocess(*PLUGIN, "--benchmark-enable", f"--benchmark-json={out}")
    result.assert_outcomes(passed=1)
    (bench,) = json.loads(out.read_text())["benchmarks"]
    info = bench["extra_info"]
    assert info["gbps"] == pytest.approx(2 * (1 << 31) / bench["stats"]["median"] / 1e9)
    assert abs(info["pct_of_peak"] - 100) <= 10, info


@pytest.mark.gpu
@pytest.mark.serial  # pytest-benchmark turns itself off inside an xdist worker
def test_the_documented_example_runs(pytester):
    guide = (ROOT / "docs" / "guide" / "benchmarking.md").read_text()
    example = re.search(r"```python\n(# test_saxpy\.py\n.*?)```", guide, re.S).group(1)
    pytester.makepyfile(test_saxpy=example)
    out = pytester.path / "bench.json"
    result = pytester.runpytest_inprocess(*PLUGIN, "--benchmark-enable", f"--benchmark-json={out}")
    result.assert_outcomes(passed=2)
    benches = json.loads(out.read_text())["benchmarks"]
    assert [b["extra_info"]["bytes_moved"] for b in benches] == [3 * 4 << 20, 3 * 4 << 28]
    assert all(b["extra_info"]["gbps"] > 0 for b in benches)
