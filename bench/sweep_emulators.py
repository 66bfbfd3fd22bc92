"""Random calls of the reductions, arg-reductions, scans and segment ops against their exact emulators
(``cukern.reference``), bit for bit, with values drawn to include subnormals, signed zeros, infinities and
NaN beside normal ones: random float, integer, bool and complex dtypes, shapes of 1 to 3 axes, views
(transposed, reversed, offset, stepped), axes (None, one, negative, a tuple), keepdims, dtype= (bfloat16
among them; complex ones for the scans) and segment offsets with empty segments. A call the emulator
refuses must be refused by cukern too. What the CUDA-event benchmarks never draw, and what found the
flush to zero of CuPy-compiled kernels (docs/design/verification.md).

Run from the repository root on a GPU: ``PYTHONPATH=. python3 bench/sweep_emulators.py SECONDS [SEED
[PROCESSES]]``; prints one line a mismatch (at most 20 a process) and a summary a process.
"""

import multiprocessing
import sys
import time

import numpy as np

# op: (emulator keywords it takes, dtypes drawn)
FLOATS = ["float32", "float32", "float64", "float16", "bfloat16"]
INTS = ["int8", "uint8", "int32", "int64", "uint64", "bool"]
COUNTED = FLOATS + INTS + ["complex64"]  # counts and truth tests: a complex element with any nonzero part counts
OPS = {
    "sum": ("dtype keepdims", FLOATS + INTS + ["complex64", "complex128"]),
    "mean": ("dtype keepdims", FLOATS + ["int32", "complex64"]),
    "amax": ("keepdims", FLOATS + INTS), "amin": ("keepdims", FLOATS + INTS),
    "nanmax": ("keepdims", FLOATS), "nanmin": ("keepdims", FLOATS),
    "prod": ("keepdims", FLOATS + ["int32", "int64", "complex64"]),
    "sum_of_squares": ("keepdims", FLOATS), "norm": ("keepdims", FLOATS), "nansum": ("keepdims", FLOATS),
    "nanmean": ("keepdims", FLOATS), "var": ("ddof keepdims", FLOATS + ["complex64"]),
    "std": ("ddof keepdims", FLOATS + ["int32"]),
    "logsumexp": ("keepdims", ["float32", "float64"]), "count_nonzero": ("keepdims", COUNTED),
    "any": ("keepdims", COUNTED), "all": ("keepdims", COUNTED),
    "argmax": ("keepdims one", FLOATS + INTS + ["complex64"]), "argmin": ("keepdims one", FLOATS + INTS),
    "nanargmax": ("keepdims one", FLOATS), "nanargmin": ("keepdims one", FLOATS),
    "cumsum": ("scan dtype", FLOATS + ["int8", "int32", "uint64", "bool", "complex64"]),
    "cumprod": ("scan dtype", ["float32", "float64", "bfloat16", "int32", "complex64"]),
    "segment_sum": ("segment", FLOATS + INTS), "segment_max": ("segment", FLOATS + INTS),
    "segment_min": ("segment", FLOATS + INTS), "segment_mean": ("segment", FLOATS + INTS),
}


def cast_values(v, rng, dt):
    """The drawn float64 values in dtype dt: integers as small whole numbers (wrapping into unsigned ones),
    bool as v > 0, complex with a second draw as the imaginary parts."""
    if dt == np.bool_:
        return v > 0
    if dt.kind in "iu":
        return np.nan_to_num(np.round(v * 3), nan=0, posinf=7, neginf=-7).astype(np.int64).astype(dt)
    if dt.kind == "c":
        z = np.empty(v.shape, dt)
        z.real, z.imag = v, draw_values(rng, v.shape)
        return z
    return v.astype(dt)


def draw_values(rng, shape):
    """Normal values with some replaced: subnormal float32 magnitudes, +-0, +-inf, NaN."""
    v = rng.standard_normal(shape)
    r = rng.random(shape)
    kind = rng.integers(4)  # some arrays all normal, some mostly subnormal
    share = [0.0, 0.05, 0.5, 0.95][kind]
    tiny = np.ldexp(rng.random(shape) + 0.5, rng.integers(-149, -126, shape)) * np.sign(v)
    v = np.where(r < share, tiny, v)
    if rng.random() < 0.3:
        specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan])
        pick = rng.random(shape) < 0.01
        v = np.where(pick, specials[rng.integers(5, size=shape)], v)
    return v


def view_of(rng, host, dev):
    nd = host.ndim
    r = rng.random()
    ax = int(rng.integers(nd))
    sl = [slice(None)] * nd
    if r < 0.15 and nd > 1:
        return host.T, dev.T, "T"
    if r < 0.3:
        sl[ax] = slice(None, None, -1)
    elif r < 0.45:
        sl[ax] = slice(1, None)
    elif r < 0.55:
        sl[ax] = slice(None, None, 2)
    else:
        return host, dev, "c"
    return host[tuple(sl)], dev[tuple(sl)], f"{r:.2f}@{ax}"


