"""A pytest plugin that routes CuPy's reductions to cukern while CuPy's own tests run, a check of NumPy semantics.

Load it with ``python -m pytest -p bench.cupy_routing .cupy_tests`` (``bench/fetch_cupy_tests.sh`` copies the
tests). While it is loaded, ``cupy.sum``, ``cupy.mean``, ``cupy.amax`` / ``cupy.max``, ``cupy.amin`` /
``cupy.min``, the ``cupy.ndarray`` methods ``sum``, ``mean``, ``max`` and ``min``, and ``cupy.linalg.norm``
(2-norms of vectors and of flattened arrays: ``ord`` None or 2) call cukern. Each routed call is counted per
test as

* ``answered``: cukern returned the result;
* ``refused``: cukern raised TypeError, ValueError or NotImplementedError and CuPy, called then, answered
  (a support gap); where CuPy raises as well, CuPy's error stands and the call counts as ``both_raised``;
* ``wrong``: the answered calls of a test that failed (the test found a wrong value, dtype or layout).

With ``CUKERN_ROUTING_OPS=all`` the plugin also routes ``prod``, ``var``, ``std``, ``nansum``, ``nanmean``,
``nanmax``, ``nanmin``, ``argmax``, ``argmin``, ``nanargmax``, ``nanargmin``, ``cumsum``, ``cumprod``,
``count_nonzero``, ``any`` and ``all`` (the functions and the ``ndarray`` methods CuPy has; argmax's
``dtype``, CuPy's index dtype, goes to cukern too), and ``cupyx.scipy.special.logsumexp`` (SciPy's
signature: ``b`` and ``return_sign`` too). Calls cukern makes while answering one go to CuPy unrouted.
Every count is also kept per op (``answered:var``, ...), and a call both raise in which cukern's exception
is not of CuPy's type is counted as ``raised_otherwise:<op>:<cukern's>/<CuPy's>``.

Tests whose node id matches ``CUKERN_ROUTING_SKIP`` (a regular expression; by default the classes that mock
CuPy's CUB internals, which check CuPy's code path rather than results) run unrouted. The counts are printed
at the end and written as JSON to the file named by ``CUKERN_ROUTING_JSON`` when set.
"""

from __future__ import annotations

import functools
import json
import os
import re
from collections import Counter

import pytest

_SKIP = re.compile(os.environ.get("CUKERN_ROUTING_SKIP", r"Cub|CUB|cub_"))
_REFUSALS = (TypeError, ValueError, NotImplementedError)


class _State:
    def __init__(self):
        self.active = False
        self.current = Counter()
        self.tests: dict = {}
        self.originals: list = []


_state = _State()


def _count(what: str, op: str) -> None:
    _state.current[what] += 1
    _state.current[f"{what}:{op}"] += 1


def _route(op: str, ours, theirs):
    """Call cukern (``ours``), counting the outcome; CuPy (``theirs``) on a refusal. Calls made while
    cukern answers (its own CuPy steps) are not routed."""
    _state.active = False
    try:
        result = ours()
    except _REFUSALS as ours_err:
        try:
            result = theirs()
        except Exception as theirs_err:
            _count("both_raised", op)
            if not isinstance(ours_err, type(theirs_err)):  # NumPy's exception type is CuPy's here
                _state.current[f"raised_otherwise:{op}:{type(ours_err).__name__}/{type(theirs_err).__name__}"] += 1
            raise
        _count("refused", op)
        return result
    finally:
        _state.active = True
    _count("answered", op)
    return result


# CuPy's positional parameters after the array, for the functions and the ndarray methods (where they differ).
_AXIS_OUT_KEEPDIMS = ("axis", "out", "keepdims")
_WITH_DTYPE = ("axis", "dtype", "out", "keepdims")
_VAR = ("axis", "dtype", "out", "ddof", "keepdims")
_SCAN = ("axis", "dtype", "out")
_ISSUE_OPS = {"sum": _WITH_DTYPE, "mean": _WITH_DTYPE, "amax": _AXIS_OUT_KEEPDIMS, "amin": _AXIS_OUT_KEEPDIMS}
_MORE_OPS = {
    "prod": _WITH_DTYPE, "var": _VAR, "std": _VAR, "nansum": _WITH_DTYPE, "nanmean": _WITH_DTYPE,
    "nanmax": _AXIS_OUT_KEEPDIMS, "nanmin": _AXIS_OUT_KEEPDIMS, "argmax": _WITH_DTYPE, "argmin": _WITH_DTYPE,
    "nanargmax": _WITH_DTYPE, "nanargmin": _WITH_DTYPE, "cumsum": _SCAN, "cumprod": _SCAN,
    "count_nonzero": ("axis",), "any": _AXIS_OUT_KEEPDIMS, "all": _AXIS_OUT_KEEPDIMS,
}
_METHOD_KEYS = {"argmax": ("axis", "out", "dtype", "keepdims"), "argmin": ("axis", "out", "dtype", "keepdims")}
_LOGSUMEXP = ("axis", "b", "keepdims", "return_sign")


