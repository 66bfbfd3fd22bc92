"""RMSNorm and fused add + RMSNorm: planning, the summation tree (a NumPy model of every launch against the
exact emulator), the machine code's roundings and argument checks on the CPU; numerics and bit-exactness on
the GPU (compilation and spills: tests/test_compile.py)."""

import itertools
import math

import numpy as np
import pytest
from _support import ARCHS, assert_close, checked_instantiations, compiled, tolerance

from cukern import reference, rmsnorm
from cukern._dtypes import BFLOAT16, FLOAT_TYPES
from cukern._layout import ArraySpec, contiguous_strides

F32, F16 = np.dtype(np.float32), np.dtype(np.float16)
DTYPES = [F32, F16, BFLOAT16]
HIDDEN = [7, 127, 1000, 4095, 4096, 5120, 8192, 65536]


# ---- planning (pure, CPU) -------------------------------------------------------------------------

# every vector width that divides the row, as the launch picks them
@pytest.mark.parametrize("hidden, vec", [(h, v) for h in (1, 2, 7, 64, 127, 128, 1000, 4095, 4096, 5120, 8192, 32768,
                                                          65536, 10**6) for v in (1, 4, 8) if h % v == 0])
def test_plan_covers_the_row(hidden, vec):
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
    assert "cukern::fused_add_rms_norm_wide<float, float, 4, 2, 4, 512>" in exprs
    for h in (7, 4096, 65536, 100000):
        p = rmsnorm.plan(h, 1, 1, 2, fused=True)
        assert p.instantiation(F16, F32, True) in insts


def test_instantiations_cover_every_items_target():
    insts = set(rmsnorm.instantiations())
    points = itertools.product(rmsnorm.SPACE["items_target"], (7, 128, 4095, 8192, 65536), (1, 8))
    for items_target, hidden, vec in points:
        if hidden % vec == 0:
            knobs = rmsnorm.Knobs(items_target=items_target)
            assert rmsnorm.plan(hidden, 1, vec, 2, knobs=knobs).instantiation(BFLOAT16, BFLOAT16, False) in insts


# ---- the summation tree: one tree per hidden size, whatever the launch -----------------------

TREE_HIDDEN = [1, 2, 3, 7, 8, 13, 31, 32, 33, 64, 127, 128, 1000, 2048, 2049, 3072, 4093, 4095, 4096, 5120, 8191,
               8192, 8200, 12289, 16384, 16392, 40000, 65536]


def test_tree_classes():
    assert [rmsnorm.tree_classes(h) for h in (1, 32, 33, 4096, 5120, 8192, 16384, 10**6)] == \
        [8, 8, 16, 1024, 2048, 2048, 4096, 4096]
    for h in range(1, 20000, 7):
        c = rmsnorm.tree_classes(h)
        assert c & (c - 1) == 0 and rmsnorm.MIN_CLASSES <= c <= rmsnorm.MAX_CLASSES


def _every_plan(hidden):
    """Every plan a call of this row length can make: both dtypes sizes' vector widths and the element path,
    every knob point of the tuning space, plain and fused, on two SM counts."""
    for t in FLOAT_TYPES:
        for vec in sorted({rmsnorm.widest_vector(hidden, t.itemsize), 1}):
            for values in itertools.product(*rmsnorm.SPACE.values()):
                knobs = rmsnorm.Knobs(**dict(zip(rmsnorm.SPACE, values)))
                for fused, sms in itertools.product((False, True), (108, 132)):
                    yield t, rmsnorm.plan(hidden, 1000, vec, t.itemsize, sms, knobs, fused=fused)


@pytest.mark.parametrize("hidden", TREE_HIDDEN + [10**6, rmsnorm.MAX_HIDDEN])
def test_every_plan_computes_the_tree_of_its_hidden_size(hidden):
    """The classes a launch sums are those of tree_classes(hidden) for every vector width, knob point, SM
    count and kernel: each thread owns groups x vec whole classes, every element has a slot, and the
    block is one the tree helpers accept."""
    for t, p in _every_plan(hidden):
        what = (t, p)
        assert p.classes == rmsnorm.tree_classes(hidden), what
        assert p.items % p.groups == 0, what
        assert p.block % 32 == 0 and p.block % p.tpr == 0 and p.block & (p.block - 1) == 0, what
        if p.kernel == "wide":
            assert p.tpr == p.block, what
        else:
            assert p.tpr <= 32 or p.tpr == p.block, what
            assert p.tpr * p.items * p.vec >= hidden, what
            assert p.items * p.vec * t.itemsize <= rmsnorm.MAX_BYTES, what


def _tree(v):
    while v.shape[-1] > 1:
        v = v[..., 0::2] + v[..., 1::2]
    return v[..., 0]


