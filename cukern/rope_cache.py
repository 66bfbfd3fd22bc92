"""The cos/sin cache :func:`cukern.rotary_embedding` reads, and the frequency scalings models publish for it.

Reference (float64, :func:`cukern.reference.rope_cache`): row ``p`` holds ``a cos(p w_j)`` for each pair
``j < rotary_dim / 2``, then ``a sin(p w_j)``, with ``w_j = base^(-2j / rotary_dim)`` adjusted by the
scaling and ``a`` YaRN's or LongRoPE's attention factor (else 1). Built on the host in float64 and rounded
once. A scaling is our dict or a model's ``config.json`` ``rope_scaling`` dict as it stands.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np

from ._dtypes import FLOAT_TYPES, dtype_name, parse_dtype
from ._launch import cupy as _cupy
from ._launch import require_gpu
from ._typing import DeviceArray, DTypeLike, HostArray

_SCALING_KEYS = {
    "linear": ({"factor"}, set()),
    "dynamic_ntk": ({"factor", "original_max_position"}, set()),
    "llama3": ({"factor", "low_freq_factor", "high_freq_factor", "original_max_position"}, set()),
    "yarn": ({"factor", "original_max_position"},
             {"beta_fast", "beta_slow", "mscale", "mscale_all_dim", "attention_factor", "truncate"}),
    "longrope": ({"short_factor", "long_factor", "original_max_position"},
                 {"factor", "attention_factor", "short_mscale", "long_mscale"}),
}
# A model's config.json (``rope_scaling``, or transformers' ``rope_parameters``) spells two of our keys and
# some of our types its own way: "su" is what early Phi-3 configs call longrope, "default" is plain RoPE, and
# "mrope" (Qwen2-VL) is plain RoPE too as far as the cache goes (its sections are the mrope op's).
_HF_KEYS = {"rope_type": "type", "original_max_position_embeddings": "original_max_position"}
_HF_TYPES = {"dynamic": "dynamic_ntk", "su": "longrope", "default": None, "mrope": None}
# Keys of the multimodal op (:func:`cukern.rotary_embedding_mrope`), which a default dict may carry.
_MROPE_KEYS = {"mrope_section", "mrope_interleaved"}
_TYPE_NAMES = sorted({*_SCALING_KEYS, *_HF_TYPES})
_POSITIVE = ("factor", "original_max_position", "low_freq_factor", "high_freq_factor", "beta_fast", "beta_slow",
             "attention_factor", "short_mscale", "long_mscale")


def _positive(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value) and float(value) > 0


def _yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def _yarn_attention(scaling: dict) -> tuple:
    """YaRN's attention factor as transformers reads the dict, and as DeepSeek's own code (and vLLM) does:
    transformers uses ``mscale`` only beside a nonzero ``mscale_all_dim``, DeepSeek fills a missing one in
    (``mscale`` 1, ``mscale_all_dim`` 0). They agree on every published config."""
    factor = scaling["factor"]
    mscale, all_dim = scaling.get("mscale"), scaling.get("mscale_all_dim")
    if mscale and all_dim:
        hf = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, all_dim)
    else:
        hf = _yarn_mscale(factor)
    deepseek = (_yarn_mscale(factor, 1.0 if mscale is None else mscale)
                / _yarn_mscale(factor, 0.0 if all_dim is None else all_dim))
    return hf, deepseek


def _check_scaling(scaling, max_position: int, rotary_dim: int, base) -> dict:
    """``scaling`` in our spelling, as a new dict (``{}`` for none): Hugging Face's key and type names
    mapped to ours, keys set to None dropped (transformers reads them as absent), ``rope_theta`` and
    ``partial_rotary_factor`` checked against ``base`` and ``rotary_dim`` and dropped, anything else a
    type does not take refused."""
    if scaling is None:
        return {}
    if not isinstance(scaling, dict):
        raise ValueError(f"scaling must be None or a dict (ours, or a config.json rope_scaling), got {scaling!r}")
    given: dict[Any, Any] = {}
    for key, value in scaling.items():
        name = _HF_KEYS.get(key, key)
        if value is None:
            continue
        if name == "type" and isinstance(value, str) and isinstance(given.get(name), str):
            if _HF_TYPES.get(given[name], given[name]) == _HF_TYPES.get(value, value):
                continue  # "type" and "rope_type" naming one kind ("su" and "longrope", as transformers writes)
        if name in given and given[name] != value:
            raise ValueError(f"scaling gives {name} twice ({given[name]!r}, then {value!r} as {key!r}); keep one")
        given[name] = value
    kind = given.pop("type", None)
    if not isinstance(kind, str) or kind not in _TYPE_NAMES:
        raise ValueError(f"scaling's type (or rope_type) {kind!r} is not one of {_TYPE_NAMES}")
    kind = _HF_TYPES.get(kind, kind)
    # The model's length, a config.json field beside rope_scaling that transformers reads for three types:
    # dynamic NTK's reference length (it ignores original_max_position_embeddings there), and LongRoPE's and
    # YaRN's default factor, max_position_embeddings / original_max_position.
    model_length = given.pop("max_position_embeddings", None)
    if model_length is not None:
        if not (isinstance(model_length, numbers.Integral) and not isinstance(model_length, bool)
                and int(model_length) > 1):
            raise ValueError(f"scaling's max_position_embeddings must be an int above 1, got {model_length!r}")
        if kind == "dynamic_ntk":
            given["original_max_position"] = int(model_length)
        elif kind in ("longrope", "yarn") and "factor" not in given and "original_max_position" in given:
            given["factor"] = int(model_length) / given["original_max_position"]
    theta = given.pop("rope_theta", base)
    if theta != base:
        raise ValueError(f"scaling's rope_theta={theta!r} is not base={base!r}; pass base={theta!r}")
    partial = given.pop("partial_rotary_factor", 1)
    if partial != 1:
        raise ValueError(f"scaling's partial_rotary_factor={partial!r} is not applied here: pass "
                         f"rotary_dim=int(head_dim * {partial!r}) and drop the key")
    if kind is None:
        if set(given) - _MROPE_KEYS:
            raise ValueError(f"default (unscaled) rope takes no {sorted(set(given) - _MROPE_KEYS)}")
        return {}
    required, optional = _SCALING_KEYS[kind]
    if required - set(given):
        field = "max_position_embeddings" if kind == "dynamic_ntk" else "original_max_position_embeddings"
        hint = (f" ({field} in a Hugging Face config, which keeps it beside rope_scaling rather than in it: add "
                "it)" if "original_max_position" in required - set(given) else "")
        raise ValueError(f"{kind} scaling needs {sorted(required - set(given))}{hint}")
    if set(given) - required - optional:
        raise ValueError(f"{kind} scaling does not take {sorted(set(given) - required - optional)}; it takes "
                         f"{sorted(required | optional)}")
    for key in _POSITIVE:
        if key in given and not _positive(given[key]):
            raise ValueError(f"{kind} scaling's {key} must be a positive number, got {given[key]!r}")
    if given.get("original_max_position", 2) <= 1:
        raise ValueError(f"{kind} scaling's original_max_position must be above 1, got "
                         f"{given['original_max_position']}")
    if kind == "llama3" and not given["low_freq_factor"] <= given["high_freq_factor"]:
        raise ValueError(f"llama3 scaling needs low_freq_factor <= high_freq_factor, got "
                         f"{given['low_freq_factor']}, {given['high_freq_factor']}")
    if kind == "yarn":
        _check_yarn(given)
    if kind == "longrope":
        _check_longrope(given, max_position, rotary_dim)
    return {"type": kind, **given}


def _check_yarn(given: dict) -> None:
    for key in ("mscale", "mscale_all_dim"):
        value = given.get(key)
        if value is not None and not (_positive(value) or value == 0):
            raise ValueError(f"yarn scaling's {key} must be a number >= 0, got {value!r}")
    if not isinstance(given.get("truncate", True), bool):
        raise ValueError(f"yarn scaling's truncate must be True or False, got {given['truncate']!r}")
    if "attention_factor" not in given:
        hf, deepseek = _yarn_attention(given)
        if not math.isclose(hf, deepseek, rel_tol=1e-12):
            raise ValueError(f"yarn scaling's mscale={given.get('mscale')!r} with mscale_all_dim="
                             f"{given.get('mscale_all_dim')!r} gives attention factor {hf!r} in transformers but "
                             f"{deepseek!r} in DeepSeek's code; give both as nonzero, or attention_factor")


def _check_longrope(given: dict, max_position: int, rotary_dim: int) -> None:
    for key in ("short_factor", "long_factor"):
        value = given[key]
        if isinstance(value, (str, bytes)) or not hasattr(value, "__len__"):
            raise ValueError(f"longrope scaling's {key} must be a list of numbers, got {type(value).__name__}")
        if len(value) != rotary_dim // 2:
            raise ValueError(f"longrope scaling's {key} must hold rotary_dim / 2 = {rotary_dim // 2} numbers, "
                             f"got {len(value)}")
        bad = next((i for i, v in enumerate(value) if not _positive(v)), None)
        if bad is not None:
            raise ValueError(f"longrope scaling's {key} must hold positive numbers, got {value[bad]!r} at {bad}")
    if "attention_factor" in given and {"short_mscale", "long_mscale"} & set(given):
        raise ValueError("longrope scaling takes attention_factor (transformers) or short_mscale/long_mscale "
                         "(vLLM, Phi-3-small), not both")
    # The attention factor belongs to the model's whole length, not to the rows asked for: a short-factor
    # cache of a long model would otherwise get 1 where the model uses its own.
    named = {"factor", "attention_factor", "short_mscale"} & set(given)
    if max_position <= given["original_max_position"] and not named:
        raise ValueError(f"longrope scaling with max_position={max_position} <= original_max_position="
                         f"{given['original_max_position']} needs factor (the model's max_position_embeddings / "
                         f"original_max_position), max_position_embeddings or attention_factor")


def _count(value, name: str) -> int:
    """``value`` as an int when it is one (Python or NumPy); a float is refused rather than rounded, so 4095.9
    rows never silently become 4095."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}; pass a whole number "
                        f"(int({name}) if truncating it is what you mean)")
    return int(value)


