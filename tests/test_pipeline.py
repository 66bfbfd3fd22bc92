"""Ops in real pipelines: host overhead, streams, no hidden synchronization, CUDA-graph capture and replay,
thread-safe first compilation. The measurement helpers are checked on the CPU with stand-ins."""

import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

import cukern
from cukern import _compile, qknorm, rmsnorm, rotary
from cukern._dtypes import BFLOAT16
from cukern.lab import pipeline
from cukern.timing import Timing


def test_host_overhead_times_each_call_and_drains_the_queue():
    calls, syncs = [], []

    def fn(a, b=0):
        calls.append((a, b))
        time.sleep(0.0002)

    medians = pipeline.host_overhead_rounds(fn, 1, b=2, n=50, rounds=2, warmup=5, sync_every=20,
                                            sync=lambda: syncs.append(len(calls)))
    assert len(calls) == 105 and calls[0] == (1, 2)
    assert syncs == [5, 25, 45, 55, 75, 95, 105]  # after the warm-up, every 20 calls and after each round
    assert len(medians) == 2 and all(150 < us < 20000 for us in medians)


def test_host_overhead_is_the_quietest_round():
    delays = iter([0.002] * 3 + [0.0002] * 3)  # a slow round, then a quiet one
    us = pipeline.host_overhead(lambda: time.sleep(next(delays)), n=3, rounds=2, warmup=0, sync=lambda: None)
    assert 150 < us < 1500


def test_host_overhead_needs_calls():
    with pytest.raises(ValueError):
        pipeline.host_overhead(lambda: None, n=0, sync=lambda: None)
    with pytest.raises(ValueError):
        pipeline.host_overhead(lambda: None, rounds=0, sync=lambda: None)


def test_per_call_divides_every_time():
    t = Timing(median_us=8.0, min_us=4.0, max_us=16.0, p20_us=6.0, p80_us=10.0, repeat=100)
    p = pipeline.per_call(t, 4, bytes_moved=1000)
    assert (p.median_us, p.min_us, p.max_us, p.p20_us, p.p80_us, p.repeat) == (2.0, 1.0, 4.0, 1.5, 2.5, 100)
    assert p.gbps == 1000 / (2.0 * 1e3)


def test_graph_replay_time_needs_calls():
    with pytest.raises(ValueError):
        pipeline.graph_replay_time(lambda: None, calls=0)


def test_the_families_register_the_decode_step_in_the_records_order():
    calls = pipeline.CALLS
    assert [c.op for c in calls] == ["rms_norm", "fused_add_rms_norm", "rotary_embedding"]
    assert [(c.op, c.impl, c.shape, c.dtype) for c in pipeline.HOST_CALLS] == [
        ("host_overhead", "cukern", (1, 4096), "bfloat16"), ("host_overhead_out", "cukern", (1, 4096), "bfloat16"),
        ("host_overhead_rotary", "cukern", (1, 32, 128), "bfloat16"),
        ("host_overhead_rotary_checked", "cukern", (1, 32, 128), "bfloat16"),
        ("host_overhead_sum", "cukern", (4096,), "float32"), ("host_overhead_sum", "cupy", (4096,), "float32"),
        ("host_overhead_qk_norm_rope", "cukern", (1, 32, 128), "bfloat16"),
        ("host_overhead_argmax", "cukern", (4096,), "float32"), ("host_overhead_argmax", "cupy", (4096,), "float32"),
        ("host_overhead_cumsum", "cukern", (4096,), "float32"), ("host_overhead_cumsum", "cupy", (4096,), "float32")]
    assert calls[0].bytes(8) == rmsnorm.bytes_moved((8, 4096), BFLOAT16, BFLOAT16)
    assert calls[1].bytes(8) == rmsnorm.bytes_moved((8, 4096), BFLOAT16, BFLOAT16, fused=True)
    assert calls[2].bytes(64) == rotary.bytes_moved(64, 32, 8, 128, BFLOAT16)


