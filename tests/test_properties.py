"""Properties every public op keeps on random shapes, dtypes and memory layouts.

Each GPU property draws a case (shape, dtype, views with padding, a one-element misalignment, negative
strides, stride-0 broadcasts as inputs, ``out=`` fresh, in place or into a padded view), runs the op on
flat allocations and checks, against the float64 references in :mod:`cukern.reference`:

* the result is close under the one closeness rule (:func:`_support.assert_close`), integers exactly;
* every allocation is bit-identical afterwards outside the views the op writes (inputs untouched, padding
  and neighbours of an output untouched);
* a rerun from the same memory state gives bit-identical memory and results.

Derandomized, and sized to stay under two minutes of the GPU job, first compilations included. The CPU
properties exercise what runs before any GPU is touched: host objects refused by name, axis
normalization against NumPy's, and ``rope_cache``'s argument checks.
"""

from __future__ import annotations

import contextlib
import math
import operator
import warnings
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import cukern
from cukern import reduce_plan, reference
from cukern._dtypes import BFLOAT16

from _support import assert_close

F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
I32, I64, BOOL = np.dtype(np.int32), np.dtype(np.int64), np.dtype(np.bool_)
FLOATS = (F32, F16, BFLOAT16)
ALL = (F32, F64, F16, BFLOAT16, I32, I64, BOOL)

# Row lengths: empty, tiny, primes, vector multiples and not, both rms_norm kernels (up to ~70000).
WIDTHS = (0, 1, 2, 3, 7, 8, 13, 31, 64, 127, 257, 1000, 1031, 4096, 4099, 8191, 65537, 69632)
LEAD = (0, 1, 2, 3, 5)
MAX_ELEMENTS = 1 << 20


