"""Every instantiation of every kernel family compiles with NVRTC for sm_80 and sm_90, with no GPU, and the
machine code is what we meant: no spills, no stack, and 16-byte accesses on the vectorized paths."""

import functools
import re

import pytest

from cukern import families
from cukern._compile import compile_program, source_dir, source_sha256

ARCHS = ["sm_80", "sm_90"]


@functools.lru_cache(maxsize=None)
def compiled(source: str, arch: str):
    fam = next(f for f in families.all_families() if f.SOURCE == source)
    return families.compile_family(fam, arch)


SOURCES = [f.SOURCE for f in families.all_families()]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("source", SOURCES)
def test_every_instantiation_compiles_without_spills(source, arch):
    c = compiled(source, arch)
    fam = next(f for f in families.all_families() if f.SOURCE == source)
    res = c.resources()
    for inst in fam.instantiations():
        r = res[c.lowered[inst.expression]]
        assert r["spill_stores"] == 0 and r["spill_loads"] == 0 and r["stack"] == 0, (inst.expression, r)
    assert ".local" not in c.ptx


@pytest.mark.parametrize("arch", ARCHS)
def test_rms_norm_vector_path_uses_16_byte_accesses(arch):
    from cukern import rmsnorm
    from cukern._dtypes import BFLOAT16

    c = compiled("rms_norm", arch)
    for fused in (False, True):
        vec = rmsnorm.plan(4096, 1, 8, 2, fused=fused).instantiation(BFLOAT16, BFLOAT16, fused)
        body = c.kernel_ptx(vec)
        assert "ld.global.v4.u32" in body and "st.global.v4.u32" in body
        scalar = rmsnorm.plan(4095, 1, 1, 2, fused=fused).instantiation(BFLOAT16, BFLOAT16, fused)
        assert "ld.global.v4" not in c.kernel_ptx(scalar)


def test_sources_are_found_and_hashed():
    assert (source_dir() / "rms_norm.cu").is_file()
    assert re.fullmatch(r"[0-9a-f]{64}", source_sha256())


def test_a_broken_kernel_reports_the_nvrtc_log(tmp_path, monkeypatch):
    import cukern._compile as comp

    monkeypatch.setattr(comp, "read_source", lambda name: "__global__ void k() { undefined_thing; }")
    with pytest.raises(RuntimeError, match="undefined_thing"):
        compile_program("broken", [], "sm_90")