def test_records_have_the_documented_form(monkeypatch):
    def fn(*args, **kwargs):
        return None

    call = pipeline.DecodeCall("op", shape=lambda t: (t, 16), bytes=lambda t: 1000 * t,
                               make=lambda t: (fn, (t,), {"k": 1}))
    monkeypatch.setattr(pipeline, "CALLS", [call, pipeline.DecodeCall("plain", lambda t: (t,), lambda t: t,
                                                                      lambda t: (fn, (), {}))])
    monkeypatch.setattr(pipeline, "HOST_CALLS", [
        pipeline.HostCall("host_op", "cukern", (1, 16), lambda: (fn, (1,), {})),
        pipeline.HostCall("host_op_out", "cukern", (1, 16), lambda: (fn, (1,), {"out": 2}))])
    peers = [pipeline.HostCall("host_op", "absent-peer", (1, 16), lambda: None),  # cannot run here: no record
             pipeline.HostCall("host_op", "peer", (1, 16), lambda: (fn, (), {"p": 3}))]
    timed = []

    def graph_replay_time(f, *args, calls, warmup, repeat, bytes_moved, **kwargs):
        timed.append((args, kwargs, calls, bytes_moved))
        return Timing(median_us=2.0, min_us=1.0, max_us=3.0, p20_us=1.5, p80_us=2.5, repeat=repeat,
                      bytes_moved=bytes_moved)

    hosts = []
    monkeypatch.setattr(pipeline, "host_overhead", lambda f, *args, n, **kwargs: hosts.append(kwargs) or 12.34567)
    monkeypatch.setattr(pipeline, "graph_replay_time", graph_replay_time)
    records = pipeline.records(1000.0, repeat=7, warmup=1, n=10, peers=peers)
    assert records[:3] == [{"op": op, "impl": impl, "shape": [1, 16], "dtype": "bfloat16", "median_us": 12.346}
                           for op, impl in (("host_op", "cukern"), ("host_op_out", "cukern"), ("host_op", "peer"))]
    assert hosts == [{}, {"out": 2}, {"p": 3}]
    graphs = records[3:]
    assert [(r["op"], r["shape"]) for r in graphs] == [
        (op, shape) for t in pipeline.DECODE_TOKENS for op, shape in (("op", [t, 16]), ("plain", [t]))]
    assert graphs[0] == {"op": "op", "impl": "cukern-graph", "shape": [1, 16], "dtype": "bfloat16", "median_us": 2.0,
                         "gbps": 0.5, "pct_of_peak": 0.1}
    assert timed[0] == ((1,), {"k": 1}, 8, 1000)


# -------------------------------------------------------------------- the cached host path, with stand-ins


class Arr:
    """What the host path reads of a device array. ``Arr(shape, dtype)`` is also the allocation the ops make
    (on the device current then); ``values`` are a positions array's host values, which the stand-in check
    kernel reads."""

    def __init__(self, shape, dtype=np.float32, ptr=1 << 20, device=None, values=None):
        self.dtype = np.dtype(dtype)
        self.shape, self.itemsize = tuple(shape), self.dtype.itemsize
        self.ndim, self.size = len(self.shape), int(np.prod(self.shape))
        self.strides = tuple(int(s) * self.itemsize for s in np.cumprod((1,) + self.shape[:0:-1])[::-1])
        device = _Fake.current if device is None else device
        self.data = SimpleNamespace(ptr=ptr, device_id=device)
        self.device = SimpleNamespace(id=device)
        self.values = values
        _Fake.allocations.append(device)


class _Fake:
    """The device side of the host path: the current device, allocations, launches, stream events."""

    current = 0
    allocations: list = []


@pytest.fixture
def fake_gpu(monkeypatch):
    """The ops' host path with the GPU replaced: arrays are :class:`Arr`, kernels record their launches (the
    position check writes its answer into its pinned pair, as the kernel does: while it is launched, or with
    ``answer_late`` set only once the stream is waited for, as a check queued behind other work), the stream
    records waits."""
    import cupy

    from cukern import _interop, _launch, _tuned
    from cukern._launch import CallCache

    _Fake.current, _Fake.allocations = 0, []
    events, pinned, queued = [], {}, []

    def synchronize():
        events.append(("sync", _Fake.current))
        while queued:
            queued.pop(0)()

    stream = SimpleNamespace(ptr=0, capturing=False, is_capturing=lambda: stream.capturing, synchronize=synchronize)
    fake = SimpleNamespace(answer_late=False, events=events, pinned=pinned, stream=stream)

    class Device:
        def __init__(self, device):
            self.device = device

        def __enter__(self):
            self.before, _Fake.current = _Fake.current, self.device

        def __exit__(self, *exc):
            _Fake.current = self.before

    class Pinned(bytearray):  # PinnedMemoryPointer: a buffer with an address
        def __init__(self, mem, offset):
            super().__init__(mem[0])
            self.ptr = 0x7F0000000000 + 64 * len(pinned)
            pinned[self.ptr] = (self, mem[1])

    def launch(kernel, config, args, signature=None):
        events.append((kernel, _Fake.current))
        if kernel == "check":  # the kernel's answer: the first bad token (or tokens), its position
            address, positions, params = args
            bad = [t for t, p in enumerate(positions.values) if not 0 <= p < params["cache_rows"]]
            first = bad[0] if bad else params["tokens"]
            answer = (first, positions.values[first] if bad else 0)

            def write():
                np.frombuffer(pinned[int(address)][0], np.int64)[:] = answer

            if fake.answer_late:
                queued.append(write)
            else:
                write()

    class Prepared:  # a prepared launch (rms_norm's single launch): the event when it is called
        def __init__(self, kernel, config, args, slots):
            self.kernel = kernel

        def __call__(self, stream, *addresses):
            events.append((self.kernel, _Fake.current))

    cuda = SimpleNamespace(get_current_stream=lambda: stream, PinnedMemory=lambda size, flags: (size, flags),
                           PinnedMemoryPointer=Pinned,
                           runtime=SimpleNamespace(hostAllocPortable=1, hostAllocMapped=2))
    fake_cupy = SimpleNamespace(ndarray=Arr, cuda=cuda)
    monkeypatch.setattr(_interop, "_cupy", lambda: fake_cupy)
    monkeypatch.setattr(_launch, "_runtime", SimpleNamespace(getDevice=lambda: _Fake.current))
    monkeypatch.setattr(cupy.cuda, "Device", Device)
    for op in (rmsnorm, rotary):
        monkeypatch.setattr(op, "_cupy", lambda: fake_cupy)
        monkeypatch.setattr(op, "_calls", CallCache())
        monkeypatch.setattr(op, "sm_count", lambda device: 132)
        monkeypatch.setattr(op, "launch", launch)
        monkeypatch.setattr(op, "struct_argument", lambda struct: struct)
    monkeypatch.setattr(rmsnorm, "Prepared", Prepared)
    monkeypatch.setattr(rmsnorm, "get_kernel", lambda inst: SimpleNamespace(kernel="rms_norm"))
    monkeypatch.setattr(rotary, "get_kernel", lambda inst: SimpleNamespace(
        kernel="check" if inst.name == "rotary_first_bad_position" else "rotate"))
    monkeypatch.setattr(rotary, "_found", threading.local())
    lookups = []
    real_lookup = _tuned.lookup
    monkeypatch.setattr(_tuned, "lookup", lambda *args: lookups.append(args[2:]) or real_lookup(*args))
    monkeypatch.setattr(_tuned, "_enabled", False)  # no cache file is read
    fake.lookups = lookups
    return fake


