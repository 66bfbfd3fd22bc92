"""The reductions without a GPU: compilation of every production instantiation (resources and PTX), planning
of every layout, capture decisions, result dtypes, and tuning and workspaces with stand-ins for the GPU."""

import math
import re
from types import SimpleNamespace

import numpy as np
import pytest
from _reduce_support import LAYOUT_CLASSES, OP_NAMES, ZERO_SIZE_VIEWS, _axis_choices, _elements
from _support import ARCHS, assert_no_spills, checked_instantiations, compiled, fake_array, ptxas_ran

from cukern import _tuned
from cukern.reference import _elementary as E
from cukern.reference import reductions as tree
from cukern import reduce as R
from cukern import reduce_plan as P
from cukern._dtypes import BFLOAT16, dtype_name


# ---------------------------------------------------------------------------------------------------------
# Compilation of every production instantiation: resources and PTX.


@pytest.mark.nvrtc(P.SOURCE)
@pytest.mark.parametrize("arch", ARCHS)
def test_every_instantiation_compiles_without_spills_and_vectorizes(arch):
    c = compiled(P.SOURCE, arch)
    res = c.resources()
    insts = checked_instantiations(P.SOURCE)
    assert len(c.lowered) == len(insts) > len(P.instantiations()) / 10  # the sample: tests/_support.py
    assert ".local" not in c.ptx
    wide = re.compile(r"ld\.global\S*\.v(4\.(u32|b32|f32|s32)|2\.(u64|b64|f64|s64))")
    checked = 0
    for inst in insts:
        if ptxas_ran(c):  # else .ci/run checks the machine code (tests/_support.py, PART)
            assert_no_spills(res[c.lowered[inst.expression]], arch, inst.expression)
        t = np.dtype(inst.args[0])
        wide_pack = 16 if t.itemsize > 1 else 8  # 1-byte types read 8 bytes a lane
        if inst.name in ("reduce_full", "reduce_rows") and t.itemsize > 1 or (
                inst.name == "reduce_cols" and inst.args[3] * t.itemsize == wide_pack == 16):
            assert wide.search(c.kernel_ptx(inst)), inst.expression
            checked += 1
    assert checked > len(insts) / 3


def _exp_fmas(ptx: str) -> tuple:
    """The float32 fused multiply-adds in ``ptx``, as (count, exps): each must take one of ExpLog<float>'s
    exp constants (kInvLn2, kMagic, -kLn2, a polynomial coefficient times 2^-64) as an operand, an immediate
    or a register moved from one, as only exp_nonpositive's do; exps counts those by kInvLn2 plus kMagic (one
    an exp)."""
    c = tree._explog(np.float32)

    def imm(v):  # PTX's spelling of a float32 immediate
        return "0f%08X" % np.float32(v).view(np.uint32)

    rounding = {imm(c["inv_ln2"]), imm(c["magic"])}
    mine = rounding | {imm(v) for v in (-c["ln2"], *(v * np.float32(2.0**-64) for v in c["exp"]))}
    moved = dict(re.findall(r"\bmov\.f32\s+(%f\d+),\s*(0f[0-9A-F]{8});", ptx))
    exps = 0
    fmas = re.findall(r"\bfma\.rn\.f32\s+%f\d+,\s*([^,;]+),\s*([^,;]+),\s*([^,;]+);", ptx)
    for ops in fmas:
        values = {moved.get(o.strip(), o.strip()) for o in ops}
        assert values & mine, ops
        exps += rounding <= values
    return len(fmas), exps


