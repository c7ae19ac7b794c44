"""aiodiskqueue: an asyncio-native persistent FIFO queue, byte-compatible with go-diskqueue."""

from ._core.options import Statistics
from .ack import AckQueue, AckStatistics, Message
from .errors import (
    CorruptionError,
    DeserializationError,
    DiskQueueError,
    GroupFormatError,
    GroupNameConflict,
    GroupOptionConflict,
    LoopThreadError,
    MessageNotInFlight,
    MessageSizeError,
    MissingExtra,
    OptionConflict,
    QueueClosed,
    QueueEmpty,
    QueueFull,
    QueueLocked,
    QueueNotFound,
    QueuePermissionError,
    RoleError,
    SerializationError,
    ShardDamaged,
)
from .group import AckQueueGroup, QueueGroup
from .queue import DiskQueue

__all__ = [
    "AckQueue",
    "AckQueueGroup",
    "AckStatistics",
    "CorruptionError",
    "DeserializationError",
    "DiskQueue",
    "DiskQueueError",
    "GroupFormatError",
    "GroupNameConflict",
    "GroupOptionConflict",
    "LoopThreadError",
    "Message",
    "MessageNotInFlight",
    "MessageSizeError",
    "MissingExtra",
    "OptionConflict",
    "QueueClosed",
    "QueueEmpty",
    "QueueFull",
    "QueueGroup",
    "QueueLocked",
    "QueueNotFound",
    "QueuePermissionError",
    "RoleError",
    "SerializationError",
    "ShardDamaged",
    "Statistics",
]

__version__ = "0.1.0"
