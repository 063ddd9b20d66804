"""The case-study notebooks and scripts use only package names and call signatures that exist.

CI does not execute the notebooks (each takes minutes). This test reads their code cells and the scripts beside
them and checks every use of the package that can be checked without running it: names imported from
``pymc_pnode`` or reached as its attributes (``pn.fenrir_loglik``, ``pymc_pnode.baselines.rk_least_squares``)
exist, and calls of package functions and classes bind to their signatures (number of positional arguments and
keyword names). A changed internal signature once broke ``chkrebtii_speed.ipynb`` unnoticed.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
from pathlib import Path

import pytest

CASE_STUDIES = Path(__file__).resolve().parents[1] / "case_studies"
SOURCES = sorted(CASE_STUDIES.glob("*.ipynb")) + sorted(CASE_STUDIES.glob("*.py"))


def _python_source(path: Path) -> str:
    """A script's text, or a notebook's code cells joined (IPython magics and shell lines dropped)."""
    if path.suffix == ".py":
        return path.read_text()
    cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
    lines = [line for c in cells for line in "".join(c["source"]).splitlines()
             if not line.lstrip().startswith(("%", "!"))]
    return "\n".join(lines)


class PackageUses(ast.NodeVisitor):
    """The package objects a module uses: local names bound by ``import pymc_pnode ...`` / ``from pymc_pnode...
    import ...``, every attribute chain on them and every call of one."""

    def __init__(self):
        self.bound: dict[str, str] = {}
        self.uses: list[tuple[int, str]] = []
        self.calls: list[tuple[int, str, int, list[str]]] = []

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name.split(".")[0] == "pymc_pnode":
                self.bound[alias.asname or "pymc_pnode"] = alias.name if alias.asname else "pymc_pnode"

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level == 0 and node.module and node.module.split(".")[0] == "pymc_pnode":
            for alias in node.names:
                self.bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
                self.uses.append((node.lineno, f"{node.module}.{alias.name}"))

    def dotted(self, node: ast.AST) -> str | None:
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if isinstance(node, ast.Name) and node.id in self.bound:
            return ".".join([self.bound[node.id], *reversed(parts)])
        return None

    def visit_Attribute(self, node: ast.Attribute) -> None:
        name = self.dotted(node)
        if name is None:
            self.generic_visit(node)
        else:
            self.uses.append((node.lineno, name))

    def visit_Call(self, node: ast.Call) -> None:
        name = self.dotted(node.func)
        starred = any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords)
        if name is not None and not starred:
            self.calls.append((node.lineno, name, len(node.args), [k.arg for k in node.keywords]))
        self.generic_visit(node)


def resolve(name: str):
    """The object a dotted ``pymc_pnode...`` name refers to (``AttributeError``/``ImportError`` if none)."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:n]))
        except ImportError:
            continue
        for attr in parts[n:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(name)


def problems_in(source: str) -> list[str]:
    """Every package name in ``source`` that does not exist and every package call that does not bind."""
    uses = PackageUses()
    uses.visit(ast.parse(source))
    problems = []
    for line, name in uses.uses:
        try:
            resolve(name)
        except (AttributeError, ImportError) as err:
            problems.append(f"line {line}: {name} does not exist ({err})")
    for line, name, n_positional, keywords in uses.calls:
        try:
            signature = inspect.signature(resolve(name))
        except (AttributeError, ImportError):
            continue  # reported above
        except (TypeError, ValueError):
            continue  # no introspectable signature (compiled kernels)
        try:
            signature.bind(*([None] * n_positional), **dict.fromkeys(keywords))
        except TypeError as err:
            problems.append(f"line {line}: {name}{signature} called with {n_positional} positional arguments and "
                            f"keywords {keywords}: {err}")
    return problems


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.name)
def test_package_names_and_signatures_used_by_case_studies_exist(path):
    problems = problems_in(_python_source(path))
    assert not problems, "\n".join(problems)


def test_the_check_finds_a_removed_name_and_a_changed_signature():
    """The checker itself: a name that does not exist and calls that do not bind are reported, a valid use is not."""
    source = ("import pymc_pnode as pn\nfrom pymc_pnode.chkrebtii.structure import covariance_structure\n"
              "pn.no_such_function\ncovariance_structure(1, 2, 3, 4, 5, 6, 7)\n"
              "pn.fenrir_loglik(1, no_such_keyword=2)\n"
              "pn.chkrebtii_sample(1, 2, 3, (0, 1), n_grid=5, alpha=1, lam=1)\n")
    problems = problems_in(source)
    assert len(problems) == 3
    assert "line 3: pymc_pnode.no_such_function does not exist" in problems[0]
    assert problems[1].startswith("line 4: pymc_pnode.chkrebtii.structure.covariance_structure")
    assert problems[2].startswith("line 5: pymc_pnode.fenrir_loglik")
