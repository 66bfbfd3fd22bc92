"""``.. cukern-reduction-dtypes::``: the reductions' table of input dtypes and result dtypes, built from
``cukern.reduce_plan`` at build time (``check_input``, ``result_dtype`` and ``route``), so it is the table
the code applies. The table is made of docutils nodes, so it renders the same in reST and MyST pages.
"""

from __future__ import annotations

from docutils import nodes
from sphinx.util.docutils import SphinxDirective

# (column heading, the op whose rules the column shows)
COLUMNS = [
    ("sum, nansum", "sum"),
    ("prod", "prod"),
    ("mean, nanmean", "mean"),
    ("var, std", "var"),
    ("amax, amin, nanmax, nanmin", "amax"),
    ("norm", "norm"),
    ("sum_of_squares", "sum_of_squares"),
    ("logsumexp", "logsumexp"),
    ("count_nonzero", "count_nonzero"),
]
HOW = {"direct": "", "cast": "c", "view": "v", "flip": "f", "complex": "p", "gather": "g"}


def cell_text(op: str, dtype) -> str:
    import cukern.reduce_plan as plan
    from cukern._dtypes import dtype_name

    try:
        plan.check_input(op, dtype)
    except TypeError:
        return "refused"
    result = plan.result_dtype(op, dtype)
    mark = HOW.get(plan.route(op, dtype, result).how, "?")
    return dtype_name(result) + (f" ({mark})" if mark else "")


def _table(rows: list[list[str]]) -> nodes.table:
    table = nodes.table(classes=["cukern-dtypes"])
    group = nodes.tgroup(cols=len(rows[0]))
    table += group
    for _ in rows[0]:
        group += nodes.colspec(colwidth=1)
    for i, row in enumerate(rows):
        part = nodes.thead() if i == 0 else None
        tr = nodes.row()
        for text in row:
            entry = nodes.entry()
            entry += nodes.paragraph(text=text)
            tr += entry
        if part is not None:
            part += tr
            group += part
        else:
            if not any(isinstance(c, nodes.tbody) for c in group.children):
                group += nodes.tbody()
            group.children[-1] += tr
    return table


class ReductionDtypes(SphinxDirective):
    has_content = False

    def run(self):
        import cukern.reduce_plan as plan
        from cukern._dtypes import dtype_name

        self.env.note_dependency(plan.__file__)
        rows = [["x"] + [heading for heading, _ in COLUMNS]]
        for t in plan.NUMERIC:
            rows.append([dtype_name(t)] + [cell_text(op, t) for _, op in COLUMNS])
        return [_table(rows)]


def setup(app):
    app.add_directive("cukern-reduction-dtypes", ReductionDtypes)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
