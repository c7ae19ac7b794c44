"""Power cuts on a simulated disk that forgets what was not synced (tests/powercut/).

Each cut runs a workload on a FUSE filesystem that keeps what processes see apart
from what would survive a power cut, SIGKILLs it at a random moment, freezes the
filesystem and makes crash images of four kinds (durable only; in-order prefix;
torn pages; zero-filled tails), and opens and drains each: the durability contract
of the README must hold in every one. The self-tests prove the checker can fail.

Needs /dev/fuse, fusermount3 (Debian's fuse3, installed by dev.sh and .ci/run) and
mfusepy (the dev extra). Without them these tests fail where ``CI=true`` and are
skipped, with the reason, elsewhere. ``AIODISKQUEUE_POWERCUTS=N`` runs N cuts per
workload (default 25; fewer for the workloads that start more processes, see
``FEWER``); ``bench/powercut.py`` runs any number and prints a table.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "powercut"))

import harness

CUTS = int(os.environ.get("AIODISKQUEUE_POWERCUTS", "25"))
# The workloads that start more processes (a consumer process, a broker, pyspark's
# imports) cost 2-4 s a cut: fewer by default, AIODISKQUEUE_POWERCUTS for all alike.
FEWER = {"procs": 6, "broker": 4, "brokerdefault": 2, "spark": 3}


def cuts_for(wl: str) -> int:
    """The number of cuts of ``wl`` in this run."""
    if "AIODISKQUEUE_POWERCUTS" in os.environ:
        return CUTS
    return FEWER.get(wl, CUTS)

SEED = int(os.environ.get("AIODISKQUEUE_POWERCUT_SEED", "20261128"))

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[harness.Mount]:
    """The simulated disk, mounted for the module."""
    problem = harness.fuse_problem()
    if problem is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"power-cut tests need FUSE, and CI must run them: {problem}")
        pytest.skip(f"power-cut tests need FUSE: {problem}")
    base = tmp_path_factory.mktemp("powercut")
    with harness.mounted(str(base / "mnt")) as m:
        yield m


@pytest.fixture(autouse=True)
def _quiet() -> Iterator[None]:
    """Recovery's warnings are expected on crash images: keep the log readable."""
    logger = logging.getLogger("aiodiskqueue")
    level = logger.level
    logger.setLevel(logging.ERROR)
    yield
    logger.setLevel(level)


def run(sim: harness.Mount, tmp_path: Path, wl: str, cuts: int, seed: int,
        **kw: object) -> list[harness.Cut]:
    out = []
    for i in range(cuts):
        out.append(harness.run_cut(sim, wl, seed * 1000 + i, str(tmp_path / f"cut{i}"),
                                   **kw))  # type: ignore[arg-type]
    return out


def findings(cuts: list[harness.Cut], tmp_path: Path,
             apart: frozenset[str] = frozenset()) -> list[str]:
    """One line per violation, but those of the kinds ``apart`` (each asserted by a
    test of its own); the cuts that showed one are copied where pytest's rotation of
    temporary directories leaves them (named in the first line)."""
    found = [f"seed {c.seed} ({c.ran:.3f} s) {o.kind}: {v}: {d}" if v else
             f"seed {c.seed} {o.kind}: hang"
             for c in cuts for o in c.outcomes
             for v, d in (o.violations or ([("", "")] if o.hung else []))
             if v not in apart]
    if found:
        keep = tempfile.mkdtemp(prefix="powercut-findings-")
        for i, c in enumerate(cuts):
            if any(o.violations or o.hung for o in c.outcomes):
                shutil.copytree(tmp_path / f"cut{i}", os.path.join(keep, f"cut{i}"),
                                symlinks=True)
        found.insert(0, f"crash images and dumps kept in {keep}")
    return found


@pytest.mark.parametrize("wl", ["sync1", "default", "ack", "purge", "repair", "empty",
                                "roles", "procs", "broker", "brokerdefault",
                                pytest.param("spark", marks=pytest.mark.spark)])
def test_contract_holds_in_every_crash_image(sim: harness.Mount, tmp_path: Path,
                                             wl: str) -> None:
    n = cuts_for(wl)
    cuts = run(sim, tmp_path, wl, n, SEED)
    print(f"\n{harness.table(cuts)}")
    assert sum(len(c.outcomes) for c in cuts) >= n * len(harness.KINDS)
    assert findings(cuts, tmp_path) == []


def test_dead_letters_survive_with_default_sync(sim: harness.Mount, tmp_path: Path) -> None:
    """AckQueue with the default sync settings: a message whose put a completed sync()
    covered, then dead-lettered (timed out or requeued on its last attempt), must be
    in the queue or the dead-letter queue after the cut. Kept apart: the dead letter
    must be durable before the ack log records the message as done."""
    cuts = run(sim, tmp_path, "ackdefault", CUTS, SEED)
    print(f"\n{harness.table(cuts)}")
    assert findings(cuts, tmp_path) == []


def test_self_test_acknowledging_before_writing_is_caught(sim: harness.Mount,
                                                          tmp_path: Path) -> None:
    cuts = run(sim, tmp_path, "liar", 3, SEED)
    for c in cuts:
        assert any(v == "lost" for v, _ in c.outcomes[0].violations), c


def test_self_test_a_dropped_synced_write_is_caught(sim: harness.Mount,
                                                    tmp_path: Path) -> None:
    # The 5th fsync of each cut answers success but its writes never reach the disk.
    cuts = run(sim, tmp_path, "produce", 3, SEED, drop_sync=5, kinds=("durable",),
               timeout=3.0)
    for c in cuts:
        assert c.dropped, "the fault was not injected"
        durable = c.outcomes[0]
        assert durable.kind == "durable"
        # Caught as a violation, never a hang: the checker drains while qsize() says a
        # message is left, and the depth follows what reading finds.
        assert durable.violations and not durable.hung, c


def test_crash_images_differ_from_what_processes_saw(sim: harness.Mount,
                                                     tmp_path: Path) -> None:
    # The simulated disk forgets: with the default sync settings the durable image
    # holds less than processes saw, and the zero-filled kind has each file at the
    # size processes saw, zeros past what was fsynced.
    import pickle
    import random

    import images

    cut = harness.run_cut(sim, "default", SEED, str(tmp_path / "c"), max_run=0.4)
    assert cut.ran > 0.05  # the seed's cut comes after some unsynced writes
    with open(tmp_path / "c" / "dump.pkl", "rb") as f:
        dump = pickle.load(f)
    rng = random.Random(0)
    durable = images.make_image(dump, "durable", rng)[1]
    zeros = images.make_image(dump, "zeros", rng)[1]
    grown = [ino for ino, seen in dump["visible_data"].items()
             if len(seen) > len(durable.get(ino, b""))]
    assert grown
    for ino in grown:
        old, seen = durable.get(ino, b""), dump["visible_data"][ino]
        assert zeros[ino] == old + bytes(len(seen) - len(old))
