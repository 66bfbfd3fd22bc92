"""The reduction ladder in the lab: its benchmark records (every rung on 2^28 float32 values) and one card
per rung (``reduce_ladder.v1`` ... ``reduce_ladder.v10``, and ``reduce_ladder.v11`` of the rung past
production), each from :mod:`cukern.ladder`'s own rungs and :mod:`cukern.reduce_plan`'s byte count."""

from __future__ import annotations

import math

import cukern.lab.bench as bench
import cukern.lab.card as card

from .. import ladder, reduce_plan
from .._dtypes import dtype_name

LADDER_N = 1 << 28


def records(peak: float, n: int = LADDER_N) -> list:
    """One results record per ladder rung and :data:`cukern.ladder.BEYOND` (op ``reduce_ladder``, impl the
    rung's kernel name)."""
    rows = ladder.run_ladder(n, "float32", include_references=False)
    return [{"op": "reduce_ladder", "impl": r["name"], "shape": [n], "dtype": "float32",
             "median_us": round(r["us"], 3), "gbps": round(r["gbps"], 1),
             "pct_of_peak": round(100 * r["gbps"] / peak, 1)} for r in rows]


# the rungs keep run_ladder's own repeat and warm-up counts, not the benchmark's
bench.register_records("reduce_ladder", lambda peak, **timing: records(peak))


def _describe(rung: ladder.Rung):
    def describe(shape, dt, params, device, knobs):
        (n,) = shape if len(shape) == 1 else (math.prod(shape),)
        a = ladder.acc_dtype(dt)
        insts = rung.instantiations(dt)  # the first pass reads the input, later ones the partials
        launches = []
        if rung.single_launch:
            launches.append(card.Launch(insts[0], rung.grid(n, dt.itemsize, device.sm_count), rung.block,
                                        "single launch: last block combines"))
        else:
            cur, left, k = dt, n, 1
            while True:
                g = rung.grid(left, cur.itemsize, device.sm_count)
                launches.append(card.Launch(insts[0] if k == 1 else insts[-1], g, rung.block,
                                            f"pass {k}: {left:,} -> {g:,} values"))
                if g == 1:
                    break
                cur, left, k = a, g, k + 1
        first = launches[0]
        vector = rung.sizing in ("resident_vec", "last_block", "full")
        per_thread = {"one": "one element", "two": "two elements, added while loading"}.get(
            rung.sizing, f"a grid-stride share (about {-(-n // (first.grid * first.block))} elements)")
        tile = {"grid": first.grid, "block": first.block, "launches": len(launches),
                "one_block_computes": "one partial sum of its elements" + (
                    "; the last block to finish sums the partials" if rung.single_launch else ""),
                "one_thread_computes": per_thread, "change_from_previous_rung": rung.change}
        nbytes = reduce_plan.bytes_moved((n,), dt, op="sum")
        written = reduce_plan.default_dtype("sum", dt).itemsize
        partials = sum(x.grid for x in launches[:-1]) * a.itemsize
        traffic = {"bytes_read": nbytes - written, "bytes_written": written,
                   "counted_by": "cukern.reduce.bytes_moved((n,), dtype, op='sum')",
                   "access_bytes": 16 if vector else dt.itemsize,
                   "coalesced": "yes: consecutive threads, consecutive elements",
                   "re_read": [f"per-block partials by later passes ({partials:,} B)" if len(launches) > 1
                               else "nothing: the partials stay in the workspace (L2)"]}
        accumulation = {"reduces": f"the sum of {n:,} elements", "precision": dtype_name(a),
                        "combine": rung.change, "passes": len(launches)}

        def measure():
            x = ladder.make_data(n, dt)
            return lambda: rung(x)

        return card.Described(launches=launches, tile=tile, traffic=traffic, accumulation=accumulation,
                              knobs={"block": rung.block, "grid_sizing": rung.sizing}, bytes=nbytes,
                              bytes_written=written, flops=n, measure=measure,
                              notes=["a ladder rung: fixed by design, not tuned"])

    return describe


for _rung in ladder.RUNGS + (ladder.BEYOND,):
    card.register(card.CardSpec(f"reduce_ladder.{_rung.label}", (LADDER_N,), "float32", _describe(_rung), {},
                                "reduce_ladder", dtypes=ladder.DTYPES))
