"""cumsum and cumprod: planning and the emulator on the host, the compiled kernels, and on a GPU every dtype,
axis and layout against the emulator (bits) and NumPy in float64 (closeness)."""

from __future__ import annotations

import gc
import re
from types import SimpleNamespace

import numpy as np
import pytest
from _support import (
    ARCHS,
    assert_close,
    assert_no_spills,
    capture,
    checked_instantiations,
    compiled,
    fake_array,
    refused_in_capture,
    same_bits,
    struct_fields,
    victims,
)

from cukern import reference as R
from cukern import scan as C
from cukern._dtypes import BFLOAT16, dtype_name
from cukern.reduce_plan import k_strides

OPS = tuple(C.OPS)


def _values(rng, shape, dtype, op):
    """Positive values near 1 for products (no overflow), around 1 for sums; integers small."""
    dt = np.dtype(dtype)
    if dt == np.bool_:
        return rng.random(shape) < 0.5
    if dt.kind == "i":
        return rng.integers(-3, 4, shape).astype(dt) if op == "cumsum" else rng.choice([-1, 1, 2], shape).astype(dt)
    spread = 1e-3 if op == "cumprod" else 0.5
    return (1 + spread * rng.uniform(-1, 1, shape)).astype(dt)


class _FakeCupy:
    """What :func:`cukern.scan.workspace` asks of CuPy: one stream on device 0, capturing or not, allocations
    that know their size and address, their fills and the memsets recorded."""

    def __init__(self, capturing: bool):
        self.allocations, self.fills, self.memsets = [], [], []
        stream = SimpleNamespace(ptr=7, is_capturing=lambda: self.capturing)
        self.capturing = capturing
        runtime = SimpleNamespace(getDevice=lambda: 0, memsetAsync=lambda *a: self.memsets.append(a))
        self.cuda = SimpleNamespace(get_current_stream=lambda: stream, runtime=runtime)

    def empty(self, n, dtype):
        buf = SimpleNamespace(size=n, data=SimpleNamespace(ptr=1 << 20 * (1 + len(self.allocations))))
        buf.fill = lambda v, buf=buf: self.fills.append(buf)
        self.allocations.append(buf)
        return buf

    zeros = empty


def test_workspace_is_made_and_grown_only_outside_a_capture(monkeypatch):
    """Eagerly the workspace is made, grown (outgrown buffers kept) and the epoch advanced, never to the
    captured launches' epoch; under capture it must be large enough already (nothing allocated otherwise),
    and the capture records the clearing of the words the launch uses."""
    fake = _FakeCupy(capturing=True)
    monkeypatch.setattr(C, "_cupy", lambda: fake)
    monkeypatch.setattr(C, "_workspaces", {})
    with pytest.raises(RuntimeError, match="before capturing"):
        C.workspace(10)  # none yet: making one would allocate inside the capture
    assert fake.allocations == [] and C._workspaces == {}
    fake.capturing = False
    ws, epoch = C.workspace(10)
    assert ws.tiles == 10 and epoch == 1 and fake.fills == [ws.status]  # a new cycle clears the words
    fake.capturing = True
    made = len(fake.allocations)
    assert C.workspace(10) == (ws, C.CAPTURED_EPOCH) and C.workspace(4) == (ws, C.CAPTURED_EPOCH)
    words = ws.status.data.ptr
    assert fake.memsets == [(words, 0, 80, 7), (words + 80, 0, 80, 7), (words, 0, 32, 7), (words + 80, 0, 32, 7)]
    with pytest.raises(RuntimeError, match="for 11 tiles"):
        C.workspace(11)  # would have to grow
    assert len(fake.allocations) == made and ws.epoch == 1
    fake.capturing = False
    first = [ws.status, ws.values]
    assert C.workspace(11) == (ws, 2) and ws.tiles == 20 and ws.outgrown == first  # kept: graphs may use them
    ws.epoch = C.EPOCHS - 3
    assert C.workspace(1)[1] == C.EPOCHS - 2 and C.workspace(1)[1] == 1  # the cycle skips CAPTURED_EPOCH
    assert C.CAPTURED_EPOCH == C.EPOCHS - 1 and fake.fills[-1] is ws.status


# ---------------------------------------------------------------------------------------------------------
# Planning (pure).


