"""``.. cukern-cli::``: the command line's reference, walked from its argparse parser at build time.

The directive imports ``cukern.lab.cli._parser()`` and writes one section per verb: its help, its usage line
and a table of every argument (flags, value, default, choices, help). A flag added to the parser appears on
the page at the next build, and one removed disappears, with no edit to the page.
"""

from __future__ import annotations

import argparse

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.util.docutils import SphinxDirective
from sphinx.util.nodes import nested_parse_with_titles


def _literal(text: str) -> str:
    return "``" + text.replace("``", "` `") + "``" if text else ""


def _cell(text: str) -> str:
    return " ".join(str(text).split())


def _help(action: argparse.Action) -> str:
    text = action.help or ""
    if text == argparse.SUPPRESS:
        return ""
    return _cell(text.replace("%%", "%"))


def _argument_rows(parser: argparse.ArgumentParser) -> list[tuple[str, str, str, str]]:
    rows = []
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        if action.option_strings:
            name = ", ".join(_literal(s) for s in action.option_strings)
        else:
            name = _literal(action.metavar or action.dest)
        if action.nargs == 0:
            value = "flag"
        else:
            value = _literal(action.metavar or action.dest.upper()) if action.option_strings else "positional"
        if isinstance(action, argparse._AppendAction):
            value += ", repeatable"
        default = "" if action.default in (None, False, argparse.SUPPRESS) else _literal(repr(action.default))
        choices = ", ".join(_literal(str(c)) for c in action.choices) if action.choices else ""
        rows.append((name, value, default, _cell(" ".join(x for x in (_help(action),
                                                                          choices and f"Choices: {choices}.") if x))))
    return rows


def _table(rows) -> list[str]:
    out = [".. list-table::", "   :header-rows: 1", "   :widths: 20 15 10 55", "",
           "   * - argument", "     - value", "     - default", "     - meaning"]
    for row in rows:
        out.append(f"   * - {row[0]}")
        out += [f"     - {cell}" for cell in row[1:]]
    return out


def _subparsers(parser: argparse.ArgumentParser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                yield name, helps.get(name, ""), sub


def render(parser: argparse.ArgumentParser) -> list[str]:
    lines = [_cell(parser.description or ""), "", "::", "", "   " + parser.format_usage().strip(), ""]
    for name, help_text, sub in _subparsers(parser):
        title = f"{parser.prog} {name}"
        lines += [title, "-" * len(title), "", _cell((help_text or "").replace("%%", "%")) + ".", "", "::", ""]
        lines += ["   " + ln for ln in sub.format_usage().strip().splitlines()]
        lines += [""]
        rows = _argument_rows(sub)
        lines += _table(rows) if rows else ["No arguments."]
        lines += [""]
    return lines


class CukernCli(SphinxDirective):
    has_content = False

    def run(self):
        import cukern.lab.cli as cli

        self.env.note_dependency(cli.__file__)
        parser = cli._parser()
        parser.prog = "python -m cukern.lab"
        node = nodes.section()
        node.document = self.state.document
        nested_parse_with_titles(self.state, StringList(render(parser), source="cukern/lab/cli.py"), node)
        return node.children


def setup(app):
    app.add_directive("cukern-cli", CukernCli)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
