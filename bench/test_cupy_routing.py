"""The routing plugin's bookkeeping and argument mapping (CPU): stand-ins for CuPy's array type, CuPy's
functions and cukern's, so that no GPU is needed."""

import sys
import types

import pytest

import cukern
from bench import cupy_routing as R


class FakeArray:
    pass


@pytest.fixture
def routing(monkeypatch):
    """A fresh plugin state, active as inside a routed test, with ``cupy.ndarray`` the stand-in type."""
    fake_cupy = types.SimpleNamespace(ndarray=FakeArray)
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy)
    monkeypatch.setattr(R, "_state", R._State())
    R._state.active = True
    return R._state


def _recorder(calls, result="ours"):
    def fn(*args, **kwargs):
        calls.append((args, kwargs))
        return result
    return fn


def test_answered_refused_and_both_raised_are_counted_per_op(routing):
    assert R._route("var", lambda: 1, lambda: 2) == 1

    def refuse():
        raise TypeError("not supported")

    assert R._route("var", refuse, lambda: 2) == 2

    def theirs_raise():
        raise ValueError("CuPy's error")

    with pytest.raises(ValueError, match="CuPy's"):
        R._route("argmax", refuse, theirs_raise)
    assert routing.active  # restored after every call
    c = routing.current
    assert (c["answered"], c["answered:var"], c["refused:var"], c["both_raised:argmax"]) == (1, 1, 1, 1)
    assert c["raised_otherwise:argmax:TypeError/ValueError"] == 1


def test_calls_made_while_cukern_answers_are_not_routed(routing):
    seen = []

    def ours():
        seen.append(routing.active)
        return 0

    R._route("any", ours, lambda: 1)
    assert seen == [False] and routing.active


def test_cupy_positional_arguments_reach_cukern_by_name(routing, monkeypatch):
    calls = []
    monkeypatch.setattr(cukern, "var", _recorder(calls))
    routed = R._reduction("var", _recorder([], "theirs"), R._MORE_OPS["var"])
    a = FakeArray()
    assert routed(a, 1, None, None, 1, True) == "ours"  # cupy.var(a, axis, dtype, out, ddof, keepdims)
    assert calls[-1] == ((a, 1), {"dtype": None, "out": None, "ddof": 1, "keepdims": True})
    monkeypatch.setattr(cukern, "prod", _recorder(calls))
    routed = R._reduction("prod", _recorder([], "theirs"), R._MORE_OPS["prod"])
    routed(a, axis=0, keepdims=None)  # ndarray.prod's default keepdims is None
    assert calls[-1] == ((a, 0), {"keepdims": False})


def test_argmax_methods_and_their_index_dtype(routing, monkeypatch):
    calls, theirs = [], []
    monkeypatch.setattr(cukern, "argmax", _recorder(calls))
    method = R._reduction("argmax", _recorder(theirs, "theirs"), R._METHOD_KEYS["argmax"])
    a = FakeArray()
    assert method(a, 1, None) == "ours"  # ndarray.argmax(axis, out, dtype, keepdims)
    assert calls[-1] == ((a, 1), {"out": None})
    # CuPy's index dtype (NumPy's argmax has none) goes to cukern as well
    assert method(a, 1, None, "int32") == "ours"
    assert calls[-1] == ((a, 1), {"out": None, "dtype": "int32"})
    assert R._reduction("argmax", _recorder(theirs, "theirs"), R._WITH_DTYPE)(a, None, "int32") == "ours"
    assert calls[-1] == ((a, None), {"dtype": "int32"})
    assert not theirs and routing.current["answered:argmax"] == 3


def test_logsumexp_takes_scipys_arguments(routing, monkeypatch):
    calls = []
    monkeypatch.setattr(cukern, "logsumexp", _recorder(calls))
    routed = R._reduction("logsumexp", _recorder([], "theirs"), R._LOGSUMEXP)
    a, b = FakeArray(), FakeArray()
    assert routed(a, 0, b, True, True) == "ours"  # logsumexp(a, axis, b, keepdims, return_sign)
    assert calls[-1] == ((a, 0), {"b": b, "keepdims": True, "return_sign": True})
    routed(a, axis=(1, 3), b=b, return_sign=True)
    assert calls[-1] == ((a, (1, 3)), {"b": b, "return_sign": True})


def test_inactive_or_foreign_calls_go_to_cupy(routing, monkeypatch):
    monkeypatch.setattr(cukern, "sum", _recorder([]))
    routed = R._reduction("sum", _recorder([], "theirs"), R._ISSUE_OPS["sum"])
    assert routed(object()) == "theirs"  # not a CuPy array
    assert routed(FakeArray(), where=True) == "theirs"  # an argument cukern does not take
    routing.active = False
    assert routed(FakeArray()) == "theirs"
    assert not routing.current