def test_result_layout_is_numpys(rng):
    """A scan's result without ``out`` is laid out as NumPy's (K order: cukern/scan.py `_run` scans x's
    memory-order view, `_layout.k_order` with no reduced axis, and transposes back, which gives the strides
    `reduce_plan.k_strides` plans with no reduced axis): those of the result's axes longer than one against
    np.cumsum's, on permuted, reversed and stepped layouts."""
    for _ in range(400):
        nd = int(rng.integers(1, 5))
        shape = tuple(int(v) for v in rng.integers(1, 6, nd))
        perm = rng.permutation(nd)
        a = np.ascontiguousarray(np.zeros(shape, np.float32).transpose(perm)).transpose(np.argsort(perm))
        a = a[tuple(slice(None, None, int(rng.choice([-2, -1, 1, 1, 2]))) for _ in range(nd))]
        axis = int(rng.integers(nd))
        want = np.cumsum(a, axis=axis)
        strides = k_strides(a.shape, [s // a.itemsize for s in a.strides], (), a.itemsize, False)
        big = [i for i, n in enumerate(a.shape) if n > 1]
        assert [strides[i] for i in big] == [want.strides[i] for i in big], (a.shape, a.strides, axis)


def test_params_match_the_struct():
    assert struct_fields(C.SOURCE, "ScanParams") == C.PARAMS.fields


@pytest.mark.parametrize("n", [1, 2047, 2048, 2049, 4095, 4096, 4097, 1 << 28])
def test_tiles_cover_a_line(n):
    p = C.plan((n,), None)
    assert (p.rows, p.n, p.tiles_per_row, p.x, p.o) == (1, n, -(-n // 4096), (0, 0, 1), (0, 0, 1))
    assert p.config.grid == (p.tiles,) and p.config.block == (C.BLOCK,)
    f32 = np.dtype(np.float32)
    p = C.plan((n,), None, dtypes=(f32, f32), vector=False)  # scan_tiles: a block a span of two tiles
    assert p.tile == 2048 and p.tiles_per_row == -(-n // 2048) and p.config.grid == (-(-n // C.SPAN),)
    p = C.plan((3, n), 1, dtypes=(f32, f32), vector=False)
    assert p.tiles == 3 * -(-n // 2048) and p.config.grid == (3 * -(-n // C.SPAN),)


def test_the_tile_follows_the_dtypes_only():
    """The tile is part of the definition: float32 scanned into float32 takes 2048 elements, every other pair
    4096, whatever the layout, kernel or device; scan.cu's ``scan_items`` is the same rule."""
    for t, o in C.PAIRS:
        want = 2048 if (t, o) == (np.dtype(np.float32),) * 2 else 4096
        assert C.tile(t, o) == want and C.items(t, o) * C.BLOCK == want, (t, o)
        for kw in ({}, {"vector": False}, {"sm_count": 108}, {"x_strides": (3,)}):
            assert C.plan((100000,), None, dtypes=(t, o), **kw).tile == want, (t, o, kw)


def test_threads_a_tile_follow_the_dtypes():
    f32, f64, i32, i64 = (np.dtype(t) for t in (np.float32, np.float64, np.int32, np.int64))
    assert C.threads(f32, f32) == C.threads(f64, f64) == C.threads(i64, i64) == 128
    assert C.threads(f32, f64) == C.threads(i32, i64) == C.threads(np.bool_, i64) == C.threads(BFLOAT16, BFLOAT16) == 256
    assert C.plan((5000,), None, dtypes=(f32, f32), vector=False).config.block == (128,)
    assert all(i.args[-1] == C.threads(i.args[0], i.args[1]) for i in C.instantiations() if i.name == "scan_tiles")


def test_float32_lines_of_unit_step_and_16_byte_starts_go_ahead():
    f32, f64 = np.dtype(np.float32), np.dtype(np.float64)
    p = C.plan((1 << 28,), None, dtypes=(f32, f32), sm_count=108)
    assert p.kernel == "ahead" and p.config.grid == (6 * 108,) and p.config.block == (C.BLOCK,)
    assert C.plan((1 << 28,), None, dtypes=(BFLOAT16, BFLOAT16), sm_count=108).config.grid == (5 * 108,)
    assert C.plan((3, 2048), 1, dtypes=(f32, f32)).config.grid == (3,)  # never more blocks than tiles
    assert C.plan((40, 4096 * 8), 1, dtypes=(f32, f32)).kernel == "ahead"
    assert C.plan((40, 4100), 1, dtypes=(f32, f32)).kernel == "ahead"  # lines 4100 floats apart: 16-byte starts
    for tiles in [C.plan((3, 10007), 1, dtypes=(f32, f32)),  # lines 10007 floats apart
                  C.plan((1 << 20,), None, dtypes=(f32, f32), vector=False),
                  C.plan((1 << 20,), None, dtypes=(f32, f64)), C.plan((1 << 20,), None, dtypes=(f64, f64)),
                  C.plan((40, 4100), 1, dtypes=(BFLOAT16, BFLOAT16))]:  # 8200 bytes apart
        assert tiles.kernel == "tiles" and tiles.config.grid == (tiles.rows * -(-tiles.n // C.SPAN),)
    assert C.plan((64, 1000), 1, x_strides=(1, 64), dtypes=(f32, f32)).kernel == "tiles"
    assert C.plan((40, 4104), 1, dtypes=(np.float16, np.float16)).kernel == "ahead"


def test_columns_take_many_adjacent_strided_lines():
    """scan_columns: lines one element apart in x and out and strided along their length (axis 0 of a
    C-ordered matrix), of a float type scanned into itself, enough of them for its column groups; its grid
    is one block a group of 32 lines of each outer line."""
    f32, f64 = np.dtype(np.float32), np.dtype(np.float64)
    p = C.plan((16384, 4096), 0, dtypes=(f32, f32))
    assert p.kernel == "columns" and p.config.grid == (128,) and p.config.block == (C.BLOCK,)
    assert p.config.shared_mem == 0 and (p.inner, p.x, p.o) == (4096, (0, 1, 4096), (0, 1, 4096))
    p = C.plan((6, 3000, 1000), 1, dtypes=(BFLOAT16, BFLOAT16))  # 6 outer lines of 1000 columns: 6 x 32 groups
    assert p.kernel == "columns" and p.config.grid == (6 * 32,)
    assert C.plan((16384, 4096), 0, dtypes=(f64, f64)).kernel == "tiles"  # 8-byte accumulators: not here
    assert C.plan((2048, 64), 0, dtypes=(f32, f32)).kernel == "columns"  # lines of one tile: however few groups
    assert C.plan((64, 256), 0, dtypes=(f32, f32)).kernel == "columns"
    assert C.plan((4096, 16384), 1, dtypes=(f32, f32)).kernel == "ahead"  # rows of unit stride
    assert C.plan((16384, 4096), 0, x_strides=(4096, 2), dtypes=(f32, f32)).kernel == "tiles"  # lines 2 apart


def test_few_column_groups_spread_their_tiles_over_blocks():
    """column_tiles: too few column groups for one block each, lines of more than one tile: a block a tile of
    a column group (aggregates, then results), and between the two a thread a line slot forming the prefixes;
    the workspace holds a float a line slot and tile."""
    f32 = np.dtype(np.float32)
    p = C.plan((100000, 64), 0, dtypes=(f32, f32))  # two groups of 49 float32 tiles
    assert p.kernel == "column_tiles" and p.config.grid == (2 * 49,) and p.config.block == (C.BLOCK,)
    assert p.column_values == 64 * 49 and p.prefix_config.grid == (1,)
    p = C.plan((5, 10000, 40), 1, dtypes=(BFLOAT16, BFLOAT16))  # 5 outer lines, 2 groups, 3 bf16 tiles
    assert p.kernel == "column_tiles" and p.config.grid == (5 * 2 * 3,) and p.column_values == 5 * 64 * 3
    assert C.plan((100000, 64), 0, dtypes=(f32, f32), sm_count=5).kernel == "columns"  # 256 bytes a row: 51 an SM
    assert C.plan((100000, 64), 0, dtypes=(f32, f32), sm_count=6).kernel == "column_tiles"  # 43 an SM
    aggregates, prefixes, finish = C.column_instantiations(f32, C.SCAN_SUM)
    assert aggregates.args == (f32, f32, C.SCAN_SUM, C.COLUMN_AGGREGATES) and prefixes.args == (C.SCAN_SUM,)
    assert C.instantiation(f32, f32, C.SCAN_SUM, "column_tiles") == finish


def test_lines_and_layouts():
    p = C.plan((6, 7, 8), 1)
    assert (p.rows, p.n, p.inner, p.x, p.o, p.copy) == (48, 7, 8, (56, 1, 8), (56, 1, 8), False)
    p = C.plan((6, 7, 8), 2)
    assert (p.rows, p.n, p.inner, p.x) == (42, 8, 42, (0, 8, 1))
    assert C.plan((5, 7), None, x_strides=(1, 5)).copy  # a transposed matrix flattened: not one run
    assert not C.plan((5, 7), None, x_strides=(-7, -1)).copy
    assert C.plan((3, 4, 5, 6), 1, x_strides=(1000, 6, 100, 1)).copy
    p = C.plan((4, 9), 0, out_strides=(-9, 1))
    assert (p.x, p.o) == ((0, 1, 9), (0, 1, -9))
    assert C.plan((0, 5), 1).tiles == 0 and C.plan((5, 0), 1).tiles == 0


def test_result_dtypes():
    assert C.result_dtype(np.int32) == np.int64 and C.result_dtype(np.bool_) == np.int64
    assert C.result_dtype(BFLOAT16) == BFLOAT16 and C.result_dtype(np.float32, "float64") == np.float64
    with pytest.raises(TypeError, match="dtype=float32 is not supported for x of float64"):
        C.result_dtype(np.float64, np.float32)


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.uint8, np.uint16, np.uint32, np.uint64, np.int32, np.int64,
                                   np.bool_, np.float16, np.float32, np.float64], ids=dtype_name)
def test_routes_give_numpys_result_dtypes(dtype):
    """Every integer and float dtype scans: a pair of PAIRS where one exists, else a conversion, a pair's scan
    and a conversion to NumPy's result dtype (its default, or any float or integer ``dtype=``)."""
    x = np.zeros(3, dtype)
    assert C.route(dtype, np.bool_) == (np.bool_, np.bool_) and np.cumsum(x, dtype=np.bool_).dtype == np.bool_
    for requested in (None, np.int8, np.uint16, np.int32, np.int64, np.uint64, np.float16, np.float32, np.float64):
        want = np.cumsum(x, dtype=requested).dtype
        how = C.route(dtype, requested)
        if how is None:
            assert C.result_dtype(dtype, requested) == want
        else:
            via, final = how
            assert final == want and (via, C.DEFAULT_DTYPE[via]) in C.PAIRS
            assert via == (final if final.kind == "f" else np.dtype(dtype) if dtype in (np.int32, np.int64, np.bool_)
                           else np.int64)
    assert C.route(BFLOAT16, np.float64) == (np.float64, np.float64)
    for bad_x, bad_dtype in ((np.complex64, None), (np.float32, np.complex64), (np.int32, np.str_)):
        with pytest.raises(TypeError, match="not supported|supported:"):
            C.route(bad_x, bad_dtype)


def test_bool_results_are_counts_of_nonzero_elements(rng):
    """The route of a bool result (:func:`cukern.scan.route`): NumPy's bool cumsum ("or") and cumprod ("and")
    are an int64 cumsum and cumprod of ``x != 0`` (a NaN counts as nonzero), then nonzero."""
    x = rng.choice([0.0, 1.5, -2.0, np.nan], (9, 40)).astype(np.float32)
    x[3] = 0
    for axis in (None, 0, 1):
        for op in ("cumsum", "cumprod"):
            counts = getattr(np, op)(x.astype(np.bool_), axis=axis, dtype=np.int64)
            assert np.array_equal(counts.astype(np.bool_), getattr(np, op)(x, axis=axis, dtype=np.bool_)), (op, axis)


def test_instantiations_are_the_pairs():
    """Both ops for every pair but the complex ones (cumprod only: cumsum scans the parts as float lines),
    and scan_ahead's and scan_columns'; complex128's stage is the launch's dynamic shared memory, the rest
    static."""
    insts = C.instantiations()
    complex_pairs = [p for p in C.PAIRS if p[1].kind == "c"]
    assert len(complex_pairs) == 2
    assert len(insts) == len(set(insts)) == 2 * (len(C.PAIRS) + 4 * len(C.AHEAD_DTYPES) + 1) - len(complex_pairs)
    assert {i.args for i in insts if i.args[1:2] in ((np.complex64,), (np.complex128,))} == {
        (t, t, C.SCAN_PROD, 256) for t, _ in complex_pairs}
    assert [C.stage_bytes(t, o) for t, o in C.PAIRS] == [4 * (16384 + 512 + 1) if o == np.complex128 else 0
                                                          for t, o in C.PAIRS]
    assert C.plan((5000,), None, dtypes=(np.complex128, np.complex128)).config.shared_mem == 67588
    assert {i.args for i in insts if i.name == "scan_ahead"} == {(t, op) for t in C.AHEAD_DTYPES
                                                                  for op in (C.SCAN_SUM, C.SCAN_PROD)}
    assert {i.args for i in insts if i.name == "scan_columns"} == {
        (t, t, op, mode) for t in C.AHEAD_DTYPES for op in (C.SCAN_SUM, C.SCAN_PROD)
        for mode in (C.COLUMN_WALK, C.COLUMN_AGGREGATES, C.COLUMN_FINISH)}
    assert {i.args for i in insts if i.name == "scan_column_prefixes"} == {(C.SCAN_SUM,), (C.SCAN_PROD,)}


def test_bytes_moved():
    assert C.bytes_moved((1 << 28,), np.float32) == 2 << 30
    assert C.bytes_moved((10, 3), np.int32) == 30 * 12
    assert C.bytes_moved((10,), np.float32, np.float64) == 120


@pytest.mark.parametrize("shape, axis, dtype, err, match", [
    ((4,), None, np.int8, TypeError, "dtype int8"),
    ((4, 5), (0,), None, TypeError, "axis must be None or an int"),
    ((4, 5), 2, None, np.exceptions.AxisError, "out of bounds"),
    ((4, 5), 0, np.int32, TypeError, "not supported"),
])
def test_bad_input(shape, axis, dtype, err, match):
    x = fake_array(shape, np.int8 if match == "dtype int8" else np.float32)
    with pytest.raises(err, match=match):
        C._prepare("cumsum", x, axis, dtype, None)


# ---------------------------------------------------------------------------------------------------------
# The emulator on the host.


@pytest.mark.parametrize("dtype", C.DTYPES, ids=dtype_name)
@pytest.mark.parametrize("op", OPS)
def test_emulator_is_close_to_numpy(op, dtype, rng):
    x = _values(rng, (3, 9001), dtype, op)
    # along axis 0 the emulator pads each line of 3 to a whole tile (C.tile elements): 512 such lines check
    # what 9001 did, in a seventeenth of the time
    cols = _values(rng, (3, 512), dtype, op)
    for a, axis in ((x, None), (cols, 0), (x, 1), (x, -1)):
        got, want = getattr(R, f"{op}_emulated")(a, axis), getattr(R, op)(a, axis)
        assert got.shape == want.shape and got.dtype == C.result_dtype(a.dtype)
        if got.dtype.kind in "iu":
            np.testing.assert_array_equal(got, want)
        elif got.dtype.kind == "c":  # each part within its float type's bound
            part = np.dtype(np.float32 if got.dtype == np.complex64 else np.float64)
            assert_close(got.real, want.real, part, terms=a.size)
            assert_close(got.imag, want.imag, part, terms=a.size)
        else:
            assert_close(got, want, got.dtype, terms=a.size)


def test_a_short_line_is_one_threads_running_sum():
    x = np.float32([0.1, 0.2, 0.3, 1e8, -1e8, 0.4])
    np.testing.assert_array_equal(R.cumsum_emulated(x), np.cumsum(x))  # NumPy's float32 cumsum is sequential
    assert np.signbit(R.cumsum_emulated(np.float32([-0.0, -0.0]))).all()


def test_tiles_fold_within_groups_then_groups_in_order(rng):
    # Each tile holds one value v_t at its start and zeros after it, so its aggregate is v_t exactly and the
    # tile's first output is P_{t-1} + v_t: the group structure of cuda_src/scan.cu, written out here.
    tiles, size = 2 * C.GROUP + 7, C.tile(np.float32, np.float32)
    v = (rng.standard_normal(tiles) * 10.0 ** rng.integers(-3, 4, tiles)).astype(np.float32)
    x = np.zeros(tiles * size, np.float32)
    x[::size] = v
    want, b = [], np.float32(-0.0)
    for g0 in range(0, tiles, C.GROUP):
        q = np.float32(-0.0)
        for t in range(g0, min(g0 + C.GROUP, tiles)):
            want.append(np.float32(b + q) + v[t])
            q = np.float32(q + v[t])
        b = np.float32(b + q)
    got = R.cumsum_emulated(x)[::size]
    np.testing.assert_array_equal(got.view(np.uint32), np.array(want, np.float32).view(np.uint32))


def test_integers_wrap():
    x = np.array([2**62, 2**62, 2**62], np.int64)
    np.testing.assert_array_equal(R.cumsum_emulated(x), np.cumsum(x))


# ---------------------------------------------------------------------------------------------------------
# Compilation.


@pytest.mark.nvrtc(C.SOURCE)
@pytest.mark.parametrize("arch", ARCHS)
def test_every_instantiation_compiles_without_spills_or_contraction(arch):
    c = compiled(C.SOURCE, arch)
    res = c.resources()
    assert ".local" not in c.ptx
    for inst in checked_instantiations(C.SOURCE):
        assert_no_spills(res[c.lowered[inst.expression]], arch, inst.expression)
        body = c.kernel_ptx(inst)
        assert "fma.rn" not in body and ".approx" not in body, inst.expression
        if inst.name == "scan_column_prefixes":  # a thread a line, nothing shared
            assert "atom." not in body and "membar" not in body and "bar.sync" not in body, inst.expression
        elif inst.name != "scan_columns":  # the look-back's kernels draw tiles and fence; scan_columns neither
            assert "atom.global.add.u32" in body and "membar.gl" in body, inst.expression
        else:
            assert "atom." not in body and "membar" not in body and "bar.sync" in body, inst.expression


@pytest.mark.nvrtc(C.SOURCE)
def test_float32_tiles_fit_twelve_an_sm_90():
    """The scan's speed follows how many tiles are in flight (cuda_src/scan.cu, docs/design/scan.md): its float32
    kernels keep twelve 128-thread blocks an SM on sm_90, by registers (64 Ki) and by shared memory (228 KiB,
    1 KiB of it reserved a block)."""
    c = compiled(C.SOURCE, "sm_90")
    res = c.resources()
    f32 = np.dtype(np.float32)
    for op in (C.SCAN_SUM, C.SCAN_PROD):
        inst = C.instantiation(f32, f32, op)
        assert inst.args[-1] == 128
        r = res[c.lowered[inst.expression]]
        assert 12 * 128 * r["registers"] <= 64 * 1024, (inst.expression, r)
        assert 12 * (r["shared"] + 1024) <= 228 * 1024, (inst.expression, r)


@pytest.mark.nvrtc(C.SOURCE)
def test_float32_ahead_fits_its_resident_blocks_on_sm_90():
    """scan_ahead's grid is ``ahead_blocks(dtype)`` blocks an SM (cukern/scan.py `Plan.grid`): that many fit by
    registers, with no spill."""
    c = compiled(C.SOURCE, "sm_90")
    res = c.resources()
    for inst in checked_instantiations(C.SOURCE):
        if inst.name == "scan_ahead":
            r = res[c.lowered[inst.expression]]
            assert C.ahead_blocks(inst.args[0]) * C.BLOCK * r["registers"] <= 64 * 1024, (inst.expression, r)
            assert r["spill_stores"] == 0, (inst.expression, r)


@pytest.mark.nvrtc(C.SOURCE)
def test_ahead_reads_in_vectors_and_streams_its_second_read_and_stores():
    """scan_ahead's second read of a tile and its stores are evict-first (cuda_src/scan.cu: the tiles still to
    be read again keep L2; plain ones ran at 44% of the copy against 66%), its first read plain, all 16-byte."""
    c = compiled(C.SOURCE, "sm_90")
    for inst in checked_instantiations(C.SOURCE):
        if inst.name == "scan_ahead":
            body = c.kernel_ptx(inst)
            assert "ld.global.cs.v4.u32" in body and "st.global.cs.v4.u32" in body, inst.expression
            assert re.search(r"ld\.global\.v4\.(u32|f32)", body), inst.expression


# ---------------------------------------------------------------------------------------------------------
# On a GPU.


def _check(op, x, xh, axis=None, dtype=None, **kw):
    got = getattr(C, op)(x, axis=axis, dtype=dtype, **kw)
    want = getattr(R, f"{op}_emulated")(xh, axis, dtype)
    assert got.shape == want.shape and got.dtype == want.dtype, (op, axis)
    assert same_bits(got, want), (op, axis, dtype)
    return got


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [d for d in C.DTYPES if np.dtype(d).kind != "c"], ids=dtype_name)
@pytest.mark.parametrize("op", OPS)
def test_every_dtype_axis_and_op(op, dtype, rng):
    """Every real dtype (complex ones: test_complex_cumprod_multiplies_the_pairs and the complex cumsum tests)."""
    import cupy

    for shape in [(1,), (4095,), (4097,), (3, 10007), (37, 5, 11)]:
        xh = _values(rng, shape, dtype, op)
        x = cupy.asarray(xh)
        for axis in [None] + list(range(-len(shape), len(shape))):
            got = _check(op, x, xh, axis)
            ref = getattr(R, op)(xh, axis)
            if got.dtype.kind in "iu":
                np.testing.assert_array_equal(got.get(), ref)
            else:
                assert_close(got, ref, got.dtype, terms=xh.size)
    if np.dtype(dtype) == np.float32:
        _check(op, x, xh, 1, np.float64)


@pytest.mark.gpu
@pytest.mark.parametrize("op", OPS)
def test_long_line_is_the_same_bits_every_run(op, rng):
    import cupy

    xh = _values(rng, ((1 << 24) + 3,), np.float32, op)
    x = cupy.asarray(xh)
    first = _check(op, x, xh)
    for _ in range(3):
        assert same_bits(getattr(C, op)(x), first)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32], ids=dtype_name)
def test_strided_negative_misaligned_and_transposed(dtype, rng):
    import cupy

    base_h = _values(rng, (64, 4099), dtype, "cumsum")
    base = cupy.asarray(base_h)
    views = [lambda a: a[1:, 1:], lambda a: a[::-1, ::-3], lambda a: a.T, lambda a: a[::2, 7:4000],
             lambda a: a.reshape(8, 8, 4099)[:, ::2].transpose(1, 2, 0)]
    for view in views:
        x, xh = view(base), view(base_h)
        for axis in [None] + list(range(x.ndim)):
            _check("cumsum", x, xh, axis)


@pytest.mark.gpu
def test_nan_inf_and_empty():
    import cupy

    xh = np.float32([1, 2, np.nan, 3, np.inf, -np.inf] * 1000)
    for op in OPS:
        _check(op, cupy.asarray(xh), xh)
        assert C.cumsum(cupy.zeros((0, 3), np.float32), axis=1).shape == (0, 3)
        assert getattr(C, op)(cupy.zeros((4, 0), np.int32), axis=1).dtype == np.int64
        assert getattr(C, op)(cupy.zeros(0, np.float32)).shape == (0,)


@pytest.mark.gpu
@pytest.mark.parametrize("op", OPS)
def test_a_0d_array_scans_as_one_element(op):
    """NumPy scans a 0-d array as shape (1,): axis 0, -1 and None; axis 1 is out of bounds."""
    import cupy

    for value, dtype in ((2.5, np.float32), (7, np.int32)):
        xh = np.array(value, dtype)
        for axis in (None, 0, -1):
            got = getattr(C, op)(cupy.asarray(xh), axis=axis)
            want = getattr(np, op)(xh, axis=axis)
            assert got.shape == want.shape == (1,) and got.dtype == want.dtype and got.get()[0] == want[0]
        with pytest.raises(np.exceptions.AxisError):
            getattr(C, op)(cupy.asarray(xh), axis=1)


@pytest.mark.gpu
def test_out_in_place_and_checked(rng):
    import cupy

    xh = _values(rng, (5, 9000), np.float32, "cumsum")
    want = R.cumsum_emulated(xh, 1)
    x = cupy.asarray(xh)
    out = cupy.full(x.shape, np.nan, np.float32)  # poisoned
    assert C.cumsum(x, axis=1, out=out) is out and same_bits(out, want)
    wide = cupy.full((5, 18000), np.nan, np.float32)
    C.cumsum(x, axis=1, out=wide[:, ::2])
    assert same_bits(wide[:, ::2], want) and cupy.isnan(wide[:, 1::2]).all()
    flat = cupy.empty(x.size, np.float32)
    C.cumsum(x, out=flat)
    assert same_bits(flat, R.cumsum_emulated(xh))
    y = x.copy()
    assert C.cumsum(y, axis=1, out=y) is y and same_bits(y, want)
    # an out of another dtype takes the result cast, as NumPy's (which casts its own float32 result)
    for t in (np.float64, np.float16, np.int32, np.complex64, np.bool_):
        cast = cupy.full(x.shape, 3, t)
        assert C.cumsum(x, axis=1, out=cast) is cast
        assert same_bits(cast, want.astype(t)), t
        assert np.cumsum(xh, axis=1, out=np.empty(xh.shape, t)).dtype == t
    cast = cupy.full((9000, 5), 3, np.float64)
    C.cumsum(x.T, axis=0, out=cast)  # a transposed view (K order inside), into an out of its own layout
    assert same_bits(cast, want.T.astype(np.float64))
    before = x.copy()
    for bad, err, match in [(cupy.empty((5, 8999), np.float32), ValueError, "shape"),
                            (cupy.empty((5, 8999), np.float64), ValueError, "shape"),
                            (x[:, ::-1], ValueError, "overlaps"),
                            (x.view(np.int32)[:, ::-1], ValueError, "overlaps"),
                            (cupy.broadcast_to(cupy.zeros(1, np.float32), (5, 9000)), ValueError, "zero stride")]:
        with pytest.raises(err, match=match):
            C.cumsum(x, axis=1, out=bad)
    assert same_bits(x, before)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, requested", [
    (np.int8, None), (np.int16, np.int16), (np.uint8, None), (np.uint16, np.int32), (np.uint32, None),
    (np.uint64, None), (np.int32, np.int8), (np.int64, np.uint64), (np.bool_, np.float32), (np.int32, np.float64),
    (np.float64, np.float32), (np.float16, np.float32), (np.float32, np.int64), (BFLOAT16, np.float64),
], ids=lambda d: dtype_name(d) if d is not None else "default")
@pytest.mark.parametrize("op", OPS)
def test_other_dtypes_and_targets_follow_numpy(op, dtype, requested, rng):
    """Dtypes and ``dtype=`` targets without a kernel of their own: NumPy's result dtype; integer results
    exactly NumPy's (its wrap-around included), float results close to NumPy's in float64; views, ``out``
    (in place too), the input untouched, every check before any launch."""
    import cupy

    dt = np.dtype(dtype)
    if dt.kind in "iub":
        xh = _values(rng, (7, 1301), np.int32, op).astype(dt) if dt.kind == "i" else (
            rng.integers(0, 4, (7, 1301)).astype(dt))
        if dt.kind == "b":
            xh = rng.random((7, 1301)) < 0.5
    else:
        xh = _values(rng, (7, 1301), np.float32, op).astype(dt)
    x = cupy.asarray(xh)
    before = x.copy()
    for view in (lambda a: a, lambda a: a[::-2, 3:], lambda a: a.T):
        v, vh = view(x), view(xh)
        for axis in (None, 0, -1):
            got = getattr(C, op)(v, axis=axis, dtype=requested)
            want = getattr(np, op)(vh, axis=axis, dtype=requested)
            assert got.dtype == want.dtype and got.shape == want.shape
            if want.dtype.kind in "iu":
                np.testing.assert_array_equal(got.get(), want)
            else:
                ref = getattr(np, op)(vh.astype(want.dtype).astype(np.float64), axis=axis)
                assert_close(got, ref, got.dtype, terms=vh.size)
    assert same_bits(x, before)
    want = getattr(np, op)(xh, axis=1, dtype=requested)
    out = cupy.zeros(want.shape, want.dtype)
    assert getattr(C, op)(x, axis=1, dtype=requested, out=out) is out
    assert same_bits(out, getattr(C, op)(x, axis=1, dtype=requested))
    if want.dtype == dt:  # in place
        y = x.copy()
        assert getattr(C, op)(y, axis=1, dtype=requested, out=y) is y and same_bits(y, out)
    # out of another dtype: the result cast, as NumPy's (a float result into an integer out only where NumPy
    # defines the values: here cumprod's reach inf)
    for t in (np.complex64, np.float64) + ((np.int16,) if want.dtype.kind in "iu" else ()):
        cast = cupy.zeros(want.shape, t)
        assert getattr(C, op)(x, axis=1, dtype=requested, out=cast) is cast
        np.testing.assert_array_equal(cast.get(), out.get().astype(t), err_msg=str(t))
    for bad, err in ((cupy.zeros((7, 1300), want.dtype), ValueError), (cupy.zeros((7, 1300), np.complex64), ValueError),
                     (x[:, ::-1], ValueError)):
        with pytest.raises(err):
            getattr(C, op)(x, axis=1, dtype=requested, out=bad)
    assert same_bits(x, before)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        try:
            with pytest.raises(RuntimeError, match="cannot be captured in a CUDA graph here: x is scanned through"):
                getattr(C, op)(x, axis=1, dtype=requested)
        finally:
            stream.end_capture()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.bool_], ids=dtype_name)
