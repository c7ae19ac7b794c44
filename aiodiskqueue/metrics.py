"""Export :meth:`DiskQueue.statistics` to Prometheus (optional extra ``metrics``).

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

The ``aiodiskqueue`` prefix is the ``namespace`` argument.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Iterator
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


@final
class DiskQueueCollector:
    """A prometheus_client collector for any number of :class:`DiskQueue` objects.

    Register it once per registry (``registry.register(collector)``) and
    :meth:`add` queues to it; or use :func:`instrument`, which does both.
    Queues are held weakly.
    """

    def __init__(self, queues: Iterable[DiskQueue] = (), *,
                 namespace: str = "aiodiskqueue") -> None:
        self.namespace = namespace
        self._queues: list[weakref.ref[DiskQueue]] = []
        for q in queues:
            self.add(q)

    def add(self, queue: DiskQueue) -> None:
        """Export ``queue``'s statistics from now on (adding it twice has no effect)."""
        if all(r() is not queue for r in self._queues):
            self._queues.append(weakref.ref(queue))

    def remove(self, queue: DiskQueue) -> None:
        """Stop exporting ``queue``; no effect if it was not added."""
        self._queues = [r for r in self._queues if r() is not None and r() is not queue]

    def queues(self) -> list[DiskQueue]:
        """The queues still alive and exported."""
        alive = [q for q in (r() for r in self._queues) if q is not None]
        if len(alive) != len(self._queues):
            self._queues = [weakref.ref(q) for q in alive]
        return alive

    def _families(self) -> tuple[list[GaugeMetricFamily], list[CounterMetricFamily]]:
        ns = self.namespace
        gauges = [GaugeMetricFamily(f"{ns}_{suffix}", doc, labels=_LABELS)
                  for suffix, _, doc in _GAUGES]
        counters = [CounterMetricFamily(f"{ns}_{suffix}", doc, labels=_LABELS)
                    for suffix, _, doc in _COUNTERS]
        return gauges, counters

    def describe(self) -> Iterator[Metric]:
        """The metric families, without samples (lets a registry check names up front)."""
        gauges, counters = self._families()
        yield from gauges
        yield from counters

    def collect(self) -> Iterator[Metric]:
        """One sample per queue for every metric, read from ``statistics()`` now."""
        gauges, counters = self._families()
        for q in self.queues():
            stats: Statistics = q.statistics()
            labels = [q.name, q.directory]
            for fam, (_, attr, _) in zip(gauges, _GAUGES, strict=True):
                fam.add_metric(labels, float(getattr(stats, attr)))
            for cfam, (_, attr, _) in zip(counters, _COUNTERS, strict=True):
                cfam.add_metric(labels, float(getattr(stats, attr)))
        yield from gauges
        yield from counters


_BY_REGISTRY: weakref.WeakKeyDictionary[CollectorRegistry, DiskQueueCollector] = (
    weakref.WeakKeyDictionary()
)


def instrument(queue: DiskQueue, registry: CollectorRegistry | None = None) -> DiskQueueCollector:
    """Export ``queue``'s statistics through ``registry`` (default: prometheus_client's).

    One collector is registered per registry and shared by every queue
    instrumented there; it is returned so that ``remove()`` can drop a queue.
    """
    reg = REGISTRY if registry is None else registry
    collector = _BY_REGISTRY.get(reg)
    if collector is None:
        collector = DiskQueueCollector()
        reg.register(collector)
        _BY_REGISTRY[reg] = collector
    collector.add(queue)
    return collector
