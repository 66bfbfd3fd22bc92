"""cukern: hand-written CUDA kernels for CuPy arrays."""

from . import timing
from .ladder import RUNGS as reduce_ladder
from .reduce import amax, amin, mean, norm, sum, sum_of_squares
from .rmsnorm import fused_add_rms_norm, rms_norm
from .rope_cache import rope_cache
from .rotary import rotary_embedding

__version__ = "0.1.0"

__all__ = [
    "amax", "amin", "fused_add_rms_norm", "mean", "norm", "reduce_ladder", "rms_norm", "rope_cache",
    "rotary_embedding", "sum", "sum_of_squares", "timing",
]
