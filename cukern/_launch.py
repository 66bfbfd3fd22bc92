"""The one launch path: a named launch configuration, typed scalar arguments, the one call cache, the one
device switch and the one place a kernel is called.

Each kernel family declares its parameter list as a :class:`Signature` (or a :class:`Params` struct);
:func:`launch` checks the count, converts scalars to the exact C type (so an int never lands in a float
slot) and launches on CuPy's current stream. :func:`on_device` makes an array's device current (a no-op
when it already is). :class:`CallCache` holds each op's prepared calls (validated, planned, arguments
packed) keyed by what they depend on, bounded.

Kernels on a hot host path (RMSNorm, rotary) take their scalars as one struct passed by value instead,
declared by :class:`Params`: CuPy converts every NumPy scalar argument on every call (a cost per argument
measured in docs/design/timing.md), while a struct packed once per plan is passed as one
pointer to its bytes.
"""

from __future__ import annotations

import threading
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import numpy as np

NULL = np.uint64(0)  # a null pointer argument
_SCALARS = {"i32": np.int32, "i64": np.int64, "u64": np.uint64, "f32": np.float32, "f64": np.float64}


@dataclass(frozen=True)
class LaunchConfig:
    grid: tuple
    block: tuple
    shared_mem: int = 0

    def __post_init__(self):
        if not all(1 <= g < 2**31 for g in self.grid) or not all(1 <= b <= 1024 for b in self.block):
            raise ValueError(f"bad launch configuration grid={self.grid} block={self.block}")


@dataclass(frozen=True)
class Signature:
    """Parameter kinds in order: ``ptr`` (an array, a device address as an int, or None for a null
    pointer), or a scalar kind from ``_SCALARS``."""

    params: tuple

    def convert(self, args) -> tuple:
        if len(args) != len(self.params):
            raise TypeError(f"kernel takes {len(self.params)} arguments, got {len(args)}")
        out = []
        for kind, a in zip(self.params, args):
            if kind == "ptr":
                out.append(NULL if a is None else np.uint64(a) if isinstance(a, int) else a)
            else:
                t = _SCALARS[kind]
                out.append(a if type(a) is t else t(a))  # arguments typed once (cached) pass through
        return tuple(out)


@dataclass(frozen=True)
class Params:
    """A C struct of scalars passed by value, ``fields`` ``(name, kind)`` in the struct's order, kinds from
    ``_SCALARS``. The layout is NumPy's aligned one, which is the C one; the ``.cu`` file declares the same
    fields in the same order (a test compares the two)."""

    fields: tuple

    @property
    def dtype(self) -> np.dtype:
        return np.dtype([(n, _SCALARS[k]) for n, k in self.fields], align=True)

    def struct(self, **values) -> np.ndarray:
        """The struct as a 0-d NumPy array, every field given by name."""
        names = [n for n, _ in self.fields]
        if sorted(values) != sorted(names):
            raise TypeError(f"struct fields are {names}, got {sorted(values)}")
        out = np.zeros((), self.dtype)
        for n in names:
            out[n] = values[n]
        return out


def struct_argument(struct: np.ndarray):
    """A :meth:`Params.struct` as a kernel argument, passed by value (it keeps the array alive)."""
    from cupy.cuda.function import CNumpyArray

    return CNumpyArray(struct)


def launch(kernel, config: LaunchConfig, args, signature: Signature | None = None) -> None:
    """Call ``kernel`` (a ``cupy.cuda.Function``) on the current stream. With ``signature`` the arguments are
    checked and typed here; without, they must already be typed: arrays (or their ``MemoryPointer``),
    :data:`NULL` or ``numpy.uint64`` addresses, and :func:`struct_argument` values packed once and cached
    (a hot loop's host path)."""
    if signature is not None:
        args = signature.convert(args)
    kernel(config.grid, config.block, args, shared_mem=config.shared_mem)


