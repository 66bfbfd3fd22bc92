"""Rotary position embedding (kernels in ``cuda_src/rotary.cu``); the cos/sin cache it reads is built by
:mod:`cukern.rope_cache`.

Reference (float64, :func:`cukern.reference.rotary_embedding`), per token ``t`` with ``p = positions[t]``,
per head of query and key, per pair ``j < rot / 2``::

    c, s = cache[p, j], cache[p, W/2 + j]           # W = cache width; s = -s when inverse
    x, y = v[j], v[j + rot/2]    (NeoX)     or     v[2j], v[2j+1]    (GPT-J)
    x, y = x*c - y*s, y*c + x*s

Memory traffic, the count every GB/s figure uses (``bytes_moved``): the rotated elements of q and k read
and written, one cache row of ``rot`` values and one position per token.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import numbers
import threading
from dataclasses import dataclass
from fractions import Fraction
from types import SimpleNamespace
from typing import Any, Sequence

import numpy as np

import cukern._check as _check
import cukern._tuned as _tuned

from ._compile import Instantiation, get_kernel
from ._dtypes import FLOAT_TYPES, dtype_name
from ._interop import as_array, check_item_aligned
from ._launch import _NO_SWITCH
from ._launch import cupy as _cupy
from ._launch import NULL as _NULL
from ._launch import CallCache, LaunchConfig, Params, launch, on_device, sm_count, struct_argument
from ._layout import extent
from ._typing import DeviceArray

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
# The position check's (``RotaryCheckParams``), packed once per call layout like PARAMS.
CHECK_PARAMS = Params((("pos_stride", "i64"), ("tokens", "i64"), ("cache_rows", "i64")))
_CHECK_CONFIG = LaunchConfig(grid=(1,), block=(CHECK_BLOCK,))
# rotary_embedding_positions' scalars (``RotaryPositionsParams``).
POSITIONS_PARAMS = Params((("tokens", "i64"), ("q_ts", "i64"), ("q_hs", "i64"), ("k_ts", "i64"), ("k_hs", "i64"),
                           ("pos_stride", "i64"), ("attention", "f64"), ("two_over_pi", "f64"), ("pio2_1", "f64"),
                           ("pio2_2", "f64"), ("pio2_3", "f64"), ("pos64", "i32"), ("q_heads", "i32"),
                           ("heads", "i32"), ("rot", "i32"), ("lanes", "i32"), ("groups", "i32"),
                           ("tokens_per_block", "i32")))


# rotary_embedding_mrope's scalars (``RotaryMropeParams``).
MROPE_PARAMS = Params((("tokens", "i64"), ("q_ts", "i64"), ("q_hs", "i64"), ("k_ts", "i64"), ("k_hs", "i64"),
                       ("pos_stride", "i64"), ("pos_row_stride", "i64"), ("cache_rows", "i64"), ("cache_ts", "i64"),
                       ("sin_offset", "i64"), ("pos64", "i32"), ("q_heads", "i32"), ("heads", "i32"), ("rot", "i32"),
                       ("lanes", "i32"), ("groups", "i32"), ("tokens_per_block", "i32"), ("section_a", "i32"),
                       ("section_b", "i32"), ("interleaved", "i32")))


def top_bits(x, bits: int = 29):
    """``x`` (a float64 scalar or array) with all but its ``bits`` leading significant bits cleared (toward
    zero): a float64 whose product with an integer under ``2^(53 - bits)`` is exact."""
    a = np.asarray(x, np.float64)
    return (a.view(np.uint64) & ~np.uint64((1 << (53 - bits)) - 1)).view(np.float64)


# pi / 2 as pio2_1 + pio2_2 + pio2_3 (the first two of 29 significant bits, from 80 digits of pi) and 2 / pi,
# for the argument reduction of cuda_src/rotary.cu `cos_sin_at`.
_PI = Fraction("3.1415926535897932384626433832795028841971693993751058209749445923078164062862089986")
PIO2_1 = float(top_bits(float(_PI / 2)))
PIO2_2 = float(top_bits(float(_PI / 2 - Fraction(PIO2_1))))
PIO2_3 = float(_PI / 2 - Fraction(PIO2_1) - Fraction(PIO2_2))
TWO_OVER_PI = float(2 / _PI)
POSITION_LIMIT = 2**24  # |position| below which cos_sin_at's argument reduction is exact


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

    def __post_init__(self):
        # a tuning cache entry that fails here is dropped with a warning (the heuristic's knobs are used)
        _check.check_least_int(self, "items", 1)
        _check.check_least_int(self, "target_block", 1)
        _check.check_least_int(self, "min_blocks", 1)
        if self.waves is not None:
            _check.check_least_int(self, "waves", 1)


DEFAULT_KNOBS = Knobs()
_KNOB_NAMES = frozenset(f.name for f in dataclasses.fields(Knobs))


def _tuning_rule(op: str) -> _tuned.Rule:
    """Cache entries keyed by shape ``(tokens, num_heads, num_kv_heads, head_size)``, tokens bucketed to a
    power of two."""
    return _tuned.Rule(op, DEFAULT_KNOBS, lambda d: Knobs(**{k: v for k, v in d.items() if k in _KNOB_NAMES}),
                       bucket=lambda s: f"tokens<={_tuned.rows_bucket(s[0])},heads={s[1]}+{s[2]},dim={s[3]}")


TUNING = {True: _tuning_rule("rotary_embedding"), False: _tuning_rule("rotary_embedding_gptj")}


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


# rotary_embedding_positions' heads a thread loads at once: one where the launch fits in one wave of resident
# threads (decode: the fewest registers and instructions), four past it (prefill: more loads in flight while
# the block computes its cos and sin table). Measured on the H200 against the cached kernel's default of two
# (docs/design/rotary.md, "Heads a thread"): one token, 32 + 8 heads of 128,
# bf16 5.38 -> 5.25 us (the cached kernel 5.31); [16384, 32 + 8, 128] 85.2% -> 89.2% of the copy.
POSITIONS_ITEMS = (1, 4)


def positions_instantiation(dtype, vec: int, is_neox: bool, items: int = POSITIONS_ITEMS[-1]) -> Instantiation:
    return Instantiation(SOURCE, "rotary_embedding_positions", (np.dtype(dtype), vec, bool(is_neox), items, MAX_BLOCK))


def mrope_instantiation(dtype, cache_dtype, vec: int, is_neox: bool, items: int = DEFAULT_KNOBS.items) -> Instantiation:
    return Instantiation(SOURCE, "rotary_embedding_mrope", (np.dtype(dtype), np.dtype(cache_dtype), vec, bool(is_neox),
                                                            items, MAX_BLOCK))


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
    target = min(knobs.target_block, MAX_BLOCK)  # a tuning entry past the launch bound would not launch
    tokens_per_block = max(1, min(max(target // tpt, 1), math.ceil(max(tokens, 1) / max(sm_count, 1))))
    tokens_per_block = max(tokens_per_block, min(32 // tpt, tokens))  # a block takes whole warps anyway
    block = tokens_per_block * tpt
    grid = math.ceil(tokens / tokens_per_block)
    if knobs.waves is not None:
        grid = min(grid, knobs.waves * max(sm_count, 1) * max(RESIDENT_THREADS // block, 1))
    grid = max(1, min(grid, MAX_GRID))
    return Plan(tokens, heads, rotary_dim, is_neox, vec, vec, units, lanes, groups, tokens_per_block,
                block, grid, items, knobs.min_blocks)


def widest_vector(rotary_dim: int, itemsize: int) -> int:
    """The vector width the shape allows (alignment may still lower it to 1): 16 bytes' worth of elements
    when ``rotary_dim / 2`` is a multiple of it, else 1. The tuner plans with this rule too."""
    vec = 16 // itemsize
    return vec if (rotary_dim // 2) % vec == 0 else 1


def vector_width(query, key, cache, rotary_dim: int, is_neox: bool, sin_offset: int) -> int:
    """:func:`widest_vector` when every q/k address a thread touches is aligned to it (base pointers,
    token and head strides) and the cache's cos and sin slices are aligned to their own pack (``vec``
    values for NeoX, ``vec / 2`` for GPT-J); else 1 (element accesses)."""
    vec = widest_vector(rotary_dim, query.itemsize)
    if vec == 1:
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
                    for items in POSITIONS_ITEMS:
                        out.add(positions_instantiation(t, vec, neox, items))
                    out.add(mrope_instantiation(t, c, vec, neox, knobs.items))
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


def _arg_key(value) -> tuple:
    """A scalar argument's part of a call cache's key: its type with its value, so that 4096.0 cannot find the
    call 4096 stored (the checks tell them apart), or its identity when it cannot be hashed (the checks
    refuse it, so it is never stored)."""
    try:
        hash(value)
    except TypeError:
        return type(value), id(value)
    return type(value), value


def _int_arg(value, name: str) -> int:
    """``value`` as an int when it is one (Python or NumPy); a float is refused, never rounded."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    return int(value)


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
    rotary_dim = width if rotary_dim is None else _int_arg(rotary_dim, "rotary_dim")
    if rotary_dim < 2 or rotary_dim % 2:
        raise ValueError(f"rotary_dim={rotary_dim} must be a positive even number")
    if rotary_dim > head_size:
        raise ValueError(f"rotary_dim={rotary_dim} is over head_size={head_size}; pass rotary_dim <= {head_size}")
    if width < rotary_dim:
        raise ValueError(f"cos_sin_cache has width {width}, too narrow for rotary_dim={rotary_dim}; "
                         f"build it with rope_cache(max_position, {rotary_dim})")
    arrays = {"positions": positions, "query": query, "key": key, "cos_sin_cache": cache}
    _check.check_same_device(arrays)
    for n, a in arrays.items():  # (CuPy arrays skip as_array's check on the call's fast path)
        if a is not None:
            check_item_aligned(a, n)
    for n in ("query", "key", "cos_sin_cache"):
        if arrays[n] is not None and arrays[n].size:  # an empty array's strides mean nothing
            _check.check_unit_last_stride(arrays[n], n)
    for n in ("query", "key"):
        if arrays[n] is not None and arrays[n].size:
            _check.check_writable(arrays[n], n)
    heads = query.shape[1] + (0 if key is None else key.shape[1])
    if heads > 2**31 - 1:  # the kernels' head count is an int
        raise ValueError(f"query and key have {heads} heads together; at most 2^31 - 1 are supported")
    return _Args(positions, query, key, cache, rotary_dim, width // 2)


def _elem_strides(a):
    return tuple(s // a.itemsize for s in a.strides)


def _check_key_apart(call, query, key, offset: int) -> None:
    """Refuse a key that shares an element with query (``key=query`` would be rotated twice, overlapping
    views raced). Called when their extents meet (``offset``, key's pointer minus query's, is inside
    ``call.meet``), which views of one fused qkv buffer do without sharing an element: decided exactly,
    and an offset found apart is remembered, so a hot loop over the same buffer decides it once."""
    if _check.shares_elements(query, key):
        raise ValueError("key overlaps query; they must share no element (key=query would be rotated twice): "
                         "pass separate arrays, or views of different heads")
    call.apart = offset


def read_spans(arrays) -> tuple:
    """Each array's extent relative to its own pointer, None for a missing or empty one: fixed by the shapes
    and strides a call's key holds, so worked out once a call."""
    return tuple(None if a is None or not a.size else extent(0, a.shape, a.strides, a.itemsize) for a in arrays)


def _check_reads_apart(call, names, reads, query, key) -> None:
    """Refuse an array the kernel reads (``names``, ``reads``) that shares an element with query or key, which
    it writes: other tokens' threads would read it written or not, as they run. It depends on the addresses,
    so every call checks it; with each array's extent relative to its pointer kept on the call
    (``call.spans``, made on its first use) that is a few additions and comparisons, and the exact test runs
    only where two extents meet."""
    spans = call.spans
    if spans is None:
        spans = call.spans = (read_spans(reads), read_spans((query, key)))
    written = []
    for name, w, span in zip(("query", "key"), (query, key), spans[1]):
        if span is not None:
            ptr = w.data.ptr
            written.append((name, w, ptr + span[0], ptr + span[1]))
    for name, a, span in zip(names, reads, spans[0]):
        if span is None:
            continue
        ptr = a.data.ptr
        lo, hi = ptr + span[0], ptr + span[1]
        for target, w, wlo, whi in written:
            if lo < whi and wlo < hi and _check.shares_elements(a, w):
                raise ValueError(f"{name} overlaps {target}, which this op writes; pass a separate array")


_READS = ("positions", "cos_sin_cache")  # what _launch_call checks apart from query and key
_found = threading.local()


def _found_pair():
    """This thread's answer slot for the position check: two int64 in pinned host memory, mapped into every
    device's address space (unified addressing: the host address is the device address), which the check
    kernel writes directly, as ``(NumPy view, kernel argument)``. A checked call reads it back before it
    returns, so one per thread is never shared by two checks in flight."""
    pair = getattr(_found, "pair", None)
    if pair is None:
        cuda = _cupy().cuda
        flags = cuda.runtime.hostAllocPortable | cuda.runtime.hostAllocMapped
        mem = cuda.PinnedMemoryPointer(cuda.PinnedMemory(16, flags), 0)
        pair = _found.pair = (np.frombuffer(mem, np.int64, 2), struct_argument(np.array(mem.ptr, np.uint64)))
    return pair


# How many times a checked call reads its answer slot, waiting for the check kernel's answer, before it waits
# for the stream instead: about a millisecond of reads, where an idle stream answers in microseconds (a long
# check, or one queued behind other work, then waits in the driver, which also raises an earlier kernel's
# error). Reading the slot returns as soon as the kernel's store reaches the host, before the kernel's end
# is signalled and the driver's wait returns.
CHECK_READS = 10000


def _check_positions(call, positions) -> None:
    """IndexError naming the first token whose position is outside the cache, before the rotation is launched:
    one small kernel on the current stream writes its answer into pinned host memory, the host sets the slot
    to -1, launches, and reads it until the kernel's answer arrives (no allocation, no copy; CHECK_READS).
    ``[3, tokens]`` positions (:func:`rotary_embedding_mrope`, its call knowing the bytes between rows) are
    checked row by row, a launch and a wait each, and the error names ``positions[r, t]``. Refused while the
    stream captures a CUDA graph, where the host cannot wait, before anything is recorded."""
    stream = _cupy().cuda.get_current_stream()
    if stream.is_capturing():
        raise RuntimeError("check_positions=True waits for the GPU, which a CUDA graph capture cannot do; pass "
                           "check_positions=False while capturing (out-of-range tokens are then left unrotated)")
    host, address = _found_pair()
    kernel = call.check_kernel
    if kernel is None:
        kernel = call.check_kernel = get_kernel(check_instantiation(positions.dtype)).kernel
    rows = 1 if positions.ndim == 1 else positions.shape[0]
    for r in range(rows):
        row = positions if rows == 1 else positions.data + r * call.row_bytes
        host[0] = -1
        launch(kernel, _CHECK_CONFIG, (address, row, call.check_params))
        for _ in range(CHECK_READS):
            if host[0] >= 0:
                break
        else:
            stream.synchronize()
        first, value = host.tolist()
        if first < positions.shape[-1]:
            where = first if rows == 1 else f"{r}, {first}"
            cache_rows = call.cache_rows
            raise IndexError(
                f"positions[{where}] = {value} is outside cos_sin_cache's {cache_rows} rows "
                f"(valid positions are 0..{cache_rows - 1}); query and key are unchanged. Build a longer "
                "cache with rope_cache, or clamp the positions"
            )


def rotary_embedding(positions: DeviceArray, query: DeviceArray, key: DeviceArray | None, cos_sin_cache: DeviceArray,
                     *, is_neox: bool = True, rotary_dim: int | None = None, inverse: bool = False,
                     check_positions: bool = True) -> None:
    """Rotary position embedding, in place on ``query`` and ``key``, one launch for both.

    For token ``t`` at ``p = positions[t]`` and each pair ``j < rotary_dim / 2`` of every head:
    ``(x, y) <- (x cos - y sin, y cos + x sin)`` with ``cos = cos_sin_cache[p, j]``,
    ``sin = cos_sin_cache[p, W/2 + j]`` (``W`` the cache's width; ``-sin`` when ``inverse``), and
    ``(x, y) = (v[j], v[j + rotary_dim/2])`` for NeoX or ``(v[2j], v[2j+1])`` for GPT-J. Computed in
    float32, each product and sum rounded once in that order (no fused multiply-add), then rounded once to
    query's dtype: a head's result does not depend on where it sits in memory or on the launch plan
    (:func:`cukern.reference.rotary_embedding_emulated` gives the same bits). Elements from
    ``rotary_dim`` on are not touched.

    Parameters
    ----------
    positions : cupy.ndarray, int32 or int64, shape ``[tokens]`` (any stride).
    query : cupy.ndarray, float32, float16 or bfloat16, shape ``[tokens, num_heads, head_size]``; token
        and head strides are free (views into a fused qkv buffer work), the last stride must be 1.
    key : cupy.ndarray like query with ``[tokens, num_kv_heads, head_size]`` (any head count), or None.
        It must not share an element with query (ValueError; views of other heads of the same buffer are
        fine).
    cos_sin_cache : cupy.ndarray, float32 or query's dtype, ``[max_position, W]``: ``W/2`` cos then
        ``W/2`` sin per row (:func:`cukern.rope_cache` builds it). float32 is the accurate choice.
    is_neox : bool
        True rotates the two halves (NeoX, Llama); False rotates interleaved pairs (GPT-J).
    rotary_dim : int, optional
        An int (a float raises TypeError), even, at most head_size and W; defaults to W.
    inverse : bool
        Rotate by -theta (undoes a rotation up to rounding).
    check_positions : bool
        True: a position outside ``[0, max_position)`` raises IndexError naming the first such token, with
        query and key unchanged (one host synchronization before the launch), also when there are no heads
        to rotate; while the current stream captures a CUDA graph it raises RuntimeError instead, before
        anything is recorded. False: no synchronization (CUDA-graph capture, hot loops); such tokens are
        left unrotated and the cache is never read out of bounds.

    Returns
    -------
    None

    Examples
    --------
    >>> import cupy as cp
    >>> import cukern
    >>> cache = cukern.rope_cache(4, 4, base=100.0)
    >>> q = cp.array([[[1.0, 0.0, 0.0, 1.0]], [[1.0, 0.0, 0.0, 1.0]]], dtype=cp.float32)  # [tokens, heads, head_size]
    >>> k = cp.ones((2, 1, 4), dtype=cp.float32)
    >>> cukern.rotary_embedding(cp.array([0, 1]), q, k, cache)
    >>> print(q[1, 0])
    [ 0.5403023  -0.09983341  0.84147096  0.9950042 ]
    >>> cukern.rotary_embedding(cp.array([0, 1]), q, k, cache, inverse=True)
    >>> bool(cp.allclose(q[1, 0], cp.array([1.0, 0.0, 0.0, 1.0]), atol=1e-6))
    True
    """
    return _run(positions, query, key, cos_sin_cache, is_neox, rotary_dim, inverse, check_positions, None)


class _Call:
    """A validated, planned call for one combination of shapes, strides, dtypes, alignments, device and
    options: everything but the four pointers, with the scalar arguments already packed. ``inst`` None:
    tokens but no heads, so only the positions can be checked."""

    __slots__ = ("device", "cache_rows", "check_params", "inst", "config", "struct", "params", "has_key", "meet",
                 "apart", "kernel", "check_kernel", "spans")

    def __init__(self, device, cache_rows, check, inst=None, config=None, struct=None, has_key=False, meet=None):
        self.device, self.cache_rows, self.inst, self.config = device, cache_rows, inst, config
        self.check_params = struct_argument(check)  # CHECK_PARAMS as the check kernel's argument
        # PARAMS as NumPy and as the kernel argument
        self.struct, self.params = struct, (None if struct is None else struct_argument(struct))
        self.has_key = has_key
        self.meet = meet  # (lo, hi): key's pointer minus query's at which their extents meet; None: no key
        self.apart = None  # the last such offset found to share no element
        # the compiled functions, fetched on the call's device at their first launch
        self.kernel = self.check_kernel = None
        self.spans = None  # _check_reads_apart's extents, made on the first launch


_calls = CallCache()
_MISSING = CallCache.MISSING


def _call_key(positions, query, key, cache, is_neox, rotary_dim, inverse, knobs) -> tuple:
    """``(key, offset)``: the call cache's key, everything :func:`_plan_call` reads from the arguments (shapes,
    strides, dtypes, the pointers' 16-byte alignment, devices, options) as one flat tuple, cheap to hash,
    with the knobs as asked (None: the tuning cache's, looked up when the call is planned) and the tuning
    cache's generation, so a call found needs no lookup; key's pointer minus query's (None without key).
    Each attribute is read once: this is most of a cached call's host time."""
    if rotary_dim is not None and type(rotary_dim) is not int:
        rotary_dim = _int_arg(rotary_dim, "rotary_dim")  # so 64.0 cannot find the call 64 stored
    qd, cd, pd = query.data, cache.data, positions.data
    qptr = qd.ptr
    if key is None:
        kshape = kdtype = kstrides = kalign = kdevice = offset = None
    else:
        kd = key.data
        kshape, kdtype, kstrides, kdevice = key.shape, key.dtype, key.strides, kd.device_id
        offset = kd.ptr - qptr
        kalign = kd.ptr & 15
    kn = None if knobs is None else (knobs.items, knobs.target_block, knobs.waves, knobs.min_blocks)
    ck = (query.shape, query.strides, query.dtype, qptr & 15, qd.device_id, kshape, kstrides, kdtype, kalign, kdevice,
          cache.shape, cache.strides, cache.dtype, cd.ptr & 15, cd.device_id, positions.shape, positions.strides,
          positions.dtype, pd.ptr & 15, pd.device_id, is_neox, rotary_dim, inverse, kn, _tuned.generation)
    return ck, offset


def _prepare(positions, query, key, cache, is_neox, rotary_dim, inverse, knobs=DEFAULT_KNOBS):
    """Validate and plan (no GPU needed): the :class:`_Call`, or None when there are no tokens. Memoized on
    :func:`_call_key`; a call that fails validation is never stored."""
    ck, _ = _call_key(positions, query, key, cache, is_neox, rotary_dim, inverse, knobs)
    call = _calls.get(ck)
    if call is _MISSING:
        call = _plan_call(ck, positions, query, key, cache, is_neox, rotary_dim, inverse, knobs)
    return call


def _plan_call(ck, positions, query, key, cache, is_neox, rotary_dim, inverse, knobs):
    """:func:`_prepare` for a key not seen yet: validate, plan, store under ``ck``."""
    args = _validate(positions, query, key, cache, rotary_dim)
    q, k, cache, pos = args.query, args.key, args.cache, args.positions
    tokens = q.shape[0]
    nkv = 0 if k is None else k.shape[1]
    if not tokens:
        return _calls.put(ck, None)
    device = q.data.device_id
    check = CHECK_PARAMS.struct(pos_stride=_elem_strides(pos)[0], tokens=tokens, cache_rows=cache.shape[0])
    if not q.shape[1] + nkv:
        return _calls.put(ck, _Call(device, cache.shape[0], check))
    if knobs is None:  # the tuning cache's winner for this device, dtype and shape, else the heuristic
        knobs = _tuned.lookup(TUNING[bool(is_neox)], device, q.dtype, (tokens, q.shape[1], nkv, q.shape[2]))
    vec = vector_width(q, k, cache, args.rotary_dim, is_neox, args.sin_offset)
    p = plan(tokens, q.shape[1], nkv, args.rotary_dim, vec, is_neox, sm_count(device), knobs)
    qs = _elem_strides(q)
    ks = _elem_strides(k) if k is not None else (0, 0, 1)
    struct = PARAMS.struct(
        tokens=tokens, q_ts=qs[0], q_hs=qs[1], k_ts=ks[0], k_hs=ks[1], pos_stride=_elem_strides(pos)[0],
        cache_rows=cache.shape[0], cache_ts=_elem_strides(cache)[0], sin_offset=args.sin_offset,
        pos64=int(pos.dtype == np.int64), q_heads=q.shape[1], heads=q.shape[1] + nkv, rot=args.rotary_dim,
        lanes=p.lanes, groups=p.groups, tokens_per_block=p.tokens_per_block, sin_sign=-1.0 if inverse else 1.0)
    meet = None
    if nkv and q.shape[1]:
        qlo, qhi = extent(0, q.shape, q.strides, q.itemsize)
        klo, khi = extent(0, k.shape, k.strides, k.itemsize)
        meet = (qlo - khi, qhi - klo)
    return _calls.put(ck, _Call(device, cache.shape[0], check, p.instantiation(q.dtype, cache.dtype), p.config,
                                struct, k is not None, meet))


def _arrays(positions, query, key, cache, takes_cache: bool = True):
    """``(positions, query, key, cache)`` as CuPy arrays (query and key writable); ``takes_cache`` False for
    the op that has none (``cache`` None). Arrays that already are cost a type test each."""
    nd = _cupy().ndarray
    if (type(positions) is nd and type(query) is nd and (type(cache) is nd or not takes_cache)
            and (key is None or type(key) is nd)):
        return positions, query, key, cache
    positions = as_array(positions, "positions")
    cache = as_array(cache, "cos_sin_cache") if takes_cache else None
    query = as_array(query, "query", writable=True)
    return positions, query, None if key is None else as_array(key, "key", writable=True), cache


def _launch_call(call, offset, positions, query, key, table, check_positions: bool) -> None:
    """The end every rotation shares, on a planned call: refuse a key sharing an element with query, go to
    query's device, check the positions, launch (``table``: the cos/sin cache, or the frequency table)."""
    meet = call.meet  # what depends on the addresses themselves is checked on every call
    if meet is not None and meet[0] < offset < meet[1] and offset != call.apart:
        _check_key_apart(call, query, key, offset)
    _check_reads_apart(call, _READS, (positions, table), query, key)
    switch = on_device(call.device)
    if switch is not _NO_SWITCH:  # the check and the launch go to query's device
        with switch:
            return _launch_call(call, offset, positions, query, key, table, check_positions)
    if check_positions:
        _check_positions(call, positions)
    if call.inst is None:  # no heads
        return
    kernel = call.kernel
    if kernel is None:
        kernel = call.kernel = get_kernel(call.inst).kernel
    launch(kernel, call.config, (query, key if call.has_key else _NULL, table, positions, call.params))


def _run(positions, query, key, cos_sin_cache, is_neox, rotary_dim, inverse, check_positions, knobs) -> None:
    is_neox, inverse = _check.check_flag(is_neox, "is_neox"), _check.check_flag(inverse, "inverse")
    check_positions = _check.check_flag(check_positions, "check_positions")
    positions, query, key, cos_sin_cache = _arrays(positions, query, key, cos_sin_cache)
    ck, offset = _call_key(positions, query, key, cos_sin_cache, is_neox, rotary_dim, inverse, knobs)
    call = _calls.get(ck)
    if call is _MISSING:
        call = _plan_call(ck, positions, query, key, cos_sin_cache, is_neox, rotary_dim, inverse, knobs)
    if call is not None:  # None: no tokens
        _launch_call(call, offset, positions, query, key, cos_sin_cache, check_positions)


# ---------------------------------------------------------------------------------------------------------
# rotary_embedding_positions: the same rotation with cos and sin computed in the kernel.


class _NoCache:
    """What :func:`_validate` reads of a cache, for a call that has none: one float32 row of ``rot`` values
    (rounded up to even) on query's device, so only the checks of positions, query, key and rotary_dim can
    fail. Made once per (rot, device) by :func:`_no_cache`: every call reads one for its key."""

    def __init__(self, rot: int, device: int):
        width = rot + rot % 2
        self.shape, self.strides, self.dtype, self.itemsize = (1, width), (4 * width, 4), _F32, 4
        self.ndim, self.size = 2, width
        self.data = SimpleNamespace(ptr=0, device_id=device)
        self.device = SimpleNamespace(id=device)


@functools.lru_cache(maxsize=256)
def _no_cache(rot: int, device: int) -> _NoCache:
    # one object per (rot, device): a call building its own spent about 12 µs of host time (docs/design/rotary.md)
    return _NoCache(rot, device)


# Frequency tables, never dropped: a captured graph reads its table on every replay, and each is rot / 2 pairs
# of doubles (made once per device, rotary_dim, base, scaling and, for the scalings that read it, length).
_tables: dict = {}
_tables_lock = threading.Lock()


def _scaling_key(scaling):
    """``scaling``'s part of a cache key, read afresh on every call (a dict changed between calls finds its
    new frequencies): for None or a plain dict of scalars and lists, its items with each value's type, a
    float's exact bits (``-0.0`` apart from ``0.0``) and a list's element types (``True`` apart from ``1``,
    ``8`` from ``8.0``, as the checks tell them apart), a few tuples built without formatting; anything
    else (arrays, nested values) as canonical JSON. Two scalings with one key have the same frequencies;
    the same scaling spelt two ways (keys in another order, an array for a list) may have two keys, each
    planned once."""
    if scaling is None:
        return None
    if type(scaling) is dict:
        key = tuple((k, type(v), tuple(v), tuple(map(type, v))) if type(v) is list
                    else (k, float, v.hex()) if type(v) is float else (k, type(v), v) for k, v in scaling.items())
        try:
            hash(key)
            return key
        except TypeError:
            pass
    return json.dumps(scaling, sort_keys=True, default=lambda o: np.asarray(o).tolist())


def _frequency_table(device: int, rot: int, base, scaling, max_position):
    """``(table, attention)``: the ``rot / 2`` frequencies of :func:`cukern.rope_cache.rope_frequencies` as
    ``(w_hi, w_lo)`` float64 pairs on ``device`` (:func:`top_bits` splits each), made once per (device,
    rotary_dim, base, scaling, max_position)."""
    from .rope_cache import rope_frequencies

    from .rope_cache import reads_length

    key = (device, rot, base, _scaling_key(scaling), max_position if reads_length(scaling) else None)
    found = _tables.get(key)
    if found is None:
        w, attention = rope_frequencies(1 if max_position is None else max_position, rot, base, scaling)
        hi = top_bits(w)
        if _cupy().cuda.get_current_stream().is_capturing():
            raise RuntimeError("rotary_embedding_positions uploads its frequencies on the first call for each "
                               "(device, rotary_dim, base, scaling, max_position), which a CUDA graph capture "
                               "cannot record; make that call once before capturing")
        with on_device(device):
            table = _cupy().asarray(np.stack([hi, w - hi], axis=1).ravel())
        with _tables_lock:
            found = _tables.setdefault(key, (table, float(attention)))
    return found


_positions_calls = CallCache()


def rotary_embedding_positions(positions: DeviceArray, query: DeviceArray, key: DeviceArray | None, *, rotary_dim: int,
                               base: float = 10000.0, scaling: dict[str, Any] | None = None, is_neox: bool = True,
                               max_position: int | None = None) -> None:
    """Rotary position embedding with no cache: cos and sin computed in the kernel from each position, in place
    on ``query`` and ``key``, one launch.

    For token ``t`` at ``p = positions[t]`` and each pair ``j < rotary_dim / 2`` of every head:
    ``(x, y) <- (x cos - y sin, y cos + x sin)`` with ``cos = a cos(p w_j)``, ``sin = a sin(p w_j)``, ``w_j`` and
    ``a`` the frequencies and attention factor of :func:`cukern.rope_cache.rope_frequencies` for ``rotary_dim``,
    ``base``, ``scaling`` and ``max_position`` (float64). cos and sin are float32 within half an ulp plus
    ``2^-40`` of the exact values for ``|p| < 2^24`` (an argument reduction exact in that range, float64
    polynomials): as accurate as a float32 :func:`cukern.rope_cache` at any such position, with no table to
    hold. The rotation is :func:`cukern.rotary_embedding`'s, so the result (query's dtype) is that op's on a
    float32 cache holding these values (:func:`cukern.reference.rotary_embedding_positions_emulated` gives
    the bits), whatever the layout or the launch.

    Parameters
    ----------
    positions : cupy.ndarray, int32 or int64, shape ``[tokens]`` (any stride); any values (no range to
        check), exact below ``2^24`` in magnitude.
    query, key : as :func:`cukern.rotary_embedding`'s (key may be None).
    rotary_dim : int
        Even, at most head_size.
    base, scaling : as :func:`cukern.rope_cache`'s.
    is_neox : bool
        True rotates the two halves (NeoX, Llama); False rotates interleaved pairs (GPT-J).
    max_position : int, optional
        The context the frequencies are for, as :func:`cukern.rope_cache`'s ``max_position``: only dynamic NTK
        and LongRoPE read it; None means within the original context.

    Returns
    -------
    None

    Notes
    -----
    The frequencies are uploaded on the first call for each (device, rotary_dim, base, scaling,
    max_position); make that call before capturing a CUDA graph (under capture it raises RuntimeError
    before anything is recorded).

    Examples
    --------
    >>> import cupy as cp
    >>> import cukern
    >>> q = cp.ones((2, 1, 4), dtype=cp.float32)
    >>> cukern.rotary_embedding_positions(cp.array([0, 1]), q, None, rotary_dim=4, base=100.0)
    >>> print(q[:, 0])
    [[ 1.          1.          1.          1.        ]
     [-0.30116868  0.89517075  1.3817732   1.0948375 ]]
    """
    is_neox = _check.check_flag(is_neox, "is_neox")
    positions, query, key, _ = _arrays(positions, query, key, None, takes_cache=False)
    rot = _int_arg(rotary_dim, "rotary_dim")
    ck, offset = _call_key(positions, query, key, _no_cache(rot, query.data.device_id), is_neox, rot, False, None)
    ck = (ck, _arg_key(base), _scaling_key(scaling), _arg_key(max_position))
    call = _positions_calls.get(ck)
    if call is _MISSING:
        call = _plan_positions_call(ck, positions, query, key, rot, base, scaling, is_neox, max_position)
    if call is not None:  # None: nothing to rotate
        _launch_call(call, offset, positions, query, key, call.table, False)


def positions_bytes_moved(tokens: int, num_heads: int, num_kv_heads: int, rotary_dim: int, dtype,
                          positions_dtype=np.int64) -> int:
    """Bytes :func:`rotary_embedding_positions` must move: the rotated elements of q and k read and written, one
    position per token (no cache)."""
    return (2 * tokens * (num_heads + num_kv_heads) * rotary_dim * np.dtype(dtype).itemsize
            + tokens * np.dtype(positions_dtype).itemsize)


# rotary_embedding_positions fills blocks to 160 threads, not 256: its kernel holds 108 registers (the
# table's float64 work beside the first loads), and two tokens of 80 threads a block ran 86.3 µs against
# 88.0 for three (240 threads) on bf16 [16384, 32 + 8, 128] (H200, docs/design/rotary.md; one token a block: 91.1).
POSITIONS_KNOBS = dataclasses.replace(DEFAULT_KNOBS, target_block=160)


POSITIONS_SHARED_LIMIT = 48 * 1024  # dynamic shared memory a launch gets without opting in


def positions_plan(tokens: int, num_heads: int, num_kv_heads: int, rotary_dim: int, vec: int, is_neox: bool = True,
                   sm_count: int = 132, knobs: Knobs = POSITIONS_KNOBS) -> tuple:
    """``(plan, shared_bytes)`` for :func:`rotary_embedding_positions`: :func:`plan`'s launch with
    :data:`POSITIONS_ITEMS` heads a thread (``knobs.items`` is replaced by them), plus the block's table of
    ``tokens_per_block`` rows of ``rotary_dim`` float32 cos and sin."""
    p = plan(tokens, num_heads, num_kv_heads, rotary_dim, vec, is_neox, sm_count,
             dataclasses.replace(knobs, items=POSITIONS_ITEMS[-1]))
    if p.heads_per_thread == 1:
        p = dataclasses.replace(p, items=POSITIONS_ITEMS[0])
    return p, p.tokens_per_block * rotary_dim * 4


def _plan_positions_call(ck, positions, query, key, rot, base, scaling, is_neox, max_position):
    from .rope_cache import check_sizes

    args = _validate(positions, query, key, _no_cache(rot, query.data.device_id), rot)
    # the frequency table's checks, which a table made already for another max_position or base would skip
    check_sizes(1 if max_position is None else max_position, rot, base)
    if rot * 4 > POSITIONS_SHARED_LIMIT:  # a block's table holds one token's cos and sin at least
        raise ValueError(f"rotary_dim={rot}: a block's table of cos and sin would take {rot * 4} bytes of shared "
                         f"memory, over the {POSITIONS_SHARED_LIMIT} a launch gets; rotary_dim <= "
                         f"{POSITIONS_SHARED_LIMIT // 4} is supported")
    q, k, pos = args.query, args.key, args.positions
    tokens, nh = q.shape[0], q.shape[1]
    nkv = 0 if k is None else k.shape[1]
    device = q.data.device_id
    table, attention = _frequency_table(device, rot, float(base), scaling, max_position)  # checks the scaling
    if not tokens or not nh + nkv:
        return _positions_calls.put(ck, None)
    vec = widest_vector(rot, q.itemsize)
    for a in (q, k):
        if vec > 1 and a is not None and (a.data.ptr % 16 or any((s // a.itemsize) % vec for s in a.strides[:-1])):
            vec = 1
    p, shared = positions_plan(tokens, nh, nkv, rot, vec, is_neox, sm_count(device))
    qs = _elem_strides(q)
    ks = _elem_strides(k) if k is not None else (0, 0, 1)
    struct = POSITIONS_PARAMS.struct(
        tokens=tokens, q_ts=qs[0], q_hs=qs[1], k_ts=ks[0], k_hs=ks[1], pos_stride=_elem_strides(pos)[0],
        attention=attention, two_over_pi=TWO_OVER_PI, pio2_1=PIO2_1, pio2_2=PIO2_2, pio2_3=PIO2_3,
        pos64=int(pos.dtype == np.int64), q_heads=nh, heads=nh + nkv, rot=rot, lanes=p.lanes, groups=p.groups,
        tokens_per_block=p.tokens_per_block)
    meet = None
    if nkv and nh:
        qlo, qhi = extent(0, q.shape, q.strides, q.itemsize)
        klo, khi = extent(0, k.shape, k.strides, k.itemsize)
        meet = (qlo - khi, qhi - klo)
    return _positions_calls.put(ck, _PositionsCall(device, positions_instantiation(q.dtype, vec, is_neox, p.items),
                                                   LaunchConfig(grid=(p.grid,), block=(p.block,), shared_mem=shared),
                                                   struct, k is not None, meet, table))


class _PositionsCall:
    """A validated, planned :func:`rotary_embedding_positions` call: as :class:`_Call`, with the frequency
    table in place of the cache and no position check."""

    __slots__ = ("apart", "config", "device", "has_key", "inst", "kernel", "meet", "params", "spans", "struct",
                 "table")

    def __init__(self, device, inst, config, struct, has_key, meet, table):
        self.device, self.inst, self.config, self.has_key, self.meet, self.table = (device, inst, config, has_key,
                                                                                     meet, table)
        self.struct, self.params = struct, struct_argument(struct)
        self.apart = self.kernel = self.spans = None


# ---------------------------------------------------------------------------------------------------------
# rotary_embedding_mrope: multimodal RoPE, three positions a token.


def mrope_sections(mrope_section, rotary_dim: int, interleaved: bool) -> tuple:
    """``(a, b)``, the kernel's section bounds, from ``mrope_section`` (three non-negative ints, the temporal,
    height and width pair counts, adding up to ``rotary_dim / 2``). Contiguous: pairs ``[0, a)`` take the
    temporal position, ``[a, b)`` the height, the rest the width (``a = s0, b = s0 + s1``). Interleaved
    (Qwen3-VL): pair j takes the height when ``j % 3 == 1 and j < a``, the width when ``j % 3 == 2 and j < b``,
    else the temporal (``a = 3 s1, b = 3 s2``, capped at ``rot/2``). Like the Hugging Face slices
    ``[1:3 s1:3]`` and ``[2:3 s2:3]`` it interleaves, the bounds clip at the last pair: a section whose stride
    runs past it (``[8, 12, 12]`` over 32 pairs) gives its surplus to the temporal one."""
    try:
        sections = [_int_arg(s, "mrope_section's entries") for s in mrope_section]
    except TypeError as err:
        if "entries" in str(err):
            raise
        raise TypeError(f"mrope_section must be three ints, got {type(mrope_section).__name__}") from None
    half = rotary_dim // 2
    if len(sections) != 3 or min(sections) < 0 or sum(sections) != half:
        raise ValueError(f"mrope_section={list(sections)} must be three non-negative ints adding up to "
                         f"rotary_dim / 2 = {half}")
    s0, s1, s2 = sections
    if not interleaved:
        return s0, s0 + s1
    return min(3 * s1, half), min(3 * s2, half)


class _Row:
    """What :func:`_validate` reads of one row of a ``[3, tokens]`` positions array."""

    def __init__(self, positions):
        self.shape, self.strides, self.dtype = positions.shape[1:], positions.strides[1:], positions.dtype
        self.ndim, self.itemsize, self.data, self.device = 1, positions.itemsize, positions.data, positions.device


_mrope_calls = CallCache()


def rotary_embedding_mrope(positions: DeviceArray, query: DeviceArray, key: DeviceArray | None,
                           cos_sin_cache: DeviceArray, *, mrope_section: Sequence[int], interleaved: bool = False,
                           is_neox: bool = True, rotary_dim: int | None = None, check_positions: bool = True) -> None:
    """Multimodal rotary embedding (Qwen2-VL, Qwen2.5-VL; ``interleaved`` for Qwen3-VL), in place on ``query``
    and ``key``, one launch.

    Token ``t`` has three positions ``positions[:, t]`` (temporal, height, width); pair ``j`` of every head is
    turned as :func:`rotary_embedding` turns it, by ``cos_sin_cache[p, j]`` and ``cos_sin_cache[p, W/2 + j]``
    with ``p = positions[r(j), t]``: ``r(j)`` is the section of ``mrope_section = (s0, s1, s2)`` (adding up to
    ``rotary_dim / 2``) that j falls in, contiguous (``j < s0``: 0, then ``s1`` pairs of 1, then 2) or
    interleaved (``j % 3 == 1`` among the first ``3 s1`` pairs: 1, ``j % 3 == 2`` among the first ``3 s2``: 2,
    else 0). A text token, all three positions equal, is rotated exactly as :func:`rotary_embedding` rotates it.
    Bits: :func:`cukern.reference.rotary_embedding_mrope_emulated`, whatever the layout or the launch.

    Parameters
    ----------
    positions : cupy.ndarray, int32 or int64, shape ``[3, tokens]`` (any strides).
    query, key, cos_sin_cache, is_neox, rotary_dim : as :func:`rotary_embedding`'s.
    mrope_section : three ints (a model config's ``rope_scaling["mrope_section"]``).
    interleaved : bool
        Qwen3-VL's interleaved sections (``mrope_interleaved``).
    check_positions : bool
        As :func:`rotary_embedding`'s, over all three rows: the IndexError names ``positions[r, t]``; without
        it a token with any position outside the cache is left as it is.

    Returns
    -------
    None

    Examples
    --------
    >>> import cupy as cp
    >>> import cukern
    >>> cache = cukern.rope_cache(4, 8)
    >>> q, k = cp.ones((1, 1, 8), dtype=cp.float32), cp.ones((1, 2, 8), dtype=cp.float32)
    >>> text = cp.array([[2], [2], [2]])  # [3, tokens]: a text token's three equal positions
    >>> cukern.rotary_embedding_mrope(text, q, k, cache, mrope_section=(2, 1, 1))
    >>> q_plain = cp.ones((1, 1, 8), dtype=cp.float32)
    >>> cukern.rotary_embedding(cp.array([2]), q_plain, None, cache)
    >>> bool((q == q_plain).all())
    True
    """
    is_neox, interleaved = _check.check_flag(is_neox, "is_neox"), _check.check_flag(interleaved, "interleaved")
    check_positions = _check.check_flag(check_positions, "check_positions")
    positions, query, key, cos_sin_cache = _arrays(positions, query, key, cos_sin_cache)
    sections: object
    try:
        sections = tuple(mrope_section)
    except TypeError:
        sections = mrope_section  # not iterable: mrope_sections refuses it
    section_key = tuple(_arg_key(s) for s in sections) if isinstance(sections, tuple) else _arg_key(sections)
    ck, offset = _call_key(positions, query, key, cos_sin_cache, is_neox, rotary_dim, False, None)
    ck = (ck, section_key, interleaved)
    call = _mrope_calls.get(ck)
    if call is _MISSING:
        call = _plan_mrope_call(ck, positions, query, key, cos_sin_cache, sections, interleaved, is_neox, rotary_dim)
    if call is not None:  # None: no tokens
        _launch_call(call, offset, positions, query, key, cos_sin_cache, check_positions)


def _plan_mrope_call(ck, positions, query, key, cache, mrope_section, interleaved, is_neox, rotary_dim):
    if positions.ndim != 2 or positions.shape[0] != 3:
        raise ValueError(f"positions has shape {tuple(positions.shape)}; it must be [3, tokens] (temporal, height, "
                         "width)")
    args = _validate(_Row(positions), query, key, cache, rotary_dim)
    check_item_aligned(positions, "positions")  # (its row stride too, which _Row does not show)
    q, k, cache, rot = args.query, args.key, args.cache, args.rotary_dim
    section_a, section_b = mrope_sections(mrope_section, rot, interleaved)
    tokens, nh = q.shape[0], q.shape[1]
    nkv = 0 if k is None else k.shape[1]
    if not tokens:
        return _mrope_calls.put(ck, None)
    device = q.data.device_id
    pos_stride, row_stride = (s // positions.itemsize for s in (positions.strides[1], positions.strides[0]))
    check = CHECK_PARAMS.struct(pos_stride=pos_stride, tokens=tokens, cache_rows=cache.shape[0])
    if not nh + nkv:
        return _mrope_calls.put(ck, _MropeCall(positions.strides[0], device, cache.shape[0], check))
    knobs = _tuned.lookup(TUNING[bool(is_neox)], device, q.dtype, (tokens, nh, nkv, q.shape[2]))
    vec = vector_width(q, k, cache, rot, is_neox, args.sin_offset)
    p = plan(tokens, nh, nkv, rot, vec, is_neox, sm_count(device), knobs)
    qs = _elem_strides(q)
    ks = _elem_strides(k) if k is not None else (0, 0, 1)
    struct = MROPE_PARAMS.struct(
        tokens=tokens, q_ts=qs[0], q_hs=qs[1], k_ts=ks[0], k_hs=ks[1], pos_stride=pos_stride,
        pos_row_stride=row_stride, cache_rows=cache.shape[0], cache_ts=_elem_strides(cache)[0],
        sin_offset=args.sin_offset, pos64=int(positions.dtype == np.int64), q_heads=nh, heads=nh + nkv, rot=rot,
        lanes=p.lanes, groups=p.groups, tokens_per_block=p.tokens_per_block, section_a=section_a,
        section_b=section_b, interleaved=int(bool(interleaved)))
    meet = None
    if nkv and nh:
        qlo, qhi = extent(0, q.shape, q.strides, q.itemsize)
        klo, khi = extent(0, k.shape, k.strides, k.itemsize)
        meet = (qlo - khi, qhi - klo)
    inst = mrope_instantiation(q.dtype, cache.dtype, vec, is_neox, p.items)
    return _mrope_calls.put(ck, _MropeCall(positions.strides[0], device, cache.shape[0], check, inst, p.config, struct,
                                           k is not None, meet))


class _MropeCall(_Call):
    """A :class:`_Call` that also knows the bytes between the rows of its ``[3, tokens]`` positions."""

    __slots__ = ("row_bytes",)

    def __init__(self, row_bytes, *args):
        super().__init__(*args)
        self.row_bytes = row_bytes
