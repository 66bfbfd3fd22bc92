"""cukern/_convert.py and cuda_src/convert.cu: the element-wise steps on results that CuPy would flush to zero.
On the host: the struct, the plan of a call's launches, the kernels' code (no flush, no local memory). On a
GPU: each step against NumPy on subnormal values and views, and the ops that use them (nanmean, one-element
reductions, float32 results of float64 reductions and scans) against NumPy and the emulators."""

from __future__ import annotations

import math

import numpy as np
import pytest
from _support import same_bits, struct_fields

from cukern import _convert as C
from cukern._dtypes import BFLOAT16
from cukern._compile import compile_program


def test_params_match_the_struct():
    assert struct_fields(C.SOURCE, "ConvertParams") == C.PARAMS.fields


@pytest.mark.parametrize("arch", ("compute_80", "compute_90"))  # the PTX; the machine code: .ci/run, no local memory
def test_kernels_compile_without_flush_or_local_memory(arch):
    c = compile_program(C.SOURCE, C.instantiations(), arch)
    assert ".ftz" not in c.ptx and ".local" not in c.ptx
    assert all(op in c.ptx for op in ("cvt.rn.f32.f64", "cvt.f64.f32", "cvt.rn.bf16.f32", "mul.rn.f32", "abs.f32",
                                      "cvt.rz.f32.f64", "cvt.rz.f32.s64", "cvt.rz.f32.u64"))
    assert "cvt.rn.f64.s64" not in c.ptx and "cvt.rn.f64.u64" not in c.ptx  # no integer rounds through double


def test_plan_collapses_axes_and_keeps_views():
    (only,) = C.plan((3, 4), (4, 1), (4, 1))  # contiguous in both: one axis of 12
    assert only[:2] == (0, 0) and (only[2]["n"], only[2]["d3"], only[2]["x3"], only[2]["o3"]) == (12, 12, 1, 1)
    (t,) = C.plan((3, 4), (1, 3), (4, 1))  # a transposed source
    assert (t[2]["d2"], t[2]["d3"], t[2]["x2"], t[2]["x3"], t[2]["o2"], t[2]["o3"]) == (3, 4, 1, 3, 4, 1)
    (r,) = C.plan((5,), (-1,), (1,))  # reversed: the stride stays negative, the offset is the first element's
    assert r[:2] == (0, 0) and r[2]["x3"] == -1
    (b,) = C.plan((2, 3), (0, 1), (3, 1))  # broadcast rows
    assert (b[2]["x2"], b[2]["x3"]) == (0, 1)
    assert C.plan((0, 4), (4, 1), (4, 1)) == []
    (scalar,) = C.plan((), (), ())
    assert scalar[2]["n"] == 1


def test_plan_takes_leading_axes_one_index_at_a_time():
    shape = (2, 3, 2, 2, 2, 2)
    x = tuple(s * 2 for s in (48, 16, 8, 4, 2, 1))  # every other element: no axis merges with the next in x
    o = (1, 2, 6, 12, 24, 48)  # F order: none merges in out either
    launches = C.plan(shape, x, o)
    assert len(launches) == 6 and all(f["n"] == 16 for _, _, f in launches)
    assert [(xo, oo) for xo, oo, _ in launches] == [(i * 96 + j * 32, i + 2 * j) for i in range(2) for j in range(3)]


def test_only_the_flushing_pairs_have_kernels():
    f32, f64, c64, c128 = (np.dtype(t) for t in (np.float32, np.float64, np.complex64, np.complex128))
    for a, b in ((c128, c64), (f64, f32), (c64, c128), (f32, f64), (f32, BFLOAT16), (BFLOAT16, f32), (BFLOAT16, f64),
                 (f64, BFLOAT16)):
        assert C._key(a, b) == (C._PART.get(a, a), C._PART.get(b, b), C.VALUE)
    # a real value into complex: into the real parts (float32 into complex128 through cvt.f64.f32)
    assert C._key(f32, c128) == (f32, f64, C.VALUE) and C._key(BFLOAT16, c64) == (BFLOAT16, f32, C.VALUE)
    assert C._key(f64, c64) == (f64, f32, C.VALUE) and C._key(f32, c64) is None  # a move: nothing flushes
    assert C._key(f32, np.bool_) == (f32, np.dtype(np.bool_), C.NONZERO) and C._key(f64, np.bool_) is None
    assert C._key(c64, np.bool_) == (f32, np.dtype(np.bool_), C.NONZERO) and C._key(c128, np.bool_) is None
    for t in (np.int8, np.uint16, np.int64, np.uint64):  # integers into bfloat16 in the kernel, no temporary
        assert C._key(t, BFLOAT16) == (np.dtype(t), BFLOAT16, C.VALUE)
    assert C._key(np.int64, f32) is None  # CuPy's int64 -> float32 rounds once, and nothing is subnormal
    f16 = np.dtype(np.float16)  # no float32 value that rounds to float16 or comes from it can be subnormal
    assert C._key(f64, f16) is None and C._key(f32, f16) is None and C._key(c64, f32) is None