@pytest.mark.parametrize("op", OPS)
def test_bool_results_are_numpys(op, dtype, rng):
    """``dtype=bool``: NumPy's "or" (cumsum) and "and" (cumprod) of ``x != 0``, NaN counting as nonzero; views,
    every axis, an ``out`` of bool and of another dtype."""
    import cupy

    xh = rng.choice([0.0, 1.5, -2.0, np.nan if dtype == np.float32 else 3.0], (7, 1301)).astype(dtype)
    xh[2] = 0
    x = cupy.asarray(xh)
    for v, vh in ((x, xh), (x[::-1, ::3], xh[::-1, ::3]), (x.T, xh.T)):
        for axis in (None, 0, 1):
            got = getattr(C, op)(v, axis=axis, dtype=bool)
            want = getattr(np, op)(vh, axis=axis, dtype=bool)
            assert got.dtype == np.bool_ and np.array_equal(got.get(), want), (axis,)
    want = getattr(np, op)(xh, axis=1, dtype=bool)
    for t in (np.bool_, np.int8):
        out = cupy.full(xh.shape, 7, t)
        assert getattr(C, op)(x, axis=1, dtype=bool, out=out) is out
        np.testing.assert_array_equal(out.get(), want.astype(t))


@pytest.mark.gpu
def test_more_than_2_31_elements():
    import cupy

    n = (1 << 31) + 5
    r = C.cumsum(cupy.ones(n, np.bool_))
    assert r.dtype == np.int64 and int(r[-1]) == n and int(r[(1 << 31) + 1]) == (1 << 31) + 2 and int(r[0]) == 1


