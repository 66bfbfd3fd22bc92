"""LayerNorm forward, fused add and backward: planning, chunking, the emulators against float64 and the
machine code's roundings on the CPU; bits against the emulators, float64 closeness, layouts, batch
invariance and empty inputs on the GPU (argument checks: tests/_record_launches.py's bad cases)."""

import dataclasses
import math

import numpy as np
import pytest
from _support import ARCHS, assert_close, compiled, same_bits

from cukern import layernorm, reference, rmsnorm
from cukern._dtypes import BFLOAT16, FLOAT_TYPES

F32, F16 = np.dtype(np.float32), np.dtype(np.float16)
DTYPES = [F32, F16, BFLOAT16]
WEIGHTS = [(d, d) for d in DTYPES] + [(F16, F32), (BFLOAT16, F32)]
HIDDEN = [1, 7, 111, 128, 989, 1000, 4095, 4096, 5120, 8191, 8192]


# ---- planning (pure, CPU) -------------------------------------------------------------------------

@pytest.mark.parametrize("kernel", ["forward", "fused", "backward"])
def test_every_row_length_plans_a_rows_kernel(kernel):
    """Every hidden up to MAX_HIDDEN, on every vector width the dtypes allow, holds its row in registers,
    with rms_norm's tile (so rms_norm's classes)."""
    for hidden in range(1, layernorm.MAX_HIDDEN + 1):
        for itemsize in (2, 4):
            for vec in sorted({1, rmsnorm.widest_vector(hidden, itemsize)}):
                p = layernorm.plan(kernel, hidden, 1000, vec, itemsize)
                t = p.tile
                assert t.kernel == "rows" and t.classes == rmsnorm.tree_classes(hidden)
                assert t.tpr * t.items * t.vec >= hidden


def test_plan_refuses_rows_past_the_limit():
    with pytest.raises(ValueError, match="8192"):
        layernorm.plan("forward", layernorm.MAX_HIDDEN + 1, 1, 1, 4)


def test_plan_tile_is_independent_of_row_count():
    for kernel in ("forward", "backward"):
        for hidden in (7, 128, 4096, 8192):
            tiles = {dataclasses.replace(layernorm.plan(kernel, hidden, rows, 1, 2).tile, rows=0, grid=0)
                     for rows in (1, 3, 257, 10**7)}
            assert len(tiles) == 1


def test_forward_holds_the_parameters_only_in_a_grid_of_one_wave():
    """The one row-count-dependent choice of the forward: where the weight and bias are loaded (no bit moves)."""
    for sm_count in (132, 78):
        for rows in (1, 256, 1000, 1056, 1057, 4096, 16384):
            p = layernorm.plan("forward", 4096, rows, 8, 2, sm_count)
            assert p.hold == (p.grid * p.tile.block <= sm_count * layernorm.ONE_WAVE_THREADS)
            assert p.instantiation(BFLOAT16, BFLOAT16).args[-1] is p.hold
        assert layernorm.plan("forward", 4096, 256, 8, 2, sm_count).hold
        assert not layernorm.plan("forward", 4096, 16384, 8, 2, sm_count).hold
    assert not any(layernorm.plan(k, 4096, 1, 8, 2).hold for k in ("fused", "backward"))
    held = {i.args[-1] for i in layernorm.instantiations() if i.name == "layer_norm_rows"}
    assert held == {True, False}


