"""``python -m cukern.lab``: bench, ladder, info, compile, explain, tune, roofline.

A mistake in what was asked (an unknown op, dtype, shape, param or architecture, a missing file, an output
path that cannot be written, ``--plot`` without matplotlib or in a format it does not write, no CuPy) is one
line on stderr and exit status 2, found before anything is measured, compiled or written.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import sys
import time
from collections import Counter
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from pathlib import Path

import cukern
import cukern._launch as _launch
import cukern.lab.bench as bench
import cukern.lab.card as card
import cukern.lab.device as device
import cukern.lab.report as report
import cukern.lab.tune as tune

from .. import _tuned, families, ladder
from .._compile import compile_program, nvrtc_version
from .._dtypes import dtype_name, parse_dtype
from .progress import Progress

# cuda_src/common/dtype.cuh converts to bfloat16 with cvt.rn.bf16.f32, which ptxas takes from sm_80 on
OLDEST_ARCH = 80
# instantiations per NVRTC program: small enough for the progress bar to move and the cores to share the
# work, large enough that parsing the headers again for each program stays a small part of the time
COMPILE_CHUNK = 24


class CommandError(Exception):
    """A mistake in the command line, reported in one line with exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _joined_negatives(argv: list) -> list:
    """``argv`` with a value that starts with a minus sign joined to its flag (``--shape -5x4096`` becomes
    ``--shape=-5x4096``): argparse reads such a value as an unknown option and names the flag's missing
    value instead of the value's mistake, which the command's own check then reports."""
    out: list = []
    for arg in argv:
        prev = out[-1] if out else ""
        if re.match(r"-\.?\d", arg) and prev.startswith("--") and "=" not in prev:
            out[-1] = f"{prev}={arg}"
        else:
            out.append(arg)
    return out


def _no_gpu(command: str) -> int:
    print(f"cukern {command}: no CUDA GPU found (cupy sees no device); nothing to measure", file=sys.stderr)
    return 2


def _require_cupy() -> None:
    try:
        _launch.cupy()
    except ModuleNotFoundError as err:
        raise CommandError(str(err)) from None


def _check_output(path, flag: str) -> None:
    """A CommandError unless ``path`` names a file that can be written: its folder exists and is writable,
    and it is not itself a folder. Checked before any work, so that nothing is measured for a file that
    cannot be written."""
    if path is None:
        return
    p = Path(path)
    if p.is_dir() or str(path).endswith(("/", os.sep)):
        raise CommandError(f"{flag} {path} is a folder; give a file in it, like {p / 'out'}"
                           f"{'.png' if flag == '--plot' else '.json'}")
    folder = p.parent
    if not folder.is_dir():
        raise CommandError(f"{flag} {path}: no folder {folder} to write into")
    if not os.access(folder, os.W_OK):
        raise CommandError(f"{flag} {path}: the folder {folder} is not writable")


def _check_plot(path) -> None:
    if path is None:
        return
    try:
        from matplotlib.backend_bases import FigureCanvasBase
    except ImportError:
        raise CommandError('--plot needs matplotlib, which the plot extra installs: pip install -e ".[plot]" '
                           "in a checkout (or pip install matplotlib)") from None
    _check_output(path, "--plot")
    formats = sorted(FigureCanvasBase.get_supported_filetypes())
    ext = Path(path).suffix.lower().lstrip(".")
    # matplotlib adds .png to a name without a suffix: the file would not be where it was asked for
    if ext not in formats:
        given = f"a .{ext} file" if ext else "no file format"
        raise CommandError(f"--plot {path} names {given}; matplotlib writes {', '.join(formats)} "
                           f"(e.g. {Path(path).with_suffix('.png')})")


RECORD_KEYS = ("op", "impl", "shape", "dtype", "median_us")  # what a results file's every record carries


