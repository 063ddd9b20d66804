"""Sphinx configuration for the pymc-pnode documentation."""

import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # document the checkout even when it is not installed

with open(ROOT / "pyproject.toml", "rb") as fh:
    _meta = tomllib.load(fh)["project"]

project = "pymc-pnode"
author = "pymc-pnode developers"
copyright = "pymc-pnode developers"
release = _meta["version"]
version = release

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "sphinx.ext.mathjax",
    "myst_parser",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]

nitpicky = False

# autodoc: import the real package (no mocked imports); type hints go into the parameter descriptions.
autodoc_typehints = "description"
autodoc_member_order = "bysource"

# napoleon: NumPy-style docstrings only.
napoleon_google_docstring = False
napoleon_numpy_docstring = True
napoleon_use_ivar = True  # "Attributes" sections do not clash with documented members

myst_enable_extensions = ["dollarmath"]

html_theme = "furo"
html_title = f"pymc-pnode {release}"
