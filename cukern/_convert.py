"""Element-wise steps on results that CuPy would flush to zero (``cuda_src/convert.cu``).

CuPy compiles its element-wise kernels with ``-ftz=true``, so ``astype``, ``copyto`` and the arithmetic
ufuncs turn a float32 result or operand below 2^-126 into 0 on the GPU, where NumPy keeps it. The op modules
call these functions instead where that can meet one of their results: a float64 value rounded to float32
or a float32 value widened to float64 (complex, part by part, and a real value into a complex one), float32
to and from bfloat16, float64 and integers to bfloat16 (rounded once, where CuPy's conversion rounds twice),
bfloat16 to float64, float32, complex64 and bfloat16 to bool (a test against zero), and the
one-element forms of the reductions on float32 and bfloat16 values (a square, an absolute value). Every
other conversion goes to CuPy unchanged. Any view in, any view out: the kernel reads and writes through the
arrays' strides, so these make no temporary of their own (:func:`astype` returns a new array, as CuPy's
does). Up to four axes (after merging the contiguous ones) take one launch; each index of any axes before
them takes one more.
"""

from __future__ import annotations

import numpy as np

from ._compile import Instantiation, get_kernel
from ._dtypes import BFLOAT16
from ._launch import LaunchConfig, Params, launch, on_device, struct_argument
from ._launch import cupy as _cupy
from ._layout import collapse

SOURCE = "convert"
VALUE, SQUARE, ABS, NONZERO = 0, 1, 2, 3
AXES = 4  # axes a launch indexes after collapsing; more are taken one leading index at a time
BLOCK = 256
MAX_GRID = 4096
PARAMS = Params(tuple((n, "i64") for n in ("n", "d1", "d2", "d3", "x0", "x1", "x2", "x3", "o0", "o1", "o2", "o3")))

_F32, _F64 = np.dtype(np.float32), np.dtype(np.float64)
_C64, _C128 = np.dtype(np.complex64), np.dtype(np.complex128)
_PART = {_C64: _F32, _C128: _F64}
# (x's dtype, out's dtype, mode) -> the kernel's template arguments
_INTS = tuple(np.dtype(t) for t in (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64))
_PAIRS = ((_F64, _F32), (_F32, _F64), (_F32, BFLOAT16), (BFLOAT16, _F32), (BFLOAT16, _F64), (_F64, BFLOAT16),
          *((t, BFLOAT16) for t in _INTS))
KERNELS = {(t, o, VALUE): (t, o, VALUE) for t, o in _PAIRS}
for _t in (_F32, BFLOAT16):
    KERNELS.update({(_t, _t, m): (_t, _t, m) for m in (SQUARE, ABS)})
    KERNELS.update({(_t, _o, NONZERO): (_t, _o, NONZERO) for _o in (np.dtype(np.bool_), np.dtype(np.int64))})


def instantiations() -> list:
    return [Instantiation(SOURCE, "convert_values", args) for args in KERNELS.values()]


def _parts(a):
    """A complex array as its real dtype's array with one more axis of two (real, imaginary), same memory."""
    part = np.dtype(a.real.dtype)
    return _cupy().ndarray(a.shape + (2,), part, memptr=a.data, strides=a.strides + (part.itemsize,))


def plan(shape: tuple, x_strides: tuple, out_strides: tuple) -> list:
    """The launches of one call, pure: ``(x offset, out offset, params fields)`` each, offsets and strides in
    elements. The axes are collapsed first (contiguous neighbours merged in both arrays, sizes of one
    dropped); the last :data:`AXES` go to one launch, each index of any leading ones to a launch of its own."""
    sizes, (xs, os) = collapse(tuple(shape), [tuple(x_strides), tuple(out_strides)])
    if any(n == 0 for n in shape):
        return []
    lead = max(len(sizes) - AXES, 0)
    pad = AXES - (len(sizes) - lead)
    inner = (1,) * pad + sizes[lead:]
    ix, io = (0,) * pad + xs[lead:], (0,) * pad + os[lead:]
    fields = dict(n=int(np.prod(inner)), d1=inner[1], d2=inner[2], d3=inner[3], x0=ix[0], x1=ix[1], x2=ix[2],
                  x3=ix[3], o0=io[0], o1=io[1], o2=io[2], o3=io[3])
    return [(sum(i * s for i, s in zip(idx, xs[:lead])), sum(i * s for i, s in zip(idx, os[:lead])), fields)
            for idx in np.ndindex(*sizes[:lead])]


