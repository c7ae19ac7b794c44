"""A queue group as one source: its shards listed as queues ``NAME/SHARD``.

``name`` names a group when ``path/NAME.group/`` exists (see
:mod:`aiodiskqueue._format.group`); every shard is a plain queue ``NAME`` in a
directory of its own, and the source reads it as it reads any queue, keyed
``NAME/000003`` in the offsets and the ``name`` column. Each listing looks at the
group directory again, so shards created between micro-batches are read from the
next one on.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import replace

from .._format.group import group_layout, is_group, shard_name
from .._format.layout import queue_names
from ..errors import DiskQueueError, QueueLocked, ShardDamaged
from ..tools.group import live_members
from ._listing import Lister, Listing, QueueFiles
from ._options import OptionError, SourceOptions, is_glob

ListFn = Callable[[Mapping[str, QueueFiles] | None], Listing]
"""One listing of the selected queues (``settled``: see :meth:`._listing.Lister.__call__`)."""


def resolve(options: SourceOptions, use: str) -> SourceOptions:
    """``options`` with ``group`` set when ``name`` names a group in ``path``.

    Raises OptionError if ``name`` is both a plain queue and a group, if a group is
    written to (the sink appends to one plain queue), or if ``removeDrainedAfter`` is
    given for a group (the group removes its drained shards itself).
    """
    if is_glob(options.name) or not is_group(options.path, options.name):
        return options
    where = group_layout(options.path, options.name).path
    if options.name in queue_names(options.path):
        raise OptionError("name", f"names both a plain queue ({options.name}.diskqueue.* "
                                  f"files) and a queue group ({where}) in {options.path}; "
                                  "move one of them away")
    if use.endswith("write"):
        raise OptionError("name", f"names the queue group {where}: the sink appends to one "
                                  "plain queue; a group's shards are written by its producers")
    if options.remove_drained_after is not None:
        raise OptionError("removeDrainedAfter", "does not apply to a queue group: the group "
                                                "removes its drained shards itself")
    return replace(options, group=True)


class GroupBusy(QueueLocked):
    """A stream would consume a queue group that group consumers (``QueueGroup`` with
    ``role="consumer"``) read: both would take the same messages."""

    def __init__(self, options: SourceOptions, pids: list[int]) -> None:
        lay = group_layout(options.path, options.name)
        who = ", ".join(str(p) for p in pids)
        DiskQueueError.__init__(
            self, f"cannot consume queue group {options.name!r} in {options.path}: group "
                  f"consumer process(es) {who} read it (member files in {lay.path}); a "
                  "group's messages go to one consumer: stop them, or read without consume")
        self.path = lay.path
        self.pid = pids[0] if pids else None


def check_no_group_consumers(options: SourceOptions) -> None:
    """Consume mode on a group: raises GroupBusy if group consumers are live.

    The group consumers take free shards whenever they look (and every shard of a
    consumer that is gone), between a micro-batch's planning and its commit too: a
    stream beside them would deliver what they deliver.
    """
    if options.consume and options.group:
        pids = live_members(group_layout(options.path, options.name))
        if pids:
            raise GroupBusy(options, sorted(pids))


def shard_key(name: str, num: int) -> str:
    """``NAME/000003``: shard ``num`` of group ``name`` in offsets and rows."""
    return f"{name}/{shard_name(num)}"


class GroupLister:
    """Lists the shards of a group again and again: one ``listdir`` of the group
    directory, then one :class:`~._listing.Lister` per shard directory (which keeps
    what it saw of an unchanged shard)."""

    def __init__(self, options: SourceOptions) -> None:
        self.name = options.name
        self.group = group_layout(options.path, options.name)
        self._listers: dict[int, Lister] = {}

    def __call__(self, settled: Mapping[str, QueueFiles] | None = None) -> Listing:
        """Every shard with files, keyed ``NAME/SHARD``, in shard order.

        Raises ShardDamaged for a shard name that is not a directory.
        """
        settled = settled or {}
        listers: dict[int, Lister] = {}
        out: Listing = {}
        for num, path in self.group.shards().items():
            key = shard_key(self.name, num)
            lister = self._listers.get(num) or Lister(path, self.name.__eq__, self.name)
            listers[num] = lister
            mine = {self.name: settled[key]} if key in settled else None
            try:
                files = lister(mine).get(self.name)
            except (FileNotFoundError, NotADirectoryError) as exc:
                if os.path.isdir(path) or not os.path.lexists(path):
                    continue  # removed (drained) since the group was listed
                raise ShardDamaged(path, "not a directory: a shard is a directory holding "
                                         f"the plain queue {self.name!r}") from exc
            if files is not None:
                out[key] = files
        self._listers = listers
        return out


def lister_for(options: SourceOptions) -> ListFn:
    """What lists the queues ``options`` select: the queues matching ``name`` in
    ``path``, or a group's shards."""
    if options.group:
        return GroupLister(options)
    return Lister(options.path, options.matches, options.name)
