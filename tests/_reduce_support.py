"""What the reduction tests share: the ops and their references, the GPU tests' data and dtypes, the layout
tables, and the blocked simulation of every kernel's split of the one tree (its lanes, chains, shuffles, span
stacks, blocks and launches, with the kernel's own index arithmetic)."""

import itertools
import math

import numpy as np

from cukern import reference
from cukern.reference import reductions as tree
from cukern import reduce_plan as P
from cukern._dtypes import BFLOAT16


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


CHAINS, CHAIN_LENGTH, LEAF = P.TREE_CHAINS, P.TREE_CHAIN_LENGTH, P.TREE_LEAF
# The error state of every combine: an overflow to infinity and inf - inf are values the kernels make too.
QUIET = {"invalid": "ignore", "over": "ignore"}


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


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
    reference's (array) combine, for the emulator; a call combines two scalars (max and min by _extreme).
    The building blocks enter NumPy's error state once and combine with :meth:`merge`: entering it for
    each combine took two thirds of a combine's time."""

    larger = None  # max: True, min: False (_extreme), else the combine itself

    def __init__(self, op: int, a):
        self.a = np.dtype(a)
        self.combine = {P.OP_MAX: tree._tree_max, P.OP_MIN: tree._tree_min}.get(op, tree._tree_sum)
        self.identity = self.a.type({P.OP_MAX: -np.inf, P.OP_MIN: np.inf}.get(op, 0))
        self.larger = {P.OP_MAX: True, P.OP_MIN: False}.get(op)

    def __call__(self, a, b):
        with np.errstate(**QUIET):
            return self.merge(a, b)

    def merge(self, a, b):
        """A call's combine, in the error state the caller entered."""
        a, b = self.a.type(a), self.a.type(b)
        if self.larger is not None:
            return _extreme(a, b, self.larger)
        return self.a.type(self.combine(a, b))

    def chain(self, values):
        """A chain's value from its present elements (m order): added one after another into the identity
        (absent elements, the identity, would change nothing)."""
        acc = self.identity
        with np.errstate(**QUIET):
            for v in values:
                acc = self.merge(acc, v)
        return acc

    def pairs(self, values):
        """tree_reduce over a power-of-two count, or the tree over any count padded with the identity."""
        values = list(values)
        values += [self.identity] * ((1 << (len(values) - 1).bit_length()) - len(values))
        with np.errstate(**QUIET):
            while len(values) > 1:
                values = [self.merge(values[i], values[i + 1]) for i in range(0, len(values), 2)]
        return values[0]

    def lanes(self, values, width: int) -> list:
        """group_tree_reduce over aligned groups of ``width`` lanes: each lane combines its own value with
        its partner's; every lane of a group must end with the same bits (the combine is commutative)."""
        m = 1
        with np.errstate(**QUIET):
            while m < width:
                values = [self.merge(values[lane], values[lane ^ m]) for lane in range(len(values))]
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
        with np.errstate(**QUIET):
            for k, v in enumerate(values):
                lev = 0
                while (k >> lev) & 1:
                    v = self.merge(level[lev], v)
                    lev += 1
                level[lev] = v
            out, first = self.identity, True
            for lev in range(len(values).bit_length()):
                if (len(values) >> lev) & 1:
                    out = level[lev] if first else self.merge(level[lev], out)
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


def _tuner_knobs():
    """Every knob point of the lab's tuning spaces (the candidates the tuner times)."""
    from cukern.lab import reduce as lab_reduce

    out = []
    for space in lab_reduce.SPACES.values():
        names = list(space)
        for values in itertools.product(*(space[k] for k in names)):
            out.append(P.Knobs(**dict(zip(names, values))))
    return out


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
