"""The cos/sin cache :func:`cukern.rotary_embedding` reads, and the frequency scalings models publish for it.

Reference (float64, :func:`cukern.reference.rope_cache`): row ``p`` holds ``a cos(p w_j)`` for each pair
``j < rotary_dim / 2``, then ``a sin(p w_j)``, with ``w_j = base^(-2j / rotary_dim)`` adjusted by the
scaling and ``a`` YaRN's attention factor (else 1). Built on the host in float64 and rounded once.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from ._dtypes import FLOAT_TYPES, dtype_name

_SCALING_KEYS = {
    "linear": ({"factor"}, set()),
    "dynamic_ntk": ({"factor", "original_max_position"}, set()),
    "llama3": ({"factor", "low_freq_factor", "high_freq_factor", "original_max_position"}, set()),
    "yarn": ({"factor", "original_max_position"},
             {"beta_fast", "beta_slow", "mscale", "mscale_all_dim", "attention_factor", "truncate"}),
}


def _check_scaling(scaling) -> dict:
    if scaling is None:
        return {}
    if not isinstance(scaling, dict) or scaling.get("type") not in _SCALING_KEYS:
        raise ValueError(f"scaling must be None or a dict with 'type' one of {sorted(_SCALING_KEYS)}, got {scaling!r}")
    required, optional = _SCALING_KEYS[scaling["type"]]
    given = set(scaling) - {"type"}
    if required - given:
        raise ValueError(f"{scaling['type']} scaling needs {sorted(required - given)}")
    if given - required - optional:
        raise ValueError(f"{scaling['type']} scaling does not take {sorted(given - required - optional)}")
    if scaling["factor"] <= 0:
        raise ValueError(f"scaling factor must be positive, got {scaling['factor']}")
    return scaling


def _count(value, name: str) -> int:
    """``value`` as an int when it is one (Python or NumPy); a float is refused rather than rounded, so 4095.9
    rows never silently become 4095."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}; pass a whole number "
                        f"(int({name}) if truncating it is what you mean)")
    return int(value)


def _check_sizes(max_position, rotary_dim, base) -> tuple:
    max_position, rotary_dim = _count(max_position, "max_position"), _count(rotary_dim, "rotary_dim")
    if rotary_dim < 2 or rotary_dim % 2:
        raise ValueError(f"rotary_dim={rotary_dim} must be a positive even number")
    if max_position < 1:
        raise ValueError(f"max_position={max_position} must be positive")
    if not base > 1:
        raise ValueError(f"base={base} must be greater than 1")
    return max_position, rotary_dim