def _complex_lse_fmas(dtype) -> int:
    """The fused multiply-adds reduce_lse_complex calls for: complex64's (the host's tree._fma32 repeats them),
    per element (eight a chain) the exp's, four in Cody and Waite's reduction, one in the exact reduction's
    product, sin's and cos's Horner steps; the exp's in each of the seven merges (five shuffle levels, the
    stack's push and result); the phase's five. complex128's only where the result is exact (the host forms
    it without one): the exact reduction's product error (eight a chain) and the phase's division remainder."""
    if np.dtype(dtype) == np.complex128:
        return 8 + 1
    t = E._trig(np.float32)
    exp = len(tree._explog(np.float32)["exp"]) + 1
    element = exp + 4 + 1 + 1 + (len(t["sin"]) - 1) + (len(t["cos"]) - 1)
    return 8 * element + 7 * exp + 3 + (len(t["atan"]) - 1)


@pytest.mark.nvrtc(P.SOURCE)
@pytest.mark.parametrize("arch", ARCHS)
def test_no_float_accumulation_is_fused(arch):
    """Every addition and square of a float accumulation is its own correctly rounded
    instruction (add.rn / mul.rn), so no architecture can contract it into an FMA and round differently.
    The only multiply-adds left are integer index arithmetic (mad.lo) and float logsumexp's exp, whose
    explicit __fmaf_rn (eight an exp, each with one of the exp's constants) round once on every architecture
    as the emulator's tree._fma32 does; no logsumexp rounds to an integer with cvt.rni (rintf / rint)."""
    c = compiled(P.SOURCE, arch)
    fused = re.compile(r"\bfma\.rn(\.ftz)?\.f(32|64)\b|\bmad\.(rn\.)?f(32|64)\b")
    terms = len(tree._explog(np.float32)["exp"])
    for inst in checked_instantiations(P.SOURCE):
        ptx = c.kernel_ptx(inst)
        if inst.name == "reduce_lse_complex":
            assert "cvt.rni" not in ptx, inst.expression
            assert len(re.findall(r"\bfma\.rn\.f(32|64)\b", ptx)) == _complex_lse_fmas(inst.args[1]), inst.expression
            # nothing left to contract: every other float add, subtraction and product rounds on its own, but
            # frexp's scaling of a subnormal argument and its x + x for inf and NaN (log|s|'s q is neither)
            assert len(re.findall(r"\b(add|sub|mul)\.f(32|64)\b", ptx)) <= 2, inst.expression
            continue
        if inst.args[2] == P.OP_LSE:
            assert "cvt.rni" not in ptx, inst.expression
            if P.acc_dtype(inst.args[1]) == np.float32:
                fmas, exps = _exp_fmas(ptx)
                assert exps and fmas == (terms + 1) * exps, (inst.expression, fmas, exps)
                ptx = re.sub(r"\bfma\.rn\.f32\b", "", ptx)
        assert not fused.search(ptx), inst.expression
        if np.dtype(inst.args[1]).kind == "f" and inst.args[2] == P.OP_SUMSQ:
            assert re.search(r"\bmul\.rn\.f(32|64)\b", ptx), inst.expression
        if np.dtype(inst.args[1]).kind == "c":  # the complex product: every step its own rounded instruction
            for step in ("mul", "sub", "add"):
                assert re.search(rf"\b{step}\.rn\.f(32|64)\b", ptx), (step, inst.expression)


@pytest.mark.nvrtc(P.SOURCE)
@pytest.mark.parametrize("arch", ARCHS)
def test_max_and_min_combine_without_branches(arch):
    """Max and Min are selects, not branches: a max or min kernel branches about as often as the sum kernel
    of the same layout and dtypes (with early returns every element's compare was a divergent branch: the
    float32 full max kernel's PTX held 724 branches against the sum's 108, 261 since)."""
    c = compiled(P.SOURCE, arch)
    insts = {(i.name, i.args[:2], i.args[2], i.args[3:]): i for i in checked_instantiations(P.SOURCE)}
    pairs = 0
    for (name, types, op, rest), inst in insts.items():
        twin = insts.get((name, types, P.OP_SUM, rest))
        if op in (P.OP_MAX, P.OP_MIN) and twin is not None and name in ("reduce_full", "reduce_rows"):
            branches = [len(re.findall(r"\bbra\b", c.kernel_ptx(i))) for i in (inst, twin)]
            assert branches[0] <= 3 * branches[1], (inst.expression, branches)
            pairs += 1
    assert pairs >= 4  # in the sample (tests/_support.py)


