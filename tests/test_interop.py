"""Arrays from anywhere: __cuda_array_interface__ parsing (pure, from fake producers), DLPack dispatch, and on
a GPU every op fed PyTorch tensors and interface-only producers, zero-copy, writing into the caller's memory,
in stream order."""

import gc
import time
import weakref
from types import SimpleNamespace

import numpy as np
import pytest

from _support import unread_cupy_array

from cukern import _interop
from cukern._interop import parse_cuda_array_interface as parse
from cukern._dtypes import BFLOAT16


def cai(**over):
    desc = {"version": 3, "shape": (4, 8), "typestr": "<f4", "data": (0x10000, False), "strides": None}
    desc.update(over)
    return {k: v for k, v in desc.items() if v is not ...}


class Producer:
    """An array known only through __cuda_array_interface__."""

    def __init__(self, desc):
        self.desc = desc

    @property
    def __cuda_array_interface__(self):
        return self.desc


# ------------------------------------------------------------------------------------------ parsing (CPU)


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_parse_every_version(version):
    r = parse(cai(version=version))
    assert (r.ptr, r.shape, r.dtype, r.strides, r.readonly, r.version) == (0x10000, (4, 8), np.float32, None,
                                                                          False, version)
    assert (r.offset, r.nbytes) == (0, 4 * 8 * 4)


@pytest.mark.parametrize("typestr, dtype", [("<f2", np.float16), ("<f4", np.float32), ("<f8", np.float64),
                                            ("<i4", np.int32), ("<i8", np.int64), ("|b1", np.bool_),
                                            ("|u1", np.uint8), ("|i1", np.int8)])
def test_parse_typestrs(typestr, dtype):
    assert parse(cai(typestr=typestr)).dtype == np.dtype(dtype)


def test_void_typestr_points_to_dlpack():
    with pytest.raises(TypeError, match="__dlpack__"):
        parse(cai(typestr="<V2"))


@pytest.mark.parametrize("typestr, words", [(">f4", "big-endian"), ("|O8", "not a number type"),
                                            ("<U4", "not a number type"), ("<q9", "not a dtype")])
def test_unsupported_typestrs(typestr, words):
    with pytest.raises(TypeError, match=words):
        parse(cai(typestr=typestr), "x")


def test_strides_and_extent():
    r = parse(cai(shape=(3, 5), strides=(40, 4)))
    assert r.strides == (40, 4) and (r.offset, r.nbytes) == (0, 2 * 40 + 4 * 4 + 4)
    r = parse(cai(shape=(3, 5), strides=(-20, 4)))  # rows reversed: memory starts two rows below ptr
    assert (r.offset, r.nbytes) == (40, 40 + 16 + 4)


def test_zero_size_arrays_may_have_no_pointer():
    for data in ((0, False), (None, False)):
        r = parse(cai(shape=(0, 8), data=data))
        assert (r.ptr, r.nbytes) == (0, 0)


def test_stream_key():
    assert parse(cai(stream=7)).stream == 7
    assert parse(cai(stream=None)).stream is None
    assert parse(cai()).stream is None
    assert parse(cai(version=2, stream=7)).stream is None  # only version 3 defines it
    with pytest.raises(ValueError, match="stream 0"):
        parse(cai(stream=0))


@pytest.mark.parametrize("over, error, words", [
    ({"mask": object()}, TypeError, "masked"),
    ({"version": 4}, ValueError, "versions 0 to 3"),
    ({"typestr": ...}, ValueError, "lacks typestr"),
    ({"strides": (4,)}, ValueError, "strides"),
    ({"strides": (32, 2)}, ValueError, "multiples of its itemsize"),
    ({"shape": (4, True)}, ValueError, "tuple of ints"),
    ({"shape": (4, -1)}, ValueError, "negative"),
    ({"data": (0, False)}, ValueError, "null data pointer"),
    ({"data": 0x10000}, ValueError, "pointer, read_only"),
    ({"stream": "s"}, ValueError, "stream"),
])
def test_broken_interfaces_are_named(over, error, words):
    with pytest.raises(error, match=words) as info:
        parse(cai(**over), "query")
    assert "query" in str(info.value)


