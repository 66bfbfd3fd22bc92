"""Run every op on CuPy arrays over memory nothing reads, with no GPU, and record the launches it would make.

Run as a script in a process of its own (tests/test_launch_contract.py does): it replaces CuPy's allocator,
its current stream and device queries, and each op module's ``get_kernel`` and ``struct_argument``, so an op
plans, validates and packs its arguments as it would on a GPU and hands them to a recorder instead of the
driver. It pickles to stdout a list of ``(case, error, launches)``, each launch
``(instantiation, grid, block, shared_mem, dynamic_shared_limit, args)`` with every argument described as
``("ptr", address)``, ``("struct", itemsize, alignment)`` or ``(NumPy type name, value)``; and the
allocations, ``(address, bytes)``.
"""

import itertools
import pickle
import sys
import traceback
import weakref

import cupy
import numpy as np

import cukern
from cukern import _convert, _launch, _tuned, argreduce, ladder, qknorm, reduce, rmsnorm, rotary, scan, segment
from cukern._dtypes import BFLOAT16

MODULES = (_convert, argreduce, ladder, qknorm, reduce, rmsnorm, rotary, scan, segment)

allocations = []  # (address, bytes) of every allocation
freed = set()  # the addresses of those whose memory went back
made_by_op = set()  # the addresses of those an op made (not a case's inputs)
_next = itertools.count(1)
_state = {"capturing": False, "inputs": False}


class CaptureViolation(Exception):
    """What the driver answers a capturing stream's caller who waits for it, copies from the host or pins
    memory: an op must refuse such a call before anything is recorded."""


class _Owner:
    pass


def _allocate(size):
    base = (1 << 40) + next(_next) * (1 << 38)  # 256 GiB apart: room for arrays past 2^32 bytes
    allocations.append((base, size))
    if not _state["inputs"]:
        made_by_op.add(base)
    owner = _Owner()
    weakref.finalize(owner, freed.add, base)
    return cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(base, max(size, 1), owner, device_id=0), 0)


def _refused_in_capture(what):
    if _state["capturing"]:
        raise CaptureViolation(f"{what} while the stream captures")


class _Stream:
    ptr = 0

    def is_capturing(self):
        return _state["capturing"]

    def synchronize(self):
        _refused_in_capture("a wait for the stream")


class _Zeros(cupy.ndarray):
    """What ``cupy.zeros`` makes here: memory nothing reads, so filling it is nothing."""

    def fill(self, value):
        pass


class _Struct:
    """What ``struct_argument`` makes here: the packed struct, kept for its size and alignment."""

    def __init__(self, struct):
        self.struct = struct


class _Pinned(bytearray):
    """What ``cupy.cuda.PinnedMemoryPointer`` makes here: host bytes with an address of their own."""

    def __init__(self, memory, offset):
        _refused_in_capture("pinned memory allocated")
        super().__init__(memory[0])
        self.ptr = 0x7F0000000000 + 256 * len(pinned)
        pinned[self.ptr] = self


pinned = {}
launches = []


class _Kernel:
    def __init__(self, inst):
        self.inst = inst
        self.kernel = self
        self.max_dynamic_shared_size_bytes = None

    def __call__(self, grid, block, args, shared_mem=0):
        launches.append((self.inst, tuple(grid), tuple(block), shared_mem, self.max_dynamic_shared_size_bytes,
                         [_describe(a) for a in args]))
        if self.inst.name == "rotary_first_bad_position":  # the answer: no position outside the cache
            np.frombuffer(pinned[int(args[0].struct)], np.int64)[0] = 1 << 62


def _describe(a):
    if isinstance(a, cupy.ndarray):
        return ("ptr", a.data.ptr)
    if isinstance(a, cupy.cuda.MemoryPointer):
        return ("ptr", a.ptr)
    if isinstance(a, _Struct):
        return ("struct", a.struct.dtype.itemsize, a.struct.dtype.alignment)
    if isinstance(a, np.generic):
        return (type(a).__name__, a.item())
    raise TypeError(f"an argument of type {type(a).__name__} reached the launch")


def _install():
    cupy.cuda.set_allocator(_allocate)
    cupy.cuda.get_current_stream = lambda: _Stream()
    cupy.cuda.runtime.getDevice = lambda: 0
    cupy.cuda.runtime.memsetAsync = lambda *args: None
    cupy.zeros = lambda shape, dtype=float, order="C": _Zeros(shape, dtype, order=order)
    asarray = cupy.asarray

    def upload(a, dtype=None):
        if isinstance(a, np.ndarray):
            _refused_in_capture("a copy from the host")
            return cupy.empty(a.shape, dtype or a.dtype)
        return asarray(a, dtype)

    cupy.asarray = upload
    _launch._runtime = type("Runtime", (), {"getDevice": staticmethod(lambda: 0)})
    _launch._sm_counts[0] = 132
    _tuned._device_names[0] = "NVIDIA H200"
    for m in MODULES:
        if hasattr(m, "get_kernel"):
            m.get_kernel = lambda inst, options=(): _Kernel(inst)
        if hasattr(m, "struct_argument"):
            m.struct_argument = _Struct
    cupy.cuda.PinnedMemory = lambda size, flags=0: (size, flags)
    cupy.cuda.PinnedMemoryPointer = _Pinned