def test_a_cached_call_looks_nothing_up_until_the_tuning_cache_changes(fake_gpu):
    from cukern import _tuned

    x, w, out = Arr((2, 64)), Arr((64,), ptr=1 << 24), Arr((2, 64), ptr=1 << 26)
    for _ in range(3):
        assert rmsnorm.rms_norm(x, w, out=out) is out
    assert len(fake_gpu.lookups) == 1 and len(fake_gpu.events) == 3
    _tuned.forget_resolved()  # the tuner saved new winners
    rmsnorm.rms_norm(x, w, out=out)
    with _tuned.heuristic_only():
        rmsnorm.rms_norm(x, w, out=out)
    rmsnorm.rms_norm(x, w, out=out)
    assert len(fake_gpu.lookups) == 4


def test_a_cached_call_still_checks_addresses_and_new_scalars(fake_gpu):
    x, w = Arr((4, 64)), Arr((64,), ptr=1 << 24)
    rmsnorm.rms_norm(x, w, out=Arr((4, 64), ptr=1 << 26))
    rmsnorm.rms_norm(x, w, out=x)  # in place: the same view
    launched = len(fake_gpu.events)
    with pytest.raises(ValueError, match="out partially overlaps x"):
        rmsnorm.rms_norm(x, w, out=Arr((4, 64), ptr=(1 << 20) + 64 * 4))  # the same layout, one row on
    with pytest.raises(ValueError, match="out overlaps weight"):
        rmsnorm.rms_norm(x, w, out=Arr((4, 64), ptr=(1 << 24) - 64 * 4))
    for eps in (-1.0, float("nan"), None):
        with pytest.raises((TypeError, ValueError), match="eps"):
            rmsnorm.rms_norm(x, w, eps=eps, out=x)
    assert len(fake_gpu.events) == launched


def test_a_call_on_another_device_allocates_and_launches_there(fake_gpu):
    x, w = Arr((2, 64), device=1), Arr((64,), ptr=1 << 24, device=1)
    for _ in range(2):
        _Fake.allocations.clear()
        rmsnorm.rms_norm(x, w)
        assert _Fake.allocations == [1] and fake_gpu.events[-1] == ("rms_norm", 1) and _Fake.current == 0


def _rotary_inputs(positions, dtype=np.int64, rows=16):
    tokens = len(positions)
    return (Arr((tokens,), dtype, ptr=1 << 30, values=list(positions)), Arr((tokens, 4, 64), ptr=1 << 20),
            Arr((tokens, 2, 64), ptr=1 << 24), Arr((rows, 64), ptr=1 << 28))


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("late", [False, True])
def test_position_check_reads_its_pinned_pair_and_raises_before_the_rotation(fake_gpu, dtype, late, monkeypatch):
    """The host reads the pair until the check's answer arrives, with no wait for the stream; an answer that
    has not arrived after CHECK_READS reads is waited for once."""
    monkeypatch.setattr(rotary, "CHECK_READS", 50)
    fake_gpu.answer_late = late
    events = fake_gpu.events
    wait = [("sync", 0)] if late else []
    rotary.rotary_embedding(*_rotary_inputs([3, 0, 15], dtype))
    assert events == [("check", 0), *wait, ("rotate", 0)]
    for positions, first, value in (([16, 1, 2], 0, 16), ([0, 1, -1], 2, -1)):  # first token, last token
        events.clear()
        with pytest.raises(IndexError, match=rf"^positions\[{first}\] = {value} is outside cos_sin_cache's 16 rows"):
            rotary.rotary_embedding(*_rotary_inputs(positions, dtype))
        assert events == [("check", 0), *wait]  # nothing rotated
    events.clear()
    rotary.rotary_embedding(*_rotary_inputs([16, 1, 2], dtype), check_positions=False)
    assert events == [("rotate", 0)]  # unchecked: no wait
    assert len(fake_gpu.pinned) == 1  # one pair for this thread, reused by every check


