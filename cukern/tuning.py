"""Autotuning: time every candidate plan of an op and keep the winner, per device, in a JSON cache.

An op takes part by declaring a :class:`Tunable`: its knob space as data (``{"items_target": [1, 2, 4, 8],
"waves": [None, 2, 4, 8]}``), the heuristic's knobs, how to build inputs for a shape and dtype, and
``run(state, knobs)`` returning a zero-argument callable that launches with exactly those knobs.
:func:`tune` times every distinct candidate with :mod:`cukern.timing` and writes the winner to
``tuning.json`` in :func:`cache_dir`, keyed by device name, op, dtype and shape bucket. Ops read it back
through :func:`lookup`: one dict lookup per call after the file is loaded once per process.

The heuristic is always a candidate (timed first) and is kept unless another plan beats it by more than
``MARGIN`` (run-to-run noise), so a tuned plan is never slower than the default in the run that chose it
(except under pinning, below, where consistency across batch sizes comes first).

Batch invariance: an op whose results must not depend on the batch (RMSNorm's per-row reduction order
depends on its threads per row) names those knobs in ``Tunable.invariant``. Once one bucket of a
``family`` (RMSNorm: a hidden size) is tuned, later buckets of that family are tuned with the invariant
knobs pinned to the same values (the heuristic is still timed, as the reference, but wins only if it has
them), so every row count still reduces a row in the same order.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import math
import os
import sys
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ._dtypes import dtype_name, parse_dtype

CACHE_FORMAT = "cukern-tuning-cache"
CACHE_VERSION = 1
CACHE_FILE = "tuning.json"
MARGIN = 0.01


def cache_dir() -> Path:
    """``$CUKERN_CACHE_DIR`` if set, else the user's cache directory (``$XDG_CACHE_HOME`` or ``~/.cache``,
    ``%LOCALAPPDATA%`` on Windows) plus ``cukern``."""
    env = os.environ.get("CUKERN_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    if sys.platform == "win32" and os.environ.get("LOCALAPPDATA"):
        return Path(os.environ["LOCALAPPDATA"]) / "cukern"
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "cukern"


def cache_path() -> Path:
    return cache_dir() / CACHE_FILE


# ---------------------------------------------------------------------------------------------------------
# The cache file.


def _valid_entry(e) -> bool:
    keys = ("device", "op", "dtype", "bucket")
    return isinstance(e, dict) and all(isinstance(e.get(k), str) for k in keys) and isinstance(e.get("knobs"), dict)


class TuningCache:
    """The entries of one cache file, keyed ``(device, op, dtype, bucket)``. A file that is not JSON, is
    some other program's JSON or another format version is ignored with a warning (and replaced on the
    next save); malformed entries are dropped with a warning. Never raises on a bad file."""

    def __init__(self, path: Path | None = None):
        self.path = Path(path) if path is not None else cache_path()
        self.entries: dict = {}
        self._load()

    def _load(self) -> None:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return
        except OSError as err:
            warnings.warn(f"cukern tuning cache {self.path} cannot be read ({err}); ignoring it", stacklevel=3)
            return
        try:
            doc = json.loads(text)
        except ValueError as err:
            warnings.warn(f"cukern tuning cache {self.path} is not valid JSON ({err}); ignoring it", stacklevel=3)
            return
        if not isinstance(doc, dict) or doc.get("format") != CACHE_FORMAT or not isinstance(doc.get("entries"), list):
            warnings.warn(f"cukern tuning cache {self.path} is not a cukern tuning cache; ignoring it", stacklevel=3)
            return
        if doc.get("version") != CACHE_VERSION:
            warnings.warn(f"cukern tuning cache {self.path} has version {doc.get('version')!r}, this cukern reads "
                          f"{CACHE_VERSION}; ignoring it", stacklevel=3)
            return
        bad = 0
        for e in doc["entries"]:
            if _valid_entry(e):
                self.entries[(e["device"], e["op"], e["dtype"], e["bucket"])] = e
            else:
                bad += 1
        if bad:
            warnings.warn(f"cukern tuning cache {self.path}: ignored {bad} malformed entries", stacklevel=3)

    def get(self, device: str, op: str, dtype: str, bucket: str) -> dict | None:
        return self.entries.get((device, op, dtype, bucket))

    def family(self, device: str, op: str, dtype: str, family: str) -> list:
        """Entries of the same device, op and dtype whose ``family`` is ``family``."""
        return [e for (d, o, t, _), e in self.entries.items()
                if (d, o, t) == (device, op, dtype) and e.get("family") == family]

    def put(self, entry: dict) -> None:
        if not _valid_entry(entry):
            raise ValueError(f"not a tuning cache entry: {entry!r}")
        self.entries[(entry["device"], entry["op"], entry["dtype"], entry["bucket"])] = entry

    def save(self) -> None:
        """Write atomically (a temporary file renamed over the old one)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        doc = {"format": CACHE_FORMAT, "version": CACHE_VERSION,
               "entries": sorted(self.entries.values(), key=lambda e: (e["device"], e["op"], e["dtype"], e["bucket"]))}
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(doc, indent=1) + "\n")
        os.replace(tmp, self.path)


