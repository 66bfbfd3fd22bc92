"""Rewrite the README's "Results" section from bench/results/h200.json (every figure comes from that file).

Usage: python bench/readme_results.py --tests-log GPU_TESTS_LOG [--gpus N]
(the GPU suite's log from the same `bench/run_h200.sh tests,bench` call, for its pass count).
"""

from __future__ import annotations

import argparse
import json
import re
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
START, END = "## Results (NVIDIA H200)", "## Running the GPU suite"
LAUNCH_FLOOR = "4.2–5.0 µs"  # bench/results/sweeps/timing_h200.log: a one-element kernel after the L2 flush
COPY_256 = "6.14 µs"  # same log: a device-to-device copy of the bytes of rms_norm [256, 4096]
COPY_4096 = "80.7%"  # same log: a copy of the bytes of rms_norm [4096, 4096]


class Records:
    def __init__(self, data):
        self.data = data
        self.peak = data["peak_copy_gbps"]

    def get(self, op, impl, shape, dtype="bfloat16"):
        for r in self.data["records"]:
            if r["op"] == op and r["impl"] == impl and r["shape"] == list(shape) and r["dtype"] == dtype:
                return r
        raise KeyError((op, impl, shape, dtype))

    def peers(self, op, shape, dtype="bfloat16"):
        return [r for r in self.data["records"] if r["op"] == op and r["shape"] == list(shape)
                and r["dtype"] == dtype and not r["impl"].startswith("cukern")]

    def best_peer(self, op, shape, dtype="bfloat16"):
        peers = self.peers(op, shape, dtype)
        return min(peers, key=lambda r: r["median_us"]) if peers else None


def pct(r):
    return f"{r['pct_of_peak']}% ({r['median_us']:.2f} µs)"


def peer_text(p, time_only=False):
    if p is None:
        return "-"
    return f"{p['impl']} {p['median_us']:.2f} µs" if time_only else f"{p['impl']} {pct(p)}"


NAMES = {"cupy": "CuPy", "triton": "Triton", "torch": "PyTorch"}


def versus(ours, peer):
    """'' when ours is at least as fast as the peer, else how much faster the peer is."""
    if peer is None or ours["median_us"] <= peer["median_us"]:
        return ""
    name, lead = NAMES.get(peer["impl"], peer["impl"]), 100 * (ours["median_us"] / peer["median_us"] - 1)
    return f"{name} {lead:.1f}% faster" if lead >= 0.05 else f"{name} {lead:.2f}% faster (a tie within noise)"


def met(misses) -> str:
    misses = [m for m in misses if m]
    return "no: " + "; ".join(misses) if misses else "yes"


