"""Reliable delivery on a DiskQueue: :class:`AckQueue`, its :class:`Message` and statistics.

In-flight messages with finish / requeue / touch, per-message deadlines, attempts and a
dead-letter queue, durable across a crash through an append-only ack log.

Modules: :mod:`.queue` (the facade), :mod:`.dispatch` (the delivery state and its
rules), :mod:`.message` (one delivery), :mod:`.pump` (the background task: hops, log
syncs, commits, dead letters), :mod:`.inflight` (deadlines and the timer),
:mod:`.journal` (entries and what the log must hold), :mod:`.log` (the log's files),
:mod:`.codec` (its records), :mod:`.files` (the queue's files on disk), :mod:`.export`
(handing messages back to nsqd), :mod:`.clock`, :mod:`.heap`, :mod:`.options`.

The facade composes one :class:`~.dispatch.Dispatcher` (the only owner of the delivery
state) and one :class:`~.pump.Pump` (the only owner of the files). A message ends its
delivery through :class:`~.message.DeliveryOwner`, the pump calls the delivery state
back through :class:`~.pump.PumpHost`, and the data queue offers the pump and the
delivery state a small internal API (``DiskQueue._take_more`` and its neighbours).

Design
------
Three stores, all under the queue's directory:

* the data queue ``NAME`` (a :class:`~aiodiskqueue.DiskQueue`): messages put
  without a delay, in FIFO order; in ``format="nsq"`` each payload is nsqd's
  message layout, so a channel diskqueue written by nsqd opens as is;
* the ack log ``NAME.ack.%06d.log`` (:mod:`.log`, :mod:`.journal`):
  every message taken out of the data queue or put with a delay, with its due
  time and attempts, and a ``D`` record once it is finished or dead-lettered;
* the dead-letter queue, when ``max_attempts > 0``: the DiskQueue ``NAME`` in the
  subdirectory ``NAME.dead-letters`` (a queue of the earlier layout, ``NAME.dead``
  beside the data queue, is moved there on open: :mod:`.files`).

The crash window that matters is between taking a message out of the data
queue and recording it in the log: the data queue must never store a read
position past a message the log does not know. So the data queue runs with its
own syncing switched off and stores its position only in a *commit*, which
(1) stops taking messages, (2) appends an ``H`` record with the data queue's read
position and the number of messages taken so far (``fetch_seq``), (3) writes and
fsyncs the log, (4) syncs the data queue. Commits follow ``sync_every`` (puts,
takes, finishes and requeues count) and ``sync_interval``, like the core.

Between commits the log runs ahead of the data queue: records are written in
the order of the takes, by a hop once the log's I/O thread is free; records that
nothing waits for linger up to 2 ms for more first (:mod:`.pump`). On open, the
data queue's messages up to the last commit's position, then ``fetch_seq -
commit_seq`` more, are exactly those the log accounts for (alive, or finished);
they are skipped, the rest of the data queue is new. So a SIGKILL loses nothing
whichever of the two stores was written last, and anything the log holds (a
finish, a requeue's due time, a delivery's attempt) survives it even before
the next commit. With ``sync_every=1`` a finish, requeue or deferred put waits
only for the log's fsync; a put of a ready message waits for a commit (the data
queue's fsync).

A message out of attempts is put into the dead-letter queue and that queue synced
before its ``D`` record is appended to the log: any write of the log may make the
record durable (a segment roll fsyncs it), so a power cut never finds the message
logged as done and missing from the dead-letter queue.

A message taken and finished before its ``E`` record was written never has its
body written twice: its ``D`` record carries the ``fetch_seq`` instead. The
log's space is reclaimed by deleting and compacting whole segments (see
:mod:`.journal`). In memory: messages in flight, the deadline heap, and an
index of deferred entries (their bodies stay on disk until due).

Roles: with ``role="consumer"`` the data queue is opened as a DiskQueue consumer and
everything above (the log, commits, deferred entries, dead letters) is the consumer's;
the consumer role's meta stores happen only in commits, as the whole queue's do. With
``role="producer"`` there is no log and no pump: puts of ready messages go to the data
queue opened as a DiskQueue producer, which syncs by ``sync_every`` and
``sync_interval`` itself; a producer's depth counts from the consumer's last commit.

Deadlines: one timer (``Clock.call_at``) armed for the earliest of the in-flight
deadline heap and the deferred heap; items are invalidated lazily and a heap is
rebuilt when more than half of it is stale. ``attempts`` follow nsqd: a record
stores the deliveries so far and a delivery reports one more.
"""

from .options import AckStatistics
from .queue import AckQueue, Message

__all__ = ["AckQueue", "AckStatistics", "Message"]