def _run(x, out, mode: int) -> None:
    """out[...] = mode(x[...]) through convert.cu, x and out of one shape (complex: part by part)."""
    if x.dtype.kind == "c":
        x, out = _parts(x), _parts(out)
    args = KERNELS[(x.dtype, out.dtype, mode)]
    launches = plan(x.shape, tuple(s // x.itemsize for s in x.strides), tuple(s // out.itemsize for s in out.strides))
    if not launches:
        return
    with on_device(x.data.device_id):
        kernel = get_kernel(Instantiation(SOURCE, "convert_values", args)).kernel
        for xo, oo, fields in launches:
            grid = max(1, min(MAX_GRID, -(-fields["n"] // BLOCK)))
            launch(kernel, LaunchConfig((grid,), (BLOCK,)),
                   (np.uint64(out.data.ptr + oo * out.itemsize), np.uint64(x.data.ptr + xo * x.itemsize),
                    struct_argument(PARAMS.struct(**fields))))


def _key(src_dtype, dst_dtype):
    """The kernel that converts ``src_dtype`` into ``dst_dtype`` (complex: part by part; a real dtype into a
    complex one: into the real parts), or None where CuPy's conversion keeps every value."""
    s, d = np.dtype(src_dtype), np.dtype(dst_dtype)
    if d in _PART:
        s, d = _PART.get(s, s), _PART[d]
    elif d == np.bool_:  # complex: either part not zero
        s = _PART.get(s, s)
    key = (s, d, NONZERO if d == np.bool_ else VALUE)
    return key if key in KERNELS else None


def copyto(dst, src) -> None:
    """``cupy.copyto(dst, src, casting="unsafe")`` (``src`` broadcast to ``dst``), but float64 <-> float32,
    complex128 <-> complex64, a real float into complex, bfloat16 <-> float32, float64 or an integer ->
    bfloat16 (rounded once), bfloat16 -> float64 and float32, complex64 or bfloat16 -> bool converted here,
    subnormals kept (a subnormal value is not zero)."""
    cp = _cupy()
    key = _key(src.dtype, dst.dtype)
    if key is None or not src.size:
        cp.copyto(dst, src, casting="unsafe")
        return
    src = cp.broadcast_to(src, dst.shape)
    with on_device(dst.data.device_id):  # CuPy's steps (the zeros, nonzero's parts) on dst's device
        if key[2] == NONZERO:
            nonzero(src, dst)
        elif dst.dtype.kind == "c" and src.dtype.kind != "c":  # a real value: a complex one with no imaginary part
            _run(src, dst.real, VALUE)
            dst.imag.fill(0)
        else:
            _run(src, dst, key[2])


def astype(a, dtype):
    """``a.astype(dtype)`` (a C-ordered result), with :func:`copyto`'s rounding."""
    dtype = np.dtype(dtype)
    if _key(a.dtype, dtype) is None:
        return a.astype(dtype)
    with on_device(a.data.device_id):  # the result on a's device, whichever is current
        out = _cupy().empty(a.shape, dtype)
    copyto(out, a)
    return out


def square(a) -> None:
    """a *= a in place, float32 and bfloat16 here (others by CuPy, where no float32 result can be subnormal)."""
    if (a.dtype, a.dtype, SQUARE) in KERNELS:
        _run(a, a, SQUARE)
    else:
        _cupy().multiply(a, a, out=a)


def absolute(a) -> None:
    """a = |a| in place, float32 and bfloat16 here."""
    if (a.dtype, a.dtype, ABS) in KERNELS:
        _run(a, a, ABS)
    else:
        _cupy().abs(a, out=a)


def nonzero(x, out) -> None:
    """out = x != 0 (out bool or int64), float32 and bfloat16 x here (a subnormal value is not zero); complex
    x: either part not zero, its parts so tested."""
    cp = _cupy()
    if x.dtype.kind == "c":
        both = cp.empty(x.shape + (2,), np.bool_)
        nonzero(_parts(x), both)
        cp.logical_or(both[..., 0], both[..., 1], out=out)
    elif (x.dtype, out.dtype, NONZERO) in KERNELS:
        _run(x, out, NONZERO)
    else:
        cp.not_equal(x, 0, out=out)
