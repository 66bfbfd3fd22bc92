"""Float64 references: the definitions the kernels are tested and benchmarked against.

They take NumPy arrays, or CuPy arrays (then they compute in float64 on the GPU, which keeps tests on
large shapes fast); the arithmetic is the textbook formula, independent of the kernels' structure.
Where a kernel promises its exact bits, an emulator (``*_emulated``, NumPy on the host) repeats its
roundings in its order, so tests compare bits rather than tolerances.
"""

from __future__ import annotations

import numpy as np


def _xp(a):
    if type(a).__module__.split(".")[0] == "cupy":
        import cupy

        return cupy
    return np


def _f64(a):
    return None if a is None else _xp(a).asarray(a).astype(np.float64)


def rms_norm(x, weight=None, eps=1e-6, offset=0.0):
    """``x / sqrt(mean(x**2, -1) + eps) * (offset + weight)`` in float64. Reads x, weight; writes out."""
    xp = _xp(x)
    x = _f64(x)
    w = 1.0 if weight is None else _f64(weight)
    return x / xp.sqrt(xp.mean(x * x, axis=-1, keepdims=True) + eps) * (offset + w)


def fused_add_rms_norm(x, residual, weight=None, eps=1e-6, offset=0.0):
    """``(new_residual, out)``: residual + x rounded to residual's dtype (as the kernel stores it), then
    the RMSNorm of that. Reads x, residual, weight; writes residual, out."""
    r = (_f64(residual) + _f64(x)).astype(residual.dtype)
    return r, rms_norm(r, weight, eps, offset)


def rms_norm_sum_of_squares_emulated(x):
    """The float32 sum of squares of each row of ``x`` (a float32 NumPy array, reduced over its last axis) in
    the one tree every :func:`cukern.rms_norm` launch computes: with ``C = cukern.rmsnorm.tree_classes(hidden)``,
    class c holds the elements ``i % C == c`` and sums their squares in index order; the C class sums are
    then added pairwise, neighbours first, up a perfect binary tree. Every product and sum is one float32
    rounding (NumPy never fuses a multiply-add). It depends on the values and ``hidden`` alone."""
    from .rmsnorm import tree_classes

    hidden = x.shape[-1]
    c = tree_classes(hidden)
    part = np.zeros(x.shape[:-1] + (c,), np.float32)
    for start in range(0, hidden, c):
        chunk = x[..., start:start + c]
        part[..., :chunk.shape[-1]] += chunk * chunk  # an empty class slot adds 0: its sum stays +0
    while part.shape[-1] > 1:
        part = part[..., 0::2] + part[..., 1::2]
    return part[..., 0]


def rms_norm_emulated(x, weight=None, eps=1e-6, offset=0.0):
    """The bits :func:`cukern.rms_norm` writes, as a NumPy array of x's dtype, from nothing but the values,
    the dtypes, ``eps`` and ``offset`` (no launch parameter exists here to pass): ``ss`` from
    :func:`rms_norm_sum_of_squares_emulated` on x widened to float32, ``inv = 1 / sqrt(ss / hidden + eps)``
    one correctly rounded float32 step at a time, ``out = (x * inv) * (offset + weight)`` in float32
    (weight None: 1), rounded once to the dtype (to nearest, ties to even). NaN inputs give NaN, whose
    payload may differ from the GPU's. Reads x, weight; writes out."""
    x = _numpy(x)
    v = x.astype(np.float32)
    ss = rms_norm_sum_of_squares_emulated(v)
    one = np.float32(1)
    inv = one / np.sqrt(ss / np.float32(v.shape[-1]) + np.float32(float(eps)))
    w = one if weight is None else _numpy(weight).astype(np.float32)
    return ((v * inv[..., None]) * (np.float32(float(offset)) + w)).astype(x.dtype)


def fused_add_rms_norm_emulated(x, residual, weight=None, eps=1e-6, offset=0.0):
    """``(new_residual, out)`` as :func:`cukern.fused_add_rms_norm` writes them: ``residual + x`` added in
    float32 and rounded once to residual's dtype (the correctly rounded sum: float32 carries more than twice
    the bits of a 16-bit type), then :func:`rms_norm_emulated` of that rounded residual."""
    residual = _numpy(residual)
    r = (residual.astype(np.float32) + _numpy(x).astype(np.float32)).astype(residual.dtype)
    return r, rms_norm_emulated(r, weight, eps, offset)


