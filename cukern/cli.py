"""``python -m cukern``: bench, ladder, info, compile."""

from __future__ import annotations

import argparse
import json
import sys
import time

from . import bench, families


def _bench(args) -> int:
    if not bench.gpu_present():
        print("cukern bench: no CUDA GPU found (cupy sees no device); nothing to measure", file=sys.stderr)
        return 2
    def show(r):
        print(f"  {r['op']:<22} {r['impl']:<14} {'x'.join(map(str, r['shape'])):<16} {r['dtype']:<9} "
              f"{r['median_us']:>9.2f} µs {r['gbps']:>7.0f} GB/s {r['pct_of_peak']:>6.1f} %", flush=True)

    doc = bench.run(args.op or None, repeat=args.repeat, peers=not args.no_peers,
                    progress=show if sys.stdout.isatty() else None)
    print(f"{doc['device']}, CuPy {doc['cupy_version']}, copy peak {doc['peak_copy_gbps']:.0f} GB/s")
    print(bench.format_table(doc["records"]))
    if args.json:
        bench.write_results(doc, args.json)
        print(f"wrote {args.json}")
    return 0


def _ladder(args) -> int:
    if not bench.gpu_present():
        print("cukern ladder: no CUDA GPU found (cupy sees no device); nothing to measure", file=sys.stderr)
        return 2
    from . import ladder

    rows = ladder.run_ladder(args.n, args.dtype)
    print(ladder.format_table(rows))
    if args.plot:
        ladder.plot_ladder(rows, args.plot)
        print(f"wrote {args.plot}")
    return 0 if all(r["ok"] for r in rows) else 1


def _info(args) -> int:
    doc = bench.info()
    for k, v in doc.items():
        print(f"{k:>20}: {v if v is not None else 'no CUDA GPU found'}")
    return 0


def _compile(args) -> int:
    total = 0
    for fam in families.all_families():
        insts = fam.instantiations()
        t = time.perf_counter()
        compiled = families.compile_family(fam, args.arch)
        res = compiled.resources()
        print(f"{fam.SOURCE}.cu: {len(insts)} instantiations for {args.arch} in {time.perf_counter() - t:.1f} s")
        for inst in insts:
            r = res.get(compiled.lowered[inst.expression], {})
            print(f"  {inst.expression}  regs={r.get('registers')} spills={r.get('spill_stores')}")
        total += len(insts)
    print(f"{total} instantiations compiled for {args.arch}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="cukern", description="hand-written CUDA kernels for CuPy arrays")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("bench", help="time every op against its peers and the copy peak")
    p.add_argument("--op", action="append", choices=sorted(bench.OPS) + ["reduce_ladder"],
                   help="only this op (repeatable)")
    p.add_argument("--json", metavar="PATH", help="write the results file")
    p.add_argument("--repeat", type=int, default=100)
    p.add_argument("--no-peers", action="store_true", help="skip torch/Triton peers")
    p.set_defaults(fn=_bench)
    p = sub.add_parser("ladder", help="run every reduction rung on the same data, with %% of peak and of CUB")
    p.add_argument("--n", type=int, default=1 << 28)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--plot", metavar="PNG", help="draw the bars (needs matplotlib)")
    p.set_defaults(fn=_ladder)
    p = sub.add_parser("info", help="device, versions and the measured copy peak")
    p.set_defaults(fn=_info)
    p = sub.add_parser("compile", help="compile every kernel instantiation with NVRTC (no GPU needed)")
    p.add_argument("--arch", default="sm_90")
    p.set_defaults(fn=_compile)
    args = parser.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
