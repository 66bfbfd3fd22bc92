"""Kernel sources, instantiations and compilation.

Kernel text lives in ``cuda_src/*.cu`` (installed as ``cukern/cuda_src`` in a wheel). An instantiation
is a template name plus its arguments; its C++ name expression is generated here, never written by hand.
At run time each instantiation is compiled by :func:`compile_program` (NVRTC) for the device's architecture,
kept on disk (:func:`cache_dir`), loaded as a :class:`cupy.RawModule` once per (device, instantiation,
options) and memoized behind a lock, so concurrent first calls compile once. Without a GPU,
:func:`compile_program` runs the same source through NVRTC for any architecture (NVRTC needs no driver): the
code the CPU tests read is the code the GPU runs.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ._dtypes import BFLOAT16, COUNT
from ._launch import cupy as _cupy

_HERE = Path(__file__).resolve().parent


def source_dir() -> Path:
    """Where the ``.cu`` files are: inside the installed package, else the repository's ``cuda_src``."""
    for candidate in (_HERE / "cuda_src", _HERE.parent / "cuda_src"):
        if (candidate / "common").is_dir():
            return candidate
    raise FileNotFoundError(f"cukern kernel sources not found next to {_HERE}; the installation is incomplete")


def read_source(name: str) -> str:
    return (source_dir() / f"{name}.cu").read_text()


_CTYPES = {
    np.dtype(np.float32): "float",
    np.dtype(np.float64): "double",
    np.dtype(np.float16): "cukern::f16",
    BFLOAT16: "cukern::bf16",
    np.dtype(np.int32): "int",
    np.dtype(np.int64): "long long",
    np.dtype(np.int8): "signed char",
    np.dtype(np.int16): "short",
    np.dtype(np.bool_): "bool",
    np.dtype(np.uint8): "unsigned char",
    np.dtype(np.uint16): "unsigned short",
    np.dtype(np.uint32): "unsigned",
    np.dtype(np.uint64): "unsigned long long",
    np.dtype(np.complex64): "cukern::Complex<float>",
    np.dtype(np.complex128): "cukern::Complex<double>",
    COUNT: "cukern::Count",
}


def ctype(dtype) -> str:
    """The C++ type cuda_src uses for a NumPy dtype."""
    return _CTYPES[np.dtype(dtype)]


@dataclass(frozen=True)
class Instantiation:
    """One kernel instantiation: ``source`` file stem, template ``name``, template ``args`` (none for a plain
    kernel)."""

    source: str
    name: str
    args: tuple

    @property
    def expression(self) -> str:
        if not self.args:  # a plain (non-template) kernel
            return f"cukern::{self.name}"
        parts = []
        for a in self.args:
            if isinstance(a, bool):
                parts.append("true" if a else "false")
            elif isinstance(a, (int, np.integer)):
                parts.append(str(int(a)))
            else:
                parts.append(ctype(a))
        return f"cukern::{self.name}<{', '.join(parts)}>"


# -ftz=false is NVRTC's default, stated because it is the reason cukern compiles its kernels itself: CuPy's
# RawModule(code=...) appends -ftz=true to every program (cupy.cuda.compiler), and NVRTC takes the last of
# two -ftz options, so a kernel built that way flushes float32 subnormal operands and results to zero (a
# cumprod that reaches the subnormal range gave 0 there, sum and max saw subnormal inputs as 0), which
# neither NumPy nor the emulators of cukern.reference do. tests/test_compile.py checks the PTX for .ftz.
OPTIONS = ("-std=c++17", "-ftz=false")


def _options(extra=()) -> tuple:
    return OPTIONS + (f"-I{source_dir()}",) + tuple(extra)


_lock = threading.Lock()
_kernels: dict = {}


def get_kernel(inst: Instantiation, options: tuple = ()):
    """The :class:`cupy.RawKernel` for ``inst`` on the current device, compiled on first use."""
    cupy = _cupy()
    device = cupy.cuda.Device().id
    key = (device, inst, tuple(options))
    kernel = _kernels.get(key)
    if kernel is None:
        with _lock:
            kernel = _kernels.get(key)
            if kernel is None:
                path, lowered = cached_binary(inst, options, target(device))
                kernel = cupy.RawModule(path=str(path)).get_function(lowered)
                _kernels[key] = kernel
    return kernel


def target(device: int) -> str:
    """What NVRTC compiles for ``device``: its own machine code (``sm_90``) where this NVRTC knows the
    architecture, else the PTX of the newest one it knows below it (``compute_90``), which the driver
    compiles on loading."""
    cupy = _cupy()
    nvrtc = cupy.cuda.nvrtc
    cc = int(cupy.cuda.Device(device).compute_capability)
    known = [a for a in nvrtc.getSupportedArchs() if a <= cc]
    if cc in known or not known:
        return f"sm_{cc}"
    return f"compute_{max(known)}"


def cache_dir() -> Path:
    """Where compiled kernels are kept between processes: ``$CUKERN_CACHE_DIR``, else ``cukern`` under
    ``$XDG_CACHE_HOME`` (``~/.cache``)."""
    chosen = os.environ.get("CUKERN_CACHE_DIR")
    if chosen:
        return Path(chosen)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "cukern"


_scratch: list = []  # a process's own directory, where the cache directory cannot be written


def _sources_digest() -> str:
    """sha256 over every file under ``source_dir()`` (paths and bytes): any change to a kernel or a header
    it includes makes new cache entries."""
    root = source_dir()
    h = hashlib.sha256()
    for p in sorted(q for q in root.rglob("*") if q.is_file() and q.suffix in {".cu", ".cuh", ".h"}):
        h.update(p.relative_to(root).as_posix().encode() + b"\n" + p.read_bytes())
    return h.hexdigest()


