"""The broker driven by pynsq (``pip install pynsq``, imported as ``nsq``), the tornado NSQ client.

pynsq runs its own tornado IOLoop, so each client runs in a child process
(a script given to ``python -c``) while the broker runs in the test's loop.
Each child stops by itself: when done, or after a time limit.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from test_broker_support import (
    TIMEOUT,
    MakeBroker,
    broker,
    channel_stats,
    eventually,
    make_broker,
    pki,
)

from aiodiskqueue.broker import BrokerServer

__all__ = ["broker", "make_broker", "pki"]

SCRIPT = r'''
import json, os, ssl, sys
import nsq
import tornado.ioloop

mode, port, topic = sys.argv[1], int(sys.argv[2]), sys.argv[3]
# Connection options (tls_v1, tls_options, deflate, snappy) for Writer and Reader.
conn_opts = json.loads(os.environ.get("NSQ_CONN_OPTS", "{}"))
if "tls_options" in conn_opts:
    conn_opts["tls_options"]["cert_reqs"] = ssl.CERT_REQUIRED
loop = tornado.ioloop.IOLoop.current()
out = {"results": [], "errors": []}

def stop():
    print(json.dumps(out), flush=True)
    loop.stop()

loop.call_later(float(sys.argv[-1]), stop)  # a hard time limit: the child always exits

if mode == "pub":
    bodies = [b.encode() for b in json.loads(sys.argv[4])]
    w = nsq.Writer(["127.0.0.1:%d" % port], **conn_opts)
    pending = [len(bodies) - 2 + 2]  # PUBs, one MPUB, one DPUB

    def done(conn, data):
        if isinstance(data, nsq.Error):
            out["errors"].append(str(data))
        else:
            out["results"].append(data.decode())
        pending[0] -= 1
        if pending[0] == 0:
            stop()

    def start():
        if not w.conns:  # not connected yet: look again shortly
            loop.call_later(0.01, start)
            return
        for b in bodies[:-2]:
            w.pub(topic, b, callback=done)
        w.mpub(topic, bodies[-2:], callback=done)
        w.dpub(topic, 100, b"deferred", callback=done)

    loop.add_callback(start)
else:
    channel, expect = sys.argv[4], int(sys.argv[5])

    def handler(msg):
        msg.enable_async()
        body = msg.body.decode()
        out["results"].append([body, msg.attempts])
        if mode == "grab":  # take messages and leave without answering
            if len(out["results"]) >= expect:
                loop.add_callback(stop)
            return
        if body.startswith("retry") and msg.attempts == 1:
            msg.requeue(delay=0, backoff=False)
            return
        if body.startswith("touch"):
            msg.touch()
        msg.finish()
        if sum(1 for b, a in out["results"] if not (b.startswith("retry") and a == 1)) >= expect:
            loop.add_callback(stop)

    r = nsq.Reader(topic=topic, channel=channel, message_handler=handler,
                   nsqd_tcp_addresses=["127.0.0.1:%d" % port], max_in_flight=10,
                   lookupd_poll_interval=600, **conn_opts)
loop.start()
'''


async def _run_child(*args: str, conn_opts: dict[str, Any] | None = None) -> dict[str, Any]:
    env = {**os.environ, "NSQ_CONN_OPTS": json.dumps(conn_opts or {})}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", SCRIPT, *args, str(TIMEOUT),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), TIMEOUT + 10)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode == 0, err.decode()
    result: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    return result


async def test_pynsq_writer_pub_mpub_dpub(broker: BrokerServer) -> None:
    bodies = ["p1", "p2", "m1", "m2"]
    res = await _run_child("pub", str(broker.tcp_port), "py_topic", json.dumps(bodies))
    assert res["errors"] == []
    assert res["results"] == ["OK"] * 4  # 2 PUB, 1 MPUB, 1 DPUB
    topic = broker.broker.topics["py_topic"]
    assert topic.message_count == 5


async def test_pynsq_reader_consumes_fin_req_touch(broker: BrokerServer) -> None:
    topic = await broker.broker.get_topic("py_jobs")
    await broker.broker.get_channel(topic, "workers")
    await topic.publish([b"plain-1", b"retry-1", b"touch-1", b"plain-2"])
    res = await _run_child("sub", str(broker.tcp_port), "py_jobs", "workers", "4")
    seen = {(b, a) for b, a in res["results"]}
    assert seen == {("plain-1", 1), ("retry-1", 1), ("retry-1", 2), ("touch-1", 1), ("plain-2", 1)}
    await eventually(lambda: channel_stats(broker, "py_jobs", "workers")["finish_count"] == 4)
    stats = channel_stats(broker, "py_jobs", "workers")
    assert (stats["requeue_count"], stats["depth"]) == (1, 0)


async def test_pynsq_writer_to_pynsq_reader(broker: BrokerServer) -> None:
    topic = await broker.broker.get_topic("py_e2e")
    await broker.broker.get_channel(topic, "c")
    pub = await _run_child("pub", str(broker.tcp_port), "py_e2e", json.dumps(["a", "b", "c", "d"]))
    assert pub["errors"] == []
    sub = await _run_child("sub", str(broker.tcp_port), "py_e2e", "c", "5")
    assert sorted(b for b, _ in sub["results"]) == ["a", "b", "c", "d", "deferred"]


async def test_pynsq_consumer_leaving_mid_flight(broker: BrokerServer) -> None:
    topic = await broker.broker.get_topic("py_leave")
    await broker.broker.get_channel(topic, "c")
    await topic.publish([b"one", b"two", b"three"])
    grabbed = await _run_child("grab", str(broker.tcp_port), "py_leave", "c", "3")
    assert sorted(b for b, _ in grabbed["results"]) == ["one", "three", "two"]
    # The child exited with all three in flight: they are delivered again, at once.
    again = await _run_child("sub", str(broker.tcp_port), "py_leave", "c", "3")
    assert sorted((b, a) for b, a in again["results"]) == [("one", 2), ("three", 2), ("two", 2)]


@pytest.mark.parametrize(
    "features",
    [{"tls_v1": True}, {"deflate": True}, {"snappy": True},
     {"tls_v1": True, "snappy": True}, {"tls_v1": True, "deflate": True, "deflate_level": 3}],
    ids=["tls", "deflate", "snappy", "tls-snappy", "tls-deflate"],
)
async def test_pynsq_upgrades_its_connections(
    make_broker: MakeBroker, pki: dict[str, Path], features: dict[str, Any],
    caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="aiodiskqueue.broker._server")
    server = await make_broker(tls_cert=str(pki["server_cert"]), tls_key=str(pki["server_key"]))
    conn_opts = dict(features)
    if features.get("tls_v1"):
        conn_opts["tls_options"] = {"ca_certs": str(pki["ca"])}
    topic = await server.broker.get_topic("py_up")
    await server.broker.get_channel(topic, "c")
    pub = await _run_child("pub", str(server.tcp_port), "py_up", json.dumps(["a", "b", "c", "d"]),
                           conn_opts=conn_opts)
    assert pub["errors"] == [] and pub["results"] == ["OK"] * 4
    sub = await _run_child("sub", str(server.tcp_port), "py_up", "c", "5", conn_opts=conn_opts)
    assert sorted(b for b, _ in sub["results"]) == ["a", "b", "c", "d", "deferred"]
    # Both clients really upgraded, in nsqd's order.
    upgrades = [r.getMessage().split(": ", 1)[1] for r in caplog.records
                if "upgraded to" in r.getMessage()]
    expected = (["upgraded to TLS"] if features.get("tls_v1") else []) + (
        ["upgraded to snappy"] if features.get("snappy") else
        [f"upgraded to deflate (level {features.get('deflate_level', 6)})"]
        if features.get("deflate") else [])
    assert upgrades == expected * 2
