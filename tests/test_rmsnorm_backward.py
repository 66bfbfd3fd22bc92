"""RMSNorm backward and the forward's ``return_rstd``: planning, the dweight tree, the emulator against float64
and the machine code's roundings on the CPU; bits against the emulator, float64 closeness, layouts, empty
inputs and batch invariance on the GPU (argument refusals: tests/test_launch_contract.py's bad cases)."""

import math
import re

import numpy as np
import pytest
from _support import (ARCHS, assert_close, checked_instantiations, compiled, refused_in_capture, replayed_alone,
                      same_bits, unread_cupy_array)

from cukern import reference, rmsnorm, rmsnorm_backward
from cukern._dtypes import BFLOAT16, FLOAT_TYPES

F32, F16 = np.dtype(np.float32), np.dtype(np.float16)
DTYPES = [F32, F16, BFLOAT16]
WEIGHTS = [(d, d) for d in DTYPES] + [(F16, F32), (BFLOAT16, F32)]


# ---- planning (pure, CPU) -------------------------------------------------------------------------

@pytest.mark.parametrize("rows", [0, 1, 111, 989, 4095, 16384, 10**6, 2**31])
@pytest.mark.parametrize("hidden", [8, 128, 989, 4096, 8192])
def test_chunks_depend_on_rows_and_hidden_only(rows, hidden):
    r = rmsnorm_backward.chunk_rows(rows, hidden)
    paired = rows > rmsnorm_backward.PAIR_ROWS and rows * hidden > rmsnorm_backward.PAIR_ELEMENTS
    assert r >= 1 and r & (r - 1) == 0
    assert math.ceil(rows / r) <= rmsnorm_backward.target_chunks(hidden)
    assert r == 1 or math.ceil(rows / (r // 2)) > rmsnorm_backward.target_chunks(hidden) or (r == 2 and paired)
    assert r > 1 or not paired
    plans = {rmsnorm_backward.plan(hidden, max(rows, 1), vec, 2).chunk_rows for vec in (1, 8)
             if hidden % vec == 0 and hidden <= rmsnorm_backward.max_hidden(vec, 2)}
    assert plans == {rmsnorm_backward.chunk_rows(max(rows, 1), hidden)}


@pytest.mark.parametrize("hidden", [1, 7, 64, 111, 128, 989, 4095, 4096, 8192, 16384])
@pytest.mark.parametrize("vec,itemsize", [(1, 2), (8, 2), (1, 4), (4, 4)])
def test_plan_covers_rows_and_chunks(hidden, vec, itemsize):
    if hidden % vec:
        pytest.skip("vec must divide hidden")
    if hidden > rmsnorm_backward.max_hidden(vec, itemsize):
        with pytest.raises(ValueError, match="x's last dimension"):
            rmsnorm_backward.plan(hidden, 1000, vec, itemsize)
        return
    p = rmsnorm_backward.plan(hidden, 1000, vec, itemsize)
    r = p.row
    assert r.kernel == "rows" and r.tpr * r.items * r.vec >= hidden and r.groups * r.tpr * r.vec == r.classes
    assert r.classes == rmsnorm.tree_classes(hidden)  # the forward's tree, so a recomputed rstd has its bits
    assert p.chunks == math.ceil(1000 / p.chunk_rows) and p.grid * p.chunks_per_block >= p.chunks
    assert (p.grid - 1) * p.chunks_per_block < p.chunks
    assert p.per_lane * rmsnorm_backward.PARTIAL_LANES >= p.grid
    assert p.tree_grid * rmsnorm_backward.PARTIAL_COLS >= hidden
    assert p.chunks_per_block & (p.chunks_per_block - 1) == 0


def test_max_hidden():
    assert rmsnorm_backward.max_hidden(8, 2) == 16384
    assert rmsnorm_backward.max_hidden(8, 2, 4) == 8192
    assert rmsnorm_backward.max_hidden(4, 4) == 8192
    assert rmsnorm_backward.max_hidden(1, 2) == rmsnorm_backward.max_hidden(1, 4) == 4096


def test_instantiations_are_generated_from_the_planner():
    insts = rmsnorm_backward.instantiations()
    assert len({i.expression for i in insts}) == len(insts)
    for t, w in WEIGHTS:
        for hidden, vec in ((128, 16 // t.itemsize), (4096, 16 // t.itemsize), (989, 1), (4095, 1), (7, 1)):
            p = rmsnorm_backward.plan(hidden, 3, vec, t.itemsize, w.itemsize)
            assert p.instantiation(t, w) in insts
    for t in FLOAT_TYPES:
        assert rmsnorm_backward.tree_instantiation(t) in insts


def test_rstd_instantiations_are_listed():
    insts = set(rmsnorm.instantiations())
    for t, w in WEIGHTS:
        for fused in (False, True):
            p = rmsnorm.plan(4096, 1, 16 // t.itemsize, t.itemsize, fused=fused)
            inst = p.instantiation(t, w, fused, rstd=True)
            assert inst in insts and inst.args[-1] is True
            assert p.instantiation(t, w, fused) in insts  # the flag's default keeps the old name


def test_bytes_moved():
    shape, b = (16384, 4096), BFLOAT16
    grid = rmsnorm_backward.plan(4096, 16384, 8, 2).grid
    assert rmsnorm_backward.bytes_moved(shape, b) == 3 * 16384 * 4096 * 2
    assert rmsnorm_backward.bytes_moved(shape, b, b) == 3 * 16384 * 4096 * 2 + 2 * 4096 * 2 + 8 * grid * 4096
    assert rmsnorm_backward.bytes_moved(shape, b, dresidual=True, rstd=True) == 4 * 16384 * 4096 * 2 + 4 * 16384
    assert rmsnorm_backward.bytes_moved((0, 64), F32, F32) == 0


# ---- the dweight tree and the emulator (CPU) ----------------------------------------------------------

def _two_level(partials, group):
    """The kernels' split of column_tree's tree: aligned groups of ``group`` chunk rows added pairwise (one
    block's shared-memory tree), then column_tree over the groups' rows (16 lanes of S leaves)."""
    chunks = partials.shape[0]
    blocks = -(-chunks // group)
    padded = np.full((blocks * group,) + partials.shape[1:], -0.0, np.float32)
    padded[:chunks] = partials
    rows = padded.reshape(blocks, group, -1)
    while rows.shape[1] > 1:
        rows = rows[:, 0::2] + rows[:, 1::2]
    per_lane = rmsnorm_backward.leaves_per_lane(blocks)
    lanes = np.full((16 * per_lane,) + partials.shape[1:], -0.0, np.float32)
    lanes[:blocks] = rows[:, 0]
    subtrees = []
    for lane in range(16):  # a lane's binary-counter pushes: the perfect tree over its S leaves
        t = lanes[lane * per_lane:(lane + 1) * per_lane]
        while t.shape[0] > 1:
            t = t[0::2] + t[1::2]
        subtrees.append(t[0])
    s = np.stack(subtrees)
    while s.shape[0] > 1:
        s = s[0::2] + s[1::2]
    return s[0]


@pytest.mark.parametrize("chunks", [1, 2, 3, 15, 16, 17, 111, 512, 989])
def test_any_aligned_split_is_the_same_tree(chunks):
    """-0 padding is IEEE addition's identity: a block combining any power of two of chunks first gives
    column_tree_emulated's bits, signed zeros included."""
    rng = np.random.default_rng(chunks)
    p = (rng.standard_normal((chunks, 37)) * 10.0 ** rng.integers(-3, 4, (chunks, 37))).astype(np.float32)
    p[:, :3] = -0.0  # columns of -0 only: their sum must stay -0
    p[:, 3] = 0.0
    want = reference.column_tree_emulated(p)
    assert np.signbit(want[:3]).all() and not np.signbit(want[3])
    for group in (1, 2, 4, 32, 128):
        assert same_bits(_two_level(p, group), want), group


@pytest.mark.parametrize("rows,hidden", [(257, 2048), (300, 4096), (1001, 1024), (2049, 512), (4097, 256)])
def test_two_row_chunks_are_one_row_chunks(rows, hidden, monkeypatch):
    """Where the plan pairs rows that its targets leave one to a chunk, dweight keeps one-row chunks' bits:
    ``(-0 + a) + b`` is ``a + b``, signed zeros and odd row counts included."""
    assert rmsnorm_backward.chunk_rows(rows, hidden) == 2
    rng = np.random.default_rng(rows)
    x, dy = (rng.standard_normal((rows, hidden)).astype(BFLOAT16) for _ in range(2))
    x[:, :4], dy[:, :4] = 1.0, -0.0  # columns of -0 products only: their sum must stay -0
    w = rng.standard_normal(hidden).astype(np.float32)
    paired = reference.rms_norm_backward_emulated(dy, x, w)[1]
    monkeypatch.setattr(rmsnorm_backward, "chunk_rows", lambda rows, hidden: 1)
    single = reference.rms_norm_backward_emulated(dy, x, w)[1]
    assert np.signbit(single[:4]).all() and same_bits(paired, single)


@pytest.mark.parametrize("dtype,wdtype", WEIGHTS, ids=str)
@pytest.mark.parametrize("shape", [(1, 7), (111, 989), (3, 37, 128), (4095, 64), (5, 4096)])
def test_emulator_is_close_to_float64(dtype, wdtype, shape):
    rng = np.random.default_rng(sum(shape))
    x, dy, dr = (rng.standard_normal(shape).astype(dtype) for _ in range(3))
    w = rng.standard_normal(shape[-1]).astype(wdtype)
    for offset, with_dr in ((0.0, False), (1.0, True)):
        got_dx, got_dw = reference.rms_norm_backward_emulated(dy, x, w, 1e-6, offset, dresidual=dr if with_dr else None)
        want_dx, want_dw = reference.rms_norm_backward(dy, x, w, 1e-6, offset, dresidual=dr if with_dr else None)
        assert got_dx.dtype == dtype and got_dw.dtype == wdtype
        assert_close(got_dx, want_dx, dtype, terms=shape[-1])
        assert_close(got_dw, want_dw, wdtype, terms=math.prod(shape[:-1]))


def test_emulator_reuses_rstd_bits():
    """Given the forward's rstd (emulated), the result is the recomputing one's, bit for bit."""
    rng = np.random.default_rng(5)
    x, dy = (rng.standard_normal((37, 989)).astype(BFLOAT16) for _ in range(2))
    w = rng.standard_normal(989).astype(np.float32)
    rstd = reference.rms_norm_rstd_emulated(x, 1e-6)
    a = reference.rms_norm_backward_emulated(dy, x, w, 1e-6, 0.5, rstd=rstd)
    b = reference.rms_norm_backward_emulated(dy, x, w, 1e-6, 0.5)
    assert same_bits(a[0], b[0]) and same_bits(a[1], b[1])


def test_reference_is_the_gradient():
    """The float64 reference against central differences of rms_norm's float64 reference."""
    rng = np.random.default_rng(7)
    x, dy = rng.standard_normal((3, 6)), rng.standard_normal((3, 6))
    w = rng.standard_normal(6)
    dx, dw = reference.rms_norm_backward(dy, x, w, 1e-3, 1.0)
    h = 1e-6

    def loss(x, w):
        return float((reference.rms_norm(x, w, 1e-3, 1.0) * dy).sum())

    num_dx = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        e = np.zeros_like(x)
        e[i] = h
        num_dx[i] = (loss(x + e, w) - loss(x - e, w)) / (2 * h)
    num_dw = np.array([(loss(x, w + h * np.eye(6)[j]) - loss(x, w - h * np.eye(6)[j])) / (2 * h) for j in range(6)])
    np.testing.assert_allclose(dx, num_dx, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(dw, num_dw, rtol=1e-6, atol=1e-8)


@pytest.mark.nvrtc("rms_norm_backward")
@pytest.mark.parametrize("arch", ARCHS)
def test_machine_code_rounds_every_step(arch):
    """No fused multiply-add and no approximate division, square root or reciprocal: the emulator's roundings."""
    c = compiled("rms_norm_backward", arch)
    for inst in checked_instantiations("rms_norm_backward"):
        body = c.kernel_ptx(inst)
        assert "fma.rn.f32" not in body and ".approx" not in body, inst.expression
        assert not re.search(r"(?<!\w)(atom|red)\.", body), inst.expression  # no atomics: a fixed order


# ---- argument checks that need no GPU -------------------------------------------------------------

def _arrays(shape=(4, 64), dtype=np.float32):
    return unread_cupy_array(shape, dtype), unread_cupy_array(shape, dtype)


@pytest.mark.parametrize("kwargs,match", [
    ({"eps": float("nan")}, "eps"), ({"eps": float("inf")}, "eps"), ({"eps": -1.0}, "eps"),
    ({"offset": float("inf")}, "offset"),
])
def test_bad_scalars_are_refused(kwargs, match):
    dy, x = _arrays()
    with pytest.raises(ValueError, match=match):
        rmsnorm_backward.rms_norm_backward(dy, x, **kwargs)


def test_bad_arrays_are_refused():
    dy, x = _arrays()
    f = rmsnorm_backward.rms_norm_backward
    with pytest.raises(ValueError, match="dy has shape"):
        f(unread_cupy_array((4, 63)), x)
    with pytest.raises(TypeError, match="dy has dtype"):
        f(unread_cupy_array((4, 64), np.float16), x)
    with pytest.raises(ValueError, match="weight has shape"):
        f(dy, x, unread_cupy_array((63,)))
    with pytest.raises(TypeError, match="rstd has dtype"):
        f(dy, x, rstd=unread_cupy_array((4,), np.float16))
    with pytest.raises(ValueError, match="rstd has shape"):
        f(dy, x, rstd=unread_cupy_array((4, 1)))
    with pytest.raises(ValueError, match="dresidual has shape"):
        f(dy, x, dresidual=unread_cupy_array((3, 64)))
    with pytest.raises(TypeError, match="x has dtype"):
        f(unread_cupy_array((4, 64), np.int32), unread_cupy_array((4, 64), np.int32))
    with pytest.raises(ValueError, match="dx overlaps x"):
        f(dy, x, dx=x)
    with pytest.raises(TypeError, match="return_rstd"):
        rmsnorm.rms_norm(x, return_rstd=1)
    with pytest.raises(TypeError, match="return_rstd"):
        rmsnorm.rms_norm(x, return_rstd=True, scale="per_token", out_dtype="float8_e4m3fn")


# ---- GPU --------------------------------------------------------------------------------------------

def _randn(cp, shape, dtype, rng):
    return cp.asarray(rng.standard_normal(shape, dtype=np.float32)).astype(dtype)


def _poisoned(cp, shape, dtype):
    out = cp.empty(shape, dtype=dtype)
    out.fill(np.nan)
    return out


def _check(dy, x, w, offset, rstd, dr, got):
    """got = (dx, dweight) against the emulator's bits and the float64 reference's values."""
    want = reference.rms_norm_backward_emulated(dy, x, w, 1e-6, offset, rstd=rstd, dresidual=dr)
    assert same_bits(got[0], want[0]), "dx differs from the emulator"
    assert (got[1] is None) == (w is None)
    if w is not None:
        assert same_bits(got[1], want[1]), "dweight differs from the emulator"
    ref = reference.rms_norm_backward(dy, x, w, 1e-6, offset, dresidual=dr)
    assert_close(got[0], ref[0], x.dtype, terms=x.shape[-1])
    if w is not None:
        assert_close(got[1], ref[1], w.dtype, terms=max(1, math.prod(x.shape[:-1])))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,wdtype", WEIGHTS, ids=str)
@pytest.mark.parametrize("hidden", [7, 111, 128, 989, 4095, 4096, 8192])
@pytest.mark.parametrize("rows", [1, 3, 111, 989, 4095])
def test_matches_emulator_and_float64(dtype, wdtype, hidden, rows, rng):
    import cupy as cp

    if rows * hidden > 2**22:
        rows = 2**22 // hidden + 1
    x, dy, dr = (_randn(cp, (rows, hidden), dtype, rng) for _ in range(3))
    w = _randn(cp, hidden, wdtype, rng)
    offset = float(rng.choice([0.0, 1.0]))
    given = bool(rng.random() < 0.5)
    y, rstd = rmsnorm.rms_norm(x, w, 1e-6, offset=offset, return_rstd=True)
    out = _poisoned(cp, x.shape, dtype)
    got = rmsnorm_backward.rms_norm_backward(dy, x, w, eps=1e-6, offset=offset, rstd=rstd if given else None,
                                             dresidual=dr, dx=out)
    assert got[0] is out
    _check(dy, x, w, offset, rstd if given else None, dr, got)
    got = rmsnorm_backward.rms_norm_backward(dy, x, None, eps=1e-6, offset=offset)
    _check(dy, x, None, offset, None, None, got)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,wdtype", WEIGHTS, ids=str)
@pytest.mark.parametrize("hidden", [128, 989, 4096])
def test_return_rstd_is_the_forward_and_the_backward_recomputation(dtype, wdtype, hidden, rng):
    """The forward's rstd: the emulator's inv, out unchanged by asking for it; the backward without it gives
    the same bits as with it (its recomputation is the forward's tree)."""
    import cupy as cp

    x, dy = (_randn(cp, (257, hidden), dtype, rng) for _ in range(2))
    w = _randn(cp, hidden, wdtype, rng)
    y0 = rmsnorm.rms_norm(x, w, 1e-5)
    y, rstd = rmsnorm.rms_norm(x, w, 1e-5, return_rstd=True)
    assert rstd.dtype == F32 and rstd.shape == (257,)
    assert same_bits(y, y0)
    assert same_bits(rstd, reference.rms_norm_rstd_emulated(x, 1e-5))
    a = rmsnorm_backward.rms_norm_backward(dy, x, w, eps=1e-5, rstd=rstd)
    b = rmsnorm_backward.rms_norm_backward(dy, x, w, eps=1e-5)
    assert same_bits(a[0], b[0]) and same_bits(a[1], b[1])
    # the fused form: rstd of the updated residual, and the residual updated as without it
    r0 = _randn(cp, x.shape, dtype, rng)
    r1 = r0.copy()
    o0 = rmsnorm.fused_add_rms_norm(x, r0, w)
    o1, rstd1 = rmsnorm.fused_add_rms_norm(x, r1, w, return_rstd=True)
    assert same_bits(o0, o1) and same_bits(r0, r1)
    assert same_bits(rstd1, reference.rms_norm_rstd_emulated(r1, 1e-6))


@pytest.mark.gpu
def test_return_rstd_wide_rows_and_layouts(rng):
    """The wide kernels' rstd, a strided x, several launches and empty rows."""
    import cupy as cp

    for shape in ((3, 65536), (2, 3, 40000)):
        x = _randn(cp, shape, F32, rng)
        for fused in (False, True):
            r = _randn(cp, shape, F32, rng)
            y, rstd = (rmsnorm.fused_add_rms_norm(x, r, return_rstd=True) if fused
                       else rmsnorm.rms_norm(x, return_rstd=True))
            src = r if fused else x
            assert same_bits(rstd, reference.rms_norm_rstd_emulated(src, 1e-6))
    base = _randn(cp, (4, 6, 10, 96), BFLOAT16, rng)
    x = base[::2, 1:, ::3, :64]  # three leading levels that do not merge: several launches
    _, rstd = rmsnorm.rms_norm(x, return_rstd=True)
    assert rstd.shape == x.shape[:-1]
    assert same_bits(rstd, reference.rms_norm_rstd_emulated(x, 1e-6))
    y, rstd = rmsnorm.rms_norm(cp.zeros((3, 0), F32), return_rstd=True)
    assert rstd.shape == (3,) and bool(cp.isnan(rstd).all())


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fused_form_gradient(dtype, rng):
    """x = the residual after fused_add_rms_norm, dresidual the gradient at the residual output: dx is the
    gradient of both inputs, against float64."""
    import cupy as cp

    x, res, dy, dres = (_randn(cp, (111, 989), dtype, rng) for _ in range(4))
    w = _randn(cp, 989, dtype, rng)
    _, rstd = rmsnorm.fused_add_rms_norm(x, res, w, offset=1.0, return_rstd=True)
    got = rmsnorm_backward.rms_norm_backward(dy, res, w, offset=1.0, rstd=rstd, dresidual=dres)
    _check(dy, res, w, 1.0, rstd, dres, got)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_strided_misaligned_and_many_level_views(dtype, rng):
    import cupy as cp

    base = _randn(cp, (37, 4097), dtype, rng)
    dbase = _randn(cp, (37, 4097), dtype, rng)
    wbase = _randn(cp, 4097, dtype, rng)
    for x, dy, w in ((base[:, 1:], dbase[:, 1:], wbase[1:]), (base[::2, :4096], dbase[::2, 1:], wbase[:4096]),
                     (base[::-1, 1:], dbase[:, :4096], wbase[1:])):
        got = rmsnorm_backward.rms_norm_backward(dy, x, w)
        _check(dy, x, w, 0.0, None, None, got)
    b4 = _randn(cp, (4, 6, 10, 96), dtype, rng)
    x, dy = b4[::2, 1:, ::3, :64], b4[1::2, 1:, ::3, 32:]  # leading levels that do not merge: copied
    w = _randn(cp, 64, dtype, rng)
    rstd = cp.asarray(reference.rms_norm_rstd_emulated(x, 1e-6))[..., None]
    out = _poisoned(cp, (2, 5, 4, 64), dtype)[:, :, ::-1]
    got = rmsnorm_backward.rms_norm_backward(dy, x, w, rstd=rstd[..., 0], dx=out)
    assert got[0] is out
    _check(dy, x, w, 0.0, rstd[..., 0], None, got)


@pytest.mark.gpu
def test_in_place_and_empty(rng):
    import cupy as cp

    x, dy = (_randn(cp, (33, 4096), BFLOAT16, rng) for _ in range(2))
    w = _randn(cp, 4096, F32, rng)
    want = reference.rms_norm_backward_emulated(dy, x, w)
    dx, dw = rmsnorm_backward.rms_norm_backward(dy, x, w, dx=dy)
    assert dx is dy and same_bits(dx, want[0]) and same_bits(dw, want[1])
    for shape in ((0, 64), (5, 0), (0, 0), (2, 0, 7)):
        z = cp.zeros(shape, F32)
        dx, dw = rmsnorm_backward.rms_norm_backward(z, z, cp.ones(shape[-1], F32))
        assert dx.shape == shape and dw.shape == (shape[-1],) and not bool(dw.any())
        assert rmsnorm_backward.rms_norm_backward(z, z)[1] is None


@pytest.mark.gpu
@pytest.mark.parametrize("hidden", [128, 4096])
def test_same_bits_whatever_the_batch_and_layout(hidden, rng):
    """dx of a row does not depend on the rows around it; dweight not on the alignment (vector width, hence
    the block's chunk count), the strides or the GPU: only on the values and the row count."""
    import cupy as cp

    rows = 1000
    x, dy = (_randn(cp, (rows, hidden), BFLOAT16, rng) for _ in range(2))
    w = _randn(cp, hidden, BFLOAT16, rng)
    dx, dw = rmsnorm_backward.rms_norm_backward(dy, x, w)
    for lo, hi in ((0, 1), (5, 6), (17, 300), (999, 1000)):
        part = rmsnorm_backward.rms_norm_backward(dy[lo:hi], x[lo:hi], w)[0]
        assert same_bits(part, dx[lo:hi])
    xb, dyb = (cp.empty((rows, hidden + 1), BFLOAT16) for _ in range(2))
    xb[:, 1:], dyb[:, 1:] = x, dy  # one element in: element accesses, another plan
    dx2, dw2 = rmsnorm_backward.rms_norm_backward(dyb[:, 1:], xb[:, 1:], w)
    assert same_bits(dx2, dx) and same_bits(dw2, dw)


@pytest.mark.gpu
def test_large_batch_matches_emulator(rng):
    import cupy as cp

    x, dy = (_randn(cp, (4096, 4096), BFLOAT16, rng) for _ in range(2))
    w = _randn(cp, 4096, BFLOAT16, rng)
    got = rmsnorm_backward.rms_norm_backward(dy, x, w)
    _check(dy, x, w, 0.0, None, None, got)


@pytest.mark.gpu
def test_zero_gradient_keeps_signed_zero_columns(rng):
    """A column whose every term is -0 (dy = +0 against negative x) sums to -0 in every part of the tree."""
    import cupy as cp

    x = -cp.abs(_randn(cp, (300, 64), F32, rng))
    dy = cp.zeros((300, 64), F32)
    w = _randn(cp, 64, F32, rng)
    got = rmsnorm_backward.rms_norm_backward(dy, x, w)
    assert bool(cp.signbit(got[1]).all())
    _check(dy, x, w, 0.0, None, None, got)


@pytest.mark.gpu
def test_captured_in_a_graph(rng):
    """Captured after one eager call (which sizes the stream's workspace for the partial rows): the capture
    frees nothing, and a replay over new values writes the emulator's bits and no later array. A layout that
    is copied first is refused under capture, before anything is recorded."""
    import cupy as cp

    x, dy = (_randn(cp, (64, 512), F16, rng) for _ in range(2))
    w = _randn(cp, 512, F16, rng)
    xh, dyh = (rng.standard_normal((64, 512)).astype(F16) for _ in range(2))

    def refill():
        x[...], dy[...] = cp.asarray(xh), cp.asarray(dyh)

    stream = cp.cuda.Stream(non_blocking=True)
    got = replayed_alone(stream, lambda: rmsnorm_backward.rms_norm_backward(dy, x, w), refill)
    want = reference.rms_norm_backward_emulated(dyh, xh, w)
    assert same_bits(got[0], want[0]) and same_bits(got[1], want[1])
    b4 = _randn(cp, (4, 6, 10, 64), F16, rng)
    many = b4[::2, 1:, ::3]
    with stream:
        rmsnorm_backward.rms_norm_backward(many, many, w[:64])
    refused_in_capture(stream, lambda: rmsnorm_backward.rms_norm_backward(many, many, w[:64]))

