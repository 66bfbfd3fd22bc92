"""The one place a kernel is launched: a named launch configuration and typed scalar arguments.

Each kernel family declares its parameter list as a :class:`Signature`; :func:`launch` checks the count,
converts scalars to the exact C type (so an int never lands in a float slot) and launches on CuPy's current
stream, on the device of the arrays.
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


def launch(kernel, config: LaunchConfig, signature: Signature, args) -> None:
    kernel(config.grid, config.block, signature.convert(args), shared_mem=config.shared_mem)


def launch_typed(kernel, config: LaunchConfig, args) -> None:
    """:func:`launch` for arguments already typed: arrays, :data:`NULL` or ``numpy.uint64`` addresses, and
    scalars converted by the kernel's :class:`Signature` once and cached (a hot loop's host path)."""
    kernel(config.grid, config.block, args, shared_mem=config.shared_mem)


_sm_counts: dict = {}


def sm_count(device: int) -> int:
    """Multiprocessors on ``device`` (read once, then cached)."""
    if device not in _sm_counts:
        import cupy

        _sm_counts[device] = cupy.cuda.Device(device).attributes["MultiProcessorCount"]
    return _sm_counts[device]
