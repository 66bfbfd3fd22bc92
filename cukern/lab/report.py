"""Bandwidth and roofline reports: ``python -m cukern.lab bench --plot bandwidth.png`` and ``python -m cukern.lab
roofline --plot roofline.png``.

Both draw with matplotlib's Agg backend (no display needed; ``pip install cukern[plot]``). The bandwidth
plot reads a results document (:func:`cukern.lab.bench.run`); the roofline takes every kernel's bytes and
FLOPs from its card (:mod:`cukern.lab.card`), so the two plots and ``explain`` count the same bytes.
"""

from __future__ import annotations

import math
import re

import cukern.lab.bench as bench

from .._dtypes import dtype_name
from .card import CARDS, measure_us, resolve
from .device import Device, current_device, gpu_present, profile

_VARIANT = re.compile(r"[a-z0-9_]+?_v(\d+)_")


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise RuntimeError("plots need matplotlib: pip install 'cukern[plot]' (or pip install matplotlib)") from err
    return plt


def _case_bytes() -> dict:
    """``(case op, shape, dtype) -> bytes`` for every benchmark case, from the benchmark's own count."""
    return {(c.op, tuple(c.shape), c.dtype): b.bytes(c) for b in bench.OPS.values() for c in b.cases}


def _panels() -> dict:
    """Case op -> the benchmark op (panel) it belongs to."""
    return {c.op: key for key, b in bench.OPS.items() for c in b.cases}


def bandwidth_series(doc: dict) -> dict:
    """``{panel: {(case op, impl, dtype): [(bytes moved, GB/s), ...] sorted by size}}`` from a results
    document's records, one panel per benchmarked op (the families' record sets excluded: the ladder's
    rungs are one size, drawn by ``cukern ladder --plot``). Bytes are the benchmark's count for the case
    (GB/s x time for cases it no longer has)."""
    counts, panels = _case_bytes(), _panels()
    out: dict = {}
    for r in doc["records"]:
        if r["op"] in bench.RECORD_SETS or not r.get("gbps"):
            continue
        nbytes = counts.get((r["op"], tuple(r["shape"]), r["dtype"]), r["gbps"] * r["median_us"] * 1e3)
        series = out.setdefault(panels.get(r["op"], r["op"]), {})
        series.setdefault((r["op"], r["impl"], r["dtype"]), []).append((nbytes, r["gbps"]))
    for series in out.values():
        for points in series.values():
            points.sort()
    return out


