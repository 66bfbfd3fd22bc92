"""The command line, called in this process through ``cukern.lab.cli.main`` (and in a subprocess for what
only a real process shows: that ``python -m cukern.lab`` runs, and what a user sees on stderr); and the
edges a new user meets first: one-line errors with exit status 2, and a GPU asked for where there is none."""

import json
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import HAS_GPU


def cukern(*args):
    """``python -m cukern.lab ARGS`` in a process of its own, as a user runs it."""
    return subprocess.run([sys.executable, "-m", "cukern.lab", *args], capture_output=True, text=True, timeout=600)


def lab(capsys, *args):
    """``(exit status, stdout, stderr)`` of the same command called in this process (a subprocess costs a
    second of imports)."""
    from cukern.lab import cli

    try:
        code = cli.main(list(args))
    except SystemExit as stop:  # argparse's own exits: --help and its errors
        code = stop.code
    out = capsys.readouterr()
    return code, out.out, out.err


def assert_one_line_error(r, *words):
    """``r``: a finished subprocess, or ``(exit status, stderr)`` of an in-process call."""
    code, err = (r.returncode, r.stderr) if isinstance(r, subprocess.CompletedProcess) else r
    assert code == 2, (code, err)
    assert err.strip() and err.strip().count("\n") == 0, err
    assert "Traceback" not in err
    for w in words:
        assert w in err, (w, err)


@pytest.mark.skipif(HAS_GPU, reason="checks the no-GPU message")
def test_bench_without_gpu_says_so_and_exits_2():
    """The README's first command on a machine without a GPU, in a process of its own as a user meets it."""
    assert_one_line_error(cukern("bench"), "no CUDA GPU")


def test_info_prints_versions(capsys):
    code, out, err = lab(capsys, "info")
    assert code == 0, err
    assert "nvrtc" in out and "cupy" in out


def test_compile_lists_instantiations_for_sm80_with_their_family(capsys):
    # the family quickest to compile (.ci/run compiles every family for sm_80 through this command); its two
    # chunks go to the command's worker processes, as they do for a user
    code, out, err = lab(capsys, "compile", "--arch", "sm_80", "--family", "reduce_ladder")
    assert code == 0, err
    from cukern import families

    insts = families.named("reduce_ladder").instantiations()
    lines = out.splitlines()
    assert all(f"  reduce_ladder  {inst.expression}  regs=" in out for inst in insts)
    assert f"{len(insts)} instantiations compiled for sm_80 in " in out
    assert lines[-1] == "no instantiation spills" or "marked SPILLS above" in lines[-1]


