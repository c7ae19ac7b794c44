"""Export :meth:`DiskQueue.statistics` and :meth:`AckQueue.statistics` to Prometheus.

An optional extra (``metrics``).

Needs ``prometheus-client`` (``pip install "asyncio-diskqueue[metrics]"``)::

    from aiodiskqueue.metrics import instrument

    async with DiskQueue(path, "events") as q:
        instrument(q)                  # into prometheus_client's default REGISTRY
        ...

Each scrape reads ``statistics()`` of every instrumented queue; nothing is
sampled in between, so the figures are never stale and cost nothing between
scrapes. A queue is dropped from the output once it is garbage collected, or
with :meth:`DiskQueueCollector.remove`.

Every metric carries the labels ``queue`` (the queue name) and ``directory``.

======================================  =======  =============================================
metric                                  type     meaning (``Statistics`` field)
======================================  =======  =============================================
``aiodiskqueue_depth``                  gauge    messages put and not yet taken (``depth``)
``aiodiskqueue_bytes_on_disk``          gauge    size of the live segment files
``aiodiskqueue_ready_messages``         gauge    messages read ahead, ready for ``get_nowait``
``aiodiskqueue_pending_writes``         gauge    messages accepted, not yet written to the OS
``aiodiskqueue_read_file_num``          gauge    segment number of the read position
``aiodiskqueue_read_pos``               gauge    byte offset of the read position
``aiodiskqueue_write_file_num``         gauge    segment number of the write position
``aiodiskqueue_write_pos``              gauge    byte offset of the write position
``aiodiskqueue_recovered_messages``     gauge    records found past the meta on open
``aiodiskqueue_puts_total``             counter  messages put since the queue was opened
``aiodiskqueue_gets_total``             counter  messages taken since the queue was opened
``aiodiskqueue_syncs_total``            counter  completed sync rounds (group commits)
``aiodiskqueue_bad_files_total``        counter  segments quarantined as ``.bad`` since open
======================================  =======  =============================================

An :class:`AckQueue` exports its data queue's figures under the names above (its
``gets`` count every message taken out of the data queue, and its read position
moves only at commits), and its delivery figures from ``AckQueue.statistics()``:

==========================================  =======  =============================================
metric                                      type     meaning (``AckStatistics`` field)
==========================================  =======  =============================================
``aiodiskqueue_ack_ready_messages``         gauge    messages ready to deliver (``depth``)
``aiodiskqueue_ack_in_flight``              gauge    delivered, not yet finished or requeued
``aiodiskqueue_ack_deferred``               gauge    waiting for their due time
``aiodiskqueue_ack_log_bytes``              gauge    size of the ack log's segments
``aiodiskqueue_ack_log_segments``           gauge    number of ack log segments
``aiodiskqueue_ack_delivered_total``        counter  deliveries (a redelivery counts again)
``aiodiskqueue_ack_finished_total``         counter  successful ``finish()`` calls
``aiodiskqueue_ack_requeued_total``         counter  explicit ``requeue()`` calls
``aiodiskqueue_ack_timed_out_total``        counter  automatic requeues after a deadline passed
``aiodiskqueue_ack_dead_lettered_total``    counter  messages moved to the dead-letter queue
``aiodiskqueue_ack_commits_total``          counter  commits (log fsynced, data position stored)
``aiodiskqueue_ack_log_syncs_total``        counter  fsyncs of the ack log
==========================================  =======  =============================================

The counters count since the queue object was opened. The dead-letter queue is a
DiskQueue of its own (``q.dead_letters``): instrument it too to see its depth.

The ``aiodiskqueue`` prefix is the ``namespace`` argument.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Iterator, Sequence
from typing import final

try:
    from prometheus_client import REGISTRY, CollectorRegistry
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "aiodiskqueue.metrics needs prometheus-client: "
        'pip install "asyncio-diskqueue[metrics]"'
    ) from exc

from ._core.options import Statistics
from .ack import AckQueue, AckStatistics
from .queue import DiskQueue

__all__ = ["DiskQueueCollector", "instrument"]

_LABELS = ["queue", "directory"]

# (suffix, Statistics field, help)
_GAUGES: tuple[tuple[str, str, str], ...] = (
    ("depth", "depth", "Messages put and not yet taken."),
    ("bytes_on_disk", "bytes_on_disk", "Size of the live segment files in bytes."),
    ("ready_messages", "ready", "Messages read ahead into memory, ready for get_nowait()."),
    ("pending_writes", "pending_writes", "Messages accepted but not yet written to the OS."),
    ("read_file_num", "read_file_num", "Segment number of the read position."),
    ("read_pos", "read_pos", "Byte offset of the read position in its segment."),
    ("write_file_num", "write_file_num", "Segment number of the write position."),
    ("write_pos", "write_pos", "Byte offset of the write position in its segment."),
    ("recovered_messages", "recovered", "Records found past the meta write position on open."),
)
_COUNTERS: tuple[tuple[str, str, str], ...] = (
    ("puts", "puts", "Messages put since the queue was opened."),
    ("gets", "gets", "Messages taken since the queue was opened."),
    ("syncs", "syncs", "Completed sync rounds (one per group commit)."),
    ("bad_files", "bad_files", "Segments quarantined as .bad since the queue was opened."),
)
_ACK_GAUGES: tuple[tuple[str, str, str], ...] = (
    ("ack_ready_messages", "depth", "Messages ready to deliver (not in flight, not deferred)."),
    ("ack_in_flight", "in_flight", "Messages delivered and not yet finished or requeued."),
    ("ack_deferred", "deferred", "Messages waiting for their due time."),
    ("ack_log_bytes", "log_bytes", "Size of the ack log's segments in bytes."),
    ("ack_log_segments", "log_segments", "Number of ack log segments."),
)
_ACK_COUNTERS: tuple[tuple[str, str, str], ...] = (
    ("ack_delivered", "delivered", "Deliveries since the queue was opened."),
    ("ack_finished", "finished", "Successful finish() calls since the queue was opened."),
    ("ack_requeued", "requeued", "Explicit requeue() calls since the queue was opened."),
    ("ack_timed_out", "timed_out", "Automatic requeues of messages whose deadline passed."),
    ("ack_dead_lettered", "dead_lettered", "Messages moved to the dead-letter queue."),
    ("ack_commits", "commits", "Commits: log fsynced, then the data queue's position stored."),
    ("ack_log_syncs", "log_syncs", "fsyncs of the ack log."),
)

Instrumented = DiskQueue | AckQueue
"""What a collector exports: byte queues and acknowledged-delivery queues."""


@final
class DiskQueueCollector:
    """A prometheus_client collector for any number of :class:`DiskQueue` and :class:`AckQueue`.

    Register it once per registry (``registry.register(collector)``) and
    :meth:`add` queues to it; or use :func:`instrument`, which does both.
    Queues are held weakly.
    """

    def __init__(self, queues: Iterable[Instrumented] = (), *,
                 namespace: str = "aiodiskqueue") -> None:
        self.namespace = namespace
        self._queues: list[weakref.ref[Instrumented]] = []
        for q in queues:
            self.add(q)

    def add(self, queue: Instrumented) -> None:
        """Export ``queue``'s statistics from now on (adding it twice has no effect).

        Raises TypeError if ``queue`` is neither a DiskQueue nor an AckQueue.
        """
        if not isinstance(queue, DiskQueue | AckQueue):
            raise TypeError(f"instrument() takes a DiskQueue or an AckQueue, "
                            f"got {type(queue).__name__}")
        if all(r() is not queue for r in self._queues):
            self._queues.append(weakref.ref(queue))

    def remove(self, queue: Instrumented) -> None:
        """Stop exporting ``queue``; no effect if it was not added."""
        self._queues = [r for r in self._queues if r() is not None and r() is not queue]

    def queues(self) -> list[Instrumented]:
        """The queues still alive and exported."""
        alive = [q for q in (r() for r in self._queues) if q is not None]
        if len(alive) != len(self._queues):
            self._queues = [weakref.ref(q) for q in alive]
        return alive

    def _families(self, gauges: tuple[tuple[str, str, str], ...],
                  counters: tuple[tuple[str, str, str], ...],
                  ) -> tuple[list[GaugeMetricFamily], list[CounterMetricFamily]]:
        ns = self.namespace
        return ([GaugeMetricFamily(f"{ns}_{suffix}", doc, labels=_LABELS)
                 for suffix, _, doc in gauges],
                [CounterMetricFamily(f"{ns}_{suffix}", doc, labels=_LABELS)
                 for suffix, _, doc in counters])

    def describe(self) -> Iterator[Metric]:
        """The metric families, without samples (lets a registry check names up front)."""
        for g, c in (self._families(_GAUGES, _COUNTERS),
                     self._families(_ACK_GAUGES, _ACK_COUNTERS)):
            yield from g
            yield from c

    def collect(self) -> Iterator[Metric]:
        """One sample per queue for every metric, read from ``statistics()`` now.

        The delivery families appear once an AckQueue is exported.
        """
        gauges, counters = self._families(_GAUGES, _COUNTERS)
        ack_gauges, ack_counters = self._families(_ACK_GAUGES, _ACK_COUNTERS)
        any_ack = False
        for q in self.queues():
            labels = [q.name, q.directory]
            if isinstance(q, AckQueue):
                ack: AckStatistics = q.statistics()
                stats: Statistics = ack.queue
                any_ack = True
                _add(ack_gauges, _ACK_GAUGES, labels, ack)
                _add(ack_counters, _ACK_COUNTERS, labels, ack)
            else:
                stats = q.statistics()
            _add(gauges, _GAUGES, labels, stats)
            _add(counters, _COUNTERS, labels, stats)
        yield from gauges
        yield from counters
        if any_ack:
            yield from ack_gauges
            yield from ack_counters


def _add(families: Sequence[GaugeMetricFamily | CounterMetricFamily],
         table: tuple[tuple[str, str, str], ...], labels: list[str],
         stats: Statistics | AckStatistics) -> None:
    for fam, (_, attr, _) in zip(families, table, strict=True):
        fam.add_metric(labels, float(getattr(stats, attr)))


_BY_REGISTRY: weakref.WeakKeyDictionary[CollectorRegistry, DiskQueueCollector] = (
    weakref.WeakKeyDictionary()
)


def instrument(queue: Instrumented,
               registry: CollectorRegistry | None = None) -> DiskQueueCollector:
    """Export ``queue``'s statistics through ``registry`` (default: prometheus_client's).

    ``queue`` is a DiskQueue or an AckQueue (see the module's tables). One
    collector is registered per registry and shared by every queue instrumented
    there; it is returned so that ``remove()`` can drop a queue.

    Raises TypeError for anything else.
    """
    reg = REGISTRY if registry is None else registry
    collector = _BY_REGISTRY.get(reg)
    if collector is None:
        collector = DiskQueueCollector()
        reg.register(collector)
        _BY_REGISTRY[reg] = collector
    collector.add(queue)
    return collector
