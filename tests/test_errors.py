"""Bad inputs to every public function, as one table.

Each row is a call, the exception it must raise and a regex that names the offending argument. For every
row the test checks that the message is one line, that every array the call was given (its whole
allocation, views included) is unchanged bit for bit, and that the CUDA context is still usable: the next
valid call of the same function gives the right answer and the device synchronizes. Rows needing two
GPUs skip on one. ``rope_cache``'s rows touch no array and also run without a GPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest

import cukern

F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
I32, I64 = np.dtype(np.int32), np.dtype(np.int64)


class ReadOnly:
    """A ``__cuda_array_interface__`` producer that marks its memory read-only, as a framework does for a
    buffer nobody may write."""

    def __init__(self, a):
        self.a = a

    @property
    def __cuda_array_interface__(self):
        desc = dict(self.a.__cuda_array_interface__)
        desc["data"] = (desc["data"][0], True)
        return desc


@dataclass(frozen=True)
class Row:
    id: str
    exc: type
    match: str
    make: object  # () -> (function, args, kwargs), building the arrays it needs
    devices: int = 1


def _a(shape, dtype=F32, device=0):
    """Distinct values (so a stray write shows) on ``device``."""
    import cupy

    shape = (shape,) if isinstance(shape, int) else shape
    n = math.prod(shape)
    host = (np.arange(n) % 251 - 125).astype(np.float64) / 8 + 0.25
    with cupy.cuda.Device(device):
        return cupy.asarray(host.astype(dtype).reshape(shape))


def _odd(shape, dtype=F32, offset=2):
    """:func:`_a`'s values ``offset`` bytes past the start of a uint8 allocation: no element at a multiple of
    its item size (made through the host, since CuPy's own kernels cannot write such an array)."""
    import cupy

    good = cupy.asnumpy(_a(shape, dtype))
    raw = np.zeros(good.nbytes + 16, np.uint8)
    raw[offset:offset + good.nbytes] = good.reshape(-1).view(np.uint8)
    return cupy.asarray(raw)[offset:offset + good.nbytes].view(dtype).reshape(good.shape)


MISALIGNED = r"elements are not aligned to its item size"


def _ints(values, dtype=I64):
    import cupy

    return cupy.asarray(np.array(values, dtype))


def _host(shape, dtype=F32):
    return np.ones(shape, dtype)


def _bcast(a, shape):
    import cupy

    return cupy.broadcast_to(a, shape)


def _call(fn, *args, **kwargs):
    return fn, args, kwargs


# ---------------------------------------------------------------------------------------------------------
# The table.


def _rms_rows():
    R = cukern.rms_norm
    x = lambda: _a((4, 64))  # noqa: E731
    rows = [
        ("x None", TypeError, r"\bx\b", lambda: _call(R, None)),
        ("x list", TypeError, r"\bx\b.*got list", lambda: _call(R, [[1.0] * 64])),
        ("x host", TypeError, r"\bx is a numpy", lambda: _call(R, _host((4, 64)))),
        ("x int32", TypeError, r"\bx has dtype int32", lambda: _call(R, _a((4, 64), I32))),
        ("x float64", TypeError, r"\bx has dtype float64", lambda: _call(R, _a((4, 64), F64))),
        ("x 0-d", ValueError, r"\bx\b.*dimension", lambda: _call(R, _a(()))),
        ("x strided last", ValueError, r"\bx's last dimension has stride", lambda: _call(R, _a((64, 4)).T)),
        ("weight host", TypeError, r"weight is a numpy", lambda: _call(R, x(), _host(64))),
        ("weight float16", TypeError, r"weight has dtype float16", lambda: _call(R, x(), _a(64, F16))),
        ("weight 2-d", ValueError, r"weight has shape", lambda: _call(R, x(), _a((1, 64)))),
        ("weight length", ValueError, r"weight has shape \(63,\)", lambda: _call(R, x(), _a(63))),
        ("weight strided", ValueError, r"weight's last dimension has stride 2", lambda: _call(R, x(), _a(128)[::2])),
        ("out host", TypeError, r"out is a numpy", lambda: _call(R, x(), out=_host((4, 64)))),
        ("out shape", ValueError, r"out has shape", lambda: _call(R, x(), out=_a((4, 63)))),
        ("out dtype", TypeError, r"out has dtype", lambda: _call(R, x(), out=_a((4, 64), F16))),
        ("out strided last", ValueError, r"out's last dimension", lambda: _call(R, x(), out=_a((4, 128))[:, ::2])),
        ("out broadcast", ValueError, r"out has a zero stride",
         lambda: _call(R, x(), out=_bcast(_a(64), (4, 64)))),
        ("out read-only", ValueError, r"out is read-only", lambda: _call(R, x(), out=ReadOnly(_a((4, 64))))),
        ("out overlaps x", ValueError, r"out partially overlaps x", lambda: _out_over_x(R)),
        ("out overlaps weight", ValueError, r"out overlaps weight", lambda: _out_over_weight(R)),
        ("x misaligned", ValueError, rf"^x's {MISALIGNED}", lambda: _call(R, _odd((4, 64)))),
        ("weight misaligned", ValueError, rf"^weight's {MISALIGNED}", lambda: _call(R, x(), _odd(64))),
        ("out misaligned", ValueError, rf"^out's {MISALIGNED}", lambda: _call(R, x(), out=_odd((4, 64), offset=1))),
    ]
    for name, bad, exc in [("eps", float("nan"), ValueError), ("eps", float("inf"), ValueError),
                           ("eps", -1e-6, ValueError), ("eps", None, TypeError), ("eps", "1e-6", TypeError),
                           ("offset", float("nan"), ValueError), ("offset", None, TypeError)]:
        rows.append((f"{name}={bad!r}", exc, rf"\b{name}\b", (lambda n, b: lambda: _call(R, x(), **{n: b}))(name, bad)))
    rows += [
        Row("weight on device 1", ValueError, r"weight on device 1", lambda: _call(R, x(), _a(64, device=1)), 2),
        Row("out on device 1", ValueError, r"out on device 1", lambda: _call(R, x(), out=_a((4, 64), device=1)), 2),
    ]
    return rows


def _out_over_x(fn):
    big = _a((5, 64))
    return _call(fn, big[:4], out=big[1:])


def _out_over_weight(fn):
    buf = _a(5 * 64)
    return _call(fn, _a((4, 64)), buf[64:128], out=buf[:256].reshape(4, 64))


def _fused_rows():
    F = cukern.fused_add_rms_norm
    x = lambda: _a((4, 64))  # noqa: E731
    r = lambda: _a((4, 64)) * 0.5  # noqa: E731

    def residual_overlaps_x():
        big = _a((5, 64))
        return _call(F, big[:4], big[1:])

    def residual_is_x():
        a = x()
        return _call(F, a, a)

    def weight_overlaps_residual():
        buf = _a(4 * 64)
        return _call(F, x(), buf.reshape(4, 64), buf[:64])

    def out_overlaps_residual():
        big = _a((5, 64))
        return _call(F, x(), big[:4], out=big[1:])

    rows = [
        ("residual None", TypeError, r"\bresidual\b", lambda: _call(F, x(), None)),
        ("residual host", TypeError, r"residual is a numpy", lambda: _call(F, x(), _host((4, 64)))),
        ("residual float16", TypeError, r"residual has dtype", lambda: _call(F, x(), _a((4, 64), F16))),
        ("residual shape", ValueError, r"residual has shape", lambda: _call(F, x(), _a((4, 65)))),
        ("residual strided last", ValueError, r"residual's last dimension",
         lambda: _call(F, x(), _a((4, 128))[:, ::2])),
        ("residual broadcast", ValueError, r"residual has a zero stride",
         lambda: _call(F, x(), _bcast(_a(64), (4, 64)))),
        ("residual read-only", ValueError, r"residual is read-only", lambda: _call(F, x(), ReadOnly(r()))),
        ("residual overlaps x", ValueError, r"residual overlaps x", residual_overlaps_x),
        ("residual is x", ValueError, r"residual overlaps x", residual_is_x),
        ("weight overlaps residual", ValueError, r"weight.*residual|residual.*weight", weight_overlaps_residual),
        ("out overlaps residual", ValueError, r"out.*residual|residual.*out", out_overlaps_residual),
        ("residual misaligned", ValueError, rf"^residual's {MISALIGNED}", lambda: _call(F, x(), _odd((4, 64)))),
        ("x int32", TypeError, r"\bx has dtype int32", lambda: _call(F, _a((4, 64), I32), _a((4, 64), I32))),
        ("eps=nan", ValueError, r"\beps\b", lambda: _call(F, x(), r(), eps=float("nan"))),
        ("eps=None", TypeError, r"\beps\b", lambda: _call(F, x(), r(), eps=None)),
        ("offset=nan", ValueError, r"\boffset\b", lambda: _call(F, x(), r(), offset=float("nan"))),
        Row("residual on device 1", ValueError, r"residual on device 1",
            lambda: _call(F, x(), _a((4, 64), device=1)), 2),
    ]
    return rows


def _rotary_rows():
    RT = cukern.rotary_embedding
    T = 4

    def args(**over):
        """Valid arguments (4 tokens, 2 query heads, 1 key head, head_size 64), some replaced."""
        import cupy

        a = {"positions": cupy.arange(T, dtype=I64), "query": _a((T, 2, 64)), "key": _a((T, 1, 64)),
             "cos_sin_cache": cukern.rope_cache(16, 64)}
        a.update({k: (v() if callable(v) else v) for k, v in over.items()})
        kw = {k: a.pop(k) for k in list(a) if k not in ("positions", "query", "key", "cos_sin_cache")}
        return _call(RT, a["positions"], a["query"], a["key"], a["cos_sin_cache"], **kw)

    def key_overlaps_query():
        buf = _a((T, 3, 64))
        return args(query=buf[:, 0:2], key=buf[:, 1:2])

    def key_is_query():
        q = _a((T, 2, 64))
        return args(query=q, key=q)

    def positions(values, dtype=I64):
        import cupy

        return lambda: cupy.asarray(np.array(values, dtype))

    rows = [
        ("positions host", TypeError, r"positions is a numpy", lambda: args(positions=np.arange(T))),
        ("query list", TypeError, r"query.*got list", lambda: args(query=[[[1.0] * 64] * 2] * T)),
        ("key host", TypeError, r"key is a numpy", lambda: args(key=_host((T, 1, 64)))),
        ("cache host", TypeError, r"cos_sin_cache is a numpy", lambda: args(cos_sin_cache=_host((16, 64)))),
        ("query 2-d", ValueError, r"query has shape", lambda: args(query=lambda: _a((T, 128)))),
        ("key 2-d", ValueError, r"key has shape", lambda: args(key=lambda: _a((T, 64)))),
        ("query float64", TypeError, r"query has dtype float64",
         lambda: args(query=lambda: _a((T, 2, 64), F64), key=lambda: _a((T, 1, 64), F64))),
        ("key float16", TypeError, r"key has dtype float16", lambda: args(key=lambda: _a((T, 1, 64), F16))),
        ("positions float32", TypeError, r"positions has dtype float32",
         lambda: args(positions=lambda: _a((T,), F32))),
        ("cache float16", TypeError, r"cos_sin_cache has dtype float16",
         lambda: args(cos_sin_cache=lambda: cukern.rope_cache(16, 64, dtype=F16))),
        ("key tokens", ValueError, r"key has 3 tokens", lambda: args(key=lambda: _a((3, 1, 64)))),
        ("key head_size", ValueError, r"key's head_size is 32", lambda: args(key=lambda: _a((T, 1, 32)))),
        ("positions length", ValueError, r"positions has shape", lambda: args(positions=positions(range(T + 1)))),
        ("positions 2-d", ValueError, r"positions has shape",
         lambda: args(positions=lambda: _a((T, 1), I64))),
        ("cache odd width", ValueError, r"cos_sin_cache has odd width 63",
         lambda: args(cos_sin_cache=lambda: _a((16, 63)))),
        ("cache 1-d", ValueError, r"cos_sin_cache has shape", lambda: args(cos_sin_cache=lambda: _a(64))),
        ("rotary_dim odd", ValueError, r"rotary_dim=3", lambda: args(rotary_dim=3)),
        ("rotary_dim 0", ValueError, r"rotary_dim=0", lambda: args(rotary_dim=0)),
        ("rotary_dim over head_size", ValueError, r"rotary_dim=128 is over head_size",
         lambda: args(rotary_dim=128, cos_sin_cache=lambda: cukern.rope_cache(16, 128))),
        ("cache too narrow", ValueError, r"cos_sin_cache has width 32",
         lambda: args(rotary_dim=64, cos_sin_cache=lambda: cukern.rope_cache(16, 32))),
        ("query strided last", ValueError, r"query's last dimension has stride 2",
         lambda: args(query=lambda: _a((T, 2, 128))[..., ::2])),
        ("cache strided last", ValueError, r"cos_sin_cache's last dimension",
         lambda: args(cos_sin_cache=lambda: _a((16, 128))[:, ::2])),
        ("query broadcast", ValueError, r"query has a zero stride",
         lambda: args(query=lambda: _bcast(_a((1, 2, 64)), (T, 2, 64)))),
        ("key overlaps query", ValueError, r"key.*query|query.*key", key_overlaps_query),
        ("key is query", ValueError, r"key.*query|query.*key", key_is_query),
        ("query read-only", ValueError, r"query is read-only", lambda: args(query=lambda: ReadOnly(_a((T, 2, 64))))),
        ("key read-only", ValueError, r"key is read-only", lambda: args(key=lambda: ReadOnly(_a((T, 1, 64))))),
        ("query misaligned", ValueError, rf"^query's {MISALIGNED}", lambda: args(query=lambda: _odd((T, 2, 64)))),
        ("cache misaligned", ValueError, rf"^cos_sin_cache's {MISALIGNED}",
         lambda: args(cos_sin_cache=lambda: _odd((16, 64)))),
        ("positions misaligned", ValueError, rf"^positions' {MISALIGNED}",
         lambda: args(positions=lambda: _odd((T,), I64, offset=4))),
        ("cache None", TypeError, r"cos_sin_cache must be a cupy.ndarray", lambda: args(cos_sin_cache=None)),
        ("position past the cache", IndexError, r"positions\[2\] = 16",
         lambda: args(positions=positions([0, 1, 16, 2]))),
        ("negative position", IndexError, r"positions\[1\] = -1", lambda: args(positions=positions([0, -1, 2, 3]))),
        ("int32 position past the cache", IndexError, r"positions\[3\] = 1000",
         lambda: args(positions=positions([0, 1, 2, 1000], I32))),
        ("zero heads still check positions", IndexError, r"positions\[1\] = 99",
         lambda: args(positions=positions([0, 99, 1, 2]), query=lambda: _a((T, 0, 64)), key=None)),
        Row("key on device 1", ValueError, r"key on device 1", lambda: args(key=lambda: _a((T, 1, 64), device=1)), 2),
    ]
    return rows


REDUCTION_NAMES = ("sum", "mean", "sum_of_squares", "norm", "amax", "amin")


def _reduction_rows(name):
    fn = getattr(cukern, name)
    x = lambda: _a((4, 5))  # noqa: E731
    result = {"sum": F32, "mean": F32, "sum_of_squares": F32, "norm": F32, "amax": F32, "amin": F32}[name]

    def out_overlaps_x():
        buf = _a((4, 5))
        return _call(fn, buf, axis=1, out=buf[:, 0])

    rows = [
        ("x None", TypeError, r"\bx\b", lambda: _call(fn, None)),
        ("x list", TypeError, r"\bx\b.*got list", lambda: _call(fn, [1.0, 2.0])),
        ("x host", TypeError, r"\bx is a numpy", lambda: _call(fn, _host(5))),
        ("axis 2", np.exceptions.AxisError, r"axis 2", lambda: _call(fn, x(), axis=2)),
        ("axis -3", np.exceptions.AxisError, r"axis -3", lambda: _call(fn, x(), axis=-3)),
        ("axis (0, 0)", ValueError, r"axis.*repeats", lambda: _call(fn, x(), axis=(0, 0))),
        ("axis (0, -2)", ValueError, r"axis.*repeats", lambda: _call(fn, x(), axis=(0, -2))),
        ("axis 1.0", TypeError, r"\baxis\b", lambda: _call(fn, x(), axis=1.0)),
        ("axis True", TypeError, r"\baxis\b", lambda: _call(fn, x(), axis=True)),
        ("axis [0]", TypeError, r"\baxis\b", lambda: _call(fn, x(), axis=[0])),
        ("out host", TypeError, r"out is a numpy", lambda: _call(fn, x(), axis=1, out=_host(4, result))),
        ("out shape", ValueError, r"out has shape", lambda: _call(fn, x(), axis=1, out=_a(5, result))),
        ("out overlaps x", ValueError, r"out overlaps x", out_overlaps_x),
        ("out read-only", ValueError, r"out is read-only", lambda: _call(fn, x(), axis=1, out=ReadOnly(_a(4, result)))),
        ("x misaligned", ValueError, rf"^x's {MISALIGNED}", lambda: _call(fn, _odd((4, 5)), axis=1)),
        ("out misaligned", ValueError, rf"^out's {MISALIGNED}", lambda: _call(fn, x(), axis=1, out=_odd(4, result))),
        ("out broadcast", ValueError, r"out has a zero stride",
         lambda: _call(fn, x(), axis=1, out=_bcast(_a(1, result), (4,)))),
        Row("out on device 1", ValueError, r"out on device 1",
            lambda: _call(fn, x(), axis=1, out=_a(4, result, device=1)), 2),
    ]
    # NumPy takes every real input and dtype= target of these; what is left to refuse:
    if name == "norm":
        rows.append(("dtype int32 of floats", TypeError, r"dtype=int32", lambda: _call(fn, x(), dtype=np.int32)))
    if name == "sum_of_squares":
        rows.append(("x complex64", TypeError, r"complex64", lambda: _call(fn, _a(5, np.complex64))))
    if name in ("amax", "amin"):
        rows.append(("empty", ValueError, rf"zero-size.*{name}", lambda: _call(fn, _a((3, 0)), axis=1)))
    return rows


def _rows(prefix, rows):
    out = []
    for r in rows:
        r = r if isinstance(r, Row) else Row(*r)
        out.append(pytest.param(r, id=f"{prefix}: {r.id}"))
    return out


GPU_ROWS = (_rows("rms_norm", _rms_rows()) + _rows("fused_add_rms_norm", _fused_rows())
            + _rows("rotary_embedding", _rotary_rows())
            + [p for n in REDUCTION_NAMES for p in _rows(n, _reduction_rows(n))])

ROPE_ROWS = _rows("rope_cache", [
    ("max_position float", TypeError, r"max_position", lambda: _call(cukern.rope_cache, 8.0, 8)),
    ("max_position 0", ValueError, r"max_position=0", lambda: _call(cukern.rope_cache, 0, 8)),
    ("rotary_dim odd", ValueError, r"rotary_dim=7", lambda: _call(cukern.rope_cache, 16, 7)),
    ("rotary_dim float", TypeError, r"rotary_dim", lambda: _call(cukern.rope_cache, 16, 8.0)),
    ("base 1", ValueError, r"base=1", lambda: _call(cukern.rope_cache, 16, 8, 1.0)),
    ("base nan", ValueError, r"base=nan", lambda: _call(cukern.rope_cache, 16, 8, float("nan"))),
    ("dtype int32", TypeError, r"dtype int32", lambda: _call(cukern.rope_cache, 16, 8, dtype=np.int32)),
    ("scaling not a dict", ValueError, r"scaling", lambda: _call(cukern.rope_cache, 16, 8, scaling="linear")),
    ("scaling type", ValueError, r"scaling", lambda: _call(cukern.rope_cache, 16, 8, scaling={"type": "ntk"})),
    ("scaling lacks factor", ValueError, r"linear scaling needs \['factor'\]",
     lambda: _call(cukern.rope_cache, 16, 8, scaling={"type": "linear"})),
    ("scaling extra key", ValueError, r"does not take \['beta_fast'\]",
     lambda: _call(cukern.rope_cache, 16, 8, scaling={"type": "linear", "factor": 2.0, "beta_fast": 1.0})),
    ("scaling factor 0", ValueError, r"factor", lambda: _call(cukern.rope_cache, 16, 8,
                                                              scaling={"type": "linear", "factor": 0.0})),
    ("llama3 low >= high", ValueError, r"low_freq_factor", lambda: _call(
        cukern.rope_cache, 16, 8, scaling={"type": "llama3", "factor": 8.0, "low_freq_factor": 4.0,
                                           "high_freq_factor": 1.0, "original_max_position": 8})),
    ("dynamic_ntk rotary_dim 2", ValueError, r"rotary_dim", lambda: _call(
        cukern.rope_cache, 16, 2, scaling={"type": "dynamic_ntk", "factor": 2.0, "original_max_position": 8})),
])


# ---------------------------------------------------------------------------------------------------------
# The checks.


def _gpus() -> int:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount()
    except Exception:  # no driver, no device: CuPy raises its runtime error
        return 0


def _root(a):
    while getattr(a, "base", None) is not None:
        a = a.base
    return a


def _arrays(args, kwargs) -> list:
    """The allocations behind every array argument (views and read-only producers unwrapped), once each."""
    import cupy

    found = {}
    for v in list(args) + list(kwargs.values()):
        v = v.a if isinstance(v, ReadOnly) else v
        if isinstance(v, (cupy.ndarray, np.ndarray)):
            root = _root(v)
            found[id(root)] = root
    return list(found.values())


def _bits(a) -> bytes:
    import cupy

    host = cupy.asnumpy(a) if not isinstance(a, np.ndarray) else a
    return np.ascontiguousarray(host).view(np.uint8).tobytes()


def _still_works(name: str) -> None:
    """A valid call of ``name`` gives the right answer, then the device synchronizes."""
    import cupy

    ones = cupy.ones((2, 8), F32)
    if name in ("rms_norm", "fused_add_rms_norm"):
        residual = cupy.zeros_like(ones)
        got = cukern.rms_norm(ones) if name == "rms_norm" else cukern.fused_add_rms_norm(ones, residual)
        np.testing.assert_allclose(cupy.asnumpy(got), 1 / np.sqrt(1 + 1e-6), rtol=1e-6)
    elif name == "rotary_embedding":
        q = cupy.ones((1, 1, 8), F32)
        cukern.rotary_embedding(cupy.zeros(1, I64), q, None, cukern.rope_cache(4, 8))
        assert cupy.asnumpy(q).tolist() == [[[1.0] * 8]]  # position 0: cos 1, sin 0
    elif name == "rope_cache":
        assert cupy.asnumpy(cukern.rope_cache(4, 8))[0].tolist() == [1.0] * 4 + [0.0] * 4
    else:
        want = {"sum": 16.0, "mean": 1.0, "sum_of_squares": 16.0, "norm": 4.0, "amax": 1.0, "amin": 1.0}[name]
        assert float(getattr(cukern, name)(ones)) == want
    cupy.cuda.Device().synchronize()


def _check_row(row: Row, gpu: bool) -> None:
    fn, args, kwargs = row.make()
    arrays = _arrays(args, kwargs)
    before = [_bits(a) for a in arrays]
    with pytest.raises(row.exc, match=row.match) as err:
        fn(*args, **kwargs)
    message = str(err.value)
    assert "\n" not in message, f"the error takes more than one line: {message!r}"
    if gpu:
        import cupy

        cupy.cuda.Device().synchronize()  # a launch that did slip through has finished writing
    for a, bits in zip(arrays, before):
        assert _bits(a) == bits, "an input changed although the call raised"
    if gpu:
        _still_works(fn.__name__)


@pytest.mark.gpu
@pytest.mark.parametrize("row", GPU_ROWS)
def test_bad_input(row):
    if _gpus() < row.devices:
        pytest.skip(f"needs {row.devices} GPUs")
    _check_row(row, gpu=True)


@pytest.mark.parametrize("row", ROPE_ROWS)
def test_bad_rope_cache_arguments(row):
    """Raised while the cache is still on the host: no GPU needed, and none is touched."""
    _check_row(row, gpu=_gpus() > 0)


@pytest.mark.gpu
def test_read_only_producers_are_accepted_as_inputs():
    """Read-only memory is refused only where an op writes: every op reads it."""
    import cupy

    x = _a((4, 64))
    want = cupy.asnumpy(cukern.rms_norm(x))
    assert _bits(cukern.rms_norm(ReadOnly(x), ReadOnly(cupy.ones(64, F32)))) == _bits(want)
    residual = _a((4, 64))
    cukern.fused_add_rms_norm(ReadOnly(x), residual, ReadOnly(cupy.ones(64, F32)))
    q = _a((4, 2, 64))
    cukern.rotary_embedding(ReadOnly(cupy.arange(4, dtype=I64)), q, None, ReadOnly(cukern.rope_cache(8, 64)))
    for name in REDUCTION_NAMES:
        assert _bits(getattr(cukern, name)(ReadOnly(x), axis=1)) == _bits(getattr(cukern, name)(x, axis=1))
    cupy.cuda.Device().synchronize()


@pytest.mark.gpu
@pytest.mark.parametrize("name, call", [
    ("x", lambda: cukern.argmax(_odd((4, 5)), axis=1)),
    ("out", lambda: cukern.argmin(_a((4, 5)), axis=1, out=_odd(4, I64, offset=4))),
    ("x", lambda: cukern.nanargmax(_odd(7))),
    ("x", lambda: cukern.cumsum(_odd((4, 5)), axis=0)),
    ("out", lambda: cukern.cumprod(_a(9), out=_odd(9, F32, offset=1))),
    ("x", lambda: cukern.segment_sum(_odd((6, 3)), _ints([0, 2, 6], I32))),
    ("offsets", lambda: cukern.segment_max(_a((6, 3)), _odd(3, I64, offset=4))),
    ("x", lambda: cukern.var(_odd((4, 5), np.complex64, offset=4), axis=0)),
    ("x", lambda: cukern.logsumexp(_odd((4, 5), F64, offset=4), axis=1)),
    ("x", lambda: cukern.count_nonzero(_odd(9, np.float16, offset=1))),
    ("q_weight", lambda: cukern.qk_norm_rope(_ints([0] * 4), _a((4, 2, 64)), None, _odd(64), None,
                                             cukern.rope_cache(16, 64))),
    ("query", lambda: cukern.rotary_embedding_positions(_ints([0] * 4), _odd((4, 2, 64)), None, rotary_dim=64)),
])
def test_misaligned_arrays_are_refused_by_every_op(name, call):
    """Elements off their item size would be misaligned loads, which end the CUDA context: every op refuses
    them first, in one line naming the array, and the device goes on working."""
    import cupy

    with pytest.raises(ValueError, match=rf"^{name}'s? {MISALIGNED}") as err:
        call()
    assert "\n" not in str(err.value)
    cupy.cuda.Device().synchronize()
    assert int(cukern.argmax(cupy.arange(5.0))) == 4
