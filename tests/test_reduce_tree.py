"""The reductions' one tree: references, the exact emulators, and a blocked simulation of every kernel and of
every plan the tuner can pick giving the emulators' bits (CPU); on the GPU, every result has the emulators'
bits whatever the layout, knobs, rows or SM count."""

import itertools

import numpy as np
import pytest
from _reduce_support import (ALL_DTYPES, CHAINS, CHAIN_LENGTH, LEAF, OP_NAMES, REFS, _Tree, _by_definition, _cdiv,
                             _chunk, _col_leaf, _col_split, _data, _extreme, _full_split, _row, _row_split, _strided,
                             _tuner_knobs)

from cukern import reference
from cukern.reference import reductions as tree
from cukern import reduce as R
from cukern import reduce_plan as P
from cukern._dtypes import dtype_name


# ---------------------------------------------------------------------------------------------------------
# References.


def test_references_match_numpy(rng):
    x = rng.standard_normal((5, 7)).astype(np.float32)
    assert np.allclose(reference.reduce_sum(x, 1), x.astype(np.float64).sum(1))
    assert np.allclose(reference.reduce_norm(x), np.linalg.norm(x.astype(np.float64)))
    assert np.allclose(reference.reduce_mean(x, 0, keepdims=True), x.astype(np.float64).mean(0, keepdims=True))
    assert reference.reduce_amax(x) == x.max() and reference.reduce_amin(x) == x.min()
    i = np.array([2**31 - 1, 2**31 - 1], dtype=np.int32)
    assert reference.reduce_sum(i) == 2**32 - 2  # widened before summing
    assert reference.reduce_sum_of_squares(i) == 2 * (2**31 - 1) ** 2
    assert np.isnan(reference.reduce_amax(np.array([1.0, np.nan, 3.0])))


def test_tolerance_scales_with_size():
    t1 = reference.reduction_tolerance(1000, np.float32, 1000.0)
    t2 = reference.reduction_tolerance(10**8, np.float32, 1000.0)
    assert 0 < t1 < t2
    assert reference.reduction_tolerance(10**8, np.int64, 1.0) == 0.0


# ---------------------------------------------------------------------------------------------------------
# The tree: the emulators compute the documented tree, and a blocked simulation of each kernel
# (its lanes, chains, shuffles, span stacks, blocks and launches, with the kernel's own index arithmetic)
# gives the emulators' bits for every launch shape, so no launch parameter can change a result.


def _same_or_nan(a, b) -> bool:
    """Equal bits, or both NaN (NaN payloads are not part of the contract)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype.kind == "f" and np.isnan(a) and np.isnan(b):
        return True
    return a.tobytes() == b.tobytes()


def _emulated_tree(t: _Tree, v, op: int):
    return reference.reduction_tree(np.asarray(v, t.a)[None], t.combine, t.identity)[0]


def _awkward(rng, n: int, a, op: int):
    """Random values with signed zeros, and a NaN now and then for max and min."""
    v = rng.standard_normal(n).astype(a)
    v[rng.random(n) < 0.05] = 0.0
    v[rng.random(n) < 0.05] = -0.0
    if op in (P.OP_MAX, P.OP_MIN) and n > 3 and rng.random() < 0.3:
        v[int(rng.integers(n))] = np.nan
    return v


@pytest.mark.parametrize("a", [np.float32, np.float64])
def test_scalar_extremes_are_the_references(a):
    special = [np.nan, -np.inf, -1.5, -0.0, 0.0, 1.5, np.inf]
    for op, larger in ((tree._tree_max, True), (tree._tree_min, False)):
        for x in special:
            for y in special:
                x_, y_ = a(x), a(y)
                assert _same_or_nan(_extreme(x_, y_, larger), op(np.asarray(x_), np.asarray(y_))), (x, y, larger)


def test_emulator_is_the_documented_tree(rng):
    for n in (1, 2, 31, 32, 33, 255, 256, 257, 1000, 2049, 5000):
        for op, a in ((P.OP_SUM, np.float32), (P.OP_SUM, np.float64), (P.OP_MAX, np.float32),
                      (P.OP_MIN, np.float64)):
            t = _Tree(op, a)
            v = _awkward(rng, n, a, op)
            assert _same_or_nan(_emulated_tree(t, v, op), _by_definition(t, v)), (n, op, a)


@pytest.mark.parametrize("itemsize, a", [(4, np.float32), (2, np.float32), (8, np.float64)])
def test_every_kernel_is_a_split_of_the_tree(rng, itemsize, a):
    """Simulated element by element: reduce_full for several blocks and grids (spans of one and of
    several chunks, empty warps and blocks), reduce_rows for every threads-per-row choice, reduce_cols
    for both chain counts and several spans, reduce_strided: each gives the emulator's bits."""
    for n in (2, 33, 257, 1025, 2100):  # 2100: 9 leaves, 2 to 5 chunks by itemsize, the last one partial
        for op in (P.OP_SUM, P.OP_MAX, P.OP_MIN):
            t = _Tree(op, a)
            v = _awkward(rng, n, a, op)
            want = _emulated_tree(t, v, op)
            cv = P.lane_elements(itemsize)
            size = P.chunk_elements(itemsize)
            chunks = [_chunk(t, v, q * size, 32, cv) for q in range(_cdiv(n, size))]
            # a 1024-thread block (its last-block fold simulated lane by lane: most of this test's time) once
            for block, grid in ((64, 1), (64, 3), (256, 2)) + (((1024, 1),) if n == 2100 else ()):
                assert _same_or_nan(_full_split(t, chunks, block, grid), want), ("full", n, op, block, grid)
            for tpr in sorted({P.row_tpr(n, itemsize), 32, 64, 256}):
                assert _same_or_nan(_row(t, v, itemsize, tpr), want), ("rows", n, op, tpr)
            for q in (1, 4):
                leaves = [_col_leaf(t, v, k, q) for k in range(_cdiv(n, LEAF))]
                for span in (1, 2, 8):
                    assert _same_or_nan(_col_split(t, leaves, span, _cdiv(len(leaves), span)), want), \
                        ("cols", n, op, q, span)
            assert _same_or_nan(_strided(t, v), want), ("strided", n, op)


