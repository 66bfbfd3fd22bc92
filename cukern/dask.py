"""cukern over Dask arrays with CuPy chunks: one GPU per worker, many GPUs per array.

Row ops run per chunk (``map_blocks``/``blockwise``): the normalized (last) axis of :func:`rms_norm` and
:func:`fused_add_rms_norm`, and ``head_size`` of :func:`rotary_embedding`, must each be one chunk; any
other axis may be chunked. Dask arrays are immutable, so the ops that work in place eagerly return new
arrays here (each chunk is copied, then changed in place). Reductions (:func:`sum`, :func:`mean`,
:func:`sum_of_squares`, :func:`norm`, :func:`amax`, :func:`amin`) are Dask tree reductions whose chunk,
combine and aggregate steps are cukern kernels; partial results stay in the accumulator type (float32 for
half types, float64 for float64, int64 for integers), so the only rounding to the result type is the last.
They match the eager ops up to summation order.

Dask is an optional extra (``pip install "cukern[dask]"``), imported when an op is first called. A cluster
with one worker per GPU::

    from dask_cuda import LocalCUDACluster
    from dask.distributed import Client
    import cupy as cp, dask.array as da, cukern.dask as ckd

    client = Client(LocalCUDACluster())
    x = da.random.default_rng(cp.random.default_rng()).standard_normal((65536, 4096), chunks=(8192, 4096),
                                                                       dtype=cp.float32)
    y = ckd.rms_norm(x, cp.ones(4096, dtype=cp.float32))      # lazy; chunks are rows
    total = ckd.sum(y, axis=-1).compute()                     # one cupy array back on the client
"""

from __future__ import annotations

import functools
import math
import operator
from contextlib import nullcontext
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import cukern._convert as _convert
import cukern.reduce as _reduce
import cukern.reduce_plan as _plan
import cukern.rmsnorm as _rmsnorm
import cukern.rotary as _rotary

from ._dtypes import dtype_name
from ._typing import Axis, DeviceArray, DTypeLike

if TYPE_CHECKING:  # Dask is an optional extra, imported when an op is first called
    from dask.array import Array as DaskArray

# The eager ops the chunk functions call, looked up at run time (tests stand in NumPy versions).
_eager = SimpleNamespace(
    rms_norm=_rmsnorm.rms_norm,
    fused_add_rms_norm=_rmsnorm.fused_add_rms_norm,
    rotary_embedding=_rotary.rotary_embedding,
    sum=_reduce.sum,
    sum_of_squares=_reduce.sum_of_squares,
    amax=_reduce.amax,
    amin=_reduce.amin,
    astype=_convert.astype,
)


def _da():
    try:
        import dask.array as da
    except ImportError as err:
        raise ImportError('cukern.dask needs Dask: pip install "cukern[dask]" (or "dask[array]")') from err
    return da


def _on_device(a):
    """The chunk's CuPy device as a context (kernels and allocations go there), else a no-op."""
    device = getattr(a, "device", None)
    return device if hasattr(device, "__enter__") else nullcontext()


def _as_dask(a, name: str):
    da = _da()
    if isinstance(a, da.Array):
        return a
    if not hasattr(a, "shape") or not hasattr(a, "dtype"):
        raise TypeError(f"{name} must be a dask array or an array, got {type(a).__name__}")
    return da.from_array(a, chunks=a.shape, name=False, asarray=False)


def _one_chunk(a, axis: int, name: str, what: str):
    if len(a.chunks[axis]) > 1:
        raise ValueError(f"{name}'s {what} (axis {axis % a.ndim}) is split into {len(a.chunks[axis])} chunks; "
                         f"it must be one: {name}.rechunk({{{axis % a.ndim}: -1}})")


def _whole(a, name: str):
    """A small operand (weight, cache) as a dask array of one chunk."""
    a = _as_dask(a, name)
    return a if a.numblocks == (1,) * a.ndim else a.rechunk(-1)


def _first(parts):
    """The first array in Dask's nested lists of blocks (the only one for an operand of one chunk)."""
    while isinstance(parts, (list, tuple)):
        parts = parts[0]
    return parts


# ---------------------------------------------------------------------------------------------- row ops


# The chunk functions take their other operands to x's device first (a weight or cache made on one GPU,
# chunks of one process on several): the eager ops refuse arrays on different devices.


