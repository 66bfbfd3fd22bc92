"""The exact emulators (cukern.reference) on the cases a CPU sweep against NumPy found them wrong in: each
must give NumPy's result, as the GPU does, by mirroring cukern.reduce_plan.route and cukern.reduce's lowering
(CPU only)."""

import warnings

import numpy as np
import pytest
from _support import same_bits

from cukern import reference as R

SUM, MEAN, PROD = R.sum_emulated, R.mean_emulated, R.prod_emulated


def _np_bits(got, want):
    assert same_bits(got, np.asarray(want)), (got, want)


@pytest.mark.parametrize("emu, fn, x", [
    (SUM, np.sum, np.array([1 + 2j, 3 + 4j])),
    (SUM, np.sum, np.array([1 + 2j, 3 - 4j], np.complex64)),
    (MEAN, np.mean, np.array([1 + 2j, 3 + 4j], np.complex64)),
    (MEAN, np.mean, np.array([1 + 2j, 3 + 4j])),
])
def test_complex_sums_and_means_keep_the_imaginary_part(emu, fn, x):
    _np_bits(emu(x), fn(x))


@pytest.mark.parametrize("x, keepdims", [
    (np.array([3 + 4j, 0j]), False),
    (np.array([[3 + 4j, 0j]], np.complex64), True),
])
def test_complex_norm_reduces_both_parts(x, keepdims):
    want = np.linalg.norm(x.reshape(-1)).astype(x.real.dtype)
    _np_bits(R.norm_emulated(x, keepdims=keepdims), want.reshape((1,) * x.ndim if keepdims else ()))


@pytest.mark.parametrize("emu, fn, x, dtype", [
    (SUM, np.sum, np.array([2**31 - 1] * 2, np.int32), np.complex64),
    (SUM, np.sum, np.array([1.0, 2.0**-30], np.float32), np.complex128),
    (MEAN, np.mean, np.array([2**24, 1], np.int32), np.complex128),
    (R.sum_of_squares_emulated, lambda x, dtype: np.sum(np.square(x.astype(np.float64)), dtype=dtype),
     np.array([70000, 70000], np.int32), np.complex128),
])
def test_complex_targets_of_real_x_accumulate_in_the_parts_dtype(emu, fn, x, dtype):
    _np_bits(emu(x, dtype=dtype), fn(x, dtype=dtype))


@pytest.mark.parametrize("emu, fn, x", [
    (SUM, np.sum, np.array([1, -1])),
    (MEAN, np.mean, np.array([1, -1])),
    (PROD, np.prod, np.array([2] * 64)),
    (PROD, np.prod, np.full(8, 1e-3, np.float16)),
    (R.sum_of_squares_emulated, lambda x, dtype: np.any(x != 0), np.array([2**32, 0])),  # squares in int64 wrap
])
def test_bool_targets_are_numpy_or_and_and(emu, fn, x):
    _np_bits(emu(x, dtype=bool), fn(x, dtype=bool))


@pytest.mark.parametrize("emu, fn, x, dtype", [
    (MEAN, np.mean, np.array([100, 100], np.int8), np.int8),
    (MEAN, np.mean, np.array([-1, -2, -3]), np.uint8),
    (MEAN, np.mean, np.array([1.5, 2.5], np.float32), np.int32),
    (R.nanmean_emulated, np.nanmean, np.array([100, 100], np.int8), np.int8),  # integer x: the mean
    (R.nanmean_emulated, np.nanmean, np.array([-1, -2, -3]), np.uint8),
])
def test_mean_into_an_integer_sums_in_that_integer(emu, fn, x, dtype):
    _np_bits(emu(x, dtype=dtype), fn(x, dtype=dtype))


@pytest.mark.parametrize("emu, fn", [(R.amax_emulated, np.max), (R.amin_emulated, np.min),
                                     (R.nanmax_emulated, np.nanmax), (R.nanmin_emulated, np.nanmin)])
@pytest.mark.parametrize("x", [
    np.array([16777217, 3], np.uint32),
    np.array([4294967294, 4294967295, 3], np.uint32),
    np.array([2**63 + 1, 2**63 + 3], np.uint64),
])
def test_integer_extremes_are_exact(emu, fn, x):
    _np_bits(emu(x), fn(x))


@pytest.mark.parametrize("op", ["argmax", "argmin", "nanargmax", "nanargmin"])
@pytest.mark.parametrize("x", [np.array(3.0, np.float32), np.array(1 - 2j, np.complex64), np.array(1 + 2j)])
@pytest.mark.parametrize("keepdims", [False, True])
def test_arg_reductions_of_a_0d_array(op, x, keepdims):
    got = getattr(R, f"{op}_emulated")(x, keepdims=keepdims)
    want = getattr(np, op)(x, keepdims=keepdims)
    assert np.array_equal(got, want) and np.shape(got) == np.shape(want)


@pytest.mark.parametrize("op", ["cumsum", "cumprod"])
@pytest.mark.parametrize("x, axis", [
    (np.zeros(0, np.float32), 0),
    (np.zeros((5, 0)), 0),
    (np.zeros((5, 0), np.int32), 1),
    (np.zeros((0, 5), np.float32), None),
])
def test_scans_of_an_empty_axis(op, x, axis):
    got = getattr(R, f"{op}_emulated")(x, axis=axis)
    want = getattr(np, op)(x, axis=axis)
    assert got.shape == want.shape and got.dtype == want.dtype