def test_not_a_dict():
    with pytest.raises(ValueError, match="dict"):
        parse([1, 2], "x")


# ------------------------------------------------------------------------------------- as_array (CPU)


@pytest.fixture
def fake_device(monkeypatch):
    """Device lookups and stream waits answered without a GPU; returns the waits asked for."""
    waits = []
    monkeypatch.setattr(_interop, "_pointer_device", lambda ptr: 0)
    monkeypatch.setattr(_interop, "_wait_for_stream", lambda stream, device: waits.append((stream, device)))
    return waits


def test_as_array_views_the_producers_memory(fake_device):
    x = _interop.as_array(Producer(cai(shape=(3, 5), strides=(-20, 4), data=(0x20028, False))), "x")
    assert (x.shape, x.strides, x.dtype, x.data.ptr, x.data.device_id) == ((3, 5), (-20, 4), np.float32,
                                                                           0x20028, 0)


def test_as_array_keeps_the_producer_alive(fake_device):
    producer = Producer(cai())
    ref = weakref.ref(producer)
    x = _interop.as_array(producer, "x")
    del producer
    gc.collect()
    assert ref() is not None
    del x
    gc.collect()
    assert ref() is None


def test_as_array_asks_for_the_device_of_the_memory(monkeypatch):
    asked = []
    monkeypatch.setattr(_interop, "_pointer_device", lambda ptr: asked.append(ptr) or 1)
    x = _interop.as_array(Producer(cai(shape=(2, 3), strides=(-12, 4), data=(0x3000C, False), version=2)), "x")
    assert asked == [0x30000] and x.data.device_id == 1


def test_as_array_waits_on_the_producers_stream(fake_device, monkeypatch):
    _interop.as_array(Producer(cai(stream=7)), "x")
    _interop.as_array(Producer(cai()), "x")
    _interop.as_array(Producer(cai(version=2, stream=9)), "x")
    assert fake_device == [(7, 0)]
    monkeypatch.setattr(_interop, "_SYNC", False)
    _interop.as_array(Producer(cai(stream=7)), "x")
    assert fake_device == [(7, 0)]


def test_as_array_refuses_read_only_memory_it_would_write(fake_device):
    producer = Producer(cai(data=(0x10000, True)))
    assert _interop.as_array(producer, "key").shape == (4, 8)
    with pytest.raises(ValueError, match="key is read-only"):
        _interop.as_array(producer, "key", writable=True)


def test_as_array_refuses_host_and_unknown_objects():
    with pytest.raises(TypeError, match=r"cupy.asarray\(x\)"):
        _interop.as_array(np.zeros(3), "x")
    with pytest.raises(TypeError, match="must be a cupy.ndarray"):
        _interop.as_array([1.0, 2.0], "weight")


class DLPackProducer:
    def __init__(self, device_type):
        self.device_type = device_type

    def __dlpack__(self, stream=None):
        raise AssertionError("cupy.from_dlpack is stubbed in these tests")

    def __dlpack_device__(self):
        return (self.device_type, 0)


def test_dlpack_from_host_memory_is_refused():
    with pytest.raises(TypeError, match="x is not in CUDA device memory: it is in CPU memory"):
        _interop.as_array(DLPackProducer(1), "x")


@pytest.mark.parametrize("device_type", [2, 13])  # CUDA, CUDA managed
def test_dlpack_is_preferred_and_goes_to_cupy(monkeypatch, device_type):
    import cupy

    class Both(DLPackProducer):
        __cuda_array_interface__ = property(lambda self: pytest.fail("DLPack should have been used"))

    seen = []
    memory = cupy.cuda.UnownedMemory(1 << 32, 8, None, device_id=0)  # never read: no GPU needed
    array = cupy.ndarray((2,), np.float32, cupy.cuda.MemoryPointer(memory, 0))
    monkeypatch.setattr(cupy, "from_dlpack", lambda obj: seen.append(obj) or array)
    producer = Both(device_type)
    assert _interop.as_array(producer, "x") is array and seen == [producer]


