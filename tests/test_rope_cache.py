"""rope_cache's scalings against the published formulas (CPU): DeepSeek's YaRN, LongRoPE (Phi-3), Llama 3 and
Llama 4, each against a float64 transcription of Hugging Face transformers' ``_compute_*_rope_parameters``
written out below; a model's config.json ``rope_scaling`` dict taken as it stands; bad dicts refused."""

import copy
import math

import numpy as np
import pytest

from cukern import reference
from cukern.rope_cache import rope_cache, rope_cache_host, rope_frequencies

# config.json rope_scaling dicts as the models publish them (Phi-3's factor lists are shortened stand-ins of
# the right length and shape: 48 pairs, short near 1, long growing to about 60).
LLAMA31 = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192,
           "rope_type": "llama3"}
LLAMA4_SCOUT = {"factor": 16.0, "high_freq_factor": 1.0, "low_freq_factor": 1.0,
                "original_max_position_embeddings": 8192, "rope_type": "llama3"}
DEEPSEEK_V3 = {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
               "original_max_position_embeddings": 4096, "type": "yarn"}
DEEPSEEK_UNEQUAL = {**DEEPSEEK_V3, "mscale": 1.0, "mscale_all_dim": 0.707}
QWEN3_YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
GPT_OSS = {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0, "original_max_position_embeddings": 4096,
           "rope_type": "yarn", "truncate": False}
SHORT = [float(v) for v in np.linspace(1.0, 1.2, 48)]
LONG = [float(v) for v in np.geomspace(1.0, 60.0, 48)]
PHI3 = {"long_factor": LONG, "short_factor": SHORT, "type": "longrope"}  # original 4096 sits beside it
PHI3_SMALL = {"long_factor": LONG, "long_mscale": 1.243163121016122, "original_max_position_embeddings": 8192,
              "short_factor": SHORT, "short_mscale": 1.0, "type": "su"}


# ------------------------------------------------------- transformers' formulas, transcribed in float64


def hf_default(dim, base):
    return 1.0 / base ** (np.arange(0, dim, 2) / dim)


def hf_llama3(dim, base, rs):
    inv_freq = hf_default(dim, base)
    factor, low, high = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
    old = rs["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    llama = np.where(wavelen > old / low, inv_freq / factor, inv_freq)
    # Llama 4's high == low divides by zero here, as torch does; the band that would use it is then empty
    with np.errstate(divide="ignore", invalid="ignore"):
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * llama / factor + smooth * llama
    medium = ~(wavelen < old / high) & ~(wavelen > old / low)
    return np.where(medium, smoothed, llama), 1.0


def get_mscale(scale, mscale=1.0):
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def hf_yarn(dim, base, rs):
    factor, orig = rs["factor"], rs["original_max_position_embeddings"]
    attention, mscale, mscale_all_dim = rs.get("attention_factor"), rs.get("mscale"), rs.get("mscale_all_dim")
    if attention is None:
        if mscale and mscale_all_dim:
            attention = get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim)
        else:
            attention = get_mscale(factor)
    beta_fast, beta_slow = rs.get("beta_fast") or 32, rs.get("beta_slow") or 1

    def correction_dim(rotations):
        return dim * math.log(orig / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if rs.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dim // 2) - low) / (high - low), 0, 1)
    pos_freqs = base ** (np.arange(0, dim, 2) / dim)
    extrapolation = 1 - ramp
    return 1 / (factor * pos_freqs) * (1 - extrapolation) + 1 / pos_freqs * extrapolation, attention


def deepseek_mscale(rs):
    """DeepSeek's own reading (modeling_deepseek.py, vLLM's DeepseekScalingRotaryEmbedding): defaults 1 and 0."""
    return get_mscale(rs["factor"], rs.get("mscale", 1.0)) / get_mscale(rs["factor"], rs.get("mscale_all_dim", 0.0))


def hf_longrope(dim, base, rs, original_max_position_embeddings, max_position_embeddings, seq_len):
    orig = rs.get("original_max_position_embeddings", original_max_position_embeddings)
    factor, attention = rs.get("factor"), rs.get("attention_factor")
    if factor is None:
        factor = max_position_embeddings / orig
    if attention is None:
        attention = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(orig))
    ext = np.asarray(rs["long_factor"] if seq_len > orig else rs["short_factor"])
    return 1.0 / (ext * base ** (np.arange(0, dim, 2) / dim)), attention


