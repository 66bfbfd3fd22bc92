"""The README's table of headline results, from the results files (every figure comes from them).

Usage: python bench/readme_results.py [--check]

Reads ``bench/results/h200.json`` and, where present, ``bench/results/h100.json`` (any
``bench/results/<card>.json`` named in ``CARDS``), and rewrites the table between the README's
``<!-- results -->`` and ``<!-- /results -->`` markers: one row per case in ``HEADLINE``, and for each card
cukern's time and % of the copy peak beside the fastest peer of the same run. ``--check`` rewrites nothing
and exits 1 when the README's table is not the one the files give. The full tables are the documentation's
Results page (``docs/results.md``), rendered from the same files by ``docs/_ext/cukern_results.py``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
START, END = "<!-- results -->", "<!-- /results -->"
CARDS = ("h200", "h100")  # results files, in the order of the table's columns; the absent ones are skipped
IMPLS = {"cupy": "CuPy", "torch": "PyTorch", "torch.compile": "torch.compile", "triton": "Triton",
         "liger": "Liger-Kernel"}

# (label, op, shape, dtype): the cases the README shows, at most 15
HEADLINE = [
    ("rms_norm", "rms_norm", (16384, 4096), "bfloat16"),
    ("rms_norm, wide rows", "rms_norm", (16384, 8192), "bfloat16"),
    ("fused_add_rms_norm", "fused_add_rms_norm", (16384, 4096), "bfloat16"),
    ("rms_norm, float8 out per token", "rms_norm_fp8", (16384, 4096), "bfloat16"),
    ("qk_norm_rope, 32 + 8 heads", "qk_norm_rope", (16384, 32, 128), "bfloat16"),
    ("rotary_embedding, NeoX", "rotary_embedding", (16384, 32, 128), "bfloat16"),
    ("rotary_embedding, GPT-J", "rotary_embedding_gptj", (16384, 32, 128), "bfloat16"),
    ("rotary_embedding_positions", "rotary_embedding_positions", (16384, 32, 128), "bfloat16"),
    ("sum", "sum", (2**29,), "float32"),
    ("sum along columns", "sum_cols", (16384, 32768), "float32"),
    ("var", "var", (2**28,), "float32"),
    ("logsumexp of rows", "logsumexp_rows", (32768, 16384), "float32"),
    ("argmax", "argmax", (2**28,), "float32"),
    ("segment_sum", "segment_sum", (2**28,), "float32"),
    ("cumsum", "cumsum", (2**28,), "float32"),
]


def load_results(directory: Path = RESULTS) -> dict[str, dict]:
    """{card: results document} for every file of ``CARDS`` present in ``directory``."""
    found = {}
    for card in CARDS:
        path = Path(directory) / f"{card}.json"
        if path.exists():
            found[card] = json.loads(path.read_text())
    if not found:
        raise SystemExit(f"no results file in {directory} (looked for {', '.join(c + '.json' for c in CARDS)})")
    return found


def shape_text(shape) -> str:
    def dim(n):
        return f"2^{n.bit_length() - 1}" if n >= 2**20 and n & (n - 1) == 0 else str(n)

    return "x".join(dim(n) for n in shape)


def find(doc: dict, op: str, impl: str, shape, dtype: str):
    for r in doc["records"]:
        if r["op"] == op and r["impl"] == impl and r["shape"] == list(shape) and r["dtype"] == dtype:
            return r
    return None


def best_peer(doc: dict, op: str, shape, dtype: str):
    peers = [r for r in doc["records"] if r["op"] == op and r["shape"] == list(shape) and r["dtype"] == dtype
             and r["impl"] in IMPLS]
    return min(peers, key=lambda r: r["median_us"]) if peers else None


def cells(doc: dict, op: str, shape, dtype: str) -> tuple[str, str]:
    ours = find(doc, op, "cukern", shape, dtype)
    if ours is None:
        return "not measured", "-"
    peer = best_peer(doc, op, shape, dtype)
    mine = f"{ours['pct_of_peak']:.1f}% ({ours['median_us']:.1f} µs)"
    if peer is None:
        return mine, "-"
    x = peer["median_us"] / ours["median_us"]
    return mine, f"{IMPLS[peer['impl']]} {peer['pct_of_peak']:.1f}% ({x:.2f}x)"


def device_name(card: str, doc: dict) -> str:
    return doc.get("device", card).replace("NVIDIA ", "")


def table(docs: dict[str, dict]) -> str:
    head = ["case", "shape, dtype"]
    for card, doc in docs.items():
        name = device_name(card, doc)
        head += [f"cukern, {name}", f"fastest peer, {name} (cukern's speed-up)"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, op, shape, dtype in HEADLINE:
        row = [label, f"{shape_text(shape)} {dtype}"]
        for doc in docs.values():
            row += cells(doc, op, shape, dtype)
        out.append("| " + " | ".join(row) + " |")
    sources = "; ".join(f"`bench/results/{card}.json`, {device_name(card, doc)}, source "
                        f"{doc['source_sha256'][:12]}, copy peak {doc['peak_copy_gbps']:.0f} GB/s"
                        for card, doc in docs.items())
    out += ["", f"Percentages are of the device-to-device copy measured in the same run ({sources})."]
    return "\n".join(out)


def rewrite(text: str, docs: dict[str, dict]) -> str:
    if START not in text or END not in text:
        raise SystemExit(f"the README has no {START} ... {END} markers")
    head, rest = text.split(START, 1)
    tail = rest[rest.index(END):]
    return head + START + "\n" + table(docs) + "\n" + tail


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when the README's table is out of date")
    ap.add_argument("--results-dir", default=str(RESULTS))
    ap.add_argument("--readme", default=str(ROOT / "README.md"))
    a = ap.parse_args(argv)
    readme = Path(a.readme)
    text = readme.read_text()
    new = rewrite(text, load_results(Path(a.results_dir)))
    if a.check:
        if new != text:
            print(f"{readme}: the results table is out of date (python bench/readme_results.py)", file=sys.stderr)
            return 1
        return 0
    readme.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
