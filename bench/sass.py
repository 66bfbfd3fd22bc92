"""The SASS of kernel instantiations without a GPU: NVRTC's cubin for an architecture, disassembled by
nvdisasm, with each kernel's count of instructions by opcode (static: every path, executed or not).

    python bench/sass.py segment "segment_warp<float, 0, long long, float>" [--arch sm_90] [--out FILE]

The second argument picks every instantiation of the family (``cuda_src/<family>.cu``) whose C++
expression contains it. nvdisasm comes from a CUDA toolkit on PATH or from the ``nvidia-cuda-nvdisasm``
wheel (``pip install nvidia-cuda-nvdisasm``; any version that knows the architecture). CuPy's
``nvrtc.getCUBIN`` returns the image one byte short (the last byte of the program header table, a zero),
which nvdisasm then refuses as an invalid ELF file: :func:`cubin_image` pads it back.
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ELF_HEADER = 64


def cubin_image(data: bytes) -> bytes:
    """An ELF64 image whose program header table, which ends it, is whole (zero bytes appended)."""
    if data[:4] != b"\x7fELF" or len(data) < ELF_HEADER:
        raise ValueError("not an ELF image")
    phoff = int.from_bytes(data[32:40], "little")
    phentsize = int.from_bytes(data[54:56], "little")
    phnum = int.from_bytes(data[56:58], "little")
    shoff = int.from_bytes(data[40:48], "little")
    shentsize = int.from_bytes(data[58:60], "little")
    shnum = int.from_bytes(data[60:62], "little")
    end = max(phoff + phentsize * phnum, shoff + shentsize * shnum)
    return data + b"\x00" * max(0, end - len(data))


def opcodes(sass: str) -> collections.Counter:
    """Instructions by opcode (predicates and modifiers dropped) in nvdisasm's or cuobjdump's listing."""
    found = re.findall(r"^\s+/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)", sass, re.M)
    return collections.Counter(found)


def nvdisasm() -> str:
    on_path = shutil.which("nvdisasm")
    if on_path:
        return on_path
    try:
        import nvidia
    except ImportError:
        nvidia = None
    for root in getattr(nvidia, "__path__", []):
        for candidate in sorted(Path(root).glob("*/bin/nvdisasm")):
            return str(candidate)
    sys.exit("nvdisasm not found: install a CUDA toolkit or `pip install nvidia-cuda-nvdisasm`")


def main(argv=None) -> int:
    from cukern import _compile, families

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    known = ", ".join(f.SOURCE for f in families.all_families())
    ap.add_argument("family", help=f"a kernel family's source stem: {known}")
    ap.add_argument("match", help="a substring of the instantiations' C++ expressions")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--out", help="write the listing here (default: only the counts)")
    args = ap.parse_args(argv)
    insts = [i for i in families.named(args.family).instantiations() if args.match in i.expression]
    if not insts:
        sys.exit(f"no instantiation of {args.family} contains {args.match!r}")
    compiled = _compile.compile_program(args.family, insts, args.arch)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernels.cubin"
        path.write_bytes(cubin_image(compiled.cubin))
        listing = subprocess.run([nvdisasm(), "-c", str(path)], capture_output=True, text=True, check=True).stdout
    if args.out:
        Path(args.out).write_text(listing)
    for inst in insts:
        name = compiled.lowered[inst.expression]
        start = listing.find(f".text.{name}:")
        end = listing.find("\n\t.section", start + 1) if start >= 0 else -1
        body = listing[start:end if end >= 0 else len(listing)] if start >= 0 else ""
        counts = opcodes(body)
        top = ", ".join(f"{op} {n}" for op, n in counts.most_common(16))
        print(f"{inst.expression}: {sum(counts.values())} instructions: {top}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
