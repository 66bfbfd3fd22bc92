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


def rope_frequency(j, rotary_dim, base=10000.0, scaling=None, max_position=None):
    """Angular frequency of pair ``j`` (float), one pair at a time from the published per-model formulas
    (HF transformers ``_compute_*_rope_parameters``): plain ``base^(-2j/rot)``, then linear (divided by
    factor), dynamic NTK (base stretched for ``max(max_position, original)`` positions), Llama 3 (long
    wavelengths divided by factor, short ones kept, a linear blend between) or YaRN (a ramp between
    interpolated and extrapolated over the correction range)."""
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
    return freq


def rope_attention_factor(scaling=None):
    """YaRN's factor on cos and sin (1 for every other scaling): given ``attention_factor``, else
    ``m(factor, mscale) / m(factor, mscale_all_dim)`` when both are set, else ``m(factor, 1)``, with
    ``m(s, k) = 0.1 k ln(s) + 1`` for ``s > 1`` and 1 otherwise."""
    import math

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
    a = rope_attention_factor(scaling)
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
