"""Autotuning: time every candidate plan of an op and keep the winner, per device, in the tuning cache.

A family takes part by registering a :class:`Tunable` for each op (its lab module calls :func:`register`):
the op's own :class:`cukern._tuned.Rule` (name, heuristic knobs, cache key), its knob space as data
(``{"items_target": [1, 2, 4, 8], "waves": [None, 2, 4, 8]}``), how to build inputs for a shape and dtype,
and ``run(state, knobs)`` returning a zero-argument callable that launches with exactly those knobs.
:func:`tune` times every distinct candidate with :mod:`cukern.timing` and writes the winner to the cache
file (:mod:`cukern._tuned`), keyed by device name, op, dtype and the rule's bucket. Ops read it back
through ``_tuned.lookup`` with the same rule: one dict lookup per call after the file is loaded once per
process.

The heuristic is always a candidate (timed first) and is kept unless another plan beats it by more than
``MARGIN`` (run-to-run noise), so a tuned plan is never slower than the default in the run that chose it
(except under pinning, below, where consistency across batch sizes comes first).

Batch invariance: an op whose results must not depend on the batch (RMSNorm's per-row reduction order
depends on its threads per row) names those knobs in ``Rule.invariant``. Once one bucket of a
``family`` (RMSNorm: a hidden size) is tuned, later buckets of that family are tuned with the invariant
knobs pinned to the same values (the heuristic is still timed, as the reference, but wins only if it has
them), so every row count still reduces a row in the same order.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from .. import _launch, timing
from .._dtypes import dtype_name, parse_dtype
from .._tuned import Rule, TuningCache, device_name, forget_resolved, knobs_dict, loaded_cache
from .._typing import DTypeLike
from .progress import Progress

MARGIN = 0.01


@dataclass
class Tunable:
    """One op's tuning space and how to time a point of it.

    ``rule``: the op's own :class:`cukern._tuned.Rule` (its name, default knobs, cache key). ``space``: knob
    name -> candidate values (data). ``setup(shape, dtype)`` -> inputs; ``run(state, knobs)`` -> a
    zero-argument callable launching with those knobs. ``bytes(shape, dtype)``: the bytes the benchmark
    counts. ``signature(shape, dtype, knobs, sm_count)``: candidates with equal signatures make the same
    launch and are timed once. ``from_case``: the benchmark case's shape and params in this tunable's shape
    convention (identity when None), which is also the shape the op passes to its lookup. ``ndim``: the one
    rank of this tunable's shapes (None: any).
    """

    rule: Rule
    space: dict
    setup: Callable
    run: Callable
    bytes: Callable
    signature: Callable | None = None
    from_case: Callable | None = None  # (benchmark case shape, params dict) -> this tunable's shape
    ndim: int | None = None

    @property
    def op(self) -> str:
        return self.rule.op

    @property
    def default(self):
        return self.rule.default

    def candidates(self, shape, dtype, sm_count: int, pinned: dict | None = None) -> list:
        """The heuristic first, then every point of ``space`` (with ``pinned`` knobs fixed) making a
        launch not seen yet."""
        names = list(self.space)
        points = [self.default]
        for values in itertools.product(*(self.space[n] for n in names)):
            d = {**knobs_dict(self.default), **dict(zip(names, values)), **(pinned or {})}
            points.append(self.rule.make(d))
        out, seen = [], set()
        for k in points:
            sig = self.signature(shape, dtype, k, sm_count) if self.signature else tuple(sorted(knobs_dict(k).items()))
            if sig not in seen:
                seen.add(sig)
                out.append(k)
        return out


TUNABLES: dict = {}  # op name -> Tunable, filled by the families' lab modules


def register(tunable: Tunable) -> None:
    TUNABLES[tunable.op] = tunable


@dataclass
class TuneResult:
    op: str
    shape: tuple
    dtype: str
    device: str
    bucket: str
    knobs: object
    median_us: float
    heuristic: object
    heuristic_us: float
    timings: list = field(default_factory=list)  # (knobs dict, median µs or None, error or None)
    pinned: dict = field(default_factory=dict)

    @property
    def from_heuristic(self) -> bool:
        return knobs_dict(self.knobs) == knobs_dict(self.heuristic)

    def entry(self, family: str | None) -> dict:
        e = {"device": self.device, "op": self.op, "dtype": self.dtype, "bucket": self.bucket,
             "knobs": knobs_dict(self.knobs), "median_us": round(self.median_us, 3),
             "heuristic_us": round(self.heuristic_us, 3), "shape": list(self.shape),
             "tuned_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        if family is not None:
            e["family"] = family
        return e


def choose(timings, margin: float = MARGIN, pinned: dict | None = None):
    """``(knobs, µs)`` of the winner among ``timings`` (knobs, µs) pairs whose first is the heuristic:
    the fastest of those that keep the ``pinned`` knob values, unless the heuristic keeps them too and is
    beaten by no more than ``margin``."""
    def keeps(knobs) -> bool:
        d = knobs_dict(knobs)
        return all(d.get(k) == v for k, v in (pinned or {}).items())

    base_knobs, base_us = timings[0]
    best_knobs, best_us = min((kt for kt in timings if keeps(kt[0])), key=lambda kt: kt[1])
    if keeps(base_knobs) and best_us >= base_us * (1 - margin):
        return base_knobs, base_us
    return best_knobs, best_us


def pinned_knobs(rule: Rule, cache: TuningCache, device: str, dtype, shape) -> dict:
    """The invariant knobs an earlier tuning of another bucket of the same family fixed (empty if none)."""
    if not rule.invariant or rule.family is None:
        return {}
    for e in cache.family(device, rule.op, dtype_name(dtype), rule.family(tuple(shape))):
        if e["bucket"] != rule.bucket(tuple(shape)):
            return {k: e["knobs"][k] for k in rule.invariant if k in e["knobs"]}
    return {}


def check_shape(op: str, shape) -> None:
    """ValueError for a shape of another rank than ``op``'s tunable takes."""
    t = TUNABLES.get(op)
    if t is not None and t.ndim is not None and len(shape) != t.ndim:
        raise ValueError(f"{op} tunes shapes of {t.ndim} dimensions, got {'x'.join(map(str, shape))}")


