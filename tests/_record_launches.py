"""Run every op on CuPy arrays over memory nothing reads, with no GPU, and record the launches it would make.

Run as a script in a process of its own (tests/test_launch_contract.py does): it replaces CuPy's allocator,
its current stream and device queries, and each op module's ``get_kernel`` and ``struct_argument``, so an op
plans, validates and packs its arguments as it would on a GPU and hands them to a recorder instead of the
driver. It pickles to stdout a list of ``(case, error, launches)``, each launch
``(instantiation, grid, block, shared_mem, dynamic_shared_limit, args)`` with every argument described as
``("ptr", address)``, ``("struct", itemsize, alignment, fields)`` (``fields``: each field's value by name,
empty for a struct of no fields) or ``(NumPy type name, value)``; and the allocations, ``(address, bytes)``.
"""

import inspect
import itertools
import pickle
import sys
import traceback
import weakref

import cupy
import numpy as np

import cukern
from cukern import (_convert, _launch, _tuned, argreduce, ladder, layernorm, qknorm, reduce, rmsnorm,
                    rmsnorm_backward, rotary, scan, segment)
from cukern._dtypes import BFLOAT16

MODULES = (_convert, argreduce, ladder, layernorm, qknorm, reduce, rmsnorm, rmsnorm_backward, rotary, scan, segment)

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
    ptr = 0  # a Prepared launch's function handle; its calls are recorded (_prepared) and never reach a driver

    def __init__(self, inst):
        self.inst = inst
        self.kernel = self
        self.max_dynamic_shared_size_bytes = None

    def __call__(self, grid, block, args, shared_mem=0):
        launches.append((self.inst, tuple(grid), tuple(block), shared_mem, self.max_dynamic_shared_size_bytes,
                         [_describe(a) for a in args]))
        if self.inst.name == "rotary_first_bad_position":  # the answer: no position outside the cache
            np.frombuffer(pinned[int(args[0].struct)], np.int64)[0] = 1 << 62


def _prepared(self, stream, *values):
    """A :class:`cukern._launch.Prepared` launch, recorded as the same arguments through ``kernel(...)``: a
    slot's address as a pointer, a struct with its slot fields set."""
    args = list(self.args)
    for slot, value in zip(self.slots, values):
        if isinstance(slot, tuple):
            i, name = slot
            args[i] = args[i].copy()
            args[i][name] = value
        else:
            args[slot] = cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(value, 1, None, device_id=0), 0)
    args = [_Struct(a) if isinstance(a, np.ndarray) else a for a in args]
    config = self.config
    self.kernel(config.grid, config.block, args, shared_mem=config.shared_mem)


def _describe(a):
    if isinstance(a, cupy.ndarray):
        return ("ptr", a.data.ptr)
    if isinstance(a, cupy.cuda.MemoryPointer):
        return ("ptr", a.ptr)
    if isinstance(a, _Struct):
        fields = {n: a.struct[n].item() for n in a.struct.dtype.names or ()}
        return ("struct", a.struct.dtype.itemsize, a.struct.dtype.alignment, fields)
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
    _launch.Prepared.__call__ = _prepared
    _launch._sm_counts[0] = 132
    _launch._gpu_seen = True
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
    weighted = {  # x's shape and axis, b's shape: rows with one weight row, a full reduction, columns, copied
        "rows": ((64, 1000), -1, (1000,)), "full": ((1 << 16,), None, (1 << 16,)), "cols": ((1000, 64), 0, (1000, 1)),
        "merged": ((4, 4, 4, 50), 3, (50,))}
    for (lay, (shape, axis, b_shape)), t in itertools.product(weighted.items(), (f32, f16, bf16, f64)):
        out.append((f"logsumexp weighted {lay} {np.dtype(t).name}", lambda s=shape, ax=axis, bs=b_shape, t=t:
                    cukern.logsumexp(_a(s, t), axis=ax, b=_a(bs, t), return_sign=True)))
    out.append(("logsumexp weighted transposed float32", lambda: cukern.logsumexp(
        _a((4, 4, 4, 50)).transpose(1, 0, 2, 3), axis=3, b=_a((50,)))))
    c64, c128 = np.complex64, np.complex128
    for (lay, (shape, axis, b_shape)), t, tb in itertools.product(weighted.items(), (c64, c128, f32),
                                                                 (c64, c128, f64, None)):
        if t == f32 and tb in (f64, None):
            continue  # real results: the cases above
        out.append((f"logsumexp complex {lay} {np.dtype(t).name} b {tb and np.dtype(tb).name}",
                    lambda s=shape, ax=axis, bs=b_shape, t=t, tb=tb: cukern.logsumexp(
                        _a(s, t), axis=ax, b=None if tb is None else _a(bs, tb), return_sign=tb == c128)))
    out.append(("logsumexp complex transposed complex128", lambda: cukern.logsumexp(
        _a((4, 4, 4, 50), c128).transpose(1, 0, 2, 3), axis=3, return_sign=True)))
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
        out.append((f"rms_norm rstd {hidden} {np.dtype(t).name} {wt}", lambda h=hidden, t=t, wt=wt: cukern.rms_norm(
            _a((64, h), t), None if wt is None else _a((h,), wt), return_rstd=True)))
        out.append((f"fused_add_rms_norm rstd {hidden} {np.dtype(t).name} {wt}", lambda h=hidden, t=t, wt=wt:
                    cukern.fused_add_rms_norm(_a((64, h), t), _a((64, h), t), None if wt is None else _a((h,), wt),
                                              return_rstd=True)))
        for scale in (0.5, "per_token"):
            out.append((f"rms_norm fp8 {scale} {hidden} {np.dtype(t).name} {wt}",
                        lambda h=hidden, t=t, wt=wt, s=scale: cukern.rms_norm(
                            _a((64, h), t), None if wt is None else _a((h,), wt), out_dtype="float8_e4m3fn",
                            scale=s)))
            out.append((f"fused_add_rms_norm fp8 {scale} {hidden} {np.dtype(t).name} {wt}",
                        lambda h=hidden, t=t, wt=wt, s=scale: cukern.fused_add_rms_norm(
                            _a((64, h), t), _a((64, h), t), None if wt is None else _a((h,), wt),
                            out_dtype="float8_e4m3fn", scale=s)))
    for hidden, rows, t, w in itertools.product((7, 128, 989, 4096, 8192), (1, 111, 4095), (f16, bf16, f32),
                                                (None, "same", f32)):
        wt = None if w is None else t if w == "same" else w
        for given in (False, True):
            out.append((f"rms_norm_backward {rows}x{hidden} {np.dtype(t).name} {wt} rstd={given}",
                        lambda h=hidden, n=rows, t=t, wt=wt, g=given: cukern.rms_norm_backward(
                            _a((n, h), t), _a((n, h), t), None if wt is None else _a((h,), wt),
                            rstd=_a((n,), f32) if g else None, dresidual=_a((n, h), t) if g else None)))
    for hidden, t, w in itertools.product((7, 128, 4096, 5000, 8192), (f16, bf16, f32), (None, "same", f32)):
        wt = None if w is None else t if w == "same" else w
        par = (lambda h, wt: None if wt is None else _a((h,), wt))
        out.append((f"layer_norm {hidden} {np.dtype(t).name} {wt}", lambda h=hidden, t=t, wt=wt: cukern.layer_norm(
            _a((64, h), t), par(h, wt), par(h, wt), return_stats=wt is not None)))
        out.append((f"fused_add_layer_norm {hidden} {np.dtype(t).name} {wt}", lambda h=hidden, t=t, wt=wt:
                    cukern.fused_add_layer_norm(_a((64, h), t), _a((64, h), t), par(h, wt), par(h, wt))))
        for rows, stats, dres in ((64, True, False), (3000, False, True), (1, True, True)):
            out.append((f"layer_norm_backward {rows}x{hidden} {np.dtype(t).name} {wt} stats={stats} dres={dres}",
                        lambda h=hidden, t=t, wt=wt, n=rows, st=stats, dr=dres: cukern.layer_norm_backward(
                            _a((n, h), t), _a((n, h), t), par(h, wt), mean=_a((n,), f32) if st else None,
                            rstd=_a((n,), f32) if st else None, dresidual=_a((n, h), t) if dr else None)))
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
    for rung in ladder.RUNGS + (ladder.BEYOND,):
        for t in (f32, f16, bf16, f64):
            out.append((f"ladder {rung.name} {np.dtype(t).name}", lambda r=rung, t=t: r(_a((1 << 20,), t))))
        out.append((f"ladder {rung.name} strided", lambda r=rung: r(_a((1 << 21,))[::2])))
    return out


