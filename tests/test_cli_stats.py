"""``stats``, the entry points, and the optional progress bar."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import struct
import subprocess
import sys
import termios
import tomllib
from pathlib import Path

from conftest import REPO_ROOT as REPO
from conftest import copy_queue

from aiodiskqueue import DiskQueue
from aiodiskqueue._format.layout import Layout
from aiodiskqueue.tools.follow import Watcher


def _env(**extra: str) -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(REPO), **extra)


def cli(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "aiodiskqueue", *map(str, args)],
                          capture_output=True, text=True, timeout=120, cwd=REPO, env=_env(),
                          check=False)


# ---------------------------------------------------------------------- stats


def test_stats_once(gofx: Path, tmp_path: Path) -> None:
    d = copy_queue(gofx, "partial", tmp_path)
    res = cli("stats", d, "partial", "--json")
    assert res.returncode == 0
    (line,) = res.stdout.splitlines()
    s = json.loads(line)
    assert (s["name"], s["depth"], s["put_rate"], s["get_rate"]) == ("partial", 850, None, None)
    assert (s["read_file_num"], s["read_pos"], s["write_file_num"], s["write_pos"]) == \
        (5, 741, 38, 531)
    text = cli("stats", d, "partial").stdout.splitlines()
    assert text[0].split()[:4] == ["TIME", "DEPTH", "PUT/S", "GET/S"]
    assert text[1].split()[1:5] == ["850", "-", "-", "33466"]


def test_stats_watch_stops_after_count(gofx: Path, tmp_path: Path) -> None:
    d = copy_queue(gofx, "fixture", tmp_path)
    res = cli("stats", d, "fixture", "--watch", "--interval", "0.01", "--count", "3", "--json")
    assert res.returncode == 0
    rows = [json.loads(x) for x in res.stdout.splitlines()]
    assert [r["depth"] for r in rows] == [863, 863, 863]
    assert rows[0]["put_rate"] is None
    assert [(r["put_rate"], r["get_rate"]) for r in rows[1:]] == [(0.0, 0.0), (0.0, 0.0)]


async def test_watcher_rates_from_successive_snapshots(tmp_path: Path) -> None:
    async with DiskQueue(tmp_path, "rates", max_bytes_per_file=500) as q:
        await q.put_many([b"x" * 20 for _ in range(10)])
        w = Watcher(Layout(str(tmp_path), "rates"))
        first = w.sample(100.0)
        assert (first.depth, first.put_rate, first.get_rate) == (10, None, None)
        await q.put_many([b"y" * 20 for _ in range(100)])  # rolls over several files
        s = w.sample(102.0)
        assert (s.depth, s.put_rate, s.get_rate) == (110, 50.0, 0.0)
        for _ in range(40):
            await q.get()
        await q.sync()  # the meta carries the read position the watcher sees
        s = w.sample(106.0)
        assert (s.depth, s.put_rate, s.get_rate) == (70, 0.0, 10.0)
        st = q.statistics()
        assert s.write == (st.write_file_num, st.write_pos)
        assert s.read == (st.read_file_num, st.read_pos)


def test_stats_unknown_queue(tmp_path: Path) -> None:
    res = cli("stats", tmp_path, "ghost", "--watch", "--count", "2")
    assert res.returncode == 2 and "'ghost'" in res.stderr


# ---------------------------------------------------------------------- entry points, progress


def test_console_script_target_and_module_entry() -> None:
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["aiodiskqueue"] == "aiodiskqueue.tools.cli:main"
    code = "from aiodiskqueue.tools.cli import main; raise SystemExit(main(['--version']))"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=REPO, env=_env(), timeout=60, check=False)
    assert res.returncode == 0 and res.stdout.startswith("aiodiskqueue ")
    res = cli("--help")
    assert res.returncode == 0
    for command in ("ls", "inspect", "dump", "verify", "repair", "stats"):
        assert command in res.stdout
    # The benchmark report lives in the source checkout (bench/report.py), not in the
    # installed command.
    assert "bench" not in res.stdout
    assert cli().returncode == 2  # a command is required


def test_works_without_tqdm(gofx: Path, tmp_path: Path) -> None:
    d = copy_queue(gofx, "fixture", tmp_path)
    code = ("import sys; sys.modules['tqdm'] = None\n"
            "from aiodiskqueue.tools.cli import main\n"
            f"raise SystemExit(main(['verify', {str(d)!r}, 'fixture']))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=REPO, env=_env(), timeout=60, check=False)
    assert res.returncode == 0 and "sound" in res.stdout, res.stderr


def _stderr_on_a_terminal(*args: object) -> tuple[subprocess.CompletedProcess[bytes], bytes]:
    master, slave = pty.openpty()
    # A fresh pty is 0 columns wide, where tqdm draws nothing: size it like a terminal.
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    try:
        res = subprocess.run([sys.executable, "-m", "aiodiskqueue", *map(str, args)],
                             stdout=subprocess.PIPE, stderr=slave, cwd=REPO,
                             env=_env(TERM="xterm-256color"), timeout=60, check=False)
    finally:
        os.close(slave)
    seen = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the terminal is closed and drained
            break
        if not chunk:
            break
        seen += chunk
    os.close(master)
    return res, seen


def test_progress_bar_only_on_a_terminal(gofx: Path, tmp_path: Path) -> None:
    # The bar is drawn by tqdm (the extra ``cli``); running without it is tested above.
    import tqdm  # type: ignore[import-untyped]  # noqa: F401
    d = copy_queue(gofx, "multi", tmp_path)
    res, seen = _stderr_on_a_terminal("verify", d, "multi")
    assert res.returncode == 0 and b"sound" in res.stdout
    assert b"scanning multi" in seen and b"B/s" in seen  # tqdm drew (and then erased) its bar
    res, seen = _stderr_on_a_terminal("verify", d, "multi", "--no-progress")
    assert res.returncode == 0 and seen == b""
