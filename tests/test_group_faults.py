"""Queue groups under faults: durability of a new shard's directory entry, a shard that
fails while a consumer holds it, a close that is cancelled."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from aiodiskqueue import QueueGroup
from aiodiskqueue._format.group import group_layout

WAIT = 20.0


async def test_a_put_into_a_new_shard_is_durable_with_its_directory_entries(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # With sync_every=1 a put returns once fsynced: that must include the directory
    # entries leading to the segment, or a power cut loses the whole shard (ext4
    # without a directory fsync may drop a new directory's entry).
    synced: list[tuple[str, set[str]]] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        synced.append((path, set(os.listdir(path)) if os.path.isdir(path) else set()))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    lay = group_layout(tmp_path, "ev")
    async with QueueGroup(tmp_path, "ev", sync_every=1) as p:
        await p.put(b"x")
        # The group directory's entry in DIRECTORY, and the shard's in the group directory.
        assert any(path == str(tmp_path) and "ev.group" in names for path, names in synced)
        assert any(path == lay.path and "000000" in names for path, names in synced)