POOL = (np.float32, np.float16, BFLOAT16, np.float64, np.int32, np.int64, np.uint8, np.bool_, np.complex64)
POOL_NAMES = tuple("bfloat16" if t is BFLOAT16 else np.dtype(t).name for t in POOL)
NOT_ARRAYS = (("numpy", lambda s, t: np.zeros(s, t)), ("list", lambda s, t: np.zeros(s).tolist()),
              ("scalar", lambda s, t: 1.0))


def _array_values(shape, ok, *, optional=False, shapes=(), unit_last=False, written=False):
    """(label, make) of the bad values of an array argument of ``shape`` (a good one's) taking dtypes ``ok``:
    host arrays, lists and scalars, None unless optional, each dtype of POOL outside ``ok``, each of
    ``shapes``, a last stride of 2 where the op needs 1, and a broadcast view where the op writes."""
    t = ok[0]
    out = [(label, lambda f=f: f(shape, t)) for label, f in NOT_ARRAYS]
    if not optional:
        out.append(("None", lambda: None))
    out += [(n, lambda u=u: _a(shape, u)) for n, u in zip(POOL_NAMES, POOL) if np.dtype(u) not in ok]
    out += [(f"shape {s}", lambda s=s: _a(s, t)) for s in shapes]
    if unit_last:
        out.append(("last stride 2", lambda: _a(shape[:-1] + (2 * shape[-1],), t)[..., ::2]))
    if written:
        out.append(("broadcast", lambda: cupy.broadcast_to(_a(shape[1:], t), shape)))
    return out


NAN, INF = float("nan"), float("inf")
REAL_VALUES = (("nan", NAN), ("inf", INF), ("-inf", -INF), ("str", "1"), ("complex", 1j), ("None", None),
               ("2 elements", np.ones(2, np.float32)), ("numpy nan", np.float32(NAN)), ("int past float64", 10**400))
FLAG_VALUES = (("1", 1), ("None", None), ("str", "yes"), ("2 elements", np.ones(2, np.bool_)))
INT_VALUES = (("True", True), ("float", 64.0), ("str", "64"), ("None", None), ("complex", 1j), ("huge", 2**64))
AXIS_VALUES = (("2", 2), ("-3", -3), ("(0, 0)", (0, 0)), ("(1, -1)", (1, -1)), ("1.0", 1.0), ("True", True),
               ("numpy True", np.True_), ("[0]", [0]), ("str", "0"), ("(0, 1.0)", (0, 1.0)))
DTYPE_VALUES = (("not a dtype", "float33"), ("float", 1.5), ("big-endian", ">f4"), ("long double", np.longdouble),
                ("object", object))


