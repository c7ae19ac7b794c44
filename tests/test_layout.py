"""The package's structure, checked from each module's syntax tree.

- Import floors: _format -> _core -> queue/ack -> group/sync/spark/broker/tools. A module may import
  from its own floor or a lower one, never upward; Spark and the tools read files through
  ``_format`` (plus ``errors`` and the option defaults), never through the engine.
- No import cycle: every ``import`` counts, at the top of a module or inside a function,
  except those under ``if TYPE_CHECKING:`` (annotations only: a module that needs its
  caller's type imports it there).
- A class owns its state: no module writes another object's private attributes
  (``x._name = ...``, ``x._name += ...``, ``x._name[k] = ...``, ``del x._name`` where ``x``
  is not ``self`` or ``cls``); the few exceptions are listed in ``FRIENDS`` with their reason.
- One class per name; modules and classes stay small.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

import aiodiskqueue

# The package as imported: the source tree, or site-packages when the suite runs
# against an installed wheel.
PKG = Path(aiodiskqueue.__file__).resolve().parent

# floor of each top-level part of the package (lower imports from higher never)
FLOORS = {
    "errors": 0, "_format": 0, "serializers": 0,
    "_core": 1,
    "queue": 2, "ack": 2, "metrics": 3, "sync": 3, "typed": 3,
    "group": 3, "spark": 3, "broker": 3, "tools": 3, "__main__": 4, "__init__": 4,
}
# parts that must not reach the engine even though their floor would allow it
ENGINE_FREE = {"spark", "tools", "_format"}
ENGINE = {"_core.engine", "_core.buffers", "_core.store", "_core.lane", "_core.iothread",
          "_core.recovery",
          "queue"}


def _part(module: str) -> str:
    return module.split(".")[0]


def _imports(path: Path) -> list[str]:
    """Modules of the package that ``path`` imports (relative imports resolved)."""
    rel = path.relative_to(PKG).with_suffix("")
    parts = list(rel.parts)
    pkg = parts[:-1]  # a module's package; for __init__, the package itself
    out: list[str] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg[: len(pkg) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            elif node.module and node.module.startswith("aiodiskqueue."):
                mod = node.module.removeprefix("aiodiskqueue.")
            else:
                continue
            if not mod:  # "from . import x" at the top: x is a module of the package
                out.extend(a.name for a in node.names)
            else:
                out.append(mod)
    return out


MODULES = sorted(p for p in PKG.rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=[str(p.relative_to(PKG)) for p in MODULES])
def test_no_import_runs_upward(path: Path) -> None:
    me = _part(str(path.relative_to(PKG).with_suffix("")).replace("/", "."))
    for mod in _imports(path):
        other = _part(mod)
        if other == me or other not in FLOORS:
            continue
        assert FLOORS[other] <= FLOORS[me], f"{path.relative_to(PKG)} imports {mod} (upward)"
        if me in ENGINE_FREE:
            assert not any(mod == e or mod.startswith(e + ".") for e in ENGINE), \
                f"{path.relative_to(PKG)} imports the engine ({mod})"


def test_floors_cover_every_part() -> None:
    parts = {_part(str(p.relative_to(PKG).with_suffix("")).replace("/", ".")) for p in MODULES}
    assert parts <= set(FLOORS), parts - set(FLOORS)


def test_one_class_per_name() -> None:
    """A class name means one thing across the package (no two ``Message`` or ``State``)."""
    seen: dict[str, str] = {}
    for path in MODULES:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                where = str(path.relative_to(PKG))
                assert node.name not in seen, f"class {node.name} in {where} and {seen[node.name]}"
                seen[node.name] = where


# A module or class past these sizes is a concept that wants its own home.
MAX_MODULE_LINES = 650
MAX_CLASS_LINES = 520


@pytest.mark.parametrize("path", MODULES, ids=[str(p.relative_to(PKG)) for p in MODULES])
def test_modules_and_classes_stay_small(path: Path) -> None:
    text = path.read_text()
    assert text.count("\n") <= MAX_MODULE_LINES, f"{path.relative_to(PKG)} is too long"
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ClassDef):
            size = (node.end_lineno or node.lineno) - node.lineno + 1
            assert size <= MAX_CLASS_LINES, f"class {node.name} has {size} lines"


#: Cycles still there, each with why: the check fails on any other, and on these once
#: they are gone from this list.
KNOWN_CYCLES: list[list[str]] = []

#: (module, attribute) pairs allowed to write another object's private attribute.
FRIENDS = {
    # DiskQueue.put reads Engine._direct_left on every put, so the count lives on the
    # engine rather than one attribute further; InlineWrites, which runs those puts,
    # sets it, and PublishedWrites does the same for a producer role's engine.
    ("_core.inline", "_direct_left"),
    ("_core.published", "_direct_left"),
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


def _written(target: ast.expr) -> list[ast.Attribute]:
    """The attributes an assignment target writes: ``x.a = ``, ``x.a[k] = ``, tuples."""
    if isinstance(target, (ast.Tuple, ast.List)):
        return [a for t in target.elts for a in _written(t)]
    if isinstance(target, ast.Starred):
        return _written(target.value)
    if isinstance(target, ast.Subscript):
        return _written(target.value)  # an item of x.a is x.a changed
    return [target] if isinstance(target, ast.Attribute) else []


def private_writes(part: str, friends: set[tuple[str, str]] = FRIENDS
                   ) -> list[tuple[str, int, str]]:
    """``(module, line, attribute)`` for each write (assignment, augmented assignment,
    item assignment, ``del``) of another object's private attribute under ``part``,
    but for ``friends``."""
    out = []
    paths = sorted((PKG / part).rglob("*.py") if part else PKG.rglob("*.py"))
    for path in paths:
        me = _name(path)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Assign, ast.Delete)):
                targets = list(node.targets)
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                targets = [node.target]
            else:
                continue
            for t in targets:
                for a in _written(t):
                    if (a.attr.startswith("_") and not a.attr.startswith("__")
                            and not (isinstance(a.value, ast.Name)
                                     and a.value.id in ("self", "cls"))
                            and (me, a.attr) not in friends):
                        out.append((me, a.lineno, a.attr))
    return out


def test_no_import_cycle() -> None:
    """Run-time imports, at the top of a module or inside a function: a lazy import is
    still a dependency that makes the modules one unit."""
    assert cycles("") == KNOWN_CYCLES


def test_no_module_writes_another_objects_private_state() -> None:
    assert private_writes("") == []


def test_the_checks_see_a_cycle_and_a_foreign_write() -> None:
    """The checks themselves: a cycle in a made-up graph, the engine's real edges (one
    under TYPE_CHECKING left out), and the one friend write once it is not pardoned."""
    assert groups({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    g = graph("_core")
    assert "_core.schedule" in g["_core.engine"]
    assert "_core.engine" not in g["_core.schedule"]  # imported under TYPE_CHECKING only
    found = {(m, a) for m, _, a in private_writes("", friends=set())}
    assert found == FRIENDS
