"""``python -m cukern``: bench, ladder, info, compile, explain, tune, roofline."""

from __future__ import annotations

import argparse
import json
import sys
import time

from . import bench, families


def _no_gpu(command: str) -> int:
    print(f"cukern {command}: no CUDA GPU found (cupy sees no device); nothing to measure", file=sys.stderr)
    return 2


def _bench(args) -> int:
    if args.results:
        doc = json.loads(open(args.results).read())
        print(bench.format_table(doc["records"]))
        return _bench_plot(doc, args.plot)
    if not bench.gpu_present():
        return _no_gpu("bench")

    def show(r):
        print(f"  {r['op']:<22} {r['impl']:<14} {'x'.join(map(str, r['shape'])):<16} {r['dtype']:<9} "
              f"{r['median_us']:>9.2f} µs {r['gbps']:>7.0f} GB/s {r['pct_of_peak']:>6.1f} %", flush=True)

    doc = bench.run(args.op or None, repeat=args.repeat, peers=not args.no_peers,
                    progress=show if sys.stdout.isatty() else None, tune=not args.no_tune)
    print(f"{doc['device']}, CuPy {doc['cupy_version']}, copy peak {doc['peak_copy_gbps']:.0f} GB/s")
    print(bench.format_table(doc["records"]))
    if args.json:
        bench.write_results(doc, args.json)
        print(f"wrote {args.json}")
    return _bench_plot(doc, args.plot)


def _bench_plot(doc, path) -> int:
    if path:
        from . import report

        report.plot_bandwidth(doc, path)
        print(f"wrote {path}")
    return 0


def _params(items) -> dict:
    out = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"cukern: --param takes KEY=VALUE, got {item!r}")
        out[key] = None if value.lower() == "none" else int(value) if value.lstrip("-").isdigit() else value
    return out


def _explain(args) -> int:
    from . import card

    try:
        c = card.explain(args.op, args.shape, args.dtype, measure=False if args.no_measure else None,
                         **_params(args.param))
    except ValueError as err:
        print(f"cukern explain: {err}", file=sys.stderr)
        return 2
    except RuntimeError as err:  # the kernel source does not compile: the staging section cannot be read
        print(f"cukern explain: {err}", file=sys.stderr)
        return 1
    print(json.dumps(c.as_dict(), indent=1) if args.json else c.format())
    return 0


def _tune(args) -> int:
    if not bench.gpu_present():
        return _no_gpu("tune")
    from . import tuning
    from .card import parse_shape

    if args.shape:
        if not args.op or len(args.op) != 1:
            print("cukern tune: --shape needs exactly one --op", file=sys.stderr)
            return 2
        jobs = [(args.op[0], parse_shape(args.shape), args.dtype or "bfloat16")]
    else:
        jobs = []
        for b in bench.OPS.values():
            for case in b.cases:
                found = tuning.tunable_for_case(case)
                if found and (not args.op or found[0].op in args.op) and (not args.dtype or case.dtype == args.dtype):
                    jobs.append((found[0].op, found[1], case.dtype))
        jobs = list(dict.fromkeys(jobs))
    if not jobs:
        print(f"cukern tune: nothing to tune; tunable ops: {', '.join(sorted(tuning.tunables()))}", file=sys.stderr)
        return 2
    results = []
    for op, shape, dtype in jobs:
        r = tuning.tune(op, shape, dtype, repeat=args.repeat, save=not args.dry_run)
        results.append(r)
        print(tuning.format_result(r), flush=True)
    where = "not saved (--dry-run)" if args.dry_run else f"saved to {tuning.cache_path()}"
    print(f"{len(results)} case(s) tuned; {where}")
    if args.json:
        rows = [{**r.entry(None), "timings": [{"knobs": k, "median_us": us, "error": e} for k, us, e in r.timings]}
                for r in results]
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
        print(f"wrote {args.json}")
    return 0


