"""Rotary embedding: references, cache formulas, planning, validation, compilation (CPU) and the kernel
(GPU): close to the float64 reference, and bit for bit the kernel's exact emulation."""

import itertools
import math
import re
from decimal import Decimal, localcontext
from types import SimpleNamespace

import ml_dtypes
import numpy as np
import pytest
from _support import (ARCHS, assert_close, assert_no_spills, checked_instantiations, compiled, fake_array,
                      same_bits, unread_cupy_array)

from cukern import reference, rotary
from cukern._dtypes import BFLOAT16, FLOAT_TYPES
from cukern.rope_cache import rope_cache, rope_cache_host, rope_frequencies

F32, F16 = np.dtype(np.float32), np.dtype(np.float16)


LLAMA31 = {"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
           "original_max_position": 8192}
QWEN_YARN = {"type": "yarn", "factor": 4.0, "original_max_position": 32768}
SCALINGS = [
    None,
    {"type": "linear", "factor": 4.0},
    {"type": "dynamic_ntk", "factor": 2.0, "original_max_position": 2048},
    LLAMA31,
    QWEN_YARN,
    {"type": "yarn", "factor": 40.0, "original_max_position": 4096, "beta_fast": 32, "beta_slow": 1,
     "mscale": 0.707, "mscale_all_dim": 0.707},
    {"type": "yarn", "factor": 16.0, "original_max_position": 4096, "beta_fast": 16, "beta_slow": 2,
     "attention_factor": 1.25, "truncate": False},
]


# ------------------------------------------------------------------------------------ references (CPU)


@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("rot", [64, 32])
def test_reference_rotation_is_complex_multiplication(rng, is_neox, rot):
    """Each pair, read as x + iy, is multiplied by a e^{±i p w}: checked with complex arithmetic, partial
    rotary_dim included (elements past it untouched)."""
    tokens, heads, hs, rows = 5, 3, 64, 50
    cache = reference.rope_cache(rows, rot, 10000.0)
    q = rng.standard_normal((tokens, heads, hs))
    pos = rng.integers(0, rows, tokens)
    half = rot // 2
    j = np.arange(half)
    a, b = (j, j + half) if is_neox else (2 * j, 2 * j + 1)
    w = 10000.0 ** (-2.0 * j / rot)
    for inverse in (False, True):
        got, none = reference.rotary_embedding(pos, q, None, cache, is_neox=is_neox, inverse=inverse)
        assert none is None
        z = (q[:, :, a] + 1j * q[:, :, b]) * np.exp((-1j if inverse else 1j) * pos[:, None, None] * w)
        np.testing.assert_allclose(got[:, :, a], z.real, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(got[:, :, b], z.imag, rtol=1e-12, atol=1e-12)
        assert same_bits(got[:, :, rot:], q[:, :, rot:])


def test_reference_rotation_partial_and_wide_cache(rng):
    """rotary_dim below the cache's width uses the first rot/2 cos and the first rot/2 sin of each row."""
    cache = reference.rope_cache(20, 64)
    q = rng.standard_normal((4, 2, 64))
    pos = rng.integers(0, 20, 4)
    narrow = np.concatenate([cache[:, :16], cache[:, 32:48]], axis=1)
    got, _ = reference.rotary_embedding(pos, q, None, cache, rotary_dim=32)
    want, _ = reference.rotary_embedding(pos, q, None, narrow)
    assert same_bits(got, want)


def test_reference_inverse_and_out_of_range(rng):
    cache = reference.rope_cache(16, 32)
    q, k = rng.standard_normal((6, 4, 32)), rng.standard_normal((6, 1, 32))
    pos = np.array([0, 3, -1, 15, 16, 7])
    r = reference.rotary_embedding(pos, q, k, cache, is_neox=False)
    back = reference.rotary_embedding(pos, r[0], r[1], cache, is_neox=False, inverse=True)
    np.testing.assert_allclose(back[0], q, atol=1e-12)
    np.testing.assert_allclose(back[1], k, atol=1e-12)
    for t in (2, 4):
        assert same_bits(r[0][t], q[t])
    assert same_bits(r[0][0], q[0])  # position 0: cos 1, sin 0


@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("dtype", FLOAT_TYPES, ids=str)
def test_emulation_is_the_reference_rounded(rng, dtype, is_neox):
    """The kernel's exact emulation (float32 products and sums, one rounding to the dtype) stays within the
    shared tolerance of the float64 reference; its inverse negates sin's products exactly as negated sin
    values would; tokens outside the cache keep their bits; past rotary_dim nothing changes."""
    cache = rope_cache_host(50, 64).astype(dtype)
    q = _random(rng, 6 * 3 * 80, dtype).reshape(6, 3, 80)
    k = _random(rng, 6 * 80, dtype).reshape(6, 1, 80)
    pos = np.array([0, 7, 49, 50, -1, 3])
    for inverse in (False, True):
        got = reference.rotary_embedding_emulated(pos, q, k, cache, is_neox=is_neox, rotary_dim=48,
                                                  inverse=inverse)
        want = reference.rotary_embedding(pos, q, k, cache, is_neox=is_neox, rotary_dim=48, inverse=inverse)
        for g, w, v in zip(got, want, (q, k)):
            assert g.dtype == dtype
            assert_close(g, w, dtype)
            assert same_bits(g[3:5], v[3:5])
            assert same_bits(g[..., 48:], v[..., 48:])
    negated = np.concatenate([cache[:, :32], -cache[:, 32:]], axis=1)
    for g, w in zip(reference.rotary_embedding_emulated(pos, q, k, cache, is_neox=is_neox, inverse=True),
                    reference.rotary_embedding_emulated(pos, q, k, negated, is_neox=is_neox)):
        assert same_bits(g, w)


@pytest.mark.parametrize("scaling", SCALINGS, ids=lambda s: "none" if s is None else s["type"])
@pytest.mark.parametrize("rot", [128, 64, 80])
def test_rope_cache_host_matches_reference(scaling, rot):
    got = rope_cache_host(3000, rot, 500000.0, scaling=scaling)
    want = reference.rope_cache(3000, rot, 500000.0, scaling)
    assert got.shape == (3000, rot)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-10)


def test_rope_cache_linear_is_positions_over_factor():
    plain_freq = np.array([reference.rope_frequency(j, 64) for j in range(32)])
    got = rope_cache_host(100, 64, scaling={"type": "linear", "factor": 4.0})
    angles = np.outer(np.arange(100) / 4.0, plain_freq)
    np.testing.assert_allclose(got[:, :32], np.cos(angles), atol=1e-12)
    np.testing.assert_allclose(got[:, 32:], np.sin(angles), atol=1e-12)


def test_llama3_bands():
    """Llama 3.1 (base 500000, rot 128): wavelengths under 8192/4 kept (pairs 0..28), over 8192 divided by 8
    (pairs 35..63), pairs 29..34 blended, the blend continuous at both edges."""
    freq, a = rope_frequencies(1, 128, 500000.0, LLAMA31)
    plain = 500000.0 ** (-np.arange(0, 128, 2) / 128)
    ratio = freq / plain
    assert a == 1.0
    np.testing.assert_allclose(ratio[:29], 1.0, rtol=1e-15)
    np.testing.assert_allclose(ratio[35:], 1 / 8, rtol=1e-15)
    assert np.all((ratio[29:35] < 1) & (ratio[29:35] > 1 / 8)) and np.all(np.diff(ratio[28:36]) < 0)
    wavelen = 2 * math.pi / plain
    s = (8192 / wavelen[29:35] - 1) / 3
    np.testing.assert_allclose(ratio[29:35], (1 - s) / 8 + s, rtol=1e-14)


def test_yarn_known_values():
    """Qwen-style YaRN (factor 4, original 32768, base 1e6, rot 128, beta 32/1): correction range [23, 40]
    after truncation, attention factor 0.1 ln 4 + 1 = 1.1386294361."""
    freq, a = rope_frequencies(1, 128, 1e6, QWEN_YARN)
    plain = 1e6 ** (-np.arange(0, 128, 2) / 128)
    ratio = freq / plain
    assert a == pytest.approx(1.1386294361119891, rel=1e-14)
    np.testing.assert_allclose(ratio[:24], 1.0, rtol=1e-15)
    np.testing.assert_allclose(ratio[40:], 0.25, rtol=1e-15)
    np.testing.assert_allclose(ratio[23:41], 1 - 0.75 * np.arange(18) / 17, rtol=1e-14)
    cache = rope_cache_host(10, 128, 1e6, scaling=QWEN_YARN)
    np.testing.assert_allclose(cache[0, :64], a, rtol=1e-15)
    np.testing.assert_allclose(cache[:, :64] ** 2 + cache[:, 64:] ** 2, a * a, rtol=1e-14)
    deepseek = {**QWEN_YARN, "mscale": 1.0, "mscale_all_dim": 1.0}
    assert rope_frequencies(1, 128, 1e6, deepseek)[1] == pytest.approx(1.0)


def test_dynamic_ntk_known_values():
    """No stretch while the cache fits the original context; at max_position = 2 x original with factor 2
    the base grows by (2 * 2 - (2 - 1))^(rot / (rot - 2)) = 3^(64 / 62)."""
    s = {"type": "dynamic_ntk", "factor": 2.0, "original_max_position": 2048}
    assert same_bits(rope_frequencies(2048, 64, 10000.0, s)[0], rope_frequencies(2048, 64, 10000.0)[0])
    freq = rope_frequencies(4096, 64, 10000.0, s)[0]
    base = 10000.0 * 3.0 ** (64 / 62)
    np.testing.assert_allclose(freq, base ** (-np.arange(0, 64, 2) / 64), rtol=1e-14)


@pytest.mark.parametrize("bad", [
    {"type": "ntk"}, {"type": "linear"}, {"type": "linear", "factor": 0.0},
    {"type": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 1.0, "original_max_position": 8},
    {"type": "yarn", "factor": 4.0, "original_max_position": 4096, "extra": 1}, "linear",
])
def test_rope_cache_rejects_bad_scaling(bad):
    with pytest.raises(ValueError):
        rope_cache_host(16, 64, scaling=bad)


@pytest.mark.parametrize("args", [(16, 63), (16, 0), (0, 64), (-1, 64), (16, -2)])
def test_rope_cache_rejects_bad_sizes(args):
    with pytest.raises(ValueError):
        rope_cache_host(*args)