@pytest.mark.gpu
@pytest.mark.parametrize("op", OPS)
def test_float32_spans_of_two_tiles_give_the_emulators_bits(op, rng):
    """scan_tiles takes float32's 2048-element tiles two a block (a span of 4096; cuda_src/scan.cu): lines of
    an odd number of tiles (the last span half empty), a span ending a group, many groups, several lines a
    launch, strided and misaligned (so never scan_ahead), and in place, give the emulator's bits."""
    import cupy

    for shape, axis in [((2048 * 67 + 5,), None), ((5, 2048 * 33), 1), ((3, 2048 * 65 + 2047), 1), ((9, 2049), 1),
                        ((4100, 3), 0), ((1,), None)]:
        n = int(np.prod(shape))
        base_h = _values(rng, (n + 1,), np.float32, op)
        base = cupy.asarray(base_h)
        x, xh = base[1:].reshape(shape), base_h[1:].reshape(shape)
        assert C._prepare(op, x, axis, None, None).plan.kernel == "tiles"
        _check(op, x, xh, axis)
        got = getattr(C, op)(x, axis=axis, out=x if axis is not None else x.reshape(-1))
        assert same_bits(got, getattr(R, f"{op}_emulated")(xh, axis)), (shape, axis)


# Column layouts each column kernel takes (with the threshold that forces it), then the matrix of the in-place
# and capture checks: lines over a group of tiles long, a last column group part empty, several outer lines,
# a negative step; column_tiles' lines over a tile long.
_COLUMN_CASES = {
    "columns": (0, [((2048 * 33 + 7, 40), 0, None), ((4097, 100), 0, None), ((3, 2049, 70), 1, None),
                    ((5000, 64), 0, lambda a: a[::-1]), ((1, 33), 0, None)], (3000, 96)),
    "column_tiles": (float("inf"), [((4096 * 33 + 7, 40), 0, None), ((8193, 100), 0, None),
                                    ((3, 8197, 70), 1, None), ((9000, 64), 0, lambda a: a[::-1]),
                                    ((4097, 32), 0, None)], (9000, 96)),
}


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", sorted(_COLUMN_CASES))
@pytest.mark.parametrize("dtype", C.AHEAD_DTYPES, ids=dtype_name)
@pytest.mark.parametrize("op", OPS)
def test_columns_give_the_emulators_bits(op, dtype, kernel, rng, monkeypatch):
    """scan_columns, walking each column group of 32 lines tile by tile with Q and B carried ("columns"), or a
    block a column group's tile, twice, with the prefixes formed between ("column_tiles"), gives the
    emulator's bits: on _COLUMN_CASES, in place, and under a CUDA-graph capture (after an eager call on the
    stream, which makes column_tiles' workspace)."""
    import cupy

    threshold, cases, size = _COLUMN_CASES[kernel]
    monkeypatch.setattr(C, "COLUMN_WALK_BYTES_PER_SM", threshold)  # however few (or many) column groups
    monkeypatch.setattr(C, "_calls", C.CallCache())
    for shape, axis, view in cases:
        xh = _values(rng, shape, dtype, op)
        x = cupy.asarray(xh)
        if view is not None:
            x, xh = view(x), view(xh)
        assert C._prepare(op, x, axis, None, None).plan.kernel == kernel, (shape, axis)
        _check(op, x, xh, axis)
    xh = _values(rng, size, dtype, op)
    x = cupy.asarray(xh)
    want = getattr(R, f"{op}_emulated")(xh, 0)
    assert same_bits(getattr(C, op)(x, axis=0, out=x), want)  # in place
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        getattr(C, op)(x, axis=0)
        graph, got, freed = capture(stream, lambda: getattr(C, op)(x, axis=0))
        assert not freed
        x2h = _values(rng, size, dtype, op)
        x[...] = cupy.asarray(x2h)
        graph.launch(stream)
        stream.synchronize()
    assert same_bits(got, getattr(R, f"{op}_emulated")(x2h, 0))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", C.AHEAD_DTYPES, ids=dtype_name)
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("sms", [1, 7, 132])
def test_ahead_gives_the_same_bits_on_any_grid(op, sms, dtype, rng, monkeypatch):
    """scan_ahead's blocks walk the tiles in the order they draw them: a grid of 5 blocks (one SM's), 35 or
    the H200's 660 gives the emulator's bits, on lines of whole and partial tiles, several to a launch."""
    import cupy

    monkeypatch.setattr(C, "sm_count", lambda device: sms)
    monkeypatch.setattr(C, "_calls", C.CallCache())
    for shape in [(3 * 4096 * 32 + 5,), (7, 4096 * 40), (300, 4104), (2, 4096 * 33 + 8)]:
        xh = _values(rng, shape, dtype, op)
        x = cupy.asarray(xh)
        axis = None if len(shape) == 1 else 1
        assert C._prepare(op, x, axis, None, None).plan.kernel == "ahead"
        _check(op, x, xh, axis)
        y = x.copy()
        assert same_bits(getattr(C, op)(y, axis=axis, out=y), getattr(R, f"{op}_emulated")(xh, axis))


