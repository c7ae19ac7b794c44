"""Errors of the Spark source and sink that name a path, a queue or lost records."""

from __future__ import annotations

import logging

from .._format.layout import Layout
from ..errors import CorruptionError, DiskQueueError

log = logging.getLogger(__name__)

REPAIR_ADVICE = "python -m aiodiskqueue repair {directory} {name}"


def repair_advice(directory: str, name: str) -> str:
    """The command that repairs queue ``name`` in ``directory``."""
    return REPAIR_ADVICE.format(directory=directory, name=name)


class PathNotFound(DiskQueueError, FileNotFoundError):
    """``path`` does not exist, is not a directory, or holds no queue matching ``name``.

    The message starts with ``[PATH_NOT_FOUND]``, as Spark's own file sources say it.
    """

    def __init__(self, path: str, name: str, problem: str) -> None:
        DiskQueueError.__init__(
            self, f"[PATH_NOT_FOUND] diskqueue: path {path!r} {problem} (option name={name!r})")
        self.path = path
        self.name = name

    def __str__(self) -> str:
        return str(self.args[0])


class DataLoss(DiskQueueError):
    """Records a read needs are gone (a missing segment, or records consumed elsewhere).

    Raised only with ``failOnDataLoss=true`` (the default); with ``false`` the
    gone records are logged and skipped.
    """

    def __init__(self, queue: str, what: str, advice: str) -> None:
        super().__init__(f"diskqueue: data loss in queue {queue!r}: {what}. {advice}")
        self.queue = queue


class SchemaMismatch(DiskQueueError, ValueError):
    """A user-given schema asks for a column the source does not have."""


def corrupt_length(layout: Layout, path: str, offset: int, length: int | None,
                   min_size: int, max_size: int) -> CorruptionError:
    """The error for a length field outside ``[min_size, max_size]``, with advice that works."""
    return CorruptionError(
        path, offset,
        f"record length {length} is outside [{min_size}, {max_size}]"
        " (options minMsgSize, maxMsgSize): if the queue's messages may be "
        "that large, set maxMsgSize; otherwise the file is damaged: repair the "
        f"queue with '{repair_advice(layout.directory, layout.name)}' (it "
        "keeps every whole record before the damage)",
    )


def report_torn(layout: Layout, path: str, offset: int, stop: int, have: int,
                fail_on_data_loss: bool) -> None:
    """Bytes ``offset`` to ``stop`` of a completed segment make no whole record: raise
    DataLoss naming the file and the repair, or with ``fail_on_data_loss`` false log it.

    Only a completed segment (one a later segment follows) is read to its end,
    so a torn record here is damage, as ``verify`` and DiskQueue see it (DiskQueue
    saves such bytes to a ``.bad`` file); the torn tail a crash leaves at the end
    of the last segment is never planned for reading. ``have`` is where the file
    ended when read: below ``stop``, it was cut short while the job ran.

    Raises DataLoss if ``fail_on_data_loss``.
    """
    if have < stop:
        what = (f"{path} ends at byte {have}, short of byte {stop} where the records "
                f"planned for this read end: the file was cut short while the job ran "
                f"(a repair, or another process)")
    else:
        what = (f"{path} is a completed segment (a later one follows) but its last "
                f"{stop - offset} byte(s), from byte {offset}, are not a whole record: "
                f"a torn record, the file is damaged")
    if fail_on_data_loss:
        raise DataLoss(
            layout.name, what,
            "To go on without them, set the option failOnDataLoss=false (they are logged "
            f"and skipped); '{repair_advice(layout.directory, layout.name)}' saves them to a "
            ".bad file and keeps every whole record, as DiskQueue does when it reaches them")
    log.warning("diskqueue: queue %r: %s; skipping the rest of this file "
                "(failOnDataLoss=false)", layout.name, what)
