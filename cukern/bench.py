"""The benchmark behind ``python -m cukern bench``: cukern against its peers, in one run, against the copy
peak measured in the same run.

Cases are data (op, shape, dtype); each op registers how to build inputs, how to call cukern and the CuPy
composite peer, and how many bytes it must move (the same function the op module exports). Peers that need
other frameworks (torch, Triton) live in the repository's ``bench/peers.py`` and are imported lazily when
that file and those packages are present.
"""

from __future__ import annotations

import importlib.util
import json
import platform
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import timing
from ._compile import source_sha256
from ._dtypes import parse_dtype


@dataclass(frozen=True)
class Case:
    op: str
    shape: tuple
    dtype: str
    params: tuple = field(default_factory=tuple)  # extra (key, value) pairs an op needs


@dataclass
class OpBench:
    """How to benchmark one op: ``setup(case) -> state``; ``run(state)`` calls cukern; ``cupy(state)`` the
    CuPy composite; ``bytes(case)`` the bytes moved."""

    setup: object
    run: object
    cupy: object
    bytes: object
    cases: list


OPS: dict = {}


def register(op: str, bench: OpBench) -> None:
    OPS[op] = bench


def _rms_setup(case: Case):
    import cupy

    dt = parse_dtype(case.dtype)
    rng = cupy.random.default_rng()
    x = rng.standard_normal(case.shape, dtype=np.float32).astype(dt)
    w = rng.standard_normal(case.shape[-1], dtype=np.float32).astype(dt)
    state = {"x": x, "w": w, "out": cupy.empty_like(x)}
    if case.op == "fused_add_rms_norm":
        state["r"] = rng.standard_normal(case.shape, dtype=np.float32).astype(dt)
    return state


def _rms_run(s):
    from .rmsnorm import fused_add_rms_norm, rms_norm

    if "r" in s:
        return fused_add_rms_norm(s["x"], s["r"], s["w"], out=s["out"])
    return rms_norm(s["x"], s["w"], out=s["out"])


def _rms_cupy(s):
    import cupy

    dt = s["x"].dtype
    x = s["x"].astype(cupy.float32)
    if "r" in s:
        x = (x + s["r"].astype(cupy.float32)).astype(dt)
        s["r"][...] = x
        x = x.astype(cupy.float32)
    rstd = cupy.reciprocal(cupy.sqrt(cupy.mean(x * x, axis=-1, keepdims=True) + 1e-6))
    return (x * rstd * s["w"].astype(cupy.float32)).astype(dt)


def _rms_bytes(case: Case):
    from .rmsnorm import bytes_moved

    dt = parse_dtype(case.dtype)
    return bytes_moved(case.shape, dt, dt, fused=case.op == "fused_add_rms_norm")


_RMS_CASES = [Case("rms_norm", s, "bfloat16") for s in ((16384, 4096), (16384, 8192), (4096, 4096), (256, 4096))]
_RMS_CASES += [Case("rms_norm", (16384, 4096), d) for d in ("float16", "float32")]
register("rms_norm", OpBench(_rms_setup, _rms_run, _rms_cupy, _rms_bytes, _RMS_CASES))
register("fused_add_rms_norm", OpBench(_rms_setup, _rms_run, _rms_cupy, _rms_bytes,
                                       [Case("fused_add_rms_norm", (16384, 4096), "bfloat16")]))


def _rope_setup(case: Case):
    """Query and key as views into one fused [tokens, (nh + 2 nkv) hd] qkv buffer when ``qkv_view``, else
    separate contiguous arrays; random positions below 8192 into a float32 cache."""
    import cupy

    p = dict(case.params)
    tokens, nh, hd = case.shape
    nkv = p["kv_heads"]
    dt = parse_dtype(case.dtype)
    rng = cupy.random.default_rng()
    if p.get("qkv_view"):
        qkv = rng.standard_normal((tokens, (nh + 2 * nkv) * hd), dtype=np.float32).astype(dt)
        q = qkv[:, : nh * hd].reshape(tokens, nh, hd)
        k = qkv[:, nh * hd: (nh + nkv) * hd].reshape(tokens, nkv, hd)
    else:
        q = rng.standard_normal((tokens, nh, hd), dtype=np.float32).astype(dt)
        k = rng.standard_normal((tokens, nkv, hd), dtype=np.float32).astype(dt)
    from .rotary import rope_cache

    cache = rope_cache(8192, hd)
    pos = rng.integers(0, 8192, tokens, dtype=np.int64)
    return {"q": q, "k": k, "cache": cache, "pos": pos, "neox": p.get("neox", True)}