def test_instantiations_are_generated_and_cover_the_dispatcher():
    insts = P.instantiations()
    assert len(insts) == len(set(insts))
    # CI compiles all of them for four architectures (var and std add 64, prod and logsumexp 52, complex
    # products 8 of those; weighted logsumexp 4, complex logsumexp 2; the NaN-aware ops none; the int64 counts
    # and the bool results of any and all 42; the 512-thread rows of inputs of at most 4 bytes 80)
    assert len(insts) <= 800
    have = set(insts)
    shapes = [(1,), (31,), (1000003,), (4097, 3), (3, 4097), (1, 4097), (4097, 1), (7, 5, 9), (2, 3, 4, 5)]
    axes_for = {1: [None, 0], 2: [None, 0, 1, (0, 1)], 3: [None, 0, 1, 2, (0, 2), (1, 2)], 4: [(1, 3), (0, 2), 2]}
    for name, op in P.OPS.items():
        for t in op.inputs:
            for o in P.kernel_dtypes(name, t):
                for shape in shapes:
                    for axis in axes_for[len(shape)]:
                        for align in (0, 4, 16):
                            pl = P.plan(shape, t, axis, ptr=align * t.itemsize, op=name, out_dtype=o)
                            for inst in P.plan_instantiations(pl, t, o, op.kernel_op):
                                assert inst in have, (name, dtype_name(t), shape, axis, inst.expression)


# ---------------------------------------------------------------------------------------------------------
# Planning.


def test_full_plan_fixed_grid():
    sm = 132
    p = P.plan_full(2**29, 4, sm)
    assert p.grid == P.FULL_BLOCKS_PER_SM * sm and p.block == P.FULL_BLOCK
    assert P.plan_full(0, 4, sm).grid == 1
    assert P.plan_full(1, 2, sm).grid == 1
    mid = P.plan_full(2**20, 4, sm)
    assert mid.grid == 2**20 // P.chunk_elements(4) // (P.FULL_BLOCK // 32)  # a warp per chunk
    assert P.plan_full(2**20, 4, sm) == mid  # a pure function of its arguments
    assert P.plan_full(2**40, 2, sm).grid == P.FULL_BLOCKS_PER_SM * sm
    # never more blocks than the workspace holds partials for, nor than the last block combines
    big = P.Knobs(full_block=256, full_blocks_per_sm=16)
    assert P.plan_full(2**40, 4, 10**4, big).grid == P.FULL_FOLD * 256 <= P.FULL_PARTIALS


def test_rows_plan():
    k = P.DEFAULT_KNOBS
    big = P.plan_rows(16384, 32768, 4)
    assert big.tpr == big.block == k.row_max_tpr and big.unroll == k.row_unroll
    assert big.min_blocks * big.block == k.row_threads_per_sm
    assert big.grid == min(32768, k.row_waves * 132 * big.min_blocks)
    # rows of one leaf: the lanes of one leaf (32 chains, lane_elements a lane)
    assert P.plan_rows(3, 4097, 4).tpr == 8 and P.plan_rows(3, 4097, 2).tpr == 4 and P.plan_rows(3, 9, 8).tpr == 16
    assert P.plan_rows(1000, 5, 4).tpr == 32  # four leaves: one warp's chunk
    assert big.index32 and not P.plan_rows(P.ROW_INDEX32_LIMIT, 2, 2).index32
    assert P.plan_rows(P.ROW_INDEX32_LIMIT - 1, 2, 2).index32
    small = P.plan_rows(100, 10**6, 4)
    assert small.block == P.ROW_SMALL_BLOCK and small.block % small.tpr == 0
    for length in (1, 31, 1000, 4096, 10**6):
        p = P.plan_rows(length, 10, 2)
        assert p.block == P.row_block(p.tpr) and p.block % p.tpr == 0
        assert P.plan_rows(length, 10**7, 2).tpr == p.tpr


