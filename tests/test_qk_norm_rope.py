"""Fused QK-norm + RoPE: references, planning, validation, compilation (CPU) and the kernel (GPU): close to the
float64 reference, and bit for bit the exact emulation, which is rms_norm then rotary_embedding."""

import itertools
import math
import re
from types import SimpleNamespace

import ml_dtypes
import numpy as np
import pytest
from _support import ARCHS, assert_close, assert_no_spills, checked_instantiations, compiled, same_bits

from cukern import qknorm, reference, rmsnorm, rotary
from cukern._dtypes import BFLOAT16, FLOAT_TYPES
from cukern.rope_cache import rope_cache, rope_cache_host

F32, F16 = np.dtype(np.float32), np.dtype(np.float16)


def _random(rng, shape, dtype):
    return rng.standard_normal(shape, dtype=np.float32).astype(dtype)


def _weight(rng, n, dtype):
    return (1 + 0.3 * rng.standard_normal(n)).astype(dtype)


def assert_close_in_two_steps(got, positions, query, key, q_weight, k_weight, cache, eps, offset, is_neox, rot):
    """``got`` (query's and key's results) against float64 one step at a time, each step under the shared
    tolerance: the normalized heads the op rounds to the dtype (the emulator's, against the float64 norm, a sum
    of head_size terms), then the float64 rotation of those rounded heads against ``got``. The float64
    reference of the whole op rounds nothing in between, so for 16-bit types it is an ulp of the larger pair
    element away wherever the rotation nearly cancels."""
    hs, dtype = query.shape[-1], query.dtype
    normed = [None if x is None else reference.rms_norm_emulated(x, w, eps, offset)
              for x, w in ((query, q_weight), (key, k_weight))]
    for x, w, n in zip((query, key), (q_weight, k_weight), normed):
        if x is not None:
            assert_close(n, reference.rms_norm(x, w, eps, offset), dtype, terms=hs)
    want = reference.rotary_embedding(positions, normed[0], normed[1], cache, is_neox=is_neox, rotary_dim=rot)
    for g, w in zip(got, want):
        if w is not None:
            assert_close(g, w, dtype)


# ------------------------------------------------------------------------------------ references (CPU)


