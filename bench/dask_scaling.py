"""How cukern.dask scales over the GPUs of one machine: an rms_norm + sum workload timed on one dask-cuda
worker and on two, in one run, written as the records ``dask_rms_norm_sum`` (impls ``dask-1gpu`` and
``dask-2gpu``) of a results file in the form of ``bench/results/h200.json``.

The workload: ``x`` [rows, hidden] float32 made on the workers in row chunks (half by each worker that will
compute on it; only seeds leave this process), then ``passes`` rms_norms of every chunk (Dask fuses them
into one task per chunk, whose kernels queue back to back) and a sum of everything. The one-GPU setting
keeps all of ``x`` on one worker and runs there; the two-GPU setting has the same values, half on each.
A figure is the median wall time of a run, from submitting the (already built and fused) graph to the
total on this process, over ``--repeat`` runs after one warm-up; the settings alternate run by run. GB/s
counts the bytes the kernels must move (rms_norm's and sum's ``bytes_moved``); ``pct_of_peak`` is of the
copy peak of the GPUs used (device 0's device-to-device copy, measured here before the cluster starts,
times their number).

Needs distributed and dask-cuda (bench/fetch_wheels.sh carries them to a machine that lacks them) and two
GPUs; ``--gpus 1`` runs the one-GPU setting alone (``dask-1gpu``), for a machine with one. From the
repository root: ``PYTHONPATH=. python3 bench/dask_scaling.py [--gpus 1] [--json PATH]``.
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

OP = "dask_rms_norm_sum"
TARGET = 1.8  # the speedup of two GPUs over one the project aims for


def make_rows(client, workers, rows: int, hidden: int, chunk_rows: int, seed: int):
    """x [rows, hidden] float32 normal, a share of the rows made and kept by each of ``workers`` (a worker
    named twice makes two shares); the values depend on the seed and the share count only."""
    import cupy
    import dask.array as da
    from distributed import wait

    share = rows // len(workers)
    parts = []
    for i, worker in enumerate(workers):
        rng = da.random.default_rng(cupy.random.default_rng(seed + i))
        part = rng.standard_normal((share, hidden), chunks=(chunk_rows, hidden), dtype=cupy.float32)
        parts.append(client.persist(part, workers=[worker]))
    x = client.persist(da.concatenate(parts))
    wait(x)
    return x


def workload(x, weight, passes: int):
    """The graph timed. Built anew for every run: the weight enters it under a fresh random name, so no
    run can find the previous one's result still held by the cluster."""
    import dask.array as da

    import cukern.dask as ckd

    w = da.from_array(weight, chunks=weight.shape, asarray=False, name=False)
    y = x
    for _ in range(passes):
        y = ckd.rms_norm(y, w)
    return ckd.sum(y)


