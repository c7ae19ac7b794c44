"""Smoke tests of the benchmark suite: shape of its table and JSON, and its order check.

No speed is asserted anywhere: the numbers are evidence for the README, not test outcomes.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench"

ROW_KEYS = {"workload", "system", "size", "producers", "loop", "rate_median", "rate_min",
            "rate_max", "guarantee"}
OURS = "aiodiskqueue"


def _load(name: str) -> ModuleType:
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up while the class is built
    spec.loader.exec_module(mod)
    return mod


def _run(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    out = tmp_path / "results.json"
    cmd = [sys.executable, str(BENCH / "run.py"), "--quick", "--reps", "1", "--sizes", "64",
           "--messages", "2000", "--tmpdir", str(tmp_path / "queues"), "--out", str(out), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO,
                          check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc, json.loads(out.read_text())


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory
              ) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """One tiny run: ours on asyncio, the raw baseline, queuelib and a durable peer."""
    return _run(tmp_path_factory.mktemp("bench"), "--loop", "asyncio",
                "--systems", "ours,raw,queuelib,diskcache-full")


def test_json_has_meta_and_typed_rows(
        quick_run: tuple[subprocess.CompletedProcess[str], dict[str, Any]]) -> None:
    _, data = quick_run
    meta = data["meta"]
    assert {"machine", "python", "versions", "timestamp"} <= meta.keys()
    assert meta["versions"]["aiodiskqueue"].startswith("0.")
    assert meta["machine"]["tmp_same_device_as_repo"] in (True, False)
    rows = data["rows"]
    assert rows
    for r in rows:
        assert r.keys() >= ROW_KEYS, r
        assert isinstance(r["size"], int) and isinstance(r["producers"], int)
        assert r["rate_min"] <= r["rate_median"] <= r["rate_max"], r
        assert isinstance(r["guarantee"], str) and r["guarantee"]


def test_every_workload_of_ours_ran_and_was_checked(
        quick_run: tuple[subprocess.CompletedProcess[str], dict[str, Any]]) -> None:
    _, data = quick_run
    ours = {(r["workload"], r["producers"]) for r in data["rows"] if r["system"] == OURS}
    assert ours == {("put", 1), ("put", 16), ("put_many", 1), ("drain", 1), ("get_many", 1),
                    ("durable", 1), ("durable", 16), ("durable", 64)}
    assert all(r["loop"] == "asyncio" for r in data["rows"] if r["system"] == OURS)
    assert all(r["verified"] and r["rate_median"] > 0 for r in data["rows"]), \
        [r for r in data["rows"] if not r["verified"]]
    assert data["meta"]["all_verified"] is True
    # Our rows report the CPU they used (all threads): a positive number of cores.
    cpus = [r["cpu_per_s"] for r in data["rows"] if r["system"] == OURS]
    assert all(isinstance(c, float) and 0 < c < 64 for c in cpus), cpus


def test_peers_and_baseline_rows_and_ratios(
        quick_run: tuple[subprocess.CompletedProcess[str], dict[str, Any]]) -> None:
    _, data = quick_run
    systems = {r["system"] for r in data["rows"]}
    assert {"queuelib FifoDiskQueue", "diskcache Deque (synchronous=FULL)",
            "raw os.write 1 MiB", "raw os.read 1 MiB", "raw os.write+fdatasync 1 MiB"} <= systems
    by_key = {(r["workload"], r["producers"], r["system"]): r for r in data["rows"]}
    put = by_key[("put", 1, OURS)]
    assert put["ratio_queuelib"] > 0 and put["ratio_raw"] > 0
    durable = by_key[("durable", 64, OURS)]
    assert durable["best_peer"] == "diskcache Deque (synchronous=FULL)"
    assert durable["ratio_best_peer"] > 0
    # queuelib keeps no crash guarantee: it is never the "best peer" of a crash-safe row.
    assert all(r.get("best_peer") != "queuelib FifoDiskQueue"
               for r in data["rows"] if r["system"] == OURS)
    assert "queuelib FifoDiskQueue: 16 producers n/a (not thread-safe)" in data["meta"]["skipped"]
    # Several producers compare with queuelib's single producer, in the same run.
    put16 = by_key[("put", 16, OURS)]
    ql = by_key[("put", 1, "queuelib FifoDiskQueue")]
    assert put16["ratio_queuelib"] == round(put16["rate_median"] / ql["rate_median"], 3)


def test_every_row_reports_cpu_per_message(
        quick_run: tuple[subprocess.CompletedProcess[str], dict[str, Any]]) -> None:
    _, data = quick_run
    for r in data["rows"]:
        assert isinstance(r["cpu_us_per_msg"], float) and r["cpu_us_per_msg"] > 0, r
        if r["cpu_per_s"] >= 0.2:  # cpu_per_s is rounded to two decimals
            assert r["cpu_us_per_msg"] == pytest.approx(
                r["cpu_per_s"] / r["rate_median"] * 1e6, rel=0.05), r


def test_table_reports_the_order_check(
        quick_run: tuple[subprocess.CompletedProcess[str], dict[str, Any]]) -> None:
    proc, data = quick_run
    lines = proc.stdout.splitlines()
    assert lines[0].split()[:4] == ["workload", "prod", "size", "system"]
    n = len(data["rows"])
    assert (f"check: every message came back once and in order (per producer) in {n} of {n} rows"
            in proc.stdout)
    ours_lines = [ln for ln in lines if f" {OURS} " in ln]
    assert len(ours_lines) == 8 and all(" ok " in ln for ln in ours_lines)


def test_only_and_both_loops(tmp_path: Path) -> None:
    _, data = _run(tmp_path, "--loop", "both", "--only", "drain", "--systems", "ours")
    rows = data["rows"]
    assert {(r["workload"], r["loop"]) for r in rows} == {("drain", "asyncio"), ("drain", "uvloop")}


def test_order_check_catches_loss_duplicates_and_reordering() -> None:
    run = _load("run")
    lists = run.make_payloads(16, [3, 2])
    a, b = lists
    assert run.check_order([a[0], b[0], a[1], b[1], a[2]], lists) is None
    assert run.check_order([a[0], a[2], a[1], b[0], b[1]], lists) is not None
    assert run.check_order([a[0], a[1], b[0], b[1]], lists) == "got 4 messages, expected 5"
    assert run.check_order([a[0], a[1], a[1], b[0], b[1]], lists) is not None
    one = [a]
    assert run.check_order([a[1], a[0], a[2]], one) is not None


def test_order_check_fed_in_chunks_keeps_nothing_and_catches_what_check_order_does() -> None:
    run = _load("run")
    [one] = run.make_payloads(16, [10])

    def fed(chunks: list[list[bytes]]) -> str | None:
        check = run.OrderCheck([one])
        for c in chunks:
            check.feed(c)
            c.clear()  # as the drain loops do: the checker keeps no reference
        result: str | None = check.result()
        return result

    assert fed([one[:4], one[4:9], one[9:]]) is None
    assert fed([one[:4], one[5:10]]) == (
        f"message 4 differs: got {one[5][:8].hex()}, expected {one[4][:8].hex()}")
    assert fed([one[:4], one[4:9]]) == "got 9 messages, expected 10"
    assert fed([one[:6], [*one[6:], one[9]]]) == "got more than the 10 messages put"
    assert fed([one[:3], one[2:3], one[3:]]) is not None  # a repeat across a chunk boundary


def test_baseline_hands_each_chunk_to_a_sink(tmp_path: Path) -> None:
    baseline = _load("baseline")
    payloads = [bytes([i % 256]) * (i * 37 % 3000) for i in range(2000)]
    path = str(tmp_path / "raw.dat")
    baseline.write_records(path, payloads, sync=False, batch_bytes=4096)
    chunks: list[list[bytes]] = []
    kept, _ = baseline.read_records(path, chunk_bytes=10_000, sink=lambda c: chunks.append(list(c)))
    assert kept == [] and len(chunks) > 100
    assert [m for c in chunks for m in c] == payloads


def test_baseline_round_trips_records(tmp_path: Path) -> None:
    baseline = _load("baseline")
    payloads = [bytes([i % 256]) * (i * 37 % 3000) for i in range(2000)]
    path = str(tmp_path / "raw.dat")
    baseline.write_records(path, payloads, sync=True, batch_bytes=4096)
    got, _ = baseline.read_records(path, chunk_bytes=1000)
    assert got == payloads
    size = sum(4 + len(p) for p in payloads)
    assert (tmp_path / "raw.dat").stat().st_size == size


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread CPU from /proc")
def test_put_threads_tells_the_queue_s_threads_apart(tmp_path: Path) -> None:
    import asyncio

    from aiodiskqueue import DiskQueue
    from aiodiskqueue._core import lane

    mod = _load("bench_put_threads")

    async def parts_while_open() -> list[str]:
        async with await DiskQueue.open(tmp_path, "q") as q:
            await q.put(b"x")
            return sorted(part for part, _ in mod.thread_cpu().values())

    parts = asyncio.run(parts_while_open())
    assert parts.count("loop") == 1
    assert parts.count("io") == 1
    assert parts.count("writer") == (1 if lane.available() else 0)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread CPU from /proc")
def test_put_threads_prints_a_row_per_mode_and_producer_count() -> None:
    cmd = [sys.executable, str(BENCH / "bench_put_threads.py"), "--n", "2000", "--reps", "1",
           "--loop", "asyncio", "--producers", "1,4"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO,
                          check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [ln.split() for ln in proc.stdout.splitlines()[2:]]
    assert [(r[0], r[1]) for r in rows[1:]] == [
        (m, p) for p in ("1", "4") for m in ("default", "spin50", "spin0", "inline")]
    assert rows[0][:3] == ["raw", "os.write", "1"]
    assert all(float(r[-7].replace(",", "")) > 0 for r in rows)  # msgs/s, 7th from the end


def test_long_drain_removes_segments_and_prints_both_rows(tmp_path: Path) -> None:
    cmd = [sys.executable, str(BENCH / "bench_long_drain.py"), "--messages", "3000",
           "--size", "100", "--segment-bytes", "65536", "--reps", "1", "--loop", "asyncio",
           "--dir", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO,
                          check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    removing = next(ln for ln in lines if "removing" in ln).split()
    anchor = next(ln for ln in lines if "(anchor)" in ln).split()
    assert removing[:2] == ["64", "KiB"]
    assert int(removing[4]) == 5  # 3000 x 104 B records in 64 KiB segments
    assert int(anchor[3]) == 1 and anchor[-1] == "1.00x"


def test_null_store_broker_serves_the_protocol_and_counts_finishes() -> None:
    # bench_broker.py --null-store: the broker with no queue behind it still moves
    # every message from publishers to consumers, and finishes each one once.
    import asyncio

    mod = _load("bench_broker")

    async def run() -> tuple[int, int]:
        broker = mod.BrokerProcess(2500, null_store=True)
        try:
            await asyncio.wait_for(mod.run_broker(
                broker, "t", 300, 64, 2, 2, 10,
                lambda p, t, k, b: mod.raw_publisher(p, t, k, b, 8), mod.raw_consumer), 120)
            url = f"http://127.0.0.1:{broker.http}/stats?format=json&topic=t"
            async with mod.ClientSession() as s, s.get(url) as r:
                ch = (await r.json())["topics"][0]["channels"][0]
            return ch["finish_count"], ch["depth"]
        finally:
            broker.close()

    assert asyncio.run(run()) == (300, 0)


def test_readme_table_small_run_prints_the_readme_table_from_its_run(tmp_path: Path) -> None:
    # bench/readme_table.py --small: one tiny run.py run, then the README's table of it.
    # The table is checked against the run's own JSON, never against fixed figures.
    mod = _load("readme_table")
    out = tmp_path / "results.json"
    cmd = [sys.executable, str(BENCH / "readme_table.py"), "--small", "--loop", "asyncio",
           # litequeue's 16-thread row fails on Python 3.13: 0.9 with InterfaceError from
           # sqlite3, 0.14 reorders a producer's messages (ids made without a lock)
           "--systems", "ours,queuelib,diskcache-full",
           "--tmpdir", str(tmp_path / "queues"), "--json-out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO,
                          check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(out.read_text())
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("Measured ") and "QUICK RUN" in lines[0]
    assert "load average" in lines[0] and data["meta"]["timestamp"] in lines[0]
    table = [ln for ln in lines if ln.startswith("|")]
    assert table[0].startswith("| workload | aiodiskqueue | CPU us/msg | best crash-safe peer")
    body = [[c.strip() for c in ln.strip("|").split("|")] for ln in table[2:]]
    assert [r[0] for r in body] == [label for _, _, label in mod.ROWS]
    ours = {(r["workload"], r["producers"]): r for r in data["rows"] if r["system"] == OURS}
    go = mod.go_anchors(BENCH / "README.md")
    assert set(go) == {("put", 1), ("put", 16), ("drain", 1), ("durable", 1)}
    for (workload, producers, _), cells in zip(mod.ROWS, body, strict=True):
        r = ours[(workload, producers)]
        assert cells[1] == mod.fmt_rate(r["rate_median"])
        assert float(cells[2]) == pytest.approx(r["cpu_us_per_msg"], rel=0.01, abs=0.05)
        assert cells[4] == mod.fmt_ratio(r["ratio_best_peer"])
        if r["best_peer"] is not None:
            assert cells[3].startswith(r["best_peer"] + " ")
        assert cells[6] == mod.fmt_ratio(r["ratio_queuelib"])
        assert cells[7] == go.get((workload, producers), "-")
    # A durable row names only a durable peer (never queuelib or a kill-safe one).
    levels = {r["system"]: r["level"] for r in data["rows"]}
    durable_peers = {ours[(w, p)]["best_peer"] for w, p, _ in mod.ROWS if w == "durable"}
    assert durable_peers and all(levels[s] == "durable" for s in durable_peers if s), durable_peers
    # --from-json prints the same table again without running anything.
    again = subprocess.run([sys.executable, str(BENCH / "readme_table.py"), "--from-json",
                            str(out)], capture_output=True, text=True, timeout=60, cwd=REPO,
                           check=False)
    assert again.returncode == 0, again.stderr
    assert [ln for ln in again.stdout.splitlines() if ln.startswith("|")] == table


def test_bench_group_prints_every_row_checked() -> None:
    # bench/bench_group.py, tiny: group producers and consumers in processes of their own,
    # beside multiprocessing.Queue; every row's messages came once, in order per producer.
    cmd = [sys.executable, str(BENCH / "bench_group.py"), "--n", "2000", "--loop", "asyncio"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO,
                          check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [[c.strip() for c in ln.strip("|").split("|")]
            for ln in proc.stdout.splitlines()[3:] if ln.startswith("|")]
    assert [r[0] for r in rows] == [label for label, *_ in _load("bench_group").ROWS]
    assert all(float(r[1]) > 0 and float(r[4]) > 0 and r[5] == "ok" for r in rows), rows
def _roles_table(stdout: str) -> list[list[str]]:
    lines = [ln for ln in stdout.splitlines() if ln.startswith("|")]
    assert lines[0].startswith("| setup | msgs/s | ours / row | target | CPU s / 1k msgs |")
    return [[c.strip() for c in ln.strip().strip("|").split("|")] for ln in lines[2:]]


def test_roles_bench_runs_ours_and_every_peer_in_two_processes(tmp_path: Path) -> None:
    # bench/bench_roles.py at a few hundred messages: every row of ours and of the
    # installed peers, each checked by its consumer; ratios from the run's own rates.
    mod = _load("bench_roles")
    peers = _load("peers")
    cmd = [sys.executable, str(BENCH / "bench_roles.py"), "--n", "100", "--rate-n", "10",
           "--loop", "asyncio", "--tmpdir", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO,
                          check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    body = _roles_table(proc.stdout)
    installed = {c.KEY for c in peers.PROCESS_PEERS if c.available()}
    expected = [s for s in mod.setups() if s.system.startswith("ours") or s.system in installed]
    assert [r[0] for r in body] == [s.label for s in expected]
    assert {"persistqueue-sqlite", "mp-queue"} <= installed  # the bench extra's peers
    rates = {r[0]: float(r[1].replace(",", "")) for r in body}
    for s, cells in zip(expected, body, strict=True):
        assert rates[s.label] > 0 and float(cells[4]) > 0, cells
        assert cells[7] == "ok", cells
        assert cells[8] == s.crash and cells[8].startswith("kill: ")
        if s.ref is None:
            assert (cells[2], cells[3]) == ("-", "(reference)")
        else:
            assert float(cells[2].rstrip("x")) == pytest.approx(
                rates[s.ref] / rates[s.label], rel=0.02, abs=0.01)
            assert cells[3].startswith(f">= {s.target:g}x ")
        if s.latency:
            assert 0 < float(cells[5]) <= float(cells[6]), cells
        else:
            assert cells[5:7] == ["-", "-"]
    summary = proc.stdout.split("Targets (issue: one queue, two processes):")[1]
    assert summary.count("target >=") == sum(s.target is not None for s in expected)
    assert summary.count("p50 ") == sum(s.latency and s.processes == 2 for s in expected)


def test_litequeue_adapter_round_trips_bytes_in_either_mode(tmp_path: Path) -> None:
    # litequeue 0.10 and later take str only: the adapter stores base64 text there.
    # Forcing that mode works with every version (each takes str), so both paths run.
    pytest.importorskip("litequeue")
    peers = _load("peers")

    class AsText(peers.LiteQueuePeer):  # type: ignore[name-defined,misc]
        STR_ONLY = True

    payloads = [bytes(range(256)) * 4, b"", b"\x00\xff"]
    for cls, sub in ((peers.LiteQueuePeer, "default"), (AsText, "text")):
        d = tmp_path / sub
        d.mkdir()
        q = cls(str(d))
        try:
            q.put(payloads[0])
            q.put_batch(payloads[1:])
            stored = q.q.conn.execute(f"SELECT data FROM {q.q.table}").fetchall()
            assert all(isinstance(r[0], str if cls.STR_ONLY else bytes) for r in stored)
            assert q.get() == payloads[0]
            assert q.rest() == payloads[1:]
        finally:
            q.close()
    assert ("base64" in peers.LiteQueuePeer.NAME) == peers.LiteQueuePeer.STR_ONLY


def test_roles_table_bounds_a_row_that_timed_out() -> None:
    # A peer not done in time shows "< rate" and "> ratio"; that bound meets a target only
    # when it already reaches it.
    mod = _load("bench_roles")
    by_system = {s.system: s for s in mod.setups() if s.processes == 2}
    ours = mod.Row(by_system["ours"], rate=10_000.0)
    slow = mod.Row(by_system["persistqueue-sqlite"], below=200.0, note="not done in 100 s")
    close = mod.Row(by_system["diskcache"], below=2_000.0, note="not done in 10 s")
    lines = mod.table([ours, slow, close])
    cells = [[c.strip() for c in ln.strip("|").split("|")] for ln in lines[2:5]]
    assert cells[1][1:4] == ["< 200", "> 50.00x", ">= 10x met"]
    assert cells[1][7] == "not done in 100 s"
    assert cells[2][1:4] == ["< 2,000", "> 5.00x", ">= 10x unknown (timed out)"]