def _rms_chunk(x, weight=None, *, eps, offset):
    with _on_device(x):
        return _eager.rms_norm(x, _to_device_of(weight, x), eps, offset=offset)


def _fused_chunk(x, residual, weight=None, *, eps, offset):
    with _on_device(x):
        residual = _to_device_of(residual, x).copy()
        out = _eager.fused_add_rms_norm(x, residual, _to_device_of(weight, x), eps, offset=offset)
        return out, residual


def _rotary_chunk(positions, x, cache, **options):
    with _on_device(x):
        x = x.copy()
        _eager.rotary_embedding(_to_device_of(positions, x), x, None, _to_device_of(_first(cache), x), **options)
        return x


def _rows(x, name: str):
    x = _as_dask(x, name)
    if x.ndim < 1:
        raise ValueError(f"{name} must have at least one dimension (the normalized one)")
    _one_chunk(x, -1, name, "last dimension")
    return x


def _weight(weight, hidden: int) -> tuple:
    if weight is None:
        return ()
    w = _whole(weight, "weight")
    if w.shape != (hidden,):
        raise ValueError(f"weight has shape {w.shape}; it must be 1-D with x's last dimension ({hidden})")
    return (w,)


def rms_norm(x: DaskArray | DeviceArray, weight: DaskArray | DeviceArray | None = None, eps: float = 1e-6, *,
             offset: float = 0.0) -> DaskArray:
    """:func:`cukern.rms_norm` over a dask array ``x`` (``[..., hidden]``, the last axis one chunk), chunk
    by chunk. ``weight``: a CuPy or dask array of ``[hidden]``, or None. Returns a dask array like ``x``.

    Examples
    --------
    >>> import cupy as cp
    >>> import dask.array as da
    >>> import cukern.dask
    >>> x = da.from_array(cp.ones((4, 8), dtype=cp.float32), chunks=(2, 8))
    >>> y = cukern.dask.rms_norm(x, eps=0.0)
    >>> y.chunks, float(y.sum().compute())
    (((2, 2), (8,)), 32.0)
    """
    da = _da()
    x = _rows(x, "x")
    return da.map_blocks(_rms_chunk, x, *_weight(weight, x.shape[-1]), eps=eps, offset=offset, dtype=x.dtype,
                         meta=x._meta)


def fused_add_rms_norm(x: DaskArray | DeviceArray, residual: DaskArray | DeviceArray,
                       weight: DaskArray | DeviceArray | None = None, eps: float = 1e-6, *,
                       offset: float = 0.0) -> tuple[DaskArray, DaskArray]:
    """:func:`cukern.fused_add_rms_norm` over dask arrays: returns ``(out, residual + x)`` as new dask arrays
    (the eager op's ``out`` and updated ``residual``). ``residual`` is rechunked like ``x``.

    Examples
    --------
    >>> import cupy as cp
    >>> import dask.array as da
    >>> import cukern.dask
    >>> x = da.from_array(cp.ones((4, 8), dtype=cp.float32), chunks=(2, 8))
    >>> out, residual = cukern.dask.fused_add_rms_norm(x, cp.ones((4, 8), dtype=cp.float32), eps=0.0)
    >>> float(out.sum().compute()), float(residual.sum().compute())
    (32.0, 64.0)
    """
    da = _da()
    x = _rows(x, "x")
    residual = _as_dask(residual, "residual")
    if residual.shape != x.shape:
        raise ValueError(f"residual has shape {residual.shape}, x has {x.shape}; they must match")
    residual = residual.rechunk(x.chunks)
    pair = da.map_blocks(_fused_chunk, x, residual, *_weight(weight, x.shape[-1]), eps=eps, offset=offset,
                         dtype=x.dtype, meta=x._meta)
    out = pair.map_blocks(operator.getitem, 0, dtype=x.dtype, meta=x._meta)
    new_residual = pair.map_blocks(operator.getitem, 1, dtype=residual.dtype, meta=residual._meta)
    return out, new_residual


