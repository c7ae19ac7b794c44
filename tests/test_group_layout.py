"""The group's on-disk names (aiodiskqueue/_format/group.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from aiodiskqueue._format.group import (
    GroupMeta,
    create_group_meta,
    group_dir,
    group_layout,
    group_names,
    is_group,
    parse_shard,
    read_group_meta,
    shard_name,
)
from aiodiskqueue.errors import GroupFormatError


def test_names(tmp_path: Path) -> None:
    lay = group_layout(tmp_path, "events")
    assert lay.path == group_dir(tmp_path, "events") == str(tmp_path / "events.group")
    assert shard_name(3) == "000003" and shard_name(1234567) == "1234567"
    assert parse_shard("000003") == 3 and parse_shard("1234567") == 1234567
    for other in ("00003", "group.meta", "member-ab.lock", ".removing-000003", "000003x"):
        assert parse_shard(other) is None
    assert lay.shard_layout(3).directory == str(tmp_path / "events.group" / "000003")
    assert lay.shard_layout(3).name == "events"
    with pytest.raises(ValueError, match="-1"):
        shard_name(-1)


def test_listing(tmp_path: Path) -> None:
    lay = group_layout(tmp_path, "events")
    assert not is_group(tmp_path, "events") and lay.shards() == {} and lay.members() == {}
    for n in (2, 0, 10):
        os.makedirs(lay.shard_path(n))
    os.makedirs(lay.removing_path(5))
    Path(lay.member_path("ab12")).touch()
    Path(lay.path, "notes.txt").touch()
    assert is_group(tmp_path, "events")
    assert list(lay.shards()) == [0, 2, 10]
    assert lay.members() == {"ab12": lay.member_path("ab12")}
    assert lay.removing() == [lay.removing_path(5)]
    (tmp_path / "plain.diskqueue.meta.dat").touch()
    (tmp_path / "file.group").touch()  # a file, not a group directory
    assert group_names(tmp_path) == ["events"]


def test_meta_created_once(tmp_path: Path) -> None:
    lay = group_layout(tmp_path, "events")
    assert read_group_meta(tmp_path, "events") is None
    first = GroupMeta(1024, 0, 512)
    assert create_group_meta(lay, first) == first
    # A second creator gets the stored one back, whatever it asked for.
    assert create_group_meta(lay, GroupMeta(2048, 0, 512)) == first
    assert read_group_meta(tmp_path, "events") == first
    assert GroupMeta(2048, 0, 512).differences(first) == [("max_bytes_per_file", 2048, 1024)]
    assert [p for p in os.listdir(lay.path) if p.endswith(".tmp")] == []


@pytest.mark.parametrize(("data", "words"), [
    (b'{"format": "aiodiskqueue-group", "version": 2, "max_bytes_per_file": 1, '
     b'"min_msg_size": 0, "max_msg_size": 1}', "format version 2"),
    (b"\x00\x00garbage", "not a group meta file"),
    (b'{"format": "aiodiskqueue-group", "version": 1}', "bad options"),
    (b"[1, 2]", "not a group meta file"),
], ids=["version", "garbage", "options", "not-an-object"])
def test_meta_damaged(tmp_path: Path, data: bytes, words: str) -> None:
    lay = group_layout(tmp_path, "events")
    os.makedirs(lay.path)
    Path(lay.meta_path).write_bytes(data)
    with pytest.raises(GroupFormatError, match=words) as info:
        read_group_meta(tmp_path, "events")
    assert info.value.path == lay.meta_path
    with pytest.raises(GroupFormatError):
        create_group_meta(lay, GroupMeta(1, 0, 1))
    assert Path(lay.meta_path).read_bytes() == data  # nothing stored touched
