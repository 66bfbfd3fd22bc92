"""The command line, called in this process through ``cukern.lab.cli.main`` (and in a subprocess for what
only a real process shows: that ``python -m cukern.lab`` runs, and what a user sees on stderr); and the
edges a new user meets first: one-line errors with exit status 2, and a GPU asked for where there is none."""

import json
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

from _support import NEEDS_CUPY, NO_CUPY
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
    (["explain", "rotary_embedding", "--shape", "16"], ["rotary_embedding takes a shape of 3 dimensions", "got 16"]),
    (["explain", "rotary_embedding", "--shape", "1x1"], ["rotary_embedding takes a shape of 3 dimensions"]),
    (["explain", "rotary_embedding", "--shape", "5x3"], ["rotary_embedding takes a shape of 3 dimensions"]),
    (["explain", "rotary_embedding", "--shape", "2x3x4x5"], ["rotary_embedding takes a shape of 3 dimensions"]),
    (["explain", "rotary_embedding_gptj", "--shape", "16x32"], ["rotary_embedding_gptj takes a shape of 3"]),
    (["explain", "rotary_embedding_qkv_view", "--shape", "16x32"], ["rotary_embedding_qkv_view takes a shape of 3"]),
    (["explain", "qk_norm_rope", "--shape", "16x32"], ["qk_norm_rope takes a shape of 3 dimensions"]),
    (["explain", "sum", "--param", "dtype=int8", "--shape", "3x4"], ["sum takes params axis, not dtype"]),
    (["explain", "sum", "--param", "shape=3"], ["sum takes params axis, not shape"]),
    (["explain", "sum", "--param", "op=1"], ["sum takes params axis, not op"]),
    (["explain", "sum", "--param", "measure=1"], ["sum takes params axis, not measure"]),
    (["explain", "sum", "--param", "device=1"], ["sum takes params axis, not device"]),
    (["explain", "sum", "--param", "axis=0", "--param", "axis=1"], ["--param axis is given twice"]),
    (["explain", "argmax", "--param", "axis=0,1", "--shape", "3x4"], ["axis must be None or an int, got (0, 1)"]),
    (["explain", "rms_norm", "--param", "weight_dtype=bogus"], ["weight_dtype='bogus' is not a dtype"]),
    (["explain", "rms_norm", "--param", "weight_dtype=int8"], ["weight has dtype int8", "or float32"]),
    (["explain", "sum", "--param", "axis=abc"], ["axis='abc' is not an axis"]),
    (["explain", "sum", "--param", "axis=3"], ["axis 3 is out of bounds"]),
    (["explain", "rotary_embedding", "--param", "kv_heads=none"], ["kv_heads='none' is not an integer"]),
    (["explain", "rotary_embedding", "--param", "rotary_dim=7"], ["rotary_dim=7 must be a positive even number"]),
    (["explain", "rotary_embedding", "--param", "rotary_dim=256"], ["rotary_dim=256 is over head_size=128"]),
    (["explain", "rotary_embedding", "--param", "neox=2"], ["neox=2 must be 0 or 1"]),
    (["explain", "sum", "--shape", "-5x4096"], ["shape '-5x4096'", "positive"]),
    (["explain", "sum", "--shape", "16384x"], ["shape '16384x' is not like 16384x4096"]),
    (["explain", "sum", "--shape", "99999999999x99999999999"], ["would pass 2^63 bytes"]),
    (["explain", "segment_sum", "--param", "segments=-3"], ["segments=-3 must be at least 0"]),
    (["explain", "sum", "--dtype", ","], ["sum takes dtype", "','"]),
    (["explain", "amax", "--dtype", "complex64"], ["runs no reduction kernel", "argmax"]),
    (["roofline", "--json", "/nonexistent/dir/r.json"], ["--json /nonexistent/dir/r.json: no folder /nonexistent/dir"]),
    (["roofline", "--json", "{tmp}"], ["--json {tmp} is a folder"]),
    (["bench", "--results", "{tmp}/r.json", "--json", "/nonexistent/dir/r.json"], ["no folder /nonexistent/dir"]),
    (["tune", "--json", "/nonexistent/dir/t.json"], ["no folder /nonexistent/dir"]),
    (["compile", "--jobs", "0"], ["--jobs 0 must be at least 1"]),
    (["compile", "--jobs", "-1"], ["--jobs -1 must be at least 1"]),
    (["compile", "--max-local", "-5"], ["--max-local -5 must be at least 0"]),
    (["bench", "--repeat", "-3"], ["--repeat -3 must be at least 1"]),
]


