"""Reductions (cukern.reduce): float64 references and the kernels' bits on the host."""

from __future__ import annotations

import functools
import warnings
from typing import Any, Callable

import numpy as np

from .._typing import Array, Axis, DTypeLike, HostArray, HostResult
from ._common import _astype, _numpy
from ._elementary import _cis, _exp_nonpositive, _explog, _fma32, _log_abs, _log_at_least_one  # noqa: F401
from ._elementary import _phase
from .argreduce import _arg_emulated


def _wide(x):
    x = np.asarray(x)
    if x.dtype.kind == "c":
        return x.astype(np.complex128)
    return x.astype(np.int64) if x.dtype.kind in "biu" else x.astype(np.float64)


def reduce_sum(x: Array, axis: Axis = None, keepdims: bool = False) -> HostResult:
    """``sum(x)`` over ``axis`` in int64 (integers, bool) or float64.

    Examples
    --------
    >>> from cukern.reference import reduce_sum
    >>> x = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    >>> print(reduce_sum(x), reduce_sum(x, axis=0), reduce_sum(np.array([True, True])))
    21.0 [5. 7. 9.] 2
    """
    return np.sum(_wide(x), axis=axis, keepdims=keepdims)


def reduce_mean(x: Array, axis: Axis = None, keepdims: bool = False) -> HostResult:
    """``sum(x) / count`` in float64.

    Examples
    --------
    >>> from cukern.reference import reduce_mean
    >>> x = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    >>> print(reduce_mean(x, axis=1, keepdims=True))
    [[2.]
     [5.]]
    """
    return np.mean(_wide(x).astype(np.float64), axis=axis, keepdims=keepdims)


def reduce_sum_of_squares(x: Array, axis: Axis = None, keepdims: bool = False) -> HostResult:
    """``sum(x * x)``, squares taken in int64 or float64.

    Examples
    --------
    >>> from cukern.reference import reduce_sum_of_squares
    >>> x = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    >>> print(reduce_sum_of_squares(x, axis=1))
    [14. 77.]
    """
    w = _wide(x)
    return np.sum(w * w, axis=axis, keepdims=keepdims)


def reduce_norm(x: Array, axis: Axis = None, keepdims: bool = False) -> HostResult:
    """``sqrt(sum(x * x))`` in float64.

    Examples
    --------
    >>> from cukern.reference import reduce_norm
    >>> print(reduce_norm(np.array([3, 4])))
    5.0
    """
    w = _wide(x).astype(np.float64)
    return np.sqrt(np.sum(w * w, axis=axis, keepdims=keepdims))


def reduce_amax(x: Array, axis: Axis = None, keepdims: bool = False) -> HostResult:
    """Maximum; NaN if any element is NaN.

    Examples
    --------
    >>> from cukern.reference import reduce_amax
    >>> print(reduce_amax(np.array([1.0, 5.0, 2.0])), reduce_amax(np.array([1.0, np.nan])))
    5.0 nan
    """
    return np.max(_wide(x), axis=axis, keepdims=keepdims)


def reduce_amin(x: Array, axis: Axis = None, keepdims: bool = False) -> HostResult:
    """Minimum; NaN if any element is NaN.

    Examples
    --------
    >>> from cukern.reference import reduce_amin
    >>> print(reduce_amin(np.array([[1, 5], [-2, 0]]), axis=1))
    [ 1 -2]
    """
    return np.min(_wide(x), axis=axis, keepdims=keepdims)


def reduction_tolerance(n: int, acc_dtype: DTypeLike, abs_sum: float) -> float:
    """Absolute error allowed for a sum of ``n`` terms accumulated in ``acc_dtype`` whose absolute values
    add to ``abs_sum``. Worst-case recursive summation grows with the longest sequential chain (up to a few
    thousand terms a thread in the kernels); rounding errors of random data add up like a random walk, so
    the bound charges ``eps`` per tree level (log2 n) plus ``sqrt(n) / 16`` for the sequential chains, with
    a floor of 4. Integer accumulators are exact: 0.

    Examples
    --------
    >>> from cukern.reference import reduction_tolerance
    >>> reduction_tolerance(1024, np.int64, 1e6)
    0.0
    >>> print(f"{reduction_tolerance(1024, np.float32, 1024.0):.3e}")
    1.953e-03
    """
    acc = np.dtype(acc_dtype)
    if acc.kind in "biu":
        return 0.0
    eps = float(np.finfo(acc).eps)
    return eps * abs_sum * (4 + np.log2(max(n, 1)) + np.sqrt(n) / 16)


# The reductions' bits (cukern.reduce), on the host: the one tree of cukern.reduce_plan's notes, in the
# accumulator dtype, one correctly rounded NumPy operation at a time (NumPy never fuses a multiply-add).
# Nothing here knows a grid, a block, a knob or an SM count: that the GPU gives these bits for every launch
# is what makes its results independent of them.


def _tree_sum(a, b):
    return a + b


def _nan_wins(a, b, out):
    """``out``, but ``a + b`` (a NaN) where either operand is NaN. ``a + b`` is computed everywhere, and where
    no NaN is met it may add infinities of opposite signs: that value is never used, so neither is its
    warning."""
    if out.dtype.kind != "f":
        return out
    with np.errstate(invalid="ignore"):
        return np.where(np.isnan(a) | np.isnan(b), a + b, out)


def _tree_max(a, b):
    """reduce.cu's Max: a NaN operand gives a NaN; of two equal values +0 over -0; commutative."""
    return _nan_wins(a, b, np.where(a > b, a, np.where(b > a, b, np.where(np.signbit(a), b, a))))


def _tree_min(a, b):
    return _nan_wins(a, b, np.where(a < b, a, np.where(b < a, b, np.where(np.signbit(a), a, b))))


def _tree_prod(a, b):
    return a * b


def _is_complex_one(z):
    """Where ``z`` is exactly 1 + 0i, its imaginary part +0 (reduce.cu ``is_one``)."""
    return (z.real == 1) & (z.imag == 0) & ~np.signbit(z.imag)


def _tree_complex_prod(a, b):
    """reduce.cu's complex ``mul_rn``: (ar br - ai bi, ar bi + ai br), each step one correctly rounded NumPy
    operation on the parts (NumPy's complex multiply is the same formula, but its SIMD loops fuse a product of
    each part into an FMA where the CPU has one: other last bits), and an operand of exactly 1 + 0i giving the
    other one as it is."""
    a, b = np.broadcast_arrays(a, b)
    out = np.empty(a.shape, a.dtype)
    out.real = a.real * b.real - a.imag * b.imag
    out.imag = a.real * b.imag + a.imag * b.real
    return np.where(_is_complex_one(b), a, np.where(_is_complex_one(a), b, out))