def run_once(client, x, weight, passes: int, where):
    import dask

    # built and fused before the clock starts: work on this process that the number of GPUs does not change
    (graph,) = dask.optimize(workload(x, weight, passes))
    start = time.perf_counter()
    total = client.compute(graph, workers=where, optimize_graph=False).result()
    return time.perf_counter() - start, float(total)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1 << 21)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--chunk-rows", type=int, default=1 << 18, help="rows per chunk (default: 8 chunks of 4 GiB)")
    ap.add_argument("--passes", type=int, default=64,
                    help="rms_norms per chunk (default: 64 passes of 69 GB, about 1 s at an H200's copy rate)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--gpus", type=int, choices=(1, 2), default=2,
                    help="2: both settings on two GPUs (default); 1: the one-GPU setting alone")
    ap.add_argument("--json", help="the results file to write (default: bench/results/h200x2.json with two GPUs, "
                                   "none with one)")
    args = ap.parse_args(argv)
    if args.json is None and args.gpus == 2:
        args.json = str(Path(__file__).resolve().parent / "results" / "h200x2.json")
    if args.rows % (2 * args.chunk_rows):
        ap.error(f"--rows {args.rows} must be a multiple of 2 x --chunk-rows ({2 * args.chunk_rows}): "
                 "each worker takes whole chunks")

    import cupy
    import dask
    from dask_cuda import LocalCUDACluster
    from distributed import Client

    from cukern import reduce, rmsnorm, timing
    from cukern._compile import source_sha256

    if cupy.cuda.runtime.getDeviceCount() < args.gpus:
        print(f"dask_scaling --gpus {args.gpus} needs {args.gpus} GPUs, this machine has "
              f"{cupy.cuda.runtime.getDeviceCount()}", file=sys.stderr)
        return 2
    shape = (args.rows, args.hidden)
    nbytes = args.passes * rmsnorm.bytes_moved(shape, "float32", "float32") + reduce.bytes_moved(shape, "float32")
    peak = timing.peak_bandwidth()
    cupy.get_default_memory_pool().free_all_blocks()  # the copy's buffers, on GPU 0, which a worker shares
    name = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    weight = cupy.ones(args.hidden, dtype=cupy.float32)
    # tasks stay where their chunks are: a stolen task would carry a 4 GiB chunk over TCP
    with dask.config.set({"distributed.scheduler.work-stealing": False}), \
            LocalCUDACluster(n_workers=args.gpus, CUDA_VISIBLE_DEVICES=",".join(map(str, range(args.gpus))),
                             protocol="tcp", threads_per_worker=1, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        workers = sorted(client.scheduler_info()["workers"])
        a = workers[0]
        settings = {"dask-1gpu": (1, [a, a], [a])}
        if args.gpus == 2:
            settings["dask-2gpu"] = (2, workers, None)
        data = {impl: make_rows(client, makers, args.rows, args.hidden, args.chunk_rows, seed=0)
                for impl, (_, makers, _) in settings.items()}
        seconds = {impl: [] for impl in settings}
        totals = {}
        for run in range(args.repeat + 1):
            for impl, (_, _, where) in settings.items():
                s, totals[impl] = run_once(client, data[impl], weight, args.passes, where)
                if run:
                    seconds[impl].append(s)
    records = []
    for impl, (gpus, _, _) in settings.items():
        median = statistics.median(seconds[impl])
        gbps = nbytes / median / 1e9
        records.append({"op": OP, "impl": impl, "shape": list(shape), "dtype": "float32",
                        "median_us": round(median * 1e6, 3), "gbps": round(gbps, 1),
                        "pct_of_peak": round(100 * gbps / (gpus * peak), 1)})
        print(f"{impl}: median {median * 1e3:.1f} ms of {len(seconds[impl])} runs "
              f"({', '.join(f'{s * 1e3:.1f}' for s in seconds[impl])}), {gbps:.0f} GB/s, "
              f"{records[-1]['pct_of_peak']:.1f} % of {gpus} x {peak:.0f} GB/s")
    if args.gpus == 2:
        speedup = records[0]["median_us"] / records[1]["median_us"]
        print(f"{OP} {args.rows}x{args.hidden} float32, {args.passes} passes, {nbytes / 1e9:.1f} GB a run: "
              f"2 GPUs / 1 GPU = {speedup:.2f}x (target >= {TARGET}x: {'met' if speedup >= TARGET else 'missed'})")
    if args.json:
        doc = {"device": f"{name} x{args.gpus}", "cupy_version": cupy.__version__, "source_sha256": source_sha256(),
               "peak_copy_gbps": round(peak, 1), "records": records}
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {args.json}")
    if args.gpus == 2 and totals["dask-1gpu"] != totals["dask-2gpu"]:
        print(f"the settings disagree: total {totals['dask-1gpu']!r} on one GPU, {totals['dask-2gpu']!r} on two "
              "(same values, same chunks, same tree: expected bitwise equal)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":  # the workers are spawned processes that import this file again
    sys.exit(main())
