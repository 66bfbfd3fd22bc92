"""var and std: one pass, (count, mean, M2) of shifted values merged by Chan's formula; emulators against
float64 and NumPy, planning and validation (CPU), bits against the emulator (GPU)."""

import math
import warnings

import numpy as np
import pytest
from _support import ARCHS, assert_close, compiled, ptxas_ran, same_bits

from cukern import reference
from cukern.reference import reductions as tree
from cukern import reduce as R
from cukern import reduce_plan as P
from cukern._dtypes import BFLOAT16, dtype_name


# ---------------------------------------------------------------------------------------------------------
# var and std: one pass, (count, mean, M2) of shifted values merged by Chan's formula.


VAR_DTYPES = (np.float32, np.float64, np.float16, BFLOAT16, np.int32, np.int64, np.bool_)


def _var_data(rng, shape, dtype):
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.random(shape) < 0.7
    if dtype.kind == "i":
        return rng.integers(-1000, 1000, shape).astype(dtype)
    return (3.0 + rng.standard_normal(shape)).astype(dtype)


@pytest.mark.parametrize("dtype", VAR_DTYPES, ids=dtype_name)
def test_var_std_emulators_against_float64(dtype):
    rng = np.random.default_rng(14)
    for shape, axis in (((1000,), None), ((37, 301), 1), ((301, 37), 0), ((5, 6, 7), (0, 2)), ((4, 999), -1)):
        x = _var_data(rng, shape, dtype)
        for ddof in (0, 1, 2.5):
            for name, emu, ref in (("var", reference.var_emulated, reference.reduce_var),
                                   ("std", reference.std_emulated, reference.reduce_std)):
                got = emu(x, axis=axis, ddof=ddof)
                want = ref(x, axis=axis, ddof=ddof)
                assert got.dtype == P.default_dtype(name, x.dtype)
                terms = math.prod(shape) // max(1, want.size)
                assert_close(got, want, terms=terms)


@pytest.mark.parametrize("n", [7, 255, 257, 1000, 4097, 4099, 100003, 2**20 + 3])
def test_var_float32_offset_accuracy(n):
    """Mean 1e4, standard deviation 1: the naive sum-of-squares form loses every digit in float32; the
    shifted one-pass tree keeps the relative error within 1e-6 of the float64 two-pass variance."""
    rng = np.random.default_rng(n)
    x = (1e4 + rng.standard_normal(n)).astype(np.float32)
    want = reference.reduce_var(x)
    got = float(reference.var_emulated(x))
    assert abs(got - want) <= 1e-6 * want
    assert abs(float(reference.std_emulated(x, ddof=1)) - reference.reduce_std(x, ddof=1)) <= 1e-6 * want


def test_var_edge_values_match_numpy():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for x, ddof in ((np.array([5.0], np.float32), 0), (np.array([5.0], np.float32), 1),
                        (np.array([1.0, 2.0], np.float32), 2), (np.array([1.0, 2.0], np.float32), 3),
                        (np.array([1.0, np.nan, 2.0], np.float32), 0),
                        (np.array([1.0, np.inf, 2.0], np.float32), 0), (np.array([np.inf, np.inf]), 0),
                        (np.zeros((3, 0), np.float32), 0), (np.full(300, 7.0), 0)):
            want = np.var(x.astype(np.float64), ddof=ddof)
            got = reference.var_emulated(x, ddof=ddof)
            assert np.array_equal(np.isnan(got), np.isnan(want)) and (np.isnan(want) or got == want), (x, ddof)
    assert reference.var_emulated(np.full(1000, -3.25, np.float32)) == 0  # a constant slice is exactly 0


