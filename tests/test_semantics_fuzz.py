"""The reductions, arg-reductions, scans and segment reductions answer as NumPy does, in what a call gives rather
than its values: raising or not (and the class), the result's shape, dtype and memory order, ``out`` returned.
tests/_record_semantics.py draws the calls at random (a fixed seed) and runs them with no GPU, in a process of its
own, beside NumPy's; every difference is a bug but those docs/guide/reductions.md names (DOCUMENTED)."""

import numpy as np
import pytest
from _support import recording

SEED, DRAWS = 20240611, 250
VAR_OPS = ("var", "std")
MEAN_OPS = ("mean",) + VAR_OPS  # NumPy's refuse an int axis of a 0-d x (nanmean's too, of integers)
INTEGERS = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
COMPLEX_REFUSED = ("sum", "mean", "prod", "nansum", "nanmean", "cumsum", "cumprod") + VAR_OPS


def _axis(m):
    return m.get("kw", {}).get("axis")


def _dtype(m):
    d = m.get("kw", {}).get("dtype")
    return None if d is None else np.dtype("float16" if d == "bfloat16" else d)


def _broadcast_out(m):
    shape, strides, _ = m["out"] or ((), (), None)
    return 0 not in shape and any(s == 0 and n > 1 for n, s in zip(shape, strides))


def _raises(m, cls):
    return m["cukern"] == ("raise", cls)


# (name, the words of docs/guide/reductions.md (or of the op's docstring), whether a mismatch is that choice)
DOCUMENTED = (
    ("bool axis", "axis is not None, an int or a tuple of ints (bools, floats and lists are refused): TypeError",
     lambda m: _raises(m, "TypeError") and (isinstance(_axis(m), (bool, np.bool_)) or isinstance(_axis(m), tuple)
                                            and any(isinstance(a, (bool, np.bool_)) for a in _axis(m)))),
    ("real dtype= for complex x", "Refused, with a message: ... a real dtype= for complex x in the sums, means, "
     "products, scans, var and std",
     lambda m: _raises(m, "TypeError") and m["op"] in COMPLEX_REFUSED and "complex" in m["x"][2]
     and _dtype(m) is not None and _dtype(m).kind != "c"),
    ("integer or bool dtype= for var/std", "Refused, with a message: ... an integer or bool dtype= for var/std",
     lambda m: _raises(m, "TypeError") and m["op"] in VAR_OPS and _dtype(m) is not None and _dtype(m).kind in "biu"),
    ("axis 0 or -1 of a 0-d x in mean/var/std", "An int axis 0 or -1 of a 0-d x is no axis, as NumPy's ufunc "
     "reductions read it (mean, var, std and nanmean of integers too, where NumPy's raise AxisError)",
     lambda m: (m["op"] in MEAN_OPS or m["op"] == "nanmean" and m["x"][2] in INTEGERS) and m["x"][0] == ()
     and m["numpy"] == ("raise", "AxisError") and not isinstance(_axis(m), tuple) and _axis(m) in (0, -1)),
    ("out a broadcast", "out a broadcast, read-only, or overlapping x: ValueError",
     lambda m: _raises(m, "ValueError") and _broadcast_out(m)),
    ("out of another shape", "out's shape is not the result's: ValueError (NumPy's may find another fault first, "
     "and its scans take any zero-size out for a zero-size x)",
     lambda m: _raises(m, "ValueError") and m["out"] is not None and m["shape"] not in (None, m["out"][0])),
    ("out cast unsafely", "out= of another dtype receives the result cast as NumPy's reductions cast (unsafely: "
     "float into int truncates, complex into real warns)",
     lambda m: m["numpy"] == ("raise", "TypeError") and m["cukern"][0] == "ok" and m["cukern"][4]),
    ("count_nonzero of a broadcast x", "count_nonzero of a broadcast x lays its result out as NumPy's sum, not as "
     "NumPy's count_nonzero (which converts x to bool first)",
     lambda m: m["op"] == "count_nonzero" and m["cukern"][:3] == m["numpy"][:3]
     and any(s == 0 and n > 1 for n, s in zip(*m["x"][:2]))),
    ("a tuple axis of an arg-reduction", "argmax, argmin, nanargmax, nanargmin (axis None or one axis): TypeError "
     "for a non-int axis (NumPy's is an AxisError for a 0-d x only)",
     lambda m: _raises(m, "TypeError") and m["op"].startswith(("arg", "nanarg")) and isinstance(_axis(m), tuple)),
)


def _documented(m):
    return next((name for name, _, applies in DOCUMENTED if m["cukern"] == m["again"] and applies(m)), None)


@pytest.mark.records("_record_semantics.py", str(SEED), str(DRAWS))
def test_calls_answer_as_numpy():
    counts, mismatches = recording("_record_semantics.py", str(SEED), str(DRAWS))
    left = [m for m in mismatches if _documented(m) is None]
    assert not left, left[:5]
    thin = {op: n for op, (n, _) in counts.items() if n < DRAWS // 3}
    assert not thin, thin  # the draws that reach a CuPy kernel (which needs a GPU) are skipped: not most of them
