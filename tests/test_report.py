"""Bandwidth and roofline reports (rendered with matplotlib's Agg backend) and the progress bar."""

import io
import json
from pathlib import Path

import pytest

from cukern import rmsnorm
from cukern._tuned import knobs_dict
from cukern.lab import bench, card, device, report
from cukern.lab.ladder import LADDER_N
from cukern.lab.progress import Progress

RESULTS = Path(__file__).resolve().parent.parent / "bench" / "results" / "h200.json"
PNG = b"\x89PNG\r\n\x1a\n"


def synthetic_results() -> dict:
    """A results document shaped like ``bench.run``'s, for every benchmark case (two impls each)."""
    records = []
    for b in bench.OPS.values():
        for c in b.cases:
            nbytes = b.bytes(c)
            for impl, gbps in (("cukern", 3500.0), ("cupy", 400.0)):
                us = nbytes / (gbps * 1e3)
                records.append({"op": c.op, "impl": impl, "shape": list(c.shape), "dtype": c.dtype,
                                "median_us": us, "gbps": gbps, "pct_of_peak": 100 * gbps / 4200})
    records.append({"op": "reduce_ladder", "impl": "reduce_v3_sequential_addressing", "shape": [LADDER_N],
                    "dtype": "float32", "median_us": 1200.0, "gbps": 900.0, "pct_of_peak": 21.0})
    return {"device": "NVIDIA H200", "cupy_version": "14", "source_sha256": "0", "peak_copy_gbps": 4200.0,
            "records": records}


def test_bandwidth_series_use_the_benchmarks_bytes():
    doc = synthetic_results()
    series = report.bandwidth_series(doc)
    assert set(series) == set(bench.OPS)
    counts = report._case_bytes()
    for panel in series.values():
        for (op, impl, dtype), points in panel.items():
            assert impl in ("cukern", "cupy")
            sizes = {n for (o, _, d), n in counts.items() if o == op and d == dtype}
            assert {x for x, _ in points} <= sizes


def test_every_committed_record_makes_a_point():
    """Every benchmarked op of the committed results file has its panel, and each of its records a point."""
    doc = json.loads(RESULTS.read_text()) if RESULTS.exists() else synthetic_results()
    series = report.bandwidth_series(doc)
    assert set(series) == set(bench.OPS)
    plotted = [r for r in doc["records"] if r["op"] not in bench.RECORD_SETS and r.get("gbps")]
    assert sum(len(points) for panel in series.values() for points in panel.values()) == len(plotted)


def test_bandwidth_plot_renders(tmp_path):
    """The panels of the committed results file (a synthetic one without it) that take every branch of the
    drawing: several dtypes and peers (rms_norm), case variants (rotary_embedding), sizes within a decade
    (var). Each panel draws the same way, and all eighteen took 9 s of the suite's time on two cores."""
    pytest.importorskip("matplotlib")
    doc = json.loads(RESULTS.read_text()) if RESULTS.exists() else synthetic_results()
    panels = report._panels()
    doc["records"] = [r for r in doc["records"] if panels.get(r["op"]) in ("rms_norm", "rotary_embedding", "var")]
    path = tmp_path / "bandwidth.png"
    report.plot_bandwidth(doc, path)
    assert path.read_bytes()[:8] == PNG


def test_roofline_points_without_a_gpu_are_predicted_on_the_bandwidth_roof():
    points = report.roofline_points(device=device.H200, measure=False)
    assert {p["op"] for p in points} == set(card.CARDS)
    for p in points:
        assert p["achieved_gflops"] is None and p["source"].startswith("predicted")
        assert p["intensity"] < device.H200.ridge
        assert p["attainable_gflops"] == pytest.approx(p["intensity"] * device.H200.peak_gbps)


def test_roofline_points_take_achieved_times_from_a_results_file():
    doc = synthetic_results()
    points = report.roofline_points(["rms_norm", "reduce_ladder.v3"], results=doc, device=device.H200, measure=False)
    by_key = {(p["op"], tuple(p["shape"]), p["dtype"]): p for p in points}
    rms = by_key[("rms_norm", (16384, 4096), "bfloat16")]
    assert rms["source"] == "results file"
    assert rms["achieved_gflops"] == pytest.approx(rms["flops"] / (rms["bytes"] / 3500.0))
    assert by_key[("reduce_ladder.v3", (LADDER_N,), "float32")]["measured_us"] == 1200.0
    assert len(by_key) == len(points)  # no shape listed twice