def cached_binary(inst: Instantiation, options: tuple, arch: str) -> tuple:
    """``(path, lowered name)`` of ``inst`` compiled for ``arch`` by :func:`compile_program`: read from
    :func:`cache_dir` when an earlier process made it from the same sources, NVRTC version, options and
    architecture, else compiled and written there (each file written whole under a temporary name and then
    renamed, so processes compiling the same kernel at once each leave a complete file)."""
    key = hashlib.sha256("\n".join((_sources_digest(), nvrtc_version(), arch, " ".join(OPTIONS + tuple(options)),
                                    inst.expression)).encode()).hexdigest()
    suffix = ".cubin" if arch.startswith("sm_") else ".ptx"
    for folder in [cache_dir()] + _scratch:
        binary, name = folder / f"{key}{suffix}", folder / f"{key}.name"
        if binary.is_file() and name.is_file():
            return binary, name.read_text()
    c = compile_program(inst.source, [inst], arch, options, report=False)
    lowered = c.lowered[inst.expression]
    data = c.cubin if suffix == ".cubin" else c.ptx.encode()
    try:
        return _write(cache_dir(), key, suffix, data, lowered), lowered
    except OSError:
        if not _scratch:
            _scratch.append(Path(tempfile.mkdtemp(prefix="cukern-")))
        return _write(_scratch[0], key, suffix, data, lowered), lowered


def _write(folder: Path, key: str, suffix: str, data: bytes, lowered: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for path, content in ((folder / f"{key}.name", lowered.encode()), (folder / f"{key}{suffix}", data)):
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".part-")
        with os.fdopen(fd, "wb") as f:
            f.write(content)
        os.replace(tmp, path)
    return folder / f"{key}{suffix}"


@dataclass
class Compiled:
    """What NVRTC made of a batch of instantiations for one architecture."""

    arch: str
    ptx: str
    cubin: bytes
    lowered: dict
    log: str

    def kernel_ptx(self, inst: Instantiation) -> str:
        """The PTX of one instantiation's kernel: its ``.entry`` up to the next one."""
        head = f".entry {self.lowered[inst.expression]}("
        start = self.ptx.find(head)
        if start < 0:
            raise KeyError(f"{inst.expression} is not in this program's PTX")
        start += len(head)
        end = self.ptx.find(".entry ", start)  # a plain search: a regex took seconds over a family's PTX
        return self.ptx[start:] if end < 0 else self.ptx[start:end]

    def resources(self) -> dict:
        """Per lowered kernel name: registers, spill bytes, stack frame and static shared memory, read
        from ptxas' verbose report (available with no GPU)."""
        out: dict = {}
        current = None
        for line in self.log.splitlines():
            m = re.search(r"Function properties for (\S+)", line)
            if m:
                current = out.setdefault(m.group(1), {})
                continue
            if current is None:
                continue
            m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
            if m:
                current.update(stack=int(m.group(1)), spill_stores=int(m.group(2)), spill_loads=int(m.group(3)))
            m = re.search(r"Used (\d+) registers", line)
            if m:
                current["registers"] = int(m.group(1))
                s = re.search(r"(\d+) bytes smem", line)
                current["shared"] = int(s.group(1)) if s else 0
        return out


def compile_program(source: str, instantiations, arch: str = "sm_90", options: tuple = (),
                    report: bool = True) -> Compiled:
    """Compile ``instantiations`` of ``cuda_src/<source>.cu`` with NVRTC for ``arch``; no GPU needed. A virtual
    architecture (``compute_90``) stops at the PTX: no ptxas, no cubin, no resources (half the time).
    ``report``: ptxas' resource report in the log (:meth:`Compiled.resources`)."""
    machine_code = not arch.startswith("compute_")
    nvrtc = _cupy().cuda.nvrtc

    prog = nvrtc.createProgram(read_source(source), f"{source}.cu", [], [])
    try:
        exprs = [i.expression for i in instantiations]
        for e in exprs:
            nvrtc.addNameExpression(prog, e)
        opts = list(_options(options)) + [f"--gpu-architecture={arch}"]
        opts += ["-Xptxas=-v"] if machine_code and report else []
        try:
            nvrtc.compileProgram(prog, opts)
        except nvrtc.NVRTCError as err:
            raise RuntimeError(f"NVRTC failed on {source}.cu for {arch}:\n{nvrtc.getProgramLog(prog)}") from err
        ptx = nvrtc.getPTX(prog)
        return Compiled(
            arch=arch,
            ptx=ptx.decode() if isinstance(ptx, bytes) else ptx,
            cubin=nvrtc.getCUBIN(prog) if machine_code else b"",
            lowered={e: nvrtc.getLoweredName(prog, e) for e in exprs},
            log=nvrtc.getProgramLog(prog),
        )
    finally:
        nvrtc.destroyProgram(prog)


def nvrtc_version() -> str:
    return ".".join(map(str, _cupy().cuda.nvrtc.getVersion()))


def source_sha256() -> str:
    """sha256 over every ``.py``, ``.cu``, ``.cuh``, ``.h`` file under ``cuda_src/`` and ``cukern/`` (sorted by
    repository-relative POSIX path; each contributes ``path\\n<sha256 of its bytes>\\n``). Computed from
    the repository checkout, the form the results file records."""
    root = _HERE.parent
    files = []
    for top in ("cuda_src", "cukern"):
        for p in (root / top).rglob("*"):
            if p.is_file() and p.suffix in {".py", ".cu", ".cuh", ".h"} and "__pycache__" not in p.parts:
                files.append(p.relative_to(root).as_posix())
    text = "".join(f"{f}\n{hashlib.sha256((root / f).read_bytes()).hexdigest()}\n" for f in sorted(files))
    return hashlib.sha256(text.encode()).hexdigest()
