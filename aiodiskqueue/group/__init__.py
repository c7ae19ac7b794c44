"""Queue groups: many producer processes into one logical queue, consumers that divide
its shards (:class:`QueueGroup`, :class:`AckQueueGroup`). On-disk names: :mod:`.layout`."""

from .queue import AckQueueGroup, QueueGroup

__all__ = ["AckQueueGroup", "QueueGroup"]