# ---------------------------------------------------------------------------------------------------------
# What ops call: the process-wide cache, loaded once, and a memo of resolved knobs.

_lock = threading.Lock()
_cache: TuningCache | None = None
_resolved: dict = {}
_device_names: dict = {}
_MEMO_LIMIT = 4096
_enabled = os.environ.get("CUKERN_TUNING", "on").lower() not in ("0", "off", "false", "no")


def loaded_cache() -> TuningCache:
    """The process-wide cache (read from disk on first use)."""
    global _cache
    if _cache is None:
        with _lock:
            if _cache is None:
                _cache = TuningCache()
    return _cache


def reset() -> None:
    """Forget the loaded cache and every resolved lookup (the next lookup reads the file again)."""
    global _cache
    with _lock:
        _cache = None
        _resolved.clear()


def enabled() -> bool:
    return _enabled


@contextlib.contextmanager
def heuristic_only():
    """Within this block ops ignore the tuning cache (``CUKERN_TUNING=off`` does the same for a process)."""
    global _enabled
    before = _enabled
    _enabled = False
    try:
        yield
    finally:
        _enabled = before


def device_name(device_id: int) -> str:
    name = _device_names.get(device_id)
    if name is None:
        import cupy

        name = _device_names[device_id] = cupy.cuda.runtime.getDeviceProperties(device_id)["name"].decode()
    return name


def effective_entry(t, cache: TuningCache, device: str, dtype, shape) -> dict | None:
    """The cache entry a call uses: its bucket's own; else, for an op with ``invariant`` knobs whose family
    has been tuned in another bucket, the heuristic with that family's invariant knobs (so an untuned batch
    size still reduces like the tuned ones); else None."""
    name, shape = dtype_name(dtype), tuple(shape)
    entry = cache.get(device, t.op, name, t.bucket(shape))
    if entry is not None or not t.invariant or t.family is None:
        return entry
    family = cache.family(device, t.op, name, t.family(shape))
    if not family:
        return None
    knobs = {**knobs_dict(t.default), **{k: family[0]["knobs"][k] for k in t.invariant if k in family[0]["knobs"]}}
    return {"device": device, "op": t.op, "dtype": name, "bucket": t.bucket(shape), "knobs": knobs,
            "family": family[0]["family"], "from_family": family[0]["bucket"]}


def lookup(op: str, device_id: int, dtype, shape):
    """The tuned knobs (the op's own knobs object) for this call, or None for the heuristic. One dict lookup
    once a (device, op, dtype, shape) has been seen; the file is read once per process."""
    if not _enabled:
        return None
    key = (device_id, op, dtype, shape)
    try:
        return _resolved[key]
    except KeyError:
        pass
    knobs = None
    t = tunables().get(op)
    if t is not None:
        entry = effective_entry(t, loaded_cache(), device_name(device_id), dtype, shape)
        if entry is not None:
            knobs = t.knobs_from(entry["knobs"])
    if len(_resolved) >= _MEMO_LIMIT:
        _resolved.clear()
    _resolved[key] = knobs
    return knobs