@pytest.mark.parametrize("dtype", [np.complex64, np.complex128], ids=dtype_name)
def test_complex_cumsum_emulator_is_the_parts_scans(dtype, rng):
    """The emulator's complex cumsum: each part's own scan bit for bit, NumPy's dtype, shape and values; a real
    x into a complex dtype= has zero imaginary parts."""
    h = (rng.standard_normal((5, 4100)) + 1j * rng.standard_normal((5, 4100))).astype(dtype)
    for axis in (None, 0, 1):
        got = R.cumsum_emulated(h, axis)
        want = np.cumsum(h, axis=axis)
        assert got.dtype == want.dtype and got.shape == want.shape
        assert same_bits(got.real, R.cumsum_emulated(np.ascontiguousarray(h.real), axis))
        assert same_bits(got.imag, R.cumsum_emulated(np.ascontiguousarray(h.imag), axis))
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)
    real = R.cumsum_emulated(h.real, 1, dtype=dtype)
    assert real.dtype == dtype and not real.imag.any()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.complex64, np.complex128], ids=dtype_name)
def test_complex_cumsum_scans_the_parts_apart(dtype, rng):
    """cumsum of complex x: each part scanned by the float kernels (a view), the emulator's bits, NumPy's
    values, dtype and layout, on C, F, negative-stride and flattened layouts, in place and into an out of
    another dtype; a real x into a complex dtype=; a real dtype= refused before any launch."""
    import cupy

    h = (rng.standard_normal((9, 5000)) + 1j * rng.standard_normal((9, 5000))).astype(dtype)
    h[2, 7] = complex(np.nan, 1)
    for label, (xh, x) in {"c": (h, cupy.asarray(h)),
                           "f": (np.asfortranarray(h), cupy.asfortranarray(cupy.asarray(h))),
                           "neg": (h[::-1, ::-3], cupy.asarray(h)[::-1, ::-3])}.items():
        for axis in (None, 0, 1, -1):
            got = C.cumsum(x, axis=axis)
            assert same_bits(got, R.cumsum_emulated(xh, axis)), (label, axis)
            want = np.cumsum(xh, axis=axis)
            assert got.dtype == want.dtype and got.shape == want.shape, (label, axis)
            big = [i for i, n in enumerate(want.shape) if n > 1]
            assert [got.strides[i] for i in big] == [want.strides[i] for i in big], (label, axis)
            np.testing.assert_allclose(got.get(), want, rtol=1e-4 if dtype == np.complex64 else 1e-10, atol=1e-3)
    x = cupy.asarray(h)
    want = R.cumsum_emulated(h, 1)
    y = x.copy()
    assert C.cumsum(y, axis=1, out=y) is y and same_bits(y, want)
    wide = cupy.zeros(h.shape, np.complex128)
    assert C.cumsum(x, axis=1, out=wide) is wide and same_bits(wide, want.astype(np.complex128))
    real = rng.standard_normal((4, 77)).astype(np.float32)
    got = C.cumsum(cupy.asarray(real), axis=1, dtype=dtype)
    assert same_bits(got, R.cumsum_emulated(real, 1, dtype=dtype))
    np.testing.assert_allclose(got.get(), np.cumsum(real, axis=1, dtype=dtype), rtol=1e-5, atol=1e-5)
    before = x.copy()
    for call in (lambda: C.cumprod(x, dtype=np.float64), lambda: C.cumsum(x, dtype=np.float64),
                 lambda: C.cumsum(x, out=x[:, ::-1])):
        with pytest.raises((TypeError, ValueError)):
            call()
    with pytest.raises(np.exceptions.AxisError):  # the axis before the refusal, as NumPy checks it
        C.cumprod(x, axis=2, dtype=np.float64)
    assert same_bits(x, before)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.complex64, np.complex128], ids=dtype_name)
