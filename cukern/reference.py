"""Float64 references: the definitions the kernels are tested and benchmarked against.

They take NumPy arrays, or CuPy arrays (then they compute in float64 on the GPU, which keeps tests on
large shapes fast); the arithmetic is the textbook formula, independent of the kernels' structure.
Where a kernel promises its exact bits, an emulator (``*_emulated``, NumPy on the host) repeats its
roundings in its order, so tests compare bits rather than tolerances.
"""

from __future__ import annotations

import functools
import warnings

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


def _rms_inv(v, eps):
    """``inv = 1 / sqrt(ss / hidden + eps)`` of float32 rows ``v``, one correctly rounded float32 step at a
    time, ``ss`` from :func:`rms_norm_sum_of_squares_emulated` (an empty row's is 0)."""
    ss = rms_norm_sum_of_squares_emulated(v) if v.shape[-1] else np.zeros(v.shape[:-1], np.float32)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return np.float32(1) / np.sqrt(ss / np.float32(v.shape[-1]) + np.float32(float(eps)))


def rms_norm_emulated(x, weight=None, eps=1e-6, offset=0.0):
    """The bits :func:`cukern.rms_norm` writes, as a NumPy array of x's dtype, from nothing but the values,
    the dtypes, ``eps`` and ``offset`` (no launch parameter exists here to pass): ``ss`` from
    :func:`rms_norm_sum_of_squares_emulated` on x widened to float32, ``inv = 1 / sqrt(ss / hidden + eps)``
    one correctly rounded float32 step at a time, ``out = (x * inv) * (offset + weight)`` in float32
    (weight None: 1), rounded once to the dtype (to nearest, ties to even). NaN inputs give NaN, whose
    payload may differ from the GPU's. Reads x, weight; writes out."""
    x = _numpy(x)
    v = x.astype(np.float32)
    inv = _rms_inv(v, eps)
    w = np.float32(1) if weight is None else _numpy(weight).astype(np.float32)
    return ((v * inv[..., None]) * (np.float32(float(offset)) + w)).astype(x.dtype)


def fused_add_rms_norm_emulated(x, residual, weight=None, eps=1e-6, offset=0.0):
    """``(new_residual, out)`` as :func:`cukern.fused_add_rms_norm` writes them: ``residual + x`` added in
    float32 and rounded once to residual's dtype (the correctly rounded sum: float32 carries more than twice
    the bits of a 16-bit type), then :func:`rms_norm_emulated` of that rounded residual."""
    residual = _numpy(residual)
    r = (residual.astype(np.float32) + _numpy(x).astype(np.float32)).astype(residual.dtype)
    return r, rms_norm_emulated(r, weight, eps, offset)


def float8_e4m3fn_bits(v):
    """The float8 e4m3fn byte of each float32 of ``v`` as the kernels write it, as ``uint8`` (NumPy, or CuPy
    for a CuPy ``v``): round to nearest even, saturate to +-448 (infinities too), every NaN 0x7f. The
    integer and float32 steps of cuda_src/rms_norm.cu ``e4m3_arithmetic``; for every non-NaN float the
    byte of ``ml_dtypes.float8_e4m3fn`` of ``clip(v, -448, 448)`` (tests/test_rmsnorm_fp8.py checks both)."""
    xp = _xp(v)
    v = xp.asarray(v, dtype=np.float32)
    a = xp.minimum(xp.abs(v), np.float32(448))  # NaN kept
    b = a.view(np.uint32)
    normal = (b - np.uint32(120 << 23) + np.uint32(0x7FFFF) + ((b >> 20) & np.uint32(1))) >> 20  # wraps below 2^-6
    with np.errstate(invalid="ignore"):  # a NaN's sum (its code comes from the normal branch)
        subnormal = (a + np.float32(16384)).view(np.uint32) - np.float32(16384).view(np.uint32)
    code = xp.where(a < np.float32(2.0**-6), subnormal, xp.minimum(normal, np.uint32(0x7F)))
    sign = (v.view(np.uint32) >> 24) & np.uint32(0x80)
    return xp.where(code == 0x7F, code, code | sign).astype(np.uint8)


FP8_MAX = 448.0
FP8_MIN_SCALE = 2.0**-126


def rms_norm_fp8_values_emulated(x, weight=None, eps=1e-6, offset=0.0, scale="per_token"):
    """``(v, s)``: the float32 values the float8 kernels convert to e4m3 and the scales, as
    :func:`rms_norm_fp8_emulated` defines them (``v = y * (1 / s)``)."""
    v = _numpy(x).astype(np.float32)
    inv = _rms_inv(v, eps)
    one = np.float32(1)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        w = one if weight is None else _numpy(weight).astype(np.float32)
        t = v * (np.float32(float(offset)) + w)
        if isinstance(scale, str):
            if t.shape[-1]:
                tmax = np.abs(t).max(axis=-1)
                s = np.maximum((tmax * inv) / np.float32(FP8_MAX), np.float32(FP8_MIN_SCALE)).astype(np.float32)
            else:  # an empty row (whose inv is NaN) has no amax: the least scale, as the op writes
                s = np.full(t.shape[:-1], FP8_MIN_SCALE, np.float32)
        else:
            s = np.float32(scale)
        r = one / np.asarray(s, np.float32)
        return (t * inv[..., None]) * (r[..., None] if isinstance(scale, str) else r), s


def rms_norm_fp8_emulated(x, weight=None, eps=1e-6, offset=0.0, scale="per_token"):
    """The bytes (and per-token scales) :func:`cukern.rms_norm` writes with ``out_dtype=float8_e4m3fn``, each
    step rounded to float32: ``inv`` as in :func:`rms_norm_emulated`, ``y = (x * (offset + weight)) * inv``
    (weight None: 1); ``s`` the static ``scale`` as float32, or per row ``max(amax / 448, 2^-126)`` with
    ``amax = max|x * (offset + weight)| * inv`` (NaN if any is NaN), which is the largest ``|y|`` (rounding
    is monotone) wherever ``inv`` is finite; ``q = float8_e4m3fn_bits(y * (1 / s))``. Returns ``q``
    (``uint8``), or ``(q, s)`` for ``scale="per_token"``."""
    v, s = rms_norm_fp8_values_emulated(x, weight, eps, offset, scale)
    with np.errstate(invalid="ignore"):
        q = float8_e4m3fn_bits(v)
    return (q, s) if isinstance(scale, str) else q


def fused_add_rms_norm_fp8_emulated(x, residual, weight=None, eps=1e-6, offset=0.0, scale="per_token"):
    """``(new_residual, q)`` or ``(new_residual, q, s)``: the residual of :func:`fused_add_rms_norm_emulated`,
    then :func:`rms_norm_fp8_emulated` of it."""
    residual = _numpy(residual)
    r = (residual.astype(np.float32) + _numpy(x).astype(np.float32)).astype(residual.dtype)
    out = rms_norm_fp8_emulated(r, weight, eps, offset, scale)
    return (r,) + out if isinstance(out, tuple) else (r, out)


