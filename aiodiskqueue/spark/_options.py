"""Options of the ``diskqueue`` Spark source and sink, validated once on the driver.

Spark hands options over as a case-insensitive mapping of strings. Every key is
also accepted in snake case (``max_bytes_per_file`` for ``maxBytesPerFile``).
A bad or missing option raises :class:`OptionError` naming it, before any
Spark job starts.
"""

from __future__ import annotations

import difflib
import fnmatch
import os
from collections.abc import Mapping
from dataclasses import dataclass

from .._core.options import DEFAULTS, MiB, Options, check_mode, check_name
from .._format.group import group_layout, parse_shard
from .._format.layout import DIR_MODE, FILE_MODE, Layout
from ..errors import DiskQueueError

FORMATS = ("raw", "nsq")
OPEN_COST = 4 * MiB  # the smallest share of a read split for parallelism, unless asked


class OptionError(DiskQueueError, ValueError):
    """A ``diskqueue`` option is missing or has a value the source cannot use."""

    def __init__(self, option: str, problem: str) -> None:
        super().__init__(f"diskqueue: option '{option}' {problem}")
        self.option = option


def _norm(key: str) -> str:
    return key.replace("_", "").lower()


def _get(opts: Mapping[str, str], key: str) -> str | None:
    want = _norm(key)
    for k, v in opts.items():
        if _norm(k) == want:
            return None if v is None else str(v)
    return None


def _int(opts: Mapping[str, str], key: str, default: int | None, lo: int) -> int | None:
    raw = _get(opts, key)
    if raw is None:
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise OptionError(key, f"must be an integer, got {raw!r}") from None
    if value < lo:
        raise OptionError(key, f"must be >= {lo}, got {value}")
    return value


QUEUE_OPTIONS = {"minMsgSize": "min_msg_size", "maxMsgSize": "max_msg_size",
                 "maxBytesPerFile": "max_bytes_per_file"}
"""The source's options that are queue options, and their names in :class:`Options`."""


def _queue_options(opts: Mapping[str, str]) -> Options:
    """The queue options given, checked by :class:`Options` (their one definition) and
    reported under the source's names.

    Raises OptionError naming the option and the bad value.
    """
    given = {}
    for key, field in QUEUE_OPTIONS.items():
        value = _int(opts, key, None, 0)
        if value is not None:
            given[field] = value
    try:
        return Options.from_keywords("diskqueue", given)
    except (TypeError, ValueError) as exc:
        problem = str(exc)
        key = next((k for k, f in QUEUE_OPTIONS.items() if problem.startswith(f)), "maxMsgSize")
        for k, f in QUEUE_OPTIONS.items():
            problem = problem.replace(f, k)
        raise OptionError(key, problem.removeprefix(key).strip()) from None


def _float(opts: Mapping[str, str], key: str, default: float) -> float:
    raw = _get(opts, key)
    if raw is None:
        return default
    try:
        value = float(raw.strip())
    except ValueError:
        raise OptionError(key, f"must be a number of seconds, got {raw!r}") from None
    if not 0 <= value < float("inf"):
        raise OptionError(key, f"must be a finite number >= 0, got {raw!r}")
    return value


def _mode(opts: Mapping[str, str], key: str, owner: int) -> int | None:
    """An octal permission mode (``660``, ``0660`` or ``0o660``), None if not given."""
    raw = _get(opts, key)
    if raw is None:
        return None
    try:
        value = int(raw.strip().lower().removeprefix("0o"), 8)
    except ValueError:
        raise OptionError(key, f"must be an octal mode such as {owner | owner >> 3:o}, got "
                               f"{raw!r}") from None
    try:
        return check_mode(key, value, owner)
    except ValueError as exc:
        raise OptionError(key, str(exc).removeprefix(key).strip()) from None


def _bool(opts: Mapping[str, str], key: str, default: bool = False) -> bool:
    raw = _get(opts, key)
    if raw is None:
        return default
    low = raw.strip().lower()
    if low in ("true", "1", "yes"):
        return True
    if low in ("false", "0", "no", ""):
        return False
    raise OptionError(key, f"must be true or false, got {raw!r}")


def is_glob(name: str) -> bool:
    """Whether ``name`` holds fnmatch wildcards."""
    return any(c in name for c in "*?[")


