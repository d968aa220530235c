"""The layers of README's "What is where" hold in the imports: no lower layer imports a higher one, and the
packages' imports form no circle.

Layers, low to high: the foundation (modes, exceptions, configs, collections) → storage → format (the native
store, smdebug's, TensorBoard's event files) → transport → capture → hooks → framework adapters; trials read
storage and format; rules, the runner, the dashboard, the CLI and the exports sit on top. The scan reads the
source (every import, also those inside functions); tensortap's root package and `tensortap.core` (smdebug's
import paths, re-exports) are facades and take part in neither rule.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "tensortap"

FOUNDATION = {"modes", "exceptions", "config", "collection", "hook_config", "analysis"}
#: the rooms of modules outside their package's own layer
_MODULE_ROOMS = {
    # TensorBoard's event-file encoder is a format the writers write (a sink); its converter reads trials
    "tensortap.tensorboard.events": "format",
    "tensortap.tensorboard.export": "format",
    "tensortap.tensorboard.histogram": "format",
    # the diagnosis reads trials and runs rules: it sits on top, beside the CLI and the dashboard (the rest of
    # tensortap.analysis is numpy only, under the rules)
    "tensortap.analysis.diagnose": "diagnose",
}
_FACADES = {"tensortap", "core"}
#: what each lower layer may import (the higher layers are not restricted here)
ALLOWED = {
    "foundation": {"foundation"},
    "storage": {"foundation", "storage"},
    "format": {"foundation", "storage", "format"},
    "transport": {"foundation", "storage", "format", "transport"},
    "capture": {"foundation", "storage", "format", "transport", "capture"},
    "trials": {"foundation", "storage", "format", "trials"},
}


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def room(module: str) -> str | None:
    """The room (layer) of a tensortap module: a package's name, "foundation", or a _MODULE_ROOMS entry."""
    parts = module.split(".")
    if parts[0] != "tensortap":
        return None
    for prefix, r in _MODULE_ROOMS.items():
        if module == prefix or module.startswith(prefix + "."):
            return r
    if len(parts) == 1:
        return "tensortap"
    return "foundation" if parts[1] in FOUNDATION else parts[1]


def imports() -> dict[str, set[tuple[str, str]]]:
    """{module: {(imported tensortap module, line)}} for every tensortap module."""
    out: dict[str, set[tuple[str, str]]] = defaultdict(set)
    for path in sorted(PACKAGE.rglob("*.py")):
        mod = _module_name(path)
        pkg = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = pkg.split(".")
                    base = base[:len(base) - (node.level - 1)]
                    module = ".".join(base + ([node.module] if node.module else []))
                else:
                    module = node.module or ""
                # `from tensortap import modes` names a module; `from tensortap.x import name` the module x
                targets = [f"{module}.{a.name}" if module == "tensortap" or not node.module else module
                           for a in node.names]
            for t in targets:
                if t.split(".")[0] == "tensortap":
                    out[mod].add((t, f"{path.relative_to(PACKAGE.parent)}:{node.lineno}"))
    return out


def test_no_lower_layer_imports_a_higher_one():
    bad = []
    for mod, targets in imports().items():
        allowed = ALLOWED.get(room(mod))
        if allowed is None:
            continue
        for target, where in sorted(targets):
            r = room(target)
            if r not in allowed and r not in _FACADES:
                bad.append(f"{where}: {room(mod)} imports {target} ({r})")
    assert not bad, "imports running up the layers:\n" + "\n".join(bad)


def test_the_packages_imports_form_no_circle():
    graph: dict[str, set[str]] = defaultdict(set)
    for mod, targets in imports().items():
        a = room(mod)
        for target, _where in targets:
            b = room(target)
            if a != b and a not in _FACADES and b not in _FACADES:
                graph[a].add(b)
    # Tarjan's strongly connected components: a component of more than one room is a circle
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(sorted(comp))

    for v in list(graph):
        if v not in index:
            visit(v)
    assert not circles, f"rooms importing each other in a circle: {circles}"


def test_the_scan_sees_an_import_inside_a_function():
    found = imports()["tensortap.tensorboard.convert"]
    assert any(t == "tensortap.trials" for t, _w in found)
    assert room("tensortap.tensorboard.convert") == "tensorboard"
    assert room("tensortap.tensorboard.export") == "format"
    assert room("tensortap.config") == "foundation"
