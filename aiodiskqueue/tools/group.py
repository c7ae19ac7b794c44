"""Queue groups as the command line sees them: read-only, from the files alone.

A group ``NAME`` in ``DIR`` is the directory ``DIR/NAME.group/``; each shard is a
directory in it holding a complete plain queue ``NAME`` (the names are
:mod:`aiodiskqueue._format.group`'s). The tools look at every shard as the plain
queue it is; nothing here takes a lock or writes a file.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from .._format.group import (
    GroupLayout,
    GroupMeta,
    group_layout,
    is_group,
    read_group_meta,
    shard_name,
)
from .._format.layout import Layout
from .._format.probe import held_exclusively
from ..errors import GroupFormatError, GroupNameConflict
from .holders import queue_exists


@dataclass(frozen=True, slots=True)
class GroupFiles:
    """Group ``name`` in ``directory`` as one listing saw it: its directory, its meta
    (None if missing; ``meta_error`` says why if unreadable) and its shards by number."""

    directory: str
    name: str
    path: str
    meta: GroupMeta | None
    meta_error: str | None
    shards: dict[int, Layout]
    damaged: tuple[str, ...]  # shard names that are no directory (made by hand)
    members: tuple[int, ...]  # pids of the group's live consumers (-1: pid unreadable)

    def shard_label(self, num: int) -> str:
        """``NAME/000003``: how the tools name a shard of this group."""
        return f"{self.name}/{shard_name(num)}"


def group_files(directory: str, name: str) -> GroupFiles | None:
    """Group ``name`` in ``directory``, or None if there is none by that name."""
    lay = group_layout(directory, name)
    if not lay.exists():
        return None
    meta, error = None, None
    try:
        meta = read_group_meta(directory, name)
    except GroupFormatError as exc:
        error = exc.reason
    shards, damaged = {}, []
    for num, path in lay.shards().items():
        if os.path.isdir(path):
            shards[num] = lay.shard_layout(num)
        elif os.path.exists(path):
            damaged.append(os.path.basename(path))
    return GroupFiles(directory, name, lay.path, meta, error, shards, tuple(damaged),
                      tuple(sorted(live_members(lay))))


def live_members(lay: GroupLayout) -> list[int]:
    """Pids of the group's live consumers: the member files whose flock is held (a
    shared probe that blocks nobody), each holding its consumer's pid."""
    out = []
    for path in lay.members().values():
        if not held_exclusively(path):
            continue  # its consumer is gone (or the file just went)
        try:
            with open(path, "rb") as f:
                out.append(int(f.read(32).split()[0]))
        except (OSError, ValueError, IndexError):
            out.append(-1)
    return out


def check_one_kind(directory: str, name: str) -> None:
    """Raises GroupNameConflict if ``name`` in ``directory`` is both a plain queue and a
    group."""
    if is_group(directory, name) and queue_exists(Layout(directory, name)):
        raise GroupNameConflict(directory, name, "group")


def conflict_message(directory: str, name: str) -> str:
    """What the tools say about a name that is both a plain queue and a group."""
    return (f"{name!r} in {directory} is both a plain queue ({name}.diskqueue.* files) and "
            f"a queue group ({os.path.join(directory, name)}.group/); move one of them away")
