"""segment_sum, segment_max, segment_min, segment_mean: planning and the emulator on the host, the compiled
kernels' resources, and on a GPU every dtype, layout and offsets form against the emulator (bits) and the
float64 reference (closeness)."""

from __future__ import annotations

import re

import numpy as np
import pytest
from _support import (
    ARCHS,
    assert_close,
    assert_no_spills,
    checked_instantiations,
    compiled,
    ptxas_ran,
    same_bits,
    struct_fields,
)

from cukern import reference as R
from cukern import segment as S
from cukern._dtypes import BFLOAT16, dtype_name

OPS = tuple(S.OPS)
F32 = np.dtype(np.float32)


def _values(rng, shape, dtype):
    """Standard normal floats; integers over their whole range (so sums wrap); bools half true."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(bool)
    if dtype.kind in "iu":
        return rng.integers(np.iinfo(dtype).min, np.iinfo(dtype).max, shape, dtype=dtype, endpoint=True)
    return rng.standard_normal(shape).astype(dtype)


def _offsets(rng, rows, segments, *, empties=True):
    cuts = np.sort(rng.integers(0, rows + 1, segments - 1)) if segments > 1 else np.zeros(0, np.int64)
    o = np.concatenate([[0], cuts, [rows]]).astype(np.int64)
    if empties and segments > 3:
        o[2] = o[1]  # at least one empty segment
    return o


# ---------------------------------------------------------------------------------------------------------
# Planning (pure).


def test_kernel_choice_and_grid():
    p = S.plan((1 << 20,), 1000)
    assert (p.kernel, p.grid, p.block, p.cols, p.row_stride) == ("warp", (500, 1), S.WARP_BLOCK, 1, 1)
    p = S.plan((1000, 3), 7)
    assert (p.kernel, p.grid, p.cols, p.row_stride, p.col_stride) == ("warp", (4, 3), 3, 3, 1)
    p = S.plan((1000, 4, 33), 7)
    assert (p.kernel, p.grid, p.cols, p.row_stride, p.col_stride) == ("cols", (7, 2), 132, 132, 1)
    assert S.plan((10, 5), 0).kernel is None and S.plan((10, 0), 3).kernel is None


def test_runs_of_segments_keep_enough_warps():
    assert S.plan((1 << 20,), 1000).run == 1
    for segments, cols in ((1 << 20, 1), (100_003, 1), (100_003, 3), (1 << 15, 31), (5 << 20, 1)):
        p = S.plan((1 << 22, cols), segments)
        assert p.kernel == "warp" and 1 <= p.run <= S.RUN_MAX
        assert p.grid[0] * (S.WARP_BLOCK // 32) * p.run >= segments  # every segment has a warp
        assert p.run == S.RUN_MAX or p.grid[0] * p.grid[1] * (S.WARP_BLOCK // 32) >= S.RUN_WARPS
    assert S.plan((1 << 28,), 1 << 20).run == 16  # the benchmark's case: 2^16 warps
    assert S.plan((1 << 28,), 1 << 22).run == S.RUN_MAX


def test_layouts_that_are_copied():
    assert not S.plan((100, 8), 3, strides=(-16, 2)).copy
    assert S.plan((100, 8), 3, strides=(-16, 2)).row_stride == -16
    assert S.plan((100, 4, 8), 3, strides=(64, 1, 4)).copy  # trailing axes transposed: two levels
    assert not S.plan((100, 4, 8), 3, strides=(64, 16, 2)).copy


def test_too_many_columns():
    with pytest.raises(ValueError, match="columns"):
        S.plan((2, S.MAX_GRID_Y * S.COL_BLOCK + 1), 1)


def test_every_plan_uses_a_listed_instantiation():
    insts = set(S.instantiations())
    # floats: sum (a mean is its sum's kernel), max, min; integers and bool a mean kernel as well
    assert len(insts) == 2 * (3 * len(S.FLOAT_DTYPES) + 4 * len(S.INT_DTYPES)) * len(S.OFFSET_DTYPES)
    for shape in [(1000,), (1000, 3), (1000, 64)]:
        p = S.plan(shape, 5)
        for dt in S.DTYPES:
            for name, (op, _) in S.OPS.items():
                for o in S.OFFSET_DTYPES:
                    assert p.instantiation(dt, op, o, S.result_dtype(name, dt)) in insts


def test_params_match_the_struct():
    assert struct_fields(S.SOURCE, "SegParams") == S.PARAMS.fields


def test_bytes_moved():
    assert S.bytes_moved((1 << 28,), F32, 1 << 20) == (1 << 30) + ((1 << 20) + 1) * 8 + (1 << 20) * 4
    assert S.bytes_moved((100, 3), np.float16, 7, np.int32) == 600 + 8 * 4 + 7 * 3 * 2


# ---------------------------------------------------------------------------------------------------------
# The emulator on the host.


def test_result_dtypes_are_numpys():
    for dt in S.DTYPES:
        x = np.zeros((2, 3), dt)
        assert S.result_dtype("segment_max", dt) == S.result_dtype("segment_min", dt) == dt
        if dt in S.INT_DTYPES:
            assert S.result_dtype("segment_sum", dt) == np.sum(x, axis=0).dtype
            assert S.result_dtype("segment_mean", dt) == np.mean(x, axis=0).dtype == np.float64
        else:
            assert S.result_dtype("segment_sum", dt) == S.result_dtype("segment_mean", dt) == dt


@pytest.mark.parametrize("dtype", S.INT_DTYPES, ids=dtype_name)
def test_integer_emulator_is_numpys_slice_reductions(dtype, rng):
    """Sums wrap at 64 bits as NumPy's sum does, maxima and minima are exact, means are float64 sums (the
    tree) divided by the length; an empty segment's max / min is the dtype's lowest / highest value."""
    x = _values(rng, (700, 2), dtype)
    o = np.array([0, 1, 1, 300, 301, 700])
    info = (False, True) if dtype == np.bool_ else (np.iinfo(dtype).min, np.iinfo(dtype).max)
    for op, fn, empty in (("segment_sum", np.sum, 0), ("segment_max", np.max, info[0]),
                          ("segment_min", np.min, info[1]), ("segment_mean", np.mean, np.nan)):
        got = getattr(R, f"{op}_emulated")(x, o)
        assert got.dtype == S.result_dtype(op, dtype) and got.shape == (5, 2)
        for s in range(5):
            want = fn(x[o[s]:o[s + 1]], axis=0) if o[s + 1] > o[s] else np.full(2, empty)
            if op == "segment_mean":
                # a float64 sum rounds relative to its values (int64's are not exact in float64): their largest
                # scales the tolerance where the mean cancels to much less
                seg = np.abs(x[o[s]:o[s + 1]].astype(np.float64))
                np.testing.assert_allclose(got[s], want, rtol=1e-13, atol=1e-13 * seg.max() if seg.size else 0)
            else:
                assert np.array_equal(got[s], want.astype(got.dtype)), (op, s)


@pytest.mark.parametrize("dtype", S.FLOAT_DTYPES, ids=dtype_name)
def test_emulator_is_close_to_the_reference(dtype, rng):
    x = rng.standard_normal((3000, 3)).astype(dtype)
    o = _offsets(rng, 3000, 40)
    for op in OPS:
        got, want = getattr(R, f"{op}_emulated")(x, o), getattr(R, op)(x, o)
        assert got.dtype == x.dtype and got.shape == want.shape
        assert_close(got, want, dtype, terms=3000)
    assert (R.segment_sum_emulated(x, o)[1] == 0).all() and np.isnan(R.segment_mean_emulated(x, o)[1]).all()
    assert (R.segment_max_emulated(x, o)[1] == -np.inf).all() and (R.segment_min_emulated(x, o)[1] == np.inf).all()


def test_a_segments_bits_are_the_sum_of_its_slice(rng):
    x = rng.standard_normal((5000, 2)).astype(np.float32)
    o = np.array([0, 3, 3, 260, 1300, 5000])
    got = R.segment_sum_emulated(x, o)
    for s in range(len(o) - 1):
        if o[s + 1] - o[s] > 1:
            assert same_bits(got[s], R.sum_emulated(x[o[s]:o[s + 1]], axis=0))
            assert same_bits(R.segment_max_emulated(x, o)[s], R.amax_emulated(x[o[s]:o[s + 1]], axis=0))


def test_nan_and_signed_zero():
    x = np.array([1.0, np.nan, 2.0, -0.0, 0.0, -0.0], np.float32)
    o = np.array([0, 3, 5, 6])
    assert np.isnan(R.segment_max_emulated(x, o)[0]) and np.isnan(R.segment_sum_emulated(x, o)[0])
    assert not np.signbit(R.segment_max_emulated(x, o)[1]) and np.signbit(R.segment_min_emulated(x, o)[1])
    assert not np.signbit(R.segment_sum_emulated(x, o)[2])  # the chain starts at +0


# ---------------------------------------------------------------------------------------------------------
# Compilation.


@pytest.mark.nvrtc(S.SOURCE)
@pytest.mark.parametrize("arch", ARCHS)
def test_every_instantiation_compiles_without_spills_or_contraction(arch):
    c = compiled(S.SOURCE, arch)
    res = c.resources() if ptxas_ran(c) else None  # else .ci/run checks the machine code (tests/_support.py)
    insts = checked_instantiations(S.SOURCE)
    assert len(c.lowered) == len(insts)
    assert ".local" not in c.ptx
    for inst in insts:
        if res is not None:
            assert_no_spills(res[c.lowered[inst.expression]], arch, inst.expression)
        body = c.kernel_ptx(inst)
        assert "fma.rn" not in body and ".approx" not in body, inst.expression
        if inst.name == "segment_warp":
            # a unit-stride segment's leaf: its eight loads at immediate offsets of 32 rows from one address
            size = np.dtype(inst.args[0]).itemsize
            steps = re.findall(r"ld\.global\.\S+\s+%\w+, \[(%rd\d+)\+(\d+)\]", body)
            by_base = {}
            for base, offset in steps:
                by_base.setdefault(base, set()).add(int(offset))
            want = {32 * size * m for m in range(1, 8)}
            assert any(want <= offsets for offsets in by_base.values()), (inst.expression, arch)


# ---------------------------------------------------------------------------------------------------------
# On a GPU.


def _check(op, x, xh, o, oh, **kw):
    got = getattr(S, op)(x, o, **kw)
    want = getattr(R, f"{op}_emulated")(xh, oh)
    assert got.dtype == S.result_dtype(op, xh.dtype) and got.shape == want.shape, op
    assert same_bits(got, want), op
    if xh.dtype in S.FLOAT_DTYPES:
        assert_close(got, getattr(R, op)(xh, oh), xh.dtype, terms=max(xh.shape[0], 1))
    return got


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", S.DTYPES, ids=dtype_name)
@pytest.mark.parametrize("shape, segments", [((4099,), 37), ((997, 3), 11), ((301, 64), 9), ((50, 4, 33), 5)])
def test_every_dtype_op_and_kernel(dtype, shape, segments, rng):
    import cupy

    xh = _values(rng, shape, dtype)
    oh = _offsets(rng, shape[0], segments)
    x = cupy.asarray(xh)
    # int32 offsets for one dtype only: each (dtype, op, offsets dtype) is a kernel compiled on first use
    for odt in S.OFFSET_DTYPES if np.dtype(dtype) == F32 else (np.dtype(np.int64),):
        o = cupy.asarray(oh.astype(odt))
        for op in OPS:
            _check(op, x, xh, o, oh)


@pytest.mark.gpu
def test_long_segments_and_independence_from_neighbours(rng):
    import cupy

    n = (1 << 20) + 3
    xh = rng.standard_normal((n,)).astype(np.float32)
    x = cupy.asarray(xh)
    oh = np.array([0, 5, 5, 70000, n - 1, n])
    for op in OPS:
        _check(op, x, xh, cupy.asarray(oh), oh)
    alone = S.segment_sum(x, cupy.asarray(np.array([5, 70000])))
    among = S.segment_sum(x, cupy.asarray(oh))
    assert same_bits(alone, among[2:3])


@pytest.mark.gpu
def test_segments_past_the_32_bit_leaf_loop():
    """A unit-stride segment of 2^31 - 2^9 rows or more takes the 64-bit leaf loop, a shorter one the 32-bit
    loop; both form the one tree, over x of more than 2^31 elements. All ones: a whole leaf sums to 256, a
    subtree of k whole leaves to 256 k, exact in float32 for k < 2^24, so lengths that are multiples of 256
    have exact sums."""
    import cupy

    n = (1 << 31) + 3
    x = cupy.ones(n, np.float32)
    big, short = (1 << 31) - 256, (1 << 31) - 768  # 64-bit loop, 32-bit loop
    oh = np.array([0, big, 3, 3 + short, big, n], np.int64)  # the second segment inverted: checks off
    o = cupy.asarray(oh)
    got = S.segment_sum(x, o, check_offsets=False)
    assert cupy.asnumpy(got).tolist() == [big, 0.0, short, big - 3 - short, n - big]
    assert cupy.asnumpy(S.segment_mean(x, o, check_offsets=False))[[0, 2, 4]].tolist() == [1.0, 1.0, 1.0]
    # markers at each loop's last leaf and past 2^31: a load at a wrong row would miss them
    for row, v in ((5, -3.0), (2 + short, 9.0), (big - 1, 7.0), (big + 1, 5.0), (n - 1, 11.0)):
        x[row] = v
    assert cupy.asnumpy(S.segment_max(x, o, check_offsets=False)).tolist() == [9.0, -np.inf, 9.0, 7.0, 11.0]
    assert cupy.asnumpy(S.segment_min(x, o, check_offsets=False)).tolist() == [-3.0, np.inf, -3.0, 1.0, 1.0]


@pytest.mark.gpu
@pytest.mark.parametrize("cols", [1, 3])
def test_runs_of_segments_give_each_segments_own_bits(cols, rng):
    import cupy

    rows, segments = 1 << 20, 300_007  # runs of 4 (1 column) or 13 (3 columns), the last warps' runs shorter
    xh = rng.standard_normal((rows, cols)).astype(np.float32)
    oh = _offsets(rng, rows, segments)
    oh[10:20] = oh[10]  # a stretch of empty segments inside a run
    x, o = cupy.asarray(xh), cupy.asarray(oh)
    assert S.plan(xh.shape, segments).run > 1
    for op in OPS:
        _check(op, x, xh, o, oh)
    alone = S.segment_sum(x, o[:41])  # 40 segments: a warp each
    assert S.plan(xh.shape, 40).run == 1
    assert same_bits(alone, S.segment_sum(x, o)[:40])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, BFLOAT16, np.int16, np.uint64], ids=dtype_name)
def test_strided_negative_and_misaligned_views(dtype, rng):
    import cupy

    base_h = _values(rng, (400, 6, 40), dtype)
    base = cupy.asarray(base_h)
    views = [lambda a: a[::2, 1], lambda a: a[::-1, :, 3], lambda a: a[1:, 2, 1:], lambda a: a.transpose(0, 2, 1),
             lambda a: a.reshape(-1)[1:2001]]
    for view in views:
        x, xh = view(base), view(base_h)
        oh = _offsets(rng, xh.shape[0], 13)
        for op in OPS:
            _check(op, x, np.ascontiguousarray(xh), cupy.asarray(oh), oh)
    # offsets as strided and reversed views (the kernels read a contiguous copy)
    xh = base_h[:, 0, 0]
    oh = _offsets(rng, xh.shape[0], 13)
    spread = cupy.zeros(2 * oh.size, oh.dtype)
    spread[::2] = cupy.asarray(oh)
    for o in (spread[::2], cupy.asarray(oh[::-1].copy())[::-1]):
        for op in OPS:
            _check(op, base[:, 0, 0], np.ascontiguousarray(xh), o, oh)


@pytest.mark.gpu
def test_nan_inf_and_empty_forms():
    import cupy

    xh = np.array([1.0, np.nan, 2.0, np.inf, -np.inf, -0.0, 0.0], np.float32)
    oh = np.array([0, 3, 4, 5, 5, 7])
    for op in OPS:
        _check(op, cupy.asarray(xh), xh, cupy.asarray(oh), oh)
    none = S.segment_sum(cupy.ones((5, 2), np.float32), cupy.zeros(1, np.int64))
    assert none.shape == (0, 2)
    rowless = S.segment_max(cupy.ones((0, 3), np.float32), cupy.zeros(4, np.int32))  # three empty segments
    assert rowless.shape == (3, 3) and (rowless == -np.inf).all()


@pytest.mark.gpu
def test_out_is_written_and_checked(rng):
    import cupy

    xh = rng.standard_normal((500, 40)).astype(np.float32)
    oh = _offsets(rng, 500, 9)
    x, o = cupy.asarray(xh), cupy.asarray(oh)
    want = R.segment_mean_emulated(xh, oh)
    out = cupy.full((9, 40), np.nan, np.float32)  # poisoned
    assert S.segment_mean(x, o, out=out) is out
    assert same_bits(out, want)
    wide = cupy.full((9, 80), np.nan, np.float32)
    S.segment_mean(x, o, out=wide[:, ::2])
    assert same_bits(wide[:, ::2], want) and cupy.isnan(wide[:, 1::2]).all()
    for bad, err, match in [(cupy.empty((8, 40), np.float32), ValueError, "shape"),
                            (cupy.empty((9, 40), np.float64), TypeError, "dtype"),
                            (x[:9], ValueError, "overlaps x")]:
        with pytest.raises(err, match=match):
            S.segment_sum(x, o, out=bad)


@pytest.mark.gpu
def test_integer_results_wrap_and_fill_as_numpy():
    """int64 sums wrap (NumPy's sum), an empty segment's max / min is the dtype's lowest / highest, a uint64
    compares unsigned, a mean sums in float64; out takes the result dtype only."""
    import cupy

    xh = np.array([2**63 - 1, 1, 5, -7], np.int64)
    oh = np.array([0, 2, 2, 4])
    x, o = cupy.asarray(xh), cupy.asarray(oh)
    assert cupy.asnumpy(S.segment_sum(x, o)).tolist() == [-2**63, 0, -2]
    assert cupy.asnumpy(S.segment_max(x, o)).tolist() == [2**63 - 1, -2**63, 5]
    mean = cupy.asnumpy(S.segment_mean(x, o))
    assert mean[0] == np.mean(xh[:2]) and np.isnan(mean[1]) and mean[2] == -1.0
    u = cupy.asarray(np.array([2**64 - 1, 3, 2**63], np.uint64))
    assert cupy.asnumpy(S.segment_max(u, cupy.asarray(np.array([0, 3, 3])))).tolist() == [2**64 - 1, 0]
    assert cupy.asnumpy(S.segment_min(u, cupy.asarray(np.array([0, 3, 3])))).tolist() == [3, 2**64 - 1]
    b = cupy.asarray(np.array([True, False, False], bool))
    ob = cupy.asarray(np.array([0, 1, 3, 3]))
    assert cupy.asnumpy(S.segment_max(b, ob)).tolist() == [True, False, False]
    assert cupy.asnumpy(S.segment_min(b, ob)).tolist() == [True, False, True]
    assert cupy.asnumpy(S.segment_sum(b, ob)).tolist() == [1, 0, 0]
    out = cupy.full(3, -9, np.int64)
    assert S.segment_sum(cupy.asarray(np.array([1, 2, 3], np.int8)), ob, out=out) is out
    assert cupy.asnumpy(out).tolist() == [1, 5, 0]
    with pytest.raises(TypeError, match="dtype"):
        S.segment_sum(cupy.asarray(np.array([1, 2, 3], np.int8)), ob, out=cupy.empty(3, np.int8))


@pytest.mark.gpu
def test_bad_offsets_raise_before_the_launch():
    import cupy

    x = cupy.arange(20, dtype=np.float32).reshape(10, 2)
    before = x.copy()
    out = cupy.full((3, 2), -7, np.float32)
    for o, err, match in [([0, 5, 3, 10], ValueError, r"offsets\[2\] = 3 is below offsets\[1\] = 5"),
                          ([0, 5, 11, 11], ValueError, r"offsets\[2\] = 11 is outside \[0, 10\]"),
                          ([-1, 5, 6, 10], ValueError, r"offsets\[0\] = -1"),
                          (np.array([0.0, 5, 10]), TypeError, "int32 or int64"),
                          (np.zeros((2, 2), np.int64), ValueError, "1-D"),
                          (np.zeros(0, np.int64), ValueError, "at least one")]:
        with pytest.raises(err, match=match):
            S.segment_sum(x, cupy.asarray(np.asarray(o)), out=out if np.ndim(o) == 1 and len(o) == 4 else None)
    assert (out == -7).all() and same_bits(x, before)
    with pytest.raises(TypeError, match="numpy.ndarray"):
        S.segment_sum(x.get(), cupy.zeros(2, np.int64))
    with pytest.raises(TypeError, match="dtype complex64"):
        S.segment_sum(cupy.zeros(4, np.complex64), cupy.zeros(2, np.int64))
    with pytest.raises(TypeError, match="check_offsets"):
        S.segment_sum(x, cupy.zeros(2, np.int64), check_offsets=1)


@pytest.mark.gpu
def test_unchecked_bad_offsets_stay_inside_x():
    import cupy

    xh = np.arange(20, dtype=np.float32).reshape(10, 2)
    oh = np.array([-5, 3, 1, 40, 8])
    got = S.segment_sum(cupy.asarray(xh), cupy.asarray(oh), check_offsets=False)
    assert same_bits(got, R.segment_sum_emulated(xh, oh))


@pytest.mark.gpu
def test_capture_refuses_a_temporary_and_replays_the_rest(rng):
    """Strided offsets, a copied layout of x or a strided out would go through a temporary that a graph's
    replays keep writing after the pool hands it out again: under capture those raise RuntimeError before
    anything is recorded or allocated. A call that writes straight into its result replays the eager answer
    and writes nothing else."""
    import cupy

    from _support import refused_in_capture, replayed_alone

    xh = rng.standard_normal((500, 4, 8)).astype(np.float32)
    oh = _offsets(rng, 500, 9)
    x, o = cupy.asarray(xh), cupy.asarray(oh)
    spread = cupy.zeros(20, o.dtype)
    spread[::2] = o
    strided_out = cupy.empty((9, 4, 16), np.float32)[:, :, ::2]
    cases = {"strided offsets": lambda: S.segment_sum(x, spread[::2], check_offsets=False),
             "copied layout": lambda: S.segment_max(x.transpose(0, 2, 1), o, check_offsets=False),
             "strided out": lambda: S.segment_mean(x, o, out=strided_out, check_offsets=False)}
    assert S.plan((500, 8, 4), 9, strides=(32, 1, 8)).copy
    stream = cupy.cuda.Stream(non_blocking=True)
    for call in cases.values():
        with stream:
            call()  # eager: works, through a temporary
        refused_in_capture(stream, call)
    out = cupy.full((9, 4, 8), np.nan, np.float32)
    xh = rng.standard_normal(xh.shape).astype(np.float32)  # the values the replay sees

    def refill():
        x[...] = cupy.asarray(xh)

    got = replayed_alone(stream, lambda: [S.segment_sum(x, o, check_offsets=False),
                                          S.segment_min(x, o, out=out, check_offsets=False)], refill)
    assert same_bits(got[0], R.segment_sum_emulated(xh, oh)) and got[1] is out
    assert same_bits(out, R.segment_min_emulated(xh, oh))