def test_position_check_refuses_a_capturing_stream_before_anything_is_recorded(fake_gpu):
    fake_gpu.stream.capturing = True
    with pytest.raises(RuntimeError, match=r"pass check_positions=False while capturing"):
        rotary.rotary_embedding(*_rotary_inputs([0, 1]))
    assert fake_gpu.events == []
    rotary.rotary_embedding(*_rotary_inputs([0, 1]), check_positions=False)
    assert fake_gpu.events == [("rotate", 0)]


def test_each_thread_has_its_own_pinned_pair_mapped_for_every_device(fake_gpu):
    pairs = [rotary._found_pair(), rotary._found_pair()]
    other = []
    t = threading.Thread(target=lambda: other.append(rotary._found_pair()))
    t.start()
    t.join()
    assert pairs[0] is pairs[1] and other[0] is not pairs[0]
    for host, address in (pairs[0], other[0]):
        buffer, flags = fake_gpu.pinned[int(address)]
        assert flags == 1 | 2 and len(buffer) == 16  # portable and mapped, two int64
        assert host.dtype == np.int64 and host.shape == (2,) and np.shares_memory(host, np.frombuffer(buffer, np.int64))


def test_a_rotation_on_another_device_checks_and_launches_there(fake_gpu):
    pos, q, k, cache = _rotary_inputs([1, 2])
    for a in (pos, q, k, cache):
        a.data.device_id = a.device.id = 1
    rotary.rotary_embedding(pos, q, k, cache)
    assert fake_gpu.events == [("check", 1), ("rotate", 1)] and _Fake.current == 0


# ------------------------------------------------------------------------------------------------- GPU


def bits(a):
    import cupy

    return cupy.ascontiguousarray(a).view(np.dtype(f"u{a.itemsize}"))


def same(a, b) -> bool:
    import cupy

    return a.shape == b.shape and bool(cupy.array_equal(bits(a), bits(b)))


def _inputs(tokens=8, hidden=4096, dtype="bfloat16"):
    import cupy

    from cukern._dtypes import parse_dtype

    t = parse_dtype(dtype)
    rng = cupy.random.default_rng(7)
    x = rng.standard_normal((tokens, hidden), dtype=cupy.float32).astype(t)
    r = rng.standard_normal((tokens, hidden), dtype=cupy.float32).astype(t)
    w = rng.standard_normal(hidden, dtype=cupy.float32).astype(t)
    q = rng.standard_normal((tokens, 32, 128), dtype=cupy.float32).astype(t)
    k = rng.standard_normal((tokens, 8, 128), dtype=cupy.float32).astype(t)
    pos = cupy.arange(100, 100 + tokens, dtype=cupy.int64)
    cache = cukern.rope_cache(4096, 128)
    cupy.cuda.Device().synchronize()  # non-blocking streams do not wait for the null stream
    return dict(x=x, r=r, w=w, q=q, k=k, pos=pos, cache=cache)


def _all_ops(a):
    """One call of every op on the inputs ``a``, results as a list (in-place ops: the arrays they change)."""
    out = [cukern.rms_norm(a["x"], a["w"])]
    res = a["r"].copy()
    out += [cukern.fused_add_rms_norm(a["x"], res, a["w"]), res]
    q, k = a["q"].copy(), a["k"].copy()
    cukern.rotary_embedding(a["pos"], q, k, a["cache"], check_positions=False)
    out += [q, k]
    for name in ("sum", "mean", "amax", "amin", "norm", "sum_of_squares"):
        fn = getattr(cukern, name)
        out += [fn(a["x"]), fn(a["x"], axis=-1), fn(a["x"], axis=0)]
    return out


@pytest.mark.gpu
def test_every_op_on_a_non_blocking_stream_matches_the_null_stream():
    import cupy

    a = _inputs(tokens=300)
    ref = _all_ops(a)
    cupy.cuda.Device().synchronize()
    s = cupy.cuda.Stream(non_blocking=True)
    with s:
        got = _all_ops(a)
        s.synchronize()
    assert all(same(g, r) for g, r in zip(got, ref))


@pytest.mark.gpu
def test_two_streams_at_once():
    import cupy

    rng = cupy.random.default_rng(3)
    xs = [rng.standard_normal(1 << 22, dtype=cupy.float32) for _ in range(2)]
    rows = [rng.standard_normal((512, 4096), dtype=cupy.float32) for _ in range(2)]
    ref = [(cukern.sum(x), cukern.amax(x), cukern.rms_norm(r)) for x, r in zip(xs, rows)]
    cupy.cuda.Device().synchronize()
    streams = [cupy.cuda.Stream(non_blocking=True) for _ in range(2)]
    got = [[], []]
    for _ in range(10):  # interleaved, so both streams have kernels in flight together
        for i, s in enumerate(streams):
            with s:
                got[i].append((cukern.sum(xs[i]), cukern.amax(xs[i]), cukern.rms_norm(rows[i])))
    for s in streams:
        s.synchronize()
    for i in range(2):
        for triple in got[i]:
            assert all(same(g, r) for g, r in zip(triple, ref[i]))


