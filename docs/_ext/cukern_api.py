"""The API reference's pages, written from the package's public names when the configuration is read, at the start of every build.

Each section below names a module and how its public names are found: a module's ``__all__`` where it has
one (``cukern``, ``cukern.reference``), else the functions and classes the module defines itself whose names
do not start with an underscore (``cukern.timing``, ``cukern.dask``), or an explicit list (``cukern.torch``'s
functions, which import torch, and the lab's entry points). A public function added to ``cukern.__all__`` (or defined in ``cukern.timing`` / ``cukern.dask``)
gets its page with no edit here. The pages go to ``docs/api/generated/`` (git-ignored); autosummary then
writes one page per name.
"""

from __future__ import annotations

import importlib
import inspect
import types
from pathlib import Path

# (page, title, module, names or None for "the module's public names", intro)
SECTIONS = [
    ("cukern", "cukern", "cukern", None,
     "The ops. Every function takes CuPy arrays (or any object with ``__dlpack__`` or "
     "``__cuda_array_interface__``) and launches on CuPy's current stream."),
    ("reference", "cukern.reference", "cukern.reference", None,
     "NumPy-only references (float64) and emulators (the exact bits the GPU writes). Runs on any machine."),
    ("timing", "cukern.timing", "cukern.timing", None,
     "CUDA-event timing with the L2 flushed, and the device-to-device copy peak every percentage is of."),
    ("dask", "cukern.dask", "cukern.dask", None,
     "The ops over Dask arrays of CuPy chunks: row ops mapped over row chunks, reductions as Dask tree "
     "reductions."),
    ("torch", "cukern.torch", "cukern.torch",
     ["rms_norm", "fused_add_rms_norm", "layer_norm", "fused_add_layer_norm", "rotary_embedding", "qk_norm_rope"],
     "PyTorch autograd on cukern's forward and backward kernels (the ``torch`` extra). The pages are built "
     "without PyTorch: ``torch`` is mocked while they are read."),
    ("lab", "cukern.lab", "cukern.lab", ["card.explain", "tune.tune", "cli.main", "pytest_plugin.CudaBenchmark"],
     "The lab's entry points: the six-question card, the tuner, the command line and the ``cuda_benchmark`` "
     "fixture of the pytest plugin."),
]


def public_names(module: types.ModuleType) -> list[str]:
    if hasattr(module, "__all__"):
        return [n for n in module.__all__ if not isinstance(getattr(module, n), types.ModuleType)]
    own = []
    for name, obj in vars(module).items():
        if name.startswith("_") or not (inspect.isfunction(obj) or inspect.isclass(obj)):
            continue
        if getattr(obj, "__module__", None) == module.__name__:
            own.append(name)
    return sorted(own)


def _page(title: str, module: str | None, names: list[str], intro: str) -> str:
    lines = [title, "=" * len(title), ""]
    if module:
        lines += [f".. module:: {module}", ""]
    lines += [intro, "", ".. autosummary::", "   :toctree: .", "   :nosignatures:", ""]
    lines += [f"   {n}" for n in names]
    return "\n".join(lines) + "\n"


def _write_if_changed(path: Path, text: str) -> None:
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


def write_pages(app, config=None) -> None:
    out = Path(app.srcdir) / "api" / "generated"
    out.mkdir(parents=True, exist_ok=True)
    for page, title, module, names, intro in SECTIONS:
        if names is None:
            mod = importlib.import_module(module)
            names = public_names(mod)
        _write_if_changed(out / f"{page}.rst", _page(title, module, names, intro))


def setup(app):
    # before the sources are listed, so that autosummary finds these pages and writes their stubs in one build
    app.connect("config-inited", write_pages)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