def test_complex_cumprod_multiplies_the_pairs(dtype, rng):
    """cumprod of complex x: the complex kernels' products, the emulator's bits, NumPy's values, dtype and
    layout, on C, F, negative-stride and flattened layouts, lines of whole and partial tiles and groups, NaN
    and inf placed, exact ones (1 + 0i) and signed zeros; in place, into an out of another dtype, from a
    real x or another complex dtype by dtype=, and in a CUDA graph."""
    import cupy

    shape = (9, 4096 * 33 + 5)
    h = (np.exp(1j * rng.uniform(-0.01, 0.01, shape)) * (1 + 1e-4 * rng.standard_normal(shape))).astype(dtype)
    h[2, 7], h[3, 4096 * 32], h[4, 11] = complex(np.nan, 1), complex(np.inf, 0), complex(1, 0)
    h[5, 5:9] = [complex(1, -0.0), complex(-0.0, 1), complex(-0.0, -0.0), 1]
    for label, (xh, x) in {"c": (h, cupy.asarray(h)),
                           "f": (np.asfortranarray(h[:, :5000]), cupy.asfortranarray(cupy.asarray(h[:, :5000]))),
                           "neg": (h[::-1, ::-3], cupy.asarray(h)[::-1, ::-3])}.items():
        for axis in (None, 0, 1):
            got = C.cumprod(x, axis=axis)
            assert same_bits(got, R.cumprod_emulated(xh, axis)), (label, axis)
            want = np.cumprod(xh.astype(np.complex128), axis=axis)
            assert got.dtype == dtype and got.shape == want.shape, (label, axis)
            finite = np.isfinite(want)
            # complex64: float32 products of near-unit factors at small angles shrink the modulus by about
            # 4e-8 a step on average (NumPy's own complex64 multiply does too); the bound grows with the line
            line = xh.size if axis is None else xh.shape[axis]
            rtol = 1e-6 + 1e-8 * line if dtype == np.complex64 else 1e-10
            np.testing.assert_allclose(got.get()[finite], want[finite], rtol=rtol)
    x = cupy.asarray(h)
    want = R.cumprod_emulated(h, 1)
    y = x.copy()
    assert C.cumprod(y, axis=1, out=y) is y and same_bits(y, want)
    wide = cupy.zeros(h.shape, np.complex128)
    assert C.cumprod(x, axis=1, out=wide) is wide and same_bits(wide, want.astype(np.complex128))
    assert same_bits(C.cumprod(x, axis=1, dtype=dtype), want)
    real = (1 + 1e-3 * rng.standard_normal((4, 5000))).astype(np.float32)
    got = C.cumprod(cupy.asarray(real), axis=1, dtype=dtype)
    assert got.dtype == dtype and same_bits(got, R.cumprod_emulated(real, 1, dtype=dtype))
    other = np.complex128 if dtype == np.complex64 else np.complex64
    got = C.cumprod(x[:3], axis=1, dtype=other)
    assert got.dtype == other and same_bits(got, R.cumprod_emulated(h[:3], 1, dtype=other))
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        C.cumprod(x, axis=1)  # the stream's workspace
        stream.synchronize()
        stream.begin_capture()
        try:
            captured = C.cumprod(x, axis=1)
        finally:
            graph = stream.end_capture()
        graph.launch(stream)
        stream.synchronize()
    assert same_bits(captured, want)


