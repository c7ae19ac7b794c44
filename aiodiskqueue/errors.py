"""Exceptions raised by aiodiskqueue: one base class, one subclass per situation."""

from __future__ import annotations

import asyncio
import errno

__all__ = [
    "CorruptionError",
    "DeserializationError",
    "DiskQueueError",
    "GroupFormatError",
    "GroupNameConflict",
    "GroupOptionConflict",
    "LoopThreadError",
    "MessageNotInFlight",
    "MessageSizeError",
    "MissingExtra",
    "OptionConflict",
    "QueueClosed",
    "QueueEmpty",
    "QueueFull",
    "QueueLocked",
    "QueueNotFound",
    "QueuePermissionError",
    "RoleError",
    "SerializationError",
    "ShardDamaged",
]

# asyncio.QueueShutDown exists from Python 3.13: QueueClosed is one there too, so code
# written for asyncio.Queue.shutdown() catches ours.
_SHUTDOWN_BASES: tuple[type[Exception], ...] = (
    (asyncio.QueueShutDown,) if hasattr(asyncio, "QueueShutDown") else ()
)


class DiskQueueError(Exception):
    """Base class of every error raised by aiodiskqueue."""


class MessageSizeError(DiskQueueError, ValueError):
    """A message is shorter than ``min_msg_size`` or longer than ``max_msg_size``."""

    def __init__(self, size: int, min_size: int, max_size: int) -> None:
        super().__init__(
            f"message of {size} bytes is outside [{min_size}, {max_size}] "
            "(min_msg_size, max_msg_size)"
        )
        self.size = size
        self.min_size = min_size
        self.max_size = max_size


class QueueFull(DiskQueueError, asyncio.QueueFull):
    """``put_nowait()`` would have to wait: the queue is at ``maxsize`` or its write
    buffer is full."""


class QueueEmpty(DiskQueueError, asyncio.QueueEmpty):
    """``get_nowait()`` found no message ready to hand out."""


class QueueClosed(DiskQueueError, *_SHUTDOWN_BASES):  # type: ignore[misc]
    """The queue was closed (``aclose()``) or shut down (``shutdown()``).

    On Python 3.13 and later it is also an :class:`asyncio.QueueShutDown`.
    """


class QueueLocked(DiskQueueError):
    """The queue is already open in another process or another queue object."""

    def __init__(self, path: str, pid: int | None) -> None:
        holder = f"process {pid}" if pid else "another process or queue object"
        super().__init__(f"queue is locked by {holder}: {path}")
        self.path = path
        self.pid = pid


class RoleError(DiskQueueError):
    """A call this queue object's role does not have: ``get()`` on a producer, ``put()``
    on a consumer, or ``purge()`` while another process holds the other role."""

    def __init__(self, role: str, what: str) -> None:
        super().__init__(f"{what} is not available to a queue opened with role={role!r}")
        self.role = role


class OptionConflict(DiskQueueError, ValueError):
    """An option that a producer and a consumer of one queue must agree on differs from
    the value of the live holder of the other role. Nothing was changed."""

    def __init__(self, option: str, mine: object, theirs: object, role: str,
                 pid: int) -> None:
        super().__init__(f"{option}={mine!r} contradicts {option}={theirs!r} of the {role} "
                         f"(process {pid}) holding the queue")
        self.option = option
        self.mine = mine
        self.theirs = theirs


class QueueNotFound(DiskQueueError, LookupError):
    """Neither a meta file nor any segment of the queue exists in the directory."""

    def __init__(self, directory: str, name: str) -> None:
        super().__init__(f"no queue named {name!r} in {directory}")
        self.directory = directory
        self.name = name


class GroupNameConflict(DiskQueueError, ValueError):
    """A queue group and a plain queue of the same name in one directory: opening a group
    where the queue ``NAME`` has files, or a plain queue ``NAME`` where the group
    directory ``NAME.group`` exists. Nothing was changed."""

    def __init__(self, directory: str, name: str, opening: str) -> None:
        other = "a plain queue" if opening == "group" else "a queue group"
        super().__init__(f"cannot open {name!r} in {directory} as a {opening}: {other} "
                         f"of that name exists there")
        self.directory = directory
        self.name = name


