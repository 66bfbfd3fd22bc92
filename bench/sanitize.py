"""Every public op on its edge cases, once, for compute-sanitizer (``bench/run_h200.sh sanitize`` runs it
under memcheck, racecheck, initcheck and synccheck).

Covers odd and empty sizes, misaligned and strided views, both RMSNorm kernels, fused residual-add in
place, NeoX and GPT-J rotation with partial rotary_dim, GQA, fused-qkv views and the position check, every
reduction layout (full, rows, columns in one and two passes, strided, size-1 axis, copied) with negative
and padded strides, QK-norm + RoPE, float8 outputs, cache-free and multimodal rotation, arg-reductions,
segmented reductions, scans (both scan kernels), and a CUDA graph of the capturable calls replayed. Exits non-zero on any Python
error.

Every input is filled before use, so initcheck can only report memory a kernel reads that nobody wrote.
Sizes are small: the tools slow kernels down 10 to 100 times.
"""

from __future__ import annotations

import sys

import numpy as np

import cukern
from cukern._dtypes import BFLOAT16

F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
I32, I64, BOOL = np.dtype(np.int32), np.dtype(np.int64), np.dtype(np.bool_)
FLOATS = (F32, F16, BFLOAT16)
REDUCTIONS = {
    "sum": (F32, F64, F16, BFLOAT16, I32, I64, BOOL),
    "mean": (F32, F64, F16, BFLOAT16, I32, I64, BOOL),
    "sum_of_squares": (F32, F64, F16, BFLOAT16, I32, I64),
    "norm": (F32, F64, F16, BFLOAT16, I32, I64),
    "amax": (F32, F64, F16, BFLOAT16, I32, I64),
    "amin": (F32, F64, F16, BFLOAT16, I32, I64),
}

_rng = np.random.default_rng(0)
calls = 0


def dev(shape, dtype):
    """A filled device array: normal floats, integers in [-50, 50], random booleans."""
    import cupy

    dtype = np.dtype(dtype)
    if dtype == BOOL:
        host = _rng.random(shape) < 0.5
    elif dtype.kind == "i":
        host = _rng.integers(-50, 51, shape)
    else:
        host = _rng.standard_normal(shape)
    return cupy.asarray(np.asarray(host).astype(dtype))


def run(fn, *args, **kwargs):
    """Call, wait for the device and read the result back, so an asynchronous failure surfaces here."""
    import cupy

    global calls
    result = fn(*args, **kwargs)
    cupy.cuda.Device().synchronize()
    for r in result if isinstance(result, tuple) else () if result is None else (result,):
        cupy.asnumpy(r)  # (out, scales) from a per-token float8 call
    calls += 1
    return result


def rms_norm_cases():
    for dtype in FLOATS:
        for hidden in (1, 7, 4096, 4099, 70000):
            rows = 2 if hidden > 5000 else 5
            base = dev((rows + 1, hidden + 1), dtype)
            w = dev(hidden + 1, dtype)
            for x in (base[:rows, :hidden], base[:rows, 1:], base[::-2, :hidden], base[1:, 1:]):
                run(cukern.rms_norm, x, w[1:], 1e-6)
                run(cukern.rms_norm, x, w[:hidden].astype(F32), offset=1.0)
                out = dev((rows + 1, hidden + 1), dtype)[1:, 1:]
                run(cukern.rms_norm, x, out=out[:x.shape[0]])
                r = dev(x.shape, dtype)
                run(cukern.fused_add_rms_norm, x, r, w[:hidden])
            x = dev((rows, hidden), dtype)
            run(cukern.fused_add_rms_norm, x, dev(x.shape, dtype), None, 1e-5, out=x)
            run(cukern.rms_norm, x, out=x)
    deep = dev((4, 6, 10, 96), BFLOAT16)[::2, 1:, ::3, :64]  # leading dimensions that do not merge
    run(cukern.rms_norm, deep)
    run(cukern.fused_add_rms_norm, deep, dev(deep.shape, BFLOAT16))
    for shape in ((0, 64), (4, 0), (0,)):
        run(cukern.rms_norm, dev(shape, F32))
        run(cukern.fused_add_rms_norm, dev(shape, F32), dev(shape, F32))