def _busy(stream):
    """Queue tens of milliseconds of GPU work on ``stream``."""
    import cupy

    with stream:
        buf = cupy.ones(64 * 2**20, dtype=cupy.float32)
        for _ in range(300):
            buf *= 1.0
    return buf


@pytest.mark.gpu
def test_no_hidden_host_synchronization():
    import cupy

    a = _inputs()
    s = cupy.cuda.Stream(non_blocking=True)
    with s:
        _all_ops(a)  # compile and plan first
        s.synchronize()
        keep = _busy(s)
        busy_done = s.record()
        _all_ops(a)
        assert not busy_done.done, "an op waited for the GPU"
        cukern.rotary_embedding(a["pos"], a["q"], a["k"], a["cache"])  # check_positions=True syncs, by design
        assert busy_done.done
        s.synchronize()
    del keep


@pytest.mark.gpu
def test_graph_capture_and_replay_match_eager():
    import cupy

    a = _inputs()
    x, w, r0, q0, k0 = a["x"], a["w"], a["r"], a["q"], a["k"]
    out, res, q, k = cupy.empty_like(x), r0.copy(), q0.copy(), k0.copy()
    reductions = [(getattr(cukern, n), axis) for n in ("sum", "mean", "amax", "amin", "norm", "sum_of_squares")
                  for axis in (None, -1, 0)]
    fused_out = cupy.empty_like(x)

    def step():
        results = [cukern.rms_norm(x, w, out=out)]
        cukern.fused_add_rms_norm(x, res, w, out=fused_out)
        cukern.rotary_embedding(a["pos"], q, k, a["cache"], check_positions=False)
        return results + [fn(x, axis=axis) for fn, axis in reductions]

    captured = pipeline.capture(step)
    results = captured.results[0]
    rng = cupy.random.default_rng(11)
    for _ in range(2):  # new inputs each replay: the graph reads the arrays' current contents
        with captured.stream:
            x[...] = rng.standard_normal(x.shape, dtype=cupy.float32).astype(x.dtype)
            res[...] = r0
            q[...], k[...] = q0, k0
            captured.replay()
            captured.stream.synchronize()
        ref_res, ref_q, ref_k = r0.copy(), q0.copy(), k0.copy()
        assert same(out, cukern.rms_norm(x, w))
        assert same(fused_out, cukern.fused_add_rms_norm(x, ref_res, w)) and same(res, ref_res)
        cukern.rotary_embedding(a["pos"], ref_q, ref_k, a["cache"])
        assert same(q, ref_q) and same(k, ref_k)
        for got, (fn, axis) in zip(results[1:], reductions):
            assert same(got, fn(x, axis=axis))


_REDUCTIONS = ("sum", "mean", "amax", "amin", "norm", "sum_of_squares", "var", "std", "logsumexp", "prod", "any",
               "all", "count_nonzero", "nansum", "nanmax", "nanmean")


def _captured_against_eager(bases, call, refill):
    """Capture ``call()`` on a new stream after one eager call, replay it on new contents of ``bases`` (the
    arrays it reads or writes, ``refill`` giving each its new values), then make the same call eagerly on the
    same contents: "same" when the replay left every base and result with the eager bits, else the refusal's
    message (a RuntimeError raised while capturing, the capture left valid) or "eager refused"."""
    import cupy

    def snapshot(outs):
        return [bits(cupy.ascontiguousarray(a)).get().tobytes() for a in list(bases) + outs if a is not None]

    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        try:
            call()
        except (TypeError, ValueError):
            return "eager refused"
        for b in bases:
            b[...] = refill(b)
        before = [b.copy() for b in bases]
        stream.synchronize()
        stream.begin_capture()
        try:
            got = call()
        except RuntimeError as e:
            graph = stream.end_capture()
            graph.launch(stream)  # still valid
            stream.synchronize()
            return str(e)
        except BaseException:
            stream.end_capture()
            raise
        graph = stream.end_capture()
        got = list(got) if isinstance(got, tuple) else [got]
        graph.launch(stream)
        stream.synchronize()
        replayed = snapshot(got)
        for b, v in zip(bases, before):
            b[...] = v
        want = call()
        want = list(want) if isinstance(want, tuple) else [want]
        stream.synchronize()
        return "same" if replayed == snapshot(want) else "different"


