"""Rotary position embedding (kernels in ``cuda_src/rotary.cu``) and its cos/sin cache.

Reference (float64, :func:`cukern.reference.rotary_embedding`), per token ``t`` with ``p = positions[t]``,
per head of query and key, per pair ``j < rot / 2``::

    c, s = cache[p, j], cache[p, W/2 + j]           # W = cache width; s = -s when inverse
    x, y = v[j], v[j + rot/2]    (NeoX)     or     v[2j], v[2j+1]    (GPT-J)
    x, y = x*c - y*s, y*c + x*s

Memory traffic, the count every GB/s figure uses (``bytes_moved``): the rotated elements of q and k read
and written, one cache row of ``rot`` values and one position per token.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from . import _check
from . import tuning as _tuning
from ._compile import Instantiation, get_kernel
from ._dtypes import FLOAT_TYPES, dtype_name
from ._launch import LaunchConfig, Params, Signature, launch, sm_count, struct_argument

SOURCE = "rotary"
MAX_BLOCK = 512  # launch bound and the most threads a block gets
RESIDENT_THREADS = 2048  # per SM on sm_80 and sm_90: one wave of the machine, as the planner counts it
CHECK_BLOCK, CHECK_UNROLL = 1024, 8
MAX_GRID = 2**31 - 1

POSITION_TYPES = (np.dtype(np.int32), np.dtype(np.int64))
_F32 = np.dtype(np.float32)

# The rotation kernel's scalars, one struct (``RotaryParams`` in cuda_src/rotary.cu): strides in elements.
PARAMS = Params((("tokens", "i64"), ("q_ts", "i64"), ("q_hs", "i64"), ("k_ts", "i64"), ("k_hs", "i64"),
                 ("pos_stride", "i64"), ("cache_rows", "i64"), ("cache_ts", "i64"), ("sin_offset", "i64"),
                 ("pos64", "i32"), ("q_heads", "i32"), ("heads", "i32"), ("rot", "i32"), ("lanes", "i32"),
                 ("groups", "i32"), ("tokens_per_block", "i32"), ("sin_sign", "f32")))
_CHECK_SIG = Signature(("ptr", "ptr", "i64", "i64", "i64"))


@dataclass(frozen=True)
class Knobs:
    """The tuning space (``bench/sweep_rotary.py`` measures it).

    ``items``: heads a thread loads before it rotates any (2 x 16 bytes each): the loads it keeps in flight.
    ``target_block``: threads a block is filled to with whole tokens. ``waves``: grid cap in waves of
    resident blocks (``sm_count x RESIDENT_THREADS / block``), blocks then walking further tokens and
    reading the next token's position ahead; None: one block per token group. ``min_blocks``: the
    kernel's ``__launch_bounds__`` minimum of ``MAX_BLOCK``-thread blocks per SM, i.e. a register cap
    (1: up to 128, 2: 64, 3: 40, 4: 32 a thread) that buys occupancy at the risk of spills."""

    items: int = 2
    target_block: int = 256
    waves: int | None = None
    min_blocks: int = 2


DEFAULT_KNOBS = Knobs()


def pairs_per_unit(vec: int, is_neox: bool) -> int:
    """Pairs one thread rotates per head: ``vec`` in both styles. NeoX takes ``vec`` elements from each
    half; GPT-J takes ``vec`` consecutive elements from each half of the rotated span (``vec / 2`` pairs
    each), or, with ``vec == 1``, the one pair ``(2u, 2u + 1)``."""
    return vec


@dataclass(frozen=True)
class Plan:
    """The rotation launch for one call.

    Each token gets ``lanes x groups`` threads: lane ``u`` owns unit ``u`` (``pairs`` pairs, two accesses
    of ``vec`` elements) of every head and keeps its cos/sin in registers; group ``g`` takes heads ``g, g +
    groups, ...`` of q then k, ``items`` of them loaded at once. ``tokens_per_block`` tokens share a block of
    ``block`` threads; ``grid`` blocks cover the tokens, looping when ``knobs.waves`` caps the grid (or past
    2^31 - 1 blocks).
    """

    tokens: int
    heads: int  # query heads + key heads
    rotary_dim: int
    is_neox: bool
    vec: int
    pairs: int
    units: int  # units per head
    lanes: int
    groups: int
    tokens_per_block: int
    block: int
    grid: int
    items: int = 2
    min_blocks: int = 2

    @property
    def threads_per_token(self) -> int:
        return self.lanes * self.groups

    @property
    def heads_per_thread(self) -> int:
        return math.ceil(self.heads / self.groups)

    @property
    def config(self) -> LaunchConfig:
        return LaunchConfig(grid=(self.grid,), block=(self.block,))

    def instantiation(self, dtype, cache_dtype) -> Instantiation:
        return rotation_instantiation(dtype, cache_dtype, self.vec, self.is_neox, self.items, self.min_blocks)


def rotation_instantiation(dtype, cache_dtype, vec: int, is_neox: bool, items: int = DEFAULT_KNOBS.items,
                           min_blocks: int = DEFAULT_KNOBS.min_blocks) -> Instantiation:
    return Instantiation(SOURCE, "rotary_embedding", (np.dtype(dtype), np.dtype(cache_dtype), vec, bool(is_neox),
                                                      items, MAX_BLOCK, min_blocks))


def check_instantiation(positions_dtype) -> Instantiation:
    return Instantiation(SOURCE, "rotary_first_bad_position", (np.dtype(positions_dtype), CHECK_BLOCK, CHECK_UNROLL))


def plan(tokens: int, num_heads: int, num_kv_heads: int, rotary_dim: int, vec: int, is_neox: bool = True,
         sm_count: int = 132, knobs: Knobs = DEFAULT_KNOBS) -> Plan:
    """Pure launch planning from the token and head counts, ``rotary_dim`` and the usable vector width.

    Units per head: ``rotary_dim / 2 / vec``; one lane per unit (at most ``MAX_BLOCK``, lanes looping
    past that). Heads per thread: one while the launch's units fit in one wave of resident threads
    (``sm_count x RESIDENT_THREADS``, small batches: latency), growing with the work up to
    ``knobs.items`` (large batches: fewer cos/sin loads and index computations per byte, more loads in
    flight). ``groups = ceil(heads / heads_per_thread)``, capped so a token fits in ``MAX_BLOCK`` threads.
    Tokens per block: as many whole tokens as fill ``knobs.target_block`` threads, but no more than spread
    the tokens over every SM, and at least a warp's worth. The grid covers the tokens once, or at most
    ``knobs.waves`` waves of resident blocks.
    """
    if rotary_dim < 2 or rotary_dim % 2:
        raise ValueError(f"rotary_dim={rotary_dim} must be a positive even number")
    if vec < 1 or (rotary_dim // 2) % vec or (not is_neox and vec > 1 and vec % 2):
        style = "NeoX" if is_neox else "GPT-J"
        raise ValueError(f"vec={vec} does not divide rotary_dim={rotary_dim} into {style} units")
    if tokens < 0 or num_heads < 0 or num_kv_heads < 0:
        raise ValueError("token and head counts must be non-negative")
    items = knobs.items
    heads = max(num_heads + num_kv_heads, 1)
    units = rotary_dim // 2 // vec
    lanes = min(units, MAX_BLOCK)
    wave = max(sm_count, 1) * RESIDENT_THREADS
    per_thread = min(max(math.ceil(tokens * heads * units / wave), 1), items)
    groups = max(1, min(math.ceil(heads / per_thread), MAX_BLOCK // lanes))
    tpt = lanes * groups
    tokens_per_block = max(1, min(max(knobs.target_block // tpt, 1), math.ceil(max(tokens, 1) / max(sm_count, 1))))
    tokens_per_block = max(tokens_per_block, min(32 // tpt, tokens))  # a block takes whole warps anyway
    block = tokens_per_block * tpt
    grid = math.ceil(tokens / tokens_per_block)
    if knobs.waves is not None:
        grid = min(grid, knobs.waves * max(sm_count, 1) * max(RESIDENT_THREADS // block, 1))
    grid = max(1, min(grid, MAX_GRID))
    return Plan(tokens, heads, rotary_dim, is_neox, vec, vec, units, lanes, groups, tokens_per_block,
                block, grid, items, knobs.min_blocks)


def vector_width(query, key, cache, rotary_dim: int, is_neox: bool, sin_offset: int) -> int:
    """16 bytes' worth of elements (``16 // itemsize``) when every q/k address a thread touches is aligned to
    it (base pointers, token and head strides, and rot / 2 divisible) and the cache's cos and sin slices
    are aligned to their own pack (``vec`` values for NeoX, ``vec / 2`` for GPT-J); else 1 (element
    accesses)."""
    vec = 16 // query.itemsize
    if (rotary_dim // 2) % vec:
        return 1
    for a in (query, key):
        if a is None:
            continue
        if a.data.ptr % 16 or any((s // a.itemsize) % vec for s in a.strides[:-1]):
            return 1
    chunk = min(16, (vec if is_neox else vec // 2) * cache.itemsize)
    if cache.data.ptr % chunk or (sin_offset * cache.itemsize) % chunk or (cache.strides[0] % chunk):
        return 1
    return vec


def instantiations(knobs: Knobs = DEFAULT_KNOBS):
    """Every instantiation the wrapper can launch, generated by planning each (dtype, cache dtype, vector
    width, style) it distinguishes, plus the position check for both position dtypes."""
    out = set()
    for t in FLOAT_TYPES:
        for c in sorted({t, _F32}, key=str):
            for vec in sorted({16 // t.itemsize, 1}):
                for neox in (True, False):
                    for tokens in (1, 1 << 20):
                        out.add(plan(tokens, 32, 8, 2 * 16 * vec, vec, neox, knobs=knobs).instantiation(t, c))
    for p in POSITION_TYPES:
        out.add(check_instantiation(p))
    return sorted(out, key=lambda i: (i.name, i.expression))


def bytes_moved(tokens: int, num_heads: int, num_kv_heads: int, rotary_dim: int, dtype,
                cache_dtype=np.float32, positions_dtype=np.int64) -> int:
    """Bytes the op must move: the ``rotary_dim`` rotated elements of every q and k head read and written,
    one cache row of ``rotary_dim`` values and one position per token. With ``rotary_dim == head_size`` this
    is ``2 (q + k) size + T rot cache_size + T pos_size``."""
    elems = tokens * (num_heads + num_kv_heads) * rotary_dim
    return (2 * elems * np.dtype(dtype).itemsize + tokens * rotary_dim * np.dtype(cache_dtype).itemsize
            + tokens * np.dtype(positions_dtype).itemsize)


@dataclass(frozen=True)
class _Args:
    positions: object
    query: object
    key: object
    cache: object
    rotary_dim: int
    sin_offset: int


def _validate(positions, query, key, cache, rotary_dim) -> _Args:
    """Every check on already-converted arrays; reads only shape, strides, dtype, itemsize, data.ptr and
    device, so it runs before anything touches the GPU."""
    if query.ndim != 3:
        raise ValueError(f"query has shape {query.shape}; it must be [tokens, num_heads, head_size]")
    _check.check_dtype(query, "query", FLOAT_TYPES)
    tokens, _, head_size = query.shape
    if key is not None:
        if key.ndim != 3:
            raise ValueError(f"key has shape {key.shape}; it must be [tokens, num_kv_heads, head_size]")
        if key.dtype != query.dtype:
            raise TypeError(
                f"key has dtype {dtype_name(key.dtype)}, query has {dtype_name(query.dtype)}; they must match")
        if key.shape[0] != tokens:
            raise ValueError(f"key has {key.shape[0]} tokens, query has {tokens}; they must match")
        if key.shape[2] != head_size:
            raise ValueError(f"key's head_size is {key.shape[2]}, query's is {head_size}; they must match")
    if positions.dtype not in POSITION_TYPES:
        raise TypeError(f"positions has dtype {dtype_name(positions.dtype)}; it must be int32 or int64")
    if positions.ndim != 1 or positions.shape[0] != tokens:
        raise ValueError(f"positions has shape {positions.shape}; it must be [tokens] = [{tokens}] like query")
    if cache.dtype not in (_F32, query.dtype):
        raise TypeError(f"cos_sin_cache has dtype {dtype_name(cache.dtype)}; it must be float32 or query's dtype "
                        f"({dtype_name(query.dtype)})")
    if cache.ndim != 2:
        raise ValueError(f"cos_sin_cache has shape {cache.shape}; it must be [max_position, rotary_dim]")
    width = cache.shape[1]
    if width % 2:
        raise ValueError(f"cos_sin_cache has odd width {width}; it must hold rot/2 cos then rot/2 sin per row")
    if rotary_dim is None:
        rotary_dim = width
    rotary_dim = int(rotary_dim)
    if rotary_dim < 2 or rotary_dim % 2:
        raise ValueError(f"rotary_dim={rotary_dim} must be a positive even number")
    if rotary_dim > head_size:
        raise ValueError(f"rotary_dim={rotary_dim} is over head_size={head_size}; pass rotary_dim <= {head_size}")
    if width < rotary_dim:
        raise ValueError(f"cos_sin_cache has width {width}, too narrow for rotary_dim={rotary_dim}; "
                         f"build it with rope_cache(max_position, {rotary_dim})")
    arrays = {"positions": positions, "query": query, "key": key, "cos_sin_cache": cache}
    _check.check_same_device(arrays)
    for n in ("query", "key", "cos_sin_cache"):
        if arrays[n] is not None and arrays[n].size:  # an empty array's strides mean nothing
            _check.check_unit_last_stride(arrays[n], n)
    for n in ("query", "key"):
        if arrays[n] is not None and arrays[n].size:
            _check.check_writable(arrays[n], n)
    for n, a in (("query", query), ("key", key)):
        if a is not None and a.shape[1] > 2**31 - 1:
            raise ValueError(f"{n} has {a.shape[1]} heads; at most 2^31 - 1 are supported")
    return _Args(positions, query, key, cache, rotary_dim, width // 2)


def _elem_strides(a):
    return tuple(s // a.itemsize for s in a.strides)


def _check_positions(args: _Args) -> None:
    import cupy

    pos = args.positions
    found = cupy.empty(2, dtype=np.int64)
    kernel = get_kernel(check_instantiation(pos.dtype))
    launch(kernel, LaunchConfig(grid=(1,), block=(CHECK_BLOCK,)), _CHECK_SIG,
           [found, pos, _elem_strides(pos)[0], pos.shape[0], args.cache.shape[0]])
    first, value = (int(v) for v in found.get())
    if first < pos.shape[0]:
        raise IndexError(
            f"positions[{first}] = {value} is outside cos_sin_cache's {args.cache.shape[0]} rows "
            f"(valid positions are 0..{args.cache.shape[0] - 1}); query and key are unchanged. Build a longer "
            "cache with rope_cache, or clamp the positions"
        )


def rotary_embedding(positions, query, key, cos_sin_cache, *, is_neox: bool = True, rotary_dim: int | None = None,
                     inverse: bool = False, check_positions: bool = True) -> None:
    """Rotary position embedding, in place on ``query`` and ``key``, one launch for both.

    For token ``t`` at ``p = positions[t]`` and each pair ``j < rotary_dim / 2`` of every head:
    ``(x, y) <- (x cos - y sin, y cos + x sin)`` with ``cos = cos_sin_cache[p, j]``,
    ``sin = cos_sin_cache[p, W/2 + j]`` (``W`` the cache's width; ``-sin`` when ``inverse``), and
    ``(x, y) = (v[j], v[j + rotary_dim/2])`` for NeoX or ``(v[2j], v[2j+1])`` for GPT-J. Computed in
    float32, rounded once to query's dtype. Elements from ``rotary_dim`` on are not touched.

    Parameters
    ----------
    positions : cupy.ndarray, int32 or int64, shape ``[tokens]`` (any stride).
    query : cupy.ndarray, float32, float16 or bfloat16, shape ``[tokens, num_heads, head_size]``; token
        and head strides are free (views into a fused qkv buffer work), the last stride must be 1.
    key : cupy.ndarray like query with ``[tokens, num_kv_heads, head_size]`` (any head count), or None.
        It must not share elements with query.
    cos_sin_cache : cupy.ndarray, float32 or query's dtype, ``[max_position, W]``: ``W/2`` cos then
        ``W/2`` sin per row (:func:`rope_cache` builds it). float32 is the accurate choice.
    is_neox : bool
        True rotates the two halves (NeoX, Llama); False rotates interleaved pairs (GPT-J).
    rotary_dim : int, optional
        Even, at most head_size and W; defaults to W.
    inverse : bool
        Rotate by -theta (undoes a rotation up to rounding).
    check_positions : bool
        True: a position outside ``[0, max_position)`` raises IndexError naming the first such token, with
        query and key unchanged (one host synchronization before the launch). False: no synchronization
        (CUDA-graph capture, hot loops); such tokens are left unrotated and the cache is never read out of
        bounds.

    Returns
    -------
    None
    """
    return _run(positions, query, key, cos_sin_cache, is_neox, rotary_dim, inverse, check_positions, None)


class _Call:
    """A validated, planned launch for one combination of shapes, strides, dtypes, alignments, device and
    options: everything but the four pointers, with the scalar arguments already packed."""

    __slots__ = ("device", "inst", "grid", "block", "struct", "params", "has_key", "rotary_dim", "sin_offset",
                 "kernel")

    def __init__(self, device, inst, grid, block, struct, has_key, rotary_dim, sin_offset):
        self.device, self.inst, self.grid, self.block = device, inst, grid, block
        self.struct, self.params = struct, struct_argument(struct)  # PARAMS: as NumPy, as the kernel argument
        self.has_key, self.kernel = has_key, None
        self.rotary_dim, self.sin_offset = rotary_dim, sin_offset


_calls: dict = {}
_MAX_CALLS = 4096
_NULL = np.uint64(0)


def _call_key(positions, query, key, cache, is_neox, rotary_dim, inverse, knobs) -> tuple:
    """Everything `_prepare` reads from its arguments: shapes, strides, dtypes, the pointers' 16-byte
    alignment and the device; one flat tuple (cheap to hash)."""
    qd, cd, pd = query.data, cache.data, positions.data
    kn = None if knobs is DEFAULT_KNOBS else (knobs.items, knobs.target_block, knobs.waves, knobs.min_blocks)
    if key is None:
        kk = kd = ks = kp = kv = None
    else:
        kdata = key.data
        kk, kd, ks, kp, kv = key.shape, key.dtype, key.strides, kdata.ptr & 15, kdata.device_id
    return (query.shape, query.strides, query.dtype, qd.ptr & 15, qd.device_id, kk, ks, kd, kp, kv, cache.shape,
            cache.strides, cache.dtype, cd.ptr & 15, cd.device_id, positions.shape, positions.strides,
            positions.dtype, pd.device_id, is_neox, rotary_dim, inverse, kn)


def _prepare(positions, query, key, cache, is_neox, rotary_dim, inverse, knobs=DEFAULT_KNOBS):
    """Validate and plan (no GPU needed): the :class:`_Call`, or None when there is nothing to rotate.
    Memoized on :func:`_call_key`; a call that fails validation is never stored."""
    ck = _call_key(positions, query, key, cache, is_neox, rotary_dim, inverse, knobs)
    call = _calls.get(ck, False)
    if call is not False:
        return call
    args = _validate(positions, query, key, cache, rotary_dim)
    q, k, cache, pos = args.query, args.key, args.cache, args.positions
    tokens = q.shape[0]
    nkv = 0 if k is None else k.shape[1]
    call = None
    if tokens and q.shape[1] + nkv:
        device = q.data.device_id
        vec = vector_width(q, k, cache, args.rotary_dim, is_neox, args.sin_offset)
        p = plan(tokens, q.shape[1], nkv, args.rotary_dim, vec, is_neox, sm_count(device), knobs)
        qs = _elem_strides(q)
        ks = _elem_strides(k) if k is not None else (0, 0, 1)
        struct = PARAMS.struct(
            tokens=tokens, q_ts=qs[0], q_hs=qs[1], k_ts=ks[0], k_hs=ks[1], pos_stride=_elem_strides(pos)[0],
            cache_rows=cache.shape[0], cache_ts=_elem_strides(cache)[0], sin_offset=args.sin_offset,
            pos64=int(pos.dtype == np.int64), q_heads=q.shape[1], heads=q.shape[1] + nkv, rot=args.rotary_dim,
            lanes=p.lanes, groups=p.groups, tokens_per_block=p.tokens_per_block, sin_sign=-1.0 if inverse else 1.0)
        call = _Call(device, p.instantiation(q.dtype, cache.dtype), (p.grid,), (p.block,), struct, k is not None,
                     args.rotary_dim, args.sin_offset)
    if len(_calls) >= _MAX_CALLS:
        _calls.clear()
    _calls[ck] = call
    return call


def _run(positions, query, key, cos_sin_cache, is_neox, rotary_dim, inverse, check_positions, knobs) -> None:
    import cupy

    nd = cupy.ndarray
    if not (type(positions) is nd and type(query) is nd and type(cos_sin_cache) is nd
            and (key is None or type(key) is nd)):
        positions, cos_sin_cache = (_check.as_array(a, n) for a, n in (
            (positions, "positions"), (cos_sin_cache, "cos_sin_cache")))
        query = _check.as_array(query, "query", writable=True)
        key = None if key is None else _check.as_array(key, "key", writable=True)
    if knobs is None:  # the tuning cache's winner for this device, dtype and shape, else the heuristic
        knobs = DEFAULT_KNOBS
        if query.ndim == 3:
            shape = (query.shape[0], query.shape[1], 0 if key is None or key.ndim != 3 else key.shape[1],
                     query.shape[2])
            knobs = _tuning.lookup("rotary_embedding" if is_neox else "rotary_embedding_gptj",
                                   query.data.device_id, query.dtype, shape) or DEFAULT_KNOBS
    call = _prepare(positions, query, key, cos_sin_cache, is_neox, rotary_dim, inverse, knobs)
    if call is None:  # no tokens or no heads
        return
    if cupy.cuda.runtime.getDevice() != call.device:
        with cupy.cuda.Device(call.device):
            return _launch(call, positions, query, key, cos_sin_cache, check_positions)
    _launch(call, positions, query, key, cos_sin_cache, check_positions)


def _launch(call, positions, query, key, cache, check_positions) -> None:
    if check_positions:
        _check_positions(_Args(positions, query, key, cache, call.rotary_dim, call.sin_offset))
    kernel = call.kernel
    if kernel is None:  # the compiled function on the current device, which is the call's
        kernel = call.kernel = get_kernel(call.inst).kernel
    kernel(call.grid, call.block, (query, key if call.has_key else _NULL, cache, positions, call.params))


# ----------------------------------------------------------------------------------------------- cache

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


def _yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def rope_frequencies(max_position: int, rotary_dim: int, base: float = 10000.0, scaling=None):
    """``(inv_freq, attention)``: the ``rotary_dim / 2`` angular frequencies (float64 NumPy) and the factor
    cos and sin are scaled by (YaRN's attention factor, else 1), as the models that define each scaling
    publish them (HF transformers ``_compute_*_rope_parameters``)."""
    scaling = _check_scaling(scaling)
    kind = scaling.get("type")
    rot = rotary_dim
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
    """The cos/sin cache :func:`rotary_embedding` reads: ``[max_position, rotary_dim]``, row ``p`` holding
    ``a cos(p w_j)`` for ``j < rotary_dim / 2`` then ``a sin(p w_j)``, with ``w_j = base^(-2j / rotary_dim)``
    adjusted by ``scaling`` and ``a`` YaRN's attention factor (else 1).

    Computed in float64 on the host, rounded once to ``dtype`` (float32, float16 or bfloat16) and copied to
    the current device.

    Parameters
    ----------
    max_position : int
        Rows (positions 0 .. max_position - 1).
    rotary_dim : int
        Even.
    base : float
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
    import cupy

    dtype = np.dtype(dtype)
    if dtype not in FLOAT_TYPES:
        raise TypeError(f"dtype {dtype_name(dtype)} is not supported; use float32, float16 or bfloat16")
    return cupy.asarray(rope_cache_host(max_position, rotary_dim, base, scaling=scaling).astype(dtype))


def rope_cache_host(max_position: int, rotary_dim: int, base: float = 10000.0, *, scaling=None) -> np.ndarray:
    """:func:`rope_cache` in float64 on the host (NumPy), before rounding and upload."""
    if rotary_dim < 2 or rotary_dim % 2:
        raise ValueError(f"rotary_dim={rotary_dim} must be a positive even number")
    if max_position < 1:
        raise ValueError(f"max_position={max_position} must be positive")
    if not base > 1:
        raise ValueError(f"base={base} must be greater than 1")
    inv_freq, attention = rope_frequencies(max_position, rotary_dim, base, scaling)
    angles = np.outer(np.arange(max_position, dtype=np.float64), inv_freq)
    return np.concatenate([np.cos(angles), np.sin(angles)], axis=1) * attention
