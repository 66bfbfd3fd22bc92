"""cukern: hand-written CUDA kernels for CuPy arrays."""

from . import reference, timing
from .argreduce import argmax, argmin, nanargmax, nanargmin
from .ladder import RUNGS as reduce_ladder
from .qknorm import qk_norm_rope, qk_norm_rope_backward
from .reduce import (
    all,
    amax,
    amin,
    any,
    count_nonzero,
    logsumexp,
    mean,
    nanmax,
    nanmean,
    nanmin,
    nansum,
    norm,
    prod,
    std,
    sum,
    sum_of_squares,
    var,
)
from .layernorm import fused_add_layer_norm, layer_norm, layer_norm_backward
from .rmsnorm import fused_add_rms_norm, rms_norm
from .rmsnorm_backward import rms_norm_backward
from .rope_cache import rope_cache
from .rotary import rotary_embedding, rotary_embedding_mrope, rotary_embedding_positions
from .scan import cumprod, cumsum
from .segment import segment_max, segment_mean, segment_min, segment_sum

__version__ = "0.2.0"

__all__ = [
    "all", "amax", "amin", "any", "argmax", "argmin", "count_nonzero", "cumprod", "cumsum", "fused_add_layer_norm",
    "fused_add_rms_norm", "layer_norm", "layer_norm_backward", "logsumexp", "mean", "nanargmax", "nanargmin",
    "nanmax", "nanmean", "nanmin", "nansum", "norm", "prod", "qk_norm_rope", "qk_norm_rope_backward",
    "reduce_ladder", "reference", "rms_norm", "rms_norm_backward", "rope_cache", "rotary_embedding",
    "rotary_embedding_mrope", "rotary_embedding_positions", "segment_max", "segment_mean", "segment_min",
    "segment_sum", "std", "sum", "sum_of_squares", "timing", "var",
]