def rms_norm_fp8(x, weight=None, eps=1e-6, offset=0.0, scale="per_token"):
    """The float64 reference of the float8 outputs, on the host: ``y`` = :func:`rms_norm` in float64, ``s`` the
    static scale or per row ``max(amax(|y|) / 448, 2^-126)`` in float64, and ml_dtypes' own float8_e4m3fn
    conversion of ``clip(y / s, -448, 448)``. Returns the bytes (``uint8``), or ``(bytes, s)`` per token."""
    import ml_dtypes

    y = _numpy(rms_norm(_numpy(x), None if weight is None else _numpy(weight), eps, offset))
    per_token = isinstance(scale, str)
    with np.errstate(invalid="ignore"):
        if per_token:
            amax = np.abs(y).max(axis=-1) if y.shape[-1] else np.zeros(y.shape[:-1])
            s = np.maximum(amax / FP8_MAX, FP8_MIN_SCALE)
            q = np.clip(y / s[..., None], -FP8_MAX, FP8_MAX)
        else:
            s = float(np.float32(scale))
            q = np.clip(y / s, -FP8_MAX, FP8_MAX)
    q = q.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    return (q, s) if per_token else q


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


def _odd_float64(v):
    """64-bit integers as float64 rounded to odd (toward zero, an inexact result's last bit set): the two
    32-bit halves added (each exact), the sum's error found exactly (Knuth's two-sum)."""
    hi = (v >> 32).astype(np.float64) * 2.0**32
    lo = (v & 0xFFFFFFFF).astype(np.float64)
    s = hi + lo
    t = s - hi
    err = (hi - (s - t)) + (lo - t)  # s + err is v exactly
    s = np.where((err != 0) & (np.signbit(err) != np.signbit(s)), np.nextafter(s, 0.0), s)  # past v: step back
    return (s.view(np.uint64) | (err != 0).astype(np.uint64)).view(np.float64)


def to_bfloat16(a):
    """float64 or integer values as bfloat16, rounded once as cuda_src/convert.cu rounds them (and NumPy with
    ml_dtypes 0.7; earlier ml_dtypes went through float32, two roundings): toward zero to float32 with an
    inexact result's last bit set (round to odd), then to nearest even. A 64-bit integer goes through float64
    rounded to odd too (float64's 53 bits hold float32's 24 and two more, so that step changes nothing), where a
    plain conversion would round it past 2^53."""
    from ._dtypes import BFLOAT16

    v = np.asarray(a)
    v = _odd_float64(v) if v.dtype.kind in "iu" and v.itemsize == 8 else v.astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        f = v.astype(np.float32)
        away = np.isfinite(v) & (np.abs(f.astype(np.float64)) > np.abs(v))  # nearest went past v: step back
        f = np.where(away, np.nextafter(f, np.float32(0)), f).astype(np.float32)
        odd = (f.astype(np.float64) != v) & ~np.isnan(v)
    return (f.view(np.uint32) | odd.astype(np.uint32)).view(np.float32).astype(BFLOAT16)


def _astype(a, dtype):
    """``a.astype(dtype)`` as cukern's own conversions make it on the GPU (cukern._convert): a float64 or
    integer value into bfloat16 by :func:`to_bfloat16`, everything else as NumPy converts."""
    from ._dtypes import BFLOAT16

    a, dtype = np.asarray(a), np.dtype(dtype)
    if dtype == BFLOAT16 and (a.dtype == np.float64 or a.dtype.kind in "iu"):
        return to_bfloat16(a)
    return a.astype(dtype)


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


def qk_norm_rope(positions, query, key, q_weight, k_weight, cos_sin_cache, eps=1e-6, offset=0.0, is_neox=True,
                 rotary_dim=None):
    """``(query, key)`` as float64 copies (key None stays None): each head RMS-normalized over head_size
    (:func:`rms_norm` with ``q_weight`` or ``k_weight``), then rotated (:func:`rotary_embedding`). Reads q, k,
    the weights, one cache row and one position per token; writes q, k."""
    q = rms_norm(query, q_weight, eps, offset)
    k = None if key is None else rms_norm(key, k_weight, eps, offset)
    return rotary_embedding(positions, q, k, cos_sin_cache, is_neox=is_neox, rotary_dim=rotary_dim)


def qk_norm_rope_emulated(positions, query, key, q_weight, k_weight, cos_sin_cache, eps=1e-6, offset=0.0,
                          is_neox=True, rotary_dim=None):
    """The bits :func:`cukern.qk_norm_rope` writes, as NumPy copies in query's dtype (key None stays None):
    :func:`rms_norm_emulated` over each head (rounded to the dtype), then :func:`rotary_embedding_emulated`
    of that. The fused kernel keeps exactly these two roundings, so it equals the two calls bit for bit."""
    q = rms_norm_emulated(query, q_weight, eps, offset)
    k = None if key is None else rms_norm_emulated(key, k_weight, eps, offset)
    return rotary_embedding_emulated(positions, q, k, cos_sin_cache, is_neox=is_neox, rotary_dim=rotary_dim)


def _rope_frequencies(rotary_dim, base, scaling, max_position):
    from .rope_cache import rope_frequencies

    return rope_frequencies(1 if max_position is None else max_position, rotary_dim, base, scaling)


def rotary_positions_cos_sin(positions, rotary_dim, base=10000.0, scaling=None, max_position=None):
    """``[tokens, rotary_dim]`` float32: the cos then sin values :func:`cukern.rotary_embedding_positions`
    computes for each token's position, bit for bit, on the host: cuda_src/rotary.cu ``cos_sin_at``'s float64
    steps (the exact product with the split frequency, the three-part reduction by pi / 2, the Taylor
    polynomials, the quadrant) one correctly rounded NumPy operation at a time, then ``a x`` rounded to
    float32."""
    from math import factorial

    from .rotary import PIO2_1, PIO2_2, PIO2_3, TWO_OVER_PI, top_bits

    w, a = _rope_frequencies(rotary_dim, base, scaling, max_position)
    w_hi = top_bits(w)
    w_lo = w - w_hi
    x = _numpy(positions).astype(np.float64)[:, None]
    a_hi, a_lo = x * w_hi, x * w_lo
    k = np.rint(a_hi * TWO_OVER_PI)
    r = ((a_hi - k * PIO2_1) - k * PIO2_2 + a_lo) - k * PIO2_3
    r2 = r * r
    sp = np.full_like(r, -1.0 / factorial(17))
    for n in (15, 13, 11, 9, 7, 5, 3):
        sp = (1.0 if n % 4 == 3 else -1.0) / factorial(n) + r2 * sp
    sin_r = r - (r * r2) * sp
    cp = np.full_like(r, 1.0 / factorial(18))
    for n in (16, 14, 12, 10, 8, 6, 4):
        cp = (1.0 if n % 4 == 2 else -1.0) / factorial(n) + r2 * cp
    cos_r = 1.0 - r2 * (0.5 + r2 * cp)
    quadrant = k.astype(np.int64) & 3
    c = np.choose(quadrant, [cos_r, -sin_r, -cos_r, sin_r])
    s = np.choose(quadrant, [sin_r, cos_r, -sin_r, -cos_r])
    return np.concatenate([(a * c).astype(np.float32), (a * s).astype(np.float32)], axis=1)