@dataclass(frozen=True, slots=True)
class SourceOptions:
    """The validated options; see the README's Spark section for each one."""

    path: str
    name: str
    format: str = "raw"
    consume: bool = False
    min_msg_size: int = DEFAULTS.min_msg_size
    max_msg_size: int = DEFAULTS.max_msg_size
    max_bytes_per_file: int = DEFAULTS.max_bytes_per_file
    max_bytes_per_partition: int = 128 * MiB
    min_partitions: int | None = None
    max_records_per_trigger: int | None = None
    max_bytes_per_trigger: int | None = None
    arrow: bool = True
    lock_wait: float = 10.0
    writer_id: str | None = None
    checkpoint_location: str | None = None
    fail_on_data_loss: bool = True
    remove_drained_after: float | None = None
    file_mode: int | None = None
    """``fileMode``: the mode of the files a write creates; None: those of the queue's
    files, owner-only for a new queue."""
    dir_mode: int | None = None
    group: bool = False  # ``name`` names a queue group (set by ``_group.resolve``)

    @property
    def many(self) -> bool:
        """Whether ``name`` selects several queues (a glob, or a group's shards): a
        busy one is then skipped for a while, not waited for."""
        return self.group or is_glob(self.name)

    def layout(self, queue: str) -> Layout:
        """Where the files of selected queue ``queue`` are: ``queue`` in ``path``, or for
        a group the shard ``queue`` names (``NAME/000003``).

        Raises ValueError if ``queue`` names no shard of the group.
        """
        if not self.group:
            return Layout(self.path, queue)
        prefix, _, shard = queue.rpartition("/")
        num = parse_shard(shard)
        if prefix != self.name or num is None:
            raise ValueError(f"{queue!r} names no shard of group {self.name!r}")
        return group_layout(self.path, self.name).shard_layout(num)

    @property
    def nsq(self) -> bool:
        """Whether payloads are nsqd messages (``format=nsq``)."""
        return self.format == "nsq"

    def partition_bytes(self, total: int) -> int:
        """Target bytes per partition for ``total`` bytes to read.

        Spark's own file sources do the same: ``maxBytesPerPartition`` at most,
        but small enough that ``minPartitions`` tasks share the work. Without
        ``minPartitions`` the share is spread over the driver's CPUs but not cut
        below 4 MiB (Spark's ``openCostInBytes``), so a small micro-batch stays
        one partition and one output file.
        """
        if self.min_partitions is None:
            share = max(OPEN_COST, -(-total // (os.cpu_count() or 1)))
        else:
            share = -(-total // self.min_partitions)
        return max(1, min(self.max_bytes_per_partition, share))

    def matches(self, queue: str) -> bool:
        """Whether queue ``queue`` is selected by the ``name`` option."""
        return fnmatch.fnmatchcase(queue, self.name)


def parse_options(opts: Mapping[str, str]) -> SourceOptions:
    """Validate the options Spark passed to the source.

    Raises OptionError naming the option that is missing or wrong.
    """
    path = _get(opts, "path")
    if not path:
        raise OptionError("path", "is required: the directory that holds the queue files")
    name = _get(opts, "name")
    if not name:
        raise OptionError("name", "is required: a queue name or a glob such as 'events-*'")
    try:
        check_name(name)
    except ValueError as exc:
        raise OptionError("name", str(exc)) from None
    fmt = (_get(opts, "format") or "raw").strip().lower()
    if fmt not in FORMATS:
        raise OptionError("format", f"must be one of {', '.join(FORMATS)}, got {fmt!r}")
    queue = _queue_options(opts)
    check_known(opts)
    arrow_raw = _get(opts, "arrow")
    drained_raw = _get(opts, "removeDrainedAfter")
    result = SourceOptions(
        path=path,
        name=name,
        format=fmt,
        consume=_bool(opts, "consume"),
        min_msg_size=queue.min_msg_size,
        max_msg_size=queue.max_msg_size,
        max_bytes_per_file=queue.max_bytes_per_file,
        max_bytes_per_partition=_int(opts, "maxBytesPerPartition", 128 * MiB, 1) or 1,
        min_partitions=_int(opts, "minPartitions", None, 1),
        max_records_per_trigger=_int(opts, "maxRecordsPerTrigger", None, 1),
        max_bytes_per_trigger=_int(opts, "maxBytesPerTrigger", None, 1),
        arrow=True if arrow_raw is None else _bool(opts, "arrow"),
        lock_wait=_float(opts, "lockWait", 10.0),
        writer_id=_get(opts, "writerId"),
        checkpoint_location=_get(opts, "checkpointLocation"),
        fail_on_data_loss=_bool(opts, "failOnDataLoss", True),
        remove_drained_after=(None if drained_raw is None
                              else _float(opts, "removeDrainedAfter", 0.0)),
        file_mode=_mode(opts, "fileMode", FILE_MODE),
        dir_mode=_mode(opts, "dirMode", DIR_MODE),
    )
    return result


# Which options apply to which use. Spark adds ``path`` itself for ``load(path)`` and
# ``save(path)``, and ``checkpointLocation`` for ``writeStream``.
COMMON = ("path", "name", "format", "minMsgSize", "maxMsgSize", "lockWait")
BATCH_READ = ("maxBytesPerPartition", "minPartitions", "arrow", "failOnDataLoss")
STREAM_READ = ("consume", "maxRecordsPerTrigger", "maxBytesPerTrigger", "removeDrainedAfter")
WRITE = ("maxBytesPerFile", "fileMode", "dirMode")
STREAM_WRITE = ("writerId", "checkpointLocation")
ALL_OPTIONS = COMMON + BATCH_READ + STREAM_READ + WRITE + STREAM_WRITE
USES: dict[str, tuple[str, ...]] = {
    "batch read": COMMON + BATCH_READ,
    "streaming read": COMMON + BATCH_READ + STREAM_READ + ("checkpointLocation",),
    "batch write": COMMON + WRITE,
    "streaming write": COMMON + WRITE + STREAM_WRITE,
}


_KNOWN = {_norm(k): k for k in ALL_OPTIONS}


def spelled(key: str, like: str | None = None) -> str:
    """Option ``key`` as the user most likely typed it, for a message.

    Spark lower-cases option names before a Python source sees them (the JVM's
    case-insensitive map, then pyspark's ``CaseInsensitiveDict``), so the
    user's spelling is gone. A lower-case ``key`` without underscores takes the
    letter case of the option it matches or, for an unknown one, of ``like``,
    the option it most resembles: ``maxrecordpertrigger`` is shown as
    ``maxRecordPerTrigger``. A key with capitals or underscores is shown as given.
    """
    if key != key.lower() or "_" in key:
        return key
    like = _KNOWN.get(_norm(key), like)
    if like is None:
        return key
    out = list(key)
    match = difflib.SequenceMatcher(None, key, like.lower(), autojunk=False)
    for a, b, size in match.get_matching_blocks():
        out[a:a + size] = like[b:b + size]
    return "".join(out)


def check_known(opts: Mapping[str, str]) -> None:
    """Refuse an option this source does not know, listing the ones it does.

    Raises OptionError naming the unknown option.
    """
    for key in opts:
        if _norm(key) not in _KNOWN:
            close = difflib.get_close_matches(_norm(key), list(_KNOWN), 1, 0.8)
            like = _KNOWN[close[0]] if close else None
            hint = f"did you mean '{like}'? " if like else ""
            raise OptionError(spelled(key, like),
                              f"is unknown; {hint}valid options: {', '.join(ALL_OPTIONS)}")


def check_use(opts: Mapping[str, str], use: str) -> None:
    """Refuse an option that does not apply to ``use`` (e.g. ``consume`` on a batch read).

    Raises OptionError naming the option, the use and the options it accepts.
    """
    allowed = {_norm(k) for k in USES[use]}
    for key in opts:
        if _norm(key) not in allowed:
            only = [u for u, keys in USES.items() if _norm(key) in {_norm(k) for k in keys}]
            raise OptionError(
                spelled(key), f"does not apply to a {use} (it applies to: {', '.join(only)}); "
                     f"options of a {use}: {', '.join(USES[use])}")


def require_single_name(options: SourceOptions) -> str:
    """The queue name for writing, which cannot be a glob.

    Raises OptionError if ``name`` holds wildcards.
    """
    if is_glob(options.name):
        raise OptionError("name",
                          f"must name one queue when writing, got the glob {options.name!r}")
    return options.name
