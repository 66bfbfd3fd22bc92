"""cukern: hand-written CUDA kernels for CuPy arrays."""

from . import timing
from .rmsnorm import fused_add_rms_norm, rms_norm
from .rotary import rope_cache, rotary_embedding

__version__ = "0.1.0"

__all__ = ["fused_add_rms_norm", "rms_norm", "rope_cache", "rotary_embedding", "timing"]