def rope_frequency(j, rotary_dim, base=10000.0, scaling=None, max_position=None):
    """Angular frequency of pair ``j`` (float), one pair at a time from the published per-model formulas
    (HF transformers ``_compute_*_rope_parameters``): plain ``base^(-2j/rot)``, then linear (divided by
    factor), dynamic NTK (base stretched for ``max(max_position, original)`` positions), Llama 3 (long
    wavelengths divided by factor, short ones kept, a linear blend between; Llama 4's equal low and high
    factors leave no blend), YaRN (a ramp between interpolated and extrapolated over the correction range)
    or LongRoPE (divided by the pair's entry of long_factor past the original length, else short_factor)."""
    import math

    kind = None if scaling is None else scaling["type"]
    rot = rotary_dim
    if kind == "dynamic_ntk":
        factor, orig = scaling["factor"], scaling["original_max_position"]
        seen = max(max_position, orig)
        base = base * ((factor * seen / orig) - (factor - 1)) ** (rot / (rot - 2))
    freq = base ** (-2.0 * j / rot)
    if kind == "linear":
        return freq / scaling["factor"]
    if kind == "llama3":
        factor, orig = scaling["factor"], scaling["original_max_position"]
        low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
        wavelength = 2 * math.pi / freq
        if wavelength < orig / high:
            return freq
        if wavelength > orig / low:
            return freq / factor
        if low == high:
            return freq
        s = (orig / wavelength - low) / (high - low)
        return (1 - s) * freq / factor + s * freq
    if kind == "yarn":
        factor, orig = scaling["factor"], scaling["original_max_position"]

        def dim_for(rotations):
            # the pair index whose wavelength fits `rotations` turns into the original context
            return rot * math.log(orig / (rotations * 2 * math.pi)) / (2 * math.log(base))

        lo = dim_for(scaling.get("beta_fast", 32.0))
        hi = dim_for(scaling.get("beta_slow", 1.0))
        if scaling.get("truncate", True):
            lo, hi = math.floor(lo), math.ceil(hi)
        lo, hi = max(lo, 0), min(hi, rot - 1)
        if hi == lo:
            hi = hi + 0.001
        ramp = min(1.0, max(0.0, (j - lo) / (hi - lo)))
        return ramp * (freq / factor) + (1 - ramp) * freq
    if kind == "longrope":
        long = max_position > scaling["original_max_position"]
        return freq / scaling["long_factor" if long else "short_factor"][j]
    return freq


def rope_attention_factor(scaling=None, max_position=None):
    """The factor on cos and sin, 1 but for YaRN and LongRoPE. YaRN: given ``attention_factor``, else
    ``m(factor, mscale) / m(factor, mscale_all_dim)`` when both are set, else ``m(factor, 1)``, with
    ``m(s, k) = 0.1 k ln(s) + 1`` for ``s > 1`` and 1 otherwise. LongRoPE: given ``attention_factor``, else
    ``long_mscale`` past the original length or ``short_mscale`` within it, else
    ``sqrt(1 + ln(s) / ln(original))`` for ``s = factor`` (default ``max_position / original``) above 1."""
    import math

    if scaling is not None and scaling["type"] == "longrope":
        orig = scaling["original_max_position"]
        mscale = "long_mscale" if max_position > orig else "short_mscale"
        for key in ("attention_factor", mscale):
            if scaling.get(key) is not None:
                return float(scaling[key])
        s = scaling.get("factor", max_position / orig)
        return math.sqrt(1 + math.log(s) / math.log(orig)) if s > 1 else 1.0
    if scaling is None or scaling["type"] != "yarn":
        return 1.0
    if scaling.get("attention_factor") is not None:
        return float(scaling["attention_factor"])
    factor = scaling["factor"]

    def m(k):
        return 0.1 * k * math.log(factor) + 1.0 if factor > 1 else 1.0

    if scaling.get("mscale") and scaling.get("mscale_all_dim"):
        return m(scaling["mscale"]) / m(scaling["mscale_all_dim"])
    return m(1.0)


