"""Reliable delivery on a DiskQueue: :class:`AckQueue`, its :class:`Message` and statistics.

In-flight messages with finish / requeue / touch, per-message deadlines, attempts and a
dead-letter queue, durable across a crash through an append-only ack log.
"""

from .options import AckStatistics
from .queue import AckQueue, Message

__all__ = ["AckQueue", "AckStatistics", "Message"]
