"""The power-cut checker's rules that need no simulated disk (tests/powercut/harness.py):
what a Spark job may leave after a cut, and what the broker's default settings promise."""

from __future__ import annotations

import collections
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "powercut"))

import harness


def acks(*lines: str) -> harness.Acks:
    return harness.Acks(list(lines))


def back(job: int, *ns: int) -> collections.Counter[tuple[int, int]]:
    return collections.Counter((job, n) for n in ns)


# Job 1: 5 messages in two staged files, ending at message 3 and 5.
JOB = ["T 1 0", "T 1 1", "T 1 2", "T 1 3", "T 1 4", "J 1 5", "S 1 3 5"]


@pytest.mark.parametrize("ns", [(), (0, 1, 2), (0, 1, 2, 3, 4)],
                         ids=["nothing", "first-file", "all"])
def test_a_job_cut_during_its_commit_may_leave_nothing_all_or_whole_files(
        ns: tuple[int, ...]) -> None:
    assert harness._spark_jobs(acks(*JOB, "C 1"), back(1, *ns)) == []


@pytest.mark.parametrize("ns", [(0, 1), (0, 1, 2, 4), (1, 2, 3)],
                         ids=["mid-file", "gap", "not-a-prefix"])
def test_a_partial_job_other_than_whole_staged_files_is_caught(ns: tuple[int, ...]) -> None:
    found = harness._spark_jobs(acks(*JOB, "C 1"), back(1, *ns))
    assert [v for v, _ in found] == ["partial"]


def test_a_job_whose_commit_had_not_begun_must_leave_nothing() -> None:
    assert harness._spark_jobs(acks(*JOB), back(1)) == []
    found = harness._spark_jobs(acks(*JOB), back(1, 0, 1, 2))
    assert [v for v, _ in found] == ["uncommitted"]


def test_a_committed_job_is_required_whole() -> None:
    a = acks(*JOB, "C 1", *(f"A 1 {n}" for n in range(5)))
    assert a.required("spark") == {(1, n) for n in range(5)}


def test_the_broker_with_sync_every_1_requires_what_was_published_not_finished() -> None:
    a = acks("T 0 0", "A 0 0", "T 0 1", "A 0 1", "D 0 0", "G 0 0", "T 0 2")
    assert a.required("broker") == {(0, 1)}
    assert a.required("brokerdefault") == set()


def test_a_job_left_as_whole_staged_files_is_counted_as_the_documented_window() -> None:
    allowed: list[tuple[str, str]] = []
    assert harness._spark_jobs(acks(*JOB, "C 1"), back(1, 0, 1, 2), allowed) == []
    assert [a for a, _ in allowed] == ["whole staged files of a cut commit"]
    out = harness.Outcome("prefix", allowed=allowed)
    cut = harness.Cut("spark", 1, 0.1, [out], [])
    header, _, row = harness.table([cut]).splitlines()
    assert header.endswith("| hangs | allowed: whole staged files of a cut commit |")
    assert row == "| spark | prefix | 1 | 1 | 0 | 0 | 1 |"