@pytest.mark.parametrize("args, name", [((16.0, 64), "max_position"), ((16.5, 64), "max_position"),
                                        ((True, 64), "max_position"), (("16", 64), "max_position"),
                                        ((16, 64.0), "rotary_dim"), ((16, None), "rotary_dim")])
def test_rope_cache_refuses_non_integer_sizes(args, name):
    """A float is refused, never rounded (16.5 rows would silently have become 16)."""
    with pytest.raises(TypeError, match=name):
        rope_cache_host(*args)
    with pytest.raises(TypeError, match=name):
        rope_frequencies(*args)
    with pytest.raises(TypeError, match=name):
        rope_cache(*args)  # before anything is uploaded


def test_rope_cache_takes_numpy_integers():
    assert same_bits(rope_cache_host(np.int64(16), np.int32(64)), rope_cache_host(16, 64))


# ---------------------------------------------------------------------------------------- plan (CPU)


def test_positions_calls_share_one_stand_in_cache():
    """The cache-free call's stand-in cache (read for the call key on every call) is made once per rotary_dim
    and device, not per call: building one took about 12 µs of a one-token call's host time."""
    stand_in = rotary._no_cache(128, 0)
    assert stand_in is rotary._no_cache(128, 0) and stand_in is not rotary._no_cache(128, 1)
    assert (stand_in.shape, stand_in.strides, stand_in.data.ptr, stand_in.device.id) == ((1, 128), (512, 4), 0, 0)
    assert rotary._no_cache(7, 0).shape == (1, 8)  # an odd rotary_dim still reaches its check


def test_plan_benchmark_shape():
    p = rotary.plan(16384, 32, 8, 128, 8, True, 132)
    assert (p.units, p.lanes, p.groups, p.heads_per_thread) == (8, 8, 20, 2)
    assert (p.tokens_per_block, p.block, p.grid) == (1, 160, 16384)
    assert p.config.block == (160,) and p.config.grid == (16384,)
    assert p.instantiation(BFLOAT16, F32).expression == \
        "cukern::rotary_embedding<cukern::bf16, float, 8, true, 2, 512, 2>"
    p = rotary.plan(16384, 32, 8, 128, 8, True, 132, rotary.Knobs(items=4))
    assert (p.groups, p.heads_per_thread, p.tokens_per_block, p.block) == (10, 4, 3, 240)
    # GPT-J: the same units as NeoX (8 elements from each half of the head, 8 pairs a thread)
    g = rotary.plan(16384, 32, 8, 128, 8, False, 132)
    assert (g.units, g.lanes, g.groups, g.block, g.grid) == (8, 8, 20, 160, 16384)


