"""The sum ladder: ten kernels from the textbook first try to the production kernel, one change per rung
(kernels and the reasoning for each step in ``cuda_src/reduce_ladder.cu``).

Every rung is a complete sum: the multi-pass rungs (v1-v8) write one partial per block and are launched
again on their own partials until one value is left; v9 and v10 finish in one launch. ``RUNGS`` is the
ordered registry (exported as ``cukern.reduce_ladder``); each rung is callable on a CuPy array and returns a
0-d array in the accumulator dtype (float32, or float64 for float64 input). ``BEYOND`` (v11) is the rung past
production that cukern does not take: v10 without its fixed tree, which measures what the tree costs.

``run_ladder`` times every rung on the same data, checks it against a float64 reference, and compares it
with the copy bandwidth, with ``cupy.sum`` (CUB) and with the rung before; ``format_table`` prints the rows.
Bytes moved: the input read once plus the scalar written (:func:`cukern.reduce_plan.bytes_moved`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

import cukern._check as _check
import cukern.reduce as _reduce
import cukern.reduce_plan as reduce_plan

from ._compile import Instantiation, get_kernel
from ._dtypes import FLOAT_TYPES, dtype_name, parse_dtype
from ._launch import X_COPIED, LaunchConfig, Signature, launch, on_device, refuse_temporary_in_capture, sm_count

SOURCE = "reduce_ladder"
BLOCK = 256  # v1-v9
DTYPES = FLOAT_TYPES + (np.dtype(np.float64),)

_MULTI_SIG = Signature(("ptr", "ptr", "i64"))
_SINGLE_SIG = Signature(("ptr", "ptr", "ptr", "ptr", "i64"))


def acc_dtype(dtype) -> np.dtype:
    return np.dtype(np.float64) if np.dtype(dtype) == np.float64 else np.dtype(np.float32)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class Rung:
    """One ladder kernel: ``number``, the kernel ``name`` (``reduce_v{N}_{what_changed}``), a one-line
    summary of the change, and how its grid is sized (``grid``)."""

    number: int
    name: str
    change: str
    # "one" / "two": one or two elements a thread; "resident": the grid the SMs hold at once;
    # "resident_vec" and "last_block": the same, but 16-byte vectors; "full": reduce_plan.plan_full's grid.
    sizing: str

    @property
    def label(self) -> str:
        return f"v{self.number}"

    @property
    def single_launch(self) -> bool:
        return self.sizing in ("last_block", "full")

    @property
    def block(self) -> int:
        return reduce_plan.FULL_BLOCK if self.sizing == "full" else BLOCK

    def grid(self, n: int, itemsize: int, sm_count: int = 132) -> int:
        """Blocks for one pass over n elements of ``itemsize`` bytes. Pure."""
        resident = sm_count * (2048 // BLOCK)
        if self.sizing == "one":
            g = _cdiv(n, BLOCK)
        elif self.sizing == "two":
            g = _cdiv(n, 2 * BLOCK)
        elif self.sizing == "resident":
            g = min(_cdiv(n, BLOCK), resident)
        elif self.sizing in ("resident_vec", "last_block"):
            g = min(_cdiv(n, BLOCK * (16 // itemsize)), resident)
        else:
            g = reduce_plan.plan_full(n, itemsize, sm_count).grid
        return max(1, g)

    def instantiations(self, dtype) -> list:
        """The instantiations this rung launches for input ``dtype`` (later passes read accumulator-typed
        partials)."""
        t, a = np.dtype(dtype), acc_dtype(dtype)
        if self.sizing == "full":
            return [Instantiation(SOURCE, self.name, (t, a, reduce_plan.FULL_BLOCK, reduce_plan.FULL_UNROLL))]
        if self.single_launch:
            return [Instantiation(SOURCE, self.name, (t, a, BLOCK))]
        return [Instantiation(SOURCE, self.name, (s, a, BLOCK)) for s in dict.fromkeys((t, a))]

    def __call__(self, x):
        """The sum of all elements of ``x`` (float32, float16, bfloat16 or float64) as a 0-d array."""
        import cupy

        x = _check.as_array(x, "x")
        _check.check_dtype(x, "x", DTYPES)
        if not self.single_launch:
            refuse_temporary_in_capture(self.name, "its passes hand their partial sums on in temporary arrays; "
                                        "capture a rung of one launch (9 or 10)")
        if not x.flags.c_contiguous:
            refuse_temporary_in_capture(self.name, X_COPIED)
            x = cupy.ascontiguousarray(x)
        a = acc_dtype(x.dtype)
        with on_device(x.data.device_id):
            sm = sm_count(x.data.device_id)
            n = x.size
            if self.single_launch:
                out = cupy.empty((), dtype=a)
                g = self.grid(n, x.itemsize, sm)
                ws = _reduce.workspace()
                kernel = get_kernel(self.instantiations(x.dtype)[0])
                launch(kernel, LaunchConfig((g,), (self.block,)), (out, ws.partials, ws.counter, x, n), _SINGLE_SIG)
                return out
            cur = x
            while True:
                g = self.grid(n, cur.itemsize, sm)
                out = cupy.empty(g, dtype=a)
                kernel = get_kernel(Instantiation(SOURCE, self.name, (cur.dtype, a, BLOCK)))
                launch(kernel, LaunchConfig((g,), (BLOCK,)), (out, cur, n), _MULTI_SIG)
                if g == 1:
                    return out.reshape(())
                cur, n = out, g


RUNGS = (
    Rung(1, "reduce_v1_interleaved_divergent", "shared-memory tree, tid % (2s) == 0 (divergent)", "one"),
    Rung(2, "reduce_v2_interleaved_strided_index", "index 2*s*tid: no divergence, bank conflicts", "one"),
    Rung(3, "reduce_v3_sequential_addressing", "fold halves: conflict-free", "one"),
    Rung(4, "reduce_v4_first_add_during_load", "two elements a thread, added while loading", "two"),
    Rung(5, "reduce_v5_unroll_last_warp", "unrolled tree, last warp with __syncwarp", "two"),
    Rung(6, "reduce_v6_warp_shuffle", "warp shuffles instead of shared memory", "two"),
    Rung(7, "reduce_v7_grid_stride", "grid-stride loop, grid from the SM count", "resident"),
    Rung(8, "reduce_v8_vector_loads", "16-byte loads, scalar head and tail", "resident_vec"),
    Rung(9, "reduce_v9_last_block_done", "one launch: last block combines partials", "last_block"),
    Rung(10, "reduce_v10_loads_in_flight", "independent 16-byte loads in flight (production)", "full"),
)

# The rung past production, which cukern does not take: v10 without its fixed tree, to measure what the tree
# costs (the benchmark's ``cukern-no-contract`` record of the full sums). Its bits follow the grid.
BEYOND = Rung(11, "reduce_v11_no_fixed_tree", "no fixed tree: round-robin vectors, bits follow the grid", "full")


def instantiations() -> list:
    """Every ladder instantiation (:data:`BEYOND`'s too), for every dtype the ladder accepts."""
    out = {i for r in RUNGS + (BEYOND,) for t in DTYPES for i in r.instantiations(t)}
    return sorted(out, key=lambda i: (i.name, i.expression))


# ---------------------------------------------------------------------------------------------------------
# The runner.


def make_data(n: int, dtype, seed: int = 0):
    """n random values in [0.5, 1.5) (never zero, so every element moves the sum), as ``dtype``."""
    import cupy

    rs = cupy.random.RandomState(seed)
    x = cupy.empty(n, dtype=parse_dtype(dtype))
    chunk = 1 << 26
    for lo in range(0, n, chunk):
        hi = min(n, lo + chunk)
        x[lo:hi] = (rs.random_sample(hi - lo, dtype=np.float32) + np.float32(0.5)).astype(x.dtype)
    return x


def reference_sum(x) -> float:
    """The float64 sum of x's values (chunked on the GPU, chunks added with math.fsum)."""
    chunk = 1 << 26
    parts = [float(x[lo:lo + chunk].astype(np.float64).sum()) for lo in range(0, x.size, chunk)]
    return math.fsum(parts)


def run_ladder(n: int = 1 << 28, dtype="float32", *, repeat: int = 20, warmup: int = 3, seed: int = 0,
               include_references: bool = True, progress=None) -> list:
    """Run every rung on the same ``n`` random ``dtype`` values and return one dict per row:

    ``rung`` ("v1".."v10", "v11" for :data:`BEYOND`, or "cub" / "cukern.sum" for the reference rows), ``name``,
    ``change``, ``us`` (median), ``gbps``, ``pct_peak`` (of the device-to-device copy), ``pct_cub``
    (``cupy.sum`` time / this time, in %), ``speedup`` (over the previous rung), ``value``, ``rel_error``
    (against the float64 reference) and ``ok`` (within :func:`cukern.reference.reduction_tolerance`).

    ``progress``: called as ``progress(label)`` after each row is measured (each rung, then the reference
    rows), for a progress bar (``cukern ladder`` passes its bar's ``step``).
    """
    import cukern.reference as reference
    import cukern.timing as timing

    t = parse_dtype(dtype)
    if t not in DTYPES:
        raise TypeError(f"dtype {dtype_name(t)} is not a ladder dtype; use one of "
                        f"{', '.join(dtype_name(d) for d in DTYPES)}")
    if n < 1:
        raise ValueError(f"n must be positive, got {n}")
    import cupy

    x = make_data(n, t, seed)
    ref = reference_sum(x)
    tol = reference.reduction_tolerance(n, acc_dtype(t), abs(ref))
    nbytes = reduce_plan.bytes_moved((n,), t, op="sum")
    peak = timing.peak_bandwidth()

    def time_it(fn):
        return timing.benchmark(fn, x, warmup=warmup, repeat=repeat, bytes_moved=nbytes)

    try:
        cub = time_it(cupy.sum)
    except Exception:  # CuPy may not reduce every dtype (bfloat16) with CUB
        cub = None

    def row(label, name, change, fn, timing_, previous):
        value = float(fn(x))
        err = abs(value - ref)
        return {
            "rung": label, "name": name, "change": change, "us": timing_.median_us, "gbps": timing_.gbps,
            "pct_peak": 100.0 * timing_.gbps / peak,
            "pct_cub": None if cub is None else 100.0 * cub.median_us / timing_.median_us,
            "speedup": None if previous is None else previous / timing_.median_us,
            "value": value, "rel_error": err / abs(ref), "ok": err <= tol,
        }

    rows, previous = [], None

    def add(r) -> None:
        rows.append(r)
        if progress is not None:
            progress(r["rung"])

    for rung in RUNGS:
        tm = time_it(rung)
        add(row(rung.label, rung.name, rung.change, rung, tm, previous))
        previous = tm.median_us
    add(row(BEYOND.label, BEYOND.name, BEYOND.change, BEYOND, time_it(BEYOND), previous))
    if include_references:
        tm = time_it(_reduce.sum)
        add(row("cukern.sum", "reduce_full", "production op", _reduce.sum, tm, None))
        if cub is not None:
            add(row("cub", "cupy.sum", "CUB device reduce (two launches)", cupy.sum, cub, None))
    return rows


def format_table(rows) -> str:
    """The rows of :func:`run_ladder` as a fixed-width text table."""
    def f(v, spec):
        return "-" if v is None else format(v, spec)

    head = f"{'rung':<11} {'us':>10} {'GB/s':>8} {'%peak':>6} {'%CUB':>6} {'speedup':>8} {'rel err':>9}  ok  change"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r['rung']:<11} {r['us']:>10.1f} {f(r['gbps'], '.0f'):>8} {f(r['pct_peak'], '.1f'):>6} "
            f"{f(r['pct_cub'], '.1f'):>6} {f(r['speedup'], '.2f'):>8} {r['rel_error']:>9.1e}  "
            f"{'y' if r['ok'] else 'N':<3} {r['change']}"
        )
    return "\n".join(lines)


def plot_ladder(rows, path) -> None:
    """Bar chart of % of the copy peak per row, saved to ``path`` (needs matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise RuntimeError("--plot needs matplotlib: pip install matplotlib") from err
    fig, ax = plt.subplots(figsize=(10, 4.5))
    labels = [r["rung"] for r in rows]
    values = [r["pct_peak"] for r in rows]
    bars = ax.bar(labels, values, color=["tab:blue" if r["rung"].startswith("v") else "tab:gray" for r in rows])
    ax.bar_label(bars, fmt="%.0f", fontsize=8)
    ax.axhline(100, color="black", linewidth=0.8, linestyle="--")
    ax.set_ylabel("% of device-to-device copy bandwidth")
    ax.set_title("sum ladder")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


__all__ = ["RUNGS", "Rung", "format_table", "instantiations", "make_data", "plot_ladder", "run_ladder"]