@pytest.mark.parametrize("rows", [1, 2, 511, 512, 513, 1000, 16384, 10**6, 2**31])
def test_chunks_depend_on_the_row_count_only(rows):
    r = layernorm.chunk_rows(rows)
    chunks = layernorm.chunk_count(rows)
    assert r & (r - 1) == 0 and chunks <= layernorm.MAX_CHUNKS and (chunks - 1) * r < rows <= chunks * r
    assert r == 1 or math.ceil(rows / (r // 2)) > layernorm.MAX_CHUNKS  # the least such power of two
    leaves = layernorm.tree_leaves(chunks)
    assert leaves >= max(chunks, 8 * layernorm.PARAM_LANES) and leaves & (leaves - 1) == 0
    # layer_norm_param_grads' stack holds 3 levels a thread: leaves / lanes / 8 pushes at most 7
    assert leaves // layernorm.PARAM_LANES // 8 <= 7


def _param_grads_split(partials):
    """layer_norm_param_grads' split of the chunk tree: PARAM_LANES lanes, each the perfect tree over its
    aligned tree_leaves / PARAM_LANES leaves (batches of eight, merged as a binary counter), then the lanes'
    subtrees pairwise in order."""
    chunks = partials.shape[0]
    leaves = layernorm.tree_leaves(chunks)
    t = np.full((leaves,) + partials.shape[1:], -0.0, np.float32)
    t[:chunks] = partials
    span = leaves // layernorm.PARAM_LANES  # a power of two: column_tree_emulated pads nothing within a lane
    lanes = t.reshape(layernorm.PARAM_LANES, span, -1)
    return reference.column_tree_emulated(np.stack([reference.column_tree_emulated(lane) for lane in lanes]))


@pytest.mark.parametrize("chunks", [1, 2, 3, 64, 255, 256, 257, 512])
def test_param_grads_lanes_split_the_one_tree(chunks):
    """However many lanes share the chunks, the tree is the emulator's: the padding with -0 is exact."""
    rng = np.random.default_rng(chunks)
    p = (rng.standard_normal((chunks, 37)) * 10.0 ** rng.integers(-3, 4, (chunks, 37))).astype(np.float32)
    p[:, :3] = -0.0  # columns of -0 only: their sum must stay -0
    want = reference.column_tree_emulated(p)
    assert np.signbit(want[:3]).all()
    assert same_bits(_param_grads_split(p), want)


def test_backward_grid_covers_the_chunks():
    for hidden, vec in ((7, 1), (128, 8), (4096, 8), (4095, 1), (8192, 1)):
        for rows in (1, 100, 5000, 16384):
            p = layernorm.plan("backward", hidden, rows, vec, 2)
            assert p.chunks == layernorm.chunk_count(rows) and p.chunk_rows == layernorm.chunk_rows(rows)
            assert p.grid * p.tile.rows_per_block >= p.chunks > (p.grid - 1) * p.tile.rows_per_block


def test_vector_widths_by_kernel_and_row_count():
    """The forward takes 16-byte vectors; the backward at most four elements, two when every chunk is one row
    (a plan choice: the bits do not change)."""
    for kernel in ("forward", "fused"):
        assert layernorm.plan(kernel, 4096, 16384, 8, 2).tile.vec == 8
    assert layernorm.plan("backward", 4096, layernorm.MAX_CHUNKS, 8, 2).tile.vec == 2
    assert layernorm.plan("backward", 4096, layernorm.MAX_CHUNKS + 1, 8, 2).tile.vec == 4
    assert layernorm.plan("backward", 4096, 10**6, 4, 4).tile.vec == 4
    assert layernorm.plan("backward", 4095, 10**6, 1, 2).tile.vec == 1


def test_instantiations_are_generated_from_the_planner():
    insts = layernorm.instantiations()
    exprs = {i.expression for i in insts}
    assert len(exprs) == len(insts)
    for kernel in ("forward", "fused", "backward"):
        assert layernorm.plan(kernel, 4096, 1, 8, 2).instantiation(BFLOAT16, BFLOAT16).expression in exprs
    assert {i.name for i in insts} == {"layer_norm_rows", "fused_add_layer_norm_rows", "layer_norm_backward_rows",
                                       "layer_norm_param_grads"}


def test_bytes_moved():
    n, h = 16384 * 4096, 4096
    assert layernorm.bytes_moved((16384, 4096), BFLOAT16, BFLOAT16, bias=True) == 4 * n + 4 * h
    assert layernorm.bytes_moved((16384, 4096), BFLOAT16, fused=True) == 8 * n
    assert layernorm.bytes_moved((16384, 4096), BFLOAT16, BFLOAT16, backward=True, stats=True) == (
        6 * n + 6 * h + 8 * 16384)


# ---- emulators (CPU) ------------------------------------------------------------------------------

def _data(rng, shape, dtype, shift=3.0):
    """Values with a mean away from 0 (the mean's subtraction matters) and magnitudes over 2^-6 .. 2^6."""
    v = rng.standard_normal(shape) * 2.0 ** rng.integers(-6, 6, shape) + shift
    return v.astype(np.float32).astype(dtype)


@pytest.mark.parametrize("dtype,wdtype", WEIGHTS, ids=str)
@pytest.mark.parametrize("hidden", [1, 7, 111, 989, 4095, 4096])
def test_emulators_are_close_to_the_reference(dtype, wdtype, hidden):
    rng = np.random.default_rng(hidden)
    rows = 37
    x, dy = _data(rng, (rows, hidden), dtype), _data(rng, (rows, hidden), dtype, 0.0)
    w, b = _data(rng, hidden, wdtype, 1.0), _data(rng, hidden, wdtype, 0.0)
    assert_close(reference.layer_norm_emulated(x, w, b), reference.layer_norm(x, w, b), dtype)
    assert_close(reference.layer_norm_emulated(x), reference.layer_norm(x), dtype)
    dx, dw, db = reference.layer_norm_backward_emulated(dy, x, w)
    rx, rw, rb = reference.layer_norm_backward(dy, x, w)
    assert dx.dtype == dtype and dw.dtype == wdtype and db.dtype == wdtype
    assert_close(dx, rx, dtype, terms=hidden)
    assert_close(dw, rw, wdtype, terms=rows)
    assert_close(db, rb, wdtype, terms=rows)


def test_fused_emulator_rounds_the_residual_once():
    rng = np.random.default_rng(1)
    x, r = _data(rng, (5, 300), BFLOAT16), _data(rng, (5, 300), BFLOAT16)
    new_r, out = reference.fused_add_layer_norm_emulated(x, r)
    assert np.array_equal(new_r, (x.astype(np.float64) + r.astype(np.float64)).astype(BFLOAT16))
    assert np.array_equal(out.view(np.uint16), reference.layer_norm_emulated(new_r).view(np.uint16))


def test_emulated_stats_are_the_backwards():
    """The backward given the forward's statistics and the backward computing them again give the same bits."""
    rng = np.random.default_rng(2)
    x, dy = _data(rng, (9, 1000), F16), _data(rng, (9, 1000), F16, 0.0)
    _, mean, rstd = reference.layer_norm_emulated(x, return_stats=True)
    given = reference.layer_norm_backward_emulated(dy, x, None, mean=mean, rstd=rstd)
    again = reference.layer_norm_backward_emulated(dy, x, None)
    assert given[1] is None and again[1] is None
    for a, b in ((given[0], again[0]), (given[2], again[2])):
        assert np.array_equal(a.view(np.uint16), b.view(np.uint16))


def test_the_chunking_is_visible_in_the_bits():
    """dbias of 1000 rows adds chunks of 2 rows, then 500 partials pairwise: not numpy's order, and a
    sequential sum of the rows gives other bits for values spread over many binades."""
    rng = np.random.default_rng(3)
    dy = (rng.standard_normal((1000, 64)) * 2.0 ** rng.integers(-20, 20, (1000, 64))).astype(np.float32)
    _, _, db = reference.layer_norm_backward_emulated(dy, np.ones_like(dy), None)
    pairs = dy.reshape(500, 2, 64)
    p = (pairs[:, 0] + pairs[:, 1]).astype(np.float32)
    p = np.concatenate([p, np.full((12, 64), -0.0, np.float32)])
    while p.shape[0] > 1:
        p = p[0::2] + p[1::2]
    assert np.array_equal(db, p[0])
    sequential = np.zeros(64, np.float32)
    for row in dy:
        sequential = sequential + row
    assert not np.array_equal(db, sequential)


@pytest.mark.nvrtc("layer_norm")
@pytest.mark.parametrize("arch", ARCHS)
def test_machine_code_rounds_every_step(arch):
    """Every float32 step is an explicitly rounded operation: no contracted fma.rn.f32, no approximate
    division, square root or reciprocal (which would differ from the emulators)."""
    ptx = compiled("layer_norm", arch).ptx
    assert "fma.rn.f32" not in ptx
    assert ".approx" not in ptx


# ---- GPU --------------------------------------------------------------------------------------------

def _same_bits(got, want):
    """``got`` (device or host) holds exactly ``want``'s bits and dtype; NaN only where ``want`` has NaN."""
    assert same_bits(got, want), (getattr(got, "dtype", None), want.dtype, getattr(got, "shape", None), want.shape)


def _gpu(cp, rng, shape, dtype, shift=3.0):
    return cp.asarray(_data(rng, shape, dtype, shift))


def _poisoned(cp, shape, dtype):
    out = cp.empty(shape, dtype=dtype)
    out.fill(np.nan)
    return out


def _rows_for(hidden):
    return max(1, min(300, 2**21 // hidden))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,wdtype", WEIGHTS, ids=str)
@pytest.mark.parametrize("hidden", HIDDEN)
def test_forward_bits_are_the_emulators(dtype, wdtype, hidden, rng):
    """layer_norm (weight and bias, weight only, neither; with its statistics) and fused_add_layer_norm
    write exactly the emulators' bits into poisoned outputs."""
    import cupy as cp

    rows = _rows_for(hidden)
    x = _gpu(cp, rng, (rows, hidden), dtype)
    w, b = _gpu(cp, rng, hidden, wdtype, 1.0), _gpu(cp, rng, hidden, wdtype, 0.0)
    out = _poisoned(cp, x.shape, dtype)
    got, mean, rstd = layernorm.layer_norm(x, w, b, eps=1e-5, out=out, return_stats=True)
    assert got is out and mean.dtype == F32 and rstd.dtype == F32 and mean.shape == (rows,)
    want, want_mean, want_rstd = reference.layer_norm_emulated(x, w, b, 1e-5, return_stats=True)
    _same_bits(got, want)
    _same_bits(mean, want_mean)
    _same_bits(rstd, want_rstd)
    _same_bits(layernorm.layer_norm(x, w, eps=3e-5), reference.layer_norm_emulated(x, w, None, 3e-5))
    _same_bits(layernorm.layer_norm(x, None, b), reference.layer_norm_emulated(x, None, b))
    _same_bits(layernorm.layer_norm(x), reference.layer_norm_emulated(x))
    r = _gpu(cp, rng, (rows, hidden), dtype, -1.0)
    want_r, want = reference.fused_add_layer_norm_emulated(x, r, w, b, 1e-5)
    out = _poisoned(cp, x.shape, dtype)
    got = layernorm.fused_add_layer_norm(x, r, w, b, eps=1e-5, out=out)
    assert got is out
    _same_bits(r, want_r)
    _same_bits(got, want)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("hidden", [7, 128, 989, 4096, 8192])
def test_forward_bits_on_both_sides_of_one_wave(dtype, hidden, rng):
    """The grids past one wave load the weight and bias after the statistics, those within it with the row
    (``Plan.hold``): the emulator's bits either way, and a row's bits the same in both."""
    import cupy as cp

    from cukern._launch import sm_count

    sms = sm_count(cp.cuda.Device().id)
    vec = rmsnorm.widest_vector(hidden, dtype.itemsize)
    rows = 1
    while layernorm.plan("forward", hidden, rows, vec, dtype.itemsize, sms).hold:
        rows *= 2
    assert layernorm.plan("forward", hidden, 3, vec, dtype.itemsize, sms).hold
    x = _gpu(cp, rng, (rows, hidden), dtype)
    w, b = _gpu(cp, rng, hidden, dtype, 1.0), _gpu(cp, rng, hidden, dtype, 0.0)
    for weight, bias in ((w, b), (w, None), (None, b), (None, None)):
        full = layernorm.layer_norm(x, weight, bias)
        ends = cp.concatenate([x[:3], x[-3:]])  # a row's bits are its own: the ends stand for every row
        _same_bits(cp.concatenate([full[:3], full[-3:]]), reference.layer_norm_emulated(ends, weight, bias))
        _same_bits(layernorm.layer_norm(x[:3], weight, bias), full[:3].get())


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,wdtype", WEIGHTS, ids=str)
@pytest.mark.parametrize("hidden", HIDDEN)
def test_backward_bits_are_the_emulators(dtype, wdtype, hidden, rng):
    """layer_norm_backward's dx, dweight and dbias are the emulator's bits, with the forward's statistics
    or without (computed again), with and without a weight and a dresidual, dx written into a poisoned
    array."""
    import cupy as cp

    rows = _rows_for(hidden) + 3  # chunks of several rows where the row count allows
    x, dy = _gpu(cp, rng, (rows, hidden), dtype), _gpu(cp, rng, (rows, hidden), dtype, 0.0)
    w = _gpu(cp, rng, hidden, wdtype, 1.0)
    _, mean, rstd = layernorm.layer_norm(x, w, return_stats=True)
    dx = _poisoned(cp, x.shape, dtype)
    got = layernorm.layer_norm_backward(dy, x, w, mean=mean, rstd=rstd, dx=dx)
    assert got[0] is dx
    want = reference.layer_norm_backward_emulated(dy, x, w, mean=mean, rstd=rstd)
    for g, e in zip(got, want):
        _same_bits(g, e)
    again = layernorm.layer_norm_backward(dy, x, w, eps=1e-5)
    for g, e in zip(again, want):  # the forward's tree, computed again: the same statistics, the same bits
        _same_bits(g, e)
    dres = _gpu(cp, rng, (rows, hidden), dtype, 0.0)
    got = layernorm.layer_norm_backward(dy, x, None, eps=2e-5, dresidual=dres)
    want = reference.layer_norm_backward_emulated(dy, x, None, 2e-5, dresidual=dres)
    assert got[1] is None and want[1] is None
    _same_bits(got[0], want[0])
    _same_bits(got[2], want[2])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [F16, BFLOAT16], ids=str)
@pytest.mark.parametrize("hidden", [1000, 4096])
def test_backward_bits_with_the_next_row_in_flight(dtype, hidden, rng):
    """Chunks of several rows in the half types' vector kernels, which load a chunk's next row while reducing
    its current one: with and without a weight, with a dresidual, the emulator's bits."""
    import cupy as cp

    rows = 2 * layernorm.MAX_CHUNKS + 77  # chunks of four rows, the last one short
    x, dy = _gpu(cp, rng, (rows, hidden), dtype), _gpu(cp, rng, (rows, hidden), dtype, 0.0)
    w = _gpu(cp, rng, hidden, dtype, 1.0)
    for g, e in zip(layernorm.layer_norm_backward(dy, x, w), reference.layer_norm_backward_emulated(dy, x, w)):
        _same_bits(g, e)
    dres = _gpu(cp, rng, (rows, hidden), dtype, 0.0)
    got = layernorm.layer_norm_backward(dy, x, None, dresidual=dres)
    want = reference.layer_norm_backward_emulated(dy, x, None, dresidual=dres)
    _same_bits(got[0], want[0])
    _same_bits(got[2], want[2])


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 2, 513, 1000, 5000, 16384])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_backward_bits_over_row_counts(rows, dtype, rng):
    """Every chunk length (1 to 32 rows) and partial counts from 1 to 512, against the emulator."""
    import cupy as cp

    hidden = 1024 if rows <= 5000 else 256
    x, dy = _gpu(cp, rng, (rows, hidden), dtype), _gpu(cp, rng, (rows, hidden), dtype, 0.0)
    w = _gpu(cp, rng, hidden, F32, 1.0)
    got = layernorm.layer_norm_backward(dy, x, w)
    for g, e in zip(got, reference.layer_norm_backward_emulated(dy, x, w)):
        _same_bits(g, e)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,wdtype", WEIGHTS, ids=str)
@pytest.mark.parametrize("hidden", [111, 989, 4095, 4096, 8192])
def test_close_to_float64(dtype, wdtype, hidden, rng):
    """Relative error against the float64 definitions: forward, dx, and dweight and dbias (sums over rows)."""
    import cupy as cp

    rows = 257
    x, dy = _gpu(cp, rng, (rows, hidden), dtype), _gpu(cp, rng, (rows, hidden), dtype, 0.0)
    w, b = _gpu(cp, rng, hidden, wdtype, 1.0), _gpu(cp, rng, hidden, wdtype, 0.0)
    assert_close(layernorm.layer_norm(x, w, b), reference.layer_norm(x, w, b), dtype)
    dx, dw, db = layernorm.layer_norm_backward(dy, x, w)
    rx, rw, rb = reference.layer_norm_backward(dy, x, w)
    assert_close(dx, rx, dtype, terms=hidden)
    assert_close(dw, rw, wdtype, terms=rows)
    assert_close(db, rb, wdtype, terms=rows)


@pytest.mark.gpu
def test_the_benchmark_shape(rng):
    """bf16 [16384, 4096]: forward and backward close to float64 and the backward's bits the emulator's."""
    import cupy as cp

    x, dy = _gpu(cp, rng, (16384, 4096), BFLOAT16), _gpu(cp, rng, (16384, 4096), BFLOAT16, 0.0)
    w, b = _gpu(cp, rng, 4096, BFLOAT16, 1.0), _gpu(cp, rng, 4096, BFLOAT16, 0.0)
    y, mean, rstd = layernorm.layer_norm(x, w, b, return_stats=True)
    err = cp.abs(y.astype(np.float64) - reference.layer_norm(x, w, b))
    assert float(err.max()) <= 0.05 * float(cp.abs(reference.layer_norm(x, w, b)).max())
    got = layernorm.layer_norm_backward(dy, x, w, mean=mean, rstd=rstd)
    for g, e in zip(got, reference.layer_norm_backward_emulated(dy, x, w, mean=mean, rstd=rstd)):
        _same_bits(g, e)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_misaligned_and_strided_views(dtype, rng):
    """Views one element in (the element path), every other row, reversed rows, a 3-D layout of two row
    levels and a 4-D one of three (several forward launches; the backward's copies): the emulators' bits,
    which are those of the same values laid out contiguously."""
    import cupy as cp

    base = _gpu(cp, rng, (38, 4097), dtype)
    dbase = _gpu(cp, rng, (38, 4097), dtype, 0.0)
    base4 = _gpu(cp, rng, (2, 3, 7, 4097), dtype)
    dbase4 = _gpu(cp, rng, (2, 3, 7, 4097), dtype, 0.0)
    w = _gpu(cp, rng, 4097, dtype, 1.0)[1:]
    views = [(base[:, 1:], dbase[:, 1:]), (base[:, :4096], dbase[:, :4096]), (base[::2, 1:], dbase[::2, 1:]),
             (base[::-1, 1:], dbase[::-1, 1:]),
             (base[:, 1:].reshape(2, 19, 4096)[:, ::2], dbase[:, 1:].reshape(2, 19, 4096)[:, ::2]),
             (base4[:, ::2, ::2, 1:], dbase4[:, ::2, ::2, 1:])]
    for x, dy in views:
        want, want_mean, want_rstd = reference.layer_norm_emulated(x, w, w, return_stats=True)
        got, mean, rstd = layernorm.layer_norm(x, w, w, return_stats=True)
        _same_bits(got, want)
        _same_bits(mean, want_mean)
        _same_bits(rstd, want_rstd)
        got = layernorm.layer_norm_backward(dy, x, w)
        for g, e in zip(got, reference.layer_norm_backward_emulated(dy, x, w)):
            _same_bits(g, e)
        rv = cp.empty((x.shape[0] * 2,) + x.shape[1:], dtype)[::2]
        rv[...] = x
        want_r, want = reference.fused_add_layer_norm_emulated(dy, rv, w, None)
        _same_bits(layernorm.fused_add_layer_norm(dy, rv, w), want)
        _same_bits(rv, want_r)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("hidden", [128, 989, 4096])
def test_batch_invariance(dtype, hidden, rng):
    """A row's outputs and dx do not depend on the rows around it or their count."""
    import cupy as cp

    x, dy = _gpu(cp, rng, (1000, hidden), dtype), _gpu(cp, rng, (1000, hidden), dtype, 0.0)
    w, b = _gpu(cp, rng, hidden, dtype, 1.0), _gpu(cp, rng, hidden, dtype, 0.0)
    full = layernorm.layer_norm(x, w, b)
    dfull = layernorm.layer_norm_backward(dy, x, w)[0]
    for lo, hi in ((0, 1), (17, 18), (3, 700), (999, 1000)):
        _same_bits(layernorm.layer_norm(x[lo:hi], w, b), full[lo:hi].get())
        _same_bits(layernorm.layer_norm_backward(dy[lo:hi], x[lo:hi], w)[0], dfull[lo:hi].get())


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_in_place(dtype, rng):
    """out=x in the forward, dx=dy in the backward."""
    import cupy as cp

    x, dy = _gpu(cp, rng, (50, 777), dtype), _gpu(cp, rng, (50, 777), dtype, 0.0)
    w = _gpu(cp, rng, 777, dtype, 1.0)
    want_dx = reference.layer_norm_backward_emulated(dy, x, w)
    got = layernorm.layer_norm_backward(dy, x, w, dx=dy)
    assert got[0] is dy
    for g, e in zip(got, want_dx):
        _same_bits(g, e)
    want = reference.layer_norm_emulated(x, w)
    assert layernorm.layer_norm(x, w, out=x) is x
    _same_bits(x, want)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_nan_and_inf_rows(dtype, rng):
    """A NaN or infinity makes its own row NaN and leaves the others as they are."""
    import cupy as cp

    x = _gpu(cp, rng, (4, 300), dtype)
    x[1, 7] = np.nan
    x[2, 0] = np.inf
    out = layernorm.layer_norm(x)
    _same_bits(out, reference.layer_norm_emulated(x))
    host = out.get().astype(np.float32)
    assert np.isnan(host[1]).all() and np.isnan(host[2]).all() and np.isfinite(host[[0, 3]]).all()


@pytest.mark.gpu
def test_empty_inputs():
    """Nothing to normalize: empty outputs (NaN statistics for rows of no element); no rows: zero gradients."""
    import cupy as cp

    for shape in ((0, 4096), (4, 0), (0,)):
        x = cp.empty(shape, dtype=BFLOAT16)
        assert layernorm.layer_norm(x).shape == shape
        out, mean, rstd = layernorm.layer_norm(x, return_stats=True)
        assert mean.shape == shape[:-1] and bool(cp.isnan(mean).all()) and bool(cp.isnan(rstd).all())
        assert layernorm.fused_add_layer_norm(x, cp.empty_like(x)).shape == shape
    dx, dw, db = layernorm.layer_norm_backward(cp.empty((0, 64), F32), cp.empty((0, 64), F32), cp.ones(64, F32))
    assert dx.shape == (0, 64) and not bool(dw.any()) and not bool(db.any()) and dw.shape == db.shape == (64,)


def test_every_float_type_is_planned():
    assert {t for t in FLOAT_TYPES} == set(DTYPES)
