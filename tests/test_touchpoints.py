"""Every private framework or CPython touchpoint in tensortap is listed in docs/internals.md.

The scan reads tensortap's source (no import): a touchpoint is an access `obj._name` (also through
getattr/setattr/hasattr with a constant name) where `obj` is not `self`/`cls` and no tensortap class defines
`_name` (a method, a class attribute or a `self._name = ...`; a module-level function does not count), or an
import of a private module or name from outside tensortap (`import _posixshmem`, `from sys import _getframe`), or
an import from a library's internal package (`tensorflow.python`: TensorFlow's public API is `tf.*`). Inside a
class that derives from a class not tensortap's (`keras.callbacks.Callback`, `xgb.callback.TrainingCallback`,
`threading.Thread`), `self._name` is a touchpoint too unless that class or one of its tensortap bases defines
`_name`: the attribute is the library's. Each one found must appear in a row of docs/internals.md's table that
names both the attribute (in backticks) and the file that uses it.
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


def _class_names(cls: ast.ClassDef) -> set[str]:
    """What a class defines itself: methods, class attributes, attributes its methods set on `self`/`cls`."""
    names: set[str] = set()
    for stmt in cls.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(stmt.name)
        targets = stmt.targets if isinstance(stmt, ast.Assign) else \
            [stmt.target] if isinstance(stmt, ast.AnnAssign) else []
        names.update(t.id for t in targets if isinstance(t, ast.Name))
    for node in ast.walk(cls):
        if (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
            names.add(node.attr)
    return names


def _module_name(path: Path, package: Path) -> str:
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _tensortap_bindings(tree: ast.AST, module: str) -> dict[str, tuple[str, str] | str]:
    """Names bound in a module to tensortap: a class, (module, class name); a module, its dotted name."""
    bound: dict[str, tuple[str, str] | str] = {}
    package = module.rsplit(".", 1)[0] if "." in module else module
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level > 0:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                source = f"{base}.{node.module}" if node.module else base
            else:
                source = node.module or ""
            if source.split(".")[0] == "tensortap":
                for alias in node.names:
                    bound[alias.asname or alias.name] = (source, alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "tensortap":
                    bound[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else "tensortap"
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            bound[node.name] = (module, node.name)
    return bound


def _framework_classes(trees: dict[Path, ast.AST], package: Path) -> dict[int, set[str]]:
    """{id(class node): the names it and its tensortap bases define} for each tensortap class that derives,
    directly or through tensortap bases, from a class not tensortap's (anything but `object` not bound to a
    tensortap class: a framework's, the standard library's)."""
    classes: dict[tuple[str, str], tuple[ast.ClassDef, list[tuple[str, str] | None]]] = {}
    bindings: dict[str, dict[str, tuple[str, str] | str]] = {}
    for path, tree in trees.items():
        module = _module_name(path, package)
        bound = bindings[module] = _tensortap_bindings(tree, module)
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            bases: list[tuple[str, str] | None] = []  # a tensortap class, or None: a class not tensortap's
            for b in node.bases:
                if isinstance(b, ast.Subscript):  # (Generic[T], Protocol[...])
                    b = b.value
                dotted = ast.unparse(b)
                if dotted == "object":
                    continue
                head, _, rest = dotted.partition(".")
                target = bound.get(head)
                if isinstance(target, tuple) and not rest:
                    bases.append(target)
                elif isinstance(target, str) and rest:
                    mod, _, name = f"{target}.{rest}".rpartition(".")
                    bases.append((mod, name))
                elif isinstance(target, tuple) and rest:  # (a tensortap module imported by `from`)
                    mod, _, name = f"{target[0]}.{target[1]}.{rest}".rpartition(".")
                    bases.append((mod, name))
                else:
                    bases.append(None)
            classes[(module, node.name)] = (node, bases)

    def resolve(key: tuple[str, str], hops: int = 0) -> tuple[str, str] | None:
        if key in classes:
            return key
        mod, name = key  # (imported there from another module: followed)
        again = bindings.get(mod, {}).get(name)
        if isinstance(again, tuple) and again != key and hops < 8:
            return resolve(again, hops + 1)
        return None

    def walk(key: tuple[str, str], seen: set[tuple[str, str]]) -> tuple[set[str], bool]:
        node, bases = classes[key]
        names, foreign = _class_names(node), False
        for base in bases:
            target = resolve(base) if base is not None else None
            if target is None:
                foreign = True
            elif target not in seen:
                seen.add(target)
                more, far = walk(target, seen)
                names |= more
                foreign = foreign or far
        return names, foreign

    out: dict[int, set[str]] = {}
    for key, (node, _bases) in classes.items():
        names, foreign = walk(key, {key})
        if foreign:
            out[id(node)] = names
    return out


def _attr_call(node: ast.AST) -> str | None:
    """The constant private name of a getattr/setattr/hasattr/delattr call, else None."""
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "setattr", "hasattr", "delattr") and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
            and _private(node.args[1].value)):
        return node.args[1].value
    return None


def _on_self(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) and node.id in ("self", "cls")


def scan(package: Path = PACKAGE) -> dict[str, set[str]]:
    """{touchpoint: {file relative to the repository}} for every private use of something not tensortap's."""
    trees = {p: ast.parse(p.read_text(), filename=str(p)) for p in sorted(package.rglob("*.py"))}
    own = _defined_names(trees)
    framework = _framework_classes(trees, package)
    found: dict[str, set[str]] = defaultdict(set)
    for path, tree in trees.items():
        rel = path.relative_to(package.parent).as_posix()
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and id(node) in framework:
                # private attributes on `self` that neither the class nor its tensortap bases define: the library's
                for sub in ast.walk(node):
                    name = sub.attr if isinstance(sub, ast.Attribute) and _private(sub.attr) and \
                        _on_self(sub.value) else _attr_call(sub) if isinstance(sub, ast.Call) and sub.args and \
                        _on_self(sub.args[0]) else None
                    if name is not None and name not in framework[id(node)] and name not in _NOT_TOUCHPOINTS:
                        found[name].add(rel)
            name = None
            if isinstance(node, ast.Attribute) and _private(node.attr):
                if not _on_self(node.value):
                    name = node.attr
            elif isinstance(node, ast.Call) and not (node.args and _on_self(node.args[0])):
                name = _attr_call(node)
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


