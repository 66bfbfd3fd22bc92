"""What several test modules share: NVRTC compilations made once per test run (started in worker processes
when the selected tests ask for them), one closeness rule per dtype, and the one stand-in array."""

from __future__ import annotations

import functools
import math
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np

from cukern import families
from cukern._layout import ArraySpec, contiguous_strides

# Every family is compiled and checked for each of these; issue 16 adds sm_100 and sm_120 once no kernel
# spills there.
ARCHS = ("sm_80", "sm_90")


def _compile(source: str, arch: str):
    return families.compile_family(families.named(source), arch)


_pool = None
_started: dict = {}


def prefetch(sources) -> None:
    """Start compiling every family in ``sources`` for every arch in :data:`ARCHS` in worker processes, one
    per core, biggest family first: NVRTC is most of the suite's time and keeps one core busy. The conftest
    calls this for the sources the selected tests name with ``@pytest.mark.nvrtc(...)``. Workers are
    spawned, not forked: the test process may hold a CUDA context, which a child must not inherit."""
    global _pool
    todo = [(s, a) for s in dict.fromkeys(sources) for a in ARCHS if (s, a) not in _started]
    workers = min(len(todo), os.cpu_count() or 1)
    if workers < 2:
        return
    if _pool is None:
        _pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))
    todo.sort(key=lambda pair: -len(families.named(pair[0]).instantiations()))
    for pair in todo:
        _started[pair] = _pool.submit(_compile, *pair)


def stop_prefetch() -> None:
    """Stop every worker: a run cut short (``-x``, Ctrl-C) must not wait for compilations nobody will read."""
    if _pool is None:
        return
    for process in list(_pool._processes.values()):  # no public way to stop them before Python 3.14
        process.terminate()
    _pool.shutdown(wait=False, cancel_futures=True)


@functools.lru_cache(maxsize=None)
def compiled(source: str, arch: str):
    """Every instantiation of the family whose ``SOURCE`` is ``source``, compiled for ``arch`` once per run
    (by a :func:`prefetch` worker when one started it)."""
    future = _started.get((source, arch))
    while future is not None:
        try:
            # a wait without a timeout holds Ctrl-C off until the compilation ends
            return future.result(timeout=0.5)
        except FutureTimeout:
            continue
        except BrokenProcessPool:
            break
    return _compile(source, arch)


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


def _host(a):
    if hasattr(a, "get") and not isinstance(a, np.ndarray):
        return a.get()
    return np.asarray(a)
