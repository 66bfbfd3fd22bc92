"""Kernel sources, instantiations and compilation.

Kernel text lives in ``cuda_src/*.cu`` (installed as ``cukern/cuda_src`` in a wheel). An instantiation
is a template name plus its arguments; its C++ name expression is generated here, never written by hand.
At run time each instantiation becomes a :class:`cupy.RawModule` built once per (device, source,
instantiation, options) and memoized behind a lock, so concurrent first calls compile once. Without a GPU,
:func:`compile_program` runs the same source through NVRTC for any architecture (NVRTC needs no driver).
"""

from __future__ import annotations

import hashlib
import re
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ._dtypes import BFLOAT16, COUNT

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


OPTIONS = ("-std=c++17",)


def _options(extra=()) -> tuple:
    return OPTIONS + (f"-I{source_dir()}",) + tuple(extra)


_lock = threading.Lock()
_kernels: dict = {}


def get_kernel(inst: Instantiation, options: tuple = ()):
    """The :class:`cupy.RawKernel` for ``inst`` on the current device, compiled on first use."""
    import cupy

    device = cupy.cuda.Device().id
    key = (device, inst, tuple(options))
    kernel = _kernels.get(key)
    if kernel is None:
        with _lock:
            kernel = _kernels.get(key)
            if kernel is None:
                module = cupy.RawModule(
                    code=read_source(inst.source),
                    options=_options(options),
                    name_expressions=[inst.expression],
                )
                kernel = module.get_function(inst.expression)
                _kernels[key] = kernel
    return kernel


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


def compile_program(source: str, instantiations, arch: str = "sm_90", options: tuple = ()) -> Compiled:
    """Compile ``instantiations`` of ``cuda_src/<source>.cu`` with NVRTC for ``arch``; no GPU needed. A virtual
    architecture (``compute_90``) stops at the PTX: no ptxas, no cubin, no resources (half the time)."""
    machine_code = not arch.startswith("compute_")
    from cupy.cuda import nvrtc

    prog = nvrtc.createProgram(read_source(source), f"{source}.cu", [], [])
    try:
        exprs = [i.expression for i in instantiations]
        for e in exprs:
            nvrtc.addNameExpression(prog, e)
        opts = list(_options(options)) + [f"--gpu-architecture={arch}"] + (["-Xptxas=-v"] if machine_code else [])
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
    from cupy.cuda import nvrtc

    return ".".join(map(str, nvrtc.getVersion()))


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