def test_attribute_errors_mean_no_interface():
    class CPUTensor:
        @property
        def __cuda_array_interface__(self):
            raise AttributeError("non-CUDA tensor")

    with pytest.raises(TypeError, match="must be a cupy.ndarray"):
        _interop.as_array(CPUTensor(), "x")


def test_stream_wait_logic(monkeypatch):
    """Same stream and legacy-vs-null: nothing; another stream: record there, wait here; capturing: nothing."""
    log = []

    class Stream:
        def __init__(self, ptr, capturing=False):
            self.ptr, self.capturing = ptr, capturing

        def is_capturing(self):
            return self.capturing

        def wait_event(self, event):
            log.append(("wait", self.ptr, event.ptr))

    class Event:
        def __init__(self, **kwargs):
            self.ptr = 0xE0

    class Device:
        def __init__(self, device):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    current = [Stream(0)]
    fake = SimpleNamespace(cuda=SimpleNamespace(
        get_current_stream=lambda: current[0], Event=Event, Device=Device,
        runtime=SimpleNamespace(eventRecord=lambda event, stream: log.append(("record", stream, event)))))
    monkeypatch.setattr(_interop, "_cupy", lambda: fake)
    monkeypatch.setattr(_interop, "_events", SimpleNamespace())
    _interop._wait_for_stream(1, 0)  # legacy default stream is CuPy's null stream
    assert log == []
    _interop._wait_for_stream(5, 0)
    assert log == [("record", 5, 0xE0), ("wait", 0, 0xE0)]
    current[0] = Stream(5)
    _interop._wait_for_stream(5, 0)
    current[0] = Stream(6, capturing=True)
    _interop._wait_for_stream(5, 0)
    assert len(log) == 2


# ------------------------------------------------------------------------------------------------- GPU

import cukern  # noqa: E402


@pytest.fixture
def torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch without CUDA")
    return torch


def bits(a):
    """An array's raw bits, for exact comparisons of any float type."""
    import cupy

    a = _interop.as_array(a, "a")
    return cupy.ascontiguousarray(a).view(np.dtype(f"u{a.itemsize}"))


def same(a, b) -> bool:
    import cupy

    return a.shape == b.shape and bool(cupy.array_equal(bits(a), bits(b)))


def cupy_copy(t):
    """A CuPy copy of a torch tensor's values (same dtype, contiguous)."""
    import cupy

    return cupy.array(_interop.as_array(t, "t"), copy=True)


TORCH_DTYPES = ["float16", "bfloat16", "float32"]
HIDDEN = 256


def _views(strided):
    # A strided view keeps unit last stride: every other row block of a wider buffer.
    return (lambda a: a[:, HIDDEN:]) if strided else (lambda a: a)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", TORCH_DTYPES)
@pytest.mark.parametrize("strided", [False, True])
def test_rms_norm_torch(torch, dtype, strided):
    t = getattr(torch, dtype)
    view = _views(strided)
    base = torch.randn(37, 2 * HIDDEN if strided else HIDDEN, device="cuda").to(t)
    w = torch.randn(HIDDEN, device="cuda").to(t)
    x = view(base)
    xa = _interop.as_array(x, "x")
    assert xa.data.ptr == x.data_ptr() and xa.dtype == (BFLOAT16 if dtype == "bfloat16" else np.dtype(dtype))
    ref = cukern.rms_norm(view(cupy_copy(base)), cupy_copy(w))
    assert same(cukern.rms_norm(x, w), ref)
    out = torch.empty_like(x)
    assert cukern.rms_norm(x, w, out=out).data.ptr == out.data_ptr()
    assert same(out, ref)
    cukern.rms_norm(x, w, out=x)  # in place, into the torch tensor
    assert same(x, ref)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", TORCH_DTYPES)