def rotary_cases():
    import cupy

    for dtype in FLOATS:
        for cache_dtype in sorted({F32, dtype}, key=str):
            for is_neox in (True, False):
                for head, rot, width in ((128, 128, 128), (64, 32, 32), (64, 32, 96), (7, 6, 6)):
                    tokens, nh, nkv = 9, 8, 2  # GQA
                    cache = cukern.rope_cache(64, width, dtype=cache_dtype)
                    pos = cupy.asarray(_rng.integers(0, 64, tokens))
                    qkv = dev((tokens, (nh + 2 * nkv) * head + 1), dtype)  # one element of misalignment
                    for off in (0, 1):
                        flat = qkv[:, off:off + (nh + 2 * nkv) * head]
                        q = flat[:, :nh * head].reshape(tokens, nh, head)
                        k = flat[:, nh * head:(nh + nkv) * head].reshape(tokens, nkv, head)
                        run(cukern.rotary_embedding, pos, q, k, cache, is_neox=is_neox, rotary_dim=rot)
                        run(cukern.rotary_embedding, pos[::-1], q, None, cache, is_neox=is_neox,
                            rotary_dim=rot, inverse=True)  # strided positions
                    bad = pos.copy()
                    bad[3] = 64
                    run(cukern.rotary_embedding, bad.astype(I32), q, k, cache, is_neox=is_neox, rotary_dim=rot,
                        check_positions=False)  # token 3 left as it is, the cache never read past its end
                    try:
                        cukern.rotary_embedding(bad, q, k, cache, rotary_dim=rot)
                    except IndexError:
                        pass
                    else:
                        raise AssertionError("an out-of-range position was not reported")
    empty = dev((0, 4, 64), F32)
    run(cukern.rotary_embedding, cupy.zeros(0, I64), empty, None, cukern.rope_cache(8, 64))
    run(cukern.rotary_embedding, cupy.zeros(3, I64), dev((3, 0, 64), F32), None, cukern.rope_cache(8, 64))


def reduction_cases():
    for name, dtypes in REDUCTIONS.items():
        fn = getattr(cukern, name)
        for dtype in dtypes:
            run(fn, dev(7, dtype))  # full, one block
            x = dev(100004, dtype)
            run(fn, x[:100003])  # full, many blocks
            run(fn, x[1:])  # misaligned
            run(fn, x[::-3])  # negative stride
            m = dev((33, 1032), dtype)
            run(fn, m[:, 1:], axis=1)  # rows, misaligned
            run(fn, m, axis=0)  # columns, one pass
            run(fn, dev((1024, 96), dtype), axis=0)  # columns, two passes
        for dtype in (F32, BFLOAT16, F64):
            x = dev((7, 3, 257), dtype)
            run(fn, x, axis=(0, 2))  # strided
            run(fn, x[:, ::-1, 1:], axis=-1)
            run(fn, x, axis=1, keepdims=True)
            run(fn, dev((5, 1, 7), dtype), axis=1)  # size-1 axis: elementwise
            run(fn, dev((3, 4, 5, 6), dtype)[::2, :, ::2].transpose(2, 0, 3, 1), axis=(1, 3))  # copied first
            kept = run(fn, x, axis=1)
            run(fn, x, axis=1, out=dev(kept.shape, kept.dtype))  # written directly
            run(fn, x, axis=1, out=dev(kept.shape, kept.dtype)[::-1])  # through a temporary
        if name not in ("amax", "amin"):  # empty reductions (amax and amin refuse them)
            run(fn, dev((3, 5), F32)[:, :0])
            run(fn, dev((3, 0), F32), axis=1)


