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