def lookup_entry(op: str, device: str, dtype, shape) -> dict | None:
    """The cache entry a call of ``op`` on ``device`` (a name) would use, or None (for ``explain``)."""
    t = tunables().get(op)
    if t is None or not _enabled:
        return None
    entry = effective_entry(t, loaded_cache(), device, parse_dtype(dtype), shape)
    if entry is not None and t.knobs_from(entry["knobs"]) is None:
        return None
    return entry


# ---------------------------------------------------------------------------------------------------------
# Tunables and the tuner.


def knobs_dict(knobs) -> dict:
    return dataclasses.asdict(knobs) if dataclasses.is_dataclass(knobs) else dict(knobs)


@dataclass
class Tunable:
    """One op's tuning space and how to time a point of it.

    ``space``: knob name -> candidate values (data). ``default``: the heuristic's knobs object. ``make``:
    dict -> knobs object. ``setup(shape, dtype)`` -> inputs; ``run(state, knobs)`` -> a zero-argument
    callable launching with those knobs. ``bytes(shape, dtype)``: the bytes the benchmark counts.
    ``bucket(shape)``: the cache key's shape part. ``signature(shape, dtype, knobs, sm_count)``: candidates
    with equal signatures make the same launch and are timed once. ``invariant`` and ``family``: see the
    module docstring. ``from_case``: the benchmark case's shape and params in this tunable's shape
    convention (identity when None), which is also the shape the op passes to :func:`lookup`.
    """

    op: str
    space: dict
    default: object
    make: Callable
    setup: Callable
    run: Callable
    bytes: Callable
    bucket: Callable
    signature: Callable | None = None
    invariant: tuple = ()
    family: Callable | None = None
    from_case: Callable | None = None  # (benchmark case shape, params dict) -> this tunable's shape

    def knobs_from(self, d: dict):
        """The knobs object for a stored dict, or None (with a warning) when it does not fit this op."""
        try:
            return self.make(dict(d))
        except (TypeError, ValueError) as err:
            warnings.warn(f"cukern tuning cache: knobs {d!r} for {self.op} do not fit ({err}); using the heuristic",
                          stacklevel=3)
            return None

    def candidates(self, shape, dtype, sm_count: int, pinned: dict | None = None) -> list:
        """The heuristic first, then every point of ``space`` (with ``pinned`` knobs fixed) making a
        launch not seen yet."""
        names = list(self.space)
        points = [self.default]
        for values in itertools.product(*(self.space[n] for n in names)):
            d = {**knobs_dict(self.default), **dict(zip(names, values)), **(pinned or {})}
            points.append(self.make(d))
        out, seen = [], set()
        for k in points:
            sig = self.signature(shape, dtype, k, sm_count) if self.signature else tuple(sorted(knobs_dict(k).items()))
            if sig not in seen:
                seen.add(sig)
                out.append(k)
        return out


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


def pinned_knobs(t: Tunable, cache: TuningCache, device: str, dtype, shape) -> dict:
    """The invariant knobs an earlier tuning of another bucket of the same family fixed (empty if none)."""
    if not t.invariant or t.family is None:
        return {}
    for e in cache.family(device, t.op, dtype_name(dtype), t.family(tuple(shape))):
        if e["bucket"] != t.bucket(tuple(shape)):
            return {k: e["knobs"][k] for k in t.invariant if k in e["knobs"]}
    return {}


def tune(op: str, shape, dtype="bfloat16", *, repeat: int = 50, warmup: int = 5, save: bool = True,
         margin: float = MARGIN, progress: bool = True, cache: TuningCache | None = None) -> TuneResult:
    """Time every candidate plan of ``op`` for ``shape`` and ``dtype`` on the current device, store the
    winner in the tuning cache (``save``) and return it with the heuristic's time. Needs a GPU."""
    import cupy

    from . import timing
    from ._launch import sm_count as _sm_count
    from .progress import Progress

    t = tunables().get(op)
    if t is None:
        raise ValueError(f"{op} has no tuning space; tunable ops: {', '.join(sorted(tunables()))}")
    shape, dt = tuple(int(n) for n in shape), parse_dtype(dtype)
    dev = cupy.cuda.Device()
    device = device_name(dev.id)
    cache = loaded_cache() if cache is None else cache
    family = t.family(shape) if t.family else None
    pinned = pinned_knobs(t, cache, device, dt, shape)
    candidates = t.candidates(shape, dt, _sm_count(dev.id), pinned)
    state = t.setup(shape, dt)
    nbytes = t.bytes(shape, dt)
    timed, rows = [], []
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
    result = TuneResult(op, shape, dtype_name(dt), device, t.bucket(shape), best, best_us, candidates[0],
                        timed[0][1], rows, pinned)
    if save:
        cache.put(result.entry(family))
        cache.save()
        with _lock:
            _resolved.clear()
    return result


