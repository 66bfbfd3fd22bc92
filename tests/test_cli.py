"""The command line, run as a user would, in a subprocess."""

import json
import subprocess
import sys

import pytest

from conftest import HAS_GPU


def cukern(*args):
    return subprocess.run([sys.executable, "-m", "cukern", *args], capture_output=True, text=True, timeout=600)


@pytest.mark.skipif(HAS_GPU, reason="checks the no-GPU message")
def test_bench_without_gpu_says_so_and_exits_2():
    r = cukern("bench")
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "no CUDA GPU" in r.stderr


def test_info_prints_versions():
    r = cukern("info")
    assert r.returncode == 0, r.stderr
    assert "nvrtc" in r.stdout and "cupy" in r.stdout


def test_compile_lists_instantiations_for_sm80():
    # one small family: test_compile compiles every family for every arch in-process
    r = cukern("compile", "--arch", "sm_80", "--family", "rotary")
    assert r.returncode == 0, r.stderr
    from cukern import rotary

    insts = rotary.instantiations()
    assert all(inst.expression in r.stdout for inst in insts)
    assert r.stdout.rstrip().endswith(f"{len(insts)} instantiations compiled for sm_80")


def test_help_lists_subcommands():
    r = cukern("--help")
    assert r.returncode == 0 and "bench" in r.stdout and "compile" in r.stdout


def test_results_file_has_the_documented_form():
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "bench" / "results" / "h200.json"
    if not path.exists():
        pytest.skip("no results file yet")
    doc = json.loads(path.read_text())
    assert set(doc) == {"device", "cupy_version", "source_sha256", "peak_copy_gbps", "records"}
    for r in doc["records"]:
        if r["op"].startswith("host_overhead"):  # host time only: no bytes
            assert set(r) == {"op", "impl", "shape", "dtype", "median_us"}
        else:
            assert set(r) == {"op", "impl", "shape", "dtype", "median_us", "gbps", "pct_of_peak"}


@pytest.mark.skipif(HAS_GPU, reason="checks the no-GPU message")
def test_ladder_without_gpu_says_so_and_exits_2():
    r = cukern("ladder", "--n", "1000")
    assert r.returncode == 2 and "no CUDA GPU" in r.stderr