def rotary_embedding(positions: DaskArray | DeviceArray, query: DaskArray | DeviceArray,
                     key: DaskArray | DeviceArray | None, cos_sin_cache: DeviceArray, *, is_neox: bool = True,
                     rotary_dim: int | None = None, inverse: bool = False,
                     check_positions: bool = True) -> tuple[DaskArray, DaskArray | None]:
    """:func:`cukern.rotary_embedding` over dask arrays: returns ``(query, key)`` rotated, as new dask arrays
    (key None stays None).

    ``query`` and ``key`` are ``[tokens, heads, head_size]`` with ``head_size`` one chunk; tokens and heads
    may be chunked (query and key each their own way). ``positions`` (``[tokens]``) is rechunked to each
    one's token chunks; ``cos_sin_cache`` (CuPy or dask) is one chunk, shared by every task.

    Examples
    --------
    >>> import cupy as cp
    >>> import dask.array as da
    >>> import cukern.dask
    >>> import cukern
    >>> q = da.from_array(cp.ones((4, 2, 8), dtype=cp.float32), chunks=(2, 1, 8))
    >>> positions = cp.zeros(4, dtype=cp.int32)  # position 0 turns by angle 0
    >>> q_rot, k_rot = cukern.dask.rotary_embedding(positions, q, None, cukern.rope_cache(16, 8))
    >>> k_rot is None, bool((q_rot.compute() == 1).all())
    (True, True)
    """
    da = _da()
    options = dict(is_neox=is_neox, rotary_dim=rotary_dim, inverse=inverse, check_positions=check_positions)
    positions = _as_dask(positions, "positions")
    cache = _whole(cos_sin_cache, "cos_sin_cache")
    if positions.ndim != 1:
        raise ValueError(f"positions has shape {positions.shape}; it must be 1-D [tokens]")
    if cache.ndim != 2:
        raise ValueError(f"cos_sin_cache has shape {cache.shape}; it must be [max_position, width]")
    out: list[Any] = []
    for name, a in (("query", query), ("key", key)):
        if a is None:
            out.append(None)
            continue
        a = _as_dask(a, name)
        if a.ndim != 3:
            raise ValueError(f"{name} has shape {a.shape}; it must be [tokens, heads, head_size]")
        if math.isnan(a.shape[0]) or math.isnan(positions.shape[0]):
            raise ValueError(f"{name} or positions has unknown chunk sizes; call compute_chunk_sizes() on it first")
        if a.shape[0] != positions.shape[0]:
            raise ValueError(f"{name} has {a.shape[0]} tokens, positions has {positions.shape[0]}; they must match")
        _one_chunk(a, -1, name, "head_size")
        pos = positions.rechunk((a.chunks[0],))
        out.append(da.blockwise(_rotary_chunk, "thd", pos, "t", a, "thd", cache, "pw", concatenate=False,
                                dtype=a.dtype, meta=a._meta, **options))
    return tuple(out)


# ---------------------------------------------------------------------------------------------- reductions

_CHUNK_OP = {"sum": "sum", "mean": "sum", "sum_of_squares": "sum_of_squares", "norm": "sum_of_squares",
             "amax": "amax", "amin": "amin"}


def _join(parts, axes):
    """Dask's nested lists of partial results (one nesting level per reduced axis, in ``axes`` order) as one
    array, concatenated here rather than by Dask so that it happens on the partials' device (that of the
    first; partials from other GPUs of the same process are copied over first)."""
    import numpy as np

    if not isinstance(parts, (list, tuple)):
        return parts
    parts = [_join(p, axes[1:]) for p in parts]
    if len(parts) == 1:
        return parts[0]
    return np.concatenate([_to_device_of(p, parts[0]) for p in parts], axis=axes[0])


def _to_device_of(a, ref):
    """``a`` on ``ref``'s CuPy device: itself when already there (or not a CuPy array), else a copy made after
    ``a``'s device has finished the work queued on its current stream (the one host sync of this path)."""
    dev, here = getattr(ref, "device", None), getattr(a, "device", None)
    if not hasattr(dev, "__enter__") or not hasattr(here, "__enter__") or here.id == dev.id:
        return a
    import cupy

    with here:
        a = cupy.ascontiguousarray(a)
        cupy.cuda.get_current_stream().synchronize()
    with dev:
        out = cupy.empty(a.shape, dtype=a.dtype)
        out.data.copy_from_device_async(a.data, a.nbytes)
        cupy.cuda.get_current_stream().synchronize()  # before ``a``, maybe a temporary, goes back to its pool
    return out


