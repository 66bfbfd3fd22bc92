"""Every instantiation of every kernel family compiles with NVRTC for every arch in ``_support.ARCHS``, with
no GPU, and the code is what we meant: no local memory, no spills, no stack, and 16-byte accesses on the
vectorized paths (the other architectures, and the machine code of the largest families: .ci/run)."""

import re

import pytest
from _support import ARCHS, assert_no_spills, checked_instantiations, compiled, ptxas_ran

from cukern import families
from cukern._compile import compile_program, source_dir, source_sha256

SOURCES = list(dict.fromkeys(f.SOURCE for f in families.all_families()))


def test_each_family_has_its_own_source():
    assert len(SOURCES) == len(families.all_families()), [f.__name__ for f in families.all_families()]
    assert families.named("rotary").SOURCE == "rotary"
    with pytest.raises(ValueError, match="no kernel family has source 'nope'"):
        families.named("nope")


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("source", [pytest.param(s, marks=pytest.mark.nvrtc(s)) for s in SOURCES])
def test_every_instantiation_compiles_without_spills(source, arch):
    c = compiled(source, arch)
    assert ".local" not in c.ptx
    assert ".ftz" not in c.ptx  # subnormals kept, as NumPy and the emulators keep them (_compile.OPTIONS)
    if not ptxas_ran(c):
        return  # machine code checked by .ci/run (tests/_support.py, PART)
    res = c.resources()
    for inst in checked_instantiations(source):
        r = res[c.lowered[inst.expression]]
        assert_no_spills(r, arch, inst.expression)


@pytest.mark.nvrtc("rms_norm")
@pytest.mark.parametrize("arch", ARCHS)
def test_rms_norm_vector_path_uses_16_byte_accesses(arch):
    from cukern._dtypes import BFLOAT16

    c = compiled("rms_norm", arch)
    for name in ("rms_norm_rows", "fused_add_rms_norm_rows"):
        bf16 = [i for i in checked_instantiations("rms_norm") if i.name == name and i.args[:2] == (BFLOAT16,) * 2]
        vec = [i for i in bf16 if i.args[2] == 8]
        scalar = [i for i in bf16 if i.args[2] == 1]
        assert vec and scalar, name
        for inst in vec:
            body = c.kernel_ptx(inst)
            assert "ld.global.v4.u32" in body and "st.global.v4.u32" in body, inst.expression
        for inst in scalar:
            assert "ld.global.v4" not in c.kernel_ptx(inst), inst.expression


def test_sources_are_found_and_hashed():
    assert (source_dir() / "rms_norm.cu").is_file()
    assert re.fullmatch(r"[0-9a-f]{64}", source_sha256())


def test_a_broken_kernel_reports_the_nvrtc_log(monkeypatch):
    import cukern._compile as comp

    monkeypatch.setattr(comp, "read_source", lambda name: "__global__ void k() { undefined_thing; }")
    with pytest.raises(RuntimeError, match="undefined_thing"):
        compile_program("broken", [], "sm_90")


def test_run_time_kernels_are_compiled_here_once_and_kept_on_disk(tmp_path, monkeypatch):
    """get_kernel's binaries are compile_program's, with OPTIONS (-ftz=false, where CuPy's RawModule(code=)
    would add -ftz=true): once per sources, options and architecture, then read back."""
    import cukern._compile as comp

    monkeypatch.setenv("CUKERN_CACHE_DIR", str(tmp_path))
    calls = []
    real = comp.compile_program
    monkeypatch.setattr(comp, "compile_program", lambda *a, **k: calls.append(a[2]) or real(*a, **k))
    inst = comp.Instantiation("timing", "hold_stream", ())
    path, lowered = comp.cached_binary(inst, (), "sm_90")
    assert path.parent == tmp_path and path.suffix == ".cubin" and path.read_bytes()[:4] == b"\x7fELF"
    assert lowered.startswith("_ZN6cukern11hold_stream")
    assert comp.cached_binary(inst, (), "sm_90") == (path, lowered)
    ptx, _ = comp.cached_binary(inst, (), "compute_90")
    assert ptx.suffix == ".ptx" and ".entry " + lowered in ptx.read_text()
    assert calls == ["sm_90", "compute_90"]
    assert "-ftz=false" in comp.OPTIONS
    assert sorted(p.suffix for p in tmp_path.iterdir()) == [".cubin", ".name", ".name", ".ptx"]


