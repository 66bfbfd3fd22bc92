"""The aliases the public signatures are written with.

CuPy ships no type stubs, so the device array is CuPy's ``ndarray`` to the type checker only (imported
under ``TYPE_CHECKING``, never at run time: importing cukern must not import CuPy); a checker without CuPy's
stubs treats it as ``Any``, which is also what the ops accept beyond CuPy arrays (any object exporting
``__dlpack__`` or ``__cuda_array_interface__``, see :mod:`cukern._interop`). At run time every alias is a
real object (``DeviceArray`` is ``Any`` there), so ``typing.get_type_hints`` and the documentation resolve
them.

* :data:`DeviceArray`: a GPU array an op reads or returns.
* :data:`HostArray`: a NumPy array (the emulators' inputs and results).
* :data:`Array`: a DeviceArray or a HostArray, as the float64 references take them (on the GPU for a CuPy
  input).
* :data:`HostResult`: a NumPy array, or the NumPy scalar a NumPy reduction over every axis gives.
* :data:`Axis`, :data:`DTypeLike`: the NumPy meanings.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeAlias, Union

import numpy as np
import numpy.typing as npt

HostArray: TypeAlias = npt.NDArray[Any]
HostResult: TypeAlias = Union[HostArray, np.generic]
Axis: TypeAlias = Union[int, tuple[int, ...], None]
DTypeLike: TypeAlias = npt.DTypeLike

if TYPE_CHECKING:
    from cupy import ndarray as DeviceArray

    Array: TypeAlias = Union[HostArray, DeviceArray]
else:
    DeviceArray: TypeAlias = Any
    Array: TypeAlias = Union[np.ndarray, Any]

__all__ = ["Array", "Axis", "DTypeLike", "DeviceArray", "HostArray", "HostResult"]