def _sweep(op, fn, good, bad):
    """(name, argument, call) of ``fn(**good())``, then of it with one argument at a time replaced by each of
    its bad values: ``bad`` maps an argument to (label, value or a maker of one) pairs. The valid call's
    argument is None."""
    out = [(f"{op} valid", None, lambda: fn(**good()))]  # first: a valid call, which fills the call caches
    for arg, values in bad.items():
        for label, value in values:
            def call(arg=arg, value=value):
                kwargs = good()
                kwargs[arg] = value() if callable(value) and not isinstance(value, type) else value
                return fn(**kwargs)
            out.append((f"{op} {arg}={label}", arg, call))
    return out


def _overlaps(op, fn, good, cases):
    """(name, argument, call) of ``fn(**good())`` with some arrays replaced by views of one buffer:
    ``cases`` are (label, argument the message names, maker of the replacements)."""
    return [(f"{op} {label}", arg, lambda make=make: fn(**{**good(), **make()})) for label, arg, make in cases]


def _views(shape, *offsets):
    """Views of ``shape`` at each row offset of one buffer (rows along axis 0)."""
    buf = _a((shape[0] + max(offsets),) + shape[1:])
    return [buf[o:o + shape[0]] for o in offsets]


def bad_cases():
    """(name, argument, call): each public op with one argument at a time made bad. Each call must raise a
    TypeError, ValueError or IndexError naming ``argument`` in one line, before anything is recorded."""
    f32, floats = np.dtype(np.float32), tuple(np.dtype(t) for t in (np.float32, np.float16, BFLOAT16))
    T, H = 4, 64
    cases = []
    eps = REAL_VALUES + (("negative", -1e-6), ("past float32", 1e39))
    fp8_scale = REAL_VALUES[:5] + (("zero", 0.0), ("negative", -1.0), ("below 2^-126", 1e-39), ("other str", "token"),
                                   ("2 elements", np.ones(2, np.float32)), ("nan element", np.full(1, NAN)),
                                   ("complex element", np.ones(1, np.complex64)))
    for fused in (False, True):
        op = "fused_add_rms_norm" if fused else "rms_norm"
        fn = getattr(cukern, op)

        def good(fused=fused):
            return {"x": _a((T, H)), **({"residual": _a((T, H))} if fused else {})}

        bad = {"x": _array_values((T, H), floats, shapes=[()], unit_last=True),
               "weight": _array_values((H,), (f32,), optional=True, shapes=[(H - 1,), (1, H), ()], unit_last=True),
               "out": _array_values((T, H), (f32,), optional=True, shapes=[(T, H - 1), (H,)], unit_last=True,
                                    written=True),
               "eps": eps, "offset": REAL_VALUES + (("past float32", -1e39),),
               "out_dtype": DTYPE_VALUES + (("float64", "float64"), ("int8", np.int8), ("float8 e5m2", "float8_e5m2")),
               "scale": (("without float8", 1.0),)}
        if fused:
            bad["residual"] = _array_values((T, H), (f32,), shapes=[(T, H + 1), (H,)], unit_last=True, written=True)
        cases += _sweep(op, fn, good, bad)

        def fp8(fused=fused):
            return {**good(fused), "out_dtype": "float8_e4m3fn", "scale": "per_token"}

        bad = {"scale": fp8_scale, "out": _array_values((T, H), (np.dtype(np.uint8),), optional=True,
                                                        shapes=[(T, H - 1)], unit_last=True, written=True),
               "eps": eps[:3], "offset": REAL_VALUES[:3], "weight": _array_values((H,), (f32,), optional=True,
                                                                                   shapes=[(H - 1,)])}
        if fused:
            bad["residual"] = _array_values((T, H), (f32,), shapes=[(T, H + 1)], written=True)
        cases += _sweep(f"{op} float8", fn, fp8, bad)
        def out_over_weight():
            buf = _a((T, H))
            return {"out": buf, "weight": buf[1]}

        def weight_in_residual():
            buf = _a((T, H))
            return {"residual": buf, "weight": buf[2]}

        def fp8_out_over_x():
            buf = _a((T, 2 * H))
            return {"x": buf[:, :H], "out": buf.view(np.uint8)[:, :H]}

        rows = [("out partially overlaps x", "out", lambda: dict(zip(("x", "out"), _views((T, H), 0, 1)))),
                ("out overlaps weight", "out", out_over_weight)]
        if fused:
            rows += [("residual overlaps x", "residual", lambda: dict(zip(("x", "residual"), _views((T, H), 0, 1)))),
                     ("residual is x", "residual", lambda: dict(zip(("x", "residual"), _views((T, H), 0, 0)))),
                     ("weight in residual", "weight", weight_in_residual),
                     ("out overlaps residual", "out", lambda: dict(zip(("residual", "out"), _views((T, H), 0, 1)))),
                     ("out is residual", "out", lambda: dict(zip(("residual", "out"), _views((T, H), 0, 0))))]
        cases += _overlaps(op, fn, good, rows)
        cases += _overlaps(f"{op} float8", fn, fp8, [("out overlaps x", "out", fp8_out_over_x)])
    cases += _backward_cases(T, H)
    cases += _layer_norm_cases(T, H, eps[:-1] + (("past float32", -1e39),))
    cases += _rotary_cases(T)
    cases += _reduction_cases()
    return cases


