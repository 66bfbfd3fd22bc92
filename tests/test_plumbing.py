"""Launch plumbing, row layouts and argument checks that need no GPU."""

import re
import threading

import numpy as np
import pytest
from _support import ARCHS, fake_array

from cukern import (
    _check,
    _convert,
    _layout,
    argreduce,
    layernorm,
    qknorm,
    reduce_plan,
    rmsnorm,
    rmsnorm_backward,
    rotary,
    scan,
    segment,
)
from cukern._compile import Instantiation, read_source
from cukern._dtypes import BFLOAT16
from cukern._launch import LaunchConfig, Params, Signature
from cukern.timing import Timing


def test_name_expressions_are_generated():
    inst = Instantiation("rms_norm", "rms_norm_rows", (BFLOAT16, np.float32, 8, 128, 4, 128))
    assert inst.expression == "cukern::rms_norm_rows<cukern::bf16, float, 8, 128, 4, 128>"
    assert Instantiation("x", "k", (np.float16, True, np.int64)).expression == "cukern::k<cukern::f16, true, long long>"


def test_signature_types_scalars_and_counts_arguments():
    sig = Signature(("ptr", "i64", "f32", "i32"))
    args = sig.convert((None, 3, 1.5, 7))
    assert args[0] == np.uint64(0) and type(args[1]) is np.int64 and type(args[2]) is np.float32
    assert type(args[3]) is np.int32
    with pytest.raises(TypeError, match="takes 4 arguments, got 3"):
        sig.convert((None, 1, 2.0))


# C field types and the Params kinds that fill them (an unsigned field takes an int32: its values stay below 2^31)
_C_KINDS = {"long long": "i64", "unsigned long long": "u64", "int": "i32", "unsigned": "i32", "float": "f32",
            "double": "f64"}


@pytest.mark.parametrize("params, family, struct", [
    (rmsnorm.PARAMS, rmsnorm, "RmsNormParams"), (rmsnorm.FP8_PARAMS, rmsnorm, "RmsNormFp8Params"),
    (rmsnorm_backward.PARAMS, rmsnorm_backward, "RmsNormBackwardParams"), (rotary.PARAMS, rotary, "RotaryParams"), (rotary.CHECK_PARAMS, rotary, "RotaryCheckParams"),
    (rotary.POSITIONS_PARAMS, rotary, "RotaryPositionsParams"), (rotary.MROPE_PARAMS, rotary, "RotaryMropeParams"),
    (qknorm.PARAMS, qknorm, "QkNormRopeParams"), (scan.PARAMS, scan, "ScanParams"),
    (segment.PARAMS, segment, "SegParams"), (argreduce.PARAMS, argreduce, "ArgParams"),
    (_convert.PARAMS, _convert, "ConvertParams"), (reduce_plan.LSE_WEIGHTED_PARAMS, reduce_plan, "LseWeightedParams"),
    (layernorm.PARAMS, layernorm, "LayerNormParams"), (layernorm.BACKWARD_PARAMS, layernorm, "LayerNormBackwardParams"),
    (layernorm.PARAM_GRADS_PARAMS, layernorm, "ParamGradsParams")])