def _results_file(path) -> dict:
    try:
        with open(path) as f:
            doc = json.load(f)
    except FileNotFoundError:
        raise CommandError(f"--results {path}: no such file (python -m cukern.lab bench --json PATH writes one)") from None
    except (OSError, ValueError) as err:
        raise CommandError(f"--results {path}: not readable as JSON ({err})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("records"), list):
        raise CommandError(f"--results {path}: not a results file (it has no list of records)")
    for i, r in enumerate(doc["records"]):
        missing = [k for k in RECORD_KEYS if not isinstance(r, dict) or k not in r]
        if missing:
            raise CommandError(f"--results {path}: record {i} lacks {', '.join(missing)}")
    return doc


def _at_least(value, least: int, flag: str) -> None:
    if value is not None and value < least:
        raise CommandError(f"{flag} {value} must be at least {least}")


def _bench(args) -> int:
    _check_plot(args.plot)
    _check_output(args.json, "--json")
    _at_least(args.repeat, 1, "--repeat")
    if args.results:
        doc = _results_file(args.results)
        if args.op:
            doc = {**doc, "records": [r for r in doc["records"] if any(bench.picks(op, r) for op in args.op)]}
        print(bench.format_table(doc["records"]))
        print(bench.format_standing(doc["records"]))
        if args.json:
            bench.write_results(doc, args.json)
            print(f"wrote {args.json}")
        return _bench_plot(doc, args.plot)
    _require_cupy()
    if not device.gpu_present():
        return _no_gpu("bench")

    def show(r):
        print(f"  {r['op']:<22} {r['impl']:<14} {'x'.join(map(str, r['shape'])):<16} {r['dtype']:<9} "
              f"{r['median_us']:>9.2f} µs {r['gbps']:>7.0f} GB/s {r['pct_of_peak']:>6.1f} %", flush=True)

    doc = bench.run(args.op or None, repeat=args.repeat, peers=not args.no_peers,
                    progress=show if sys.stdout.isatty() else None, tune=not args.no_tune)
    print(f"{doc['device']}, CuPy {doc['cupy_version']}, copy peak {doc['peak_copy_gbps']:.0f} GB/s")
    print(bench.format_table(doc["records"]))
    print(bench.format_standing(doc["records"]))
    if args.json:
        bench.write_results(doc, args.json)
        print(f"wrote {args.json}")
    return _bench_plot(doc, args.plot)


def _bench_plot(doc, path) -> int:
    if path:
        report.plot_bandwidth(doc, path)
        print(f"wrote {path}")
    return 0


def _params(items) -> dict:
    out = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep:
            raise CommandError(f"--param takes KEY=VALUE, got {item!r}")
        if key in out:
            raise CommandError(f"--param {key} is given twice")
        out[key] = value
    return out


def _explain(args) -> int:
    params = _params(args.param)
    _require_cupy()
    try:
        c = card.build(args.op, args.shape, args.dtype, params, measure=False if args.no_measure else None)
    except (ValueError, TypeError) as err:  # the op's own refusals: TypeError for a wrong type, as NumPy's
        raise CommandError(str(err)) from None
    except RuntimeError as err:  # the kernel source does not compile: the staging section cannot be read
        print(f"cukern explain: {err}", file=sys.stderr)
        return 1
    print(json.dumps(c.as_dict(), indent=1) if args.json else c.format())
    return 0


def _check_dtype(name) -> None:
    try:
        parse_dtype(name)
    except TypeError:
        raise CommandError(f"--dtype {name!r} is not a dtype; give one like bfloat16 or float32") from None


def _tune(args) -> int:
    _check_output(args.json, "--json")
    _at_least(args.repeat, 1, "--repeat")
    if args.shape and (not args.op or len(args.op) != 1):
        raise CommandError("--shape needs exactly one --op")
    if args.dtype:
        _check_dtype(args.dtype)
    try:
        shape = card.parse_shape(args.shape) if args.shape else None
        if shape:
            tune.check_shape(args.op[0], shape)
    except ValueError as err:
        raise CommandError(f"--shape: {err}") from None
    _require_cupy()
    if not device.gpu_present():
        return _no_gpu("tune")
    if shape:
        jobs = [(args.op[0], shape, args.dtype or "bfloat16")]
    else:
        jobs = []
        for b in bench.OPS.values():
            for case in b.cases:
                found = tune.tunable_for_case(case)
                if found and (not args.op or found[0].op in args.op) and (not args.dtype or case.dtype == args.dtype):
                    jobs.append((found[0].op, found[1], case.dtype))
        jobs = list(dict.fromkeys(jobs))
    if not jobs:
        raise CommandError("no benchmark case matches --op and --dtype; name one with --shape")
    results = []
    for op, shape, dtype in jobs:
        r = tune.tune(op, shape, dtype, repeat=args.repeat, save=not args.dry_run)
        results.append(r)
        print(tune.format_result(r), flush=True)
    where = "not saved (--dry-run)" if args.dry_run else f"saved to {_tuned.cache_path()}"
    print(f"{len(results)} case(s) tuned; {where}")
    if args.json:
        rows = [{**r.entry(None), "timings": [{"knobs": k, "median_us": us, "error": e} for k, us, e in r.timings]}
                for r in results]
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
        print(f"wrote {args.json}")
    return 0


def _roofline(args) -> int:
    _check_plot(args.plot)
    _check_output(args.json, "--json")
    results = _results_file(args.results) if args.results else None
    _require_cupy()
    measure = device.gpu_present() and not args.no_measure
    dev = device.current_device()
    ops = args.op or None
    bar = Progress(len(ops or card.CARDS), "roofline", quiet=not measure)
    points = report.roofline_points(ops, results=results, measure=measure, device=dev,
                                    progress=lambda op: bar.step(op))
    bar.close()
    print(report.format_roofline(points, dev))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": dev.label, "peak_gbps": dev.peak_gbps, "compute_gflops": dev.compute_gflops,
                       "ridge": dev.ridge, "points": points}, f, indent=1)
        print(f"wrote {args.json}")
    if args.plot:
        report.plot_roofline(points, dev, args.plot)
        print(f"wrote {args.plot}")
    return 0