def rotary_embedding_positions(positions, query, key, rotary_dim, base=10000.0, scaling=None, is_neox=True,
                               max_position=None):
    """``(query, key)`` rotated as float64 copies by ``a cos(p w_j)``, ``a sin(p w_j)`` computed in float64
    (``p w_j`` rounded once: within ``|p w_j| 2^-53`` of the exact angle). Reads q, k, one position per token;
    writes q, k."""
    w, a = _rope_frequencies(rotary_dim, base, scaling, max_position)
    angle = _numpy(positions).astype(np.float64)[:, None] * w
    rows = np.concatenate([a * np.cos(angle), a * np.sin(angle)], axis=1)
    return rotary_embedding(np.arange(rows.shape[0]), query, key, rows, is_neox=is_neox)


def rotary_embedding_positions_emulated(positions, query, key, rotary_dim, base=10000.0, scaling=None,
                                        is_neox=True, max_position=None):
    """The bits :func:`cukern.rotary_embedding_positions` writes: :func:`rotary_embedding_emulated` with each
    token's row of :func:`rotary_positions_cos_sin` as its cache row."""
    rows = rotary_positions_cos_sin(positions, rotary_dim, base, scaling, max_position)
    return rotary_embedding_emulated(np.arange(rows.shape[0]), query, key, rows, is_neox=is_neox)