def test_chan_merge_is_commutative_and_exact_with_the_identity():
    rng = np.random.default_rng(3)
    k = 4096
    for dt in (np.float32, np.float64):
        # Counts from 1: an empty state in the tree is always the identity (0, 0, 0).
        a = (rng.integers(1, 5, k).astype(dt), rng.standard_normal(k).astype(dt), rng.random(k).astype(dt))
        b = (rng.integers(1, 5, k).astype(dt), rng.standard_normal(k).astype(dt), rng.random(k).astype(dt))
        b[1][:64] = a[1][:64]  # ties in count and mean
        with np.errstate(all="ignore"):
            ab, ba = tree._chan(a, b), tree._chan(b, a)
        for u, v in zip(ab, ba):
            assert u.tobytes() == v.tobytes()
        zero = tuple(np.zeros(k, dt) for _ in range(3))
        for u, v, w in zip(tree._chan(a, zero), tree._chan(zero, a), a):
            assert u.tobytes() == v.tobytes() == w.tobytes()


def test_var_emulator_is_one_tree_whatever_the_layout():
    """The emulator numbers elements in C order over the reduced axes; any view of the same values gives
    the same bits (the kernels' contract)."""
    rng = np.random.default_rng(5)
    x = _var_data(rng, (33, 517), np.float32)
    a = reference.var_emulated(x, axis=1)
    b = reference.var_emulated(np.asfortranarray(x), axis=1)
    c = np.array([reference.var_emulated(x[i]) for i in range(33)])
    assert a.tobytes() == b.tobytes() == c.tobytes()


def test_var_planning_dtypes_and_instantiations():
    assert P.result_dtype("var", np.float16) == np.float16
    assert P.result_dtype("std", np.int32) == np.float64
    assert P.result_dtype("var", np.bool_) == np.float64
    assert P.result_dtype("var", np.float32, np.float64) == np.float64  # x converted first, as NumPy computes
    assert P.route("std", np.float32, np.float64) == P.Route("std", "cast", np.float64, np.float64)
    with pytest.raises(TypeError, match="dtype=int32 is not supported for var"):
        P.result_dtype("var", np.float32, np.int32)
    assert P.state_itemsize(P.OP_VAR, np.float32) == 12 and P.state_itemsize(P.OP_VAR, np.float64) == 24
    assert P.col_vector_width(4, 12) == 1 and P.col_vector_width(2, 24) == 1
    insts = set(P.instantiations())
    # Every layout's launches for var and std are in the table, two-pass columns included.
    for shape, axis in (((1 << 20,), None), ((64, 4096), 1), ((1 << 18, 8), 0), ((300, 40), 0),
                        ((7, 9, 11), (0, 2)), ((9, 8, 7, 6), (1, 3))):
        for t in (np.float32, np.float16, np.float64, np.int32, np.bool_):
            pl = P.plan(shape, t, axis, op="var", knobs=P.VAR_KNOBS)
            o = P.default_dtype("var", t)
            if pl.fold is not None:
                assert pl.partials == P.cols_geometry(pl.layout)[0] * pl.kernel.spans * shape[1] * P.state_itemsize(
                    P.OP_VAR, o)
            for inst in P.plan_instantiations(pl, t, o, P.OP_VAR):
                assert inst in insts, inst
    assert len([i for i in insts if i.args[2] == P.OP_VAR]) <= 64


def test_ddof_validation():
    for bad, err in (("1", TypeError), (True, TypeError), (None, TypeError), (float("nan"), ValueError),
                     (float("inf"), ValueError)):
        with pytest.raises(err, match="ddof must be"):
            R._check_ddof(bad)
    for good in (0, 1, 2.5, np.int64(3), np.float32(0.5)):
        R._check_ddof(good)


@pytest.mark.gpu
def test_var_bad_input_raises_before_launch():
    import cupy

    x = cupy.ones((4, 5), np.float32)
    with pytest.raises(TypeError, match="ddof must be an int or a float"):
        R.var(x, ddof="1")
    with pytest.raises(TypeError, match="ddof must be an int or a float"):
        R.std(x, ddof=True)
    with pytest.raises(ValueError, match="ddof must be finite"):
        R.var(x, ddof=float("nan"))
    with pytest.raises(TypeError, match="dtype=int64 is not supported for std"):
        R.std(x, dtype=np.int64)
    with pytest.raises(np.exceptions.AxisError):
        R.var(x, axis=2)
    with pytest.raises(ValueError, match="shape"):
        R.std(x, axis=0, out=cupy.empty(4, np.float32))
    with pytest.raises(TypeError, match="dtype=float64 is not supported for var of complex64"):
        R.var(cupy.ones(3, np.complex64), dtype=np.float64)
    assert float(x.sum()) == 20  # untouched


