"""GPU timing with CUDA events: warm-up, many repeats, L2 flushed between them, robust statistics.

Nothing here imports torch. ``benchmark`` records an event pair around every repeat on the current stream,
with the stream held busy while the host queues them (so the events time the GPU, not the launch), and
synchronizes once at the end; ``peak_bandwidth`` measures a large device-to-device copy (bytes read
plus bytes written) once per device, the figure every percentage in cukern is against.
"""

from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

import numpy as np

from ._compile import Instantiation, get_kernel
from ._launch import cupy as _cupy
from ._launch import require_gpu
from ._typing import HostArray


@dataclass(frozen=True)
class Timing:
    median_us: float
    min_us: float
    max_us: float
    p20_us: float
    p80_us: float
    repeat: int
    bytes_moved: int | None = None

    @property
    def gbps(self) -> float | None:
        """Bytes moved over the median time, in GB/s (10^9 bytes per second)."""
        return None if self.bytes_moved is None else self.bytes_moved / (self.median_us * 1e3)

    def as_dict(self) -> dict:
        return {**asdict(self), "gbps": self.gbps}


class L2Flush:
    """Leaves L2 holding nothing the timed call can use, and nothing dirty.

    Overwriting a buffer twice the L2 evicts the timed call's data, but leaves L2 full of the flush's own
    dirty lines, whose write-back would then be charged to the timed call (docs/design/timing.md has
    what that costs). Reading a second buffer of the same size afterwards writes
    those lines back before the timed region and leaves L2 clean. ``clean=False`` keeps the overwrite
    alone (as torch/Triton's ``do_bench`` does), for comparison.
    """

    def __init__(self, l2_bytes: int):
        cupy = _cupy()
        self.written = cupy.empty(2 * l2_bytes, dtype=np.uint8)
        self.read = cupy.zeros(2 * l2_bytes // 4, dtype=np.float32)
        self.total = cupy.empty((), dtype=np.float32)
        self.clean = True

    def __call__(self) -> None:
        cupy = _cupy()
        self.written.fill(1)
        if self.clean:
            cupy.sum(self.read, out=self.total)


_flushes: dict = {}


def l2_flush() -> L2Flush:
    """The current device's :class:`L2Flush` (made once).

    Examples
    --------
    >>> import cupy as cp
    >>> from cukern.timing import l2_flush
    >>> flush = l2_flush()
    >>> flush()
    >>> flush is l2_flush(), flush.written.nbytes >= cp.cuda.Device().attributes["L2CacheSize"]
    (True, True)
    """
    cupy = _cupy()
    dev = cupy.cuda.Device()
    if dev.id not in _flushes:
        _flushes[dev.id] = L2Flush(dev.attributes["L2CacheSize"])
    return _flushes[dev.id]


HOLD_MIN_US = 20.0
HOLD_MAX_US = 2000.0


def hold_stream(us: float) -> None:
    """Keep the current stream busy for ``us`` microseconds (``cuda_src/timing.cu``), touching no memory.

    Examples
    --------
    >>> import cupy as cp
    >>> from cukern.timing import hold_stream
    >>> start, end = cp.cuda.Event(), cp.cuda.Event()
    >>> start.record(); hold_stream(100.0); end.record(); end.synchronize()
    >>> cp.cuda.get_elapsed_time(start, end) >= 0.09  # milliseconds
    True
    """
    kernel = get_kernel(Instantiation("timing", "hold_stream", ()))
    kernel((1,), (1,), (np.uint64(int(us * 1e3)),))


def hold_time_us(host_us: float) -> float:
    """How long to hold the stream before a timed call whose launch costs the host ``host_us``: four
    times that, plus :data:`HOLD_MIN_US` for the two event records, within :data:`HOLD_MAX_US`.

    Examples
    --------
    >>> from cukern.timing import hold_time_us
    >>> hold_time_us(5.0), hold_time_us(1e6)
    (40.0, 2000.0)
    """
    return min(HOLD_MAX_US, HOLD_MIN_US + 4.0 * host_us)


def benchmark(fn: Callable[..., object], *args: Any, warmup: int = 10, repeat: int = 100, flush_l2: bool = True,
              bytes_moved: int | None = None, hold: bool | None = None) -> Timing:
    """Time ``fn(*args)`` on the current stream with CUDA events.

    ``warmup`` untimed calls first (compilation, caches; the fastest gives the host's cost of one call),
    then ``repeat`` timed calls, each with its own event pair; with ``flush_l2`` a buffer larger than L2
    is overwritten before each one, and a second one read so that no dirty line is left for the timed
    call to write back (:class:`L2Flush`), outside the events. With ``hold`` the stream is then kept busy
    (:func:`hold_stream`) while the host records the start event and launches the call, so the interval
    holds the call's GPU work and not the host's launch cost. ``hold=None`` holds only without the flush:
    back to back, a call of a few microseconds is launch-bound, while the flush's own GPU time already lets
    the host queue the call ahead, so holding as well adds nothing (``bench/sweep_timing.py`` measures all
    four; the figures are in docs/design/timing.md). Returns microseconds
    (median, min, max, 20th and 80th percentile) and, given ``bytes_moved``, GB/s at the median.

    Examples
    --------
    >>> import cupy as cp
    >>> import cukern
    >>> from cukern.timing import benchmark
    >>> x = cp.ones((1024, 4096), dtype=cp.float32)
    >>> t = benchmark(cukern.sum, x, warmup=2, repeat=10, bytes_moved=x.nbytes)
    >>> t.repeat, t.min_us <= t.median_us <= t.max_us, t.gbps > 0
    (10, True, True)
    """
    times = event_times_us(fn, *args, warmup=warmup, repeat=repeat, flush_l2=flush_l2, hold=hold)
    p20, p50, p80 = np.percentile(times, [20, 50, 80])
    return Timing(
        median_us=float(p50),
        min_us=float(times.min()),
        max_us=float(times.max()),
        p20_us=float(p20),
        p80_us=float(p80),
        repeat=repeat,
        bytes_moved=None if bytes_moved is None else int(bytes_moved),
    )


def event_times_us(fn: Callable[..., object], *args: Any, warmup: int = 10, repeat: int = 100,
                   flush_l2: bool = True, hold: bool | None = None) -> HostArray:
    """The microseconds of each of ``repeat`` calls of ``fn(*args)``, timed as :func:`benchmark` times them.

    Examples
    --------
    >>> import cupy as cp
    >>> import cukern
    >>> from cukern.timing import event_times_us
    >>> times = event_times_us(cukern.sum, cp.ones(1 << 20, dtype=cp.float32), warmup=1, repeat=5)
    >>> times.shape, bool((times > 0).all())
    ((5,), True)
    """
    cupy = _cupy()
    if repeat < 1:
        raise ValueError("repeat must be at least 1")
    require_gpu()
    if hold is None:
        hold = not flush_l2
    stream = cupy.cuda.get_current_stream()
    host_us = HOLD_MAX_US
    for _ in range(max(warmup, 1 if hold else 0)):
        t0 = time.perf_counter()
        fn(*args)
        host_us = min(host_us, (time.perf_counter() - t0) * 1e6)
    flush = l2_flush() if flush_l2 else None
    hold_us = hold_time_us(host_us) if hold else 0.0
    starts = [cupy.cuda.Event() for _ in range(repeat)]
    ends = [cupy.cuda.Event() for _ in range(repeat)]
    for start, end in zip(starts, ends):
        if flush is not None:
            flush()
        if hold:
            hold_stream(hold_us)
        start.record(stream)
        fn(*args)
        end.record(stream)
    ends[-1].synchronize()
    return np.array([cupy.cuda.get_elapsed_time(s, e) * 1e3 for s, e in zip(starts, ends)])


_peaks: dict = {}
_peak_lock = threading.Lock()
COPY_BYTES = 1 << 31


def peak_bandwidth(nbytes: int = COPY_BYTES) -> float:
    """GB/s of a ``nbytes`` device-to-device copy on the current device (read + write counted), measured
    once per device and size and cached.

    Examples
    --------
    >>> import cupy as cp
    >>> from cukern.timing import peak_bandwidth
    >>> with cp.cuda.Device(0):
    ...     gbps = peak_bandwidth(1 << 26)
    >>> gbps > 0, peak_bandwidth(1 << 26) == gbps  # measured once per device and size
    (True, True)
    """
    cupy = _cupy()
    require_gpu()
    key = (cupy.cuda.Device().id, nbytes)
    with _peak_lock:
        if key not in _peaks:
            src = cupy.empty(nbytes, dtype=np.uint8)
            src.fill(1)
            dst = cupy.empty_like(src)

            def copy():
                cupy.cuda.runtime.memcpyAsync(
                    dst.data.ptr, src.data.ptr, nbytes, cupy.cuda.runtime.memcpyDeviceToDevice,
                    cupy.cuda.get_current_stream().ptr,
                )

            _peaks[key] = benchmark(copy, warmup=3, repeat=20, bytes_moved=2 * nbytes).gbps
            del src, dst
    return _peaks[key]
