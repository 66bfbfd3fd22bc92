"""The dtypes cukern speaks of, bfloat16 included (from ml_dtypes, which CuPy 14 understands)."""

import ml_dtypes
import numpy as np

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
FLOAT_TYPES = (np.dtype(np.float32), np.dtype(np.float16), BFLOAT16)


def dtype_name(dtype) -> str:
    return "bfloat16" if np.dtype(dtype) == BFLOAT16 else np.dtype(dtype).name


def parse_dtype(name) -> np.dtype:
    return BFLOAT16 if str(name) == "bfloat16" else np.dtype(name)