def reduction_tree(v: Array, combine: Callable[[HostArray, HostArray], HostArray] = _tree_sum,
                   identity: Any = 0) -> HostArray:
    """The tree over the last axis of ``v`` (values already lifted into the accumulator dtype), one result
    per leading position: leaves of 256 elements, in each 32 chains (chain c: elements c, c + 32, ... of the
    leaf, added one after another into ``identity``), then the chains in order paired with their neighbours
    up a perfect binary tree, the count padded with ``identity``.

    Examples
    --------
    >>> from cukern.reference import reduction_tree
    >>> v = np.full((2, 1000), 0.1, np.float32)
    >>> print(reduction_tree(v))
    [100.00001 100.00001]
    >>> print(reduction_tree(np.array([3.0, -1.0, 7.0]), np.maximum, -np.inf))
    7.0
    """
    from ..reduce_plan import TREE_CHAIN_LENGTH, TREE_CHAINS, TREE_LEAF

    v = np.asarray(v)
    lead, n = v.shape[:-1], v.shape[-1]
    v = v.reshape(-1, n)
    leaves = max(1, -(-n // TREE_LEAF))
    fill = np.array(identity, v.dtype)
    if leaves * TREE_LEAF != n:
        v = np.concatenate([v, np.full((v.shape[0], leaves * TREE_LEAF - n), fill, v.dtype)], axis=1)
    v = v.reshape(-1, leaves, TREE_CHAIN_LENGTH, TREE_CHAINS)
    with np.errstate(invalid="ignore", over="ignore"):
        chain = np.full((v.shape[0], leaves, TREE_CHAINS), fill, v.dtype)
        for m in range(TREE_CHAIN_LENGTH):
            chain = combine(chain, v[:, :, m, :])
        p = chain.reshape(v.shape[0], leaves * TREE_CHAINS)
        size = 1 << (p.shape[1] - 1).bit_length()
        if size != p.shape[1]:
            p = np.concatenate([p, np.full((p.shape[0], size - p.shape[1]), fill, p.dtype)], axis=1)
        while p.shape[1] > 1:
            p = combine(p[:, 0::2], p[:, 1::2])
    return p[:, 0].reshape(lead)


def _reduce_emulated(name: str, x, axis, dtype, keepdims: bool):
    import cukern.reduce_plan as P

    from .._dtypes import storage

    x = _numpy(x)
    op = P.OPS[name]
    axes = P.normalize_axis(axis, x.ndim)
    final = P.result_dtype(name, x.dtype, dtype)
    shape = P.result_shape(x.shape, axes, keepdims)
    if name in P.COUNT_OPS and x.dtype.kind == "c":
        x = x != 0  # a complex element is non-zero where either part is
    rt = None
    if not (op.minmax or name in P.COUNT_OPS):
        # cukern lowers x first (reduce_plan.route): uint64 viewed as int64 (sums wrap the same modulo
        # 2^64), a narrower or unsigned integer converted exactly, uint64 to float64 for a float result, a
        # float to int64 for an integer result, any x to a complex target of prod; the kernels then write
        # rt.kernel.
        rt = P.route(name, x.dtype, final)
        if rt.how == "complex" or rt.op != name or (final.kind == "c" and rt.kernel.kind != "c"):
            return _lowered_emulated(name, x, axes, final, keepdims, rt)
        if rt.how == "view":
            x = x.view(rt.via)
        elif rt.how == "cast":
            if op.lift == P.LIFT_SKIP_NAN and rt.via.kind in "iu" and (x.dtype.kind == "f" or x.dtype == P.BFLOAT16):
                x = np.where(np.isnan(x), np.zeros((), x.dtype), x)  # nansum: NaN -> 0 in x's dtype first
            x = x.astype(rt.via)
    n = int(np.prod([x.shape[i] for i in axes], dtype=np.int64))
    if n == 0:
        if op.minmax:
            raise ValueError(f"zero-size array to reduction operation {name} which has no identity")
        empty = (1 if op.kernel_op == P.OP_PROD or op.finalize == P.FINISH_EQUALS
                 else np.nan if op.finalize == P.FINISH_DIVIDE else 0)
        return np.full(shape, empty, final)
    kept = [i for i in range(x.ndim) if i not in axes]
    v = np.transpose(x, kept + list(axes)).reshape(-1, n)  # C order over the reduced axes
    if n == 1:
        # cukern reduces size-1 axes elementwise, in the result dtype: no tree, no chain to start from +0.
        if op.lift in (P.LIFT_NONZERO, P.LIFT_NOT_NAN):
            hit = v[:, 0] != 0 if op.lift == P.LIFT_NONZERO else ~np.isnan(v[:, 0].astype(np.float64))
            return hit.astype(final).reshape(shape)
        r = _astype(v[:, 0], final)
        if op.lift == P.LIFT_SKIP_NAN and op.kernel_op == P.OP_SUM and r.dtype in P.FLOATS:
            r = np.where(np.isnan(r), np.zeros_like(r), r)
        if op.finalize == P.FINISH_SQRT:
            r = np.abs(r)
        elif op.kernel_op == P.OP_SUMSQ:
            r = r * r
        return r.reshape(shape)
    o = x.dtype if op.minmax else rt.kernel if rt is not None else P.kernel_dtype(name, x.dtype, final)
    # An integer maximum or minimum is one of the elements (cukern converts x exactly, or flips uint64's sign
    # bit): selected in x's own dtype, as no float accumulator holds every uint32 or uint64.
    a = o if op.minmax and o.kind in "biu" else P.acc_dtype(o)
    w = v.astype(a)
    if op.kernel_op == P.OP_SUMSQ:
        w = w * w
    if op.lift == P.LIFT_SKIP_NAN and a.kind == "f":
        fill = {P.OP_MAX: -np.inf, P.OP_MIN: np.inf}.get(op.kernel_op, 0)
        w = np.where(np.isnan(w), np.array(fill, a), w)
    elif op.lift == P.LIFT_NONZERO:
        w = (w != 0).astype(a)
    elif op.lift == P.LIFT_NOT_NAN:
        w = (~np.isnan(w)).astype(a)
    if op.kernel_op == P.OP_PROD:
        with np.errstate(over="ignore", invalid="ignore"):
            if a.kind == "i":
                acc = w.prod(axis=1, dtype=a)
            else:
                acc = reduction_tree(w, _tree_complex_prod if a.kind == "c" else _tree_prod, 1)
    elif op.kernel_op == P.OP_MAX:
        acc = w.max(axis=1) if a.kind in "biu" else reduction_tree(w, _tree_max, -np.inf)
    elif op.kernel_op == P.OP_MIN:
        acc = w.min(axis=1) if a.kind in "biu" else reduction_tree(w, _tree_min, np.inf)
    else:
        acc = w.sum(axis=1, dtype=a) if a.kind == "i" else reduction_tree(w)  # integers: exact, wrapping
    if op.finalize == P.FINISH_EQUALS:
        acc = acc == np.float64(n)  # all: every element counted
    elif op.finalize != P.FINISH_NONE:
        d = acc.astype(np.float64)
        acc = d / np.float64(n) if op.finalize == P.FINISH_DIVIDE else np.sqrt(d)
    if o.itemsize == 2 and acc.dtype == np.float64:
        acc = acc.astype(np.float32)  # the kernels round a double result to float, then to the half type
    return _astype(acc.astype(storage(o)), final).reshape(shape)


def _lowered_emulated(name: str, x, axes, final, keepdims: bool, rt):
    """cukern.reduce's ``_lowered`` for route ``rt`` (:func:`cukern.reduce_plan.route`) where the kernels run
    another op or write another kind of result: x lowered as ``rt.how`` says (complex x as its real and
    imaginary parts on a trailing axis, each part its own tree, the norm reducing that axis too), the
    kernels' op into ``rt.kernel`` emulated on that, then converted to ``final``. A bool target compares
    the count of non-zero elements with 0 (sum, mean; an empty mean is True) or n (prod); a mean's integer
    target is the int64 sum taken modulo that type, divided in float64, truncated into it."""
    import cukern.reduce_plan as P

    n = int(np.prod([x.shape[i] for i in axes], dtype=np.int64))
    inner_axes = axes
    if name == "nansum" and (x.dtype.kind in "fc" or x.dtype == P.BFLOAT16):
        x = np.where(np.isnan(x), np.zeros((), x.dtype), x)  # NumPy's nansum: a NaN (either part) is 0 first
    if rt.how == "complex":
        x = np.stack([x.real, x.imag], axis=-1)
        if name == "norm":
            inner_axes = axes + (x.ndim - 1,)
    elif rt.how == "view":
        x = x.view(rt.via)
    elif rt.how == "cast":
        x = _astype(x, rt.via)
    if rt.op == "count_nonzero":
        c = _reduce_emulated("count_nonzero", x, inner_axes, None, keepdims)
        # NumPy's "and" (prod) or "or"; an empty mean's "or" (False) over 0 is NaN, which is True
        r = c == n if name == "prod" else (c > 0) | (n == 0 and name == "mean")
    else:
        r = _reduce_emulated(rt.op, x, inner_axes, rt.kernel, keepdims)
        if rt.how == "complex" and name != "norm":
            r = np.ascontiguousarray(r).view(np.result_type(r.dtype, np.complex64))[..., 0]
        elif rt.how == "complex" and keepdims:  # the norm reduced the parts' axis too: not one of x's
            r = r.reshape(r.shape[:-1])
        if rt.mean_int:
            with np.errstate(invalid="ignore", divide="ignore"):
                r = (r.astype(final).astype(np.float64) / np.float64(n)).astype(final)
    return _astype(r, final)


def sum_emulated(x: Array, axis: Axis = None, dtype: DTypeLike | None = None, keepdims: bool = False) -> HostArray:
    """The bits :func:`cukern.sum` returns, as a NumPy array, computed on the host: x (any array; a CuPy
    array is copied to the host) converted to the accumulator dtype (float32 for float32 and half-type
    results, float64 for float64, int64 for integer results), each result the tree of
    :func:`reduction_tree` over its elements in C order over ``axis`` (integer sums exactly, wrapping),
    rounded once to the result dtype. An axis of one element is copied, as cukern does it. NaN payloads
    may differ from the GPU's. A float converted to an integer (x for an integer target, a mean's quotient)
    that is +-inf, NaN or out of range takes the host's conversion here, where the GPU's saturates: such
    values are not emulated bit for bit.

    Examples
    --------
    >>> from cukern.reference import sum_emulated
    >>> x = np.full(1000, 0.1, np.float32)
    >>> print(sum_emulated(x), np.float32(np.sum(x, dtype=np.float64)))
    100.00001 100.0
    >>> print(sum_emulated(np.array([[1, 2], [3, 4]], np.int8), axis=0).dtype)
    int64
    """
    return _reduce_emulated("sum", x, axis, dtype, keepdims)


def mean_emulated(x: Array, axis: Axis = None, dtype: DTypeLike | None = None, keepdims: bool = False) -> HostArray:
    """The bits :func:`cukern.mean` returns: the tree's sum in the accumulator dtype, widened to float64,
    divided by the count (one IEEE division), rounded to the result dtype (through float32 for half
    types, as the kernels store it).

    Examples
    --------
    >>> from cukern.reference import mean_emulated
    >>> print(mean_emulated(np.array([1, 2, 4], np.int32)))
    2.3333333333333335
    """
    return _reduce_emulated("mean", x, axis, dtype, keepdims)


def sum_of_squares_emulated(x: Array, axis: Axis = None, dtype: DTypeLike | None = None,
                            keepdims: bool = False) -> HostArray:
    """The bits :func:`cukern.sum_of_squares` returns: each value squared in the accumulator dtype (one
    rounding), then :func:`sum_emulated`'s tree.

    Examples
    --------
    >>> from cukern.reference import sum_of_squares_emulated
    >>> y = sum_of_squares_emulated(np.array([30.0, 40.0], np.float16))
    >>> print(y.dtype, y)
    float16 2.5e+03
    """
    return _reduce_emulated("sum_of_squares", x, axis, dtype, keepdims)


def norm_emulated(x: Array, axis: Axis = None, dtype: DTypeLike | None = None, keepdims: bool = False) -> HostArray:
    """The bits :func:`cukern.norm` returns: :func:`sum_of_squares_emulated`'s sum widened to float64, its
    correctly rounded square root, rounded to the result dtype.

    Examples
    --------
    >>> from cukern.reference import norm_emulated
    >>> print(norm_emulated(np.array([[3.0, 4.0], [5.0, 12.0]], np.float32), axis=1))
    [ 5. 13.]
    """
    return _reduce_emulated("norm", x, axis, dtype, keepdims)


def amax_emulated(x: Array, axis: Axis = None, dtype: DTypeLike | None = None, keepdims: bool = False) -> HostArray:
    """The bits :func:`cukern.amax` returns: the tree with reduce.cu's commutative max (NaN if any element
    is NaN, +0 over -0), converted to ``dtype`` when given. Complex x: :func:`extreme_emulated`.

    Examples
    --------
    >>> from cukern.reference import amax_emulated
    >>> print(amax_emulated(np.array([-0.0, 0.0, -1.0], np.float32)), amax_emulated(np.array([1.0, np.nan])))
    0.0 nan
    """
    if _numpy(x).dtype.kind == "c":
        return extreme_emulated("amax", x, axis, dtype, keepdims)
    return _reduce_emulated("amax", x, axis, dtype, keepdims)


def amin_emulated(x: Array, axis: Axis = None, dtype: DTypeLike | None = None, keepdims: bool = False) -> HostArray:
    """The bits :func:`cukern.amin` returns: as :func:`amax_emulated`, with min (-0 over +0).

    Examples
    --------
    >>> from cukern.reference import amin_emulated
    >>> print(amin_emulated(np.array([0.0, -0.0, 1.0], np.float32)))
    -0.0
    """
    if _numpy(x).dtype.kind == "c":
        return extreme_emulated("amin", x, axis, dtype, keepdims)
    return _reduce_emulated("amin", x, axis, dtype, keepdims)


def reduce_var(x: Array, axis: Axis = None, ddof: int = 0, keepdims: bool = False) -> HostResult:
    """``sum((x - mean)**2) / (n - ddof)`` in float64, two passes (``numpy.var``).

    Examples
    --------
    >>> from cukern.reference import reduce_var
    >>> x = np.array([1.0, 2.0, 3.0, 4.0])
    >>> print(reduce_var(x), reduce_var(x, ddof=1))
    1.25 1.6666666666666667
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.var(_wide(x).astype(np.float64), axis=axis, ddof=ddof, keepdims=keepdims)


def reduce_std(x: Array, axis: Axis = None, ddof: int = 0, keepdims: bool = False) -> HostResult:
    """``sqrt(reduce_var(x))`` in float64.

    Examples
    --------
    >>> from cukern.reference import reduce_std
    >>> print(reduce_std(np.array([2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0])))
    2.0
    """
    return np.sqrt(reduce_var(x, axis, ddof, keepdims))


def _chan(a, b):
    """reduce.cu's Chan merge of (count, mean, M2) arrays: the operands ordered (larger count, then larger
    mean, first), an empty one giving the other exactly; each step one rounding in the arrays' dtype."""
    swap = (b[0] > a[0]) | ((b[0] == a[0]) & (b[1] > a[1]))
    hn, hm, h2 = (np.where(swap, y, x) for x, y in zip(a, b))
    ln, lm, l2 = (np.where(swap, x, y) for x, y in zip(a, b))
    n = hn + ln
    d = lm - hm
    f = ln / np.where(n == 0, np.ones_like(n), n)
    m = hm + d * f
    m2 = (h2 + l2) + (d * d) * (hn * f)
    empty = ln == 0
    return np.where(empty, hn, n), np.where(empty, hm, m), np.where(empty, h2, m2)


def _chain_elements(a, fill):
    """The chains of :func:`reduction_tree` over the last axis of ``a`` (rows, n): their elements (rows,
    chains, 8) in m order, ``fill`` past n, chains in order 32 k + c, and each chain's count of elements
    below n (chains,): a prefix of its 8."""
    from ..reduce_plan import TREE_CHAIN_LENGTH, TREE_CHAINS, TREE_LEAF

    rows, n = a.shape
    leaves = max(1, -(-n // TREE_LEAF))
    v = np.concatenate([a, np.full((rows, leaves * TREE_LEAF - n), fill, a.dtype)], axis=1)
    v = v.reshape(rows, leaves, TREE_CHAIN_LENGTH, TREE_CHAINS).transpose(0, 1, 3, 2)
    first = np.arange(leaves * TREE_CHAINS)
    left = n - (first // TREE_CHAINS * TREE_LEAF + first % TREE_CHAINS)
    count = np.clip(-(-left // TREE_CHAINS), 0, TREE_CHAIN_LENGTH)
    return v.reshape(rows, leaves * TREE_CHAINS, TREE_CHAIN_LENGTH), count


def _upper_tree(p, combine, identity):
    """The perfect binary tree of :func:`reduction_tree` over chain states ``p`` (a tuple of (rows, chains)
    arrays), neighbours paired first, the count padded with ``identity`` (a tuple of scalars)."""
    rows, chains = p[0].shape
    size = 1 << (chains - 1).bit_length()
    p = tuple(np.concatenate([s, np.full((rows, size - chains), i, s.dtype)], axis=1) for s, i in zip(p, identity))
    while p[0].shape[1] > 1:
        p = combine(tuple(s[:, 0::2] for s in p), tuple(s[:, 1::2] for s in p))
    return tuple(s[:, 0] for s in p)


def _moments_tree(d):
    """The tree of :func:`reduction_tree` over the last axis of ``d`` (shifted values in the accumulator
    dtype) with states (count, mean, M2): the chains' states (:func:`_moment_chains`) merged by
    :func:`_chan`."""
    return _upper_tree(_moment_chains(d), _chan, (0, 0, 0))


def _moment_chains(d):
    """Each chain's (count, mean, M2) over the last axis of ``d`` (rows, n), as reduce.cu ``chain_state``
    forms it: its c present values summed left to right from the first, mean = sum / c (one division),
    M2 = the squares of (value - mean) summed left to right; an empty chain the identity (0, 0, 0). Arrays
    (rows, chains), chains in order 32 k + c."""
    v, count = _chain_elements(d, 0)
    c = count.astype(d.dtype)
    with np.errstate(all="ignore"):
        s1 = v[..., 0]
        for m in range(1, v.shape[-1]):
            s1 = np.where(m < count, s1 + v[..., m], s1)
        mean = s1 / np.where(count == 0, 1, c).astype(d.dtype)
        e = v[..., 0] - mean
        m2 = e * e
        for m in range(1, v.shape[-1]):
            e = v[..., m] - mean
            m2 = np.where(m < count, m2 + e * e, m2)
        zero = np.zeros_like(mean)
        empty = count == 0
        return np.broadcast_to(c, mean.shape), np.where(empty, zero, mean), np.where(empty, zero, m2)


def _var_emulated(name: str, x, axis, dtype, ddof, keepdims: bool):
    import cukern.reduce_plan as P

    x = _numpy(x)
    axes = P.normalize_axis(axis, x.ndim)
    final = P.result_dtype(name, x.dtype, dtype)
    shape = P.result_shape(x.shape, axes, keepdims)
    rt = P.route(name, x.dtype, final)
    if rt.how == "complex":
        # the parts' variances, each its own tree, added in float64 (then the square root), rounded once; with
        # ddof >= n > 0 the parts' M2 (over 1), added, over 0 (NumPy's (M2_re + M2_im) / 0)
        n = int(np.prod([x.shape[i] for i in axes], dtype=np.int64))
        no_freedom = 0 < n <= ddof
        parts = [np.ascontiguousarray(p).reshape(x.shape) for p in (x.real, x.imag)]
        r = sum(_var_emulated("var", p, axis, rt.kernel, n - 1 if no_freedom else ddof, keepdims).astype(np.float64)
                for p in parts)
        with np.errstate(invalid="ignore", divide="ignore"):
            r = r / np.float64(0) if no_freedom else r
            return np.asarray(np.sqrt(r) if name == "std" else r).astype(final)
    if rt.how == "cast":
        x = x.astype(rt.via)  # as cukern converts x first (to a float ``dtype=``: NumPy computes in it)
    n = int(np.prod([x.shape[i] for i in axes], dtype=np.int64))
    divisor = max(n - ddof, 0)
    if n == 0:  # NumPy: the empty M2, 0, over max(n - ddof, 0): NaN, or 0 for a negative ddof
        return np.full(shape, np.nan if divisor == 0 else 0.0, final)
    kept = [i for i in range(x.ndim) if i not in axes]
    v = np.transpose(x, kept + list(axes)).reshape(-1, n)
    with np.errstate(all="ignore"):
        if n == 1:
            # cukern reduces size-1 axes elementwise: 0 for a finite element, NaN otherwise, over the divisor.
            r = np.where(np.isfinite(v[:, 0].astype(np.float64)), 0.0, np.nan) / np.float64(divisor)
            return r.astype(final).reshape(shape)
        s = P.acc_dtype(rt.kernel)  # a complex target's: its parts'
        w = v.astype(s)
        _, mean, m2 = _moments_tree(w - w[:, :1])
        r = np.where(np.isfinite(mean), m2.astype(np.float64) / np.float64(divisor), np.nan)
        if name == "std":
            r = np.sqrt(r)
    if final.itemsize == 2:
        r = r.astype(np.float32)  # the kernels round a double result to float, then to the half type
    return r.astype(final).reshape(shape)


def var_emulated(x: Array, axis: Axis = None, dtype: DTypeLike | None = None, ddof: int = 0,
                 keepdims: bool = False) -> HostArray:
    """The bits :func:`cukern.var` returns: each slice's values in the accumulator dtype (float32 for float32
    and half-type results, float64 otherwise) less the slice's first element; each chain of
    :func:`reduction_tree` forms its (count, mean, M2) at once (:func:`_moments_tree`: one division a
    chain), and the chains merge up the tree by reduce.cu's Chan merge (:func:`_chan`); then M2
    widened to float64 and divided by ``max(n - ddof, 0)`` (NaN when the mean is not finite), rounded to the
    result dtype (through float32 for half types).

    Examples
    --------
    >>> from cukern.reference import var_emulated
    >>> x = np.array([[1.0, 2.0, 3.0, 4.0]], np.float32)
    >>> print(var_emulated(x, axis=1), var_emulated(x, axis=1, ddof=1))
    [1.25] [1.6666666]
    """
    return _var_emulated("var", x, axis, dtype, ddof, keepdims)


def std_emulated(x: Array, axis: Axis = None, dtype: DTypeLike | None = None, ddof: int = 0,
                 keepdims: bool = False) -> HostArray:
    """The bits :func:`cukern.std` returns: :func:`var_emulated`'s float64 quotient, its correctly rounded
    square root, rounded to the result dtype.

    Examples
    --------
    >>> from cukern.reference import std_emulated
    >>> print(std_emulated(np.array([2, 4, 4, 4, 5, 5, 7, 9], np.int16)))
    2.0
    """
    return _var_emulated("std", x, axis, dtype, ddof, keepdims)


# NaN-aware reductions, counts, prod and logsumexp (cuda_src/reduce.cu): float64 references from NumPy, and
# the kernels' bits on the host.


def reduce_nansum(x: Array, axis: Axis = None, keepdims: bool = False) -> HostResult:
    """``sum`` of the non-NaN elements in int64 or float64 (``numpy.nansum``).

    Examples
    --------
    >>> from cukern.reference import reduce_nansum
    >>> print(reduce_nansum(np.array([1.0, np.nan, 2.0])))
    3.0
    """
    return np.nansum(_wide(x), axis=axis, keepdims=keepdims)


def reduce_nanmean(x: Array, axis: Axis = None, keepdims: bool = False) -> HostResult:
    """Mean of the non-NaN elements in float64; NaN for an all-NaN slice.

    Examples
    --------
    >>> from cukern.reference import reduce_nanmean
    >>> print(reduce_nanmean(np.array([[1.0, np.nan, 2.0], [np.nan, np.nan, np.nan]]), axis=1))
    [1.5 nan]
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmean(_wide(x).astype(np.float64), axis=axis, keepdims=keepdims)


def reduce_nanmax(x: Array, axis: Axis = None, keepdims: bool = False) -> HostResult:
    """Maximum of the non-NaN elements; NaN for an all-NaN slice.

    Examples
    --------
    >>> from cukern.reference import reduce_nanmax
    >>> print(reduce_nanmax(np.array([1.0, np.nan, 2.0])))
    2.0
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmax(_wide(x), axis=axis, keepdims=keepdims)


def reduce_nanmin(x: Array, axis: Axis = None, keepdims: bool = False) -> HostResult:
    """Minimum of the non-NaN elements; NaN for an all-NaN slice.

    Examples
    --------
    >>> from cukern.reference import reduce_nanmin
    >>> print(reduce_nanmin(np.array([1.0, np.nan, 2.0])))
    1.0
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmin(_wide(x), axis=axis, keepdims=keepdims)


def reduce_prod(x: Array, axis: Axis = None, keepdims: bool = False) -> HostResult:
    """Product in int64 (wrapping), float64 or complex128.

    Examples
    --------
    >>> from cukern.reference import reduce_prod
    >>> print(reduce_prod(np.array([[1, 2], [3, 4]], np.int8), axis=1))
    [ 2 12]
    """
    with np.errstate(over="ignore", invalid="ignore"):
        return np.prod(_wide(x), axis=axis, keepdims=keepdims)


def reduce_logsumexp(x: Array, axis: Axis = None, keepdims: bool = False, b: Array | None = None,
                     return_sign: bool = False) -> HostResult | tuple[HostResult, HostResult]:
    """``log(sum(exp(x)))`` in float64, shifted by the maximum (``scipy.special.logsumexp``): -inf for an
    empty or all -inf slice, +inf for a slice holding +inf, NaN for one holding NaN. With ``b`` (broadcast
    against x): ``log|sum(b * exp(x))|`` with the elements of zero weight dropped, shifted by the maximum of
    the others; -inf for a zero sum, NaN for a negative one unless ``return_sign``, which also returns the
    sum's sign (1, -1, 0, NaN for NaN; -1 for an empty slice, as SciPy's).

    Examples
    --------
    >>> from cukern.reference import reduce_logsumexp
    >>> print(reduce_logsumexp(np.array([1000.0, 1000.0])))
    1000.6931471805599
    >>> print(reduce_logsumexp(np.array([0.0, 0.0]), b=np.array([1.0, -3.0]), return_sign=True))
    (array(0.69314718), array(-1.))

    A complex x or b (:func:`_reduce_logsumexp_complex`): the principal ``log(sum(b * exp(x)))``, complex128,
    or with ``return_sign`` (``log|sum|``, float64; ``sum / |sum|``, complex128).
    """
    if np.iscomplexobj(x) or (b is not None and np.iscomplexobj(b)):
        return _reduce_logsumexp_complex(x, axis, keepdims, b, return_sign)
    if b is None:
        w = _wide(x).astype(np.float64)
        with np.errstate(all="ignore"):
            if w.size == 0:
                r = np.full(np.sum(w, axis=axis, keepdims=keepdims).shape, -np.inf)
                return (r, np.full(r.shape, -1.0)) if return_sign else r
            m = np.max(w, axis=axis, keepdims=True)
            safe = np.where(np.isfinite(m), m, 0.0)
            r = np.log(np.sum(np.exp(w - safe), axis=axis, keepdims=True)) + safe
            r = np.where(np.isfinite(m), r, m)
        r = r if keepdims else np.squeeze(r, axis=axis)
        return (r, np.where(np.isnan(r), np.nan, np.where(r == -np.inf, 0.0, 1.0))) if return_sign else r
    w, g = np.broadcast_arrays(_wide(x).astype(np.float64), _wide(b).astype(np.float64))
    keep = g != 0
    with np.errstate(all="ignore"):
        if w.size == 0:
            r = np.full(np.sum(w, axis=axis, keepdims=keepdims).shape, -np.inf)
            return (r, np.full(r.shape, -1.0)) if return_sign else r
        m = np.max(np.where(keep, w, -np.inf), axis=axis, keepdims=True)
        safe = np.where(np.isfinite(m), m, 0.0)
        total = np.sum(np.where(keep, g * np.exp(w - safe), 0.0), axis=axis, keepdims=True)
        sign = np.sign(total)
        r = np.log(np.abs(total)) + safe
        top = np.sum(np.where(keep & (w == np.inf), g, 0.0), axis=axis, keepdims=True)  # the +inf elements' weights
        r = np.where(m == np.inf, np.where(top == 0, np.nan, np.inf), r)
        sign = np.where(m == np.inf, np.where(top == 0, np.nan, np.sign(top)), sign)
        r = np.where(np.isnan(m), np.nan, r)
        sign = np.where(np.isnan(m) | np.isnan(r), np.nan, sign)
    if not keepdims:
        r, sign = np.squeeze(r, axis=axis), np.squeeze(sign, axis=axis)
    if return_sign:
        return r, sign
    return np.where(sign < 0, np.nan, r)


def _reduce_logsumexp_complex(x, axis, keepdims, b, return_sign):
    """:func:`reduce_logsumexp` of a complex x or b, the textbook sum in long double (64-bit significands where
    the platform has them, x86's; else float64) and returned in complex128 (float64 for ``log|sum|``): m the
    maximum of the real parts of the elements of non-zero weight, s = sum(b exp(x - m)) with NumPy's complex
    exp, an element of real part +inf adding b exp(i x_im), one of -inf nothing (times b); then
    :func:`_lse_complex_finish`'s rules: NaN for a NaN in m or s (or s == 0 at m = +inf), -inf (sign 0) for
    s == 0, +inf for m = +inf or an infinite part of s (its direction standing for s), else m + log|s|, the
    phase in (-pi, pi] and s / |s|."""
    z = _numpy(x).astype(np.clongdouble)
    g = np.ones((), np.clongdouble) if b is None else _numpy(b).astype(np.clongdouble)
    z, g = np.broadcast_arrays(z, g)
    with np.errstate(all="ignore"):
        if z.size == 0:
            shape = np.sum(z, axis=axis, keepdims=keepdims).shape
            r = np.full(shape, -np.inf)
            return (r, np.full(shape, -1 + 0j)) if return_sign else r.astype(np.complex128)
        keep = g != 0
        re, im = z.real, z.imag
        m = np.max(np.where(keep, re, -np.inf), axis=axis, keepdims=True)
        mag = np.where(re == np.inf, 1, np.where(m == np.inf, 0, np.exp(re - np.where(np.isfinite(m), m, 0))))
        terms = np.where(keep, g * (mag * np.exp(1j * np.where(re == -np.inf, 0, im))), 0)
        s = np.sum(terms, axis=axis, keepdims=True)
        bad = np.isnan(m) | np.isnan(s.real) | np.isnan(s.imag)
        zero = s == 0
        wide = np.isinf(s.real) | np.isinf(s.imag)
        d = np.where(wide, np.where(np.isinf(s.real), np.sign(s.real), 0) + 1j * np.where(np.isinf(s.imag),
                                                                                          np.sign(s.imag), 0), s)
        pi = np.arctan2(np.longdouble(0), np.longdouble(-1))
        phase = np.arctan2(d.imag, d.real)
        phase = np.where(phase == -pi, pi, phase)
        real = np.where(wide | (m == np.inf), np.inf, m + np.log(np.abs(d)))
        sign = d / np.abs(d)
        nan = bad | (zero & (m == np.inf))
        real = np.where(nan, np.nan, np.where(zero, -np.inf, real))
        phase = np.where(nan, np.nan, np.where(zero, 0, phase))
        sign = np.where(nan, np.nan + 1j * np.nan, np.where(zero, 0, sign))
    if not keepdims:
        real, phase, sign = (np.squeeze(v, axis=axis) for v in (real, phase, sign))
    if return_sign:
        return real.astype(np.float64), sign.astype(np.complex128)
    out = np.empty(np.shape(real), np.complex128)
    out.real, out.imag = real, phase
    return out


def nansum_emulated(x: Array, axis: Axis = None, dtype: DTypeLike | None = None, keepdims: bool = False) -> HostArray:
    """The bits :func:`cukern.nansum` returns: :func:`sum_emulated` with each NaN replaced by 0 first.

    Examples
    --------
    >>> from cukern.reference import nansum_emulated
    >>> print(nansum_emulated(np.array([1.5, np.nan, 2.0], np.float32)))
    3.5
    """
    return _reduce_emulated("nansum", x, axis, dtype, keepdims)


def _count_not_nan_emulated(x, axis, keepdims):
    return _reduce_emulated("count_not_nan", x, axis, None, keepdims)


def extreme_emulated(name: str, x: Array, axis: Axis = None, dtype: DTypeLike | None = None,
                     keepdims: bool = False) -> HostArray:
    """The bits :func:`cukern.amax` (``name`` "amax"), ``amin``, ``nanmax`` and ``nanmin`` return for complex
    host ``x`` (its strides matter): the element at the arg-reduction's index along the reduced axes merged
    in NumPy's visiting order (:func:`cukern.reduce_plan.gather_axes`); NaN-skipping for the nan forms, an
    all-NaN slice giving its first element. NumPy's own max, min, nanmax and nanmin give the same bits.

    Examples
    --------
    >>> from cukern.reference import extreme_emulated
    >>> z = np.array([1 + 1j, 3 + 0j, 3 - 1j], np.complex64)
    >>> print(extreme_emulated("amax", z), extreme_emulated("amin", z))
    (3+0j) (1+1j)
    """
    import cukern.reduce_plan as P

    x = _numpy(x)  # a cupy array arrives C-contiguous: pass host views to keep their visiting order
    axes = P.normalize_axis(axis, x.ndim)
    final = P.result_dtype(name, x.dtype, dtype)
    n = int(np.prod([x.shape[i] for i in axes], dtype=np.int64))
    if n == 0:
        raise ValueError(f"zero-size array to reduction operation {name} which has no identity")
    kept = [i for i in range(x.ndim) if i not in axes]
    merged = np.transpose(x, kept + list(P.gather_axes(x.shape, x.strides, axes)))
    merged = merged.reshape(tuple(x.shape[i] for i in kept) + (n,))
    at = _arg_emulated({"amax": "argmax", "amin": "argmin"}.get(name, name), merged, -1, True)
    r = np.take_along_axis(merged, at, axis=-1).reshape(P.result_shape(x.shape, axes, keepdims))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", np.exceptions.ComplexWarning)
        return np.asarray(_astype(r, final))


def _nan_minmax_emulated(name, x, axis, dtype, keepdims):
    x = _numpy(x)
    if x.dtype.kind == "c":
        return extreme_emulated(name, x, axis, dtype, keepdims)
    r = _reduce_emulated(name, x, axis, dtype, keepdims)
    if (x.dtype.kind == "f" or x.dtype.name == "bfloat16") and (r.dtype.kind == "f" or r.dtype.name == "bfloat16"):
        r = np.where(_count_not_nan_emulated(x, axis, keepdims) == 0, np.array(np.nan, r.dtype), r)
    return np.asarray(r)


def nanmax_emulated(x: Array, axis: Axis = None, dtype: DTypeLike | None = None, keepdims: bool = False) -> HostArray:
    """The bits :func:`cukern.nanmax` returns: :func:`amax_emulated` with each NaN replaced by -inf first,
    then NaN for the slices without a non-NaN value.

    Examples
    --------
    >>> from cukern.reference import nanmax_emulated
    >>> print(nanmax_emulated(np.array([[np.nan, 1.0], [np.nan, np.nan]], np.float32), axis=1))
    [ 1. nan]
    """
    return _nan_minmax_emulated("nanmax", x, axis, dtype, keepdims)


def nanmin_emulated(x: Array, axis: Axis = None, dtype: DTypeLike | None = None, keepdims: bool = False) -> HostArray:
    """The bits :func:`cukern.nanmin` returns: as :func:`nanmax_emulated`, with min and +inf.

    Examples
    --------
    >>> from cukern.reference import nanmin_emulated
    >>> print(nanmin_emulated(np.array([np.nan, 1.0, -2.0], np.float32)))
    -2.0
    """
    return _nan_minmax_emulated("nanmin", x, axis, dtype, keepdims)


def nanmean_emulated(x: Array, axis: Axis = None, dtype: DTypeLike | None = None, keepdims: bool = False) -> HostArray:
    """The bits :func:`cukern.nanmean` returns: :func:`nansum_emulated` in the accumulator dtype, widened to
    float64, divided by the count of non-NaN values (NaN for none), rounded to the result dtype (through
    float32 for half types). Integer and bool inputs: :func:`mean_emulated`. Complex x: each part of the sum
    divided in float64 by the count of elements with no NaN part, rounded to the part's dtype; a real x
    with a complex ``dtype=``: the real result in the parts' dtype, widened.

    Examples
    --------
    >>> from cukern.reference import nanmean_emulated
    >>> print(nanmean_emulated(np.array([1.0, np.nan, 2.0], np.float32)))
    1.5
    """
    import cukern.reduce_plan as P

    x = _numpy(x)
    if x.dtype.kind in "biu":
        return mean_emulated(x, axis, dtype, keepdims)
    final = P.result_dtype("mean", x.dtype, dtype)
    if final.kind == "c" and x.dtype.kind != "c":
        return nanmean_emulated(x, axis, P.real_of(final), keepdims).astype(final)
    total = nansum_emulated(x, axis, P.acc_dtype(final), keepdims)
    if x.dtype.kind == "c":
        count = np.sum(~np.isnan(x), axis=P.normalize_axis(axis, x.ndim), keepdims=keepdims).astype(np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            re, im = total.real.astype(np.float64) / count, total.imag.astype(np.float64) / count
        q = np.empty(np.shape(total), final)
        q.real, q.imag = re, im
        return q
    with np.errstate(invalid="ignore", divide="ignore"):
        q = total.astype(np.float64) / _count_not_nan_emulated(x, axis, keepdims)
    if final.itemsize == 2:
        q = q.astype(np.float32)
    return np.asarray(q.astype(final))


def count_nonzero_emulated(x: Array, axis: Axis = None, keepdims: bool = False) -> HostArray:
    """:func:`cukern.count_nonzero`: the number of x != 0 (a NaN counts), int64.

    Examples
    --------
    >>> from cukern.reference import count_nonzero_emulated
    >>> print(count_nonzero_emulated(np.array([[0.0, -0.0, np.nan], [1.0, 2.0, 0.0]]), axis=1))
    [1 2]
    """
    return np.asarray(_reduce_emulated("count_nonzero", x, axis, None, keepdims))


def any_emulated(x: Array, axis: Axis = None, keepdims: bool = False) -> HostArray:
    """:func:`cukern.any`: the count of x != 0 (a NaN counts) in float64, stored as count != 0.

    Examples
    --------
    >>> from cukern.reference import any_emulated
    >>> print(any_emulated(np.array([[0, 0], [0, 3]]), axis=1))
    [False  True]
    """
    return np.asarray(_reduce_emulated("any", x, axis, None, keepdims))


def all_emulated(x: Array, axis: Axis = None, keepdims: bool = False) -> HostArray:
    """:func:`cukern.all`: the count of x != 0 in float64, stored as count == n (n the slice's length).

    Examples
    --------
    >>> from cukern.reference import all_emulated
    >>> print(all_emulated(np.array([[1, 2], [0, 3]]), axis=1), all_emulated(np.zeros((0,))))
    [ True False] True
    """
    return np.asarray(_reduce_emulated("all", x, axis, None, keepdims))


def prod_emulated(x: Array, axis: Axis = None, dtype: DTypeLike | None = None, keepdims: bool = False) -> HostArray:
    """The bits :func:`cukern.prod` returns: x converted first to a ``dtype`` that NumPy multiplies in (a
    float or complex target), as cukern converts it; then the tree of :func:`reduction_tree` with correctly
    rounded products from the identity 1 in the accumulator dtype (float32 for half types; complex results in
    their own dtype, multiplied by :func:`_tree_complex_prod`, which keeps 1 + 0i exact), rounded once to the
    result dtype; integer products in int64, wrapping (any order gives those bits).

    Examples
    --------
    >>> from cukern.reference import prod_emulated
    >>> print(prod_emulated(np.array([1.5, 2.0, -4.0], np.float32)))
    -12.0
    """
    return _reduce_emulated("prod", x, axis, dtype, keepdims)


def _lse_ordered(a, b):
    """(m_hi, s_hi, m_lo, s_lo) of two (m, s) states, hi the operand of the larger m (or of a NaN m), as
    reduce.cu's merges order them."""
    am, as_ = a
    bm, bs = b
    swap = (bm > am) | np.isnan(bm)
    return np.where(swap, bm, am), np.where(swap, bs, as_), np.where(swap, am, bm), np.where(swap, as_, bs)


def _lse_merge(a, b):
    """reduce.cu's LogSumExp merge of (m, s) arrays, step for step: m the NaN-propagating maximum, s = s_hi +
    s_lo e^(m_lo - m_hi) (a NaN or -inf difference gives 0)."""
    with np.errstate(all="ignore"):
        hm, hs, lm, ls = _lse_ordered(a, b)
        return _tree_max(a[0], b[0]), hs + ls * _exp_nonpositive(lm - hm)


def _lse_tree(w):
    """The tree of :func:`reduction_tree` over the last axis of ``w`` (values in the accumulator dtype) with
    states (m, s): the chains' states (:func:`_lse_chains`) merged by :func:`_lse_merge`."""
    return _upper_tree(_lse_chains(w), _lse_merge, (-np.inf, 0))


def _lse_chains(w):
    """Each chain's (m, s) over the last axis of ``w`` (rows, n), as reduce.cu ``chain_state`` forms it: m
    the NaN-propagating maximum of its present values, (m, 1) for an infinite or NaN m (nothing later
    reads such an s but for s != 0), else s = the sum, left to right, of :func:`_exp_nonpositive` (value -
    m); an empty chain the identity (-inf, 0). Arrays (rows, chains), chains in order 32 k + c."""
    v, count = _chain_elements(w, -np.inf)
    t = w.dtype.type
    with np.errstate(all="ignore"):
        hi = v[..., 0]
        for m in range(1, v.shape[-1]):
            hi = np.where(m < count, _tree_max(hi, v[..., m]), hi)
        finite = np.isfinite(hi)
        s = _exp_nonpositive(np.where(finite, v[..., 0] - hi, t(0)))
        for m in range(1, v.shape[-1]):
            s = np.where(m < count, s + _exp_nonpositive(np.where(finite, v[..., m] - hi, t(0))), s)
        s = np.where(finite, s, t(1))
        empty = count == 0
        return np.where(empty, t(-np.inf), hi), np.where(empty, t(0), s)


def _lse_weighted_chains(x, w):
    """Each chain's (m, s) over the last axis of ``x`` and ``w`` (rows, n; the accumulator dtype), as reduce.cu
    ``weighted_chain`` forms it: m the NaN-propagating maximum of the elements of non-zero weight (-inf for
    none), s the left-to-right sum from 0 of their terms, w for x = +inf, else w e^(x - m) (one product after
    :func:`_exp_nonpositive`). Past n a weight is 0: the element is dropped."""
    v, _ = _chain_elements(x, 0)
    g, _ = _chain_elements(w, 0)
    t = x.dtype.type
    keep = g != 0
    with np.errstate(all="ignore"):
        m = np.full(v.shape[:-1], t(-np.inf))
        for k in range(v.shape[-1]):
            m = np.where(keep[..., k], _tree_max(m, v[..., k]), m)
        s = np.zeros(v.shape[:-1], x.dtype)
        for k in range(v.shape[-1]):
            term = np.where(v[..., k] == np.inf, g[..., k], g[..., k] * _exp_nonpositive(v[..., k] - m))
            s = np.where(keep[..., k], s + term, s)
    return m, s


def _lse_weighted_merge(a, b):
    """reduce.cu's WeightedLse merge of (m, s) arrays, or of (m, s_re, s_im) for complex sums (each part as a
    real s): :func:`_lse_merge`, but two maxima of +inf add their sums (a factor 1 in place of the exp's 0)."""
    with np.errstate(all="ignore"):
        swap = (b[0] > a[0]) | np.isnan(b[0])
        hi = tuple(np.where(swap, v, u) for u, v in zip(a, b))
        lo = tuple(np.where(swap, u, v) for u, v in zip(a, b))
        e = np.where((hi[0] == lo[0]) & (hi[0] == np.inf), hi[0].dtype.type(1), _exp_nonpositive(lo[0] - hi[0]))
        return (_tree_max(a[0], b[0]),) + tuple(h + u * e for h, u in zip(hi[1:], lo[1:]))


def _lse_weighted_finish(m, s, signed: bool):
    """reduce.cu ``finish_weighted``: (m + log|s|, sign(s)) in the accumulator dtype, NaN for a NaN m or s,
    (-inf, 0) for s == 0 but (NaN, NaN) there under m = +inf, +inf for m = +inf or an infinite s; without
    ``signed`` a negative s gives NaN."""
    t = m.dtype.type
    with np.errstate(all="ignore"):
        a = np.abs(s)
        ok = np.isfinite(m) & np.isfinite(a) & (a != 0)
        r = np.where(ok, m + _log_at_least_one(np.where(ok, a, t(1))), t(np.inf))
        g = np.where(s > 0, t(1), t(-1))
        zero = s == 0
        r = np.where(zero, np.where(m == np.inf, t(np.nan), t(-np.inf)), r)
        g = np.where(zero, np.where(m == np.inf, t(np.nan), t(0)), g)
        bad = np.isnan(m) | np.isnan(s)
        r, g = np.where(bad, t(np.nan), r), np.where(bad, t(np.nan), g)
        if not signed:
            r = np.where(g < 0, t(np.nan), r)
    return r, g


def logsumexp_weighted_emulated(x: Array, b: Array, axis: Axis = None, keepdims: bool = False,
                                return_sign: bool = False) -> HostArray | tuple[HostArray, HostArray]:
    """The bits :func:`cukern.logsumexp` returns with weights ``b``: x and b promoted to the result dtype
    (:func:`cukern.reduce_plan.weighted_dtype`) and broadcast; per output, the chains of
    :func:`reduction_tree` over its elements (C order over ``axis``) form (m, s) at once
    (:func:`_lse_weighted_chains`), merge up the tree by :func:`_lse_weighted_merge` and finish as
    :func:`_lse_weighted_finish`, rounded to the result dtype; an empty slice gives (-inf, -1). Returns the
    result, or (result, sign) with ``return_sign``.

    Examples
    --------
    >>> from cukern.reference import logsumexp_weighted_emulated
    >>> x = np.array([1.0, 1.0, 1.0], np.float32)
    >>> print(logsumexp_weighted_emulated(x, np.array([1.0, -1.0, -1.0], np.float32), return_sign=True))
    (array(1., dtype=float32), array(-1., dtype=float32))
    """
    import cukern.reduce_plan as P

    x, b = _numpy(x), _numpy(b)
    final = P.weighted_dtype(x.dtype, b.dtype)
    x, b = np.broadcast_arrays(_astype(x, final), _astype(b, final))
    axes = P.normalize_axis(axis, x.ndim)
    shape = P.result_shape(x.shape, axes, keepdims)
    n = int(np.prod([x.shape[i] for i in axes], dtype=np.int64))
    if n == 0:
        r = np.full(shape, -np.inf, final)
        return (r, np.full(shape, -1, final)) if return_sign else r
    kept = [i for i in range(x.ndim) if i not in axes]
    a = P.acc_dtype(final)
    v = np.transpose(x, kept + list(axes)).reshape(-1, n).astype(a)
    g = np.transpose(b, kept + list(axes)).reshape(-1, n).astype(a)
    m, s = _upper_tree(_lse_weighted_chains(v, g), _lse_weighted_merge, (-np.inf, 0))
    r, sign = _lse_weighted_finish(m, s, return_sign)
    r = _astype(r, final).reshape(shape)
    return (r, _astype(sign, final).reshape(shape)) if return_sign else r


def _lse_complex_chains(x, w):
    """Each chain's (m, s_re, s_im) over the last axis of complex ``x`` (rows, n) and its weights ``w`` (complex,
    or None: no weights), as reduce.cu ``complex_chain`` forms it: m the NaN-propagating maximum of the real
    parts of the kept elements (those below n, and of non-zero weight), s the left-to-right sum from 0 of their
    terms w e^(x_re - m) (cos x_im, sin x_im) (:func:`_cis`; each product rounded once, the weight's by the
    textbook complex product): w (cos, sin) for x_re = +inf, 0 (times w) for x_re = -inf whatever x_im is."""
    v, count = _chain_elements(x, 0)
    t = x.real.dtype.type
    if w is None:
        keep = np.arange(v.shape[-1]) < count[:, None]
        keep = np.broadcast_to(keep, v.shape)
    else:
        g, _ = _chain_elements(w, 0)
        keep = g != 0
    re, im = v.real, v.imag
    with np.errstate(all="ignore"):
        m = np.full(v.shape[:-1], t(-np.inf))
        for k in range(v.shape[-1]):
            m = np.where(keep[..., k], _tree_max(m, re[..., k]), m)
        sr, si = np.zeros(v.shape[:-1], t), np.zeros(v.shape[:-1], t)
        for k in range(v.shape[-1]):
            r = re[..., k]
            c, sn = _cis(np.where(r == -np.inf, t(0), im[..., k]))
            e = np.where(r == np.inf, t(1), _exp_nonpositive(r - m))
            tr, ti = e * c, e * sn
            if w is not None:
                gr, gi = g[..., k].real, g[..., k].imag
                tr, ti = gr * tr - gi * ti, gr * ti + gi * tr
            sr = np.where(keep[..., k], sr + tr, sr)
            si = np.where(keep[..., k], si + ti, si)
    return m, sr, si


def _lse_complex_finish(m, sr, si):
    """reduce.cu ``finish_complex``: (real part, imaginary part, sign's real part, sign's imaginary part) of
    states (m, s_re, s_im). NaN (every part) for a NaN in m or s, or s == 0 under m = +inf; (-inf, 0, 0, 0) for
    s == 0; else m + log|s| (+inf for m = +inf or an infinite part of s, whose direction then stands for s:
    each infinite part as +-1, a finite one beside it as 0), the phase atan2(s_im, s_re) in (-pi, pi] and
    the sign s / |s| (:func:`_phase`, :func:`_log_abs`)."""
    t = m.dtype.type
    with np.errstate(all="ignore"):
        bad = np.isnan(m) | np.isnan(sr) | np.isnan(si)
        zero = (sr == 0) & (si == 0)
        wide = np.isinf(sr) | np.isinf(si)
        dr = np.where(wide, np.where(np.isinf(sr), np.copysign(t(1), sr), t(0)), sr)
        di = np.where(wide, np.where(np.isinf(si), np.copysign(t(1), si), t(0)), si)
        ok = ~bad & ~zero
        dr, di = np.where(ok, dr, t(1)), np.where(ok, di, t(0))
        log_abs, (ur, ui), gr, gi = _log_abs(dr, di)
        re = np.where(wide | (m == np.inf), t(np.inf), m + log_abs)
        im = _phase(ur, ui)
        nan = bad | (zero & (m == np.inf))
        parts = []
        for v, z in ((re, -np.inf), (im, 0), (gr, 0), (gi, 0)):
            parts.append(np.where(nan, t(np.nan), np.where(zero, t(z), v)))
    return tuple(parts)


def logsumexp_complex_emulated(x: Array, b: Array | None = None, axis: Axis = None, keepdims: bool = False,
                               return_sign: bool = False) -> HostArray | tuple[HostArray, HostArray]:
    """The bits :func:`cukern.logsumexp` returns for a complex result: complex ``x``, or weights ``b`` that make
    the result complex (:func:`cukern.reduce_plan.weighted_dtype`; x and b converted to it and broadcast). Per
    output, the chains of :func:`reduction_tree` over its elements (C order over ``axis``) form (m, s) at once
    (:func:`_lse_complex_chains`: m the maximum of the real parts, s the complex sum of w e^(x - m) with
    cukern's own exp, cos and sin), merge up the tree by :func:`_lse_weighted_merge` and finish as
    :func:`_lse_complex_finish`. Returns the complex log (its imaginary part in (-pi, pi]), or with
    ``return_sign`` (``log|sum|`` in the parts' dtype, the sign ``sum / |sum|``); an empty slice gives -inf
    (+0j) and the sign -1 + 0j, as SciPy's.

    Examples
    --------
    >>> from cukern.reference import logsumexp_complex_emulated
    >>> print(logsumexp_complex_emulated(np.array([0, 1j * np.pi / 2], np.complex128)))
    (0.34657359027997264+0.7853981633974483j)
    >>> r, sign = logsumexp_complex_emulated(np.array([1, 1, 1], np.complex64), np.array([1, -1, -1]),
    ...                                      return_sign=True)
    >>> print(r, sign)
    1.0 (-1+0j)
    """
    import cukern.reduce_plan as P

    x = _numpy(x)
    final = x.dtype if b is None else P.weighted_dtype(x.dtype, _numpy(b).dtype)
    if final.kind != "c":
        raise ValueError(f"x ({x.dtype}) and b give a {final} result; logsumexp_complex_emulated takes complex ones")
    x = _astype(x, P.real_of(final)).astype(final) if x.dtype.kind != "c" else x.astype(final)
    w = None
    if b is not None:
        b = _numpy(b)
        b = _astype(b, P.real_of(final)).astype(final) if b.dtype.kind != "c" else b.astype(final)
        x, w = np.broadcast_arrays(x, b)
    axes = P.normalize_axis(axis, x.ndim)
    shape = P.result_shape(x.shape, axes, keepdims)
    part = P.real_of(final)
    n = int(np.prod([x.shape[i] for i in axes], dtype=np.int64))
    if n == 0:
        r = np.full(shape, -np.inf, part if return_sign else final)
        return (r, np.full(shape, -1, final)) if return_sign else r
    kept = [i for i in range(x.ndim) if i not in axes]
    order = kept + list(axes)
    v = np.transpose(x, order).reshape(-1, n)
    g = None if w is None else np.transpose(w, order).reshape(-1, n)
    m, sr, si = _upper_tree(_lse_complex_chains(v, g), _lse_weighted_merge, (-np.inf, 0, 0))
    re, im, gr, gi = _lse_complex_finish(m, sr, si)

    def joined(u, v):
        z = np.empty(u.shape, final)
        z.real, z.imag = u, v
        return z.reshape(shape)

    if return_sign:
        return re.reshape(shape), joined(gr, gi)
    return joined(re, im)


def logsumexp_emulated(x: Array, axis: Axis = None, keepdims: bool = False) -> HostArray:
    """The bits :func:`cukern.logsumexp` returns: the values in the accumulator dtype (float32 for float32
    and half types, float64 for float64; integer and bool x converted to float64); each chain of
    :func:`reduction_tree` forms its (max m, sum of exp(x - m)) at once with cukern's own exp
    (:func:`_lse_tree`: one exp an element), and the chains merge up the tree by reduce.cu's LogSumExp
    merge (:func:`_lse_merge`); then m + log(s) with cukern's own log, rounded to the result dtype; -inf for an
    empty or all -inf slice, m itself for an infinite or NaN m. A one-element slice is copied.

    Examples
    --------
    >>> from cukern.reference import logsumexp_emulated
    >>> print(logsumexp_emulated(np.array([0.0, 0.0], np.float32)), logsumexp_emulated(np.array([], np.float32)))
    0.6931472 -inf
    """
    import cukern.reduce_plan as P

    x = _numpy(x)
    if x.dtype.kind in "biu":
        x = x.astype(np.float64)
    axes = P.normalize_axis(axis, x.ndim)
    final = x.dtype
    shape = P.result_shape(x.shape, axes, keepdims)
    n = int(np.prod([x.shape[i] for i in axes], dtype=np.int64))
    if n == 0:
        return np.full(shape, -np.inf, final)
    kept = [i for i in range(x.ndim) if i not in axes]
    v = np.transpose(x, kept + list(axes)).reshape(-1, n)
    if n == 1:
        return v[:, 0].astype(final).reshape(shape)
    a = P.acc_dtype(final)
    w = v.astype(a)
    with np.errstate(all="ignore"):
        m, s = _lse_tree(w)
        finite = np.isfinite(m) & (s != 0)
        r = np.where(finite, m + _log_at_least_one(np.where(finite, s, np.ones_like(s))), m)
        r = np.where(s == 0, np.array(-np.inf, a), r)
    return r.astype(final).reshape(shape)