@pytest.mark.gpu
def test_every_op_captured_in_random_layouts_replays_its_eager_bits():
    """Reductions, arg-reductions, scans, segment reductions and the LLM ops, each captured in a random dtype,
    layout (C, transposed, strided, reversed, misaligned, F-ordered) and axis: every capture either replays
    the bits of an eager call on the same inputs, or refuses while capturing with a RuntimeError that says
    why, leaving the capture valid; most are captured."""
    import cupy

    rng = np.random.default_rng(2026)

    def refill(b):
        if b.dtype == np.bool_:
            return cupy.asarray(rng.random(b.shape) < 0.5)
        if b.dtype.kind in "iu":
            return cupy.asarray(rng.integers(0, 5, b.shape).astype(b.dtype))
        if b.dtype.kind == "c":
            return cupy.asarray((rng.standard_normal(b.shape) + 1j * rng.standard_normal(b.shape)).astype(b.dtype))
        return cupy.asarray((1 + 0.5 * rng.standard_normal(b.shape)).astype(np.float32).astype(b.dtype))

    views = {"c": lambda b: b, "t": lambda b: b.T, "s": lambda b: b[..., ::2], "n": lambda b: b[::-1],
             "m": lambda b: b[..., 1:], "f": lambda b: b.T.copy().T}
    dtypes = (np.float32, np.float64, np.float16, BFLOAT16, np.int32, np.bool_, np.complex64)
    outcomes = {}
    for _ in range(120):
        dt = np.dtype(dtypes[int(rng.choice(7, p=[.35, .15, .1, .1, .1, .1, .1]))])
        shape = tuple(int(v) for v in rng.choice([1, 3, 7, 64, 129, 1000, 4099], size=rng.integers(1, 4)))
        if np.prod(shape) > 3_000_000:
            continue
        layout = str(rng.choice(list(views)))
        base = cupy.empty(shape, dt)
        base[...] = refill(base)
        x = views[layout](base)
        axis = [None, 0, -1, (0, -1) if x.ndim > 1 else 0][int(rng.choice(4, p=[.35, .25, .3, .1]))]
        op = str(rng.choice(_REDUCTIONS + ("argmax", "argmin", "cumsum", "cumprod", "segment_sum", "segment_max")))
        fn = getattr(cukern, op)
        one = None if axis is None or isinstance(axis, tuple) else axis
        if op.startswith("segment"):
            n = x.shape[0]
            offsets = cupy.asarray(np.concatenate([[0], np.sort(rng.integers(0, n + 1, 4)), [n]]).astype(np.int64))
            checked = bool(rng.random() < 0.5)
            result = _captured_against_eager([base], lambda: fn(x, offsets, check_offsets=checked), refill)
        elif op in ("argmax", "argmin", "cumsum", "cumprod"):
            result = _captured_against_eager([base], lambda: fn(x, axis=one), refill)
        else:
            result = _captured_against_eager([base], lambda: fn(x, axis=axis), refill)
        outcomes.setdefault(result, []).append(f"{op} {shape} {dt.name} {layout} axis={axis}")
    t, heads, kv, d = 33, 4, 2, 128
    for dt in (np.float32, np.float16, BFLOAT16):
        dt = np.dtype(dt)
        x, res = (cupy.asarray(rng.standard_normal((t, 1024)).astype(dt)) for _ in range(2))
        w = cupy.asarray(rng.standard_normal(1024).astype(dt))
        qkv = cupy.asarray(rng.standard_normal((t, (heads + 2 * kv) * d)).astype(dt))
        q, k = qkv[:, :heads * d].reshape(t, heads, d), qkv[:, heads * d:(heads + kv) * d].reshape(t, kv, d)
        qw, kw = (cupy.asarray(rng.standard_normal(d).astype(dt)) for _ in range(2))
        pos = cupy.asarray(rng.integers(0, 4096, t))
        cache = cukern.rope_cache(4096, d)
        fp8 = {} if dt == np.float32 else {"out_dtype": "float8_e4m3fn", "scale": "per_token"}
        calls = {"rms_norm": ([x], lambda: cukern.rms_norm(x, w, **fp8)),
                 "fused_add_rms_norm": ([x, res], lambda: cukern.fused_add_rms_norm(x, res, w)),
                 "rotary_embedding": ([qkv], lambda: cukern.rotary_embedding(pos, q, k, cache, check_positions=False)),
                 "qk_norm_rope": ([qkv], lambda: cukern.qk_norm_rope(pos, q, k, qw, kw, cache, check_positions=False)),
                 "rotary_embedding_positions": ([qkv], lambda: cukern.rotary_embedding_positions(pos, q, k,
                                                                                                 rotary_dim=d))}
        for name, (bases, call) in calls.items():
            outcomes.setdefault(_captured_against_eager(bases, call, refill), []).append(f"{name} {dt.name}")
    assert "different" not in outcomes, outcomes["different"]
    refused = {why: cases for why, cases in outcomes.items() if why not in ("same", "eager refused")}
    assert all("captur" in why for why in refused), refused
    assert len(outcomes["same"]) > sum(map(len, refused.values())), refused
    llm = [c for c in outcomes["same"] if c.split()[0] in calls]
    assert len(llm) == 3 * len(calls), refused  # the LLM ops are captured in every dtype


@pytest.mark.gpu
def test_graph_replay_time_for_decode_shapes():
    a = _inputs(tokens=1)
    out = a["x"].copy()
    t = pipeline.graph_replay_time(cukern.rms_norm, a["x"], a["w"], out=out, calls=4, repeat=20, warmup=3)
    assert 0 < t.median_us < 1000 and t.repeat == 20


