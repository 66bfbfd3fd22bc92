"""RoPE's gradient (``rotary_embedding(..., inverse=True)``) and ``qk_norm_rope_backward``: against the float64
Jacobian of the forward references and central differences on the CPU; bits against the emulators and
float64 closeness on the GPU (argument refusals: tests/test_launch_contract.py's bad cases)."""

import math

import numpy as np
import pytest
from _support import assert_close, same_bits, unread_cupy_array

import cukern
from cukern import reference
from cukern._dtypes import BFLOAT16

F32, F16 = np.dtype(np.float32), np.dtype(np.float16)
DTYPES = [F32, F16, BFLOAT16]


def _jacobian_transpose_times(f, shape, dy):
    """J^T dy of a linear map f of one array of ``shape`` (float64), column by column of J."""
    n = math.prod(shape)
    jac = np.stack([f(np.eye(n)[i].reshape(shape)).ravel() for i in range(n)], axis=1)
    return (jac.T @ dy.ravel()).reshape(shape)


@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("rotary_dim", [8, 4])
def test_inverse_rotation_is_the_forward_gradient(is_neox, rotary_dim):
    """The forward is linear in q, so its gradient is J^T dy: rotary_embedding with inverse=True applied to dy
    (cos and sin as cached, whatever their rounding: the transpose negates the sine), a position outside the
    cache passing dy through as the forward passes q."""
    rng = np.random.default_rng(rotary_dim)
    positions = np.array([0, 3, 7, 40])  # 40 is outside the cache
    cache = np.asarray(reference.rope_cache(16, rotary_dim), np.float64)
    shape = (4, 2, 8)
    dy = rng.standard_normal(shape)

    def forward(q):
        return reference.rotary_embedding(positions, q, None, cache, is_neox=is_neox, rotary_dim=rotary_dim)[0]

    want = _jacobian_transpose_times(forward, shape, dy)
    got = reference.rotary_embedding(positions, dy, None, cache, is_neox=is_neox, rotary_dim=rotary_dim,
                                     inverse=True)[0]
    np.testing.assert_allclose(got, want, rtol=1e-14, atol=1e-14)


def _qk_inputs(rng, tokens, heads, kv_heads, head_size, dtype, wdtype=None):
    q, dq = (rng.standard_normal((tokens, heads, head_size)).astype(dtype) for _ in range(2))
    k, dk = (rng.standard_normal((tokens, kv_heads, head_size)).astype(dtype) for _ in range(2))
    w = [rng.standard_normal(head_size).astype(wdtype or dtype) for _ in range(2)]
    return q, k, dq, dk, w[0], w[1]


def test_qk_norm_rope_reference_is_the_gradient():
    """The float64 reference against central differences of qk_norm_rope's float64 reference, every input."""
    rng = np.random.default_rng(11)
    positions = np.array([1, 5, 2])
    cache = np.asarray(reference.rope_cache(8, 8), np.float64)
    q, k, dq, dk, qw, kw = (a.astype(np.float64) for a in _qk_inputs(rng, 3, 2, 1, 8, np.float64))
    got = reference.qk_norm_rope_backward(positions, dq, dk, q, k, qw, kw, cache, 1e-3, 1.0)

    def loss(q, k, qw, kw):
        yq, yk = reference.qk_norm_rope(positions, q, k, qw, kw, cache, 1e-3, 1.0)
        return float((yq * dq).sum() + (yk * dk).sum())

    args, h = [q, k, qw, kw], 1e-6
    for i, want_shape in enumerate((q.shape, k.shape, qw.shape, kw.shape)):
        num = np.zeros(want_shape)
        for idx in np.ndindex(want_shape):
            plus, minus = [a.copy() for a in args], [a.copy() for a in args]
            plus[i][idx] += h
            minus[i][idx] -= h
            num[idx] = (loss(*plus) - loss(*minus)) / (2 * h)
        np.testing.assert_allclose(got[i], num, rtol=1e-6, atol=1e-7)


