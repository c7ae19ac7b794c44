"""No import cycle in the package; no module of the engine writes another's state.

Two static checks, from each module's syntax tree:

- No import cycle: every ``import`` counts, at the top of a module or inside a function
  (a lazy import is still a dependency that makes the modules one unit), except those
  under ``if TYPE_CHECKING:`` (annotations only: a module that needs its caller's type
  imports it there).
- No module writes another object's private attributes (``x._name = ...`` or
  ``x._name += ...`` where ``x`` is not ``self`` or ``cls``): a class owns its state. The
  few exceptions are listed in ``FRIENDS``, each with its reason.

The cycle check covers the whole package; the write check ``_core`` only for now
(:func:`private_writes` takes any part of the package: ``ack`` has a few left).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import aiodiskqueue

PKG = Path(aiodiskqueue.__file__).resolve().parent

#: Cycles still there, each with why: the check fails on any other, and on these once
#: they are gone from this list.
KNOWN_CYCLES = [
    # SegmentStore.open runs Recovery (a function-level import); Recovery builds the
    # OpenState that store.py defines. Goes with OpenState in a leaf module, or with
    # the engine running Recovery itself.
    ["_core.recovery", "_core.store"],
]

#: (module, attribute) pairs allowed to write another object's private attribute.
FRIENDS = {
    # DiskQueue.put reads Engine._direct_left on every put, so the count lives on the
    # engine rather than one attribute further; InlineWrites, which runs those puts,
    # sets it.
    ("_core.inline", "_direct_left"),
}


def _name(path: Path) -> str:
    """``_core/engine.py`` -> ``_core.engine``; a package's ``__init__`` -> the package."""
    parts = list(path.relative_to(PKG).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_module(name: str) -> bool:
    base = PKG.joinpath(*name.split(".")) if name else PKG
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def _type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _import_nodes(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement, skipping the bodies of ``if TYPE_CHECKING:``."""
    todo: list[ast.AST] = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If) and _type_checking(node):
            todo.extend(node.orelse)
        else:
            todo.extend(ast.iter_child_nodes(node))


def imports(path: Path) -> set[str]:
    """The package's modules that ``path`` imports at run time (relative imports
    resolved; ``from .x import y`` counts ``x.y`` if ``y`` is a module, else ``x``)."""
    me = _name(path)
    pkg = me.split(".") if path.name == "__init__.py" else me.split(".")[:-1]
    if me == "":
        pkg = []
    out: set[str] = set()
    for node in _import_nodes(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("aiodiskqueue."):
                    out.add(a.name.removeprefix("aiodiskqueue."))
            continue
        if node.level:
            base = pkg[: len(pkg) - (node.level - 1)]
            mod = ".".join(base + ([node.module] if node.module else []))
        elif node.module and node.module.startswith("aiodiskqueue."):
            mod = node.module.removeprefix("aiodiskqueue.")
        else:
            continue
        for a in node.names:
            sub = f"{mod}.{a.name}" if mod else a.name
            out.add(sub if _is_module(sub) else mod)
    out.discard(me)
    return {m for m in out if _is_module(m)}


def graph(part: str) -> dict[str, set[str]]:
    """The run-time import graph of the modules under ``part`` (edges inside it only)."""
    paths = sorted((PKG / part).rglob("*.py") if part else PKG.rglob("*.py"))
    names = {_name(p) for p in paths}
    return {_name(p): imports(p) & names for p in paths}


def cycles(part: str) -> list[list[str]]:
    """The import cycles under ``part``."""
    return groups(graph(part))


def groups(g: dict[str, set[str]]) -> list[list[str]]:
    """Each strongly connected group of two or more nodes of ``g`` (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(g[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return found


def private_writes(part: str, friends: set[tuple[str, str]] = FRIENDS
                   ) -> list[tuple[str, int, str]]:
    """``(module, line, attribute)`` for each write of another object's private attribute
    under ``part``, but for ``friends``."""
    out = []
    for path in sorted((PKG / part).rglob("*.py")):
        me = _name(path)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Assign):
                targets = list(node.targets)
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                targets = [node.target]
            else:
                continue
            while targets:
                t = targets.pop()
                if isinstance(t, (ast.Tuple, ast.List)):
                    targets.extend(t.elts)
                elif (isinstance(t, ast.Attribute) and t.attr.startswith("_")
                      and not t.attr.startswith("__")
                      and not (isinstance(t.value, ast.Name) and t.value.id in ("self", "cls"))
                      and (me, t.attr) not in friends):
                    out.append((me, t.lineno, t.attr))
    return out


def test_no_module_imports_itself_back() -> None:
    assert cycles("") == KNOWN_CYCLES


def test_the_engine_writes_no_other_objects_private_state() -> None:
    assert private_writes("_core") == []


def test_the_checks_see_a_cycle_and_a_foreign_write() -> None:
    """The checks themselves: a cycle in a made-up graph, the engine's real edges (one
    under TYPE_CHECKING left out), and the one friend write once it is not pardoned."""
    assert groups({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    g = graph("_core")
    assert "_core.schedule" in g["_core.engine"]
    assert "_core.engine" not in g["_core.schedule"]  # imported under TYPE_CHECKING only
    found = {(m, a) for m, _, a in private_writes("_core", friends=set())}
    assert found == FRIENDS
