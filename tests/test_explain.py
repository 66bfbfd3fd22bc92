"""The six-question card: built from the planning functions and ptxas without a GPU, its bytes the
benchmark's bytes, its measured fields filled on a GPU."""

import json

import _support
import pytest

from conftest import HAS_GPU
from cukern import _tuned, ladder, reduce, rmsnorm
from cukern._dtypes import BFLOAT16
from cukern.lab import bench, card, cli, device
from cukern.lab.ladder import LADDER_N

H200 = device.H200
SECTIONS = ("tile", "traffic", "accumulation", "staging", "tuning", "profile")


def _case_params(case) -> dict:
    """A benchmark case's params as card params (the card names the same knobs of the call)."""
    spec = card.CARDS[case.op]
    return {k: (int(v) if isinstance(v, bool) else v) for k, v in case.params if k in spec.params}


@pytest.fixture(autouse=True)
def empty_cache(tmp_path, monkeypatch):
    """Every test sees an empty tuning cache of its own."""
    monkeypatch.setenv("CUKERN_CACHE_DIR", str(tmp_path / "cache"))
    _tuned.reset()
    yield
    _tuned.reset()


# The cards whose staging reads ptxas in the README's test command: one a family. With --every-instantiation
# (.ci/run) every card does; the other tests here read a stand-in (they check plans, launches and bytes).
READS_PTXAS = {spec.family: op for op, spec in sorted(card.CARDS.items(), reverse=True)}.values()


@pytest.fixture(autouse=True)
def ptxas(request, monkeypatch):
    op = request.node.callspec.params.get("op") if hasattr(request.node, "callspec") else None
    if request.node.get_closest_marker("nvrtc") and (_support.EVERY or op in READS_PTXAS):
        return
    monkeypatch.setattr(device, "_ptxas", lambda source, insts, arch: tuple(
        {"registers": 32, "stack": 0, "spill_stores": 0, "spill_loads": 0, "shared": 0} for _ in insts))


def test_every_benchmarked_op_and_every_rung_has_a_card():
    cases = {c.op for b in bench.OPS.values() for c in b.cases}
    rungs = {f"reduce_ladder.{r.label}" for r in ladder.RUNGS + (ladder.BEYOND,)}
    assert not (cases | rungs) - set(card.CARDS), "a new op or rung must register a card from its family's lab module"


@pytest.mark.parametrize("op", [pytest.param(op, marks=pytest.mark.nvrtc(card.CARDS[op].family))
                                for op in sorted(card.CARDS)])
def test_card_builds_without_a_gpu_from_plans_and_ptxas(op):
    c = card.explain(op, device=H200)
    d = c.as_dict()
    for section in SECTIONS:
        assert d[section], f"{op}: empty {section}"
    assert c.launches and all(ln["grid"] >= 1 and 1 <= ln["block"] <= 1024 for ln in c.launches)
    for s in c.staging:
        assert s["registers_per_thread"] > 0 and s["blocks_per_sm"] >= 1
        assert s["source"].startswith("NVRTC ptxas")
        assert s["local_memory_bytes"] == 0, f"{s['kernel']} spills or uses a stack frame"
    assert c.profile["measured_us"] is None and "profile.measured_us" in c.unmeasured
    assert c.profile["verdict"] in ("memory-bound", "latency-bound", "compute-bound")
    text = c.format()
    for n, title in enumerate(("Output tile", "Input traffic", "Accumulation", "Staging", "Tuning", "Profile"), 1):
        assert f"{n}. {title}" in text
    assert "not measured (no GPU)" in text


@pytest.mark.parametrize("op,case", [(op, c) for op, b in bench.OPS.items() for c in b.cases],
                         ids=lambda v: v if isinstance(v, str) else f"{v.op}-{'x'.join(map(str, v.shape))}-{v.dtype}")
def test_card_bytes_are_the_benchmarks_bytes(op, case):
    r = card.resolve(case.op, case.shape, case.dtype, H200, _case_params(case))
    assert r.described.bytes == bench.OPS[op].bytes(case)
    traffic = r.described.traffic
    assert traffic["bytes_read"] + traffic["bytes_written"] == r.described.bytes


def test_rung_bytes_are_the_ladder_records_bytes():
    for rung in ladder.RUNGS + (ladder.BEYOND,):
        d = card.resolve(f"reduce_ladder.{rung.label}", (LADDER_N,), "float32", H200).described
        assert d.bytes == reduce.bytes_moved((LADDER_N,), "float32", op="sum")


