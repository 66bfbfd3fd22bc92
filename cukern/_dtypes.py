"""The dtypes cukern speaks of, bfloat16 included (from ml_dtypes, which CuPy 14 understands)."""

import ml_dtypes
import numpy as np

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
FLOAT_TYPES = (np.dtype(np.float32), np.dtype(np.float16), BFLOAT16)
# A reduction kernel's result that is stored as int64 but accumulated in float64 (reduce.cu Count:
# count_nonzero's kernels write its result themselves). No array has this dtype: :func:`storage` gives the
# one that holds it.
COUNT = np.dtype([("count", np.int64)])


def storage(dtype) -> np.dtype:
    """The dtype of the array a kernel result of ``dtype`` is written into: int64 for :data:`COUNT`."""
    return np.dtype(np.int64) if np.dtype(dtype) == COUNT else np.dtype(dtype)


def dtype_name(dtype) -> str:
    t = np.dtype(dtype)
    return "bfloat16" if t == BFLOAT16 else "count" if t == COUNT else t.name


def parse_dtype(name) -> np.dtype:
    """``name`` as a dtype: TypeError for one NumPy takes but no CuPy array can hold (another byte order,
    long double), so a ``dtype=`` fails with the op's checks rather than inside CuPy after a launch."""
    try:
        t = BFLOAT16 if str(name) == "bfloat16" else np.dtype(name)
    except (TypeError, ValueError, SyntaxError) as err:  # NumPy parses text with commas as a struct's fields
        raise TypeError(f"dtype={name!r} is not a dtype ({err})") from None
    if not t.isnative or t.type in (np.longdouble, np.clongdouble):
        raise TypeError(f"dtype {t.str} ({t.name}) is not one a CuPy array can hold; use a native-order float, "
                        "integer, complex or bool type")
    return t