def test_strided_kernel_carries_its_division_right():
    """reduce_strided divides once a leaf and carries the quotient along the chain (32 apart)."""
    for r_inner in (1, 2, 5, 31, 32, 33, 1000):
        count = 3 * r_inner + 700
        step_q, step_r = divmod(CHAINS, r_inner)
        for k in range(_cdiv(count, LEAF)):
            for lane in range(32):
                q, rem = divmod(k * LEAF + lane, r_inner)
                for m in range(CHAIN_LENGTH):
                    r = k * LEAF + m * CHAINS + lane
                    assert (q, rem) == divmod(r, r_inner), (r_inner, r)
                    q, rem = q + step_q, rem + step_r
                    if rem >= r_inner:
                        q, rem = q + 1, rem - r_inner


def test_every_plan_the_tuner_can_pick_is_a_split_of_the_tree(rng):
    """For every knob point and an SM count of 108 (A100), 132 (H200) or 142 (L40), the planners'
    launches are splits of the same tree: simulated over random chunk (or leaf) values, each gives the tree
    over those values, bit for bit. Sizes large enough that the grid caps bind and warps take spans."""
    t = _Tree(P.OP_SUM, np.float32)
    values = [np.float32(x) for x in rng.standard_normal(1 << 14)]
    seen = set()
    for knobs in _tuner_knobs():
        for sm in (108, 132, 142):
            for n, itemsize in ((1 << 22, 4), ((1 << 23) + 77, 2), ((1 << 21) + 5, 8)):
                f = P.plan_full(n, itemsize, sm, knobs)
                assert f.grid <= min(P.FULL_FOLD * f.block, P.FULL_PARTIALS) and CHAIN_LENGTH % f.unroll == 0
                chunks = values[:_cdiv(n, P.chunk_elements(itemsize))]
                if (f.block, f.grid, len(chunks)) not in seen:
                    seen.add((f.block, f.grid, len(chunks)))
                    assert _full_split(t, chunks, f.block, f.grid, lanes=False) == t.pairs(chunks), (knobs, sm, n)
            for length, itemsize in ((16384, 4), (4095, 2), (1 << 22, 4), (100, 8), (3, 4), (1000, 4)):
                r = P.plan_rows(length, 4096, itemsize, sm, knobs)
                assert r.block == P.row_block(r.tpr) and r.block % r.tpr == 0 and r.tpr & (r.tpr - 1) == 0
                group = min(r.tpr, 32)
                chunks = values[:_cdiv(length, group * P.lane_elements(itemsize) * CHAIN_LENGTH)]
                if (r.tpr, len(chunks)) not in seen:
                    seen.add((r.tpr, len(chunks)))
                    assert _row_split(t, chunks, r.tpr) == t.pairs(chunks), (knobs, sm, length)
    for sm in (108, 132, 142):
        for shape in ((16384, 32768), (4096, 64), (1 << 20, 3), (300, 5), (1 << 21, 1024)):
            c = P.plan(shape, np.float32, 0, sm_count=sm).kernel
            leaves = values[:_cdiv(shape[0], LEAF)]
            assert c.span & (c.span - 1) == 0
            assert _col_split(t, leaves, c.span, c.spans) == t.pairs(leaves), (sm, shape)


