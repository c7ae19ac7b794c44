"""Who holds a queue now: the roles' published records and the whole-queue lock's holder.

Reads only; takes no lock a live process could trip over (the probes are shared).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from .._format.layout import Layout
from .._format.lock import read_lock_pid
from .._format.probe import held_exclusively
from .._format.roles import RoleRecord, published_record


@dataclass(frozen=True, slots=True)
class RolesState:
    """The roles held in a queue now: the producer's published record (its pid and the
    position its next record goes to: everything before it is published) and the
    consumer's (its pid and its last stored read position); None where a role is free."""

    producer: RoleRecord | None
    consumer: RoleRecord | None

    @property
    def live(self) -> bool:
        """Whether a role is held."""
        return self.producer is not None or self.consumer is not None

    @property
    def limit(self) -> tuple[int, int] | None:
        """Where published data ends while a producer is live, else None."""
        return None if self.producer is None else self.producer.at

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: ``producer`` and ``consumer``, each None or an object."""
        p, c = self.producer, self.consumer
        return {
            "producer": None if p is None else {
                "pid": p.pid, "write_file_num": p.file_num, "write_pos": p.pos},
            "consumer": None if c is None else {
                "pid": c.pid, "read_file_num": c.file_num, "read_pos": c.pos},
        }

    def describe(self) -> str:
        """One line of text, e.g. ``producer pid 12 (published to 0,1024), consumer pid
        13 (read at 0,512)``, or ``none``."""
        parts = []
        if self.producer is not None:
            p = self.producer
            parts.append(f"producer pid {p.pid} (published to {p.file_num},{p.pos})")
        if self.consumer is not None:
            c = self.consumer
            parts.append(f"consumer pid {c.pid} (read at {c.file_num},{c.pos})")
        return ", ".join(parts) if parts else "none"


def roles_state(layout: Layout) -> RolesState:
    """The roles held in the queue now; takes no lock (see
    :func:`~aiodiskqueue._format.roles.published_record`)."""
    return RolesState(published_record(layout.role_path("producer")),
                      published_record(layout.role_path("consumer")))


def whole_holder(lock_path: str) -> int | None:
    """Pid of a process holding the queue whole (``role="both"``) at ``lock_path``, -1 if
    its pid is unknown, None if none does. A shared probe: roles hold it shared too."""
    if not held_exclusively(lock_path):
        return None
    return read_lock_pid(lock_path) or -1


def queue_exists(layout: Layout) -> bool:
    """Whether the queue has a meta file, a segment or a quarantined segment."""
    return (os.path.exists(layout.meta_path) or bool(layout.segments())
            or bool(layout.bad_files()))


def holder(layout: Layout) -> int | None:
    """Pid of the live process that has the queue open (a role's holder: the producer's
    first), or None; creates nothing.

    Probes no role file whose record says the role is free (see
    :func:`~aiodiskqueue._format.roles.published_record`), so a role being opened
    meanwhile is not made to fail.
    """
    roles = roles_state(layout)
    for rec in (roles.producer, roles.consumer):
        if rec is not None:
            return rec.pid
    return whole_holder(layout.lock_path)