NEWER_REDUCTIONS = {
    "var": (F32, F64, F16, BFLOAT16, I32), "std": (F32,), "nansum": (F32, F16, BFLOAT16), "nanmean": (F32,),
    "nanmax": (F32, BFLOAT16), "nanmin": (F32,), "prod": (F32, F64, I32, np.complex64, np.complex128),
    "logsumexp": (F32, F64, BFLOAT16), "count_nonzero": (F32, I32), "any": (F32,), "all": (F32,),
}


def newer_reduction_cases():
    """var, std, the NaN-aware ops, counts, prod and logsumexp (with weights too) on the full, row, column and
    strided layouts."""
    for name, dtypes in NEWER_REDUCTIONS.items():
        fn = getattr(cukern, name)
        for dtype in dtypes:
            x = dev(100004, dtype)
            run(fn, dev(7, dtype))
            run(fn, x[:100003])
            run(fn, x[1:])
            run(fn, x[::-3])
            m = dev((33, 1032), dtype)
            run(fn, m[:, 1:], axis=1)
            run(fn, m, axis=0)
            run(fn, dev((7, 3, 257), dtype), axis=(0, 2))
            if name == "logsumexp":  # weights: one row broadcast over the rows, a strided column, copied layouts
                run(fn, m[:, 1:], axis=1, b=dev(1031, dtype), return_sign=True)
                run(fn, m, axis=0, b=dev((33, 1), dtype)[::-1])
                run(fn, dev((4, 5, 6, 7), dtype).transpose(1, 0, 2, 3), axis=3, b=dev(7, dtype), return_sign=True)


def fused_and_quantized_cases():
    """qk_norm_rope on fused-qkv views (GQA, partial rotary_dim, key None), rms_norm and fused_add_rms_norm
    with float8 outputs (static and per-token scales), the cache-free and multimodal rotations."""
    import cupy

    for dtype in FLOATS:
        for is_neox in (True, False):
            for head, rot in ((128, 128), (64, 32), (72, 72)):
                tokens, nh, nkv = 7, 8, 2
                cache = cukern.rope_cache(64, rot, dtype=F32)
                pos = cupy.asarray(_rng.integers(0, 64, tokens))
                qkv = dev((tokens, (nh + 2 * nkv) * head + 1), dtype)[:, 1:]  # misaligned fused view
                q = qkv[:, :nh * head].reshape(tokens, nh, head)
                k = qkv[:, nh * head:(nh + nkv) * head].reshape(tokens, nkv, head)
                wq, wk = dev(head, dtype), dev(head, dtype)
                run(cukern.qk_norm_rope, pos, q, k, wq, wk, cache, is_neox=is_neox, rotary_dim=rot)
                run(cukern.qk_norm_rope, pos, q, None, wq, None, cache, is_neox=is_neox, rotary_dim=rot)
                run(cukern.rotary_embedding_positions, pos, q, k, rotary_dim=rot, is_neox=is_neox)
        for hidden in (7, 127, 4096, 4099):  # element and vector rows (the staged per-token y), the wide kernel
            x, w = dev((5, hidden), dtype), dev(hidden, dtype)
            for scale in (0.5, "per_token"):
                run(cukern.rms_norm, x, w, out_dtype="float8_e4m3fn", scale=scale)
                run(cukern.fused_add_rms_norm, x, dev(x.shape, dtype), w, out_dtype="float8_e4m3fn", scale=scale)
    q, k = dev((9, 4, 128), BFLOAT16), dev((9, 2, 128), BFLOAT16)
    mpos = cupy.asarray(_rng.integers(0, 64, (3, 9)))
    run(cukern.rotary_embedding_mrope, mpos, q, k, cukern.rope_cache(64, 128), mrope_section=[16, 24, 24])