def reads_length(scaling: object) -> bool:
    """Whether a scaling's frequencies depend on the cache's length (dynamic NTK's base, LongRoPE's choice of
    factors and attention factor); the others' do not.

    Examples
    --------
    >>> from cukern.rope_cache import reads_length
    >>> reads_length({"rope_type": "dynamic", "factor": 2.0}), reads_length({"type": "linear", "factor": 2.0})
    (True, False)
    """
    if not isinstance(scaling, dict):
        return False
    kind = scaling.get("type")
    if kind is None:  # absent or None, which the checks read as absent: rope_type names it
        kind = scaling.get("rope_type")
    return isinstance(kind, str) and _HF_TYPES.get(kind, kind) in ("dynamic_ntk", "longrope")


_MAX_ELEMENTS = 1 << 62  # past this a table's size is not one NumPy can index (and nothing could hold it)


def check_sizes(max_position: int, rotary_dim: int, base: float) -> tuple[int, int, float]:
    """``(max_position, rotary_dim, base)`` checked, as two ints and a float.

    Examples
    --------
    >>> from cukern.rope_cache import check_sizes
    >>> check_sizes(np.int64(4096), 128, 10000)
    (4096, 128, 10000.0)
    >>> check_sizes(4096, 127, 10000.0)
    Traceback (most recent call last):
        ...
    ValueError: rotary_dim=127 must be a positive even number
    """
    max_position, rotary_dim = _count(max_position, "max_position"), _count(rotary_dim, "rotary_dim")
    if rotary_dim < 2 or rotary_dim % 2:
        raise ValueError(f"rotary_dim={rotary_dim} must be a positive even number")
    if max_position < 1:
        raise ValueError(f"max_position={max_position} must be positive")
    if max_position * rotary_dim > _MAX_ELEMENTS:
        raise ValueError(f"max_position={max_position} by rotary_dim={rotary_dim} is a table past 2^62 elements")
    if isinstance(base, bool) or not isinstance(base, numbers.Real):
        raise TypeError(f"base must be a real number, got {type(base).__name__}")
    try:
        b = float(base)
    except OverflowError:  # an int past float64
        b = math.inf
    if not 1 < b < math.inf:
        raise ValueError(f"base={base} must be finite and greater than 1")
    return max_position, rotary_dim, b