def test_rms_norm_card_is_the_planners_launch():
    c = card.explain("rms_norm", (16384, 4096), "bfloat16", device=H200)
    p = rmsnorm.plan(4096, 16384, 8, 2, H200.sm_count, rmsnorm.DEFAULT_KNOBS)
    (ln,) = c.launches
    assert (ln["grid"], ln["block"]) == (p.grid, p.block)
    assert ln["kernel"] == p.instantiation(BFLOAT16, BFLOAT16, False).expression
    assert c.tile["rows_per_block"] == p.rows_per_block and c.traffic["access_bytes"] == 16
    assert c.tuning["source"].startswith("heuristic")
    assert c.tuning["knobs"] == {"items_target": rmsnorm.DEFAULT_KNOBS.items_target,
                                 "small_block": rmsnorm.DEFAULT_KNOBS.small_block, "waves": rmsnorm.DEFAULT_KNOBS.waves}


def test_float8_cards_are_the_float8_calls_launch():
    """The float8 cards plan with the float8 call's knobs (4 waves without the residual where the tuning cache
    has no entry), name the float8 emulator, and say that the wide kernel reads a row twice."""
    for fused, op in ((False, "rms_norm_fp8"), (True, "fused_add_rms_norm_fp8")):
        d = card.resolve(op, (16384, 4096), "bfloat16", H200).described
        knobs = rmsnorm.Knobs(waves=8 if fused else 4)
        p = rmsnorm.plan(4096, 16384, 8, 2, H200.sm_count, knobs, fused=fused)
        (ln,) = d.launches
        assert (ln.grid, ln.block, ln.inst) == (p.grid, p.block, p.instantiation(BFLOAT16, BFLOAT16, fused, fp8=True))
        assert d.knobs["waves"] == knobs.waves
        assert "cukern.reference.rms_norm_fp8_emulated" in d.accumulation["batch_invariant"]
        wide = card.resolve(op, (64, 65536), "bfloat16", H200).described
        assert wide.launches[0].role == "wide kernel" and "read twice" in wide.accumulation["passes"]


def test_unaligned_hidden_gets_element_accesses():
    c = card.resolve("rms_norm", (64, 4095), "bfloat16", H200).described
    assert c.traffic["access_bytes"] == 2 and "access_note" in c.traffic


def test_multi_pass_rung_lists_every_pass():
    c = card.explain("reduce_ladder.v3", (1 << 20,), "float32", device=H200)
    grids = [ln["grid"] for ln in c.launches]
    assert grids == [4096, 16, 1] and c.accumulation["passes"] == 3
    assert c.staging[0]["launches"] == 3


def test_cards_use_the_tuning_cache_when_it_has_an_entry(tmp_path):
    cache = _tuned.TuningCache()
    cache.put({"device": H200.name, "op": "rms_norm", "dtype": "bfloat16", "bucket": "hidden=4096,rows<=16384",
               "knobs": {"items_target": 4, "small_block": 128, "waves": None}, "median_us": 70.0,
               "heuristic_us": 72.0})
    cache.save()
    _tuned.reset()
    c = card.explain("rms_norm", (16384, 4096), "bfloat16", device=H200)
    assert c.tuning["source"] == "tuning cache" and c.tuning["knobs"]["items_target"] == 4
    p = rmsnorm.plan(4096, 16384, 8, 2, H200.sm_count, rmsnorm.Knobs(4, 128, None))
    assert (c.launches[0]["grid"], c.launches[0]["block"]) == (p.grid, p.block)
    with _tuned.heuristic_only():
        assert card.explain("rms_norm", (16384, 4096), "bfloat16", device=H200).tuning["source"].startswith("heuristic")


def test_params_are_checked():
    with pytest.raises(ValueError, match="takes params"):
        card.explain("rms_norm", device=H200, axis=0)
    with pytest.raises(ValueError, match="no card"):
        card.explain("softmax", device=H200)
    with pytest.raises(ValueError, match="like 16384x4096"):
        card.parse_shape("16384 by 4096")


def test_column_sum_card_shows_both_passes():
    c = card.explain("sum", (16384, 32768), "float32", device=H200, axis=0)
    assert c.tile["kind"] == "cols" and len(c.launches) == 2
    assert c.params == {"axis": 0}


def test_column_scan_card_names_the_column_kernel():
    c = card.explain("cumsum", (16384, 4096), "float32", device=H200, axis=0)
    assert [launch["kernel"] for launch in c.launches] == ["cukern::scan_columns<float, float, 0, 0>"]
    assert c.tuning["knobs"]["kernel"] == "columns" and "carried" in c.accumulation["combine"]
    assert c.traffic["re_read"] == ["each tile a second time for the results, from L2"]