def tunable_for_case(case):
    """``(Tunable, shape in its convention)`` for a benchmark case whose op has a tuning space, else None."""
    t = tunables().get(case.op)
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
    lines.append(f"  chosen {knobs_dict(r.knobs)}: {r.median_us:.2f} µs, heuristic {r.heuristic_us:.2f} µs ({verdict})")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------
# Adapters: one small block per op, each in the shape convention its op passes to `lookup`. An adapter
# whose op lacks the launch-with-knobs entry point it needs returns None: the op is then not tunable.


def rows_bucket(rows: int) -> int:
    """Row counts are bucketed to the next power of two: plans change with the grid, not the exact count."""
    return 1 << max(0, math.ceil(math.log2(max(rows, 1))))


def _rms_tunable(fused: bool) -> Tunable:
    from . import rmsnorm

    op = "fused_add_rms_norm" if fused else "rms_norm"

    def setup(shape, dtype):
        import cupy
        import numpy as np

        rng = cupy.random.default_rng(0)
        state = {"x": rng.standard_normal(shape, dtype=np.float32).astype(dtype),
                 "w": rng.standard_normal(shape[-1], dtype=np.float32).astype(dtype)}
        state["out"] = cupy.empty_like(state["x"])
        state["r"] = rng.standard_normal(shape, dtype=np.float32).astype(dtype) if fused else None
        return state

    def run(s, knobs):
        return lambda: rmsnorm._run(fused, s["x"], s["r"], s["w"], 1e-6, 0.0, s["out"], knobs)

    def signature(shape, dtype, knobs, sm):
        hidden, itemsize = shape[-1], dtype.itemsize
        vec = 16 // itemsize if hidden % (16 // itemsize) == 0 else 1
        return rmsnorm.plan(hidden, math.prod(shape[:-1]), vec, itemsize, sm, knobs, fused=fused)

    return Tunable(
        op=op,
        space={"items_target": [1, 2, 4, 8], "small_block": [64, 128, 256], "waves": [None, 2, 4, 8]},
        default=rmsnorm.DEFAULT_KNOBS,
        make=lambda d: rmsnorm.Knobs(**d),
        setup=setup,
        run=run,
        bytes=lambda shape, dtype: rmsnorm.bytes_moved(shape, dtype, dtype, fused=fused),
        bucket=lambda shape: f"hidden={shape[-1]},rows<={rows_bucket(math.prod(shape[:-1]))}",
        signature=signature,
        invariant=("items_target",),
        family=lambda shape: f"hidden={shape[-1]}",
    )


def _accepts_knobs(fn) -> bool:
    import inspect

    return "knobs" in inspect.signature(fn).parameters


def _module_tunable(op: str, module, space: dict, **kw) -> Tunable:
    """A tunable over ``module.Knobs``, its space restricted to the fields Knobs has."""
    fields = {f.name for f in dataclasses.fields(module.Knobs)}
    return Tunable(op=op, space={k: v for k, v in space.items() if k in fields}, default=module.DEFAULT_KNOBS,
                   make=lambda d: module.Knobs(**{k: v for k, v in d.items() if k in fields}), **kw)