@pytest.mark.gpu
@pytest.mark.serial  # a host-time bound: six test processes sharing the host's cores pushed it past 50 µs
@pytest.mark.parametrize("op", ["rms_norm", "rms_norm_out", "rotary", "rotary_checked"])
def test_host_overhead(op):
    a = _inputs(tokens=1)
    if op.startswith("rms_norm"):
        kwargs = {"out": a["r"]} if op == "rms_norm_out" else {}  # r: any array shaped like x
        us = pipeline.host_overhead(cukern.rms_norm, a["x"], a["w"], **kwargs)
    else:
        us = pipeline.host_overhead(cukern.rotary_embedding, a["pos"], a["q"], a["k"], a["cache"],
                                    check_positions=op.endswith("checked"))
    print(f"host overhead {op}: {us:.2f} us")
    assert us < 50


@pytest.mark.gpu
@pytest.mark.parametrize("fused", [False, True])
def test_out_gives_the_bits_of_the_allocating_call(fused):
    """The cached host path with ``out`` (a separate array, and x itself) writes what the allocating call
    returns, bit for bit, call after call."""
    import cupy

    a = _inputs(tokens=5)
    x, w = a["x"], a["w"]
    if fused:
        r0 = a["r"]
        want_r = r0.copy()
        want = cukern.fused_add_rms_norm(x, want_r, w)
        for _ in range(3):
            out, res = cupy.empty_like(x), r0.copy()
            assert cukern.fused_add_rms_norm(x, res, w, out=out) is out
            assert same(out, want) and same(res, want_r)
            xs, res = x.copy(), r0.copy()
            assert cukern.fused_add_rms_norm(xs, res, w, out=xs) is xs
            assert same(xs, want) and same(res, want_r)
    else:
        want = cukern.rms_norm(x, w)
        for _ in range(3):
            out = cupy.empty_like(x)
            assert cukern.rms_norm(x, w, out=out) is out and same(out, want)
            xs = x.copy()
            assert cukern.rms_norm(xs, w, out=xs) is xs and same(xs, want)
            assert same(cukern.rms_norm(x, w), want)


@pytest.mark.gpu
def test_hot_calls_allocate_nothing_but_their_output_and_never_compile(monkeypatch):
    import cupy

    a = _inputs(tokens=1)
    out = cupy.empty_like(a["x"])
    pool = cupy.get_default_memory_pool()
    allocations = []

    def counting(nbytes):
        allocations.append(nbytes)
        return pool.malloc(nbytes)

    def calls():
        cukern.rms_norm(a["x"], a["w"], out=out)
        cukern.rotary_embedding(a["pos"], a["q"], a["k"], a["cache"], check_positions=False)

    calls()
    compiles = []
    monkeypatch.setattr(cupy, "RawModule", lambda *args, **kw: compiles.append(kw) or pytest.fail("compiled"))
    with cupy.cuda.using_allocator(counting):
        for _ in range(20):
            calls()
        assert allocations == []
        for _ in range(20):
            cukern.rms_norm(a["x"], a["w"])
        assert len(allocations) == 20  # the output, nothing else
    assert compiles == []


@pytest.mark.gpu
def test_eight_threads_first_call_compile_once(monkeypatch):
    import cupy

    hidden = 1000  # an unusual row length, so its kernel is new to this process
    monkeypatch.setattr(_compile, "_kernels", {})
    built = []
    real = cupy.RawModule

    def counting(*args, **kwargs):
        built.append(kwargs["path"])
        return real(*args, **kwargs)

    monkeypatch.setattr(cupy, "RawModule", counting)
    rng = cupy.random.default_rng(5)
    xs = [rng.standard_normal((3, hidden), dtype=cupy.float32).astype(cupy.float16) for _ in range(8)]
    barrier = threading.Barrier(8)
    results, errors = [None] * 8, []

    def work(i):
        try:
            barrier.wait()
            results[i] = cukern.rms_norm(xs[i])
            cupy.cuda.get_current_stream().synchronize()
        except Exception as err:  # reported below, with the thread's index
            errors.append((i, err))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(built) == 1
    for x, y in zip(xs, results):
        assert same(y, cukern.rms_norm(x))


@pytest.mark.gpu
def test_pipeline_records_have_the_results_file_form():
    recs = pipeline.records(4000.0, repeat=5, warmup=1, n=50)
    hosts = [r for r in recs if r["op"].startswith("host_overhead")]
    ours = [(r["op"], r["shape"], r["dtype"]) for r in hosts if r["impl"] == "cukern"]
    assert ours == [("host_overhead", [1, 4096], "bfloat16"), ("host_overhead_out", [1, 4096], "bfloat16"),
                    ("host_overhead_rotary", [1, 32, 128], "bfloat16"),
                    ("host_overhead_rotary_checked", [1, 32, 128], "bfloat16"),
                    ("host_overhead_sum", [4096], "float32"), ("host_overhead_qk_norm_rope", [1, 32, 128], "bfloat16"),
                    ("host_overhead_argmax", [4096], "float32"), ("host_overhead_cumsum", [4096], "float32")]
    cupys = [r["op"] for r in hosts if r["impl"] == "cupy"]
    assert cupys == ["host_overhead_sum", "host_overhead_argmax", "host_overhead_cumsum"]
    assert {r["impl"] for r in hosts} <= {"cukern", "cupy"}  # no peers asked for: no torch records
    assert recs[: len(hosts)] == hosts and hosts[0]["impl"] == "cukern"
    assert all(set(r) == {"op", "impl", "shape", "dtype", "median_us"} and r["median_us"] > 0 for r in hosts)
    graphs = [(r["op"], r["shape"][0]) for r in recs[len(hosts):]]
    assert graphs == [(op, t) for t in pipeline.DECODE_TOKENS
                      for op in ("rms_norm", "fused_add_rms_norm", "rotary_embedding")]
    assert all(r["impl"] == "cukern-graph" and r["gbps"] > 0 for r in recs[len(hosts):])


