"""What several test modules share: NVRTC compilations and launch recordings made once per test run (started
in worker processes when the selected tests ask for them), one closeness rule per dtype, the one stand-in
array, and the lines that hide CuPy from a process."""

from __future__ import annotations

import functools
import math
import multiprocessing
import os
import pickle
import subprocess
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from cukern import families
from cukern._compile import Compiled, compile_program, read_source
from cukern._layout import ArraySpec, contiguous_strides

# Every family is compiled and checked for sm_90, the GPU we measure, once per test run. The other supported
# architectures (sm_80, sm_100, sm_120) are compiled by .ci/run through the CLI, outside this suite to keep it
# under two minutes on two cores, with no local memory either (`--max-local 0`).
ARCHS = ("sm_90",)


def assert_no_spills(resources: dict, arch: str, what) -> None:
    """``resources`` (one kernel's, from ``Compiled.resources``): no spill and no stack frame."""
    used = max(resources["spill_stores"], resources["spill_loads"], resources["stack"])
    assert used == 0, (what, arch, resources)


# Families with more checked instantiations than this compile in parts, one worker each, merged for the
# tests; and families with more than this in all (the reductions, RMSNorm, LayerNorm and the segment
# reductions, most of the NVRTC time) stop at the PTX here (NVRTC without ptxas, half the time). Their machine
# code is checked by .ci/run: `python -m cukern.lab compile --arch sm_90 --max-local 0` for those families,
# which fails on any spill or stack frame. The tests' PTX checks cover every family.
PART = 150


# The README's test command inspects a covering sample of each family's instantiations (below); .ci/run
# inspects every one in a pytest run of its own (`python -m pytest -m nvrtc --every-instantiation`), outside
# the two minutes. Set from that option by the conftest, and handed to the compiling workers.
EVERY = False
# Families with more instantiations than this are sampled without it (the smaller ones cost little).
SAMPLED_PAST = 40


def _covers(inst) -> set:
    """What one instantiation stands for in the sample: each template argument's value; for the reductions'
    full kernel and the scans also the second with the third (each result dtype with each operation, which
    tests/test_reduce_plan.py's branch count and tests/test_scan.py's register count read). Pairs of the
    other arguments are .ci/run's to inspect (``--every-instantiation``): covering them too made the sample
    half as large again, its NVRTC time with it."""
    args = [(i, repr(a)) for i, a in enumerate(inst.args)]
    covered = {(inst.name, a) for a in args}
    if len(args) > 2 and (inst.name == "reduce_full" or inst.source == "scan"):
        covered.add((inst.name, args[1], args[2]))
    return covered


def _sample(insts: list) -> list:
    """A greedy cover of ``insts`` by :func:`_covers`: the instantiation adding the most new values first (the
    earliest of a tie), until every value and pair is covered; in the family's order."""
    left = {i: _covers(i) for i in insts}
    seen: set = set()
    chosen = set()
    while left:
        best = max(left, key=lambda i: len(left[i] - seen))
        if not left[best] - seen:
            break
        seen |= left.pop(best)
        chosen.add(best)
    return [i for i in insts if i in chosen]


def sampled(insts: list) -> list:
    """``insts`` under :data:`EVERY`, else their covering :func:`_sample` (for the instantiations a test
    compiles that no family lists)."""
    return insts if EVERY else _sample(insts)


def checked_instantiations(source: str, every: bool | None = None) -> list:
    """The instantiations of ``source``'s family this suite compiles and inspects: with ``every`` (default
    :data:`EVERY`) all of them, but for the reductions' rows kernels with 64-bit row indices and column kernels
    of four chains a thread, the same templates as their twins compiled and inspected here (32-bit row indices,
    one chain a thread) with another index type or chain count; without it, a covering :func:`_sample` of
    those for the families past :data:`SAMPLED_PAST` instantiations (every dtype, operation and tuning value,
    and the reductions' and scans' result dtype with each operation: a sixth or less of their instantiations).
    .ci/run compiles every instantiation, those included, to machine code for sm_80, sm_90, sm_100 and sm_120
    with no local memory."""
    return _checked(source, EVERY if every is None else every)


