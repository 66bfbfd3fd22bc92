"""The sum ladder: registry, source comments, compilation and PTX of every rung (CPU); every rung against
a float64 reference on odd sizes, and the runner (GPU)."""

import math
import re

import numpy as np
import pytest
from _support import ARCHS, assert_no_spills, compiled

from cukern import ladder as L
from cukern import reduce as R
from cukern import reduce_plan as P
from cukern import reference
from cukern._compile import read_source
from cukern._dtypes import BFLOAT16, dtype_name


def _kernel_text(source: str, name: str) -> str:
    """The source of kernel ``name``: from its name to the next top-level closing brace."""
    start = source.index(f" {name}(")
    end = source.index("\n}\n", start)
    return source[start:end]


def test_registry_is_ordered_and_named():
    assert [r.number for r in L.RUNGS] == list(range(1, len(L.RUNGS) + 1))
    assert len(L.RUNGS) >= 10
    for r in L.RUNGS:
        assert re.fullmatch(rf"reduce_v{r.number}_[a-z0-9_]+", r.name), r.name
        assert r.label == f"v{r.number}"
    assert [r.single_launch for r in L.RUNGS][-2:] == [True, True]
    assert not any(r.single_launch for r in L.RUNGS[:-2])
    assert L.BEYOND.number == len(L.RUNGS) + 1 and L.BEYOND not in L.RUNGS  # past production, not a rung
    assert re.fullmatch(rf"reduce_v{L.BEYOND.number}_[a-z0-9_]+", L.BEYOND.name) and L.BEYOND.single_launch


def test_every_rung_says_what_changed():
    src = read_source(L.SOURCE)
    for r in L.RUNGS + (L.BEYOND,):
        body = _kernel_text(src, r.name)
        assert "Predicted" in body, r.name
        if r.number > 1:
            assert f"Changed from v{r.number - 1}" in body, r.name
    header = src[: src.index("#include")]
    for r in L.RUNGS + (L.BEYOND,):
        assert re.search(rf"//\s+v{r.number}\s", header), f"v{r.number} missing from the file header"


def test_last_warp_rung_is_safe_under_independent_thread_scheduling():
    body = _kernel_text(read_source(L.SOURCE), "reduce_v5_unroll_last_warp")
    code = "\n".join(line.split("//")[0] for line in body.splitlines())
    assert "volatile" not in code
    assert code.count("__syncwarp()") >= 2


def test_last_rung_is_the_production_body():
    src = read_source(L.SOURCE)
    assert '#include "reduce.cu"' in src  # the production body itself, not a copy
    body = _kernel_text(src, L.RUNGS[-1].name)
    assert "full_reduce_body<T, A, OP_SUM, BLOCK, UNROLL>" in body
    assert "full_reduce_body" in read_source(P.SOURCE) and "reduce_v" not in read_source(P.SOURCE)
    p = P.plan_full(2**29, 4, 132)
    assert L.RUNGS[-1].grid(2**29, 4, 132) == p.grid and L.RUNGS[-1].block == p.block


def test_rung_past_production_launches_as_production_without_the_tree():
    """v11 differs from v10 only in its order: the same block, grid and loads in flight, no span layout."""
    for n, size in ((2**29, 4), (2**28, 8), (2**30, 2), (1000, 4)):
        assert L.BEYOND.grid(n, size, 132) == L.RUNGS[-1].grid(n, size, 132)
    assert L.BEYOND.block == L.RUNGS[-1].block
    for t in L.DTYPES:
        (mine,), (production,) = L.BEYOND.instantiations(t), L.RUNGS[-1].instantiations(t)
        assert mine.args == production.args
    body = _kernel_text(read_source(L.SOURCE), L.BEYOND.name)
    assert "full_reduce_body" not in body and "finish_in_last_block" in body