def _reduction(name: str, theirs, keys: tuple):
    import cupy

    import cukern

    ours = getattr(cukern, name)

    @functools.wraps(theirs)
    def routed(a, *args, **kwargs):
        if not _state.active or type(a) is not cupy.ndarray or set(kwargs) - set(keys) or len(args) > len(keys):
            return theirs(a, *args, **kwargs)
        kw = dict(zip(keys, args))
        kw.update(kwargs)
        if "keepdims" in kw and kw["keepdims"] is None:  # ndarray.prod's default
            kw["keepdims"] = False
        axis = kw.pop("axis", None)
        return _route(name, lambda: ours(a, axis, **kw), lambda: theirs(a, *args, **kwargs))

    routed.__cukern_routed__ = True
    return routed


def _norm(theirs):
    import cupy

    import cukern

    @functools.wraps(theirs)
    def routed(x, ord=None, axis=None, keepdims=False):
        vector = (ord is None and (axis is None or isinstance(axis, int))) or (
            ord == 2 and (isinstance(axis, int) or (axis is None and getattr(x, "ndim", 0) == 1)))
        if not _state.active or type(x) is not cupy.ndarray or not vector:
            return theirs(x, ord, axis, keepdims)
        return _route("norm", lambda: cukern.norm(x, axis, keepdims=keepdims),
                      lambda: theirs(x, ord, axis, keepdims))

    routed.__cukern_routed__ = True
    return routed


def _patch(owner, attr: str, make) -> None:
    original = getattr(owner, attr)
    if getattr(original, "__cukern_routed__", False):
        return
    _state.originals.append((owner, attr, original))
    setattr(owner, attr, make(original))


def pytest_configure(config):
    import cupy

    ops = dict(_ISSUE_OPS, **(_MORE_OPS if os.environ.get("CUKERN_ROUTING_OPS") == "all" else {}))
    aliases = {"max": "amax", "min": "amin"}
    for attr in (*ops, *aliases):
        name = aliases.get(attr, attr)
        if name in ops and hasattr(cupy, attr):
            _patch(cupy, attr, lambda f, n=name: _reduction(n, f, ops[n]))
        if name in ops and hasattr(cupy.ndarray, attr) and attr not in ("amax", "amin"):
            _patch(cupy.ndarray, attr, lambda f, n=name: _reduction(n, f, _METHOD_KEYS.get(n, ops[n])))
    _patch(cupy.linalg, "norm", _norm)
    if os.environ.get("CUKERN_ROUTING_OPS") == "all":
        import cupyx.scipy.special

        _patch(cupyx.scipy.special, "logsumexp", lambda f: _reduction("logsumexp", f, _LOGSUMEXP))


def pytest_unconfigure(config):
    for owner, attr, original in reversed(_state.originals):
        setattr(owner, attr, original)
    _state.originals.clear()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    _state.current = Counter()
    _state.active = not _SKIP.search(item.nodeid)
    try:
        yield
    finally:
        _state.active = False
        # the counts travel with the test's report, so that under pytest-xdist the controller sums them
        item.user_properties.append(("cukern_routing", dict(_state.current)))


def pytest_runtest_logreport(report):
    if report.when != "call":
        return
    counts = dict(dict(report.user_properties).get("cukern_routing", {}))
    if not counts:
        return
    if report.failed:
        for key in [k for k in counts if k.startswith("answered")]:
            counts["wrong" + key[8:]] = counts.pop(key)
    counts["outcome"] = report.outcome
    _state.tests[report.nodeid] = counts


def _totals() -> dict:
    total = Counter()
    for counts in _state.tests.values():
        total.update({k: v for k, v in counts.items() if k != "outcome"})
        total["tests_" + counts["outcome"]] += 1
    return dict(total)


def pytest_terminal_summary(terminalreporter):
    totals = _totals()
    terminalreporter.section("cukern routing")
    terminalreporter.write_line(
        "routed calls: " + ", ".join(f"{k} {totals.get(k, 0)}" for k in ("answered", "refused", "wrong", "both_raised"))
        + f"; tests with routed calls: {len(_state.tests)} (" + ", ".join(
            f"{k[6:]} {v}" for k, v in sorted(totals.items()) if k.startswith("tests_")) + ")")
    kinds = ("answered", "refused", "wrong", "both_raised")
    ops = sorted({k.split(":", 1)[1] for k in totals if k.split(":", 1)[0] in kinds and ":" in k})
    for op in ops:
        terminalreporter.write_line(f"  {op}: " + ", ".join(f"{k} {totals.get(f'{k}:{op}', 0)}" for k in kinds))
    for k in sorted(k for k in totals if k.startswith("raised_otherwise:")):
        terminalreporter.write_line(f"  {k[len('raised_otherwise:'):]}: raised otherwise {totals[k]}")
    path = os.environ.get("CUKERN_ROUTING_JSON")
    if path:
        with open(path, "w") as f:
            json.dump({"totals": totals, "tests": _state.tests}, f, indent=1, sort_keys=True)