@functools.lru_cache(maxsize=None)
def _checked(source: str, every: bool) -> list:
    insts = families.named(source).instantiations()
    if source == "reduce":
        insts = [i for i in insts if not (i.name == "reduce_rows" and np.dtype(i.args[-1]) == np.int64)
                 and not (i.name == "reduce_cols" and i.args[4] == 4)]
    return insts if every or len(insts) <= SAMPLED_PAST else _sample(insts)


def _parts(source: str, every: bool) -> int:
    return -(-len(checked_instantiations(source, every)) // PART)


def _target(source: str, arch: str) -> str:
    """``arch``, or its virtual architecture (PTX only) for a family past :data:`PART` instantiations in all
    (so in both modes of :data:`EVERY`)."""
    return arch if _parts(source, True) <= 1 else arch.replace("sm_", "compute_")


def ptxas_ran(c: Compiled) -> bool:
    """Whether ``c`` holds machine code (and ``c.resources()`` its registers and spills): False for the
    families this suite compiles to PTX only (see :data:`PART`)."""
    return not c.arch.startswith("compute_")


def _compile(source: str, arch: str, part: int = 0, parts: int = 1, every: bool | None = None):
    insts = checked_instantiations(source, every)
    size = -(-len(insts) // parts)
    return compile_program(source, insts[part * size:(part + 1) * size], _target(source, arch))


def _merged(pieces: list) -> Compiled:
    """One family's parts as one :class:`Compiled`: the PTX and logs joined, the lowered names merged (the
    cubins stay apart: no test reads them)."""
    if len(pieces) == 1:
        return pieces[0]
    return Compiled(arch=pieces[0].arch, ptx="\n".join(p.ptx for p in pieces), cubin=b"",
                    lowered={k: v for p in pieces for k, v in p.lowered.items()},
                    log="\n".join(p.log for p in pieces))


_pool = None
_started: dict = {}


def prefetch(sources) -> None:
    """Start compiling every family in ``sources`` for every arch in :data:`ARCHS` in worker processes, one
    per core, longest source first: NVRTC is most of the suite's time and keeps one core busy, and its time
    follows the code a family instantiates more than how many times (the scans' 24 took 19 s, the ladder's
    44 took 3.5 s). The conftest calls this for the sources the selected tests name with
    ``@pytest.mark.nvrtc(...)``. Workers are spawned, not forked: the test process may hold a CUDA context,
    which a child must not inherit. They run at a lower priority (nice 10) than the tests: the tests that
    compile nothing are the longest serial chain, and run last otherwise, with a core idle (on two cores
    127 s against 110 s)."""
    global _pool
    todo = [(s, a) for s in dict.fromkeys(sources) for a in ARCHS if (s, a) not in _started]
    jobs = sum(_parts(s, EVERY) for s, _ in todo)
    workers = min(jobs, os.cpu_count() or 1)
    if workers < 2:
        return
    if _pool is None:
        _pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"), initializer=os.nice,
                                    initargs=(10,))
    todo.sort(key=lambda pair: -len(read_source(pair[0])))
    for s, a in todo:
        n = _parts(s, EVERY)
        _started[(s, a)] = [_pool.submit(_compile, s, a, i, n, EVERY) for i in range(n)]


def stop_prefetch() -> None:
    """Stop every worker: a run cut short (``-x``, Ctrl-C) must not wait for compilations nobody will read."""
    if _pool is None:
        return
    for process in list(_pool._processes.values()):  # no public way to stop them before Python 3.14
        process.terminate()
    _pool.shutdown(wait=False, cancel_futures=True)


@functools.lru_cache(maxsize=None)
def compiled(source: str, arch: str):
    """The :func:`checked_instantiations` of the family whose ``SOURCE`` is ``source``, compiled for ``arch``
    once per run (by a :func:`prefetch` worker when one started it)."""
    pieces = []
    for future in _started.get((source, arch), []):
        while True:
            try:
                # a wait without a timeout holds Ctrl-C off until the compilation ends
                pieces.append(future.result(timeout=0.5))
                break
            except FutureTimeout:
                continue
            except BrokenProcessPool:
                return _compile(source, arch)
    return _merged(pieces) if pieces else _compile(source, arch)


_recordings: dict = {}


def start_recordings(commands) -> None:
    """Start each of ``commands`` (``(script, *args)``, a recorder in tests/ such as _record_launches.py and its
    arguments) once, in a process of its own at a lower priority, as :func:`prefetch` starts NVRTC: the
    conftest calls this at collection for the commands the selected tests mark with ``records``, so the
    recordings run while other tests do. No GPU in those processes, on any machine: CuPy's own steps (a cast,
    a copy) would run its kernels over a recorder's made-up addresses and fault, where with no GPU they fail
    at once."""
    here = Path(__file__).parent
    env = {**os.environ, "PYTHONPATH": str(here.parent), "CUDA_VISIBLE_DEVICES": ""}
    for command in dict.fromkeys(tuple(c) for c in commands):
        if command not in _recordings:
            script, *args = command
            out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
            process = subprocess.Popen([sys.executable, str(here / script), *args], stdout=out, stderr=err,
                                       cwd=here.parent, env=env, preexec_fn=lambda: os.nice(10))
            _recordings[command] = (process, out, err)


@functools.lru_cache(maxsize=None)
def recording(script: str, *args: str):
    """What the recorder ``script`` pickled to its output, run with ``args`` (started now if collection did
    not start it)."""
    command = (script, *args)
    start_recordings([command])
    process, out, err = _recordings[command]
    process.wait(timeout=300)
    err.seek(0)
    assert process.returncode == 0, err.read().decode()[-3000:]
    out.seek(0)
    return pickle.load(out)


def stop_recordings() -> None:
    """Stop the recordings still running (a run cut short must not wait for them)."""
    for process, _, _ in _recordings.values():
        if process.poll() is None:
            process.kill()


@dataclass(frozen=True)
class FakeArray(ArraySpec):
    """:class:`cukern._layout.ArraySpec` plus the device an op's validation asks for (``.data.device_id``,
    ``.device.id``): an array for the checks and planners, without a GPU. Make one with :func:`fake_array`."""

    device_id: int = 0

    @property
    def data(self):
        return SimpleNamespace(ptr=self.ptr, device_id=self.device_id)

    @property
    def device(self):
        return SimpleNamespace(id=self.device_id)


def fake_array(shape, dtype=np.float32, strides=None, *, ptr: int = 1 << 20, device: int = 0) -> FakeArray:
    """A :class:`FakeArray`; ``strides`` in elements (default C-contiguous), ``ptr`` 256-byte aligned by
    default as CuPy allocates."""
    dtype = np.dtype(dtype)
    elems = contiguous_strides(shape) if strides is None else strides
    return FakeArray(tuple(shape), tuple(s * dtype.itemsize for s in elems), dtype, ptr, device)


def unread_cupy_array(shape, dtype=np.float32, offset: int = 0):
    """A real :class:`cupy.ndarray` over memory nothing reads, ``offset`` bytes past a 256-byte boundary: for
    the checks an op makes before it touches the GPU (no GPU needed)."""
    import cupy

    dtype = np.dtype(dtype)
    n = int(np.prod(shape)) * dtype.itemsize
    mem = cupy.cuda.UnownedMemory(1 << 32, n + 16, None, device_id=0)
    raw = cupy.ndarray((n + 16,), np.uint8, cupy.cuda.MemoryPointer(mem, 0))
    return raw[offset:offset + n].view(dtype).reshape(shape)


# The one closeness rule: |got - ref| <= rtol * (|ref| + 0.1 * rms(ref)) elementwise, against a float64
# reference, with rtol set by the dtype the result is rounded to (float32 arithmetic with one rounding to
# the output for the low-precision types). ``terms``: how many values were summed into each result; a sum
# of n float32 terms in a tree carries about log2(n) roundings, so rtol grows with it.
RTOL = {"float64": 1e-12, "float32": 1e-5, "float16": 5e-3, "bfloat16": 1e-2}


def tolerance(dtype, terms: int = 1) -> float:
    from cukern._dtypes import dtype_name

    grow = max(1.0, math.log2(max(terms, 1)) / 4)
    return RTOL[dtype_name(dtype)] * grow


def assert_close(got, ref, dtype=None, *, terms: int = 1) -> None:
    """``got`` (any array, host or device) against the float64 reference ``ref`` under :func:`tolerance`
    of ``dtype`` (default: got's dtype). NaN must meet NaN, inf the same inf."""
    got = _host(got)
    got_dtype = got.dtype
    got = got.astype(np.float64)
    ref = _host(ref).astype(np.float64)
    assert got.shape == ref.shape, (got.shape, ref.shape)
    rtol = tolerance(dtype if dtype is not None else got_dtype, terms)
    special = ~np.isfinite(ref)
    assert np.array_equal(np.isnan(got), np.isnan(ref)), "NaN where the reference has none, or the reverse"
    assert np.array_equal(got[special & ~np.isnan(ref)], ref[special & ~np.isnan(ref)]), "infinities differ"
    finite = ~special
    if not finite.any():
        return
    g, r = got[finite], ref[finite]
    rms = float(np.sqrt(np.mean(r * r)))
    err = np.abs(g - r)
    bound = rtol * (np.abs(r) + 0.1 * rms)
    worst = int(np.argmax(err - bound))
    assert (err <= bound).all(), (f"{int((err > bound).sum())} of {g.size} elements off; worst {g[worst]!r} "
                                  f"against {r[worst]!r} (rtol {rtol:.3g})")


def same_bits(got, want) -> bool:
    """The reproducibility contract's equality: same shape, dtype and bits, NaN payloads aside (every NaN
    equals every NaN). A GPU makes its own NaN (0x7fffffff for float32 on NVIDIA GPUs, from 0/0, inf - inf
    and NaN operands alike) where NumPy on the host keeps or makes another (0x7fc00000), so the emulators
    promise the bits of every number and the NaN-ness of every NaN."""
    got, want = _host(got), _host(want)
    if got.shape != want.shape or got.dtype != want.dtype:
        return False
    if got.dtype.kind == "c":  # each part as a float of its own: the bits of each number, the NaN-ness of each NaN
        got, want = (np.ascontiguousarray(a).view(a.real.dtype) for a in (got, want))
    # ml_dtypes' bfloat16 and float8 say kind "V" as raw bytes do, but their NaNs are NaNs like float32's
    if got.dtype.kind in "biu" or (got.dtype.kind == "V" and got.dtype.type.__module__ != "ml_dtypes"):
        return got.tobytes() == want.tobytes()
    nan_got, nan_want = np.isnan(got.astype(np.float64)), np.isnan(want.astype(np.float64))
    return bool(np.array_equal(nan_got, nan_want)) and got[~nan_got].tobytes() == want[~nan_want].tobytes()


def _host(a):
    if hasattr(a, "get") and not isinstance(a, np.ndarray):
        return a.get()
    return np.asarray(a)


def struct_fields(source: str, struct: str) -> tuple:
    """The ``(name, kind)`` fields of ``struct`` in cuda_src/<source>.cu, comments dropped, in the kinds of
    :class:`cukern._launch.Params` (``unsigned`` packs as i32, ``unsigned long long`` as u64)."""
    import re

    from cukern._compile import read_source

    body = re.search(r"struct " + struct + r" \{(.*?)\};", read_source(source), re.DOTALL).group(1)
    body = re.sub(r"//[^\n]*", "", body)
    kinds = {"long long": "i64", "unsigned long long": "u64", "int": "i32", "unsigned": "i32", "float": "f32",
             "double": "f64"}
    fields = []
    for decl in body.split(";")[:-1]:
        kind, names = re.fullmatch(r"\s*(unsigned long long|long long|unsigned|int|float|double) (.*)", decl,
                                   re.DOTALL).groups()
        fields += [(n.strip(), kinds[kind]) for n in names.split(",")]
    return tuple(fields)


# CUDA-graph capture: capture, then allocate "victim" arrays that would be handed any
# memory the capture freed, replay, and check the victims are untouched.


def victims(pool):
    """Arrays allocated on the current stream until the pool has no free block left there: they take every
    byte freed since the pool was last emptied."""
    import cupy

    made, size = [], pool.free_bytes()
    while size >= 512:
        before = pool.free_bytes()
        made.append(cupy.empty(size, np.uint8))
        after = pool.free_bytes()
        size = min(size, after) if after < before else size // 2  # no block that large left: try smaller
    return made


def _frees_hook():
    """A CuPy memory hook recording every pool block given back while it is on (``.freed``: bytes each).
    Inside a capture any such block is one the graph's replays may still write after a later array reuses
    it. (The pool's ``free_bytes`` cannot tell: blocks split from a partly used chunk stay counted as free
    after ``free_all_blocks``.)"""
    from cupy.cuda.memory_hook import MemoryHook

    class Frees(MemoryHook):
        name = "cukern-test-frees"

        def __init__(self):
            self.freed = []

        def free_postprocess(self, **kw):
            self.freed.append(kw["mem_size"])

    return Frees()


def capture(stream, step):
    """(graph, what ``step()`` returned, bytes of each pool block freed while capturing) for ``step``
    recorded on ``stream``."""
    frees = _frees_hook()
    stream.begin_capture()
    try:
        with frees:
            results = step()
    except BaseException:
        stream.end_capture()
        raise
    return stream.end_capture(), results, frees.freed


def refused_in_capture(stream, call, match="cannot be captured in a CUDA graph"):
    """Capture one kernel, then ``call()`` on ``stream``: the call must raise RuntimeError (``match``)
    having allocated nothing, and leave the capture valid, so that the graph replays the kernel."""
    import gc

    import cupy
    import pytest

    pool = cupy.get_default_memory_pool()
    with stream:
        marker = cupy.zeros(1, np.float32)
        stream.synchronize()
        gc.collect()
        pool.free_all_blocks()
        frees = _frees_hook()
        stream.begin_capture()
        try:
            marker += 1
            with pytest.raises(RuntimeError, match=match), frees:
                call()
        finally:
            graph = stream.end_capture()
        freed = frees.freed
        graph.launch(stream)
        stream.synchronize()
    assert not freed, f"the refused call allocated and freed blocks of {freed} bytes"
    assert float(marker[0]) == 1.0


def replayed_alone(stream, step, refill):
    """``step()`` called once on ``stream`` (compilation, plans, workspaces), then captured; arrays allocated
    after the capture take every byte the pool has free, ``refill()`` gives the inputs new values, and the
    graph replays once. Returns what the captured ``step()`` returned, after that replay; asserts that the
    capture freed nothing and that the replay wrote none of the later arrays."""
    import gc

    import cupy

    pool = cupy.get_default_memory_pool()
    with stream:
        step()
        stream.synchronize()
        gc.collect()
        pool.free_all_blocks()
        graph, got, freed = capture(stream, step)
        later = victims(pool)
        for v in later:
            v.fill(0x5A)
        refill()
        graph.launch(stream)
        stream.synchronize()
    assert not freed, f"the capture freed blocks of {freed} bytes that its replays may still write"
    assert all(bool((v == 0x5A).all()) for v in later), "a replay wrote into a later allocation"
    return got


# Python lines that hide CuPy from the process that runs them first, as a wheel installed without an extra
# has none (cupy_backends too: CuPy's compiled half, which NVRTC is reached through)
NO_CUPY = """
import sys

class NoCupy:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("cupy", "cupyx", "cupy_backends"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)

sys.meta_path.insert(0, NoCupy())
"""
NEEDS_CUPY = 'cukern needs CuPy: pip install "cukern[cuda12]"'
