"""NumPy float64 references: the definitions the kernels are tested and benchmarked against."""

from __future__ import annotations

import numpy as np


def _f64(a):
    return None if a is None else np.asarray(a).astype(np.float64)


def rms_norm(x, weight=None, eps=1e-6, offset=0.0):
    """``x / sqrt(mean(x**2, -1) + eps) * (offset + weight)`` in float64. Reads x, weight; writes out."""
    x = _f64(x)
    w = np.ones(x.shape[-1]) if weight is None else _f64(weight)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * (offset + w)


def fused_add_rms_norm(x, residual, weight=None, eps=1e-6, offset=0.0, residual_dtype=None):
    """``(new_residual, out)``: residual + x rounded to ``residual_dtype`` (as the kernel stores it), then its
    RMSNorm. Reads x, residual, weight; writes residual, out."""
    r = _f64(residual) + _f64(x)
    if residual_dtype is not None:
        r = r.astype(residual_dtype).astype(np.float64)
    return r, rms_norm(r, weight, eps, offset)
