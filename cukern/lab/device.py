"""The device a card plans for, what its compiled kernels leave resident on it, and where a launch sits
against its roofs.

On a GPU the device is measured (:func:`current_device`: its properties, and the copy peak from
:func:`cukern.timing.peak_bandwidth`); without one it is the H200's datasheet, labelled as such. Staging
(registers, shared and local memory, blocks per SM) is read from the compiled kernel: ``cupy.RawKernel``
attributes and the driver's occupancy on a GPU, NVRTC's ptxas report without one. The profile puts a
launch's bytes and FLOPs against the bandwidth and FP32 roofs and gives a verdict.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from .. import timing
from .._compile import compile_program, get_kernel

# FP32 lanes (FMA units) per SM by compute capability; every later architecture has 128.
_FP32_LANES = {(6, 0): 64, (7, 0): 64, (7, 2): 64, (7, 5): 64, (8, 0): 64}
LATENCY_US = 5.0  # below this the bandwidth limit is in the range of a launch and one DRAM round trip
MEMORY_BOUND_PCT = 60.0  # measured share of the copy peak from which a memory-bound kernel counts as such


@dataclass(frozen=True)
class Device:
    """What the card's staging and profile need from a device.

    ``compute_gflops`` is a datasheet-style FP32 roof: SMs x clock x FP32 lanes per SM x 2 (an FMA is two
    FLOPs). ``peak_gbps`` is the measured device-to-device copy bandwidth on a GPU (the figure every % in
    cukern is against), the datasheet's HBM bandwidth without one (``bandwidth_source`` says which).
    """

    name: str
    arch: str
    sm_count: int
    clock_mhz: float
    fp32_lanes_per_sm: int
    l2_bytes: int
    peak_gbps: float
    bandwidth_source: str
    measured: bool
    regs_per_sm: int = 65536
    max_threads_per_sm: int = 2048
    max_blocks_per_sm: int = 32
    shared_per_sm: int = 233472
    reserved_shared_per_block: int = 1024

    @property
    def compute_gflops(self) -> float:
        return self.sm_count * self.clock_mhz * 1e-3 * self.fp32_lanes_per_sm * 2

    @property
    def ridge(self) -> float:
        """FLOPs per byte at which the compute roof meets the bandwidth roof."""
        return self.compute_gflops / self.peak_gbps

    @property
    def label(self) -> str:
        return self.name if self.measured else f"{self.name} (assumed: no GPU; datasheet figures)"


H200 = Device(name="NVIDIA H200", arch="sm_90", sm_count=132, clock_mhz=1980.0, fp32_lanes_per_sm=128,
              l2_bytes=60 * 2**20, peak_gbps=4800.0,
              bandwidth_source="H200 datasheet HBM3e bandwidth (not measured: no GPU)", measured=False)


def gpu_present() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


_devices: dict = {}


def current_device() -> Device:
    """The current GPU, with its copy peak measured once (:func:`cukern.timing.peak_bandwidth`); the H200
    defaults when there is no GPU."""
    if not gpu_present():
        return H200
    import cupy

    dev = cupy.cuda.Device()
    if dev.id not in _devices:
        props = cupy.cuda.runtime.getDeviceProperties(dev.id)
        attrs = dev.attributes
        major, minor = (int(c) for c in dev.compute_capability)
        _devices[dev.id] = Device(
            name=props["name"].decode(), arch=f"sm_{major}{minor}", sm_count=props["multiProcessorCount"],
            clock_mhz=props["clockRate"] / 1e3, fp32_lanes_per_sm=_FP32_LANES.get((major, minor), 128),
            l2_bytes=props["l2CacheSize"], peak_gbps=timing.peak_bandwidth(),
            bandwidth_source="measured device-to-device copy (cukern.timing.peak_bandwidth)", measured=True,
            regs_per_sm=attrs.get("MaxRegistersPerMultiprocessor", 65536),
            max_threads_per_sm=attrs.get("MaxThreadsPerMultiProcessor", 2048),
            max_blocks_per_sm=attrs.get("MaxBlocksPerMultiprocessor", 32),
            shared_per_sm=attrs.get("MaxSharedMemoryPerMultiprocessor", 233472),
            reserved_shared_per_block=attrs.get("ReservedSharedMemoryPerBlock", 1024),
        )
    return _devices[dev.id]


def fits_l2(nbytes: int, device: Device) -> str:
    """``nbytes`` as a share of the device's L2, for the traffic section's notes on what should stay there."""
    return f"{nbytes:,} B, {100 * nbytes / device.l2_bytes:.2g} % of the {device.l2_bytes / 2**20:.0f} MiB L2"


# ---------------------------------------------------------------------------------------------------------
# Staging: from the compiled kernel.


def blocks_per_sm(registers: int, shared: int, block: int, device: Device) -> tuple:
    """``(blocks, limiter)``: resident blocks per SM for a kernel using ``registers`` per thread and
    ``shared`` bytes of shared memory per block (registers allocated per warp in units of 256)."""
    warps = -(-block // 32)
    regs_per_warp = -(-max(registers, 1) * 32 // 256) * 256
    limits = {
        "threads": device.max_threads_per_sm // (warps * 32),
        "registers": (device.regs_per_sm // regs_per_warp) // warps,
        "shared memory": device.shared_per_sm // (shared + device.reserved_shared_per_block),
        "blocks per SM": device.max_blocks_per_sm,
    }
    limiter = min(limits, key=limits.__getitem__)
    return limits[limiter], limiter


@functools.lru_cache(maxsize=64)
def _ptxas(source: str, insts: tuple, arch: str) -> tuple:
    compiled = compile_program(source, list(insts), arch)
    res = compiled.resources()
    return tuple(res.get(compiled.lowered[i.expression], {}) for i in insts)


def _resources_ptxas(launches, arch: str) -> list:
    by_source: dict = {}
    for ln in launches:
        by_source.setdefault(ln.inst.source, []).append(ln.inst)
    found = {}
    for source, insts in by_source.items():
        insts = tuple(dict.fromkeys(insts))
        for inst, r in zip(insts, _ptxas(source, insts, arch)):
            found[inst] = {"registers": r.get("registers", 0), "local_bytes": r.get("stack", 0),
                           "spill_bytes": r.get("spill_stores", 0), "static_shared": r.get("shared", 0),
                           "max_threads_per_block": None}
    return [found[ln.inst] for ln in launches]


def _resources_gpu(launches) -> list:
    out = []
    for ln in launches:
        kernel = get_kernel(ln.inst)
        a = kernel.attributes
        out.append({"registers": a["num_regs"], "local_bytes": a["local_size_bytes"], "spill_bytes": None,
                    "static_shared": a["shared_size_bytes"], "max_threads_per_block": a["max_threads_per_block"],
                    "kernel": kernel})
    return out


def _driver_occupancy(kernel, block: int, dynamic: int):
    try:
        from cupy.cuda import driver

        return int(driver.occupancyMaxActiveBlocksPerMultiprocessor(kernel.kernel.ptr, block, dynamic))
    except Exception:
        return None


def staging(launches, device: Device, on_gpu: bool) -> list:
    """Per distinct launch (kernel, block, dynamic shared memory) of ``launches`` (:class:`cukern.lab.card.Launch`):
    registers, local memory, static and dynamic shared memory and resident blocks per SM."""
    counts: dict = {}
    distinct: dict = {}
    for ln in launches:
        key = (ln.inst, ln.block, ln.dynamic_shared)
        counts[key] = counts.get(key, 0) + 1
        distinct.setdefault(key, ln)
    launches = list(distinct.values())
    resources = _resources_gpu(launches) if on_gpu else _resources_ptxas(launches, device.arch)
    out = []
    for ln, r in zip(launches, resources):
        shared = r["static_shared"] + ln.dynamic_shared
        blocks, limiter = blocks_per_sm(r["registers"], shared, ln.block, device)
        source = f"NVRTC ptxas -v for {device.arch}" if not on_gpu else "cupy.RawKernel.attributes"
        if on_gpu:
            driver = _driver_occupancy(r["kernel"], ln.block, ln.dynamic_shared)
            if driver is not None:
                blocks, source = driver, source + "; blocks per SM from cuOccupancyMaxActiveBlocksPerMultiprocessor"
        out.append({
            "kernel": ln.inst.expression, "launches": counts[(ln.inst, ln.block, ln.dynamic_shared)],
            "registers_per_thread": r["registers"],
            "local_memory_bytes": r["local_bytes"], "spill_bytes": r["spill_bytes"],
            "static_shared_bytes": r["static_shared"], "dynamic_shared_bytes": ln.dynamic_shared,
            "max_threads_per_block": r["max_threads_per_block"], "block": ln.block, "blocks_per_sm": blocks,
            "occupancy_limiter": limiter,
            "occupancy_pct": round(100 * blocks * ln.block / device.max_threads_per_sm, 1), "source": source,
        })
    return out


# ---------------------------------------------------------------------------------------------------------
# The profile: the roofline.


def verdict(intensity: float, ridge: float, bound_us: float, pct_of_peak: float | None = None) -> tuple:
    """``(verdict, reason)``: compute-bound above the ridge point; below it, memory-bound when the measured
    bandwidth is near the copy peak (or, unmeasured, when the bandwidth limit is long enough to matter),
    latency-bound otherwise."""
    if intensity >= ridge:
        return "compute-bound", f"{intensity:.3g} FLOP/B is above the ridge point ({ridge:.3g})"
    if pct_of_peak is None:
        if bound_us < LATENCY_US:
            return "latency-bound", (f"predicted: the bandwidth limit is {bound_us:.2f} µs, under {LATENCY_US:g} µs "
                                     "of launch and memory latency")
        return "memory-bound", f"predicted: {intensity:.3g} FLOP/B is far under the ridge point ({ridge:.3g})"
    if pct_of_peak >= MEMORY_BOUND_PCT:
        return "memory-bound", f"at {pct_of_peak:.1f} % of the copy peak, {intensity:.3g} FLOP/B"
    return "latency-bound", (f"at {pct_of_peak:.1f} % of the copy peak with {intensity:.3g} FLOP/B: too little "
                             "work in flight to cover memory latency")


def profile(nbytes: int, flops: int, device: Device, measured_us: float | None) -> dict:
    """A launch of ``nbytes`` and ``flops`` against the device's roofs, with the measured time when known."""
    bound_us = nbytes / (device.peak_gbps * 1e3)
    intensity = flops / nbytes if nbytes else 0.0
    out = {
        "bytes": nbytes, "flops": flops, "arithmetic_intensity": round(intensity, 4),
        "ridge_point": round(device.ridge, 2), "peak_gbps": round(device.peak_gbps, 1),
        "bandwidth_source": device.bandwidth_source, "compute_gflops": round(device.compute_gflops, 1),
        "compute_source": (f"{device.sm_count} SMs x {device.clock_mhz:.0f} MHz x {device.fp32_lanes_per_sm} FP32 "
                           "lanes x 2 (datasheet-style FP32 FMA roof)"),
        "bandwidth_limit_us": round(bound_us, 3),
        "compute_limit_us": round(flops / (device.compute_gflops * 1e3), 3),
        "measured_us": None, "gbps": None, "pct_of_copy_peak": None,
    }
    pct = None
    if measured_us is not None:
        gbps = nbytes / (measured_us * 1e3)
        pct = 100 * gbps / device.peak_gbps
        out.update(measured_us=round(measured_us, 3), gbps=round(gbps, 1), pct_of_copy_peak=round(pct, 1))
    out["verdict"], out["verdict_reason"] = verdict(intensity, device.ridge, bound_us, pct)
    return out