@pytest.mark.gpu
@pytest.mark.parametrize("op", OPS)
def test_captured_scans_replay_into_their_results(op, rng):
    """After one eager call on the stream (workspace, kernels), a capture of scans of both kernels and several
    layouts, fresh, into an out and in place, frees nothing; each replay scans x's values of the moment into
    the same arrays (the emulator's bits), eager scans between replays stay right, and arrays allocated after
    the capture are never written."""
    import cupy

    cases = [((3 * 4096 * 32 + 5,), np.float32, None), ((37, 9001), np.float32, 1), ((300, 4104), np.float16, 0),
             ((9, 70001), np.int32, 1), ((5000, 7), np.float64, 0), ((4096 * 40,), np.complex64, None)]
    pool = cupy.get_default_memory_pool()
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        xs, outs, ins = [], [], []
        for shape, dt, axis in cases:
            h = _values(rng, shape, dt, op) if dt != np.complex64 else (
                np.exp(1j * rng.uniform(-0.01, 0.01, shape)) * _values(rng, shape, np.float32, op)).astype(dt)
            x = cupy.asarray(h)
            xs.append((x, axis))
            want = getattr(C, op)(x, axis=axis)  # eager: the workspace and the kernels
            outs.append(cupy.full(want.shape, -1, want.dtype))
            ins.append(x.copy() if want.dtype == x.dtype and want.shape == x.shape else None)
        stream.synchronize()
        gc.collect()
        pool.free_all_blocks()

        def step():
            fresh = [getattr(C, op)(x, axis=axis) for x, axis in xs]
            into = [getattr(C, op)(x, axis=axis, out=o) for (x, axis), o in zip(xs, outs)]
            inplace = [getattr(C, op)(y, axis=axis, out=y) for (_, axis), y in zip(xs, ins) if y is not None]
            return fresh, into, inplace

        graph, (fresh, into, inplace), freed = capture(stream, step)
        later = victims(pool)
        for v in later:
            v.fill(0x5A)
        for replay in range(2):
            sources = []
            for (x, axis), y in zip(xs, ins):
                x[...] = cupy.asarray(_values(rng, x.shape, x.dtype, op)) if x.dtype.kind != "c" else x[::-1].copy()
                if y is not None:
                    y[...] = x
                sources.append(x.get())
            graph.launch(stream)
            eager = [getattr(C, op)(x, axis=axis) for x, axis in xs]  # between replays: its own epoch
            stream.synchronize()
            k = 0
            for i, ((x, axis), y) in enumerate(zip(xs, ins)):
                want = getattr(R, f"{op}_emulated")(sources[i], axis)
                assert same_bits(fresh[i], want) and same_bits(into[i], want) and same_bits(eager[i], want), (i, replay)
                if y is not None:
                    assert same_bits(inplace[k], want), (i, replay)
                    k += 1
    assert not freed, f"the capture freed blocks of {freed} bytes that its replays may still write"
    assert all(bool((v == 0x5A).all()) for v in later), "a replay wrote into a later allocation"
    assert all(r is o for r, o in zip(into, outs))