def rope_frequencies(max_position: int, rotary_dim: int, base: float = 10000.0,
                     scaling: dict[str, Any] | None = None) -> tuple[HostArray, float]:
    """``(inv_freq, attention)``: the ``rotary_dim / 2`` angular frequencies (float64 NumPy) and the factor
    cos and sin are scaled by (YaRN's or LongRoPE's attention factor, else 1), as the models that define each
    scaling publish them (HF transformers ``_compute_*_rope_parameters``). Arguments as :func:`rope_cache`'s.

    Examples
    --------
    >>> from cukern.rope_cache import rope_frequencies
    >>> inv_freq, attention = rope_frequencies(4096, 8, base=10000.0)
    >>> print(inv_freq, attention)
    [1.    0.1   0.01  0.001] 1.0
    >>> inv_freq, attention = rope_frequencies(4096, 8, scaling={"type": "linear", "factor": 4.0})
    >>> print(inv_freq, attention)
    [0.25    0.025   0.0025  0.00025] 1.0
    """
    max_position, rot, base = check_sizes(max_position, rotary_dim, base)
    scaling = _check_scaling(scaling, max_position, rot, base)
    kind = scaling.get("type")
    exponents = np.arange(0, rot, 2, dtype=np.float64) / rot
    inv_freq = 1.0 / base**exponents
    attention: Any = 1.0  # a scaling's factor, or None where its default applies
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
        wavelen = 2 * math.pi / inv_freq
        scaled = np.where(wavelen > orig / low, inv_freq / factor, inv_freq)
        # Llama 4 sets low == high: no band to blend over, only the step at wavelength orig / low.
        if low < high:
            smooth = (orig / wavelen - low) / (high - low)
            band = (wavelen >= orig / high) & (wavelen <= orig / low)
            scaled = np.where(band, (1 - smooth) * inv_freq / factor + smooth * inv_freq, scaled)
        inv_freq = scaled
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
        attention = scaling.get("attention_factor", _yarn_attention(scaling)[0])
    elif kind == "longrope":
        orig = scaling["original_max_position"]
        long = max_position > orig
        inv_freq = inv_freq / np.asarray(scaling["long_factor" if long else "short_factor"], dtype=np.float64)
        attention = scaling.get("attention_factor", scaling.get("long_mscale" if long else "short_mscale"))
        if attention is None:
            factor = scaling.get("factor", max_position / orig)
            attention = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(orig))
    return inv_freq, float(attention)