def tune(op: str, shape: Sequence[int], dtype: DTypeLike = "bfloat16", *, repeat: int = 50, warmup: int = 5,
         save: bool = True, margin: float = MARGIN, progress: bool = True,
         cache: TuningCache | None = None) -> TuneResult:
    """Time every candidate plan of ``op`` for ``shape`` and ``dtype`` on the current device, store the
    winner in the tuning cache (``save``) and return it with the heuristic's time. Needs a GPU.

    Examples
    --------
    >>> import cupy as cp
    >>> from cukern.lab.tune import tune
    >>> with cp.cuda.Device(0):
    ...     result = tune("rms_norm", (64, 4096), "bfloat16", repeat=5, warmup=1, save=False, progress=False)
    >>> result.op, result.shape, result.dtype, result.median_us <= result.heuristic_us
    ('rms_norm', (64, 4096), 'bfloat16', True)
    """
    import cupy

    t = TUNABLES.get(op)
    if t is None:
        raise ValueError(f"{op} has no tuning space; tunable ops: {', '.join(sorted(TUNABLES))}")
    shape, dt = tuple(int(n) for n in shape), parse_dtype(dtype)
    check_shape(op, shape)
    _launch.require_gpu()
    dev = cupy.cuda.Device()
    device = device_name(dev.id)
    cache = loaded_cache() if cache is None else cache
    family = t.rule.family(shape) if t.rule.family else None
    pinned = pinned_knobs(t.rule, cache, device, dt, shape)
    candidates = t.candidates(shape, dt, _launch.sm_count(dev.id), pinned)
    state = t.setup(shape, dt)
    nbytes = t.bytes(shape, dt)
    timed: list[tuple[Any, float]] = []
    rows: list[tuple[dict, float | None, str | None]] = []
    with Progress(len(candidates), f"tune {op} {'x'.join(map(str, shape))} {dtype_name(dt)}",
                  quiet=not progress) as bar:
        for i, k in enumerate(candidates):
            try:
                us = timing.benchmark(t.run(state, k), warmup=warmup, repeat=repeat, bytes_moved=nbytes).median_us
            except Exception as err:  # a candidate that cannot launch here is skipped; the heuristic must run
                if i == 0:
                    raise
                rows.append((knobs_dict(k), None, f"{type(err).__name__}: {err}"))
                bar.step("skipped")
                continue
            timed.append((k, us))
            rows.append((knobs_dict(k), us, None))
            bar.step(f"{us:.1f} µs")
    del state
    cupy.get_default_memory_pool().free_all_blocks()
    best, best_us = choose(timed, margin, pinned)
    result = TuneResult(op, shape, dtype_name(dt), device, t.rule.bucket(shape), best, best_us, candidates[0],
                        timed[0][1], rows, pinned)
    if save:
        cache.put(result.entry(family))
        cache.save()
        forget_resolved()
    return result


def tunable_for_case(case):
    """``(Tunable, shape in its convention)`` for a benchmark case whose op has a tuning space, else None."""
    t = TUNABLES.get(case.op)
    if t is None:
        return None
    return t, (t.from_case(tuple(case.shape), dict(case.params)) if t.from_case else tuple(case.shape))


def format_result(r: TuneResult) -> str:
    lines = [f"{r.op} {'x'.join(map(str, r.shape))} {r.dtype} on {r.device} (bucket {r.bucket})"]
    if r.pinned:
        lines.append(f"  pinned for batch invariance: {r.pinned}")
    for knobs, us, err in sorted(r.timings, key=lambda row: (row[1] is None, row[1] or 0.0)):
        mark = "*" if knobs == knobs_dict(r.knobs) else " "
        note = " (heuristic)" if knobs == knobs_dict(r.heuristic) else ""
        lines.append(f" {mark} {knobs}  " + (f"{us:9.2f} µs{note}" if us is not None else f"skipped: {err}"))
    verdict = "heuristic kept" if r.from_heuristic else f"{r.heuristic_us / r.median_us:.3f}x over the heuristic"
    lines.append(f"  chosen {knobs_dict(r.knobs)}: {r.median_us:.2f} µs, heuristic {r.heuristic_us:.2f} µs "
                 f"({verdict})")
    return "\n".join(lines)
