"""Shared fixtures: the go-diskqueue fixture directory, a queue factory that always closes,
a small tmpfs."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import is_hypothesis_test

from aiodiskqueue import AckQueue, DiskQueue
from aiodiskqueue.ack.clock import ManualClock

REPO_ROOT = Path(__file__).resolve().parent.parent
FIXTURES_DIR = Path(__file__).resolve().parent / "fixtures" / "go-diskqueue"
FIXTURES_ENV = "AIODISKQUEUE_FIXTURES"

MakeQueue = Callable[..., Awaitable[DiskQueue]]
CopyFixture = Callable[[str, Path], list[Path]]


def locate_fixtures() -> Path:
    """The go-diskqueue fixture directory: ``$AIODISKQUEUE_FIXTURES`` or the copy in
    ``tests/fixtures/go-diskqueue`` that ships with the repository."""
    env = os.environ.get(FIXTURES_ENV)
    return Path(env) if env else FIXTURES_DIR


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    """Directory of queues written by go-diskqueue (fails, never skips, when missing)."""
    return require_fixtures()


def copy_fixture_files(src: Path, name: str, dest: Path) -> list[Path]:
    """Copy every file of queue ``name`` from ``src`` into ``dest``; return the copies."""
    dest.mkdir(parents=True, exist_ok=True)
    copied = []
    for entry in sorted(src.iterdir()):
        if entry.name.startswith(f"{name}.diskqueue."):
            copied.append(Path(shutil.copy2(entry, dest / entry.name)))
    if not copied:
        raise FileNotFoundError(f"no files of queue {name!r} in {src}")
    return copied


def copy_queue(src: Path, name: str, dest: Path) -> Path:
    """Copy queue ``name``'s files from ``src`` into ``dest``; return ``dest``."""
    copy_fixture_files(src, name, dest)
    return dest


def require_fixtures() -> Path:
    """The fixture directory, failing the test (never skipping) when it is missing."""
    path = locate_fixtures()
    if not (path / "README.md").is_file():
        pytest.fail(f"go-diskqueue fixtures not found at {path}; set {FIXTURES_ENV}")
    return path


@pytest.fixture(scope="session")
def gofx() -> Path:
    """Same as ``fixtures_dir`` (the name the command line tests use)."""
    return require_fixtures()


@pytest.fixture
def copy_fixture(fixtures_dir: Path) -> CopyFixture:
    """``copy_fixture(name, dest)``: copy a go-diskqueue fixture queue into ``dest``."""

    def _copy(name: str, dest: Path) -> list[Path]:
        return copy_fixture_files(fixtures_dir, name, dest)

    return _copy


@pytest.fixture
async def make_queue(tmp_path: Path) -> AsyncIterator[MakeQueue]:
    """``await make_queue(directory=tmp_path, name="q", **options)``; closed at teardown."""
    opened: list[DiskQueue] = []

    async def _make(directory: Path | None = None, name: str = "q", **options: Any) -> DiskQueue:
        q = await DiskQueue.open(directory if directory is not None else tmp_path, name,
                                 **options)
        opened.append(q)
        return q

    yield _make
    for q in reversed(opened):
        await q.aclose()


@pytest.fixture
def pure_python(monkeypatch: pytest.MonkeyPatch) -> None:
    """Write through the Python I/O thread only (for tests that patch ``os`` calls
    in the store; the native write lane does not go through them)."""
    monkeypatch.setenv("AIODISKQUEUE_PURE_PYTHON", "1")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark ``jvm`` every test that takes the ``spark`` fixture (the local SparkSession):
    the CI matrix selects on it (noxfile.py, ``MATRIX_PYTEST``). Mark ``property`` every
    Hypothesis test, for a deeper search on its own (``helpers_props.examples``)."""
    for item in items:
        if "spark" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.jvm)
        if is_hypothesis_test(getattr(item, "function", None)):
            item.add_marker(pytest.mark.property)


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One local[2] SparkSession for the whole test run, with the ``diskqueue`` format
    registered (pyspark is imported only by the tests that use it)."""
    from pyspark.sql import SparkSession

    import aiodiskqueue.spark as dqspark

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    session = (
        SparkSession.builder.master("local[2]")
        .appName("aiodiskqueue-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.streaming.stopTimeout", "30s")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    dqspark.register(session)
    yield session
    session.stop()


MakeAck = Callable[..., Awaitable[AckQueue]]


@pytest.fixture
def clock() -> ManualClock:
    """Time for AckQueue tests: deadlines and due times move only when a test advances it."""
    return ManualClock()


@pytest.fixture
async def make_ack(tmp_path: Path, clock: ManualClock) -> AsyncIterator[MakeAck]:
    """``await make_ack(**options)`` opens ``jobs`` in tmp_path with the manual clock."""
    opened: list[AckQueue] = []

    async def _make(**options: Any) -> AckQueue:
        options.setdefault("clock", clock)
        options.setdefault("msg_timeout", 10.0)
        q = await AckQueue.open(options.pop("directory", tmp_path), options.pop("name", "jobs"),
                                **options)
        opened.append(q)
        return q

    yield _make
    for q in reversed(opened):
        await q.aclose()


def _mount(mnt: Path, *opts: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join(("size=1m", *opts)),
                           "tmpfs", str(mnt)], capture_output=True, check=False)


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A fresh 1 MiB tmpfs, unmounted afterwards."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    try:
        r = _mount(mnt)
        err = r.stderr.decode(errors="replace").strip()
    except OSError as exc:  # no mount binary
        r, err = None, str(exc)
    if r is None or r.returncode != 0:
        why = (f"cannot mount a 1 MiB tmpfs on {mnt} ({err}); the tests on a tmpfs need root "
               "(set AIODISKQUEUE_NO_MOUNT=1 to skip them)")
        if os.environ.get("AIODISKQUEUE_NO_MOUNT") == "1":
            pytest.skip(why)
        pytest.fail(why)
    try:
        yield mnt
    finally:
        # Lazily if still busy (a queue a failed test left open): never left mounted.
        if subprocess.run(["umount", str(mnt)], capture_output=True, check=False).returncode:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True, check=False)