def test_full_sums_are_benchmarked_beside_the_rung_past_production():
    from cukern.lab import bench, reduce  # noqa: F401  (the family's lab module registers the sum cases)

    sums = bench.OPS["sum"]
    ((impl, _),) = sums.variants({"x": None, "axis": None})
    assert impl == "cukern-no-contract"
    assert sums.variants({"x": None, "axis": -1}) == [] and sums.variants({"x": None, "axis": 0}) == []


def test_grids_are_pure_and_bounded():
    sm = 132
    n = 2**28
    grids = {r.label: r.grid(n, 4, sm) for r in L.RUNGS}
    assert grids["v1"] == n // L.BLOCK and grids["v4"] == n // (2 * L.BLOCK)
    assert grids["v7"] == grids["v8"] == sm * (2048 // L.BLOCK)
    assert grids["v9"] <= P.FULL_PARTIALS
    for r in L.RUNGS:
        assert r.grid(1, 4, sm) == 1 and r.grid(0, 4, sm) == 1
        assert r.grid(n, 4, sm) < 2**31
    # passes a multi-pass rung makes: until one block is left
    for r in L.RUNGS[:-2]:
        m, passes = 2**28 + 7, 0
        while True:
            g = r.grid(m, 4, sm)
            passes += 1
            if g == 1:
                break
            m = g
        assert passes <= 4, r.name


def test_instantiations_cover_every_rung_and_dtype():
    insts = L.instantiations()
    names = {i.name for i in insts}
    assert names == {r.name for r in L.RUNGS + (L.BEYOND,)}
    for r in L.RUNGS + (L.BEYOND,):
        for t in L.DTYPES:
            assert set(r.instantiations(t)) <= set(insts)


@pytest.mark.nvrtc(L.SOURCE)
@pytest.mark.parametrize("arch", ARCHS)
def test_every_rung_compiles_without_local_memory(arch):
    c = compiled(L.SOURCE, arch)
    res = c.resources()
    for inst in L.instantiations():
        r = res[c.lowered[inst.expression]]
        assert_no_spills(r, arch, inst.expression)
    assert ".local" not in c.ptx


@pytest.mark.nvrtc(L.SOURCE)
@pytest.mark.parametrize("arch", ARCHS)
def test_vector_rungs_use_16_byte_loads(arch):
    c = compiled(L.SOURCE, arch)
    vector = re.compile(r"ld\.global\S*\.v(4\.(u32|b32|f32|s32)|2\.(u64|b64|f64|s64))")
    for r in L.RUNGS + (L.BEYOND,):
        for t in (np.dtype(np.float32), BFLOAT16):
            inst = r.instantiations(t)[0]
            body = c.kernel_ptx(inst)
            if r.number >= 8:
                assert vector.search(body), (r.name, dtype_name(t))
            else:
                assert not vector.search(body), (r.name, dtype_name(t))


def test_format_table():
    rows = [
        {"rung": "v1", "name": "reduce_v1_x", "change": "first", "us": 1000.0, "gbps": 1000.0, "pct_peak": 25.0,
         "pct_cub": 20.0, "speedup": None, "value": 1.0, "rel_error": 1e-7, "ok": True},
        {"rung": "v2", "name": "reduce_v2_x", "change": "second", "us": 500.0, "gbps": 2000.0, "pct_peak": 50.0,
         "pct_cub": None, "speedup": 2.0, "value": 1.0, "rel_error": 1e-3, "ok": False},
    ]
    text = L.format_table(rows)
    lines = text.splitlines()
    assert len(lines) == 4 and "GB/s" in lines[0] and "%CUB" in lines[0]
    assert "2.00" in lines[3] and " N " in lines[3] and "-" in lines[3]


def test_run_ladder_reports_progress_after_each_row(monkeypatch):
    """``progress(label)`` after every row, rungs then references, with the measuring replaced by fakes."""
    import inspect

    from cukern import timing

    assert "progress" in inspect.signature(L.run_ladder).parameters  # cukern ladder passes its bar then
    events = []

    class Fake:
        def __init__(self, label):
            self.label, self.name, self.change = label, f"fake_{label}", "fake"

        def __call__(self, x):
            events.append(("call", self.label))
            return np.float64(x.sum())

    def benchmark(fn, x, **kw):
        if getattr(fn, "__module__", "").startswith("cupy") or fn is np.sum:
            raise RuntimeError("no CUB here")
        events.append(("time", getattr(fn, "label", "sum")))
        return timing.Timing(10.0, 10.0, 10.0, 10.0, 10.0, 1, kw.get("bytes_moved"))

    monkeypatch.setattr(L, "RUNGS", tuple(Fake(f"v{i}") for i in (1, 2, 3)))
    monkeypatch.setattr(L, "BEYOND", Fake("v4"))
    monkeypatch.setattr(L, "make_data", lambda n, t, seed=0: np.ones(n))
    monkeypatch.setattr(L, "reference_sum", lambda x: float(x.sum()))
    monkeypatch.setattr(R, "sum", Fake("sum"))
    monkeypatch.setattr(timing, "benchmark", benchmark)
    monkeypatch.setattr(timing, "peak_bandwidth", lambda: 1000.0)
    pytest.importorskip("cupy")
    seen = []
    rows = L.run_ladder(64, "float32", progress=lambda label: (seen.append(label), events.append(("done", label))))
    assert seen == [r["rung"] for r in rows] == ["v1", "v2", "v3", "v4", "cukern.sum"]  # no CUB: no cub row
    assert events.index(("done", "v1")) < events.index(("time", "v2"))  # after each row, not at the end
    assert all(r["ok"] for r in rows)
    assert L.run_ladder(64, "float32") and len(seen) == 5  # progress is optional


def test_run_ladder_rejects_bad_arguments():
    with pytest.raises(TypeError, match="ladder dtype"):
        L.run_ladder(16, "int32")
    with pytest.raises(ValueError, match="positive"):
        L.run_ladder(0)


# ---------------------------------------------------------------------------------------------------------
# GPU.


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 31, 1000003, 2**28 + 7])
def test_every_rung_sums_float32(n):
    import cupy

    x = L.make_data(n, "float32", seed=n % 1000)
    ref = L.reference_sum(x)
    tol = reference.reduction_tolerance(n, np.float32, ref)
    first = None
    for r in L.RUNGS + (L.BEYOND,):
        got = r(x)
        assert got.shape == () and got.dtype == np.float32
        assert abs(float(got) - ref) <= tol, (r.name, n, float(got), ref)
        if r.number == L.RUNGS[-1].number:
            first = cupy.asnumpy(got).tobytes()
            assert all(cupy.asnumpy(r(x)).tobytes() == first for _ in range(3))  # bit-identical reruns
            assert float(R.sum(x)) == float(got)  # the production op runs the same body and plan


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float16, BFLOAT16, np.float64], ids=dtype_name)
def test_every_rung_other_dtypes_and_misaligned(dtype):
    n = 1000003
    x = L.make_data(n + 3, dtype, seed=7)
    for view in (x[:n], x[1:n + 1], x[3:]):
        ref = L.reference_sum(view)
        tol = reference.reduction_tolerance(view.size, L.acc_dtype(dtype), ref)
        for r in L.RUNGS + (L.BEYOND,):
            assert abs(float(r(view)) - ref) <= tol, (r.name, dtype_name(dtype))


@pytest.mark.gpu
def test_run_ladder_rows():
    seen = []
    rows = L.run_ladder(1 << 22, "float32", repeat=3, warmup=1, progress=seen.append)
    labels = [r["rung"] for r in rows]
    assert seen == labels and labels[len(L.RUNGS) + 1] == "cukern.sum"  # one progress call a row, in order
    assert labels[: len(L.RUNGS) + 1] == [r.label for r in L.RUNGS + (L.BEYOND,)]
    assert all(r["ok"] for r in rows)
    assert all(r["us"] > 0 and math.isfinite(r["gbps"]) for r in rows)
    assert rows[0]["speedup"] is None and rows[1]["speedup"] is not None
    assert L.format_table(rows).count("\n") == len(rows) + 1