@pytest.mark.parametrize("strided", [False, True])
def test_fused_add_rms_norm_torch(torch, dtype, strided):
    t = getattr(torch, dtype)
    view = _views(strided)
    width = 2 * HIDDEN if strided else HIDDEN
    xb, rb = torch.randn(19, width, device="cuda").to(t), torch.randn(19, width, device="cuda").to(t)
    w = torch.randn(HIDDEN, device="cuda").to(torch.float32)
    cx, cr = cupy_copy(xb), cupy_copy(rb)
    ref = cukern.fused_add_rms_norm(view(cx), view(cr), cupy_copy(w))
    cukern.fused_add_rms_norm(view(xb), view(rb), w, out=view(xb))
    assert same(view(xb), ref) and same(view(rb), view(cr))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", TORCH_DTYPES)
def test_rotary_torch(torch, dtype):
    t = getattr(torch, dtype)
    tokens, heads, kv, dim = 13, 4, 2, 64
    qkv = torch.randn(tokens, heads + 2 * kv, dim, device="cuda").to(t)
    positions = torch.randint(0, 100, (tokens,), device="cuda")
    cache = cukern.rope_cache(100, dim)
    ref = cupy_copy(qkv)
    cukern.rotary_embedding(cupy_copy(positions), ref[:, :heads], ref[:, heads:heads + kv], cache)
    cukern.rotary_embedding(positions, qkv[:, :heads], qkv[:, heads:heads + kv], cache)  # views of a fused qkv
    assert same(qkv, ref)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", TORCH_DTYPES)
@pytest.mark.parametrize("op", ["sum", "mean", "amax", "amin", "norm", "sum_of_squares"])
def test_reductions_torch(torch, dtype, op):
    t = getattr(torch, dtype)
    base = torch.randn(33, 2 * HIDDEN, device="cuda").to(t)
    x, cx = base[:, ::2], cupy_copy(base)[:, ::2]  # a strided view with a non-unit last stride
    fn = getattr(cukern, op)
    for axis in (None, 0, -1):
        assert same(fn(x, axis=axis), fn(cx, axis=axis))
    out = torch.empty(33, device="cuda").to(t)
    fn(x, axis=-1, out=out)
    assert same(out, fn(cx, axis=-1))


@pytest.mark.gpu
def test_torch_cpu_tensors_and_grad_tensors_are_refused(torch):
    with pytest.raises(TypeError, match="CPU"):
        cukern.rms_norm(torch.ones(2, 8))
    with pytest.raises((RuntimeError, BufferError), match="grad"):
        cukern.rms_norm(torch.ones(2, 8, device="cuda", requires_grad=True))


class InterfaceOnly:
    """A CuPy array seen only through __cuda_array_interface__, optionally naming a producer stream."""

    def __init__(self, a, stream=None):
        self.a, self.stream = a, stream

    @property
    def __cuda_array_interface__(self):
        desc = dict(self.a.__cuda_array_interface__)
        desc["stream"] = self.stream
        return desc


@pytest.mark.gpu
def test_interface_only_producers_for_every_op():
    import cupy

    rng = cupy.random.default_rng(1)
    x = rng.standard_normal((9, 128), dtype=cupy.float32)
    w = rng.standard_normal(128, dtype=cupy.float32)
    assert same(cukern.rms_norm(InterfaceOnly(x), InterfaceOnly(w)), cukern.rms_norm(x, w))
    assert same(cukern.sum(InterfaceOnly(x), axis=-1), cukern.sum(x, axis=-1))
    q = rng.standard_normal((9, 2, 64), dtype=cupy.float32)
    ref = q.copy()
    pos = cupy.arange(9)
    cache = cukern.rope_cache(16, 64)
    cukern.rotary_embedding(pos, ref, None, cache)
    cukern.rotary_embedding(InterfaceOnly(pos), InterfaceOnly(q), None, InterfaceOnly(cache))
    assert same(q, ref)


def _busy(stream, ms_guess: float = 30.0):
    """Queue GPU work on ``stream`` lasting tens of milliseconds (a 256 MiB buffer rewritten many times)."""
    import cupy

    with stream:
        buf = cupy.ones(64 * 2**20, dtype=cupy.float32)
        for _ in range(int(ms_guess / 0.15)):
            buf *= 1.0
    return buf