def _a(shape, dtype=np.float32, order="C"):
    """An input of a case."""
    _state["inputs"] = True
    try:
        return cupy.empty(shape, dtype, order=order)
    finally:
        _state["inputs"] = False


def cases():
    """(name, call) pairs: every op, over the layouts its planner tells apart and the dtypes it takes."""
    f32, f16, f64, bf16 = np.float32, np.float16, np.float64, BFLOAT16
    out = []
    reductions = ("sum", "mean", "amax", "amin", "prod", "sum_of_squares", "norm", "var", "std", "nansum",
                  "nanmean", "nanmax", "nanmin", "logsumexp", "any", "all", "count_nonzero")
    layouts = {  # shape, order, axis: full, rows, columns, few columns, strided middle axis, F order
        "full": ((1 << 20,), "C", None), "rows": ((64, 1000), "C", -1), "cols": ((1000, 64), "C", 0),
        "fold": ((100000, 4), "C", 0), "middle": ((8, 100, 16), "C", 1), "forder": ((64, 1000), "F", 1),
        "small": ((7,), "C", None)}
    dtypes = (f32, f16, bf16, f64, np.int32, np.int64, np.uint8, np.bool_, np.complex64)
    for op, (lay, (shape, order, axis)), t in itertools.product(reductions, layouts.items(), dtypes):
        out.append((f"{op} {lay} {np.dtype(t).name}", lambda op=op, s=shape, o=order, ax=axis, t=t:
                    getattr(cukern, op)(_a(s, t, o), axis=ax)))
    for op in ("sum", "mean", "var", "norm"):
        for t, d in ((f32, f64), (bf16, f32), (np.int32, f64), (f16, f32)):
            out.append((f"{op} dtype {np.dtype(t).name}->{np.dtype(d).name}",
                        lambda op=op, t=t, d=d: getattr(cukern, op)(_a((64, 1000), t), axis=1, dtype=d)))
    for op, (lay, (shape, order, axis)), t in itertools.product(
            ("argmax", "argmin", "nanargmax", "nanargmin"), layouts.items(), (f32, f16, bf16, f64, np.int64,
                                                                            np.uint8, np.complex64)):
        if lay != "middle" or op == "argmax":
            out.append((f"{op} {lay} {np.dtype(t).name}", lambda op=op, s=shape, o=order, ax=axis, t=t:
                        getattr(cukern, op)(_a(s, t, o), axis=ax)))
    for op, trail, t, ot in itertools.product(("segment_sum", "segment_max", "segment_min", "segment_mean"),
                                              ((), (8,), (1000,)), (f32, bf16, f64, np.int32), (np.int32, np.int64)):
        out.append((f"{op} {trail} {np.dtype(t).name} {np.dtype(ot).name}", lambda op=op, tr=trail, t=t, ot=ot:
                    getattr(cukern, op)(_a((5000, *tr), t), _a((101,), ot), check_offsets=False)))
    scans = {"1d": ((1 << 22,), None), "rows": ((64, 5000), -1), "columns": ((4096, 4096), 0),
             "few columns": ((1 << 18, 64), 0), "short": ((100,), None)}
    for op, (lay, (shape, axis)), t in itertools.product(("cumsum", "cumprod"), scans.items(),
                                                         (f32, f16, bf16, f64, np.int32, np.int64, np.complex64)):
        out.append((f"{op} {lay} {np.dtype(t).name}", lambda op=op, s=shape, ax=axis, t=t:
                    getattr(cukern, op)(_a(s, t), axis=ax)))
    for hidden, t, w in itertools.product((128, 4096, 5000, 100000), (f16, bf16, f32), (None, "same", f32)):
        wt = None if w is None else t if w == "same" else w
        out.append((f"rms_norm {hidden} {np.dtype(t).name} {wt}", lambda h=hidden, t=t, wt=wt: cukern.rms_norm(
            _a((64, h), t), None if wt is None else _a((h,), wt))))
        out.append((f"fused_add_rms_norm {hidden} {np.dtype(t).name} {wt}", lambda h=hidden, t=t, wt=wt:
                    cukern.fused_add_rms_norm(_a((64, h), t), _a((64, h), t), None if wt is None else _a((h,), wt))))
        for scale in (0.5, "per_token"):
            out.append((f"rms_norm fp8 {scale} {hidden} {np.dtype(t).name} {wt}",
                        lambda h=hidden, t=t, wt=wt, s=scale: cukern.rms_norm(
                            _a((64, h), t), None if wt is None else _a((h,), wt), out_dtype="float8_e4m3fn",
                            scale=s)))
            out.append((f"fused_add_rms_norm fp8 {scale} {hidden} {np.dtype(t).name} {wt}",
                        lambda h=hidden, t=t, wt=wt, s=scale: cukern.fused_add_rms_norm(
                            _a((64, h), t), _a((64, h), t), None if wt is None else _a((h,), wt),
                            out_dtype="float8_e4m3fn", scale=s)))
    for t, neox, dim, key, ct in itertools.product((f16, bf16, f32), (True, False), (None, 64), (True, False),
                                                  (f32, "same")):
        cache_t = t if ct == "same" else ct
        out.append((f"rotary {np.dtype(t).name} neox={neox} dim={dim} key={key} cache={np.dtype(cache_t).name}",
                    lambda t=t, n=neox, d=dim, k=key, c=cache_t: cukern.rotary_embedding(
                        _a((16,), np.int64), _a((16, 32, 128), t), _a((16, 8, 128), t) if k else None,
                        _a((4096, d or 128), c), is_neox=n, rotary_dim=d)))
        out.append((f"rotary_embedding_positions {np.dtype(t).name} neox={neox} dim={dim} key={key}",
                    lambda t=t, n=neox, d=dim, k=key: cukern.rotary_embedding_positions(
                        _a((16,), np.int64), _a((16, 32, 128), t), _a((16, 8, 128), t) if k else None,
                        rotary_dim=d or 128, is_neox=n)))
        out.append((f"rotary_embedding_mrope {np.dtype(t).name} neox={neox} key={key} cache={np.dtype(cache_t).name}",
                    lambda t=t, n=neox, k=key, c=cache_t: cukern.rotary_embedding_mrope(
                        _a((3, 16), np.int64), _a((16, 32, 128), t), _a((16, 8, 128), t) if k else None,
                        _a((4096, 128), c), mrope_section=(16, 24, 24), is_neox=n)))
        out.append((f"qk_norm_rope {np.dtype(t).name} neox={neox} dim={dim} key={key} cache={np.dtype(cache_t).name}",
                    lambda t=t, n=neox, d=dim, k=key, c=cache_t: cukern.qk_norm_rope(
                        _a((16,), np.int64), _a((16, 32, 128), t), _a((16, 8, 128), t) if k else None,
                        _a((128,), t), _a((128,), t) if k else None, _a((4096, d or 128), c), is_neox=n,
                        rotary_dim=d)))
    for x_t, o_t, mode in _convert.KERNELS:
        name = {_convert.VALUE: "astype", _convert.SQUARE: "square", _convert.ABS: "absolute",
                _convert.NONZERO: "nonzero"}[mode]
        out.append((f"convert {name} {x_t.name}->{o_t.name}", lambda x_t=x_t, o_t=o_t, mode=mode: _convert._run(
            _a((3, 50, 7), x_t)[:, ::2], _a((3, 25, 7), o_t), mode)))
    for rung in ladder.RUNGS:
        for t in (f32, f16, bf16, f64):
            out.append((f"ladder {rung.name} {np.dtype(t).name}", lambda r=rung, t=t: r(_a((1 << 20,), t))))
        out.append((f"ladder {rung.name} strided", lambda r=rung: r(_a((1 << 21,))[::2])))
    return out


