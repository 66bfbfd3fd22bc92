"""Call the reductions, arg-reductions, scans and segment reductions at random, with no GPU, beside NumPy.

Run as a script in a process of its own (tests/test_semantics_fuzz.py does), over the fakes of
``_record_launches``: memory nothing reads, launches recorded and dropped. Each draw picks a shape (0-d, zero-size
and size-1 dimensions, up to 4-D), a layout (C, F, transposed, reversed, stepped, broadcast), a dtype and the op's
arguments (axis, keepdims, dtype, ddof, out), calls the op on a CuPy array and NumPy on a NumPy array of the same
shape, dtype and strides, and compares what the calls give, never values: whether each raises and of what class,
the result's shape, dtype and strides (NumPy's K order), whether ``out`` is the result, and that cukern returns a
CuPy array where NumPy may return a scalar. bfloat16 stands in NumPy's call as float16 (a draw that names
bfloat16 names no float16). A call that reaches one of CuPy's own kernels needs a GPU: it counts as skipped.

``python tests/_record_semantics.py SEED DRAWS`` pickles to stdout ``(counts, mismatches)``: per op, how many
draws were compared and how many skipped; each mismatch a dict of the op, the call and both answers.
"""

import pickle
import random
import sys
import warnings

import cupy
import numpy as np
from _record_launches import _install

import cukern
from cukern._dtypes import BFLOAT16

REALS = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "float32",
         "float64", "bfloat16")
DTYPES = REALS + ("complex64", "complex128")
SIZES = (0, 1, 1, 2, 3, 3, 5, 7)

SUMS = ("sum", "mean", "prod", "sum_of_squares", "norm", "nansum", "nanmean", "var", "std")
EXTREMES = ("amax", "amin", "nanmax", "nanmin")
TESTS = ("any", "all", "count_nonzero", "logsumexp")
ARGS = ("argmax", "argmin", "nanargmax", "nanargmin")
SCANS = ("cumsum", "cumprod")
SEGMENTS = ("segment_sum", "segment_max", "segment_min", "segment_mean")
OPS = SUMS + EXTREMES + TESTS + ARGS + SCANS + SEGMENTS
_UFUNC = {"amax": np.maximum, "amin": np.minimum, "nanmax": np.fmax, "nanmin": np.fmin}


def _np_dtype(name):
    return np.dtype(np.float16) if name == "bfloat16" else np.dtype(name)


def _cp_dtype(name):
    return BFLOAT16 if name == "bfloat16" else np.dtype(name)


def _shape(rng, ndim=None):
    ndim = rng.choice((0, 1, 1, 2, 2, 3, 3, 4)) if ndim is None else ndim
    return tuple(rng.choice(SIZES) for _ in range(ndim))


def _pair(rng, shape, name, layout=None):
    """(NumPy array, CuPy array) of ``shape`` and dtype ``name`` with the same strides, in a random layout:
    NumPy's view of a zero buffer, CuPy's the same view of an allocation as large."""
    nt = _np_dtype(name)
    layout = layout or rng.choice(("C", "C", "F", "transposed", "reversed", "stepped", "broadcast"))
    nd = len(shape)
    if layout == "F":
        a = np.zeros(shape, nt, order="F")
    elif layout == "transposed":
        perm = rng.sample(range(nd), nd)
        a = np.zeros(tuple(shape[p] for p in perm), nt).transpose(np.argsort(perm))
    elif layout == "reversed":
        a = np.zeros(shape, nt)[tuple(slice(None, None, rng.choice((1, -1))) for _ in shape) + (...,)]
    elif layout == "stepped":
        steps = [rng.choice((1, 2, 3, -2)) for _ in shape]
        a = np.zeros(tuple(n * abs(s) + 1 for n, s in zip(shape, steps)), nt)
        a = a[tuple(slice(1, 1 + n * s, s) if s > 0 else slice(n * -s, 0, s) for n, s in zip(shape, steps)) + (...,)]
    elif layout == "broadcast":  # writable, as CuPy's: an out like it is NumPy's to write, cukern's to refuse
        small = np.zeros(tuple(1 if rng.random() < 0.5 else n for n in shape), nt)
        a = np.lib.stride_tricks.as_strided(small, shape, tuple(0 if m == 1 else s for m, s in
                                                                zip(small.shape, small.strides)))
    else:
        a = np.zeros(shape, nt)
    assert a.shape == tuple(shape), (layout, a.shape, shape)
    base = a
    while base.base is not None:
        base = base.base
    offset = a.__array_interface__["data"][0] - base.__array_interface__["data"][0]
    buf = cupy.empty(max(base.nbytes, 1), np.uint8)
    c = cupy.ndarray(a.shape, _cp_dtype(name), memptr=buf.data + max(offset, 0), strides=a.strides)
    return a, c