def _backward_cases(T, H):
    """rms_norm_backward's bad arguments, one at a time, and dx over its inputs."""
    f32, floats = np.dtype(np.float32), tuple(np.dtype(t) for t in (np.float32, np.float16, BFLOAT16))
    fn = cukern.rms_norm_backward

    def good():
        return {"dy": _a((T, H)), "x": _a((T, H)), "weight": _a((H,))}

    bad = {"dy": _array_values((T, H), (f32,), shapes=[(T, H - 1), (H,)], unit_last=True),
           "x": _array_values((T, H), floats, shapes=[()], unit_last=True),
           "weight": _array_values((H,), (f32,), optional=True, shapes=[(H - 1,), (1, H), ()], unit_last=True),
           "rstd": _array_values((T,), (f32,), optional=True, shapes=[(T, 1), (T - 1,), ()]),
           "dresidual": _array_values((T, H), (f32,), optional=True, shapes=[(T, H + 1)], unit_last=True),
           "dx": _array_values((T, H), (f32,), optional=True, shapes=[(T, H - 1)], unit_last=True, written=True),
           "eps": REAL_VALUES + (("negative", -1e-6), ("past float32", 1e39)),
           "offset": REAL_VALUES + (("past float32", -1e39),)}
    cases = _sweep("rms_norm_backward", fn, good, bad)

    def out_over(name, same):
        def make():
            views = _views((T, H), 0, 0 if same else 1)
            return {name: views[0], "dx": views[1]}
        return make

    def out_over_weight():
        buf = _a((T, H))
        return {"dx": buf, "weight": buf[1]}

    def out_over_rstd():
        buf = _a((T, H))
        return {"dx": buf, "rstd": buf[:, 0]}

    rows = [("dx is x", "dx", out_over("x", True)), ("dx partially overlaps x", "dx", out_over("x", False)),
            ("dx partially overlaps dy", "dx", out_over("dy", False)),
            ("dx partially overlaps dresidual", "dx", out_over("dresidual", False)),
            ("dx overlaps weight", "dx", out_over_weight), ("dx overlaps rstd", "dx", out_over_rstd)]
    return cases + _overlaps("rms_norm_backward", fn, good, rows)


def _layer_norm_cases(T, H, eps):
    """:func:`bad_cases`' of layer_norm, fused_add_layer_norm and layer_norm_backward, over float32 (T, H)."""
    f32, floats = np.dtype(np.float32), tuple(np.dtype(t) for t in (np.float32, np.float16, BFLOAT16))
    cases = []
    param = _array_values((H,), (f32,), optional=True, shapes=[(H - 1,), (1, H), ()], unit_last=True)
    for fused in (False, True):
        op = "fused_add_layer_norm" if fused else "layer_norm"

        def good(fused=fused):
            return {"x": _a((T, H)), "weight": _a((H,)), "bias": _a((H,)),
                    **({"residual": _a((T, H))} if fused else {})}

        bad = {"x": _array_values((T, H), floats, shapes=[()], unit_last=True), "weight": param, "bias": param,
               "out": _array_values((T, H), (f32,), optional=True, shapes=[(T, H - 1), (H,)], unit_last=True,
                                    written=True),
               "eps": eps}
        if fused:
            bad["residual"] = _array_values((T, H), (f32,), shapes=[(T, H + 1), (H,)], unit_last=True, written=True)
        cases += _sweep(op, getattr(cukern, op), good, bad)

        def bias_over_residual():
            buf = _a((T, H))
            return {"residual": buf, "bias": buf[2]}

        rows = [("out partially overlaps x", "out", lambda: dict(zip(("x", "out"), _views((T, H), 0, 1))))]
        if fused:
            rows += [("residual overlaps x", "residual", lambda: dict(zip(("x", "residual"), _views((T, H), 0, 1)))),
                     ("bias in residual", "bias", bias_over_residual),
                     ("out is residual", "out", lambda: dict(zip(("residual", "out"), _views((T, H), 0, 0))))]
        cases += _overlaps(op, getattr(cukern, op), good, rows)
    cases += [("layer_norm hidden over the limit", "x",
               lambda: cukern.layer_norm(_a((2, layernorm.MAX_HIDDEN + 1))))]

    def backward():
        return {"dy": _a((T, H)), "x": _a((T, H)), "weight": _a((H,)), "mean": _a((T,)), "rstd": _a((T,))}

    stat = _array_values((T,), (f32,), optional=True, shapes=[(T + 1,), (T, 1)])
    bad = {"dy": _array_values((T, H), (f32,), shapes=[(T, H - 1), (H,)], unit_last=True),
           "x": _array_values((T, H), floats, shapes=[()], unit_last=True), "weight": param,
           "mean": stat, "rstd": stat, "eps": eps,
           "dresidual": _array_values((T, H), (f32,), optional=True, shapes=[(T, H + 1)], unit_last=True),
           "dx": _array_values((T, H), (f32,), optional=True, shapes=[(T, H - 1)], unit_last=True, written=True)}
    fn = cukern.layer_norm_backward
    cases += _sweep("layer_norm_backward", fn, backward, bad)

    def dx_over(name):
        def make():
            buf = _a((2 * T, H))
            return {name: buf[:T], "dx": buf[1:T + 1]}
        return make

    cases += _overlaps("layer_norm_backward", fn, backward, [
        ("dx partially overlaps dy", "dx", dx_over("dy")), ("dx overlaps x", "dx", dx_over("x")),
        ("dx is x", "dx", lambda: dict(zip(("x", "dx"), _views((T, H), 0, 0))))])
    return cases