def test_emulators_follow_the_references_and_numpy(rng):
    """The emulators' dtypes and shapes are the ops' (NumPy's rules), their values the float64 references'
    within the sum tolerance; one-element reductions copy (-0.0 stays -0.0); empty ones fill or raise."""
    x = rng.standard_normal((5, 300, 7)).astype(np.float32)
    for name in OP_NAMES:
        fn = getattr(reference, f"{name}_emulated")
        for axis in (None, 1, (0, 2), -1):
            for keepdims in (False, True):
                got = fn(x, axis=axis, keepdims=keepdims)
                want = REFS[name](x, axis=axis, keepdims=keepdims)
                assert got.dtype == P.result_dtype(name, x.dtype) and got.shape == np.shape(want)
                assert np.allclose(got, want, rtol=1e-5, atol=1e-4), (name, axis)
    xi = rng.integers(-2**31, 2**31, (4, 999), dtype=np.int64).astype(np.int32)
    assert np.array_equal(reference.sum_emulated(xi, axis=1), xi.astype(np.int64).sum(1))
    assert reference.sum_emulated(xi, axis=1, dtype=np.int32).dtype == np.int32
    h = rng.standard_normal(3000).astype(np.float16)
    assert reference.sum_emulated(h).dtype == np.float16
    assert reference.sum_emulated(h, dtype=np.float64) == reference.sum_emulated(h.astype(np.float64))
    assert np.signbit(reference.sum_emulated(np.array([[-0.0]], np.float32), axis=1)[0])
    assert not np.signbit(reference.sum_emulated(np.array([-0.0, -0.0], np.float32)))  # chains start at +0
    assert reference.sum_of_squares_emulated(np.array([3.0], np.float16)) == 9.0
    assert np.isnan(reference.mean_emulated(np.zeros((2, 0), np.float32), axis=1)).all()
    with pytest.raises(ValueError, match="zero-size"):
        reference.amax_emulated(np.zeros(0, np.float32))
    z = np.array([0.0, -0.0, -0.0], np.float32)
    assert not np.signbit(reference.amax_emulated(z)) and np.signbit(reference.amin_emulated(z))
    assert np.isnan(reference.amin_emulated(np.array([1.0, np.nan, 0.5], np.float32)))


def test_integer_sum_emulators_are_exact_in_64_bits(rng):
    """The emulators lower x as cukern does (reduce_plan.route: uint64 read as int64, uint32 converted to
    int64), so 64-bit integer sums are NumPy's exactly: values above 2^53, int64 near 2^63, and uint64 sums
    wrapping modulo 2^64."""
    x = np.array([2**40, 3, 5], np.uint64)
    assert reference.sum_emulated(x) == np.uint64(2**40 + 8) and reference.sum_emulated(x).dtype == np.uint64
    big = np.array([2**53 + 1, 2**60 + 3, 7], np.uint64)
    assert reference.sum_emulated(big) == big.sum() == np.uint64(2**53 + 2**60 + 11)
    wrap = np.array([2**64 - 1, 2**63 + 5, 2**63, 9], np.uint64)
    assert reference.sum_emulated(wrap) == wrap.sum() == np.uint64(13)  # modulo 2^64
    u = rng.integers(0, 2**64 - 1, (3, 1000), dtype=np.uint64, endpoint=True)
    i = rng.integers(2**62, 2**63 - 1, (3, 1000), dtype=np.int64)  # near 2^63: the int64 sums wrap too
    for axis in (None, 0, 1):
        for v in (u, i, i.astype(np.uint64), u[:, :1]):
            got, want = reference.sum_emulated(v, axis=axis), v.sum(axis=axis)
            assert got.dtype == want.dtype and np.array_equal(got, want), (v.dtype, axis)
            assert np.array_equal(reference.nansum_emulated(v, axis=axis), want), (v.dtype, axis)
        for t in (np.uint64, np.int64, np.int32):
            assert np.array_equal(reference.sum_emulated(i, axis=axis, dtype=t), i.sum(axis=axis, dtype=t))
    s = np.array([2**32 - 1, 2**32 - 1, 2], np.uint32)
    assert reference.sum_emulated(s) == s.sum() == np.uint64(2**33)
    # nansum of floats into an integer dtype: NaN -> 0 in x's dtype, then NumPy's conversion.
    f = np.array([[1.5, np.nan, 2.0, -7.9], [np.nan] * 4], np.float32)
    for t in (np.int32, np.int64):
        for axis in (None, 1):
            got = reference.nansum_emulated(f, axis=axis, dtype=t)
            assert got.dtype == t and np.array_equal(got, np.nansum(f, axis=axis, dtype=t)), (t, axis)
    assert np.array_equal(reference.nansum_emulated(f[:, 1:2], axis=1, dtype=np.int64), [0, 0])


# ---------------------------------------------------------------------------------------------------------
# On the GPU: every result has the emulator's bits, whatever the layout, knobs, rows or SM count.