def rope_cache(max_position: int, rotary_dim: int, base: float = 10000.0, *, scaling: dict[str, Any] | None = None,
               dtype: DTypeLike = np.float32) -> DeviceArray:
    """The cos/sin cache :func:`cukern.rotary_embedding` reads: ``[max_position, rotary_dim]``, row ``p``
    holding ``a cos(p w_j)`` for ``j < rotary_dim / 2`` then ``a sin(p w_j)``, with
    ``w_j = base^(-2j / rotary_dim)`` adjusted by ``scaling`` and ``a`` YaRN's or LongRoPE's attention factor
    (else 1).

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
        ``{"type": "llama3", "factor", "low_freq_factor", "high_freq_factor", "original_max_position"}``
        (Llama 3.1; Llama 4 sets ``low_freq_factor == high_freq_factor``);
        ``{"type": "yarn", "factor", "original_max_position"}`` plus optional ``beta_fast`` (32),
        ``beta_slow`` (1), ``truncate`` (True), ``attention_factor``, or ``mscale`` with ``mscale_all_dim``
        (DeepSeek: ``m(mscale) / m(mscale_all_dim)``, ``m(k) = 0.1 k ln(factor) + 1``); the attention
        factor, ``m(1)`` by default, scales cos and sin;
        ``{"type": "longrope", "short_factor", "long_factor", "original_max_position"}`` (Phi-3: each
        frequency divided by its entry of ``long_factor`` when ``max_position > original_max_position``, else
        of ``short_factor``) plus optional ``factor`` (the model's length over the original,
        ``max_position / original_max_position`` by default; needed when the cache is no longer than the
        original) and ``attention_factor`` or vLLM's ``short_mscale``/``long_mscale``; the attention factor,
        ``sqrt(1 + ln(factor) / ln(original_max_position))`` by default, scales cos and sin.
        A Hugging Face ``rope_scaling`` dict is taken as it stands: ``rope_type`` for ``type`` (both may be
        given when they name one type), its types ``default`` and ``mrope`` (no scaling; ``mrope_section``
        and ``mrope_interleaved`` belong to :func:`cukern.rotary_embedding_mrope`), ``dynamic`` and ``su``
        for ``dynamic_ntk`` and ``longrope``, ``original_max_position_embeddings`` for
        ``original_max_position``, keys set to None read as absent, and transformers' ``rope_theta`` (must
        equal ``base``) and ``partial_rotary_factor`` (must be 1; pass ``rotary_dim = int(head_dim *
        partial_rotary_factor)`` instead). The config's ``max_position_embeddings`` may be added as
        transformers reads it: dynamic NTK's reference length (in place of ``original_max_position``), and
        LongRoPE's and YaRN's default ``factor``, ``max_position_embeddings / original_max_position`` (a
        LongRoPE cache shorter than the model then keeps the model's attention factor). Any other key raises
        ValueError.
    dtype : float32, float16 or bfloat16

    Returns
    -------
    cupy.ndarray ``[max_position, rotary_dim]``

    Examples
    --------
    >>> import cupy as cp
    >>> import cukern
    >>> from cukern.rope_cache import rope_cache_host
    >>> llama3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
    ...           "original_max_position_embeddings": 8192}
    >>> cache = cukern.rope_cache(4096, 128, 500000.0, scaling=llama3)
    >>> isinstance(cache, cp.ndarray), cache.shape, cache.dtype
    (True, (4096, 128), dtype('float32'))
    >>> host = rope_cache_host(4096, 128, 500000.0, scaling=llama3)
    >>> bool((cp.asnumpy(cache) == host.astype(np.float32)).all())
    True
    """
    dtype = parse_dtype(dtype)
    if dtype not in FLOAT_TYPES:
        raise TypeError(f"dtype {dtype_name(dtype)} is not supported; use float32, float16 or bfloat16")
    host = rope_cache_host(max_position, rotary_dim, base, scaling=scaling).astype(dtype)
    require_gpu()
    cupy = _cupy()
    if cupy.cuda.get_current_stream().is_capturing():
        raise RuntimeError("rope_cache uploads a table from the host, which a CUDA graph capture cannot record; "
                           "build the cache before capturing")
    return cupy.asarray(host)


def rope_cache_host(max_position: int, rotary_dim: int, base: float = 10000.0, *,
                    scaling: dict[str, Any] | None = None) -> HostArray:
    """:func:`rope_cache` in float64 on the host (NumPy), before rounding and upload.

    Examples
    --------
    >>> from cukern.rope_cache import rope_cache_host
    >>> print(rope_cache_host(3, 4, base=100.0).round(4))
    [[ 1.      1.      0.      0.    ]
     [ 0.5403  0.995   0.8415  0.0998]
     [-0.4161  0.9801  0.9093  0.1987]]
    """
    inv_freq, attention = rope_frequencies(max_position, rotary_dim, base, scaling)
    angles = np.outer(np.arange(int(max_position), dtype=np.float64), inv_freq)
    return np.concatenate([np.cos(angles), np.sin(angles)], axis=1) * attention