def _chunk(x, axis, keepdims, *, op, partial_dtype, computing_meta=False):
    if computing_meta:  # Dask asking for the result's array type while building the graph: launch nothing
        return x
    with _on_device(x):
        if op in ("amax", "amin") and not math.prod(x.shape[i] for i in axis):
            return _identity(x, axis, keepdims, op)
        return getattr(_eager, op)(x, axis=axis, keepdims=keepdims, dtype=partial_dtype)


def _identity(x, axis, keepdims, op):
    """The partial of a chunk empty along a reduced axis (Dask makes them: ``compute_chunk_sizes`` after a
    mask, say), which holds no extreme: the value no element loses to (-inf for a float maximum, the
    least integer, False), in x's dtype and array type."""
    import numpy as np

    shape = tuple(1 if i in axis else n for i, n in enumerate(x.shape) if keepdims or i not in axis)
    dt = np.dtype(x.dtype)
    if dt.kind == "b":
        value = op == "amin"
    elif dt.kind in "iu":
        value = np.iinfo(dt).min if op == "amax" else np.iinfo(dt).max
    else:
        value = -np.inf if op == "amax" else np.inf
    host = np.full(shape, value, dt)
    if isinstance(x, np.ndarray):
        return host
    import cupy

    return cupy.asarray(host)  # on x's device, the caller's


def _combine(parts, axis, keepdims, *, op):
    with _on_device(_first(parts)):
        return getattr(_eager, op)(_join(parts, sorted(axis)), axis=axis, keepdims=keepdims)


def _finish(parts, axis, keepdims, *, op, name, count, final):
    import numpy as np

    with _on_device(_first(parts)):
        r = getattr(_eager, op)(_join(parts, sorted(axis)), axis=axis, keepdims=keepdims)
        if name in ("mean", "norm"):  # in float64, as the eager kernels finish (CuPy's float32 steps flush)
            r = _eager.astype(r, np.complex128 if r.dtype.kind == "c" else np.float64)
            r = (r / count if count else r * np.nan) if name == "mean" else np.sqrt(r)
            if final.itemsize == 2:  # the eager kernels round a half type's result through float32
                r = _eager.astype(r, np.float32)
        return r if r.dtype == final else _eager.astype(r, final)


def _reduction(name: str, x, axis, dtype, keepdims: bool, split_every):
    da = _da()
    from dask.array.utils import meta_from_array

    x = _as_dask(x, "x")
    op = _plan.OPS[name]
    if x.dtype not in op.inputs:
        names = ", ".join(dtype_name(d) for d in op.inputs)
        raise TypeError(f"x has dtype {dtype_name(x.dtype)}; {name} takes {names}")
    axes = _plan.normalize_axis(axis, x.ndim)
    final = _plan.result_dtype(name, x.dtype, dtype)
    direct = _plan.kernel_dtypes(name, x.dtype)
    if dtype is not None and final not in direct:
        # the chunks' partials are the kernels' own results, which a cast after them would not give (NumPy
        # accumulates in such a dtype)
        names = ", ".join(dtype_name(d) for d in direct)
        raise TypeError(f"dtype={dtype_name(final)} is not supported by cukern.dask's {name} of "
                        f"{dtype_name(x.dtype)}; use one of {names} (or convert the result with .astype)")
    count = math.prod(x.shape[i] for i in axes)
    if math.isnan(count) and (name == "mean" or op.minmax):  # the count divides; an empty extreme raises
        raise ValueError(f"x has unknown chunk sizes along axes {axes}; call x.compute_chunk_sizes() first")
    if count == 0 and op.minmax:
        raise ValueError(f"zero-size array to reduction operation {name} which has no identity")
    minmax = op.minmax
    partial_dtype = None if minmax else _plan.acc_dtype(final)
    merge = name if minmax else "sum"
    chunk = functools.partial(_chunk, op=_CHUNK_OP[name], partial_dtype=partial_dtype)
    combine = functools.partial(_combine, op=merge)
    aggregate = functools.partial(_finish, op=merge, name=name, count=count, final=final)
    ndim = x.ndim if keepdims else x.ndim - len(axes)
    return da.reduction(x, chunk, aggregate, combine=combine, axis=axes, keepdims=keepdims, dtype=final,
                        split_every=split_every, concatenate=False, name=f"cukern-{name}",
                        meta=meta_from_array(x._meta, ndim=ndim, dtype=final))