def test_defaults_are_the_sweeps_winners():
    # docs/design/reductions.md: rows with unroll 4, 4 blocks of 256 a SM and a grid of 32 waves, and for
    # inputs of at most 4 bytes 512 threads (2 blocks a SM) past 2048 vectors ([32768, 16384] float32); the
    # full sum: blocks of 256, 4 an SM, the whole chain step's 8 loads in flight ("Groups combined in
    # batches").
    k = P.DEFAULT_KNOBS
    assert k.row_waves == 32 and (k.row_max_tpr, k.row_unroll, k.row_threads_per_sm) == (256, 4, 1024)
    assert (k.full_block, k.full_blocks_per_sm, k.full_unroll) == (256, 4, 8)
    p = P.plan_rows(16384, 32768, 8, 132)
    assert (p.tpr, p.unroll, p.min_blocks, p.grid) == (256, 4, 4, 32 * 132 * 4)
    wide = P.row_knobs(k, np.float32)
    assert wide is P.WIDE_ROW_KNOBS and wide.row_max_tpr == 512 and P.row_knobs(k, np.float64) is k
    p = P.plan_rows(16384, 32768, 4, 132, knobs=wide)
    assert (p.tpr, p.unroll, p.min_blocks, p.grid) == (512, 4, 2, 32 * 132 * 2)
    assert P.plan_rows(8192, 32768, 4, 132, knobs=wide).tpr == 256  # 2048 vectors: as before
    tuned = P.Knobs(row_max_tpr=128)
    assert P.row_knobs(tuned, np.float32) is tuned  # a tuning cache entry stands