def _float64_after_rotation(positions, dq, dk, q, k, qw, kw, cache, eps, offset, **rope):
    """The float64 gradients from the turned gradient as the op stores it (rounded to query's dtype, by
    design: the forward rounds the normalized head there too), so that the comparison measures the norm's
    backward, not that one rounding, which a sum over many rows grows (dweight of 16-bit types)."""
    gq, gk = reference.rotary_embedding_emulated(positions, dq, dk, cache, inverse=True, **rope)
    dquery, dqw = reference.rms_norm_backward(gq, q, qw, eps, offset)
    dkey, dkw = (None, None) if k is None else reference.rms_norm_backward(gk, k, kw, eps, offset)
    return dquery, dkey, dqw, dkw


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_qk_emulator_is_close_to_float64(dtype):
    rng = np.random.default_rng(3)
    q, k, dq, dk, qw, kw = _qk_inputs(rng, 37, 4, 2, 128, dtype)
    positions = rng.integers(0, 64, 37)
    cache = np.asarray(reference.rope_cache(64, 128), np.float32)
    got = reference.qk_norm_rope_backward_emulated(positions, dq, dk, q, k, qw, kw, cache, 1e-6, 1.0)
    want = _float64_after_rotation(positions, dq, dk, q, k, qw, kw, cache, 1e-6, 1.0)
    for g, w, terms in zip(got, want, (128, 128, 37 * 4, 37 * 2)):
        assert_close(g, w, g.dtype, terms=terms)
    if dtype == F32:  # no rounding in between worth the name: the whole float64 gradient
        want = reference.qk_norm_rope_backward(positions, dq, dk, q, k, qw, kw, cache, 1e-6, 1.0)
        for g, w, terms in zip(got, want, (128, 128, 37 * 4, 37 * 2)):
            assert_close(g, w, g.dtype, terms=terms)


def test_qk_backward_refuses_before_any_launch():
    f = cukern.qk_norm_rope_backward
    pos = unread_cupy_array((4,), np.int64)
    q, k, dq = unread_cupy_array((4, 2, 64)), unread_cupy_array((4, 1, 64)), unread_cupy_array((4, 2, 64))
    cache = unread_cupy_array((16, 64))
    with pytest.raises(TypeError, match="dk is None"):
        f(pos, dq, None, q, k, None, None, cache)
    with pytest.raises(TypeError, match="dk is given"):
        f(pos, dq, unread_cupy_array((4, 1, 64)), q, None, None, None, cache)
    with pytest.raises(ValueError, match="dq has shape"):
        f(pos, unread_cupy_array((4, 2, 63)), None, q, None, None, None, cache)
    with pytest.raises(TypeError, match="dq has dtype"):
        f(pos, unread_cupy_array((4, 2, 64), np.float16), None, q, None, None, None, cache)
    with pytest.raises(ValueError, match="eps"):
        f(pos, dq, None, q, None, None, None, cache, eps=float("nan"))