def _settings(examples: int):
    return settings(derandomize=True, max_examples=examples, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# ---------------------------------------------------------------------------------------------------------
# Memory layouts.


@dataclass(frozen=True)
class View:
    """Where a logical array of ``shape`` sits in a flat allocation: skip ``shift`` elements (1: misaligned
    by one element), view the rest as ``base``, take ``index`` (slices, maybe reversed), then broadcast
    size-1 dimensions to ``shape`` when ``broadcast``. :meth:`of` applies the same steps to a device buffer
    or to a host copy of it, so a host copy shows exactly what the op saw."""

    shape: tuple
    base: tuple
    index: tuple = ()
    shift: int = 0
    broadcast: bool = False

    @property
    def size(self) -> int:
        return math.prod(self.base) + self.shift

    def of(self, buf):
        import cupy

        a = buf[self.shift:].reshape(self.base)
        if self.index:  # (NumPy's a[()] of a 0-d array is a scalar, not a view)
            a = a[self.index]
        if self.broadcast:
            return cupy.get_array_module(buf).broadcast_to(a, self.shape)
        return a if a.shape == self.shape else a.reshape(self.shape)  # a 0-d array cut from a (1,) slice


def plain(shape) -> View:
    return View(tuple(shape), tuple(shape))


def _cut(start: int, n: int, flip: bool) -> slice:
    if flip and n:
        return slice(start + n - 1, start - 1 if start else None, -1)
    return slice(start, start + n)


@st.composite
def views(draw, shape, reversible=(), broadcastable=()):
    """A :class:`View` of ``shape``: plain, offset by one element, padded (every dimension may be, the last
    always is), reversed along some of ``reversible``, or broadcast along some of ``broadcastable``."""
    shape = tuple(shape)
    kinds = ["plain", "offset", "padded", "reversed"] + (["broadcast"] if broadcastable else [])
    kind = draw(st.sampled_from(kinds))
    if kind == "plain":
        return plain(shape)
    shift = 1 if kind == "offset" else draw(st.integers(0, 1))
    if kind == "offset":
        return View(shape, shape, shift=1)
    if kind == "broadcast":
        dims = draw(st.sets(st.sampled_from(sorted(broadcastable)), min_size=1))
        return View(shape, tuple(1 if i in dims else n for i, n in enumerate(shape)), shift=shift, broadcast=True)
    cells = shape or (1,)  # a 0-d array is cut from a padded 1-D allocation
    pads = [draw(st.integers(0, 2)) for _ in cells]
    if kind == "padded":
        pads[-1] = max(pads[-1], 1)
    starts = [draw(st.integers(0, p)) for p in pads]
    flip = set()
    if kind == "reversed" and reversible:
        flip = draw(st.sets(st.sampled_from(sorted(reversible)), min_size=1))
    index = tuple(_cut(s, n, i in flip) for i, (s, n) in enumerate(zip(starts, cells)))
    return View(shape, tuple(n + p for n, p in zip(cells, pads)), index, shift)


@st.composite
def row_shapes(draw, max_lead: int = 3):
    """``lead + (width,)``: up to ``max_lead`` leading dimensions, at most MAX_ELEMENTS elements."""
    width = draw(st.sampled_from(WIDTHS))
    lead = draw(st.lists(st.sampled_from(LEAD), max_size=max_lead))
    while math.prod(lead) * width > MAX_ELEMENTS:
        i = lead.index(max(lead))
        lead[i] //= 2
    return tuple(lead) + (width,)


def _values(rng, n: int, dtype, fill: str):
    """``n`` host values of ``dtype``: "normal", "positive" ([0.5, 1.5)), or "sentinel" (random bytes, NaNs
    and all, for memory an op should overwrite or leave alone). Integers in [-100, 100]."""
    dtype = np.dtype(dtype)
    if fill == "sentinel":
        return rng.integers(0, 256, n * dtype.itemsize, dtype=np.uint8).view(dtype)
    if dtype == BOOL:
        return rng.random(n) < 0.5
    if dtype.kind == "i":
        return rng.integers(-100, 101, n).astype(dtype)
    v = rng.random(n) + 0.5 if fill == "positive" else rng.standard_normal(n)
    return v.astype(dtype)


class Memory:
    """Every allocation one call sees: flat device buffers and named views into them, some written.

    :meth:`settle` runs the call, checks that nothing changed outside the written views, restores the
    memory and runs it again, requiring bit-identical memory and results."""

    def __init__(self, rng):
        self.rng = rng
        self.bufs: dict = {}
        self.views: dict = {}  # view name -> (buffer name, View)
        self.written: set = set()

    def put(self, name: str, view: View, dtype, fill: str = "normal", *, written: bool = False):
        import cupy

        self.bufs[name] = cupy.asarray(_values(self.rng, view.size, dtype, fill))
        return self.alias(name, name, view, written=written)

    def alias(self, name: str, buf: str, view: View, *, written: bool = False):
        self.views[name] = (buf, view)
        if written:
            self.written.add(name)
        return view.of(self.bufs[buf])

    def snapshot(self) -> dict:
        import cupy

        return {n: cupy.asnumpy(b) for n, b in self.bufs.items()}

    def host(self, name: str, snap: dict):
        """View ``name`` in a host snapshot."""
        buf, view = self.views[name]
        return view.of(snap[buf])

    def settle(self, call):
        """``(before, after, result, returned)``: host snapshots around the call, the result on the host and
        the object the first call returned."""
        import cupy

        before = self.snapshot()
        returned = call()
        after = self.snapshot()
        result = None if returned is None else cupy.asnumpy(returned)
        for name in self.bufs:
            expected = before[name].copy()
            for v, (b, view) in self.views.items():
                if b == name and v in self.written:
                    view.of(expected)[...] = view.of(after[name])
            assert _bits(after[name]) == _bits(expected), f"{name}: bytes changed outside what the op writes"
        for name, buf in self.bufs.items():
            buf.set(before[name])
        again = call()
        for name, snap in self.snapshot().items():
            assert _bits(snap) == _bits(after[name]), f"{name}: a rerun wrote different bits"
        if returned is not None:
            assert _bits(cupy.asnumpy(again)) == _bits(result), "a rerun returned different bits"
        return before, after, result, returned


def _bits(a) -> bytes:
    return np.ascontiguousarray(a).view(np.uint8).tobytes()


@contextlib.contextmanager
def _quiet():
    """Reference computations may divide by zero counts or overflow a half type, as NumPy warns."""
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        yield


# ---------------------------------------------------------------------------------------------------------
# RMSNorm.


def _weight_and_out(d, mem, shape, dtype, x, x_view):
    """Draw the weight (none, x's dtype or float32; plain, offset or padded) and ``out`` (none, fresh, x
    itself unless x is a broadcast, or a padded view), put them in ``mem``; return (weight, out)."""
    wkind = d(st.sampled_from(["none", "same", "float32"]))
    w = None
    if wkind != "none":
        w = mem.put("weight", d(views(shape[-1:])), dtype if wkind == "same" else F32)
    outk = d(st.sampled_from(["none", "fresh", "x", "view"]))
    if outk == "x" and x_view.broadcast:
        outk = "fresh"
    out = None
    if outk == "fresh":
        out = mem.put("out", plain(shape), dtype, "sentinel", written=True)
    elif outk == "view":
        out = mem.put("out", d(views(shape, reversible=range(len(shape) - 1))), dtype, "sentinel", written=True)
    elif outk == "x":
        mem.written.add("x")
        out = x
    return w, out


@pytest.mark.gpu
@_settings(30)
@given(st.data())
def test_rms_norm_properties(data):
    d = data.draw
    dtype = d(st.sampled_from(FLOATS))
    shape = d(row_shapes())
    lead = range(len(shape) - 1)
    mem = Memory(np.random.default_rng(d(st.integers(0, 2**32 - 1))))
    x_view = d(views(shape, reversible=lead, broadcastable=lead))
    x = mem.put("x", x_view, dtype)
    w, out = _weight_and_out(d, mem, shape, dtype, x, x_view)
    eps, offset = d(st.sampled_from([1e-6, 1e-5, 0.5])), d(st.sampled_from([0.0, 1.0]))

    before, after, got, returned = mem.settle(lambda: cukern.rms_norm(x, w, eps, offset=offset, out=out))
    if out is not None:
        assert returned is out
    with _quiet():
        ref = reference.rms_norm(mem.host("x", before), None if w is None else mem.host("weight", before), eps,
                                 offset)
    assert_close(got, ref, dtype, terms=max(shape[-1], 1))


@pytest.mark.gpu
@_settings(25)
@given(st.data())
def test_fused_add_rms_norm_properties(data):
    d = data.draw
    dtype = d(st.sampled_from(FLOATS))
    shape = d(row_shapes())
    lead = range(len(shape) - 1)
    mem = Memory(np.random.default_rng(d(st.integers(0, 2**32 - 1))))
    x_view = d(views(shape, reversible=lead, broadcastable=lead))
    x = mem.put("x", x_view, dtype)
    r = mem.put("residual", d(views(shape, reversible=lead)), dtype, written=True)
    w, out = _weight_and_out(d, mem, shape, dtype, x, x_view)
    eps, offset = d(st.sampled_from([1e-6, 0.5])), d(st.sampled_from([0.0, 1.0]))

    before, after, got, returned = mem.settle(
        lambda: cukern.fused_add_rms_norm(x, r, w, eps, offset=offset, out=out))
    if out is not None:
        assert returned is out
    with _quiet():
        want_r, ref = reference.fused_add_rms_norm(
            mem.host("x", before), mem.host("residual", before),
            None if w is None else mem.host("weight", before), eps, offset)
    new_r = mem.host("residual", after)
    assert np.array_equal(new_r.astype(F64), want_r.astype(F64)), "residual must be x + residual rounded once"
    assert_close(got, ref, dtype, terms=max(shape[-1], 1))


# ---------------------------------------------------------------------------------------------------------
# Rotary embedding.


@pytest.mark.gpu
@_settings(40)
@given(st.data())
def test_rotary_embedding_properties(data):
    import cupy

    d = data.draw
    dtype = d(st.sampled_from(FLOATS))
    cache_dtype = d(st.sampled_from([F32, dtype]))
    tokens = d(st.sampled_from([0, 1, 2, 3, 7, 16, 33]))
    head_size = d(st.sampled_from([2, 6, 7, 16, 64, 80, 128, 256]))
    rot = 2 * d(st.integers(1, head_size // 2))
    width = rot + 2 * d(st.integers(0, 2))
    rotary_dim = None if width == rot and d(st.booleans()) else rot
    nh, nkv = d(st.integers(0, 6)), d(st.integers(0, 3))
    layout = d(st.sampled_from(["separate", "fused", "no key"]))
    is_neox, inverse, check = d(st.booleans()), d(st.booleans()), d(st.booleans())
    max_pos = d(st.sampled_from([1, 5, 64, 300]))
    rng = np.random.default_rng(d(st.integers(0, 2**32 - 1)))
    mem = Memory(rng)

    tq = (0, 1)
    if layout == "fused":  # q and k side by side in one [tokens, heads, head_size] buffer, maybe padded
        pad_heads, pad_dim, shift = d(st.integers(0, 2)), d(st.integers(0, 3)), d(st.integers(0, 1))
        base = (tokens, nh + nkv + pad_heads, head_size + pad_dim)
        flip = d(st.booleans())
        q_view = View((tokens, nh, head_size), base, (_cut(0, tokens, flip), slice(0, nh), slice(0, head_size)), shift)
        k_view = View((tokens, nkv, head_size), base, (_cut(0, tokens, flip), slice(nh, nh + nkv),
                                                       slice(0, head_size)), shift)
        q = mem.put("query", q_view, dtype, written=True)
        k = mem.alias("key", "query", k_view, written=True)
    else:
        q = mem.put("query", d(views((tokens, nh, head_size), reversible=tq)), dtype, written=True)
        k = None
        if layout == "separate":
            k = mem.put("key", d(views((tokens, nkv, head_size), reversible=tq)), dtype, written=True)
    cache = mem.put("cache", d(views((max_pos, width), reversible=(0,), broadcastable=(0,))), cache_dtype)
    pos_view = d(views((tokens,), reversible=(0,), broadcastable=(0,)))
    pos_dtype = d(st.sampled_from([I32, I64]))
    positions = mem.put("positions", pos_view, pos_dtype)
    lo, hi = (0, max_pos) if check else (-3, max_pos + 3)  # unchecked: some tokens out of range
    mem.bufs["positions"][...] = cupy.asarray(rng.integers(lo, hi, mem.bufs["positions"].size).astype(pos_dtype))

    def call():
        return cukern.rotary_embedding(positions, q, k, cache, is_neox=is_neox, rotary_dim=rotary_dim,
                                       inverse=inverse, check_positions=check)

    before, after, _, _ = mem.settle(call)
    pos = mem.host("positions", before)
    has_key = k is not None
    q_ref, k_ref = reference.rotary_embedding(pos, mem.host("query", before),
                                              mem.host("key", before) if has_key else None,
                                              mem.host("cache", before), is_neox, rot, inverse)
    names = ["query"] + (["key"] if has_key else [])
    for name, ref in zip(names, (q_ref, k_ref)):
        got, was = mem.host(name, after), mem.host(name, before)
        assert_close(got, ref, dtype)
        assert _bits(got[..., rot:]) == _bits(was[..., rot:]), f"{name}: elements past rotary_dim changed"
        outside = (pos < 0) | (pos >= max_pos)
        assert _bits(got[outside]) == _bits(was[outside]), f"{name}: a token outside the cache was rotated"

    # Bitwise independent of layout, alignment and so vector width: the same values, contiguous.
    fresh = {n: cupy.asarray(np.ascontiguousarray(mem.host(n, before))) for n in ["positions", "cache"] + names}
    cukern.rotary_embedding(fresh["positions"], fresh["query"], fresh.get("key"), fresh["cache"], is_neox=is_neox,
                            rotary_dim=rotary_dim, inverse=inverse, check_positions=check)
    for name in names:
        assert _bits(cupy.asnumpy(fresh[name])) == _bits(mem.host(name, after)), f"{name} depends on the layout"


# ---------------------------------------------------------------------------------------------------------
# Reductions.

REDUCTIONS = {
    "sum": (cukern.sum, reference.reduce_sum, ALL),
    "mean": (cukern.mean, reference.reduce_mean, ALL),
    "sum_of_squares": (cukern.sum_of_squares, reference.reduce_sum_of_squares, ALL[:-1]),
    "norm": (cukern.norm, reference.reduce_norm, ALL[:-1]),
    "amax": (cukern.amax, reference.reduce_amax, ALL[:-1]),
    "amin": (cukern.amin, reference.reduce_amin, ALL[:-1]),
}


def _result_dtype(name: str, t, requested):
    """NumPy's result dtype rule, as the reductions document it."""
    if requested is not None:
        return np.dtype(requested)
    if name in ("amax", "amin") or t in FLOATS + (F64,):
        return t
    return I64 if name in ("sum", "sum_of_squares") else F64


@st.composite
def axes(draw, ndim: int):
    """None, one axis or a tuple of distinct axes (any order, either sign, maybe empty)."""
    form = draw(st.sampled_from(["none", "int", "tuple"] if ndim else ["none", "tuple"]))
    if form == "none":
        return None
    if form == "int":
        return draw(st.integers(-ndim, ndim - 1))
    chosen = draw(st.permutations(list(range(ndim))))[:draw(st.integers(0, ndim))]
    return tuple(a - ndim if draw(st.booleans()) else a for a in chosen)


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(REDUCTIONS))
@_settings(14)
@given(data=st.data())
def test_reduction_properties(name, data):
    import cupy

    fn, ref_fn, dtypes = REDUCTIONS[name]
    d = data.draw
    t = d(st.sampled_from(dtypes))
    shape = () if d(st.integers(0, 9)) == 0 else d(row_shapes())
    every = range(len(shape))
    mem = Memory(np.random.default_rng(d(st.integers(0, 2**32 - 1))))
    fill = "normal" if name in ("amax", "amin") else "positive"  # sums of one sign: no cancellation
    x = mem.put("x", d(views(shape, reversible=every, broadcastable=every)), t, fill)
    axis, keepdims = d(axes(len(shape))), d(st.booleans())
    requested = d(st.sampled_from([None, F64]))
    want = _result_dtype(name, t, requested)
    reduced = range(len(shape)) if axis is None else {a % len(shape) for a in np.atleast_1d(axis).tolist()}
    count = math.prod(shape[i] for i in reduced)
    result_shape = np.sum(np.empty(shape, np.int8), axis=axis, keepdims=keepdims).shape
    outk = d(st.sampled_from(["none", "fresh", "view"]))
    out = None
    if outk == "fresh":
        out = mem.put("out", plain(result_shape), want, "sentinel", written=True)
    elif outk == "view":
        out = mem.put("out", d(views(result_shape, reversible=range(len(result_shape)))), want, "sentinel",
                      written=True)

    def call():
        return fn(x, axis=axis, dtype=requested, keepdims=keepdims, out=out)

    if count == 0 and name in ("amax", "amin"):
        before = mem.snapshot()
        with pytest.raises(ValueError, match="zero-size"):
            call()
        assert all(_bits(s) == _bits(before[n]) for n, s in mem.snapshot().items())
        return
    before, after, got, returned = mem.settle(call)
    if out is not None:
        assert returned is out
    assert got.dtype == want, (got.dtype, want)
    with _quiet():
        ref = np.asarray(ref_fn(mem.host("x", before), axis=axis, keepdims=keepdims))
        assert got.shape == ref.shape == result_shape
        if name in ("amax", "amin") or want.kind in "biu":
            wide = I64 if want.kind in "biu" else F64
            assert np.array_equal(got.astype(wide), ref.astype(want).astype(wide))
        else:  # rounded to the result dtype first: a half-type sum past its range is inf, as in NumPy
            assert_close(got, ref.astype(want), want, terms=max(count, 1))
    cupy.cuda.Device().synchronize()


# ---------------------------------------------------------------------------------------------------------
# CPU: what is refused before any GPU is touched.

# Every argument given the same host object: the error names the first one checked (either of two for
# fused_add_rms_norm, whose residual may be checked first).
_FIRST_ARGUMENT = {
    "rms_norm": (cukern.rms_norm, "x"),
    "fused_add_rms_norm": (lambda a: cukern.fused_add_rms_norm(a, a), "(x|residual)"),
    "rotary_embedding": (lambda a: cukern.rotary_embedding(a, a, a, a), "positions"),
    **{n: (fn, "x") for n, (fn, _, _) in REDUCTIONS.items()},
}

host_objects = st.one_of(
    hnp.arrays(st.sampled_from([F32, F16, F64, I32, BOOL, np.dtype(np.uint8), np.dtype(np.complex64)]),
               hnp.array_shapes(min_dims=0, max_dims=3, max_side=4)),
    st.lists(st.floats(allow_nan=False), max_size=4),
    st.tuples(st.integers()),
    st.none(), st.integers(), st.floats(), st.text(max_size=3), st.just(np.float32(1.0)),
)


@pytest.mark.parametrize("op", list(_FIRST_ARGUMENT))
@_settings(20)
@given(obj=host_objects)
def test_host_objects_are_refused_by_name(op, obj):
    call, name = _FIRST_ARGUMENT[op]
    snapshot = obj.copy() if isinstance(obj, np.ndarray) else None
    with pytest.raises(TypeError, match=rf"\b{name}\b") as err:
        call(obj)
    assert "\n" not in str(err.value)
    if snapshot is not None:
        assert _bits(obj) == _bits(snapshot)


axis_values = st.one_of(
    st.none(), st.integers(-8, 8), st.lists(st.integers(-8, 8), max_size=4).map(tuple),
    st.integers(-8, 8).map(np.int64), st.booleans(), st.floats(-3, 3), st.lists(st.integers(-3, 3), max_size=2),
    st.tuples(st.integers(0, 2), st.booleans()), st.text(max_size=2),
)


@_settings(200)
@given(ndim=st.integers(0, 6), axis=axis_values)
def test_axis_normalization_matches_numpy(ndim, axis):
    """The reductions read ``axis`` as NumPy does (sorted, distinct; an int 0 or -1 of a 0-d array as no axis),
    except that bools, lists and other non-integers are refused with TypeError rather than read as integers or
    sequences."""
    array_utils = pytest.importorskip("numpy.lib.array_utils")
    normalize = reduce_plan.normalize_axis
    items = axis if isinstance(axis, tuple) else (axis,)
    integer = [isinstance(a, (int, np.integer)) and not isinstance(a, (bool, np.bool_)) for a in items]
    if axis is not None and not all(integer):
        # a tuple mixing integers with other items may fail on an integer first (out of range)
        with pytest.raises(TypeError if not any(integer) else (TypeError, ValueError), match="axis") as err:
            normalize(axis, ndim)
        assert "\n" not in str(err.value)
        return
    if axis is None:
        assert normalize(axis, ndim) == tuple(range(ndim))
        return
    if ndim == 0 and not isinstance(axis, tuple) and axis in (0, -1):
        assert normalize(axis, ndim) == ()  # as NumPy's ufunc reductions read it
        return
    try:
        want = tuple(sorted(array_utils.normalize_axis_tuple(tuple(operator.index(a) for a in items), ndim)))
    except (ValueError, TypeError) as numpy_err:  # AxisError is a ValueError
        with pytest.raises(type(numpy_err)) as err:
            normalize(axis, ndim)
        assert "\n" not in str(err.value) and "axis" in str(err.value)
        return
    assert normalize(axis, ndim) == want


_ROPE_VALID = {"max_position": 16, "rotary_dim": 8, "base": 10000.0, "dtype": F32}
_ROPE_BAD = [
    ("max_position", ValueError, st.integers(-5, 0)),
    ("max_position", TypeError, st.sampled_from([8.0, 8.5, None, "8"])),
    ("rotary_dim", ValueError, st.sampled_from([-2, 0, 1, 3, 7, 129])),
    ("base", ValueError, st.sampled_from([1.0, 0.5, 0.0, -2.0, float("nan")])),
    ("dtype", TypeError, st.sampled_from([np.int32, np.float64, np.bool_, np.uint8])),
]


@pytest.mark.parametrize("name, exc, values", _ROPE_BAD, ids=[f"{n}-{e.__name__}" for n, e, _ in _ROPE_BAD])
@_settings(6)
@given(data=st.data())
def test_rope_cache_refuses_bad_arguments_before_the_gpu(name, exc, values, data):
    """One bad argument at a time: the error is raised before anything is uploaded, and names it."""
    kwargs = dict(_ROPE_VALID, **{name: data.draw(values)})
    with pytest.raises(exc, match=name) as err:
        cukern.rope_cache(kwargs.pop("max_position"), kwargs.pop("rotary_dim"), **kwargs)
    assert "\n" not in str(err.value)