def _roofline(args) -> int:
    from . import card, report
    from .progress import Progress

    results = json.loads(open(args.results).read()) if args.results else None
    measure = bench.gpu_present() and not args.no_measure
    device = card.current_device()
    ops = args.op or None
    bar = Progress(len(ops or card.CARDS), "roofline", quiet=not measure)
    points = report.roofline_points(ops, results=results, measure=measure, device=device,
                                    progress=lambda op: bar.step(op))
    bar.close()
    print(report.format_roofline(points, device))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": device.label, "peak_gbps": device.peak_gbps, "compute_gflops": device.compute_gflops,
                       "ridge": device.ridge, "points": points}, f, indent=1)
        print(f"wrote {args.json}")
    if args.plot:
        report.plot_roofline(points, device, args.plot)
        print(f"wrote {args.plot}")
    return 0


def _ladder(args) -> int:
    if not bench.gpu_present():
        print("cukern ladder: no CUDA GPU found (cupy sees no device); nothing to measure", file=sys.stderr)
        return 2
    import inspect

    from . import ladder
    from .progress import Progress

    with Progress(len(ladder.RUNGS) + 2, "ladder") as bar:  # the rungs, then cukern.sum and CUB
        extra = {"progress": bar.step} if "progress" in inspect.signature(ladder.run_ladder).parameters else {}
        rows = ladder.run_ladder(args.n, args.dtype, **extra)
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
    p.add_argument("--op", action="append", choices=sorted(bench.OPS) + ["reduce_ladder", "pipeline"],
                   help="only this op (repeatable)")
    p.add_argument("--json", metavar="PATH", help="write the results file")
    p.add_argument("--repeat", type=int, default=100)
    p.add_argument("--no-peers", action="store_true", help="skip torch/Triton peers")
    p.add_argument("--no-tune", action="store_true", help="skip the cukern-tuned records (no tuning)")
    p.add_argument("--plot", metavar="PNG", help="draw GB/s against size for every op and peer (needs matplotlib)")
    p.add_argument("--results", metavar="PATH", help="read this results file instead of measuring (no GPU needed)")
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
    from .card import CARDS

    p = sub.add_parser("explain", help="the six-question card for the launch an op call makes")
    p.add_argument("op", choices=sorted(CARDS), metavar="OP", help=f"one of: {', '.join(sorted(CARDS))}")
    p.add_argument("--shape", help="e.g. 16384x4096 (default: the op's benchmark shape)")
    p.add_argument("--dtype", help="e.g. bfloat16 (default: the op's benchmark dtype)")
    p.add_argument("--param", action="append", metavar="KEY=VALUE", help="op parameter, e.g. axis=0 or kv_heads=8")
    p.add_argument("--json", action="store_true", help="print the card as JSON")
    p.add_argument("--no-measure", action="store_true", help="do not time the op even with a GPU")
    p.set_defaults(fn=_explain)
    p = sub.add_parser("tune", help="time every candidate plan and keep the winner in the tuning cache")
    p.add_argument("--op", action="append", help="only this op (repeatable; default: every tunable benchmark case)")
    p.add_argument("--shape", help="tune this shape (in the op's tuning convention) instead of the benchmark cases")
    p.add_argument("--dtype", help="only this dtype (with --shape: default bfloat16)")
    p.add_argument("--repeat", type=int, default=50)
    p.add_argument("--dry-run", action="store_true", help="do not write the tuning cache")
    p.add_argument("--json", metavar="PATH", help="write every candidate's timing")
    p.set_defaults(fn=_tune)
    p = sub.add_parser("roofline", help="every kernel at its arithmetic intensity against the device's roofs")
    p.add_argument("--op", action="append", help="only this kernel (repeatable)")
    p.add_argument("--plot", metavar="PNG", help="draw the roofline (needs matplotlib)")
    p.add_argument("--results", metavar="PATH", help="achieved times from this results file instead of measuring")
    p.add_argument("--json", metavar="PATH", help="write the points")
    p.add_argument("--no-measure", action="store_true", help="do not time the kernels even with a GPU")
    p.set_defaults(fn=_roofline)
    args = parser.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
