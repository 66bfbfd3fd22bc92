"""RMSNorm and fused add + RMSNorm with float8 e4m3fn outputs (static and per-token scales): the conversion
against ml_dtypes, the emulator against the float64 reference (bit for bit but at rounding boundaries, counted
and bounded), planning, the kernels' struct and machine code and the scale checks on the CPU; bytes, scales and
argument checks on the GPU."""

import re

import ml_dtypes
import numpy as np
import pytest
from _support import ARCHS, checked_instantiations, compiled, ptxas_ran, tolerance

from cukern import _tuned, reference, rmsnorm
from cukern._compile import compile_program, read_source
from cukern._dtypes import BFLOAT16, FLOAT_TYPES

F32, F16 = np.dtype(np.float32), np.dtype(np.float16)
FP8 = rmsnorm.FLOAT8_E4M3FN
LOOKUP = _tuned.lookup  # the real one, which the fake GPU below replaces


# ---- the conversion ---------------------------------------------------------------------------------

def _float_sweep():
    """Every float32 whose low 12 bits are one of a few patterns (0, 1, around 0x800, 0xfff): all signs,
    exponents and the top 11 mantissa bits, so every e4m3 rounding midpoint (exactly, and one ulp either
    side), the subnormal steps, 448 and past it, infinities and NaNs."""
    hi = np.arange(2**20, dtype=np.uint64) << 12
    low = np.array([0, 1, 0x7FF, 0x800, 0x801, 0xFFF], np.uint64)
    return (hi[:, None] | low[None, :]).ravel().astype(np.uint32).view(np.float32)


def test_e4m3_bits_are_ml_dtypes_saturating_conversion():
    v = _float_sweep()
    got = reference.float8_e4m3fn_bits(v)
    nan = np.isnan(v)
    with np.errstate(invalid="ignore", over="ignore"):
        want = np.clip(v, -448, 448).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    assert not ((got != want) & ~nan).any()
    assert (got[nan] == 0x7F).all(), "every NaN is 0x7f, whatever its sign or payload"


def test_e4m3_special_values():
    v = np.array([0.0, -0.0, 448.0, -448.0, 464.0, 1e30, np.inf, -np.inf, np.nan, -np.nan, 2.0**-9, 2.0**-10,
                  3 * 2.0**-10, 2.0**-6, 240.0, 1.0, 1.0625, 1.1875, -1.0625], np.float32)
    want = [0x00, 0x80, 0x7E, 0xFE, 0x7E, 0x7E, 0x7E, 0xFE, 0x7F, 0x7F, 0x01, 0x00, 0x02, 0x08, 0x77, 0x38, 0x38,
            0x3A, 0xB8]
    assert reference.float8_e4m3fn_bits(v).tolist() == want


# ---- the emulator against the float64 reference -----------------------------------------------------

def _decoded(codes):
    return np.asarray(codes).view(ml_dtypes.float8_e4m3fn).astype(np.float64)


def _boundary_mismatches(got, want, q32, q64, rtol):
    """Where the emulator's bytes ``got`` differ from the reference's ``want``, check that each difference is a
    rounding boundary: adjacent codes, whose midpoint lies within ``rtol`` (relative) of both the float32 value
    ``q32`` the kernel rounds and the float64 ``q64``. (Either side of it may round either way: q32 and q64
    differ by float32 rounding; q64 may sit exactly on a tie, per-token scales making ``y / s`` a ratio of
    input products; and ml_dtypes converts a float64 through float32, rounding twice.) Returns how many
    there are."""
    differ = (got != want) & ~np.isnan(_decoded(want))
    if not differ.any():
        return 0
    g, w = got[differ].astype(int), want[differ].astype(int)
    assert (np.abs(_decoded(got[differ]) - _decoded(want[differ])) > 0).all()
    assert (((g ^ w) & 0x80) == 0).all() or (np.minimum(g & 0x7F, w & 0x7F) == 0).all(), "a sign differs"
    assert (np.abs((g & 0x7F) - (w & 0x7F)) == 1).all(), "codes more than one step apart"
    mid = (_decoded(got[differ]) + _decoded(want[differ])) / 2
    a, b = q32[differ].astype(np.float64), q64[differ]
    assert (np.abs(a - mid) <= rtol * np.abs(mid)).all() and (np.abs(b - mid) <= rtol * np.abs(mid)).all(), \
        "a difference away from any rounding boundary"
    return int(differ.sum())


