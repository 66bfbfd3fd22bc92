"""cukern: hand-written CUDA kernels for CuPy arrays."""

from . import timing
from .card import explain
from .ladder import RUNGS as reduce_ladder
from .reduce import amax, amin, mean, norm, sum, sum_of_squares
from .rmsnorm import fused_add_rms_norm, rms_norm
from .rotary import rope_cache, rotary_embedding
from .tuning import tune

__version__ = "0.1.0"

__all__ = [
    "amax", "amin", "explain", "fused_add_rms_norm", "mean", "norm", "reduce_ladder", "rms_norm", "rope_cache",
    "rotary_embedding", "sum", "sum_of_squares", "timing", "tune",
]