def science_cases():
    """argmax and friends, segmented reductions and scans on odd, strided and empty inputs."""
    import cupy

    for dtype in (F32, F64, F16, BFLOAT16, I32):
        x = dev((33, 1031), dtype)
        for fn in (cukern.argmax, cukern.argmin):
            run(fn, x)
            run(fn, x[:, 1:], axis=1)
            run(fn, x[::-1], axis=0)
        if dtype.kind == "f":
            run(cukern.nanargmax, x, axis=1)
        run(cukern.cumsum, x[:, 1:], axis=1)
        run(cukern.cumsum, x, axis=0)
        run(cukern.cumsum, x[::-2])
        if dtype.kind == "f":
            run(cukern.cumprod, x * 0 + 1, axis=1)
        offsets = cupy.asarray(np.array([0, 0, 5, 6, 33], np.int64))
        for fn in (cukern.segment_sum, cukern.segment_max, cukern.segment_min, cukern.segment_mean):
            run(fn, x, offsets)
            run(fn, x[:, :7], offsets.astype(I32))
            if dtype == I32:  # the integer kernels of the narrow types and bool (64-bit accumulators)
                run(fn, x[:, 1:9].astype(np.int16), offsets)
                run(fn, x[:, :40] > 0, offsets)
    for dtype in FLOATS:  # scan_ahead: rows of unit stride with 16-byte aligned starts, several a launch
        x = dev((6, 4104), dtype)
        run(cukern.cumsum, x, axis=1)
        run(cukern.cumprod, x * 0 + 1, axis=1)
        y = x.copy()
        run(cukern.cumsum, y, axis=1, out=y)
    for dtype in FLOATS:  # scan_columns: the walk over whole and partial tiles, the last column group part
        x = dev((4099, 4300), dtype)  # empty; then column_tiles' three launches (three groups of 70 lines)
        run(cukern.cumsum, x, axis=0)
        x = dev((4100, 70), dtype)
        run(cukern.cumsum, x, axis=0)
        run(cukern.cumprod, x[::-1] * 0 + 1, axis=0)
    run(cukern.argmax, dev(100003, F32))
    run(cukern.cumsum, dev(100003, F32))
    run(cukern.cumsum, dev((0, 5), F32), axis=0)


def graph_cases():
    """Capturable calls (no host synchronization, no temporary: ``out=`` given, positions unchecked) captured
    once, after eager calls made the kernels and the stream's workspace, and replayed."""
    import cupy

    x, w = dev((64, 4096), BFLOAT16), dev(4096, BFLOAT16)
    y, r = dev((8, 1000), F32), dev((8, 1000), F32)
    q, k = dev((16, 8, 128), BFLOAT16), dev((16, 2, 128), BFLOAT16)
    cache, pos = cukern.rope_cache(64, 128), cupy.asarray(_rng.integers(0, 64, 16))
    m, tall = dev((64, 4096), F32), dev((1024, 96), F32)
    outs = [dev(x.shape, BFLOAT16), cupy.empty((), F32), cupy.empty(64, F32), cupy.empty(4096, F32),
            cupy.empty(96, F32)]

    def step():
        cukern.rms_norm(x, w, out=outs[0])
        cukern.fused_add_rms_norm(y, r, out=y)
        cukern.rotary_embedding(pos, q, k, cache, check_positions=False)
        cukern.sum(m, out=outs[1])
        cukern.amax(m, axis=1, out=outs[2])
        cukern.norm(m, axis=0, out=outs[3])
        cukern.mean(tall, axis=0, out=outs[4])  # two passes through the stream's workspace

    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        for _ in range(2):  # compile, plan and make the stream's workspace before capturing
            step()
        stream.synchronize()
        stream.begin_capture()
        step()
        graph = stream.end_capture()
        for _ in range(3):
            graph.launch(stream)
        stream.synchronize()
    global calls
    calls += 3


def main() -> int:
    import cupy

    for part in (rms_norm_cases, rotary_cases, reduction_cases, newer_reduction_cases, fused_and_quantized_cases,
                 science_cases, graph_cases):
        part()
        print(f"{part.__name__}: done ({calls} calls so far)", flush=True)
    cupy.cuda.Device().synchronize()
    print(f"sanitize: {calls} calls returned")
    return 0


if __name__ == "__main__":
    sys.exit(main())
