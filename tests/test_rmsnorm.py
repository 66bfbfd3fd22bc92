"""RMSNorm and fused add + RMSNorm: planning and argument checks on the CPU, numerics on the GPU
(compilation: tests/test_compile.py)."""

import math

import numpy as np
import pytest
from _support import assert_close, tolerance

from cukern import reference, rmsnorm
from cukern._dtypes import BFLOAT16
from cukern._layout import ArraySpec, contiguous_strides

F32, F16 = np.dtype(np.float32), np.dtype(np.float16)
DTYPES = [F32, F16, BFLOAT16]
HIDDEN = [7, 127, 1000, 4095, 4096, 5120, 8192, 65536]


# ---- planning (pure, CPU) -------------------------------------------------------------------------

@pytest.mark.parametrize("hidden", [1, 2, 7, 64, 127, 128, 1000, 4095, 4096, 5120, 8192, 32768, 65536, 10**6])
@pytest.mark.parametrize("vec", [1, 4, 8])
def test_plan_covers_the_row(hidden, vec):
    if hidden % vec:
        pytest.skip("vec must divide hidden")
    p = rmsnorm.plan(hidden, 1000, vec, 16 // vec if vec > 1 else 2, 132)
    assert p.block % 32 == 0 and p.block <= 1024
    if p.kernel == "rows":
        assert p.tpr * p.items * p.vec >= hidden
        assert p.items * 16 <= rmsnorm.MAX_BYTES or p.vec == 1
        assert p.tpr <= 32 or p.tpr == p.block
        assert p.grid == math.ceil(1000 / p.rows_per_block)
    else:
        assert p.rows_per_block == 1 and p.grid == 1000


def test_plan_is_independent_of_row_count():
    """Batch invariance starts here: everything but the grid is a function of the row length."""
    for hidden in (7, 128, 4096, 8192, 100000):
        plans = {rmsnorm.plan(hidden, rows, 1, 2, 132).instantiation(F32, F32, False) for rows in (1, 3, 257, 10**7)}
        assert len(plans) == 1


def test_plan_grid_cap_uses_sm_count():
    p = rmsnorm.plan(4096, 10**6, 8, 2, 132, rmsnorm.Knobs(waves=2))
    assert p.grid == 2 * 132 * (2048 // p.block)


def test_plan_rejects_bad_vec():
    with pytest.raises(ValueError):
        rmsnorm.plan(4095, 1, 8, 2)


def test_instantiations_are_generated_from_the_planner():
    insts = rmsnorm.instantiations()
    exprs = {i.expression for i in insts}
    assert len(exprs) == len(insts)
    assert rmsnorm.plan(4096, 1, 8, 2).instantiation(BFLOAT16, BFLOAT16, False).expression in exprs
    assert "cukern::fused_add_rms_norm_wide<float, float, 4, 4, 512>" in exprs
    for h in (7, 4096, 65536, 100000):
        p = rmsnorm.plan(h, 1, 1, 2, fused=True)
        assert p.instantiation(F16, F32, True) in insts


def test_bytes_moved():
    assert rmsnorm.bytes_moved((16384, 4096), BFLOAT16, BFLOAT16) == 2 * 16384 * 4096 * 2 + 4096 * 2
    assert rmsnorm.bytes_moved((16384, 4096), BFLOAT16, BFLOAT16, fused=True) == 4 * 16384 * 4096 * 2 + 8192
    assert rmsnorm.bytes_moved((3, 7), F32) == 2 * 21 * 4


def test_reference_matches_definition():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 5))
    w = rng.standard_normal(5)
    want = x / np.sqrt((x**2).mean(-1, keepdims=True) + 1e-6) * (1.0 + w)
    np.testing.assert_allclose(reference.rms_norm(x, w, 1e-6, 1.0), want, rtol=1e-14)


# ---- argument checks that need no GPU ---------------------------------------------------------------

def test_fused_add_without_residual_names_it():
    with pytest.raises(TypeError, match=r"residual is None"):
        rmsnorm.fused_add_rms_norm(np.ones((2, 8), np.float32), None)


@pytest.mark.parametrize("eps, offset", [(1e-6, 0.0), (0, 1), (np.float32(1e-5), np.float64(1.0)), (1e-30, -2.5),
                                         (np.int64(0), True), (3e38, -3e38)])
