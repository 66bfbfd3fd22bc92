"""``.. cukern-results::`` and ``.. cukern-headline::``: the measured records, rendered at build time.

Both read every results file ``bench/readme_results.CARDS`` names that is present (``h200.json``, and
``h100.json`` when a run on an H100 has written one), so a new file shows up at the next build.
``cukern-results`` writes, for each file, the device, the CuPy version, the hash of the source it measured
and the copy peak, then every record; ``cukern-headline`` writes the README's table of headline cases.
"""

from __future__ import annotations

import sys
from pathlib import Path

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.util.docutils import SphinxDirective
from sphinx.util.nodes import nested_parse_with_titles

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import readme_results  # noqa: E402


def _num(value, digits) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _records_table(doc: dict) -> list[str]:
    out = [".. list-table::", "   :header-rows: 1", "", "   * - op", "     - impl", "     - shape", "     - dtype",
           "     - µs", "     - GB/s", "     - % of copy"]
    for r in doc["records"]:
        out += [f"   * - ``{r['op']}``", f"     - {r['impl']}", f"     - {'x'.join(map(str, r['shape']))}",
                f"     - {r['dtype']}", f"     - {r['median_us']:.2f}", f"     - {_num(r.get('gbps'), 1)}",
                f"     - {_num(r.get('pct_of_peak'), 1)}"]
    return out


class _ResultsDirective(SphinxDirective):
    has_content = False

    def _docs(self) -> dict:
        for card in readme_results.CARDS:
            self.env.note_dependency(str(readme_results.RESULTS / f"{card}.json"))
        self.env.note_dependency(readme_results.__file__)
        return readme_results.load_results()

    def _parse(self, lines: list[str]):
        node = nodes.section()
        node.document = self.state.document
        nested_parse_with_titles(self.state, StringList(lines, source="bench/results"), node)
        return node.children


class CukernResults(_ResultsDirective):
    def run(self):
        lines = []
        for card, doc in self._docs().items():
            name = readme_results.device_name(card, doc)
            title = f"{name} (``bench/results/{card}.json``)"
            lines += [title, "-" * len(title), "",
                      f"- device: {doc['device']}", f"- CuPy: {doc['cupy_version']}",
                      f"- source measured: ``{doc['source_sha256']}``",
                      f"- copy peak (device-to-device, read + write): {doc['peak_copy_gbps']:.1f} GB/s",
                      f"- records: {len(doc['records'])}", ""]
            for plot, alt in (("bandwidth", "GB/s against bytes moved, every op and peer, with the copy peak"),
                              ("roofline", "every kernel at its arithmetic intensity against the roofs")):
                image = readme_results.RESULTS / f"{plot}_{card}.png"
                if image.exists():
                    lines += [f".. figure:: /../bench/results/{image.name}", f"   :alt: {alt}", "",
                              f"   {alt[0].upper() + alt[1:]} ({name}).", ""]
            card_text = readme_results.RESULTS / f"rms_norm_card_{card}.txt"
            if card_text.exists():
                lines += ["The ``rms_norm`` card of this run (``python -m cukern.lab explain rms_norm --shape "
                          "16384x4096 --dtype bfloat16``):", "", "::", ""]
                lines += ["   " + ln for ln in card_text.read_text().rstrip("\n").splitlines()] + [""]
            lines += ["Every record:", ""] + _records_table(doc) + [""]
        return self._parse(lines)


class CukernHeadline(_ResultsDirective):
    def run(self):
        text = readme_results.table(self._docs())
        parser_lines = text.splitlines()
        table, note = parser_lines[:-2], parser_lines[-1]
        out = [".. list-table::", "   :header-rows: 1", ""]
        for row in (table[0], *table[2:]):
            parts = [c.strip() for c in row.strip("|").split("|")]
            out.append(f"   * - {parts[0]}")
            out += [f"     - {p}" for p in parts[1:]]
        out += ["", note.replace("`", "``")]
        return self._parse(out)


def setup(app):
    app.add_directive("cukern-results", CukernResults)
    app.add_directive("cukern-headline", CukernHeadline)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