def _exact_bfloat16(v) -> float:
    """The bfloat16 nearest ``v`` (a float or an int; ties to even), by exact arithmetic: 8 significant bits,
    exponents down to -126 (then subnormal steps of 2^-133), past the largest finite value infinity."""
    from fractions import Fraction

    if not math.isfinite(v) or v == 0:
        return v
    a = Fraction(abs(v))
    e = a.numerator.bit_length() - a.denominator.bit_length()
    e += a >= Fraction(2) ** e  # frexp's exponent, 2^(e-1) <= a < 2^e, of the exact value
    step = Fraction(2) ** (max(e - 1, -126) - 7)
    q, rest = divmod(a, step)
    q += rest > step / 2 or (rest == step / 2 and q % 2 == 1)
    r = float(q * step)
    return math.copysign(math.inf if r >= 2.0**128 - 2.0**119 else r, v)


def test_float64_to_bfloat16_rounds_once():
    """convert.cu's round to odd through float32, then to nearest even (reference.to_bfloat16 on the host)
    is one rounding: exact arithmetic agrees, where float32 then bfloat16 (CuPy's way, and ml_dtypes' before
    0.7) rounds a value just past a midpoint down to it."""
    from cukern import reference

    rng = np.random.default_rng(7)
    mid = 1.0 + np.arange(1, 128) / 128 + 2.0**-8  # halfway between bfloat16 neighbours in [1, 2)
    v = np.concatenate([mid, mid + 2.0**-30, mid - 2.0**-30, np.ldexp(mid + 2.0**-30, rng.integers(-140, 120, 127)),
                        rng.standard_normal(2000) * 10.0 ** rng.integers(-45, 39, 2000),
                        [0.0, -0.0, np.inf, -np.inf, 3.4e38, 3.5e38, 1e39, 1e-39, 1e-45, 5e-46, 2.0**-134 * 1.5]])
    want = np.array([_exact_bfloat16(float(t)) for t in v]).astype(np.float32).astype(BFLOAT16)
    assert same_bits(reference.to_bfloat16(v), want)
    assert np.isnan(reference.to_bfloat16(np.array([np.nan])).astype(np.float32)).all()
    with np.errstate(over="ignore"):
        assert not same_bits(v.astype(np.float32).astype(BFLOAT16), want)  # the two roundings differ here


def test_integers_to_bfloat16_round_once():
    """64-bit integers past 2^53 too: through float64 they would round twice (2^60 + 2^52 + 1 onto the midpoint
    2^60 + 2^52, then to even, down), where exact arithmetic and NumPy with ml_dtypes 0.7 round up."""
    from cukern import reference

    rng = np.random.default_rng(9)
    for t in (np.int64, np.uint64, np.int32, np.uint8):
        info = np.iinfo(t)
        odd = [2**60 + 2**52 + 1, 2**60 + 2**52 - 1, 2**54 + 2**46 + 1] if info.bits == 64 else []
        v = np.concatenate([rng.integers(info.min, info.max, 3000, t, endpoint=True),
                            np.array([info.min, info.max, 0, 1, *odd], t)])
        want = np.array([_exact_bfloat16(int(i)) for i in v]).astype(np.float32).astype(BFLOAT16)
        assert same_bits(reference.to_bfloat16(v), want), t
    assert float(reference.to_bfloat16(np.int64(2**60 + 2**52 + 1))) == 2.0**60 + 2.0**53


def _tiny(rng, shape):
    """float64 values across float32's subnormal range (and a few normal and zero ones), both signs."""
    v = np.ldexp(rng.random(shape) + 0.5, rng.integers(-152, -120, shape)) * rng.choice([-1.0, 1.0], shape)
    v.reshape(-1)[::7] = 0.0
    return v


@pytest.mark.gpu
def test_conversions_keep_subnormals_in_any_view():
    import cupy

    rng = np.random.default_rng(1)
    v = _tiny(rng, (37, 41))
    for host in (v, v[::-1], v.T, v[:, 1::3]):
        got = C.astype(cupy.asarray(host), np.float32)
        assert got.flags.c_contiguous and same_bits(got, host.astype(np.float32))
    out = cupy.full((41, 37), 7.0, np.float32)
    C.copyto(out.T, cupy.asarray(v))
    assert same_bits(out, v.T.astype(np.float32))
    row = cupy.full((4, 41), 7.0, np.float32)
    C.copyto(row, cupy.asarray(v[0]))  # broadcast
    assert same_bits(row, np.broadcast_to(v[0].astype(np.float32), (4, 41)))
    z = v[:, :20] + 1j * v[:, 20:40]
    assert same_bits(C.astype(cupy.asarray(z), np.complex64), z.astype(np.complex64))