def _reduction_cases():
    """:func:`bad_cases`' of the reductions, scans, segment reductions and ladder rungs, over float32 x of
    shape (4, 5) (the segments': 10 rows of 3, offsets [0, 4, 10])."""
    cases = []
    x = _array_values((4, 5), POOL)
    keepdims = (("None", None), ("str", "yes"), ("float", 1.0), ("2 elements", np.ones(2, np.bool_)))  # NumPy's
    reductions = ("sum", "mean", "amax", "amin", "prod", "any", "all", "count_nonzero", "sum_of_squares", "norm",
                  "var", "std", "nansum", "nanmean", "nanmax", "nanmin", "logsumexp")
    for op in reductions + ("argmax", "argmin", "nanargmax", "nanargmin"):
        fn = getattr(cukern, op)
        params = inspect.signature(fn).parameters
        result = np.int64 if op.startswith(("arg", "nanarg")) else np.bool_ if op in ("any", "all") else np.float32
        bad = {"x": x, "axis": AXIS_VALUES, "keepdims": keepdims}
        if "out" in params:
            bad["out"] = [v for v in _array_values((4,), (np.dtype(result),), optional=True, shapes=[(5,), (4, 1)])
                          if v[0] not in POOL_NAMES]  # another dtype takes the result cast, as NumPy's
            bad["out"].append(("broadcast", lambda r=result: cupy.broadcast_to(_a((1,), r), (4,))))
        if "dtype" in params:
            bad["dtype"] = DTYPE_VALUES
        if "ddof" in params:
            bad["ddof"] = (("True", True), ("nan", NAN), ("inf", INF), ("str", "1"), ("None", None), ("complex", 1j),
                           ("2 elements", np.ones(2)), ("int past float64", 10**400))
        if op.startswith(("arg", "nanarg")):
            bad["axis"] = AXIS_VALUES[:2] + AXIS_VALUES[4:] + (("(1,)", (1,)),)
            bad["out"] += [(n, lambda t=t: _a((4,), t)) for n, t in (("float32", np.float32), ("uint64", np.uint64),
                                                                    ("complex64", np.complex64))]

        def good(op=op):
            return {"x": _a((4, 5)), "axis": 1}

        cases += _sweep(op, fn, good, bad)
        if "out" in params:
            cases += _overlaps(op, fn, good, [("out in x", "out", lambda r=result: {
                "x": (v := _a((4, 8), r)[:, :5] if r != np.float32 else _a((4, 5))), "out": v[:, 0]})])
    for op in ("cumsum", "cumprod"):
        fn = getattr(cukern, op)

        def good():
            return {"x": _a((4, 5)), "axis": 1}

        cases += _sweep(op, fn, good, {
            "x": x, "axis": AXIS_VALUES[:2] + AXIS_VALUES[4:] + (("(1,)", (1,)),), "dtype": DTYPE_VALUES,
            "out": [v for v in _array_values((4, 5), (np.dtype(np.float32),), optional=True,
                                             shapes=[(4, 4), (20,), (5, 4)], written=True) if v[0] not in POOL_NAMES]})
        cases += _overlaps(op, fn, good, [("out overlaps x", "out", lambda: dict(zip(("x", "out"),
                                                                                     _views((4, 5), 0, 1))))])
    for op in ("segment_sum", "segment_max", "segment_min", "segment_mean"):
        fn = getattr(cukern, op)

        def good():
            return {"x": _a((10, 3)), "offsets": _a((3,), np.int32), "check_offsets": False}

        ints = (np.dtype(np.int32), np.dtype(np.int64))
        cases += _sweep(op, fn, good, {
            "x": _array_values((10, 3), (np.dtype(np.float32),), shapes=[()])[:4],
            "offsets": _array_values((3,), ints, shapes=[(3, 1), (0,), ()]),
            "out": _array_values((2, 3), (np.dtype(np.float32),), optional=True, shapes=[(3, 3), (2,)], written=True),
            "check_offsets": FLAG_VALUES})
        cases += _overlaps(op, fn, good, [
            ("out in x", "out", lambda: {"x": (v := _a((10, 3))), "out": v[2:4]}),
            ("out over offsets", "out", lambda: {"offsets": (v := _a((2, 3), np.float32))[0].view(np.int32),
                                                 "out": v})])
    for rung in cukern.reduce_ladder:
        cases += _sweep(f"ladder {rung.number}", rung, lambda: {"x": _a((1 << 12,))},
                        {"x": _array_values((1 << 12,), tuple(np.dtype(t) for t in (np.float32, np.float16, BFLOAT16,
                                                                                     np.float64)))})
    return cases


