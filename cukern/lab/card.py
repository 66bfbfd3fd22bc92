"""The six-question card for the exact launch a call makes: ``cukern.lab.card.explain(op, shape, dtype)`` and
``python -m cukern.lab explain OP``.

1. Output tile: grid and block, what one block and one thread compute.
2. Input traffic: bytes read and written (the benchmark's own count), access width, coalescing, what is
   re-read and where it should live.
3. Accumulation: what is reduced, in what precision, how partials combine.
4. Staging: registers, shared memory, local memory and blocks per SM, read from the compiled kernel
   (``cupy.RawKernel.attributes`` on a GPU, NVRTC's ptxas report without one; :mod:`cukern.lab.device`).
5. Tuning: the knobs, their values, and whether they came from the heuristic or the tuning cache.
6. Profile: bytes, FLOPs, arithmetic intensity against the device's ridge point, the time the bandwidth
   limit allows and, on a GPU, the measured time, % of the copy peak and a verdict.

Sections 1 to 3 and the knobs come from the op's family: its lab module registers a :class:`CardSpec`
whose ``describe`` is built from the op module's own planning functions, so the card, the benchmark and
the docs read the same numbers. The tests fail for any benchmarked op or ladder rung without a card.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

import cukern.lab.bench as bench
import cukern.lab.tune as tune

from .. import _tuned, timing
from .._compile import Instantiation
from .._dtypes import FLOAT_TYPES, dtype_name, parse_dtype
from .._typing import DTypeLike
from .device import Device, current_device, gpu_present, profile, staging

# ---------------------------------------------------------------------------------------------------------
# What an op's describe function returns.


@dataclass(frozen=True)
class Launch:
    """One kernel launch of the call (a multi-pass rung's passes differ in grid, so each pass is its own
    Launch; the staging section counts identical ones)."""

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
    dtype, params, device, knobs)`` -> :class:`Described` (``knobs`` None means the heuristic's). ``dtypes``:
    the input dtypes the op takes (the op module's own list), checked before ``describe`` runs; ``ndim``: the
    one rank its shapes have (None: any)."""

    op: str
    default_shape: tuple
    default_dtype: str
    describe: Callable
    params: dict = field(default_factory=dict)
    family: str = ""
    tuning_op: str | None = None  # the tunable whose cache entries this launch uses (default: op)
    dtypes: tuple = FLOAT_TYPES
    ndim: int | None = None


CARDS: dict = {}


def register(spec: CardSpec) -> None:
    CARDS[spec.op] = spec


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
        parts = text.strip().lower().replace("*", "x").split("x")
        if not all(re.fullmatch(r"-?\d+", p.strip()) for p in parts):
            raise ValueError(f"shape {text!r} is not like 16384x4096 (sizes joined by x)")
        shape = tuple(int(p) for p in parts)
    else:
        shape = tuple(int(n) for n in text)
    if not shape or any(n < 1 for n in shape):
        raise ValueError(f"shape {text!r} must have at least one dimension, all positive")
    return shape


def _check_size(op: str, shape: tuple, dt: np.dtype) -> None:
    """ValueError for a shape no array has: CuPy and NumPy count an array's bytes in a signed 64-bit integer."""
    if math.prod(shape) * dt.itemsize >= 2**63:
        raise ValueError(f"{op}: an array of shape {'x'.join(map(str, shape))} and dtype {dtype_name(dt)} "
                         f"would pass 2^63 bytes, more than any array holds")


def _param_value(op: str, key: str, value, default):
    """A ``--param`` value given as text, as the op takes it: an axis (``0``, ``0,1``, ``(0, 1)``), a dtype for
    a ``*_dtype`` param, else an integer; ``none`` where the param's default is None. Values given as
    themselves pass through."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if text.lower() == "none" and default is None:
        return None
    if key == "axis":
        if not re.fullmatch(r"\(?\s*-?\d+(\s*,\s*-?\d+)*\s*,?\s*\)?", text):
            raise ValueError(f"{op} param axis={value!r} is not an axis; give an integer, several like 0,1, or none")
        return bench.parse_axis(text)
    if key.endswith("_dtype"):
        try:
            return dtype_name(parse_dtype(text))
        except TypeError:
            raise ValueError(f"{op} param {key}={value!r} is not a dtype; give one like bfloat16 or float32") from None
    if not re.fullmatch(r"-?\d+", text):
        raise ValueError(f"{op} param {key}={value!r} is not an integer")
    return int(text)


def _card_dtype(spec: CardSpec, dtype) -> np.dtype:
    """``dtype`` as one the op takes; a ValueError naming them otherwise (``bf16``, ``int8``, or float64 for a
    row op), raised before planning so that no kernel is compiled for it."""
    try:
        dt = parse_dtype(dtype)
    except TypeError:
        dt, given = None, repr(dtype)
    else:
        given = dtype_name(dt)
    if dt is None or not any(dt == t for t in spec.dtypes):
        raise ValueError(f"{spec.op} takes dtype {', '.join(dtype_name(t) for t in spec.dtypes)}, not {given}")
    return dt


@dataclass
class Resolved:
    """An op call resolved to its launches: shape, dtype and params filled in, knobs looked up."""

    spec: CardSpec
    shape: tuple
    dtype: np.dtype
    params: dict
    described: Described
    tuning_op: str
    tunable: tune.Tunable | None
    tuning_shape: tuple
    entry: dict | None


def resolve(op: str, shape=None, dtype=None, device: Device | None = None, params: dict | None = None) -> Resolved:
    """Fill in defaults, look up the tuning cache and run the op's ``describe`` (no compilation, no GPU).
    ``params``: the op's, by name (:func:`build`)."""
    params = params or {}
    if op not in CARDS:
        raise ValueError(f"no card for {op!r}; ops with cards: {', '.join(sorted(CARDS))}")
    spec = CARDS[op]
    unknown = set(params) - set(spec.params)
    if unknown:
        raise ValueError(f"{op} takes params {', '.join(sorted(spec.params)) or 'none'}, not "
                         f"{', '.join(sorted(unknown))}")
    shape = parse_shape(spec.default_shape if shape is None else shape)
    if spec.ndim is not None and len(shape) != spec.ndim:
        like = "x".join(map(str, spec.default_shape))
        raise ValueError(f"{op} takes a shape of {spec.ndim} dimensions, like {like}; got {'x'.join(map(str, shape))}")
    dt = _card_dtype(spec, spec.default_dtype if dtype is None else dtype)
    _check_size(op, shape, dt)
    params = {**spec.params, **{k: _param_value(op, k, v, spec.params[k]) for k, v in params.items()}}
    device = device or current_device()
    tuning_op = spec.tuning_op or op
    tunable = tune.TUNABLES.get(tuning_op)
    if tunable is None:
        tshape, entry, knobs = shape, None, None
    else:
        tshape = tunable.from_case(shape, params) if tunable.from_case else shape
        entry = _tuned.lookup_entry(tunable.rule, device.name, dt, tshape)
        knobs = tunable.rule.knobs_from(entry["knobs"]) if entry is not None else None
    described = spec.describe(shape, dt, params, device, knobs)
    return Resolved(spec, shape, dt, params, described, tuning_op, tunable, tshape, entry)