def test_params_match_the_struct_the_kernel_declares(params, family, struct):
    text = re.sub(r"//[^\n]*", "", read_source(family.SOURCE))
    body = re.search(r"struct " + struct + r" \{(.*?)\};", text, re.S).group(1)
    fields = []
    for decl in body.split(";")[:-1]:
        kind, names = re.fullmatch(r"\s*(unsigned long long|long long|unsigned|int|float|double) (.*)", decl,
                                  re.S).groups()
        fields += [(n.strip(), _C_KINDS[kind]) for n in names.split(",")]
    assert tuple(fields) == params.fields
    # NumPy's aligned layout is C's: every field at a multiple of its size, the whole padded to the largest
    offset = 0
    for name, kind in fields:
        size = int(kind[1:]) // 8
        offset = -(-offset // size) * size
        assert params.dtype.fields[name][1] == offset, name
        offset += size
    assert params.dtype.itemsize == -(-offset // 8) * 8


def test_params_struct_takes_every_field_by_name():
    p = Params((("n", "i64"), ("scale", "f32")))
    s = p.struct(scale=0.5, n=3)
    assert s["n"] == 3 and s["scale"] == np.float32(0.5) and p.dtype.itemsize == 16
    with pytest.raises(TypeError, match="struct fields"):
        p.struct(n=3)


def test_launch_config_rejects_swapped_or_empty_sizes():
    LaunchConfig((100000,), (256,))
    with pytest.raises(ValueError):
        LaunchConfig((1,), (2048,))
    with pytest.raises(ValueError):
        LaunchConfig((0,), (128,))


def test_prepared_launch_hands_the_driver_each_arguments_bytes_and_its_slots(monkeypatch):
    import ctypes
    from types import SimpleNamespace

    from cukern import _launch

    seen = []
    p = Params((("n", "i64"), ("epoch", "i32")))
    sizes = (8, 4, 8, p.dtype.itemsize)

    def launch_kernel(*args):  # cuLaunchKernel's reading of kernelParams: one pointer per argument
        pointers = (ctypes.c_uint64 * len(sizes)).from_address(args[9])
        seen.append((args[:9] + args[10:], [ctypes.string_at(a, n) for a, n in zip(pointers, sizes)]))

    contexts = []  # the threads whose context a prepared launch made current
    driver = SimpleNamespace(launchKernel=launch_kernel)
    runtime = SimpleNamespace(getDevice=lambda: 0, memGetInfo=lambda: contexts.append(threading.get_ident()))
    monkeypatch.setattr(_launch, "_cupy", SimpleNamespace(cuda=SimpleNamespace(driver=driver, runtime=runtime)))
    monkeypatch.setattr(_launch, "_thread", threading.local())
    struct = p.struct(n=-5, epoch=0)
    prepared = _launch.Prepared(SimpleNamespace(ptr=1234), LaunchConfig((5,), (128,), 64),
                                (np.uint64(0), np.int32(-3), np.uint64(0), struct), (0, 2, (3, "epoch")))
    prepared(7, 0xA00, 0xB00, 9)
    prepared(0, 0xC00, 0xD00, 10)
    expected = p.struct(n=-5, epoch=9)
    assert seen[0] == ((1234, 5, 1, 1, 128, 1, 1, 64, 7, 0), [
        np.uint64(0xA00).tobytes(), np.int32(-3).tobytes(), np.uint64(0xB00).tobytes(), expected.tobytes()])
    expected["epoch"] = 10
    assert seen[1][0][8] == 0 and seen[1][1][0] == np.uint64(0xC00).tobytes()
    assert seen[1][1][3] == expected.tobytes() and struct["epoch"] == 0  # the caller's struct is copied
    raw = SimpleNamespace(kernel=SimpleNamespace(ptr=77))  # a RawKernel: its Function on the current device
    _launch.Prepared(raw, LaunchConfig((1,), (32,)), prepared.args, prepared.slots)(3, 0xE00, 0xF00, 11)
    assert seen[2][0][0] == 77 and seen[2][1][0] == np.uint64(0xE00).tobytes()
    pair = Params((("a", "i32"), ("b", "i32"))).struct(a=1, b=2)
    with pytest.raises(ValueError, match="8-byte aligned"):  # a slot is a whole word of the buffer
        _launch.Prepared(SimpleNamespace(ptr=1), LaunchConfig((1,), (32,)), (pair,), ((0, "b"),))
    worker = threading.Thread(target=lambda: [prepared(0, 1, 2, 3) for _ in range(2)])  # a fresh thread (Dask's)
    worker.start()
    worker.join()
    assert contexts == [threading.get_ident(), worker.ident] and len(seen) == 5


def fake(shape, strides):
    return fake_array(shape, np.float16, strides)


def test_contiguous_rows_collapse_to_one_level():
    lay = _layout.rows_layout([fake((8, 4, 16), (64, 16, 1))])
    assert (lay.rows, lay.inner, lay.strides, lay.outer) == (32, 32, ((0, 16),), ((0,),))


def test_fused_qkv_heads_keep_two_levels():
    q = fake((5, 8, 128), (1536, 128, 1))
    out = fake((5, 8, 128), (1024, 128, 1))
    lay = _layout.rows_layout([out, q])
    assert (lay.rows, lay.inner, lay.strides) == (40, 8, ((1024, 128), (1536, 128)))


def test_unmergeable_leading_dims_split_into_launches():
    lay = _layout.rows_layout([fake((2, 5, 4, 64), (5760, 384, 288, 1))])
    assert lay.rows == 20 and lay.inner == 4 and lay.outer == ((0,), (5760,))


def test_scalar_and_single_row_layouts():
    assert _layout.rows_layout([fake((7,), (1,))]).rows == 1
    lay = _layout.rows_layout([fake((1, 3, 7), (0, 9, 1))])
    assert (lay.rows, lay.inner, lay.strides) == (3, 3, ((0, 9),))


def test_overlap_is_decided_by_the_elements_each_array_touches():
    buf = fake_array((4, 8), np.float32)
    left, right = fake_array((4, 4), np.float32, (8, 1)), fake_array((4, 4), np.float32, (8, 1), ptr=buf.ptr + 16)
    assert _check.overlaps(buf, left) and not _check.overlaps(left, right)  # interleaved rows: a range, no element
    assert _check.overlaps(left, fake_array((4, 4), np.float32, (8, 1), ptr=buf.ptr + 12))  # one column shared
    assert _check.overlaps(fake_array((2,), np.float64, ptr=buf.ptr + 4), left)  # bytes, whatever the dtypes
    assert not _check.overlaps(fake_array((4, 8)), fake_array((4, 8), ptr=(1 << 20) + 128))
    backwards = fake_array((4, 8), np.float32, (-8, 1), ptr=buf.ptr + 96)  # row 0 last in memory
    assert _check.overlaps(backwards, buf) and not _check.overlaps(backwards, fake_array((1,), ptr=buf.ptr + 128))
    assert not _check.overlaps(buf, fake_array((0, 8)))
    _check.check_no_overlap(buf, "out", buf, "x", identical_ok=True)
    with pytest.raises(ValueError, match="out partially overlaps x; pass a separate array or the same one"):
        _check.check_no_overlap(left, "out", buf, "x", identical_ok=True)
    with pytest.raises(ValueError, match="out overlaps x; pass a separate array$"):
        _check.check_no_overlap(buf, "out", buf, "x", identical_ok=False)


def test_extent_and_contiguous_strides():
    assert _layout.contiguous_strides((3, 0, 5), 4) == (20, 20, 4)
    assert _layout.extent(1000, (3, 5), (-20, 4), 4) == (960, 1020)
    spec = _layout.ArraySpec.fresh((3, 5), np.float16)
    assert (spec.strides, spec.size, spec.ndim, spec.data.ptr) == ((10, 2), 15, 2, 0)


def test_timing_bandwidth():
    t = Timing(median_us=100.0, min_us=90, max_us=120, p20_us=95, p80_us=110, repeat=10, bytes_moved=4 * 10**8)
    assert t.gbps == pytest.approx(4000.0)
    assert Timing(1, 1, 1, 1, 1, 1).gbps is None


@pytest.mark.parametrize("arch", ARCHS)
def test_stream_hold_kernel_compiles_and_sleeps_on_the_global_timer(arch):
    from cukern._compile import compile_program

    hold = Instantiation("timing", "hold_stream", ())
    assert hold.expression == "cukern::hold_stream"
    ptx = compile_program("timing", [hold], arch).kernel_ptx(hold)
    assert "%globaltimer" in ptx and "nanosleep" in ptx and "ld.global" not in ptx


def test_hold_covers_the_host_launch_cost_within_bounds():
    from cukern import timing

    assert timing.hold_time_us(0.0) == timing.HOLD_MIN_US
    assert timing.hold_time_us(15.0) >= 4 * 15.0
    assert timing.hold_time_us(1e9) == timing.HOLD_MAX_US


@pytest.mark.gpu
@pytest.mark.serial
def test_benchmark_times_gpu_work_not_the_launch():
    """A 50 µs hold measures about 50 µs; back to back (no flush), a tiny call timed with the stream held
    is faster than timed bare, where the host's launch cost is inside the events."""
    import cupy

    from cukern import timing

    held = timing.benchmark(timing.hold_stream, 50.0, repeat=20)
    assert 49.0 <= held.median_us <= 60.0
    x = cupy.ones(1, dtype=cupy.float32)
    held = timing.benchmark(cupy.negative, x, repeat=50, flush_l2=False)
    bare = timing.benchmark(cupy.negative, x, repeat=50, flush_l2=False, hold=False)
    assert held.median_us < bare.median_us


@pytest.mark.parametrize("dtype", [">f4", ">i8", np.longdouble, np.clongdouble])
def test_dtypes_no_cupy_array_holds_are_refused_by_name(dtype):
    from cukern import reduce_plan
    from cukern._dtypes import parse_dtype

    with pytest.raises(TypeError, match=r"is not one a CuPy array can hold"):
        parse_dtype(dtype)
    with pytest.raises(TypeError, match=r"is not one a CuPy array can hold"):
        reduce_plan.result_dtype("sum", np.dtype(np.float32), dtype)
    assert parse_dtype("<f4") == np.float32 and parse_dtype("bfloat16").name == "bfloat16"


def test_stream_keys_tell_threads_apart_on_the_per_thread_stream(monkeypatch):
    import threading
    from types import SimpleNamespace

    from cukern import _launch
    from cukern._launch import PER_THREAD_STREAM, stream_key

    runtime = SimpleNamespace(getDevice=lambda: 0, deviceSynchronize=lambda: None)
    monkeypatch.setattr(_launch, "_cupy", SimpleNamespace(cuda=SimpleNamespace(runtime=runtime)))
    keys = {}

    def key(name, stream):
        keys[name] = stream_key(stream)

    legacy, own = SimpleNamespace(ptr=0), SimpleNamespace(ptr=0x7F00)
    ptds = SimpleNamespace(ptr=PER_THREAD_STREAM, is_capturing=lambda: False)
    for name, stream in (("legacy", legacy), ("own", own), ("ptds", ptds)):
        key(name, stream)
        t = threading.Thread(target=key, args=(name + "'", stream))
        t.start()
        t.join()
    assert keys["legacy"] == keys["legacy'"] == (0,) and keys["own"] == keys["own'"] == (0x7F00,)
    assert keys["ptds"] != keys["ptds'"]


def test_a_threads_first_call_on_the_per_thread_stream_waits_once_a_device(monkeypatch):
    """Thread ids are reused: a new thread may find the workspaces of one that ended with launches still
    queued on its own stream, so its first eager call on each device waits for that device."""
    import threading
    from types import SimpleNamespace

    from cukern import _launch

    waits, device = [], [0]
    runtime = SimpleNamespace(getDevice=lambda: device[0], deviceSynchronize=lambda: waits.append(device[0]))
    monkeypatch.setattr(_launch, "_cupy", SimpleNamespace(cuda=SimpleNamespace(runtime=runtime)))
    capturing = [False]
    ptds = SimpleNamespace(ptr=_launch.PER_THREAD_STREAM, is_capturing=lambda: capturing[0])

    def calls():
        capturing[0] = True
        _launch.stream_key(ptds)  # nothing can wait under a capture
        assert waits == []
        capturing[0] = False
        _launch.stream_key(ptds)
        _launch.stream_key(ptds)
        device[0] = 1
        _launch.stream_key(ptds)
        _launch.stream_key(SimpleNamespace(ptr=0))  # other streams are one stream whatever the thread

    t = threading.Thread(target=calls)
    t.start()
    t.join()
    assert waits == [0, 1]
