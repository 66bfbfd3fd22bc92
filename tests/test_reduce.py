"""Production reductions: references, the exact emulators and a blocked simulation of every kernel's split
of the one tree, compilation of every instantiation and its PTX, planning, capture decisions, validation
(CPU); results against float64 references and bit for bit against the emulators whatever the knobs, the
rows, the SM count or the layout, NaN, zero-size views, CUDA-graph capture and 64-bit sizes (GPU)."""

import gc
import itertools
import math
import re
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from _support import (ARCHS, assert_close, assert_no_spills, capture, checked_instantiations, compiled, fake_array,
                      ptxas_ran, refused_in_capture, same_bits, victims)

from cukern import _tuned, reference
from cukern.reference import reductions as tree
from cukern import reduce as R
from cukern import reduce_plan as P
from cukern._dtypes import BFLOAT16, dtype_name

OP_NAMES = ("sum", "mean", "sum_of_squares", "norm", "amax", "amin")
REFS = {
    "sum": reference.reduce_sum,
    "mean": reference.reduce_mean,
    "sum_of_squares": reference.reduce_sum_of_squares,
    "norm": reference.reduce_norm,
    "amax": reference.reduce_amax,
    "amin": reference.reduce_amin,
}


def _elements(a) -> tuple:
    """A host array's strides in elements (what the planner takes)."""
    return tuple(s // a.itemsize for s in a.strides)


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

CHAINS, CHAIN_LENGTH, LEAF = P.TREE_CHAINS, P.TREE_CHAIN_LENGTH, P.TREE_LEAF


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _same_or_nan(a, b) -> bool:
    """Equal bits, or both NaN (NaN payloads are not part of the contract)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype.kind == "f" and np.isnan(a) and np.isnan(b):
        return True
    return a.tobytes() == b.tobytes()


def _extreme(a, b, larger: bool):
    """reduce.cu's Max (``larger``) or Min of two scalars, as tree._tree_max / _tree_min give them
    (test_scalar_extremes_are_the_references checks that on every pair of special values): a NaN operand
    gives a NaN (their sum), of two equal values max keeps +0 over -0 and min -0 over +0. Scalar
    comparisons, where the reference's array selects cost the simulations below most of their time."""
    if a != a or b != b:
        return a + b
    if a == b:
        return (b if np.signbit(a) else a) if larger else (a if np.signbit(a) else b)
    return (a if a > b else b) if larger else (a if a < b else b)


class _Tree:
    """One op's combine and identity in the accumulator dtype ``a``, applied as reduce.cu applies them,
    and the kernels' building blocks (common/reduce.cuh) on Python lists of values. ``combine`` is the
    reference's (array) combine, for the emulator; a call combines two scalars (max and min by _extreme)."""

    larger = None  # max: True, min: False (_extreme), else the combine itself

    def __init__(self, op: int, a):
        self.a = np.dtype(a)
        self.combine = {P.OP_MAX: tree._tree_max, P.OP_MIN: tree._tree_min}.get(op, tree._tree_sum)
        self.identity = self.a.type({P.OP_MAX: -np.inf, P.OP_MIN: np.inf}.get(op, 0))
        self.larger = {P.OP_MAX: True, P.OP_MIN: False}.get(op)

    def __call__(self, a, b):
        a, b = self.a.type(a), self.a.type(b)
        if self.larger is not None:
            return _extreme(a, b, self.larger)
        with np.errstate(invalid="ignore", over="ignore"):
            return self.a.type(self.combine(a, b))

    def chain(self, values):
        """A chain's value from its present elements (m order): added one after another into the identity
        (absent elements, the identity, would change nothing)."""
        acc = self.identity
        for v in values:
            acc = self(acc, v)
        return acc

    def pairs(self, values):
        """tree_reduce over a power-of-two count, or the tree over any count padded with the identity."""
        values = list(values)
        values += [self.identity] * ((1 << (len(values) - 1).bit_length()) - len(values))
        while len(values) > 1:
            values = [self(values[i], values[i + 1]) for i in range(0, len(values), 2)]
        return values[0]

    def lanes(self, values, width: int) -> list:
        """group_tree_reduce over aligned groups of ``width`` lanes: each lane combines its own value with
        its partner's; every lane of a group must end with the same bits (the combine is commutative)."""
        m = 1
        while m < width:
            values = [self(values[lane], values[lane ^ m]) for lane in range(len(values))]
            m *= 2
        for g in range(0, len(values), width):
            assert len({np.asarray(v).tobytes() for v in values[g:g + width]}) == 1, "lanes disagree"
        return values

    def block(self, warp_values, block: int):
        """block_tree_reduce<BLOCK, C, 1> with each warp's value in its lane 0 (the identity elsewhere)."""
        lanes = [warp_values[i // 32] if i % 32 == 0 else self.identity for i in range(block)]
        lanes = self.lanes(lanes, 32)
        return self.pairs([lanes[w * 32] for w in range(block // 32)])

    def stack(self, values):
        """tree_push of values 0, 1, ... then tree_result(count)."""
        level = {}
        for k, v in enumerate(values):
            lev = 0
            while (k >> lev) & 1:
                v = self(level[lev], v)
                lev += 1
            level[lev] = v
        out, first = self.identity, True
        for lev in range(len(values).bit_length()):
            if (len(values) >> lev) & 1:
                out = level[lev] if first else self(level[lev], out)
                first = False
        return out


def _chunk(t: _Tree, v, start: int, group: int, cv: int):
    """chunk_value: lane l of a group of ``group`` lanes adds its cv chains from start + lane_start(l),
    combines them, then the group's lanes combine."""
    per_leaf = CHAINS // cv
    out = []
    for lane in range(group):
        e0 = start + (lane // per_leaf) * LEAF + (lane % per_leaf) * cv
        acc = [t.chain([v[i] for m in range(CHAIN_LENGTH) if (i := e0 + m * CHAINS + j) < v.size])
               for j in range(cv)]
        out.append(t.pairs(acc))
    return t.lanes(out, group)[0]


def _full_split(t: _Tree, chunks, block: int, grid: int, lanes: bool = True):
    """reduce_full over its chunks' values: the span each warp derives from the grid, its stack, each
    block's warps, the last block's FULL_FOLD partials a thread (``lanes=False``: the block-level trees
    over their values directly, which the simulation with lanes shows they are)."""
    if not lanes:
        t = _Quick(t)
    warps = block // 32
    span = 1
    while span * grid * warps < len(chunks):
        span *= 2
    assert grid <= P.FULL_FOLD * block
    partials = []
    for b in range(grid):
        values = []
        for w in range(warps):
            first = (b * warps + w) * span
            values.append(t.stack(chunks[first:first + max(0, min(span, len(chunks) - first))]))
        partials.append(t.block(values, block))
    p = partials + [t.identity] * (P.FULL_FOLD * block - grid)
    per_thread = [t.pairs(p[i * P.FULL_FOLD:(i + 1) * P.FULL_FOLD]) for i in range(block)]
    lanes = t.lanes(per_thread, 32)
    return t.pairs([lanes[w * 32] for w in range(block // 32)])


class _Quick:
    """A _Tree whose lanes are not simulated one by one."""

    def __init__(self, t: _Tree):
        self.t = t
        self.identity, self.pairs, self.stack = t.identity, t.pairs, t.stack

    def block(self, warp_values, block: int):
        return self.t.pairs(warp_values)

    def lanes(self, values, width: int) -> list:
        return [self.t.pairs(values[g:g + width]) for g in range(0, len(values), width) for _ in range(width)]


def _row_split(t: _Tree, chunks, tpr: int):
    """reduce_rows over one row's chunks (of min(tpr, 32) lanes each): spans per warp, their stacks, and
    the row's warps."""
    group = min(tpr, 32)
    groups = tpr // group
    span = 1
    while span * groups < len(chunks):
        span *= 2
    assert span == 1 or group == 32, "a sub-warp group takes one chunk"
    values = []
    for g in range(groups):
        mine = chunks[g * span:g * span + max(0, min(span, len(chunks) - g * span))]
        values.append((mine[0] if mine else t.identity) if span == 1 else t.stack(mine))
    return values[0] if groups == 1 else t.block(values, tpr)


def _row(t: _Tree, v, itemsize: int, tpr: int):
    cv = P.lane_elements(itemsize)
    group = min(tpr, 32)
    size = group * cv * CHAIN_LENGTH
    return _row_split(t, [_chunk(t, v, q * size, group, cv) for q in range(_cdiv(v.size, size))], tpr)


def _col_leaf(t: _Tree, v, leaf: int, q: int):
    """reduce_cols' value of one leaf of one column: row lane ty's q chains, combined in the thread, then
    across the 32 / q row lanes."""
    stage = []
    for ty in range(CHAINS // q):
        r0 = leaf * LEAF + q * ty
        acc = [t.chain([v[r] for m in range(CHAIN_LENGTH) if (r := r0 + m * CHAINS + c) < v.size]) for c in range(q)]
        stage.append(t.pairs(acc))
    return t.lanes(stage, CHAINS // q)[0]


def _col_split(t: _Tree, leaves, span: int, spans: int):
    """reduce_cols' span stacks over a column's leaf values, then reduce_cols_fold's stack over spans."""
    assert spans == _cdiv(len(leaves), span) <= P.COL_MAX_SPANS
    partials = [t.stack(leaves[sp * span:(sp + 1) * span]) for sp in range(spans)]
    return partials[0] if spans == 1 else t.stack(partials)


def _strided(t: _Tree, v):
    """reduce_strided: lane c holds chain c of each leaf; the lanes combine; a stack over the leaves."""
    leaves = []
    for k in range(_cdiv(v.size, LEAF)):
        lanes = []
        for lane in range(32):
            lanes.append(t.chain([v[r] for m in range(CHAIN_LENGTH) if (r := k * LEAF + m * CHAINS + lane) < v.size]))
        leaves.append(t.lanes(lanes, 32)[0])
    return t.stack(leaves)


def _by_definition(t: _Tree, v):
    """The module notes' tree, written out: chains skipping elements past n, then the recursive tree."""
    chains = []
    for leaf in range(_cdiv(v.size, LEAF)):
        for c in range(CHAINS):
            chains.append(t.chain([v[i] for m in range(CHAIN_LENGTH) if (i := leaf * LEAF + m * CHAINS + c) < v.size]))

    def tree(lo: int, size: int):
        if size == 1:
            return chains[lo] if lo < len(chains) else t.identity
        return t(tree(lo, size // 2), tree(lo + size // 2, size // 2))

    return tree(0, 1 << (len(chains) - 1).bit_length())


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


def _tuner_knobs():
    """Every knob point of the lab's tuning spaces (the candidates the tuner times)."""
    from cukern.lab import reduce as lab_reduce

    out = []
    for space in lab_reduce.SPACES.values():
        names = list(space)
        for values in itertools.product(*(space[k] for k in names)):
            out.append(P.Knobs(**dict(zip(names, values))))
    return out


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
# Compilation of every production instantiation: resources and PTX.


@pytest.mark.nvrtc(P.SOURCE)
@pytest.mark.parametrize("arch", ARCHS)
def test_every_instantiation_compiles_without_spills_and_vectorizes(arch):
    c = compiled(P.SOURCE, arch)
    res = c.resources()
    insts = checked_instantiations(P.SOURCE)
    assert len(c.lowered) == len(insts) > len(P.instantiations()) / 4
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
    assert pairs >= 7  # in the sample (tests/_support.py)


def test_instantiations_are_generated_and_cover_the_dispatcher():
    insts = P.instantiations()
    assert len(insts) == len(set(insts))
    # CI compiles all of them for two architectures (var and std add 64, prod and logsumexp 52, complex
    # products 8 of those; the NaN-aware ops none; the int64 counts and the bool results of any and all 42)
    assert len(insts) <= 708
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


def test_defaults_are_the_h200_sweep_winners():
    # docs/design/reductions.md: rows [32768, 16384] float32 with 256 threads a row, unroll 4, 4 blocks
    # a SM and a grid of 32 waves; the full sum: blocks of 256, 4 an SM, the whole chain step's 8 loads in
    # flight ("Groups combined in batches").
    k = P.DEFAULT_KNOBS
    assert k.row_waves == 32 and (k.row_max_tpr, k.row_unroll, k.row_threads_per_sm) == (256, 4, 1024)
    assert (k.full_block, k.full_blocks_per_sm, k.full_unroll) == (256, 4, 8)
    p = P.plan_rows(16384, 32768, 4, 132)
    assert (p.tpr, p.unroll, p.min_blocks, p.grid) == (256, 4, 4, 32 * 132 * 4)


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


ZERO_SIZE_VIEWS = {  # label -> view of a (3, 5) array
    "x[:, :0]": lambda a: a[:, :0],
    "x[:0]": lambda a: a[:0],
    "x[:0, :0]": lambda a: a[:0, :0],
    "x[:, :0].T": lambda a: a[:, :0].T,
    "x[::-1, 5:]": lambda a: a[::-1, 5:],
    "x.reshape(3, 1, 5)[:, :, :0]": lambda a: a.reshape(3, 1, 5)[:, :, :0],
    "x[:, :0:2] of a transposed x": lambda a: a.T.copy().T[:, :0:2],
}


def _axis_choices(ndim: int) -> list:
    return [None, *range(ndim), -1, tuple(range(ndim)), ()]


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


# What a reduction of each layout class looks like (the GPU capture tests use the same table): the shape of
# a C-contiguous base, the view taken of it, the axis, and the kind and number of passes the planner gives.
LAYOUT_CLASSES = {
    "full": ((4099,), lambda a: a, None, "full", 1),
    "full, reversed": ((4099,), lambda a: a[::-1], None, "full", 1),
    "rows": ((33, 1031), lambda a: a, -1, "rows", 1),
    "columns, one pass": ((33, 4096), lambda a: a, 0, "cols", 1),
    "columns, two passes": ((4096, 64), lambda a: a, 0, "cols", 2),
    "strided": ((4, 5, 6), lambda a: a, (0, 2), "strided", 1),
    "size-1 axes": ((5, 1, 7), lambda a: a, 1, "none", 0),
    "zero-size reduction": ((3, 5), lambda a: a[:, :0], 1, "fill", 0),
    "no outputs": ((3, 5), lambda a: a[:0], 1, "empty", 0),
}


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


# ---------------------------------------------------------------------------------------------------------
# GPU.

ALL_DTYPES = (np.float32, np.float64, np.float16, BFLOAT16, np.int32, np.int64, np.bool_)


def _data(rng, shape, dtype, *, signed=False):
    """Random values that are never zero: floats in [0.5, 1.5) (times a random sign when ``signed``),
    integers in [1, 100] (or [-100, -1] U [1, 100]), booleans mostly True."""
    dtype = np.dtype(dtype)
    size = math.prod(shape)
    if dtype == np.bool_:
        return (rng.random(size) < 0.9).reshape(shape)
    if dtype.kind == "i":
        v = rng.integers(1, 101, size)
    else:
        v = rng.random(size) + 0.5
    if signed:
        v = v * rng.choice([-1, 1], size)
    return v.reshape(shape).astype(dtype)


def _check_result(name, got, x_host, axis, keepdims=False, dtype=None):
    """``got`` against the float64 reference. The bound scales with the sum of magnitudes, not with the
    result (a signed sum may cancel to near zero), hence not the elementwise rule of _support."""
    import cupy

    t = x_host.dtype
    want_dtype = P.result_dtype(name, t, dtype)
    assert got.dtype == want_dtype, (name, got.dtype, want_dtype)
    ref = REFS[name](x_host, axis=axis, keepdims=keepdims)
    g = cupy.asnumpy(got).astype(np.float64 if want_dtype.kind == "f" or want_dtype == BFLOAT16 else np.int64)
    assert g.shape == np.shape(ref)
    axes = P.normalize_axis(axis, x_host.ndim)
    n = max(1, math.prod(x_host.shape[i] for i in axes))
    acc = P.acc_dtype(want_dtype)
    if name in ("amax", "amin") or acc.kind == "i":
        tol = 0.0
    else:
        w = np.abs(x_host.astype(np.float64))
        mag = np.sum(w * w if name in ("sum_of_squares", "norm") else w, axis=axis, keepdims=keepdims)
        tol = reference.reduction_tolerance(n, acc, 1.0) * mag
        if name == "mean":
            tol = tol / n
        if name == "norm":
            tol = tol / (2 * np.maximum(np.asarray(ref), 1e-30))
    out_eps = 0.0 if want_dtype.kind in "biu" else float(np.finfo(np.float32 if want_dtype == BFLOAT16 else want_dtype).eps)
    if want_dtype == BFLOAT16:
        out_eps = 2.0**-8
    tol = tol + out_eps * np.abs(ref)  # rounding the result to its dtype
    if want_dtype.kind == "f":  # as in NumPy, a result past its dtype's range is an infinity of the right sign
        over = np.abs(ref) > float(np.finfo(want_dtype).max) * (1 + out_eps)
        assert np.all(np.where(over, g == np.sign(ref) * np.inf, True)), (name, dtype_name(t), "overflow")
        ref, g = np.where(over, 0.0, ref), np.where(over, 0.0, g)
    assert np.all(np.abs(g - ref) <= tol), (name, dtype_name(t), x_host.shape, axis, np.max(np.abs(g - ref)))


def _same_bits(a, b) -> bool:
    import cupy

    return a.shape == b.shape and a.dtype == b.dtype and cupy.asnumpy(a).tobytes() == cupy.asnumpy(b).tobytes()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_name)
@pytest.mark.parametrize("n", [1, 31, 1000003])
def test_full_reductions(rng, dtype, n):
    import cupy

    xh = _data(rng, (n,), dtype)
    x = cupy.asarray(xh)
    for name in OP_NAMES:
        if np.dtype(dtype) not in P.OPS[name].inputs:
            continue
        _check_result(name, getattr(R, name)(x), xh, None)


@pytest.mark.gpu
def test_large_float32_sum_and_bit_identical_reruns(rng):
    import cupy

    n = 2**28 + 7
    x = cupy.random.random(n, dtype=np.float32) + np.float32(0.5)
    ref = math.fsum(float(x[i:i + 2**26].astype(np.float64).sum()) for i in range(0, n, 2**26))
    got = R.sum(x)
    assert abs(float(got) - ref) <= reference.reduction_tolerance(n, np.float32, ref)
    again = [R.sum(x) for _ in range(5)]
    assert all(_same_bits(a, got) for a in again)
    assert float(R.amax(x)) == float(x.max())


@pytest.mark.gpu
def test_bit_identical_reruns_every_layout(rng):
    import cupy

    x = cupy.asarray(_data(rng, (4097, 1031), np.float32, signed=True))
    for axis in (None, 0, 1):
        for fn in (R.sum, R.norm):
            first = fn(x, axis=axis)
            for _ in range(3):
                assert _same_bits(fn(x, axis=axis), first)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float16, BFLOAT16, np.float64], ids=dtype_name)
def test_nan_propagates(dtype):
    import cupy

    for n in (1, 5, 1000003):
        for where in sorted({0, n // 2, n - 1}):
            xh = np.linspace(-3, 3, n).astype(dtype)
            xh[where] = np.nan
            x = cupy.asarray(xh)
            assert np.isnan(float(R.amax(x))) and np.isnan(float(R.amin(x))), (n, where)
            assert np.isnan(float(R.sum(x)))
    xh = np.ones((3, 4097), dtype)
    xh[1, 4000] = np.nan
    for axis in (0, 1):
        got = cupy.asnumpy(R.amax(cupy.asarray(xh), axis=axis)).astype(np.float64)
        assert np.array_equal(np.isnan(got), np.isnan(np.max(xh.astype(np.float64), axis=axis)))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, BFLOAT16, np.int32], ids=dtype_name)
@pytest.mark.parametrize("m", [1, 3, 4097])
@pytest.mark.parametrize("n", [1, 3, 4097])
def test_axis_variants(rng, dtype, m, n):
    import cupy

    xh = _data(rng, (m, n), dtype, signed=True)
    x = cupy.asarray(xh)
    for name in OP_NAMES:
        for axis in (None, 0, 1, -1, (0, 1)):
            for keepdims in (False, True):
                _check_result(name, getattr(R, name)(x, axis=axis, keepdims=keepdims), xh, axis, keepdims)


@pytest.mark.gpu
def test_size_1_axes_match_the_kernels_bit_for_bit(rng):
    """A reduction over size-1 axes only is elementwise (no kernel); it gives what a kernel gives for the
    same values: squares formed in the accumulator and rounded once, conversions as the kernels store them.
    The kernel side reduces each value with a zero (sums), or with itself (amax, amin)."""
    import cupy

    for dtype in (np.float16, BFLOAT16, np.float32, np.float64, np.int32, np.int64):
        xh = _data(rng, (7, 1, 9), dtype, signed=True)
        x = cupy.asarray(xh)
        with_zero = cupy.asarray(np.concatenate([xh, np.zeros_like(xh)], axis=1))
        with_itself = cupy.asarray(np.concatenate([xh, xh], axis=1))
        for name in ("sum", "mean", "sum_of_squares", "amax", "amin"):
            fn = getattr(R, name)
            minmax = P.OPS[name].minmax
            for dt in [None] if minmax else [None, *P.kernel_dtypes(name, dtype)]:
                got = fn(x, axis=1, dtype=dt)
                if minmax:
                    want = fn(with_itself, axis=1)
                elif name == "mean":  # the kernels' mean would halve: compare with the sum, in mean's dtype
                    want = R.sum(with_zero, axis=1, dtype=got.dtype)
                else:
                    want = fn(with_zero, axis=1, dtype=dt)
                assert _same_bits(got, want), (name, dtype_name(dtype), dt)


@pytest.mark.gpu
def test_layouts_views_and_misalignment(rng):
    import cupy

    base_h = _data(rng, (6, 37, 41), np.float32, signed=True)
    base = cupy.asarray(base_h)
    views = {
        "contiguous": (base, base_h),
        "offset": (base.reshape(-1)[1:].reshape(-1)[: 6 * 37 * 41 - 5], base_h.reshape(-1)[1: 6 * 37 * 41 - 4]),
        "transposed": (base.transpose(2, 0, 1), base_h.transpose(2, 0, 1)),
        "step": (base[:, ::2, 1:], base_h[:, ::2, 1:]),
        "reversed": (base[::-1, :, ::-1], base_h[::-1, :, ::-1]),
    }
    for label, (x, xh) in views.items():
        axes = [None] + list(range(xh.ndim)) + [(0, xh.ndim - 1)] if xh.ndim > 1 else [None, 0]
        for axis in axes:
            for name in ("sum", "amax", "norm"):
                _check_result(name, getattr(R, name)(x, axis=axis), xh, axis)


@pytest.mark.gpu
def test_misaligned_rows_and_dtype_argument(rng):
    import cupy

    for dtype in (np.float16, BFLOAT16, np.float32, np.int64, np.bool_):
        xh = _data(rng, (1000003 + 3,), dtype)
        x = cupy.asarray(xh)
        for k in (1, 2, 3):
            _check_result("sum", R.sum(x[k:]), xh[k:], None)
        for k, width in ((1, 3), (3, 1001)):  # rows start at every alignment
            rows_h = xh[k:k + 997 * width].reshape(997, width)
            rows = x[k:k + 997 * width].reshape(997, width)
            _check_result("sum", R.sum(rows, axis=1), rows_h, 1)
            _check_result("sum", R.sum(rows, axis=0), rows_h, 0)
    xh = _data(rng, (4097, 33), np.float16)
    x = cupy.asarray(xh)
    for dt in ("float32", "float64"):
        for name in ("sum", "mean", "norm"):
            _check_result(name, getattr(R, name)(x, axis=0, dtype=dt), xh, 0, dtype=dt)
    xi = _data(rng, (4097, 33), np.int32)
    _check_result("sum", R.sum(cupy.asarray(xi), axis=1, dtype=np.int32), xi, 1, dtype=np.int32)


_NUMPY = {
    "sum": np.sum,
    "mean": np.mean,
    "sum_of_squares": lambda a, **kw: np.sum(a * a, **kw),
    "norm": lambda a, **kw: np.sqrt(np.sum(a * a, **kw)),
    "amax": np.max,
    "amin": np.min,
}


@pytest.mark.gpu
@pytest.mark.parametrize("label", ZERO_SIZE_VIEWS)
def test_zero_size_views_answer_as_numpy(label):
    """Every zero-size view, any axis, keepdims or not, fresh or into out: NumPy's values (sum 0,
    mean NaN with its "Mean of empty slice." warning), and amax/amin of an empty reduction raise
    ValueError as NumPy does, before anything is written."""
    import cupy

    xh = ZERO_SIZE_VIEWS[label](np.ones((3, 5), np.float32))
    x = ZERO_SIZE_VIEWS[label](cupy.ones((3, 5), np.float32))
    for axis in _axis_choices(xh.ndim):
        for keepdims in (False, True):
            for name in OP_NAMES:
                fn = getattr(R, name)
                with warnings.catch_warnings(record=True) as numpy_warned:
                    warnings.simplefilter("always")
                    try:
                        want = np.asarray(_NUMPY[name](xh, axis=axis, keepdims=keepdims))
                    except ValueError:
                        want = None
                if want is None:
                    with pytest.raises(ValueError, match="zero-size array to reduction operation"):
                        fn(x, axis=axis, keepdims=keepdims)
                    out = cupy.full(P.result_shape(x.shape, P.normalize_axis(axis, x.ndim), keepdims), 7.0,
                                    np.float32)
                    with pytest.raises(ValueError, match="zero-size"):
                        fn(x, axis=axis, keepdims=keepdims, out=out)
                    assert bool((out == 7.0).all())  # untouched
                    continue
                empty_slice = any("Mean of empty slice" in str(w.message) for w in numpy_warned)
                for with_out in (False, True):
                    out = cupy.full(want.shape, 7.0, np.float32) if with_out else None
                    with warnings.catch_warnings(record=True) as ours:
                        warnings.simplefilter("always")
                        got = fn(x, axis=axis, keepdims=keepdims, out=out)
                    assert got.shape == want.shape and got.dtype == np.float32, (label, name, axis, keepdims)
                    assert np.array_equal(cupy.asnumpy(got), want, equal_nan=True), (label, name, axis, keepdims)
                    assert out is None or got is out
                    said = any("Mean of empty slice" in str(w.message) for w in ours)
                    assert said == empty_slice, (label, name, axis, keepdims)


@pytest.mark.gpu
def test_empty_and_out(rng):
    import cupy

    e = cupy.zeros((0,), np.float32)
    assert float(R.sum(e)) == 0.0 and float(R.sum_of_squares(e)) == 0.0 and float(R.norm(e)) == 0.0
    with pytest.warns(RuntimeWarning, match="Mean of empty slice"):
        assert np.isnan(float(R.mean(e)))
    with pytest.raises(ValueError, match="zero-size"):
        R.amax(e)
    with pytest.raises(ValueError, match="zero-size"):
        R.amin(cupy.zeros((3, 0), np.float32), axis=1)
    assert R.amax(cupy.zeros((0, 3), np.float32), axis=1).shape == (0,)
    assert R.sum(cupy.zeros((0, 3), np.int32), axis=0).tolist() == [0, 0, 0]
    xh = _data(rng, (5, 9), np.float32)
    x = cupy.asarray(xh)
    out = cupy.empty(9, np.float32)
    assert R.sum(x, axis=0, out=out) is out
    _check_result("sum", out, xh, 0)
    strided_out = cupy.empty(18, np.float32)[::2]
    R.amax(x, axis=0, out=strided_out)
    assert np.array_equal(cupy.asnumpy(strided_out), xh.max(0))
    s = cupy.asarray(np.float32(3.0))
    assert float(R.sum(s)) == 3.0 and R.sum(s).shape == ()


@pytest.mark.gpu
def test_cached_calls_match_the_general_path(rng):
    import cupy

    xh = _data(rng, (513, 1031), np.float32, signed=True)
    x = cupy.asarray(xh)
    cases = [dict(), dict(axis=1), dict(axis=0), dict(axis=(0, 1)), dict(axis=1, keepdims=True),
             dict(dtype=np.float64), dict(axis=-1, dtype="float64")]
    for name in ("sum", "norm", "amax"):
        for kw in cases:
            if name == "amax" and "dtype" in kw:
                continue
            first = getattr(R, name)(x, **kw)  # general path, then cached
            second = getattr(R, name)(x, **kw)  # from the call cache
            assert _same_bits(second, first), (name, kw)
            assert second.data.ptr != first.data.ptr  # a fresh result every call
    y = cupy.asarray(xh[:, 1:])  # other strides and alignment: its own entry
    _check_result("sum", R.sum(y, axis=1), xh[:, 1:], 1)
    _check_result("sum", R.sum(x[:, 1:], axis=1), xh[:, 1:], 1)
    _check_result("sum", R.sum(x[::-1, 0]), xh[::-1, 0], None)
    _check_result("sum", R.sum(x[::-1, 0]), xh[::-1, 0], None)
    # values that compare equal to cached valid arguments are still rejected
    R.sum(x, axis=1)
    with pytest.raises(TypeError):
        R.sum(x, axis=True)
    with pytest.raises(TypeError):
        R.sum(x, axis=(True,))
    with pytest.raises(TypeError):
        R.sum(x, axis=1.0)
    with cupy.cuda.Stream():  # another stream: its own workspace and entry
        _check_result("sum", R.sum(x), xh, None)
    _check_result("sum", R.sum(x), xh, None)


@pytest.mark.gpu
@pytest.mark.parametrize("knobs", [
    P.Knobs(),
    P.Knobs(row_max_tpr=512, row_threads_per_sm=1024, row_waves=32),
    P.Knobs(row_max_tpr=32, row_items=128, row_waves=None),
    P.Knobs(row_max_tpr=128, row_unroll=8, row_threads_per_sm=1024, row_waves=4),
    P.Knobs(full_block=256, full_blocks_per_sm=4, full_unroll=8),
    P.Knobs(full_block=1024, full_blocks_per_sm=1, full_unroll=2),
])
def test_knob_settings_are_correct(rng, knobs):
    import cupy

    xh = _data(rng, (257, 16411), np.float32, signed=True)
    x = cupy.asarray(xh)
    _check_result("sum", R._reduce("sum", x, -1, None, False, None, knobs=knobs), xh, -1)
    _check_result("sum", R._reduce("sum", x, -1, None, False, None, knobs=knobs), xh, -1)  # cached
    _check_result("sum", R._reduce("sum", x, None, None, False, None, knobs=knobs), xh, None)
    f32 = np.dtype(np.float32)
    for axis, view, ref in ((-1, x, xh), (None, x, xh), (-1, x[:, 3:], xh[:, 3:])):
        pl = P.plan(view.shape, view.dtype, axis, strides=_elements(view), ptr=view.data.ptr % 16, knobs=knobs)
        shape = () if axis is None else (view.shape[0],)
        out = cupy.empty(shape, f32)
        R._prepare(pl, view, f32, P.OPS["sum"], pl.layout.count, shape).run(out, view)
        _check_result("sum", out, ref, axis)


def _failing_allocator(size):
    raise MemoryError(f"unexpected device allocation of {size} bytes")


@pytest.mark.gpu
def test_out_is_written_directly_without_allocations(rng):
    import cupy

    xh = _data(rng, (257, 1031), np.float32, signed=True)
    x = cupy.asarray(xh)
    cases = [dict(), dict(axis=1), dict(axis=-1, keepdims=True), dict(axis=0), dict(axis=(0, 1)),
             dict(axis=1, dtype=np.float64)]
    assert P.plan(x.shape, x.dtype, 0).fold is not None  # axis=0 here is the two-pass column plan
    for name in ("sum", "norm", "amax"):
        for kw in cases:
            if name == "amax" and "dtype" in kw:
                continue
            want = getattr(R, name)(x, **kw)
            outs = [cupy.full(want.shape, np.nan, want.dtype) for _ in range(3)]
            assert getattr(R, name)(x, **kw, out=outs[0]) is outs[0]  # general path, then cached
            with cupy.cuda.using_allocator(_failing_allocator):  # every plan: no temporary, workspaces made
                assert getattr(R, name)(x, **kw, out=outs[1]) is outs[1]  # cached
                R._calls.clear()
                assert getattr(R, name)(x, **kw, out=outs[2]) is outs[2]  # general path
            for o in outs:
                assert _same_bits(o, want), (name, kw)
    # A strided out, and amax with a converted dtype, go through a temporary and still land in out.
    strided = cupy.zeros(2 * 1031, np.float32)[::2]
    assert R.sum(x, axis=0, out=strided) is strided
    _check_result("sum", strided, xh, 0)
    conv = cupy.zeros(257, np.float64)
    assert R.amax(x, axis=1, dtype=np.float64, out=conv) is conv
    assert np.array_equal(cupy.asnumpy(conv), xh.max(1).astype(np.float64))


@pytest.mark.gpu
def test_out_overlapping_x_raises():
    import cupy

    y = cupy.ones((5, 4), np.float32)
    with pytest.raises(ValueError, match="out overlaps x"):
        R.sum(y, axis=0, out=y[0])
    with pytest.raises(ValueError, match="out overlaps x"):
        R.sum(y, axis=1, out=y[:, 0])  # strided: the temporary path checks too
    out = cupy.empty(4, np.float32)
    R.sum(y, axis=0, out=out)  # cached for out's shape, strides, dtype and alignment
    R.sum(y, axis=0, out=out)
    with pytest.raises(ValueError, match="out overlaps x"):
        R.sum(y, axis=0, out=y[1])  # same description as out: the cached call still checks
    assert float(y.sum()) == 20.0  # nothing was written into x
    assert out.tolist() == [5.0] * 4


@pytest.mark.gpu
def test_out_in_a_cuda_graph(rng):
    import cupy

    from cukern.lab import pipeline

    x = cupy.asarray(_data(rng, (64, 4096), np.float32, signed=True))
    calls = [(name, axis) for name in ("sum", "amax", "norm") for axis in (None, -1, 0)]
    shapes = {None: (), -1: (64,), 0: (4096,)}
    outs = [cupy.empty(shapes[axis], np.float32) for _, axis in calls]

    def step():
        return [getattr(R, name)(x, axis=axis, out=o) for (name, axis), o in zip(calls, outs)]

    captured = pipeline.capture(step)
    assert all(r is o for r, o in zip(captured.results[0], outs))
    for _ in range(2):  # new inputs each replay: the graph writes into out again
        with captured.stream:
            x[...] = cupy.asarray(_data(rng, x.shape, np.float32, signed=True))
            for o in outs:
                o.fill(np.nan)
            captured.replay()
            captured.stream.synchronize()
        for (name, axis), o in zip(calls, outs):
            assert _same_bits(o, getattr(R, name)(x, axis=axis)), (name, axis)


@pytest.mark.gpu
@pytest.mark.filterwarnings("ignore:Mean of empty slice")
@pytest.mark.parametrize("label", LAYOUT_CLASSES)
def test_captured_reductions_write_only_their_results(rng, label):
    """Every op, fresh and into a C-contiguous out, of each layout class: after one eager call on the
    stream (compilation, plans, workspaces), the capture frees nothing, so arrays allocated after it never
    share memory with what its replays write, and the replays give the eager results."""
    import cupy

    shape, view, axis, kind, _ = LAYOUT_CLASSES[label]
    x = view(cupy.asarray(_data(rng, shape, np.float32, signed=True)))
    names = [n for n in OP_NAMES if not (kind == "fill" and P.OPS[n].minmax)]
    pool = cupy.get_default_memory_pool()
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        want = {n: getattr(R, n)(x, axis=axis) for n in names}
        outs = {n: cupy.full(w.shape, -1, w.dtype) for n, w in want.items()}
        for n in names:
            getattr(R, n)(x, axis=axis, out=outs[n])
        stream.synchronize()
        gc.collect()
        pool.free_all_blocks()
        graph, results, freed = capture(stream, lambda: ([getattr(R, n)(x, axis=axis) for n in names]
                                                          + [getattr(R, n)(x, axis=axis, out=outs[n]) for n in names]))
        later = victims(pool)
        for v in later:
            v.fill(0x5A)
        for o in outs.values():
            o.fill(-1)
        for _ in range(2):
            graph.launch(stream)
        stream.synchronize()
    assert not freed, f"{label}: the capture freed blocks of {freed} bytes that its replays may still write"
    assert all(bool((v == 0x5A).all()) for v in later), f"{label}: a replay wrote into a later allocation"
    for n, got in zip(names + names, results):
        assert _same_bits(got, want[n]), (label, n)
    assert all(r is outs[n] for n, r in zip(names, results[len(names):]))


@pytest.mark.gpu
def test_capture_refuses_a_temporary_before_recording_anything(rng):
    """Calls that go through a temporary work eagerly; under capture they raise RuntimeError before
    anything is recorded or allocated."""
    import cupy

    deep = cupy.asarray(_data(rng, (6, 7, 8, 9, 10), np.float32, signed=True))
    y = cupy.asarray(_data(rng, (33, 1031), np.float32, signed=True))
    strided_out = cupy.empty(2 * 1031, np.float32)[::2]
    deep_out = cupy.empty((6, 8, 10), np.float32)
    wide_out = cupy.empty(33, np.float64)
    assert P.plan(deep.shape, deep.dtype, (1, 3)).copy
    cases = {
        "copied layout": lambda: R.sum(deep, axis=(1, 3)),
        "copied layout into out": lambda: R.norm(deep, axis=(1, 3), out=deep_out),
        "strided out": lambda: R.sum(y, axis=0, out=strided_out),
        "amax converting": lambda: R.amax(y, axis=1, dtype=np.float64),
        "amin converting into out": lambda: R.amin(y, axis=1, dtype=np.float64, out=wide_out),
    }
    for label, call in cases.items():
        stream = cupy.cuda.Stream(non_blocking=True)
        with stream:
            call()  # eager: works, through a temporary
        refused_in_capture(stream, call)


@pytest.mark.gpu
def test_capture_refuses_to_make_or_grow_a_workspace(rng, monkeypatch):
    """A full or two-pass column reduction needs the stream's workspace, made and grown by eager calls; a
    capture that would have to make or grow it is refused, and works once an eager call has done that."""
    import cupy

    from cukern._launch import CallCache

    # Workspaces and the cached calls that point into them, for this test only (a stream made here may
    # reuse the address of one an earlier test made a workspace for).
    monkeypatch.setattr(R, "_workspaces", {})
    monkeypatch.setattr(R, "_calls", CallCache(4096))
    small = cupy.asarray(_data(rng, (4096, 64), np.float32))
    big = cupy.asarray(_data(rng, (4096, 256), np.float32))
    sm = cupy.cuda.Device().attributes["MultiProcessorCount"]
    need_small = P.plan(small.shape, small.dtype, 0, sm_count=sm).partials
    need_big = P.plan(big.shape, big.dtype, 0, sm_count=sm).partials
    assert 0 < 2 * need_small < need_big  # the small one's scratch, even doubled, is too small for the big one
    for a in (small, big):  # compiled on the default stream
        R.sum(a)
        R.sum(a, axis=0)
    stream = cupy.cuda.Stream(non_blocking=True)
    refused_in_capture(stream, lambda: R.sum(small), "before capturing")  # no workspace on this stream yet
    refused_in_capture(stream, lambda: R.sum(small, axis=0), "before capturing")
    with stream:
        R.sum(small, axis=0)  # eager: makes the workspace, with scratch for the small partials
    refused_in_capture(stream, lambda: R.sum(big, axis=0), "before capturing")  # would grow it
    pool = cupy.get_default_memory_pool()
    with stream:
        R.sum(big, axis=0)  # eager: grows it
        want = [R.sum(small, axis=0), R.sum(big, axis=0), R.sum(small)]
        stream.synchronize()
        gc.collect()
        pool.free_all_blocks()
        graph, got, freed = capture(stream, lambda: [R.sum(small, axis=0), R.sum(big, axis=0), R.sum(small)])
        later = victims(pool)
        for v in later:
            v.fill(0x5A)
        graph.launch(stream)
        stream.synchronize()
    assert not freed
    assert all(bool((v == 0x5A).all()) for v in later)
    assert all(_same_bits(g, w) for g, w in zip(got, want))


@pytest.mark.gpu
def test_every_stream_keeps_its_own_workspace(rng):
    import cupy

    xh = _data(rng, (1 << 20,), np.float32)
    x = cupy.asarray(xh)
    cupy.cuda.Device().synchronize()
    streams = [cupy.cuda.Stream(non_blocking=True) for _ in range(6)]
    got, kept = [], {}
    for _ in range(3):  # interleaved: kernels of several streams in flight at once
        for s in streams:
            with s:
                got.append(R.sum(x))
                R._calls.clear()  # the general path, so each call asks for its stream's workspace
                got.append(R.sum(x))
                ws = R.workspace()
            assert kept.setdefault(s.ptr, ws) is ws  # made once per stream, never replaced
    for s in streams:
        s.synchronize()
    assert all(_same_bits(g, got[0]) for g in got)  # bit-identical on every stream
    _check_result("sum", got[0], xh, None)


@pytest.mark.gpu
def test_tuned_knobs_are_used(rng, monkeypatch):
    import cupy

    tuned = {"sum": P.Knobs(full_block=256, full_blocks_per_sm=4, full_unroll=8),
             "sum_rows": P.Knobs(row_max_tpr=128, row_unroll=2, row_waves=4)}
    seen = []

    def lookup(rule, device_id, dtype, shape):
        seen.append((rule.op, shape))
        return tuned.get(rule.op, rule.default)

    xh = _data(rng, (33, 4099), np.float32, signed=True)
    x = cupy.asarray(xh)
    R._calls.clear()
    monkeypatch.setattr(_tuned, "lookup", lookup)
    for _ in range(2):  # general path, then cached
        _check_result("sum", R.sum(x), xh, None)
        _check_result("sum", R.sum(x, axis=-1), xh, -1)
        _check_result("sum", R.sum(x, axis=1, out=cupy.empty(33, np.float32)), xh, 1)
    assert ("sum", (x.size,)) in seen and ("sum_rows", (33, 4099)) in seen
    monkeypatch.setattr(_tuned, "lookup", lambda rule, *a: rule.default)  # untuned: the defaults
    _check_result("sum", R.sum(x), xh, None)
    _check_result("sum", R.sum(x, axis=-1), xh, -1)


@pytest.mark.gpu
def test_bad_input_raises_before_launch():
    import cupy

    x = cupy.ones((4, 5), np.float32)
    with pytest.raises(TypeError, match="not supported"):
        R.sum_of_squares(cupy.ones(3, np.complex64))
    with pytest.raises(TypeError, match="supports"):
        R.logsumexp(cupy.ones(3, np.complex64))
    with pytest.raises(np.exceptions.AxisError):
        R.sum(x, axis=2)
    with pytest.raises(ValueError, match="shape"):
        R.sum(x, axis=0, out=cupy.empty(4, np.float32))
    with pytest.raises(TypeError, match="dtype=int32 is not supported"):
        R.norm(x, axis=0, dtype=np.int32)
    with pytest.raises(ValueError, match="zero stride"):
        R.sum(x, axis=0, out=cupy.broadcast_to(cupy.empty(1, np.float32), (5,)))
    with pytest.raises(TypeError, match="cupy"):
        R.sum(x, out=np.empty((), np.float32))


@pytest.mark.gpu
def test_more_than_2_31_elements():
    import cupy

    n = 2**31 + 7
    for dtype in (np.float16, BFLOAT16):
        x = cupy.empty(n, dtype=dtype)
        bits = x.view(np.uint16)  # filled through the bit pattern: no dependence on CuPy's half-type fills
        bits.fill(int(np.array(0.5, dtype).view(np.uint16)))
        bits[-3:] = int(np.array(1024, dtype).view(np.uint16))
        want = 0.5 * (n - 3) + 3 * 1024
        assert float(R.sum(x, dtype=np.float64)) == want
        assert float(R.amax(x)) == 1024.0
        rows = x[:-7].reshape(2**15, 2**16)
        got = R.sum(rows, axis=1, dtype=np.float64)
        assert float(got[-1]) == 0.5 * rows.shape[1] and float(got[0]) == 0.5 * rows.shape[1]
        two = x[:2**31].reshape(2, 2**30)  # rows of 2^30 elements: 64-bit indices within the row
        assert not P.plan(two.shape, two.dtype, 1).kernel.index32
        got = R.sum(two, axis=1, dtype=np.float64)
        assert float(got[0]) == float(got[1]) == 0.5 * 2**30
        del two
        del x, rows, got


@pytest.mark.gpu
def test_columns_past_one_launch():
    """2^31 matrices of 2 x 2 (a column grid past 2^31 - 1 blocks: the strided kernel) and columns of
    2^34 + 2^20 rows (129 spans of 2^19 leaves, past COL_MAX_SPANS, folded by reduce_cols_fold)."""
    import cupy

    free, _ = cupy.cuda.runtime.memGetInfo()
    if free < 30 * 2**30:  # x 16 GiB, its sums 8 GiB, their test against 1 4 GiB
        pytest.skip("needs 30 GiB of free GPU memory")
    x = cupy.empty((2**31, 2, 2), np.float16)
    x.view(np.uint16).fill(int(np.array(0.5, np.float16).view(np.uint16)))
    x[-1, :, 1] = 3
    assert P.plan(x.shape, x.dtype, 1).layout.kind == "strided"
    got = R.sum(x, axis=1)
    assert float(got[-1, 1]) == 6.0 and float(got[-1, 0]) == float(got[0, 0]) == 1.0
    assert int(cupy.count_nonzero(got == 1)) == 2**32 - 1
    del x, got
    cupy.get_default_memory_pool().free_all_blocks()
    if free < 36 * 2**30:
        pytest.skip("columns of 2^34 + 2^20 rows need 36 GiB of free GPU memory")
    b = cupy.zeros((2**34 + 2**20, 2), np.bool_)
    b[::2**20, 0] = True
    b[-1, 1] = True
    assert P.plan(b.shape, b.dtype, 0).kernel.spans > P.COL_MAX_SPANS
    assert R.sum(b, axis=0).tolist() == [2**14 + 1, 1]
    del b
    cupy.get_default_memory_pool().free_all_blocks()


# ---------------------------------------------------------------------------------------------------------
# The tree on the GPU: every result has the emulator's bits, whatever the layout, knobs, rows or SM count.

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


# ---------------------------------------------------------------------------------------------------------
# var and std: one pass, (count, mean, M2) of shifted values merged by Chan's formula.

VAR_DTYPES = (np.float32, np.float64, np.float16, BFLOAT16, np.int32, np.int64, np.bool_)


def _var_data(rng, shape, dtype):
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.random(shape) < 0.7
    if dtype.kind == "i":
        return rng.integers(-1000, 1000, shape).astype(dtype)
    return (3.0 + rng.standard_normal(shape)).astype(dtype)


@pytest.mark.parametrize("dtype", VAR_DTYPES, ids=dtype_name)
def test_var_std_emulators_against_float64(dtype):
    rng = np.random.default_rng(14)
    for shape, axis in (((1000,), None), ((37, 301), 1), ((301, 37), 0), ((5, 6, 7), (0, 2)), ((4, 999), -1)):
        x = _var_data(rng, shape, dtype)
        for ddof in (0, 1, 2.5):
            for name, emu, ref in (("var", reference.var_emulated, reference.reduce_var),
                                   ("std", reference.std_emulated, reference.reduce_std)):
                got = emu(x, axis=axis, ddof=ddof)
                want = ref(x, axis=axis, ddof=ddof)
                assert got.dtype == P.default_dtype(name, x.dtype)
                terms = math.prod(shape) // max(1, want.size)
                assert_close(got, want, terms=terms)


@pytest.mark.parametrize("n", [7, 255, 257, 1000, 4097, 4099, 100003, 2**20 + 3])
def test_var_float32_offset_accuracy(n):
    """Mean 1e4, standard deviation 1: the naive sum-of-squares form loses every digit in float32; the
    shifted one-pass tree keeps the relative error within 1e-6 of the float64 two-pass variance."""
    rng = np.random.default_rng(n)
    x = (1e4 + rng.standard_normal(n)).astype(np.float32)
    want = reference.reduce_var(x)
    got = float(reference.var_emulated(x))
    assert abs(got - want) <= 1e-6 * want
    assert abs(float(reference.std_emulated(x, ddof=1)) - reference.reduce_std(x, ddof=1)) <= 1e-6 * want


def test_var_edge_values_match_numpy():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for x, ddof in ((np.array([5.0], np.float32), 0), (np.array([5.0], np.float32), 1),
                        (np.array([1.0, 2.0], np.float32), 2), (np.array([1.0, 2.0], np.float32), 3),
                        (np.array([1.0, np.nan, 2.0], np.float32), 0),
                        (np.array([1.0, np.inf, 2.0], np.float32), 0), (np.array([np.inf, np.inf]), 0),
                        (np.zeros((3, 0), np.float32), 0), (np.full(300, 7.0), 0)):
            want = np.var(x.astype(np.float64), ddof=ddof)
            got = reference.var_emulated(x, ddof=ddof)
            assert np.array_equal(np.isnan(got), np.isnan(want)) and (np.isnan(want) or got == want), (x, ddof)
    assert reference.var_emulated(np.full(1000, -3.25, np.float32)) == 0  # a constant slice is exactly 0


def test_chan_merge_is_commutative_and_exact_with_the_identity():
    rng = np.random.default_rng(3)
    k = 4096
    for dt in (np.float32, np.float64):
        # Counts from 1: an empty state in the tree is always the identity (0, 0, 0).
        a = (rng.integers(1, 5, k).astype(dt), rng.standard_normal(k).astype(dt), rng.random(k).astype(dt))
        b = (rng.integers(1, 5, k).astype(dt), rng.standard_normal(k).astype(dt), rng.random(k).astype(dt))
        b[1][:64] = a[1][:64]  # ties in count and mean
        with np.errstate(all="ignore"):
            ab, ba = tree._chan(a, b), tree._chan(b, a)
        for u, v in zip(ab, ba):
            assert u.tobytes() == v.tobytes()
        zero = tuple(np.zeros(k, dt) for _ in range(3))
        for u, v, w in zip(tree._chan(a, zero), tree._chan(zero, a), a):
            assert u.tobytes() == v.tobytes() == w.tobytes()


def test_var_emulator_is_one_tree_whatever_the_layout():
    """The emulator numbers elements in C order over the reduced axes; any view of the same values gives
    the same bits (the kernels' contract)."""
    rng = np.random.default_rng(5)
    x = _var_data(rng, (33, 517), np.float32)
    a = reference.var_emulated(x, axis=1)
    b = reference.var_emulated(np.asfortranarray(x), axis=1)
    c = np.array([reference.var_emulated(x[i]) for i in range(33)])
    assert a.tobytes() == b.tobytes() == c.tobytes()


def test_var_planning_dtypes_and_instantiations():
    assert P.result_dtype("var", np.float16) == np.float16
    assert P.result_dtype("std", np.int32) == np.float64
    assert P.result_dtype("var", np.bool_) == np.float64
    assert P.result_dtype("var", np.float32, np.float64) == np.float64  # x converted first, as NumPy computes
    assert P.route("std", np.float32, np.float64) == P.Route("std", "cast", np.float64, np.float64)
    with pytest.raises(TypeError, match="dtype=int32 is not supported for var"):
        P.result_dtype("var", np.float32, np.int32)
    assert P.state_itemsize(P.OP_VAR, np.float32) == 12 and P.state_itemsize(P.OP_VAR, np.float64) == 24
    assert P.col_vector_width(4, 12) == 1 and P.col_vector_width(2, 24) == 1
    insts = set(P.instantiations())
    # Every layout's launches for var and std are in the table, two-pass columns included.
    for shape, axis in (((1 << 20,), None), ((64, 4096), 1), ((1 << 18, 8), 0), ((300, 40), 0),
                        ((7, 9, 11), (0, 2)), ((9, 8, 7, 6), (1, 3))):
        for t in (np.float32, np.float16, np.float64, np.int32, np.bool_):
            pl = P.plan(shape, t, axis, op="var", knobs=P.VAR_KNOBS)
            o = P.default_dtype("var", t)
            if pl.fold is not None:
                assert pl.partials == P.cols_geometry(pl.layout)[0] * pl.kernel.spans * shape[1] * P.state_itemsize(
                    P.OP_VAR, o)
            for inst in P.plan_instantiations(pl, t, o, P.OP_VAR):
                assert inst in insts, inst
    assert len([i for i in insts if i.args[2] == P.OP_VAR]) <= 64


def test_ddof_validation():
    for bad, err in (("1", TypeError), (True, TypeError), (None, TypeError), (float("nan"), ValueError),
                     (float("inf"), ValueError)):
        with pytest.raises(err, match="ddof must be"):
            R._check_ddof(bad)
    for good in (0, 1, 2.5, np.int64(3), np.float32(0.5)):
        R._check_ddof(good)


@pytest.mark.gpu
def test_var_bad_input_raises_before_launch():
    import cupy

    x = cupy.ones((4, 5), np.float32)
    with pytest.raises(TypeError, match="ddof must be an int or a float"):
        R.var(x, ddof="1")
    with pytest.raises(TypeError, match="ddof must be an int or a float"):
        R.std(x, ddof=True)
    with pytest.raises(ValueError, match="ddof must be finite"):
        R.var(x, ddof=float("nan"))
    with pytest.raises(TypeError, match="dtype=int64 is not supported for std"):
        R.std(x, dtype=np.int64)
    with pytest.raises(np.exceptions.AxisError):
        R.var(x, axis=2)
    with pytest.raises(ValueError, match="shape"):
        R.std(x, axis=0, out=cupy.empty(4, np.float32))
    with pytest.raises(TypeError, match="dtype=float64 is not supported for var of complex64"):
        R.var(cupy.ones(3, np.complex64), dtype=np.float64)
    assert float(x.sum()) == 20  # untouched


@pytest.mark.nvrtc(P.SOURCE)
def test_var_kernels_compile_without_local_memory():
    comp = compiled(P.SOURCE, ARCHS[0])
    res = comp.resources()
    var = [i for i in P.instantiations() if i.args[2] == P.OP_VAR]
    assert var
    for inst in var if ptxas_ran(comp) else ():  # else .ci/run checks the machine code
        r = res[comp.lowered[inst.expression]]
        assert r.get("stack", 0) == 0 and r.get("spill_stores", 0) == 0, inst.expression
    # Correctly rounded steps only: no fused multiply-add in the Chan merge.
    ptx = comp.kernel_ptx(next(i for i in var if i.name == "reduce_full" and i.args[0] == np.float32))
    assert "fma.rn.f32" not in ptx and "div.rn.f32" in ptx


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", VAR_DTYPES, ids=dtype_name)
def test_var_std_bits_match_the_emulator(dtype):
    import cupy

    rng = np.random.default_rng(41)
    for shape, axis in (((100003,), None), ((33, 4099), 1), ((5000, 33), 0), ((4099, 3), 0), ((6, 7, 65), (0, 2)),
                        ((8, 9, 10, 11), (1, 3)), ((17, 1), 1), ((0, 5), 0)):
        xh = _var_data(rng, shape, dtype)
        x = cupy.asarray(xh)
        for name in ("var", "std"):
            for ddof in (0, 1):
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    got = getattr(R, name)(x, axis=axis, ddof=ddof)
                    want = getattr(reference, f"{name}_emulated")(xh, axis=axis, ddof=ddof)
                assert same_bits(got, want), (name, shape, axis, ddof)
        # The same bits for another SM count, other knobs and a strided (negative-stride) view of the values.
        v = R._reduce("var", x, axis, None, False, None, knobs=P.DEFAULT_KNOBS, sm=7)
        assert same_bits(v, reference.var_emulated(xh, axis=axis))
        flipped = cupy.asarray(xh[::-1].copy())[::-1]
        assert same_bits(R.var(flipped, axis=axis), reference.var_emulated(xh, axis=axis))


@pytest.mark.gpu
def test_var_float32_offset_accuracy_on_the_gpu():
    import cupy

    rng = np.random.default_rng(2)
    xh = (1e4 + rng.standard_normal((64, 65537))).astype(np.float32)
    x = cupy.asarray(xh)
    want = reference.reduce_var(xh, axis=1)
    got = cupy.asnumpy(R.var(x, axis=1)).astype(np.float64)
    assert (np.abs(got - want) <= 1e-6 * want).all()
    full = float(R.var(x))
    assert abs(full - float(reference.reduce_var(xh))) <= 1e-6 * float(reference.reduce_var(xh))
    assert full == float(reference.var_emulated(xh))


@pytest.mark.gpu
def test_var_special_values_and_out():
    import cupy

    xh = np.ones((4, 300), np.float32)
    xh[1, 7] = np.nan
    xh[2, 299] = np.inf
    xh[3, 0] = -np.inf
    out = cupy.full(4, 5.0, np.float32)
    assert R.std(cupy.asarray(xh), axis=1, out=out) is out
    assert np.array_equal(cupy.asnumpy(out), np.array([0, np.nan, np.nan, np.nan], np.float32), equal_nan=True)
    with pytest.warns(RuntimeWarning, match="Degrees of freedom"):
        assert np.isnan(float(R.var(cupy.zeros(0, np.float32))))


# ---------------------------------------------------------------------------------------------------------
# NaN-aware reductions, counts, any / all (lift modes of the sum, max and min kernels), prod and logsumexp.

NAN_DTYPES = (np.float32, np.float64, np.float16, BFLOAT16)


def _nan_data(rng, shape, dtype, where: str):
    """Normal values with NaNs: "none", "first" / "last" of each last-axis slice, "all" of slice 0 (or the
    whole array when 1-d), or "some" (about 10%)."""
    x = rng.standard_normal(shape).astype(np.float64)
    if where == "first":
        x[..., 0] = np.nan
    elif where == "last":
        x[..., -1] = np.nan
    elif where == "all" and x.size:
        x[slice(None) if x.ndim == 1 else 0] = np.nan
    elif where == "some":
        x[rng.random(shape) < 0.1] = np.nan
    return x.astype(dtype)


def _close(got, want, dtype, what, rtol=None):
    """Complex results: the error's modulus on the scale of the reference's (a part alone may be near 0),
    rtol by the parts' dtype."""
    wide = np.complex128 if np.dtype(dtype).kind == "c" else np.float64
    got = np.asarray(got).astype(wide)
    want = np.asarray(want, wide)
    assert np.array_equal(np.isnan(got), np.isnan(want)), what
    inf = np.isinf(want)
    assert np.array_equal(got[inf], want[inf]), what  # the same infinities
    ok = np.isfinite(want)
    rtol = rtol or {2: 1e-2, 4: 2e-5, 8: 1e-12}[P.real_of(dtype).itemsize]
    scale = np.abs(want[ok]) + 0.1 * (np.sqrt(np.mean(np.abs(want[ok]) ** 2)) if ok.any() else 0) + 1e-30
    assert (np.abs(got[ok] - want[ok]) <= rtol * scale).all(), (what, np.max(np.abs(got[ok] - want[ok]) / scale))


@pytest.mark.parametrize("dtype", NAN_DTYPES, ids=dtype_name)
def test_nan_ops_and_counts_emulators_against_float64(rng, dtype):
    for shape, axis in (((1000,), None), ((5, 257), 1), ((300, 7), 0), ((4, 6, 33), (0, 2)), ((3, 1), 1)):
        for where in ("none", "first", "last", "all", "some"):
            xh = _nan_data(rng, shape, dtype, where)
            what = (shape, axis, where)
            _close(reference.nansum_emulated(xh, axis), reference.reduce_nansum(xh, axis), dtype, what)
            _close(reference.nanmean_emulated(xh, axis), reference.reduce_nanmean(xh, axis), dtype, what)
            for name in ("nanmax", "nanmin"):
                got = getattr(reference, f"{name}_emulated")(xh, axis)
                want = getattr(reference, f"reduce_{name}")(xh, axis)
                assert np.array_equal(got.astype(np.float64), want, equal_nan=True), (name, what)
            count = reference.count_nonzero_emulated(xh, axis)
            assert count.dtype == np.int64 and np.array_equal(count, np.count_nonzero(xh.astype(np.float64), axis))


def test_all_nan_and_empty_slices_follow_numpy():
    x = np.array([[np.nan, np.nan], [1.0, np.nan], [-np.inf, np.nan]], np.float32)
    assert np.array_equal(reference.nansum_emulated(x, 1), np.array([0, 1, -np.inf], np.float32))
    assert np.array_equal(reference.nanmax_emulated(x, 1), np.array([np.nan, 1, -np.inf], np.float32), equal_nan=True)
    assert np.array_equal(reference.nanmean_emulated(x, 1), np.array([np.nan, 1, -np.inf], np.float32), equal_nan=True)
    assert reference.nansum_emulated(np.zeros((0,), np.float32)) == 0
    assert np.isnan(reference.nanmean_emulated(np.zeros((0,), np.float32)))
    with pytest.raises(ValueError, match="zero-size"):
        reference.nanmax_emulated(np.zeros((0,), np.float32))
    assert reference.prod_emulated(np.zeros((0,), np.int32)) == 1
    assert reference.logsumexp_emulated(np.zeros((0,), np.float32)) == -np.inf
    z = np.array([0.0, -0.0, np.nan, 2.0], np.float32)
    assert reference.count_nonzero_emulated(z) == 2  # -0.0 is zero, NaN is not


def test_prod_emulator_against_float64(rng):
    for dtype in NAN_DTYPES:
        xh = (1 + 0.01 * rng.standard_normal((6, 3001))).astype(dtype)
        _close(reference.prod_emulated(xh, 1), reference.reduce_prod(xh, 1), dtype, dtype)
        assert reference.prod_emulated(xh, 1).dtype == np.dtype(dtype)
    xi = rng.integers(-9, 10, (5, 1000)).astype(np.int32)  # wraps in int64, as NumPy
    assert np.array_equal(reference.prod_emulated(xi, 1), np.prod(xi.astype(np.int64), 1))
    assert reference.prod_emulated(np.array([True, False])).dtype == np.int64


COMPLEX_DTYPES = (np.complex64, np.complex128)


def _complex(re, im, dtype):
    """Complex values with exactly these parts (``re + 1j * im`` would make NaNs of 1j * inf)."""
    z = np.empty(np.broadcast(re, im).shape, dtype)
    z.real, z.imag = re, im
    return z


def _near_one(rng, shape, dtype):
    return (1 + 0.01 * (rng.standard_normal(shape) + 1j * rng.standard_normal(shape))).astype(dtype)


@pytest.mark.parametrize("dtype", COMPLEX_DTYPES, ids=dtype_name)
def test_complex_prod_emulator_against_numpy(rng, dtype):
    """NumPy's complex products within rounding, NumPy's result dtypes and shapes for every axis form and
    keepdims, complex targets (x converted to them first, as NumPy multiplies in them) and 1+0j for an empty
    slice."""
    x = _near_one(rng, (6, 3001), dtype)
    for axis in (1, -1, (1,)):
        _close(reference.prod_emulated(x, axis), reference.reduce_prod(x, 1), dtype, axis)
    y = x[:, :60].reshape(6, 5, 12)
    for axis in (None, 0, -1, (0, 2)):
        for keepdims in (False, True):
            got = reference.prod_emulated(y, axis, keepdims=keepdims)
            want = np.prod(y, axis=axis, keepdims=keepdims)
            assert got.dtype == want.dtype and got.shape == want.shape, (axis, keepdims)
            _close(got, reference.reduce_prod(y, axis, keepdims), dtype, (axis, keepdims))
    for t in (np.complex64, np.complex128):
        assert same_bits(reference.prod_emulated(x, 1, dtype=t), reference.prod_emulated(x.astype(t), 1))
        real = x.real.copy()
        assert same_bits(reference.prod_emulated(real, 1, dtype=t), reference.prod_emulated(real.astype(t), 1))
        _close(reference.prod_emulated(real, 1, dtype=t), np.prod(real.astype(np.float64), 1), t, t)
    with pytest.raises(TypeError, match=f"dtype=float32 is not supported for prod of {dtype_name(dtype)}"):
        reference.prod_emulated(x, 1, dtype=np.float32)
    assert same_bits(reference.prod_emulated(x[:, :0], 1), np.ones(6, dtype))


@pytest.mark.parametrize("dtype", COMPLEX_DTYPES, ids=dtype_name)
def test_complex_product_is_commutative_and_keeps_one_exact(rng, dtype):
    """reduce.cu's complex mul_rn, as the emulator applies it: commutative bit for bit (a shuffle tree forms a b
    in one lane and b a in its partner), and exactly 1 + 0i returns the other operand as it is, -0, infinite
    and NaN parts included, where the formula alone would not; 1 - 0i is no identity."""
    part = np.array([0.0, -0.0, 1.0, -1.0, 0.5, -3.25, 1e30, np.inf, -np.inf, np.nan], P.real_of(dtype))
    z = _complex(part[:, None], part[None, :], dtype).ravel()
    z = np.concatenate([z, _near_one(rng, 200, dtype), (10 * rng.standard_normal(200) * (1 - 2j)).astype(dtype)])
    a, b = (v.ravel() for v in np.meshgrid(z, z))
    one = _complex(1.0, 0.0, dtype)
    mul = tree._tree_complex_prod
    with np.errstate(all="ignore"):
        assert same_bits(mul(a, b), mul(b, a))
        assert same_bits(mul(z, one), z) and same_bits(mul(one, z), z)
        assert same_bits(mul(_complex(-0.0, -0.0, dtype), _complex(1.0, -0.0, dtype)), _complex(-0.0, 0.0, dtype))
        # NumPy's own product gives nan+nanj here (inf - inf in one part, inf * 0 in the other)
        inf = _complex(np.inf, np.inf, dtype)
        assert same_bits(reference.prod_emulated(np.array([inf, one])), inf)


def _f32_of(x):
    """The float32 nearest the rational ``x`` (a nonzero Fraction), ties to even: subnormals on their fixed
    grid of 2^-149, past the largest finite value infinity."""
    from fractions import Fraction

    a = abs(x)
    e = a.numerator.bit_length() - a.denominator.bit_length()  # 2^(e - 1) < a < 2^(e + 1)
    if a < Fraction(2) ** e:
        e -= 1
    q = Fraction(2) ** max(e - 23, -149)
    v = round(a / q) * q  # Fraction rounds half to even
    f = np.float32(np.inf) if v >= 2**128 else np.float32(float(v))
    return -f if x < 0 else f


def _fma_triples(rng, n):
    """float32 (a, b, c) for the fma: random bits over every exponent (subnormals, near overflow), c
    cancelling a b, exact ties between float32 neighbours with and without a tiny c to break them, zeros."""
    def floats(k, lo, hi):
        e = rng.integers(lo, hi, k)
        f = (1 + rng.integers(0, 2**23, k) / 2**23) * np.exp2(e.astype(np.float64))
        return (f * rng.choice([-1.0, 1.0], k)).astype(np.float32)

    a, b, c = floats(n, -75, 64), floats(n, -75, 64), floats(n, -150, 128)
    a[: n // 8], b[: n // 8] = floats(n // 8, -150, -60), floats(n // 8, -10, 40)  # subnormal products
    k = slice(n // 8, n // 4)  # c is minus a b rounded, or a neighbour: massive cancellation
    c[k] = -(a[k].astype(np.float64) * b[k]).astype(np.float32)
    c[k][::2] = np.nextafter(c[k][::2], np.float32(np.inf))
    k = slice(n // 4, 3 * n // 8)  # odd a b in (2^24, 2^25), times 2^e, lies halfway between float32s: ties
    i = rng.integers(2**12, 5792, n // 8) | 1
    j = rng.integers(2**12, 5792, n // 8) | 1
    a[k], b[k] = (i * 2.0 ** rng.integers(-20, 20, n // 8)).astype(np.float32), j.astype(np.float32)
    tiny = rng.choice([-1.0, 1.0], n // 8) * 2.0 ** rng.integers(-149, -30, n // 8)
    c[k] = np.where(rng.random(n // 8) < 0.5, 0.0, tiny)  # 0 keeps the tie, a tiny c breaks it
    k = slice(3 * n // 8, n // 2)  # the largest products: overflow to infinity or just below
    a[k], b[k] = floats(n // 8, 63, 64), floats(n // 8, 63, 65)
    c[k] = -np.sign(a[k] * b[k].astype(np.float64)) * floats(n // 8, 126, 128) * rng.choice([0, 1], n // 8)
    zero = np.array([0.0, -0.0], np.float32)
    a[-8:], b[-8:], c[-8:] = np.repeat(zero, 4), np.tile(np.repeat(zero, 2), 2), np.tile(zero, 4)
    return a, b, c


def test_fma32_is_the_correctly_rounded_fma(rng):
    """tree._fma32 (the host's __fmaf_rn, which float32's exp multiply-adds with) against exact rational
    arithmetic: a b + c rounded once to float32, ties to even; an exact zero is -0 only for -0 + -0."""
    from fractions import Fraction

    a, b, c = _fma_triples(rng, 4000)
    got = tree._fma32(a, b, c)
    assert got.dtype == np.float32 and got.shape == a.shape
    for i in range(a.size):
        x = Fraction(float(a[i])) * Fraction(float(b[i])) + Fraction(float(c[i]))
        if x == 0:
            zeros = (a[i] == 0 or b[i] == 0) and c[i] == 0  # else a b and c cancel: +0
            neg = zeros and np.signbit(a[i]) != np.signbit(b[i]) and np.signbit(c[i])
            want = np.float32(-0.0 if neg else 0.0)
        else:
            want = _f32_of(x)
        assert same_bits(got[i], want), (a[i], b[i], c[i], got[i], want)
    # ties broken by a c below half a float64 ulp of a b: what rounding the float64 sum to nearest would miss
    tie = tree._fma32(np.float32(4097), np.float32(4097), np.float32([2.0**-40, -(2.0**-40), 0]))
    assert list(tie) == [16785410, 16785408, 16785408]  # a b = 2^24 + 8193
    with np.errstate(invalid="ignore"):
        special = tree._fma32(np.float32([np.inf, np.inf, 0, np.nan, 2.0**100, 1]),
                                   np.float32([1, 0, np.inf, 1, 2.0**100, 1]),
                                   np.float32([-np.inf, 1, 1, 1, -np.inf, np.inf]))
    assert same_bits(special, np.float32([np.nan, np.nan, np.nan, np.nan, -np.inf, np.inf]))


def test_exp_rounds_and_scales_exactly():
    """exp_nonpositive's exact steps, as reduce.cu argues them: adding and subtracting the magic 1.5 2^23
    (1.5 2^52) rounds any |v| < 2^22 (2^51) to its nearest integer, ties to even, the integer also read from
    the sum's bits; and p 2^-64 times 2^(k + 64) is p 2^k rounded once (subnormal results included) for p in
    [1/2, 2) and every k the exp can form, as p 2^(k + 64) (exact) times 2^-64 is."""
    for t, kmin in ((np.float32, -150), (np.float64, -1076)):
        c = tree._explog(t)
        magic = c["magic"]
        ibits = np.dtype(f"i{np.dtype(t).itemsize}")
        v = np.concatenate([np.arange(-2 * kmin + 1) / t(2) + kmin, np.arange(kmin, 1) + t(0.25)]).astype(t)
        v = np.concatenate([v, np.nextafter(v, t(np.inf)), np.nextafter(v, t(-np.inf))])
        m = v + magic
        assert same_bits(m - magic, np.rint(v) + t(0))  # rint keeps -0.0: the sum gives +0
        assert (m.view(ibits).astype(np.int64) - np.asarray(magic).view(ibits) == np.rint(v)).all()
        assert np.rint(c["underflow"] * c["inv_ln2"]) == kmin  # the least k: d >= the underflow bound
        p = np.linspace(0.5, 2, 4001, dtype=t)[:-1]
        for k in range(kmin, 1):
            one = np.ones_like(p)
            assert same_bits((p * np.ldexp(one, k + 64)) * np.ldexp(one, -64), np.ldexp(p, k)), (t, k)
            assert same_bits((p * np.ldexp(one, -64)) * np.ldexp(one, k + 64), np.ldexp(p, k)), (t, k)


def test_exp_scaled_by_its_coefficients_keeps_its_bits():
    """reduce.cu's exp_nonpositive scales Horner's coefficients by 2^-64 and multiplies once by 2^(k + 64):
    the bits of the unscaled Horner's p times 2^(k + 64), then 2^-64 (its form before), on every 997th
    float32 in [-104, 0], on float64 values over [-746, 0], and at the ends."""
    rng = np.random.default_rng(11)
    f32 = np.arange(0x80000000, np.float32(-104).view(np.uint32) + 1, 997).astype(np.uint32).view(np.float32)
    f64 = -np.abs(rng.standard_normal(300000) * 200)
    for d in (f32, f64, np.array([0.0, -0.0, -1e-30, -1e-300, -745.5, -746.0, -np.inf])):
        c = tree._explog(d.dtype)
        t = d.dtype.type
        mad = tree._fma32 if t is np.float32 else (lambda a, b, c: a * b + c)
        with np.errstate(all="ignore"):
            live = d >= c["underflow"]
            dd = np.where(live, d, t(0))
            km = mad(dd, c["inv_ln2"], c["magic"])
            kf = km - c["magic"]
            bits = np.dtype(f"i{d.dtype.itemsize}")
            ki = km.view(bits).astype(np.int64) - np.asarray(c["magic"]).view(bits).astype(np.int64)
            r = mad(kf, -c["ln2"], dd) if t is np.float32 else mad(kf, -c["ln2_lo"], mad(kf, -c["ln2_hi"], dd))
            p = np.full_like(d, c["exp"][-1])
            for coef in reversed(c["exp"][:-1]):
                p = mad(p, r, coef)
            one = np.ones_like(d)
            before = np.where(live, (p * np.ldexp(one, ki + 64)) * np.ldexp(one, -64), t(0))
        assert same_bits(tree._exp_nonpositive(d), before), d.dtype


def test_exp_and_log_routines_are_accurate():
    """The exp and log against float64's, within 2 ulps; float32's exp (a degree-5 polynomial, its r in one
    step with ln2 rounded to float) within 2.5 plus |d| 2^-28 relative (k (ln2 - kLn2) < |d| 2^-28.4)."""
    rng = np.random.default_rng(5)
    for dtype, ulps, exp_ulps in ((np.float32, 2, 2.5), (np.float64, 2, 2)):
        eps = np.finfo(dtype).eps
        d = -np.abs(rng.standard_normal(200000) * 40).astype(dtype)
        d[:4] = [0.0, -0.0, -1e-30, -np.inf]
        got = tree._exp_nonpositive(d)
        want = np.exp(d.astype(np.float64))
        step = np.abs(np.where(np.isfinite(d), d, 0).astype(np.float64)) * 2.0**-28 * want if dtype == np.float32 else 0
        normal = want > np.finfo(dtype).tiny
        assert (np.abs(got - want) <= np.where(normal, exp_ulps * eps * want, np.finfo(dtype).smallest_subnormal * 2)
                + step).all()
        assert got[0] == 1 and got[1] == 1 and got[3] == 0
        s = (1 + np.abs(rng.standard_normal(200000)) * 1e6).astype(dtype)
        s[:2] = [1.0, 2.0]
        ls = tree._log_at_least_one(s)
        w = np.log(s.astype(np.float64))
        assert (np.abs(ls - w) <= ulps * eps * np.maximum(w, 1)).all() and ls[0] == 0
    # float32's exp on a lattice over every float32 in [-104, 0]: within 2.25 ulps of e^d (of 2^-149 for
    # subnormal results) plus |d| 2^-28 relative; within 2.25 ulps alone for d > -11 (2.22 there)
    d = np.arange(0x80000000, np.float32(-104).view(np.uint32) + 1, 1117).astype(np.uint32).view(np.float32)
    got = tree._exp_nonpositive(d).astype(np.float64)
    want = np.exp(d.astype(np.float64))
    ulp = np.exp2(np.maximum(np.floor(np.log2(np.maximum(want, 2.0**-126))) - 23, -149))
    assert (np.abs(got - want) <= 2.25 * ulp + np.abs(d.astype(np.float64)) * 2.0**-28 * want).all()
    assert (np.abs(got - want) <= 2.25 * ulp)[d > -11].all()


def test_exp_is_zero_from_the_underflow_bound_down():
    """reduce.cu's exp_nonpositive raises d to kUnderflow rather than testing it: the same bits as the
    emulator's test (0 below the bound) because its steps already give 0 at the bound and just above it."""
    for dtype in (np.float32, np.float64):
        bound = np.array([tree._explog(dtype)["underflow"]], dtype)
        d = np.concatenate([bound, np.nextafter(bound, 0), bound - 1, [-np.inf, np.nan]]).astype(dtype)
        got = tree._exp_nonpositive(d)
        clamped = tree._exp_nonpositive(np.fmax(d, bound[0]))
        assert got.tobytes() == clamped.tobytes() and (got[:2] == 0).all()


def test_explog_constants_are_the_kernels():
    """tree._EXPLOG holds reduce.cu's hex literals (the emulator's bits depend on them)."""
    src = (Path(P.__file__).parent.parent / "cuda_src" / "reduce.cu").read_text()
    for name, dtype, suffix in (("ExpLog<float>", np.float32, "f"), ("ExpLog<double>", np.float64, "")):
        body = src[src.index(f"template <> struct {name}"):]
        body = body[:body.index("pow2")]
        c = tree._explog(dtype)
        lits = re.findall(r"(0x[0-9a-f.]+p[-+]\d+)" + suffix, body)
        one_step = [c["ln2"]] if "ln2" in c else []  # float's r in one step
        want = [c["inv_ln2"], c["magic"], c["ln2_hi"], c["ln2_lo"], *one_step, *c["exp"], c["sqrt_half"], *c["log"]]
        assert [dtype(float.fromhex(v)) for v in lits] == want, name
        assert f"kUnderflow = {c['underflow']:.1f}" in body.replace("f;", ";")


def test_logsumexp_emulator_against_float64(rng):
    for dtype in NAN_DTYPES:
        for shape, axis, scale in (((3001,), None, 1), ((7, 4099), 1, 30), ((600, 5), 0, 1e3), ((2, 3, 300), (0, 2), 5)):
            xh = (scale * rng.standard_normal(shape)).astype(dtype)
            got = reference.logsumexp_emulated(xh, axis)
            assert got.dtype == np.dtype(dtype)
            _close(got, reference.reduce_logsumexp(xh, axis), dtype, (dtype, shape))
    x = np.array([[-np.inf, -np.inf, -np.inf], [np.inf, 1, 2], [np.nan, 1, np.inf], [np.inf, np.inf, 0],
                  [0.0, -0.0, -np.inf], [1e30, 1e30, -1e30]], np.float32)
    want = np.array([-np.inf, np.inf, np.nan, np.inf, np.log(2), 1e30 + np.log(2)], np.float32)
    assert np.array_equal(reference.logsumexp_emulated(x, 1), want, equal_nan=True)
    assert np.array_equal(reference.reduce_logsumexp(x, 1).astype(np.float32), want, equal_nan=True)
    assert reference.logsumexp_emulated(np.array([3, 3], np.int32)).dtype == np.float64


def test_var_and_logsumexp_chains_by_hand():
    """The chain states reduce.cu's chain_state forms, on values whose arithmetic is exact: chain c of leaf 0
    of 0, 1, ..., 255 holds c + 32 m, m = 0..7 (sum 8 c + 896, mean c + 112, M2 = 1024 * 42); leaf 1 of
    n = 259 has three chains of one value and 29 empty ones."""
    for dt in (np.float32, np.float64):
        d = np.arange(259, dtype=dt)[None]
        n, mean, m2 = tree._moment_chains(d)
        c = np.arange(32)
        assert (n[0, :32] == 8).all() and (mean[0, :32] == c + 112).all() and (m2[0, :32] == 43008).all()
        assert (n[0, 32:35] == 1).all() and (mean[0, 32:35] == 256 + np.arange(3)).all() and (m2[0, 32:] == 0).all()
        assert (n[0, 35:] == 0).all() and (mean[0, 35:] == 0).all()
        e = tree._exp_nonpositive(np.array([-1.0, -2.0], dt))
        inf, nan = np.inf, np.nan
        rows = np.full((7, 64), -inf, dt)  # n = 64: chains of two values (c, c + 32)
        rows[0, [0, 32]] = 5.0  # (5, 1 + 1)
        rows[1, [0, 32]] = [3.0, 2.0]  # (3, 1 + e^-1)
        rows[2, [0, 32]] = [0.0, -1.0]  # (0, 1 + e^-1)
        rows[3, [0, 32]] = [inf, 1.0]  # (inf, 1)
        rows[4, [0, 32]] = [nan, inf]  # (nan, 1)
        rows[5, [0, 32]] = [-inf, 1.0]  # (1, 0 + 1): a -inf term adds 0
        rows[6, [0, 32]] = [1.0, -2.0]  # (1, 1 + e^-3)
        m, s = tree._lse_chains(rows)
        want_m = np.array([5, 3, 0, inf, nan, 1, 1], dt)
        want_s = np.array([2, 1 + e[0], 1 + e[0], 1, 1, 1, 1 + tree._exp_nonpositive(np.array([-3.0], dt))[0]], dt)
        assert np.array_equal(m[:, 0], want_m, equal_nan=True) and np.array_equal(s[:, 0], want_s)
        # a chain of -inf alone is (-inf, 1); an empty chain (n = 1: chains 1..31) the identity (-inf, 0)
        assert (m[:, 1:] == -inf).all() and (s[:, 1:] == 1).all()
        m, s = tree._lse_chains(np.array([[2.0]], dt))
        assert m[0, 0] == 2 and s[0, 0] == 1 and (m[0, 1:] == -inf).all() and (s[0, 1:] == 0).all()


@pytest.mark.parametrize("n", [1, 7, 255, 257, 4099])
def test_logsumexp_emulator_odd_lengths_and_special_values(n):
    """Within a few ulps of the float64 reference (relative to max(1, |result|): the sum's rounding, the
    exp's and the log's), and NumPy's answers for slices holding -inf, +inf or NaN."""
    rng = np.random.default_rng(n)
    for dt in (np.float32, np.float64):
        x = (10 * rng.standard_normal((9, n))).astype(dt)
        x[1] = -np.inf
        x[2, ::3] = -np.inf
        x[3, n // 2] = np.inf
        x[4, n - 1] = np.nan
        x[5, 0], x[5, n - 1] = np.inf, np.nan
        x[6, 0], x[6, n - 1] = -np.inf, np.inf
        x[7] = 3.5  # equal maxima everywhere: exactly 3.5 + log(n) as cukern's log gives it
        x[8, ::2] = -np.inf
        got = reference.logsumexp_emulated(x, axis=1)
        want = reference.reduce_logsumexp(x, axis=1)
        assert np.array_equal(np.isnan(got), np.isnan(want)) and np.array_equal(np.isinf(got), np.isinf(want))
        assert (got[np.isinf(want)] == want[np.isinf(want)]).all()
        ok = np.isfinite(want)
        eps = np.finfo(dt).eps
        bound = (6 + np.log2(n)) * eps * np.maximum(1, np.abs(want[ok]))
        assert (np.abs(got[ok] - want[ok]) <= bound).all(), (n, dt, np.abs(got[ok] - want[ok]) / bound)
        assert got[7] == dt(3.5) + tree._log_at_least_one(np.array([n], dt))[0]
        if n > 1:  # var: an infinity or a NaN anywhere gives NaN (rows 3 to 6), a constant slice 0 (row 7)
            with np.errstate(invalid="ignore"):
                v = reference.var_emulated(x[3:], axis=1)
            assert np.isnan(v[:4]).all() and v[4] == 0


class _LseTree:
    """The LogSumExp merge on (m, s) pairs, as _Tree's interface wants it (for _by_definition and the
    kernels' splits), with the chain written out from its definition (reduce.cu chain_state)."""

    def __init__(self, a):
        self.a = np.dtype(a)
        self.identity = (self.a.type(-np.inf), self.a.type(0))

    def __call__(self, x, y):
        m, s = tree._lse_merge(tuple(np.asarray(v, self.a) for v in x), tuple(np.asarray(v, self.a) for v in y))
        return (self.a.type(m), self.a.type(s))

    def chain(self, values):
        """The maximum m of the present values (NaN-propagating), (m, 1) if it is not finite, else the sum
        from 0, left to right, of exp(v - m) by cukern's exp; no values: the identity."""
        t = self.a.type
        if not values:
            return self.identity
        m = t(values[0])
        for v in values[1:]:
            m = t(tree._tree_max(np.asarray(m, self.a), np.asarray(v, self.a)))
        if not np.isfinite(m):
            return (m, t(1))
        s = t(0)
        for v in values:
            s = t(s + tree._exp_nonpositive(np.asarray([t(v) - m], self.a))[0])
        return (m, s)

    pairs, lanes, block, stack = _Tree.pairs, _Tree.lanes, _Tree.block, _Tree.stack


class _VarTree:
    """The Chan merge on (count, mean, M2), as _Tree's interface wants it, with the chain written out from
    its definition (reduce.cu chain_state) over already shifted values."""

    def __init__(self, a):
        self.a = np.dtype(a)
        self.identity = (self.a.type(0),) * 3

    def __call__(self, x, y):
        with np.errstate(all="ignore"):
            r = tree._chan(tuple(np.asarray(v, self.a) for v in x), tuple(np.asarray(v, self.a) for v in y))
        return tuple(self.a.type(v) for v in r)

    def chain(self, values):
        """S1 the sum of the c present values from the first, left to right; mean = S1 / c; M2 the sum from
        0, left to right, of (v - mean)^2; no values: the identity."""
        t = self.a.type
        if not values:
            return self.identity
        with np.errstate(all="ignore"):
            s1 = t(values[0])
            for v in values[1:]:
                s1 = t(s1 + t(v))
            mean = t(s1 / t(len(values)))
            m2 = t(0)
            for v in values:
                m2 = t(m2 + t(t(v) - mean) * t(t(v) - mean))
        return (t(len(values)), mean, m2)

    pairs, lanes, block, stack = _Tree.pairs, _Tree.lanes, _Tree.block, _Tree.stack


class _ProdTree(_Tree):
    def __init__(self, a):
        self.a = np.dtype(a)
        self.combine = tree._tree_complex_prod if self.a.kind == "c" else tree._tree_prod
        self.identity = self.a.type(1)


def _lse_finish(state):
    """logsumexp's finish of one state, as reduce.cu's and the emulator's: m + log(s) for a finite m, m itself
    for an infinite or NaN one, -inf for the identity (s == 0)."""
    m, s = state
    if s == 0:
        return type(m)(-np.inf)
    if not np.isfinite(m):
        return m
    return type(m)(m + tree._log_at_least_one(np.asarray([s]))[0])


def test_lse_merge_is_commutative_where_the_result_reads_it_and_exact_with_the_identity(rng):
    """The branch-free merge: for finite maxima (and the identity) the same bits in either order and the other
    operand unchanged by the identity; with an infinite or NaN m the order may change the state's s, never
    what finish makes of it."""
    for a in (np.float32, np.float64):
        t = _LseTree(a)
        vals = [(-np.inf, 0), (-np.inf, 1), (-np.inf, 3), (np.inf, 1), (np.inf, 5), (np.nan, 1), (np.nan, 2),
                (0.0, 1), (-0.0, 1), (0.0, 2), (3.5, 7), (3.5, 2), (-80.0, 3), (-200.0, 1), (1e30, 1),
                (-np.finfo(a).max, 1), (np.finfo(a).max, 2)]
        vals = [(a(m), a(s)) for m, s in vals] + [(a(m), a(s)) for m, s in zip(rng.standard_normal(20) * 10,
                                                                               rng.integers(1, 9, 20))]
        for x in vals:
            if np.isfinite(x[0]):
                assert t(x, t.identity) == x and t(t.identity, x) == x
            same = np.asarray(_lse_finish(t(x, t.identity))).tobytes() == np.asarray(_lse_finish(x)).tobytes()
            assert same or np.isnan(x[0]) and np.isnan(_lse_finish(t(x, t.identity)))
            for y in vals:
                u, v = t(x, y), t(y, x)
                if all(np.isfinite(z[0]) or z[1] == 0 for z in (x, y)):
                    assert np.asarray(u).tobytes() == np.asarray(v).tobytes() or np.isnan(u[0]) and np.isnan(v[0])
                fu, fv = _lse_finish(u), _lse_finish(v)
                assert np.asarray(fu).tobytes() == np.asarray(fv).tobytes() or np.isnan(fu) and np.isnan(fv), (x, y)


def _lse_values(rng, n, dtype, special):
    v = (5 * rng.standard_normal(n)).astype(dtype)
    if special and n > 300:
        v[::97] = -np.inf  # chains mixing -inf with finite values, and one of -inf alone
        v[256 + 5:256 + 5 + 8 * 32:32] = -np.inf
        v[3 * 256 + 7] = np.inf
        v[2 * 256 + 1] = np.nan
    return v


def test_prod_var_and_logsumexp_are_splits_of_the_tree(rng):
    """The emulators compute the documented tree (var's and logsumexp's chains formed at once, as
    chain_state defines them), and the full, rows and strided kernels' splits (and var's column kernel)
    give their bits; complex products with factors of exactly 1 + 0i and -0 parts among them."""
    for n in (40, 1100):  # 1100: 5 leaves, 2 chunks of float32, the last one partial
        complex_factors = []
        for dtype in COMPLEX_DTYPES:
            v = _near_one(rng, n, dtype)
            v[::7] = 1
            v[3::11].imag = -0.0
            complex_factors.append((_ProdTree(dtype), v))
        for t, v in ((_ProdTree(np.float32), (1 + 0.1 * rng.standard_normal(n)).astype(np.float32)),
                     *complex_factors,
                     (_LseTree(np.float32), _lse_values(rng, n, np.float32, False)),
                     (_LseTree(np.float64), _lse_values(rng, n, np.float64, True)),
                     (_VarTree(np.float32), (1e4 + rng.standard_normal(n)).astype(np.float32) - np.float32(1e4)),
                     (_VarTree(np.float64), rng.standard_normal(n))):
            if isinstance(t, _LseTree):
                m, s = tree._lse_tree(v[None])
                want = (v.dtype.type(m[0]), v.dtype.type(s[0]))
            elif isinstance(t, _VarTree):
                want = tuple(v.dtype.type(u[0]) for u in tree._moments_tree(v[None]))
            else:
                want = reference.reduction_tree(v[None], t.combine, t.identity)[0]
            want = np.asarray(want).tobytes()
            assert np.asarray(_by_definition(t, v)).tobytes() == want, (n, type(t))
            # the chunks of 2-byte inputs too (float trees' half types); complex inputs come in one size
            halves = isinstance(t, (_ProdTree, _VarTree)) and v.dtype.kind == "f"
            for itemsize in (v.itemsize, 2) if halves else (v.itemsize,):
                cv, size = P.lane_elements(itemsize), P.chunk_elements(itemsize)
                chunks = [_chunk(t, v, q * size, 32, cv) for q in range(_cdiv(n, size))]
                for block, grid in ((64, 2),):
                    assert np.asarray(_full_split(t, chunks, block, grid)).tobytes() == want
                for tpr in sorted({P.row_tpr(n, itemsize, P.COMPACT_KNOBS), 32, 64}):
                    assert np.asarray(_row(t, v, itemsize, tpr)).tobytes() == want
            if isinstance(t, _VarTree):
                for q in (1, 4):
                    leaves = [_col_leaf(t, v, k, q) for k in range(_cdiv(n, LEAF))]
                    for span in (1, 2):
                        assert np.asarray(_col_split(t, leaves, span, _cdiv(len(leaves), span))).tobytes() == want
            assert np.asarray(_strided(t, v)).tobytes() == want


def test_lift_modes_add_no_kernels_and_compact_ops_few():
    """The NaN-aware ops reuse the sum / max / min kernels (a run-time lift mode in ``finalize``); the counts,
    any and all the sum kernels' code with float64 accumulators, stored as their results (float64, int64,
    bool: full and rows kernels only); prod and logsumexp have four kernels a dtype (full, two rows,
    strided), no column kernel."""
    lifted = {"nansum": "sum", "nanmax": "amax", "nanmin": "amin"}
    for name, base in lifted.items():
        for t in P.OPS[name].inputs:
            assert P.kernel_dtypes(name, t) == P.kernel_dtypes(base, t)
    combos = {(t, o, op) for t, o, op in P.kernel_combos()}
    for name in P.COUNT_OPS:
        for t in P.OPS[name].inputs:
            (o,) = P.kernel_dtypes(name, t)
            assert (t, o, P.OP_SUM) in combos and P.acc_dtype(o) == P.F64, (name, t, o)
            assert o == {"count_nonzero": P.COUNT, "count_not_nan": P.F64}.get(name, P.BOOL)
    own = [i for i in P.instantiations() if i.args[1] in (P.COUNT, P.BOOL)]
    assert own and all(i.name in ("reduce_full", "reduce_rows") for i in own)
    insts = P.instantiations()
    for op, dtypes in ((P.OP_PROD, 9), (P.OP_LSE, 4)):
        mine = [i for i in insts if i.args[2] == op]
        assert len(mine) == 4 * dtypes and not any(i.name.startswith("reduce_cols") for i in mine)
    assert P.OPS["nansum"].mode == P.LIFT_SKIP_NAN << P.FINISH_BITS
    assert P.OPS["count_nonzero"].mode == P.LIFT_NONZERO << P.FINISH_BITS
    src = (Path(P.__file__).parent.parent / "cuda_src" / "reduce.cu").read_text()
    assert (f"LIFT_PLAIN = {P.LIFT_PLAIN}, LIFT_SKIP_NAN = {P.LIFT_SKIP_NAN}, LIFT_NONZERO = {P.LIFT_NONZERO}, "
            f"LIFT_NOT_NAN = {P.LIFT_NOT_NAN}") in src
    assert f"FINISH_BITS = {P.FINISH_BITS};" in src and f"OP_PROD = {P.OP_PROD}, OP_LSE = {P.OP_LSE}" in src
    # Every lifted op's kernels implement its lift (integer inputs never hold a NaN: skipping is plain there),
    # and only the full and row kernels lift: other layouts are copied to rows.
    for name, op in P.OPS.items():
        for t in op.inputs:
            for o in P.kernel_dtypes(name, t):
                modes = P.lift_modes(t, o, op.kernel_op)
                assert modes >> op.lift & 1 or (op.lift == P.LIFT_SKIP_NAN and t not in P.FLOATS) or (
                    op.lift == P.LIFT_NONZERO and t == np.bool_), (name, t, o)
                if op.lift != P.LIFT_PLAIN:
                    for shape, axis in (((300, 40), 0), ((9, 8, 7), (0, 2)), ((5, 6), 1), ((50,), None)):
                        assert P.plan(shape, t, axis, op=name).layout.kind in ("rows", "full"), (name, shape)
    # Lifted rows always take the one rows block that lifts, whatever the knobs (the tuner's included).
    assert f"ROW_LIFT_BLOCK = {P.ROW_SMALL_BLOCK};" in src
    for knobs in [P.DEFAULT_KNOBS, P.Knobs(row_max_tpr=1024, row_items=8), *_tuner_knobs()]:
        for length in (1, 100, 5000, 1 << 20):
            pl = P.plan((7, length), np.float32, 1, op="nansum", knobs=knobs)
            assert pl.layout.kind != "rows" or pl.kernel.block == P.ROW_SMALL_BLOCK, (knobs, length)
    # The full kernel hands the lift to its chunks (the one line reduce_full's body needs for it).
    assert "lift_of(finalize)" in src[src.index("void full_reduce_body"):src.index("__global__ void CUKERN_BOUNDS(BLOCK)\n    reduce_full")]


def test_new_ops_plan_only_instantiated_kernels():
    insts = set(P.instantiations())
    cases = (((1 << 20,), None), ((64, 4096), 1), ((1 << 18, 8), 0), ((300, 40), 0), ((7, 9, 11), (0, 2)),
             ((9, 8, 7, 6), (1, 3)), ((3, 1 << 16), 1))
    for name in ("nansum", "nanmax", "nanmin", "count_nonzero", "count_not_nan", "any", "all", "prod", "logsumexp"):
        for t in P.OPS[name].inputs:
            for shape, axis in cases:
                pl = P.plan(shape, t, axis, op=name)
                final = P.default_dtype(name, t)
                o = t if name in P.MINMAX_OPS else P.kernel_dtype(name, t, final)
                if P.OPS[name].kernel_op in P.COMPACT_KERNEL_OPS:
                    assert pl.layout.kind != "cols" and pl.fold is None
                for inst in P.plan_instantiations(pl, t, o, P.OPS[name].kernel_op):
                    assert inst in insts, (name, inst)


def test_new_ops_result_dtypes_follow_numpy():
    for t in (np.float32, np.float64, np.float16, np.int32, np.int64, np.bool_):
        x = np.ones(3, t)
        assert P.default_dtype("prod", t) == np.prod(x).dtype
        assert P.default_dtype("nansum", t) == np.nansum(x).dtype
        if t != np.bool_:
            assert P.default_dtype("nanmax", t) == np.nanmax(x).dtype
        assert P.default_dtype("count_nonzero", t) == np.int64
    assert P.result_dtype("nansum", np.float32, np.float64) == np.float64


def test_new_ops_validate_before_any_launch():
    for fn, bad in ((R.nansum, fake_array((4,), "datetime64[s]")), (R.nanmax, fake_array((4,), "datetime64[s]")),
                    (R.prod, fake_array((4,), "datetime64[s]")), (R.logsumexp, fake_array((4,), np.complex64)),
                    (R.count_nonzero, fake_array((4,), "timedelta64[s]")),
                    (R.nanmean, fake_array((4,), "datetime64[s]")), (R.var, fake_array((4,), "timedelta64[s]"))):
        with pytest.raises(TypeError):
            fn(bad)
    with pytest.raises(TypeError):
        R.any(np.ones(3, np.float32))  # a host array


# GPU: bits against the emulators, closeness to float64, layouts, knobs, special values, out, bad input.


def _gpu_views(cupy, xh):
    """x as a C-contiguous array; for float32 also a negative-stride view and a view 4 bytes off 16-byte
    alignment (the other dtypes take the same code paths)."""
    x = cupy.asarray(xh)
    if xh.dtype != np.float32:
        return {"c": x}
    flipped = cupy.asarray(np.ascontiguousarray(xh[::-1]))[::-1]
    buf = cupy.empty(xh.size * xh.itemsize + 16, np.uint8)
    off = buf[4:4 + xh.size * xh.itemsize].view(xh.dtype).reshape(xh.shape) if xh.itemsize <= 4 else x
    off[...] = x
    return {"c": x, "flipped": flipped, "misaligned": off}


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", NAN_DTYPES, ids=dtype_name)
def test_nan_ops_bits_match_the_emulators(dtype):
    import cupy

    rng = np.random.default_rng(71)
    for shape, axis in (((100003,), None), ((33, 4099), 1), ((5000, 33), 0), ((17, 1), 1), ((0, 5), 1)):
        for where in ("some", "all"):
            xh = _nan_data(rng, shape, dtype, where)
            for label, x in _gpu_views(cupy, xh).items():
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", RuntimeWarning)
                    for name in ("nansum", "nanmean", "nanmax", "nanmin", "count_nonzero", "any", "all"):
                        if name in ("nanmax", "nanmin") and 0 in shape:
                            continue
                        got = cupy.asnumpy(getattr(R, name)(x, axis=axis))
                        want = getattr(reference, f"{name}_emulated")(xh, axis=axis)
                        assert same_bits(got, want), (name, shape, axis, where, label)
                    ref = reference.reduce_nansum(xh, axis)
                    _close(cupy.asnumpy(R.nansum(x, axis=axis)), ref, dtype, ("nansum", shape, label))
                    hits = np.count_nonzero(xh.astype(np.float64), axis=axis)
                    assert np.array_equal(cupy.asnumpy(R.any(x, axis=axis)), hits > 0)
                    n = xh.size // max(1, np.asarray(hits).size)
                    assert np.array_equal(cupy.asnumpy(R.all(x, axis=axis)), hits == n)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64, np.int32, np.bool_], ids=dtype_name)
def test_counts_any_and_all_are_one_launch_into_their_result_and_captured(dtype):
    """count_nonzero, any and all: the kernels store the count (int64) or its test (bool) themselves, so the
    full and rows layouts run with no temporary: the emulators' bits eagerly, into ``out`` and replayed from a
    CUDA graph on new contents (no pool block freed while capturing); a column layout still copies first."""
    import cupy

    rng = np.random.default_rng(17)

    def fresh(shape):
        v = rng.choice([0, 0, 1, -2], shape).astype(np.float64)
        if np.dtype(dtype).kind == "f":
            v[rng.random(shape) < 0.1] = np.nan
        h = v.astype(dtype)
        h[:2] = 1  # every element of some rows non-zero: all is True there
        return h

    cases = [((100003,), None), ((64, 4099), 1), ((9, 5, 33), (1, 2)), ((5, 1), 1), ((0, 7), 1), ((7, 0), 1)]
    stream = cupy.cuda.Stream(non_blocking=True)
    for shape, axis in cases:
        xh = fresh(shape)
        x = cupy.asarray(xh)
        for name in ("count_nonzero", "any", "all"):
            fn, emulated = getattr(R, name), getattr(reference, f"{name}_emulated")
            want = emulated(xh, axis=axis)
            got = fn(x, axis=axis)
            assert same_bits(got, want) and got.dtype == want.dtype, (name, shape, axis)
            assert np.array_equal(cupy.asnumpy(got), getattr(np, name)(xh, axis=axis)), (name, shape, axis)
            kw = {} if name == "count_nonzero" else {"out": cupy.zeros(want.shape, np.bool_)}
            with stream:
                fn(x, axis=axis, **kw)  # the stream's workspace
                stream.synchronize()
                graph, got, freed = capture(stream, lambda: fn(x, axis=axis, **kw))
                assert not freed, (name, shape, axis)
                xh2 = fresh(shape)
                x[...] = cupy.asarray(xh2)
                graph.launch(stream)
                stream.synchronize()
            assert same_bits(got, emulated(xh2, axis=axis)), (name, shape, axis)
            if kw:
                assert got is kw["out"]
            xh = xh2  # x holds the replay's contents for the next op
    xc = cupy.asarray(fresh((3000, 40)))
    for name in ("count_nonzero", "any", "all"):
        got = getattr(R, name)(xc, axis=0)  # copied to rows first: eager only
        assert same_bits(got, getattr(reference, f"{name}_emulated")(cupy.asnumpy(xc), axis=0)), name


@pytest.mark.gpu
def test_nan_ops_warn_as_numpy_and_write_out():
    import cupy

    x = cupy.asarray(np.array([[np.nan, np.nan], [1.0, np.nan]], np.float32))
    with pytest.warns(RuntimeWarning, match="All-NaN slice encountered"):
        r = R.nanmax(x, axis=1)
    assert np.array_equal(cupy.asnumpy(r), np.array([np.nan, 1], np.float32), equal_nan=True)
    for dtype, out in ((np.complex64, None), (None, cupy.zeros(2, np.complex128)), (np.float16, None)):
        with pytest.warns(RuntimeWarning, match="All-NaN slice encountered"):  # a NaN in any float result
            r = R.nanmin(x, axis=1, dtype=dtype, out=out)
        assert np.array_equal(cupy.asnumpy(r), np.array([np.nan, 1]).astype(r.dtype), equal_nan=True), r.dtype
    with pytest.warns(RuntimeWarning, match="Mean of empty slice"):
        R.nanmean(x, axis=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert float(R.nanmax(x[1])) == 1 and float(R.nansum(x)) == 1
    out = cupy.full(2, 7.0, np.float32)
    assert R.nansum(x, axis=1, out=out) is out and cupy.asnumpy(out).tolist() == [0, 1]
    b = cupy.zeros(2, np.bool_)
    assert R.any(x, axis=0, out=b) is b and cupy.asnumpy(b).all()
    assert bool(R.all(cupy.zeros((0,), np.float32))) and not bool(R.any(cupy.zeros((0,), np.float32)))
    assert int(R.count_nonzero(cupy.asarray(np.array([0, -0.0, np.nan, 2], np.float32)))) == 2
    xi = cupy.arange(-3, 4, dtype=np.int32)
    assert int(R.count_nonzero(xi)) == 6 and R.count_nonzero(xi).dtype == np.int64
    assert float(R.nanmean(xi)) == 0.0 and R.nanmean(xi).dtype == np.float64
    assert int(R.nanmax(xi)) == 3 and int(R.nansum(xi)) == 0 and R.nansum(xi).dtype == np.int64
    # A column layout of a lifted op is copied to rows first: the same bits as the emulator's.
    xc = _nan_data(np.random.default_rng(3), (3000, 40), np.float32, "some")
    got = cupy.asnumpy(R.nansum(cupy.asarray(xc), axis=0))
    assert got.tobytes() == reference.nansum_emulated(xc, axis=0).tobytes()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_name)
def test_prod_bits_match_the_emulator(dtype):
    import cupy

    rng = np.random.default_rng(72)
    for shape, axis in (((100003,), None), ((33, 4099), 1), ((5000, 33), 0), ((6, 7, 65), (0, 2)), ((17, 1), 1),
                        ((0, 5), 0)):
        if np.dtype(dtype).kind in "biu":
            xh = rng.integers(-3, 4, shape).astype(dtype)
        else:
            xh = (1 + 0.01 * rng.standard_normal(shape)).astype(dtype)
        want = reference.prod_emulated(xh, axis=axis)
        for label, x in _gpu_views(cupy, xh).items():
            got = cupy.asnumpy(R.prod(x, axis=axis))
            assert same_bits(got, want), (shape, axis, label)
        if np.dtype(dtype).kind not in "biu":
            _close(got, reference.reduce_prod(xh, axis), dtype, shape, rtol=1e-3 if xh.itemsize == 4 else None)
        v = R._reduce("prod", cupy.asarray(xh), axis, None, False, None, knobs=P.DEFAULT_KNOBS, sm=7)
        assert same_bits(cupy.asnumpy(v), want), ("knobs", shape, axis)


def _complex_views(cupy, xh):
    """(device array, the host array it shows) pairs: x as it is, every axis reversed, every other element
    of the last axis, and for complex64 a view 8 bytes off 16-byte alignment (one element a load)."""
    x = cupy.asarray(xh)
    back = (slice(None, None, -1),) * xh.ndim
    views = {"c": (x, xh), "reversed": (x[back], xh[back]), "every other": (x[..., ::2], xh[..., ::2])}
    if xh.dtype == np.complex64:
        buf = cupy.empty(xh.nbytes + 16, np.uint8)
        off = buf[8:8 + xh.nbytes].view(xh.dtype).reshape(xh.shape)
        off[...] = x
        views["misaligned"] = (off, xh)
    return views


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", COMPLEX_DTYPES, ids=dtype_name)
def test_complex_prod_bits_match_the_emulator(dtype):
    """Every layout (full, rows, strided for columns, copied), strides of either sign, misalignment, keepdims,
    out, complex targets, empty slices (1+0j) and infinite, NaN and -0 parts: the emulator's bits, whatever
    the knobs and the SM count; NumPy's product within rounding."""
    import cupy

    rng = np.random.default_rng(74)
    for shape, axis in (((100003,), None), ((33, 4099), 1), ((5000, 33), 0), ((6, 7, 65), (0, 2)), ((17, 1), 1),
                        ((0, 5), 0), ((64, 300), -1), ((9, 8, 7), (1, 2)), ((4, 5, 6), None)):
        xh = _near_one(rng, shape, dtype)
        if xh.size > 10:
            xh.reshape(-1)[::97] = 1  # exact identities among the factors
        for label, (x, h) in _complex_views(cupy, xh).items():
            assert same_bits(R.prod(x, axis=axis), reference.prod_emulated(h, axis=axis)), (shape, axis, label)
        x = cupy.asarray(xh)
        want = reference.prod_emulated(xh, axis=axis)
        _close(cupy.asnumpy(R.prod(x, axis=axis)), reference.reduce_prod(xh, axis), dtype, shape,
               rtol=1e-3 if dtype == np.complex64 else None)
        assert same_bits(R.prod(x, axis=axis, keepdims=True), reference.prod_emulated(xh, axis=axis, keepdims=True))
        out = cupy.full(want.shape, 7, dtype)
        assert R.prod(x, axis=axis, out=out) is out and same_bits(out, want), (shape, axis)
        wide = reference.prod_emulated(xh, axis=axis, dtype=np.complex128)
        assert same_bits(R.prod(x, axis=axis, dtype=np.complex128), wide), (shape, axis)
        real = xh.real.copy()
        got = R.prod(cupy.asarray(real), axis=axis, dtype=dtype)
        assert same_bits(got, reference.prod_emulated(real, axis=axis, dtype=dtype)), (shape, axis)
        for knobs, sm in ((P.DEFAULT_KNOBS, 7), (P.Knobs(full_block=64, full_unroll=2, row_max_tpr=256), 142)):
            v = R._reduce("prod", x, axis, None, False, None, knobs=knobs, sm=sm)
            assert same_bits(v, want), (shape, axis, knobs, sm)
    special = _near_one(rng, (5, 300), dtype)
    special[0, 5] = _complex(np.inf, 0.0, dtype)
    special[1, 7] = _complex(np.nan, 1.0, dtype)
    special[2, :8] = _complex(-0.0, -0.0, dtype)
    special[3, 33] = _complex(0.5, -np.inf, dtype)
    special[4, ::2] = _complex(-1.0, -0.0, dtype)
    for layout, axis in ((special, 1), (np.ascontiguousarray(special.T), 0)):
        got = R.prod(cupy.asarray(layout), axis=axis)
        assert same_bits(got, reference.prod_emulated(layout, axis=axis)), axis


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", NAN_DTYPES, ids=dtype_name)
def test_logsumexp_bits_match_the_emulator(dtype):
    import cupy

    rng = np.random.default_rng(73)
    for shape, axis in (((100003,), None), ((33, 4099), 1), ((5000, 33), 0), ((6, 7, 65), (0, 2)), ((17, 1), 1),
                        ((0, 5), 0), ((64, 300), -1)):
        xh = (20 * rng.standard_normal(shape)).astype(dtype)
        if xh.size > 10:
            xh.reshape(-1)[::97] = -np.inf
        want = reference.logsumexp_emulated(xh, axis=axis)
        for label, x in _gpu_views(cupy, xh).items():
            got = cupy.asnumpy(R.logsumexp(x, axis=axis))
            assert same_bits(got, want), (shape, axis, label)
        _close(got, reference.reduce_logsumexp(xh, axis), dtype, shape)
        # The same bits for other knobs (kernels compiled on the fly) and SM counts.
        points = ((P.COMPACT_KNOBS, 7), (P.Knobs(full_block=256, full_unroll=2, row_max_tpr=256), 142))
        for knobs, sm in points if dtype == np.float32 else points[:1]:
            v = R._reduce("logsumexp", cupy.asarray(xh), axis, None, False, None, knobs=knobs, sm=sm)
            assert same_bits(cupy.asnumpy(v), want), (shape, knobs, sm)
    special = np.array([[-np.inf] * 300, [np.inf] + [1.0] * 299, [np.nan] + [1.0] * 299], dtype)
    got = cupy.asnumpy(R.logsumexp(cupy.asarray(special), axis=1)).astype(np.float64)
    assert got[0] == -np.inf and got[1] == np.inf and np.isnan(got[2])


@pytest.mark.gpu
def test_var_and_logsumexp_special_chains_match_the_emulator():
    """Chains formed at once (chain_state) on every kernel path: partial chains (odd lengths), chains of
    -inf alone or mixed, +inf, NaN, constant slices; full, rows, columns (var) and strided layouts."""
    import cupy

    rng = np.random.default_rng(29)
    for dt in (np.float32, np.float64, BFLOAT16):
        for n in (7, 257, 4099):
            x = (10 * rng.standard_normal((8, n))).astype(np.float32)
            x[1] = -np.inf
            x[2, ::3] = -np.inf
            x[3, n // 2] = np.inf
            x[4, n - 1] = np.nan
            x[5, 0], x[5, n - 1] = -np.inf, np.inf
            x[6] = 3.5
            x[7, 1::2] = -np.inf
            xh = x.astype(dt)
            for layout, axis in ((xh, 1), (np.ascontiguousarray(xh.T), 0), (xh.reshape(2, 4, n), (0, 2))):
                d = cupy.asarray(layout)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    assert same_bits(R.logsumexp(d, axis=axis), reference.logsumexp_emulated(layout, axis=axis)), \
                        (dt, n, axis)
                    assert same_bits(R.var(d, axis=axis), reference.var_emulated(layout, axis=axis)), (dt, n, axis)
            row = cupy.asarray(xh[2])
            assert same_bits(R.logsumexp(row), reference.logsumexp_emulated(xh[2])), (dt, n)
            assert same_bits(R.var(cupy.asarray(xh[0])[1:]), reference.var_emulated(xh[0, 1:])), (dt, n)


@pytest.mark.gpu
def test_new_ops_bad_input_raises_before_launch():
    import cupy

    x = cupy.ones((4, 5), np.float32)
    for call, err in ((lambda: R.nansum(x, axis=2), np.exceptions.AxisError),
                      (lambda: R.nanmean(x, axis=0, out=cupy.empty(4, np.float32)), ValueError),
                      (lambda: R.any(x, axis=0, out=cupy.empty(4, np.bool_)), ValueError),
                      (lambda: R.all(x, axis=1, out=cupy.empty(5, np.bool_)), ValueError),
                      (lambda: R.prod(cupy.ones(3, np.complex64), dtype=np.float32), TypeError),
                      (lambda: R.logsumexp(x, out=x[0, 0]), ValueError),
                      (lambda: R.nansum(cupy.ones(3, np.complex64), dtype=np.float32), TypeError),
                      (lambda: R.nanmax(cupy.zeros((0, 3), np.float32), axis=0), ValueError)):
        with pytest.raises(err):
            call()
    assert float(x.sum()) == 20


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["var", "std"])
def test_variances_without_freedom_are_numpys(name):
    """ddof >= n: NumPy's values (an empty slice over a negative ddof is 0; complex (M2_re + M2_im) / 0 is inf
    unless both are 0) and its "Degrees of freedom <= 0" warning, also where a size-1 slice is lowered (an
    integer x, a float64 dtype= of float32) or the parts of complex x are reduced."""
    import cupy

    cases = [(np.zeros(0, np.float32), None, -1, {}), (np.zeros((3, 0)), 1, -2, {}),
             (np.array([1 + 2j, 3 + 0j], np.complex64), None, 2, {}), (np.array([1 + 0j, 1 + 0j]), None, 5, {}),
             (np.array([[1 + 1j], [2 + 0j]], np.complex64), 1, 1, {}),
             (np.arange(-3, 4, dtype=np.int8)[:, None], 1, 1, {}),
             (np.float32([[1.5], [2.0]]), 1, 1, {"dtype": np.float64})]
    for x, axis, ddof, kw in cases:
        with warnings.catch_warnings(record=True) as theirs, np.errstate(all="ignore"):
            warnings.simplefilter("always")
            want = getattr(np, name)(x, axis=axis, ddof=ddof, **kw)
        with warnings.catch_warnings(record=True) as ours:
            warnings.simplefilter("always")
            got = getattr(R, name)(cupy.asarray(x), axis=axis, ddof=ddof, **kw)
        label = (x.dtype, axis, ddof)
        assert got.shape == np.shape(want) and got.dtype == np.asarray(want).dtype, label
        assert same_bits(got, getattr(reference, f"{name}_emulated")(x, axis=axis, ddof=ddof, **kw)), label
        np.testing.assert_array_equal(got.get(), want, err_msg=str(label))
        freedom = [str(w.message) for w in ours if "Degrees of freedom" in str(w.message)]
        assert len(freedom) == any("Degrees of freedom" in str(w.message) for w in theirs), (label, freedom)
