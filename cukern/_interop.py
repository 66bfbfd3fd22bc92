"""Arrays from other frameworks as :class:`cupy.ndarray` views, without importing them and without copying
(:func:`as_array`):

* ``__dlpack__`` first when the object has it (PyTorch, JAX, CuPy-likes): :func:`cupy.from_dlpack` hands the
  producer CuPy's current stream, and the producer orders its pending work before that stream's next launch
  (an event wait on the GPU, no host synchronization). DLPack also carries bfloat16, which
  ``__cuda_array_interface__`` cannot name.
* ``__cuda_array_interface__`` otherwise (Numba device arrays, cuDF columns, hand-written producers), versions
  0 to 3, read by :func:`parse_cuda_array_interface`. A version 3 ``stream`` other than CuPy's current one
  gets the same GPU-side ordering: an event is recorded on the producer's stream and the current stream waits
  on it (``CUPY_CUDA_ARRAY_INTERFACE_SYNC=0`` turns that off, as it does in CuPy; CuPy itself synchronizes
  the host instead). While the current stream is capturing a CUDA graph no wait is inserted: the graph replays
  long after the producer's work, so order the two yourself. Earlier versions name no stream: the producer's
  work must already be ordered before CuPy's current stream.

The resulting :class:`cupy.ndarray` is a view of the producer's memory on the producer's device, holding a
reference to the producer, so in-place ops write into the caller's memory.
"""

from __future__ import annotations

import math
import os
import threading
from dataclasses import dataclass

import numpy as np

from ._launch import cupy as _cupy
from ._launch import require_gpu
from ._layout import contiguous_strides, extent, item_aligned

_DLPACK_CUDA, _DLPACK_CUDA_MANAGED = 2, 13
_DLPACK_DEVICES = {1: "CPU", 3: "CUDA pinned host memory", 4: "OpenCL", 7: "Vulkan", 8: "Metal", 10: "ROCm"}
_LEGACY_STREAM = 1  # the protocol's name for the legacy default stream, which CuPy's null stream (0) is
_SYNC = os.environ.get("CUPY_CUDA_ARRAY_INTERFACE_SYNC", "1") != "0"


@dataclass(frozen=True)
class ArrayInterface:
    """What a ``__cuda_array_interface__`` says, checked. ``ptr`` is element 0's address; the memory the
    array touches is ``[ptr - offset, ptr - offset + nbytes)`` (``offset`` > 0 only with negative strides).
    ``strides`` in bytes, None for C-contiguous. ``stream``: the producer's stream handle (1 the legacy
    default stream, 2 the per-thread default stream), None when no ordering is needed."""

    ptr: int
    shape: tuple
    dtype: np.dtype
    strides: tuple | None
    readonly: bool
    stream: int | None
    version: int
    offset: int
    nbytes: int


def _int_tuple(value, what: str, name: str) -> tuple:
    if not isinstance(value, (tuple, list)) or not all(
            isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in value):
        raise ValueError(f"{name}'s __cuda_array_interface__ has {what} {value!r}; it must be a tuple of ints")
    return tuple(int(v) for v in value)


_typestrs: dict = {}


def _interface_dtype(typestr, name: str) -> np.dtype:
    dtype = _typestrs.get(typestr) if isinstance(typestr, str) else None
    if dtype is not None:
        return dtype
    if not isinstance(typestr, str):
        raise ValueError(f"{name}'s __cuda_array_interface__ has typestr {typestr!r}; it must be a string")
    try:
        dtype = np.dtype(typestr)
    except TypeError as err:
        raise TypeError(f"{name}'s __cuda_array_interface__ has typestr {typestr!r}, which is not a dtype") from err
    if dtype.kind not in "biufc":
        hint = (" (bfloat16 and other extension types cannot be named by this protocol: pass an object with "
                "__dlpack__, a PyTorch tensor for example)") if dtype.kind == "V" else ""
        raise TypeError(f"{name}'s __cuda_array_interface__ has typestr {typestr!r}: not a number type{hint}")
    if not dtype.isnative:
        raise TypeError(f"{name}'s __cuda_array_interface__ has typestr {typestr!r}: big-endian data is not "
                        "supported on the GPU; byte-swap it first")
    _typestrs[typestr] = dtype
    return dtype


