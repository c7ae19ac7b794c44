"""The broker's registry of topics and channels, and its metadata file."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import socket
import time
from typing import Any

from .._core.options import DEFAULTS
from .._format.access import make_dirs, open_file
from .._format.layout import fsync_dir
from ._backend import open_store, remove_store
from ._lookupd import LookupdPeer, command
from ._options import BrokerOptions
from ._protocol import VERSION, is_valid_name
from ._topic import Channel, Topic

log = logging.getLogger(__name__)

META_FILE = "broker.meta.json"


class Broker:
    """Topics and channels over stores in one data directory (no network).

    The TCP and HTTP front ends (:mod:`._server`, :mod:`._http`) call
    :meth:`get_topic`, :meth:`get_channel` and :meth:`Topic.publish`. Which
    topics and channels exist is kept in ``broker.meta.json`` (written to a
    temporary file, fsynced and renamed), like nsqd's ``nsqd.dat``, so a
    restarted broker reopens every channel, and with it every message that
    was queued, deferred or in flight.
    """

    def __init__(
        self, data_dir: str | os.PathLike[str], options: BrokerOptions | None = None
    ) -> None:
        self.data_dir = os.fspath(data_dir)
        self.options = options or BrokerOptions()
        self.topics: dict[str, Topic] = {}
        self.start_time = int(time.time())
        self.tcp_port = 0
        self.http_port = 0
        self._lock = asyncio.Lock()
        self._closed = False
        self.closing = False
        """Set once :meth:`aclose` started: connections ending then do not delete anything."""
        self.lookupd: list[LookupdPeer] = []
        """The nsqlookupd registrations, told of every topic and channel created or deleted."""

    # ------------------------------------------------------------------ life cycle

    async def start(self) -> None:
        """Create the data directory and reopen the topics and channels of the last run."""
        make_dirs(self.data_dir, DEFAULTS.dir_mode)  # the queues' own default, owner-only
        # Ephemeral topics and channels do not outlive the process ('#' appears
        # in no other name): drop what a crash left of them.
        for f in os.listdir(self.data_dir):
            if "#ephemeral" in f:
                path = os.path.join(self.data_dir, f)
                if os.path.isdir(path):  # a dead-letter directory
                    shutil.rmtree(path)
                else:
                    os.unlink(path)
        meta = self._load_meta()
        for t in meta.get("topics", []):
            name = t.get("name", "")
            if not isinstance(name, str) or not is_valid_name(name):
                log.warning("ignoring bad topic name %r in %s", name, META_FILE)
                continue
            topic = await self.get_topic(name, persist=False)
            topic.paused = bool(t.get("paused", False))
            for c in t.get("channels", []):
                cname = c.get("name", "")
                if not isinstance(cname, str) or not is_valid_name(cname):
                    log.warning("ignoring bad channel name %r in %s", cname, META_FILE)
                    continue
                ch = await self.get_channel(topic, cname, persist=False)
                ch.paused = bool(c.get("paused", False))
            topic.start_pump()

    async def aclose(self) -> None:
        """Stop the pumps, sync and close every store; idempotent."""
        if self._closed:
            return
        self._closed = self.closing = True
        for topic in self.topics.values():
            await topic.stop_pump()
        for topic in self.topics.values():
            for ch in topic.channels.values():
                await ch.store.aclose()
            await topic.backlog.aclose()

    # ------------------------------------------------------------------ registry

    async def get_topic(self, name: str, *, persist: bool = True) -> Topic:
        """Return topic ``name``, creating it (and its store) if needed."""
        topic = self.topics.get(name)
        if topic is not None:
            return topic
        async with self._lock:
            topic = self.topics.get(name)
            if topic is None:
                # The topic's own queue never dead-letters: its pump takes each
                # message once to copy it into the channels.
                store = await open_store(self.data_dir, name, self.options, dead_letters=False)
                topic = Topic(name, store)
                self.topics[name] = topic
                self._notify(command("REGISTER", name))
                if persist:
                    await self.persist_meta()
        return topic

    async def get_channel(self, topic: Topic, name: str, *, persist: bool = True) -> Channel:
        """Return channel ``name`` of ``topic``, creating it (and its store) if needed."""
        ch = topic.channels.get(name)
        if ch is not None:
            return ch
        async with self._lock:
            ch = topic.channels.get(name)
            if ch is None:
                store = await open_store(self.data_dir, f"{topic.name}:{name}", self.options)
                ch = Channel(topic, name, store)
                topic.add_channel(ch)
                self._notify(command("REGISTER", topic.name, name))
                if persist:
                    await self.persist_meta()
        return ch

    async def delete_channel(self, topic: Topic, name: str) -> bool:
        """Delete channel ``name``: disconnect its clients, close its queue, delete its files.

        Returns False if there is no such channel.
        """
        async with self._lock:
            ch = topic.remove_channel(name)
            if ch is None:
                return False
            for c in list(ch.clients.values()):
                c.close()
            self._notify(command("UNREGISTER", topic.name, name))
            await remove_store(ch.store, self.data_dir, ch.queue_name)
            await self.persist_meta()
        if topic.ephemeral and not topic.channels and not topic.deleting:
            await self.delete_topic(topic.name)
        return True

    async def delete_topic(self, name: str) -> bool:
        """Delete topic ``name`` with all its channels and files. False if there is none."""
        topic = self.topics.get(name)
        if topic is None:
            return False
        topic.deleting = True
        for cname in list(topic.channels):
            await self.delete_channel(topic, cname)
        async with self._lock:
            if self.topics.pop(name, None) is None:
                return False
            await topic.stop_pump()
            self._notify(command("UNREGISTER", name))
            await remove_store(topic.backlog, self.data_dir, name)
            await self.persist_meta()
        return True

    def _notify(self, cmd: bytes) -> None:
        for peer in self.lookupd:
            peer.notify(cmd)

    # ------------------------------------------------------------------ metadata

    def _meta_path(self) -> str:
        return os.path.join(self.data_dir, META_FILE)

    def _load_meta(self) -> dict[str, Any]:
        try:
            with open(self._meta_path(), "rb") as f:
                data = json.loads(f.read())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            log.error("cannot read %s (%s); starting with no topics", self._meta_path(), exc)
            return {}
        return data if isinstance(data, dict) else {}

    def meta(self) -> dict[str, Any]:
        """The metadata document: every topic and channel with its paused flag.

        ``#ephemeral`` ones are left out, as nsqd leaves them out of ``nsqd.dat``.
        """
        return {
            "version": VERSION,
            "topics": [
                {
                    "name": t.name,
                    "paused": t.paused,
                    "channels": [{"name": c.name, "paused": c.paused}
                                 for c in t.channels.values() if not c.ephemeral],
                }
                for t in self.topics.values() if not t.ephemeral
            ],
        }

    async def persist_meta(self) -> None:
        """Store the metadata atomically (temp file, fsync, rename, directory fsync)."""
        data = json.dumps(self.meta(), indent=1).encode()
        await asyncio.get_running_loop().run_in_executor(None, self._write_meta, data)

    def _write_meta(self, data: bytes) -> None:
        path = self._meta_path()
        tmp = f"{path}.{os.getpid()}.tmp"
        fd = open_file(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, DEFAULTS.file_mode)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        fsync_dir(self.data_dir)

    # ------------------------------------------------------------------ stats

    def stats(self, topic: str = "", channel: str = "", *, include_clients: bool = True,
              memory: dict[str, int] | None = None,
              producers: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """nsqd's ``/stats?format=json`` document, optionally narrowed to a topic/channel.

        Without ``include_clients`` each channel's ``clients`` is null, as nsqd's;
        ``memory`` is left out when None; ``producers`` is null when empty (Go
        encodes its empty list so).
        """
        topics = []
        for t in sorted(self.topics.values(), key=lambda t: t.name):
            if topic and t.name != topic:
                continue
            ts = t.stats()
            if channel:
                ts["channels"] = [c for c in ts["channels"] if c["channel_name"] == channel]
            if not include_clients:
                for c in ts["channels"]:
                    c["clients"] = None
            topics.append(ts)
        out: dict[str, Any] = {
            "version": VERSION,
            "health": "OK",
            "start_time": self.start_time,
            "topics": topics,
        }
        if memory is not None:
            out["memory"] = memory
        out["producers"] = producers or None
        return out

    @property
    def broadcast_address(self) -> str:
        """The address clients are told to connect to (``--broadcast-address``, default
        the hostname)."""
        return self.options.broadcast_address or socket.gethostname()

    def info(self) -> dict[str, Any]:
        """nsqd's ``/info`` document (its durations in nanoseconds, as Go encodes them)."""
        limits = self.options.limits()
        return {
            "version": VERSION,
            "broadcast_address": self.broadcast_address,
            "hostname": socket.gethostname(),
            "http_port": self.http_port,
            "tcp_port": self.tcp_port,
            "start_time": self.start_time,
            "max_heartbeat_interval": limits.max_heartbeat_interval_ms * 1_000_000,
            "max_output_buffer_size": limits.max_output_buffer_size,
            "max_output_buffer_timeout": limits.max_output_buffer_timeout_ms * 1_000_000,
            "max_deflate_level": limits.max_deflate_level,
        }


__all__ = ["Broker"]
