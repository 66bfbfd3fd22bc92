"""What every op hands the driver, checked with no GPU against what NVRTC made of the kernel: the arguments
against the kernel's parameter list (count, sizes, the struct's bytes and alignment), the block against its
launch bounds, the grid against the hardware's limits, shared memory against what the kernel may take, and
every address inside an array the op was given or made. tests/_record_launches.py runs the ops in a process
of its own over memory nothing reads and records each launch."""

import bisect
import collections
import re

import numpy as np
import pytest
from _support import assert_no_spills, compiled, recording, sampled

import cukern
from cukern import families
from cukern._compile import compile_program

SOURCES = [f.SOURCE for f in families.all_families()]
RECORDER = "_record_launches.py"  # run by tests/_support.py, started at collection (the records marks)
ARCH = "sm_90"
MAX_GRID_X, MAX_GRID_YZ = 2**31 - 1, 65535
STATIC_SHARED = 48 * 1024  # what a block may take without opting in
MAX_SHARED = 227 * 1024  # sm_90's most a block may take, opted in
ARG_TYPES = {"int32": "32", "uint32": "32", "int64": "64", "uint64": "64", "float32": "f32", "float64": "f64"}


@pytest.fixture(scope="module")
def recorded():
    return recording(RECORDER, "launches")


def launches(recorded):
    return [(name, launch) for name, _, done in recorded[0] for launch in done]


