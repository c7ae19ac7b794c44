"""What the commands print: exit codes, the one-line error, text, JSON, tables, progress."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..inspect import Problem

EXIT_OK = 0
EXIT_PROBLEMS = 1
EXIT_ERROR = 2
EXIT_INTERRUPTED = 130


class CliError(Exception):
    """An error reported to the user as one line on stderr, exit code 2."""


def out(text: str = "") -> None:
    """Print a line of text on stdout."""
    sys.stdout.write(text + "\n")


def json_line(obj: Any) -> None:
    """Print ``obj`` as one compact line of JSON (a stream of samples or messages)."""
    sys.stdout.write(json.dumps(obj, separators=(",", ":")) + "\n")


def json_doc(obj: Any) -> None:
    """Print ``obj`` as one indented JSON document."""
    sys.stdout.write(json.dumps(obj, indent=2) + "\n")


def table(rows: list[list[str]], right: frozenset[int] = frozenset()) -> None:
    """Print ``rows`` in aligned columns; the columns in ``right`` are right-aligned."""
    if not rows:
        return
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        cells = [c.rjust(w) if i in right else c.ljust(w)
                 for i, (c, w) in enumerate(zip(r, widths, strict=True))]
        out("  ".join(cells).rstrip())


@contextlib.contextmanager
def progress(total: int, enabled: bool, label: str) -> Iterator[Callable[[int], None] | None]:
    """A byte progress bar on stderr when it is a terminal and tqdm is installed."""
    if not enabled or total <= 0 or not sys.stderr.isatty():
        yield None
        return
    try:
        from tqdm import tqdm  # type: ignore[import-untyped,unused-ignore]
    except ImportError:
        yield None
        return
    bar = tqdm(total=total, desc=label, unit="B", unit_scale=True, unit_divisor=1024,
               file=sys.stderr, leave=False, dynamic_ncols=True)
    try:
        yield bar.update
    finally:
        bar.close()


def print_problems(problems: Sequence[Problem]) -> None:
    """Print each problem on its own indented line."""
    for p in problems:
        out(f"  {p}")


def pos(p: tuple[int, int]) -> str:
    """A queue position ``(file number, offset)`` as ``FILE,OFFSET``."""
    return f"{p[0]},{p[1]}"


def pids(numbers: list[int]) -> str:
    """Process ids joined by commas, or ``-`` for none."""
    return ",".join(map(str, numbers)) or "-"


def rate(r: float | None) -> str:
    """A rate per second with one decimal, or ``-`` when not known yet."""
    return "-" if r is None else f"{r:,.1f}"
