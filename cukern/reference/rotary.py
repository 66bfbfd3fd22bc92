"""Rotary embedding (cached, cache-free, multimodal) and fused QK-norm + RoPE: references and emulators."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .._typing import Array, HostArray
from ._common import _f64, _numpy
from .norms import rms_norm, rms_norm_backward, rms_norm_backward_emulated, rms_norm_emulated


def rope_frequency(j: int, rotary_dim: int, base: float = 10000.0, scaling: dict[str, Any] | None = None,
                   max_position: int | None = None) -> float:
    """Angular frequency of pair ``j`` (float), one pair at a time from the published per-model formulas
    (HF transformers ``_compute_*_rope_parameters``): plain ``base^(-2j/rot)``, then linear (divided by
    factor), dynamic NTK (base stretched for ``max(max_position, original)`` positions), Llama 3 (long
    wavelengths divided by factor, short ones kept, a linear blend between; Llama 4's equal low and high
    factors leave no blend), YaRN (a ramp between interpolated and extrapolated over the correction range)
    or LongRoPE (divided by the pair's entry of long_factor past the original length, else short_factor).

    Examples
    --------
    >>> from cukern.reference import rope_frequency
    >>> rope_frequency(1, 4, base=100.0)
    0.1
    >>> rope_frequency(1, 4, base=100.0, scaling={"type": "linear", "factor": 2.0})
    0.05
    """
    import math

    spec: dict[str, Any] = {} if scaling is None else scaling
    kind = None if scaling is None else spec["type"]
    rot = rotary_dim
    if kind == "dynamic_ntk":
        factor, orig = spec["factor"], spec["original_max_position"]
        seen = max(max_position, orig)
        base = base * ((factor * seen / orig) - (factor - 1)) ** (rot / (rot - 2))
    freq = base ** (-2.0 * j / rot)
    if kind == "linear":
        return freq / spec["factor"]
    if kind == "llama3":
        factor, orig = spec["factor"], spec["original_max_position"]
        low, high = spec["low_freq_factor"], spec["high_freq_factor"]
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
        factor, orig = spec["factor"], spec["original_max_position"]

        def dim_for(rotations):
            # the pair index whose wavelength fits `rotations` turns into the original context
            return rot * math.log(orig / (rotations * 2 * math.pi)) / (2 * math.log(base))

        lo = dim_for(spec.get("beta_fast", 32.0))
        hi = dim_for(spec.get("beta_slow", 1.0))
        if spec.get("truncate", True):
            lo, hi = math.floor(lo), math.ceil(hi)
        lo, hi = max(lo, 0), min(hi, rot - 1)
        if hi == lo:
            hi = hi + 0.001
        ramp = min(1.0, max(0.0, (j - lo) / (hi - lo)))
        return ramp * (freq / factor) + (1 - ramp) * freq
    if kind == "longrope":
        long = max_position > spec["original_max_position"]
        return freq / spec["long_factor" if long else "short_factor"][j]
    return freq


def rope_attention_factor(scaling: dict[str, Any] | None = None, max_position: int | None = None) -> float:
    """The factor on cos and sin, 1 but for YaRN and LongRoPE. YaRN: given ``attention_factor``, else
    ``m(factor, mscale) / m(factor, mscale_all_dim)`` when both are set, else ``m(factor, 1)``, with
    ``m(s, k) = 0.1 k ln(s) + 1`` for ``s > 1`` and 1 otherwise. LongRoPE: given ``attention_factor``, else
    ``long_mscale`` past the original length or ``short_mscale`` within it, else
    ``sqrt(1 + ln(s) / ln(original))`` for ``s = factor`` (default ``max_position / original``) above 1.

    Examples
    --------
    >>> from cukern.reference import rope_attention_factor
    >>> rope_attention_factor()
    1.0
    >>> round(rope_attention_factor({"type": "yarn", "factor": 4.0}), 6)
    1.138629
    """
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


def rope_cache(max_position: int, rotary_dim: int, base: float = 10000.0,
               scaling: dict[str, Any] | None = None) -> HostArray:
    """``[max_position, rotary_dim]`` float64: row p is ``a cos(p w_j)`` for each pair j, then ``a sin(p w_j)``
    (``w_j = rope_frequency(j)``, ``a = rope_attention_factor``).

    Examples
    --------
    >>> from cukern.reference import rope_cache
    >>> cache = rope_cache(3, 4, base=100.0)  # per row: cos of both pairs, then sin of both
    >>> print(cache.round(4))
    [[ 1.      1.      0.      0.    ]
     [ 0.5403  0.995   0.8415  0.0998]
     [-0.4161  0.9801  0.9093  0.1987]]
    """
    half = rotary_dim // 2
    w = np.array([rope_frequency(j, rotary_dim, base, scaling, max_position) for j in range(half)])
    a = rope_attention_factor(scaling, max_position)
    out = np.empty((max_position, rotary_dim))
    for j in range(half):
        angle = np.arange(max_position, dtype=np.float64) * w[j]
        out[:, j] = a * np.cos(angle)
        out[:, half + j] = a * np.sin(angle)
    return out


def rotary_embedding(positions: Array, query: Array, key: Array | None, cos_sin_cache: Array, is_neox: bool = True,
                     rotary_dim: int | None = None, inverse: bool = False) -> tuple[Array, Array | None]:
    """``(query, key)`` rotated, as float64 copies (key None stays None). Pair j of every head is
    ``(j, j + rot/2)`` (NeoX) or ``(2j, 2j + 1)`` (GPT-J), turned by ``cache[p, j]`` (cos) and
    ``cache[p, W/2 + j]`` (sin, negated when inverse). Tokens whose position is outside the cache are left
    as they are. Reads q, k, one cache row and one position per token; writes q, k.

    Examples
    --------
    >>> from cukern.reference import rope_cache, rotary_embedding
    >>> q = np.array([[[1.0, 0.0, 0.0, 1.0]], [[1.0, 0.0, 0.0, 1.0]]])  # [tokens, heads, head_size]
    >>> cache = rope_cache(4, 4, base=100.0)
    >>> q_rot, k_rot = rotary_embedding(np.array([0, 1]), q, None, cache)
    >>> print(q_rot.round(4), k_rot)
    [[[ 1.      0.      0.      1.    ]]
    <BLANKLINE>
     [[ 0.5403 -0.0998  0.8415  0.995 ]]] None
    >>> back, _ = rotary_embedding(np.array([0, 1]), q_rot, None, cache, inverse=True)
    >>> bool(np.allclose(back, q))
    True
    """
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

    out: list[Any] = []
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


def rotary_embedding_emulated(positions: Array, query: Array, key: Array | None, cos_sin_cache: Array,
                              is_neox: bool = True, rotary_dim: int | None = None,
                              inverse: bool = False) -> tuple[HostArray, HostArray | None]:
    """The bits :func:`cukern.rotary_embedding` writes, as NumPy copies in query's dtype (key None stays
    None): the pairs of :func:`rotary_embedding` widened to float32, ``x c - y s`` and ``y c + x s`` with
    every product and sum rounded to float32 in that order (NumPy never fuses a multiply-add), then rounded
    once to the dtype. Tokens whose position is outside the cache are left as they are.

    Examples
    --------
    >>> from cukern.reference import rope_cache, rotary_embedding_emulated
    >>> q = np.ones((2, 1, 4), np.float16)
    >>> q_rot, _ = rotary_embedding_emulated(np.array([0, 1]), q, None, rope_cache(2, 4, base=100.0))
    >>> print(q_rot.dtype, q_rot[1, 0])
    float16 [-0.3013  0.895   1.382   1.095 ]
    """
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
    out: list[Any] = []
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


def qk_norm_rope(positions: Array, query: Array, key: Array | None, q_weight: Array | None, k_weight: Array | None,
                 cos_sin_cache: Array, eps: float = 1e-6, offset: float = 0.0, is_neox: bool = True,
                 rotary_dim: int | None = None) -> tuple[Array, Array | None]:
    """``(query, key)`` as float64 copies (key None stays None): each head RMS-normalized over head_size
    (:func:`rms_norm` with ``q_weight`` or ``k_weight``), then rotated (:func:`rotary_embedding`). Reads q, k,
    the weights, one cache row and one position per token; writes q, k.

    Examples
    --------
    >>> from cukern.reference import qk_norm_rope, rope_cache
    >>> q = np.array([[[3.0, 0.0, 0.0, 4.0]]])
    >>> k = np.array([[[1.0, 1.0, 1.0, 1.0]]])
    >>> q_out, k_out = qk_norm_rope(np.array([0]), q, k, None, None, rope_cache(1, 4), eps=0.0)
    >>> print(q_out, k_out)
    [[[1.2 0.  0.  1.6]]] [[[1. 1. 1. 1.]]]
    """
    q = rms_norm(query, q_weight, eps, offset)
    k = None if key is None else rms_norm(key, k_weight, eps, offset)
    return rotary_embedding(positions, q, k, cos_sin_cache, is_neox=is_neox, rotary_dim=rotary_dim)


def qk_norm_rope_emulated(positions: Array, query: Array, key: Array | None, q_weight: Array | None,
                          k_weight: Array | None, cos_sin_cache: Array, eps: float = 1e-6, offset: float = 0.0,
                          is_neox: bool = True, rotary_dim: int | None = None) -> tuple[HostArray, HostArray | None]:
    """The bits :func:`cukern.qk_norm_rope` writes, as NumPy copies in query's dtype (key None stays None):
    :func:`rms_norm_emulated` over each head (rounded to the dtype), then :func:`rotary_embedding_emulated`
    of that. The fused kernel keeps exactly these two roundings, so it equals the two calls bit for bit.

    Examples
    --------
    >>> from cukern.reference import qk_norm_rope_emulated, rope_cache
    >>> q = np.array([[[3.0, 0.0, 0.0, 4.0]]], np.float16)
    >>> q_out, _ = qk_norm_rope_emulated(np.array([1]), q, None, None, None, rope_cache(2, 4, base=100.0))
    >>> print(q_out.dtype, q_out)
    float16 [[[ 0.6484 -0.1597  1.01    1.592 ]]]
    """
    q = rms_norm_emulated(query, q_weight, eps, offset)
    k = None if key is None else rms_norm_emulated(key, k_weight, eps, offset)
    return rotary_embedding_emulated(positions, q, k, cos_sin_cache, is_neox=is_neox, rotary_dim=rotary_dim)


def _rope_frequencies(rotary_dim, base, scaling, max_position):
    from ..rope_cache import rope_frequencies

    return rope_frequencies(1 if max_position is None else max_position, rotary_dim, base, scaling)


def rotary_positions_cos_sin(positions: Array, rotary_dim: int, base: float = 10000.0,
                             scaling: dict[str, Any] | None = None, max_position: int | None = None) -> HostArray:
    """``[tokens, rotary_dim]`` float32: the cos then sin values :func:`cukern.rotary_embedding_positions`
    computes for each token's position, bit for bit, on the host: cuda_src/rotary.cu ``cos_sin_at``'s float64
    steps (the exact product with the split frequency, the three-part reduction by pi / 2, the Taylor
    polynomials, the quadrant) one correctly rounded NumPy operation at a time, then ``a x`` rounded to
    float32.

    Examples
    --------
    >>> from cukern.reference import rotary_positions_cos_sin
    >>> cs = rotary_positions_cos_sin(np.array([0, 1]), 4, base=100.0)
    >>> print(cs.dtype, cs)
    float32 [[1.         1.         0.         0.        ]
     [0.5403023  0.9950042  0.84147096 0.09983341]]
    """
    from math import factorial

    from ..rotary import PIO2_1, PIO2_2, PIO2_3, TWO_OVER_PI, top_bits

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


def rotary_embedding_positions(positions: Array, query: Array, key: Array | None, rotary_dim: int,
                               base: float = 10000.0, scaling: dict[str, Any] | None = None, is_neox: bool = True,
                               max_position: int | None = None) -> tuple[Array, Array | None]:
    """``(query, key)`` rotated as float64 copies by ``a cos(p w_j)``, ``a sin(p w_j)`` computed in float64
    (``p w_j`` rounded once: within ``|p w_j| 2^-53`` of the exact angle). Reads q, k, one position per token;
    writes q, k.

    Examples
    --------
    >>> from cukern.reference import rope_cache, rotary_embedding, rotary_embedding_positions
    >>> q = np.array([[[1.0, 0.0, 0.0, 1.0]], [[1.0, 0.0, 0.0, 1.0]]])  # [tokens, heads, head_size]
    >>> q_rot, _ = rotary_embedding_positions(np.array([0, 1]), q, None, 4, base=100.0)
    >>> q_cached, _ = rotary_embedding(np.array([0, 1]), q, None, rope_cache(2, 4, base=100.0))
    >>> bool(np.allclose(q_rot, q_cached))
    True
    """
    w, a = _rope_frequencies(rotary_dim, base, scaling, max_position)
    angle = _numpy(positions).astype(np.float64)[:, None] * w
    rows = np.concatenate([a * np.cos(angle), a * np.sin(angle)], axis=1)
    return rotary_embedding(np.arange(rows.shape[0]), query, key, rows, is_neox=is_neox)


def rotary_embedding_positions_emulated(positions: Array, query: Array, key: Array | None, rotary_dim: int,
                                        base: float = 10000.0, scaling: dict[str, Any] | None = None,
                                        is_neox: bool = True,
                                        max_position: int | None = None) -> tuple[HostArray, HostArray | None]:
    """The bits :func:`cukern.rotary_embedding_positions` writes: :func:`rotary_embedding_emulated` with each
    token's row of :func:`rotary_positions_cos_sin` as its cache row.

    Examples
    --------
    >>> from cukern.reference import rotary_embedding_positions_emulated
    >>> q = np.ones((2, 1, 4), np.float32)
    >>> q_rot, _ = rotary_embedding_positions_emulated(np.array([0, 1]), q, None, 4, base=100.0)
    >>> print(q_rot[:, 0])
    [[ 1.          1.          1.          1.        ]
     [-0.30116868  0.89517075  1.3817732   1.0948375 ]]
    """
    rows = rotary_positions_cos_sin(positions, rotary_dim, base, scaling, max_position)
    return rotary_embedding_emulated(np.arange(rows.shape[0]), query, key, rows, is_neox=is_neox)


def mrope_rows(positions: Array, cos_sin_cache: Array, mrope_section: Sequence[int], interleaved: bool = False,
               rotary_dim: int | None = None) -> tuple[HostArray, HostArray]:
    """``(rows, ok)``: for each token the ``rotary_dim`` cos then sin values multimodal RoPE turns its pairs by,
    pair j's from the cache row of ``positions[r(j), t]`` (``r(j)``: the section of ``mrope_section`` j falls
    in, contiguous or interleaved as :func:`cukern.rotary.mrope_sections` says), in the cache's dtype; ``ok``:
    the tokens whose three positions are all inside the cache (the others' rows are meaningless).

    Examples
    --------
    >>> from cukern.reference import mrope_rows, rope_cache
    >>> positions = np.array([[0, 1], [2, 3], [3, 5]])  # [3, tokens]: time, height, width
    >>> rows, ok = mrope_rows(positions, rope_cache(4, 8), (2, 1, 1))
    >>> rows.shape, ok
    ((2, 8), array([ True, False]))
    """
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


def rotary_embedding_mrope(positions: Array, query: Array, key: Array | None, cos_sin_cache: Array,
                           mrope_section: Sequence[int], interleaved: bool = False, is_neox: bool = True,
                           rotary_dim: int | None = None) -> tuple[Array, Array | None]:
    """``(query, key)`` rotated by multimodal RoPE as float64 copies: :func:`rotary_embedding` with each token's
    :func:`mrope_rows` row; a token with a position outside the cache is left as it is.

    Examples
    --------
    >>> from cukern.reference import rope_cache, rotary_embedding, rotary_embedding_mrope
    >>> q = np.ones((1, 1, 8))
    >>> same = np.array([[2], [2], [2]])  # three equal positions: plain RoPE at that position
    >>> q_m, _ = rotary_embedding_mrope(same, q, None, rope_cache(4, 8), (2, 1, 1))
    >>> q_r, _ = rotary_embedding(np.array([2]), q, None, rope_cache(4, 8))
    >>> bool(np.allclose(q_m, q_r))
    True
    """
    rows, ok = mrope_rows(positions, cos_sin_cache, mrope_section, interleaved, rotary_dim)
    return rotary_embedding(np.where(ok, np.arange(rows.shape[0]), -1), query, key, rows, is_neox=is_neox)


def rotary_embedding_mrope_emulated(positions: Array, query: Array, key: Array | None, cos_sin_cache: Array,
                                    mrope_section: Sequence[int], interleaved: bool = False, is_neox: bool = True,
                                    rotary_dim: int | None = None) -> tuple[HostArray, HostArray | None]:
    """The bits :func:`cukern.rotary_embedding_mrope` writes: :func:`rotary_embedding_emulated` with each
    token's :func:`mrope_rows` row (the cache's own values, widened to float32 as the kernel widens them).

    Examples
    --------
    >>> from cukern.reference import rope_cache, rotary_embedding_mrope_emulated
    >>> q = np.ones((1, 1, 8), np.float32)
    >>> positions = np.array([[0], [1], [9]])  # width 9 is outside the 4-row cache: the token is left as it is
    >>> q_m, _ = rotary_embedding_mrope_emulated(positions, q, None, rope_cache(4, 8), (2, 1, 1))
    >>> print(q_m)
    [[[1. 1. 1. 1. 1. 1. 1. 1.]]]
    """
    rows, ok = mrope_rows(positions, cos_sin_cache, mrope_section, interleaved, rotary_dim)
    return rotary_embedding_emulated(np.where(ok, np.arange(rows.shape[0]), -1), query, key, rows, is_neox=is_neox)


def qk_norm_rope_backward(positions: Array, dq: Array, dk: Array | None, query: Array, key: Array | None,
                          q_weight: Array | None, k_weight: Array | None, cos_sin_cache: Array, eps: float = 1e-6,
                          offset: float = 0.0, is_neox: bool = True, rotary_dim: int | None = None
                          ) -> tuple[Array, Array | None, Array | None, Array | None]:
    """``(dquery, dkey, dq_weight, dk_weight)`` of :func:`qk_norm_rope` in float64: the gradients turned back
    (:func:`rotary_embedding` with ``inverse=True``, the rotation's transpose), then :func:`rms_norm_backward`
    over every head with the head's weight (weights summed over tokens and heads).

    Examples
    --------
    >>> from cukern.reference import qk_norm_rope_backward, rope_cache
    >>> q = np.array([[[3.0, 0.0, 0.0, 4.0]]])
    >>> dq = np.array([[[1.0, 0.0, 0.0, 0.0]]])
    >>> dquery, dkey, dqw, dkw = qk_norm_rope_backward(np.array([1]), dq, None, q, None, None, None,
    ...                                                rope_cache(2, 4, base=100.0), eps=0.0)
    >>> print(dquery, dkey, dqw, dkw)
    [[[ 0.13831739  0.         -0.33658839 -0.10373804]]] None None None
    """
    gq, gk = rotary_embedding(positions, dq, dk, cos_sin_cache, is_neox=is_neox, rotary_dim=rotary_dim, inverse=True)
    dquery, dqw = rms_norm_backward(gq, query, q_weight, eps, offset)
    dkey, dkw = (None, None) if key is None else rms_norm_backward(gk, key, k_weight, eps, offset)
    return dquery, dkey, dqw, dkw


def qk_norm_rope_backward_emulated(positions: Array, dq: Array, dk: Array | None, query: Array, key: Array | None,
                                   q_weight: Array | None, k_weight: Array | None, cos_sin_cache: Array,
                                   eps: float = 1e-6, offset: float = 0.0, is_neox: bool = True,
                                   rotary_dim: int | None = None
                                   ) -> tuple[HostArray, HostArray | None, HostArray | None, HostArray | None]:
    """The bits :func:`cukern.qk_norm_rope_backward` writes: :func:`rotary_embedding_emulated` of the gradients
    with ``inverse=True`` (rounded to query's dtype), then :func:`rms_norm_backward_emulated` over every head
    (rows: tokens then heads, in C order) with query's or key's weight.

    Examples
    --------
    >>> from cukern.reference import qk_norm_rope_backward_emulated, rope_cache
    >>> q = np.array([[[3.0, 0.0, 0.0, 4.0]]], np.float32)
    >>> dq = np.array([[[1.0, 0.0, 0.0, 0.0]]], np.float32)
    >>> dquery, _, _, _ = qk_norm_rope_backward_emulated(np.array([1]), dq, None, q, None, None, None,
    ...                                                  rope_cache(2, 4, base=100.0), eps=0.0)
    >>> print(dquery.dtype, dquery)
    float32 [[[ 0.13831738  0.         -0.33658838 -0.10373805]]]
    """
    gq, gk = rotary_embedding_emulated(positions, dq, dk, cos_sin_cache, is_neox=is_neox, rotary_dim=rotary_dim,
                                       inverse=True)
    dquery, dqw = rms_norm_backward_emulated(gq, query, q_weight, eps, offset)
    dkey, dkw = (None, None) if key is None else rms_norm_backward_emulated(gk, key, k_weight, eps, offset)
    return dquery, dkey, dqw, dkw
