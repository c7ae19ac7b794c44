"""``export-for-nsqd``: hand a stopped broker's data directory back to nsqd.

Every topic and channel queue is an AckQueue in nsqd's message format; what
was in flight, requeued or deferred when the broker stopped is kept in its
ack log only, which nsqd does not read. This moves all of it into the
queue's disk queue (:func:`aiodiskqueue.ack.export.hand_back`), as nsqd
itself writes its in-flight and deferred messages at shutdown.
"""

from __future__ import annotations

import os

from .._format.layout import ack_queue_names
from ..ack.export import hand_back
from ._options import BrokerOptions


async def export_for_nsqd(data_dir: str | os.PathLike[str],
                          options: BrokerOptions | None = None) -> dict[str, int]:
    """Move every unfinished message of every queue in ``data_dir`` into its disk queue.

    Returns the number moved per queue name (``topic`` or ``topic:channel``).
    ``options`` must match the broker's (message size, file size). The
    broker must be stopped.

    Raises QueueLocked if a queue is open (the broker is running),
    DiskQueueError on I/O errors.
    """
    opts = options or BrokerOptions()
    d = os.fspath(data_dir)
    moved: dict[str, int] = {}
    for name in ack_queue_names(d):
        moved[name] = await hand_back(d, name, **opts.queue_options(dead_letters=False))
    return moved


__all__ = ["export_for_nsqd"]
