"""Fused per-head RMSNorm and rotary embedding of query and key (kernel in ``cuda_src/qk_norm_rope.cu``), the
QK-norm of Qwen3, Gemma 3 and OLMo 2.

Reference (float64, :func:`cukern.reference.qk_norm_rope`), per token ``t`` with ``p = positions[t]``, per
head ``v`` of query (weight ``q_weight``) and of key (``k_weight``)::

    v = v / sqrt(mean(v**2) + eps) * (offset + weight)           # over head_size
    then v's pairs j < rot / 2 turned by cache[p, j], cache[p, W/2 + j]   (rotary_embedding)

Memory traffic, the count every GB/s figure uses (``bytes_moved``): every element of q and k read and
written once, both weights, one cache row of ``rot`` values and one position per token.

Reproducibility: the bits are those of :func:`cukern.rms_norm` over each head followed by
:func:`cukern.rotary_embedding` (:func:`cukern.reference.qk_norm_rope_emulated`), whatever the launch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

import cukern._check as _check
import cukern._tuned as _tuned
import cukern.rmsnorm_backward as _backward
import cukern.rotary as _rotary

from ._compile import Instantiation, get_kernel
from ._dtypes import BFLOAT16, FLOAT_TYPES, dtype_name
from ._interop import as_array, check_item_aligned
from ._launch import _NO_SWITCH
from ._launch import cupy as _cupy
from ._launch import NULL as _NULL
from ._launch import CallCache, LaunchConfig, Params, launch, on_device, sm_count, struct_argument
from ._layout import extent
from ._typing import DeviceArray
from .rmsnorm import _scalars, check_like_x, tree_classes
from .rotary import CHECK_PARAMS, _check_key_apart, _check_positions, _check_reads_apart, _elem_strides
from .rotary import _validate as _validate_rotary

SOURCE = "qk_norm_rope"
MAX_TPR = 32  # lanes a head: a group stays within a warp (shuffles, __syncwarp)
MAX_HEAD_SIZE = 1024  # a thread then holds at most 32 elements of its head
MAX_SHARED = 48 * 1024  # dynamic shared memory a block may take without opting in
MAX_GRID = 2**31 - 1
_F32 = np.dtype(np.float32)

# The kernel's scalars, one struct (``QkNormRopeParams`` in cuda_src/qk_norm_rope.cu): strides in elements.
PARAMS = Params((("slots", "i64"), ("q_ts", "i64"), ("q_hs", "i64"), ("k_ts", "i64"), ("k_hs", "i64"),
                 ("pos_stride", "i64"), ("cache_rows", "i64"), ("cache_ts", "i64"), ("sin_offset", "i64"),
                 ("pos64", "i32"), ("q_heads", "i32"), ("heads", "i32"), ("head_size", "i32"), ("rot", "i32"),
                 ("eps", "f32"), ("offset", "f32")))


@dataclass(frozen=True)
class Knobs:
    """The tuning space; no knob changes a head's bits. ``block``: threads per block (a multiple of 32, the
    kernel's launch bound), ``block / lanes`` heads at a time; ``waves``: grid cap in waves of resident
    blocks (``sm_count x 2048 / block``), blocks then walking further heads; None: a block per group of
    heads. The defaults are the H200 tuner's pick at 16384 tokens, 32 + 8 heads of 128 (docs/design/qk_norm_rope.md)."""

    block: int = 128
    waves: int | None = 4


DEFAULT_KNOBS = Knobs()
SPACE = {"block": (128, 256, 512), "waves": (None, 4, 8)}


def _tuning_rule() -> _tuned.Rule:
    """Cache entries keyed by shape ``(tokens, num_heads, num_kv_heads, head_size)``, tokens bucketed to a
    power of two. No knob decides a head's summation order, so no ``invariant`` knobs."""
    return _tuned.Rule("qk_norm_rope", DEFAULT_KNOBS, lambda d: Knobs(**d),
                       bucket=lambda s: f"tokens<={_tuned.rows_bucket(s[0])},heads={s[1]}+{s[2]},dim={s[3]}")


