"""``/stats?format=json`` with nsqd 1.3.0's fields: memory, producers, the clients' own."""

from __future__ import annotations

import json
import struct
from typing import Any

import aiohttp
from test_broker_support import RawClient, broker, connect, make_broker, raw_clients

from aiodiskqueue.broker import BrokerServer

__all__ = ["broker", "make_broker", "raw_clients"]  # fixtures used by the tests below

# nsqd 1.3.0's ClientV2Stats fields that are always present (the others are omitempty).
NSQD_CLIENT_FIELDS = {
    "client_id", "hostname", "version", "remote_address", "state", "ready_count",
    "in_flight_count", "message_count", "finish_count", "requeue_count", "connect_ts",
    "sample_rate", "deflate", "snappy", "user_agent", "tls", "tls_cipher_suite", "tls_version",
    "tls_negotiated_protocol", "tls_negotiated_protocol_is_mutual",
}
NSQD_MEMORY_FIELDS = {
    "heap_objects", "heap_idle_bytes", "heap_in_use_bytes", "heap_released_bytes",
    "gc_pause_usec_100", "gc_pause_usec_99", "gc_pause_usec_95", "next_gc_bytes", "gc_total_runs",
}


async def get_stats(server: BrokerServer, query: str = "") -> tuple[str, dict[str, Any]]:
    url = f"http://127.0.0.1:{server.http_port}/stats?format=json{query}"
    async with aiohttp.ClientSession() as http, http.get(url) as r:
        assert r.status == 200
        text = await r.text()
    return text, json.loads(text)


async def test_the_document_has_nsqds_top_level_fields_in_order(broker: BrokerServer) -> None:
    text, data = await get_stats(broker)
    assert list(data) == ["version", "health", "start_time", "topics", "memory", "producers"]
    assert set(data["memory"]) == NSQD_MEMORY_FIELDS
    assert data["memory"]["heap_objects"] > 0 and data["memory"]["heap_in_use_bytes"] > 0
    assert data["producers"] is None  # Go encodes its empty list as null
    assert '"producers": null' in text


async def test_publishers_are_producers_with_their_pub_counts(
    broker: BrokerServer, raw_clients: list[RawClient]
) -> None:
    p = await connect(broker.tcp_port, raw_clients, client_id="pub-1", hostname="h")
    for _ in range(3):
        await p.pub("a", b"x")
    p.send(b"MPUB b", struct.pack(">iixix", 2, 1, 1))
    await p.expect_ok()
    c = await connect(broker.tcp_port, raw_clients, client_id="sub-1")
    await c.sub("a", "ch")
    _, data = await get_stats(broker)
    (producer,) = data["producers"]
    assert set(producer) >= NSQD_CLIENT_FIELDS
    assert (producer["client_id"], producer["tls"], producer["tls_version"]) == ("pub-1", False, "")
    assert producer["pub_counts"] == [{"topic": "a", "count": 3}, {"topic": "b", "count": 2}]
    (client,) = data["topics"][0]["channels"][0]["clients"]
    assert set(client) >= NSQD_CLIENT_FIELDS and "pub_counts" not in client
    _, only_b = await get_stats(broker, "&topic=b")
    assert only_b["producers"][0]["pub_counts"] == [{"topic": "b", "count": 2}]


async def test_include_clients_and_include_mem_as_nsqd(
    broker: BrokerServer, raw_clients: list[RawClient]
) -> None:
    p = await connect(broker.tcp_port, raw_clients)
    await p.sub("t", "ch")
    await p.pub("t", b"x")
    _, data = await get_stats(broker, "&include_clients=false&include_mem=0")
    assert "memory" not in data
    assert data["producers"] is None
    channel = data["topics"][0]["channels"][0]
    assert (channel["clients"], channel["client_count"]) == (None, 1)
    _, data = await get_stats(broker, "&include_clients=maybe")  # not a bool: the default
    assert data["producers"] and data["topics"][0]["channels"][0]["clients"]