@pytest.fixture
def tmp(tmp_path):
    (tmp_path / "r.json").write_text(json.dumps({"records": []}))
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "partial.json").write_text(json.dumps({"records": [{"op": "sum"}]}))
    return tmp_path


@pytest.mark.parametrize("argv, words", MISTAKES, ids=[" ".join(a) for a, _ in MISTAKES])
def test_each_mistake_is_one_line_and_exit_2(argv, words, tmp, monkeypatch, capsys):
    # a None entry in sys.modules makes `import matplotlib` fail as if it were not installed (its submodules
    # too, which an earlier test of this process may have imported)
    for name in ["matplotlib", *(m for m in list(sys.modules) if m.startswith("matplotlib."))]:
        monkeypatch.setitem(sys.modules, name, None)
    code, _, err = lab(capsys, *(a.format(tmp=tmp) for a in argv))
    assert_one_line_error((code, err), *(w.format(tmp=tmp) for w in words))
    assert not (tmp / "p.png").exists()


# (arguments, words the one line must hold) for --plot, with matplotlib there to ask which formats it writes
PLOT_MISTAKES = [
    (["roofline", "--plot", "/nonexistent/dir/r.png"], ["--plot /nonexistent/dir/r.png: no folder /nonexistent/dir"]),
    (["bench", "--results", "{tmp}/r.json", "--plot", "/nonexistent/dir/x.png"], ["no folder /nonexistent/dir"]),
    (["roofline", "--plot", "{tmp}/out.txt"], ["names a .txt file", "png"]),
    (["roofline", "--plot", "{tmp}/r.bogusext"], ["names a .bogusext file", "{tmp}/r.png"]),
    (["bench", "--results", "{tmp}/r.json", "--plot", "{tmp}/r"], ["names no file format"]),
    (["bench", "--results", "{tmp}/r.json", "--plot", "{tmp}"], ["is a folder", "{tmp}/out.png"]),
    (["ladder", "--plot", "{tmp}/"], ["is a folder"]),
]


@pytest.mark.parametrize("argv, words", PLOT_MISTAKES, ids=[" ".join(a) for a, _ in PLOT_MISTAKES])
def test_each_plot_mistake_is_one_line_and_exit_2_before_any_work(argv, words, tmp, monkeypatch, capsys):
    pytest.importorskip("matplotlib", reason="the test extra installs matplotlib")
    from cukern.lab import report

    monkeypatch.setattr(report, "roofline_points", lambda *a, **k: pytest.fail("work began"))
    code, out, err = lab(capsys, *(a.format(tmp=tmp) for a in argv))
    assert_one_line_error((code, err), *(w.format(tmp=tmp) for w in words))
    assert out == "" and sorted(p.name for p in tmp.iterdir()) == ["list.json", "partial.json", "r.json"]


def test_version(capsys):
    import cukern

    code, out, _ = lab(capsys, "--version")
    assert code == 0 and out.strip() == f"cukern {cukern.__version__}"


def test_every_flag_has_help():
    from cukern.lab import cli

    parser = cli._parser()
    (sub,) = [a for a in parser._actions if a.dest == "command"]
    bare = [f"{verb} {a.option_strings[0]}" for verb, p in sub.choices.items() for a in p._actions
            if a.option_strings and not a.help]
    assert not bare