TUNING = _tuning_rule()


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(n, 1))))


@dataclass(frozen=True)
class Plan:
    """The launch for one call.

    A head is ``lanes`` threads; thread ``u`` holds vector columns ``u + i * lanes`` (``i < items``, ``vec``
    elements each), ``groups`` groups of ``vec`` summation classes (``groups * lanes * vec`` is
    :func:`cukern.rmsnorm.tree_classes` of head_size). ``pair``: NeoX pairs' halves ``pair`` items apart in
    one thread; 0: GPT-J (in a vector, or with the neighbouring lane) or NeoX through ``shared`` bytes of
    shared memory. ``block / lanes`` (token, head) slots a block at a time, ``grid`` blocks.
    """

    tokens: int
    heads: int  # query heads + key heads
    head_size: int
    rotary_dim: int
    is_neox: bool
    vec: int
    lanes: int
    groups: int
    items: int
    pair: int
    block: int
    grid: int
    shared: int

    @property
    def heads_per_block(self) -> int:
        return self.block // self.lanes

    @property
    def config(self) -> LaunchConfig:
        return LaunchConfig(grid=(self.grid,), block=(self.block,), shared_mem=self.shared)

    def instantiation(self, dtype, weight_dtype, cache_dtype) -> Instantiation:
        return Instantiation(SOURCE, "qk_norm_rope", (np.dtype(dtype), np.dtype(weight_dtype), np.dtype(cache_dtype),
                                                      self.vec, self.lanes, self.groups, self.items,
                                                      bool(self.is_neox), self.pair, self.block))