def differ(got, want):
    """The flat indices where ``got`` and ``want`` differ: in bytes, but not where both elements are NaN (a
    NaN's payload is not promised); None when their shapes or dtypes differ."""
    if got.shape != want.shape or got.dtype != want.dtype:
        return None
    g, w = got.reshape(-1), want.reshape(-1)
    bytes_differ = np.any(g.view(np.uint8).reshape(g.size, -1) != w.view(np.uint8).reshape(w.size, -1), axis=1)
    if g.dtype.kind == "c":
        nan = (np.isnan(g.real) | np.isnan(g.imag)) & (np.isnan(w.real) | np.isnan(w.imag))
    elif g.dtype.kind == "f" or g.dtype.name == "bfloat16":
        nan = np.isnan(g.astype(np.float64)) & np.isnan(w.astype(np.float64))
    else:
        nan = np.zeros(g.size, bool)
    return np.nonzero(bytes_differ & ~nan)[0]


def worker(args):
    seconds, seed = args
    import cupy as cp

    import cukern
    from cukern import reference
    from cukern._dtypes import BFLOAT16

    rng = np.random.default_rng(seed)
    names = list(OPS)
    cases = bad = unchecked = 0
    lines = []
    t0 = time.time()
    while time.time() - t0 < seconds:
        op = names[int(rng.integers(len(names)))]
        form, dtypes = OPS[op]
        dt = BFLOAT16 if (d := dtypes[int(rng.integers(len(dtypes)))]) == "bfloat16" else np.dtype(d)
        nd = int(rng.integers(1, 4))
        shape = tuple(int(rng.choice([1, 2, 3, 7, 33, 130, 1000, 4099])) for _ in range(nd))
        while np.prod(shape) > 2_000_000:
            shape = shape[1:] or (1000,)
        v = draw_values(rng, shape)
        host = cast_values(v, rng, dt)
        host, dev, view = view_of(rng, host, cp.asarray(host))
        if host.size == 0:
            continue
        kw, ekw = {}, {}
        if form == "segment":  # offsets into axis 0: sorted cut points, some repeated (empty segments)
            rows = host.shape[0]
            cuts = np.sort(rng.integers(0, rows + 1, int(rng.integers(1, 40))))
            offsets = np.concatenate([[0], cuts, [rows]]).astype([np.int32, np.int64][int(rng.integers(2))])
            axis, host_args, dev_args = None, (offsets,), (cp.asarray(offsets),)
        else:
            host_args = dev_args = ()
            if "scan" in form or "one" in form:
                axis = None if rng.random() < 0.3 else int(rng.integers(-host.ndim, host.ndim))
            else:
                r = rng.random()
                axis = None if r < 0.3 else int(rng.integers(-host.ndim, host.ndim)) if r < 0.8 else tuple(
                    sorted(set(int(a) for a in rng.integers(0, host.ndim, 2))))
            kw["axis"] = ekw["axis"] = axis
        if "keepdims" in form and rng.random() < 0.3:
            kw["keepdims"] = ekw["keepdims"] = True
        if "ddof" in form and rng.random() < 0.3:
            kw["ddof"] = ekw["ddof"] = 1
        if "dtype" in form and dt.kind != "c" and rng.random() < 0.2:
            kw["dtype"] = ekw["dtype"] = np.float64 if dt != np.float64 else np.float32
            if dt != BFLOAT16 and rng.random() < 0.3:  # a float64 or integer result rounded into bfloat16
                kw["dtype"] = ekw["dtype"] = BFLOAT16
            if "scan" in form and rng.random() < 0.5:  # a complex dtype=: x's values into the real parts
                kw["dtype"] = ekw["dtype"] = [np.complex64, np.complex128][int(rng.integers(2))]
        try:
            want = np.asarray(getattr(reference, op + "_emulated")(host, *host_args, **ekw))
        except Exception as err:  # noqa: BLE001 - a case the emulator does not take: cukern must refuse it too
            want = err
        try:
            got = cp.asnumpy(getattr(cukern, op)(dev, *dev_args, **kw))
            if isinstance(want, Exception):
                unchecked += 1
                if unchecked <= 5:
                    lines.append(f"SWEEP UNCHECKED {op} {dt} {shape} {view} axis={axis} {kw.get('dtype')} "
                                 f"emulator {want!r:.120}")
                continue
            diff = differ(got, want)
            ok = diff is not None and diff.size == 0
        except Exception as err:  # noqa: BLE001 - reported with the call
            ok = isinstance(want, Exception)  # both refused
            got, want, diff = None, f"{err!r:.120} / emulator {want!r:.80}", None
        cases += 1
        if not ok:
            bad += 1
            if bad <= 20:
                where = None
                if isinstance(got, np.ndarray) and diff is not None:
                    where = (diff.size, diff[:3].tolist(), got.reshape(-1)[diff[:3]].tolist(),
                             want.reshape(-1)[diff[:3]].tolist())
                lines.append(f"SWEEP BAD {op} {dt} {shape} {view} axis={axis} {kw} got/want "
                             f"{getattr(got, 'dtype', got)}/{getattr(want, 'dtype', want)} {where}")
    lines.append(f"SWEEP seed {seed}: {cases} calls, {bad} mismatches, {unchecked} answered where the emulator "
                 f"raised, {time.time() - t0:.0f} s")
    return lines


def main():
    seconds = float(sys.argv[1])
    seed = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    procs = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(procs) as pool:
        for lines in pool.imap_unordered(worker, [(seconds, seed + i) for i in range(procs)]):
            print("\n".join(lines), flush=True)


if __name__ == "__main__":
    main()