def mrope_rows(positions, cos_sin_cache, mrope_section, interleaved=False, rotary_dim=None):
    """``(rows, ok)``: for each token the ``rotary_dim`` cos then sin values multimodal RoPE turns its pairs by,
    pair j's from the cache row of ``positions[r(j), t]`` (``r(j)``: the section of ``mrope_section`` j falls
    in, contiguous or interleaved as :func:`cukern.rotary.mrope_sections` says), in the cache's dtype; ``ok``:
    the tokens whose three positions are all inside the cache (the others' rows are meaningless)."""
    cache = _numpy(cos_sin_cache)
    positions = _numpy(positions).astype(np.int64)
    width = cache.shape[1]
    half = (width if rotary_dim is None else rotary_dim) // 2
    j = np.arange(half)
    s0, s1, s2 = (int(s) for s in mrope_section)
    if interleaved:
        r = np.where((j % 3 == 1) & (j < 3 * s1), 1, np.where((j % 3 == 2) & (j < 3 * s2), 2, 0))
    else:
        r = np.where(j < s0, 0, np.where(j < s0 + s1, 1, 2))
    ok = np.all((positions >= 0) & (positions < cache.shape[0]), axis=0)
    p = np.where(ok, positions, 0)[r].T  # [tokens, half]: each pair's position
    return np.concatenate([cache[p, j], cache[p, width // 2 + j]], axis=1), ok


def rotary_embedding_mrope(positions, query, key, cos_sin_cache, mrope_section, interleaved=False, is_neox=True,
                           rotary_dim=None):
    """``(query, key)`` rotated by multimodal RoPE as float64 copies: :func:`rotary_embedding` with each token's
    :func:`mrope_rows` row; a token with a position outside the cache is left as it is."""
    rows, ok = mrope_rows(positions, cos_sin_cache, mrope_section, interleaved, rotary_dim)
    return rotary_embedding(np.where(ok, np.arange(rows.shape[0]), -1), query, key, rows, is_neox=is_neox)


def rotary_embedding_mrope_emulated(positions, query, key, cos_sin_cache, mrope_section, interleaved=False,
                                    is_neox=True, rotary_dim=None):
    """The bits :func:`cukern.rotary_embedding_mrope` writes: :func:`rotary_embedding_emulated` with each
    token's :func:`mrope_rows` row (the cache's own values, widened to float32 as the kernel widens them)."""
    rows, ok = mrope_rows(positions, cos_sin_cache, mrope_section, interleaved, rotary_dim)
    return rotary_embedding_emulated(np.where(ok, np.arange(rows.shape[0]), -1), query, key, rows, is_neox=is_neox)


# Reductions (cukern.reduce). Each reads x once and writes one value per kept position. Values are
# upcast before reducing: float64 for floats, int64 for integers, so the reference is exact for integers
# and within a few float64 ulps otherwise.


def _wide(x):
    x = np.asarray(x)
    if x.dtype.kind == "c":
        return x.astype(np.complex128)
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
        p = chain.reshape(v.shape[0], leaves * TREE_CHAINS)
        size = 1 << (p.shape[1] - 1).bit_length()
        if size != p.shape[1]:
            p = np.concatenate([p, np.full((p.shape[0], size - p.shape[1]), fill, p.dtype)], axis=1)
        while p.shape[1] > 1:
            p = combine(p[:, 0::2], p[:, 1::2])
    return p[:, 0].reshape(lead)


def _reduce_emulated(name: str, x, axis, dtype, keepdims: bool):
    import cukern.reduce_plan as P

    from ._dtypes import storage

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


def sum_emulated(x, axis=None, dtype=None, keepdims=False):
    """The bits :func:`cukern.sum` returns, as a NumPy array, computed on the host: x (any array; a CuPy
    array is copied to the host) converted to the accumulator dtype (float32 for float32 and half-type
    results, float64 for float64, int64 for integer results), each result the tree of
    :func:`reduction_tree` over its elements in C order over ``axis`` (integer sums exactly, wrapping),
    rounded once to the result dtype. An axis of one element is copied, as cukern does it. NaN payloads
    may differ from the GPU's. A float converted to an integer (x for an integer target, a mean's quotient)
    that is +-inf, NaN or out of range takes the host's conversion here, where the GPU's saturates: such
    values are not emulated bit for bit."""
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
    is NaN, +0 over -0), converted to ``dtype`` when given. Complex x: :func:`extreme_emulated`."""
    if _numpy(x).dtype.kind == "c":
        return extreme_emulated("amax", x, axis, dtype, keepdims)
    return _reduce_emulated("amax", x, axis, dtype, keepdims)


def amin_emulated(x, axis=None, dtype=None, keepdims=False):
    """The bits :func:`cukern.amin` returns: as :func:`amax_emulated`, with min (-0 over +0)."""
    if _numpy(x).dtype.kind == "c":
        return extreme_emulated("amin", x, axis, dtype, keepdims)
    return _reduce_emulated("amin", x, axis, dtype, keepdims)


# ---------------------------------------------------------------------------------------------------------
# Arg-reductions (cuda_src/argreduce.cu): NumPy's own functions are the references (upcast floats to
# float64, which keeps every order and tie); the emulators search the kernel's keys.


def _arg_reference(fn, x, axis, keepdims):
    x = np.asarray(x)
    wide = x if x.dtype.kind in "biuc" else x.astype(np.float64)
    return fn(wide, axis=axis, keepdims=keepdims)


def argmax(x, axis=None, keepdims=False):
    """``np.argmax`` of x (floats widened to float64)."""
    return _arg_reference(np.argmax, x, axis, keepdims)


def argmin(x, axis=None, keepdims=False):
    """``np.argmin`` of x (floats widened to float64)."""
    return _arg_reference(np.argmin, x, axis, keepdims)


def nanargmax(x, axis=None, keepdims=False):
    """``np.nanargmax`` of x (floats widened to float64; ValueError for an all-NaN slice)."""
    return _arg_reference(np.nanargmax, x, axis, keepdims)


def nanargmin(x, axis=None, keepdims=False):
    """``np.nanargmin`` of x (floats widened to float64; ValueError for an all-NaN slice)."""
    return _arg_reference(np.nanargmin, x, axis, keepdims)


def arg_keys(x, op: str):
    """The key cuda_src/argreduce.cu's ``element_key`` gives each element of the host array ``x``, unsigned of
    x's width: its unsigned order is ``op``'s order (reversed for argmin and nanargmin), -0 keyed as +0,
    a NaN's key all ones (argmax, argmin: it wins) or 0 (the nan forms: it loses); no number's key is 0 or
    all ones. Complex x (NumPy's lexicographic order, a NaN in either part a NaN): complex64's keys are
    uint64, the real part's 32-bit key over the imaginary part's; complex128's are x.shape + (2,) uint64,
    the real part's key then the imaginary part's, compared lexicographically (the kernel's Key128)."""
    import cukern.argreduce as A

    dt = np.dtype(x.dtype)
    kind, width = A.KINDS[dt], dt.itemsize
    flip, nan_loses = A.SEARCHES[op]
    if kind == A.KIND_COMPLEX:
        return _complex_arg_keys(x, flip, nan_loses)
    u = np.dtype(f"u{width}")
    b = np.asarray(x, order="C").view(u)  # ascontiguousarray would make a 0-d x 1-d
    sign = u.type(1 << (8 * width - 1))
    if kind == A.KIND_BOOL:
        k = (b != 0).astype(u)
    elif kind == A.KIND_SIGNED:
        k = b ^ sign
    elif kind == A.KIND_UNSIGNED:
        k = b.copy()
    else:
        wide = 0x7F800000 if width == 4 else 0x7FF0000000000000
        infinity = {A.KIND_HALF: 0x7C00, A.KIND_BFLOAT: 0x7F80}.get(kind, wide)
        mag = b & ~sign
        k = np.where(((b & sign) != 0) & (mag != 0), ~b, mag | sign).astype(u)
    if flip:
        k = ~k
    if kind in (A.KIND_FLOAT, A.KIND_HALF, A.KIND_BFLOAT):
        k = np.where(mag > u.type(infinity), u.type(0) if nan_loses else ~u.type(0), k).astype(u)
    return k


def _complex_arg_keys(x, flip: bool, nan_loses: bool):
    part = np.dtype(np.float32 if x.dtype == np.complex64 else np.float64)
    u = np.dtype(f"u{part.itemsize}")
    z = np.asarray(x, order="C")
    re, im = z.real.astype(part).view(u), z.imag.astype(part).view(u)
    sign = u.type(1 << (8 * part.itemsize - 1))

    def order(b):
        mag = b & ~sign
        return np.where(((b & sign) != 0) & (mag != 0), ~b, mag | sign).astype(u)

    nan = np.isnan(z.real) | np.isnan(z.imag)
    nan_key = np.uint64(0) if nan_loses else ~np.uint64(0)
    if u == np.uint32:
        k = (order(re).astype(np.uint64) << np.uint64(32)) | order(im).astype(np.uint64)
        if flip:
            k = ~k
        return np.where(nan, nan_key, k).astype(np.uint64)
    k = np.stack([order(re), order(im)], axis=-1)
    if flip:
        k = ~k
    return np.where(nan[..., None], nan_key, k).astype(np.uint64)


def _first_largest(k, ndim: int, axis, keepdims: bool):
    """The first index of the largest key along ``axis`` (None: flattened); ``k`` of ``ndim`` dimensions, or
    one more for complex128's (hi, lo) pairs, whose largest is the largest lo among the largest hi."""
    if k.ndim == ndim:
        return np.argmax(k, axis=axis, keepdims=keepdims)
    hi, lo = k[..., 0], k[..., 1]
    if axis is None:
        i = _first_largest(np.stack([hi.reshape(-1), lo.reshape(-1)], axis=-1), 1, 0, False)
        return i.reshape((1,) * ndim) if keepdims else i
    # lo is 0 only for a NaN keyed 0, and such a NaN's hi is the largest only in an all-NaN slice
    top = hi.max(axis=axis, keepdims=True)
    return np.argmax(np.where(hi == top, lo, np.uint64(0)), axis=axis, keepdims=keepdims)


def _arg_emulated(op: str, x, axis, keepdims):
    from .argreduce import INEXACT, SEARCHES

    x = np.asarray(x)
    k = arg_keys(x, op)
    if x.ndim == 0:
        axis = None
    elif axis is not None:
        axis = axis % x.ndim
    hi = k if k.ndim == x.ndim else k[..., 0]
    if SEARCHES[op][1] and op.startswith("nanarg") and x.dtype in INEXACT and hi.size \
            and (np.max(hi, axis=axis) == 0).any():
        raise ValueError("All-NaN slice encountered")
    return _first_largest(k, x.ndim, axis, keepdims)  # the first of the largest keys


def argmax_emulated(x, axis=None, keepdims=False):
    """The indices :func:`cukern.argmax` returns: the first index of the largest :func:`arg_keys`."""
    return _arg_emulated("argmax", x, axis, keepdims)


def argmin_emulated(x, axis=None, keepdims=False):
    """The indices :func:`cukern.argmin` returns (keys in reversed order, so the largest key is the least
    value)."""
    return _arg_emulated("argmin", x, axis, keepdims)


def nanargmax_emulated(x, axis=None, keepdims=False):
    """The indices :func:`cukern.nanargmax` returns (NaNs keyed 0; an all-NaN slice raises ValueError)."""
    return _arg_emulated("nanargmax", x, axis, keepdims)


def nanargmin_emulated(x, axis=None, keepdims=False):
    """The indices :func:`cukern.nanargmin` returns (NaNs keyed 0; an all-NaN slice raises ValueError)."""
    return _arg_emulated("nanargmin", x, axis, keepdims)


def reduce_var(x, axis=None, ddof=0, keepdims=False):
    """``sum((x - mean)**2) / (n - ddof)`` in float64, two passes (``numpy.var``)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.var(_wide(x).astype(np.float64), axis=axis, ddof=ddof, keepdims=keepdims)


def reduce_std(x, axis=None, ddof=0, keepdims=False):
    """``sqrt(reduce_var(x))`` in float64."""
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
    from .reduce_plan import TREE_CHAIN_LENGTH, TREE_CHAINS, TREE_LEAF

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


def var_emulated(x, axis=None, dtype=None, ddof=0, keepdims=False):
    """The bits :func:`cukern.var` returns: each slice's values in the accumulator dtype (float32 for float32
    and half-type results, float64 otherwise) less the slice's first element; each chain of
    :func:`reduction_tree` forms its (count, mean, M2) at once (:func:`_moments_tree`: one division a
    chain), and the chains merge up the tree by reduce.cu's Chan merge (:func:`_chan`); then M2
    widened to float64 and divided by ``max(n - ddof, 0)`` (NaN when the mean is not finite), rounded to the
    result dtype (through float32 for half types)."""
    return _var_emulated("var", x, axis, dtype, ddof, keepdims)


def std_emulated(x, axis=None, dtype=None, ddof=0, keepdims=False):
    """The bits :func:`cukern.std` returns: :func:`var_emulated`'s float64 quotient, its correctly rounded
    square root, rounded to the result dtype."""
    return _var_emulated("std", x, axis, dtype, ddof, keepdims)


# ---------------------------------------------------------------------------------------------------------
# NaN-aware reductions, counts, prod and logsumexp (cuda_src/reduce.cu): float64 references from NumPy, and
# the kernels' bits on the host.


def reduce_nansum(x, axis=None, keepdims=False):
    """``sum`` of the non-NaN elements in int64 or float64 (``numpy.nansum``)."""
    return np.nansum(_wide(x), axis=axis, keepdims=keepdims)


def reduce_nanmean(x, axis=None, keepdims=False):
    """Mean of the non-NaN elements in float64; NaN for an all-NaN slice."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmean(_wide(x).astype(np.float64), axis=axis, keepdims=keepdims)


def reduce_nanmax(x, axis=None, keepdims=False):
    """Maximum of the non-NaN elements; NaN for an all-NaN slice."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmax(_wide(x), axis=axis, keepdims=keepdims)


def reduce_nanmin(x, axis=None, keepdims=False):
    """Minimum of the non-NaN elements; NaN for an all-NaN slice."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmin(_wide(x), axis=axis, keepdims=keepdims)


def reduce_prod(x, axis=None, keepdims=False):
    """Product in int64 (wrapping), float64 or complex128."""
    with np.errstate(over="ignore", invalid="ignore"):
        return np.prod(_wide(x), axis=axis, keepdims=keepdims)


def reduce_logsumexp(x, axis=None, keepdims=False):
    """``log(sum(exp(x)))`` in float64, shifted by the maximum (``scipy.special.logsumexp``): -inf for an
    empty or all -inf slice, +inf for a slice holding +inf, NaN for one holding NaN."""
    w = _wide(x).astype(np.float64)
    with np.errstate(all="ignore"):
        if w.size == 0:
            return np.full(np.sum(w, axis=axis, keepdims=keepdims).shape, -np.inf)
        m = np.max(w, axis=axis, keepdims=True)
        safe = np.where(np.isfinite(m), m, 0.0)
        r = np.log(np.sum(np.exp(w - safe), axis=axis, keepdims=True)) + safe
        r = np.where(np.isfinite(m), r, m)
    return r if keepdims else np.squeeze(r, axis=axis)


def nansum_emulated(x, axis=None, dtype=None, keepdims=False):
    """The bits :func:`cukern.nansum` returns: :func:`sum_emulated` with each NaN replaced by 0 first."""
    return _reduce_emulated("nansum", x, axis, dtype, keepdims)


def _count_not_nan_emulated(x, axis, keepdims):
    return _reduce_emulated("count_not_nan", x, axis, None, keepdims)


def extreme_emulated(name: str, x, axis=None, dtype=None, keepdims=False):
    """The bits :func:`cukern.amax` (``name`` "amax"), ``amin``, ``nanmax`` and ``nanmin`` return for complex
    host ``x`` (its strides matter): the element at the arg-reduction's index along the reduced axes merged
    in NumPy's visiting order (:func:`cukern.reduce_plan.gather_axes`); NaN-skipping for the nan forms, an
    all-NaN slice giving its first element. NumPy's own max, min, nanmax and nanmin give the same bits."""
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


def nanmax_emulated(x, axis=None, dtype=None, keepdims=False):
    """The bits :func:`cukern.nanmax` returns: :func:`amax_emulated` with each NaN replaced by -inf first,
    then NaN for the slices without a non-NaN value."""
    return _nan_minmax_emulated("nanmax", x, axis, dtype, keepdims)


def nanmin_emulated(x, axis=None, dtype=None, keepdims=False):
    """The bits :func:`cukern.nanmin` returns: as :func:`nanmax_emulated`, with min and +inf."""
    return _nan_minmax_emulated("nanmin", x, axis, dtype, keepdims)


def nanmean_emulated(x, axis=None, dtype=None, keepdims=False):
    """The bits :func:`cukern.nanmean` returns: :func:`nansum_emulated` in the accumulator dtype, widened to
    float64, divided by the count of non-NaN values (NaN for none), rounded to the result dtype (through
    float32 for half types). Integer and bool inputs: :func:`mean_emulated`. Complex x: each part of the sum
    divided in float64 by the count of elements with no NaN part, rounded to the part's dtype; a real x
    with a complex ``dtype=``: the real result in the parts' dtype, widened."""
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


def count_nonzero_emulated(x, axis=None, keepdims=False):
    """:func:`cukern.count_nonzero`: the number of x != 0 (a NaN counts), int64."""
    return np.asarray(_reduce_emulated("count_nonzero", x, axis, None, keepdims))


def any_emulated(x, axis=None, keepdims=False):
    """:func:`cukern.any`: the count of x != 0 (a NaN counts) in float64, stored as count != 0."""
    return np.asarray(_reduce_emulated("any", x, axis, None, keepdims))


def all_emulated(x, axis=None, keepdims=False):
    """:func:`cukern.all`: the count of x != 0 in float64, stored as count == n (n the slice's length)."""
    return np.asarray(_reduce_emulated("all", x, axis, None, keepdims))


def prod_emulated(x, axis=None, dtype=None, keepdims=False):
    """The bits :func:`cukern.prod` returns: x converted first to a ``dtype`` that NumPy multiplies in (a
    float or complex target), as cukern converts it; then the tree of :func:`reduction_tree` with correctly
    rounded products from the identity 1 in the accumulator dtype (float32 for half types; complex results in
    their own dtype, multiplied by :func:`_tree_complex_prod`, which keeps 1 + 0i exact), rounded once to the
    result dtype; integer products in int64, wrapping (any order gives those bits)."""
    return _reduce_emulated("prod", x, axis, dtype, keepdims)


# logsumexp's exp and log (reduce.cu ExpLog, exp_nonpositive, log_at_least_one): the same steps, each rounded
# once, in the same order, in the accumulator dtype (float32's exp multiply-adds by :func:`_fma32`). The
# constants are reduce.cu's hex literals.
_EXPLOG = {
    np.dtype(np.float32): {
        "underflow": -104.0, "inv_ln2": "0x1.715476p+0", "magic": "0x1.8p+23", "ln2_hi": "0x1.62e4p-1",
        "ln2_lo": "0x1.7f7d1cp-20", "ln2": "0x1.62e430p-1",
        "exp": ["0x1p+0", "0x1p+0", "0x1.fffdfcp-2", "0x1.5557aep-3", "0x1.5729e6p-5", "0x1.10625ap-7"],
        "sqrt_half": "0x1.6a09e6p-1",
        "log": ["0x1p+0", "0x1.555556p-2", "0x1.99999ap-3", "0x1.24924ap-3", "0x1.c71c72p-4"]},
    np.dtype(np.float64): {
        "underflow": -746.0, "inv_ln2": "0x1.71547652b82fep+0", "magic": "0x1.8p+52", "ln2_hi": "0x1.62e42feep-1",
        "ln2_lo": "0x1.a39ef35793c76p-33",
        "exp": ["0x1p+0", "0x1p+0", "0x1p-1", "0x1.5555555555555p-3", "0x1.5555555555555p-5", "0x1.1111111111111p-7",
             "0x1.6c16c16c16c17p-10", "0x1.a01a01a01a01ap-13", "0x1.a01a01a01a01ap-16", "0x1.71de3a556c734p-19",
             "0x1.27e4fb7789f5cp-22", "0x1.ae64567f544e4p-26", "0x1.1eed8eff8d898p-29", "0x1.6124613a86d09p-33"],
        "sqrt_half": "0x1.6a09e667f3bcdp-1",
        "log": ["0x1p+0", "0x1.5555555555555p-2", "0x1.999999999999ap-3", "0x1.2492492492492p-3",
             "0x1.c71c71c71c71cp-4", "0x1.745d1745d1746p-4", "0x1.3b13b13b13b14p-4", "0x1.1111111111111p-4",
             "0x1.e1e1e1e1e1e1ep-5", "0x1.af286bca1af28p-5", "0x1.8618618618618p-5"]},
}


@functools.cache
def _explog(dtype):
    """The constants of :data:`_EXPLOG` as ``dtype``'s scalars (made once a dtype: the tree simulations call
    the exp and log a value at a time)."""
    c = _EXPLOG[np.dtype(dtype)]
    t = np.dtype(dtype).type

    def f(h):
        return t(float.fromhex(h)) if isinstance(h, str) else t(h)

    return {k: [f(h) for h in v] if isinstance(v, list) else f(v) for k, v in c.items()}


def _fma32(a, b, c):
    """``__fmaf_rn(a, b, c)`` for float32 arrays (broadcast): a b + c rounded once, to nearest even. The
    product is exact in float64 (24 + 24 bits); the float64 sum is rounded to odd, not to nearest: TwoSum
    gives s = RN(x), x = a b + c, and its error e = x - s exactly; an inexact x rounds toward zero (s, or its
    neighbour toward zero when e and s differ in sign) and then sets the last bit, which keeps the sticky
    information a second rounding needs. 53 >= 24 + 2 bits, so rounding that to float32 is the correctly
    rounded x, subnormal results, overflow and signed zeros included. Infinite or NaN operands make e a NaN,
    neither positive nor negative: s stays as float64 forms it, by the same IEEE rules."""
    a, b, c = (np.asarray(v, np.float32).astype(np.float64) for v in (a, b, c))
    with np.errstate(all="ignore"):
        p = a * b
        s = p + c
        bv = s - p
        e = (p - (s - bv)) + (c - bv)
        inexact = (e > 0) | (e < 0)
        bits = s.view(np.int64)
        odd = (bits - (inexact & ((e > 0) != (s > 0)))) | inexact
        return odd.view(np.float64).astype(np.float32)


def _exp_nonpositive(d):
    """reduce.cu ``exp_nonpositive``: e^d for d <= 0 (an array of float32 or float64), 0 below the underflow
    bound. k = rint(d / ln2) by adding and subtracting the magic constant (its integer also read from the
    sum's bits), r = d - k ln2 (in one fused step for float32, two for float64), e^r by Horner with the
    coefficients scaled by 2^-64, then that times 2^(k + 64), rounded once. Float32 forms every multiply-add
    with one rounding (:func:`_fma32`, as ``__fmaf_rn``), float64 as a correctly rounded product and a
    correctly rounded sum."""
    c = _explog(d.dtype)
    t = d.dtype.type
    mad = _fma32 if t is np.float32 else (lambda a, b, c: a * b + c)
    bits = np.dtype(f"i{d.dtype.itemsize}")
    scale = t(2.0**-64)
    with np.errstate(all="ignore"):
        live = d >= c["underflow"]
        dd = np.where(live, d, t(0))
        km = mad(dd, c["inv_ln2"], c["magic"])
        kf = km - c["magic"]
        ki = km.view(bits).astype(np.int64) - np.asarray(c["magic"]).view(bits).astype(np.int64)
        if "ln2" in c:  # float32: r in one fused step
            r = mad(kf, -c["ln2"], dd)
        else:
            r = mad(kf, -c["ln2_lo"], mad(kf, -c["ln2_hi"], dd))
        p = np.full_like(d, c["exp"][-1] * scale)
        for coef in reversed(c["exp"][:-1]):
            p = mad(p, r, coef * scale)
        out = p * np.ldexp(np.ones_like(d), ki + 64)
    return np.where(live, out, t(0))


def _log_at_least_one(s):
    """reduce.cu ``log_at_least_one``: log(s) for finite s >= 1 (an array of float32 or float64)."""
    c = _explog(s.dtype)
    t = s.dtype.type
    with np.errstate(all="ignore"):
        f, e = np.frexp(s)
        low = f < c["sqrt_half"]
        f = np.where(low, f * t(2), f)
        e = np.where(low, e - 1, e)
        u = (f - t(1)) / (f + t(1))
        w = u * u
        p = np.full_like(s, c["log"][-1])
        for coef in reversed(c["log"][:-1]):
            p = p * w + coef
        se = e.astype(s.dtype)
        return se * c["ln2_hi"] + (se * c["ln2_lo"] + (u + u) * p)


def _lse_merge(a, b):
    """reduce.cu's LogSumExp merge of (m, s) arrays, step for step: hi the operand of the larger m (or of a NaN
    m), m the NaN-propagating maximum, s = s_hi + s_lo e^(m_lo - m_hi) (a NaN or -inf difference gives 0)."""
    am, as_ = a
    bm, bs = b
    with np.errstate(all="ignore"):
        swap = (bm > am) | np.isnan(bm)
        hm, hs = np.where(swap, bm, am), np.where(swap, bs, as_)
        lm, ls = np.where(swap, am, bm), np.where(swap, as_, bs)
        return _tree_max(am, bm), hs + ls * _exp_nonpositive(lm - hm)


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


def logsumexp_emulated(x, axis=None, keepdims=False):
    """The bits :func:`cukern.logsumexp` returns: the values in the accumulator dtype (float32 for float32
    and half types, float64 for float64; integer and bool x converted to float64); each chain of
    :func:`reduction_tree` forms its (max m, sum of exp(x - m)) at once with cukern's own exp
    (:func:`_lse_tree`: one exp an element), and the chains merge up the tree by reduce.cu's LogSumExp
    merge (:func:`_lse_merge`); then m + log(s) with cukern's own log, rounded to the result dtype; -inf for an
    empty or all -inf slice, m itself for an infinite or NaN m. A one-element slice is copied."""
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


# ---------------------------------------------------------------------------------------------------------
# Segmented reductions (cuda_src/segment.cu): rows offsets[s] : offsets[s + 1] of x along axis 0.


def _segments(x, offsets):
    x = _numpy(x)
    o = np.asarray(_numpy(offsets)).astype(np.int64)
    return x, o, x.reshape(x.shape[0], int(np.prod(x.shape[1:], dtype=np.int64)))  # -1 fails for no rows


def _segment_reference(x, offsets, fn, empty):
    x, o, v = _segments(x, offsets)
    out = np.full((len(o) - 1, v.shape[1]), empty, np.float64)
    for s in range(len(o) - 1):
        if o[s + 1] > o[s]:
            out[s] = fn(v[o[s]:o[s + 1]].astype(np.float64), axis=0)
    return out.reshape((len(o) - 1,) + x.shape[1:])


def segment_sum(x, offsets):
    """Each segment's float64 sum along axis 0 (0 for an empty segment)."""
    return _segment_reference(x, offsets, np.sum, 0.0)


def segment_max(x, offsets):
    """Each segment's maximum along axis 0 (-inf for an empty segment; NaN if it holds a NaN)."""
    return _segment_reference(x, offsets, np.max, -np.inf)


def segment_min(x, offsets):
    """Each segment's minimum along axis 0 (+inf for an empty segment; NaN if it holds a NaN)."""
    return _segment_reference(x, offsets, np.min, np.inf)


def segment_mean(x, offsets):
    """Each segment's float64 mean along axis 0 (NaN for an empty segment)."""
    return _segment_reference(x, offsets, np.mean, np.nan)


def _segment_emulated(op: str, x, offsets):
    """Each segment through :func:`reduction_tree` over its own length, segments of one length at a time,
    in float32 (float64 for float64 x and for the means of integers and bool), then rounded to the result
    dtype (a mean: the sum widened to float64, divided by the length, rounded through float32 for the half
    types). Integer and bool sums, maxima and minima are exact (sums wrap at 64 bits, as NumPy's), so
    their values do not depend on any order."""
    from .segment import result_dtype

    x, o, v = _segments(x, offsets)
    rt = result_dtype(op, x.dtype)
    exact = x.dtype.kind in "biu" and op != "segment_mean"
    acc = rt if exact else np.float64 if rt == np.float64 else np.float32
    combine, identity = {"segment_sum": (_tree_sum, 0), "segment_mean": (_tree_sum, 0),
                         "segment_max": (_tree_max, -np.inf), "segment_min": (_tree_min, np.inf)}[op]
    if exact and op != "segment_sum":
        limits = (False, True) if x.dtype == np.bool_ else (np.iinfo(x.dtype).min, np.iinfo(x.dtype).max)
        identity = limits[op == "segment_min"]
    rows = x.shape[0]
    start = np.clip(o[:-1], 0, rows)
    length = np.clip(o[1:], start, rows) - start
    out = np.empty((len(o) - 1, v.shape[1]), acc)
    for n in np.unique(length):
        which = np.flatnonzero(length == n)
        idx = start[which, None] + np.arange(n)[None, :]
        seg = v[idx].astype(acc)  # [segments of this length, n, cols]
        if not n:
            out[which] = identity
        elif exact:
            out[which] = {"segment_sum": np.sum, "segment_max": np.max, "segment_min": np.min}[op](seg, axis=1)
        else:
            out[which] = reduction_tree(np.moveaxis(seg, 1, 2), combine, identity)
    if op == "segment_mean":
        with np.errstate(invalid="ignore", divide="ignore"):
            wide = out.astype(np.float64) / length[:, None]
        out = wide if acc == np.float64 else wide.astype(np.float32)
    return out.astype(rt).reshape((len(o) - 1,) + x.shape[1:])


def segment_sum_emulated(x, offsets):
    """The bits :func:`cukern.segment_sum` returns: each segment's :func:`reduction_tree` sum, the same
    bits as :func:`sum_emulated` of that slice along axis 0 (but for one row of -0, which the tree's chain
    adds to +0 where a one-row sum copies it)."""
    return _segment_emulated("segment_sum", x, offsets)


def segment_max_emulated(x, offsets):
    """The bits :func:`cukern.segment_max` returns (reduce.cu's max: NaN propagates, +0 over -0)."""
    return _segment_emulated("segment_max", x, offsets)


def segment_min_emulated(x, offsets):
    """The bits :func:`cukern.segment_min` returns (NaN propagates, -0 under +0)."""
    return _segment_emulated("segment_min", x, offsets)


def segment_mean_emulated(x, offsets):
    """The bits :func:`cukern.segment_mean` returns: the tree's sum widened to float64, divided once by the
    length, rounded to x's dtype (through float32 for the half types; NaN for an empty segment)."""
    return _segment_emulated("segment_mean", x, offsets)


# ---------------------------------------------------------------------------------------------------------
# Scans (cuda_src/scan.cu): NumPy's cumsum and cumprod in float64 (or int64) are the references; the
# emulators evaluate the kernel's fixed expression over tiles of cukern.scan.tile(x's dtype, the result's).


def _scan_reference(fn, x, axis):
    x = _numpy(x)
    wide = x.astype(np.int64 if x.dtype.kind in "biu" else np.complex128 if x.dtype.kind == "c" else np.float64)
    return fn(wide, axis=axis)


def cumsum(x, axis=None):
    """``np.cumsum`` in float64 (int64 for integers and bool, complex128 for complex)."""
    return _scan_reference(np.cumsum, x, axis)


def cumprod(x, axis=None):
    """``np.cumprod`` in float64 (int64 for integers and bool, complex128 for complex)."""
    return _scan_reference(np.cumprod, x, axis)


def _accumulate(f, v):
    """The running combine of ``v`` along its last axis, in order: ``f.accumulate`` for a ufunc, a loop for
    the complex product (:func:`_tree_complex_prod`)."""
    if isinstance(f, np.ufunc):
        return f.accumulate(v, axis=-1)
    out = np.empty_like(v)
    out[..., 0] = v[..., 0]
    for i in range(1, v.shape[-1]):
        out[..., i] = f(out[..., i - 1], v[..., i])
    return out


def _scan_emulated(op: str, x, axis, dtype):
    from ._check import check_dtype
    from ._dtypes import BFLOAT16
    from .scan import BLOCK, DTYPES, GROUP, items, normalize_axis, result_dtype, route

    x = _numpy(x)
    if x.ndim == 0:
        x = x.reshape(1)  # NumPy scans a 0-d array as one of shape (1,), as the op does
    axis = normalize_axis(axis, x.ndim)  # the op's TypeError or AxisError
    if x.dtype.kind == "c" and dtype is not None and np.dtype(dtype).kind != "c":
        raise TypeError(f"dtype={np.dtype(dtype).name} is not supported for {op} of {x.dtype.name}: NumPy does "
                        "not cast complex to real")
    if op == "cumsum" and (x.dtype.kind == "c" or (dtype is not None and np.dtype(dtype).kind == "c")):
        # the real and imaginary parts scanned apart, x converted to the complex result dtype first
        z = x.astype(x.dtype if dtype is None else np.dtype(dtype))
        r = np.empty((z.size,) if axis is None else z.shape, z.dtype)
        r.real, r.imag = (_scan_emulated(op, np.ascontiguousarray(p), axis, None) for p in (z.real, z.imag))
        return r
    if op == "cumprod" and dtype is not None and np.dtype(dtype).kind == "c" and x.dtype != np.dtype(dtype):
        x, dtype = (x.astype(np.float32) if x.dtype == BFLOAT16 else x).astype(dtype), None  # converted first
    if x.dtype.kind != "c" and (dtype is not None or x.dtype not in DTYPES):
        how = route(x.dtype, dtype)  # the public op's TypeError for a dtype it does not scan
        if how is not None:  # scan.route's conversions: x to via (uint64 viewed), its scan, then to the result
            via, final = how
            if x.dtype.kind == "u" and x.itemsize == 8 and via == np.int64:
                v = x.view(np.int64)
            elif final == np.uint64 and via == np.int64 and (x.dtype.kind == "f" or x.dtype == BFLOAT16):
                # a float as NumPy (x86) converts it to uint64: past int64's range by value, a negative one
                # wrapped (bfloat16's, as ml_dtypes 0.7 and the GPU do it, 0)
                f = x.astype(np.float32) if x.dtype == BFLOAT16 else x
                with np.errstate(invalid="ignore"):
                    big = np.where(f < 0, 0, f).astype(np.uint64).view(np.int64)
                    v = big if x.dtype == BFLOAT16 else np.where(f < 0, f.astype(np.int64), big)
            else:
                v = _astype(x, via)
            r = _scan_emulated(op, v, axis, None)
            return r.view(final) if final.kind == "u" and final.itemsize == 8 else _astype(r, final)
    check_dtype(x, "x", DTYPES)  # the public op's TypeError
    o = result_dtype(x.dtype, dtype)
    if x.size == 0:
        return np.empty((0,) if axis is None else x.shape, o)
    acc = o if o.kind == "c" else np.dtype(np.float64 if o == np.float64 else np.int64 if o.kind in "iu"
                                           else np.float32)
    f = _tree_complex_prod if acc.kind == "c" else np.multiply if op == "cumprod" else np.add
    identity = np.array(1 if op == "cumprod" else (-0.0 if acc.kind == "f" else 0), acc)
    if axis is None:
        shape, lines = (x.size,), x.reshape(1, -1)
    else:
        axis = axis % x.ndim
        moved = np.moveaxis(x, axis, -1)
        shape, lines = moved.shape, moved.reshape(-1, x.shape[axis])
    rows, n = lines.shape
    k = items(x.dtype, o)
    tiles = max(1, -(-n // (BLOCK * k)))
    a = np.full((rows, tiles * BLOCK * k), identity, acc)
    a[:, :n] = lines.astype(acc)
    a = a.reshape(rows, tiles, BLOCK // 32, 32, k)
    with np.errstate(all="ignore"):
        s = _accumulate(f, a)  # each thread's k elements, in order
        u = s[..., -1]
        for d in (1, 2, 4, 8, 16):  # the lanes' ladder, every lane at once from the old values
            nxt = u.copy()
            nxt[..., d:] = f(u[..., :-d], u[..., d:])
            u = nxt
        lane_before = np.concatenate([np.broadcast_to(identity, u.shape[:-1] + (1,)), u[..., :-1]], axis=-1)
        warps = _accumulate(f, u[..., -1])
        warp_before = np.concatenate([np.broadcast_to(identity, warps.shape[:-1] + (1,)), warps[..., :-1]], axis=-1)
        # tiles in groups of GROUP: Q, the fold of a group's aggregates before each tile; S, each group's total;
        # B, the fold of the row's earlier totals; a tile's prefix B + Q
        groups = -(-tiles // GROUP)
        agg = np.full((rows, groups * GROUP), identity, acc)
        agg[:, :tiles] = warps[..., -1]
        within = _accumulate(f, agg.reshape(rows, groups, GROUP))
        q = np.concatenate([np.broadcast_to(identity, (rows, groups, 1)), within[..., :-1]], axis=-1)
        b = np.concatenate([np.broadcast_to(identity, (rows, 1)), _accumulate(f, within[..., -1])[:, :-1]],
                           axis=-1)
        tile_before = f(b[..., None], q).reshape(rows, -1)[:, :tiles]
        base = f(f(tile_before[:, :, None], warp_before)[..., None], lane_before)
        out = f(base[..., None], s)
    out = out.reshape(rows, -1)[:, :n].astype(o).reshape(shape)
    return out if axis is None else np.moveaxis(out, -1, axis)


def cumsum_emulated(x, axis=None, dtype=None):
    """The bits :func:`cukern.cumsum` returns: per thread a running sum of :func:`cukern.scan.items` elements
    (8 for float32 scanned into float32, 16 otherwise), the lanes' ladder, the warps in order, the tiles of a
    group in order, the groups in order, combined as ``((P + W) + L) + s`` with ``P = B + Q``
    (cuda_src/scan.cu's notes). Complex x or ``dtype``: each part so, apart."""
    return _scan_emulated("cumsum", x, axis, dtype)


def cumprod_emulated(x, axis=None, dtype=None):
    """The bits :func:`cukern.cumprod` returns: :func:`cumsum_emulated`'s expression with products (complex
    ones as prod's, :func:`_tree_complex_prod`: correctly rounded steps, 1 + 0i an exact identity)."""
    return _scan_emulated("cumprod", x, axis, dtype)
