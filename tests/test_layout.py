"""The package's import floors: _format -> _core -> queue/ack -> spark/broker/tools.

A module may import from its own floor or a lower one, never upward; Spark and the tools
read files through ``_format`` (plus ``errors`` and the option defaults), never through
the engine.
"""

from __future__ import annotations

import ast
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
    "spark": 3, "broker": 3, "tools": 3, "__main__": 4, "__init__": 4,
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