def parse_cuda_array_interface(desc, name: str = "array") -> ArrayInterface:
    """Check a ``__cuda_array_interface__`` dictionary (versions 0 to 3) and return what it says.

    Pure: reads nothing but ``desc``. Raises TypeError for data cukern cannot take (masks, non-numeric or
    big-endian typestrs) and ValueError for a dictionary that breaks the protocol.
    """
    if not isinstance(desc, dict):
        raise ValueError(f"{name}'s __cuda_array_interface__ is a {type(desc).__name__}; the protocol asks for a dict")
    missing = [k for k in ("version", "shape", "typestr", "data") if k not in desc]
    if missing:
        raise ValueError(f"{name}'s __cuda_array_interface__ lacks {', '.join(missing)}")
    version = desc["version"]
    if not isinstance(version, int) or isinstance(version, bool) or not 0 <= version <= 3:
        raise ValueError(f"{name}'s __cuda_array_interface__ has version {version!r}; cukern reads versions 0 to 3")
    if desc.get("mask") is not None:
        raise TypeError(f"{name} is a masked array (its __cuda_array_interface__ has a mask); fill or drop the "
                        "masked elements first")
    shape = _int_tuple(desc["shape"], "shape", name)
    if any(n < 0 for n in shape):
        raise ValueError(f"{name}'s __cuda_array_interface__ has a negative extent in shape {shape}")
    dtype = _interface_dtype(desc["typestr"], name)
    strides = desc.get("strides")
    if strides is not None:
        strides = _int_tuple(strides, "strides", name)
        if len(strides) != len(shape):
            raise ValueError(f"{name}'s __cuda_array_interface__ has strides {strides} for shape {shape}")
        if any(s % dtype.itemsize for s in strides):
            raise ValueError(f"{name}'s strides {strides} (bytes) are not multiples of its itemsize "
                             f"{dtype.itemsize}; copy it to a contiguous array first")
    data = desc["data"]
    if not isinstance(data, (tuple, list)) or len(data) != 2:
        raise ValueError(f"{name}'s __cuda_array_interface__ has data {data!r}; it must be (pointer, read_only)")
    ptr, readonly = data
    size = math.prod(shape)
    if ptr is None:
        ptr = 0
    if not isinstance(ptr, (int, np.integer)) or isinstance(ptr, bool) or ptr < 0:
        raise ValueError(f"{name}'s __cuda_array_interface__ has data pointer {ptr!r}; it must be an int")
    if size and not ptr:
        raise ValueError(f"{name}'s __cuda_array_interface__ has a null data pointer for {size} elements")
    stream = desc.get("stream") if version >= 3 else None
    if stream is not None:
        if not isinstance(stream, (int, np.integer)) or isinstance(stream, bool):
            raise ValueError(f"{name}'s __cuda_array_interface__ has stream {stream!r}; it must be an int or None")
        if stream == 0:
            raise ValueError(f"{name}'s __cuda_array_interface__ names stream 0, which the protocol forbids as "
                             "ambiguous (1 is the legacy default stream, 2 the per-thread one)")
        stream = int(stream)
    offset, nbytes = 0, 0
    if size:
        steps = strides if strides is not None else contiguous_strides(shape, dtype.itemsize)
        lo, hi = extent(0, shape, steps, dtype.itemsize)
        offset, nbytes = -lo, hi - lo
    return ArrayInterface(int(ptr), shape, dtype, strides, bool(readonly), stream, version, offset, nbytes)


_device_count = None


def _pointer_device(ptr: int) -> int:
    """The device ``ptr`` lives on: asked of the driver only when there is more than one device (null
    pointers of empty arrays: the current device)."""
    global _device_count
    runtime = _cupy().cuda.runtime
    if _device_count is None:
        require_gpu()
        _device_count = runtime.getDeviceCount()
    if not ptr:
        return runtime.getDevice()
    if _device_count == 1:
        return 0
    return runtime.pointerGetAttributes(ptr).device


_events = threading.local()