@pytest.mark.parametrize("op", ["cumsum", "cumprod"])
@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.uint8, np.uint16, np.uint32, np.uint64, np.int32, np.bool_])
@pytest.mark.parametrize("requested", [None, np.int8, np.uint16, np.int32, np.uint64, np.bool_])
def test_scans_of_routed_integers_are_numpys(op, dtype, requested):
    """cukern.scan.route's integer and bool results: x converted, scanned in int64 (wrapping), converted to
    NumPy's result dtype, whose low bits are those of NumPy's narrower arithmetic."""
    x = np.random.default_rng(5).integers(-300, 300, (7, 301)).astype(dtype)
    for axis in (None, 0, 1):
        with np.errstate(over="ignore"):
            want = getattr(np, op)(x, axis=axis, dtype=requested)
        got = getattr(R, f"{op}_emulated")(x, axis, requested)
        assert got.dtype == want.dtype and np.array_equal(got, want), (axis, got.dtype)


@pytest.mark.parametrize("op", ["cumsum", "cumprod"])
@pytest.mark.parametrize("dtype, requested", [(np.float16, np.float64), (np.float64, np.float16),
                                              (np.int32, np.float32), (np.uint8, np.float16)])
def test_scans_of_a_converted_float_scan_the_converted_values(op, dtype, requested):
    """A float result of another dtype than a kernel scans x into: x converted to it first (NumPy's
    conversion), then that dtype's own scan, bit for bit."""
    x = np.random.default_rng(6).standard_normal((5, 3000)).astype(dtype) if np.dtype(dtype).kind == "f" else (
        np.random.default_rng(6).integers(0, 9, (5, 3000)).astype(dtype))
    for axis in (None, 1):
        with np.errstate(all="ignore"):
            got = getattr(R, f"{op}_emulated")(x, axis, requested)
            want = getattr(R, f"{op}_emulated")(x.astype(requested), axis)
        assert got.dtype == np.dtype(requested) and same_bits(got, want), axis


@pytest.mark.parametrize("op", ["cumsum", "cumprod"])
@pytest.mark.parametrize("dtype", [np.str_, np.object_])
def test_scans_refuse_what_the_public_ops_refuse(op, dtype):
    with pytest.raises(TypeError, match="supported"):
        getattr(R, f"{op}_emulated")(np.ones(3, dtype))


@pytest.mark.parametrize("op, empty", [("sum", 0.0), ("max", -np.inf), ("min", np.inf), ("mean", np.nan)])
@pytest.mark.parametrize("x, offsets", [
    (np.zeros((0, 3), np.float32), np.array([0, 0])),
    (np.zeros((0,), np.float32), np.array([0])),
    (np.zeros((0,), np.float64), np.array([0, 0, 0])),
])
def test_segments_of_no_rows_are_the_identity(op, empty, x, offsets):
    got = getattr(R, f"segment_{op}_emulated")(x, offsets)
    _np_bits(got, np.full((len(offsets) - 1,) + x.shape[1:], empty, x.dtype))


@pytest.mark.parametrize("name", ["var", "std"])
@pytest.mark.parametrize("x, axis, ddof", [
    (np.zeros(0, np.float32), None, -1),  # the empty M2 over -ddof: 0
    (np.zeros((3, 0)), 1, -2),
    (np.zeros((3, 0), np.int8), 1, 0),  # over 0: NaN
    (np.array([1 + 2j, 3 + 0j], np.complex64), None, 2),  # (M2_re + M2_im) / 0: inf
    (np.array([1 + 0j, 1 + 0j]), None, 5),  # 0 / 0: NaN
    (np.array([[1 + 1j], [2 + 0j]], np.complex64), 1, 1),  # one element a slice, ddof 1: 0 / 0
    (np.array(1 + 2j, np.complex64), (), 0),  # 0-d: its shape kept
])
def test_variances_without_freedom_are_numpys(name, x, axis, ddof):
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        want = getattr(np, name)(x, axis=axis, ddof=ddof)
    got = getattr(R, f"{name}_emulated")(x, axis=axis, ddof=ddof)
    assert np.shape(got) == np.shape(want)
    _np_bits(got, want)


@pytest.mark.parametrize("op", ["cumsum", "cumprod"])
def test_scan_emulators_take_numpys_axes_and_0d_arrays(op):
    for x in (np.float32(3), np.complex64(3 + 1j), np.int8(5)):
        for axis in (None, 0, -1):
            got, want = getattr(R, f"{op}_emulated")(np.asarray(x), axis), getattr(np, op)(np.asarray(x), axis=axis)
            assert got.shape == want.shape == (1,) and got.dtype == want.dtype, (x, axis)
    for axis in (2, -3):
        with pytest.raises(np.exceptions.AxisError):
            getattr(R, f"{op}_emulated")(np.zeros((2, 3), np.float32), axis)
    with pytest.raises(TypeError, match="does not cast complex to real"):
        getattr(R, f"{op}_emulated")(np.ones(3, np.complex64), None, np.bool_)


def test_floats_into_uint64_scan_numpys_conversion():
    """A float into a uint64 result: NumPy's conversion (values past int64's range kept, negative ones
    wrapped), then wrapping sums."""
    x = np.array([1e19, 5.0, -2.0, 2.0**63], np.float64)
    with np.errstate(invalid="ignore"):
        want = np.cumsum(x, dtype=np.uint64)
        for t in (np.float64, np.float32):
            assert np.array_equal(R.cumsum_emulated(x.astype(t), None, np.uint64), np.cumsum(x.astype(t),
                                                                                               dtype=np.uint64))
    assert want[0] == 10**19