def test_the_scan_finds_private_attributes_of_a_framework_base_class_used_on_self(tmp_path):
    """`self._model` in a keras.callbacks.Callback subclass is Keras's attribute; `self._mine`, set by the class
    or a tensortap base (also one imported from another module, under another name), is not; a class deriving
    only from tensortap classes keeps `self` out of the scan."""
    pkg = tmp_path / "tensortap"
    (pkg / "hooks").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "hooks" / "__init__.py").write_text("")
    (pkg / "hooks" / "base.py").write_text(
        "class Hook:\n"
        "    def __init__(self):\n"
        "        self._base = 1\n"
        "class Hook2:\n"
        "    def f(self):\n"
        "        return self._anything\n"
    )
    (pkg / "cb.py").write_text(
        "import keras\n"
        "import threading\n"
        "from tensortap.hooks.base import Hook as BaseHook\n"
        "class Cb(BaseHook, keras.callbacks.Callback):\n"
        "    def __init__(self):\n"
        "        self._mine = 2\n"
        "    def f(self):\n"
        "        return self._model, self._mine, self._base, getattr(self, '_params', None)\n"
        "class Sub(Cb):\n"
        "    def g(self):\n"
        "        return self._stop_training, self._mine\n"
        "class T(threading.Thread):\n"
        "    def run(self):\n"
        "        return self._started\n"
        "class Own(BaseHook):\n"
        "    def h(self):\n"
        "        return self._set_elsewhere\n"
    )
    assert scan(pkg) == {"_model": {"tensortap/cb.py"}, "_params": {"tensortap/cb.py"},
                         "_stop_training": {"tensortap/cb.py"}, "_started": {"tensortap/cb.py"}}


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