def measure_us(d: Described, repeat: int = 50) -> float:
    """The median time of the described call on the current GPU (:func:`cukern.timing.benchmark`)."""
    assert d.measure is not None, "a card without a GPU call is not measured"
    return timing.benchmark(d.measure(), warmup=10, repeat=repeat, bytes_moved=d.bytes).median_us


def explain(op: str, shape: Sequence[int] | str | None = None, dtype: DTypeLike | None = None, *,
            measure: bool | None = None, device: Device | None = None, **params: Any) -> Card:
    """The card for the launch ``op`` makes on ``shape`` and ``dtype`` (defaults: the op's benchmark shape).

    ``measure``: time the op on the GPU (default: when a GPU is present). ``device``: plan for this device
    instead of the current one (no measurement then). ``params``: op-specific (``explain("sum", axis=0)``,
    ``explain("rotary_embedding", kv_heads=8, neox=False)``; see ``CARDS[op].params``).

    Examples
    --------
    >>> from cukern.lab.card import explain
    >>> from cukern.lab.device import H200
    >>> card = explain("rms_norm", (4, 4096), "bfloat16", device=H200)  # planned for an H200, on any machine
    >>> card.traffic["bytes_read"], card.traffic["bytes_written"], card.profile["bytes"]
    (40960, 32768, 73728)
    >>> card.staging[0]["local_memory_bytes"], card.profile["verdict"]
    (0, 'latency-bound')
    >>> print(card.format().splitlines()[0])
    rms_norm 4x4096 bfloat16 on NVIDIA H200 (assumed: no GPU; datasheet figures)
    """
    return build(op, shape, dtype, params, measure=measure, device=device)


def build(op: str, shape: Sequence[int] | str | None, dtype: DTypeLike | None, params: dict[str, Any], *,
          measure: bool | None = None, device: Device | None = None) -> Card:
    """:func:`explain` with the op's params as a dict (the command line's ``--param``, whose keys may be any
    text, ``dtype`` and ``device`` included), their values as themselves or as text."""
    on_gpu = device is None and gpu_present()
    device = device or current_device()
    measure = on_gpu if measure is None else (measure and on_gpu)
    r = resolve(op, shape, dtype, device, params)
    spec, shape, dt, params, d, tuning_op, tunable, tshape, entry = (
        r.spec, r.shape, r.dtype, r.params, r.described, r.tuning_op, r.tunable, r.tuning_shape, r.entry)
    tune_info = {"knobs": d.knobs,
                 "source": "tuning cache" if entry is not None else "heuristic (no tuning cache entry)"}
    if entry is not None and "from_family" in entry:
        tune_info["source"] = "heuristic, with the tuning cache's batch-invariant knobs"
        tune_info["cache_entry"] = (f"{entry['family']} was tuned at {entry['from_family']}; this bucket "
                                    f"({entry['bucket']}) keeps its invariant knobs ({_tuned.cache_path()})")
    elif entry is not None:
        tune_info["cache_entry"] = (f"bucket {entry['bucket']}: {entry.get('median_us')} µs tuned vs "
                                    f"{entry.get('heuristic_us')} µs heuristic ({_tuned.cache_path()})")
    if tunable is not None:
        tune_info["space"] = {k: list(v) for k, v in tunable.space.items()}
        tune_info["tune_with"] = (f"python -m cukern.lab tune --op {tuning_op} --shape {'x'.join(map(str, tshape))} "
                                  f"--dtype {dtype_name(dt)}")
    else:
        tune_info["space"] = "not tunable yet (no Tunable registered with cukern.lab.tune)"

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
        profile=profile(d.bytes, d.flops, device, measured_us), unmeasured=unmeasured, notes=d.notes,
    )