def _ladder(args) -> int:
    _check_plot(args.plot)
    _at_least(args.n, 1, "--n")
    _require_cupy()
    if not device.gpu_present():
        return _no_gpu("ladder")
    with Progress(len(ladder.RUNGS) + 2, "ladder") as bar:  # the rungs, then cukern.sum and CUB
        rows = ladder.run_ladder(args.n, args.dtype, progress=bar.step)
    print(ladder.format_table(rows))
    if args.plot:
        ladder.plot_ladder(rows, args.plot)
        print(f"wrote {args.plot}")
    return 0 if all(r["ok"] for r in rows) else 1


def _info(args) -> int:
    _require_cupy()
    doc = bench.info()
    for k, v in doc.items():
        print(f"{k:>20}: {v if v is not None else 'no CUDA GPU found'}")
    return 0


def _check_arch(arch: str) -> None:
    """A CommandError unless ``arch`` is a real architecture (``sm_90``, ``sm_90a``, ``sm_100f``) that this
    NVRTC compiles for and cukern's kernels build on."""
    m = re.fullmatch(r"(sm|compute)_(\d+)([af]?)", arch)
    if m is None:
        raise CommandError(f"--arch {arch!r} is not an architecture; give one like sm_90")
    if m.group(1) == "compute":
        raise CommandError(f"--arch {arch} is a virtual architecture (PTX only: no registers or spills to "
                           f"report); give a real one, sm_{m.group(2)}{m.group(3)}")
    number = int(m.group(2))
    if number < OLDEST_ARCH:
        raise CommandError(f"--arch {arch} is too old: cukern's kernels need sm_{OLDEST_ARCH} or newer (bfloat16)")
    from cupy.cuda import nvrtc

    known = [a for a in nvrtc.getSupportedArchs() if a >= OLDEST_ARCH]
    if number not in known:
        raise CommandError(f"--arch {arch}: NVRTC {nvrtc_version()} does not compile for it; it knows "
                           f"{', '.join(f'sm_{a}' for a in known)}")


def _cpus() -> int:
    # the CPUs this process may run on (a container's cpuset), not every CPU of the host
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _compile_chunk(source: str, insts: list, arch: str) -> dict:
    """Registers and spills of each instantiation in ``insts``, by expression (run in a worker)."""
    compiled = compile_program(source, insts, arch)
    res = compiled.resources()
    return {inst.expression: res.get(compiled.lowered[inst.expression], {}) for inst in insts}


