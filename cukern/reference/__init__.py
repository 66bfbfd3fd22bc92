"""Float64 references: the definitions the kernels are tested and benchmarked against.

They take NumPy arrays, or CuPy arrays (then they compute in float64 on the GPU, which keeps tests on
large shapes fast); the arithmetic is the textbook formula, independent of the kernels' structure.
Where a kernel promises its exact bits, an emulator (``*_emulated``, NumPy on the host) repeats its
roundings in its order, so tests compare bits rather than tolerances. One module per family:
:mod:`~cukern.reference.norms`, :mod:`~cukern.reference.rotary`, :mod:`~cukern.reference.reductions`,
:mod:`~cukern.reference.argreduce`, :mod:`~cukern.reference.segment` and :mod:`~cukern.reference.scan`;
every public name is also here.
"""

from .norms import (
    rms_norm,
    fused_add_rms_norm,
    rms_norm_sum_of_squares_emulated,
    rms_norm_emulated,
    rms_norm_rstd_emulated,
    fused_add_rms_norm_emulated,
    float8_e4m3fn_bits,
    FP8_MAX,
    FP8_MIN_SCALE,
    rms_norm_fp8_values_emulated,
    rms_norm_fp8_emulated,
    fused_add_rms_norm_fp8_emulated,
    rms_norm_fp8,
    rms_norm_backward,
    column_tree_emulated,
    rms_norm_backward_emulated,
)
from .layernorm import (
    layer_norm,
    layer_norm_backward,
    layer_norm_stats_emulated,
    layer_norm_emulated,
    fused_add_layer_norm_emulated,
    layer_norm_backward_emulated,
)
from .rotary import (
    rope_frequency,
    rope_attention_factor,
    rope_cache,
    rotary_embedding,
    rotary_embedding_emulated,
    qk_norm_rope,
    qk_norm_rope_emulated,
    qk_norm_rope_backward,
    qk_norm_rope_backward_emulated,
    rotary_positions_cos_sin,
    rotary_embedding_positions,
    rotary_embedding_positions_emulated,
    mrope_rows,
    rotary_embedding_mrope,
    rotary_embedding_mrope_emulated,
)
from .reductions import (
    reduce_sum,
    reduce_mean,
    reduce_sum_of_squares,
    reduce_norm,
    reduce_amax,
    reduce_amin,
    reduction_tolerance,
    reduction_tree,
    sum_emulated,
    mean_emulated,
    sum_of_squares_emulated,
    norm_emulated,
    amax_emulated,
    amin_emulated,
    reduce_var,
    reduce_std,
    var_emulated,
    std_emulated,
    reduce_nansum,
    reduce_nanmean,
    reduce_nanmax,
    reduce_nanmin,
    reduce_prod,
    reduce_logsumexp,
    nansum_emulated,
    extreme_emulated,
    nanmax_emulated,
    nanmin_emulated,
    nanmean_emulated,
    count_nonzero_emulated,
    any_emulated,
    all_emulated,
    prod_emulated,
    logsumexp_emulated,
    logsumexp_weighted_emulated,
    logsumexp_complex_emulated,
)
from .argreduce import (
    argmax,
    argmin,
    nanargmax,
    nanargmin,
    arg_keys,
    argmax_emulated,
    argmin_emulated,
    nanargmax_emulated,
    nanargmin_emulated,
)
from .segment import (
    segment_sum,
    segment_max,
    segment_min,
    segment_mean,
    segment_sum_emulated,
    segment_max_emulated,
    segment_min_emulated,
    segment_mean_emulated,
)
from .scan import (
    cumsum,
    cumprod,
    cumsum_emulated,
    cumprod_emulated,
)
from ._common import (
    to_bfloat16,
)

__all__ = [
    "FP8_MAX", "FP8_MIN_SCALE", "all_emulated", "amax_emulated", "amin_emulated", "any_emulated", "arg_keys", "argmax",
    "argmax_emulated", "argmin", "argmin_emulated", "column_tree_emulated", "count_nonzero_emulated", "cumprod",
    "cumprod_emulated", "cumsum", "cumsum_emulated", "extreme_emulated", "float8_e4m3fn_bits",
    "fused_add_layer_norm_emulated", "fused_add_rms_norm", "fused_add_rms_norm_emulated",
    "fused_add_rms_norm_fp8_emulated", "layer_norm", "layer_norm_backward", "layer_norm_backward_emulated",
    "layer_norm_emulated", "layer_norm_stats_emulated", "logsumexp_complex_emulated", "logsumexp_emulated",
    "logsumexp_weighted_emulated",
    "mean_emulated", "mrope_rows", "nanargmax", "nanargmax_emulated", "nanargmin", "nanargmin_emulated",
    "nanmax_emulated", "nanmean_emulated", "nanmin_emulated", "nansum_emulated", "norm_emulated", "prod_emulated",
    "qk_norm_rope", "qk_norm_rope_backward", "qk_norm_rope_backward_emulated", "qk_norm_rope_emulated", "reduce_amax",
    "reduce_amin", "reduce_logsumexp", "reduce_mean", "reduce_nanmax", "reduce_nanmean", "reduce_nanmin",
    "reduce_nansum", "reduce_norm", "reduce_prod", "reduce_std", "reduce_sum", "reduce_sum_of_squares", "reduce_var",
    "reduction_tolerance", "reduction_tree", "rms_norm", "rms_norm_backward", "rms_norm_backward_emulated",
    "rms_norm_emulated", "rms_norm_fp8", "rms_norm_fp8_emulated", "rms_norm_fp8_values_emulated",
    "rms_norm_rstd_emulated", "rms_norm_sum_of_squares_emulated", "rope_attention_factor", "rope_cache",
    "rope_frequency", "rotary_embedding", "rotary_embedding_emulated", "rotary_embedding_mrope",
    "rotary_embedding_mrope_emulated", "rotary_embedding_positions", "rotary_embedding_positions_emulated",
    "rotary_positions_cos_sin", "segment_max", "segment_max_emulated", "segment_mean", "segment_mean_emulated",
    "segment_min", "segment_min_emulated", "segment_sum", "segment_sum_emulated", "std_emulated", "sum_emulated",
    "sum_of_squares_emulated", "to_bfloat16", "var_emulated",
]
