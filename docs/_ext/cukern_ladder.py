"""The reduction-ladder tutorial's generated parts, made at build time:

- ``.. cukern-ladder-plot::``: an SVG bar chart of every rung's % of the copy, one chart per results file
  (``bench/readme_results.CARDS``), drawn from the ``reduce_ladder`` records with no plotting library;
- ``.. cukern-ladder-table::``: the same records as a table, beside each rung's change (``cukern.ladder.RUNGS``,
  then ``cukern.ladder.BEYOND``);
- ``.. cukern-explain:: CARD``: the six-question card of a lab card name (``python -m cukern.lab explain CARD
  --no-measure``), planned for the current GPU or, with none, for an H200 from its datasheet, with registers
  and spills from NVRTC's ptxas.
"""

from __future__ import annotations

import html
import sys
from pathlib import Path

from docutils import nodes
from sphinx.util.docutils import SphinxDirective

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import readme_results  # noqa: E402


def ladder_records(doc: dict) -> list[dict]:
    import cukern.ladder as ladder

    by_name = {r["impl"]: r for r in doc["records"] if r["op"] == "reduce_ladder"}
    return [by_name[r.name] for r in ladder.RUNGS + (ladder.BEYOND,) if r.name in by_name]


def svg_chart(title: str, labels: list[str], values: list[float]) -> str:
    width, height, left, bottom, top = 640, 300, 48, 40, 30
    plot_w, plot_h = width - left - 16, height - bottom - top
    top_value = max(110.0, max(values, default=0) * 1.05)
    bar = plot_w / max(len(values), 1)

    def y(v):
        return top + plot_h * (1 - v / top_value)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" role="img" '
             f'aria-label="{html.escape(title)}" style="max-width:100%;font-family:sans-serif;font-size:11px">',
             f'<text x="{width / 2}" y="16" text-anchor="middle" font-size="13">{html.escape(title)}</text>']
    for tick in range(0, int(top_value) + 1, 20):
        parts.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{y(tick):.1f}" y2="{y(tick):.1f}" '
                     f'stroke="#ddd"/><text x="{left - 4}" y="{y(tick) + 4:.1f}" text-anchor="end">{tick}%</text>')
    parts.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{y(100):.1f}" y2="{y(100):.1f}" stroke="#c33" '
                 f'stroke-dasharray="4 3"/><text x="{left + plot_w}" y="{y(100) - 4:.1f}" text-anchor="end" '
                 f'fill="#c33">copy peak</text>')
    for i, (label, v) in enumerate(zip(labels, values)):
        x0 = left + i * bar + bar * 0.15
        parts.append(f'<rect x="{x0:.1f}" y="{y(v):.1f}" width="{bar * 0.7:.1f}" height="{y(0) - y(v):.1f}" '
                     f'fill="#3b6ea5"><title>{html.escape(label)}: {v:.1f}% of the copy</title></rect>')
        parts.append(f'<text x="{x0 + bar * 0.35:.1f}" y="{y(v) - 3:.1f}" text-anchor="middle">{v:.0f}</text>')
        parts.append(f'<text x="{x0 + bar * 0.35:.1f}" y="{y(0) + 14:.1f}" text-anchor="middle">'
                     f'{html.escape(label)}</text>')
    parts.append(f'<text x="{left + plot_w / 2}" y="{height - 6}" text-anchor="middle">rung (float32, 2^28 '
                 f'elements; % of the device-to-device copy)</text></svg>')
    return "".join(parts)


class _Ladder(SphinxDirective):
    has_content = False

    def _docs(self) -> dict:
        for card in readme_results.CARDS:
            self.env.note_dependency(str(readme_results.RESULTS / f"{card}.json"))
        return readme_results.load_results()


class LadderPlot(_Ladder):
    def run(self):
        out = []
        for card, doc in self._docs().items():
            rows = ladder_records(doc)
            if not rows:
                continue
            labels = [r["impl"].split("_")[1] for r in rows]
            title = f"The reduction ladder on the {readme_results.device_name(card, doc)}"
            out.append(nodes.raw("", svg_chart(title, labels, [r["pct_of_peak"] for r in rows]), format="html"))
        return out


class LadderTable(_Ladder):
    def run(self):
        import cukern.ladder as ladder
        from cukern_tables import _table

        docs = self._docs()
        head = ["rung", "change from the rung before"]
        for card, doc in docs.items():
            head += [f"µs, {readme_results.device_name(card, doc)}", "% of copy", "x the rung before"]
        rows = [head]
        per_card = {card: {r["impl"]: r for r in ladder_records(doc)} for card, doc in docs.items()}
        for rung in ladder.RUNGS + (ladder.BEYOND,):
            row = [rung.name, rung.change]
            for card in docs:
                r = per_card[card].get(rung.name)
                before = per_card[card].get(ladder.RUNGS[rung.number - 2].name) if rung.number > 1 else None
                if r is None:
                    row += ["-", "-", "-"]
                    continue
                speedup = f"{before['median_us'] / r['median_us']:.2f}" if before else "-"
                row += [f"{r['median_us']:.1f}", f"{r['pct_of_peak']:.1f}", speedup]
            rows.append(row)
        return [_table(rows)]


class Explain(SphinxDirective):
    required_arguments = 1
    has_content = False

    def run(self):
        import cukern.lab  # noqa: F401  (registers every family's cards)
        from cukern.lab.card import explain

        text = explain(self.arguments[0], measure=False).format()
        block = nodes.literal_block(text, text)
        block["language"] = "text"
        return [block]


def setup(app):
    app.add_directive("cukern-ladder-plot", LadderPlot)
    app.add_directive("cukern-ladder-table", LadderTable)
    app.add_directive("cukern-explain", Explain)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