def _axis(rng, nd):
    """An axis argument for an array of ``nd`` dimensions: mostly valid, sometimes not."""
    r = rng.random()
    if r < 0.2:
        return None
    if r < 0.45:
        return rng.randrange(-nd - 1, nd + 1) if nd else rng.choice((0, -1, 1))
    if r < 0.85:
        k = rng.randrange(0, nd + 1)
        t = rng.sample(range(-nd, nd), k) if nd else []
        return tuple(a if a < 0 or rng.random() < 0.5 else a - nd for a in t)  # mixed signs, distinct
    return rng.choice(((0, 0), (0, -nd) if nd else (0,), 1.0, [0], True, (nd,), np.int64(0), (np.int32(-1),)))


def _outcome(call, want_out):
    """``("raise", class name)``, ``("skip",)`` for a CUDA error (a CuPy kernel needs a GPU), or
    ``("ok", shape, dtype, strides in items of the dimensions longer than one (none for an empty result), out is
    the result, kind)``."""
    try:
        r = call()
    except Exception as err:  # noqa: BLE001 - a refusal is an answer too
        name = type(err).__name__
        if "CUDA" in name:
            return ("skip",)
        for cls in (np.exceptions.AxisError, TypeError, IndexError, ValueError, RuntimeError):
            if isinstance(err, cls):
                return ("raise", cls.__name__)
        return ("raise", name)
    kind = "cupy" if isinstance(r, cupy.ndarray) else "numpy" if isinstance(r, np.ndarray) else "scalar"
    r_arr = np.asarray(r) if kind == "scalar" else r
    dt = r_arr.dtype
    strides = tuple(s // dt.itemsize for n, s in zip(r_arr.shape, r_arr.strides) if n > 1 and r_arr.size)
    return ("ok", tuple(r_arr.shape), dt, strides, r is want_out if want_out is not None else None, kind)


def _kwargs(rng, op, nd, xname):
    """The op's keyword arguments but ``out``, as names NumPy's call and cukern's both read."""
    kw = {}
    if op in ARGS + SCANS:
        r = rng.random()
        kw["axis"] = None if r < 0.3 else rng.randrange(-nd - 1, nd + 1) if r < 0.9 else rng.choice(
            ((0,), 1.0, True, np.int64(0)))
    elif op not in SEGMENTS:
        kw["axis"] = _axis(rng, nd)
    if op not in SCANS + SEGMENTS and rng.random() < 0.4:
        kw["keepdims"] = True
    if op in SUMS + EXTREMES + SCANS and rng.random() < 0.35:
        kw["dtype"] = rng.choice(DTYPES)
    if op in ("var", "std") and rng.random() < 0.5:
        kw["ddof"] = rng.choice((0, 1, 2, 5, -1, 0.5, np.int64(1)))
    if "bfloat16" in (xname, kw.get("dtype")) and kw.get("dtype") == "float16":
        kw["dtype"] = "float32"
    return kw


def _numpy_call(op, a, kw, out):
    """NumPy's call for ``op`` (a rule of NumPy's own reductions where NumPy has no such function)."""
    kw = dict(kw)
    if "dtype" in kw:
        kw["dtype"] = _np_dtype(kw["dtype"])
    if out is not None:
        kw["out"] = out
    if op in ("sum", "mean", "prod", "nansum", "nanmean", "var", "std", "cumsum", "cumprod", "any", "all",
              "count_nonzero") + ARGS:
        return getattr(np, op)(a, **kw)
    if op == "sum_of_squares":  # np.sum(x * x): the sum's dtypes and layout
        if a.dtype.kind == "c":
            raise TypeError("complex")
        return np.sum(a, **kw)
    if op == "norm":  # sqrt(sum(|x|**2)): float64 for integers and bool, the parts' type for complex
        d = kw.pop("dtype", None)
        if d is not None and d.kind != "f":
            raise TypeError("a norm is real")
        d = d or (a.real.dtype if a.dtype.kind in "fc" else np.dtype(np.float64))
        return np.sum(a.real, dtype=d, **kw)
    if op == "logsumexp":  # scipy.special.logsumexp: x's float or complex dtype, float64 for integers and bool
        return np.sum(a, dtype=a.dtype if a.dtype.kind in "fc" else np.float64, **kw)
    if op in EXTREMES:
        if "dtype" in kw:
            return _UFUNC[op].reduce(a, **kw)
        return getattr(np, op)(a, **kw)
    raise AssertionError(op)


def _segments(rng, op):
    """A segment reduction's draw: (x pair, offsets pair, out pair or None, description)."""
    name = rng.choice(tuple(t for t in REALS if t != "bfloat16" or rng.random() < 0.5))
    shape = (rng.choice(SIZES),) + _shape(rng, rng.choice((0, 1, 2)))
    a, c = _pair(rng, shape, name)
    segs = rng.choice((0, 1, 3))
    _, offsets = _pair(rng, (segs + 1,), rng.choice(("int32", "int64")), "C")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sample = np.zeros((1,), a.dtype)
        if op == "segment_mean":
            want = np.mean(sample, axis=0).dtype if a.dtype.kind == "f" else np.dtype(np.float64)
        else:
            want = {"segment_sum": np.sum, "segment_max": np.max, "segment_min": np.min}[op](sample, axis=0).dtype
    if name == "bfloat16":
        want = BFLOAT16
    rshape = (segs,) + shape[1:]
    out = None
    if rng.random() < 0.3:
        good = rng.random() < 0.7
        oname = name if rng.random() < 0.2 else ("bfloat16" if want == BFLOAT16 else want.name)
        out = _pair(rng, rshape if good else _shape(rng), oname, rng.choice(("C", "F", "stepped")))
    return a, c, offsets, out, want, rshape


def _segment_expect(a, want, rshape, out):
    if out is not None:
        if out[1].shape != rshape or out[1].dtype != want:
            return ("raise", "ValueError" if out[1].shape != rshape else "TypeError")
        if out[1].size and any(s == 0 and n > 1 for n, s in zip(out[1].shape, out[1].strides)):
            return ("raise", "ValueError")
        return ("ok", rshape, want, None, True, "cupy")
    if a.ndim == 0:
        return ("raise", "ValueError")
    strides = tuple(s // 8 for n, s in zip(rshape, np.zeros(rshape).strides) if n > 1 and 0 not in rshape)
    return ("ok", rshape, want, strides, None, "cupy")


def _compare(np_answer, ck_answer, bf: bool, others=()):
    """Whether cukern's answer is NumPy's (a bfloat16 x or target read as float16 in NumPy's). Of several faults
    either may be found first: a refusal may also be the class NumPy raises without ``out`` or ``dtype``
    (``others``)."""
    if np_answer[0] != ck_answer[0]:
        return False
    if np_answer[0] == "raise":
        return ck_answer[1] == np_answer[1] or ck_answer[1] in others
    _, shape, dtype, strides, is_out, _ = np_answer
    _, cshape, cdtype, cstrides, c_is_out, ckind = ck_answer
    if bf and dtype == np.float16:
        dtype = BFLOAT16
    return (shape, dtype, is_out, ckind) == (cshape, cdtype, c_is_out, "cupy") and (
        is_out or strides is None or strides == cstrides)


def draw(rng, op):
    """One draw of ``op``: (description, NumPy's answer, cukern's answer, cukern's answer again: the call
    cache's). The description's ``others``: the classes NumPy raises without ``out``, ``dtype`` or both; its
    ``shape``, NumPy's result's without ``out`` (where ``out`` was given)."""
    if op in SEGMENTS:
        a, c, offsets, out, want, rshape = _segments(rng, op)
        expect = _segment_expect(a, want, rshape, out)
        call = lambda: getattr(cukern, op)(c, offsets, out=None if out is None else out[1], check_offsets=False)
        desc = {"op": op, "x": (a.shape, a.strides, str(c.dtype)), "segments": offsets.shape[0] - 1,
                "out": None if out is None else (out[1].shape, out[1].strides, str(out[1].dtype))}
        want_out = None if out is None else out[1]
        return desc, expect, _outcome(call, want_out), _outcome(call, want_out)
    names = DTYPES if op not in ARGS or rng.random() < 0.9 else REALS
    name = rng.choice(names)
    a, c = _pair(rng, _shape(rng), name)
    kw = _kwargs(rng, op, a.ndim, name)
    bf = name == "bfloat16" or kw.get("dtype") == "bfloat16"
    out = None
    if op != "count_nonzero" and rng.random() < 0.35:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                plain = np.asarray(_numpy_call(op, a, kw, None))
                shape, dt = plain.shape, plain.dtype
            except Exception:  # noqa: BLE001 - an out for a call that raises anyway
                shape, dt = _shape(rng), np.dtype(np.float64)
        if rng.random() < 0.2:
            shape = shape + (2,) if rng.random() < 0.5 else _shape(rng)
        if op in SCANS and not shape:
            shape = (2,)  # NumPy 2.4's cumsum and cumprod crash writing into a 0-d out
        oname = ("bfloat16" if bf and dt == np.float16 else dt.name) if rng.random() < 0.6 else rng.choice(
            tuple(t for t in DTYPES if not (bf and t == "float16")))
        bf = bf or oname == "bfloat16"
        out = _pair(rng, shape, oname, rng.choice(("C", "C", "F", "stepped", "reversed", "broadcast")))
    np_out, ck_out = (None, None) if out is None else out
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expect = _outcome(lambda: _numpy_call(op, a, kw, np_out), np_out)
        bare = {k: v for k, v in kw.items() if k != "dtype"}
        answers = [_outcome(lambda: _numpy_call(op, a, k, o), o) for k, o in ((kw, None), (bare, np_out), (bare, None))]
        others = {r[1] for r in answers if r[0] == "raise"}
        call = lambda: getattr(cukern, op)(c, **kw, **({} if ck_out is None else {"out": ck_out}))
        got, again = _outcome(call, ck_out), _outcome(call, ck_out)
    desc = {"op": op, "x": (a.shape, a.strides, name), "bfloat16": bf,
            "kw": {k: (v if k != "dtype" else str(v)) for k, v in kw.items()},
            "out": None if out is None else (ck_out.shape, ck_out.strides, str(ck_out.dtype)), "others": others,
            "shape": answers[0][1] if out is not None and answers[0][0] == "ok" else None}
    return desc, expect, got, again


def main(seed: int, draws: int):
    _install()
    warnings.simplefilter("ignore")
    rng = random.Random(seed)
    counts, mismatches = {}, []
    for op in OPS:
        compared = skipped = 0
        for _ in range(draws):
            desc, expect, got, again = draw(rng, op)
            if got[0] == "skip" or expect[0] == "skip":
                skipped += 1
                continue
            compared += 1
            if not _compare(expect, got, desc.get("bfloat16"), desc.get("others", ())) or got != again:
                mismatches.append({**desc, "numpy": expect, "cukern": got, "again": again})
        counts[op] = (compared, skipped)
    pickle.dump((counts, mismatches), sys.stdout.buffer)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