def test_bench_results_keeps_the_records_of_op_and_writes_json(tmp_path, capsys):
    records = [{"op": op, "impl": impl, "shape": [4], "dtype": "float32", "median_us": 1.0}
               for op, impl in [("sum", "cukern"), ("sum_rows", "cupy"), ("rms_norm", "cukern"),
                                ("rms_norm", "cukern-graph"), ("host_overhead", "cukern"), ("reduce_ladder", "v1")]]
    src, dst = tmp_path / "in.json", tmp_path / "out.json"
    src.write_text(json.dumps({"device": "d", "records": records}))
    code, out, err = lab(capsys, "bench", "--results", str(src), "--op", "sum", "--op", "pipeline", "--json", str(dst))
    assert code == 0, err
    kept = json.loads(dst.read_text())
    assert kept["device"] == "d"
    assert [(r["op"], r["impl"]) for r in kept["records"]] == [
        ("sum", "cukern"), ("sum_rows", "cupy"), ("rms_norm", "cukern-graph"), ("host_overhead", "cukern")]
    assert "rms_norm" in out and f"wrote {dst}" in out


def test_explain_takes_what_the_op_takes(capsys):
    """The card goes the op's way: an int8 sum converts x to the kernels' int32 first, a complex cumsum
    scans the parts as a float view; neither is refused, and no NVRTC error reaches the user."""
    code, out, err = lab(capsys, "explain", "sum", "--dtype", "int8", "--shape", "64x33", "--param", "axis=1",
                         "--no-measure")
    assert code == 0, err
    assert "sum 64x33 int8 axis=1" in out and "note: x is first converted to int32" in out
    code, out, err = lab(capsys, "explain", "cumsum", "--dtype", "complex64", "--shape", "1000", "--no-measure")
    assert code == 0, err
    assert "scan_tiles<float, float" in out and "parts are scanned apart" in out


def test_without_cupy_each_verb_says_what_to_install():
    """``python -m cukern.lab info`` in a process without CuPy, as a user meets it; then in that process
    every verb that needs CuPy, and an op."""
    r = subprocess.run([sys.executable, "-c", NO_CUPY + "import runpy; runpy.run_module('cukern.lab', "
                        "run_name='__main__', alter_sys=True)", "info"], capture_output=True, text=True, timeout=300)
    assert_one_line_error(r, "cukern info: " + NEEDS_CUPY, "cuda13")
    verbs = [["compile", "--family", "rotary"], ["explain", "sum"], ["bench"], ["ladder"], ["tune"], ["roofline"]]
    script = NO_CUPY + f"""
import contextlib, io, json
import numpy as np
import cukern
from cukern.lab import cli
answers = []
for argv in {verbs!r}:
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        answers.append((cli.main(argv), err.getvalue()))
try:
    cukern.sum(np.ones(3))
except ModuleNotFoundError as e:
    answers.append((2, str(e)))
print(json.dumps(answers))
"""
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    answers = json.loads(r.stdout.splitlines()[-1])
    for argv, answer in zip(verbs + [["cukern.sum"]], answers):
        assert_one_line_error(tuple(answer), NEEDS_CUPY)


def test_a_mistake_is_one_line_as_a_user_sees_it():
    """What the in-process mistakes cannot show: nothing else on stderr (a warning at import, a traceback)
    and exit status 2 through ``python -m cukern.lab`` itself; one mistake stands for them all."""
    assert_one_line_error(cukern("explain", "rms_norm", "--dtype", "bf16"), "'bf16'")


@pytest.mark.parametrize("op, dtype", [("rms_norm", "bf16"), ("rotary_embedding", "float64"), ("sum_of_squares", "complex64"),
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


@pytest.mark.parametrize("card", ["h200", "h100"])
def test_results_file_has_the_documented_form(card):
    path = Path(__file__).resolve().parent.parent / "bench" / "results" / f"{card}.json"
    if not path.exists():
        pytest.skip("no results file yet")
    doc = json.loads(path.read_text())
    assert set(doc) == {"device", "cupy_version", "source_sha256", "peak_copy_gbps", "records"}
    for r in doc["records"]:
        if r["op"].startswith("host_overhead"):  # host time only: no bytes
            assert set(r) == {"op", "impl", "shape", "dtype", "median_us"}
        elif r["impl"] == "cukern-tuned":  # names the knobs the tuner chose
            assert set(r) == {"op", "impl", "shape", "dtype", "median_us", "gbps", "pct_of_peak", "knobs"}
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