def test_compile_flags_each_spilling_instantiation(monkeypatch, capsys):
    from cukern import rotary
    from cukern.lab import cli

    insts = rotary.instantiations()
    spilling = insts[0].expression

    def fake_chunk(source, chunk, arch):  # ptxas' report, without NVRTC
        return {i.expression: {"registers": 64, "spill_stores": 8 if i.expression == spilling else 0,
                               "spill_loads": 4 if i.expression == spilling else 0} for i in chunk}

    monkeypatch.setattr(cli, "_compile_chunk", fake_chunk)
    assert cli.main(["compile", "--arch", "sm_100", "--family", "rotary", "--jobs", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    flagged = [line for line in lines if "SPILLS" in line and line.startswith("  ")]
    assert len(flagged) == 1 and spilling in flagged[0] and "8 B stored, 4 B loaded" in flagged[0]
    assert lines[-1] == "1 instantiations spill to local memory (rotary 1): marked SPILLS above"


def test_compile_max_local_fails_past_its_bytes(monkeypatch, capsys):
    from cukern import rotary
    from cukern.lab import cli

    insts = rotary.instantiations()

    def fake_chunk(source, chunk, arch):
        return {i.expression: {"registers": 64, "spill_stores": 0, "spill_loads": 0,
                               "stack": 24 if i.expression == insts[1].expression else 0} for i in chunk}

    monkeypatch.setattr(cli, "_compile_chunk", fake_chunk)
    argv = ["compile", "--arch", "sm_80", "--family", "rotary", "--jobs", "1"]
    assert cli.main(argv + ["--max-local", "24"]) == 0
    assert cli.main(argv + ["--max-local", "16"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"cukern compile: 1 instantiations use more than 16 B of local memory on sm_80; the most: "
                   f"{insts[1].expression} (rotary), 24 B"]


def test_compile_failure_shows_nvrtc_log_and_exits_1(monkeypatch, capsys):
    from cukern.lab import cli

    def broken(source, chunk, arch):
        raise RuntimeError(f"NVRTC failed on {source}.cu for {arch}:\n{source}.cu(1): error: expected a ;")

    monkeypatch.setattr(cli, "_compile_chunk", broken)
    assert cli.main(["compile", "--arch", "sm_90", "--family", "rotary", "--jobs", "1"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("cukern compile: NVRTC failed on rotary.cu for sm_90:\n") and "Traceback" not in err


# (arguments, words the one line must hold); "{tmp}" is a fresh folder
MISTAKES = [
    (["compile", "--arch", "sm90"], ["'sm90' is not an architecture", "sm_90"]),
    (["compile", "--arch", "sm_75"], ["too old", "sm_80"]),
    (["compile", "--arch", "compute_90"], ["virtual", "sm_90"]),
    (["compile", "--arch", "sm_990"], ["does not compile for it", "sm_90"]),
    (["compile", "--family", "nope"], ["invalid choice: 'nope'"]),
    (["explain", "rms_norm", "--dtype", "bf16"], ["rms_norm takes dtype float32, float16, bfloat16", "'bf16'"]),
    (["explain", "rms_norm", "--dtype", "int8"], ["rms_norm takes dtype float32, float16, bfloat16", "int8"]),
    (["explain", "rms_norm", "--dtype", "float64"], ["rms_norm takes dtype float32, float16, bfloat16", "float64"]),
    (["explain", "bogus"], ["invalid choice: 'bogus'"]),
    (["explain", "rms_norm", "--param", "eps"], ["KEY=VALUE"]),
    (["roofline", "--op", "bogus"], ["invalid choice: 'bogus'"]),
    (["bench", "--results", "{tmp}/nope.json"], ["{tmp}/nope.json", "no such file"]),
    (["bench", "--results", "{tmp}/list.json"], ["not a results file"]),
    (["bench", "--results", "{tmp}/r.json", "--plot", "{tmp}/p.png"], ["--plot needs matplotlib", ".[plot]"]),
    (["roofline", "--plot", "{tmp}/p.png"], ["--plot needs matplotlib", ".[plot]"]),
    (["ladder", "--plot", "{tmp}/p.png"], ["--plot needs matplotlib", ".[plot]"]),
    (["ladder", "--dtype", "int8"], ["invalid choice: 'int8'"]),
    (["tune", "--op", "rms_norm", "--shape", "4096", "--dtype", "bf16"], ["'bf16'"]),
    (["tune", "--op", "rms_norm", "--shape", "16xq"], ["--shape"]),
    (["tune", "--op", "bogus"], ["invalid choice: 'bogus'"]),
    (["tune", "--op", "rotary_embedding", "--shape", "4x4x4"], ["rotary_embedding tunes shapes of 4 dimensions"]),
    (["tune", "--repeat", "0"], ["--repeat 0 must be at least 1"]),
    (["explain", "rotary_embedding", "--shape", "4x4"], ["rotary_embedding takes a shape of 3 dimensions"]),
    (["explain", "qk_norm_rope", "--shape", "4096"], ["qk_norm_rope takes a shape of 3 dimensions"]),
    (["bench", "--repeat", "0"], ["--repeat 0 must be at least 1"]),
    (["ladder", "--n", "0"], ["--n 0 must be at least 1"]),
    (["bench", "--results", "{tmp}/partial.json"], ["record 0 lacks impl, shape, dtype, median_us"]),
]


@pytest.fixture
def tmp(tmp_path):
    (tmp_path / "r.json").write_text(json.dumps({"records": []}))
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "partial.json").write_text(json.dumps({"records": [{"op": "sum"}]}))
    return tmp_path


@pytest.mark.parametrize("argv, words", MISTAKES, ids=[" ".join(a) for a, _ in MISTAKES])
def test_each_mistake_is_one_line_and_exit_2(argv, words, tmp, monkeypatch, capsys):
    # a None entry in sys.modules makes `import matplotlib` fail as if it were not installed
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    code, _, err = lab(capsys, *(a.format(tmp=tmp) for a in argv))
    assert_one_line_error((code, err), *(w.format(tmp=tmp) for w in words))
    assert not (tmp / "p.png").exists()


def test_a_mistake_is_one_line_as_a_user_sees_it():
    """What the in-process mistakes cannot show: nothing else on stderr (a warning at import, a traceback)
    and exit status 2 through ``python -m cukern.lab`` itself; one mistake stands for them all."""
    assert_one_line_error(cukern("explain", "rms_norm", "--dtype", "bf16"), "'bf16'")


@pytest.mark.parametrize("op, dtype", [("rms_norm", "bf16"), ("rotary_embedding", "float64"), ("sum", "int8"),
                                       ("reduce_ladder.v1", "int32")])
def test_explain_api_refuses_a_dtype_before_compiling(op, dtype):
    from cukern.lab import card
    from cukern.lab.device import H200

    taken = card.CARDS[op].dtypes
    with pytest.raises(ValueError, match=f"^{op} takes dtype .*, not '?{dtype}'?$") as err:
        card.explain(op, dtype=dtype, device=H200)
    assert len(str(err.value).split(",")) == len(taken) + 1


def test_help_lists_subcommands(capsys):
    code, out, _ = lab(capsys, "--help")
    assert code == 0 and "bench" in out and "compile" in out


def test_no_gpu_is_said_in_one_clear_error(monkeypatch):
    import cupy

    import cukern
    from cukern import _launch, timing

    def no_driver():
        raise cupy.cuda.runtime.CUDARuntimeError(35)  # cudaErrorInsufficientDriver: CUDA's words for no GPU

    monkeypatch.setattr(_launch, "_gpu_seen", False)
    monkeypatch.setattr(cupy.cuda.runtime, "getDeviceCount", no_driver)
    from cukern import _interop

    monkeypatch.setattr(_interop, "_device_count", None)

    class Producer:  # a DLPack-less array another library hands over
        __cuda_array_interface__ = {"shape": (4,), "typestr": "<f4", "data": (1 << 20, False), "version": 3}

    for call in (timing.peak_bandwidth, lambda: timing.benchmark(lambda: None),
                 lambda: cukern.rope_cache(16, 8), lambda: cukern.rms_norm(Producer())):
        with pytest.raises(RuntimeError, match=r"^cukern needs a CUDA GPU: none is visible \(CUDA says: .*\)$"):
            call()


@pytest.mark.skipif(HAS_GPU, reason="checks the no-GPU error")
def test_tune_without_gpu_says_so():
    from cukern.lab.tune import tune

    with pytest.raises(RuntimeError, match="cukern needs a CUDA GPU"):
        tune("rms_norm", (16, 4096), "bfloat16")


def test_results_file_has_the_documented_form():
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
def test_ladder_without_gpu_says_so_and_exits_2(capsys):
    code, _, err = lab(capsys, "ladder", "--n", "1000")
    assert_one_line_error((code, err), "no CUDA GPU")


def test_package_main_points_at_the_lab():
    """``python -m cukern`` runs cukern/__main__.py as here: an exit with a message, which Python prints on
    stderr with exit status 1."""
    import cukern

    with pytest.raises(SystemExit) as stop:
        runpy.run_path(str(Path(cukern.__file__).with_name("__main__.py")), run_name="__main__")
    assert isinstance(stop.value.code, str) and "python -m cukern.lab" in stop.value.code
