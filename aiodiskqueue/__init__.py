"""aiodiskqueue: an asyncio-native persistent FIFO queue, byte-compatible with go-diskqueue."""

from ._core.options import Statistics
from .ack import AckQueue, AckStatistics, Message
from .errors import (
    CorruptionError,
    DiskQueueError,
    MessageNotInFlight,
    MessageSizeError,
    QueueClosed,
    QueueEmpty,
    QueueFull,
    QueueLocked,
    QueueNotFound,
)
from .queue import DiskQueue

__all__ = [
    "AckQueue",
    "AckStatistics",
    "CorruptionError",
    "DiskQueue",
    "DiskQueueError",
    "Message",
    "MessageNotInFlight",
    "MessageSizeError",
    "QueueClosed",
    "QueueEmpty",
    "QueueFull",
    "QueueLocked",
    "QueueNotFound",
    "Statistics",
]

__version__ = "0.1.0"