def sum(  # noqa: A001 - mirrors numpy
        x: DaskArray | DeviceArray, axis: Axis = None, *, dtype: DTypeLike | None = None, keepdims: bool = False,
        split_every: int | dict[int, int] | None = None) -> DaskArray:
    """:func:`cukern.sum` as a Dask reduction: per-chunk sums in the accumulator type, combined and finished
    with cukern kernels. ``split_every``: Dask's fan-in per combine step.

    Examples
    --------
    >>> import cupy as cp
    >>> import dask.array as da
    >>> import cukern.dask
    >>> x = da.from_array(cp.arange(12, dtype=cp.float32).reshape(4, 3), chunks=(2, 3))
    >>> print(cukern.dask.sum(x, axis=0).compute())
    [18. 22. 26.]
    """
    return _reduction("sum", x, axis, dtype, keepdims, split_every)


def mean(x: DaskArray | DeviceArray, axis: Axis = None, *, dtype: DTypeLike | None = None, keepdims: bool = False,
         split_every: int | dict[int, int] | None = None) -> DaskArray:
    """:func:`cukern.mean` as a Dask reduction: a tree of sums, divided by the count at the end.

    Examples
    --------
    >>> import cupy as cp
    >>> import dask.array as da
    >>> import cukern.dask
    >>> x = da.from_array(cp.arange(12, dtype=cp.float32).reshape(4, 3), chunks=(2, 3))
    >>> print(cukern.dask.mean(x, axis=0).compute())
    [4.5 5.5 6.5]
    """
    return _reduction("mean", x, axis, dtype, keepdims, split_every)


def sum_of_squares(x: DaskArray | DeviceArray, axis: Axis = None, *, dtype: DTypeLike | None = None,
                   keepdims: bool = False, split_every: int | dict[int, int] | None = None) -> DaskArray:
    """:func:`cukern.sum_of_squares` as a Dask reduction.

    Examples
    --------
    >>> import cupy as cp
    >>> import dask.array as da
    >>> import cukern.dask
    >>> x = da.from_array(cp.arange(12, dtype=cp.float32).reshape(4, 3), chunks=(2, 3))
    >>> print(cukern.dask.sum_of_squares(x, axis=1).compute())
    [  5.  50. 149. 302.]
    """
    return _reduction("sum_of_squares", x, axis, dtype, keepdims, split_every)


def norm(x: DaskArray | DeviceArray, axis: Axis = None, *, dtype: DTypeLike | None = None, keepdims: bool = False,
         split_every: int | dict[int, int] | None = None) -> DaskArray:
    """:func:`cukern.norm` as a Dask reduction: a tree of sums of squares, square-rooted at the end.

    Examples
    --------
    >>> import cupy as cp
    >>> import dask.array as da
    >>> import cukern.dask
    >>> x = da.from_array(cp.array([[3.0, 4.0], [0.0, 0.0]]), chunks=(1, 2))
    >>> print(cukern.dask.norm(x).compute())
    5.0
    """
    return _reduction("norm", x, axis, dtype, keepdims, split_every)


def amax(x: DaskArray | DeviceArray, axis: Axis = None, *, dtype: DTypeLike | None = None, keepdims: bool = False,
         split_every: int | dict[int, int] | None = None) -> DaskArray:
    """:func:`cukern.amax` as a Dask reduction (NaN propagates).

    Examples
    --------
    >>> import cupy as cp
    >>> import dask.array as da
    >>> import cukern.dask
    >>> x = da.from_array(cp.arange(12, dtype=cp.float32).reshape(4, 3), chunks=(2, 3))
    >>> print(cukern.dask.amax(x, axis=1).compute())
    [ 2.  5.  8. 11.]
    """
    return _reduction("amax", x, axis, dtype, keepdims, split_every)


def amin(x: DaskArray | DeviceArray, axis: Axis = None, *, dtype: DTypeLike | None = None, keepdims: bool = False,
         split_every: int | dict[int, int] | None = None) -> DaskArray:
    """:func:`cukern.amin` as a Dask reduction (NaN propagates).

    Examples
    --------
    >>> import cupy as cp
    >>> import dask.array as da
    >>> import cukern.dask
    >>> x = da.from_array(cp.arange(12, dtype=cp.float32).reshape(4, 3), chunks=(2, 3))
    >>> print(cukern.dask.amin(x, axis=0).compute())
    [0. 1. 2.]
    """
    return _reduction("amin", x, axis, dtype, keepdims, split_every)
