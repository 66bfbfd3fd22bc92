"""The public API's docstrings: every public function is annotated and has an Examples section, and each
Examples section runs as a doctest, one test per function.

The public functions are the names of ``cukern.__all__`` and ``cukern.reference.__all__``, the public
functions of :mod:`cukern.timing`, :mod:`cukern.dask` and :mod:`cukern.rope_cache`, and the lab's entry
points in :data:`LAB`. An example that imports CuPy runs on the GPU: its test is marked ``gpu`` (skipped
without one). The others run everywhere. ``np`` is NumPy in every example, as in NumPy's own docs.
"""

from __future__ import annotations

import doctest
import importlib
import inspect

import numpy as np
import pytest

import cukern
import cukern.dask
import cukern.reference
import cukern.rope_cache
import cukern.timing

LAB = ("cukern.lab.card.explain", "cukern.lab.tune.tune")
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def _own(module) -> list:
    return [f"{module.__name__}.{n}" for n, f in vars(module).items()
            if not n.startswith("_") and inspect.isfunction(f) and f.__module__ == module.__name__]


def _exported(package) -> list:
    return [f"{package.__name__}.{n}" for n in package.__all__ if inspect.isfunction(getattr(package, n))]


PUBLIC = sorted({*_exported(cukern), *_exported(cukern.reference), *_own(cukern.timing), *_own(cukern.dask),
                 *_own(cukern.rope_cache), *LAB})


def _resolve(path: str):
    module, name = path.rsplit(".", 1)
    return getattr(importlib.import_module(module), name)


def _doctest(path: str) -> doctest.DocTest | None:
    tests = doctest.DocTestFinder(recurse=False).find(_resolve(path), path, globs={"np": np})
    return tests[0] if tests and tests[0].examples else None


def _uses_gpu(test: doctest.DocTest) -> bool:
    return any("import cupy" in e.source for e in test.examples)


def _cases() -> list:
    cases = []
    for path in PUBLIC:
        test = _doctest(path)
        if test is not None:
            cases.append(pytest.param(path, id=path, marks=[pytest.mark.gpu] if _uses_gpu(test) else []))
    return cases


@pytest.mark.parametrize("path", _cases())
def test_example_runs(path):
    test = _doctest(path)
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    report = []
    runner.run(test, out=report.append)
    assert not runner.failures, "".join(report)


@pytest.mark.parametrize("path", PUBLIC)
def test_public_function_has_examples(path):
    doc = inspect.getdoc(_resolve(path)) or ""
    assert "\nExamples\n--------\n" in doc, f"{path}'s docstring has no Examples section"
    assert _doctest(path) is not None, f"{path}'s Examples section has no >>> example"


@pytest.mark.parametrize("path", PUBLIC)
def test_public_function_is_annotated(path):
    sig = inspect.signature(_resolve(path))
    bare = [p.name for p in sig.parameters.values() if p.annotation is inspect.Parameter.empty]
    assert not bare, f"{path}: parameters {bare} have no annotation"
    assert sig.return_annotation is not inspect.Signature.empty, f"{path} has no return annotation"
