"""aiodiskqueue: an asyncio-native persistent FIFO queue, byte-compatible with go-diskqueue."""

from ._options import Statistics
from .errors import (
    CorruptionError,
    DiskQueueError,
    MessageSizeError,
    QueueClosed,
    QueueEmpty,
    QueueFull,
    QueueLocked,
)
from .queue import DiskQueue

__all__ = [
    "CorruptionError",
    "DiskQueue",
    "DiskQueueError",
    "MessageSizeError",
    "QueueClosed",
    "QueueEmpty",
    "QueueFull",
    "QueueLocked",
    "Statistics",
]

__version__ = "0.1.0"
