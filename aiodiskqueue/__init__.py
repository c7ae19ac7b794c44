"""aiodiskqueue: an asyncio-native persistent FIFO queue, byte-compatible with go-diskqueue."""

from ._core.options import Statistics
from .ack import AckQueue, AckStatistics, Message
from .errors import (
    CorruptionError,
    DeserializationError,
    DiskQueueError,
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
)
from .queue import DiskQueue

__all__ = [
    "AckQueue",
    "AckStatistics",
    "CorruptionError",
    "DeserializationError",
    "DiskQueue",
    "DiskQueueError",
    "LoopThreadError",
    "Message",
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
    "Statistics",
]

__version__ = "0.1.0"