# ---- GPU --------------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("is_neox", [True, False])
def test_inverse_rotary_kernel_gives_the_gradient(dtype, is_neox, rng):
    """rotary_embedding(inverse=True) on dy: the emulator's bits, and J^T dy of the float64 forward."""
    import cupy as cp

    tokens, heads, hs, rot = 111, 3, 64, 32
    positions = cp.asarray(rng.integers(0, 128, tokens))
    cache = cukern.rope_cache(128, rot)
    dy = cp.asarray(rng.standard_normal((tokens, heads, hs), dtype=np.float32)).astype(dtype)
    want_bits = reference.rotary_embedding_emulated(positions, dy, None, cache, is_neox=is_neox, rotary_dim=rot,
                                                    inverse=True)[0]
    g = dy.copy()
    cukern.rotary_embedding(positions, g, None, cache, is_neox=is_neox, rotary_dim=rot, inverse=True)
    assert same_bits(g, want_bits)
    c64, p64 = cache.get().astype(np.float64), positions.get()
    dy64 = dy.get().astype(np.float64)
    # J^T dy of one token at a time (J is block diagonal over tokens and heads)
    want = np.empty_like(dy64)
    for t in range(tokens):
        def forward(v, t=t):
            return reference.rotary_embedding(p64[t:t + 1], v, None, c64, is_neox=is_neox, rotary_dim=rot)[0]
        for h in range(heads):
            want[t:t + 1, h:h + 1] = _jacobian_transpose_times(forward, (1, 1, hs), dy64[t:t + 1, h:h + 1])
    assert_close(g, want, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,wdtype", [(F32, F32), (F16, F16), (BFLOAT16, BFLOAT16), (BFLOAT16, F32)], ids=str)
@pytest.mark.parametrize("tokens", [1, 111, 989])
@pytest.mark.parametrize("head_size,rot,is_neox", [(128, 128, True), (64, 32, False), (256, 128, True)])
def test_qk_norm_rope_backward_matches_emulator(dtype, wdtype, tokens, head_size, rot, is_neox, rng):
    import cupy as cp

    heads, kv_heads = 8, 2
    host = _qk_inputs(rng, tokens, heads, kv_heads, head_size, dtype, wdtype)
    # query and key as views of one fused qkv buffer, as models hold them
    qkv = cp.empty((tokens, heads + 2 * kv_heads, head_size), dtype)
    q, k = qkv[:, :heads], qkv[:, heads:heads + kv_heads]
    q[...], k[...] = cp.asarray(host[0]), cp.asarray(host[1])
    dq, dk, qw, kw = (cp.asarray(a) for a in host[2:])
    positions = cp.asarray(rng.integers(0, 4096, tokens).astype(np.int32))
    cache = cukern.rope_cache(4096, rot)
    offset = float(rng.choice([0.0, 1.0]))
    before = (dq.copy(), dk.copy(), qkv.copy())
    got = cukern.qk_norm_rope_backward(positions, dq, dk, q, k, qw, kw, cache, eps=1e-6, offset=offset,
                                       is_neox=is_neox, rotary_dim=rot)
    assert same_bits(dq, before[0]) and same_bits(dk, before[1]) and same_bits(qkv, before[2]), "inputs changed"
    want = reference.qk_norm_rope_backward_emulated(positions, dq, dk, q, k, qw, kw, cache, 1e-6, offset,
                                                    is_neox=is_neox, rotary_dim=rot)
    for g, w in zip(got, want):
        assert same_bits(g, w)
    ref = _float64_after_rotation(*(a.get() for a in (positions, dq, dk, q, k, qw, kw, cache)), 1e-6, offset,
                                  is_neox=is_neox, rotary_dim=rot)
    for g, w, terms in zip(got, ref, (head_size, head_size, tokens * heads, tokens * kv_heads)):
        assert_close(g, w, g.dtype, terms=terms)


@pytest.mark.gpu
def test_qk_norm_rope_backward_without_key_or_weights(rng):
    import cupy as cp

    q, _, dq, _, _, _ = (cp.asarray(a) for a in _qk_inputs(rng, 33, 4, 1, 128, BFLOAT16))
    positions = cp.asarray(rng.integers(0, 64, 33))
    cache = cukern.rope_cache(64, 128)
    got = cukern.qk_norm_rope_backward(positions, dq, None, q, None, None, None, cache)
    assert got[1] is None and got[2] is None and got[3] is None
    want = reference.qk_norm_rope_backward_emulated(positions, dq, None, q, None, None, None, cache)
    assert same_bits(got[0], want[0])
    empty = cp.zeros((0, 4, 128), np.float32).astype(BFLOAT16)
    weight = cp.ones(128, np.float32).astype(BFLOAT16)
    got = cukern.qk_norm_rope_backward(cp.zeros(0, np.int64), empty, None, empty, None, weight, None, cache)
    assert got[0].shape == (0, 4, 128) and not bool(got[2].any())
