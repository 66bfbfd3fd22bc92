"""The six-question card for the exact launch a call makes: ``cukern.explain(op, shape, dtype)`` and
``python -m cukern explain OP``.

1. Output tile: grid and block, what one block and one thread compute.
2. Input traffic: bytes read and written (the benchmark's own count), access width, coalescing, what is
   re-read and where it should live.
3. Accumulation: what is reduced, in what precision, how partials combine.
4. Staging: registers, shared memory, local memory and blocks per SM, read from the compiled kernel
   (``cupy.RawKernel.attributes`` on a GPU, NVRTC's ptxas report without one).
5. Tuning: the knobs, their values, and whether they came from the heuristic or the tuning cache.
6. Profile: bytes, FLOPs, arithmetic intensity against the device's ridge point, the time the bandwidth
   limit allows and, on a GPU, the measured time, % of the copy peak and a verdict.

Each op contributes one ``describe`` function (registered in ``CARDS``) built from its own planning
functions, so the card, the benchmark and the docs read the same numbers. A new op or ladder rung plugs in
with :func:`register`; the tests fail for any benchmarked op or rung without a card.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ._compile import Instantiation, compile_program
from ._dtypes import dtype_name, parse_dtype

# ---------------------------------------------------------------------------------------------------------
# The device: measured on a GPU, else the H200's datasheet figures, labelled as such.

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

    from . import timing

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


# ---------------------------------------------------------------------------------------------------------
# What an op's describe function returns.


@dataclass(frozen=True)
class Launch:
    """One kernel launch of the call: ``count`` identical launches (a multi-pass rung's passes differ in
    grid, so each pass is its own Launch)."""

    inst: Instantiation
    grid: int
    block: int
    role: str
    dynamic_shared: int = 0


@dataclass
class Described:
    launches: list
    tile: dict
    traffic: dict
    accumulation: dict
    knobs: dict  # name -> value the launch uses
    bytes: int  # the benchmark's count
    bytes_written: int
    flops: int
    measure: Callable | None = None  # () -> zero-argument callable running the op (GPU only)
    notes: list = field(default_factory=list)


@dataclass(frozen=True)
class CardSpec:
    """An op's card: default shape and dtype, the params it takes (name -> default) and ``describe(shape,
    dtype, params, device, knobs)`` -> :class:`Described` (``knobs`` None means the heuristic's)."""

    op: str
    default_shape: tuple
    default_dtype: str
    describe: Callable
    params: dict = field(default_factory=dict)
    family: str = ""
    tuning_op: str | None = None  # the tunable whose cache entries this launch uses (default: op)


CARDS: dict = {}


def register(spec: CardSpec) -> None:
    CARDS[spec.op] = spec


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
    limiter = min(limits, key=limits.get)
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
    from ._compile import get_kernel

    out = []
    for ln in launches:
        a = get_kernel(ln.inst).attributes
        out.append({"registers": a["num_regs"], "local_bytes": a["local_size_bytes"], "spill_bytes": None,
                    "static_shared": a["shared_size_bytes"], "max_threads_per_block": a["max_threads_per_block"],
                    "kernel": get_kernel(ln.inst)})
    return out


def _driver_occupancy(kernel, block: int, dynamic: int):
    try:
        from cupy.cuda import driver

        return int(driver.occupancyMaxActiveBlocksPerMultiprocessor(kernel.kernel.ptr, block, dynamic))
    except Exception:
        return None


def staging(launches, device: Device, on_gpu: bool) -> list:
    """Per distinct launch (kernel, block, dynamic shared memory): registers, local memory, static and dynamic
    shared memory and resident blocks per SM."""
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
# The profile.


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


def profile(d: Described, device: Device, measured_us: float | None) -> dict:
    bound_us = d.bytes / (device.peak_gbps * 1e3)
    intensity = d.flops / d.bytes if d.bytes else 0.0
    out = {
        "bytes": d.bytes, "flops": d.flops, "arithmetic_intensity": round(intensity, 4),
        "ridge_point": round(device.ridge, 2), "peak_gbps": round(device.peak_gbps, 1),
        "bandwidth_source": device.bandwidth_source, "compute_gflops": round(device.compute_gflops, 1),
        "compute_source": (f"{device.sm_count} SMs x {device.clock_mhz:.0f} MHz x {device.fp32_lanes_per_sm} FP32 "
                           "lanes x 2 (datasheet-style FP32 FMA roof)"),
        "bandwidth_limit_us": round(bound_us, 3),
        "compute_limit_us": round(d.flops / (device.compute_gflops * 1e3), 3),
        "measured_us": None, "gbps": None, "pct_of_copy_peak": None,
    }
    pct = None
    if measured_us is not None:
        gbps = d.bytes / (measured_us * 1e3)
        pct = 100 * gbps / device.peak_gbps
        out.update(measured_us=round(measured_us, 3), gbps=round(gbps, 1), pct_of_copy_peak=round(pct, 1))
    out["verdict"], out["verdict_reason"] = verdict(intensity, device.ridge, bound_us, pct)
    return out


# ---------------------------------------------------------------------------------------------------------
# The card.


@dataclass
class Card:
    op: str
    shape: tuple
    dtype: str
    params: dict
    device: dict
    launches: list
    tile: dict
    traffic: dict
    accumulation: dict
    staging: list
    tuning: dict
    profile: dict
    unmeasured: list
    notes: list

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    def format(self) -> str:
        head = f"{self.op} {'x'.join(map(str, self.shape))} {self.dtype}"
        if self.params:
            head += " " + " ".join(f"{k}={v}" for k, v in self.params.items())
        lines = [f"{head} on {self.device['label']}"]
        for ln in self.launches:
            lines.append(f"  launch: {ln['kernel']}  grid ({ln['grid']},) block ({ln['block']},)  [{ln['role']}]")
        sections = [("1. Output tile", self.tile), ("2. Input traffic", self.traffic),
                    ("3. Accumulation", self.accumulation)]
        for title, sec in sections:
            lines.append(title)
            lines += _format_items(sec)
        lines.append("4. Staging")
        for s in self.staging:
            lines.append(f"   {s['kernel']}")
            lines += _format_items({k: v for k, v in s.items() if k != "kernel"}, indent=5)
        if not self.staging:
            lines.append("   no kernel launch")
        lines.append("5. Tuning")
        lines += _format_items(self.tuning)
        lines.append("6. Profile")
        lines += _format_items(self.profile)
        for n in self.notes:
            lines.append(f"note: {n}")
        if self.unmeasured:
            lines.append("not measured (no GPU): " + ", ".join(self.unmeasured))
        return "\n".join(lines)


def _format_items(d: dict, indent: int = 3) -> list:
    pad = " " * indent
    out = []
    for k, v in d.items():
        if v is None:
            v = "-"
        elif isinstance(v, float):
            v = f"{v:,.4g}" if abs(v) < 1e4 else f"{v:,.0f}"
        elif isinstance(v, int) and not isinstance(v, bool) and abs(v) >= 1e4:
            v = f"{v:,}"
        elif isinstance(v, (list, tuple)):
            v = "; ".join(map(str, v)) if v else "-"
        out.append(f"{pad}{k.replace('_', ' ')}: {v}")
    return out


def parse_shape(text) -> tuple:
    """``"16384x4096"`` (or a sequence) -> ``(16384, 4096)``."""
    if isinstance(text, str):
        try:
            shape = tuple(int(p) for p in text.lower().replace("*", "x").split("x") if p)
        except ValueError:
            raise ValueError(f"shape {text!r} is not like 16384x4096") from None
    else:
        shape = tuple(int(n) for n in text)
    if not shape or any(n < 1 for n in shape):
        raise ValueError(f"shape {text!r} must have at least one dimension, all positive")
    return shape


@dataclass
class Resolved:
    """An op call resolved to its launches: shape, dtype and params filled in, knobs looked up."""

    spec: CardSpec
    shape: tuple
    dtype: np.dtype
    params: dict
    described: Described
    tuning_op: str
    tuning_shape: tuple
    entry: dict | None


def resolve(op: str, shape=None, dtype=None, device: Device | None = None, **params) -> Resolved:
    """Fill in defaults, look up the tuning cache and run the op's ``describe`` (no compilation, no GPU)."""
    from . import tuning

    if op not in CARDS:
        raise ValueError(f"no card for {op!r}; ops with cards: {', '.join(sorted(CARDS))}")
    spec = CARDS[op]
    unknown = set(params) - set(spec.params)
    if unknown:
        raise ValueError(f"{op} takes params {sorted(spec.params) or 'none'}, not {sorted(unknown)}")
    shape = parse_shape(spec.default_shape if shape is None else shape)
    dt = parse_dtype(spec.default_dtype if dtype is None else dtype)
    params = {**spec.params, **params}
    device = device or current_device()
    tuning_op = spec.tuning_op or op
    tunable = tuning.tunables().get(tuning_op)
    tshape = tunable.from_case(shape, params) if tunable is not None and tunable.from_case else shape
    entry = tuning.lookup_entry(tuning_op, device.name, dt, tshape)
    knobs = tunable.knobs_from(entry["knobs"]) if entry is not None else None
    return Resolved(spec, shape, dt, params, spec.describe(shape, dt, params, device, knobs), tuning_op, tshape, entry)


def measure_us(d: Described, repeat: int = 50) -> float:
    """The median time of the described call on the current GPU (:func:`cukern.timing.benchmark`)."""
    from . import timing

    return timing.benchmark(d.measure(), warmup=10, repeat=repeat, bytes_moved=d.bytes).median_us


def explain(op: str, shape=None, dtype=None, *, measure: bool | None = None, device: Device | None = None,
            **params) -> Card:
    """The card for the launch ``op`` makes on ``shape`` and ``dtype`` (defaults: the op's benchmark shape).

    ``measure``: time the op on the GPU (default: when a GPU is present). ``device``: plan for this device
    instead of the current one (no measurement then). ``params``: op-specific (``explain("sum", axis=0)``,
    ``explain("rotary_embedding", kv_heads=8, neox=False)``; see ``CARDS[op].params``).
    """
    from . import tuning

    on_gpu = device is None and gpu_present()
    device = device or current_device()
    measure = on_gpu if measure is None else (measure and on_gpu)
    r = resolve(op, shape, dtype, device, **params)
    spec, shape, dt, params, d, tuning_op, tshape, entry = (
        r.spec, r.shape, r.dtype, r.params, r.described, r.tuning_op, r.tuning_shape, r.entry)
    tunable = tuning.tunables().get(tuning_op)

    tune_info = {"knobs": d.knobs,
                 "source": "tuning cache" if entry is not None else "heuristic (no tuning cache entry)"}
    if entry is not None and "from_family" in entry:
        tune_info["source"] = "heuristic, with the tuning cache's batch-invariant knobs"
        tune_info["cache_entry"] = (f"{entry['family']} was tuned at {entry['from_family']}; this bucket "
                                    f"({entry['bucket']}) keeps its invariant knobs ({tuning.cache_path()})")
    elif entry is not None:
        tune_info["cache_entry"] = (f"bucket {entry['bucket']}: {entry.get('median_us')} µs tuned vs "
                                    f"{entry.get('heuristic_us')} µs heuristic ({tuning.cache_path()})")
    if tunable is not None:
        tune_info["space"] = {k: list(v) for k, v in tunable.space.items()}
        tune_info["tune_with"] = (f"python -m cukern tune --op {tuning_op} --shape {'x'.join(map(str, tshape))} "
                                  f"--dtype {dtype_name(dt)}")
    else:
        tune_info["space"] = "not tunable yet (no Tunable registered in cukern.tuning)"

    measured_us = measure_us(d) if measure and d.measure is not None else None
    unmeasured = []
    if measured_us is None:
        unmeasured = ["profile.measured_us", "profile.gbps", "profile.pct_of_copy_peak"]
        if not device.measured:
            unmeasured += ["device.peak_gbps (datasheet figure used)", "device clock and SM count (H200 assumed)"]
        if not on_gpu:
            unmeasured.append("staging.max_threads_per_block and blocks_per_sm from the driver (computed from "
                              "ptxas registers and shared memory instead)")
    dev = {"name": device.name, "label": device.label, "arch": device.arch, "sm_count": device.sm_count,
           "clock_mhz": device.clock_mhz, "l2_bytes": device.l2_bytes, "measured": device.measured}
    return Card(
        op=op, shape=shape, dtype=dtype_name(dt), params={k: v for k, v in params.items() if v != spec.params[k]},
        device=dev,
        launches=[{"kernel": ln.inst.expression, "grid": ln.grid, "block": ln.block, "role": ln.role,
                   "dynamic_shared": ln.dynamic_shared} for ln in d.launches],
        tile=d.tile, traffic=d.traffic, accumulation=d.accumulation,
        staging=staging(d.launches, device, on_gpu), tuning=tune_info,
        profile=profile(d, device, measured_us), unmeasured=unmeasured, notes=d.notes,
    )


def all_ops() -> list:
    return sorted(CARDS)


# ---------------------------------------------------------------------------------------------------------
# Per-op describe functions: one block per kernel family, each from the op module's own planning functions.


def _bench_measure(bench_op: str, case_op: str, shape, dtype, params=()):
    """The benchmark's own setup and run for a case, as a zero-argument callable."""
    from .bench import OPS, Case

    b = OPS[bench_op]
    state = b.setup(Case(case_op, tuple(shape), dtype_name(dtype), tuple(sorted(params))))
    return lambda: b.run(state)


def _fits_l2(nbytes: int, device: Device) -> str:
    return f"{nbytes:,} B, {100 * nbytes / device.l2_bytes:.2g} % of the {device.l2_bytes / 2**20:.0f} MiB L2"


def _rms_describe(fused: bool):
    def describe(shape, dt, params, device, knobs):
        from . import rmsnorm

        knobs = rmsnorm.DEFAULT_KNOBS if knobs is None else knobs
        w_dt = parse_dtype(params["weight_dtype"] or dtype_name(dt))
        hidden, rows, size = shape[-1], math.prod(shape[:-1]), dt.itemsize
        vec = rmsnorm.vector_width(hidden, [_Aligned(shape, dt)], _Aligned((hidden,), w_dt))
        p = rmsnorm.plan(hidden, rows, vec, size, device.sm_count, knobs, fused=fused)
        inst = p.instantiation(dt, w_dt, fused)
        groups = -(-rows // p.rows_per_block)
        per_block = -(-groups // p.grid)
        tensors = "residual + x" if fused else "x"
        if p.kernel == "rows":
            thread = (f"{p.items} vectors of {p.vec} elements ({p.items * p.vec * size} B) of one row, held in "
                      "registers from load to store")
            block = f"{p.rows_per_block} row(s) at a time, {p.tpr} threads per row"
        else:
            thread = (f"{p.items} vectors of {p.vec} elements per {p.block * p.items * p.vec}-element chunk of one "
                      "row, streamed twice (sum of squares, then scale)")
            block = "one row at a time, the whole block on it"
        tile = {"grid": p.grid, "block": p.block, "kernel": p.kernel, "rows_per_block": p.rows_per_block,
                "threads_per_row": p.tpr, "one_block_computes": block, "one_thread_computes": thread,
                "row_groups": groups, "row_groups_per_block": per_block,
                "grid_rule": ("capped at knobs.waves x resident blocks; blocks loop over row groups"
                              if per_block > 1 else "one block per row group")}
        nbytes = rmsnorm.bytes_moved(shape, dt, w_dt, fused=fused)
        written = (2 if fused else 1) * math.prod(shape) * size
        re_read = [f"weight ({_fits_l2(hidden * w_dt.itemsize, device)}) by every row group: "
                   f"{rows * hidden * w_dt.itemsize:,} B from L1/L2, should stay in L2"]
        if p.kernel == "wide":
            row_bytes = hidden * size * (2 if fused else 1)
            live = min(p.grid, device.sm_count * (2048 // p.block)) * row_bytes
            re_read.append(f"each row of {tensors} a second time for the scaling pass: {rows * row_bytes:,} B "
                           f"from L2 (rows in flight: {_fits_l2(live, device)})")
        traffic = {"bytes_read": nbytes - written, "bytes_written": written,
                   "counted_by": f"cukern.rmsnorm.bytes_moved(shape, dtype, weight_dtype, fused={fused})",
                   "access_bytes": p.vec * size,
                   "coalesced": (f"yes: lane k of a row's {p.tpr} threads takes vector k + j*{p.tpr}, so a warp "
                                 f"reads {min(p.tpr, 32) * p.vec * size} contiguous bytes per row per access"),
                   "re_read": re_read}
        if vec == 1:
            traffic["access_note"] = f"hidden={hidden} is not a multiple of {16 // size}: element accesses"
        steps = int(math.log2(min(p.tpr, 32))) if p.tpr > 1 else 0
        combine = f"butterfly shuffle over {min(p.tpr, 32)} lanes ({steps} steps)"
        if p.tpr > 32 or p.kernel == "wide":
            combine += f", then warp sums through shared memory ({2 * (p.block // 32)} floats)"
        accumulation = {"reduces": f"sum of squares of each row's {hidden} elements of {tensors}",
                        "precision": "float32 (inputs widened on load), output rounded once to " + dtype_name(dt),
                        "order": (f"each thread sums its {p.items * p.vec} elements in order"
                                  if p.kernel == "rows" else "each thread sums its elements chunk by chunk"),
                        "combine": combine,
                        "passes": ("one launch; the row never leaves registers" if p.kernel == "rows"
                                   else "one launch; the row is read twice"),
                        "batch_invariant": "yes: the reduction order depends on hidden and the knobs, not rows"}
        op = "fused_add_rms_norm" if fused else "rms_norm"
        return Described(
            launches=[Launch(inst, p.grid, p.block, f"{p.kernel} kernel")], tile=tile, traffic=traffic,
            accumulation=accumulation, knobs=dataclasses.asdict(knobs), bytes=nbytes, bytes_written=written,
            flops=math.prod(shape) * (5 if fused else 4),
            measure=lambda: _bench_measure(op, op, shape, dt),
        )

    return describe


class _Aligned:
    """What the ops' ``vector_width`` reads of an array: a contiguous one at a 256-byte-aligned address, as
    CuPy allocates it (so the card plans the exact launch a freshly allocated input gets)."""

    def __init__(self, shape, dtype, strides=None):
        self.shape, self.dtype, self.itemsize = tuple(shape), np.dtype(dtype), np.dtype(dtype).itemsize
        elems = strides or tuple(int(math.prod(shape[i + 1:])) for i in range(len(shape)))
        self.strides = tuple(e * self.itemsize for e in elems)
        self.data = type("Data", (), {"ptr": 256})()


def _knob_values(module, knobs) -> tuple:
    """(knobs object or None, dict of the values the launch uses) for an op module with ``DEFAULT_KNOBS``."""
    used = knobs if knobs is not None else getattr(module, "DEFAULT_KNOBS", None)
    return knobs, (dataclasses.asdict(used) if used is not None else {})


def _rotary_describe(shape, dt, params, device, knobs):
    from . import rotary

    tokens, nh, hd = shape
    nkv, neox = int(params["kv_heads"]), bool(int(params["neox"]))
    rot = int(params["rotary_dim"] or hd)
    cache_dt = np.dtype(np.float32)
    heads = nh + 2 * nkv if int(params["qkv_view"]) else nh
    q = _Aligned((tokens, nh, hd), dt, (heads * hd, hd, 1))
    k = _Aligned((tokens, nkv, hd), dt, (heads * hd, hd, 1))
    vec = rotary.vector_width(q, k, _Aligned((8192, rot), cache_dt), rot, neox, rot // 2)
    knobs, used = _knob_values(rotary, knobs)
    p = rotary.plan(tokens, nh, nkv, rot, vec, neox, device.sm_count, **({"knobs": knobs} if knobs else {}))
    launches = []
    if bool(int(params["check_positions"])):
        launches.append(Launch(rotary.check_instantiation(np.int64), 1, rotary.CHECK_BLOCK,
                               "position check (then one host synchronization)"))
    launches.append(Launch(p.instantiation(dt, cache_dt), p.grid, p.block, "rotation"))
    elems = tokens * (nh + nkv) * rot
    nbytes = rotary.bytes_moved(tokens, nh, nkv, rot, dt, cache_dt, np.int64)
    written = elems * dt.itemsize
    tile = {"grid": p.grid, "block": p.block, "tokens_per_block": p.tokens_per_block,
            "threads_per_token": f"{p.threads_per_token} ({p.lanes} lanes x {p.groups} head groups)",
            "one_block_computes": f"{p.tokens_per_block} token(s): all {p.heads} q and k heads of each",
            "one_thread_computes": (f"unit u of {p.heads_per_thread} head(s): {p.pairs} pair(s) a head, "
                                    f"{p.items} head(s) loaded before any is rotated"),
            "style": "NeoX (halves)" if neox else "GPT-J (interleaved)", "rotary_dim": rot}
    traffic = {"bytes_read": nbytes - written, "bytes_written": written,
               "counted_by": "cukern.rotary.bytes_moved(tokens, num_heads, num_kv_heads, rotary_dim, dtype)",
               "access_bytes": vec * dt.itemsize,
               "coalesced": "yes: the lanes of a warp take consecutive units of a head, then the next head",
               "re_read": [f"the token's cos/sin row ({rot * cache_dt.itemsize} B) by each of its {p.groups} head "
                           "groups, from L1", "positions once per thread, from L1",
                           f"cos/sin rows repeat across tokens at equal positions: the cache should sit in L2 "
                           f"({_fits_l2(8192 * rot * cache_dt.itemsize, device)} for 8192 positions)"]}
    accumulation = {"reduces": "nothing: each output is two float32 products and one add",
                    "precision": "float32, rounded once to " + dtype_name(dt), "combine": "none", "passes": "one"}
    notes = []
    if bool(int(params["check_positions"])):
        notes.append("the profile measures the rotation (check_positions=False, as the benchmark does)")
    case = (("kv_heads", nkv), ("neox", neox), ("qkv_view", bool(int(params["qkv_view"]))))
    return Described(
        launches=launches, tile=tile, traffic=traffic, accumulation=accumulation, knobs=used, bytes=nbytes,
        bytes_written=written, flops=3 * elems,
        measure=lambda: _bench_measure("rotary_embedding", "rotary_embedding", shape, dt, case), notes=notes)


def _parse_axis(axis):
    if axis is None or isinstance(axis, (int, tuple)):
        return axis
    text = str(axis).strip().lower()
    if text in ("none", ""):
        return None
    parts = tuple(int(a) for a in text.strip("()").split(",") if a.strip())
    return parts[0] if len(parts) == 1 else parts


def _reduce_describe(name: str):
    def describe(shape, dt, params, device, knobs):
        from . import reduce

        axis = _parse_axis(params["axis"])
        op = reduce.OPS[name]
        final = reduce.default_dtype(name, dt)
        o = dt if op.kernel_op in (reduce.OP_MAX, reduce.OP_MIN) else final
        knobs, used = _knob_values(reduce, knobs)
        pl = reduce.plan(shape, dt, axis, op=name, sm_count=device.sm_count, **({"knobs": knobs} if knobs else {}))
        insts = reduce.plan_instantiations(pl, dt, o, op.kernel_op)
        kind, p = pl.layout.kind, pl.kernel
        launches = []
        if insts:
            launches.append(Launch(insts[0], p.grid, p.block, f"{kind} kernel" + (", pass 1 of 2" if pl.cols2 else "")))
        if pl.cols2 is not None:
            launches.append(Launch(insts[1], pl.cols2.grid, pl.cols2.block, "cols kernel, pass 2 of 2 (partials)"))
        outputs, count = pl.layout.outputs, pl.layout.count
        size, acc = dt.itemsize, reduce.acc_dtype(o)
        if kind == "full":
            per_thread = -(-count // (p.grid * p.block))
            thread = f"about {per_thread} elements, {p.unroll} 16-byte loads in flight"
            block = f"a grid-stride share of all {count:,} elements, to one partial; the last block combines {p.grid}"
        elif kind == "rows":
            thread = f"1/{p.tpr} of a row ({-(-count // p.tpr)} elements)"
            block = f"{p.block // p.tpr} row(s) at a time ({p.tpr} threads per row), looping when the grid is capped"
        elif kind == "cols":
            thread = f"{p.vec} adjacent columns down {-(-p.rows_per_slice // (p.block // p.cw))} rows"
            block = f"a strip of {p.cw * p.vec} columns x {p.rows_per_slice} rows ({p.slices} row slices)"
        elif kind == "strided":
            thread = "1/32 of one output's elements"
            block = f"{p.block // 32} outputs, one per warp"
        else:
            thread = block = "no kernel: each output is one input element"
        tile = {"kind": kind, "grid": getattr(p, "grid", None), "block": getattr(p, "block", None),
                "outputs": outputs, "elements_per_output": count, "one_block_computes": block,
                "one_thread_computes": thread}
        nbytes = reduce.bytes_moved(shape, dt, axis, op=name)
        written = outputs * final.itemsize
        if kind == "cols":
            width = f"{p.vec * size} B per row ({p.vec} columns)" if p.vector else f"{size} B ({p.vec} scalar loads)"
            coalesced = "yes: a warp's threads own adjacent column packs, so each row read is contiguous"
        elif kind == "strided":
            width, coalesced = f"{size} B", "no: a warp walks one output's strided elements"
        else:
            width, coalesced = "16 B (scalar head and tail)", "yes: contiguous spans read as 16-byte vectors"
        re_read = ["nothing: every element is read once"]
        if pl.cols2 is not None:
            re_read = [f"partials ({outputs * p.slices * acc.itemsize:,} B) written by pass 1, read by pass 2 from L2"]
        traffic = {"bytes_read": nbytes - written, "bytes_written": written,
                   "counted_by": f"cukern.reduce.bytes_moved(shape, dtype, axis, op={name!r})",
                   "access_bytes": width, "coalesced": coalesced, "re_read": re_read}
        combine = {"full": f"shuffle butterfly, shared memory across warps, then the last of {getattr(p, 'grid', 0)} "
                           "blocks combines the partials in index order",
                   "rows": "shuffle butterfly per row group (shared memory when a block owns the row)",
                   "cols": "row lanes combined through shared memory" + (", then a second pass over the slices"
                                                                         if pl.cols2 else ""),
                   "strided": "shuffle butterfly per warp"}.get(kind, "none")
        accumulation = {"reduces": f"{name} of {count:,} elements per output",
                        "precision": f"{dtype_name(acc)} accumulators, result {dtype_name(final)}",
                        "order": "fixed by the plan (no atomics): bit-identical run to run", "combine": combine,
                        "passes": len(launches)}
        notes = ["the input is first copied to contiguous (reduced axes last); that copy is not in the count"] if pl.copy else []
        prefix = {"full": "full_", "rows": "row_"}.get(kind)
        constants = {"cols": ("COL_BLOCK", "COL_WAVES", "COL_MIN_ROWS"), "strided": ("STRIDED_BLOCK", "STRIDED_WAVES")}
        if prefix:
            knob_values = {k: v for k, v in used.items() if k.startswith(prefix)}
        else:
            knob_values = {c.lower(): getattr(reduce, c) for c in constants.get(kind, ()) if hasattr(reduce, c)}
        flops = outputs * count * (2 if op.kernel_op == reduce.OP_SUMSQ else 1)

        def measure():
            import cupy

            x = cupy.random.default_rng(0).standard_normal(shape, dtype=np.float32).astype(dt)
            fn = getattr(reduce, name)
            return lambda: fn(x, axis=axis)

        return Described(launches=launches, tile=tile, traffic=traffic, accumulation=accumulation,
                         knobs=knob_values, bytes=nbytes, bytes_written=written, flops=flops,
                         measure=measure, notes=notes)

    return describe


def _rung_describe(number: int):
    def describe(shape, dt, params, device, knobs):
        from . import ladder, reduce

        rung = ladder.RUNGS[number - 1]
        (n,) = shape if len(shape) == 1 else (math.prod(shape),)
        a = ladder.acc_dtype(dt)
        launches = []
        if rung.single_launch:
            launches.append(Launch(rung.instantiations(dt)[0], rung.grid(n, dt.itemsize, device.sm_count),
                                   rung.block, "single launch: last block combines"))
        else:
            cur, left, k = dt, n, 1
            while True:
                g = rung.grid(left, cur.itemsize, device.sm_count)
                launches.append(Launch(Instantiation(ladder.SOURCE, rung.name, (cur, a, ladder.BLOCK)), g, rung.block,
                                       f"pass {k}: {left:,} -> {g:,} values"))
                if g == 1:
                    break
                cur, left, k = a, g, k + 1
        first = launches[0]
        vector = rung.sizing in ("resident_vec", "last_block", "full")
        per_thread = {"one": "one element", "two": "two elements, added while loading"}.get(
            rung.sizing, f"a grid-stride share (about {-(-n // (first.grid * first.block))} elements)")
        tile = {"grid": first.grid, "block": first.block, "launches": len(launches),
                "one_block_computes": "one partial sum of its elements" + (
                    "; the last block to finish sums the partials" if rung.single_launch else ""),
                "one_thread_computes": per_thread, "change_from_previous_rung": rung.change}
        nbytes = reduce.bytes_moved((n,), dt, op="sum")
        written = reduce.default_dtype("sum", dt).itemsize
        traffic = {"bytes_read": nbytes - written, "bytes_written": written,
                   "counted_by": "cukern.reduce.bytes_moved((n,), dtype, op='sum')",
                   "access_bytes": 16 if vector else dt.itemsize, "coalesced": "yes: consecutive threads, consecutive elements",
                   "re_read": ([f"per-block partials by later passes ({sum(x.grid for x in launches[:-1]) * a.itemsize:,} B)"]
                               if len(launches) > 1 else ["nothing: the partials stay in the workspace (L2)"])}
        accumulation = {"reduces": f"the sum of {n:,} elements", "precision": dtype_name(a),
                        "combine": rung.change, "passes": len(launches)}

        def measure():
            x = ladder.make_data(n, dt)
            return lambda: rung(x)

        return Described(launches=launches, tile=tile, traffic=traffic, accumulation=accumulation,
                         knobs={"block": rung.block, "grid_sizing": rung.sizing}, bytes=nbytes, bytes_written=written,
                         flops=n, measure=measure, notes=["a ladder rung: fixed by design, not tuned"])

    return describe


def _register_all() -> None:
    rms_params = {"weight_dtype": None}
    register(CardSpec("rms_norm", (16384, 4096), "bfloat16", _rms_describe(False), rms_params, "rms_norm"))
    register(CardSpec("fused_add_rms_norm", (16384, 4096), "bfloat16", _rms_describe(True), rms_params, "rms_norm"))
    rope = {"kv_heads": 8, "neox": 1, "rotary_dim": None, "check_positions": 1, "qkv_view": 0}
    register(CardSpec("rotary_embedding", (16384, 32, 128), "bfloat16", _rotary_describe, rope, "rotary"))
    register(CardSpec("rotary_embedding_gptj", (16384, 32, 128), "bfloat16", _rotary_describe, {**rope, "neox": 0},
                      "rotary"))
    register(CardSpec("rotary_embedding_qkv_view", (16384, 32, 128), "bfloat16", _rotary_describe,
                      {**rope, "qkv_view": 1}, "rotary", tuning_op="rotary_embedding"))
    for name in ("sum", "mean", "amax", "amin", "sum_of_squares", "norm"):
        register(CardSpec(name, (1 << 29,), "float32", _reduce_describe(name), {"axis": None}, "reduce"))
    register(CardSpec("sum_rows", (32768, 16384), "float32", _reduce_describe("sum"), {"axis": -1}, "reduce"))
    register(CardSpec("sum_cols", (16384, 32768), "float32", _reduce_describe("sum"), {"axis": 0}, "reduce"))
    from .ladder import RUNGS

    for rung in RUNGS:
        register(CardSpec(f"reduce_ladder.{rung.label}", (1 << 28,), "float32", _rung_describe(rung.number), {},
                          "reduce_ladder"))


_register_all()
