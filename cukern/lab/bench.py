"""The benchmark behind ``python -m cukern.lab bench``: cukern against its peers, in one run, against the copy
peak measured in the same run.

Cases are data (op, shape, dtype); each family's lab module registers, per op, how to build inputs, how to
call cukern and the CuPy composite peer, and how many bytes it must move (the same function the op module
exports), and may register record sets that are not (op, case) pairs (the reduction ladder's rungs). The
pipeline's decode-step records (:mod:`cukern.lab.pipeline`) come last. Peers that need other frameworks
(torch, Triton) live in the repository's ``bench/peers.py`` and are imported when that file and those
packages are present.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import platform
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import cukern.lab.pipeline as pipeline
import cukern.lab.tune as tuner  # run() takes a flag named tune

from .. import _tuned, timing
from .._compile import nvrtc_version, source_sha256
from .._dtypes import parse_dtype
from .device import gpu_present
from .progress import Progress


@dataclass(frozen=True)
class Case:
    op: str
    shape: tuple
    dtype: str
    params: tuple = field(default_factory=tuple)  # extra (key, value) pairs an op needs


@dataclass
class OpBench:
    """How to benchmark one op: ``setup(case) -> state``; ``run(state)`` calls cukern; ``cupy(state)`` the
    CuPy composite; ``bytes(case)`` the bytes moved; ``variants(state)``, optional: more ``(impl, fn)`` pairs
    computing the same with cukern another way (``cukern-composed``: the unfused calls)."""

    setup: Callable
    run: Callable
    cupy: Callable
    bytes: Callable
    cases: list
    variants: Callable | None = None


def parse_axis(axis):
    """An ``axis`` param as the reductions take it: None, an int or a tuple of ints, given as itself or as
    text (``"none"``, ``"1"``, ``"(0, 2)"``: the command line's ``--param``)."""
    if axis is None or isinstance(axis, (int, tuple)):
        return axis
    text = str(axis).strip().lower()
    if text in ("none", ""):
        return None
    parts = tuple(int(a) for a in text.strip("()").split(",") if a.strip())
    return parts[0] if len(parts) == 1 else parts


def array_setup(inputs: Callable) -> Callable:
    """The :class:`OpBench` setup of an op over one array ``x`` along an ``axis`` param (none: everything):
    ``x = inputs(shape, dtype)``."""
    return lambda case: {"x": inputs(case.shape, parse_dtype(case.dtype)),
                         "axis": parse_axis(dict(case.params).get("axis"))}


OPS: dict = {}
RECORD_SETS: dict = {}  # name -> records(peak, repeat=, warmup=) -> list of results records


def register(op: str, bench: OpBench) -> None:
    OPS[op] = bench


def register_records(name: str, records: Callable) -> None:
    RECORD_SETS[name] = records


def record_sets() -> dict:
    """Every record set a full run ends with: the families', then the pipeline's."""
    return {**RECORD_SETS, "pipeline": pipeline.records}


def picks(name: str, record: dict) -> bool:
    """Whether ``--op name`` keeps this results record: a record of one of the op's benchmark cases, or one
    its record set writes (the pipeline's: host costs, named ``host_overhead...``, and graph replays)."""
    if name == "pipeline":
        return record["op"].startswith("host_overhead") or record["impl"] == "cukern-graph"
    if name in OPS:
        return record["op"] in {c.op for c in OPS[name].cases} and record["impl"] != "cukern-graph"
    return record["op"] == name


def load_peers():
    """``bench/peers.py`` from the repository checkout, if it is there (not part of an installed wheel)."""
    path = Path(__file__).resolve().parents[2] / "bench" / "peers.py"
    if not path.is_file():
        return None
    spec = importlib.util.spec_from_file_location("cukern_bench_peers", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _tuned_impl(case: Case, repeat: int, warmup: int):
    """``("cukern-tuned", fn, knobs)`` for a case whose op has a tuning space: the case is tuned first (the
    winner goes to the user's tuning cache), ``fn`` launches with the winning knobs (``knobs``, as a dict) on
    the tunable's own inputs. None for ops without one."""
    found = tuner.tunable_for_case(case)
    if found is None:
        return None
    tunable, shape = found
    result = tuner.tune(tunable.op, shape, case.dtype, repeat=max(repeat // 2, 10), warmup=warmup, progress=False)
    fn = tunable.run(tunable.setup(shape, parse_dtype(case.dtype)), result.knobs)
    return "cukern-tuned", fn, _tuned.knobs_dict(result.knobs)


def run(ops=None, *, repeat: int = 100, warmup: int = 10, peers: bool = True, progress=None,
        tune: bool = True) -> dict:
    """Run every case of ``ops`` (all when None; record set names count as ops) for cukern and every peer;
    return the results document.

    ``cukern`` is the heuristic plan (the tuning cache is ignored while it is timed); with ``tune``, ops
    that have a tuning space are tuned for each case and also timed as ``cukern-tuned``, whose record
    names the winning ``knobs``. A progress bar
    runs on stderr when it is a terminal; ``progress(record)`` is called after each record."""
    import cupy

    peak = timing.peak_bandwidth()
    extra = load_peers() if peers else None
    records = []
    cases = [(b, case) for op, b in OPS.items() if not ops or op in ops for case in b.cases]
    sets = {name: fn for name, fn in record_sets().items() if not ops or name in ops}
    bar = Progress(len(cases) + len(sets), "bench")
    for b, case in cases:
        bar.step(f"{case.op} {'x'.join(map(str, case.shape))} {case.dtype}", n=0)
        state = b.setup(case)
        nbytes = b.bytes(case)
        impls = [("cukern", lambda s=state: b.run(s)), ("cupy", lambda s=state: b.cupy(s))]
        if b.variants is not None:
            impls[1:1] = b.variants(state)
        tuned = _tuned_impl(case, repeat, warmup) if tune else None
        knobs = {}
        if tuned is not None:
            impls.insert(1, tuned[:2])
            knobs[tuned[0]] = tuned[2]
        if extra is not None:
            impls += [(name, fn) for name, fn in extra.peers(case)]
        for impl, fn in impls:
            heuristic = _tuned.heuristic_only() if impl == "cukern" else contextlib.nullcontext()
            try:
                with heuristic:
                    t = timing.benchmark(fn, warmup=warmup, repeat=repeat, bytes_moved=nbytes)
            except Exception as err:  # a peer that cannot run this case is reported, not fatal
                if impl.startswith("cukern"):
                    raise
                bar.clear()
                print(f"  {impl} skipped for {case.op} {case.shape}: {type(err).__name__}: {err}")
                continue
            gbps = t.gbps
            assert gbps is not None  # bytes_moved was given
            records.append({
                "op": case.op, "impl": impl, "shape": list(case.shape), "dtype": case.dtype,
                "median_us": round(t.median_us, 3), "gbps": round(gbps, 1),
                "pct_of_peak": round(100 * gbps / peak, 1),
                **({"knobs": knobs[impl]} if impl in knobs else {}),
            })
            if progress:
                bar.clear()
                progress(records[-1])
        del state, impls, tuned
        cupy.get_default_memory_pool().free_all_blocks()
        bar.step(f"{case.op} {'x'.join(map(str, case.shape))} {case.dtype}")
    host_peers = [pipeline.HostCall(*c) for c in extra.host_calls()] if extra is not None else []
    for name, fn in sets.items():
        bar.step(name, n=0)
        kwargs = {"peers": host_peers} if fn is pipeline.records else {}
        records += fn(peak, repeat=repeat, warmup=warmup, **kwargs)
        bar.step(name)
    bar.close()
    dev = cupy.cuda.Device()
    return {
        "device": cupy.cuda.runtime.getDeviceProperties(dev.id)["name"].decode(),
        "cupy_version": cupy.__version__,
        "source_sha256": source_sha256(),
        "peak_copy_gbps": round(peak, 1),
        "records": records,
    }


def format_table(records) -> str:
    rows = [("op", "impl", "shape", "dtype", "µs", "GB/s", "% peak")]
    rows += [(r["op"], r["impl"], "x".join(map(str, r["shape"])), r["dtype"], f"{r['median_us']:.2f}",
              f"{r['gbps']:.0f}" if "gbps" in r else "-", f"{r['pct_of_peak']:.1f}" if "pct_of_peak" in r else "-")
             for r in records]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) if i < 4 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
                     for r in rows)


BEHIND = 0.995  # a peer more than 0.5% faster than cukern, in the same run, puts the case behind


def standing(records) -> list:
    """cukern against its fastest peer, case by case: ``(op, shape, dtype, cukern_us, peer, peer_us, ratio,
    verdict)``, ``ratio`` the peer's time over cukern's (above 1: cukern leads). The verdict is ``lead`` or
    ``even`` (within 0.5%), ``behind``, or ``explained``: behind, but the same kernel without its fixed
    reduction order (``cukern-no-contract``, measured in the same run) is not, so the gap is what the
    same-bits contract costs. cukern is its default plan (impl ``cukern``); its other forms (tuned, graph,
    composed) are not peers, and neither are the ladder's rungs, whose op has no ``cukern`` record."""
    cases: dict = {}
    for r in records:
        cases.setdefault((r["op"], tuple(r["shape"]), r["dtype"]), {})[r["impl"]] = r["median_us"]
    rows = []
    for (op, shape, dtype), times in cases.items():
        ours = times.get("cukern")
        peers = {impl: t for impl, t in times.items() if not impl.startswith("cukern")}
        if ours is None or not peers:
            continue
        peer = min(peers, key=peers.__getitem__)
        ratio = peers[peer] / ours
        if ratio >= 1.005:
            verdict = "lead"
        elif ratio >= BEHIND:
            verdict = "even"
        elif peers[peer] / times.get("cukern-no-contract", float("inf")) >= BEHIND:
            verdict = "explained"
        else:
            verdict = "behind"
        rows.append((op, shape, dtype, ours, peer, peers[peer], ratio, verdict))
    return rows


def format_standing(records) -> str:
    """One line a case (cukern's time, the fastest peer's, their ratio, the verdict), then the count of cases
    behind a peer, explained ones apart."""
    rows = standing(records)
    lines = [f"{op:<26} {'x'.join(map(str, shape)):<18} {dtype:<9} cukern {ours:>10.2f} µs  "
             f"{peer:<14} {theirs:>10.2f} µs  {ratio:6.3f}x  {verdict}"
             for op, shape, dtype, ours, peer, theirs, ratio, verdict in rows]
    behind = sum(r[-1] == "behind" for r in rows)
    explained = sum(r[-1] == "explained" for r in rows)
    lines.append(f"cases behind a peer: {behind} (explained by the same-bits contract: {explained}, "
                 f"cases compared: {len(rows)})")
    return "\n".join(lines)


def write_results(doc: dict, path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(doc, indent=1) + "\n")


def info() -> dict:
    """Device, versions and the measured copy peak (when a GPU is present)."""
    import cupy

    doc = {"python": platform.python_version(), "nvrtc": nvrtc_version(), "cupy": cupy.__version__}
    if gpu_present():
        dev = cupy.cuda.Device()
        props = cupy.cuda.runtime.getDeviceProperties(dev.id)
        doc.update(device=props["name"].decode(), compute_capability=dev.compute_capability,
                   sm_count=props["multiProcessorCount"], l2_bytes=props["l2CacheSize"],
                   peak_copy_gbps=round(timing.peak_bandwidth(), 1))
    else:
        doc["device"] = None
    return doc