def test_an_unwritable_cache_falls_back_to_a_directory_of_the_process(tmp_path, monkeypatch):
    import cukern._compile as comp

    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    monkeypatch.setenv("CUKERN_CACHE_DIR", str(blocked))
    monkeypatch.setattr(comp, "_scratch", [])
    path, _ = comp.cached_binary(comp.Instantiation("timing", "hold_stream", ()), (), "compute_90")
    assert path.is_file() and path.parent == comp._scratch[0]


@pytest.mark.gpu
def test_gpu_kernels_keep_subnormal_inputs_and_results():
    """The GPU runs what compile_program makes, which flushes nothing to zero: subnormal float32 inputs and
    results come out as NumPy and the emulators have them (a flush would give 0 in each case below)."""
    import cupy
    import numpy as np

    import cukern
    from cukern import reference
    from cukern._dtypes import BFLOAT16

    tiny = np.full(1000, 2.0**-130, np.float32)  # each subnormal; their sum 1000 * 2^-130 is normal
    got = cukern.sum(cupy.asarray(tiny))
    assert float(got) > 0 and got.get().tobytes() == reference.sum_emulated(tiny).tobytes()
    ladder = np.array([2.0**-140, 2.0**-135, 2.0**-138, -(2.0**-133)], np.float32)
    assert int(cukern.argmax(cupy.asarray(ladder))) == 1 and int(cukern.argmin(cupy.asarray(ladder))) == 3
    assert float(cukern.amax(cupy.asarray(ladder))) == 2.0**-135
    steps = np.array([2.0**-120, 2.0**-10, 2.0**-5, 2.0**20, 0.75], np.float32)
    prods = cukern.cumprod(cupy.asarray(steps)).get()
    assert prods.tolist() == [2.0**-120, 2.0**-130, 2.0**-135, 2.0**-115, 0.75 * 2.0**-115]
    assert prods.tobytes() == reference.cumprod_emulated(steps).tobytes()
    row = np.full((2, 64), 2.0**-130, np.float32).astype(BFLOAT16)  # y = x / sqrt(eps) or so: normal
    y = cukern.rms_norm(cupy.asarray(row)).get()
    assert (y.astype(np.float32) > 0).all()
    assert y.tobytes() == reference.rms_norm_emulated(row).tobytes()


def test_get_kernel_loads_the_binary_compiled_here(tmp_path, monkeypatch):
    """get_kernel never hands CuPy source to compile (CuPy would add -ftz=true): it loads cached_binary's file
    by path and asks for the lowered name, once per (device, instantiation, options)."""
    import cupy

    import cukern._compile as comp

    monkeypatch.setenv("CUKERN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(comp, "_kernels", {})
    monkeypatch.setattr(comp, "target", lambda device: "compute_90")
    monkeypatch.setattr(cupy.cuda, "Device", lambda *a: type("D", (), {"id": 0})())
    loaded = []

    class Module:
        def __init__(self, code=None, *, path=None, **kw):
            assert code is None and not kw
            loaded.append(path)

        def get_function(self, name):
            return ("kernel", name)

    monkeypatch.setattr(cupy, "RawModule", Module)
    inst = comp.Instantiation("timing", "hold_stream", ())
    first = comp.get_kernel(inst)
    assert comp.get_kernel(inst) is first and len(loaded) == 1
    path, lowered = comp.cached_binary(inst, (), "compute_90")
    assert loaded == [str(path)] and first == ("kernel", lowered)