def _run(call):
    """(error, launches) of one call: error None, or its first line (and, for CUDA's own errors, the last line
    of cukern it came through: a step of CuPy's that needs the driver)."""
    start = len(launches)
    try:
        result = call()
        error = None
    except Exception as err:  # noqa: BLE001 - a refusal before the launch is an answer too
        result = None
        error = f"{type(err).__name__}: {err}".splitlines()[0][:300]
        if "CUDARuntimeError" in error or "CUDADriverError" in error:
            frames = [f for f in traceback.extract_tb(err.__traceback__) if "cukern" in f.filename]
            error += f" at {frames[-1].filename.rsplit('/', 1)[-1]}:{frames[-1].lineno}" if frames else ""
    return error, launches[start:], result


def main(mode):
    """``launches``: each case once. ``capture``: each case once as it is, then again while the stream
    "captures", recording also the addresses the captured launches were given in memory the op made during
    the call and gave back before it returned (a graph's replay would write there)."""
    _install()
    records = []
    for name, call in cases():
        if mode == "launches":
            error, done, _ = _run(call)
            records.append((name, error, done))
            continue
        _run(call)
        first = len(allocations)
        _state["capturing"] = True
        try:
            error, done, result = _run(call)
        finally:
            _state["capturing"] = False
        gone = {base for base, _ in allocations[first:] if base in freed and base in made_by_op}
        spans = [(base, size) for base, size in allocations[first:] if base in gone]
        hit = sorted({a[1] for *_, args in done for a in args if a[0] in ("ptr", "uint64")
                      and any(base <= a[1] < base + max(size, 1) for base, size in spans)})
        records.append((name, error, done, hit))
        del result
    pickle.dump((records, allocations), sys.stdout.buffer)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "launches")