def test_positions_refuse_to_upload_frequencies_while_capturing(fake_gpu, monkeypatch):
    """rotary_embedding_positions uploads a new (rotary_dim, base, scaling) frequency table on its first call,
    which a CUDA-graph capture cannot record: RuntimeError before anything is launched; a bad scaling is
    still a ValueError first."""
    from cukern._launch import CallCache

    monkeypatch.setattr(rotary, "_tables", {})
    monkeypatch.setattr(rotary, "_positions_calls", CallCache())
    fake_gpu.stream.capturing = True
    pos, q, k, _ = _rotary_inputs([0, 1])
    with pytest.raises(ValueError, match="rope_type"):
        rotary.rotary_embedding_positions(pos, q, k, rotary_dim=64, scaling={"rope_type": "nonsense"})
    with pytest.raises(RuntimeError, match="make that call once before capturing"):
        rotary.rotary_embedding_positions(pos, q, k, rotary_dim=64)
    assert fake_gpu.events == [] and len(rotary._tables) == 0


def test_flags_are_bools_on_every_call(fake_gpu):
    """is_neox, inverse, interleaved and check_positions take True, False or a NumPy bool: anything else is a
    TypeError before anything is launched, also for a call whose bool twin is already in the call cache
    (1 == True would find it)."""
    rotary.rotary_embedding(*_rotary_inputs([0, 1]), is_neox=True, check_positions=False)
    rotary.rotary_embedding(*_rotary_inputs([0, 1]), is_neox=np.True_, inverse=np.False_, check_positions=False)
    assert len(fake_gpu.events) == 2
    fake_gpu.events.clear()
    bad = [({"is_neox": 1}, "is_neox"), ({"is_neox": None}, "is_neox"), ({"inverse": "no"}, "inverse"),
           ({"check_positions": None}, "check_positions"), ({"check_positions": 0}, "check_positions")]
    for kw, name in bad:
        with pytest.raises(TypeError, match=rf"^{name} must be True or False, got "):
            rotary.rotary_embedding(*_rotary_inputs([0, 1]), **kw)
    pos, q, k, cache = _rotary_inputs([0, 1])
    with pytest.raises(TypeError, match="^is_neox must be"):
        rotary.rotary_embedding_positions(pos, q, k, rotary_dim=64, is_neox="yes")
    with pytest.raises(TypeError, match="^interleaved must be"):
        rotary.rotary_embedding_mrope(Arr((3, 2), np.int64), q, k, cache, mrope_section=(16, 8, 8), interleaved=1)
    with pytest.raises(TypeError, match="^check_positions must be"):
        qknorm.qk_norm_rope(pos, q, k, None, None, cache, check_positions="no")
    assert fake_gpu.events == []


def test_capture_refuses_host_steps_before_recording(monkeypatch):
    """rope_cache's upload, a float8 scale read from any GPU array (not only CuPy's), and a bfloat16 nansum
    over axes of one element (a mask temporary) are refused under capture, before anything is recorded."""
    import importlib

    import cupy

    from cukern import reduce as R

    RC = importlib.import_module("cukern.rope_cache")  # (cukern.rope_cache is also the function's name)
    capturing = SimpleNamespace(ptr=7, is_capturing=lambda: True)
    monkeypatch.setattr(cupy.cuda, "get_current_stream", lambda: capturing)
    monkeypatch.setattr(RC, "require_gpu", lambda: None)
    monkeypatch.setattr(cupy, "asarray", lambda *a, **k: pytest.fail("uploaded under capture"))
    with pytest.raises(RuntimeError, match="build the cache before capturing"):
        RC.rope_cache(16, 8)

    class DeviceScalar:  # a one-element GPU array of another framework: no .get, only __array__
        shape, dtype = (1,), np.dtype(np.float32)

        def __array__(self, *args, **kwargs):
            pytest.fail("read to the host under capture")

    monkeypatch.setattr(rmsnorm, "_cupy", lambda: SimpleNamespace(cuda=cupy.cuda))
    with pytest.raises(RuntimeError, match="float\\(scale\\) before capturing"):
        rmsnorm._fp8_scale(DeviceScalar())
    with pytest.raises(RuntimeError, match="bfloat16 nansum over axes of one element"):
        R._elementwise(R.OPS["nansum"], None, (1,), SimpleNamespace(dtype=BFLOAT16), False, 1.0)