def _yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def rope_frequencies(max_position: int, rotary_dim: int, base: float = 10000.0, scaling=None):
    """``(inv_freq, attention)``: the ``rotary_dim / 2`` angular frequencies (float64 NumPy) and the factor
    cos and sin are scaled by (YaRN's attention factor, else 1), as the models that define each scaling
    publish them (HF transformers ``_compute_*_rope_parameters``). Arguments as :func:`rope_cache`'s."""
    max_position, rot = _check_sizes(max_position, rotary_dim, base)
    scaling = _check_scaling(scaling)
    kind = scaling.get("type")
    exponents = np.arange(0, rot, 2, dtype=np.float64) / rot
    inv_freq = 1.0 / base**exponents
    attention = 1.0
    if kind == "linear":
        inv_freq = inv_freq / scaling["factor"]
    elif kind == "dynamic_ntk":
        if rot < 4:
            raise ValueError("dynamic_ntk scaling needs rotary_dim >= 4 (its exponent is rot / (rot - 2))")
        factor, orig = scaling["factor"], scaling["original_max_position"]
        length = max(max_position, orig)
        scaled_base = base * (factor * length / orig - (factor - 1)) ** (rot / (rot - 2))
        inv_freq = 1.0 / scaled_base**exponents
    elif kind == "llama3":
        factor, orig = scaling["factor"], scaling["original_max_position"]
        low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
        if not 0 < low < high:
            raise ValueError(f"llama3 scaling needs 0 < low_freq_factor < high_freq_factor, got {low}, {high}")
        wavelen = 2 * math.pi / inv_freq
        smooth = (orig / wavelen - low) / (high - low)
        blended = (1 - smooth) * inv_freq / factor + smooth * inv_freq
        inv_freq = np.where(wavelen > orig / low, inv_freq / factor,
                            np.where(wavelen < orig / high, inv_freq, blended))
    elif kind == "yarn":
        factor, orig = scaling["factor"], scaling["original_max_position"]
        beta_fast, beta_slow = scaling.get("beta_fast", 32.0), scaling.get("beta_slow", 1.0)

        def correction_dim(rotations):
            return rot * math.log(orig / (rotations * 2 * math.pi)) / (2 * math.log(base))

        lo, hi = correction_dim(beta_fast), correction_dim(beta_slow)
        if scaling.get("truncate", True):
            lo, hi = math.floor(lo), math.ceil(hi)
        lo, hi = max(lo, 0), min(hi, rot - 1)
        if lo == hi:
            hi += 0.001
        ramp = np.clip((np.arange(rot // 2, dtype=np.float64) - lo) / (hi - lo), 0.0, 1.0)
        extrapolate = 1.0 - ramp
        inv_freq = inv_freq / factor * (1.0 - extrapolate) + inv_freq * extrapolate
        attention = scaling.get("attention_factor")
        if attention is None:
            mscale, all_dim = scaling.get("mscale"), scaling.get("mscale_all_dim")
            if mscale and all_dim:
                attention = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, all_dim)
            else:
                attention = _yarn_mscale(factor)
    return inv_freq, float(attention)


def rope_cache(max_position: int, rotary_dim: int, base: float = 10000.0, *, scaling=None, dtype=np.float32):
    """The cos/sin cache :func:`cukern.rotary_embedding` reads: ``[max_position, rotary_dim]``, row ``p``
    holding ``a cos(p w_j)`` for ``j < rotary_dim / 2`` then ``a sin(p w_j)``, with
    ``w_j = base^(-2j / rotary_dim)`` adjusted by ``scaling`` and ``a`` YaRN's attention factor (else 1).

    Computed in float64 on the host, rounded once to ``dtype`` (float32, float16 or bfloat16) and copied to
    the current device.

    Parameters
    ----------
    max_position : int
        Rows (positions 0 .. max_position - 1), at least 1. An int (Python or NumPy): a float raises
        TypeError rather than being rounded.
    rotary_dim : int
        Even and positive; an int, as ``max_position``.
    base : float
        Greater than 1.
    scaling : dict, optional
        ``{"type": "linear", "factor"}`` (positions / factor);
        ``{"type": "dynamic_ntk", "factor", "original_max_position"}`` (base scaled by
        ``(factor L / orig - (factor - 1))^(rot / (rot - 2))`` with ``L = max(max_position, orig)``);
        ``{"type": "llama3", "factor", "low_freq_factor", "high_freq_factor", "original_max_position"}``;
        ``{"type": "yarn", "factor", "original_max_position"}`` plus optional ``beta_fast`` (32),
        ``beta_slow`` (1), ``truncate`` (True), ``attention_factor``, or ``mscale`` with ``mscale_all_dim``
        (DeepSeek); the attention factor, ``0.1 ln(factor) + 1`` by default, scales cos and sin.
    dtype : float32, float16 or bfloat16

    Returns
    -------
    cupy.ndarray ``[max_position, rotary_dim]``
    """
    dtype = np.dtype(dtype)
    if dtype not in FLOAT_TYPES:
        raise TypeError(f"dtype {dtype_name(dtype)} is not supported; use float32, float16 or bfloat16")
    host = rope_cache_host(max_position, rotary_dim, base, scaling=scaling).astype(dtype)
    import cupy

    return cupy.asarray(host)


def rope_cache_host(max_position: int, rotary_dim: int, base: float = 10000.0, *, scaling=None) -> np.ndarray:
    """:func:`rope_cache` in float64 on the host (NumPy), before rounding and upload."""
    inv_freq, attention = rope_frequencies(max_position, rotary_dim, base, scaling)
    angles = np.outer(np.arange(int(max_position), dtype=np.float64), inv_freq)
    return np.concatenate([np.cos(angles), np.sin(angles)], axis=1) * attention