def assert_cache_rows(scaling, rows, dim, base, want_freq, want_attention, positions):
    """Our frequencies and attention factor, and the cache's rows at ``positions``, against the formula's."""
    freq, attention = rope_frequencies(rows, dim, base, scaling)
    np.testing.assert_allclose(freq, want_freq, rtol=1e-14, atol=0)
    assert attention == pytest.approx(want_attention, rel=1e-15)
    cache = rope_cache_host(rows, dim, base, scaling=scaling)
    angles = np.outer(positions, want_freq)
    # an angle near 1e5 radians carries ~1e-11 of rounding in its product, so cos/sin agree to that
    np.testing.assert_allclose(cache[positions, :dim // 2], want_attention * np.cos(angles), rtol=0, atol=1e-9)
    np.testing.assert_allclose(cache[positions, dim // 2:], want_attention * np.sin(angles), rtol=0, atol=1e-9)


def around(orig, rows):
    """Positions at the start, on both sides of the original context, and past it up to the last row."""
    return np.array([p for p in (0, 1, 7, orig - 1, orig, orig + 1, 2 * orig + 3, rows - 1) if p < rows])


# ------------------------------------------------------------------------------------- the scalings


@pytest.mark.parametrize("rs", [LLAMA31, LLAMA4_SCOUT], ids=["llama3.1", "llama4-scout"])
def test_llama3_and_llama4_match_transformers(rs):
    """Llama 4 Scout is rope_type llama3 with low_freq_factor == high_freq_factor: no blend, a step at
    wavelength 8192 (pairs 0..34 kept, 35..63 divided by 16 at base 500000, rot 128)."""
    want, a = hf_llama3(128, 500000.0, rs)
    assert_cache_rows(rs, 20000, 128, 500000.0, want, a, around(8192, 20000))
    if rs is LLAMA4_SCOUT:
        ratio = rope_frequencies(1, 128, 500000.0, rs)[0] / hf_default(128, 500000.0)
        np.testing.assert_array_equal(ratio[:35], 1.0)
        np.testing.assert_allclose(ratio[35:], 1 / 16, rtol=1e-15)


@pytest.mark.parametrize("rs, dim, base, rows", [
    (DEEPSEEK_V3, 64, 10000.0, 12000),
    (DEEPSEEK_UNEQUAL, 64, 10000.0, 12000),
    (QWEN3_YARN, 128, 1e6, 40000),
    (GPT_OSS, 64, 150000.0, 12000),
], ids=["deepseek-v3", "deepseek-unequal-mscale", "qwen3", "gpt-oss-untruncated"])
def test_yarn_matches_transformers(rs, dim, base, rows):
    want, a = hf_yarn(dim, base, rs)
    assert_cache_rows(rs, rows, dim, base, want, a, around(rs["original_max_position_embeddings"], rows))


DEEPSEEK_V2_LITE = {**DEEPSEEK_V3, "mscale": 0.707, "mscale_all_dim": 0.707}


@pytest.mark.parametrize("rs", [DEEPSEEK_V3, DEEPSEEK_UNEQUAL, DEEPSEEK_V2_LITE, {**QWEN3_YARN, "mscale": 1.0}],
                         ids=["v3", "unequal", "v2-lite", "mscale-1-alone"])
def test_yarn_mscale_is_deepseeks_own_reading(rs):
    """DeepSeek's code and transformers read mscale/mscale_all_dim alike on these (V3: 1 / 1 gives 1)."""
    assert rope_frequencies(1, 64, 10000.0, rs)[1] == pytest.approx(deepseek_mscale(rs), rel=1e-15)


@pytest.mark.parametrize("rs", [{"mscale": 0.707}, {"mscale_all_dim": 0.707}, {"mscale": 0.707, "mscale_all_dim": 0}])
def test_yarn_refuses_mscale_the_two_codes_read_apart(rs):
    with pytest.raises(ValueError, match="mscale.*attention_factor"):
        rope_frequencies(16, 64, 10000.0, {**QWEN3_YARN, **rs})
    rope_frequencies(16, 64, 10000.0, {**QWEN3_YARN, **rs, "attention_factor": 1.1})


def test_longrope_long_cache_matches_transformers():
    """Phi-3-mini-128k: past the original 4096 every frequency is divided by its long_factor entry; the
    attention factor is the model's, sqrt(1 + ln(131072 / 4096) / ln 4096), from factor or by default from
    max_position / original when the cache spans the model's whole length."""
    rs = {**PHI3, "original_max_position_embeddings": 4096}
    want, a = hf_longrope(96, 10000.0, PHI3, 4096, 131072, seq_len=131072)
    assert a == pytest.approx(math.sqrt(1 + math.log(32) / math.log(4096)), rel=1e-15)
    freq, attention = rope_frequencies(131072, 96, 10000.0, rs)
    np.testing.assert_allclose(freq, want, rtol=1e-14, atol=0)
    assert attention == pytest.approx(a, rel=1e-15)
    assert_cache_rows({**rs, "factor": 32.0}, 20000, 96, 10000.0, want, a, around(4096, 20000))


def test_longrope_short_cache_keeps_the_models_attention_factor():
    """No longer than the original: short_factor, with the attention factor of the model's full length."""
    rs = {**PHI3, "original_max_position_embeddings": 4096, "factor": 32.0}
    want, a = hf_longrope(96, 10000.0, rs, 4096, 131072, seq_len=4096)
    assert a > 1.1
    assert_cache_rows(rs, 4096, 96, 10000.0, want, a, np.array([0, 1, 7, 2048, 4095]))


def test_longrope_vllm_mscales():
    """Phi-3-small's legacy "su" dict: short_mscale within the original 8192, long_mscale past it."""
    within = rope_frequencies(8192, 96, 10000.0, PHI3_SMALL)
    past = rope_frequencies(8193, 96, 10000.0, PHI3_SMALL)
    np.testing.assert_allclose(within[0], hf_default(96, 10000.0) / np.array(SHORT), rtol=1e-15)
    np.testing.assert_allclose(past[0], hf_default(96, 10000.0) / np.array(LONG), rtol=1e-15)
    assert (within[1], past[1]) == (1.0, 1.243163121016122)


OURS_AND_REFERENCE = [
    {"type": "llama3", "factor": 16.0, "low_freq_factor": 1.0, "high_freq_factor": 1.0, "original_max_position": 64},
    {"type": "yarn", "factor": 40.0, "original_max_position": 64, "mscale": 1.0, "mscale_all_dim": 0.707},
    {"type": "longrope", "short_factor": SHORT[:32], "long_factor": LONG[:32], "original_max_position": 100},
    {"type": "longrope", "short_factor": SHORT[:32], "long_factor": LONG[:32], "original_max_position": 3000,
     "factor": 8.0},
    {"type": "longrope", "short_factor": SHORT[:32], "long_factor": LONG[:32], "original_max_position": 100,
     "short_mscale": 1.0, "long_mscale": 1.5},
]


@pytest.mark.parametrize("scaling", OURS_AND_REFERENCE, ids=["llama4", "yarn-mscale", "longrope-long",
                                                             "longrope-short", "longrope-mscale"])
def test_rope_cache_host_matches_reference(scaling):
    got = rope_cache_host(3000, 64, 500000.0, scaling=scaling)
    np.testing.assert_allclose(got, reference.rope_cache(3000, 64, 500000.0, scaling), rtol=0, atol=1e-10)


# ------------------------------------------------------------------------- a config.json dict as it stands


@pytest.mark.parametrize("hf, ours, rows, dim, base", [
    (LLAMA31, {"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position": 8192}, 9000, 128, 500000.0),
    (LLAMA4_SCOUT, {"type": "llama3", "factor": 16.0, "low_freq_factor": 1.0, "high_freq_factor": 1.0,
                    "original_max_position": 8192}, 9000, 128, 500000.0),
    (DEEPSEEK_V3, {"type": "yarn", "factor": 40, "original_max_position": 4096, "beta_fast": 32, "beta_slow": 1,
                   "mscale": 1.0, "mscale_all_dim": 1.0}, 5000, 64, 10000.0),
    (GPT_OSS, {"type": "yarn", "factor": 32.0, "original_max_position": 4096, "truncate": False}, 5000, 64, 150000.0),
    ({**QWEN3_YARN, "attention_factor": None, "beta_fast": None},
     {"type": "yarn", "factor": 4.0, "original_max_position": 32768}, 100, 128, 1e6),
    ({**PHI3, "original_max_position_embeddings": 4096},
     {"type": "longrope", "short_factor": SHORT, "long_factor": LONG, "original_max_position": 4096}, 5000, 96, 1e4),
    (PHI3_SMALL, {"type": "longrope", "short_factor": SHORT, "long_factor": LONG, "original_max_position": 8192,
                  "short_mscale": 1.0, "long_mscale": 1.243163121016122}, 9000, 96, 1e4),
    ({"type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 2048},
     {"type": "dynamic_ntk", "factor": 2.0, "original_max_position": 2048}, 4096, 64, 1e4),
    ({"rope_type": "linear", "factor": 8.0}, {"type": "linear", "factor": 8.0}, 100, 64, 1e4),
    ({"rope_type": "yarn", "type": "yarn", "rope_theta": 1e6, "partial_rotary_factor": 1.0, "factor": 4.0,
      "original_max_position_embeddings": 32768}, {"type": "yarn", "factor": 4.0, "original_max_position": 32768},
     100, 128, 1e6),
    ({"rope_type": "default", "rope_theta": 1e4}, None, 100, 64, 1e4),
    ({"type": "mrope", "mrope_section": [16, 24, 24]}, None, 100, 128, 1e6),  # Qwen2-VL
    ({"type": "mrope", "rope_type": "default", "mrope_section": [16, 24, 24]}, None, 100, 128, 1e6),
    ({"rope_type": "default", "mrope_section": [24, 20, 20], "mrope_interleaved": True}, None, 100, 128, 5e6),
    ({**PHI3, "type": "su", "rope_type": "longrope", "original_max_position_embeddings": 4096},  # Phi3Config's
     {"type": "longrope", "short_factor": SHORT, "long_factor": LONG, "original_max_position": 4096}, 5000, 96, 1e4),
    ({**PHI3, "original_max_position_embeddings": 4096, "max_position_embeddings": 131072},  # a shorter cache
     {"type": "longrope", "short_factor": SHORT, "long_factor": LONG, "original_max_position": 4096, "factor": 32.0},
     8192, 96, 1e4),
    ({"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 2048,
      "max_position_embeddings": 4096}, {"type": "dynamic_ntk", "factor": 2.0, "original_max_position": 4096},
     8192, 64, 1e4),
    ({**QWEN3_YARN, "factor": None, "max_position_embeddings": 131072},  # transformers' fallback for a null
     {"type": "yarn", "factor": 4.0, "original_max_position": 32768}, 100, 128, 1e6),
], ids=["llama3.1", "llama4-scout", "deepseek-v3", "gpt-oss", "nulls", "phi3", "phi3-small-su", "dynamic",
        "linear", "rope-parameters", "default", "qwen2-vl-mrope", "mrope-written-back", "qwen3-vl-default",
        "phi3-type-and-rope-type", "longrope-model-length", "dynamic-model-length", "yarn-null-factor"])
def test_hf_dict_is_our_dict(hf, ours, rows, dim, base):
    """rope_type or type, original_max_position_embeddings, HF's type names, keys set to null, and
    transformers' rope_theta / partial_rotary_factor (when they agree) give the cache our spelling gives."""
    before = copy.deepcopy(hf)
    np.testing.assert_array_equal(rope_cache_host(rows, dim, base, scaling=hf),
                                  rope_cache_host(rows, dim, base, scaling=ours))
    assert hf == before  # the caller's dict is read, never changed


PHI3_32 = {"type": "longrope", "short_factor": SHORT[:32], "long_factor": LONG[:32], "original_max_position": 16}
BAD = [
    ({"factor": 2.0}, r"type \(or rope_type\) None"),
    ({**QWEN3_YARN, "llama_4_scaling_beta": 0.1}, r"yarn scaling does not take \['llama_4_scaling_beta'\]; "
                                                  r"it takes \['attention_factor', 'beta_fast'"),
    ({**QWEN3_YARN, "extrapolation_factor": 1}, r"does not take \['extrapolation_factor'\]"),
    ({"rope_type": "yarn", "type": "linear", "factor": 2.0}, r"scaling gives type twice"),
    ({**QWEN3_YARN, "original_max_position": 4096}, r"gives original_max_position twice"),
    ({**QWEN3_YARN, "rope_theta": 1e6}, r"rope_theta=1000000.0 is not base=10000.0; pass base=1000000.0"),
    ({**QWEN3_YARN, "partial_rotary_factor": 0.5}, r"partial_rotary_factor=0.5 .*rotary_dim=int\(head_dim \* 0.5\)"),
    (PHI3, r"longrope scaling needs \['original_max_position'\] \(original_max_position_embeddings"),
    ({**PHI3_32, "short_factor": SHORT[:31]}, r"short_factor must hold rotary_dim / 2 = 32 numbers, got 31"),
    ({**PHI3_32, "long_factor": [1.0] * 31 + [0.0]}, r"long_factor must hold positive numbers, got 0.0 at 31"),
    ({**PHI3_32, "short_factor": 1.0}, r"short_factor must be a list of numbers, got float"),
    ({**PHI3_32, "attention_factor": 1.2, "long_mscale": 1.2},
     r"attention_factor .*short_mscale/long_mscale.*not both"),
    ({**PHI3_32, "original_max_position": 64}, r"max_position=64 <= original_max_position=64 needs factor"),
    ({**LLAMA31, "low_freq_factor": 8.0}, r"low_freq_factor <= high_freq_factor, got 8.0, 4.0"),
    ({**LLAMA31, "factor": "8"}, r"llama3 scaling's factor must be a positive number, got '8'"),
    ({**QWEN3_YARN, "beta_fast": 0}, r"beta_fast must be a positive number"),
    ({**QWEN3_YARN, "truncate": "false"}, r"truncate must be True or False"),
    ({**QWEN3_YARN, "mscale": -1.0, "mscale_all_dim": 1.0}, r"mscale must be a number >= 0"),
    ({**QWEN3_YARN, "original_max_position_embeddings": 1}, r"original_max_position must be above 1"),
    ({"rope_type": "default", "factor": 2.0}, r"default \(unscaled\) rope takes no \['factor'\]"),
    ({"rope_type": "dynamic", "factor": 2.0}, r"needs \['original_max_position'\] \(max_position_embeddings in"),
    ({**QWEN3_YARN, "max_position_embeddings": 4096.0}, r"max_position_embeddings must be an int above 1"),
    ({"type": ["yarn"]}, r"type \(or rope_type\) \['yarn'\]"),
]


@pytest.mark.parametrize("bad, message", BAD, ids=[m[:40] for _, m in BAD])
def test_bad_dicts_name_the_key(bad, message):
    """One line naming the key (and, for an unknown one, the keys taken), before any upload, the dict as given."""
    before = copy.deepcopy(bad)
    for build in (rope_cache_host, rope_cache):
        with pytest.raises(ValueError, match=message) as info:
            build(64, 64, 10000.0, scaling=bad)
        assert "\n" not in str(info.value)
    assert bad == before


def test_only_dynamic_ntk_and_longrope_read_the_length():
    """rotary_embedding_positions keys its frequency table by the length only for these two."""
    from cukern.rope_cache import reads_length

    assert reads_length({"type": "dynamic_ntk", "factor": 2.0}) and reads_length({"rope_type": "dynamic"})
    assert reads_length(PHI3) and reads_length(PHI3_SMALL)
    assert reads_length({"type": None, "rope_type": "dynamic"})  # a None key is absent, as the checks read it
    assert not any(reads_length(s) for s in (None, LLAMA31, DEEPSEEK_V3, {"type": "linear", "factor": 2.0},
                                             {"rope_type": "default"}, {"type": ["yarn"]}))
