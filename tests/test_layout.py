"""The package's shape, read from the source with ``ast`` (no import runs): no import circle anywhere, the
lab wing imported by nothing outside it (its command line, ``cukern/lab/cli.py``, runs as ``python -m
cukern.lab``), and the op modules importing only downward.

Every import counts, at module level or inside a function. ``from P import x`` is an edge to the package or
module ``P`` and, when ``x`` is a module, to ``x`` as well: Python runs ``P``'s ``__init__`` first, so a
module that imports a sibling through ``from . import`` stands in a circle with a package ``__init__`` that
imports it. Relative imports are resolved against the importing module.

And every name a module uses is bound somewhere (pyflakes' check): most of the ops' host code runs only
with a GPU, so a name renamed on one line and not the next would otherwise surface there first.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "cukern"

LAB = "cukern.lab"
OPS = ("cukern.rmsnorm", "cukern.rmsnorm_backward", "cukern.rotary", "cukern.reduce", "cukern.reduce_plan",
       "cukern.rope_cache", "cukern.qknorm", "cukern.argreduce", "cukern.segment", "cukern.scan")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict:
    """Module name -> source path, for every module under cukern/."""
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports(name: str, path: Path, known) -> list:
    """``(imported module, line)`` for every import in the module, cukern's own modules only."""
    is_package = path.name == "__init__.py"
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                drop = node.level - 1 if is_package else node.level
                base = base[: len(base) - drop] if drop else base
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            out.append((target, node.lineno))
            out += [(f"{target}.{alias.name}", node.lineno) for alias in node.names]
    return [(m, line) for m, line in out if m in known]


def graph() -> dict:
    """Module -> {imported module: first line importing it}."""
    mods = modules()
    edges = {}
    for name, path in mods.items():
        edges[name] = {}
        for target, line in imports(name, path, mods):
            if target != name:
                edges[name].setdefault(target, line)
    return edges


@pytest.fixture(scope="module")
def edges() -> dict:
    """The package's :func:`graph`, read once for the module's tests (the source does not change under them)."""
    return graph()


def where(edges, a, b) -> str:
    return f"{a} -> {b} ({modules()[a].relative_to(ROOT)}:{edges[a][b]})"


def find_cycle(edges) -> list | None:
    """One import circle as a list of modules (first == last), or None."""
    state = {}
    stack = []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for n in sorted(edges[m]):
            if state.get(n) == "open":
                return stack[stack.index(n):] + [n]
            if n not in state:
                found = visit(n)
                if found:
                    return found
        stack.pop()
        state[m] = "done"
        return None

    for m in sorted(edges):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return None


def test_the_graph_sees_every_module_and_resolves_relative_imports(edges):
    assert {"cukern", "cukern.lab", "cukern.lab.bench", "cukern.rmsnorm", "cukern._tuned"} <= set(edges)
    assert "cukern.rmsnorm" in edges["cukern.lab.rmsnorm"]  # from .. import rmsnorm
    assert "cukern.lab.bench" in edges["cukern.lab.rmsnorm"]  # import cukern.lab.bench as bench
    assert "cukern._tuned" in edges["cukern.rmsnorm"]
    assert "cukern.lab.rmsnorm" in edges["cukern.lab"]  # an __init__'s "from . import" is its own package's


def test_from_package_import_is_an_edge_to_the_package_too(tmp_path):
    (tmp_path / "a.py").write_text("from . import b\nfrom .b import name\nimport pkg.c as c\n")
    found = imports("pkg.a", tmp_path / "a.py", {"pkg", "pkg.b", "pkg.c"})
    assert sorted(set(m for m, _ in found)) == ["pkg", "pkg.b", "pkg.c"]
    assert ("pkg", 2) not in found  # from .b import name: the module b, not the package


def test_find_cycle_names_the_circle():
    assert find_cycle({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b": 1}, "b": {}, "c": {"a": 1, "b": 1}}) is None


def test_no_import_circle(edges):
    cycle = find_cycle(edges)
    assert cycle is None, "import circle: " + "; ".join(where(edges, a, b) for a, b in zip(cycle, cycle[1:]))


def test_nothing_outside_the_lab_imports_it(edges):
    bad = [where(edges, a, b) for a in edges for b in edges[a]
           if (b == LAB or b.startswith(LAB + ".")) and not (a == LAB or a.startswith(LAB + "."))]
    assert not bad, "nothing outside cukern/lab/ may import cukern.lab: " + "; ".join(bad)


@pytest.mark.parametrize("op", OPS)
def test_op_modules_import_only_downward(op, edges):
    assert op in edges, f"{op} is gone: update OPS"
    allowed = set(OPS) | {m for m in edges if m.count(".") == 1 and m.startswith("cukern._")
                          and not m.startswith("cukern.__")}
    bad = [where(edges, op, b) for b in edges[op] if b not in allowed]
    assert not bad, ("an op module imports only cukern's underscore modules and the other op modules (no timing, "
                     "lab, cli or dask): " + "; ".join(bad))


def test_every_name_used_is_bound():
    """pyflakes over the package, the bench and the tests, its undefined-name findings only (unused imports
    are the families' re-exports)."""
    pytest.importorskip("pyflakes")
    from pyflakes import checker, messages

    undefined = (messages.UndefinedName, messages.UndefinedLocal, messages.UndefinedExport)
    found = []
    for top in ("cukern", "bench", "tests"):
        for path in sorted((ROOT / top).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            found += [f"{path.relative_to(ROOT)}:{m.lineno}: {m.message % m.message_args}"
                      for m in checker.Checker(tree, filename=str(path)).messages if isinstance(m, undefined)]
    assert not found, "\n".join(found)