@pytest.mark.parametrize("dtype", FLOAT_TYPES, ids=str)
@pytest.mark.parametrize("hidden", [1, 7, 1000, 4095, 4096, 40000])
def test_emulator_is_the_float64_reference_but_at_boundaries(dtype, hidden):
    """Per-token and static scales: the emulated bytes are ml_dtypes' conversion of the float64 reference
    except where a rounding boundary lies between the float32 and float64 values (counted: at most one in
    a thousand, each within the float32 tolerance); the per-token scales are close to float64's."""
    rng = np.random.default_rng(hidden)
    rows = max(2, min(64, 2**17 // hidden))
    x = (rng.standard_normal((rows, hidden)) * 2.0 ** rng.integers(-3, 3, (rows, 1))).astype(dtype)
    w = rng.standard_normal(hidden).astype(dtype)
    rtol = tolerance(F32, hidden)
    y64 = reference.rms_norm(x, w, 1e-6, 0.0)
    got, s32 = reference.rms_norm_fp8_emulated(x, w, 1e-6, 0.0, "per_token")
    want, s64 = reference.rms_norm_fp8(x, w, 1e-6, 0.0, "per_token")
    assert got.dtype == np.uint8 and got.shape == x.shape and s32.dtype == F32 and s32.shape == (rows,)
    assert (np.abs(s32 - s64) <= rtol * s64).all()
    v32, _ = reference.rms_norm_fp8_values_emulated(x, w, 1e-6, 0.0, "per_token")
    n = _boundary_mismatches(got, want, v32, y64 / s64[:, None], rtol)
    assert n <= max(1, x.size // 1000), n
    for scale in (0.01, 0.37, 4.0):
        got = reference.rms_norm_fp8_emulated(x, w, 1e-6, 0.0, scale)
        want = reference.rms_norm_fp8(x, w, 1e-6, 0.0, scale)
        v32, _ = reference.rms_norm_fp8_values_emulated(x, w, 1e-6, 0.0, scale)
        n = _boundary_mismatches(got, want, v32, y64 / np.float64(np.float32(scale)), rtol)
        assert n <= max(1, x.size // 1000), n


def test_per_token_scale_rules():
    """An all-zero row gets 2^-126 and zero bytes; a NaN (or an infinity, whose product with 0 is NaN) makes
    its row's scale NaN and every byte 0x7f; the largest |y| of a row becomes +-448."""
    x = np.zeros((4, 64), np.float32)
    x[1] = np.linspace(-3, 2, 64)
    x[2] = 1.0
    x[2, 5] = np.nan
    x[3, 7] = np.inf
    q, s = reference.rms_norm_fp8_emulated(x, None, 1e-6, 0.0, "per_token")
    assert s[0] == np.float32(2.0**-126) and (q[0] == 0).all()
    assert np.isnan(s[2]) and np.isnan(s[3]) and (q[2:] == 0x7F).all()
    assert q[1, 0] == 0xFE and q[1].view(ml_dtypes.float8_e4m3fn).astype(np.float32).min() == -448


@pytest.mark.parametrize("dtype", FLOAT_TYPES, ids=str)
def test_fused_emulator_is_the_residual_then_the_norm(dtype):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((6, 999)).astype(dtype)
    r = rng.standard_normal((6, 999)).astype(dtype)
    w = rng.standard_normal(999).astype(dtype)
    want_r, _ = reference.fused_add_rms_norm_emulated(x, r, w, 1e-5, 1.0)
    got_r, q, s = reference.fused_add_rms_norm_fp8_emulated(x, r, w, 1e-5, 1.0, "per_token")
    assert got_r.tobytes() == want_r.tobytes()
    q2, s2 = reference.rms_norm_fp8_emulated(want_r, w, 1e-5, 1.0, "per_token")
    assert q.tobytes() == q2.tobytes() and s.tobytes() == s2.tobytes()
    got_r, q = reference.fused_add_rms_norm_fp8_emulated(x, r, w, 1e-5, 1.0, 0.5)
    assert q.tobytes() == reference.rms_norm_fp8_emulated(want_r, w, 1e-5, 1.0, 0.5).tobytes()


# ---- planning, struct, bytes, machine code ------------------------------------------------------------

def test_fp8_kernels_take_the_plans_of_the_plain_ones():
    insts = set(rmsnorm.instantiations())
    t = BFLOAT16
    for hidden, vec in ((7, 1), (128, 8), (4096, 8), (4095, 1), (5120, 8), (65536, 8), (65537, 1)):
        for fused in (False, True):
            p = rmsnorm.plan(hidden, 1, vec, t.itemsize, fused=fused)
            plain, fp8 = p.instantiation(t, t, fused), p.instantiation(t, t, fused, fp8=True)
            assert fp8.name == plain.name.replace("rms_norm_", "rms_norm_fp8_") and fp8.args == plain.args
            assert fp8 in insts and plain in insts
            wide_weight = p.instantiation(t, F32, fused, fp8=True)
            assert wide_weight in insts
    fp8 = [i for i in insts if "fp8" in i.name]
    assert len(fp8) <= 100 and {i.args[0] for i in fp8} == {t}, "keep the float8 table to bfloat16 x"


def test_fp8_params_match_the_struct_the_kernel_declares():
    body = re.search(r"struct RmsNormFp8Params \{(.*?)\};", read_source(rmsnorm.SOURCE), re.DOTALL).group(1)
    kinds = {"long long": "i64", "int": "i32", "float": "f32"}
    fields = []
    for decl in body.split(";")[:-1]:
        kind, names = re.fullmatch(r"\s*(long long|int|float) (.*)", decl, re.DOTALL).groups()
        fields += [(n.strip(), kinds[kind]) for n in names.split(",")]
    assert tuple(fields) == rmsnorm.FP8_PARAMS.fields
    assert rmsnorm.FP8_PARAMS.fields[:len(rmsnorm.PARAMS.fields)] == rmsnorm.PARAMS.fields


def test_fp8_bytes_moved():
    n, rows = 16384 * 4096, 16384
    assert rmsnorm.bytes_moved((16384, 4096), BFLOAT16, BFLOAT16, out_dtype=FP8, per_token=True) == \
        2 * n + n + 4096 * 2 + 4 * rows
    assert rmsnorm.bytes_moved((16384, 4096), BFLOAT16, BFLOAT16, fused=True, out_dtype=FP8, per_token=True) == \
        2 * n * 3 + n + 4096 * 2 + 4 * rows
    assert rmsnorm.bytes_moved((3, 7), F32, out_dtype=FP8) == 21 * 4 + 21


def _fp8_insts(t=BFLOAT16):
    return [rmsnorm.plan(h, 1, v, t.itemsize, fused=f).instantiation(t, t, f, fp8=True)
            for h, v in ((4096, 8), (4095, 1), (65536, 8)) for f in (False, True)]


@pytest.mark.nvrtc("rms_norm")
@pytest.mark.parametrize("arch", ARCHS)
def test_fp8_machine_code(arch):
    """sm_90 converts with cvt.rn.satfinite.e4m3x2 and rounds every other step (no fused multiply-add, nothing
    approximate); no float8 kernel spills."""
    c = compiled("rms_norm", arch)
    res = c.resources()
    for inst in checked_instantiations("rms_norm"):
        if "fp8" not in inst.name:
            continue
        body = c.kernel_ptx(inst)
        assert "cvt.rn.satfinite.e4m3x2.f32" in body, inst.expression
        assert "fma.rn.f32" not in body and ".approx" not in body, inst.expression
        if ptxas_ran(c):  # else .ci/run checks the machine code (tests/_support.py, PART)
            r = res[c.lowered[inst.expression]]
            assert max(r["spill_stores"], r["spill_loads"], r["stack"]) == 0, (inst.expression, r)


def test_fp8_arithmetic_conversion_on_sm_80_and_by_request():
    """sm_80 has no float8 conversion: the arithmetic path, with its max.NaN / min.NaN; -DCUKERN_FP8_SOFTWARE
    selects the same on sm_90 (what the GPU test compares against the instruction). The PTX says it: NVRTC stops
    there (.ci/run compiles the machine code)."""
    insts = _fp8_insts()[:2]
    for arch, options in (("compute_80", ()), ("compute_90", ("-DCUKERN_FP8_SOFTWARE",))):
        c = compile_program(rmsnorm.SOURCE, insts, arch, options)
        for inst in insts:
            body = c.kernel_ptx(inst)
            assert "e4m3" not in body and "min.NaN.f32" in body, (arch, inst.expression)
            assert "fma.rn.f32" not in body and ".approx" not in body


# ---- the scale argument ----------------------------------------------------------------------------

@pytest.mark.parametrize("scale, want", [("per_token", (True, 1.0)), (0.5, (False, 0.5)), (np.float32(3), (False, 3.0)),
                                         (1, (False, 1.0)), (np.array([0.25], np.float32), (False, 0.25)),
                                         (np.array(2.0), (False, 2.0)), (2.0**-126, (False, 2.0**-126)),
                                         (0.1, (False, float(np.float32(0.1))))])
def test_good_scales(scale, want):
    assert rmsnorm._fp8_scale(scale) == want


@pytest.mark.parametrize("scale, err", [(None, TypeError), ("per_row", ValueError), ([1.0], TypeError),
                                        (1j, TypeError), (0.0, ValueError), (-1.0, ValueError),
                                        (float("nan"), ValueError), (float("inf"), ValueError), (1e39, ValueError),
                                        (1e-40, ValueError), (10**400, ValueError), (np.ones(2, np.float32), ValueError),
                                        (np.array(["1"]), TypeError)])
def test_bad_scales(scale, err):
    with pytest.raises(err, match="scale"):
        rmsnorm._fp8_scale(scale)


def test_out_dtype_names():
    assert rmsnorm._is_fp8(ml_dtypes.float8_e4m3fn) and rmsnorm._is_fp8(FP8) and rmsnorm._is_fp8("float8_e4m3fn")
    assert not any(rmsnorm._is_fp8(d) for d in (None, np.uint8, ml_dtypes.float8_e5m2, "bfloat16", BFLOAT16, 3))


# ---- the launch plumbing, with a stand-in for CuPy ---------------------------------------------------

class _Ptr:
    def __init__(self, ptr):
        self.ptr, self.device_id = ptr, 0

    def __add__(self, offset):
        return _Ptr(self.ptr + int(offset))


class _Array:
    """What the float8 call reads of a cupy.ndarray, at an address of our choosing (strides in elements)."""

    def __init__(self, shape, dtype, ptr, strides=None):
        from cukern._layout import contiguous_strides

        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        self.itemsize, self.ndim, self.size = self.dtype.itemsize, len(shape), int(np.prod(shape))
        elems = contiguous_strides(shape) if strides is None else strides
        self.strides = tuple(e * self.itemsize for e in elems)
        self.data, self.device = _Ptr(ptr), type("D", (), {"id": 0})()

    def fill(self, value):
        self.filled = value


@pytest.fixture
def fake_gpu(monkeypatch):
    """rmsnorm's float8 call with CuPy, the device and the launch replaced: returns the launches' list of
    (kernel expression, config, pointer addresses, the packed parameters as a tuple)."""
    from types import SimpleNamespace

    from cukern._launch import CallCache

    launches, heap = [], [1 << 32]

    def empty(shape, dtype):
        heap[0] += 1 << 30
        return _Array(shape, dtype, heap[0])

    def address(a):
        return a.ptr if isinstance(a, _Ptr) else a.data.ptr if isinstance(a, _Array) else int(a)

    def launch(kernel, config, args):
        launches.append((kernel, config, [address(a) for a in args[:-1]], tuple(args[-1][()].tolist())))

    monkeypatch.setattr(rmsnorm, "_cupy", lambda: SimpleNamespace(ndarray=_Array, empty=empty))
    monkeypatch.setattr(rmsnorm, "as_array", lambda a, name, writable=False: a)
    monkeypatch.setattr(rmsnorm._check, "check_same_device", lambda arrays: 0)
    monkeypatch.setattr(rmsnorm, "on_device", lambda device: rmsnorm._NO_SWITCH)
    monkeypatch.setattr(rmsnorm, "sm_count", lambda device: 132)
    monkeypatch.setattr(rmsnorm._tuned, "lookup", lambda rule, *a: rule.default)
    monkeypatch.setattr(rmsnorm, "get_kernel", lambda inst: SimpleNamespace(kernel=inst.expression))
    monkeypatch.setattr(rmsnorm, "struct_argument", lambda struct: struct)
    monkeypatch.setattr(rmsnorm, "launch", launch)
    monkeypatch.setattr(rmsnorm, "_fp8_calls", CallCache())
    return launches


def test_fp8_call_plumbing(fake_gpu):
    """Arguments in the kernel's order, the parameters packed, leading dimensions that do not merge split over
    launches with each array's own byte offsets, repeated calls served from the call cache, empty inputs."""
    x = _Array((16, 4096), BFLOAT16, 1 << 20)
    w = _Array((4096,), BFLOAT16, 1 << 24)
    q, s = rmsnorm.rms_norm(x, w, out_dtype="float8_e4m3fn", scale="per_token")
    (kernel, config, ptrs, params), = fake_gpu
    assert kernel == "cukern::rms_norm_fp8_rows<cukern::bf16, cukern::bf16, 8, 128, 1, 4, 128>"
    assert config.grid == (16,) and ptrs == [q.data.ptr, s.data.ptr, x.data.ptr, w.data.ptr]
    assert q.shape == x.shape and q.dtype == np.uint8 and s.shape == (16,) and s.dtype == F32
    assert params == (16, 16, 0, 4096, 0, 0, 0, 4096, 4096, np.float32(1e-6), 0.0, 0, 0, 0, 1, 1.0)
    rmsnorm.rms_norm(x, w, out_dtype="float8_e4m3fn", scale="per_token")
    assert len(rmsnorm._fp8_calls) == 1 and len(fake_gpu) == 2

    # [3, 2, 3] rows of a [3, 5, 7, 4097] buffer, one element in: three launches of two levels
    x = _Array((3, 2, 3, 4096), BFLOAT16, (1 << 20) + 2, strides=(5 * 7 * 4097, 2 * 7 * 4097, 2 * 4097, 1))
    out = _Array((3, 2, 3, 4096), np.uint8, 1 << 26)
    r = _Array((3, 2, 3, 4096), BFLOAT16, 1 << 28)
    fake_gpu.clear()
    q = rmsnorm.fused_add_rms_norm(x, r, None, 1e-5, offset=1.0, out=out, out_dtype=FP8, scale=0.25)
    assert q is out and len(fake_gpu) == 3
    for i, (kernel, _, ptrs, params) in enumerate(fake_gpu):
        assert kernel == "cukern::fused_add_rms_norm_fp8_wide<cukern::bf16, cukern::bf16, 1, 2, 4, 512>"  # fused, unaligned
        assert ptrs == [out.data.ptr + i * 6 * 4096, 0, r.data.ptr + i * 6 * 4096 * 2, x.data.ptr + i * 5 * 7 * 4097 * 2,
                        0]
        assert params == (6, 3, 12288, 4096, 12288, 4096, 57358, 8194, 4096, np.float32(1e-5), 1.0, 0, 0, 3, 1,
                          0.25)

    fake_gpu.clear()
    q, s = rmsnorm.rms_norm(_Array((4, 0), BFLOAT16, 1 << 20), out_dtype=FP8, scale="per_token")
    assert fake_gpu == [] and s.shape == (4,) and s.filled == 2.0**-126


def test_fp8_knobs_without_and_with_a_cache_entry(fake_gpu, monkeypatch, tmp_path):
    """Without a tuning cache entry rms_norm to float8 caps its grid at 4 waves (measured faster than the bf16
    output's 8) and the fused form keeps the heuristic's 8; an entry of the op (rms_norm, fused_add_rms_norm:
    the float8 forms read those) is taken as it is, even one equal to the heuristic's knobs. The plain op's
    lookup of the same shape does not answer for the float8 one."""
    monkeypatch.setattr(rmsnorm._tuned, "lookup", LOOKUP)
    monkeypatch.setenv("CUKERN_CACHE_DIR", str(tmp_path))
    monkeypatch.setitem(_tuned._device_names, 0, "Fake GPU")
    shape = (16384, 4096)
    x, r = _Array(shape, BFLOAT16, 1 << 20), _Array(shape, BFLOAT16, 1 << 28)
    w = _Array(shape[-1:], BFLOAT16, 1 << 29)

    def grid(fused):
        fake_gpu.clear()
        if fused:
            rmsnorm.fused_add_rms_norm(x, r, w, out_dtype=FP8, scale="per_token")
        else:
            rmsnorm.rms_norm(x, w, out_dtype=FP8, scale="per_token")
        (_, config, _, _), = fake_gpu
        return config.grid

    def planned(waves, fused):
        return (rmsnorm.plan(4096, 16384, 8, 2, 132, rmsnorm.Knobs(waves=waves), fused=fused).grid,)

    assert planned(4, False) != planned(8, False)
    _tuned.reset()
    try:
        assert _tuned.lookup(rmsnorm.TUNING[False], 0, BFLOAT16, shape) == rmsnorm.Knobs(waves=8)
        assert grid(False) == planned(4, False) and grid(True) == planned(8, True)
        cache = _tuned.TuningCache()
        for op in ("rms_norm", "fused_add_rms_norm"):
            cache.put({"device": "Fake GPU", "op": op, "dtype": "bfloat16", "bucket": "hidden=4096,rows<=16384",
                       "knobs": {"items_target": 4, "small_block": 128, "waves": 8}})
        cache.save()
        _tuned.reset()
        assert grid(False) == planned(8, False) and grid(True) == planned(8, True)
        with _tuned.heuristic_only():
            assert grid(False) == planned(4, False) and grid(True) == planned(8, True)
    finally:
        _tuned.reset()


# ---- on the GPU ---------------------------------------------------------------------------------------

@pytest.fixture
def rng():
    return np.random.default_rng(0)


def _spread(rng, shape, dtype):
    import cupy as cp

    return cp.asarray((rng.standard_normal(shape) * 2.0 ** rng.integers(-12, 12, shape)).astype(dtype))


def _same(got, want):
    got = got.get() if hasattr(got, "get") else np.asarray(got)
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.dtype, want.shape)
    if got.dtype == F32:
        nan = np.isnan(want)
        assert np.array_equal(np.isnan(got), nan)
        got, want = np.where(nan, 0, got), np.where(nan, 0, want)
    differ = np.ascontiguousarray(got).view(np.uint8) != np.ascontiguousarray(want).view(np.uint8)
    assert not differ.any(), f"{int(differ.sum())} bytes differ; first at {np.argwhere(differ)[0]}"


def _call(fused, x, r, w, scale, **kw):
    kw = {"out_dtype": FP8, "scale": scale, **kw}
    if fused:
        return rmsnorm.fused_add_rms_norm(x, r, w, 1e-5, offset=0.5, **kw)
    return rmsnorm.rms_norm(x, w, 1e-5, offset=0.5, **kw)


def _want(fused, x, r, w, scale):
    if fused:
        return reference.fused_add_rms_norm_fp8_emulated(x, r, w, 1e-5, 0.5, scale)
    out = reference.rms_norm_fp8_emulated(x, w, 1e-5, 0.5, scale)
    return (None,) + (out if isinstance(out, tuple) else (out,))


# bfloat16 over every kernel shape (rows of sub-warp groups and of whole blocks, the wide kernel from 16392
# elements, element paths at odd sizes), float16 and float32 at a few, and float32 weights of bfloat16 x
# (wider loads: a lower register bound in the rows kernels); each case compiles two kernels.
FP8_CASES = [(BFLOAT16, BFLOAT16, h) for h in (7, 127, 4095, 4096, 16384, 20480, 65537)] + \
    [(F16, F16, 4096)] + [(F32, F32, h) for h in (1, 4096, 20480)] + [(BFLOAT16, F32, h) for h in (127, 4096, 20480)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,wdtype,hidden", FP8_CASES, ids=str)
def test_fp8_bits_are_the_emulators(dtype, wdtype, hidden, rng):
    """Both ops, per-token and static scales, weighted: the emulator's bytes, scales and residual, on the
    rows kernel and the wide one, vector and element paths."""
    import cupy as cp

    rows = max(1, min(64, 2**19 // hidden))
    x = _spread(rng, (rows, hidden), dtype)
    w = cp.asarray(rng.standard_normal(hidden).astype(wdtype))
    for fused in (False, True):
        for scale in ("per_token", 0.03):
            r = _spread(rng, (rows, hidden), dtype) if fused else None
            want = _want(fused, x, r, w, scale)
            got = _call(fused, x, r, w, scale)
            got = got if isinstance(got, tuple) else (got,)
            for g, wnt in zip(got, want[1:]):
                _same(g, wnt)
            if fused:
                _same(r, want[0])


@pytest.mark.gpu
def test_fp8_instruction_and_arithmetic_agree(monkeypatch, rng):
    """The same calls compiled with cvt.rn.satfinite.e4m3x2 and with -DCUKERN_FP8_SOFTWARE give the same bytes,
    and the emulator's, over float32 rows of any bit pattern (finite), scales that reach the subnormal
    steps and saturation, and rows with an infinity or a NaN."""
    import cupy as cp

    from cukern import _compile

    bits = rng.integers(0, 2**32, (512, 4096), dtype=np.uint64).astype(np.uint32)
    bits &= ~np.uint32(0x40000000)  # exponents under 2^0: no square overflows
    x = bits.view(np.float32)
    x[3, 9], x[4, 1] = np.inf, np.nan
    xg = cp.asarray(x)
    outs = []
    for options in ((), ("-DCUKERN_FP8_SOFTWARE",)):
        monkeypatch.setattr(rmsnorm, "get_kernel", lambda inst, o=options: _compile.get_kernel(inst, o))
        outs.append([rmsnorm.rms_norm(xg, None, 0.0, out_dtype=FP8, scale=s) for s in ("per_token", 2.0**-8, 2.0**8)])
    for s, hw, sw in zip(("per_token", 2.0**-8, 2.0**8), *outs):
        want = reference.rms_norm_fp8_emulated(x, None, 0.0, 0.0, s)
        want = want if isinstance(want, tuple) else (want,)
        hw, sw = (hw, sw) if isinstance(hw, tuple) else ((hw,), (sw,))
        for h, w_, e in zip(hw, sw, want):
            _same(h, e)
            _same(w_, e)


@pytest.mark.gpu
@pytest.mark.parametrize("fused", [False, True])
def test_fp8_bits_do_not_depend_on_knobs_layout_or_rows(fused, rng):
    """Every knob point on a misaligned view (element path), the aligned copy (16-byte path), a negative-stride
    view, leading dimensions that do not merge (two levels), a strided uint8 out and a row alone: the same
    bytes and scales."""
    import itertools

    import cupy as cp

    base = _spread(rng, (2, 40, 4097), BFLOAT16)
    w = cp.asarray(rng.standard_normal(4096).astype(BFLOAT16))
    r0 = _spread(rng, (2, 40, 4096), BFLOAT16)
    x = base[:, :, 1:]
    want = _want(fused, x, r0, w, "per_token")
    views = [x, x.copy(), base[:, ::-1, 1:].copy()[:, ::-1], base[:, ::3, 1:]]
    for i, v in enumerate(views):
        rows = (slice(None), slice(None, None, 3)) if i == 3 else (slice(None), slice(None))
        for values in itertools.product(*rmsnorm.SPACE.values()) if i == 0 else [None]:
            knobs = None if values is None else rmsnorm.Knobs(**dict(zip(rmsnorm.SPACE, values)))
            r = r0[rows].copy() if fused else None
            out = cp.empty(v.shape, np.uint8)
            q, s = rmsnorm._run_fp8(fused, v, r, w, 1e-5, 0.5, out, FP8, "per_token", knobs)
            _same(q, want[1][rows])
            _same(s, want[2][rows])
            if fused:
                _same(r, want[0][rows])
    wide = cp.zeros((2, 40, 8192), np.uint8)
    q, s = _call(fused, x, r0.copy() if fused else None, w, "per_token", out=wide[:, :, 4096:])
    _same(wide[:, :, 4096:], want[1])
    assert not wide[:, :, :4096].any()
    q, s = _call(fused, x[1, 7:8], r0[1, 7:8].copy() if fused else None, w, "per_token")
    _same(q, want[1][1, 7:8])
    _same(s, want[2][1, 7:8])


@pytest.mark.gpu
def test_fp8_close_to_the_float64_reference(rng):
    """On the GPU as on the host: ml_dtypes' bytes of the float64 reference but at rounding boundaries."""
    import cupy as cp

    x = cp.asarray(rng.standard_normal((256, 4095)).astype(BFLOAT16))
    w = cp.asarray(rng.standard_normal(4095).astype(BFLOAT16))
    q, s = rmsnorm.rms_norm(x, w, out_dtype=FP8, scale="per_token")
    want, s64 = reference.rms_norm_fp8(x, w, 1e-6, 0.0, "per_token")
    v32, s32 = reference.rms_norm_fp8_values_emulated(x, w, 1e-6, 0.0, "per_token")
    assert s.get().tobytes() == s32.tobytes()
    rtol = tolerance(F32, 4095)
    n = _boundary_mismatches(q.get(), want, v32, reference.rms_norm(x.get(), w.get()) / s64[:, None], rtol)
    assert n <= q.size // 1000


@pytest.mark.gpu
def test_fp8_empty_and_special_rows():
    import cupy as cp

    for shape in ((0, 4096), (4, 0), (0,)):
        x = cp.empty(shape, dtype=BFLOAT16)
        q, s = rmsnorm.rms_norm(x, out_dtype=FP8, scale="per_token")
        assert q.shape == shape and q.dtype == np.uint8 and s.shape == shape[:-1]
        assert bool((s == np.float32(2.0**-126)).all())
        assert rmsnorm.fused_add_rms_norm(x, cp.empty_like(x), out_dtype=FP8, scale=1.0).shape == shape
    x = cp.zeros((3, 256), BFLOAT16)
    x[1, 4] = np.nan
    q, s = rmsnorm.rms_norm(x, out_dtype=FP8, scale="per_token")
    assert float(s[0]) == 2.0**-126 and not bool(q[0].any()) and bool(cp.isnan(s[1])) and bool((q[1] == 0x7F).all())
    ones = cp.asarray(np.ones((1, 256), BFLOAT16))
    q = rmsnorm.rms_norm(ones, out_dtype="float8_e4m3fn", scale=cp.asarray([2.0**-9], np.float32))
    assert bool((q == 0x7E).all()), "1 / 2^-9 saturates to 448"


@pytest.mark.gpu
@pytest.mark.parametrize("fused", [False, True])
def test_fp8_bad_inputs_raise_before_launch(fused):
    import cupy as cp

    x = cp.ones((4, 64), np.float32)
    r = cp.full((4, 64), 2.0, np.float32)
    before = r.copy()
    out = cp.zeros((8, 64), np.uint8)  # its even rows: a strided out, which is allowed

    def run(**kw):
        kw = {"out_dtype": FP8, "scale": "per_token", **kw}
        return rmsnorm.fused_add_rms_norm(x, r, **kw) if fused else rmsnorm.rms_norm(x, **kw)

    bad = [({"scale": None}, TypeError, "scale"), ({"scale": 0.0}, ValueError, "scale"),
           ({"scale": float("nan")}, ValueError, "scale"), ({"scale": -2.0}, ValueError, "scale"),
           ({"scale": cp.asarray([0.0], np.float32)}, ValueError, "scale"),
           ({"scale": cp.ones(2, np.float32)}, ValueError, "scale"), ({"scale": "dynamic"}, ValueError, "scale"),
           ({"out_dtype": np.float16}, TypeError, "out_dtype"), ({"out_dtype": None, "scale": 1.0}, TypeError, "scale"),
           ({"out_dtype": np.float32, "scale": 1.0}, TypeError, "scale"),
           ({"out": cp.zeros((4, 64), np.int8)}, TypeError, "uint8"), ({"out": cp.zeros((4, 63), np.uint8)}, ValueError, "shape"),
           ({"out": x.view(np.uint8)[:, :64]}, ValueError, "overlaps"), ({"out": out[::2]}, None, None),
           ({"eps": float("nan")}, ValueError, "eps"), ({"offset": None}, TypeError, "offset")]
    for kwargs, err, match in bad:
        if err is None:
            run(**kwargs)
            r[...] = before
            continue
        with pytest.raises(err, match=match):
            run(**kwargs)
        assert bool((r == before).all()), kwargs
    assert not bool(out[1::2].any())
    assert rmsnorm.rms_norm(x, out_dtype=np.float32) is not None  # x's own dtype: the plain call


def test_a_scale_on_the_gpu_is_refused_while_capturing(fake_gpu, monkeypatch):
    """A static scale in a GPU array is read to the host (a wait a CUDA-graph capture cannot make): refused
    with a RuntimeError before it is read or anything is launched; read as it is otherwise."""
    from types import SimpleNamespace

    stream = SimpleNamespace(capturing=True)
    stream.is_capturing = lambda: stream.capturing
    fake = SimpleNamespace(ndarray=_Array, empty=rmsnorm._cupy().empty,
                           cuda=SimpleNamespace(get_current_stream=lambda: stream))
    monkeypatch.setattr(rmsnorm, "_cupy", lambda: fake)
    reads = []

    class Scale(_Array):
        def get(self):
            reads.append(self)
            return np.array([0.5], np.float32)

    x, scale = _Array((16, 4096), BFLOAT16, 1 << 20), Scale((1,), F32, 1 << 24)
    with pytest.raises(RuntimeError, match="pass the scale as a number"):
        rmsnorm.rms_norm(x, out_dtype=FP8, scale=scale)
    assert reads == [] and fake_gpu == []
    stream.capturing = False
    rmsnorm.rms_norm(x, out_dtype=FP8, scale=scale)
    assert reads == [scale] and fake_gpu[0][3][-1] == 0.5


@pytest.mark.gpu
def test_a_gpu_scale_is_refused_under_capture(rng):
    """A static scale in a CuPy array is read to the host: under capture a RuntimeError before anything is
    recorded or allocated, the capture left valid (tests/_support.py `refused_in_capture`)."""
    import cupy as cp

    from _support import refused_in_capture, same_bits

    x = cp.asarray(rng.standard_normal((4, 256)).astype(BFLOAT16))
    scale = cp.asarray([0.5], np.float32)
    cp.cuda.Device().synchronize()  # made on the null stream, which the non-blocking stream does not wait for
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        eager = rmsnorm.rms_norm(x, out_dtype=FP8, scale=scale)
        assert same_bits(eager, rmsnorm.rms_norm(x, out_dtype=FP8, scale=0.5))
    refused_in_capture(stream, lambda: rmsnorm.rms_norm(x, out_dtype=FP8, scale=scale), "pass the scale as a number")


@pytest.mark.filterwarnings("ignore:Mean of empty slice", "ignore:invalid value encountered")
def test_empty_rows_have_the_least_scale():
    """Rows of no element: no bytes, and per token the scale 2^-126 (the op fills it), not the NaN an
    empty row's inverse RMS would give."""
    q, s = reference.rms_norm_fp8_emulated(np.zeros((3, 0), np.float32))
    assert q.shape == (3, 0) and s.dtype == np.float32 and (s == np.float32(2.0**-126)).all()
    assert (reference.rms_norm_fp8(np.zeros((3, 0)))[1] == 2.0**-126).all()