@pytest.mark.gpu
def test_capture_refuses_a_temporary_or_a_missing_workspace(rng, monkeypatch):
    """Calls that would go through a temporary (a copied layout, a conversion, a cast into out) or need a larger
    workspace than the stream has raise RuntimeError under capture before anything is recorded or allocated,
    and work eagerly."""
    import cupy

    monkeypatch.setattr(C, "_workspaces", {})  # (a stream made by another test may have had this address)
    x = cupy.asarray(_values(rng, (4, 5, 6, 4100), np.float32, "cumsum"))
    deep = x[:, ::2, :, ::3]
    assert C.plan(deep.shape, 2, x_strides=[s // 4 for s in deep.strides]).copy
    narrow = cupy.asarray(_values(rng, (70, 4100), np.int8, "cumsum"))
    cast = cupy.empty(x.shape, np.float64)
    z = x[:, ::2].astype(np.complex64)[:, :, ::2]
    big = cupy.ones(4096 * 4096, np.float32)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        C.cumsum(x, axis=3)  # the workspace for these tiles
        cases = [(lambda: C.cumsum(deep, axis=2), "copied to C-contiguous"),
                 (lambda: C.cumsum(narrow, axis=1), "converted temporary"),
                 (lambda: C.cumsum(x, axis=3, out=cast), "cast into out"),
                 (lambda: C.cumsum(z), "copied to C-contiguous"),  # complex, flattened from a view
                 (lambda: C.cumsum(big), "before capturing")]
        for call, match in cases:
            refused_in_capture(stream, call, match=match)
        assert same_bits(C.cumsum(x, axis=3, out=cast), R.cumsum_emulated(x.get(), 3).astype(np.float64))
        assert same_bits(C.cumsum(deep, axis=2), R.cumsum_emulated(deep.get(), 2))


@pytest.mark.gpu
def test_an_out_starting_at_x_but_stepping_over_it_is_refused():
    """``out`` is x itself (in place) only as x's own view, or its flat run for axis=None: an out at x's
    address with another stride overlaps x and is refused before anything is written."""
    import cupy

    b = cupy.arange(2 * 5000, dtype=cupy.float32)
    before = b.get()
    for call in (lambda: C.cumsum(b[:5000], out=b[::2]), lambda: C.cumsum(b[:5000].reshape(50, 100), out=b[::2])):
        with pytest.raises(ValueError, match="out overlaps x"):
            call()
    assert np.array_equal(b.get(), before)
    x = cupy.asarray(np.arange(12, dtype=np.float32).reshape(3, 4))
    C.cumsum(x, out=x.reshape(-1))  # the flat run of a C-contiguous x: in place
    assert np.array_equal(x.get().reshape(-1), np.cumsum(np.arange(12, dtype=np.float32)))


@pytest.mark.gpu
def test_floats_into_uint64_scan_numpys_conversion():
    import cupy

    for t in (np.float64, np.float32, BFLOAT16):
        xh = np.array([1e19, 5.0, -2.0, 2.0**63, 3.5] * 300).astype(t)
        with np.errstate(invalid="ignore"):
            want = R.cumsum_emulated(xh, None, np.uint64)
        got = C.cumsum(cupy.asarray(xh), dtype=np.uint64)
        assert got.dtype == np.uint64 and np.array_equal(got.get(), want), t
