"""The README and the documentation stay in step with the code and the results files: the README's short form
and its headline table (bench/readme_results.py), the CLI page's generator against the parser, the API pages'
names against the package. The Sphinx build itself runs in .ci/run (python -m sphinx -W)."""

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _load(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(path.parent))
    return module


def test_readme_is_the_front_door():
    assert len(README.splitlines()) <= 150
    # CI runs the README's install command, its docs build and, last, its test command (.ci/run: in a
    # checkout, not in an sdist)
    commands = ('pip install -e ".[cuda12,test]"', "python -m pytest",
                "python -m sphinx -W -b html docs docs/_build/html")
    for command in commands:
        assert f"\n{command}\n" in README, command
    ci_run = ROOT / ".ci" / "run"
    if ci_run.exists():
        ci = ci_run.read_text()
        assert all(command in ci for command in commands)
        assert ci.rstrip().splitlines()[-1] == "python -m pytest"


def test_readme_images_render_outside_the_repository():
    for target in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", README):
        assert target.startswith("https://"), target


def test_readme_results_table_is_the_results_files():
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "readme_results.py"), "--check"], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr


def test_readme_results_handles_an_h100_file_beside_the_h200_one(tmp_path):
    results = _load(ROOT / "bench" / "readme_results.py")
    h200 = (ROOT / "bench" / "results" / "h200.json").read_text()
    (tmp_path / "h200.json").write_text(h200)
    (tmp_path / "h100.json").write_text(h200.replace("NVIDIA H200", "NVIDIA H100 80GB HBM3"))
    table = results.table(results.load_results(tmp_path))
    head = table.splitlines()[0]
    assert "cukern, H200" in head and "cukern, H100 80GB HBM3" in head
    rows = [ln for ln in table.splitlines()[2:] if ln.startswith("|")]
    assert len(rows) == len(results.HEADLINE) <= 15
    assert all(ln.count("|") == 7 for ln in rows)
    (tmp_path / "h200.json").unlink()
    assert "H200" not in results.table(results.load_results(tmp_path)).splitlines()[0]


def test_cli_page_names_every_verb_and_flag():
    pytest.importorskip("sphinx")
    cli_page = _load(ROOT / "docs" / "_ext" / "cukern_cli.py")
    from cukern.lab import cli

    parser = cli._parser()
    text = "\n".join(cli_page.render(parser))
    for name, _, sub in cli_page._subparsers(parser):
        assert f"{parser.prog} {name}\n" in text
        for action in sub._actions:
            for flag in action.option_strings if action.dest != "help" else ():
                assert f"``{flag}``" in text, (name, flag)


def test_api_pages_list_every_public_name():
    pytest.importorskip("sphinx")
    api = _load(ROOT / "docs" / "_ext" / "cukern_api.py")
    import types

    import cukern

    names = api.public_names(cukern)
    assert set(names) == {n for n in cukern.__all__ if not isinstance(getattr(cukern, n), types.ModuleType)}
    assert "benchmark" in api.public_names(cukern.timing)


def test_design_notes_are_not_a_diary():
    for page in (ROOT / "docs" / "design").glob("*.md"):
        text = page.read_text()
        assert not re.search(r"^#+ .*\b20\d\d-\d\d-\d\d", text, re.M), page.name
        assert not re.search(r"\b(session|next stop|to-do|TODO)\b", text, re.I), page.name