def targets(R: Records) -> list:
    rows = []

    def bandwidth(label, op, shape, dtype, floor, why_low=""):
        ours, peer = R.get(op, "cukern", shape, dtype), R.best_peer(op, shape, dtype)
        low = f"under {floor}%{why_low}" if floor is not None and ours["pct_of_peak"] < floor else ""
        target = (f">= {floor}%, " if floor is not None else "") + "beat every peer"
        rows.append((label, target, pct(ours), peer_text(peer), met([low, versus(ours, peer)])))

    bandwidth("rms_norm bf16 16384x4096", "rms_norm", (16384, 4096), "bfloat16", 93)
    bandwidth("rms_norm bf16 16384x8192", "rms_norm", (16384, 8192), "bfloat16", 93)
    bandwidth("rms_norm bf16 4096x4096", "rms_norm", (4096, 4096), "bfloat16", 85,
              f" (a copy of the same bytes: {COPY_4096})")
    r, p = R.get("rms_norm", "cukern", (256, 4096)), R.best_peer("rms_norm", (256, 4096))
    rows.append(("rms_norm bf16 256x4096", "<= 4.5 µs, beat every peer", f"{r['median_us']:.2f} µs",
                 peer_text(p, True),
                 met([r["median_us"] > 4.5 and f"over 4.5 µs (a copy of the same bytes: {COPY_256})", versus(r, p)])))
    bandwidth("rms_norm fp16 16384x4096", "rms_norm", (16384, 4096), "float16", None)
    bandwidth("rms_norm fp32 16384x4096", "rms_norm", (16384, 4096), "float32", None)
    bandwidth("fused_add_rms_norm bf16 16384x4096", "fused_add_rms_norm", (16384, 4096), "bfloat16", 92)
    bandwidth("rotary NeoX 16384x32x128", "rotary_embedding", (16384, 32, 128), "bfloat16", 90)
    bandwidth("rotary GPT-J 16384x32x128", "rotary_embedding_gptj", (16384, 32, 128), "bfloat16", 88)
    contiguous = R.get("rotary_embedding", "cukern", (16384, 32, 128))
    view = R.get("rotary_embedding_qkv_view", "cukern", (16384, 32, 128))
    gap = 100 * (view["median_us"] / contiguous["median_us"] - 1)
    rows.append(("rotary fused-qkv view", "within 5% of contiguous", pct(view),
                 peer_text(R.best_peer("rotary_embedding_qkv_view", (16384, 32, 128))),
                 f"{met([gap > 5 and 'over 5%'])} ({round(gap, 1) or 0.0:.1f}%)"))
    for tokens in (1, 8, 64):
        r = R.get("rotary_embedding", "cukern", (tokens, 32, 128))
        g = R.get("rotary_embedding", "cukern-graph", (tokens, 32, 128))
        rows.append((f"rotary decode {tokens} token(s)", "<= 4 µs", f"{r['median_us']:.2f} µs",
                     peer_text(R.best_peer("rotary_embedding", (tokens, 32, 128)), True),
                     met([r["median_us"] > 4 and f"over 4 µs (launch floor {LAUNCH_FLOOR})"])
                     + f"; graph replay {g['median_us']:.2f} µs a call"))
    r, c = R.get("sum", "cukern", (2**29,), "float32"), R.get("sum", "cupy", (2**29,), "float32")
    rows.append(("sum fp32 2^29", ">= cupy.sum", pct(r), peer_text(c),
                 met([versus(r, c)])))
    for e, want in ((20, 1.2), (24, 1.1)):  # issue 13's targets
        r, c = R.get("sum", "cukern", (2**e,), "float32"), R.get("sum", "cupy", (2**e,), "float32")
        x = c["median_us"] / r["median_us"]
        rows.append((f"sum fp32 2^{e}", f"{want}x cupy.sum", f"{r['median_us']:.2f} µs", peer_text(c, True),
                     f"{met([x < want and f'under {want}x'])} ({x:.2f}x)"))
    r = R.get("sum", "cukern", (2**30,), "bfloat16")
    rows.append(("sum bf16 2^30", ">= 100%", pct(r), peer_text(R.best_peer("sum", (2**30,), "bfloat16")),
                 met([r["pct_of_peak"] < 100 and "under 100%"])))
    for op, shape, floor in (("sum_rows", (32768, 16384), 100), ("sum_cols", (16384, 32768), 95)):
        r, p = R.get(op, "cukern", shape, "float32"), R.best_peer(op, shape, "float32")
        lost = versus(r, p)
        rows.append((f"{op} fp32 {'x'.join(map(str, shape))}", f">= {floor}%", pct(r), peer_text(p),
                     met([r["pct_of_peak"] < floor and f"under {floor}%", lost])))
    v10 = R.get("reduce_ladder", "reduce_v10_loads_in_flight", (2**28,), "float32")
    prod = R.get("sum", "cukern", (2**29,), "float32")
    gap = 100 * (1 - v10["gbps"] / prod["gbps"])
    rows.append(("ladder v10 vs production", "within 2%", f"v10 {v10['pct_of_peak']}% at 2^28",
                 f"production {prod['pct_of_peak']}% at 2^29",
                 f"{met([gap > 2 and 'over 2%'])} ({gap:.1f}%, per element)"))
    def newer(label, op, shape, dtype, floor, peer_impl=None, times=None):
        """A target of issues 14 and 15: at least ``floor``% of the copy, and with ``times`` at least that
        speed-up over ``peer_impl`` (a peer or another cukern impl) in the same run."""
        try:
            ours = R.get(op, "cukern", shape, dtype)
        except KeyError:
            rows.append((label, f">= {floor}%", "not measured", "-", "no: no record"))
            return
        against = R.best_peer(op, shape, dtype) if peer_impl is None else next(
            (r for r in R.data["records"] if r["op"] == op and r["impl"] == peer_impl and r["shape"] == list(shape)
             and r["dtype"] == dtype), None)
        misses = [ours["pct_of_peak"] < floor and f"under {floor}%"]
        target = f">= {floor}%"
        if times is not None and against is not None:
            x = against["median_us"] / ours["median_us"]
            target += f", >= {times}x {against['impl']}"
            misses.append(x < times and f"{x:.2f}x {against['impl']}")
        rows.append((label, target, pct(ours), peer_text(against), met(misses)))

    newer("qk_norm_rope bf16 16384x32x128 (8 kv heads)", "qk_norm_rope", (16384, 32, 128), "bfloat16", 92,
          "cukern-composed", 1.8)
    newer("rms_norm fp8 out, bf16 16384x4096, per token", "rms_norm_fp8", (16384, 4096), "bfloat16", 92)
    newer("fused_add_rms_norm fp8 out, bf16 16384x4096", "fused_add_rms_norm_fp8", (16384, 4096), "bfloat16", 92)
    newer("rotary_embedding_positions 16384x32x128", "rotary_embedding_positions", (16384, 32, 128), "bfloat16",
          90)
    try:
        free = R.get("rotary_embedding_positions", "cukern", (1, 32, 128))
        cached = R.get("rotary_embedding", "cukern", (1, 32, 128))
        rows.append(("rotary_embedding_positions one token", "no slower than the cached kernel",
                     f"{free['median_us']:.2f} µs", f"cached {cached['median_us']:.2f} µs",
                     met([free["median_us"] > cached["median_us"] and "slower"])))
    except KeyError:
        rows.append(("rotary_embedding_positions one token", "no slower than the cached kernel", "not measured",
                     "-", "no: no record"))
    newer("argmax fp32 2^28", "argmax", (2**28,), "float32", 100)
    newer("var fp32 2^28", "var", (2**28,), "float32", 100, "cupy", 1.8)
    newer("nansum fp32 2^28", "nansum", (2**28,), "float32", 100)
    newer("sum float64 2^28", "sum", (2**28,), "float64", 100)
    newer("logsumexp rows fp32 32768x16384", "logsumexp_rows", (32768, 16384), "float32", 100)
    newer("var rows fp32 32768x16384", "var_rows", (32768, 16384), "float32", 100)
    newer("segment_sum fp32 2^28", "segment_sum", (2**28,), "float32", 90)
    newer("cumsum fp32 2^28", "cumsum", (2**28,), "float32", 90, "cupy", 1.0)

    def host(op, impl="cukern"):
        return next(x for x in R.data["records"] if x["op"] == op and x["impl"] == impl)

    # issue 16's host targets, as ratios in one run
    ours, torch = host("host_overhead"), host("host_overhead", "torch")
    rows.append(("host cost, rms_norm [1, 4096]", "<= torch F.rms_norm", f"{ours['median_us']:.2f} µs",
                 f"torch {torch['median_us']:.2f} µs", met([ours["median_us"] > torch["median_us"] and "over torch"])))
    out = host("host_overhead_out")
    rows.append(("host cost, rms_norm(out=)", "<= the allocating call", f"{out['median_us']:.2f} µs",
                 f"allocating {ours['median_us']:.2f} µs", met([out["median_us"] > ours["median_us"] and "over"])))
    plain, checked = host("host_overhead_rotary"), host("host_overhead_rotary_checked")
    x = checked["median_us"] / plain["median_us"]
    rows.append(("host cost, rotary one token, checked", "<= 2.5x unchecked", f"{checked['median_us']:.2f} µs",
                 f"unchecked {plain['median_us']:.2f} µs", f"{met([x > 2.5 and 'over 2.5x'])} ({x:.2f}x)"))
    return rows