class GroupFormatError(DiskQueueError):
    """A group's meta file (``NAME.group/group.meta``) is damaged or of a format version
    this release does not read. Nothing was changed."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


class GroupOptionConflict(OptionConflict):
    """An option that every shard of a group must share differs from the value stored in
    the group's meta file. Nothing was changed."""

    def __init__(self, option: str, mine: object, theirs: object, path: str) -> None:
        DiskQueueError.__init__(self, f"{option}={mine!r} contradicts {option}={theirs!r} "
                                      f"stored for the group in {path}")
        self.option = option
        self.mine = mine
        self.theirs = theirs
        self.path = path


class ShardDamaged(DiskQueueError):
    """A shard of a queue group is not what the group made: a file where its directory
    belongs, a directory that is not readable, a shard removed by hand while open.
    Nothing was changed."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"shard {path}: {reason}")
        self.path = path
        self.reason = reason


class QueuePermissionError(DiskQueueError, PermissionError):
    """This process may not open a file or directory of the queue: the file's mode and
    owner (or, where it could not be seen, its directory's) do not let this user in.

    A :class:`PermissionError` too (``errno`` is ``EACCES``). Attributes: ``path``,
    ``mode`` (its permission bits, or those of the directory that keeps it from being
    seen; None if neither could be), ``uid`` and ``gid`` (the same one's owner and
    group). Nothing was changed.
    """

    def __init__(self, path: str, mode: int | None, uid: int | None, gid: int | None,
                 detail: str) -> None:
        super().__init__(detail)
        self.errno = errno.EACCES
        self.path = path
        self.mode = mode
        self.uid = uid
        self.gid = gid


class CorruptionError(DiskQueueError):
    """A segment or meta file does not hold what the format allows.

    Raised only where the caller asked for strict handling; by default a corrupt
    segment is quarantined as ``.bad`` and reading goes on with the next one.
    """

    def __init__(self, path: str, offset: int, reason: str) -> None:
        super().__init__(f"{path} at byte {offset}: {reason}")
        self.path = path
        self.offset = offset
        self.reason = reason


class MessageNotInFlight(DiskQueueError):
    """``finish()``, ``requeue()`` or ``touch()`` on a message that is no longer in flight.

    It was already finished or requeued, or it timed out (and may have been
    delivered again). Nothing was changed.
    """

    def __init__(self, msg_id: str, state: str) -> None:
        super().__init__(f"message {msg_id} is not in flight: {state}")
        self.msg_id = msg_id
        self.state = state


class MissingExtra(DiskQueueError, ImportError):
    """An optional dependency needed for what was asked is not installed."""


class SerializationError(DiskQueueError, ValueError):
    """A value could not be serialized; nothing was stored.

    ``value`` is the value, ``__cause__`` the serializer's exception.
    """

    def __init__(self, value: object, reason: str) -> None:
        text = repr(value)
        if len(text) > 80:
            text = text[:77] + "..."
        super().__init__(f"cannot serialize {type(value).__name__} {text}: {reason}")
        self.value = value


class DeserializationError(DiskQueueError, ValueError):
    """A stored record could not be deserialized. It was taken out of the queue.

    The messages after it are still in the queue. Attributes: ``queue`` (name),
    ``directory``, ``path`` (segment file), ``offset`` (byte offset of the record,
    its 4-byte length prefix, in that file), ``ordinal`` (1 for the first message
    this queue object handed out since it was opened), ``payload`` (the record's
    bytes, to keep or dead-letter), and ``__cause__`` (the serializer's exception).
    """

    def __init__(self, *, queue: str, directory: str, path: str, offset: int, ordinal: int,
                 payload: bytes, reason: str) -> None:
        super().__init__(f"cannot deserialize message #{ordinal} of queue {queue!r} "
                         f"({len(payload)} bytes): {path} at byte {offset}: {reason}; "
                         "the record was taken out of the queue, the next ones are kept")
        self.queue = queue
        self.directory = directory
        self.path = path
        self.offset = offset
        self.ordinal = ordinal
        self.payload = payload


class LoopThreadError(DiskQueueError, RuntimeError):
    """A blocking call was made from the event loop thread that runs the queue.

    It would wait for the loop it blocks. Use the async queue there.
    """