@pytest.mark.gpu
def test_named_producer_stream_is_waited_on_without_host_sync():
    import cupy

    producer, consumer = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)
    x = cupy.zeros(1 << 20, dtype=cupy.float32)
    cupy.cuda.Device().synchronize()  # the streams below do not wait for the null stream
    with consumer:
        cukern.sum(InterfaceOnly(x, stream=producer.ptr))  # compiled and planned before the timed call
    consumer.synchronize()
    keep = _busy(producer)
    with producer:
        x.fill(2.0)  # lands only after the busy work
    with consumer:
        t0 = time.perf_counter()
        total = cukern.sum(InterfaceOnly(x, stream=producer.ptr))
        host = time.perf_counter() - t0
        assert not producer.done, "the producer finished too soon for this test to mean anything"
        consumer.synchronize()
    assert float(total) == 2.0 * x.size
    assert host < 0.01
    del keep


@pytest.mark.gpu
def test_device_one_arrays_launch_there_and_mixing_raises(torch):
    import cupy

    if cupy.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs two GPUs")
    x1 = torch.randn(4, 128, device="cuda:1")
    with cupy.cuda.Device(0):
        y = cukern.rms_norm(x1)
        s = cukern.sum(x1)
        q = torch.randn(3, 2, 64, device="cuda:1")
        with cupy.cuda.Device(1):
            cache = cukern.rope_cache(8, 64)
        cukern.rotary_embedding(torch.arange(3, device="cuda:1"), q, None, cache)
    assert y.device.id == 1 and s.device.id == 1
    with cupy.cuda.Device(1):
        assert same(y, cukern.rms_norm(cupy_copy(x1)))
    w0 = torch.ones(128, device="cuda:0")
    with pytest.raises(ValueError, match="different devices"):
        cukern.rms_norm(x1, w0)


# ------------------------------------------------------------------------ item alignment, every op (CPU)


def _at(offset, shape, dtype=np.float32):
    return unread_cupy_array(shape, dtype, offset)


@pytest.mark.parametrize("name, call", [
    ("x", lambda C: C.cumsum(_at(1, (4, 5)), axis=1)),
    ("x", lambda C: C.segment_sum(_at(2, (4, 5)), _at(0, (3,), np.int32))),
    ("offsets", lambda C: C.segment_sum(_at(0, (4, 5)), _at(4, (3,), np.int64))),
    ("x", lambda C: C.rms_norm(_at(1, (4, 64)))),
    ("out", lambda C: C.rms_norm(_at(0, (4, 64)), out=_at(2, (4, 64)))),
    ("query", lambda C: C.rotary_embedding(_at(0, (4,), np.int64), _at(3, (4, 2, 64)), None, _at(0, (16, 64)))),
    ("positions", lambda C: C.rotary_embedding(_at(4, (4,), np.int64), _at(0, (4, 2, 64)), None, _at(0, (16, 64)))),
    ("q_weight", lambda C: C.qk_norm_rope(_at(0, (4,), np.int64), _at(0, (4, 2, 64)), None, _at(2, (64,)), None,
                                          _at(0, (16, 64)))),
    ("query", lambda C: C.rotary_embedding_positions(_at(0, (4,), np.int64), _at(2, (4, 2, 64)), None,
                                                     rotary_dim=64)),
])
def test_arrays_off_their_item_size_are_refused_before_the_gpu(name, call):
    """An element not at a multiple of its item size (bytes viewed at an odd offset) would be a misaligned
    load, a fault that ends the CUDA context: refused first, naming the array (and no GPU is touched)."""
    import cukern

    with pytest.raises(ValueError, match=rf"^{name}'s? elements are not aligned to its item size"):
        call(cukern)


def test_item_alignment_is_the_address_and_every_stride_that_steps():
    from cukern._layout import item_aligned

    assert item_aligned(256, (3, 4), (16, 4), 4) and not item_aligned(258, (3, 4), (16, 4), 4)
    assert not item_aligned(256, (3, 4), (18, 4), 4) and item_aligned(256, (1, 4), (18, 4), 4)  # a row: no step
    assert item_aligned(257, (0, 4), (16, 4), 4)  # nothing to load
    assert not item_aligned(264, (2,), (16,), 16)  # complex128 8 bytes off: CuPy's complex<double> is 16-aligned
