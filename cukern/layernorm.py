"""LayerNorm forward and backward, and fused residual-add + LayerNorm (kernels in ``cuda_src/layer_norm.cu``).

Reference (float64, :func:`cukern.reference.layer_norm`)::

    xhat = (x - mean(x)) / sqrt(var(x) + eps);  out = xhat * weight + bias
    dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),  g = dy * weight
    dweight = sum(dy * xhat, rows),  dbias = sum(dy, rows)

Memory traffic, the count every GB/s figure uses: :func:`bytes_moved` (forward: read x (and residual), write
out (and residual), read weight and bias once; backward: read dy and x (and dresidual), write dx, read weight
once, write dweight and dbias).

Reproducibility: a row's mean and M2 are two passes up one tree fixed by the hidden size (rms_norm's classes,
:func:`cukern.rmsnorm.tree_classes`: the sum, then the centred squares), its backward sums the same tree, and dweight
and dbias add each chunk of :func:`chunk_rows` rows in row order, then the chunks as a pairwise tree: every
bit depends on the values, the dtypes, eps and the row count, never on the launch, the SM count or the GPU
(the exact emulators: :func:`cukern.reference.layer_norm_emulated`,
:func:`cukern.reference.fused_add_layer_norm_emulated`, :func:`cukern.reference.layer_norm_backward_emulated`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
import numpy as np

import cukern._check as _check
import cukern._tuned as _tuned
import cukern.reduce as reduce
import cukern.rmsnorm as rmsnorm

from ._compile import Instantiation, get_kernel
from ._dtypes import FLOAT_TYPES, dtype_name
from ._interop import as_array
from ._launch import NULL as _NULL
from ._launch import SEQUENCE_LOCK, LaunchConfig, Params, launch, on_device, refuse_temporary_in_capture, sm_count
from ._launch import cupy as _cupy
from ._launch import struct_argument
from ._layout import ArraySpec, rows_layout
from ._typing import DeviceArray

SOURCE = "layer_norm"
# The longest row a thread group holds in registers on every path (the element path of float32 rows of 8192
# plans 512 threads of 16 elements); longer rows are refused rather than streamed twice.
MAX_HIDDEN = 8192
MAX_CHUNKS = 512  # of dweight's and dbias's partial rows (see chunk_rows)
# The backward's vectors hold at most four elements (float32 takes 16-byte vectors, the half types 8-byte ones),
# so that a thread's weight-gradient partials, two floats an element, fit its registers; two when every chunk
# is one row (rows <= MAX_CHUNKS), which then spreads over twice the threads. The forward takes 16-byte
# vectors. Plan choices (docs/design/layer_norm.md, "Speed"): every plan splits the same class tree, so the
# bits do not change.
BACKWARD_MAX_VEC = 4
PARAM_LANES = 32  # chunk lanes of a layer_norm_param_grads block (kParamLanes in the .cu)
# Threads an SM in one wave of the forward's held kernels (they take up to 128 registers a thread, so an SM
# keeps 512 of their threads): a grid of at most that many loads the weight and bias with the row (see
# holds_params).
ONE_WAVE_THREADS = 512

PARAMS = Params((("rows", "i64"), ("inner", "i64"), ("out_s0", "i64"), ("out_s1", "i64"), ("res_s0", "i64"),
                 ("res_s1", "i64"), ("x_s0", "i64"), ("x_s1", "i64"), ("st_s0", "i64"), ("st_s1", "i64"),
                 ("hidden", "i32"), ("eps", "f32")))
BACKWARD_PARAMS = Params((("rows", "i64"), ("inner", "i64"), ("dx_s0", "i64"), ("dx_s1", "i64"), ("dy_s0", "i64"),
                          ("dy_s1", "i64"), ("x_s0", "i64"), ("x_s1", "i64"), ("dr_s0", "i64"), ("dr_s1", "i64"),
                          ("st_s0", "i64"), ("st_s1", "i64"), ("chunk_rows", "i64"), ("chunks", "i32"),
                          ("hidden", "i32"), ("inv_hidden", "f32")))
PARAM_GRADS_PARAMS = Params((("hidden", "i64"), ("chunks", "i32"), ("leaves", "i32")))

Knobs = rmsnorm.Knobs
DEFAULT_KNOBS = rmsnorm.DEFAULT_KNOBS


def _tuning_rule(op: str) -> _tuned.Rule:
    """Entries per hidden size and power-of-two row bucket; no knob decides a summation order."""
    return _tuned.Rule(op, DEFAULT_KNOBS, lambda d: Knobs(**d),
                       bucket=lambda shape: f"hidden={shape[-1]},rows<={_tuned.rows_bucket(math.prod(shape[:-1]))}")


TUNING = {"forward": _tuning_rule("layer_norm"), "fused": _tuning_rule("fused_add_layer_norm"),
          "backward": _tuning_rule("layer_norm_backward")}


def chunk_rows(rows: int) -> int:
    """R, the rows of one chunk of dweight's and dbias's first stage, from the row count alone: the least power
    of two that leaves at most :data:`MAX_CHUNKS` chunks. Each chunk adds its rows in row order into one
    float32 partial row; the ``ceil(rows / R)`` partials are then added as a perfect binary tree (neighbours
    first, padded with -0). Fewer chunks would move fewer partial bytes but leave too few groups to keep the
    memory busy; more would move more."""
    return 1 << max(0, math.ceil(math.log2(max(1, math.ceil(rows / MAX_CHUNKS)))))


def chunk_count(rows: int) -> int:
    return math.ceil(rows / chunk_rows(rows)) if rows else 0


def tree_leaves(chunks: int) -> int:
    """The leaves of the chunk tree as layer_norm_param_grads computes it: the chunk count padded with -0 to
    a power of two, at least eight a lane (padding with the exact identity changes no bit)."""
    return max(8 * PARAM_LANES, 1 << max(0, (chunks - 1).bit_length()))


@dataclass(frozen=True)
class Plan:
    """A launch: the row tile of :func:`cukern.rmsnorm.plan` (``tile``), the kernel and its grid. For the
    backward ``grid`` covers the chunks, ``rows_per_block`` of them a block."""

    kernel: str  # "forward", "fused" or "backward"
    tile: rmsnorm.Plan
    grid: int
    chunk_rows: int = 0
    chunks: int = 0
    hold: bool = False  # the forward loads the weight and bias with the row (holds_params)

    @property
    def config(self) -> LaunchConfig:
        return LaunchConfig(grid=(self.grid,), block=(self.tile.block,))

    def instantiation(self, dtype, weight_dtype) -> Instantiation:
        name = {"forward": "layer_norm_rows", "fused": "fused_add_layer_norm_rows",
                "backward": "layer_norm_backward_rows"}[self.kernel]
        t = self.tile
        args = (dtype, weight_dtype, t.vec, t.tpr, t.groups, t.items, t.block)
        return Instantiation(SOURCE, name, args + ((self.hold,) if self.kernel == "forward" else ()))


def plan(kernel: str, hidden: int, rows: int, vec: int, itemsize: int, sm_count: int = 132,
         knobs: Knobs = DEFAULT_KNOBS) -> Plan:
    """Pure launch planning. The tile is rms_norm's (:func:`cukern.rmsnorm.plan`, never its wide kernel: rows
    past :data:`MAX_HIDDEN` are refused before planning), so the row's classes are split over threads as rms_norm
    splits them; the backward's ``vec`` is at most :func:`backward_vec_cap`. The forward's grid is rms_norm's
    (and :func:`holds_params` decides ``hold``); the backward's covers the ``ceil(rows / chunk_rows(rows))``
    chunks, one a row group."""
    if not 1 <= hidden <= MAX_HIDDEN:
        raise ValueError(f"hidden={hidden}; layer_norm takes 1 to {MAX_HIDDEN} elements a row")
    if kernel == "backward":
        vec = min(vec, backward_vec_cap(rows))
    tile = rmsnorm.plan(hidden, rows, vec, itemsize, sm_count, knobs)
    if tile.kernel != "rows":
        raise ValueError(f"hidden={hidden} with vec={vec} does not fit a row in registers")
    if kernel != "backward":
        return Plan(kernel, tile, tile.grid, hold=kernel == "forward" and holds_params(tile, sm_count))
    r = chunk_rows(rows)
    chunks = chunk_count(rows)
    return Plan(kernel, tile, max(1, math.ceil(chunks / tile.rows_per_block)), r, chunks)


def holds_params(tile: rmsnorm.Plan, sm_count: int) -> bool:
    """Whether the forward loads the weight and bias with the row and holds them through the statistics: when
    its grid is at most one wave (:data:`ONE_WAVE_THREADS` threads an SM), where no other block's work hides
    their latency after the statistics. With more waves, loading them early slowed every measured shape
    (docs/design/layer_norm.md). Where the weight and bias are loaded changes no bit."""
    return tile.grid * tile.block <= sm_count * ONE_WAVE_THREADS


def backward_vec_cap(rows: int) -> int:
    """The backward's widest vector for ``rows`` rows: :data:`BACKWARD_MAX_VEC`, or half of it when every chunk
    is a single row."""
    return BACKWARD_MAX_VEC if chunk_rows(rows) > 1 else BACKWARD_MAX_VEC // 2


def param_grads_instantiation(weight_dtype) -> Instantiation:
    return Instantiation(SOURCE, "layer_norm_param_grads", (weight_dtype,))


def param_grads_config(hidden: int) -> LaunchConfig:
    return LaunchConfig(grid=(math.ceil(hidden / 32),), block=(32, PARAM_LANES))


widest_vector = rmsnorm.widest_vector


def vector_width(hidden: int, arrays, params=()) -> int:
    """:func:`cukern.rmsnorm.vector_width` over the rowed arrays, each of ``params`` (weight, bias; may be
    wider than x) aligned to its own chunk."""
    vec = rmsnorm.vector_width(hidden, arrays)
    for p in params:
        if p is not None and p.data.ptr % min(16, vec * p.itemsize):
            return 1
    return vec


def _lengths() -> list:
    """One row length per (classes, elements per class) pair up to :data:`MAX_HIDDEN`: all a plan reads of
    ``hidden``."""
    out = []
    classes = rmsnorm.MIN_CLASSES
    while classes <= rmsnorm.tree_classes(MAX_HIDDEN):
        out += [classes * k for k in range(1, 5) if classes * k <= MAX_HIDDEN
                and rmsnorm.tree_classes(classes * k) == classes]
        classes *= 2
    return out + [h for h in range(1, rmsnorm.MIN_CLASSES)]


def instantiations():
    """The instantiations ``plan`` chooses at the default knobs, generated by planning every supported dtype
    pair, both vector widths and every row length that plans differently, for the three row kernels (the
    forward with its grid of one wave and of more, the backward with one-row chunks and with longer ones); and
    the param-grads kernel for every weight dtype."""
    out = set()
    dtypes = [(t, t) for t in FLOAT_TYPES] + [(t, np.dtype(np.float32)) for t in FLOAT_TYPES[1:]]
    for t, w in dtypes:
        for vec in sorted({16 // t.itemsize, 1}):
            for hidden in _lengths():
                if hidden % vec:
                    continue
                for kernel, rows in (("forward", 1), ("forward", 2**20), ("fused", 1), ("backward", 1),
                                     ("backward", 2 * MAX_CHUNKS)):
                    out.add(plan(kernel, hidden, rows, vec, t.itemsize).instantiation(t, w))
    for w in FLOAT_TYPES:
        out.add(param_grads_instantiation(w))
    return sorted(out, key=lambda i: (i.name, i.expression))


def bytes_moved(shape, dtype, weight_dtype=None, *, fused: bool = False, bias: bool = False,
                backward: bool = False, dresidual: bool = False, stats: bool = False) -> int:
    """Bytes the op must move. Forward: x (and residual) read, out (and residual) written, weight and bias
    read once, with ``stats`` two floats a row written. Backward: dy, x (and dresidual) read, dx written,
    weight read and dweight written once, dbias written, and with ``stats`` two floats a row read."""
    n = math.prod(shape)
    rows = math.prod(shape[:-1])
    size = np.dtype(dtype).itemsize
    wsize = np.dtype(weight_dtype if weight_dtype is not None else dtype).itemsize
    hidden = shape[-1]
    st = 8 * rows if stats else 0
    if backward:
        w = 2 * hidden * wsize if weight_dtype is not None else 0
        return (4 if dresidual else 3) * n * size + w + hidden * wsize + st
    w = hidden * wsize * ((weight_dtype is not None) + bias)
    return (4 if fused else 2) * n * size + w + st


# ---------------------------------------------------------------------------------------------------------
# Validation.


def _eps(eps) -> float:
    v = rmsnorm._scalar(eps, "eps")
    if v < 0:
        raise ValueError(f"eps={eps!r} is negative; it must be at least 0 (1e-5 is usual)")
    return v


def _like_x(a, name: str, x):
    if a.dtype != x.dtype:
        raise TypeError(f"{name} has dtype {dtype_name(a.dtype)}, x has {dtype_name(x.dtype)}; they must match")
    if a.shape != x.shape:
        raise ValueError(f"{name} has shape {a.shape}, x has {x.shape}; they must match")


def _params(weight, bias, x):
    """weight and bias: 1-D of x's last dimension, x's dtype or float32, one dtype for both."""
    for name, a in (("weight", weight), ("bias", bias)):
        if a is None:
            continue
        if a.dtype not in (x.dtype, np.dtype(np.float32)):
            raise TypeError(f"{name} has dtype {dtype_name(a.dtype)}; it must be x's dtype "
                            f"({dtype_name(x.dtype)}) or float32")
        if a.ndim != 1 or a.shape[0] != x.shape[-1]:
            raise ValueError(f"{name} has shape {a.shape}; it must be 1-D with x's last dimension ({x.shape[-1]})")
    if weight is not None and bias is not None and weight.dtype != bias.dtype:
        raise TypeError(f"bias has dtype {dtype_name(bias.dtype)}, weight has {dtype_name(weight.dtype)}; they "
                        "must match")


def _x(x, name: str = "x"):
    x = as_array(x, name)
    if x.ndim < 1:
        raise ValueError(f"{name} must have at least one dimension (the normalized one)")
    _check.check_dtype(x, name, FLOAT_TYPES)
    return x


def _hidden(x) -> None:
    if x.shape[-1] > MAX_HIDDEN:
        raise ValueError(f"x's last dimension {x.shape[-1]} is over layer_norm's limit of {MAX_HIDDEN} (a row is "
                         "held in registers)")


def _common(arrays: dict) -> None:
    _check.check_same_device(arrays)
    for n, a in arrays.items():
        if a is not None and a.ndim:
            _check.check_unit_last_stride(a, n)


# ---------------------------------------------------------------------------------------------------------
# Forward.


def _forward(fused: bool, x, residual, weight, bias, eps, out, return_stats: bool):
    op = "fused_add_layer_norm" if fused else "layer_norm"
    if fused and residual is None:
        raise TypeError("residual is None; fused_add_layer_norm adds x into residual in place, so pass an array "
                        "shaped like x (or call layer_norm)")
    x = _x(x)
    residual = as_array(residual, "residual", writable=True) if fused else None
    weight = None if weight is None else as_array(weight, "weight")
    bias = None if bias is None else as_array(bias, "bias")
    out = None if out is None else as_array(out, "out", writable=True)
    if residual is not None:
        _like_x(residual, "residual", x)
    if out is not None:
        _like_x(out, "out", x)
    _params(weight, bias, x)
    _common({"x": x, "residual": residual, "weight": weight, "bias": bias, "out": out})
    _hidden(x)
    e = _eps(eps)
    if residual is not None:
        _check.check_writable(residual, "residual")
        _check.check_no_overlap(residual, "residual", x, "x", identical_ok=False)
        for n, a in (("weight", weight), ("bias", bias)):
            if a is not None:
                _check.check_no_overlap(a, n, residual, "residual", identical_ok=False)
    if out is not None:
        _check.check_writable(out, "out")
        _check.check_no_overlap(out, "out", x, "x", identical_ok=True)
        for n, a in (("weight", weight), ("bias", bias), ("residual", residual)):
            if a is not None:
                _check.check_no_overlap(out, "out", a, n, identical_ok=False)
    cp = _cupy()
    device = x.data.device_id
    with on_device(device):
        if out is None:
            out = cp.empty(x.shape, x.dtype)
        lead = x.shape[:-1]
        mean = cp.empty(lead, np.float32) if return_stats else None
        rstd = cp.empty(lead, np.float32) if return_stats else None
        if x.size == 0:
            if mean is not None and rstd is not None and mean.size:  # rows of no element: NaN statistics
                mean.fill(np.nan)
                rstd.fill(np.nan)
        else:
            _launch_forward(fused, x, residual, weight, bias, e, out, mean, rstd, device)
    return (out, mean, rstd) if return_stats else out


def _launch_forward(fused, x, residual, weight, bias, e, out, mean, rstd, device, w_dtype=None):
    """The forward's launches; ``out`` None: the statistics alone, into ``mean`` and ``rstd`` (cupy arrays or
    addresses of contiguous float32 rows), for kernels of weight dtype ``w_dtype``."""
    hidden = x.shape[-1]
    rowed = [out if out is not None else x, residual, x] if fused else [out if out is not None else x, x]
    stats = ArraySpec.fresh(x.shape[:-1] + (1,), np.float32)
    layout = rows_layout(rowed + [stats])
    knobs = _tuned.lookup(TUNING["fused" if fused else "forward"], device, x.dtype, x.shape)
    p = plan("fused" if fused else "forward", hidden, layout.rows, vector_width(hidden, rowed, (weight, bias)),
             x.itemsize, sm_count(device), knobs)
    if w_dtype is None:
        w_dtype = weight.dtype if weight is not None else bias.dtype if bias is not None else x.dtype
    kernel = get_kernel(p.instantiation(x.dtype, w_dtype)).kernel
    (out_s0, out_s1), (x_s0, x_s1), (st_s0, st_s1) = layout.strides[0], layout.strides[-2], layout.strides[-1]
    res_s0, res_s1 = layout.strides[1] if fused else (0, 0)
    params = struct_argument(PARAMS.struct(rows=layout.rows, inner=layout.inner, out_s0=out_s0, out_s1=out_s1,
                                           res_s0=res_s0, res_s1=res_s1, x_s0=x_s0, x_s1=x_s1, st_s0=st_s0,
                                           st_s1=st_s1, hidden=hidden, eps=e))
    w = _NULL if weight is None else weight
    b = _NULL if bias is None else bias
    for offs in layout.outer:
        *o_rowed, o_st = offs
        ptrs = [a.data + o * x.itemsize for a, o in zip(rowed, o_rowed)]
        if fused:
            args = (ptrs[0], ptrs[1], ptrs[2], w, b, params)
        else:
            st = (_NULL, _NULL) if mean is None else (np.uint64(_address(mean) + 4 * o_st),
                                                      np.uint64(_address(rstd) + 4 * o_st))
            args = (ptrs[0] if out is not None else _NULL, *st, ptrs[1], w, b, params)
        launch(kernel, p.config, args)


def _address(a) -> int:
    return a if isinstance(a, int) else a.data.ptr


def layer_norm(x: DeviceArray, weight: DeviceArray | None = None, bias: DeviceArray | None = None, *,
               eps: float = 1e-5, out: DeviceArray | None = None, return_stats: bool = False) -> DeviceArray | tuple:
    """Layer normalization over the last axis.

    ``out = (x - mean) * rstd * weight + bias`` with ``mean`` and ``var`` the row's mean and (biased)
    variance and ``rstd = 1 / sqrt(var + eps)``, computed in float32 and rounded once to x's dtype.
    ``weight=None`` means 1, ``bias=None`` 0. A row's bits depend only on its values, the hidden size, the
    dtypes and eps: not on the other rows, the layout, the tuning, the stream or the GPU
    (:func:`cukern.reference.layer_norm_emulated` computes them on the host).

    Parameters
    ----------
    x : cupy.ndarray, float32, float16 or bfloat16, shape ``[..., hidden]``, hidden at most 8192; leading
        dimensions may be strided, the last must have unit stride.
    weight, bias : cupy.ndarray of shape ``[hidden]``, x's dtype or float32 (both the same), optional.
    eps : float
        Finite and at least 0; a real number (an array is refused: reading it would synchronize the host).
    out : cupy.ndarray like x, optional; may be x itself (in place), must not overlap it otherwise.
    return_stats : bool
        Also return each row's mean and rstd (float32, shape ``x.shape[:-1]``), as
        :func:`layer_norm_backward` takes them.

    Returns
    -------
    out, or ``(out, mean, rstd)`` with ``return_stats``. out has x's dtype.

    Raises
    ------
    TypeError
        For a non-array, a dtype outside those above, or an eps that is not a real number.
    ValueError
        For mismatched shapes, a bad stride, overlapping arrays, a row over 8192 elements or an eps that is
        negative or not finite. Every check runs before anything is launched.

    Examples
    --------
    >>> import cupy, cukern
    >>> x = cupy.random.standard_normal((4, 1024), dtype=cupy.float32)
    >>> y = cukern.layer_norm(x, cupy.ones(1024, cupy.float32), cupy.zeros(1024, cupy.float32))
    >>> bool(abs(float(y.mean())) < 1e-3)
    True
    """
    return _forward(False, x, None, weight, bias, eps, out, bool(return_stats))


def fused_add_layer_norm(x: DeviceArray, residual: DeviceArray, weight: DeviceArray | None = None,
                         bias: DeviceArray | None = None, *, eps: float = 1e-5,
                         out: DeviceArray | None = None) -> DeviceArray:
    """``residual = round(residual + x)`` in place, then ``out = layer_norm(residual, weight, bias)``.

    The sum is taken in float32 and rounded once to residual's dtype (x's); out has x's dtype. ``out=x`` is
    allowed. Same dtypes, layouts and eps as :func:`layer_norm`; residual (an array, never None) must not
    overlap x, out, weight or bias. The backward of this form is :func:`layer_norm_backward` of the new
    residual, with ``dresidual`` the gradient flowing into the residual stream.

    Examples
    --------
    >>> import cupy, cukern
    >>> x = cupy.ones((2, 64), cupy.float32); r = cupy.arange(128, dtype=cupy.float32).reshape(2, 64)
    >>> y = cukern.fused_add_layer_norm(x, r)
    >>> float(r[0, 0])
    1.0
    """
    return _forward(True, x, residual, weight, bias, eps, out, False)


# ---------------------------------------------------------------------------------------------------------
# Backward.


def _contiguous(a, name: str, op: str):
    if a is None or a.flags.c_contiguous:
        return a
    refuse_temporary_in_capture(op, f"{name} is copied to a contiguous array first; pass a C-contiguous {name}")
    return _cupy().ascontiguousarray(a)


def layer_norm_backward(dy: DeviceArray, x: DeviceArray, weight: DeviceArray | None = None, *, eps: float = 1e-5,
                        mean: DeviceArray | None = None, rstd: DeviceArray | None = None,
                        dresidual: DeviceArray | None = None, dx: DeviceArray | None = None
                        ) -> tuple[DeviceArray, DeviceArray | None, DeviceArray]:
    """Gradients of :func:`layer_norm` (and of :func:`fused_add_layer_norm`, x then being the new residual).

    With ``xhat = (x - mean) * rstd`` and ``g = dy * weight``:
    ``dx = rstd * ((g - mean(g)) - xhat * mean(g * xhat)) (+ dresidual)``,
    ``dweight = sum over rows of dy * xhat``, ``dbias = sum over rows of dy``. Row sums in float32 over
    rms_norm's fixed tree, means as the sums times ``1 / hidden`` (rounded once); dweight and dbias add
    chunks of :func:`chunk_rows` rows in row order, then the chunks pairwise: no float atomics, the same bits
    on every GPU for the same row count, and a row's dx does not depend on the other rows
    (:func:`cukern.reference.layer_norm_backward_emulated`).

    Parameters
    ----------
    dy, x : cupy.ndarray of one shape ``[..., hidden]`` and dtype (float32, float16 or bfloat16), last stride 1.
    weight : cupy.ndarray ``[hidden]``, x's dtype or float32, optional (None: 1, and no dweight).
    eps : float
        The forward's eps; used only when mean and rstd are not given.
    mean, rstd : cupy.ndarray float32 of shape ``x.shape[:-1]``, both or neither: the forward's statistics
        (``return_stats=True``). Without them they are computed again by the forward's own tree, which gives
        the forward's bits.
    dresidual : cupy.ndarray like x, optional: added to dx (the gradient of the residual stream).
    dx : cupy.ndarray like x, optional, written; may be dy or dresidual itself, must not overlap x or any
        other input.

    Returns
    -------
    (dx, dweight, dbias): dx in x's dtype; dweight (None without a weight) and dbias of shape ``[hidden]`` in
    weight's dtype (x's without a weight).

    Raises
    ------
    TypeError, ValueError
        As :func:`layer_norm`, for any argument above; every check runs before anything is launched.

    Examples
    --------
    >>> import cupy, cukern
    >>> x = cupy.random.standard_normal((8, 256), dtype=cupy.float32)
    >>> w = cupy.ones(256, cupy.float32)
    >>> y, mu, rs = cukern.layer_norm(x, w, return_stats=True)
    >>> dx, dw, db = cukern.layer_norm_backward(cupy.ones_like(y), x, w, mean=mu, rstd=rs)
    >>> bool(abs(float(dx.sum())) < 1e-3)
    True
    """
    op = "layer_norm_backward"
    dy = _x(dy, "dy")
    x = _x(x)
    _like_x(dy, "dy", x)
    weight = None if weight is None else as_array(weight, "weight")
    _params(weight, None, x)
    if (mean is None) != (rstd is None):
        missing = "rstd" if rstd is None else "mean"
        raise TypeError(f"{missing} is None; pass both mean and rstd (from layer_norm(..., return_stats=True)) "
                        "or neither")
    stats = {}
    for name, a in (("mean", mean), ("rstd", rstd)):
        if a is None:
            continue
        a = stats[name] = as_array(a, name)
        if a.dtype != np.float32:
            raise TypeError(f"{name} has dtype {dtype_name(a.dtype)}; it must be float32")
        if a.shape != x.shape[:-1]:
            raise ValueError(f"{name} has shape {a.shape}; it must be x's leading shape {x.shape[:-1]}")
    dresidual = None if dresidual is None else as_array(dresidual, "dresidual")
    if dresidual is not None:
        _like_x(dresidual, "dresidual", x)
    if dx is not None:
        dx = as_array(dx, "dx", writable=True)
        _like_x(dx, "dx", x)
    _common({"dy": dy, "x": x, "weight": weight, "dresidual": dresidual, "dx": dx, **stats})
    _hidden(x)
    e = _eps(eps)
    if dx is not None:
        _check.check_writable(dx, "dx")
        _check.check_no_overlap(dx, "dx", dy, "dy", identical_ok=True)
        if dresidual is not None:
            _check.check_no_overlap(dx, "dx", dresidual, "dresidual", identical_ok=True)
        for n, a in (("x", x), ("weight", weight), *stats.items()):
            if a is not None:
                _check.check_no_overlap(dx, "dx", a, n, identical_ok=False)
    mean, rstd = stats.get("mean"), stats.get("rstd")
    cp = _cupy()
    device = x.data.device_id
    hidden = x.shape[-1]
    rows = math.prod(x.shape[:-1])
    w_dtype = weight.dtype if weight is not None else x.dtype
    with on_device(device):
        if x.size == 0:
            if dx is None:
                dx = cp.empty(x.shape, x.dtype)
            dbias = cp.zeros(hidden, w_dtype)
            return dx, None if weight is None else cp.zeros(hidden, w_dtype), dbias
        target = dx
        layout = rows_layout([dx if dx is not None else ArraySpec.fresh(x.shape, x.dtype), dy, x]
                             + ([dresidual] if dresidual is not None else []))
        if len(layout.outer) > 1:  # chunks run across launches: one launch over contiguous copies
            dy, x, dresidual = (_contiguous(a, n, op) for a, n in ((dy, "dy"), (x, "x"), (dresidual, "dresidual")))
            if dx is not None and not dx.flags.c_contiguous:
                refuse_temporary_in_capture(op, "dx is written to a contiguous array first; pass a C-contiguous dx")
                dx = None
        mean, rstd = _contiguous(mean, "mean", op), _contiguous(rstd, "rstd", op)
        chunks = chunk_count(rows)
        partials = chunks * hidden * 4 * (2 if weight is not None else 1)
        ws = reduce.workspace(partials + (8 * rows if mean is None else 0))
        if dx is None:
            dx = cp.empty(x.shape, x.dtype)
        dweight = None if weight is None else cp.empty(hidden, w_dtype)
        dbias = cp.empty(hidden, w_dtype)
        scratch = ws.scratch.data.ptr
        with SEQUENCE_LOCK:
            if mean is None:  # the forward's statistics, by the forward's kernel
                mean, rstd = scratch + partials, scratch + partials + 4 * rows
                _launch_forward(False, x, None, None, None, e, None, mean, rstd, device, w_dtype)
            _launch_backward(dy, x, weight, mean, rstd, dresidual, dx, dweight, dbias, scratch, device)
        if target is not None and target is not dx:
            target[...] = dx
            dx = target
    return dx, dweight, dbias


def _launch_backward(dy, x, weight, mean, rstd, dresidual, dx, dweight, dbias, scratch, device):
    hidden = x.shape[-1]
    rowed = [dx, dy, x] + ([dresidual] if dresidual is not None else [])
    layout = rows_layout(rowed + [ArraySpec.fresh(x.shape[:-1] + (1,), np.float32)])
    knobs = _tuned.lookup(TUNING["backward"], device, x.dtype, x.shape)
    p = plan("backward", hidden, layout.rows, vector_width(hidden, rowed, (weight,)), x.itemsize, sm_count(device),
             knobs)
    w_dtype = weight.dtype if weight is not None else x.dtype
    kernel = get_kernel(p.instantiation(x.dtype, w_dtype)).kernel
    grads = get_kernel(param_grads_instantiation(w_dtype)).kernel
    s = layout.strides
    dr_s0, dr_s1 = s[3] if dresidual is not None else (0, 0)
    params = struct_argument(BACKWARD_PARAMS.struct(
        rows=layout.rows, inner=layout.inner, dx_s0=s[0][0], dx_s1=s[0][1], dy_s0=s[1][0], dy_s1=s[1][1],
        x_s0=s[2][0], x_s1=s[2][1], dr_s0=dr_s0, dr_s1=dr_s1, st_s0=s[-1][0], st_s1=s[-1][1],
        chunk_rows=p.chunk_rows, chunks=p.chunks, hidden=hidden, inv_hidden=np.float32(1) / np.float32(hidden)))
    db_part = np.uint64(scratch)
    dw_part = np.uint64(scratch + 4 * p.chunks * hidden) if weight is not None else _NULL
    grads_params = struct_argument(PARAM_GRADS_PARAMS.struct(hidden=hidden, chunks=p.chunks,
                                                             leaves=tree_leaves(p.chunks)))
    launch(kernel, p.config, (dx, dw_part, db_part, dy, x, _NULL if weight is None else weight,
                              np.uint64(_address(mean)), np.uint64(_address(rstd)),
                              _NULL if dresidual is None else dresidual, params))
    launch(grads, param_grads_config(hidden), (_NULL if dweight is None else dweight, dbias, dw_part, db_part,
                                               grads_params))