def test_good_eps_and_offset(eps, offset):
    assert rmsnorm._scalars(eps, offset) == (float(eps), float(offset))


@pytest.mark.parametrize("eps, offset, err, name", [
    (None, 0.0, TypeError, "eps"), ("1e-6", 0.0, TypeError, "eps"), (np.array(1e-6), 0.0, TypeError, "eps"),
    (np.ones(2), 0.0, TypeError, "eps"), ([1e-6], 0.0, TypeError, "eps"), (1e-6j, 0.0, TypeError, "eps"),
    (1e-6, None, TypeError, "offset"), (1e-6, "1", TypeError, "offset"),
    (-1e-6, 0.0, ValueError, "eps"), (float("nan"), 0.0, ValueError, "eps"), (float("inf"), 0.0, ValueError, "eps"),
    (1e39, 0.0, ValueError, "eps"), (10**400, 0.0, ValueError, "eps"),
    (1e-6, float("nan"), ValueError, "offset"), (1e-6, float("-inf"), ValueError, "offset"),
    (1e-6, -1e39, ValueError, "offset"),
])
def test_bad_eps_and_offset(eps, offset, err, name):
    with pytest.raises(err, match=rf"^{name}\b"):
        rmsnorm._scalars(eps, offset)


def _fake_call():
    layout = dict(rows=1, inner=1, out_s0=0, out_s1=0, res_s0=0, res_s1=0, x_s0=0, x_s1=0, hidden=8)
    return rmsnorm._Call(kernel=object(), config=None, device=0, outer=None, layout=layout, aliasing=(), packed={})


def test_a_bad_eps_or_offset_is_never_packed():
    """Packing checks each new pair once; a pair that fails is not stored, so it fails every time."""
    call = _fake_call()
    for eps, offset in [(None, 0.0), (1e-6, None), (float("nan"), 0.0), (-1.0, 0.0), (1e-6, float("nan"))]:
        for _ in range(2):
            with pytest.raises((TypeError, ValueError)):
                call.pack(eps, offset)
    assert call.packed == {}
    p = call.pack(1e-6, 1)
    assert call.packed == {(1e-6, 1): p}


def _spec(shape, dtype=F32, ptr=1 << 20, strides=None):
    dtype = np.dtype(dtype)
    strides = contiguous_strides(shape, dtype.itemsize) if strides is None else strides
    return ArraySpec(tuple(shape), tuple(strides), dtype, ptr)


def _aliasing_error(out, residual, x, weight):
    pairs = rmsnorm._aliasing(out, residual, x, weight)
    try:
        rmsnorm._check_aliasing(pairs, (out, residual, x, weight))
    except ValueError as err:
        return str(err)
    return None


def test_aliasing_pairs():
    """Overlap found from pointer offsets against extents computed once per layout, as a cached call does."""
    base, row = 1 << 20, 64 * 4
    x, w = _spec((4, 64), ptr=base), _spec((64,), ptr=base + (1 << 16))
    assert _aliasing_error(None, None, x, w) is None
    assert _aliasing_error(x, None, x, w) is None  # in place
    assert "out partially overlaps x" in _aliasing_error(_spec((4, 64), ptr=base + row), None, x, w)
    assert "out overlaps weight" in _aliasing_error(_spec((4, 64), ptr=w.ptr - row), None, x, w)
    r = _spec((4, 64), ptr=base + (1 << 17))
    assert _aliasing_error(None, r, x, w) is None
    assert "residual overlaps x" in _aliasing_error(None, x, x, w)
    assert "out overlaps residual" in _aliasing_error(_spec((4, 64), ptr=r.ptr + 4), r, x, w)
    # weight a view of residual's second row: read while residual is written
    assert "weight overlaps residual" in _aliasing_error(None, r, x, _spec((64,), ptr=r.ptr + row))
    assert _aliasing_error(None, r, x, _spec((64,), ptr=r.ptr + 4 * row)) is None  # just past it
    empty = _spec((0, 64), ptr=base)
    assert rmsnorm._aliasing(empty, empty, empty, w) == ()


# ---- GPU --------------------------------------------------------------------------------------------

def _randn(cp, shape, dtype, rng):
    return cp.asarray(rng.standard_normal(shape, dtype=np.float32)).astype(dtype)