def fill(text: str) -> str:
    return textwrap.fill(text, width=110, break_on_hyphens=False, break_long_words=False)


def section(R: Records, tests: str, gpus: int) -> str:
    d = R.data
    words = {1: "one", 2: "two", 4: "four", 8: "eight"}
    machine = ("a machine with one H200" if gpus == 1
               else f"a machine with {words.get(gpus, gpus)} H200s (the multi-GPU tests ran)")
    out = [START, "", fill(
           f"Measured by `bench/run_h200.sh tests,bench` in one device call (GPU suite, then the benchmark) on {machine}: "
           f"{tests}. `bench/results/h200.json` holds every figure with the source hash of the code it measured "
           f"({d['source_sha256'][:12]}, this tree). CuPy {d['cupy_version']}; all percentages are of the "
           f"device-to-device copy measured in the same run, {d['peak_copy_gbps']:.0f} GB/s (read + write). Times "
           "are medians of 100 CUDA-event timed calls, L2 flushed (and left clean) before each. Host costs are "
           "medians of 2000 individually timed calls, the quietest of five rounds."),
           "", "### Against the targets", "",
           "| case | target | cukern | best peer, same run | met |", "|---|---|---|---|---|"]
    out += [f"| {' | '.join(row)} |" for row in targets(R)]
    out += ["", fill(
            "Why the small cases miss (`bench/sweep_timing.py`, log in `bench/results/sweeps/timing_h200.log`, notes "
            "in `bench/NOTES.md`): under this timing a one-element CuPy kernel takes "
            f"{LAUNCH_FLOOR} (cold memory after the flush plus the launch), and in the same sweep a device-to-device "
            f"copy of the same bytes took {COPY_256} for `rms_norm` [256, 4096] and reached {COPY_4096} of the peak "
            "at [4096, 4096]. The ≤ 4 µs decode and ≤ 4.5 µs [256, 4096] targets are under what a copy of those "
            "bytes takes. In a CUDA graph a decode-size call costs what the `cukern-graph` records below say."),
            "", "### Every record", "",
            "| op | impl | shape | dtype | µs | GB/s | % of copy |", "|---|---|---|---|---:|---:|---:|"]
    for r in d["records"]:
        gbps = f"{r['gbps']:.1f}" if "gbps" in r else "-"
        p = f"{r['pct_of_peak']:.1f}" if "pct_of_peak" in r else "-"
        out.append(f"| {r['op']} | {r['impl']} | {'x'.join(map(str, r['shape']))} | {r['dtype']} | "
                   f"{r['median_us']:.2f} | {gbps} | {p} |")
    card = (ROOT / "bench/results/rms_norm_card_h200.txt").read_text().rstrip("\n")
    out += ["", "### Plots", "",
            "![GB/s against bytes moved, every op and peer, with the copy peak](bench/results/bandwidth_h200.png)", "",
            "![Every kernel at its arithmetic intensity against the H200's bandwidth and FP32 roofs]"
            "(bench/results/roofline_h200.png)", "",
            "### The rms_norm card (`python -m cukern.lab explain rms_norm --shape 16384x4096 --dtype bfloat16`)", "",
            "```", card, "```", "", ""]
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tests-log", required=True, help="gpu_tests.log of the same run")
    ap.add_argument("--gpus", type=int, default=2)
    ap.add_argument("--results", default=str(ROOT / "bench/results/h200.json"))
    a = ap.parse_args(argv)
    lines = [ln for ln in Path(a.tests_log).read_text().splitlines() if ln.strip()]
    if not lines or not lines[-1].startswith("gpu tests: shared exit"):
        raise SystemExit(f"not a GPU suite log of bench/run_h200.sh: {lines[-1:]!r}")
    # one pytest summary per part (the shared and the serial run): "N passed, M skipped, ... in S s"
    summaries = [ln for ln in lines if re.search(r"\d+ passed.* in [\d.]+s", ln)]
    count = {w: sum(int(m.group(1)) for ln in summaries for m in [re.search(rf"(\d+) {w}", ln)] if m)
             for w in ("passed", "skipped", "failed", "error")}
    if not summaries:
        raise SystemExit("the GPU suite's log has no pytest summary")
    failed = [ln.split()[1] for ln in lines if ln.startswith("FAILED ")]
    tests = f"{count['passed']} GPU tests passed"
    if count["failed"] or count["error"]:  # said, not hidden: the README states what failed
        tests += f", {count['failed'] + count['error']} failed ({', '.join(f'`{f}`' for f in failed)})"
    tests += f", {count['skipped']} skipped" if count["skipped"] else ""
    readme = ROOT / "README.md"
    text = readme.read_text()
    head, rest = text.split(START, 1)
    tail = rest[rest.index(END):]
    readme.write_text(head + section(Records(json.loads(Path(a.results).read_text())), tests, a.gpus) + tail)


if __name__ == "__main__":
    main()