def _emulated_bits_match(name, got, xh, axis) -> bool:
    want = getattr(reference, f"{name}_emulated")(xh, axis=axis)
    import cupy

    g = cupy.asnumpy(got)
    return g.dtype == want.dtype and g.shape == np.shape(want) and g.tobytes() == np.asarray(want).tobytes()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_name)
def test_every_op_has_the_emulators_bits(rng, dtype):
    """Random shapes (odd and prime lengths), strided, negative-stride and misaligned views, every axis
    class: the GPU returns the emulator's bits."""
    import cupy

    shapes = [(1,), (2,), (255,), (257,), (65537,), (1000003,), (3, 1), (7, 4099), (129, 513), (3, 5, 2, 7),
              (2, 311, 67)]
    for shape in shapes:
        xh = _data(rng, shape, dtype, signed=np.dtype(dtype).kind != "b")
        x = cupy.asarray(xh)
        views = [(x, xh)]
        if len(shape) >= 2 and shape[-1] > 2:
            views += [(x[..., 1:], xh[..., 1:]), (x[..., ::-2], xh[..., ::-2]), (x[::-1], xh[::-1])]
        axes = [None] + list(range(len(shape))) + ([(0, len(shape) - 1)] if len(shape) > 2 else [])
        for view, vh in views:
            for axis in axes:
                for name in OP_NAMES:
                    if np.dtype(dtype) not in P.OPS[name].inputs:
                        continue
                    got = getattr(R, name)(view, axis=axis)
                    assert _emulated_bits_match(name, got, vh, axis), (name, shape, view.strides, axis)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [2**27 + 257])
def test_large_sums_have_the_emulators_bits(rng, n):
    import cupy

    x = cupy.random.default_rng(int(rng.integers(2**31))).standard_normal(n, dtype=np.float32)
    xh = cupy.asnumpy(x)
    for name in ("sum", "norm", "amax"):
        assert _emulated_bits_match(name, getattr(R, name)(x), xh, None), (name, n)
    rows = x[: n - n % 1024].reshape(-1, 1024)
    assert _emulated_bits_match("sum", R.sum(rows, axis=1), xh[: n - n % 1024].reshape(-1, 1024), 1)
    cols = x[: n - n % 4096].reshape(-1, 4096)
    assert _emulated_bits_match("sum", R.sum(cols, axis=0), xh[: n - n % 4096].reshape(-1, 4096), 0)


def _space_points(op: str):
    from cukern.lab.reduce import SPACES

    names = list(SPACES[op])
    for values in itertools.product(*(SPACES[op][k] for k in names)):
        yield P.Knobs(**dict(zip(names, values)))


@pytest.mark.gpu
def test_every_knob_setting_and_sm_count_gives_the_same_bits(rng):
    """Every point of the tuner's space, and plans made for 108 SMs (A100), 132 (H200) and 142 (L40),
    launched here: the emulator's bits each time."""
    import cupy

    cases = [(((1 << 20) + 3,), None), ((1 << 22,), None), ((257, 16411), -1), ((33, 4096), -1), ((4099, 260), 0),
             ((2, 3000, 70), 1)]
    for shape, axis in cases:
        xh = _data(rng, shape, np.float32, signed=True)
        x = cupy.asarray(xh)
        want = {name: getattr(reference, f"{name}_emulated")(xh, axis=axis).tobytes() for name in ("sum", "norm")}
        knobs = list(_space_points("sum")) + list(_space_points("sum_rows"))
        for k in knobs[:: 3 if len(shape) == 1 else 1]:
            for sm in (108, 132, 142):
                got = R._reduce("sum", x, axis, None, False, None, knobs=k, sm=sm)
                assert cupy.asnumpy(got).tobytes() == want["sum"], (shape, axis, k, sm)
            got = R._reduce("norm", x, axis, None, False, None, knobs=k)
            assert cupy.asnumpy(got).tobytes() == want["norm"], (shape, axis, k)


@pytest.mark.gpu
@pytest.mark.parametrize("length", [1, 33, 1000, 4096, 65537])
def test_a_rows_bits_do_not_depend_on_the_row_count(rng, length):
    import cupy

    row = _data(rng, (length,), np.float32, signed=True)
    want = None
    for rows in (1, 255, 256, 4096):
        xh = np.tile(row, (rows, 1))
        xh[1::2] = _data(rng, (len(xh[1::2]), length), np.float32, signed=True)  # other rows differ
        for name in ("sum", "norm", "amax"):
            got = cupy.asnumpy(getattr(R, name)(cupy.asarray(xh), axis=1))
            cols = cupy.asnumpy(getattr(R, name)(cupy.asarray(np.ascontiguousarray(xh.T)), axis=0))
            first = (got[0].tobytes(), cols[0].tobytes())
            if want is None or name not in want:
                want = {**(want or {}), name: first}
            assert first == want[name] and first[0] == first[1], (name, rows, length)