def _butterfly(v, width):
    """common/reduce.cuh group_tree_reduce over the last axis, lane by lane: lane t adds lane t ^ m to its
    own value, m = 1, 2, ... up to width / 2."""
    lanes = np.arange(v.shape[-1])
    m = 1
    while m < width:
        v = v + v[..., lanes ^ m]
        m *= 2
    return v


def _launch_model(x, p):
    """The sum of squares a launch of plan ``p`` computes, modelled step by step from cuda_src/rms_norm.cu
    (both kernels): thread t holds vector column t + k * tpr as item k (the wide kernel's chunks continue
    k), adds its squares into accumulator [k % groups][lane j], in item order; then the tree over its lanes,
    the butterfly over the row's threads and, for a block of rows, the tree over (group, warp) values."""
    rows, hidden = x.shape
    t = np.arange(p.tpr)[:, None]
    j = np.arange(p.vec)[None, :]
    acc = np.zeros((rows, p.tpr, p.groups, p.vec), np.float32)
    items = p.items if p.kernel == "rows" else p.items * -(-hidden // (p.block * p.items * p.vec))
    for k in range(items):
        idx = (k * p.tpr + t) * p.vec + j
        v = np.where(idx < hidden, x[:, np.minimum(idx, hidden - 1)], np.float32(0))
        acc[:, :, k % p.groups] += v * v
    part = _tree(acc)  # [rows, tpr, groups]: each group's lanes
    if p.tpr <= 32:
        return _tree(_butterfly(np.moveaxis(part, 1, 2), p.tpr)[..., 0])
    warps = _butterfly(np.moveaxis(part, 1, 2).reshape(rows, p.groups, p.tpr // 32, 32), 32)[..., 0]
    return _tree(warps.reshape(rows, -1))


def _spread(rng, shape):
    """float32 values over 2^-12 .. 2^12, so that adding them in another order changes the rounding."""
    return (rng.standard_normal(shape) * 2.0 ** rng.integers(-12, 12, shape)).astype(np.float32)


@pytest.mark.parametrize("hidden", TREE_HIDDEN)
def test_every_launch_adds_in_the_emulators_order(hidden):
    """A NumPy model of each distinct launch (vector or element path, every knob point, rows or wide kernel)
    gives the bits of reference.rms_norm_sum_of_squares_emulated, which knows nothing of launches."""
    rng = np.random.default_rng(hidden)
    x = _spread(rng, (3, hidden))
    want = reference.rms_norm_sum_of_squares_emulated(x)
    seen = set()
    for _, p in _every_plan(hidden):
        key = (p.kernel, p.vec, p.tpr, p.groups, p.items, p.block)
        if key not in seen:
            seen.add(key)
            got = _launch_model(x, p)
            assert got.tobytes() == want.tobytes(), p
    assert len(seen) > 1 or hidden % 8, "a vector path and the element path at least"


def test_the_order_is_visible_in_the_bits():
    """The model and the emulator agree because they add in the same order, not because the data forgives:
    a sequential sum or the other butterfly direction gives other bits on these rows."""
    x = _spread(np.random.default_rng(1), (64, 4096))
    want = reference.rms_norm_sum_of_squares_emulated(x)
    sequential = np.zeros(64, np.float32)
    for i in range(4096):
        sequential += x[:, i] * x[:, i]
    assert (sequential != want).any()
    c = rmsnorm.tree_classes(4096)
    part = (x * x).reshape(64, -1, c).sum(axis=1, dtype=np.float32)
    high_first = part
    while high_first.shape[-1] > 1:
        half = high_first.shape[-1] // 2
        high_first = high_first[:, :half] + high_first[:, half:]
    assert (high_first[:, 0] != want).any()


@pytest.mark.parametrize("dtype", FLOAT_TYPES, ids=str)
@pytest.mark.parametrize("hidden", [7, 1000, 4096, 40000])
def test_emulator_is_close_to_the_reference(dtype, hidden):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((5, hidden)).astype(dtype)
    w = rng.standard_normal(hidden).astype(dtype)
    for offset in (0.0, 1.0):
        got = reference.rms_norm_emulated(x, w, 1e-6, offset)
        assert got.dtype == dtype
        assert_close(got, reference.rms_norm(x, w, 1e-6, offset), dtype)
    assert_close(reference.rms_norm_emulated(x), reference.rms_norm(x), dtype)


@pytest.mark.parametrize("dtype", FLOAT_TYPES, ids=str)
def test_fused_emulator_rounds_the_residual_once(dtype):
    """float32 addition rounded again to a 16-bit type is the correctly rounded sum (float32 has more than
    twice their bits), so the emulated residual equals the float64 sum rounded once, over wide exponents."""
    rng = np.random.default_rng(3)
    x = _spread(rng, (8, 999)).astype(dtype)
    r = _spread(rng, (8, 999)).astype(dtype)
    want_r, want = reference.fused_add_rms_norm(x, r, None, 1e-5, 1.0)
    got_r, got = reference.fused_add_rms_norm_emulated(x, r, None, 1e-5, 1.0)
    assert got_r.dtype == dtype and got_r.tobytes() == want_r.tobytes()
    assert got.tobytes() == reference.rms_norm_emulated(got_r, None, 1e-5, 1.0).tobytes()
    assert_close(got, want, dtype)


@pytest.mark.nvrtc("rms_norm")
@pytest.mark.parametrize("arch", ARCHS)
def test_machine_code_rounds_every_step(arch):
    """No instantiation fuses a multiply-add or uses an approximate square root, reciprocal or division,
    which would round differently from the emulator (and between paths the compiler treats differently)."""
    c = compiled("rms_norm", arch)
    insts = checked_instantiations("rms_norm")
    for inst in insts:
        body = c.kernel_ptx(inst)
        assert "fma.rn.f32" not in body and ".approx" not in body, inst.expression
    body = c.kernel_ptx(next(i for i in insts if i.name == "rms_norm_rows" and i.args[:3] == (BFLOAT16, BFLOAT16, 8)))
    assert all(op in body for op in ("div.rn.f32", "sqrt.rn.f32", "rcp.rn.f32"))


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
    layout = dict(rows=1, inner=1, out_s0=0, out_s1=0, res_s0=0, res_s1=0, x_s0=0, x_s1=0, hidden=8, rs_s0=0, rs_s1=0)
    return rmsnorm._Call(kernel=object(), config=None, device=0, outer=None, layout=layout, aliasing=(), packed={},
                          prepared={})


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


# ---- bit-exactness: the emulator's bits, whatever the launch ---------------------------------

def _same_bits(got, want):
    """``got`` (device or host) holds exactly ``want``'s bits; NaN only where ``want`` has NaN (payloads may
    differ)."""
    got = got.get() if hasattr(got, "get") else np.asarray(got)
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.dtype, want.shape)
    nan = np.isnan(want.astype(np.float32))
    assert np.array_equal(np.isnan(got.astype(np.float32)), nan), "NaN where the emulator has none, or the reverse"
    uint = np.dtype(f"u{want.itemsize}")
    differ = (np.ascontiguousarray(got).view(uint) != np.ascontiguousarray(want).view(uint)) & ~nan
    assert not differ.any(), f"{int(differ.sum())} of {differ.size} elements differ; first at {np.argwhere(differ)[0]}"


def _spread_on_gpu(cp, shape, dtype, rng):
    return cp.asarray(_spread(rng, shape).astype(dtype))


BITS_HIDDEN = [1, 7, 127, 128, 1000, 2049, 4093, 4096, 5120, 8191, 8192, 12289, 16384, 65537]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,wdtype", WEIGHTS, ids=lambda d: str(d))
@pytest.mark.parametrize("hidden", BITS_HIDDEN)
def test_bits_are_the_emulators(dtype, wdtype, hidden, rng):
    """rms_norm and fused_add_rms_norm write exactly reference.*_emulated's bits (which take no launch
    parameter), weighted or not, for odd, prime and power-of-two hidden sizes on both kernels."""
    import cupy as cp

    rows = max(1, min(300, 2**22 // hidden))
    x = _spread_on_gpu(cp, (rows, hidden), dtype, rng)
    w = _randn(cp, hidden, wdtype, rng)
    offset = float(rng.choice([0.0, 1.0, -0.25]))
    _same_bits(rmsnorm.rms_norm(x, w, 1e-6, offset=offset), reference.rms_norm_emulated(x, w, 1e-6, offset))
    _same_bits(rmsnorm.rms_norm(x, eps=3e-5), reference.rms_norm_emulated(x, None, 3e-5))
    r = _spread_on_gpu(cp, (rows, hidden), dtype, rng)
    want_r, want = reference.fused_add_rms_norm_emulated(x, r, w, 1e-5, offset)
    got = rmsnorm.fused_add_rms_norm(x, r, w, 1e-5, offset=offset)
    _same_bits(r, want_r)
    _same_bits(got, want)


@pytest.mark.gpu
@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("hidden,dtype", [(7, F32), (128, BFLOAT16), (1000, F16), (4095, BFLOAT16), (4096, BFLOAT16),
                                          (4096, F32), (8192, F16), (40000, BFLOAT16)], ids=str)
def test_bits_do_not_depend_on_the_knobs(fused, hidden, dtype, rng):
    """Every point of the tuning space (threads per row, rows per block, grid), on the vector path and on
    a misaligned view (the element path), gives the same bits."""
    import cupy as cp

    rows = 300
    base = _spread_on_gpu(cp, (rows, hidden + 1), dtype, rng)
    r0 = _spread_on_gpu(cp, (rows, hidden), dtype, rng)
    w = _randn(cp, hidden, dtype, rng)
    want_r, want = reference.fused_add_rms_norm_emulated(base[:, 1:], r0, w, 1e-6, 0.5) if fused else \
        (None, reference.rms_norm_emulated(base[:, 1:], w, 1e-6, 0.5))
    for x in (base[:, 1:].copy(), base[:, 1:]):
        for values in itertools.product(*rmsnorm.SPACE.values()):
            knobs = rmsnorm.Knobs(**dict(zip(rmsnorm.SPACE, values)))
            r = r0.copy() if fused else None
            out = cp.empty((rows, hidden), dtype)
            rmsnorm._run(fused, x, r, w, 1e-6, 0.5, out, knobs)
            _same_bits(out, want)
            if fused:
                _same_bits(r, want_r)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("hidden", [128, 4095, 4096, 65536])
def test_bits_do_not_depend_on_the_row_count(dtype, hidden, rng):
    """1, 255, 256 or 4096 rows (other grids, other rows per block, another number of waves): a row's bits
    are the same."""
    import cupy as cp

    total = 4096 if hidden < 65536 else 512
    x = _spread_on_gpu(cp, (total, hidden), dtype, rng)
    w = _randn(cp, hidden, dtype, rng)
    full = rmsnorm.rms_norm(x, w).get()
    _same_bits(full[:8], reference.rms_norm_emulated(x[:8], w))
    for rows in (1, 255, 256, 4096):
        if rows <= total:
            _same_bits(rmsnorm.rms_norm(x[:rows], w), full[:rows])
    _same_bits(rmsnorm.rms_norm(x[-1:], w), full[-1:])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_bits_do_not_depend_on_alignment_strides_or_stream(dtype, rng):
    """A view one element in (element loads) and a strided view give the bits of the aligned contiguous
    copy (16-byte loads), on the default stream or another."""
    import cupy as cp

    base = _spread_on_gpu(cp, (38, 4097), dtype, rng)
    w = _randn(cp, 4096, dtype, rng)
    misaligned, aligned = base[::2, 1:], base[::2, 1:].copy()
    assert rmsnorm.vector_width(4096, [misaligned]) == 1 < rmsnorm.vector_width(4096, [aligned])
    want = reference.rms_norm_emulated(aligned, w)
    _same_bits(rmsnorm.rms_norm(misaligned, w), want)
    _same_bits(rmsnorm.rms_norm(aligned, w), want)
    with cp.cuda.Stream(non_blocking=True) as s:
        out = rmsnorm.rms_norm(misaligned, w)
        s.synchronize()
    _same_bits(out, want)
    r = _spread_on_gpu(cp, (19, 4097), dtype, rng)[:, 1:]
    want_r, want = reference.fused_add_rms_norm_emulated(aligned, r, w)
    _same_bits(rmsnorm.fused_add_rms_norm(misaligned, r, w), want)
    _same_bits(r, want_r)


@pytest.mark.gpu
@pytest.mark.parametrize("hidden,rows", [(4096, 16384), (128, 65536), (65536, 600)])
def test_bits_do_not_depend_on_the_sm_count(hidden, rows, monkeypatch, rng):
    """Planned for a 108-SM and a 142-SM GPU (grids capped at one wave of each), launched on this one: the
    same bits."""
    import cupy as cp
    from cukern._launch import CallCache

    x = _spread_on_gpu(cp, (rows, hidden), BFLOAT16, rng)
    w = _randn(cp, hidden, BFLOAT16, rng)
    knobs = rmsnorm.Knobs(waves=1)
    grids, outs = set(), []
    for sms in (108, 142):
        monkeypatch.setattr(rmsnorm, "sm_count", lambda device, n=sms: n)
        monkeypatch.setattr(rmsnorm, "_calls", CallCache())  # a call planned for the other count must not be reused
        grids.add(rmsnorm.plan(hidden, rows, 8, 2, sms, knobs).grid)
        out = cp.empty_like(x)
        rmsnorm._run(False, x, None, w, 1e-6, 0.0, out, knobs)
        outs.append(out)
    assert len(grids) == 2
    _same_bits(outs[1], outs[0].get())
    _same_bits(outs[0][:64], reference.rms_norm_emulated(x[:64], w))


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1, 2**27 - 1), (2, 2**26), (2**13, 2**14 + 8)], ids=str)
def test_bits_of_large_inputs(shape, rng):
    """Up to 2^27 elements in one row (32768 elements a class), and 2^27 over 8192 rows."""
    import cupy as cp

    x = _spread_on_gpu(cp, shape, BFLOAT16, rng)
    w = _randn(cp, shape[-1], BFLOAT16, rng)
    _same_bits(rmsnorm.rms_norm(x, w), reference.rms_norm_emulated(x, w))
    del x
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