def test_reference_is_norm_then_rotation(rng):
    """Each head normalized over head_size with its tensor's weight, then turned as a complex number."""
    tokens, hs, rot = 5, 64, 32
    q, k = rng.standard_normal((tokens, 3, hs)), rng.standard_normal((tokens, 1, hs))
    qw, kw = rng.standard_normal(hs), rng.standard_normal(hs)
    cache = reference.rope_cache(40, rot)
    pos = rng.integers(0, 40, tokens)
    gq, gk = reference.qk_norm_rope(pos, q, k, qw, kw, cache, 1e-5, 1.0, is_neox=True, rotary_dim=rot)
    for x, w, got in ((q, qw, gq), (k, kw, gk)):
        n = x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-5) * (1.0 + w)
        j = np.arange(rot // 2)
        z = (n[..., j] + 1j * n[..., j + rot // 2]) * np.exp(1j * pos[:, None, None] * 10000.0 ** (-2.0 * j / rot))
        np.testing.assert_allclose(got[..., j], z.real, atol=1e-12)
        np.testing.assert_allclose(got[..., j + rot // 2], z.imag, atol=1e-12)
        np.testing.assert_allclose(got[..., rot:], n[..., rot:], atol=1e-12)


@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("dtype", FLOAT_TYPES, ids=str)
def test_emulation_is_the_reference_rounded(rng, dtype, is_neox):
    """The exact emulation is within the shared tolerance of float64 at each of its two steps (float32: of the
    whole op's float64 reference too); a token outside the cache is normalized but not rotated; GQA head
    counts, partial rotary_dim, float32 weights, key None and the Gemma offset."""
    hs, rot = 80, 48
    cache = rope_cache_host(50, rot).astype(dtype)
    q, k = _random(rng, (6, 4, hs), dtype), _random(rng, (6, 1, hs), dtype)
    qw, kw = _weight(rng, hs, F32), _weight(rng, hs, F32)
    pos = np.array([0, 7, 49, 50, -1, 3])
    for key, offset in ((k, 0.0), (None, 1.0)):
        got = reference.qk_norm_rope_emulated(pos, q, key, qw, kw, cache, 1e-6, offset, is_neox, rot)
        want = reference.qk_norm_rope(pos, q, key, qw, kw, cache, 1e-6, offset, is_neox, rot)
        assert (got[1] is None) == (key is None) and got[0].dtype == dtype
        assert_close_in_two_steps(got, pos, q, key, qw, kw, cache, 1e-6, offset, is_neox, rot)
        if dtype == F32:
            for g, w in zip(got, want):
                if w is not None:
                    assert_close(g, w, dtype, terms=hs)
        normalized = reference.rms_norm_emulated(q, qw, 1e-6, offset)
        assert same_bits(got[0][3:5], normalized[3:5])
        assert same_bits(got[0][..., rot:], normalized[..., rot:])


def test_bytes_moved():
    t, nh, nkv, hs = 16384, 32, 8, 128
    assert qknorm.bytes_moved(t, nh, nkv, hs, BFLOAT16) == 2 * t * (nh + nkv) * hs * 2 + 2 * hs * 2 + t * hs * 4 + t * 8
    assert qknorm.bytes_moved(t, nh, 0, hs, BFLOAT16, 64, F32, BFLOAT16, np.int32) == \
        2 * t * nh * hs * 2 + hs * 4 + t * 64 * 2 + t * 4


# ---------------------------------------------------------------------------------------- plan (CPU)


def test_plan_benchmark_shape():
    p = qknorm.plan(16384, 32, 8, 128, 128, 8, True, 2, 132)
    assert (p.lanes, p.groups, p.items, p.pair, p.shared) == (4, 1, 4, 2, 0)
    assert (p.block, p.heads_per_block, p.grid) == (128, 32, min(16384 * 40 // 32, 4 * 132 * 16))
    assert p.config.shared_mem == 0
    assert p.instantiation(BFLOAT16, BFLOAT16, F32).expression == \
        "cukern::qk_norm_rope<cukern::bf16, cukern::bf16, float, 8, 4, 1, 4, true, 2, 128>"
    half = qknorm.plan(16384, 32, 8, 128, 64, 8, True, 2, 132)
    assert half.pair == 1 and half.shared == 0
    narrow = qknorm.plan(16384, 32, 8, 128, 32, 8, True, 2, 132)  # rot/2 = 2 vectors, 4 lanes: shared memory
    assert narrow.pair == 0 and narrow.shared == 32 * 128 * 2
    gptj = qknorm.plan(1, 32, 8, 128, 128, 1, False, 2, 132)
    assert (gptj.lanes, gptj.items, gptj.pair, gptj.shared, gptj.grid) == (32, 4, 0, 0, 10)


@pytest.mark.parametrize("vec", [1, 4, 8])
@pytest.mark.parametrize("is_neox", [True, False])
def test_plan_computes_rms_norms_tree_and_keeps_pairs_together(vec, is_neox):
    """Every plan splits exactly rms_norm's tree for head_size over its threads, holds the whole head, and
    either keeps a NeoX pair's halves in one thread or has the shared memory for them."""
    r = np.random.default_rng(0)
    for _ in range(400):
        hs = vec * int(r.integers(1, qknorm.MAX_HEAD_SIZE // vec + 1))
        step = 2 * vec if is_neox else max(vec, 2)
        rot = step * int(r.integers(1, hs // step + 1)) if hs >= step else None
        if rot is None:
            continue
        tokens, nh, nkv = int(r.choice([0, 1, 7, 4096, 2**22])), int(r.integers(0, 65)), int(r.integers(0, 9))
        block = int(r.choice([32, 128, 256, 512, 1024]))
        waves = [None, 1, 8][int(r.integers(0, 3))]
        p = qknorm.plan(tokens, nh, nkv, hs, rot, vec, is_neox, 4 if vec == 4 else 2, 132, qknorm.Knobs(block, waves))
        assert p.groups * p.lanes * p.vec == rmsnorm.tree_classes(hs)
        assert p.items % p.groups == 0 and p.items * p.lanes * p.vec >= hs
        assert p.lanes <= 32 and p.lanes & (p.lanes - 1) == 0 and p.block % 32 == 0 and p.block >= p.lanes
        if p.pair:
            assert is_neox and p.pair * p.lanes * vec == rot // 2 and 2 * p.pair <= p.items and p.shared == 0
        elif is_neox:
            assert p.shared == p.heads_per_block * hs * (4 if vec == 4 else 2) <= qknorm.MAX_SHARED
        else:
            assert p.shared == 0 and (vec > 1 or p.lanes % 2 == 0)
        slots = tokens * (nh + nkv)
        assert p.grid * p.heads_per_block >= slots or waves is not None
        assert 1 <= p.grid <= qknorm.MAX_GRID


@pytest.mark.parametrize("args", [(1, 1, 1, 128, 130, 1, True), (1, 1, 1, 128, 63, 1, True),
                                  (1, 1, 1, 2048, 128, 1, True), (1, 1, 1, 128, 120, 8, True),
                                  (1, 1, 1, 128, 124, 8, False), (1, 1, 1, 100, 100, 8, True),
                                  (1, -1, 1, 128, 128, 8, True)])
def test_plan_rejects_bad_shapes(args):
    with pytest.raises(ValueError):
        qknorm.plan(*args)


def test_plan_rejects_a_bad_block():
    with pytest.raises(ValueError, match="block=100"):
        qknorm.plan(1, 1, 1, 128, 128, 8, True, 2, 132, qknorm.Knobs(block=100))


def test_widest_vector():
    assert qknorm.widest_vector(128, 128, True, 2) == 8
    assert qknorm.widest_vector(128, 64, True, 4) == 4
    assert qknorm.widest_vector(128, 24, True, 2) == 1  # NeoX half of 12 is not a multiple of 8
    assert qknorm.widest_vector(128, 24, False, 2) == 8 and qknorm.widest_vector(128, 20, False, 2) == 1
    assert qknorm.widest_vector(128, 16, False, 2) == 8
    assert qknorm.widest_vector(100, 100, True, 2) == 1


# ----------------------------------------------------------------- validation with fake arrays (CPU)


class Fake:
    """The attributes validation reads, without a GPU; strides in elements."""

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


W_PTR = 1 << 30


def _fakes(**over):
    f = {"positions": Fake((7,), np.int64, ptr=1 << 29), "query": Fake((7, 8, 128)),
         "key": Fake((7, 2, 128), ptr=1 << 24),
         "q_weight": Fake((128,), ptr=W_PTR), "k_weight": Fake((128,), ptr=W_PTR + 4096),
         "cache": Fake((100, 128), F32, ptr=1 << 28), "rotary_dim": None}
    f.update(over)
    return f


def _prep(monkeypatch, f, eps=1e-6, offset=0.0, is_neox=True, knobs=qknorm.DEFAULT_KNOBS):
    monkeypatch.setattr(qknorm, "sm_count", lambda device: 132)
    return qknorm._prepare(f["positions"], f["query"], f["key"], f["q_weight"], f["k_weight"], f["cache"], eps, offset,
                           is_neox, f["rotary_dim"], knobs)


def test_prepare_plans_and_memoizes(monkeypatch):
    qknorm._calls.clear()
    a = _prep(monkeypatch, _fakes())
    assert a.inst.args[3] == 8 and a.has_key and a.config.block == (128,) and a.struct["head_size"] == 128
    assert _prep(monkeypatch, _fakes()) is a
    assert _prep(monkeypatch, _fakes(query=Fake((7, 8, 128), ptr=(1 << 20) + 2))).inst.args[3] == 1
    assert _prep(monkeypatch, _fakes(q_weight=Fake((128,), ptr=W_PTR + 2))).inst.args[3] == 1
    b = _prep(monkeypatch, _fakes(), eps=1e-5, offset=1.0)
    assert b is not a and b.struct["offset"] == 1.0 and b.struct["eps"] == np.float32(1e-5)
    c = _prep(monkeypatch, _fakes(q_weight=Fake((128,), F32, ptr=W_PTR), k_weight=Fake((128,), F32, ptr=W_PTR + 4096)))
    assert c.inst.args[1] == F32
    assert _prep(monkeypatch, _fakes(key=None, k_weight=None)).has_key is False
    assert _prep(monkeypatch, _fakes(q_weight=None, k_weight=None)).inst.args[1] == BFLOAT16
    assert _prep(monkeypatch, _fakes(query=Fake((0, 8, 128)), key=Fake((0, 2, 128)),
                                     positions=Fake((0,), np.int64))) is None
    none = _prep(monkeypatch, _fakes(query=Fake((7, 0, 128)), key=None))
    assert none.inst is None and none.cache_rows == 100
    assert _prep(monkeypatch, _fakes(), knobs=qknorm.Knobs(block=512)).config.block == (512,)


@pytest.mark.parametrize("over, err, match", [
    ({"q_weight": Fake((128,), F16, ptr=W_PTR)}, TypeError, "q_weight has dtype float16"),
    ({"k_weight": Fake((64,), ptr=W_PTR)}, ValueError, r"k_weight has shape \(64,\); it must be \[head_size\]"),
    ({"k_weight": Fake((1, 128), ptr=W_PTR)}, ValueError, "k_weight has shape"),
    ({"k_weight": Fake((128,), F32, ptr=W_PTR)}, TypeError, "q_weight has dtype bfloat16, k_weight has float32"),
    ({"q_weight": Fake((128,), ptr=W_PTR, device=1)}, ValueError, "different devices"),
    ({"k_weight": Fake((128,), strides=(2,), ptr=W_PTR)}, ValueError, "k_weight's last dimension has stride 2"),
    ({"q_weight": Fake((128,), ptr=(1 << 20) + 64)}, ValueError, "q_weight overlaps query"),
    ({"k_weight": Fake((128,), ptr=1 << 24)}, ValueError, "k_weight overlaps key"),
    ({"query": Fake((7, 8, 2048)), "key": None, "q_weight": None, "k_weight": None, "cache": Fake((9, 128), F32)},
     ValueError, "head_size is 2048; at most 1024"),
    ({"query": Fake((7, 8, 1024))}, ValueError, "key's head_size is 128, query's is 1024"),
    ({"positions": Fake((7,), np.float32)}, TypeError, "positions has dtype float32"),
    ({"rotary_dim": 63}, ValueError, "rotary_dim=63"),
    ({"rotary_dim": 64.0}, TypeError, "rotary_dim must be an int"),
    ({"cache": Fake((100, 128), F16)}, TypeError, "cos_sin_cache has dtype float16"),
])
def test_validate_errors(monkeypatch, over, err, match):
    n = len(qknorm._calls)
    for _ in range(2):  # failures are never memoized
        with pytest.raises(err, match=match):
            _prep(monkeypatch, _fakes(**over))
    assert len(qknorm._calls) == n


@pytest.mark.parametrize("eps, offset, name", [(-1.0, 0.0, "eps"), (float("nan"), 0.0, "eps"), ("1", 0.0, "eps"),
                                               (1e-6, float("inf"), "offset"), (1e-6, None, "offset")])
def test_bad_eps_and_offset(monkeypatch, eps, offset, name):
    with pytest.raises((TypeError, ValueError), match=rf"^{name}\b"):
        _prep(monkeypatch, _fakes(), eps=eps, offset=offset)


def test_key_overlapping_query_is_refused_and_fused_views_pass(monkeypatch):
    """rotary's exact check: views of one [tokens, 12 heads] buffer pass (decided once), key=query's heads
    do not, even on a call layout already planned."""
    qknorm._calls.clear()
    row = 12 * 128
    q = Fake((7, 8, 128), strides=(row, 128, 1))
    k = Fake((7, 2, 128), strides=(row, 128, 1), ptr=(1 << 20) + 8 * 128 * 2)
    call = _prep(monkeypatch, _fakes(query=q, key=k))
    assert call.meet[0] < k.data.ptr - q.data.ptr < call.meet[1] and call.apart == k.data.ptr - q.data.ptr
    for bad in (Fake((7, 2, 128), strides=(row, 128, 1), ptr=(1 << 20) + 7 * 128 * 2),
                Fake((7, 2, 128), strides=(row, 128, 1), ptr=1 << 20)):
        with pytest.raises(ValueError, match="key overlaps query"):
            _prep(monkeypatch, _fakes(query=q, key=bad))


def test_host_arrays_are_rejected_by_name():
    q = np.zeros((2, 1, 8), np.float32)
    with pytest.raises(TypeError, match="positions is a numpy.ndarray"):
        qknorm.qk_norm_rope(np.zeros(2, np.int64), q, None, None, None, np.zeros((4, 8), np.float32))


def test_vector_width():
    def vw(q=None, k=None, qw=None, cache=None, rot=128, neox=True):
        q = q or Fake((7, 8, 128))
        cache = cache or Fake((100, rot), F32)
        return qknorm.vector_width(q, k, qw, None, cache, rot, neox, cache.shape[1] // 2)

    assert vw() == 8 and vw(q=Fake((7, 8, 128), F32)) == 4
    assert vw(q=Fake((7, 8, 128), ptr=(1 << 20) + 2)) == 1
    assert vw(k=Fake((7, 2, 128), strides=(256, 129, 1))) == 1
    assert vw(qw=Fake((128,), ptr=W_PTR + 8)) == 1
    assert vw(qw=Fake((128,), F32, ptr=W_PTR + 16)) == 8
    assert vw(cache=Fake((100, 128), BFLOAT16, ptr=(1 << 20) + 8), neox=False) == 8  # GPT-J: 8-byte packs
    assert vw(cache=Fake((100, 128), BFLOAT16, ptr=(1 << 20) + 8)) == 1
    assert vw(cache=Fake((100, 130), F32)) == 1  # sin at 65 floats: unaligned


# --------------------------------------------------------------------------------- compilation (CPU)


def test_instantiations_generated_and_modest():
    insts = qknorm.instantiations()
    assert len({i.expression for i in insts}) == len(insts) <= 64
    kinds = {(i.args[7], i.args[8] > 0, i.args[3] > 1) for i in insts}  # style, in-thread pairs, vectors
    assert kinds == {(True, True, True), (True, True, False), (True, False, True), (True, False, False),
                     (False, False, True), (False, False, False)}


@pytest.mark.nvrtc("qk_norm_rope")
@pytest.mark.parametrize("arch", ARCHS)
def test_every_instantiation_compiles_without_spills_or_local_memory(arch):
    prog = compiled(qknorm.SOURCE, arch)
    res = prog.resources()
    for inst in checked_instantiations(qknorm.SOURCE):
        r = res[prog.lowered[inst.expression]]
        assert_no_spills(r, arch, inst.expression)
        assert ".local" not in prog.kernel_ptx(inst), inst.expression


@pytest.mark.nvrtc("qk_norm_rope")
@pytest.mark.parametrize("arch", ARCHS)
def test_machine_code_rounds_every_step_and_uses_16_byte_accesses(arch):
    """No fused multiply-add and no approximate square root, reciprocal or division anywhere (the emulator
    rounds every step); vectorized instantiations move q and k with 16-byte accesses, element-wise ones with
    none."""
    prog = compiled(qknorm.SOURCE, arch)
    for inst in checked_instantiations(qknorm.SOURCE):
        body = prog.kernel_ptx(inst)
        assert "fma.rn.f32" not in body and ".approx" not in body, inst.expression
        assert all(op in body for op in ("div.rn.f32", "sqrt.rn.f32", "rcp.rn.f32", "mul.rn.f32")), inst.expression
        wide = re.search(r"ld\.global(\.\w+)*\.v4", body) and re.search(r"st\.global(\.\w+)*\.v4", body)
        if inst.args[3] > 1:
            assert wide, inst.expression
        else:
            assert not re.search(r"st\.global(\.\w+)*\.v\d", body), inst.expression


# ------------------------------------------------------------------------------------------ GPU tests


def _layout(tokens, nh, nkv, hs, kind):
    """Element offsets and strides of q and k in one flat buffer: separate contiguous arrays, views into a
    fused [tokens, (nh + 2 nkv) hs] qkv buffer, such views shifted by one element with an odd row (the
    element-wise instantiations), or the fused views with tokens in reverse order (negative token stride)."""
    if kind == "contiguous":
        return tokens * (nh + nkv) * hs, (0, (nh * hs, hs, 1)), (tokens * nh * hs, (nkv * hs, hs, 1))
    width = (nh + 2 * nkv) * hs + (kind == "misaligned")
    shift = int(kind == "misaligned")
    if kind == "reversed":
        last = (tokens - 1) * width
        return tokens * width, (last, (-width, hs, 1)), (last + nh * hs, (-width, hs, 1))
    return tokens * width, (shift, (width, hs, 1)), (shift + nh * hs, (width, hs, 1))


def _view(xp, flat, off, strides, shape):
    st = tuple(s * flat.itemsize for s in strides)
    return xp.lib.stride_tricks.as_strided(flat[off:], shape, st)


def run_case(rng, *, tokens, nh, nkv, hs, rot, dtype, is_neox, kind="contiguous", weight_dtype=None,
             cache_dtype=F32, pos_dtype=np.int64, eps=1e-6, offset=0.0, weights=True, max_position=4096,
             sample=128, knobs=None, fill=None):
    """Norm and rotate on the GPU; compare a sample of tokens with the emulator (bits) and the float64
    reference (closeness); every element of the buffer the op must not touch is bit-identical afterwards."""
    import cupy

    dtype = np.dtype(dtype)
    wdt = dtype if weight_dtype is None else np.dtype(weight_dtype)
    n, (qo, qs), (ko, ks) = _layout(tokens, nh, nkv, hs, kind)
    host = _random(rng, n, dtype)
    if fill is not None:
        fill(host)
    flat = cupy.asarray(host)
    q = _view(cupy, flat, qo, qs, (tokens, nh, hs))
    k = _view(cupy, flat, ko, ks, (tokens, nkv, hs)) if nkv else None
    qw_h, kw_h = (_weight(rng, hs, wdt), _weight(rng, hs, wdt)) if weights else (None, None)
    qw, kw = (None, None) if not weights else (cupy.asarray(qw_h), cupy.asarray(kw_h))
    cache_h = rope_cache_host(max_position, rot).astype(cache_dtype)
    pos_h = rng.integers(0, max_position, tokens).astype(pos_dtype)
    args = (cupy.asarray(pos_h), q, k, qw, kw, cupy.asarray(cache_h))
    if knobs is None:
        qknorm.qk_norm_rope(*args, eps=eps, offset=offset, is_neox=is_neox, rotary_dim=rot)
    else:
        qknorm._run(*args, eps, offset, is_neox, rot, True, knobs)
    after = flat.get()

    touched = np.zeros(n, bool)
    index = np.arange(n)
    touched[_view(np, index, qo, qs, (tokens, nh, hs)).ravel()] = True
    if nkv:
        touched[_view(np, index, ko, ks, (tokens, nkv, hs)).ravel()] = True
    assert same_bits(after[~touched], host[~touched])

    rows = np.arange(tokens) if tokens <= sample else np.unique(
        np.concatenate([rng.choice(tokens, sample, replace=False), [0, tokens - 1]]))
    q0 = _view(np, host, qo, qs, (tokens, nh, hs))[rows]
    k0 = _view(np, host, ko, ks, (tokens, nkv, hs))[rows] if nkv else None
    got = [_view(np, after, qo, qs, (tokens, nh, hs))[rows]]
    if nkv:
        got.append(_view(np, after, ko, ks, (tokens, nkv, hs))[rows])
    call = (pos_h[rows], q0, k0, qw_h, kw_h, cache_h, eps, offset, is_neox, rot)
    for g, e in zip(got, reference.qk_norm_rope_emulated(*call)):
        assert same_bits(g, e)
    if fill is None:
        assert_close_in_two_steps(got + [None] * (2 - len(got)), *call)


def _matrix():
    """Every style x dtype x head shape once (full, half and narrow rotary_dim, odd head sizes); GQA ratio,
    token count and layout rotate through the cases."""
    heads = [(64, 64), (128, 128), (128, 32), (256, 128), (80, 80), (96, 32)]
    gqa, tokens, kinds = [(32, 8), (8, 1), (4, 4)], [1, 7, 999], ["contiguous", "fused", "misaligned", "reversed"]
    cases = []
    for n, (neox, dtype, (hs, rot)) in enumerate(itertools.product([True, False], FLOAT_TYPES, heads)):
        nh, nkv = gqa[n % 3]
        t, kind = tokens[(n + n // 3) % 3], kinds[(n // 2) % 4]
        cid = f"{'neox' if neox else 'gptj'}-{dtype}-hs{hs}-rot{rot}-{nh}x{nkv}-T{t}-{kind}"
        cases.append(pytest.param({"is_neox": neox, "dtype": dtype, "hs": hs, "rot": rot, "nh": nh, "nkv": nkv,
                                   "tokens": t, "kind": kind}, id=cid))
    return cases


@pytest.mark.gpu
@pytest.mark.parametrize("case", _matrix())
def test_matrix(rng, case):
    run_case(rng, **case)


@pytest.mark.gpu
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("dtype", FLOAT_TYPES, ids=str)
def test_benchmark_heads_and_variants(rng, dtype, is_neox):
    """The benchmark's heads (32 q, 8 kv, head 128) from a fused qkv buffer: float32 weights with int32
    positions, then a cache in query's dtype with the Gemma offset and no weights, then key None."""
    run_case(rng, tokens=300, nh=32, nkv=8, hs=128, rot=128, dtype=dtype, is_neox=is_neox, kind="fused",
             weight_dtype=F32, pos_dtype=np.int32)
    run_case(rng, tokens=33, nh=32, nkv=8, hs=128, rot=128, dtype=dtype, is_neox=is_neox, cache_dtype=dtype,
             offset=1.0, eps=1e-5, weights=False)
    run_case(rng, tokens=5, nh=16, nkv=0, hs=128, rot=64, dtype=dtype, is_neox=is_neox)


@pytest.mark.gpu
@pytest.mark.parametrize("knobs", [qknorm.Knobs(128, None), qknorm.Knobs(512, 1), qknorm.Knobs(32, 1)])
@pytest.mark.parametrize("is_neox", [True, False])
def test_every_knob_setting_and_looping_blocks(rng, knobs, is_neox):
    # waves=1 caps the grid below the slots: blocks walk several (token, head) slots
    run_case(rng, tokens=20000, nh=4, nkv=2, hs=128, rot=128, dtype=BFLOAT16, is_neox=is_neox, knobs=knobs)
    run_case(rng, tokens=3000, nh=3, nkv=1, hs=96, rot=32, dtype=F16, is_neox=is_neox, kind="fused", knobs=knobs)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", FLOAT_TYPES, ids=str)
def test_nan_inf_and_large_values(rng, dtype):
    """A NaN or infinity makes its head NaN (its sum of squares is), as rms_norm does; other heads and huge
    finite values come out as the emulator's."""
    def fill(h):
        h[5] = np.nan
        h[300] = np.inf
        h[1000:1010] = float(ml_dtypes.finfo(dtype).max) / 4

    run_case(rng, tokens=9, nh=4, nkv=2, hs=128, rot=128, dtype=dtype, is_neox=True, fill=fill)


@pytest.mark.gpu
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("kind", ["contiguous", "misaligned"])
def test_fused_equals_the_two_calls_on_the_gpu(rng, is_neox, kind):
    """qk_norm_rope's bits are rms_norm over each head then rotary_embedding, launched on the GPU."""
    import cupy

    tokens, nh, nkv, hs = 77, 16, 4, 128
    n, (qo, qs), (ko, ks) = _layout(tokens, nh, nkv, hs, kind)
    flat = cupy.asarray(_random(rng, n, BFLOAT16))
    other = flat.copy()
    qw, kw = cupy.asarray(_weight(rng, hs, BFLOAT16)), cupy.asarray(_weight(rng, hs, BFLOAT16))
    cache, pos = rope_cache(4096, hs), cupy.asarray(rng.integers(0, 4096, tokens))
    q, k = _view(cupy, flat, qo, qs, (tokens, nh, hs)), _view(cupy, flat, ko, ks, (tokens, nkv, hs))
    q2, k2 = _view(cupy, other, qo, qs, (tokens, nh, hs)), _view(cupy, other, ko, ks, (tokens, nkv, hs))
    qknorm.qk_norm_rope(pos, q, k, qw, kw, cache, is_neox=is_neox)
    rmsnorm.rms_norm(q2, qw, out=q2)
    rmsnorm.rms_norm(k2, kw, out=k2)
    rotary.rotary_embedding(pos, q2, k2, cache, is_neox=is_neox)
    assert same_bits(flat.get(), other.get())


@pytest.mark.gpu
@pytest.mark.parametrize("pos_dtype", [np.int32, np.int64])
def test_out_of_range_positions(rng, pos_dtype):
    """check_positions (the default) raises naming the first bad token with query and key unchanged; without
    it those tokens are normalized but not rotated, and the others are the emulator's."""
    import cupy

    tokens, rows, hs = 3000, 512, 64
    pos_h = rng.integers(0, rows, tokens).astype(pos_dtype)
    pos_h[[2999, 1234, 1500]] = [rows, -1, rows + 7]
    q0, k0 = _random(rng, (tokens, 4, hs), BFLOAT16), _random(rng, (tokens, 1, hs), BFLOAT16)
    qw, kw = _weight(rng, hs, BFLOAT16), _weight(rng, hs, BFLOAT16)
    q, k = cupy.asarray(q0), cupy.asarray(k0)
    cache_h = rope_cache_host(rows, hs).astype(np.float32)
    args = (cupy.asarray(pos_h), q, k, cupy.asarray(qw), cupy.asarray(kw), cupy.asarray(cache_h))
    with pytest.raises(IndexError, match=r"positions\[1234\] = -1 is outside cos_sin_cache's 512 rows"):
        qknorm.qk_norm_rope(*args)
    assert same_bits(q.get(), q0)
    assert same_bits(k.get(), k0)
    qknorm.qk_norm_rope(*args, check_positions=False)
    exact = reference.qk_norm_rope_emulated(pos_h, q0, k0, qw, kw, cache_h)
    assert same_bits(q.get(), exact[0])
    assert same_bits(k.get(), exact[1])
    assert same_bits(q.get()[1234], reference.rms_norm_emulated(q0[1234], qw))


@pytest.mark.gpu
def test_empty_inputs_zero_heads_and_graph_capture(rng):
    import cupy

    cache = rope_cache(16, 64)
    empty = cupy.empty((0, 4, 64), F16)
    assert qknorm.qk_norm_rope(cupy.empty(0, np.int64), empty, None, None, None, cache) is None
    with pytest.raises(IndexError, match=r"positions\[1\] = 99"):
        qknorm.qk_norm_rope(cupy.asarray([0, 99]), cupy.zeros((2, 0, 64), F16), None, None, None, cache)
    q0 = cupy.asarray(_random(rng, (3, 4, 64), F32))
    q, pos = q0.copy(), cupy.asarray([1, 2, 3])
    qknorm.qk_norm_rope(pos, q0.copy(), None, None, None, cache, check_positions=False)  # plan and compile first
    cupy.cuda.Device().synchronize()
    s = cupy.cuda.Stream(non_blocking=True)
    with s:
        s.begin_capture()
        try:
            with pytest.raises(RuntimeError, match="check_positions=False while capturing"):
                qknorm.qk_norm_rope(pos, q, None, None, None, cache)
            qknorm.qk_norm_rope(pos, q, None, None, None, cache, check_positions=False)
        finally:
            graph = s.end_capture()
        graph.launch(s)
        s.synchronize()
    exact = reference.qk_norm_rope_emulated(pos.get(), q0.get(), None, None, None, cache.get())
    assert same_bits(q.get(), exact[0])


@pytest.mark.gpu
def test_gpu_validation_errors_leave_inputs_unchanged(rng):
    import cupy

    qkv = cupy.asarray(_random(rng, (5, 6 * 64), F16))
    before = qkv.copy()
    q, k = qkv[:, : 4 * 64].reshape(5, 4, 64), qkv[:, 4 * 64: 5 * 64].reshape(5, 1, 64)
    w, cache, pos = cupy.ones(64, F16), rope_cache(16, 64), cupy.zeros(5, np.int64)
    bad = [((pos, q, q[:, 1:3], w, w, cache), ValueError, "key overlaps query"),
           ((pos, q, k, qkv[0, :64], w, cache), ValueError, "q_weight overlaps query"),
           ((pos, q, k, w.get(), w, cache), TypeError, "q_weight is a numpy.ndarray"),
           ((pos, q, k, w[:32], w, cache), ValueError, "q_weight has shape"),
           ((pos[:3], q, k, w, w, cache), ValueError, "positions has shape"),
           ((pos, q, k, w, w.astype(F32), cache), TypeError, "k_weight has float32")]
    for args, err, match in bad:
        with pytest.raises(err, match=match):
            qknorm.qk_norm_rope(*args)
        assert bool((qkv == before).all())
    with pytest.raises(ValueError, match="eps=-1"):
        qknorm.qk_norm_rope(pos, q, k, w, w, cache, eps=-1.0)
    assert bool((qkv == before).all())


@pytest.mark.gpu
def test_more_than_2_31_elements(rng):
    """query with 2^31 + 4096 elements: the last token starts at element 2^31. Only a few tokens are filled
    and checked."""
    import cupy

    tokens, nh, hs = 2**31 // (32 * 128) + 1, 32, 128
    free, _ = cupy.cuda.runtime.memGetInfo()
    if free < 6 * 2**30:
        pytest.skip("needs 6 GiB of free GPU memory")
    try:
        q = cupy.zeros((tokens, nh, hs), BFLOAT16)
        check = [0, tokens - 2, tokens - 1]
        q0 = _random(rng, (len(check), nh, hs), BFLOAT16)
        q[check] = cupy.asarray(q0)
        w = _weight(rng, hs, BFLOAT16)
        pos = cupy.zeros(tokens, np.int64)
        pos[check] = cupy.asarray([5, 77, 4095])
        cache_h = rope_cache_host(4096, hs).astype(np.float32)
        qknorm.qk_norm_rope(pos, q, None, cupy.asarray(w), None, cupy.asarray(cache_h), check_positions=False)
        exact = reference.qk_norm_rope_emulated(pos[check].get(), q0, None, w, None, cache_h)
        assert same_bits(q[check].get(), exact[0])
    finally:
        q = pos = None
        cupy.get_default_memory_pool().free_all_blocks()
