"""RMSNorm and fused residual-add + RMSNorm (kernels in ``cuda_src/rms_norm.cu``).

Reference (float64, :func:`cukern.reference.rms_norm`)::

    out = x / sqrt(mean(x**2, axis=-1) + eps) * (offset + weight)

Memory traffic, the count every GB/s figure uses: read x (and residual), write out (and residual), read
weight once: ``bytes_moved``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from . import _check
from . import tuning as _tuning
from ._compile import Instantiation, get_kernel
from ._dtypes import FLOAT_TYPES
from ._launch import NULL as _NULL
from ._launch import LaunchConfig, Params, launch_typed, sm_count, struct_argument
from ._layout import rows_layout

SOURCE = "rms_norm"
MAX_TPR = 512
MAX_ITEMS = 16
MAX_BYTES = 64  # of the row a thread holds in registers (see plan)
WIDE_BLOCK, WIDE_ITEMS = 512, 4
MAX_HIDDEN = 2**31 - 2**20

# The kernels' scalars, one struct (``RmsNormParams`` in cuda_src/rms_norm.cu): strides in elements.
PARAMS = Params((("rows", "i64"), ("inner", "i64"), ("out_s0", "i64"), ("out_s1", "i64"), ("res_s0", "i64"),
                 ("res_s1", "i64"), ("x_s0", "i64"), ("x_s1", "i64"), ("hidden", "i32"), ("eps", "f32"),
                 ("offset", "f32")))


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(n, 1))))


@dataclass(frozen=True)
class Plan:
    """The launch for one call: which kernel, its tile and its grid.

    ``vec`` elements per access, ``tpr`` threads per row, ``items`` vectors per thread (rows kernel) or per
    chunk (wide kernel), ``block`` threads per block, ``grid`` blocks, ``rows_per_block`` rows one block
    holds at a time.
    """

    kernel: str  # "rows" (row held in registers) or "wide" (row streamed twice)
    hidden: int
    rows: int
    vec: int
    tpr: int
    items: int
    block: int
    grid: int

    @property
    def rows_per_block(self) -> int:
        return self.block // self.tpr

    @property
    def config(self) -> LaunchConfig:
        return LaunchConfig(grid=(self.grid,), block=(self.block,))

    def instantiation(self, dtype, weight_dtype, fused: bool) -> Instantiation:
        name = ("fused_add_rms_norm_" if fused else "rms_norm_") + self.kernel
        if self.kernel == "rows":
            args = (dtype, weight_dtype, self.vec, self.tpr, self.items, self.block)
        else:
            args = (dtype, weight_dtype, self.vec, self.items, self.block)
        return Instantiation(SOURCE, name, args)


@dataclass(frozen=True)
class Knobs:
    """The tuning space. ``items_target``: vectors a thread keeps in flight; ``small_block``: threads per
    block when several rows share one; ``waves``: grid cap in waves of resident blocks (None: a block per
    row group). Defaults measured on the H200 (bench/NOTES.md): 8 waves cost nothing at 4096 (94.6% either
    way) and gained 1.4 points at 8192 (96.1% against 94.7%)."""

    items_target: int = 4
    small_block: int = 128
    waves: int | None = 8


DEFAULT_KNOBS = Knobs()


def plan(hidden: int, rows: int, vec: int, itemsize: int, sm_count: int = 132, knobs: Knobs = DEFAULT_KNOBS,
         *, fused: bool = False) -> Plan:
    """Pure launch planning from the row length, the row count and the usable vector width.

    Threads per row: the power of two that gives each thread about ``knobs.items_target`` vectors (so each
    thread has several independent 16-byte loads in flight), at most 1024. Rows of up to 32 threads share a
    block of ``knobs.small_block`` threads; longer rows get a block each. A thread holds at most 64 bytes of its row
    (16 accesses; 4 fused, which also holds the residual loads in flight) in blocks of at most 512 threads,
    so the weight (or residual) loads in flight beside it fit in registers without spills; longer rows go
    to the wide kernel. The plan depends on ``hidden`` and ``vec`` only, never on ``rows``, except
    for the grid: that keeps every row's reduction order, and so its result, independent of the batch.
    The grid covers every row group once, or with ``knobs.waves`` at most that many full waves of resident
    blocks (``sm_count`` x 2048 / block), the blocks then looping over rows.
    """
    if hidden < 1 or vec < 1 or hidden % vec:
        raise ValueError(f"hidden={hidden} is not a positive multiple of vec={vec}")
    nvec = hidden // vec
    tpr = min(MAX_TPR, _pow2_at_least(math.ceil(nvec / knobs.items_target)))
    items = _pow2_at_least(math.ceil(nvec / tpr))
    max_items = MAX_ITEMS // 4 if fused else MAX_ITEMS
    if items > min(max_items, MAX_BYTES // (vec * itemsize)):
        kernel, tpr, items, block = "wide", WIDE_BLOCK, WIDE_ITEMS, WIDE_BLOCK
    else:
        kernel, block = "rows", (tpr if tpr > 32 else knobs.small_block)
    grid = math.ceil(rows / (block // tpr))
    if knobs.waves is not None:
        grid = min(grid, knobs.waves * sm_count * (2048 // block))
    return Plan(kernel, hidden, rows, vec, tpr, items, block, max(1, min(grid, 2**31 - 1)))


def vector_width(hidden: int, arrays, weight=None) -> int:
    """16 bytes' worth of elements when ``hidden``, every array's base address and every leading stride allow
    it, else 1. ``weight`` (which may be wider than the others) must be aligned to its own chunk."""
    itemsize = arrays[0].itemsize
    vec = 16 // itemsize
    if hidden % vec:
        return 1
    for a in arrays:
        if a.data.ptr % 16 or any((s // itemsize) % vec for s in a.strides[:-1]):
            return 1
    if weight is not None and weight.data.ptr % min(16, vec * weight.itemsize):
        return 1
    return vec


def instantiations():
    """Every instantiation ``plan`` can choose, generated by running it over all row lengths it
    distinguishes, for every supported dtype pair and both kernels."""
    out = set()
    dtypes = [(t, t) for t in FLOAT_TYPES] + [(t, np.dtype(np.float32)) for t in FLOAT_TYPES[1:]]
    for t, w in dtypes:
        for vec in sorted({16 // t.itemsize, 1}):
            for nvec in range(1, MAX_TPR * MAX_ITEMS + 2):
                for fused in (False, True):
                    out.add(plan(nvec * vec, 1, vec, t.itemsize, fused=fused).instantiation(t, w, fused))
    return sorted(out, key=lambda i: (i.name, i.expression))


def bytes_moved(shape, dtype, weight_dtype=None, *, fused: bool = False) -> int:
    """Bytes the op must move: x (and residual) read, out (and residual) written, weight read once."""
    n = math.prod(shape)
    size = np.dtype(dtype).itemsize
    w = shape[-1] * np.dtype(weight_dtype).itemsize if weight_dtype is not None else 0
    return (4 if fused else 2) * n * size + w


def _validate(x, weight, out, residual=None):
    names = {"x": x, "weight": weight, "out": out, "residual": residual}
    arrays = {n: _check.as_array(a, n, writable=n in ("out", "residual")) for n, a in names.items() if a is not None}
    x = arrays["x"]
    if x.ndim < 1:
        raise ValueError("x must have at least one dimension (the normalized one)")
    _check.check_dtype(x, "x", FLOAT_TYPES)
    for n in ("out", "residual"):
        a = arrays.get(n)
        if a is None:
            continue
        if a.dtype != x.dtype:
            raise TypeError(f"{n} has dtype {a.dtype}, x has {x.dtype}; they must match")
        if a.shape != x.shape:
            raise ValueError(f"{n} has shape {a.shape}, x has {x.shape}; they must match")
    w = arrays.get("weight")
    if w is not None:
        if w.dtype not in (x.dtype, np.dtype(np.float32)):
            raise TypeError(f"weight has dtype {w.dtype}; it must be x's dtype ({x.dtype}) or float32")
        if w.ndim != 1 or w.shape[0] != x.shape[-1]:
            raise ValueError(f"weight has shape {w.shape}; it must be 1-D with x's last dimension ({x.shape[-1]})")
    _check.check_same_device(arrays)
    for n, a in arrays.items():
        _check.check_unit_last_stride(a, n)
    if x.shape[-1] > MAX_HIDDEN:
        raise ValueError(f"x's last dimension {x.shape[-1]} is over the supported {MAX_HIDDEN}")
    return arrays


@dataclass(frozen=True)
class _Call:
    """Everything about a call that depends only on the arguments' shapes, strides, dtypes, alignment and
    device: validated once, then reused by every call that matches (the host path of a hot loop)."""

    kernel: object  # cupy.cuda.Function on the arrays' device
    config: LaunchConfig
    outer: tuple | None  # per launch, per rowed array: element offset; None: one launch at offset 0
    layout: dict  # PARAMS' fields but eps and offset
    packed: dict  # (eps, offset) as given -> PARAMS as the kernel argument

    def pack(self, eps, offset):
        if len(self.packed) >= 64:
            self.packed.clear()
        p = self.packed[eps, offset] = struct_argument(PARAMS.struct(**self.layout, eps=eps, offset=offset))
        return p


_calls: dict = {}


def _desc(a):
    if a is None:
        return None
    d = a.data
    return a.shape, a.strides, a.dtype, d.ptr & 15, d.device_id


def _run(fused: bool, x, residual, weight, eps, offset, out, knobs: Knobs | None = None):
    import cupy

    nd = cupy.ndarray
    key = None
    if (type(x) is nd and (weight is None or type(weight) is nd) and (out is None or type(out) is nd)
            and (residual is None or type(residual) is nd) and x.ndim):
        xd, shape, dtype = x.data, x.shape, x.dtype
        if knobs is None:  # the tuning cache's winner for this device, dtype and shape, else the heuristic
            knobs = _tuning.lookup("fused_add_rms_norm" if fused else "rms_norm", xd.device_id, dtype,
                                   shape) or DEFAULT_KNOBS
        key = (fused, shape, x.strides, dtype, xd.ptr & 15, xd.device_id, _desc(weight), _desc(out),
               _desc(residual), None if knobs is DEFAULT_KNOBS else knobs)
    call = _calls.get(key) if key is not None else None
    if call is None:
        arrays = _validate(x, weight, out, residual)
        x, weight, out, residual = (arrays.get(n) for n in ("x", "weight", "out", "residual"))
        if knobs is None:
            knobs = _tuning.lookup("fused_add_rms_norm" if fused else "rms_norm", x.data.device_id, x.dtype,
                                   x.shape) or DEFAULT_KNOBS
        call = _plan_call(fused, x, residual, weight, out, knobs)
        if key is not None:
            if len(_calls) > 4096:
                _calls.clear()
            _calls[key] = call
    # What depends on the addresses themselves is checked on every call.
    if fused:
        _check.check_no_overlap(residual, "residual", x, "x", identical_ok=False)
    if out is not None:
        _check.check_no_overlap(out, "out", x, "x", identical_ok=True)
        if weight is not None:
            _check.check_no_overlap(out, "out", weight, "weight", identical_ok=False)
        if fused:
            _check.check_no_overlap(out, "out", residual, "residual", identical_ok=False)
    params = None
    if call.kernel is not None:
        params = call.packed.get((eps, offset)) or call.pack(eps, offset)
    # One device switch for the allocation and the launches, none when x's device is already current.
    with _check.on_device_of(x):
        if out is None:
            out = nd(x.shape, dtype=x.dtype)
        if params is None:
            return out
        w = _NULL if weight is None else weight
        rowed = (out, residual, x) if fused else (out, x)
        if call.outer is None:
            launch_typed(call.kernel, call.config, rowed + (w, params))
        else:
            for offs in call.outer:
                ptrs = tuple(np.uint64(a.data.ptr + o * x.itemsize) for a, o in zip(rowed, offs))
                launch_typed(call.kernel, call.config, ptrs + (w, params))
    return out


class _FreshArray:
    """What planning needs to know of an output not allocated yet: C-contiguous, allocation-aligned."""

    class data:
        ptr = 0

    def __init__(self, shape, itemsize):
        self.shape, self.itemsize = shape, itemsize
        strides, step = [], itemsize
        for n in reversed(shape):
            strides.append(step)
            step *= n
        self.strides = tuple(reversed(strides))


def _plan_call(fused: bool, x, residual, weight, out, knobs: Knobs) -> _Call:
    """Validate what the shapes and strides decide, plan the launch and fetch the kernel."""
    if fused:
        _check.check_writable(residual, "residual")
    if out is not None:
        _check.check_writable(out, "out")
    if x.size == 0:
        return _Call(None, None, None, {}, {})
    planned_out = out if out is not None else _FreshArray(x.shape, x.itemsize)
    rowed = [planned_out, residual, x] if fused else [planned_out, x]
    hidden = x.shape[-1]
    layout = rows_layout(rowed)
    p = plan(hidden, layout.rows, vector_width(hidden, rowed, weight), x.itemsize, sm_count(x.device.id), knobs,
             fused=fused)
    with x.device:  # the compiled function on x's device (the call is cached per device)
        kernel = get_kernel(p.instantiation(x.dtype, weight.dtype if weight is not None else x.dtype, fused)).kernel
    (out_s0, out_s1), (x_s0, x_s1) = layout.strides[0], layout.strides[-1]
    res_s0, res_s1 = layout.strides[1] if fused else (0, 0)
    fields = dict(rows=layout.rows, inner=layout.inner, out_s0=out_s0, out_s1=out_s1, res_s0=res_s0, res_s1=res_s1,
                  x_s0=x_s0, x_s1=x_s1, hidden=hidden)
    outer = None if layout.outer == (tuple(0 for _ in rowed),) else layout.outer
    return _Call(kernel, p.config, outer, fields, {})


def rms_norm(x, weight=None, eps: float = 1e-6, *, offset: float = 0.0, out=None):
    """Root-mean-square normalization over the last axis.

    ``out = x / sqrt(mean(x**2, axis=-1) + eps) * (offset + weight)``, computed in float32 and rounded
    once to x's dtype. ``weight=None`` means 1; ``offset=1.0`` is the Gemma form.

    Parameters
    ----------
    x : cupy.ndarray, float32, float16 or bfloat16, shape ``[..., hidden]``; leading dimensions may be
        strided, the last must have unit stride.
    weight : cupy.ndarray of shape ``[hidden]``, x's dtype or float32, optional.
    eps : float
    offset : float
    out : cupy.ndarray like x, optional; may be x itself (in place), must not overlap it otherwise.

    Returns
    -------
    out
    """
    return _run(False, x, None, weight, eps, offset, out)


def fused_add_rms_norm(x, residual, weight=None, eps: float = 1e-6, *, offset: float = 0.0, out=None):
    """``residual += x`` in place (rounded to residual's dtype), then ``out = rms_norm(residual)``.

    ``out=x`` is allowed (the in-place form LLM servers use). Same dtypes and layouts as :func:`rms_norm`;
    residual must not overlap x or out.
    """
    return _run(True, x, residual, weight, eps, offset, out)