@pytest.mark.nvrtc(P.SOURCE)
def test_var_kernels_compile_without_local_memory():
    comp = compiled(P.SOURCE, ARCHS[0])
    res = comp.resources()
    var = [i for i in P.instantiations() if i.args[2] == P.OP_VAR]
    assert var
    for inst in var if ptxas_ran(comp) else ():  # else .ci/run checks the machine code
        r = res[comp.lowered[inst.expression]]
        assert r.get("stack", 0) == 0 and r.get("spill_stores", 0) == 0, inst.expression
    # Correctly rounded steps only: no fused multiply-add in the Chan merge.
    ptx = comp.kernel_ptx(next(i for i in var if i.name == "reduce_full" and i.args[0] == np.float32))
    assert "fma.rn.f32" not in ptx and "div.rn.f32" in ptx


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", VAR_DTYPES, ids=dtype_name)
def test_var_std_bits_match_the_emulator(dtype):
    import cupy

    rng = np.random.default_rng(41)
    for shape, axis in (((100003,), None), ((33, 4099), 1), ((5000, 33), 0), ((4099, 3), 0), ((6, 7, 65), (0, 2)),
                        ((8, 9, 10, 11), (1, 3)), ((17, 1), 1), ((0, 5), 0)):
        xh = _var_data(rng, shape, dtype)
        x = cupy.asarray(xh)
        for name in ("var", "std"):
            for ddof in (0, 1):
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    got = getattr(R, name)(x, axis=axis, ddof=ddof)
                    want = getattr(reference, f"{name}_emulated")(xh, axis=axis, ddof=ddof)
                assert same_bits(got, want), (name, shape, axis, ddof)
        # The same bits for another SM count, other knobs and a strided (negative-stride) view of the values.
        v = R._reduce("var", x, axis, None, False, None, knobs=P.DEFAULT_KNOBS, sm=7)
        assert same_bits(v, reference.var_emulated(xh, axis=axis))
        flipped = cupy.asarray(xh[::-1].copy())[::-1]
        assert same_bits(R.var(flipped, axis=axis), reference.var_emulated(xh, axis=axis))


@pytest.mark.gpu
def test_var_float32_offset_accuracy_on_the_gpu():
    import cupy

    rng = np.random.default_rng(2)
    xh = (1e4 + rng.standard_normal((64, 65537))).astype(np.float32)
    x = cupy.asarray(xh)
    want = reference.reduce_var(xh, axis=1)
    got = cupy.asnumpy(R.var(x, axis=1)).astype(np.float64)
    assert (np.abs(got - want) <= 1e-6 * want).all()
    full = float(R.var(x))
    assert abs(full - float(reference.reduce_var(xh))) <= 1e-6 * float(reference.reduce_var(xh))
    assert full == float(reference.var_emulated(xh))


@pytest.mark.gpu
def test_var_special_values_and_out():
    import cupy

    xh = np.ones((4, 300), np.float32)
    xh[1, 7] = np.nan
    xh[2, 299] = np.inf
    xh[3, 0] = -np.inf
    out = cupy.full(4, 5.0, np.float32)
    assert R.std(cupy.asarray(xh), axis=1, out=out) is out
    assert np.array_equal(cupy.asnumpy(out), np.array([0, np.nan, np.nan, np.nan], np.float32), equal_nan=True)
    with pytest.warns(RuntimeWarning, match="Degrees of freedom"):
        assert np.isnan(float(R.var(cupy.zeros(0, np.float32))))
