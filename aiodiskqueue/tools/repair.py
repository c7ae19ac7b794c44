"""The repair planner and executor: turn an :func:`~.inspect.analyze` report into
a list of actions, and carry them out.

:func:`execute` is the only function of the tools that changes files, and only
while it holds the queue's lock. Damaged bytes are never deleted: they are saved
as ``.bad`` files first.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from dataclasses import dataclass, field
from typing import Any

from .._format.access import open_file, read_fd
from .._format.layout import FILE_MODE, Layout, free_bad_name, fsync_dir
from .._format.lock import QueueLock
from .._format.meta import Meta, store_meta
from .._format.scan import TORN, ZEROS
from ..errors import QueueNotFound
from .holders import queue_exists
from .inspect import Progress, QueueReport, analyze

# ---------------------------------------------------------------------- repair


@dataclass(frozen=True, slots=True)
class Action:
    """One step of a repair."""

    kind: str  # "truncate", "quarantine", "placeholder", "move meta", "write meta"
    file: str
    offset: int
    detail: str

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {"kind": self.kind, "file": self.file, "offset": self.offset,
                "detail": self.detail}

    def __str__(self) -> str:
        return f"{self.kind:11} {self.file} @ {self.offset}: {self.detail}"


@dataclass(frozen=True, slots=True)
class Plan:
    """The actions that make a queue consistent, and the meta it ends with."""

    actions: tuple[Action, ...]
    meta: Meta
    report: QueueReport = field(repr=False)

    @property
    def needed(self) -> bool:
        """Whether anything has to change on disk."""
        return bool(self.actions)


def plan_repair(report: QueueReport) -> Plan:
    """Work out the repair of ``report``'s queue; touches nothing.

    Torn tails of the last segment are truncated (the bytes are not a record).
    A segment damaged anywhere else is quarantined: copied whole to ``.bad``,
    then cut after its last whole record, so every readable record stays in the
    queue. A missing segment between the read and write positions is replaced
    by an empty one so the numbering stays contiguous. Finally the meta file is
    rewritten with the recounted depth and the real end of the data, which
    indexes records written after the last meta sync.
    """
    lay = Layout(report.directory, report.name)
    actions: list[Action] = []
    live = [s for s in report.segments if s.role != "consumed"]
    last = live[-1].num if live else None
    if report.meta_state == "unreadable":
        actions.append(Action("move meta", os.path.basename(lay.meta_path), 0,
                              "move the unparsable meta file aside as .bad"))
    for s in live:
        if s.problem is None or s.problem_offset is None:
            continue
        if s.problem in (TORN, ZEROS) and s.num == last:
            what = "torn tail" if s.problem == TORN else "zero-filled tail"
            actions.append(Action("truncate", s.file, s.end,
                                  f"cut {s.size - s.end} byte(s) of {what}"))
        else:
            actions.append(Action("quarantine", s.file, s.end,
                                  f"copy to .bad, then keep the {s.consumed + s.unread} whole "
                                  f"record(s) before offset {s.end}"))
    rf = report.read[0]
    for n in report.missing:
        if n > rf and (last is not None and n < last):
            actions.append(Action("placeholder", os.path.basename(lay.segment_path(n)), 0,
                                  "create an empty segment in place of the missing one"))
    meta = Meta(report.depth, *report.read, *report.write)
    if report.meta is None or meta != report.meta:
        old = "none" if report.meta is None else _meta_text(report.meta)
        actions.append(Action("write meta", os.path.basename(lay.meta_path), 0,
                              f"{old} -> {_meta_text(meta)}"))
    return Plan(tuple(actions), meta, report)


def _meta_text(m: Meta) -> str:
    return (f"depth {m.depth}, read {m.read_file_num},{m.read_pos}, "
            f"write {m.write_file_num},{m.write_pos}")


def _fsync_path(path: str) -> None:
    fd = read_fd(path)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _copy(src: str, dst: str) -> None:
    """Copy ``src`` to the new file ``dst``, which gets ``src``'s mode exactly."""
    with open(read_fd(src), "rb") as fin:
        mode = os.fstat(fin.fileno()).st_mode & 0o777
        with open(open_file(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode), "wb") as out:
            shutil.copyfileobj(fin, out, 1 << 20)


def execute(plan: Plan, file_mode: int = FILE_MODE) -> list[str]:
    """Carry out ``plan`` (the caller holds the queue's lock); return what was done.

    A quarantined copy gets the mode of the segment it copies (whoever could read
    the segment can read its copy, nobody else); a placeholder segment, and a meta
    file where there was none, get ``file_mode``.
    Each quarantined copy is complete and fsynced before its segment is cut.
    The meta file is stored last, atomically, so a crash part-way leaves a
    queue that the next repair or open still recovers.
    Raises OSError if a step fails; the steps before it stay done.
    """
    lay = Layout(plan.report.directory, plan.report.name)
    done: list[str] = []
    for a in plan.actions:
        path = os.path.join(lay.directory, a.file)
        if a.kind == "move meta":
            dst = free_bad_name(path)
            os.rename(path, dst)
            done.append(f"moved {a.file} to {os.path.basename(dst)}")
        elif a.kind == "truncate":
            os.truncate(path, a.offset)
            _fsync_path(path)
            done.append(f"truncated {a.file} at {a.offset}")
        elif a.kind == "quarantine":
            dst = free_bad_name(path)
            tmp = dst + ".tmp"
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)  # left by a repair that was cut short
            _copy(path, tmp)
            _fsync_path(tmp)
            os.rename(tmp, dst)
            fsync_dir(lay.directory)
            os.truncate(path, a.offset)
            _fsync_path(path)
            done.append(f"quarantined {a.file} as {os.path.basename(dst)}, kept bytes "
                        f"0..{a.offset}")
        elif a.kind == "placeholder":
            fd = open_file(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, file_mode)
            os.close(fd)
            done.append(f"created empty {a.file}")
        elif a.kind == "write meta":
            continue
        else:  # pragma: no cover - plan_repair makes only the kinds above
            raise ValueError(f"unknown repair action {a.kind!r}")
    fsync_dir(lay.directory)
    if any(a.kind == "write meta" for a in plan.actions):
        store_meta(lay.meta_path, plan.meta, mode=file_mode)
        done.append(f"wrote {os.path.basename(lay.meta_path)}: {_meta_text(plan.meta)}")
    return done


def repair(layout: Layout, min_size: int = 0, max_size: int = 1 << 20,
           progress: Progress | None = None) -> tuple[Plan, list[str]]:
    """Lock the queue, analyze it again under the lock, and repair it.

    Files it creates get ``layout.file_mode`` (see :func:`execute`).

    Raises QueueLocked if another process has the queue open, QueueNotFound
    if it does not exist, OSError if a step fails.
    """
    if not queue_exists(layout):
        raise QueueNotFound(layout.directory, layout.name)
    lock = QueueLock(layout.lock_path, layout.file_mode)
    lock.acquire()
    try:
        plan = plan_repair(analyze(layout, min_size, max_size, progress))
        done = execute(plan, layout.file_mode) if plan.needed else []
    finally:
        lock.release()
    return plan, done