def plot_bandwidth(doc: dict, path) -> None:
    """GB/s against bytes moved, one panel per benchmarked op: colour per implementation, marker per case
    variant, line style per dtype; the copy peak measured in the same run as a dashed line."""
    plt = _pyplot()
    series = bandwidth_series(doc)
    if not series:
        raise ValueError("the results document has no op records to plot")
    panels = sorted(series)
    cols = min(2, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(7 * cols, 4.6 * rows), squeeze=False)
    peak = doc.get("peak_copy_gbps")
    impls = sorted({impl for s in series.values() for _, impl, _ in s})
    colors = {impl: f"C{i % 10}" for i, impl in enumerate(impls)}
    styles = {"bfloat16": "-", "float16": "--", "float32": ":", "float64": "-."}
    for ax, panel in zip(axes.flat, panels):
        variants = sorted({op for op, _, _ in series[panel]})
        markers = {op: "osD^v<>"[i % 7] for i, op in enumerate(variants)}
        for (op, impl, dtype), points in sorted(series[panel].items()):
            xs, ys = zip(*points)
            variant = op[len(panel):].lstrip("_") if op.startswith(panel) else op
            ax.plot(xs, ys, styles.get(dtype, "-"), marker=markers[op], markersize=5, color=colors[impl],
                    label=" ".join(v for v in (impl, variant, dtype) if v))
        if peak:
            ax.axhline(peak, color="black", linewidth=0.8, linestyle="--", label=f"copy peak {peak:.0f} GB/s")
        sizes = [x for pts in series[panel].values() for x, _ in pts]
        ax.set_xscale("log")
        if max(sizes) / min(sizes) < 10:
            ax.set_xlim(min(sizes) / 4, max(sizes) * 4)
        ax.set_title(panel, fontsize=10)
        ax.set_xlabel("bytes moved")
        ax.set_ylabel("GB/s")
        ax.set_ylim(0, (peak or max(y for pts in series[panel].values() for _, y in pts)) * 1.1)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=6, ncol=2)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    fig.suptitle(f"{doc.get('device', '')}: GB/s against size, copy peak measured in the same run", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _measured_from_results(doc: dict) -> dict:
    """``(card op, shape, dtype) -> median µs`` for cukern's own records in a results document. A record
    set's record whose impl is a variant ``{op}_v{N}_{what}`` (a ladder rung) is card ``{set}.v{N}``."""
    out = {}
    for r in doc["records"]:
        if r["op"] in bench.RECORD_SETS:
            variant = _VARIANT.match(r["impl"])
            if variant:
                out[(f"{r['op']}.v{variant.group(1)}", tuple(r["shape"]), r["dtype"])] = r["median_us"]
        elif r["impl"] == "cukern":
            out[(r["op"], tuple(r["shape"]), r["dtype"])] = r["median_us"]
    return out


def roofline_points(ops=None, *, results: dict | None = None, measure: bool | None = None,
                    device: Device | None = None, progress=None) -> list:
    """One point per kernel (every card op at its default shape, plus each benchmarked shape found in
    ``results``): bytes, FLOPs, intensity, the attainable GFLOP/s under both roofs and, where known, the
    achieved GFLOP/s (from ``results``, else measured when ``measure`` and a GPU is present)."""
    device = device or current_device()
    measure = gpu_present() if measure is None else measure
    known = _measured_from_results(results) if results else {}
    wanted = [(op, None, None) for op in (ops or sorted(CARDS))]
    for op, shape, dtype in known:
        if op in CARDS and (not ops or op in ops) and (op, shape, dtype) not in wanted:
            wanted.append((op, shape, dtype))
    points, seen = [], set()
    for op, shape, dtype in wanted:
        r = resolve(op, shape, dtype, device)
        name = dtype_name(r.dtype)
        if (op, r.shape, name) in seen:
            continue
        seen.add((op, r.shape, name))
        us = known.get((op, r.shape, name))
        source = "results file" if us is not None else None
        if us is None and measure and r.described.measure is not None:
            us, source = measure_us(r.described), "measured"
        p = profile(r.described.bytes, r.described.flops, device, us)
        intensity = p["flops"] / p["bytes"]
        points.append({
            "op": op, "shape": list(r.shape), "dtype": name, "bytes": p["bytes"], "flops": p["flops"],
            "intensity": intensity,
            "attainable_gflops": min(device.compute_gflops, intensity * device.peak_gbps),
            "achieved_gflops": None if us is None else p["flops"] / (us * 1e3),
            "measured_us": us, "source": source or "predicted (bandwidth roof)", "verdict": p["verdict"],
        })
        if progress:
            progress(op)
    return points


def plot_roofline(points: list, device: Device, path) -> None:
    """Every kernel at its arithmetic intensity against the device's bandwidth roof (``peak_gbps``) and
    FP32 compute roof; achieved GFLOP/s where measured, else the attainable bound (hollow markers)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 6))
    # kernels that do no arithmetic at all (argmax compares, a scan or a copy adds nothing the card counts)
    # have no place on log axes: they are in the table, not the plot
    points = [p for p in points if p["intensity"] > 0]
    lo = min(min(p["intensity"] for p in points) / 4, 0.01)
    hi = max(max(p["intensity"] for p in points) * 4, device.ridge * 8)
    xs = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    ax.plot(xs, [min(device.compute_gflops, x * device.peak_gbps) for x in xs], color="black", linewidth=1.5)
    ax.axvline(device.ridge, color="gray", linewidth=0.8, linestyle=":")
    ax.text(device.ridge, device.compute_gflops * 1.15, f"ridge {device.ridge:.1f} FLOP/B", ha="center", fontsize=8)
    ax.text(lo * 1.2, lo * 1.2 * device.peak_gbps * 1.3, f"{device.peak_gbps:.0f} GB/s", fontsize=8, rotation=0)
    ax.text(hi / 1.2, device.compute_gflops * 0.85, f"{device.compute_gflops / 1e3:.1f} TFLOP/s FP32", ha="right",
            fontsize=8)
    families = sorted({CARDS[p["op"]].family for p in points})
    colors = {f: f"C{i % 10}" for i, f in enumerate(families)}
    labelled = set()
    for p in points:
        family = CARDS[p["op"]].family
        y = p["achieved_gflops"] if p["achieved_gflops"] is not None else p["attainable_gflops"]
        hollow = p["achieved_gflops"] is None
        ax.scatter([p["intensity"]], [y], s=36, facecolors="none" if hollow else colors[family],
                   edgecolors=colors[family], label=None if family in labelled else family, zorder=3)
        labelled.add(family)
        label = p["op"].rpartition(".")[2] + ("" if p["dtype"] == "float32" else f" {p['dtype']}")
        ax.annotate(label if len(points) <= 40 else "",
                    (p["intensity"], y), fontsize=6, xytext=(3, 2), textcoords="offset points")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_xlabel("arithmetic intensity (FLOP / byte moved)")
    ax.set_ylabel("GFLOP/s")
    ax.set_title(f"{device.label} roofline\nfilled: achieved; hollow: bandwidth bound (not measured)", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def format_roofline(points: list, device: Device) -> str:
    head = f"{'kernel':<28} {'shape':<16} {'dtype':<9} {'FLOP/B':>7} {'bound GF/s':>11} {'achieved':>9}  source"
    lines = [f"{device.label}: bandwidth {device.peak_gbps:.0f} GB/s ({device.bandwidth_source}), "
             f"FP32 {device.compute_gflops:.0f} GFLOP/s, ridge {device.ridge:.2f} FLOP/B", head, "-" * len(head)]
    for p in points:
        achieved = "-" if p["achieved_gflops"] is None else f"{p['achieved_gflops']:.0f}"
        lines.append(f"{p['op']:<28} {'x'.join(map(str, p['shape'])):<16} {p['dtype']:<9} {p['intensity']:>7.3f} "
                     f"{p['attainable_gflops']:>11.0f} {achieved:>9}  {p['source']}")
    return "\n".join(lines)
