"""Queue groups: many producer processes into one logical queue, consumers that divide
its shards (:class:`QueueGroup`, :class:`AckQueueGroup`). On-disk names:
:mod:`aiodiskqueue._format.group`."""

from .ack import AckQueueGroup
from .queue import QueueGroup

__all__ = ["AckQueueGroup", "QueueGroup"]