def test_roofline_plot_renders(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "roofline.png"
    points = report.roofline_points(results=synthetic_results(), device=device.H200, measure=False)
    report.plot_roofline(points, device.H200, path)
    assert path.read_bytes()[:8] == PNG
    assert "ridge" in report.format_roofline(points, device.H200)


def test_cli_roofline_and_bench_plot_from_a_results_file(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    from cukern.lab import cli

    doc = synthetic_results()
    doc["records"] = [r for r in doc["records"] if r["op"] == "rms_norm"]  # the plumbing, not every series
    results = tmp_path / "results.json"
    results.write_text(json.dumps(doc))
    roof, bw = tmp_path / "roofline.png", tmp_path / "bandwidth.png"
    # in this process, as a user's command runs (a subprocess would cost seconds of imports)
    assert cli.main(["roofline", "--no-measure", "--results", str(results), "--plot", str(roof)]) == 0
    assert roof.read_bytes()[:8] == PNG and "rms_norm" in capsys.readouterr().out
    assert cli.main(["bench", "--results", str(results), "--plot", str(bw)]) == 0
    assert bw.read_bytes()[:8] == PNG


class Tty(io.StringIO):
    def isatty(self):
        return True


def test_progress_is_quiet_off_a_terminal():
    stream = io.StringIO()
    with Progress(3, "bench", stream=stream) as bar:
        bar.step("a")
        bar.step("b")
    assert stream.getvalue() == ""


def test_progress_draws_and_clears_on_a_terminal():
    stream = Tty()
    with Progress(4, "tune", stream=stream) as bar:
        bar.step("first")
        assert "tune [#######.....................] 1/4" in stream.getvalue()
        bar.step("x", n=0)
        assert bar.done == 1
    assert stream.getvalue().endswith("\r")
    quiet = Tty()
    Progress(2, "q", stream=quiet, quiet=True).step("x")
    assert quiet.getvalue() == ""


@pytest.mark.gpu
def test_bench_records_the_heuristic_and_the_tuned_plan():
    doc = bench.run(["fused_add_rms_norm"], repeat=10, peers=False)
    impls = {(r["op"], r["impl"]) for r in doc["records"]}
    assert ("fused_add_rms_norm", "cukern") in impls and ("fused_add_rms_norm", "cukern-tuned") in impls
    for r in doc["records"]:
        tuned = r["impl"] == "cukern-tuned"
        keys = {"op", "impl", "shape", "dtype", "median_us", "gbps", "pct_of_peak"}
        assert set(r) == (keys | {"knobs"} if tuned else keys)
        if tuned:
            assert set(r["knobs"]) == set(knobs_dict(rmsnorm.DEFAULT_KNOBS))


@pytest.mark.gpu
def test_roofline_measures_on_a_gpu():
    points = report.roofline_points(["rms_norm", "sum"], measure=True)
    assert all(p["source"] == "measured" and p["achieved_gflops"] > 0 for p in points)


def test_standing_compares_the_default_plan_with_the_fastest_peer():
    def rec(op, impl, us, shape=(4096,)):
        return {"op": op, "impl": impl, "shape": list(shape), "dtype": "float32", "median_us": us}

    records = [
        rec("sum", "cukern", 100.0), rec("sum", "cukern-tuned", 90.0), rec("sum", "cupy", 99.0),
        rec("sum", "torch", 101.0),
        rec("var", "cukern", 100.0), rec("var", "torch", 110.0),
        rec("cumsum", "cukern", 100.0), rec("cumsum", "cupy", 99.8),
        rec("norm", "cukern", 100.0), rec("norm", "cukern-no-contract", 95.0), rec("norm", "cupy", 96.0),
        rec("reduce_ladder", "reduce_v1", 500.0),
    ]
    rows = {r[0]: r for r in bench.standing(records)}
    assert set(rows) == {"sum", "var", "cumsum", "norm"}  # the ladder has no cukern record: not a case
    assert rows["sum"][4:] == ("cupy", 99.0, 0.99, "behind")  # the tuned plan is not the default
    assert rows["var"][-1] == "lead" and rows["cumsum"][-1] == "even" and rows["norm"][-1] == "explained"
    assert bench.format_standing(records).splitlines()[-1].startswith("cases behind a peer: 1 ")