def _rope_run(s):
    from .rotary import rotary_embedding

    rotary_embedding(s["pos"], s["q"], s["k"], s["cache"], is_neox=s["neox"], check_positions=False)


def _rope_cupy(s):
    """The composite a CuPy user would write: gather cos/sin rows, rotate in float32, write back."""
    import cupy

    half = s["cache"].shape[1] // 2
    cos = s["cache"][s["pos"], :half][:, None, :]
    sin = s["cache"][s["pos"], half:][:, None, :]
    for t in (s["q"], s["k"]):
        x = t.astype(cupy.float32)
        if s["neox"]:
            x1, x2 = x[..., :half], x[..., half:]
            t[...] = cupy.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(t.dtype)
        else:
            x1, x2 = x[..., 0::2], x[..., 1::2]
            t[..., 0::2] = (x1 * cos - x2 * sin).astype(t.dtype)
            t[..., 1::2] = (x2 * cos + x1 * sin).astype(t.dtype)


def _rope_bytes(case: Case):
    from .rotary import bytes_moved

    tokens, nh, hd = case.shape
    return bytes_moved(tokens, nh, dict(case.params)["kv_heads"], hd, parse_dtype(case.dtype))


def _rope_case(op, tokens, **params):
    return Case(op, (tokens, 32, 128), "bfloat16", tuple(sorted({"kv_heads": 8, **params}.items())))


_ROPE_CASES = [_rope_case("rotary_embedding", 16384), _rope_case("rotary_embedding_gptj", 16384, neox=False),
               _rope_case("rotary_embedding_qkv_view", 16384, qkv_view=True)]
_ROPE_CASES += [_rope_case("rotary_embedding", t) for t in (1, 8, 64, 4096)]
register("rotary_embedding", OpBench(_rope_setup, _rope_run, _rope_cupy, _rope_bytes, _ROPE_CASES))


def _sum_setup(case: Case):
    import cupy

    axis = dict(case.params).get("axis")
    x = cupy.random.default_rng().standard_normal(case.shape, dtype=np.float32).astype(parse_dtype(case.dtype))
    return {"x": x, "axis": axis}


def _sum_run(s):
    from .reduce import sum as ksum

    return ksum(s["x"], axis=s["axis"])


def _sum_cupy(s):
    return s["x"].sum(axis=s["axis"])


def _sum_bytes(case: Case):
    from .reduce import bytes_moved

    return bytes_moved(case.shape, parse_dtype(case.dtype), dict(case.params).get("axis"))


_SUM_CASES = [Case("sum", (n,), "float32") for n in (1 << 29, 1 << 20, 1 << 24)]
_SUM_CASES += [Case("sum", (1 << 30,), "bfloat16"), Case("sum_rows", (32768, 16384), "float32", (("axis", -1),)),
               Case("sum_cols", (16384, 32768), "float32", (("axis", 0),))]
register("sum", OpBench(_sum_setup, _sum_run, _sum_cupy, _sum_bytes, _SUM_CASES))

LADDER_N = 1 << 28


def ladder_records(peak: float, n: int = LADDER_N) -> list:
    """One results record per ladder rung (op ``reduce_ladder``, impl the rung's kernel name)."""
    from .ladder import run_ladder

    rows = run_ladder(n, "float32", include_references=False)
    return [{"op": "reduce_ladder", "impl": r["name"], "shape": [n], "dtype": "float32",
             "median_us": round(r["us"], 3), "gbps": round(r["gbps"], 1),
             "pct_of_peak": round(100 * r["gbps"] / peak, 1)} for r in rows]