def _wait_for_stream(producer: int, device: int) -> None:
    """Order CuPy's current stream after the work queued so far on stream ``producer`` (a handle), on the
    GPU: an event recorded there and waited on here. One reusable event per thread and device: a wait binds
    to the event's state when it is queued, so re-recording it later is harmless."""
    cp = _cupy()
    current = cp.cuda.get_current_stream()
    if producer == current.ptr or (producer == _LEGACY_STREAM and current.ptr == 0):
        return
    if current.is_capturing():
        return
    cache = _events.__dict__.setdefault("by_device", {})
    event = cache.get(device)
    if event is None:
        with cp.cuda.Device(device):
            event = cache[device] = cp.cuda.Event(block=False, disable_timing=True)
    cp.cuda.runtime.eventRecord(event.ptr, producer)
    current.wait_event(event)


def from_interface(obj, iface: ArrayInterface):
    """A :class:`cupy.ndarray` viewing the memory ``iface`` describes, owned by ``obj`` (kept alive)."""
    cp = _cupy()
    device = _pointer_device(iface.ptr - iface.offset)
    if iface.stream is not None and _SYNC:
        _wait_for_stream(iface.stream, device)
    mem = cp.cuda.UnownedMemory(iface.ptr - iface.offset, iface.nbytes, obj, device_id=device)
    return cp.ndarray(iface.shape, iface.dtype, cp.cuda.MemoryPointer(mem, iface.offset), iface.strides)


def _from_dlpack(obj, name: str):
    cp = _cupy()
    device = getattr(obj, "__dlpack_device__", None)
    kind = device()[0] if device is not None else None
    if kind not in (_DLPACK_CUDA, _DLPACK_CUDA_MANAGED):
        where = "it does not say which device it is on (no __dlpack_device__)" if kind is None else (
            f"it is in {_DLPACK_DEVICES.get(int(kind), f'DLPack device type {kind}')} memory")
        raise TypeError(f"{name} is not in CUDA device memory: {where}; move it to the GPU first")
    return cp.from_dlpack(obj)


def check_item_aligned(a, name: str) -> None:
    """ValueError for an array some of whose elements do not start at a multiple of its item size (a view of
    bytes at an odd offset, say): the GPU cannot load them (a misaligned load is a fault that ends the
    process's CUDA context), so it is refused before any launch."""
    if not item_aligned(a.data.ptr, a.shape, a.strides, a.itemsize):
        whose = f"{name}'" if name.endswith("s") else f"{name}'s"
        raise ValueError(f"{whose} elements are not aligned to its item size ({a.itemsize} bytes: its address or a "
                         "stride is not a multiple of it), which the GPU cannot load; copy its bytes to a new array")


def as_array(obj, name: str, *, writable: bool = False):
    """``obj`` as a :class:`cupy.ndarray` without copying: CuPy arrays as they are, other GPU arrays through
    ``__dlpack__`` or ``__cuda_array_interface__`` (see the module notes for stream order). ``writable``:
    the op writes into it, so a producer that marks its memory read-only is refused. Every array must be
    aligned to its item size (:func:`check_item_aligned`)."""
    cp = _cupy()
    if isinstance(obj, cp.ndarray):
        check_item_aligned(obj, name)
        return obj
    if isinstance(obj, np.ndarray):
        raise TypeError(f"{name} is a numpy.ndarray in host memory; move it to the GPU with cupy.asarray({name})")
    if hasattr(obj, "__dlpack__"):
        a = _from_dlpack(obj, name)
        check_item_aligned(a, name)
        return a
    try:
        desc = obj.__cuda_array_interface__
    except AttributeError:
        desc = None
    if desc is None:
        raise TypeError(
            f"{name} must be a cupy.ndarray or a GPU array exposing __cuda_array_interface__ or __dlpack__, "
            f"got {type(obj).__name__}; convert with cupy.asarray({name})"
        )
    iface = parse_cuda_array_interface(desc, name)
    if writable and iface.readonly:
        raise ValueError(f"{name} is read-only (its producer says so) and this op writes into it; pass a "
                         "writable array")
    a = from_interface(obj, iface)
    check_item_aligned(a, name)
    return a
