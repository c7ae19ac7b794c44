"""An NSQ-protocol broker built on aiodiskqueue, for real NSQ clients.

Run it with ``python -m aiodiskqueue.broker --data-dir D --tcp-port 4150
--http-port 4151``, or embed it::

    async with BrokerServer("data", tcp_port=0, http_port=0) as server:
        ...  # server.tcp_port, server.http_port

It speaks NSQ's TCP protocol V2 (``IDENTIFY`` with feature negotiation,
``SUB``, ``PUB``, ``MPUB``, ``DPUB``, ``RDY``, ``FIN``, ``REQ``, ``TOUCH``,
``NOP``, ``CLS``, heartbeats and the idle deadline, ``sample_rate``, nsqd's
error codes, fatal or not as in nsqd) and the HTTP API clients and tools use
(``/ping``, ``/info``, ``/pub``, ``/mpub`` in text and binary mode,
``/stats?format=json``, ``/topic/{create,delete,empty,pause,unpause}``,
``/channel/{create,delete,empty,pause,unpause}``). ``#ephemeral`` topics and
channels are left out of the metadata and deleted with their last client.

Not offered: TLS, snappy, deflate (IDENTIFY answers ``false``, clients stay
on the plain stream), AUTH (``E_AUTH_DISABLED``). With
``--lookupd-tcp-address`` the broker registers its topics and channels with
nsqlookupd as nsqd does (:mod:`._lookupd`), under ``--broadcast-address``.
A client's IDENTIFY ``msg_timeout`` (1 s up to the broker's ``max_msg_timeout``,
nsqd's 15 min by default) applies to the messages delivered to it and to
their touches.
Emptying a channel drops its in-flight, ready and deferred messages, as nsqd
does. A message requeued with ``REQ id 0``, or timed out, goes behind what
the channel holds, as in nsqd. Known difference from nsqd: an ephemeral
channel's messages are on disk while it exists.

Storage and durability
----------------------
Every channel is an :class:`aiodiskqueue.AckQueue` named ``topic:channel``
(nsqd's name for a channel's disk queue), so in-flight and deferred messages
survive a SIGKILL of the broker: after a restart, a message that was
published (``OK`` received) and not finished is delivered again. nsqd loses
in-flight and deferred messages on a crash. A client that disconnects gets
its in-flight messages requeued at once, rather than after the message
timeout as in nsqd. ``python -m aiodiskqueue.broker export-for-nsqd DIR``
hands a stopped broker's directory to nsqd (:mod:`._export`).

Where each message is stored: a topic with one channel (the common case)
writes each message once, straight into that channel's queue. A topic with
no channel (or a paused one) keeps messages in its own queue, named like the
topic, until a channel appears; then they are moved, each finished in the
topic's queue only after every channel accepted it. A topic with N channels
stores a message N times, once per channel, as nsqd does when its channels
spill to disk. Sharing one copy per topic between channels would need
channels that track read positions into a shared log and a reference-counted
cleanup of its segments; the library's ``AckQueue`` owns one log per queue,
and per-channel copies keep each channel independent (its own depth, its own
files to delete when it is emptied), so that is what this broker ships.
"""

from ._app import BrokerServer
from ._broker import Broker
from ._options import BrokerOptions

__all__ = ["Broker", "BrokerOptions", "BrokerServer"]