class Prepared:
    """One launch with its arguments laid out once, in the form ``cuLaunchKernel`` takes them: a buffer with
    every argument's bytes and an array of pointers to each. A call writes only the words that change (the
    ``slots``: argument positions whose value is given per call, such as the output's and the input's
    addresses, or ``(position, field)`` for an 8-byte-aligned field of a struct argument), then launches
    through the driver on ``stream`` (a handle). Nothing is converted per call, which is most of a small
    call's host cost through ``Function.__call__`` (docs/design/timing.md).

    ``kernel`` is a ``cupy.RawKernel`` (its ``Function`` on the current device is taken: the launch holds for
    that device only) or a ``cupy.cuda.Function``. ``args`` are typed as :func:`launch` takes them (arrays or
    ``MemoryPointer``: their address; NumPy scalars; :meth:`Params.struct` structs, as NumPy arrays), the
    slots' entries being placeholders. Calls on one object are serialized by a lock (they share the buffer)
    for the microseconds of the enqueue; the driver copies the arguments when the launch is enqueued, so the
    buffer is free again when it returns.

    The driver launches in the calling thread's current context, which a thread that has made no runtime call
    yet (a Dask worker's, say) lacks; the first call of each thread on each device makes one (as CuPy's own
    launches do)."""

    __slots__ = ("kernel", "config", "args", "slots", "_words", "_dims", "_values", "_pointers", "_address",
                 "_function", "_device", "_launch", "_lock")

    def __init__(self, kernel, config: LaunchConfig, args, slots: tuple):
        self.kernel, self.config, self.args, self.slots = kernel, config, tuple(args), tuple(slots)
        pieces = [_argument_bytes(a) for a in self.args]
        offsets = np.cumsum([0] + [-(-len(p) // 8) * 8 for p in pieces])  # each argument 8-byte aligned
        values = np.zeros(max(int(offsets[-1]) // 8, 1), np.uint64)
        raw = values.view(np.uint8)
        for piece, at in zip(pieces, offsets):
            raw[at:at + len(piece)] = np.frombuffer(piece, np.uint8)
        self._values = values
        self._words = tuple(_word(offsets, self.args, s) for s in self.slots)
        self._pointers = np.array([values.ctypes.data + int(at) for at in offsets[:-1]], np.uint64)
        self._address = self._pointers.ctypes.data
        grid = tuple(config.grid) + (1,) * (3 - len(config.grid))
        block = tuple(config.block) + (1,) * (3 - len(config.block))
        self._dims = grid + block + (config.shared_mem,)
        self._function = getattr(kernel, "kernel", kernel).ptr  # a RawKernel's Function on this device, or one
        self._device = cupy().cuda.runtime.getDevice()
        self._launch = cupy().cuda.driver.launchKernel
        self._lock = threading.Lock()

    def __call__(self, stream: int, *addresses: int) -> None:
        """Launch on ``stream`` with ``addresses`` in the slots, in order."""
        if self._device not in getattr(_thread, "contexts", ()):
            _make_context(self._device)
        with self._lock:
            values = self._values
            for word, address in zip(self._words, addresses):
                values[word] = address
            self._launch(self._function, *self._dims, stream, self._address, 0)


_thread = threading.local()  # .contexts: the devices whose context this thread has made current


def _make_context(device: int) -> None:
    """Make ``device``'s primary context current in this thread (any runtime call does; the device is the
    current one), once per thread and device."""
    cupy().cuda.runtime.memGetInfo()
    if not hasattr(_thread, "contexts"):
        _thread.contexts = set()
    _thread.contexts.add(device)


def _word(offsets, args, slot) -> int:
    """The buffer word a slot writes: an argument's, or a struct field's (``(position, field)``)."""
    i, name = (slot, None) if isinstance(slot, int) else slot
    at = int(offsets[i]) + (0 if name is None else args[i].dtype.fields[name][1])
    if at % 8:
        raise ValueError(f"slot {slot} is not 8-byte aligned in the parameter buffer")
    return at // 8


def _argument_bytes(a) -> bytes:
    """The bytes ``cuLaunchKernel`` reads for one argument typed as :func:`launch` takes it (an int: an
    address)."""
    if isinstance(a, (np.generic, np.ndarray)):
        return a.tobytes()
    if isinstance(a, int):
        return np.uint64(a).tobytes()
    return np.uint64(a.ptr if hasattr(a, "ptr") else a.data.ptr).tobytes()


_NO_SWITCH = nullcontext()
_cupy = None
# CuPy is an extra rather than a dependency because its wheel is built per CUDA major version
NEEDS_CUPY = 'cukern needs CuPy: pip install "cukern[cuda12]" (or "cukern[cuda13]" for CUDA 13)'
_runtime = None


def cupy():
    """The CuPy module, imported by the first call that needs it (importing cukern does not import CuPy): the
    one lazy import the ops' hot paths share."""
    global _cupy
    if _cupy is None:
        try:
            import cupy as module
        except ModuleNotFoundError as err:
            if err.name != "cupy":
                raise
            raise ModuleNotFoundError(NEEDS_CUPY, name="cupy") from None
        _cupy = module
    return _cupy


# refuse_temporary_in_capture's usual reasons
X_COPIED = "x's layout is first copied to C-contiguous; make that copy before the capture (cupy.ascontiguousarray(x))"
OUT_STRIDED = "out is not C-contiguous; pass a C-contiguous out"


def refuse_temporary_in_capture(op: str, why: str | None) -> None:
    """RuntimeError, before anything is recorded, when the current stream is capturing a CUDA graph and the
    call would go through a temporary array (``why``: which, and the way around it). A temporary made during
    the capture returns to the memory pool when the call ends, while every replay of the graph still writes
    it: into whatever array the pool hands that memory to next."""
    if why is not None and cupy().cuda.get_current_stream().is_capturing():
        raise RuntimeError(f"{op} cannot be captured in a CUDA graph here: {why}")


def on_device(device_id: int):
    """A context making ``device_id`` current: a no-op when it already is (the common case, and a hot loop's:
    it saves making a Device and two runtime calls). The one device switch of every op."""
    global _runtime
    if _runtime is None:
        _runtime = cupy().cuda.runtime
    if device_id == _runtime.getDevice():
        return _NO_SWITCH
    return cupy().cuda.Device(device_id)


class CallCache:
    """Prepared calls of one op, keyed by everything the preparation read (shapes, strides, dtypes, pointer
    alignment, device, options, knobs). Bounded: past ``limit`` entries the oldest half is dropped. A key
    maps to its value or to None (a call with nothing to launch); :meth:`get` answers ``MISSING`` for a key
    never stored. Only validated preparations are stored, so a hit skips validation and planning."""

    # Any to the type checker: an op's ``call`` variable starts as this and then holds the cached value
    MISSING: Any = object()

    def __init__(self, limit: int = 4096):
        self.limit = limit
        self._entries: dict = {}
        self._lock = threading.Lock()

    def get(self, key):
        return self._entries.get(key, self.MISSING)

    def put(self, key, value):
        with self._lock:
            entries = self._entries
            if len(entries) >= self.limit:
                for k in list(entries)[: self.limit // 2]:
                    del entries[k]
            entries[key] = value
        return value

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


PER_THREAD_STREAM = 2  # cudaStreamPerThread: one handle that names each thread's own default stream
# Held while a call enqueues launches that hand each other data through its stream's workspace (a two-pass
# reduction, a scan's column tiles): two threads on one stream must not interleave theirs (enqueueing takes
# microseconds; the launches run after).
SEQUENCE_LOCK = threading.Lock()


_threads = threading.local()  # ``devices``: those this thread has waited for once (stream_key)


def stream_key(stream) -> tuple:
    """What tells ``stream`` apart for the per-stream workspaces: its handle, and the thread where the handle
    is the per-thread default stream's (``CUPY_CUDA_PER_THREAD_DEFAULT_STREAM=1``: every thread's stream has
    that one handle, but launches on it from two threads may run at once). There a thread's first call on a
    device waits for the device once: a thread that ended under the same id (ids are reused) may have left
    launches on its own stream that still use the workspaces kept under that key. Not while capturing, where
    nothing can wait: the thread's next eager call does."""
    if stream.ptr == PER_THREAD_STREAM:
        devices = getattr(_threads, "devices", None)
        if devices is None:
            devices = _threads.devices = set()
        runtime = cupy().cuda.runtime
        device = runtime.getDevice()
        if device not in devices and not stream.is_capturing():
            runtime.deviceSynchronize()
            devices.add(device)
        return stream.ptr, threading.get_ident()
    return (stream.ptr,)


_sm_counts: dict = {}


def sm_count(device: int) -> int:
    """Multiprocessors on ``device`` (read once, then cached)."""
    if device not in _sm_counts:
        _sm_counts[device] = cupy().cuda.Device(device).attributes["MultiProcessorCount"]
    return _sm_counts[device]


_gpu_seen = False


def require_gpu() -> None:
    """Raise one RuntimeError that says so when CUDA sees no GPU, in place of CUDA's own words for it (without
    a driver: 'driver version is insufficient for CUDA runtime version'); free once a GPU has been seen.
    Called where a public function first touches the device with no GPU array in hand (an op given a
    ``cupy.ndarray`` already has a GPU)."""
    global _gpu_seen
    if _gpu_seen:
        return
    runtime = cupy().cuda.runtime
    try:
        runtime.getDeviceCount()
    except runtime.CUDARuntimeError as err:
        raise RuntimeError(f"cukern needs a CUDA GPU: none is visible (CUDA says: {err})") from None
    _gpu_seen = True