def plan(tokens: int, num_heads: int, num_kv_heads: int, head_size: int, rotary_dim: int, vec: int,
         is_neox: bool = True, itemsize: int = 2, sm_count: int = 132, knobs: Knobs = DEFAULT_KNOBS) -> Plan:
    """Pure launch planning from the counts, head_size, rotary_dim, the usable vector width and the style.

    The summation tree is fixed by head_size (:func:`cukern.rmsnorm.tree_classes`: C classes); a head gets
    ``lanes = min(32, C / vec)`` threads, each owning ``groups = C / (vec lanes)`` groups of classes and
    ``items = groups x s`` vectors, s the power of two at or above ``head_size / C`` (slots past the head
    stay empty). NeoX pairs ``(j, j + rot/2)`` sit ``pair = rot / (2 vec lanes)`` items apart in one thread
    when that divides evenly; otherwise the normalized head passes through shared memory. GPT-J needs
    neither. ``knobs.block`` threads a block (halved while the shared memory would pass 48 KiB); the grid
    covers the ``tokens x heads`` slots once, or at most ``knobs.waves`` waves of resident blocks.
    """
    if head_size < 2 or head_size > MAX_HEAD_SIZE:
        raise ValueError(f"head_size={head_size} must be between 2 and {MAX_HEAD_SIZE}")
    if rotary_dim < 2 or rotary_dim % 2 or rotary_dim > head_size:
        raise ValueError(f"rotary_dim={rotary_dim} must be even, from 2 to head_size={head_size}")
    if vec not in (1, 2, 4, 8) or head_size % vec or (rotary_dim // 2 if is_neox else rotary_dim) % vec:
        raise ValueError(f"vec={vec} does not divide head_size={head_size} and rotary_dim={rotary_dim} into "
                         f"{'NeoX' if is_neox else 'GPT-J'} vectors")
    if tokens < 0 or num_heads < 0 or num_kv_heads < 0:
        raise ValueError("token and head counts must be non-negative")
    if knobs.block % 32 or not 32 <= knobs.block <= 1024:
        raise ValueError(f"block={knobs.block} must be a multiple of 32 from 32 to 1024")
    classes = tree_classes(head_size)
    per_class = _pow2_at_least(math.ceil(head_size / classes))
    columns = classes // vec
    lanes = min(MAX_TPR, columns)
    groups = columns // lanes
    items = groups * per_class
    pair = 0
    if is_neox:
        h = rotary_dim // 2 // vec
        if h % lanes == 0:
            pair = h // lanes
    block = knobs.block
    row = head_size * itemsize if is_neox and pair == 0 else 0
    while block > 32 and (block // lanes) * row > MAX_SHARED:
        block //= 2
    heads = num_heads + num_kv_heads
    per_block = block // lanes
    grid = math.ceil(tokens * heads / per_block)
    if knobs.waves is not None:
        grid = min(grid, knobs.waves * max(sm_count, 1) * max(2048 // block, 1))
    grid = max(1, min(grid, MAX_GRID))
    return Plan(tokens, heads, head_size, rotary_dim, bool(is_neox), vec, lanes, groups, items, pair, block, grid,
                per_block * row)


def widest_vector(head_size: int, rotary_dim: int, is_neox: bool, itemsize: int) -> int:
    """The vector width the shape allows (alignment may still lower it to 1): 16 bytes' worth of elements when
    head_size and the rotated span (NeoX: ``rotary_dim / 2``, GPT-J: ``rotary_dim``) are multiples of it,
    else 1. The tuner and the card plan with this rule too."""
    vec = 16 // itemsize
    span = rotary_dim // 2 if is_neox else rotary_dim
    return vec if head_size % vec == 0 and span % vec == 0 else 1


def vector_width(query, key, q_weight, k_weight, cache, rotary_dim: int, is_neox: bool, sin_offset: int) -> int:
    """:func:`widest_vector` when every q/k address a thread touches is aligned to 16 bytes (base pointers,
    token and head strides), each weight to its own vector, and the cache's cos and sin slices to their
    packs (``vec`` values for NeoX, ``vec / 2`` for GPT-J); else 1 (element accesses)."""
    vec = widest_vector(query.shape[-1], rotary_dim, is_neox, query.itemsize)
    if vec == 1:
        return 1
    for a in (query, key):
        if a is not None and (a.data.ptr % 16 or any((s // a.itemsize) % vec for s in a.strides[:-1])):
            return 1
    for w in (q_weight, k_weight):
        if w is not None and w.data.ptr % min(16, vec * w.itemsize):
            return 1
    chunk = min(16, (vec if is_neox else vec // 2) * cache.itemsize)
    if cache.data.ptr % chunk or (sin_offset * cache.itemsize) % chunk or cache.strides[0] % chunk:
        return 1
    return vec


# What the compile tests cover: every dtype with its own weights and a float32 cache over the head shapes
# below, and bfloat16 with float32 weights or a bfloat16 cache at head 128; other points compile on first use.
_HEADS = ((64, 64), (128, 128), (128, 64), (128, 32), (256, 256))  # (head_size, rotary_dim)


def instantiations(knobs: Knobs = DEFAULT_KNOBS):
    """The instantiations the wrapper launches for the head shapes above, both styles and both vector widths
    (query's dtype for the weights, a float32 cache), and for bfloat16 with float32 weights or a bfloat16
    cache at head 128, generated by planning each."""
    points = [(t, t, _F32, heads) for t in FLOAT_TYPES for heads in _HEADS]
    points += [(BFLOAT16, w, c, (128, 128)) for w, c in ((_F32, _F32), (BFLOAT16, BFLOAT16))]
    out = set()
    for t, w, c, (head, rot) in points:
        for neox in (True, False):
            for vec in sorted({widest_vector(head, rot, neox, t.itemsize), 1}):
                p = plan(1 << 16, 32, 8, head, rot, vec, neox, t.itemsize, knobs=knobs)
                out.add(p.instantiation(t, w, c))
    return sorted(out, key=lambda i: (i.name, i.expression))


def bytes_moved(tokens: int, num_heads: int, num_kv_heads: int, head_size: int, dtype, rotary_dim: int | None = None,
                weight_dtype=None, cache_dtype=np.float32, positions_dtype=np.int64) -> int:
    """Bytes the op must move: every element of q and k read and written once, the weights (one per tensor
    that has heads; ``weight_dtype`` None: the data's dtype), one cache row of ``rotary_dim`` values and one
    position per token."""
    rot = head_size if rotary_dim is None else rotary_dim
    size = np.dtype(dtype).itemsize
    wsize = size if weight_dtype is None else np.dtype(weight_dtype).itemsize
    weights = (int(num_heads > 0) + int(num_kv_heads > 0)) * head_size * wsize
    return (2 * tokens * (num_heads + num_kv_heads) * head_size * size + weights
            + tokens * rot * np.dtype(cache_dtype).itemsize + tokens * np.dtype(positions_dtype).itemsize)


def _validate(positions, query, key, q_weight, k_weight, cache, rotary_dim):
    """rotary_embedding's checks of positions, query, key and the cache (:func:`cukern.rotary._validate`),
    then the weights': each None or ``[head_size]`` of query's dtype or float32, both of one dtype, on the
    device, unit stride (that they share no memory with query or key is :func:`_check_addresses`'). Reads no
    data."""
    args = _validate_rotary(positions, query, key, cache, rotary_dim)
    head_size = query.shape[2]
    if head_size > MAX_HEAD_SIZE:
        raise ValueError(f"query's head_size is {head_size}; at most {MAX_HEAD_SIZE} is supported")
    nkv = 0 if key is None else key.shape[1]
    if query.shape[1] + nkv > 2**31 - 1:
        raise ValueError(f"query and key have {query.shape[1] + nkv} heads together; at most 2^31 - 1 are supported")
    weights = {"q_weight": q_weight, "k_weight": k_weight}
    for n, w in weights.items():
        if w is None:
            continue
        if w.dtype not in (query.dtype, _F32):
            raise TypeError(f"{n} has dtype {dtype_name(w.dtype)}; it must be query's dtype "
                            f"({dtype_name(query.dtype)}) or float32")
        if w.ndim != 1 or w.shape[0] != head_size:
            raise ValueError(f"{n} has shape {w.shape}; it must be [head_size] = [{head_size}]")
    if q_weight is not None and k_weight is not None and q_weight.dtype != k_weight.dtype:
        raise TypeError(f"q_weight has dtype {dtype_name(q_weight.dtype)}, k_weight has "
                        f"{dtype_name(k_weight.dtype)}; they must match")
    _check.check_same_device({"query": query, **weights})
    for n, w in weights.items():
        if w is None:
            continue
        check_item_aligned(w, n)
        _check.check_unit_last_stride(w, n)
    return args


class _Call:
    """A validated, planned call for one combination of shapes, strides, dtypes, alignments, device, scalars
    and options: everything but the pointers, with the scalar arguments packed. ``inst`` None: tokens but no
    heads, so only the positions can be checked. The attributes rotary's position and key checks read
    (``cache_rows``, ``check_params``, ``check_kernel``, ``apart``) have their names there."""

    __slots__ = ("apart", "cache_rows", "check_kernel", "check_params", "config", "device", "has_key", "inst",
                 "kernel", "meet", "params", "spans", "struct")

    def __init__(self, device, cache_rows, check, inst=None, config=None, struct=None, has_key=False, meet=None):
        self.device, self.cache_rows, self.inst, self.config = device, cache_rows, inst, config
        self.check_params = struct_argument(check)
        self.struct, self.params = struct, (None if struct is None else struct_argument(struct))
        self.has_key = has_key
        self.meet = meet  # (lo, hi): key's pointer minus query's at which their extents meet; None: no key
        self.apart = None
        self.kernel = self.check_kernel = self.spans = None


_calls = CallCache()
_READS = ("q_weight", "k_weight", "positions", "cos_sin_cache")  # what _check_addresses checks apart
_MISSING = CallCache.MISSING


def _desc(a):
    if a is None:
        return None
    d = a.data
    return a.shape, a.strides, a.dtype, d.ptr & 15, d.device_id


def _call_key(positions, query, key, q_weight, k_weight, cache, eps, offset, is_neox, rotary_dim, knobs):
    """Everything :func:`_plan_call` reads from the arguments, as one flat tuple (the addresses themselves are
    checked on every call: :func:`_check_addresses`)."""
    if rotary_dim is not None and type(rotary_dim) is not int:
        from .rotary import _int_arg

        rotary_dim = _int_arg(rotary_dim, "rotary_dim")
    return (_desc(query), _desc(key), _desc(q_weight), _desc(k_weight), _desc(cache), _desc(positions), eps,
            offset, bool(is_neox), rotary_dim, knobs, _tuned.generation)


def _prepare(positions, query, key, q_weight, k_weight, cache, eps=1e-6, offset=0.0, is_neox=True, rotary_dim=None,
             knobs=DEFAULT_KNOBS):
    """Validate and plan (no GPU needed): the :class:`_Call`, or None when there are no tokens. Memoized on
    :func:`_call_key`; a call that fails validation is never stored."""
    eps, offset = _scalars(eps, offset)
    ck = _call_key(positions, query, key, q_weight, k_weight, cache, eps, offset, is_neox, rotary_dim, knobs)
    call = _calls.get(ck)
    if call is _MISSING:
        call = _plan_call(ck, positions, query, key, q_weight, k_weight, cache, eps, offset, is_neox, rotary_dim,
                          knobs)
    if call is not None:
        _check_addresses(call, positions, query, key, q_weight, k_weight, cache)
    return call


def _check_addresses(call, positions, query, key, q_weight, k_weight, cache) -> None:
    """What depends on the addresses themselves, checked on every call (the call cache keys on alignment
    only): key apart from query (rotary's exact check, decided once per offset), the arrays read apart from
    both."""
    meet = call.meet
    if meet is not None:
        koff = key.data.ptr - query.data.ptr
        if meet[0] < koff < meet[1] and koff != call.apart:
            _check_key_apart(call, query, key, koff)
    _check_reads_apart(call, _READS, (q_weight, k_weight, positions, cache), query, key)


def _plan_call(ck, positions, query, key, q_weight, k_weight, cache, eps, offset, is_neox, rotary_dim, knobs):
    """:func:`_prepare` for a key not seen yet: validate, plan, store under ``ck``."""
    eps, offset = _scalars(eps, offset)
    args = _validate(positions, query, key, q_weight, k_weight, cache, rotary_dim)
    q, k, cache, pos, rot = args.query, args.key, args.cache, args.positions, args.rotary_dim
    tokens, nh, head_size = q.shape
    nkv = 0 if k is None else k.shape[1]
    if not tokens:
        return _calls.put(ck, None)
    device = q.data.device_id
    check = CHECK_PARAMS.struct(pos_stride=_elem_strides(pos)[0], tokens=tokens, cache_rows=cache.shape[0])
    if not nh + nkv:
        return _calls.put(ck, _Call(device, cache.shape[0], check))
    if knobs is None:
        knobs = _tuned.lookup(TUNING, device, q.dtype, (tokens, nh, nkv, head_size))
    vec = vector_width(q, k, q_weight, k_weight, cache, rot, is_neox, args.sin_offset)
    p = plan(tokens, nh, nkv, head_size, rot, vec, is_neox, q.itemsize, sm_count(device), knobs)
    w = q_weight if q_weight is not None else k_weight
    qs = _elem_strides(q)
    ks = _elem_strides(k) if k is not None else (0, 0, 1)
    struct = PARAMS.struct(
        slots=tokens * (nh + nkv), q_ts=qs[0], q_hs=qs[1], k_ts=ks[0], k_hs=ks[1], pos_stride=_elem_strides(pos)[0],
        cache_rows=cache.shape[0], cache_ts=_elem_strides(cache)[0], sin_offset=args.sin_offset,
        pos64=int(pos.dtype == np.int64), q_heads=nh, heads=nh + nkv, head_size=head_size, rot=rot, eps=eps,
        offset=offset)
    meet = None
    if nkv and nh:
        qlo, qhi = extent(0, q.shape, q.strides, q.itemsize)
        klo, khi = extent(0, k.shape, k.strides, k.itemsize)
        meet = (qlo - khi, qhi - klo)
    inst = p.instantiation(q.dtype, q.dtype if w is None else w.dtype, cache.dtype)
    return _calls.put(ck, _Call(device, cache.shape[0], check, inst, p.config, struct, k is not None, meet))


def qk_norm_rope(positions: DeviceArray, query: DeviceArray, key: DeviceArray | None, q_weight: DeviceArray | None,
                 k_weight: DeviceArray | None, cos_sin_cache: DeviceArray, *, eps: float = 1e-6,
                 offset: float = 0.0, is_neox: bool = True, rotary_dim: int | None = None,
                 check_positions: bool = True) -> None:
    """Per-head RMSNorm then rotary position embedding, in place on ``query`` and ``key``, one launch for both.

    For every head ``v`` of token ``t`` (``w`` = ``q_weight`` for query's heads, ``k_weight`` for key's):
    ``v <- v / sqrt(mean(v**2) + eps) * (offset + w)`` over head_size, rounded to query's dtype, then, with
    ``p = positions[t]``, each pair ``j < rotary_dim / 2`` turned as :func:`cukern.rotary_embedding` turns it
    (``(x, y) <- (x cos - y sin, y cos + x sin)``, cos and sin from ``cos_sin_cache[p]``). The result has
    query's dtype and is bit for bit :func:`cukern.rms_norm` over each head followed by
    :func:`cukern.rotary_embedding` (:func:`cukern.reference.qk_norm_rope_emulated` computes it on the host),
    whatever the layout or the launch. Each element is read once and written once.

    Parameters
    ----------
    positions : cupy.ndarray, int32 or int64, shape ``[tokens]`` (any stride).
    query : cupy.ndarray, float32, float16 or bfloat16, ``[tokens, num_heads, head_size]``, head_size at
        most 1024; token and head strides are free (views into a fused qkv buffer work), the last stride must
        be 1.
    key : cupy.ndarray like query with ``[tokens, num_kv_heads, head_size]`` (any head count), or None. It
        must not share an element with query.
    q_weight, k_weight : cupy.ndarray ``[head_size]`` of query's dtype or float32 (both the same), or None
        (a weight of 1); they must not overlap query or key.
    cos_sin_cache : cupy.ndarray, float32 or query's dtype, ``[max_position, W]``: ``W/2`` cos then ``W/2``
        sin per row (:func:`cukern.rope_cache`).
    eps : float
        Finite and at least 0 (a Python or NumPy real number).
    offset : float
        Finite; ``1.0`` is the Gemma form ``(1 + w)``.
    is_neox : bool
        True rotates the two halves (NeoX, Llama, Qwen); False rotates interleaved pairs (GPT-J).
    rotary_dim : int, optional
        Even, at most head_size and W; defaults to W. Elements from rotary_dim on are normalized only.
    check_positions : bool
        As :func:`cukern.rotary_embedding`'s: True raises IndexError for a position outside the cache,
        naming the first such token, with query and key unchanged (one host synchronization before the
        launch; RuntimeError under CUDA-graph capture); False: no synchronization, and such tokens are
        normalized but not rotated.

    Returns
    -------
    None

    Examples
    --------
    >>> import cupy as cp
    >>> import cukern
    >>> q = cp.array([[[3.0, 0.0, 0.0, 4.0]]], dtype=cp.float32)
    >>> k = cp.ones((1, 1, 4), dtype=cp.float32)
    >>> cukern.qk_norm_rope(cp.array([1]), q, k, None, None, cukern.rope_cache(4, 4, base=100.0), eps=0.0)
    >>> print(q[0, 0], k[0, 0])
    [ 0.64836276 -0.15973346  1.0097651   1.5920067 ] [-0.30116868  0.89517075  1.3817732   1.0948375 ]
    """
    return _run(positions, query, key, q_weight, k_weight, cos_sin_cache, eps, offset, is_neox, rotary_dim,
                check_positions, None)


def _run(positions, query, key, q_weight, k_weight, cos_sin_cache, eps, offset, is_neox, rotary_dim,
         check_positions, knobs) -> None:
    is_neox = _check.check_flag(is_neox, "is_neox")
    check_positions = _check.check_flag(check_positions, "check_positions")
    nd = _cupy().ndarray
    if not (type(positions) is nd and type(query) is nd and type(cos_sin_cache) is nd
            and (key is None or type(key) is nd) and (q_weight is None or type(q_weight) is nd)
            and (k_weight is None or type(k_weight) is nd)):
        positions, cos_sin_cache = (as_array(a, n) for a, n in ((positions, "positions"),
                                                                (cos_sin_cache, "cos_sin_cache")))
        query = as_array(query, "query", writable=True)
        key = None if key is None else as_array(key, "key", writable=True)
        q_weight = None if q_weight is None else as_array(q_weight, "q_weight")
        k_weight = None if k_weight is None else as_array(k_weight, "k_weight")
    if type(eps) is not float or type(offset) is not float:
        eps, offset = _scalars(eps, offset)
    ck = _call_key(positions, query, key, q_weight, k_weight, cos_sin_cache, eps, offset, is_neox, rotary_dim, knobs)
    call = _calls.get(ck)
    if call is _MISSING:
        call = _plan_call(ck, positions, query, key, q_weight, k_weight, cos_sin_cache, eps, offset, is_neox,
                          rotary_dim, knobs)
    if call is None:  # no tokens
        return
    _check_addresses(call, positions, query, key, q_weight, k_weight, cos_sin_cache)
    switch = on_device(call.device)
    if switch is not _NO_SWITCH:
        with switch:
            return _run(positions, query, key, q_weight, k_weight, cos_sin_cache, eps, offset, is_neox, rotary_dim,
                        check_positions, knobs)
    if check_positions:
        _check_positions(call, positions)
    if call.inst is None:  # no heads
        return
    kernel = call.kernel
    if kernel is None:
        kernel = call.kernel = get_kernel(call.inst).kernel
    launch(kernel, call.config, (query, key if call.has_key else _NULL, _NULL if q_weight is None else q_weight,
                                 _NULL if k_weight is None else k_weight, cos_sin_cache, positions, call.params))


def qk_norm_rope_backward(positions: DeviceArray, dq: DeviceArray, dk: DeviceArray | None, query: DeviceArray,
                          key: DeviceArray | None, q_weight: DeviceArray | None, k_weight: DeviceArray | None,
                          cos_sin_cache: DeviceArray, *, eps: float = 1e-6, offset: float = 0.0,
                          is_neox: bool = True, rotary_dim: int | None = None
                          ) -> tuple[DeviceArray, DeviceArray | None, DeviceArray | None, DeviceArray | None]:
    """Gradients of :func:`qk_norm_rope`: the rotation undone on the gradients, then RMSNorm's backward per head.

    ``g = rotary_embedding(positions, dq, dk, cos_sin_cache, inverse=True)`` (a rotation's transpose is the
    rotation by -theta; the turned gradient is rounded to query's dtype, as the forward rounds the normalized
    head), then ``(dquery, dq_weight) = rms_norm_backward(g_q, query, q_weight, eps=eps, offset=offset)`` over
    every head of every token, and the same for key. q_weight is shared by the heads, so dq_weight sums over
    ``tokens * num_heads`` rows in :func:`cukern.rms_norm_backward`'s fixed tree: the bits depend on the values
    and the shapes only, never on the launch or the GPU
    (:func:`cukern.reference.qk_norm_rope_backward_emulated`). A position outside the cache leaves its token's
    gradient unrotated, as the forward with ``check_positions=False`` leaves the token.

    Parameters
    ----------
    positions, cos_sin_cache, eps, offset, is_neox, rotary_dim :
        The forward's (:func:`qk_norm_rope`).
    dq : cupy.ndarray like query: the gradient arriving at the rotated query; read only.
    dk : cupy.ndarray like key, or None exactly when key is None; read only.
    query, key : the forward's inputs, before normalization ([tokens, heads, head_size], free token and head
        strides, unit last stride).
    q_weight, k_weight : the forward's weights ([head_size], query's dtype or float32) or None.

    Returns
    -------
    (dquery, dkey, dq_weight, dk_weight): fresh C-contiguous arrays, dquery of query's shape and dtype, dkey of
    key's (None without key), dq_weight and dk_weight of the weights' dtype (None without a weight).

    Raises
    ------
    TypeError, ValueError
        As :func:`qk_norm_rope` and :func:`cukern.rms_norm_backward` raise them (and for dq or dk unlike query or
        key), every check before anything is launched.

    Examples
    --------
    >>> import cupy as cp
    >>> import cukern
    >>> from cukern.reference import qk_norm_rope_backward_emulated
    >>> pos = cp.array([1])
    >>> q = cp.array([[[3.0, 0.0, 0.0, 4.0]]], dtype=cp.float32)
    >>> k = cp.ones((1, 1, 4), dtype=cp.float32)
    >>> dq = cp.array([[[1.0, 0.0, 0.0, 0.0]]], dtype=cp.float32)
    >>> dk = cp.zeros((1, 1, 4), dtype=cp.float32)
    >>> w = cp.ones(4, dtype=cp.float32)
    >>> cache = cukern.rope_cache(4, 4, base=100.0)
    >>> dquery, dkey, dq_weight, dk_weight = cukern.qk_norm_rope_backward(pos, dq, dk, q, k, w, w, cache, eps=0.0)
    >>> print(dquery.shape, dkey.shape, dq_weight.dtype, dq_weight.shape)
    (1, 1, 4) (1, 1, 4) float32 (4,)
    >>> host = [None if a is None else cp.asnumpy(a) for a in (pos, dq, dk, q, k, w, w, cache)]
    >>> want = qk_norm_rope_backward_emulated(*host, eps=0.0)
    >>> all(bool((cp.asnumpy(a) == b).all()) for a, b in zip((dquery, dkey, dq_weight, dk_weight), want))
    True
    """
    e, o = _scalars(eps, offset)
    is_neox = _check.check_flag(is_neox, "is_neox")
    positions, cos_sin_cache = (as_array(a, n) for a, n in ((positions, "positions"), (cos_sin_cache, "cos_sin_cache")))
    query, dq = as_array(query, "query"), as_array(dq, "dq")
    key = None if key is None else as_array(key, "key")
    dk = None if dk is None else as_array(dk, "dk")
    q_weight = None if q_weight is None else as_array(q_weight, "q_weight")
    k_weight = None if k_weight is None else as_array(k_weight, "k_weight")
    if (dk is None) != (key is None):
        raise TypeError("dk is None but key is given; pass key's gradient" if dk is None
                        else "dk is given but key is None; pass both or neither")
    args = _validate(positions, query, key, q_weight, k_weight, cos_sin_cache, rotary_dim)
    for g, v, name, of in ((dq, query, "dq", "query"), (dk, key, "dk", "key")):
        if g is None:
            continue
        check_like_x({of: v, name: g}, (name,), like=of)
        _check.check_unit_last_stride(g, name)
        _check.check_same_device({of: v, name: g})
    with on_device(query.data.device_id):
        gq, gk = dq.copy(), None if dk is None else dk.copy()
        _rotary.rotary_embedding(positions, gq, gk, cos_sin_cache, is_neox=is_neox, rotary_dim=args.rotary_dim,
                                 inverse=True, check_positions=False)
        dquery, dq_weight = _backward.rms_norm_backward(gq, query, q_weight, eps=e, offset=o, dx=gq)
        dkey, dk_weight = (None, None) if key is None else _backward.rms_norm_backward(gk, key, k_weight, eps=e,
                                                                                       offset=o, dx=gk)
    return dquery, dkey, dq_weight, dk_weight