def _rotary_cases(T):
    """:func:`bad_cases`' of the rotary ops: 4 tokens, 2 query heads and 1 key head of 64 elements."""
    floats = tuple(np.dtype(t) for t in (np.float32, np.float16, BFLOAT16))
    ints = (np.dtype(np.int32), np.dtype(np.int64))
    f32, D = floats[0], 64
    cases = []
    query = _array_values((T, 2, D), floats, shapes=[(T, 2 * D), (T, 2, D, 1)], unit_last=True, written=True)
    key = _array_values((T, 1, D), (f32,), optional=True, shapes=[(T - 1, 1, D), (T, 1, D // 2), (T, D)],
                        unit_last=True, written=True)
    positions = _array_values((T,), ints, shapes=[(T + 1,), (T, 1), ()])
    cache = _array_values((16, D), (f32,), shapes=[(16, D - 1), (D,), (16, D, 1)], unit_last=True)
    rot = tuple(v for v in INT_VALUES if v[1] is not None) + (("odd", 3), ("0", 0), ("negative", -2))
    over = (("over head_size", 2 * D),)
    flags = {n: FLAG_VALUES for n in ("is_neox", "inverse", "check_positions")}
    pair = ("key overlaps query", "key", lambda: dict(zip(("query", "key"), _views((T, 2, D), 0, 1)))), \
        ("key is query", "key", lambda: dict(zip(("query", "key"), _views((T, 2, D), 0, 0)))), \
        ("positions in query", "positions", lambda: {"query": (q := _a((T, 2, D))),
                                                     "positions": q[0, 0, :2 * T].view(np.int64)}), \
        ("cache in query", "cos_sin_cache", lambda: {"query": (q := _a((T, 2, D))), "cos_sin_cache": q.reshape(-1, D)})

    def good():
        return {"positions": _a((T,), np.int64), "query": _a((T, 2, D)), "key": _a((T, 1, D)),
                "cos_sin_cache": _a((16, D))}

    fn = cukern.rotary_embedding
    cases += _sweep("rotary_embedding", fn, good, {"positions": positions, "query": query, "key": key,
                                                   "cos_sin_cache": cache, "rotary_dim": rot + over, **flags})
    cases += _overlaps("rotary_embedding", fn, good, pair + (
        ("cache too narrow", "cos_sin_cache", lambda: {"cos_sin_cache": _a((16, D // 2)), "rotary_dim": D}),))

    def mrope():
        return {**good(), "positions": _a((3, T), np.int64), "mrope_section": (8, 12, 12)}

    fn = cukern.rotary_embedding_mrope
    sections = (("sum off", (8, 12, 13)), ("two", (16, 16)), ("negative", (-8, 20, 20)), ("floats", (8.0, 12, 12)),
                ("bools", (True, 15, 16)), ("None", None), ("str", "8,12,12"), ("int", 32))
    cases += _sweep("rotary_embedding_mrope", fn, mrope, {
        "positions": _array_values((3, T), ints, shapes=[(3, T + 1), (2, T), (3, T, 1)]), "query": query,
        "key": key, "cos_sin_cache": cache, "mrope_section": sections, "rotary_dim": rot + over,
        **{n: FLAG_VALUES for n in ("is_neox", "interleaved", "check_positions")}})
    cases += _overlaps("rotary_embedding_mrope", fn, mrope, pair[:2] + pair[3:] + (
        ("positions in query", "positions", lambda: {"query": (q := _a((T, 2, D))),
                                                     "positions": q[0, 0, :6 * T].view(np.int64).reshape(3, T)}),))

    def computed():
        return {"positions": _a((T,), np.int64), "query": _a((T, 2, D)), "key": _a((T, 1, D)), "rotary_dim": D}

    fn = cukern.rotary_embedding_positions
    cases += _sweep("rotary_embedding_positions", fn, computed, {
        "positions": positions, "query": query, "key": key, "rotary_dim": rot + over + (("None", None),),
        "base": REAL_VALUES + (("1", 1.0), ("0", 0), ("negative", -10000.0)), "is_neox": FLAG_VALUES,
        "max_position": tuple(v for v in INT_VALUES if v[1] is not None) + (("0", 0), ("negative", -1)),
        "scaling": (("str", "linear"), ("unknown type", {"type": "ntk", "factor": 2.0}),
                    ("factor nan", {"type": "linear", "factor": NAN}))})
    cases += _overlaps("rotary_embedding_positions", fn, computed, pair[:3])

    def qk():
        return {**good(), "q_weight": _a((D,)), "k_weight": _a((D,))}

    fn = cukern.qk_norm_rope
    weight = _array_values((D,), (f32,), optional=True, shapes=[(D - 1,), (1, D)], unit_last=True)
    cases += _sweep("qk_norm_rope", fn, qk, {
        "positions": positions, "query": query, "key": key, "cos_sin_cache": cache, "q_weight": weight,
        "k_weight": weight, "rotary_dim": rot + over, "eps": REAL_VALUES + (("negative", -1e-6),),
        "offset": REAL_VALUES, **{n: FLAG_VALUES for n in ("is_neox", "check_positions")}})
    cases += _overlaps("qk_norm_rope", fn, qk, pair + (
        ("q_weight in query", "q_weight", lambda: {"query": (q := _a((T, 2, D))), "q_weight": q[1, 0]}),
        ("k_weight in key", "k_weight", lambda: {"key": (k := _a((T, 1, D))), "k_weight": k[2, 0]})))

    def qk_backward():
        return {**qk(), "dq": _a((T, 2, D)), "dk": _a((T, 1, D))}

    fn = cukern.qk_norm_rope_backward
    read_query = _array_values((T, 2, D), floats, shapes=[(T, 2 * D), (T, 2, D, 1)], unit_last=True)
    read_key = _array_values((T, 1, D), (f32,), optional=True, shapes=[(T - 1, 1, D), (T, 1, D // 2), (T, D)],
                             unit_last=True)
    cases += _sweep("qk_norm_rope_backward", fn, qk_backward, {
        "positions": positions, "dq": _array_values((T, 2, D), (f32,), shapes=[(T, 2, D - 1), (T, D)], unit_last=True),
        "dk": _array_values((T, 1, D), (f32,), optional=True, shapes=[(T, 2, D)], unit_last=True),
        "query": read_query, "key": read_key, "cos_sin_cache": cache, "q_weight": weight, "k_weight": weight,
        "rotary_dim": rot + over, "eps": REAL_VALUES + (("negative", -1e-6),), "offset": REAL_VALUES,
        "is_neox": FLAG_VALUES})

    def table():
        return {"max_position": 16, "rotary_dim": D}

    cases += _sweep("rope_cache", cukern.rope_cache, table, {
        "max_position": INT_VALUES + (("0", 0), ("negative", -1)), "rotary_dim": rot + (("None", None),),
        "base": REAL_VALUES + (("1", 1.0), ("0", 0), ("negative", -10000.0)),
        "dtype": DTYPE_VALUES + (("int32", np.int32), ("float64", np.float64), ("complex64", np.complex64)),
        "scaling": (("str", "linear"), ("a list", [2.0]), ("factor 0", {"type": "linear", "factor": 0.0}),
                    ("factor nan", {"type": "linear", "factor": NAN}))})
    return cases


def _view(rng, shape, dtype=np.float32, unit_last=False):
    """An input of ``shape`` in a drawn layout of a buffer of its own: its axes in any order in memory, each
    taken with a step of 1 to 3, either way, past a margin; with ``unit_last``, the last axis innermost and
    forward with step 1."""
    nd = len(shape)
    order = list(rng.permutation(nd - 1 if unit_last else nd)) + ([nd - 1] if unit_last else [])
    steps = [1 if unit_last and d == nd - 1 else int(rng.integers(1, 4)) for d in range(nd)]
    signs = [1 if unit_last and d == nd - 1 else int(rng.choice((-1, 1))) for d in range(nd)]
    starts = [int(rng.integers(0, 3)) for _ in range(nd)]
    base = _a(tuple(starts[d] + max(shape[d], 1) * steps[d] + 1 for d in order), dtype)
    v = base.transpose(tuple(np.argsort(order)))
    cut = []
    for n, step, sign, start in zip(shape, steps, signs, starts):
        if sign > 0:
            cut.append(slice(start, start + n * step, step))
        else:
            last = start + (n - 1) * step
            cut.append(slice(last, start - 1 if start else None, -step) if n else slice(0, 0))
    v = v[tuple(cut)]
    assert v.shape == tuple(shape), (v.shape, shape)
    return v


def _qkv(rng, tokens, q_heads, k_heads, head_size, dtype):
    """query and key: views of one fused qkv buffer (token axis drawn as :func:`_view` draws one), or each
    a view of its own."""
    if rng.random() < 0.5:
        qkv = _view(rng, (tokens, q_heads + 2 * k_heads, head_size), dtype, unit_last=True)
        return qkv[:, :q_heads], qkv[:, q_heads:q_heads + k_heads]
    return (_view(rng, (tokens, q_heads, head_size), dtype, unit_last=True),
            _view(rng, (tokens, k_heads, head_size), dtype, unit_last=True))


def layout_cases(seed=0, draws=1600):
    """(family, name, call) of ops over drawn layouts; each call returns ``(views, result)``: the arrays the
    kernels should address (and the numbers that say how much of them, and "op", the op a family of several
    drew), by name, and what the op returned."""
    rng = np.random.default_rng(seed)
    f32 = np.float32
    out = []

    def dims(k, low=0, high=4):
        return tuple(int(n) for n in rng.integers(low, high, k))

    families = ("rms_norm", "fused_add_rms_norm", "rms_norm_backward", "rotary", "rotary_positions", "mrope",
                "qk_norm_rope", "scan", "argreduce", "reduce", "segment")
    for i in range(draws):
        family = families[i % len(families)]
        seed_i = int(rng.integers(1 << 31))

        def call(family=family, r=np.random.default_rng(seed_i)):
            if family in ("rms_norm", "fused_add_rms_norm"):
                hidden = int(r.choice((8, 64, 100, 256, 5000, 16384, 20000, 16390)))
                shape = dims(int(r.integers(1, 4)), 0, 4 if hidden < 16384 else 3) + (hidden,)
                x = _view(r, shape, f32, unit_last=True)
                fp8 = r.random() < 0.3
                rstd = not fp8 and r.random() < 0.3
                o = None if r.random() < 0.3 else _view(r, shape, np.uint8 if fp8 else f32, unit_last=True)
                kw = {"out": o, **({"out_dtype": "float8_e4m3fn", "scale": "per_token"} if fp8 else {}),
                      **({"return_rstd": True} if rstd else {})}
                views = {"x": x}
                if family == "rms_norm":
                    got = cukern.rms_norm(x, **kw)
                else:
                    views["residual"] = _view(r, shape, f32, unit_last=True)
                    got = cukern.fused_add_rms_norm(x, views["residual"], **kw)
                views["out"], views["scales" if fp8 else "rstd"] = got if fp8 or rstd else (got, None)
                return {k: v for k, v in views.items() if v is not None}, None
            if family == "rms_norm_backward":
                hidden = int(r.choice((8, 64, 100, 256, 989, 4096)))
                shape = dims(int(r.integers(1, 4)), 0, 4) + (hidden,)
                views = {"dy": _view(r, shape, f32, unit_last=True), "x": _view(r, shape, f32, unit_last=True)}
                if r.random() < 0.5:
                    views["rstd"] = _view(r, shape[:-1], f32)
                if r.random() < 0.5:
                    views["dresidual"] = _view(r, shape, f32, unit_last=True)
                o = None if r.random() < 0.3 else _view(r, shape, f32, unit_last=True)
                views["out"], views["dweight"] = cukern.rms_norm_backward(
                    views["dy"], views["x"], _a((hidden,), f32), rstd=views.get("rstd"),
                    dresidual=views.get("dresidual"), dx=o)
                return views, None
            if family in ("rotary", "rotary_positions", "mrope", "qk_norm_rope"):
                tokens, q_heads, k_heads = int(r.integers(0, 6)), int(r.integers(1, 5)), int(r.integers(1, 3))
                head_size = int(r.choice((64, 128)))
                rot = head_size if family == "qk_norm_rope" or r.random() < 0.5 else head_size // 2
                q, k = _qkv(r, tokens, q_heads, k_heads, head_size, f32)
                k = None if r.random() < 0.2 else k
                pos = _view(r, (3, tokens) if family == "mrope" else (tokens,),
                            np.int64 if r.random() < 0.5 else np.int32)
                if family == "mrope" and r.random() < 0.2:  # a text-only batch: one row read as all three
                    pos = cupy.broadcast_to(pos[0], (3, tokens))
                cache = _view(r, (64, rot), f32, unit_last=True)
                views = {"query": q, "positions": pos, "rot": rot, **({} if k is None else {"key": k})}
                if tokens and family != "rotary_positions":  # any position in range may be read: all of the cache
                    views["cache"] = cache
                neox = bool(r.random() < 0.5)
                if family == "rotary_positions":
                    return views, cukern.rotary_embedding_positions(pos, q, k, rotary_dim=rot, is_neox=neox)
                # without the position check at times: its kernel reads every position, and would hide a
                # rotation's formula that misses some
                check = bool(r.random() < 0.5)
                if family == "mrope":  # three sections adding up to rot / 2, any of them empty
                    a, b = sorted(int(n) for n in r.integers(0, rot // 2 + 1, 2))
                    interleaved = bool(r.random() < 0.5)
                    views["op"] = f"rotary_embedding_mrope interleaved={interleaved}"
                    return views, cukern.rotary_embedding_mrope(
                        pos, q, k, cache, mrope_section=(a, b - a, rot // 2 - b), interleaved=interleaved,
                        is_neox=neox, rotary_dim=rot, check_positions=check)
                if family == "rotary":
                    return views, cukern.rotary_embedding(pos, q, k, cache, rotary_dim=rot, is_neox=neox,
                                                          check_positions=check)
                kw = None if k is None else _a((head_size,), f32)
                return views, cukern.qk_norm_rope(pos, q, k, _a((head_size,), f32), kw, cache, rotary_dim=rot,
                                                  is_neox=neox, check_positions=check)
            unit_last = bool(r.random() < 0.5)  # the rows and columns kernels' layouts
            if family in ("scan", "argreduce", "reduce"):
                shape = dims(int(r.integers(1, 4)), 0, 6)
                if r.random() < 0.5:
                    shape = shape[:-1] + (int(r.integers(60, 3000)),)
                x = _view(r, shape, f32, unit_last)
                axis = int(r.integers(-len(shape), len(shape)))
                op = {"scan": ("cumsum", "cumprod"), "argreduce": ("argmax", "argmin", "nanargmax", "nanargmin"),
                      "reduce": ("sum", "amax", "var")}[family]
                kept = shape if family == "scan" else shape[:axis % len(shape)] + shape[axis % len(shape) + 1:]
                o = _view(r, kept, np.int64 if family == "argreduce" else f32) if r.random() < 0.4 else None
                op = op[int(r.integers(len(op)))]
                if family == "reduce" and r.random() < 0.3:  # weights: a suffix of x's shape, some axes broadcast
                    b = _view(r, tuple(n if r.random() < 0.6 else 1 for n in shape)[int(r.integers(len(shape) + 1)):],
                              f32)
                    got = cukern.logsumexp(x, axis=axis, b=b, return_sign=bool(r.random() < 0.5))
                    views = {"x": x, "b": b, "axis": axis, "op": "logsumexp weighted"}
                    return (dict(views, sign=got[1]) if isinstance(got, tuple) else views), got
                if family == "reduce" and r.random() < 0.2:  # complex x, with complex weights or none
                    x = _view(r, shape, np.complex64, unit_last)
                    b = None
                    if r.random() < 0.5:
                        b = _view(r, tuple(n if r.random() < 0.6 else 1 for n in shape)[int(r.integers(len(shape) + 1)):],
                                  np.complex64)
                    got = cukern.logsumexp(x, axis=axis, b=b, return_sign=bool(r.random() < 0.5))
                    views = {"x": x, "axis": axis, "op": "logsumexp complex"}
                    views = views if b is None else dict(views, b=b)
                    return (dict(views, sign=got[1]) if isinstance(got, tuple) else views), got
                return {"x": x, "axis": axis, "op": op}, getattr(cukern, op)(x, axis=axis, out=o)
            shape = (int(r.integers(0, 40)),) + dims(int(r.integers(0, 3)), 1, 5)
            if r.random() < 0.3:
                shape = shape[:1] + (int(r.integers(60, 600)),)
            x = _view(r, shape, f32, unit_last and len(shape) > 1)
            segments, skip = int(r.integers(1, 8)), int(r.integers(0, 3))  # offsets: unit stride, past a margin
            offsets = _a((skip + segments + 1,), np.int64 if r.random() < 0.5 else np.int32)[skip:]
            op = ("segment_sum", "segment_max", "segment_min", "segment_mean")[int(r.integers(4))]
            return {"x": x, "offsets": offsets, "op": op}, getattr(cukern, op)(x, offsets, check_offsets=False)

        out.append((family, f"{family} draw {i}", call))
    return out


def _array(a):
    """An array as the layout test models it: (address, shape, strides in bytes, itemsize)."""
    return (a.data.ptr, a.shape, a.strides, a.itemsize)


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


def _refusal(name, arg, call):
    """(name, argument, exception type's names from its class up, its whole message, launches recorded)."""
    start = len(launches)
    try:
        call()
        kinds, message = (), None
    except Exception as err:  # noqa: BLE001 - the test judges what was raised
        kinds, message = tuple(c.__name__ for c in type(err).__mro__), str(err)
    return name, arg, kinds, message, len(launches) - start


def main(mode):
    """``launches``: each case once. ``capture``: each case once as it is, then again while the stream
    "captures", recording also the addresses the captured launches were given in memory the op made during
    the call and gave back before it returned (a graph's replay would write there). ``bad``: each of
    :func:`bad_cases` once, as :func:`_refusal` records it. ``layouts``: each of :func:`layout_cases` once,
    recorded as ``(family, name, error, launches, views)``, ``views`` by :func:`_array` (and the result's)."""
    _install()
    if mode == "layouts":
        records = []
        for family, name, call in layout_cases():
            box = {}
            error, done, result = _run(lambda call=call: box.setdefault("got", call()))
            views = {n: v if isinstance(v, (int, str)) else _array(v) for n, v in box["got"][0].items()} if box else {}
            if result is not None and result[1] is not None:
                views["result"] = _array(result[1] if not isinstance(result[1], tuple) else result[1][0])
            records.append((family, name, error, done, views))
        pickle.dump(records, sys.stdout.buffer)
        return
    if mode == "bad":
        pickle.dump([_refusal(*case) for case in bad_cases()], sys.stdout.buffer)
        return
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
