"""GPU timing with CUDA events: warm-up, many repeats, L2 flushed between them, robust statistics.

Nothing here imports torch. ``benchmark`` records an event pair around every repeat on the current stream
and synchronizes once at the end; ``peak_bandwidth`` measures a large device-to-device copy (bytes read
plus bytes written) once per device, the figure every percentage in cukern is against.
"""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass

import numpy as np


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


_flush_buffers: dict = {}


def _flush_buffer():
    """A buffer twice the device's L2; overwriting it evicts whatever the timed call left in L2."""
    import cupy

    dev = cupy.cuda.Device()
    buf = _flush_buffers.get(dev.id)
    if buf is None:
        l2 = dev.attributes["L2CacheSize"]
        buf = _flush_buffers[dev.id] = cupy.empty(2 * l2, dtype=np.uint8)
    return buf


def benchmark(fn, *args, warmup: int = 10, repeat: int = 100, flush_l2: bool = True, bytes_moved=None) -> Timing:
    """Time ``fn(*args)`` on the current stream with CUDA events.

    ``warmup`` untimed calls first (compilation, caches), then ``repeat`` timed calls, each with its own
    event pair; with ``flush_l2`` a buffer larger than L2 is overwritten before each one, outside the
    events. Returns microseconds (median, min, max, 20th and 80th percentile) and, given ``bytes_moved``,
    GB/s at the median.
    """
    import cupy

    if repeat < 1:
        raise ValueError("repeat must be at least 1")
    stream = cupy.cuda.get_current_stream()
    for _ in range(warmup):
        fn(*args)
    flush = _flush_buffer() if flush_l2 else None
    starts = [cupy.cuda.Event() for _ in range(repeat)]
    ends = [cupy.cuda.Event() for _ in range(repeat)]
    for start, end in zip(starts, ends):
        if flush is not None:
            flush.fill(1)
        start.record(stream)
        fn(*args)
        end.record(stream)
    ends[-1].synchronize()
    times = np.array([cupy.cuda.get_elapsed_time(s, e) * 1e3 for s, e in zip(starts, ends)])
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


_peaks: dict = {}
_peak_lock = threading.Lock()
COPY_BYTES = 1 << 31


def peak_bandwidth(nbytes: int = COPY_BYTES) -> float:
    """GB/s of a ``nbytes`` device-to-device copy on the current device (read + write counted), measured
    once per device and size and cached."""
    import cupy

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