def load_peers():
    """``bench/peers.py`` from the repository checkout, if it is there (not part of an installed wheel)."""
    path = Path(__file__).resolve().parent.parent / "bench" / "peers.py"
    if not path.is_file():
        return None
    spec = importlib.util.spec_from_file_location("cukern_bench_peers", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def gpu_present() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def _tuned_impl(case: Case, repeat: int, warmup: int):
    """``("cukern-tuned", fn)`` for a case whose op has a tuning space: the case is tuned first (the winner
    goes to the user's tuning cache), ``fn`` launches with the winning knobs on the tunable's own inputs.
    None for ops without one."""
    from . import tuning

    found = tuning.tunable_for_case(case)
    if found is None:
        return None
    tunable, shape = found
    result = tuning.tune(tunable.op, shape, case.dtype, repeat=max(repeat // 2, 10), warmup=warmup, progress=False)
    return "cukern-tuned", tunable.run(tunable.setup(shape, parse_dtype(case.dtype)), result.knobs)


def run(ops=None, *, repeat: int = 100, warmup: int = 10, peers: bool = True, progress=None,
        tune: bool = True) -> dict:
    """Run every case of ``ops`` (all when None) for cukern and every peer; return the results document.

    ``cukern`` is the heuristic plan (the tuning cache is ignored while it is timed); with ``tune``, ops
    that have a tuning space are tuned for each case and also timed as ``cukern-tuned``. A progress bar
    runs on stderr when it is a terminal; ``progress(record)`` is called after each record."""
    import contextlib

    import cupy

    from . import tuning
    from .progress import Progress

    peak = timing.peak_bandwidth()
    extra = load_peers() if peers else None
    records = []
    cases = [(b, case) for op, b in OPS.items() if not ops or op in ops for case in b.cases]
    with_ladder = not ops or "reduce_ladder" in ops
    with_pipeline = not ops or "pipeline" in ops  # host overhead and graph-replayed decode sizes
    bar = Progress(len(cases) + with_ladder + with_pipeline, "bench")
    for b, case in cases:
        bar.step(f"{case.op} {'x'.join(map(str, case.shape))} {case.dtype}", n=0)
        state = b.setup(case)
        nbytes = b.bytes(case)
        impls = [("cukern", lambda s=state: b.run(s)), ("cupy", lambda s=state: b.cupy(s))]
        tuned = _tuned_impl(case, repeat, warmup) if tune else None
        if tuned is not None:
            impls.insert(1, tuned)
        if extra is not None:
            impls += [(name, fn) for name, fn in extra.peers(case)]
        for impl, fn in impls:
            heuristic = tuning.heuristic_only() if impl == "cukern" else contextlib.nullcontext()
            try:
                with heuristic:
                    t = timing.benchmark(fn, warmup=warmup, repeat=repeat, bytes_moved=nbytes)
            except Exception as err:  # a peer that cannot run this case is reported, not fatal
                if impl.startswith("cukern"):
                    raise
                bar.clear()
                print(f"  {impl} skipped for {case.op} {case.shape}: {type(err).__name__}: {err}")
                continue
            records.append({
                "op": case.op, "impl": impl, "shape": list(case.shape), "dtype": case.dtype,
                "median_us": round(t.median_us, 3), "gbps": round(t.gbps, 1),
                "pct_of_peak": round(100 * t.gbps / peak, 1),
            })
            if progress:
                bar.clear()
                progress(records[-1])
        del state, impls, tuned
        cupy.get_default_memory_pool().free_all_blocks()
        bar.step(f"{case.op} {'x'.join(map(str, case.shape))} {case.dtype}")
    if with_ladder:
        bar.step("reduce_ladder", n=0)
        records += ladder_records(peak)
        bar.step("reduce_ladder")
    if with_pipeline:
        from . import pipeline

        bar.step("pipeline", n=0)
        records += pipeline.records(peak, repeat=repeat, warmup=warmup)
        bar.step("pipeline")
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


def write_results(doc: dict, path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(doc, indent=1) + "\n")


def info() -> dict:
    """Device, versions and the measured copy peak (when a GPU is present)."""
    from ._compile import nvrtc_version

    doc = {"python": platform.python_version(), "nvrtc": nvrtc_version()}
    import cupy

    doc["cupy"] = cupy.__version__
    if gpu_present():
        dev = cupy.cuda.Device()
        props = cupy.cuda.runtime.getDeviceProperties(dev.id)
        doc.update(device=props["name"].decode(), compute_capability=dev.compute_capability,
                   sm_count=props["multiProcessorCount"], l2_bytes=props["l2CacheSize"],
                   peak_copy_gbps=round(timing.peak_bandwidth(), 1))
    else:
        doc["device"] = None
    return doc