def _rotary_tunable(neox: bool) -> Tunable | None:
    """Shape ``(tokens, num_heads, num_kv_heads, head_size)``, contiguous q and k, float32 cache. Needs
    ``rotary.Knobs`` and ``rotary._run(..., knobs)``."""
    from . import rotary

    if not (hasattr(rotary, "Knobs") and hasattr(rotary, "_run") and _accepts_knobs(rotary.plan)):
        return None

    def setup(shape, dtype):
        from .bench import OPS, Case

        tokens, nh, nkv, hd = shape
        return OPS["rotary_embedding"].setup(Case("rotary_embedding", (tokens, nh, hd), dtype_name(dtype),
                                                  (("kv_heads", nkv), ("neox", neox))))

    def run(s, knobs):
        return lambda: rotary._run(s["pos"], s["q"], s["k"], s["cache"], neox, None, False, False, knobs)

    def signature(shape, dtype, knobs, sm):
        tokens, nh, nkv, hd = shape
        vec = 16 // dtype.itemsize
        if (hd // 2 if neox else hd) % vec:
            vec = 1
        return rotary.plan(tokens, nh, nkv, hd, vec, neox, sm, knobs)

    return _module_tunable(
        "rotary_embedding" if neox else "rotary_embedding_gptj", rotary,
        {"items": [1, 2, 4], "target_block": [128, 256], "waves": [None, 4], "min_blocks": [1, 2, 4]},
        setup=setup, run=run,
        bytes=lambda shape, dtype: rotary.bytes_moved(shape[0], shape[1], shape[2], shape[3], dtype),
        bucket=lambda shape: f"tokens<={rows_bucket(shape[0])},heads={shape[1]}+{shape[2]},dim={shape[3]}",
        signature=signature, from_case=lambda shape, params: (shape[0], shape[1], params.get("kv_heads", 8), shape[2]))


def _reduce_tunable(op: str) -> Tunable | None:
    """``sum`` over everything (shape ``(n,)``, the full kernel) and ``sum_rows`` (shape ``(rows, length)``,
    axis -1, the rows kernel). Needs ``reduce.Knobs`` and ``reduce._reduce(..., knobs=None)`` passing
    them to ``plan``."""
    from . import reduce

    if not (hasattr(reduce, "Knobs") and _accepts_knobs(reduce._reduce) and _accepts_knobs(reduce.plan)):
        return None
    axis = None if op == "sum" else -1

    def setup(shape, dtype):
        import cupy
        import numpy as np

        return {"x": cupy.random.default_rng(0).standard_normal(shape, dtype=np.float32).astype(dtype)}

    def run(s, knobs):
        return lambda: reduce._reduce("sum", s["x"], axis, None, False, None, knobs=knobs)

    def signature(shape, dtype, knobs, sm):
        return reduce.plan(shape, dtype, axis, sm_count=sm, knobs=knobs)

    if op == "sum":
        space = {"full_block": [256, 512, 1024], "full_blocks_per_sm": [1, 2, 4], "full_unroll": [2, 4, 8]}
        return _module_tunable(op, reduce, space, setup=setup, run=run,
                               bytes=lambda shape, dtype: reduce.bytes_moved(shape, dtype),
                               bucket=lambda shape: f"n<={rows_bucket(math.prod(shape))}", signature=signature,
                               from_case=lambda shape, params: (math.prod(shape),))
    space = {"row_items": [4, 8, 16], "row_max_tpr": [128, 256, 512], "row_unroll": [2, 4, 8],
             "row_threads_per_sm": [1024, 2048], "row_waves": [None, 4, 8, 16]}
    return _module_tunable(op, reduce, space, setup=setup, run=run,
                           bytes=lambda shape, dtype: reduce.bytes_moved(shape, dtype, -1),
                           bucket=lambda shape: f"length={shape[-1]},rows<={rows_bucket(math.prod(shape[:-1]))}",
                           signature=signature, invariant=("row_items", "row_max_tpr"),
                           family=lambda shape: f"length={shape[-1]}")


_tunables: dict | None = None


def tunables() -> dict:
    """op name -> :class:`Tunable`, for every op that can be tuned now."""
    global _tunables
    if _tunables is None:
        found = [_rms_tunable(False), _rms_tunable(True), _rotary_tunable(True), _rotary_tunable(False),
                 _reduce_tunable("sum"), _reduce_tunable("sum_rows")]
        _tunables = {t.op: t for t in found if t is not None}
    return _tunables
