"""Every private framework or CPython touchpoint in tensortap is listed in docs/internals.md.

The scan reads tensortap's source (no import): a touchpoint is an access `obj._name` (also through
getattr/setattr/hasattr with a constant name) where `obj` is not `self`/`cls` and no tensortap class defines
`_name` (a method, a class attribute or a `self._name = ...`; a module-level function does not count), or an
import of a private module or name from outside tensortap (`import _posixshmem`, `from sys import _getframe`), or
an import from a library's internal package (`tensorflow.python`: TensorFlow's public API is `tf.*`). Each one
found must appear in a row of docs/internals.md's table that names both the attribute (in backticks) and the
file that uses it.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "tensortap"
INTERNALS = ROOT / "docs" / "internals.md"

# Names that look private but are not a library's internals: Enum's documented `_value_`, the documented
# `os._exit`, tensortap's own attributes on its own objects (a reservation's writer), and the markers tensortap
# puts on objects it wraps.
_NOT_TOUCHPOINTS = {"_value_", "_exit", "_w"}
_OWN_PREFIX = "_tensortap"
# Packages that are a library's internals though no part of their name starts with an underscore.
_INTERNAL_PACKAGES = ("tensorflow.python",)


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__") and not name.startswith(_OWN_PREFIX)


def _internal_module(module: str) -> bool:
    return any(_private(part) for part in module.split(".")) or any(
        module == p or module.startswith(p + ".") for p in _INTERNAL_PACKAGES)


def _defined_names(trees: dict[Path, ast.AST]) -> set[str]:
    names: set[str] = set()
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                names.add(node.name)
                # (methods only: a module-level `_helper` of tensortap's does not make `layer._helper` its own)
                names.update(stmt.name for stmt in node.body
                             if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)))
                for stmt in node.body:
                    targets = stmt.targets if isinstance(stmt, ast.Assign) else \
                        [stmt.target] if isinstance(stmt, ast.AnnAssign) else []
                    names.update(t.id for t in targets if isinstance(t, ast.Name))
            if (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                    and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                names.add(node.attr)
    return names


def scan(package: Path = PACKAGE) -> dict[str, set[str]]:
    """{touchpoint: {file relative to the repository}} for every private use of something not tensortap's."""
    trees = {p: ast.parse(p.read_text(), filename=str(p)) for p in sorted(package.rglob("*.py"))}
    own = _defined_names(trees)
    found: dict[str, set[str]] = defaultdict(set)
    for path, tree in trees.items():
        rel = path.relative_to(package.parent).as_posix()
        for node in ast.walk(tree):
            name = None
            if isinstance(node, ast.Attribute) and _private(node.attr):
                if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                    name = node.attr
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                  and node.func.id in ("getattr", "setattr", "hasattr", "delattr") and len(node.args) >= 2
                  and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
                  and _private(node.args[1].value)):
                name = node.args[1].value
            if name is not None and name not in own and name not in _NOT_TOUCHPOINTS:
                found[name].add(rel)
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                    and node.module.split(".")[0] != "tensortap":
                if _internal_module(node.module):
                    found[node.module].add(rel)
                for alias in node.names:
                    if _private(alias.name):
                        found[alias.name].add(rel)
            if isinstance(node, ast.Import):
                for alias in node.names:
                    parts = alias.name.split(".")
                    if parts[0] != "tensortap" and _internal_module(alias.name):
                        found[alias.name].add(rel)
    return dict(found)


def _rows() -> list[str]:
    return [line for line in INTERNALS.read_text().splitlines() if line.startswith("| ") and "`" in line]


def test_every_private_touchpoint_is_listed_with_the_file_that_uses_it():
    rows = _rows()
    missing = []
    for name, files in sorted(scan().items()):
        pattern = re.compile(r"`[^`]*(?<![A-Za-z0-9_])" + re.escape(name) + r"(?![A-Za-z0-9_])[^`]*`")
        for rel in sorted(files):
            if not any(pattern.search(row) and rel in row for row in rows):
                missing.append(f"{name} in {rel}")
    assert not missing, "private touchpoints not listed in docs/internals.md (name and file in one row): " + \
        ", ".join(missing)


def test_the_scan_finds_a_new_private_access(tmp_path):
    pkg = tmp_path / "tensortap"
    pkg.mkdir()
    (pkg / "mod.py").write_text(
        "import torch\n"
        "from multiprocessing import _private_thing\n"
        "class A:\n"
        "    def __init__(self):\n"
        "        self._mine = 1\n"
        "    def f(self, m):\n"
        "        return m._parameters, self._mine, getattr(m, '_buffers', None), m._mine, m._value_, m._layers\n"
        "def _layers():\n"
        "    pass\n"
    )
    found = scan(pkg)
    assert found == {"_parameters": {"tensortap/mod.py"}, "_buffers": {"tensortap/mod.py"},
                     "_private_thing": {"tensortap/mod.py"}, "_layers": {"tensortap/mod.py"}}


def test_the_scan_finds_an_import_from_a_librarys_internal_package(tmp_path):
    pkg = tmp_path / "tensortap"
    pkg.mkdir()
    (pkg / "mod.py").write_text(
        "import tensorflow as tf\n"
        "from tensorflow.python.ops import resource_variable_ops\n"
        "import tensorflow.python.eager.context\n"
        "from tensorflow import nest\n"
    )
    assert scan(pkg) == {"tensorflow.python.ops": {"tensortap/mod.py"},
                         "tensorflow.python.eager.context": {"tensortap/mod.py"}}


def test_every_listed_row_names_a_fallback_and_a_guarding_test():
    header = next(line for line in INTERNALS.read_text().splitlines() if line.startswith("| touchpoint"))
    columns = [c.strip() for c in header.strip("|").split("|")]
    assert columns == ["touchpoint", "where", "what it buys", "fallback", "guarded by"]
    for row in _rows():
        cells = [c.strip() for c in row.strip("|").split("|")]
        if cells[0] == "touchpoint":
            continue
        assert len(cells) == 5 and all(cells), row
        assert "tests/" in cells[4] or "test_" in cells[4], row