def _assert_close_on_gpu(out, ref, dtype):
    """tests/_support.assert_close's rule evaluated on the GPU, for outputs of up to 2^27 elements whose copy
    to the host would cost seconds; a NaN left by an unwritten element fails it."""
    import cupy as cp

    err = cp.abs(out.astype(np.float64) - ref)
    bound = tolerance(dtype) * (cp.abs(ref) + 0.1 * cp.sqrt(cp.mean(ref * ref)))
    assert bool((err <= bound).all()), f"{int((~(err <= bound)).sum())} of {err.size} elements off"


def _poisoned(cp, shape, dtype):
    out = cp.empty(shape, dtype=dtype)
    out.fill(np.nan)
    return out


WEIGHTS = [(d, d) for d in DTYPES] + [(F16, F32), (BFLOAT16, F32)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,wdtype", WEIGHTS, ids=lambda d: str(d))
@pytest.mark.parametrize("hidden", HIDDEN)
@pytest.mark.parametrize("rows", [1, 3, 257, 16384])
def test_rms_norm_matches_reference(dtype, wdtype, hidden, rows, rng):
    import cupy as cp

    if rows * hidden > 2**27:
        rows = 2**27 // hidden + 1  # keep the largest cases to ~128M elements
    x = _randn(cp, (rows, hidden), dtype, rng)
    w = _randn(cp, hidden, wdtype, rng)
    offset = float(rng.choice([0.0, 1.0]))
    out = _poisoned(cp, x.shape, dtype)
    got = rmsnorm.rms_norm(x, w, 1e-6, offset=offset, out=out)
    assert got is out
    _assert_close_on_gpu(out, reference.rms_norm(x, w, 1e-6, offset), dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,wdtype", WEIGHTS, ids=lambda d: str(d))
@pytest.mark.parametrize("hidden", [7, 1000, 4096, 65536])
@pytest.mark.parametrize("rows", [1, 257])
def test_fused_add_matches_reference(dtype, wdtype, hidden, rows, rng):
    import cupy as cp

    x = _randn(cp, (rows, hidden), dtype, rng)
    r = _randn(cp, (rows, hidden), dtype, rng)
    w = _randn(cp, hidden, wdtype, rng)
    want_r, want = reference.fused_add_rms_norm(x, r, w, 1e-5, 1.0)
    x_before = x.copy()
    out = rmsnorm.fused_add_rms_norm(x, r, w, 1e-5, offset=1.0)
    assert bool((r == want_r).all()), "residual must be x + residual rounded once to its dtype"
    assert bool((x == x_before).all())
    assert_close(out, want, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fused_add_in_place_out_is_x(dtype, rng):
    import cupy as cp

    x = _randn(cp, (33, 4096), dtype, rng)
    r = _randn(cp, (33, 4096), dtype, rng)
    want_r, want = reference.fused_add_rms_norm(x, r, None)
    got = rmsnorm.fused_add_rms_norm(x, r, out=x)
    assert got is x
    assert bool((r == want_r).all())
    assert_close(x, want, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_in_place_rms_norm(dtype, rng):
    import cupy as cp

    x = _randn(cp, (5, 4096), dtype, rng)
    want = reference.rms_norm(x)
    rmsnorm.rms_norm(x, out=x)
    assert_close(x, want, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_misaligned_and_strided_views(dtype, rng):
    import cupy as cp

    base = _randn(cp, (37, 4097), dtype, rng)
    w = _randn(cp, 4096, dtype, rng)
    for x in (base[:, 1:], base[:, :4096], base[::2, 1:], base[::-1, 1:]):
        out = rmsnorm.rms_norm(x, w)
        assert_close(out, reference.rms_norm(x, w), dtype)
    # a view one element into the weight too
    wbase = _randn(cp, 4097, dtype, rng)
    out = rmsnorm.rms_norm(base[:, 1:], wbase[1:])
    assert_close(out, reference.rms_norm(base[:, 1:], wbase[1:]), dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_per_head_norm_in_fused_qkv_buffer(dtype, rng):
    """[tokens, heads, head_dim] views into a [tokens, (nh + 2 nkv) * hd] buffer, normalized in place."""
    import cupy as cp

    tokens, nh, nkv, hd = 19, 8, 2, 128
    qkv = _randn(cp, (tokens, (nh + 2 * nkv) * hd), dtype, rng)
    before = qkv.copy()
    q = qkv[:, : nh * hd].reshape(tokens, nh, hd)
    k = qkv[:, nh * hd: (nh + nkv) * hd].reshape(tokens, nkv, hd)
    w = _randn(cp, hd, dtype, rng)
    want_q, want_k = reference.rms_norm(q, w), reference.rms_norm(k, w)
    rmsnorm.rms_norm(q, w, out=q)
    rmsnorm.rms_norm(k, w, out=k)
    assert_close(q, want_q, dtype)
    assert_close(k, want_k, dtype)
    assert bool((qkv[:, (nh + nkv) * hd:] == before[:, (nh + nkv) * hd:]).all()), "v must be untouched"


@pytest.mark.gpu
def test_many_leading_dimensions_that_do_not_merge(rng):
    import cupy as cp

    base = _randn(cp, (4, 6, 10, 96), BFLOAT16, rng)
    x = base[::2, 1:, ::3, :64]  # three leading dims, none mergeable: several launches
    out = rmsnorm.rms_norm(x)
    assert_close(out, reference.rms_norm(x), BFLOAT16)
    r = _randn(cp, x.shape, BFLOAT16, rng)
    want_r, want = reference.fused_add_rms_norm(x, r)
    got = rmsnorm.fused_add_rms_norm(x, r)
    assert bool((r == want_r).all())
    assert_close(got, want, BFLOAT16)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("hidden", [128, 4096, 65536])
def test_batch_invariance(dtype, hidden, rng):
    """A row's result is bit-identical whether it is normalized alone or among 16384 rows."""
    import cupy as cp

    rows = 16384 if hidden < 65536 else 1024
    x = _randn(cp, (rows, hidden), dtype, rng)
    w = _randn(cp, hidden, dtype, rng)
    full = rmsnorm.rms_norm(x, w)
    for sel in (slice(0, 1), slice(5, 8), slice(rows - 257, rows)):
        part = rmsnorm.rms_norm(x[sel], w)
        assert bool((part.view(np.uint8) == full[sel].view(np.uint8)).all())


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_nan_and_inf_rows(dtype, rng):
    import cupy as cp

    x = _randn(cp, (4, 1000), dtype, rng)
    x[1, 17] = np.nan
    x[2, 3] = np.inf
    out = rmsnorm.rms_norm(x).astype(np.float64)
    ref = reference.rms_norm(x)
    assert bool(cp.isnan(out[1]).all())
    assert bool((cp.isnan(out[2]) == cp.isnan(ref[2])).all()) and bool(cp.isnan(out[2, 3]))
    assert_close(out[[0, 3]].astype(dtype), ref[[0, 3]], dtype)


@pytest.mark.gpu
def test_empty_inputs_launch_nothing():
    import cupy as cp

    for shape in ((0, 4096), (4, 0), (0,)):
        x = cp.empty(shape, dtype=BFLOAT16)
        assert rmsnorm.rms_norm(x).shape == shape
        assert rmsnorm.fused_add_rms_norm(x, cp.empty_like(x)).shape == shape


@pytest.mark.gpu
def test_more_than_2_31_elements(rng):
    import cupy as cp

    hidden = 4096
    rows = 2**31 // hidden + 3
    x = cp.empty((rows, hidden), dtype=BFLOAT16)
    x[...] = cp.asarray(rng.standard_normal(hidden, dtype=np.float32)).astype(BFLOAT16)
    x[-3:] = _randn(cp, (3, hidden), BFLOAT16, rng)
    out = rmsnorm.rms_norm(x)
    assert_close(out[-3:], reference.rms_norm(x[-3:]), BFLOAT16)
    assert_close(out[:2], reference.rms_norm(x[:2]), BFLOAT16)
    del x, out
    cp.get_default_memory_pool().free_all_blocks()


# ---- validation (needs arrays on a device) ----------------------------------------------------------

@pytest.mark.gpu
def test_bad_inputs_raise_before_launch():
    import cupy as cp

    x = cp.ones((4, 64), dtype=np.float32)
    with pytest.raises(TypeError, match="cupy.asarray"):
        rmsnorm.rms_norm(np.ones((4, 64), np.float32))
    with pytest.raises(TypeError, match="got list"):
        rmsnorm.rms_norm([[1.0]])
    with pytest.raises(TypeError, match="dtype"):
        rmsnorm.rms_norm(cp.ones((4, 64), dtype=np.int32))
    with pytest.raises(TypeError, match="weight"):
        rmsnorm.rms_norm(x, cp.ones(64, dtype=np.float16))
    with pytest.raises(ValueError, match="weight has shape"):
        rmsnorm.rms_norm(x, cp.ones(63, dtype=np.float32))
    with pytest.raises(ValueError, match="stride"):
        rmsnorm.rms_norm(cp.ones((64, 4), dtype=np.float32).T)
    with pytest.raises(ValueError, match="out has shape"):
        rmsnorm.rms_norm(x, out=cp.empty((4, 63), dtype=np.float32))
    with pytest.raises(TypeError, match="out has dtype"):
        rmsnorm.rms_norm(x, out=cp.empty((4, 64), dtype=np.float16))
    with pytest.raises(ValueError, match="residual has shape"):
        rmsnorm.fused_add_rms_norm(x, cp.ones((4, 65), np.float32))
    big = cp.ones((5, 64), dtype=np.float32)
    with pytest.raises(ValueError, match="partially overlaps"):
        rmsnorm.rms_norm(big[:4], out=big[1:])
    with pytest.raises(ValueError, match="overlaps"):
        rmsnorm.fused_add_rms_norm(big[:4], big[1:])
    with pytest.raises(ValueError, match="zero stride"):
        rmsnorm.rms_norm(x, out=cp.broadcast_to(cp.empty(64, np.float32), (4, 64)))
    with pytest.raises(ValueError, match="at least one dimension"):
        rmsnorm.rms_norm(cp.float32(1.0) * cp.ones(()))


@pytest.mark.gpu
@pytest.mark.parametrize("fused", [False, True])
def test_eps_and_offset_are_checked_before_any_launch(fused):
    """Bad values raise whether or not a good pair is cached for the call, and for an empty x too; a
    residual is left untouched."""
    import cupy as cp

    x = cp.ones((4, 64), np.float32)
    r = cp.full((4, 64), 2.0, np.float32)
    run = (lambda **kw: rmsnorm.fused_add_rms_norm(x, r, **kw)) if fused else (lambda **kw: rmsnorm.rms_norm(x, **kw))
    run(eps=1e-6, offset=0.0)
    r_before = r.copy()
    bad = [({"eps": None}, TypeError), ({"eps": "1e-6"}, TypeError), ({"eps": cp.asarray([1e-6])}, TypeError),
           ({"offset": None}, TypeError), ({"eps": float("nan")}, ValueError), ({"eps": -1e-6}, ValueError),
           ({"eps": float("inf")}, ValueError), ({"offset": float("nan")}, ValueError)]
    for kwargs, err in bad:
        for _ in range(2):
            with pytest.raises(err, match=next(iter(kwargs))):
                run(**kwargs)
        assert bool((r == r_before).all())
    empty = cp.empty((0, 64), np.float32)
    with pytest.raises(TypeError, match="eps"):
        rmsnorm.rms_norm(empty, eps=None)
    out = run(eps=1e-6, offset=1)  # a good pair still works after the refusals
    assert bool(cp.isfinite(out).all())


@pytest.mark.gpu
def test_weight_inside_residual_is_refused():
    """residual is written while weight is read: a weight view into residual would race."""
    import cupy as cp

    x = cp.ones((4, 64), np.float32)
    buf = cp.arange(5 * 64, dtype=np.float32)
    residual, before = buf[:256].reshape(4, 64), buf.copy()
    with pytest.raises(ValueError, match="weight overlaps residual"):
        rmsnorm.fused_add_rms_norm(x, residual, buf[64:128])
    assert bool((buf == before).all())
    rmsnorm.fused_add_rms_norm(x, residual, buf[256:])  # the row after residual is no part of it


@pytest.mark.gpu
def test_different_devices_raise():
    import cupy as cp

    if cp.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs two GPUs")
    x = cp.ones((4, 64), dtype=np.float32)
    with cp.cuda.Device(1):
        w = cp.ones(64, dtype=np.float32)
    with pytest.raises(ValueError, match="different devices"):
        rmsnorm.rms_norm(x, w)