@pytest.mark.gpu
def test_real_into_complex_keeps_subnormals():
    """A real float into complex: its value into the real parts through the kernel, the imaginary parts zeroed
    (float32 into complex128 went through CuPy's flushing cvt.f64.f32); float32 and bfloat16 into bool."""
    import cupy

    t = _tiny(np.random.default_rng(4), (23, 9))
    for src, dst in ((np.float32, np.complex128), (np.float64, np.complex64), (BFLOAT16, np.complex64),
                     (BFLOAT16, np.complex128), (np.float32, np.complex64)):
        host = (t if src == np.float64 else t.astype(np.float32).astype(src))[::-1, 1::2]
        want = host.astype(np.float32).astype(dst) if src == BFLOAT16 else host.astype(dst)
        assert same_bits(C.astype(cupy.asarray(host), dst), want), (src, dst)
        out = cupy.full((4, 23), 7 + 7j, dst)
        C.copyto(out.T, cupy.asarray(host))
        assert same_bits(out, want.T), (src, dst)
    for src in (np.float32, BFLOAT16):
        host = t.astype(np.float32).astype(src)
        assert np.array_equal(C.astype(cupy.asarray(host), np.bool_).get(), host.astype(np.float64) != 0), src


@pytest.mark.gpu
def test_float64_and_integers_into_bfloat16_round_once():
    """float64 and integer values into bfloat16 rounded once (reference.to_bfloat16), subnormals kept (CuPy's
    own conversion goes through float32, rounding twice, and flushes)."""
    import cupy

    import cukern
    from cukern import reference

    rng = np.random.default_rng(8)
    mid = 1.0 + np.arange(1, 128) / 128 + 2.0**-8  # halfway between bfloat16 neighbours, then nudged up
    v = np.concatenate([mid + 2.0**-30, _tiny(rng, (500,)), rng.standard_normal(500) * 1e30])
    for host in (v, v[::-3]):
        assert same_bits(C.astype(cupy.asarray(host), BFLOAT16), reference.to_bfloat16(host))
    out = cupy.zeros((2, v.size), BFLOAT16)
    C.copyto(out[1], cupy.asarray(v))
    assert same_bits(out[1], reference.to_bfloat16(v)) and same_bits(out[0], np.zeros(v.size, BFLOAT16))
    ints = np.array([2**24 + 2**16 + 1, -(2**30 + 2**22 + 3), 7, 0, 2**40 + 2**32 + 1, 2**60 + 2**52 + 1,
                     -(2**62 + 2**54 + 1), 2**63 - 1, -(2**63)], np.int64)
    for t in (np.int64, np.uint64, np.int32, np.uint8):
        host = ints.astype(t)
        assert same_bits(C.astype(cupy.asarray(host), BFLOAT16), reference.to_bfloat16(host)), t
    x = ints[:3].repeat(700)
    assert same_bits(cukern.cumsum(cupy.asarray(x), dtype=BFLOAT16), reference.cumsum_emulated(x, None, BFLOAT16))


@pytest.mark.gpu
def test_complex_with_subnormal_parts_is_not_zero():
    """complex64 into bool, and the counts and truth tests of complex x, test each part against zero through
    the kernel (CuPy's complex != flushed a subnormal part, so 1e-40j was zero)."""
    import cupy

    import cukern

    t = _tiny(np.random.default_rng(5), (2, 31, 17)).astype(np.float32)
    t[1, ::3] = 0.0
    z = (t[0] + 1j * t[1]).astype(np.complex64)
    z[5] = 0
    want = z != 0
    assert np.count_nonzero(want) > np.count_nonzero(want & (np.abs(z.real) >= 2.0**-126))  # subnormal-only ones
    x = cupy.asarray(z)
    assert np.array_equal(C.astype(x, np.bool_).get(), want)
    assert np.array_equal(C.astype(x[::-2, 1::3], np.bool_).get(), want[::-2, 1::3])
    for axis in (None, 0, 1):
        assert np.array_equal(cukern.count_nonzero(x, axis=axis).get(), np.count_nonzero(z, axis=axis)), axis
        assert np.array_equal(cukern.any(x, axis=axis).get(), np.any(z, axis=axis)), axis
        assert np.array_equal(cukern.all(x, axis=axis).get(), np.all(z, axis=axis)), axis


