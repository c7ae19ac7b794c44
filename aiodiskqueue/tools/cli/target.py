"""The queue or queue group a command's arguments name, and scanning a queue."""

from __future__ import annotations

import argparse
import dataclasses
import os

from ..._format.access import check_dir, queue_modes
from ..._format.layout import Layout
from ...errors import GroupNameConflict
from ..group import GroupFiles, check_one_kind, conflict_message, group_files
from ..holders import RolesState, queue_exists
from ..inspect import QueueReport, analyze_live, total_bytes
from .output import CliError, progress


def find_group(args: argparse.Namespace) -> GroupFiles | None:
    """The group ``args.name`` names in ``args.directory``, or None for a plain queue.

    Raises CliError if the directory is missing or the name is both a queue and a group.
    """
    directory = args.directory
    check_dir(directory, os.R_OK | os.X_OK)  # else a queue it may not see looks like none
    if not os.path.isdir(directory):
        raise CliError(f"not a directory: {directory}")
    try:
        check_one_kind(directory, args.name)
    except GroupNameConflict:
        raise CliError(conflict_message(directory, args.name)) from None
    return group_files(directory, args.name)


def find_queue(args: argparse.Namespace) -> Layout:
    """The plain queue ``args.name`` in ``args.directory`` (with ``--file-mode`` if given).

    Raises CliError if the name is a queue group or no such queue exists, and as
    :func:`find_group` does.
    """
    directory = args.directory
    group = find_group(args)
    if group is not None:
        raise CliError(
            f"{args.name!r} is a queue group of {len(group.shards)} shard(s); "
            f"'{args.command}' works on one queue: each shard is the queue {args.name!r} in "
            f"its directory, e.g. '{args.command} {os.path.join(group.path, '000000')} "
            f"{args.name}' ('ls {directory}' lists the shards)")
    lay = queue_modes(Layout(directory, args.name))
    if getattr(args, "file_mode", None) is not None:
        lay = dataclasses.replace(lay, file_mode=args.file_mode)
    if not queue_exists(lay):
        raise CliError(f"no queue named {args.name!r} in {directory}")
    return lay


def scan(args: argparse.Namespace, lay: Layout) -> tuple[QueueReport, RolesState]:
    """Analyze the queue ``lay`` with the arguments' message sizes, with a progress bar
    unless ``--no-progress``."""
    with progress(total_bytes(lay), not args.no_progress, f"scanning {lay.name}") as cb:
        return analyze_live(lay, args.min_msg_size, args.max_msg_size, cb)