def test_complex_logsumexp_card_names_its_own_kernel():
    """Complex x takes reduce_lse_complex (one warp an output), not the real logsumexp's kernels or a route of
    the parts."""
    for dtype, part in (("complex64", "float"), ("complex128", "double")):
        c = card.explain("logsumexp_rows", (1024, 4096), dtype, device=H200, axis=-1)
        assert [launch["kernel"] for launch in c.launches] == [
            f"cukern::reduce_lse_complex<cukern::Complex<{part}>, cukern::Complex<{part}>, 6, 128>"]
        assert c.tile["kind"] == "strided" and c.tile["outputs"] == 1024 and c.tile["elements_per_output"] == 4096
        assert c.traffic["bytes_written"] == 1024 * (8 if part == "float" else 16)


def test_blocks_per_sm():
    assert device.blocks_per_sm(48, 64, 256, H200) == (5, "registers")
    assert device.blocks_per_sm(32, 0, 1024, H200) == (2, "threads")
    assert device.blocks_per_sm(16, 100_000, 128, H200) == (2, "shared memory")
    assert device.blocks_per_sm(16, 0, 32, H200) == (32, "blocks per SM")


def test_verdicts():
    assert device.verdict(20.0, 13.9, 100.0)[0] == "compute-bound"
    assert device.verdict(0.5, 13.9, 100.0)[0] == "memory-bound"
    assert device.verdict(0.5, 13.9, 1.0)[0] == "latency-bound"
    assert device.verdict(0.5, 13.9, 100.0, pct_of_peak=85.0)[0] == "memory-bound"
    assert device.verdict(0.5, 13.9, 100.0, pct_of_peak=14.0)[0] == "latency-bound"


def test_h200_defaults_are_labelled_and_the_ridge_follows_from_them():
    assert not H200.measured and "no GPU" in H200.label and "not measured" in H200.bandwidth_source
    assert H200.compute_gflops == pytest.approx(132 * 1.98 * 128 * 2)
    assert H200.ridge == pytest.approx(H200.compute_gflops / H200.peak_gbps)


def test_cli_explain_json(capsys):
    code = cli.main(["explain", "rms_norm", "--shape", "4096x4096", "--json", "--no-measure"])
    out = capsys.readouterr()
    assert code == 0, out.err
    doc = json.loads(out.out)
    assert doc["shape"] == [4096, 4096] and doc["dtype"] == "bfloat16"
    assert doc["profile"]["bytes"] == rmsnorm.bytes_moved((4096, 4096), BFLOAT16, BFLOAT16)


def test_cli_explain_rejects_unknown_ops(capsys):
    with pytest.raises(SystemExit) as stop:
        cli.main(["explain", "softmax"])
    assert stop.value.code == 2 and "softmax" in capsys.readouterr().err


@pytest.mark.gpu
@pytest.mark.serial  # the card times the copy and the kernel: a GPU shared with other tests skews their ratio
@pytest.mark.parametrize("op", ["rms_norm", "fused_add_rms_norm", "rotary_embedding", "sum", "sum_rows",
                                "reduce_ladder.v10"])
def test_card_measured_fields_are_filled_on_a_gpu(op):
    c = card.explain(op)
    p = c.profile
    assert c.device["measured"] and not c.unmeasured
    assert p["measured_us"] > 0 and p["gbps"] > 0 and 0 < p["pct_of_copy_peak"] < 150
    assert p["bandwidth_source"].startswith("measured")
    for s in c.staging:
        assert s["source"].startswith("cupy.RawKernel.attributes")
        assert s["registers_per_thread"] > 0 and s["max_threads_per_block"] >= s["block"]
        assert s["blocks_per_sm"] >= 1


@pytest.mark.gpu
@pytest.mark.serial
def test_large_rms_norm_is_memory_bound_on_a_gpu():
    assert card.explain("rms_norm", (16384, 8192), "bfloat16").profile["verdict"] == "memory-bound"


@pytest.mark.skipif(HAS_GPU, reason="checks the no-GPU card")
def test_default_device_without_a_gpu_is_the_labelled_h200():
    c = card.explain("rms_norm")
    assert c.device["name"] == "NVIDIA H200" and not c.device["measured"]
    assert "device.peak_gbps (datasheet figure used)" in c.unmeasured
