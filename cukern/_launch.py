"""The one place a kernel is launched: a named launch configuration and typed scalar arguments.

Each kernel family declares its parameter list as a :class:`Signature`; :func:`launch` checks the count,
converts scalars to the exact C type (so an int never lands in a float slot) and launches on CuPy's current
stream, on the device of the arrays.

Kernels on a hot host path (RMSNorm, rotary) take their scalars as one struct passed by value instead,
declared by :class:`Params`: CuPy converts every NumPy scalar argument on every call (about 0.5 µs each
on the H200's host, measured in bench/NOTES.md), while a struct packed once per plan is passed as one
pointer to its bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

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


def launch(kernel, config: LaunchConfig, signature: Signature, args) -> None:
    kernel(config.grid, config.block, signature.convert(args), shared_mem=config.shared_mem)


def launch_typed(kernel, config: LaunchConfig, args) -> None:
    """:func:`launch` for arguments already typed: arrays, :data:`NULL` or ``numpy.uint64`` addresses, and
    a :func:`struct_argument` packed once and cached (a hot loop's host path)."""
    kernel(config.grid, config.block, args, shared_mem=config.shared_mem)


_sm_counts: dict = {}


def sm_count(device: int) -> int:
    """Multiprocessors on ``device`` (read once, then cached)."""
    if device not in _sm_counts:
        import cupy

        _sm_counts[device] = cupy.cuda.Device(device).attributes["MultiProcessorCount"]
    return _sm_counts[device]