def rope_cache(max_position, rotary_dim, base=10000.0, scaling=None):
    """``[max_position, rotary_dim]`` float64: row p is ``a cos(p w_j)`` for each pair j, then ``a sin(p w_j)``
    (``w_j = rope_frequency(j)``, ``a = rope_attention_factor``)."""
    half = rotary_dim // 2
    w = np.array([rope_frequency(j, rotary_dim, base, scaling, max_position) for j in range(half)])
    a = rope_attention_factor(scaling, max_position)
    out = np.empty((max_position, rotary_dim))
    for j in range(half):
        angle = np.arange(max_position, dtype=np.float64) * w[j]
        out[:, j] = a * np.cos(angle)
        out[:, half + j] = a * np.sin(angle)
    return out


def rotary_embedding(positions, query, key, cos_sin_cache, is_neox=True, rotary_dim=None, inverse=False):
    """``(query, key)`` rotated, as float64 copies (key None stays None). Pair j of every head is
    ``(j, j + rot/2)`` (NeoX) or ``(2j, 2j + 1)`` (GPT-J), turned by ``cache[p, j]`` (cos) and
    ``cache[p, W/2 + j]`` (sin, negated when inverse). Tokens whose position is outside the cache are left
    as they are. Reads q, k, one cache row and one position per token; writes q, k."""
    cache = _f64(cos_sin_cache)
    positions = np.asarray(positions).astype(np.int64)
    width = cache.shape[1]
    rot = width if rotary_dim is None else rotary_dim
    half = rot // 2
    j = np.arange(half)
    first, second = (j, j + half) if is_neox else (2 * j, 2 * j + 1)
    ok = (positions >= 0) & (positions < cache.shape[0])
    rows = cache[positions[ok]]
    cos = rows[:, None, :half]
    sin = rows[:, None, width // 2:width // 2 + half] * (-1.0 if inverse else 1.0)

    out = []
    for x in (query, key):
        if x is None:
            out.append(None)
            continue
        x = _f64(x).copy()
        a, b = x[ok][:, :, first], x[ok][:, :, second]
        turned = x[ok]
        turned[:, :, first] = a * cos - b * sin
        turned[:, :, second] = b * cos + a * sin
        x[ok] = turned
        out.append(x)
    return tuple(out)


def _numpy(a):
    return a.get() if type(a).__module__.split(".")[0] == "cupy" else np.asarray(a)


def rotary_embedding_emulated(positions, query, key, cos_sin_cache, is_neox=True, rotary_dim=None, inverse=False):
    """The bits :func:`cukern.rotary_embedding` writes, as NumPy copies in query's dtype (key None stays
    None): the pairs of :func:`rotary_embedding` widened to float32, ``x c - y s`` and ``y c + x s`` with
    every product and sum rounded to float32 in that order (NumPy never fuses a multiply-add), then rounded
    once to the dtype. Tokens whose position is outside the cache are left as they are."""
    cache = _numpy(cos_sin_cache).astype(np.float32)
    positions = _numpy(positions).astype(np.int64)
    width = cache.shape[1]
    half = (width if rotary_dim is None else rotary_dim) // 2
    j = np.arange(half)
    first, second = (j, j + half) if is_neox else (2 * j, 2 * j + 1)
    ok = (positions >= 0) & (positions < cache.shape[0])
    rows = cache[positions[ok]]
    cos = rows[:, None, :half]
    sin = rows[:, None, width // 2:width // 2 + half]
    if inverse:
        sin = -sin
    out = []
    for v in (query, key):
        if v is None:
            out.append(None)
            continue
        v = _numpy(v).copy()
        turned = v[ok]
        a, b = turned[:, :, first].astype(np.float32), turned[:, :, second].astype(np.float32)
        turned[:, :, first] = (a * cos - b * sin).astype(v.dtype)
        turned[:, :, second] = (b * cos + a * sin).astype(v.dtype)
        v[ok] = turned
        out.append(v)
    return tuple(out)


# Reductions (cukern.reduce). Each reads x once and writes one value per kept position. Values are
# upcast before reducing: float64 for floats, int64 for integers, so the reference is exact for integers
# and within a few float64 ulps otherwise.


def _wide(x):
    x = np.asarray(x)
    return x.astype(np.int64) if x.dtype.kind in "biu" else x.astype(np.float64)


def reduce_sum(x, axis=None, keepdims=False):
    """``sum(x)`` over ``axis`` in int64 (integers, bool) or float64."""
    return np.sum(_wide(x), axis=axis, keepdims=keepdims)


def reduce_mean(x, axis=None, keepdims=False):
    """``sum(x) / count`` in float64."""
    return np.mean(_wide(x).astype(np.float64), axis=axis, keepdims=keepdims)


def reduce_sum_of_squares(x, axis=None, keepdims=False):
    """``sum(x * x)``, squares taken in int64 or float64."""
    w = _wide(x)
    return np.sum(w * w, axis=axis, keepdims=keepdims)


def reduce_norm(x, axis=None, keepdims=False):
    """``sqrt(sum(x * x))`` in float64."""
    w = _wide(x).astype(np.float64)
    return np.sqrt(np.sum(w * w, axis=axis, keepdims=keepdims))


def reduce_amax(x, axis=None, keepdims=False):
    """Maximum; NaN if any element is NaN."""
    return np.max(_wide(x), axis=axis, keepdims=keepdims)


def reduce_amin(x, axis=None, keepdims=False):
    """Minimum; NaN if any element is NaN."""
    return np.min(_wide(x), axis=axis, keepdims=keepdims)


def reduction_tolerance(n: int, acc_dtype, abs_sum: float) -> float:
    """Absolute error allowed for a sum of ``n`` terms accumulated in ``acc_dtype`` whose absolute values
    add to ``abs_sum``. Worst-case recursive summation grows with the longest sequential chain (up to a few
    thousand terms a thread in the kernels); rounding errors of random data add up like a random walk, so
    the bound charges ``eps`` per tree level (log2 n) plus ``sqrt(n) / 16`` for the sequential chains, with
    a floor of 4. Integer accumulators are exact: 0."""
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


def _tree_max(a, b):
    """reduce.cu's Max: a NaN operand gives a NaN; of two equal values +0 over -0; commutative."""
    out = np.where(a > b, a, np.where(b > a, b, np.where(np.signbit(a), b, a)))
    if out.dtype.kind == "f":
        out = np.where(np.isnan(a) | np.isnan(b), a + b, out)
    return out


def _tree_min(a, b):
    out = np.where(a < b, a, np.where(b < a, b, np.where(np.signbit(a), a, b)))
    if out.dtype.kind == "f":
        out = np.where(np.isnan(a) | np.isnan(b), a + b, out)
    return out


def reduction_tree(v, combine=_tree_sum, identity=0):
    """The tree over the last axis of ``v`` (values already lifted into the accumulator dtype), one result
    per leading position: leaves of 256 elements, in each 32 chains (chain c: elements c, c + 32, ... of the
    leaf, added one after another into ``identity``), then the chains in order paired with their neighbours
    up a perfect binary tree, the count padded with ``identity``."""
    from .reduce_plan import TREE_CHAIN_LENGTH, TREE_CHAINS, TREE_LEAF

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
        p = chain.reshape(v.shape[0], -1)
        size = 1 << (p.shape[1] - 1).bit_length()
        if size != p.shape[1]:
            p = np.concatenate([p, np.full((p.shape[0], size - p.shape[1]), fill, p.dtype)], axis=1)
        while p.shape[1] > 1:
            p = combine(p[:, 0::2], p[:, 1::2])
    return p[:, 0].reshape(lead)


def _reduce_emulated(name: str, x, axis, dtype, keepdims: bool):
    from . import reduce_plan as P

    x = _numpy(x)
    op = P.OPS[name]
    axes = P.normalize_axis(axis, x.ndim)
    final = P.result_dtype(name, x.dtype, dtype)
    shape = P.result_shape(x.shape, axes, keepdims)
    n = int(np.prod([x.shape[i] for i in axes], dtype=np.int64))
    if n == 0:
        if op.minmax:
            raise ValueError(f"zero-size array to reduction operation {name} which has no identity")
        return np.full(shape, np.nan if op.finalize == P.FINISH_DIVIDE else 0, final)
    kept = [i for i in range(x.ndim) if i not in axes]
    v = np.transpose(x, kept + list(axes)).reshape(-1, n)  # C order over the reduced axes
    if n == 1:
        # cukern reduces size-1 axes elementwise, in the result dtype: no tree, no chain to start from +0.
        r = v[:, 0].astype(final)
        if op.finalize == P.FINISH_SQRT:
            r = np.abs(r)
        elif op.kernel_op == P.OP_SUMSQ:
            r = r * r
        return r.reshape(shape)
    o = x.dtype if op.minmax else final
    a = P.acc_dtype(o)
    w = v.astype(a)
    if op.kernel_op == P.OP_SUMSQ:
        w = w * w
    if op.kernel_op == P.OP_MAX:
        acc = w.max(axis=1) if a.kind == "i" else reduction_tree(w, _tree_max, -np.inf)
    elif op.kernel_op == P.OP_MIN:
        acc = w.min(axis=1) if a.kind == "i" else reduction_tree(w, _tree_min, np.inf)
    else:
        acc = w.sum(axis=1, dtype=a) if a.kind == "i" else reduction_tree(w)  # integers: exact, wrapping
    if op.finalize != P.FINISH_NONE:
        d = acc.astype(np.float64)
        acc = d / np.float64(n) if op.finalize == P.FINISH_DIVIDE else np.sqrt(d)
    if o.itemsize == 2 and acc.dtype == np.float64:
        acc = acc.astype(np.float32)  # the kernels round a double result to float, then to the half type
    return acc.astype(o).astype(final).reshape(shape)


def sum_emulated(x, axis=None, dtype=None, keepdims=False):
    """The bits :func:`cukern.sum` returns, as a NumPy array, computed on the host: x (any array; a CuPy
    array is copied to the host) converted to the accumulator dtype (float32 for float32 and half-type
    results, float64 for float64, int64 for integer results), each result the tree of
    :func:`reduction_tree` over its elements in C order over ``axis`` (integer sums exactly, wrapping),
    rounded once to the result dtype. An axis of one element is copied, as cukern does it. NaN payloads
    may differ from the GPU's."""
    return _reduce_emulated("sum", x, axis, dtype, keepdims)


def mean_emulated(x, axis=None, dtype=None, keepdims=False):
    """The bits :func:`cukern.mean` returns: the tree's sum in the accumulator dtype, widened to float64,
    divided by the count (one IEEE division), rounded to the result dtype (through float32 for half
    types, as the kernels store it)."""
    return _reduce_emulated("mean", x, axis, dtype, keepdims)


def sum_of_squares_emulated(x, axis=None, dtype=None, keepdims=False):
    """The bits :func:`cukern.sum_of_squares` returns: each value squared in the accumulator dtype (one
    rounding), then :func:`sum_emulated`'s tree."""
    return _reduce_emulated("sum_of_squares", x, axis, dtype, keepdims)


def norm_emulated(x, axis=None, dtype=None, keepdims=False):
    """The bits :func:`cukern.norm` returns: :func:`sum_of_squares_emulated`'s sum widened to float64, its
    correctly rounded square root, rounded to the result dtype."""
    return _reduce_emulated("norm", x, axis, dtype, keepdims)


def amax_emulated(x, axis=None, dtype=None, keepdims=False):
    """The bits :func:`cukern.amax` returns: the tree with reduce.cu's commutative max (NaN if any element
    is NaN, +0 over -0), converted to ``dtype`` when given."""
    return _reduce_emulated("amax", x, axis, dtype, keepdims)


def amin_emulated(x, axis=None, dtype=None, keepdims=False):
    """The bits :func:`cukern.amin` returns: as :func:`amax_emulated`, with min (-0 over +0)."""
    return _reduce_emulated("amin", x, axis, dtype, keepdims)
