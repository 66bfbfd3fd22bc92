"""Sphinx configuration of cukern's documentation.

Build: ``python -m sphinx -W -b html docs docs/_build/html`` from the repository root. Nothing here needs a
GPU: the API pages import cukern (CuPy is imported, no device is touched), the CLI page walks the argparse
parser and the results page reads ``bench/results/*.json``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(DOCS / "_ext"))

import cukern  # noqa: E402

project = "cukern"
author = "cukern contributors"
copyright = "cukern contributors"
release = cukern.__version__
version = ".".join(release.split(".")[:2])

extensions = [
    "myst_parser",
    "numpydoc",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.intersphinx",
    "sphinx.ext.mathjax",
    "cukern_api",
    "cukern_cli",
    "cukern_results",
    "cukern_tables",
    "cukern_ladder",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]

myst_enable_extensions = ["colon_fence", "deflist", "dollarmath"]
myst_heading_anchors = 3

# numpydoc: docstrings are written in numpydoc form; the settings below accept every standard section and do
# not validate, so that a docstring renders whatever sections it carries
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_validation_checks = set()
numpydoc_xref_param_type = False
numpydoc_use_plots = False
numpydoc_attributes_as_param_list = False

autosummary_generate = True
autosummary_imported_members = True
autodoc_default_options = {"members": False}
autodoc_typehints = "none"  # numpydoc's Parameters section carries the types
autodoc_mock_imports = ["dask", "distributed", "dask_cuda", "torch", "triton"]

# links into Python's, NumPy's and CuPy's documentation, when asked for: CI builds offline
intersphinx_mapping = {}
if os.environ.get("CUKERN_DOCS_INTERSPHINX"):
    intersphinx_mapping = {
        "python": ("https://docs.python.org/3", None),
        "numpy": ("https://numpy.org/doc/stable", None),
        "cupy": ("https://docs.cupy.dev/en/stable", None),
    }

html_theme = "pydata_sphinx_theme"
html_title = f"cukern {release}"
html_theme_options = {
    "github_url": "https://github.com/cukern/cukern",
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "secondary_sidebar_items": ["page-toc"],
}
html_sidebars = {"**": ["sidebar-nav-bs"]}
html_show_sourcelink = False
