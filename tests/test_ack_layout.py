"""The ack layer's structure: no import cycle inside ``aiodiskqueue/ack`` (annotation-only
imports included), and no module there writes a private attribute of another object."""

from __future__ import annotations

import ast
from pathlib import Path

import aiodiskqueue.ack

ACK = Path(aiodiskqueue.ack.__file__).parent


def _modules() -> dict[str, ast.Module]:
    return {f.stem: ast.parse(f.read_text(encoding="utf-8")) for f in sorted(ACK.glob("*.py"))}


def _imports(tree: ast.Module) -> set[str]:
    """The sibling modules a module imports, at run time or for annotations."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                out.add(node.module.split(".")[0])
            else:
                out.update(a.name for a in node.names)
    return out


def test_no_import_cycle_inside_ack() -> None:
    graph = {name: _imports(tree) & set(_modules()) for name, tree in _modules().items()}
    graph.pop("__init__")  # the package imports its facade, nothing imports the package
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> None:
        if name in path:
            cycle = [*path[path.index(name):], name]
            raise AssertionError("import cycle: " + " -> ".join(cycle))
        if name in done:
            return
        for dep in sorted(graph.get(name, ())):
            visit(dep, [*path, name])
        done.add(name)

    for name in sorted(graph):
        visit(name, [])


def _written(target: ast.expr) -> list[ast.Attribute]:
    """The attributes an assignment target writes: ``x.a = ``, ``x.a[k] = ``, tuples."""
    if isinstance(target, (ast.Tuple, ast.List)):
        return [a for t in target.elts for a in _written(t)]
    if isinstance(target, ast.Starred):
        return _written(target.value)
    if isinstance(target, ast.Subscript):
        return _written(target.value)  # an item of x.a is x.a changed
    return [target] if isinstance(target, ast.Attribute) else []


def test_no_module_writes_another_objects_private_attributes() -> None:
    writes = []
    for name, tree in _modules().items():
        for node in ast.walk(tree):
            targets: list[ast.expr] = []
            if isinstance(node, (ast.Assign, ast.Delete)):
                targets = list(node.targets)
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                targets = [node.target]
            for t in targets:
                for a in _written(t):
                    if (a.attr.startswith("_") and not a.attr.startswith("__")
                            and not (isinstance(a.value, ast.Name)
                                     and a.value.id in ("self", "cls"))):
                        writes.append(f"{name}.py:{a.lineno}: {ast.unparse(a)}")
    assert writes == []
