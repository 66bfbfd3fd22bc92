"""Argument checks shared by every op, and overlap between arrays. Each failure names the argument and says
how to fix it, and all of them run before anything is launched. Arrays from other frameworks become CuPy
views in :mod:`cukern._interop`.
"""

from __future__ import annotations

import numpy as np

from ._dtypes import dtype_name
from ._interop import as_array  # noqa: F401  (the ops still call _check.as_array; they move to _interop)
from ._layout import extent


def check_keepdims(value) -> bool:
    """``keepdims`` as NumPy's reductions read it: a bool, or an integer taken as its truth (``keepdims=1``);
    None, a float, a string or an array is a TypeError, as NumPy's ``sum`` raises."""
    if value is True or value is False:
        return value
    if isinstance(value, (int, np.integer, np.bool_)):
        return bool(value)
    raise TypeError(f"keepdims must be a bool or an integer, got {value!r}")


def check_flag(value, name: str) -> bool:
    """``value`` as a bool: True, False or a NumPy bool; anything else (None, 0, a string) is a TypeError rather
    than a guess at what it meant. Cheap for a bool (two identity tests): the ops call it on every call, so
    that a cached call cannot take a flag its planning would have refused."""
    if value is True or value is False:
        return value
    if isinstance(value, np.bool_):
        return bool(value)
    raise TypeError(f"{name} must be True or False, got {value!r}")


def check_least_int(owner, name: str, least: int) -> None:
    """ValueError unless ``owner``'s attribute ``name`` (a tuning knob, say) is an int of at least ``least``."""
    value = getattr(owner, name)
    if not (isinstance(value, int) and value >= least):
        raise ValueError(f"{name}={value!r}; it must be an int >= {least}")


def check_dtype(a, name: str, allowed) -> None:
    if a.dtype not in allowed:
        names = ", ".join(dtype_name(d) for d in allowed)
        raise TypeError(f"{name} has dtype {dtype_name(a.dtype)}; supported: {names}")


def check_same_device(arrays: dict) -> int:
    devices = {name: a.device.id for name, a in arrays.items() if a is not None}
    if len(set(devices.values())) > 1:
        where = ", ".join(f"{n} on device {d}" for n, d in devices.items())
        raise ValueError(f"arrays are on different devices ({where}); move them to one device")
    return next(iter(devices.values()))


def check_unit_last_stride(a, name: str) -> None:
    if a.size and a.shape[-1] > 1 and a.strides[-1] != a.itemsize:
        raise ValueError(
            f"{name}'s last dimension has stride {a.strides[-1] // a.itemsize} elements; it must be 1 "
            f"(make it contiguous with cupy.ascontiguousarray({name}))"
        )


def same_view(a, b) -> bool:
    return a.data.ptr == b.data.ptr and a.shape == b.shape and a.strides == b.strides


class _Addresses:
    """An array's addresses through NumPy's array interface, never read: what :func:`numpy.shares_memory`
    needs to decide exactly whether two strided layouts share a byte."""

    def __init__(self, a):
        self.__array_interface__ = {"version": 3, "shape": tuple(a.shape), "strides": tuple(a.strides),
                                    "typestr": f"|V{a.itemsize}", "data": (a.data.ptr, True)}


_SHARE_WORK = 1 << 20  # numpy.shares_memory's search bound; layouts it cannot settle within it count as sharing


def shares_elements(a, b) -> bool:
    """Whether two arrays share a byte, decided exactly (views of one buffer interleaved, such as ``buf[:, 0]``
    and ``buf[:, 1]``, share none though their extents meet)."""
    try:
        # NumPy's stubs name only max_work's constants, -1 and 0; a positive bound is documented too
        return bool(np.shares_memory(np.asarray(_Addresses(a)), np.asarray(_Addresses(b)),
                                     max_work=_SHARE_WORK))  # type: ignore[arg-type]
    except np.exceptions.TooHardError:
        return True


def overlaps(a, b) -> bool:
    """Whether two arrays share an element: their extents first, then, where those meet, exactly."""
    if a.size == 0 or b.size == 0:
        return False
    alo, ahi = extent(a.data.ptr, a.shape, a.strides, a.itemsize)
    blo, bhi = extent(b.data.ptr, b.shape, b.strides, b.itemsize)
    return alo < bhi and blo < ahi and shares_elements(a, b)


def check_no_overlap(a, a_name: str, b, b_name: str, *, identical_ok: bool) -> None:
    if not (identical_ok and same_view(a, b)) and overlaps(a, b):  # (the same view costs no exact check)
        how = "partially overlaps" if identical_ok else "overlaps"
        also = " or the same one" if identical_ok else ""
        raise ValueError(f"{a_name} {how} {b_name}; pass a separate array{also}")


def check_out(out, shape, dtype, x):
    """An ``out`` argument as a CuPy view: of the result's ``shape`` and ``dtype`` (None: any dtype, the
    caller casts into it), on x's device, writable; overlap is the caller's to check (in-place ops allow
    some)."""
    out = as_array(out, "out", writable=True)
    if out.shape != shape:
        raise ValueError(f"out has shape {out.shape}; the result has shape {shape}")
    if dtype is not None and out.dtype != dtype:
        raise TypeError(f"out has dtype {dtype_name(out.dtype)}; the result has dtype {dtype_name(dtype)}")
    check_same_device({"x": x, "out": out})
    check_writable(out, "out")
    return out


def check_writable(a, name: str) -> None:
    """A written array must not alias itself (a broadcast view with a zero stride, say)."""
    if a.size and any(s == 0 and n > 1 for n, s in zip(a.shape, a.strides)):
        raise ValueError(f"{name} has a zero stride (a broadcast view); it cannot be written, pass a real array")