def _compiled_chunks(chunks, arch: str, jobs: int):
    """``(source, resources by expression, instantiation count)`` for each chunk as it is compiled, in ``jobs``
    worker processes when more than one."""
    if jobs == 1:
        for src, insts in chunks:
            yield src, _compile_chunk(src, insts, arch), len(insts)
        return
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        pending = {pool.submit(_compile_chunk, src, insts, arch): (src, len(insts)) for src, insts in chunks}
        try:
            while pending:
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for fut in done:
                    src, n = pending.pop(fut)
                    yield src, fut.result(), n
        finally:  # after a failure or an interrupt, compile nothing more
            pool.shutdown(cancel_futures=True)


def _spill_note(r: dict) -> str:
    stores, loads = r.get("spill_stores", 0), r.get("spill_loads", 0)
    return f"  SPILLS: {stores} B stored, {loads} B loaded" if stores or loads else ""


def _local_bytes(r: dict) -> int:
    """Local memory one instantiation uses: the largest of its spill stores, spill loads and stack frame."""
    return max(r.get("spill_stores", 0), r.get("spill_loads", 0), r.get("stack", 0))


def _compile(args) -> int:
    _at_least(args.jobs, 1, "--jobs")
    _at_least(args.max_local, 0, "--max-local")
    _require_cupy()
    _check_arch(args.arch)
    fams = [families.named(s) for s in dict.fromkeys(args.family)] if args.family else families.all_families()
    todo = {fam.SOURCE: fam.instantiations() for fam in fams}
    chunks = [(src, insts[i:i + COMPILE_CHUNK]) for src, insts in todo.items()
              for i in range(0, len(insts), COMPILE_CHUNK)]
    jobs = max(1, min(args.jobs or _cpus(), len(chunks)))
    total = sum(len(insts) for insts in todo.values())
    start = time.perf_counter()
    found: dict = {src: {} for src in todo}
    chunks_left = Counter(src for src, _ in chunks)
    spilled: dict = {}
    printed = 0

    def print_done_families():
        # families in order, each as soon as all of its chunks are back
        nonlocal printed
        for src in list(todo)[printed:]:
            if chunks_left[src]:
                return
            bar.clear()
            print(f"{src}: {len(todo[src])} instantiations for {args.arch} (cuda_src/{src}.cu)")
            for inst in todo[src]:
                r = found[src][inst.expression]
                note = _spill_note(r)
                if note:
                    spilled[src] = spilled.get(src, 0) + 1
                print(f"  {src}  {inst.expression}  regs={r.get('registers')} spills={r.get('spill_stores')}{note}")
            sys.stdout.flush()
            printed += 1

    try:
        with Progress(total, f"compile {args.arch}") as bar:
            for src, resources, n in _compiled_chunks(chunks, args.arch, jobs):
                found[src].update(resources)
                chunks_left[src] -= 1
                bar.step(src, n=n)
                print_done_families()
    except RuntimeError as err:  # a kernel that does not compile: NVRTC's log says where
        print(f"cukern compile: {err}", file=sys.stderr)
        return 1
    print(f"{total} instantiations compiled for {args.arch} in {time.perf_counter() - start:.1f} s "
          f"({jobs} worker{'s' if jobs > 1 else ''})")
    if spilled:
        where = ", ".join(f"{src} {n}" for src, n in spilled.items())
        print(f"{sum(spilled.values())} instantiations spill to local memory ({where}): marked SPILLS above")
    else:
        print("no instantiation spills")
    if args.max_local is not None:
        over = [(src, expr, _local_bytes(r)) for src in todo for expr, r in found[src].items()
                if _local_bytes(r) > args.max_local]
        if over:
            src, expr, used = max(over, key=lambda o: o[2])
            print(f"cukern compile: {len(over)} instantiations use more than {args.max_local} B of local memory "
                  f"on {args.arch}; the most: {expr} ({src}), {used} B", file=sys.stderr)
            return 1
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="cukern", description="hand-written CUDA kernels for CuPy arrays")
    parser.add_argument("--version", action="version", version=f"cukern {cukern.__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("bench", help="time every op against its peers and the copy peak")
    p.add_argument("--op", action="append", choices=sorted(bench.OPS) + list(bench.record_sets()),
                   help="only this op (repeatable; with --results, only its records)")
    p.add_argument("--json", metavar="PATH", help="write the results file (with --results: the records kept)")
    p.add_argument("--repeat", type=int, default=100, help="timed calls per implementation and case (default 100)")
    p.add_argument("--no-peers", action="store_true", help="skip torch/Triton peers")
    p.add_argument("--no-tune", action="store_true", help="skip the cukern-tuned records (no tuning)")
    p.add_argument("--plot", metavar="PNG", help="draw GB/s against size for every op and peer (needs matplotlib)")
    p.add_argument("--results", metavar="PATH", help="read this results file instead of measuring (no GPU needed)")
    p.set_defaults(fn=_bench)
    p = sub.add_parser("ladder", help="run every reduction rung on the same data, with %% of peak and of CUB")
    p.add_argument("--n", type=int, default=1 << 28, help="elements summed by every rung (default 2^28)")
    p.add_argument("--dtype", default="float32", choices=[dtype_name(t) for t in ladder.DTYPES],
                   help="the elements' dtype (default float32)")
    p.add_argument("--plot", metavar="PNG", help="draw the bars (needs matplotlib)")
    p.set_defaults(fn=_ladder)
    p = sub.add_parser("info", help="device, versions and the measured copy peak")
    p.set_defaults(fn=_info)
    p = sub.add_parser("compile", help="compile every kernel instantiation with NVRTC (no GPU needed)")
    p.add_argument("--arch", default="sm_90", help="a real architecture, sm_80 or newer (default sm_90)")
    p.add_argument("--family", action="append", choices=list(dict.fromkeys(f.SOURCE for f in families.all_families())),
                   help="only the family in cuda_src/FAMILY.cu (repeatable; default: every family)")
    p.add_argument("--jobs", type=int, help="worker processes, at least 1 (default: one per CPU)")
    p.add_argument("--max-local", type=int, metavar="BYTES",
                   help="exit 1 when an instantiation uses more local memory (spills or stack) than BYTES")
    p.set_defaults(fn=_compile)
    p = sub.add_parser("explain", help="the six-question card for the launch an op call makes")
    p.add_argument("op", choices=sorted(card.CARDS), metavar="OP", help=f"one of: {', '.join(sorted(card.CARDS))}")
    p.add_argument("--shape", help="e.g. 16384x4096 (default: the op's benchmark shape)")
    p.add_argument("--dtype", help="e.g. bfloat16 (default: the op's benchmark dtype)")
    p.add_argument("--param", action="append", metavar="KEY=VALUE", help="op parameter, e.g. axis=0 or kv_heads=8")
    p.add_argument("--json", action="store_true", help="print the card as JSON")
    p.add_argument("--no-measure", action="store_true", help="do not time the op even with a GPU")
    p.set_defaults(fn=_explain)
    p = sub.add_parser("tune", help="time every candidate plan and keep the winner in the tuning cache")
    p.add_argument("--op", action="append", choices=sorted(tune.TUNABLES),
                   help="only this op (repeatable; default: every tunable benchmark case)")
    p.add_argument("--shape", help="tune this shape (in the op's tuning convention) instead of the benchmark cases")
    p.add_argument("--dtype", help="only this dtype (with --shape: default bfloat16)")
    p.add_argument("--repeat", type=int, default=50, help="timed calls per candidate plan (default 50)")
    p.add_argument("--dry-run", action="store_true", help="do not write the tuning cache")
    p.add_argument("--json", metavar="PATH", help="write every candidate's timing")
    p.set_defaults(fn=_tune)
    p = sub.add_parser("roofline", help="every kernel at its arithmetic intensity against the device's roofs")
    p.add_argument("--op", action="append", choices=sorted(card.CARDS), metavar="OP",
                   help="only this kernel (repeatable): a card, as python -m cukern.lab explain names them")
    p.add_argument("--plot", metavar="PNG", help="draw the roofline (needs matplotlib)")
    p.add_argument("--results", metavar="PATH", help="achieved times from this results file instead of measuring")
    p.add_argument("--json", metavar="PATH", help="write the points")
    p.add_argument("--no-measure", action="store_true", help="do not time the kernels even with a GPU")
    p.set_defaults(fn=_roofline)
    return parser


def main(argv=None) -> int:
    args = _parser().parse_args(_joined_negatives(sys.argv[1:] if argv is None else list(argv)))
    try:
        return args.fn(args)
    except CommandError as err:
        print(f"cukern {args.command}: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"cukern {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader (head, less) left early: nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
