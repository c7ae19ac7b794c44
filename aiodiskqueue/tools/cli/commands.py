"""The commands on a directory or a queue: ``ls``, ``inspect``, ``verify``, ``stats``,
``repair``. ``inspect``, ``verify`` and ``stats`` take a plain queue (:mod:`.queues`)
or a queue group (:mod:`.groups`); ``dump`` is in :mod:`.dump`."""

from __future__ import annotations

import argparse
from typing import Any

from ..._format.group import group_names
from ..._format.layout import Layout, queue_names
from ..._format.lock import lock_holder
from ...errors import QueueLocked
from ..group import group_files
from ..inspect import analyze, total_bytes
from ..repair import plan_repair, repair
from .groups import group_entry, inspect_group, stats_group, verify_group
from .output import (
    EXIT_OK,
    EXIT_PROBLEMS,
    CliError,
    json_doc,
    out,
    pids,
    print_problems,
    progress,
    table,
)
from .queues import inspect_queue, ls_entry, stats_queue, verify_queue
from .target import find_group, find_queue, scan


def _roles_cell(roles: dict[str, Any]) -> str:
    p, c = roles["producer"], roles["consumer"]
    if p is None and c is None:
        return "-"
    return f"{'-' if p is None else p['pid']}/{'-' if c is None else c['pid']}"


def _ls_row(e: dict[str, Any], label: str) -> list[str]:
    return [
        label + ("" if e["meta"] == "ok" else f" (meta {e['meta']})"),
        str(e["depth"]), str(e["segments"]), str(e["bytes"]),
        f"{e['read_file_num']},{e['read_pos']}", f"{e['write_file_num']},{e['write_pos']}",
        str(e["bad_files"]),
        "-" if e["locked_by_pid"] is None else str(e["locked_by_pid"]),
        _roles_cell(e["roles"]),
    ]


def cmd_ls(args: argparse.Namespace) -> int:
    """List every queue and every group in a directory."""
    directory = args.directory
    try:
        names = queue_names(directory)
    except (FileNotFoundError, NotADirectoryError):
        raise CliError(f"not a directory: {directory}") from None
    groups = group_names(directory)
    entries = [{**ls_entry(Layout(directory, n)), "kind": "queue"} for n in names]
    for g in groups:
        group = group_files(directory, g)
        if group is not None:  # unless removed since the listing
            entries.append(group_entry(group))
    entries.sort(key=lambda e: (e["name"], e["kind"]))
    if args.json:
        json_doc(entries)
        return EXIT_OK
    if not entries:
        out(f"no queues in {directory}")
        return EXIT_OK
    rows = [["NAME", "DEPTH", "SEGMENTS", "BYTES", "READ", "WRITE", "BAD", "LOCKED BY",
             "PRODUCER/CONSUMER"]]
    for e in entries:
        if e["kind"] == "queue":
            rows.append(_ls_row(e, e["name"]))
            continue
        # A group: one line with its totals, then its shards (named GROUP/SHARD).
        label = f"{e['name']} (group, {len(e['shards'])} shard(s))"
        if e["meta"] != "ok":
            label += f" (group meta {e['meta']})"
        if e["members"]:
            label += f" (group consumers: pids {pids(e['members'])})"
        if e["damaged_shards"]:
            label += f" (not a directory: {', '.join(e['damaged_shards'])})"
        rows.append([label, str(e["depth"]),
                     str(e["segments"]), str(e["bytes"]), "-", "-", str(e["bad_files"]), "-",
                     f"{pids(e['producers'])}/{pids(e['consumers'])}"])
        rows.extend(_ls_row(s, f"  {e['name']}/{s['shard']:06d}") for s in e["shards"])
    table(rows, right=frozenset({1, 2, 3, 6}))
    return EXIT_OK


def cmd_inspect(args: argparse.Namespace) -> int:
    """Show the meta file, every segment, and what is read and unread (a group: each
    shard's summary and the total)."""
    group = find_group(args)
    if group is not None:
        return inspect_group(args, group)
    return inspect_queue(args, find_queue(args))


def cmd_verify(args: argparse.Namespace) -> int:
    """Scan every record; exit 0 when sound, 1 listing each problem (a group: every shard)."""
    group = find_group(args)
    if group is not None:
        return verify_group(args, group)
    return verify_queue(args, find_queue(args))


def cmd_stats(args: argparse.Namespace) -> int:
    """Depth and put/get rates from successive snapshots of the files."""
    group = find_group(args)
    if group is not None:
        return stats_group(args, group)
    return stats_queue(args, find_queue(args))


def cmd_repair(args: argparse.Namespace) -> int:
    """Make a damaged queue consistent again, keeping every readable record."""
    lay = find_queue(args)
    pid = lock_holder(lay.lock_path)  # every holder, a role being opened too
    if pid is not None:
        raise CliError(f"refusing to repair {lay.name!r}: it is open in process {pid}")
    if args.dry_run:
        plan = plan_repair(scan(args, lay)[0])
        if args.json:
            json_doc({"name": lay.name, "dry_run": True, "needed": plan.needed,
                      "problems": [p.to_dict() for p in plan.report.problems],
                      "actions": [a.to_dict() for a in plan.actions]})
        elif plan.needed:
            out(f"{lay.name}: {len(plan.actions)} repair(s) needed (dry run, nothing changed)")
            print_problems(plan.report.problems)
            out("would:")
            for a in plan.actions:
                out(f"  {a}")
        else:
            out(f"{lay.name}: nothing to repair")
        return EXIT_PROBLEMS if plan.needed else EXIT_OK
    try:
        with progress(total_bytes(lay), not args.no_progress, f"scanning {lay.name}") as cb:
            plan, done = repair(lay, args.min_msg_size, args.max_msg_size, cb)
    except QueueLocked as exc:
        raise CliError(f"refusing to repair {lay.name!r}: {exc}") from None
    after = analyze(lay, args.min_msg_size, args.max_msg_size)
    if args.json:
        json_doc({"name": lay.name, "dry_run": False, "needed": plan.needed,
                  "problems": [p.to_dict() for p in plan.report.problems],
                  "actions": [a.to_dict() for a in plan.actions], "done": done,
                  "sound": after.sound,
                  "remaining": [p.to_dict() for p in after.problems]})
    elif not plan.needed:
        out(f"{lay.name}: nothing to repair")
    else:
        out(f"{lay.name}: repaired")
        for d in done:
            out(f"  {d}")
        if after.sound:
            out(f"  now sound: {after.depth} unread message(s)")
        else:
            out("  still not sound:")
            print_problems(after.problems)
    return EXIT_OK if after.sound else EXIT_PROBLEMS