@pytest.mark.gpu
def test_one_element_steps_keep_subnormals():
    import cupy

    rng = np.random.default_rng(2)
    small = np.ldexp(rng.random(300) + 0.5, rng.integers(-72, -64, 300)).astype(np.float32)  # squares subnormal
    a = cupy.asarray(small)
    C.square(a)
    assert same_bits(a, small * small) and np.count_nonzero(small * small) == small.size
    t = _tiny(rng, (300,)).astype(np.float32)
    a = cupy.asarray(t)
    C.absolute(a[::2])
    want = t.copy()
    want[::2] = np.abs(want[::2])
    assert same_bits(a, want)
    b = (small * small).astype(BFLOAT16)  # squares in bfloat16's subnormal range, and absolute values
    a = cupy.asarray(small.astype(BFLOAT16))
    C.square(a)
    assert same_bits(a, (small.astype(BFLOAT16).astype(np.float32) ** 2).astype(BFLOAT16)) and np.count_nonzero(b)
    a = cupy.asarray(t.astype(BFLOAT16))
    C.absolute(a)
    assert same_bits(a, np.abs(t).astype(BFLOAT16))
    for src, dst in ((np.float32, np.float64), (np.float32, BFLOAT16), (BFLOAT16, np.float32), (BFLOAT16, np.float64)):
        host = t[::-3].astype(src)
        assert same_bits(C.astype(cupy.asarray(host), dst), host.astype(dst)), (src, dst)
    z = (t[:150] + 1j * t[150:]).astype(np.complex64)
    assert same_bits(C.astype(cupy.asarray(z), np.complex128), z.astype(np.complex128))
    for host in (t, t.astype(BFLOAT16)):
        for dtype in (np.bool_, np.int64):
            out = cupy.empty(host.shape, dtype)
            C.nonzero(cupy.asarray(host), out)
            assert np.array_equal(out.get(), (host.astype(np.float64) != 0).astype(dtype))


@pytest.mark.gpu
def test_ops_keep_subnormal_results():
    """The ops' steps that went through CuPy: nanmean's conversion, a reduction over axes of one element, a
    float64 reduction or scan into a float32 dtype or out."""
    import cupy

    import cukern
    from cukern import reference

    rng = np.random.default_rng(3)
    t32 = _tiny(rng, (64, 33)).astype(np.float32)
    x = cupy.asarray(t32)
    assert same_bits(cukern.nanmean(x, axis=0), reference.nanmean_emulated(t32, axis=0))
    assert np.count_nonzero(reference.nanmean_emulated(t32, axis=0)) > 0
    one = t32[:1]
    for name in ("sum", "sum_of_squares", "norm", "amax"):
        got = getattr(cukern, name)(cupy.asarray(one), axis=0)
        assert same_bits(got, getattr(reference, name + "_emulated")(one, axis=0)), name
    assert np.array_equal(cukern.count_nonzero(cupy.asarray(one), axis=0).get(), np.count_nonzero(one, axis=0))
    t64 = _tiny(rng, (64, 33))
    x64 = cupy.asarray(t64)
    out = cupy.full(33, 7.0, np.float32)
    cukern.sum(x64, axis=0, out=out)
    assert same_bits(out, reference.sum_emulated(t64, axis=0).astype(np.float32))
    assert same_bits(cukern.sum(x64, axis=0, dtype=np.float32), reference.sum_emulated(t64, axis=0, dtype=np.float32))
    for name in ("nanmean", "mean"):
        got = getattr(cukern, name)(cupy.asarray(t32.astype(BFLOAT16)), axis=1)
        assert same_bits(got, getattr(reference, name + "_emulated")(t32.astype(BFLOAT16), axis=1)), name
    assert same_bits(cukern.mean(cupy.asarray(one), axis=0, dtype=np.float64), one[0].astype(np.float64))
    for name in ("sum_of_squares", "norm", "sum"):
        one16 = (one * 2.0**30).astype(BFLOAT16)  # squares near bfloat16's subnormal range
        got = getattr(cukern, name)(cupy.asarray(one16), axis=0)
        assert same_bits(got, getattr(reference, name + "_emulated")(one16, axis=0)), name
    z = (t32[:, :16] + 1j * t32[:, 16:32]).astype(np.complex64)
    assert same_bits(cukern.var(cupy.asarray(z), axis=0), reference.var_emulated(z, axis=0))
    scanned = cukern.cumsum(x64, axis=0, dtype=np.float32)
    assert same_bits(scanned, reference.cumsum_emulated(t64.astype(np.float32), axis=0))  # NumPy: x cast first