@pytest.mark.parametrize("knobs", [
    P.Knobs(row_max_tpr=512, row_threads_per_sm=1024, row_waves=32),
    P.Knobs(row_max_tpr=32, row_items=128, row_waves=None),
    P.Knobs(row_max_tpr=128, row_unroll=2, row_threads_per_sm=1536, row_waves=4),
    P.Knobs(row_waves=8),
    P.Knobs(full_block=256, full_blocks_per_sm=4, full_unroll=8),
])
def test_knobs_give_consistent_plans(knobs):
    for length, rows in ((16384, 32768), (100, 10**6), (1, 5), (4096, 2**31 - 5)):
        p = P.plan_rows(length, rows, 4, 132, knobs)
        assert p.block == P.row_block(p.tpr) and p.block % p.tpr == 0
        assert p.min_blocks * p.block <= 2048 and 1 <= p.grid < 2**31
        assert p.grid * (p.block // p.tpr) < 2**31
        if knobs.row_waves is not None:
            assert p.grid <= knobs.row_waves * 132 * p.min_blocks
    f = P.plan_full(2**29, 4, 132, knobs)
    assert f.block == knobs.full_block and f.unroll == knobs.full_unroll
    assert f.grid == knobs.full_blocks_per_sm * 132 <= P.FULL_PARTIALS
    pl = P.plan((32768, 16384), np.float32, -1, knobs=knobs)
    assert pl.kernel == P.plan_rows(16384, 32768, 4, 132, knobs)


def test_cols_plans_past_2_31_blocks_or_2_34_rows():
    """Columns past 2^34 rows split into more spans than COL_MAX_SPANS (a span holds 2^19 leaves at most), as
    many as reduce_cols_fold's stack holds; a column grid past 2^31 - 1 blocks (2^31 matrices of a strip)
    takes the strided kernel, the same tree."""
    from cukern._compile import read_source

    depth = int(re.search(r"FOLD_DEPTH = (\d+);", read_source("reduce")).group(1))
    assert P.COL_FOLD_SPANS.bit_length() == depth
    p = P.plan((2**35, 2), np.bool_, 0)
    assert p.layout.kind == "cols" and (p.kernel.span, p.kernel.spans) == (2**19, 256) and p.fold is not None
    assert P.plan_cols(1, 2**19 * P.TREE_LEAF * P.COL_FOLD_SPANS, 2, 2, True, 1).spans == P.COL_FOLD_SPANS
    assert P.plan_cols(1, 2**19 * P.TREE_LEAF * P.COL_FOLD_SPANS + 1, 2, 2, True, 1) is None
    assert P.plan((2**31 - 1, 2, 2), np.float32, 1).kernel.grid == 2**31 - 1
    for shape in ((2**31, 2, 2), (2**31 - 1, 4, 64)):
        p = P.plan(shape, np.float32, 1)
        assert p.layout.kind == "strided" and p.layout.outputs == shape[0] * shape[2] and p.kernel.grid < 2**31


def test_make_knobs_ignores_unknown_names():
    assert P.make_knobs({"row_waves": 4, "not_a_knob": 1}) == P.Knobs(row_waves=4)


def test_knobs_that_would_break_the_tree_are_refused():
    """Unrolls must divide the chain length and thread counts be powers of two (spans are subtrees); a
    stored setting that does not fit is a ValueError, which the tuning cache answers with the defaults."""
    for bad in ({"full_unroll": 3}, {"row_unroll": 16}, {"full_block": 384}, {"row_max_tpr": 96},
                {"row_max_tpr": 16}, {"row_waves": 0}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            P.make_knobs(bad)


def test_cols_plan_benchmark_shape():
    p = P.plan((16384, 32768), np.float32, 0)
    assert p.layout.kind == "cols"
    first, fold = p.kernel, p.fold
    assert first.vec == 4 and first.vector and first.q == 4 and first.columns == 128 and first.spans > 1
    leaves = 16384 // P.TREE_LEAF
    assert first.span & (first.span - 1) == 0 and first.spans == -(-leaves // first.span)
    assert fold.grid * fold.block >= 32768
    assert p.partials == first.spans * 32768 * 4  # the workspace scratch the partials take
    assert P.plan((33, 32768), np.float32, 0).partials == 0  # one leaf: one pass, no partials
    assert P.plan((4096, 64), np.float32, 0).kernel.q == 1  # few columns: 32 row lanes
    assert not P.plan((16384, 32768), np.float32, 0, ptr=4).kernel.vector  # misaligned base: scalar loads
    assert not P.plan((16, 30), np.float32, 0).kernel.vector  # rows 30 elements apart: packs misalign


def test_classify_layouts():
    assert P.classify((8, 16), (16, 1), (1,)).kind == "rows"
    assert P.classify((8, 16), (16, 1), (0,)).kind == "cols"
    assert P.classify((8, 16), (16, 1), (0, 1)).kind == "full"
    # transposed: the elements in the caller's order are 16 apart, then 1: not one level, so copied (a
    # memory-order sum would be another tree than the same values' contiguous copy)
    assert P.classify((16, 8), (1, 16), (0, 1)) == P.Layout("copy", (), ((16, 1), (8, 16)))
    assert P.classify((16, 8), (1, 16), (1,)).kind == "cols" and P.classify((16, 8), (1, 16), (0,)).kind == "rows"
    assert P.classify((8,), (-1,), (0,)) == P.Layout("full", (), ((8, -1),))  # reversed: in x's order
    assert P.classify((4, 5, 6), (30, 6, 1), (1,)).kind == "cols"  # middle axis: matrices of columns
    assert P.classify((4, 5, 6), (30, 6, 1), (0, 2)).kind == "strided"
    assert P.classify((8, 16), (32, 2), (0, 1)).kind == "full"  # x[:, ::2] of [8, 32]: one stride-2 run
    assert P.classify((8, 16), (40, 2), (0, 1)).kind == "copy"  # x[:, :32:2] of [8, 40]: two levels
    assert P.classify((8, 16), (16, 1), ()).kind == "none"
    assert P.classify((8, 1), (1, 1), (1,)).kind == "none"
    assert P.classify((2, 3, 4, 5), (60, 20, 5, 1), (1, 3)).kind == "strided"
    assert P.classify((2, 3, 4, 5, 6), (360, 120, 30, 6, 1), (1, 3)).kind == "copy"
    p = P.plan((2, 3, 4, 5, 6), np.float32, (1, 3))
    assert p.copy and p.layout.kind == "rows"
    assert P.classify((3, 0), (5, 1), (0, 1)) == P.Layout("fill", (), ((3, 5), (0, 1)))
    assert P.classify((0, 3), (3, 1), (1,)).kind == "empty"


def test_copied_layouts_become_rows_or_full(rng):
    """Whatever deep layout is copied, the copy (kept axes first, reduced last, contiguous) is one rows or
    full launch."""
    for _ in range(200):
        ndim = int(rng.integers(2, 6))
        shape = tuple(int(n) for n in rng.integers(1, 5, ndim))
        base = np.empty(tuple(2 * n for n in shape), np.float32)
        view = base[tuple(slice(None, None, int(rng.integers(1, 3))) for _ in shape)][tuple(slice(0, n) for n in shape)]
        axes = tuple(int(a) for a in np.flatnonzero(rng.random(ndim) < 0.5))
        pl = P.plan(view.shape, view.dtype, axes, strides=_elements(view))
        if pl.copy:
            assert pl.layout.kind in ("rows", "full"), (shape, view.strides, axes)


@pytest.mark.parametrize("label", ZERO_SIZE_VIEWS)
def test_zero_size_views_are_planned_without_a_kernel(label):
    """``sum(ones((3, 5))[:, :0])`` fell through the copy re-classification into the column
    geometry. Zero-size views are "fill" (nothing to reduce: every output gets the empty value) or "empty"
    (no outputs), before any collapsing, for every axis."""
    x = ZERO_SIZE_VIEWS[label](np.ones((3, 5), np.float32))
    for axis in _axis_choices(x.ndim):
        axes = P.normalize_axis(axis, x.ndim)
        for name in OP_NAMES:
            pl = P.plan(x.shape, x.dtype, axis, strides=_elements(x), op=name)
            outputs = math.prod(P.result_shape(x.shape, axes, False))
            count = math.prod(x.shape[i] for i in axes)
            assert pl.layout.kind == ("empty" if outputs == 0 else "fill"), (label, axis)
            assert (pl.layout.outputs, pl.layout.count) == (outputs, count)
            assert pl.kernel is None and not pl.copy and P.plan_instantiations(pl, x.dtype, x.dtype, 0) == []


@pytest.mark.parametrize("label", LAYOUT_CLASSES)
def test_layout_classes_plan_as_named(label):
    shape, view, axis, kind, passes = LAYOUT_CLASSES[label]
    x = view(np.ones(shape, np.float32))
    for sm in (16, 108, 132, 142):  # whatever the device
        pl = P.plan(x.shape, x.dtype, axis, strides=_elements(x), sm_count=sm)
        assert pl.layout.kind == kind and not pl.copy
        assert len(P.plan_instantiations(pl, x.dtype, x.dtype, P.OP_SUM)) == passes
        assert (pl.partials > 0) == (passes == 2)


def test_which_calls_go_through_a_temporary():
    """The decision behind refusing a capture (pure): a temporary only for a copied layout, an amax/amin
    conversion or an out the kernels cannot write as it is; zero-size and size-1 reductions write any
    destination elementwise."""
    rows = P.plan((8, 16), np.float32, 1)
    copy = P.plan((2, 3, 4, 5, 6), np.float32, (1, 3))
    none = P.plan((8, 1), np.float32, 1)
    fill = P.plan((8, 0), np.float32, 1)

    def why(pl, converts=False, out_direct=None):
        return P.temporary(pl, converts=converts, out_direct=out_direct)

    assert why(rows) is None and why(rows, out_direct=True) is None
    assert "C-contiguous out" in why(rows, out_direct=False)
    assert "dtype=None" in why(rows, converts=True) and "dtype=None" in why(rows, converts=True, out_direct=True)
    assert "ascontiguousarray" in why(copy) and "ascontiguousarray" in why(copy, out_direct=True)
    for pl in (none, fill):
        assert why(pl, converts=True, out_direct=False) is None
    for pl in (rows, copy, none, fill):  # one line, naming the way around it
        for kw in ({"converts": True}, {"out_direct": False}):
            text = why(pl, **kw)
            assert text is None or ("\n" not in text and "; " in text)


def test_normalize_axis():
    assert P.normalize_axis(None, 3) == (0, 1, 2)
    assert P.normalize_axis(-1, 3) == (2,)
    assert P.normalize_axis((2, 0), 3) == (0, 2)
    with pytest.raises(np.exceptions.AxisError):
        P.normalize_axis(3, 3)
    with pytest.raises(ValueError, match="repeats"):
        P.normalize_axis((0, -3), 3)
    with pytest.raises(TypeError):
        P.normalize_axis(1.0, 3)
    with pytest.raises(TypeError):
        P.normalize_axis(True, 3)
    assert P.normalize_axis(0, 0) == P.normalize_axis(np.int64(-1), 0) == ()  # NumPy's ufunc reductions: no axis
    for axis in ((0,), (-1,), 1, True):
        with pytest.raises((np.exceptions.AxisError, TypeError)):
            P.normalize_axis(axis, 0)


def test_result_dtypes_follow_numpy():
    i32, i64, f16, f32, f64 = (np.dtype(t) for t in ("int32", "int64", "float16", "float32", "float64"))
    assert P.result_dtype("sum", i32) == np.sum(np.ones(2, i32)).dtype == i64
    assert P.result_dtype("sum", np.bool_) == i64
    assert P.result_dtype("sum", f16) == f16 and P.result_dtype("sum", BFLOAT16) == BFLOAT16
    assert P.result_dtype("mean", i32) == f64 and P.result_dtype("norm", i64) == f64
    assert P.result_dtype("mean", f16) == np.mean(np.ones(2, f16)).dtype
    assert P.result_dtype("sum", f16, "float32") == f32
    assert P.result_dtype("amax", i32) == i32
    with pytest.raises(TypeError, match="dtype=float32 is not supported for sum of complex64"):
        P.result_dtype("sum", np.complex64, f32)
    for name in ("sum", "mean", "sum_of_squares", "norm"):
        for t in P.OPS[name].inputs:
            assert P.acc_dtype(P.result_dtype(name, t)) in (f32, f64, i64)
            if t in (f16, BFLOAT16):
                assert P.acc_dtype(P.result_dtype(name, t)) == f32  # halves accumulate in float32


def test_bytes_moved():
    assert P.bytes_moved((32768, 16384), np.float32, -1) == 32768 * 16384 * 4 + 32768 * 4
    assert P.bytes_moved((2**29,), np.float32) == 2**31 + 4
    assert P.bytes_moved((16, 8), np.int32, 0) == 16 * 8 * 4 + 8 * 8  # int32 sums are int64


def test_callers_still_find_their_names_on_the_op_module():
    for name in ("plan", "Knobs", "DEFAULT_KNOBS", "bytes_moved", "instantiations", "SOURCE"):
        assert getattr(R, name) is getattr(P, name), name
    assert set(R.TUNING) == {"sum", "sum_rows"} and callable(R._reduce)


# ---------------------------------------------------------------------------------------------------------
# Tuning and workspaces, with stand-ins for the GPU.


def test_tuned_knobs_lookup_rule(monkeypatch):
    calls = []
    tuned = {"sum": P.Knobs(full_block=256), "sum_rows": P.Knobs(row_waves=4)}

    def lookup(rule, device_id, dtype, shape):
        calls.append((rule.op, device_id, dtype, shape))
        return tuned.get(rule.op, rule.default)

    monkeypatch.setattr(_tuned, "lookup", lookup)
    x = fake_array((6, 5, 7), np.float16, device=1)
    assert R._tuned_knobs(x, None) == tuned["sum"]
    assert calls[-1] == ("sum", 1, np.dtype(np.float16), (210,))
    for axis in (-1, 2, (2,), (-1,), np.int64(-1)):
        calls.clear()
        assert R._tuned_knobs(x, axis) == tuned["sum_rows"], axis
        assert calls == [("sum_rows", 1, np.dtype(np.float16), (30, 7))]
    calls.clear()
    for axis in (0, 1, (1, 2), (0, 1, 2), True, (True,), 1.0, [2], "x", ()):
        assert R._tuned_knobs(x, axis) is P.DEFAULT_KNOBS, axis
    assert R._tuned_knobs(fake_array((7,)), -1) is P.DEFAULT_KNOBS  # rows need 2 or more dimensions
    assert R._tuned_knobs(fake_array((3, 0)), -1) is P.DEFAULT_KNOBS  # empty rows: nothing to look up
    assert calls == []


def test_tuning_adapter_is_on():
    import inspect

    from cukern.lab import tune

    assert inspect.signature(R._reduce).parameters["knobs"].default is None
    for op in ("sum", "sum_rows"):
        assert tune.TUNABLES[op].rule is R.TUNING[op]


class _FakeCupy:
    """What :func:`cukern.reduce.workspace` asks of CuPy: one stream on device 0, capturing or not, and
    allocations that only know their size."""

    def __init__(self, capturing: bool):
        self.allocations = []
        stream = SimpleNamespace(ptr=7, is_capturing=lambda: self.capturing)
        self.capturing = capturing
        self.cuda = SimpleNamespace(get_current_stream=lambda: stream, runtime=SimpleNamespace(getDevice=lambda: 0))

    def empty(self, n, dtype):
        buf = SimpleNamespace(nbytes=n * np.dtype(dtype).itemsize)
        self.allocations.append(buf)
        return buf

    zeros = empty


def test_workspace_is_made_and_grown_only_outside_a_capture(monkeypatch):
    fake = _FakeCupy(capturing=True)
    monkeypatch.setattr(R, "_cupy", lambda: fake)
    monkeypatch.setattr(R, "_workspaces", {})
    with pytest.raises(RuntimeError, match="before capturing"):
        R.workspace()  # none yet: making one would allocate inside the capture
    assert fake.allocations == [] and R._workspaces == {}
    fake.capturing = False
    ws = R.workspace(1000)
    assert ws.partials.nbytes == P.FULL_PARTIALS * P.STATE_BYTES and ws.counter.nbytes == 4 and ws.scratch.nbytes == 1000
    fake.capturing = True
    assert R.workspace(1000) is ws and R.workspace() is ws  # large enough: nothing to allocate
    made = len(fake.allocations)
    with pytest.raises(RuntimeError, match="1001 bytes of scratch"):
        R.workspace(1001)  # would have to grow
    assert len(fake.allocations) == made and ws.scratch.nbytes == 1000
    fake.capturing = False
    first = ws.scratch
    assert R.workspace(1001) is ws and ws.scratch.nbytes == 2000  # grown by at least doubling
    assert ws.outgrown == [first]  # kept: a graph captured before may still write it


def test_rejects_host_arrays():
    for name in OP_NAMES:
        with pytest.raises(TypeError, match="cupy.asarray"):
            getattr(R, name)(np.ones(4, np.float32))
    with pytest.raises(TypeError, match="cupy.ndarray"):
        R.sum([1.0, 2.0])