def entry(ptx: str):
    """(parameters, launch-bound threads or None, static shared bytes) of one kernel's PTX (``kernel_ptx``),
    each parameter ``(type, bytes, alignment)``."""
    head, _, body = ptx.partition(")")
    params = []
    for p in re.findall(r"\.param ([^\n,]+)", head):
        m = re.fullmatch(r"\.align (\d+) \.b8 \S+\[(\d+)\]", p.strip())
        if m:
            params.append(("struct", int(m.group(2)), int(m.group(1))))
        else:
            kind = p.split()[0]
            params.append((kind, int(re.sub(r"\D", "", kind) or 0) // 8, None))
    bound = re.search(r"\.(?:maxntid|reqntid) (\d+), (\d+), (\d+)", body.split("{", 1)[0])
    threads = None if bound is None else int(bound.group(1)) * int(bound.group(2)) * int(bound.group(3))
    static = sum(int(n) for n in re.findall(r"^\s*\.shared [^\n;]*\[(\d+)\];", body, re.M))
    return params, threads, static


def argument_fits(arg, param) -> bool:
    kind, size, align = param
    if arg[0] == "ptr":
        return kind in (".u64", ".b64", ".s64")
    if arg[0] == "struct":  # a struct, or a scalar passed as its bytes (rotary's answer address)
        return arg[1:3] == (size, align) if kind == "struct" else arg[1] == size
    want = ARG_TYPES[arg[0]]
    return kind.endswith(want) if want.startswith("f") else kind in {f".{t}{want}" for t in "usb"}


@pytest.fixture(scope="module")
def kernels(recorded):
    """``(entries, undeclared)``: :func:`entry` of each launched instantiation this run compiles (its family's
    checked ones: every one under .ci/run's ``--every-instantiation``, a covering sample otherwise) and of the
    launched ones no family lists (compiled here to machine code, sampled the same way), keyed by
    instantiation; and the compilation of those, per source."""
    declared = {i for f in families.all_families() for i in f.instantiations()}
    by_source = collections.defaultdict(set)
    for _, launch in launches(recorded):
        by_source[launch[0].source].add(launch[0])
    entries, undeclared = {}, {}
    for source, insts in by_source.items():
        c = compiled(source, ARCH)
        extra = sampled(sorted((i for i in insts if i not in declared), key=lambda i: i.expression))
        if extra:
            undeclared[source] = compile_program(source, extra, ARCH)
        for inst in insts:
            have = c if inst.expression in c.lowered else undeclared.get(source)
            if have is not None and inst.expression in have.lowered:
                entries[inst] = entry(have.kernel_ptx(inst))
        # a kernel launched only in instantiations the sample left out: one of them, to PTX
        named = {i.name for i in entries if i.source == source}
        lone = {i.name: i for i in sorted(insts, key=lambda i: i.expression) if i.name not in named}
        if lone:
            ptx = compile_program(source, list(lone.values()), ARCH.replace("sm_", "compute_"))
            entries.update((i, entry(ptx.kernel_ptx(i))) for i in lone.values())
    return entries, undeclared


def parameters(kernels, inst):
    """The kernel's parameter list: its own, or a compiled sibling's (a kernel's parameters are pointers,
    scalars and structs whose types no template argument changes)."""
    if inst in kernels[0]:
        return kernels[0][inst][0]
    return next(e[0] for i, e in kernels[0].items() if (i.source, i.name) == (inst.source, inst.name))


@pytest.mark.nvrtc(*SOURCES)
@pytest.mark.records(RECORDER, "launches")
def test_every_kernel_of_every_family_is_launched(recorded):
    launched = {(launch[0].source, launch[0].name) for _, launch in launches(recorded)}
    declared = {(f.SOURCE, i.name) for f in families.all_families() for i in f.instantiations()}
    assert declared <= launched, sorted(declared - launched)


@pytest.mark.records(RECORDER, "launches")
def test_ops_refuse_or_reach_cupy_only(recorded):
    """A case ends in a launch, in a refusal (TypeError, ValueError), or where a step of CuPy's own needs the
    driver; any other exception is a bug in the host path."""
    odd = [(name, error) for name, error, _ in recorded[0]
           if error and not re.match(r"(TypeError|ValueError|CUDARuntimeError|CUDADriverError)\b", error)]
    assert not odd, odd[:10]
    assert sum(1 for _, error, done in recorded[0] if error is None and done) > 1000


@pytest.mark.nvrtc(*SOURCES)
@pytest.mark.records(RECORDER, "launches")
def test_arguments_match_the_kernel_parameters(recorded, kernels):
    bad = []
    for name, (inst, _, _, _, _, args) in launches(recorded):
        params = parameters(kernels, inst)
        if len(args) != len(params) or not all(argument_fits(a, p) for a, p in zip(args, params)):
            bad.append((name, inst.expression, args, params))
    assert not bad, bad[:5]


@pytest.mark.nvrtc(*SOURCES)
@pytest.mark.records(RECORDER, "launches")
def test_blocks_grids_and_shared_memory_fit(recorded, kernels):
    bad = []
    for name, (inst, grid, block, shared, limit, _) in launches(recorded):
        if inst not in kernels[0]:
            continue  # outside this run's sample, declared or not: checked under --every-instantiation
        _, threads, static = kernels[0][inst]
        size = block[0] * (block[1] if len(block) > 1 else 1) * (block[2] if len(block) > 2 else 1)
        fits = size <= (1024 if threads is None else threads) and grid[0] <= MAX_GRID_X
        fits &= all(g <= MAX_GRID_YZ for g in grid[1:]) and static + shared <= MAX_SHARED
        fits &= static + shared <= STATIC_SHARED or (limit is not None and shared <= limit)
        if not fits:
            bad.append((name, inst.expression, grid, block, shared, limit, threads, static))
    assert not bad, bad[:5]


@pytest.mark.records(RECORDER, "launches")
def test_addresses_fall_inside_arrays(recorded):
    cases, allocations = recorded
    spans = sorted(allocations)
    bases = [base for base, _ in spans]

    def inside(address):
        if address == 0 or 0x7F0000000000 <= address < 0x7F0001000000:  # null, pinned
            return True
        at = bisect.bisect_right(bases, address) - 1  # the last array starting at or below the address
        return at >= 0 and address <= bases[at] + spans[at][1]

    bad = [(name, inst.expression, a) for name, (inst, *_, args) in launches(recorded) for a in args
           if (a[0] == "ptr" or a[0] == "uint64" and a[1] >= 1 << 40) and not inside(a[1])]
    assert not bad, bad[:5]


@pytest.mark.nvrtc(*SOURCES)
@pytest.mark.records(RECORDER, "launches")
def test_undeclared_instantiations_compile_clean(kernels):
    """The instantiations no family lists (its ``instantiations`` says which it leaves to compile on first use)
    that these cases launch: no local memory, no spill."""
    for source, c in kernels[1].items():
        assert ".local" not in c.ptx, source
        for name, r in c.resources().items():
            assert_no_spills(r, ARCH, name)


@pytest.mark.records(RECORDER, "capture")
def test_captured_calls_refuse_first_or_keep_their_memory():
    """Each case once as it is (which makes the stream's workspaces), then again while the stream "captures"
    a CUDA graph: it refuses with a RuntimeError before anything is recorded, or it records launches that
    touch no memory the call made and gave back before it returned (where a replay would write once the pool
    hands it on), and it neither waits for the stream nor copies from the host nor pins memory there."""
    cases, _ = recording(RECORDER, "capture")
    waits = [(name, error) for name, error, _, _ in cases if error and error.startswith("CaptureViolation")]
    partial = [(name, error) for name, error, done, _ in cases if error and error.startswith("RuntimeError") and done]
    freed = [(name, hit) for name, _, _, hit in cases if hit]
    assert not waits and not partial and not freed, (waits[:3], partial[:3], freed[:3])
    assert sum(1 for _, error, done, _ in cases if error is None and done) > 1000



# The exception a bad value's label (after "=" in a case's name) asks for: NumPy's where the op mirrors NumPy
# (AxisError, a ValueError and an IndexError, for an axis out of range; TypeError for a bool or float axis).
# A wrong shape, and an overlap (a case with no "="), is a ValueError; a wrong dtype a TypeError.
KINDS = {"numpy": "TypeError", "list": "TypeError", "scalar": "TypeError", "None": "TypeError",
         "2": "AxisError", "-3": "AxisError", "True": "TypeError", "1.0": "TypeError", "complex": "TypeError",
         "last stride 2": "ValueError", "broadcast": "ValueError", "nan": "ValueError", "inf": "ValueError",
         "-inf": "ValueError", **{t: "TypeError" for t in ("float32", "float16", "bfloat16", "float64", "int32",
                                                           "int64", "uint8", "uint64", "bool", "complex64")}}


@pytest.mark.records(RECORDER, "bad")
def test_bad_inputs_are_refused_before_any_launch():
    """Every public op given one bad argument at a time (tests/_record_launches.py's ``bad_cases``: host
    arrays, lists, scalars, None, each dtype the op does not take, wrong shapes and strides, broadcast and
    overlapping outputs, non-finite and mistyped scalars, bad axes, flags, dtypes, ddof and offsets), after a
    valid call of the same op has filled its call caches: a TypeError, ValueError or IndexError (no case is
    about the GPU's state, so no RuntimeError) of the kind :data:`KINDS` names, in one line naming the
    argument, raised before anything is recorded. Each valid call launches, or ends where a step of CuPy's
    own needs the driver (nanmax's host check of its result)."""
    records = recording(RECORDER, "bad")
    broken = [(name, kinds[:1], message) for name, arg, kinds, message, _ in records
              if arg is None and kinds and not {"CUDARuntimeError", "CUDADriverError"} & set(kinds)]
    wrong = []
    for name, arg, kinds, message, launched in records:
        if arg is None:
            continue
        label = name.partition("=")[2]
        want = "ValueError" if not label or label.startswith("shape") else KINDS.get(label)
        if not {"TypeError", "ValueError", "IndexError"} & set(kinds) or want is not None and want not in kinds:
            wrong.append((name, kinds[:1], message))
        elif "\n" in message or not re.search(rf"\b{arg}\b", message) or launched:
            wrong.append((name, message, launched))
    assert not broken and not wrong, (broken[:5], wrong[:10])
    ops = {n for n in cukern.__all__ if callable(getattr(cukern, n))} - {"reduce_ladder"}
    ops |= {f"ladder {r.number}" for r in cukern.reduce_ladder}
    assert ops <= {name.removesuffix(" valid") for name, arg, *_ in records if arg is None}
    assert len(records) > 1500


# The layouts test: each kernel's address formula, from the comment or code beside its parameters in
# cuda_src, as the byte addresses a launch reads or writes. A model takes the launch's arguments (pointers as
# addresses, a struct as its fields by name) and yields (array name, pointer, element offsets, itemsize or None
# for the array's own).

def _rows(rows, inner, s0, s1, n, step):
    """Offsets of the elements i < n of rows r < rows, row r at (r / inner) * s0 + (r % inner) * s1."""
    if rows <= 0 or n <= 0:
        return np.zeros(0, np.int64)
    r = np.arange(rows, dtype=np.int64)
    return ((r // inner * s0 + r % inner * s1)[:, None] + np.arange(n, dtype=np.int64) * step).ravel()


def _heads(tokens, heads, ts, hs, width):
    t, h, e = (np.arange(n, dtype=np.int64) for n in (tokens, heads, width))
    return (t[:, None, None] * ts + h[None, :, None] * hs + e).ravel()


def _cache(p, ptr):
    """A rotary cache's elements any position in range reads: cos at j, sin at sin_offset + j, j < rot / 2."""
    cos = _rows(p["cache_rows"], 1, p["cache_ts"], 0, p["rot"] // 2, 1)
    return "cache", ptr, np.concatenate([cos, cos + p["sin_offset"]]), None


def _model(name, args):
    a = [x[1] if x[0] != "struct" else x[3] for x in args]
    if name in ("rms_norm_rows", "rms_norm_wide", "fused_add_rms_norm_rows", "fused_add_rms_norm_wide"):
        p, fused = a[-1], name.startswith("fused")  # (out, [residual,] x, weight, rstd, p)
        row = {k: _rows(p["rows"], p["inner"], p[f"{k}_s0"], p[f"{k}_s1"], p["hidden"], 1) for k in ("out", "res", "x")}
        yield "out", a[0], row["out"], None
        if fused:
            yield "residual", a[1], row["res"], None
        yield "x", a[2 if fused else 1], row["x"], None
        if a[-2]:  # rstd, one float a row
            yield "rstd", a[-2], _rows(p["rows"], p["inner"], p["rs_s0"], p["rs_s1"], 1, 0), None
    elif name == "rms_norm_backward_rows":  # (dx, partials, dy, x, weight, rstd, dresidual, p): partials, the op's own
        p = a[-1]
        for array, ptr, k in (("out", a[0], "dx"), ("dy", a[2], "dy"), ("x", a[3], "x"), ("dresidual", a[6], "dr")):
            if ptr:
                yield array, ptr, _rows(p["rows"], p["inner"], p[f"{k}_s0"], p[f"{k}_s1"], p["hidden"], 1), None
        if a[5]:
            yield "rstd", a[5], _rows(p["rows"], p["inner"], p["rs_s0"], p["rs_s1"], 1, 0), None
    elif name == "column_tree":  # (out, partials, out_stride, cols, leaves, per_lane)
        yield "dweight", a[0], np.arange(a[3], dtype=np.int64) * a[2], None
    elif name in ("rms_norm_fp8_rows", "rms_norm_fp8_wide", "fused_add_rms_norm_fp8_rows",
                  "fused_add_rms_norm_fp8_wide"):  # (out, scales, [residual,] x, weight, p)
        p, fused = a[-1], name.startswith("fused")
        yield "out", a[0], _rows(p["rows"], p["inner"], p["out_s0"], p["out_s1"], p["hidden"], 1), None
        yield "scales", a[1], _rows(p["rows"], p["inner"], p["sc_s0"], p["sc_s1"], 1, 0), None
        if fused:
            yield "residual", a[2], _rows(p["rows"], p["inner"], p["res_s0"], p["res_s1"], p["hidden"], 1), None
        yield "x", a[-3], _rows(p["rows"], p["inner"], p["x_s0"], p["x_s1"], p["hidden"], 1), None
    elif name == "rotary_embedding":
        p = a[4]
        yield "query", a[0], _heads(p["tokens"], p["q_heads"], p["q_ts"], p["q_hs"], p["rot"]), None
        yield "key", a[1], _heads(p["tokens"], p["heads"] - p["q_heads"], p["k_ts"], p["k_hs"], p["rot"]), None
        yield "positions", a[3], np.arange(p["tokens"], dtype=np.int64) * p["pos_stride"], 8 if p["pos64"] else 4
        yield _cache(p, a[2])
    elif name == "rotary_embedding_positions":  # (q, k, freqs, positions, p): freqs, the op's own table, unmodelled
        p = a[4]
        yield "query", a[0], _heads(p["tokens"], p["q_heads"], p["q_ts"], p["q_hs"], p["rot"]), None
        yield "key", a[1], _heads(p["tokens"], p["heads"] - p["q_heads"], p["k_ts"], p["k_hs"], p["rot"]), None
        yield "positions", a[3], np.arange(p["tokens"], dtype=np.int64) * p["pos_stride"], 8 if p["pos64"] else 4
    elif name == "rotary_embedding_mrope":  # positions[r][t] at r * pos_row_stride + t * pos_stride, r < 3
        p = a[4]
        yield "query", a[0], _heads(p["tokens"], p["q_heads"], p["q_ts"], p["q_hs"], p["rot"]), None
        yield "key", a[1], _heads(p["tokens"], p["heads"] - p["q_heads"], p["k_ts"], p["k_hs"], p["rot"]), None
        yield ("positions", a[3], _rows(3, 1, p["pos_row_stride"], 0, p["tokens"], p["pos_stride"]),
               8 if p["pos64"] else 4)
        yield _cache(p, a[2])
    elif name == "qk_norm_rope":
        p = a[6]
        tokens = p["slots"] // p["heads"]
        assert tokens * p["heads"] == p["slots"], p
        yield "query", a[0], _heads(tokens, p["q_heads"], p["q_ts"], p["q_hs"], p["head_size"]), None
        yield "key", a[1], _heads(tokens, p["heads"] - p["q_heads"], p["k_ts"], p["k_hs"], p["head_size"]), None
        yield "positions", a[5], np.arange(tokens, dtype=np.int64) * p["pos_stride"], 8 if p["pos64"] else 4
        yield _cache(p, a[4])
    elif name == "rotary_first_bad_position":
        yield "positions", a[1], np.arange(a[2]["tokens"], dtype=np.int64) * a[2]["pos_stride"], None
    elif name in ("scan_tiles", "scan_ahead", "scan_columns"):
        p = a[-1]
        rows = p["tiles"] // p["tiles_per_row"] if p["tiles_per_row"] else 0
        yield "result", a[0], _rows(rows, p["inner"], p["o_s0"], p["o_s1"], p["n"], p["o_step"]), None
        yield "x", a[1], _rows(rows, p["inner"], p["x_s0"], p["x_s1"], p["n"], p["x_step"]), None
    elif name in ("argreduce_span", "argreduce_cols"):
        p = a[-1]
        yield "result", a[0], np.arange(p["rows"], dtype=np.int64), 8
        yield "x", a[-2], _rows(p["rows"], p["inner"], p["s0"], p["s1"], p["n"], p["stride"]), None
    elif name == "reduce_full":
        yield "result", a[0], np.zeros(1, np.int64), None
        yield "x", a[3], np.arange(a[4], dtype=np.int64) * a[5], None
    elif name == "reduce_rows":  # (out, x, rows, length, inner, s0, s1, ...)
        yield "result", a[0], np.arange(a[2], dtype=np.int64), None
        yield "x", a[1], _rows(a[2], a[4], a[5], a[6], a[3], 1), None
    elif name == "reduce_cols":  # (out, x, outer, rows, cols, s_outer, s_row, span, spans, ...)
        outer, rows, cols, s_outer, s_row, spans = a[2], a[3], a[4], a[5], a[6], a[8]
        if spans == 1:
            yield "result", a[0], np.arange(outer * cols, dtype=np.int64), None
        yield "x", a[1], (_rows(outer, 1, s_outer, 0, rows, s_row)[:, None] + np.arange(cols)).ravel(), None
    elif name == "reduce_cols_fold":  # (out, partials, outer, cols, spans, ...)
        yield "result", a[0], np.arange(a[2] * a[3], dtype=np.int64), None
    elif name == "reduce_strided":  # (out, x, outputs, o_inner, o_s0, o_s1, count, r_inner, r_s0, r_s1, ...)
        outputs, count = a[2], a[6]
        yield "result", a[0], np.arange(outputs, dtype=np.int64), None
        if outputs and count:
            o = _rows(outputs, a[3], a[4], a[5], 1, 0)
            r = _rows(count, a[7], a[8], a[9], 1, 0)
            yield "x", a[1], (o[:, None] + r).ravel(), None
    elif name == "reduce_lse_weighted":  # (out, sgn or null, x, b, p): x and b through their own strides
        p = a[4]
        outputs, count = p["outputs"], p["count"]
        yield "result", a[0], np.arange(outputs, dtype=np.int64), None
        if a[1]:
            yield "sign", a[1], np.arange(outputs, dtype=np.int64), None
        for array, ptr, o, r in (("x", a[2], "o_s", "r_s"), ("b", a[3], "ow_s", "rw_s")):
            kept = _rows(outputs, p["o_inner"], p[o + "0"], p[o + "1"], 1, 0)
            red = _rows(count, p["r_inner"], p[r + "0"], p[r + "1"], 1, 0)
            yield array, ptr, (kept[:, None] + red).ravel(), None
    elif name == "reduce_lse_complex":  # (out or null, sgn or null, mag or null, x, b, p): as the weighted one
        p = a[5]
        outputs, count = p["outputs"], p["count"]
        yield "result", a[0] or a[2], np.arange(outputs, dtype=np.int64), None
        if a[1]:
            yield "sign", a[1], np.arange(outputs, dtype=np.int64), None
        for array, ptr, o, r in (("x", a[3], "o_s", "r_s"), ("b", a[4], "ow_s", "rw_s")):
            if array == "b" and not p["weighted"]:
                continue  # not read (b is x's pointer)
            kept = _rows(outputs, p["o_inner"], p[o + "0"], p[o + "1"], 1, 0)
            red = _rows(count, p["r_inner"], p[r + "0"], p[r + "1"], 1, 0)
            yield array, ptr, (kept[:, None] + red).ravel(), None
    elif name in ("segment_warp", "segment_cols"):  # (out, x, offsets, p): offsets[s] and offsets[s + 1]
        p = a[3]
        yield "result", a[0], np.arange(p["segments"] * p["cols"], dtype=np.int64), None
        yield "offsets", a[2], np.arange(p["segments"] + 1, dtype=np.int64), None
        yield "x", a[1], _rows(p["rows"], 1, p["row_stride"], 0, p["cols"], p["col_stride"]), None
    else:
        raise AssertionError(f"no address model of {name}")


def _elements(ptr, shape, strides):
    """The byte address of every element of a view."""
    at = np.full((1,) * len(shape), ptr, dtype=np.int64)
    for d, (n, s) in enumerate(zip(shape, strides)):
        at = at + (np.arange(n, dtype=np.int64) * s).reshape((1,) * d + (n,) + (1,) * (len(shape) - d - 1))
    return set(at.ravel().tolist())


@pytest.mark.records(RECORDER, "layouts")
def test_launches_address_exactly_the_views_elements():
    """Seeded draws of layouts (tests/_record_launches.py ``layout_cases``: any axis order, steps either way,
    offsets into a buffer, size-1 and zero-size axes, query and key in one fused qkv buffer, mrope's
    ``[3, tokens]`` positions in any row and token strides or one row broadcast): for every array a kernel
    reads or writes, the set of element addresses its launches' arguments address (each kernel's formula,
    :func:`_model`) is the set of the view's elements. A read from a buffer the op made (a copy of x) is
    counted apart, as are calls that end in CuPy's own copy (no GPU here); rotary_embedding_positions' own
    frequency table is not modelled. Every op of a family of several, and each wide rms_norm kernel, is
    drawn and checked a few times at least."""
    records = recording(RECORDER, "layouts")
    bad, checked, copied, ops = [], collections.Counter(), collections.Counter(), collections.Counter()
    for family, case, error, done, views in records:
        if error is not None:
            copied[family] += "CUDARuntimeError" in error
            continue
        ops[views.get("op", family)] += 1
        ops.update({inst.name for inst, *_ in done})
        got = collections.defaultdict(set)
        for inst, *_, args in done:
            for array, ptr, offsets, size in _model(inst.name, args):
                if array not in views:  # an array the call did not pass (key None): nothing of it addressed
                    if offsets.size:
                        bad.append((case, array, "not passed", offsets.size))
                    continue
                view = views[array]
                if ptr >> 38 != view[0] >> 38:  # another buffer: the op's own copy
                    copied[family] += 1
                    got[array] = None
                    continue
                if got[array] is not None:
                    got[array] |= set((ptr + offsets * (size or view[3])).tolist())
        for array, view in views.items():
            if isinstance(view, (int, str)) or array == "result" and "out" in views or got.get(array, set()) is None:
                continue
            ptr, shape, strides, _ = view
            if family in ("rotary", "rotary_positions", "mrope") and array in ("query", "key"):  # the rotated ones
                shape = shape[:-1] + (views["rot"],)
            want = _elements(ptr, shape, strides)
            have = got.get(array, set())
            if have != want:
                bad.append((case, array, view, len(have - want), len(want - have), sorted(have - want)[:3],
                            sorted(want - have)[:3], [(i.name, a) for i, *_, a in done]))
            checked[family] += 1
    assert not bad, bad[:3]
    assert all(checked[f] >= 20 for f in ("rms_norm", "fused_add_rms_norm", "rms_norm_backward", "rotary",
                                          "rotary_positions", "mrope", "qk_norm_rope", "scan", "argreduce", "reduce",
                                          "segment")), (checked, copied)
    drawn = ("argmax", "argmin", "nanargmax", "nanargmin", "segment_sum", "segment_max", "segment_min",
             "segment_mean", "rotary_embedding_mrope interleaved=False", "rotary_embedding_mrope interleaved=True",
             "rms_norm_wide", "rms_norm_fp8_wide", "fused_add_rms_norm_wide", "fused_add_rms_norm_fp8_wide",
             "rotary_embedding_positions", "column_tree")
    assert all(ops[op] >= 5 for op in drawn), ops
