"""The tuning cache: the file, and the lookup an op makes on each call. It knows no op.

Each tunable op declares a :class:`Rule`: its op name, its default knobs, how a stored dict becomes a knobs
object, and how a shape maps to the cache key's bucket (and, for batch-invariant ops, to a family). The op
calls :func:`lookup` with its rule; the tuner (``cukern.lab.tune``) writes entries keyed by the same rule.
Entries live in ``tuning.json`` in :func:`cache_dir`, keyed by device name, op, dtype and bucket; the file is
read once per process and each (device, rule, dtype, shape) is resolved once.

Batch invariance: an op whose results must not depend on the batch names the knobs that decide the
reduction order in ``Rule.invariant``. A bucket without its own entry whose ``family`` has been tuned in
another bucket uses the heuristic with that family's invariant knobs, so every row count still reduces a
row in the same order.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import sys
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ._dtypes import dtype_name, parse_dtype

CACHE_FORMAT = "cukern-tuning-cache"
CACHE_VERSION = 1
CACHE_FILE = "tuning.json"


@dataclass(frozen=True, eq=False)
class Rule:
    """How one op keys its tuning cache entries. ``default``: the heuristic's knobs object; ``make``: dict ->
    knobs object (raises TypeError or ValueError for a dict that does not fit); ``bucket(shape)``: the key's
    shape part; ``invariant`` and ``family(shape)``: see the module notes. Rules compare and hash by identity,
    and :func:`lookup` resolves each rule on its own: two rules of one op (a variant of the op reading its
    entries) may have different defaults."""

    op: str
    default: object
    make: Callable
    bucket: Callable
    invariant: tuple = ()
    family: Callable | None = None

    def knobs_from(self, d: dict):
        """The knobs object for a stored dict, or None (with a warning) when it does not fit this op."""
        try:
            return self.make(dict(d))
        except (TypeError, ValueError) as err:
            warnings.warn(f"cukern tuning cache: knobs {d!r} for {self.op} do not fit ({err}); using the heuristic",
                          stacklevel=3)
            return None


def rows_bucket(rows: int) -> int:
    """Row counts are bucketed to the next power of two: plans change with the grid, not the exact count."""
    return 1 << max(0, math.ceil(math.log2(max(rows, 1))))


def knobs_dict(knobs) -> dict:
    if dataclasses.is_dataclass(knobs) and not isinstance(knobs, type):
        return dataclasses.asdict(knobs)
    return dict(knobs)


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
# Bumped whenever a lookup may answer differently (reset, forget_resolved, heuristic_only): ops key their
# prepared calls on it, so a call found there needs no lookup.
generation = 0
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
    global _cache, generation
    with _lock:
        _cache = None
        _resolved.clear()
        generation += 1


@contextlib.contextmanager
def heuristic_only():
    """Within this block ops ignore the tuning cache (``CUKERN_TUNING=off`` does the same for a process)."""
    global _enabled, generation
    before = _enabled
    _enabled = False
    generation += 1
    try:
        yield
    finally:
        _enabled = before
        generation += 1


def device_name(device_id: int) -> str:
    name = _device_names.get(device_id)
    if name is None:
        import cupy

        name = _device_names[device_id] = cupy.cuda.runtime.getDeviceProperties(device_id)["name"].decode()
    return name


def effective_entry(rule: Rule, cache: TuningCache, device: str, dtype, shape) -> dict | None:
    """The cache entry a call uses: its bucket's own; else, for a rule with ``invariant`` knobs whose family
    has been tuned in another bucket, the heuristic with that family's invariant knobs (so an untuned batch
    size still reduces like the tuned ones); else None."""
    name, shape = dtype_name(dtype), tuple(shape)
    entry = cache.get(device, rule.op, name, rule.bucket(shape))
    if entry is not None or not rule.invariant or rule.family is None:
        return entry
    family = cache.family(device, rule.op, name, rule.family(shape))
    if not family:
        return None
    knobs = {**knobs_dict(rule.default),
             **{k: family[0]["knobs"][k] for k in rule.invariant if k in family[0]["knobs"]}}
    return {"device": device, "op": rule.op, "dtype": name, "bucket": rule.bucket(shape), "knobs": knobs,
            "family": family[0]["family"], "from_family": family[0]["bucket"]}


def lookup(rule: Rule, device_id: int, dtype, shape):
    """The knobs for this call: the tuning cache's (the op's own knobs object), else ``rule.default``. One
    dict lookup once a (device, rule, dtype, shape) has been seen; the file is read once per process."""
    if not _enabled:
        return rule.default
    key = (device_id, rule, dtype, shape)
    try:
        return _resolved[key]
    except KeyError:
        pass
    knobs = None
    entry = effective_entry(rule, loaded_cache(), device_name(device_id), dtype, shape)
    if entry is not None:
        knobs = rule.knobs_from(entry["knobs"])
    if knobs is None:
        knobs = rule.default
    with _lock:
        if len(_resolved) >= _MEMO_LIMIT:
            _resolved.clear()
        _resolved[key] = knobs
    return knobs


def lookup_entry(rule: Rule, device: str, dtype, shape) -> dict | None:
    """The cache entry a call of ``rule.op`` on ``device`` (a name) would use, or None (for ``explain``)."""
    if not _enabled:
        return None
    entry = effective_entry(rule, loaded_cache(), device, parse_dtype(dtype), shape)
    if entry is not None and rule.knobs_from(entry["knobs"]) is None:
        return None
    return entry


def forget_resolved() -> None:
    """Drop the memo of resolved lookups (after the tuner saved new entries)."""
    global generation
    with _lock:
        _resolved.clear()
        generation += 1