def test_plan_waves_cap_the_grid():
    p = rotary.plan(16384, 32, 8, 128, 8, True, 132, rotary.Knobs(waves=2))
    assert p.block == 160 and p.grid == 2 * 132 * (2048 // 160)
    assert rotary.plan(8, 32, 8, 128, 8, True, 132, rotary.Knobs(waves=2)).grid == 8  # below the cap


def test_plan_small_batches_spread_heads():
    p = rotary.plan(1, 32, 8, 128, 8, True, 132)
    assert (p.groups, p.heads_per_thread, p.block, p.grid) == (40, 1, 320, 1)
    p = rotary.plan(64, 32, 8, 128, 8, False, 132)
    assert p.units == 8 and p.groups == 40 and p.heads_per_thread == 1 and p.block == 320
    p = rotary.plan(64, 32, 8, 256, 8, False, 132)
    assert p.units == 16 and p.groups == 32 and p.heads_per_thread == 2 and p.block == 512  # token capped
    p = rotary.plan(7, 1, 0, 64, 8, True, 132)  # 4 threads a token: tokens share a warp
    assert p.lanes == 4 and p.groups == 1 and p.tokens_per_block == 7 and p.grid == 1


def test_plan_is_pure_and_deterministic():
    a = rotary.plan(4096, 8, 1, 64, 4, False, 100)
    assert a == rotary.plan(4096, 8, 1, 64, 4, False, 100)


@pytest.mark.parametrize("vec", [1, 4, 8])
@pytest.mark.parametrize("is_neox", [True, False])
def test_plan_covers_every_token_head_and_unit(vec, is_neox):
    r = np.random.default_rng(0)
    for _ in range(300):
        rot = 2 * vec * int(r.integers(1, 300 if vec == 1 else 40))
        tokens = int(r.choice([1, 2, 7, 64, 1000, 4096, 65536, 2**22]))
        nh, nkv = int(r.integers(0, 129)), int(r.integers(0, 33))
        p = rotary.plan(tokens, nh, nkv, rot, vec, is_neox, int(r.choice([1, 108, 132])))
        assert p.pairs == vec and p.units * p.pairs == rot // 2  # vec pairs a thread, in both styles
        assert p.lanes == min(p.units, rotary.MAX_BLOCK)
        assert 1 <= p.block <= rotary.MAX_BLOCK and p.block == p.tokens_per_block * p.lanes * p.groups
        assert p.grid * p.tokens_per_block >= tokens and (p.grid - 1) * p.tokens_per_block < max(tokens, 1)
        assert p.heads_per_thread <= p.items or p.lanes * p.groups * 2 > rotary.MAX_BLOCK
        full = rotary.plan(tokens, nh, nkv, rot, vec, is_neox, 132)
        capped = rotary.plan(tokens, nh, nkv, rot, vec, is_neox, 132, rotary.Knobs(waves=4))
        assert capped.block == full.block
        assert capped.grid == min(full.grid, 4 * 132 * max(rotary.RESIDENT_THREADS // full.block, 1))


def test_plan_caps_grid():
    p = rotary.plan(2**45, 1, 0, 2, 1, True, 132)
    assert p.grid == rotary.MAX_GRID


@pytest.mark.parametrize("args", [(10, 4, 4, 63, 1, True), (10, 4, 4, 24, 8, True), (10, 4, 4, 20, 8, False),
                                  (10, 4, 4, 0, 1, True), (10, 4, 4, 64, 3, False)])
def test_plan_rejects_bad_shapes(args):
    with pytest.raises(ValueError):
        rotary.plan(*args)


def test_bytes_moved_benchmark_formula():
    t, nh, nkv, hs = 16384, 32, 8, 128
    q, k = t * nh * hs, t * nkv * hs
    assert rotary.bytes_moved(t, nh, nkv, hs, BFLOAT16) == 2 * (q + k) * 2 + t * hs * 4 + t * 8
    assert rotary.bytes_moved(t, nh, nkv, 64, BFLOAT16, BFLOAT16, np.int32) == (q + k) * 2 + t * 64 * 2 + t * 4


# ----------------------------------------------------------------- validation with fake arrays (CPU)


class Fake:
    """The attributes the validation reads, without a GPU: shape, strides (elements here), dtype, pointer,
    device."""

    def __init__(self, shape, dtype=BFLOAT16, strides=None, ptr=1 << 20, device=0):
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        self.itemsize = self.dtype.itemsize
        self.ndim = len(self.shape)
        self.size = math.prod(self.shape)
        if strides is None:
            strides = tuple(math.prod(self.shape[i + 1:]) for i in range(self.ndim))
        self.strides = tuple(s * self.itemsize for s in strides)
        self.data = SimpleNamespace(ptr=ptr, device_id=device)
        self.device = SimpleNamespace(id=device)


def _fakes(**over):
    f = {"positions": Fake((7,), np.int64), "query": Fake((7, 8, 128)), "key": Fake((7, 2, 128)),
         "cache": Fake((100, 128), F32), "rotary_dim": None}
    f.update(over)
    return f


def test_validate_accepts_good_and_fused_views():
    args = rotary._validate(**_fakes())
    assert args.rotary_dim == 128 and args.sin_offset == 64
    fused = _fakes(query=Fake((7, 8, 128), strides=(12 * 128, 128, 1)),
                   key=Fake((7, 2, 128), strides=(12 * 128, 128, 1), ptr=(1 << 20) + 8 * 128 * 2),
                   positions=Fake((7,), np.int32), rotary_dim=64)
    assert rotary._validate(**fused).rotary_dim == 64
    assert rotary._validate(**_fakes(key=None, cache=Fake((100, 128), BFLOAT16))).rotary_dim == 128


@pytest.mark.parametrize("over, err, match", [
    ({"query": Fake((7, 1024))}, ValueError, r"query has shape \(7, 1024\)"),
    ({"query": Fake((7, 8, 128), np.float64)}, TypeError, "query has dtype float64"),
    ({"key": Fake((7, 2, 128), F16)}, TypeError, "key has dtype float16, query has bfloat16"),
    ({"key": Fake((7, 2, 64))}, ValueError, "key's head_size is 64, query's is 128"),
    ({"key": Fake((6, 2, 128))}, ValueError, "key has 6 tokens, query has 7"),
    ({"key": Fake((7, 256))}, ValueError, "key has shape"),
    ({"positions": Fake((7,), np.float32)}, TypeError, "positions has dtype float32"),
    ({"positions": Fake((6,), np.int32)}, ValueError, r"positions has shape \(6,\)"),
    ({"positions": Fake((7, 1), np.int64)}, ValueError, "positions has shape"),
    ({"cache": Fake((100, 128), F16)}, TypeError, "cos_sin_cache has dtype float16"),
    ({"cache": Fake((100, 127), F32)}, ValueError, "odd width 127"),
    ({"cache": Fake((100, 128, 1), F32)}, ValueError, "cos_sin_cache has shape"),
    ({"cache": Fake((100, 64), F32), "rotary_dim": 128}, ValueError, "width 64, too narrow for rotary_dim=128"),
    ({"rotary_dim": 63}, ValueError, "rotary_dim=63 must be a positive even"),
    ({"rotary_dim": 0}, ValueError, "rotary_dim=0"),
    ({"rotary_dim": 64.0}, TypeError, "rotary_dim must be an int, got float"),
    ({"rotary_dim": 64.7}, TypeError, "rotary_dim must be an int"),
    ({"rotary_dim": True}, TypeError, "rotary_dim must be an int"),
    ({"cache": Fake((100, 256), F32)}, ValueError, "rotary_dim=256 is over head_size=128"),
    ({"query": Fake((7, 8, 128), strides=(2048, 256, 2))}, ValueError, "query's last dimension has stride 2"),
    ({"key": Fake((7, 2, 128), strides=(512, 256, 2))}, ValueError, "key's last dimension has stride 2"),
    ({"cache": Fake((100, 128), F32, strides=(256, 2))}, ValueError, "cos_sin_cache's last dimension"),
    ({"key": Fake((7, 2, 128), device=1)}, ValueError, "different devices"),
    ({"query": Fake((7, 8, 128), strides=(0, 128, 1))}, ValueError, "query has a zero stride"),
])
def test_validate_errors(over, err, match):
    with pytest.raises(err, match=match):
        rotary._validate(**_fakes(**over))


def _prep(monkeypatch, f, **kw):
    monkeypatch.setattr(rotary, "sm_count", lambda device: 132)
    return rotary._prepare(f["positions"], f["query"], f["key"], f["cache"], kw.get("is_neox", True),
                           f["rotary_dim"], kw.get("inverse", False), kw.get("knobs", rotary.DEFAULT_KNOBS))


def test_prepare_memoizes_on_layout_not_pointers(monkeypatch):
    rotary._calls.clear()
    a = _prep(monkeypatch, _fakes())
    assert a.config.grid == (7,) and a.config.block == (80,) and a.inst.args[2] == 8 and a.has_key
    assert _prep(monkeypatch, _fakes(query=Fake((7, 8, 128), ptr=1 << 24))) is a  # same alignment: reused
    b = _prep(monkeypatch, _fakes(query=Fake((7, 8, 128), ptr=(1 << 20) + 2)))  # misaligned: its own plan
    assert b is not a and b.inst.args[2] == 1
    assert _prep(monkeypatch, _fakes(), is_neox=False) is not a
    c = _prep(monkeypatch, _fakes(), inverse=True)
    assert c.struct["sin_sign"] == -1.0 and a.struct["sin_sign"] == 1.0
    assert _prep(monkeypatch, _fakes(), knobs=rotary.Knobs(items=1)).inst.args[4] == 1
    assert _prep(monkeypatch, _fakes(key=None)).has_key is False
    assert _prep(monkeypatch, _fakes(query=Fake((0, 8, 128)), key=Fake((0, 2, 128)),
                                     positions=Fake((0,), np.int64))) is None
    n = len(rotary._calls)
    for over, err in [({"key": Fake((7, 2, 128), device=1)}, ValueError), ({"rotary_dim": 63}, ValueError),
                      ({"rotary_dim": 64.0}, TypeError)]:
        with pytest.raises(err):  # failures are never memoized, so they fail every time
            _prep(monkeypatch, _fakes(**over))
        with pytest.raises(err):
            _prep(monkeypatch, _fakes(**over))
    assert len(rotary._calls) == n


def test_a_float_rotary_dim_never_finds_the_int_one(monkeypatch):
    """64.0 == 64 and hashes alike: the call cached for 64 must not let 64.0 through."""
    assert _prep(monkeypatch, _fakes(rotary_dim=64)) is not None
    with pytest.raises(TypeError, match="rotary_dim must be an int"):
        _prep(monkeypatch, _fakes(rotary_dim=64.0))
    assert _prep(monkeypatch, _fakes(rotary_dim=np.int64(64))) is _prep(monkeypatch, _fakes(rotary_dim=64))


def test_zero_heads_still_make_a_call_that_checks_positions(monkeypatch):
    """No heads to rotate but tokens to check: a call with nothing to launch but the position check."""
    for key in (None, Fake((7, 0, 128))):
        call = _prep(monkeypatch, _fakes(query=Fake((7, 0, 128)), key=key))
        assert call is not None and call.inst is None and call.cache_rows == 100


def _apart(monkeypatch, q, k):
    """The per-call key/query check as ``_run`` makes it."""
    call = _prep(monkeypatch, _fakes(query=q, key=k))
    offset = k.data.ptr - q.data.ptr
    if call.meet is not None and call.meet[0] < offset < call.meet[1] and offset != call.apart:
        rotary._check_key_apart(call, q, k, offset)
    return call


def test_key_sharing_elements_with_query_is_refused(monkeypatch):
    rotary._calls.clear()
    base = 1 << 20
    q = Fake((7, 8, 128), ptr=base)
    overlapping = [Fake((7, 8, 128), ptr=base),  # key=query
                   Fake((7, 2, 128), ptr=base + 6 * 128 * 2),  # query's heads 6 and 7
                   Fake((7, 2, 128), strides=(8 * 128, 128, 1), ptr=base + 3 * 8 * 128 * 2),  # token 3..
                   Fake((7, 2, 128), ptr=base + 8 * 128 * 2 * 7 - 2)]  # one element into query's last
    for k in overlapping:
        with pytest.raises(ValueError, match="key overlaps query"):
            _apart(monkeypatch, q, k)


def test_fused_qkv_views_pass_and_are_decided_once(monkeypatch):
    """Views of one [tokens, (8 + 2 + 2) heads] buffer: their extents meet, their elements do not."""
    rotary._calls.clear()
    base, row = 1 << 20, 12 * 128
    q = Fake((7, 8, 128), strides=(row, 128, 1), ptr=base)
    k = Fake((7, 2, 128), strides=(row, 128, 1), ptr=base + 8 * 128 * 2)
    call = _apart(monkeypatch, q, k)
    assert call.meet[0] < k.data.ptr - q.data.ptr < call.meet[1]  # the extents do meet
    assert call.apart == k.data.ptr - q.data.ptr  # remembered: later calls only compare
    separate = Fake((7, 2, 128), ptr=base + (1 << 24))
    assert _apart(monkeypatch, Fake((7, 8, 128), ptr=base), separate).apart is None  # extents apart: no search
    v = Fake((7, 2, 128), strides=(row, 128, 1), ptr=base + 7 * 128 * 2)  # heads 7, 8 of the buffer
    with pytest.raises(ValueError, match="key overlaps query"):
        _apart(monkeypatch, q, v)


def test_host_arrays_are_rejected_by_name():
    q = np.zeros((2, 1, 8), np.float32)
    with pytest.raises(TypeError, match="positions is a numpy.ndarray"):
        rotary.rotary_embedding(np.zeros(2, np.int64), q, None, np.zeros((4, 8), np.float32))


def _vw(q, k=None, cache=None, rot=128, neox=True):
    cache = cache or Fake((100, rot), F32)
    return rotary.vector_width(q, k, cache, rot, neox, cache.shape[1] // 2)


def test_vector_width():
    assert _vw(Fake((7, 8, 128))) == 8
    assert _vw(Fake((7, 8, 128), F32)) == 4
    assert _vw(Fake((7, 8, 128), ptr=(1 << 20) + 2)) == 1
    assert _vw(Fake((7, 8, 128), strides=(1025, 128, 1))) == 1
    assert _vw(Fake((7, 8, 128)), Fake((7, 2, 128), strides=(256, 129, 1))) == 1
    assert _vw(Fake((7, 8, 128)), rot=24) == 1  # NeoX half of 12 is not a multiple of 8
    assert _vw(Fake((7, 8, 128)), rot=24, neox=False) == 1  # GPT-J takes 8 elements from each half too
    assert _vw(Fake((7, 8, 128)), rot=32, neox=False) == 8
    assert _vw(Fake((7, 8, 128)), cache=Fake((100, 128), BFLOAT16, ptr=(1 << 20) + 8), neox=False) == 8  # 8-byte packs
    assert _vw(Fake((7, 8, 128)), cache=Fake((100, 128), BFLOAT16, ptr=(1 << 20) + 8)) == 1
    assert _vw(Fake((7, 8, 128)), cache=Fake((100, 130), F32), rot=128) == 1  # sin at 65 floats: unaligned
    assert _vw(Fake((7, 8, 128)), cache=Fake((100, 128), F32, ptr=(1 << 20) + 4)) == 1
    assert _vw(Fake((7, 8, 128)), cache=Fake((100, 128), BFLOAT16)) == 8


# --------------------------------------------------------------------------------- compilation (CPU)


def test_instantiations_generated_and_modest():
    insts = rotary.instantiations()
    names = {i.expression for i in insts}
    assert len(names) == len(insts) <= 72
    for t in FLOAT_TYPES:
        for c in {t, F32}:
            for vec in {16 // t.itemsize, 1}:
                for neox in (True, False):
                    assert rotary.rotation_instantiation(t, c, vec, neox).expression in names
    assert rotary.check_instantiation(np.int32).expression in names
    assert rotary.check_instantiation(np.int64).expression in names
    for t in FLOAT_TYPES:
        for vec in {16 // t.itemsize, 1}:
            for neox in (True, False):
                for items in rotary.POSITIONS_ITEMS:
                    assert rotary.positions_instantiation(t, vec, neox, items).expression in names
                for c in {t, F32}:  # the cache's dtype: float32 or query's
                    assert rotary.mrope_instantiation(t, c, vec, neox).expression in names


@pytest.mark.nvrtc(rotary.SOURCE)
@pytest.mark.parametrize("arch", ARCHS)
def test_every_instantiation_compiles_without_spills_or_local_memory(arch):
    prog = compiled(rotary.SOURCE, arch)
    res = prog.resources()
    for inst in checked_instantiations(rotary.SOURCE):
        lowered = prog.lowered[inst.expression]
        assert lowered in res, inst.expression
        r = res[lowered]
        assert_no_spills(r, arch, inst.expression)
        # the launch bound caps the rotation at 64 registers (half the SM's threads resident), spill-free; the
        # cache-free rotation holds its first loads (four heads' for prefill) across its float64 cos and sin,
        # mrope its gathered cos/sin
        bound = {"rotary_embedding": 64, "rotary_embedding_positions": 112}.get(inst.name, 96)
        assert r["registers"] <= bound, (inst.expression, r)
        assert ".local" not in prog.kernel_ptx(inst), inst.expression


@pytest.mark.nvrtc(rotary.SOURCE)
@pytest.mark.parametrize("arch", ARCHS)
def test_position_check_stores_its_answer_last(arch):
    """The host reads the check's answer slot until found[0] leaves -1, then reads found[1]: the kernel stores
    found[1] first, a system-scope fence between (membar.sys), then found[0]."""
    prog = compiled(rotary.SOURCE, arch)
    for dtype in (np.int32, np.int64):
        body = prog.kernel_ptx(rotary.check_instantiation(dtype))
        stores = re.findall(r"st\.global\.u64\s+\[(%rd\d+)(\+8)?\]|(membar\.sys)", body)
        assert [(s[1], s[2]) for s in stores] == [("+8", ""), ("", "membar.sys"), ("", "")], (dtype, stores)
        assert stores[0][0] == stores[2][0]


@pytest.mark.nvrtc(rotary.SOURCE)
@pytest.mark.parametrize("arch", ARCHS)
def test_vectorized_instantiations_use_16_byte_accesses(arch):
    prog = compiled(rotary.SOURCE, arch)
    for inst in checked_instantiations(rotary.SOURCE):
        if inst.name != "rotary_embedding":
            continue
        body = prog.kernel_ptx(inst)
        dtype, vec = np.dtype(inst.args[0]), inst.args[2]
        wide = re.search(r"ld\.global(\.\w+)*\.v4", body) and re.search(r"st\.global(\.\w+)*\.v4", body)
        if vec > 1:
            assert vec * dtype.itemsize == 16 and wide, inst.expression
        else:
            assert not re.search(r"\.global(\.\w+)*\.v\d", body), inst.expression


@pytest.mark.nvrtc(rotary.SOURCE)
@pytest.mark.parametrize("arch", ARCHS)
def test_rotation_is_never_contracted_into_fma(arch):
    """Every instantiation rotates with separately rounded multiplies and adds, so the 16-byte and the
    element-wise paths give the same bits (an fma in one path and not the other changed the last bit); the
    cache-free kernel's float64 cos and sin likewise, with no approximate instruction."""
    prog = compiled(rotary.SOURCE, arch)
    for inst in checked_instantiations(rotary.SOURCE):
        if inst.name not in ("rotary_embedding", "rotary_embedding_positions"):
            continue
        body = prog.kernel_ptx(inst)
        assert "fma.rn.f32" not in body and "fma.rn.f64" not in body and ".approx" not in body, inst.expression
        assert "mul.rn.f32" in body and "sub.rn.f32" in body and "add.rn.f32" in body, inst.expression
        if inst.name == "rotary_embedding_positions":
            assert "mul.rn.f64" in body and "cvt.rni.f64.f64" in body and "cvt.rn.f32.f64" in body, inst.expression


# ------------------------------------------------------------------------------------------ GPU tests


def _layout(tokens, nh, nkv, hs, kind):
    """Element offsets and strides of q and k in one flat buffer: separate contiguous arrays, views into a
    fused [tokens, (nh + 2 nkv) hs] qkv buffer, or such views shifted by one element with an odd row
    (no 16-byte alignment anywhere: the element-wise instantiations)."""
    if kind == "contiguous":
        return tokens * (nh + nkv) * hs, (0, (nh * hs, hs, 1)), (tokens * nh * hs, (nkv * hs, hs, 1))
    width = (nh + 2 * nkv) * hs + (kind == "misaligned")
    shift = int(kind == "misaligned")
    return tokens * width, (shift, (width, hs, 1)), (shift + nh * hs, (width, hs, 1))


def _view(xp, flat, off, strides, shape):
    st = tuple(s * flat.itemsize for s in strides)
    if xp is np:
        return np.lib.stride_tricks.as_strided(flat[off:], shape, st)
    return xp.lib.stride_tricks.as_strided(flat[off:], shape, st)


def _random(rng, n, dtype):
    return rng.standard_normal(n, dtype=np.float32).astype(dtype)


def run_case(rng, *, tokens, nh, nkv, hs, rot, dtype, is_neox, kind="contiguous", cache_dtype=F32,
             pos_dtype=np.int64, inverse=False, max_position=8192, sample=256, knobs=None):
    """Rotate on the GPU and check against the float64 reference (on a sample of tokens when there are
    many); every element the op must not touch, inside the buffer, is bit-identical afterwards."""
    import cupy

    dtype = np.dtype(dtype)
    n, (qo, qs), (ko, ks) = _layout(tokens, nh, nkv, hs, kind)
    host = _random(rng, n, dtype)
    flat = cupy.asarray(host)
    q = _view(cupy, flat, qo, qs, (tokens, nh, hs))
    k = _view(cupy, flat, ko, ks, (tokens, nkv, hs)) if nkv else None
    cache_host = rope_cache_host(max_position, rot, 10000.0).astype(cache_dtype)
    pos_host = rng.integers(0, max_position, tokens).astype(pos_dtype)
    if knobs is None:
        rotary.rotary_embedding(cupy.asarray(pos_host), q, k, cupy.asarray(cache_host), is_neox=is_neox,
                                inverse=inverse)
    else:
        rotary._run(cupy.asarray(pos_host), q, k, cupy.asarray(cache_host), is_neox, None, inverse, True, knobs)
    after = flat.get()

    touched = np.zeros(n, bool)
    index = np.arange(n)
    touched[_view(np, index, qo, qs, (tokens, nh, hs))[..., :rot].ravel()] = True
    if nkv:
        touched[_view(np, index, ko, ks, (tokens, nkv, hs))[..., :rot].ravel()] = True
    assert same_bits(after[~touched], host[~touched])

    rows = np.arange(tokens) if tokens <= sample else np.unique(
        np.concatenate([rng.choice(tokens, sample, replace=False), [0, tokens - 1]]))
    q0 = _view(np, host, qo, qs, (tokens, nh, hs))[rows]
    k0 = _view(np, host, ko, ks, (tokens, nkv, hs))[rows] if nkv else None
    got = [_view(np, after, qo, qs, (tokens, nh, hs))[rows]]
    if nkv:
        got.append(_view(np, after, ko, ks, (tokens, nkv, hs))[rows])
    want = reference.rotary_embedding(pos_host[rows], q0, k0, cache_host, is_neox=is_neox, inverse=inverse)
    exact = reference.rotary_embedding_emulated(pos_host[rows], q0, k0, cache_host, is_neox=is_neox,
                                                inverse=inverse)
    for g, w, e in zip(got, want, exact):
        assert_close(g, w, dtype)
        assert same_bits(g, e)


def _matrix():
    """Every style x dtype x head size once; rotary_dim full or half, GQA ratio, token count and layout
    rotate through the cases so each value meets each style and dtype."""
    gqa, tokens, kinds = [(32, 8), (8, 1), (4, 4)], [1, 7, 4096], ["contiguous", "fused", "misaligned"]
    cases = []
    for n, (neox, dtype, hs) in enumerate(itertools.product([True, False], FLOAT_TYPES, [64, 80, 128, 256])):
        rot = hs if (n + n // 4) % 2 == 0 else hs // 2
        nh, nkv = gqa[n % 3]
        t = tokens[(n + n // 4) % 3]
        if t == 4096 and hs == 256:
            t = 1000
        kind = kinds[(n // 2) % 3]
        cid = f"{'neox' if neox else 'gptj'}-{dtype}-hs{hs}-rot{rot}-{nh}x{nkv}-T{t}-{kind}"
        cases.append(pytest.param(dict(is_neox=neox, dtype=dtype, hs=hs, rot=rot, nh=nh, nkv=nkv, tokens=t,
                                       kind=kind), id=cid))
    return cases


@pytest.mark.gpu
@pytest.mark.parametrize("case", _matrix())
def test_rotation_matrix(rng, case):
    run_case(rng, **case)


@pytest.mark.gpu
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("dtype", FLOAT_TYPES, ids=str)
@pytest.mark.parametrize("kind", ["contiguous", "fused", "misaligned"])
def test_rotation_benchmark_heads(rng, is_neox, dtype, kind):
    """The benchmark's heads (32 q, 8 kv, head 128), every layout, cache in query's dtype, int32
    positions."""
    run_case(rng, tokens=300, nh=32, nkv=8, hs=128, rot=128, dtype=dtype, is_neox=is_neox, kind=kind,
             cache_dtype=dtype, pos_dtype=np.int32)


@pytest.mark.gpu
@pytest.mark.parametrize("knobs", [rotary.Knobs(1, 128, 1, 2), rotary.Knobs(2, 512, 1, 2), rotary.Knobs(4, 256, 1, 1),
                                   rotary.Knobs(2, 256, 4, 1)])
@pytest.mark.parametrize("is_neox", [True, False])
def test_rotation_every_knob_setting_and_looping_blocks(rng, knobs, is_neox):
    # with waves=1, 20000 tokens of 6 heads are more than one wave of blocks: blocks walk several tokens
    run_case(rng, tokens=20000, nh=4, nkv=2, hs=128, rot=128, dtype=BFLOAT16, is_neox=is_neox, knobs=knobs)
    run_case(rng, tokens=3000, nh=3, nkv=1, hs=96, rot=64, dtype=F16, is_neox=is_neox, kind="fused", knobs=knobs)


@pytest.mark.gpu
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("rot", [2, 24, 40, 96])
def test_rotation_odd_rotary_dims(rng, is_neox, rot):
    run_case(rng, tokens=33, nh=3, nkv=1, hs=96, rot=rot, dtype=BFLOAT16, is_neox=is_neox, kind="fused",
             inverse=True)


@pytest.mark.gpu
def test_key_none_and_many_heads(rng):
    run_case(rng, tokens=50, nh=64, nkv=0, hs=128, rot=64, dtype=F16, is_neox=True)
    run_case(rng, tokens=3, nh=130, nkv=2, hs=64, rot=64, dtype=F32, is_neox=False, kind="fused")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", FLOAT_TYPES, ids=str)
@pytest.mark.parametrize("is_neox", [True, False])
def test_inverse_undoes_rotation(rng, dtype, is_neox):
    import cupy

    q0 = cupy.asarray(_random(rng, 64 * 8 * 128, dtype).reshape(64, 8, 128))
    k0 = cupy.asarray(_random(rng, 64 * 2 * 128, dtype).reshape(64, 2, 128))
    q, k = q0.copy(), k0.copy()
    pos = cupy.asarray(rng.integers(0, 4096, 64))
    cache = rope_cache(4096, 128)
    rotary.rotary_embedding(pos, q, k, cache, is_neox=is_neox)
    assert not cupy.array_equal(q, q0)
    rotary.rotary_embedding(pos, q, k, cache, is_neox=is_neox, inverse=True)
    there = reference.rotary_embedding_emulated(pos, q0, k0, cache, is_neox=is_neox)
    back = reference.rotary_embedding_emulated(pos, *there, cache, is_neox=is_neox, inverse=True)
    eps = float(ml_dtypes.finfo(dtype).eps)
    for got, exact, want in ((q, back[0], q0), (k, back[1], k0)):
        assert same_bits(got.get(), exact)
        # each rotation's rounding moves an element by up to an ulp of its pair's length, so the bound is
        # relative to the largest value, not to each element
        g, w = got.get().astype(np.float64), want.get().astype(np.float64)
        assert np.abs(g - w).max() <= 4 * eps * np.abs(w).max()


@pytest.mark.gpu
@pytest.mark.parametrize("pos_dtype", [np.int32, np.int64])
def test_out_of_range_positions(rng, pos_dtype):
    import cupy

    tokens, rows = 20000, 512
    pos_host = rng.integers(0, rows, tokens).astype(pos_dtype)
    bad = {19999: rows, 12345: -1, 15000: rows + 7}
    for t, p in bad.items():
        pos_host[t] = p
    q0 = _random(rng, tokens * 4 * 64, BFLOAT16).reshape(tokens, 4, 64)
    k0 = _random(rng, tokens * 64, BFLOAT16).reshape(tokens, 1, 64)
    q, k = cupy.asarray(q0), cupy.asarray(k0)
    cache_host = rope_cache_host(rows, 64).astype(np.float32)
    pos, cache = cupy.asarray(pos_host), cupy.asarray(cache_host)

    with pytest.raises(IndexError, match=r"positions\[12345\] = -1 is outside cos_sin_cache's 512 rows"):
        rotary.rotary_embedding(pos, q, k, cache)
    assert same_bits(q.get(), q0)
    assert same_bits(k.get(), k0)

    rotary.rotary_embedding(pos, q, k, cache, check_positions=False)
    want = reference.rotary_embedding(pos_host, q0, k0, cache_host)
    qa, ka = q.get(), k.get()
    for t in bad:
        assert same_bits(qa[t], q0[t])
        assert same_bits(ka[t], k0[t])
    assert_close(qa, want[0], BFLOAT16)
    assert_close(ka, want[1], BFLOAT16)


@pytest.mark.gpu
def test_position_check_accepts_strided_positions_and_last_row(rng):
    import cupy

    pos2 = cupy.asarray(np.repeat(rng.integers(0, 100, 9), 2))
    pos2[-2] = 99
    pos2[1] = 1000  # skipped by the stride
    q0 = _random(rng, 9 * 2 * 32, F32).reshape(9, 2, 32)
    q = cupy.asarray(q0)
    cache_host = rope_cache_host(100, 32).astype(np.float32)
    rotary.rotary_embedding(pos2[::2], q, None, cupy.asarray(cache_host), is_neox=False)
    want = reference.rotary_embedding(pos2[::2].get(), q0, None, cache_host, is_neox=False)
    assert_close(q.get(), want[0], F32)


@pytest.mark.gpu
def test_wide_cache_and_partial_rotary_dim(rng):
    import cupy

    q0 = _random(rng, 5 * 2 * 64, BFLOAT16).reshape(5, 2, 64)
    q = cupy.asarray(q0)
    cache_host = rope_cache_host(50, 64).astype(np.float32)
    pos_host = rng.integers(0, 50, 5)
    rotary.rotary_embedding(cupy.asarray(pos_host), q, None, cupy.asarray(cache_host), rotary_dim=48)
    want = reference.rotary_embedding(pos_host, q0, None, cache_host, rotary_dim=48)
    assert_close(q.get(), want[0], BFLOAT16)
    assert same_bits(q.get()[..., 48:], q0[..., 48:])


@pytest.mark.gpu
def test_runs_on_current_stream_and_zero_tokens(rng):
    import cupy

    q0 = _random(rng, 16 * 4 * 64, F16).reshape(16, 4, 64)
    cache_host = rope_cache_host(64, 64).astype(np.float32)
    pos_host = rng.integers(0, 64, 16)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        q = cupy.asarray(q0)
        rotary.rotary_embedding(cupy.asarray(pos_host), q, None, cupy.asarray(cache_host))
        stream.synchronize()
    assert_close(q.get(), reference.rotary_embedding(pos_host, q0, None, cache_host)[0], F16)
    empty = cupy.empty((0, 4, 64), F16)
    assert rotary.rotary_embedding(cupy.empty(0, np.int64), empty, None, cupy.asarray(cache_host)) is None


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", FLOAT_TYPES, ids=str)
def test_rope_cache_on_device(dtype):
    got = rope_cache(300, 64, scaling=LLAMA31, dtype=dtype)
    assert got.dtype == dtype and got.shape == (300, 64)
    want = rope_cache_host(300, 64, scaling=LLAMA31).astype(dtype)
    assert same_bits(got.get(), want)


@pytest.mark.gpu
def test_gpu_validation_errors():
    import cupy

    q = cupy.zeros((4, 2, 64), np.float32)
    cache = rope_cache(16, 64)
    pos = cupy.zeros(4, np.int64)
    with pytest.raises(TypeError, match="query is a numpy.ndarray"):
        rotary.rotary_embedding(pos, q.get(), None, cache)
    with pytest.raises(ValueError, match="positions has shape"):
        rotary.rotary_embedding(pos[:3], q, None, cache)
    with pytest.raises(TypeError, match="key has dtype float16"):
        rotary.rotary_embedding(pos, q, q.astype(np.float16), cache)
    with pytest.raises(ValueError, match="query's last dimension has stride"):
        rotary.rotary_embedding(pos, q[:, :, ::2], None, cache[:, :32])
    with pytest.raises(ValueError, match="too narrow"):
        rotary.rotary_embedding(pos, q, None, cache[:, :32], rotary_dim=64)


def test_heads_of_query_and_key_together_fit_an_int():
    """The kernels count query's and key's heads together in an int: 2^31 of them are refused before any
    launch (a ValueError, not the struct's OverflowError), 2^31 - 1 are planned."""
    pos, cache = fake_array((1,), np.int64), fake_array((16, 2), np.float32)
    q = fake_array((1, 2**30, 2), np.float16)
    with pytest.raises(ValueError, match="2147483648 heads together"):
        rotary._validate(pos, q, fake_array((1, 2**30, 2), np.float16, ptr=1 << 40), cache, None)
    rotary._validate(pos, q, fake_array((1, 2**30 - 1, 2), np.float16, ptr=1 << 40), cache, None)


@pytest.mark.gpu
def test_heads_up_to_2_31_stay_in_query():
    """2^31 - 1 heads of one token, 2^30 + 4 of them in query and the rest in key: the head loops step past
    the last head without wrapping (with int indices they went negative and wrote before the arrays). The
    heads next to the last are rotated, the guards around both arrays untouched."""
    import cupy

    free, _ = cupy.cuda.runtime.memGetInfo()
    if free < 10 * 2**30:
        pytest.skip("needs 10 GiB of free GPU memory")
    nq, guard = 2**30 + 4, 4096
    nk = 2**31 - 1 - nq
    try:
        buf = cupy.full(2 * (nq + nk) + 4 * guard, 7.0, np.float16)
        q = buf[guard:guard + 2 * nq].reshape(1, nq, 2)
        k = buf[3 * guard + 2 * nq:3 * guard + 2 * (nq + nk)].reshape(1, nk, 2)
        q[...] = 0
        k[...] = 0
        q[0, -2:, 0] = 1
        k[0, -2:, 0] = 1
        cache = cupy.asarray(rope_cache_host(16, 2).astype(np.float32))
        rotary.rotary_embedding(cupy.asarray([3], np.int64), q, k, cache)
        c, s = (float(v) for v in cache[3])
        want = np.array([[c, s], [c, s]], np.float16)
        assert np.array_equal(q[0, -2:].get(), want) and np.array_equal(k[0, -2:].get(), want)
        assert float(abs(q[0, :2]).max()) == 0.0 and float(abs(k[0, :2]).max()) == 0.0
        for g in (buf[:guard], buf[guard + 2 * nq:3 * guard + 2 * nq], buf[-guard:]):
            assert bool((g == 7.0).all())
    finally:
        buf = q = k = None
        cupy.get_default_memory_pool().free_all_blocks()


@pytest.mark.gpu
def test_more_than_2_31_elements(rng):
    """query with 2^31 + 4096 elements: the last token starts exactly at element 2^31. Only the first
    and last tokens are filled and checked."""
    import cupy

    tokens, nh, hs = 2**31 // (32 * 128) + 1, 32, 128
    free, _ = cupy.cuda.runtime.memGetInfo()
    if free < 6 * 2**30:
        pytest.skip("needs 6 GiB of free GPU memory")
    try:
        q = cupy.empty((tokens, nh, hs), BFLOAT16)
        k = cupy.empty((tokens, 1, hs), BFLOAT16)
        check = [0, tokens - 3, tokens - 2, tokens - 1]
        q0 = _random(rng, len(check) * nh * hs, BFLOAT16).reshape(len(check), nh, hs)
        k0 = _random(rng, len(check) * hs, BFLOAT16).reshape(len(check), 1, hs)
        q[check] = cupy.asarray(q0)
        k[check] = cupy.asarray(k0)
        pos = cupy.random.randint(0, 8192, tokens, dtype=np.int64)
        cache_host = rope_cache_host(8192, hs).astype(np.float32)
        rotary.rotary_embedding(pos, q, k, cupy.asarray(cache_host))
        want = reference.rotary_embedding(pos[check].get(), q0, k0, cache_host)
        assert_close(q[check].get(), want[0], BFLOAT16)
        assert_close(k[check].get(), want[1], BFLOAT16)
    finally:
        q = k = pos = None
        cupy.get_default_memory_pool().free_all_blocks()


@pytest.mark.gpu
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("cache_is_f32", [True, False])
@pytest.mark.parametrize("dtype", FLOAT_TYPES, ids=str)
def test_placement_does_not_change_the_bits(rng, dtype, cache_is_f32, is_neox):
    """The same heads rotated from 16-byte aligned buffers (the vector path) and from buffers one element
    further (the element-wise path) give the same bits, which are the exact emulation's: a token's result
    does not depend on where it sits in a fused buffer."""
    import cupy

    tokens, nh, nkv, hs, rows = 37, 4, 2, 128, 4096
    cache_host = rope_cache_host(rows, hs).astype(F32 if cache_is_f32 else dtype)
    cache = cupy.asarray(cache_host)
    pos_host = rng.integers(0, rows, tokens)
    pos = cupy.asarray(pos_host)
    q0 = _random(rng, tokens * nh * hs, dtype).reshape(tokens, nh, hs)
    k0 = _random(rng, tokens * nkv * hs, dtype).reshape(tokens, nkv, hs)
    exact = reference.rotary_embedding_emulated(pos_host, q0, k0, cache_host, is_neox=is_neox)
    for shift in (0, 1):
        qbuf, kbuf = cupy.empty(q0.size + shift, dtype), cupy.empty(k0.size + shift, dtype)
        q, k = qbuf[shift:].reshape(q0.shape), kbuf[shift:].reshape(k0.shape)
        q[...], k[...] = cupy.asarray(q0), cupy.asarray(k0)
        vec = rotary.vector_width(q, k, cache, hs, is_neox, hs // 2)
        assert (vec > 1) == (shift == 0), (shift, vec)
        rotary.rotary_embedding(pos, q, k, cache, is_neox=is_neox)
        assert same_bits(q.get(), exact[0]), f"query, shift {shift}"
        assert same_bits(k.get(), exact[1]), f"key, shift {shift}"


@pytest.mark.gpu
@pytest.mark.parametrize("key_heads", [None, 0])
def test_zero_heads_still_check_positions(key_heads):
    import cupy

    q = cupy.zeros((4, 0, 64), np.float32)
    k = None if key_heads is None else cupy.zeros((4, key_heads, 64), np.float32)
    cache = rope_cache(16, 64)
    with pytest.raises(IndexError, match=r"positions\[1\] = 99"):
        rotary.rotary_embedding(cupy.asarray([0, 99, 1, 2]), q, k, cache)
    rotary.rotary_embedding(cupy.asarray([0, 99, 1, 2]), q, k, cache, check_positions=False)
    rotary.rotary_embedding(cupy.asarray([0, 15, 1, 2]), q, k, cache)


@pytest.mark.gpu
@pytest.mark.parametrize("reads", [None, 0])
@pytest.mark.parametrize("pos_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("tokens", [1, 7])
def test_position_check_names_the_first_and_the_last_token(rng, pos_dtype, tokens, reads, monkeypatch):
    """A bad first or last token raises naming it and its position, with query and key unchanged; valid
    positions rotate exactly as the unchecked call does. Also with no reads of the answer slot (reads=0: the
    host waits for the stream at once, as after a long check)."""
    import cupy

    if reads is not None:
        monkeypatch.setattr(rotary, "CHECK_READS", reads)

    rows = 32
    cache = rope_cache(rows, 64)
    q0 = cupy.asarray(_random(rng, tokens * 4 * 64, BFLOAT16).reshape(tokens, 4, 64))
    k0 = cupy.asarray(_random(rng, tokens * 2 * 64, BFLOAT16).reshape(tokens, 2, 64))
    good = rng.integers(0, rows, tokens).astype(pos_dtype)
    for t, value in ((0, rows), (tokens - 1, -1)):
        bad = good.copy()
        bad[t] = value
        q, k = q0.copy(), k0.copy()
        with pytest.raises(IndexError, match=rf"^positions\[{t}\] = {value} is outside cos_sin_cache's {rows} rows"):
            rotary.rotary_embedding(cupy.asarray(bad), q, k, cache)
        assert same_bits(q.get(), q0.get())
        assert same_bits(k.get(), k0.get())
    pos = cupy.asarray(good)
    q, k, qu, ku = q0.copy(), k0.copy(), q0.copy(), k0.copy()
    rotary.rotary_embedding(pos, q, k, cache)
    rotary.rotary_embedding(pos, qu, ku, cache, check_positions=False)
    assert same_bits(q.get(), qu.get())
    assert same_bits(k.get(), ku.get())


@pytest.mark.gpu
def test_position_check_refuses_graph_capture_before_recording(rng):
    """Under capture the checked call raises before anything is recorded: the capture stays valid and the
    graph holds only the unchecked call made after it."""
    import cupy

    cache = rope_cache(32, 64)
    pos = cupy.asarray(rng.integers(0, 32, 3))
    q0 = cupy.asarray(_random(rng, 3 * 4 * 64, F32).reshape(3, 4, 64))
    k0 = cupy.asarray(_random(rng, 3 * 2 * 64, F32).reshape(3, 2, 64))
    q, k = q0.copy(), k0.copy()
    cupy.cuda.Device().synchronize()  # a non-blocking stream does not wait for the null stream
    s = cupy.cuda.Stream(non_blocking=True)
    with s:
        for check in (True, False):  # compile, plan and make this thread's pinned pair before capturing
            rotary.rotary_embedding(pos, q0.copy(), k0.copy(), cache, check_positions=check)
        s.synchronize()
        s.begin_capture()
        try:
            with pytest.raises(RuntimeError, match="pass check_positions=False while capturing"):
                rotary.rotary_embedding(pos, q, k, cache)
            rotary.rotary_embedding(pos, q, k, cache, check_positions=False)
        finally:
            graph = s.end_capture()  # raises if the refused call had invalidated the capture
        s.synchronize()
        assert same_bits(q.get(), q0.get())  # captured, not run
        graph.launch(s)
        s.synchronize()
    want_q, want_k = q0.copy(), k0.copy()
    rotary.rotary_embedding(pos, want_q, want_k, cache, check_positions=False)
    assert same_bits(q.get(), want_q.get())  # rotated once
    assert same_bits(k.get(), want_k.get())


@pytest.mark.gpu
def test_key_overlapping_query_is_refused_and_fused_views_are_not(rng):
    import cupy

    tokens, hs = 5, 64
    cache = rope_cache(16, hs)
    pos = cupy.asarray(rng.integers(0, 16, tokens))
    qkv = cupy.asarray(_random(rng, tokens * 6 * hs, F16).reshape(tokens, 6 * hs))
    before = qkv.copy()
    q = qkv[:, : 4 * hs].reshape(tokens, 4, hs)
    for k in (q, qkv[:, 3 * hs: 5 * hs].reshape(tokens, 2, hs), q[:, 1:3]):
        with pytest.raises(ValueError, match="key overlaps query"):
            rotary.rotary_embedding(pos, q, k, cache)
        assert bool((qkv == before).all()), "a refused call must leave query and key as they were"
    k = qkv[:, 4 * hs: 5 * hs].reshape(tokens, 1, hs)
    for _ in range(2):  # the second call finds the layout already decided
        rotary.rotary_embedding(pos, q, k, cache)
    want = reference.rotary_embedding_emulated(pos, before[:, : 4 * hs].reshape(tokens, 4, hs),
                                               before[:, 4 * hs: 5 * hs].reshape(tokens, 1, hs), cache)
    twice = reference.rotary_embedding_emulated(pos, *want, cache)
    assert same_bits(q.get(), twice[0])
    assert same_bits(k.get(), twice[1])


# --------------------------------------------------- rotary_embedding_positions: cos and sin in the kernel

_PI_DIGITS = Decimal("3.1415926535897932384626433832795028841971693993751058209749445923078164062862089986")


def _exact_cos_sin(p: int, w: float) -> tuple:
    """cos and sin of the exact product of the integer ``p`` and the float64 ``w``, to about 40 digits
    (Decimal: the angle reduced by 2 pi from 80 digits of pi, then Taylor series)."""
    with localcontext() as ctx:
        ctx.prec = 60
        x = Decimal(p) * Decimal(w)  # exact
        two_pi = 2 * _PI_DIGITS
        x -= two_pi * (x / two_pi).to_integral_value()
        term, c, s, n = Decimal(1), Decimal(0), Decimal(0), 0
        while abs(term) > Decimal(10) ** -50 or n < 4:
            if n % 2 == 0:
                c += term if n % 4 == 0 else -term
            else:
                s += term if n % 4 == 1 else -term
            n += 1
            term = term * x / n
        return float(c), float(s)


def test_pi_over_2_in_three_parts():
    from fractions import Fraction

    assert rotary.top_bits(rotary.PIO2_1) == rotary.PIO2_1 and rotary.top_bits(rotary.PIO2_2) == rotary.PIO2_2
    parts = Fraction(rotary.PIO2_1) + Fraction(rotary.PIO2_2) + Fraction(rotary.PIO2_3)
    assert abs(parts - Fraction(_PI_DIGITS) / 2) < Fraction(1, 2**110)
    w = np.array([1.0, 0.1, 1e-4, 3.3e-9])
    hi = rotary.top_bits(w)
    assert np.all(hi + (w - hi) == w) and np.all((w - hi) <= np.abs(w) * 2.0**-28)
    assert all(float(Fraction(int(p)) * Fraction(float(h))) == p * h for p in (2**24 - 1, 77777) for h in hi)


def test_in_kernel_cos_sin_are_within_half_an_ulp_at_any_position():
    """The stated bound, on the host (the emulator is the kernel bit for bit): cos and sin within half a
    float32 ulp plus 2^-40 of the exact a cos(p w), a sin(p w), at positions up to 2^24 - 1, negative ones
    too, for plain and YaRN frequencies; the float32 cache's error at the same points obeys the same bound
    only where float64's rounded angle p w is accurate enough."""
    r = np.random.default_rng(7)
    pos = np.concatenate([[0, 1, 2, 3, 4095, 2**20 - 1, 2**20, 2**24 - 1, -1, -(2**24 - 1)],
                          r.integers(0, 2**24, 40), -r.integers(0, 2**20, 10)])
    for scaling, rot in ((None, 128), (QWEN_YARN, 64)):
        got = reference.rotary_positions_cos_sin(pos, rot, 1e6, scaling)
        w, a = rope_frequencies(1, rot, 1e6, scaling)
        half = rot // 2
        cols = list(range(0, half, 7)) + [half - 1]
        for i, p in enumerate(pos):
            for j in cols:
                c, s = _exact_cos_sin(int(p), float(w[j]))
                for value, exact in ((got[i, j], a * c), (got[i, half + j], a * s)):
                    bound = float(np.spacing(np.float32(abs(exact)))) / 2 + 2.0**-40
                    assert abs(float(value) - exact) <= bound, (p, j, value, exact)


def test_positions_error_beside_a_float32_cache(rng):
    """The rotated values' max abs error against float64 at positions up to 2^20: the cache-free op's and a
    float32 cache's (the same rotation) are alike, within the float64 reference's own angle error."""
    tokens, hs = 64, 128
    pos = np.concatenate([[2**20 - 1, 2**20 - 2], rng.integers(0, 2**20, tokens - 2)])
    q = rng.standard_normal((tokens, 4, hs)).astype(np.float32)
    want = reference.rotary_embedding_positions(pos, q, None, hs)[0]
    got = reference.rotary_embedding_positions_emulated(pos, q, None, hs)[0].astype(np.float64)
    w, _ = rope_frequencies(1, hs)
    cache = np.concatenate([np.cos(pos[:, None] * w), np.sin(pos[:, None] * w)], axis=1).astype(np.float32)
    cached = reference.rotary_embedding_emulated(np.arange(tokens), q, None, cache)[0].astype(np.float64)
    err, cache_err = np.abs(got - want).max(), np.abs(cached - want).max()
    slack = 2**20 * 2.0**-53 * np.abs(q).max() * 2  # the reference's own angle rounding
    assert err <= 2 * np.spacing(np.float32(np.abs(want).max())) and abs(err - cache_err) <= slack + err / 4
    assert_close(got, want, F32)


def test_positions_validation_runs_before_the_gpu():
    q = np.zeros((2, 1, 8), np.float32)
    with pytest.raises(TypeError, match="positions is a numpy.ndarray"):
        rotary.rotary_embedding_positions(np.zeros(2, np.int64), q, None, rotary_dim=8)


@pytest.mark.parametrize("kw, err, match", [({"rotary_dim": 7}, ValueError, "rotary_dim=7"),
                                            ({"rotary_dim": 8.0}, TypeError, "rotary_dim must be an int"),
                                            ({"rotary_dim": 128}, ValueError, "over head_size=64"),
                                            ({"rotary_dim": 8, "base": "1e4"}, TypeError, "base must be"),
                                            ({"rotary_dim": 8, "scaling": {"type": "ntk"}}, ValueError, "ntk"),
                                            ({"rotary_dim": 8, "max_position": 1.5}, TypeError, "max_position")])
def test_positions_bad_arguments(monkeypatch, kw, err, match):
    monkeypatch.setattr(rotary, "sm_count", lambda device: 132)
    monkeypatch.setattr(rotary, "_frequency_table", lambda device, rot, base, scaling, max_position: (
        None, rope_frequencies(1 if max_position is None else max_position, rot, base, scaling)[1]))
    args = {"positions": Fake((7,), np.int64), "query": Fake((7, 8, 64)), "key": None}
    rot = kw.pop("rotary_dim")
    with pytest.raises(err, match=match):
        rot = rotary._int_arg(rot, "rotary_dim")
        rotary._plan_positions_call(object(), args["positions"], args["query"], args["key"], rot,
                                    kw.get("base", 10000.0), kw.get("scaling"), True, kw.get("max_position"))


def test_positions_plan_table_fits_shared_memory():
    """Every rotary_dim the op takes (the 48 KiB a launch gets hold one token's table: rotary_dim <= 12288)."""
    assert rotary.POSITIONS_SHARED_LIMIT == 48 * 1024
    for rot, vec in ((2, 1), (64, 8), (128, 8), (256, 8), (512, 1), (128, 1), (1030, 1), (4096, 8), (12288, 8),
                     (12288, 1), (8190, 1)):
        for tokens in (1, 7, 16384):
            p, shared = rotary.positions_plan(tokens, 32, 8, rot, vec)
            assert shared == p.tokens_per_block * rot * 4 <= rotary.POSITIONS_SHARED_LIMIT, (rot, vec, tokens)


def test_positions_past_the_shared_table_are_refused_before_the_gpu():
    q = unread_cupy_array((2, 1, 12290))
    with pytest.raises(ValueError, match=r"rotary_dim=12290: .* rotary_dim <= 12288 is supported"):
        rotary.rotary_embedding_positions(unread_cupy_array((2,), np.int64), q, None, rotary_dim=12290)


def test_positions_refuse_a_max_position_below_one_when_the_table_is_kept(monkeypatch):
    """A table that does not read the length is found without it, so the op checks max_position itself."""
    monkeypatch.setattr(rotary, "_tables", {(0, 64, 10000.0, rotary._scaling_key(None), None): (None, 1.0)})
    q = unread_cupy_array((2, 1, 64))
    for bad in (0, -3):
        with pytest.raises(ValueError, match=f"max_position={bad} must be positive"):
            rotary.rotary_embedding_positions(unread_cupy_array((2,), np.int64), q, None, rotary_dim=64,
                                              max_position=bad)


def test_positions_plan_loads_one_head_a_thread_when_one_wave_holds_the_launch():
    for tokens, nh, nkv in ((1, 32, 8), (64, 32, 8), (1, 1, 0), (16384, 32, 8), (4096, 8, 1), (1 << 20, 64, 0)):
        p, _ = rotary.positions_plan(tokens, nh, nkv, 128, 8)
        assert p.items in rotary.POSITIONS_ITEMS
        assert (p.items == 1) == (p.heads_per_thread == 1), (tokens, nh, nkv, p)
        assert p.heads_per_thread <= p.items
        inst = rotary.positions_instantiation(np.float32, 4, True, p.items)
        assert inst in rotary.instantiations()
    assert rotary.positions_plan(1, 32, 8, 128, 8)[0].items == 1
    assert rotary.positions_plan(16384, 32, 8, 128, 8)[0].items == 4


def test_knobs_out_of_range_are_refused():
    """A tuning cache entry with such knobs is dropped with a warning (the heuristic's are used) rather than
    planned into a division by zero or an empty block."""
    for bad in ({"items": 0}, {"target_block": 0}, {"waves": 0}, {"min_blocks": 0}, {"items": 2.5}):
        with pytest.raises(ValueError):
            rotary.Knobs(**bad)
        with pytest.warns(UserWarning, match="do not fit"):
            assert rotary._tuning_rule("rotary_embedding").knobs_from(bad) is None


def test_blocks_stay_within_the_launch_bound_and_positions_fill_160_threads():
    """No knobs (a tuning cache entry, say) plan a block past the kernels' launch bound; the cache-free kernel
    fills blocks to 160 threads (two 80-thread tokens of 32 + 8 heads of 128), as measured fastest."""
    for target in (32, 160, 256, 512, 640, 4096):
        for tokens, nh, nkv, rot, vec in ((16384, 32, 8, 128, 8), (4096, 1, 0, 2, 1), (1 << 20, 64, 64, 64, 8)):
            p = rotary.plan(tokens, nh, nkv, rot, vec, knobs=rotary.Knobs(target_block=target))
            assert p.block <= rotary.MAX_BLOCK, (target, tokens, nh, nkv, rot, vec, p)
    p, _ = rotary.positions_plan(16384, 32, 8, 128, 8)
    assert (p.tokens_per_block, p.block) == (2, 160)


def _positions_case(rng, *, tokens, nh, nkv, hs, rot, dtype, is_neox, kind="contiguous", pos=None, base=10000.0,
                    scaling=None, pos_dtype=np.int64):
    import cupy

    dtype = np.dtype(dtype)
    n, (qo, qs), (ko, ks) = _layout(tokens, nh, nkv, hs, kind)
    host = _random(rng, n, dtype)
    flat = cupy.asarray(host)
    q = _view(cupy, flat, qo, qs, (tokens, nh, hs))
    k = _view(cupy, flat, ko, ks, (tokens, nkv, hs)) if nkv else None
    pos_h = (rng.integers(0, 2**20, tokens) if pos is None else np.asarray(pos)).astype(pos_dtype)
    rotary.rotary_embedding_positions(cupy.asarray(pos_h), q, k, rotary_dim=rot, base=base, scaling=scaling,
                                      is_neox=is_neox)
    after = flat.get()
    q0 = _view(np, host, qo, qs, (tokens, nh, hs))
    k0 = _view(np, host, ko, ks, (tokens, nkv, hs)) if nkv else None
    exact = reference.rotary_embedding_positions_emulated(pos_h, q0, k0, rot, base, scaling, is_neox)
    want = reference.rotary_embedding_positions(pos_h, q0, k0, rot, base, scaling, is_neox)
    got = [_view(np, after, qo, qs, (tokens, nh, hs))] + ([_view(np, after, ko, ks, (tokens, nkv, hs))] if nkv else [])
    for g, e, w in zip(got, exact, want):
        assert same_bits(g, e)
        assert_close(g, w, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("dtype", FLOAT_TYPES, ids=str)
@pytest.mark.parametrize("kind", ["fused", "misaligned"])
def test_positions_kernel_is_the_emulator(rng, dtype, is_neox, kind):
    _positions_case(rng, tokens=300, nh=32, nkv=8, hs=128, rot=128, dtype=dtype, is_neox=is_neox, kind=kind)
    _positions_case(rng, tokens=5, nh=3, nkv=1, hs=96, rot=64, dtype=dtype, is_neox=is_neox, kind=kind,
                    pos=[0, 2**24 - 1, -7, 2**20, 1], pos_dtype=np.int32, base=1e6, scaling=QWEN_YARN)


@pytest.mark.gpu
def test_positions_decode_key_none_and_blocks_that_loop(rng):
    _positions_case(rng, tokens=1, nh=32, nkv=8, hs=128, rot=128, dtype=BFLOAT16, is_neox=True)
    _positions_case(rng, tokens=7, nh=64, nkv=0, hs=128, rot=32, dtype=F16, is_neox=False)
    _positions_case(rng, tokens=20000, nh=2, nkv=1, hs=64, rot=64, dtype=F32, is_neox=True)


@pytest.mark.gpu
def test_positions_kernel_cos_sin_match_a_cache_built_from_them(rng):
    """The cache-free op equals rotary_embedding on a float32 cache holding its own cos and sin rows."""
    import cupy

    tokens, hs = 50, 128
    pos = rng.integers(0, 2**20, tokens)
    q0 = cupy.asarray(_random(rng, tokens * 8 * hs, BFLOAT16).reshape(tokens, 8, hs))
    q, q2 = q0.copy(), q0.copy()
    rotary.rotary_embedding_positions(cupy.asarray(pos), q, None, rotary_dim=hs)
    rows = cupy.asarray(reference.rotary_positions_cos_sin(pos, hs))
    rotary.rotary_embedding(cupy.arange(tokens), q2, None, rows)
    assert same_bits(q.get(), q2.get())


# ------------------------------------------------------------------- rotary_embedding_mrope: three positions


def _hf_mrope(pos3, x, cache, section, interleaved):
    """Multimodal RoPE transcribed from the Hugging Face form (float64, NeoX halves): cos and sin for each of
    the three position rows, then pair j's taken from its section's row (contiguous chunks, or Qwen3-VL's
    interleaving: rows 1 and 2 at j = 1, 4, ... and j = 2, 5, ... within 3 s1 and 3 s2, the slices clipping
    at the last pair as Python's do)."""
    half = cache.shape[1] // 2
    cos = np.stack([cache[p, :half] for p in pos3])  # [3, tokens, half]
    sin = np.stack([cache[p, half:] for p in pos3])
    if interleaved:
        c, s = cos[0].copy(), sin[0].copy()
        for dim, offset in ((1, 1), (2, 2)):
            c[:, offset:section[dim] * 3:3] = cos[dim][:, offset:section[dim] * 3:3]
            s[:, offset:section[dim] * 3:3] = sin[dim][:, offset:section[dim] * 3:3]
    else:
        bounds = np.cumsum([0] + list(section))
        c = np.concatenate([cos[i][:, bounds[i]:bounds[i + 1]] for i in range(3)], axis=1)
        s = np.concatenate([sin[i][:, bounds[i]:bounds[i + 1]] for i in range(3)], axis=1)
    c, s = c[:, None, :], s[:, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)


@pytest.mark.parametrize("interleaved, section", [(False, (16, 24, 24)), (True, (24, 20, 20)), (False, (8, 0, 56)),
                                                  (True, (22, 21, 21)), (True, (4, 30, 30)), (True, (0, 0, 64))])
def test_mrope_reference_is_the_hugging_face_form(rng, interleaved, section):
    tokens, rows = 9, 300
    cache = reference.rope_cache(rows, 128, 1e6)
    pos3 = rng.integers(0, rows, (3, tokens))
    q = rng.standard_normal((tokens, 4, 128))
    got, _ = reference.rotary_embedding_mrope(pos3, q, None, cache, section, interleaved)
    np.testing.assert_allclose(got, _hf_mrope(pos3, q, cache, section, interleaved), rtol=0, atol=1e-12)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("is_neox", [True, False])
def test_mrope_text_tokens_are_rotary_embedding(rng, interleaved, is_neox):
    """Three equal positions: the bits of rotary_embedding; a token with any position outside the cache is
    left as it is."""
    cache = rope_cache_host(64, 64).astype(np.float32)
    pos = rng.integers(0, 64, 6)
    pos3 = np.stack([pos, pos, pos])
    pos3[1, 2] = 64
    q = _random(rng, 6 * 3 * 64, BFLOAT16).reshape(6, 3, 64)
    got = reference.rotary_embedding_mrope_emulated(pos3, q, None, cache, (10, 11, 11), interleaved, is_neox)[0]
    bad = pos.copy()
    bad[2] = -1
    want = reference.rotary_embedding_emulated(bad, q, None, cache, is_neox=is_neox)[0]
    assert same_bits(got, want)
    assert_close(got, reference.rotary_embedding_mrope(pos3, q, None, cache, (10, 11, 11), interleaved,
                                                       is_neox)[0], BFLOAT16)


@pytest.mark.parametrize("section, interleaved, err, match", [
    ((16, 24), False, ValueError, "three non-negative ints adding up to rotary_dim / 2 = 64"),
    ((16, 24, 25), False, ValueError, "adding up to"), ((-1, 33, 32), False, ValueError, "non-negative"),
    ((4, 30, 31), True, ValueError, "adding up to"), ((16.0, 24, 24), False, TypeError, "entries"),
    (16, False, TypeError, "mrope_section must be three ints")])
def test_mrope_sections_are_checked(section, interleaved, err, match):
    with pytest.raises(err, match=match):
        rotary.mrope_sections(section, 128, interleaved)


def test_mrope_section_bounds():
    assert rotary.mrope_sections((16, 24, 24), 128, False) == (16, 40)
    assert rotary.mrope_sections([24, 20, 20], 128, True) == (60, 60)
    assert rotary.mrope_sections((np.int64(22), 21, 21), 128, True) == (63, 63)
    # the Hugging Face slices [1:3 s1:3] and [2:3 s2:3] clip at the last pair, and so do the bounds
    assert rotary.mrope_sections((8, 12, 12), 64, True) == (32, 32)
    assert rotary.mrope_sections((4, 30, 30), 128, True) == (64, 64)


def test_mrope_validation_with_fakes(monkeypatch):
    monkeypatch.setattr(rotary, "sm_count", lambda device: 132)
    monkeypatch.setattr(rotary._tuned, "lookup", lambda rule, device, dtype, shape: rule.default)
    q, cache = Fake((7, 8, 128)), Fake((100, 128), F32)
    call = rotary._plan_mrope_call(("a",), Fake((3, 7), np.int64), q, None, cache, (16, 24, 24), False, True, None)
    assert call.struct["section_a"] == 16 and call.struct["section_b"] == 40 and call.row_bytes == 7 * 8
    assert call.struct["pos_row_stride"] == 7 and call.inst.name == "rotary_embedding_mrope"
    for pos, match in ((Fake((7,), np.int64), r"\[3, tokens\]"), (Fake((2, 7), np.int64), r"\[3, tokens\]"),
                       (Fake((3, 6), np.int64), "positions has shape"), (Fake((3, 7), F32), "positions has dtype")):
        with pytest.raises((TypeError, ValueError), match=match):
            rotary._plan_mrope_call(("b",), pos, q, None, cache, (16, 24, 24), False, True, None)


def _mrope_case(rng, *, tokens, nh, nkv, hs, rot, dtype, is_neox, section, interleaved, kind="contiguous",
                rows=4096, pos_dtype=np.int64, cache_dtype=F32):
    import cupy

    dtype = np.dtype(dtype)
    n, (qo, qs), (ko, ks) = _layout(tokens, nh, nkv, hs, kind)
    host = _random(rng, n, dtype)
    flat = cupy.asarray(host)
    q = _view(cupy, flat, qo, qs, (tokens, nh, hs))
    k = _view(cupy, flat, ko, ks, (tokens, nkv, hs)) if nkv else None
    cache_h = rope_cache_host(rows, rot, 1e6).astype(cache_dtype)
    pos_h = rng.integers(0, rows, (3, tokens)).astype(pos_dtype)
    pos_h[:, ::5] = pos_h[0, ::5]  # text tokens among the image ones
    rotary.rotary_embedding_mrope(cupy.asarray(pos_h), q, k, cupy.asarray(cache_h), mrope_section=section,
                                  interleaved=interleaved, is_neox=is_neox)
    after = flat.get()
    q0 = _view(np, host, qo, qs, (tokens, nh, hs))
    k0 = _view(np, host, ko, ks, (tokens, nkv, hs)) if nkv else None
    exact = reference.rotary_embedding_mrope_emulated(pos_h, q0, k0, cache_h, section, interleaved, is_neox)
    want = reference.rotary_embedding_mrope(pos_h, q0, k0, cache_h, section, interleaved, is_neox)
    got = [_view(np, after, qo, qs, (tokens, nh, hs))] + ([_view(np, after, ko, ks, (tokens, nkv, hs))] if nkv else [])
    for g, e, w in zip(got, exact, want):
        assert same_bits(g, e)
        assert_close(g, w, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("interleaved, section", [(False, (16, 24, 24)), (True, (24, 20, 20))])
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("dtype", FLOAT_TYPES, ids=str)
def test_mrope_kernel_is_the_emulator(rng, dtype, is_neox, interleaved, section):
    _mrope_case(rng, tokens=300, nh=16, nkv=2, hs=128, rot=128, dtype=dtype, is_neox=is_neox, section=section,
                interleaved=interleaved, kind="fused")
    _mrope_case(rng, tokens=7, nh=3, nkv=1, hs=96, rot=64, dtype=dtype, is_neox=is_neox, section=(8, 12, 12),
                interleaved=interleaved, kind="misaligned", pos_dtype=np.int32, cache_dtype=dtype)


@pytest.mark.gpu
def test_mrope_out_of_range_positions(rng):
    import cupy

    tokens, rows = 50, 64
    cache_h = rope_cache_host(rows, 64).astype(np.float32)
    pos_h = rng.integers(0, rows, (3, tokens))
    pos_h[2, 17], pos_h[1, 30] = rows, -3
    q0 = _random(rng, tokens * 2 * 64, F16).reshape(tokens, 2, 64)
    q = cupy.asarray(q0)
    args = (cupy.asarray(pos_h), q, None, cupy.asarray(cache_h))
    with pytest.raises(IndexError, match=r"positions\[1, 30\] = -3 is outside cos_sin_cache's 64 rows"):
        rotary.rotary_embedding_mrope(*args, mrope_section=(10, 11, 11))
    assert same_bits(q.get(), q0)
    rotary.rotary_embedding_mrope(*args, mrope_section=(10, 11, 11), check_positions=False)
    exact = reference.rotary_embedding_mrope_emulated(pos_h, q0, None, cache_h, (10, 11, 11))[0]
    assert same_bits(q.get(), exact)
    assert same_bits(q.get()[[17, 30]], q0[[17, 30]])


@pytest.mark.gpu
def test_positions_first_call_is_refused_under_capture(rng):
    """rotary_embedding_positions uploads new frequencies on its first call: under capture a RuntimeError before
    anything is recorded or allocated; once an eager call has made them, the call captures."""
    import cupy

    from _support import capture, refused_in_capture

    q = cupy.asarray(_random(rng, 3 * 4 * 64, F32).reshape(3, 4, 64))
    pos = cupy.arange(3)
    base = 12345.678  # frequencies no other test makes

    def call():
        return rotary.rotary_embedding_positions(pos, q, None, rotary_dim=64, base=base)

    stream = cupy.cuda.Stream(non_blocking=True)
    refused_in_capture(stream, call, "make that call once before capturing")
    with stream:
        call()  # eager: uploads the frequencies
        stream.synchronize()
        _, _, freed = capture(stream, call)
    assert not freed


@pytest.mark.gpu
def test_a_call_stored_takes_no_float_in_place_of_its_ints(rng):
    """The call caches key a scalar by its type too: once mrope_section [16, 24, 24] or max_position 4096 has
    a stored call, [16.0, 24, 24] and 4096.0 are refused as a first call refuses them; a NumPy array of
    sections is planned as its ints."""
    import cupy

    pos = cupy.asarray(rng.integers(0, 64, (3, 5)))
    q = cupy.asarray(_random(rng, 5 * 2 * 128, F32).reshape(5, 2, 128))
    cache = cupy.asarray(rope_cache_host(64, 128).astype(np.float32))
    rotary.rotary_embedding_mrope(pos, q, None, cache, mrope_section=[16, 24, 24])
    with pytest.raises(TypeError, match="mrope_section"):
        rotary.rotary_embedding_mrope(pos, q, None, cache, mrope_section=[16.0, 24, 24])
    rotary.rotary_embedding_mrope(pos, q, None, cache, mrope_section=np.array([16, 24, 24]))
    ids = cupy.arange(5)
    rotary.rotary_embedding_positions(ids, q, None, rotary_dim=128, max_position=4096)
    with pytest.raises(TypeError, match="max_position"):
        rotary.rotary_embedding_positions(ids, q, None, rotary_dim=128, max_position=4096.0)
