"""Who may read the files: creating files and directories with exactly the queue's
mode, and a clear error when this process may not open one.

A file is created with ``os.open(..., mode)`` and then, if the process's umask took
bits away (0o660 under umask 022 comes out 0o640), set to ``mode`` with ``fchmod``:
the mode applies exactly as given. A file or directory that already exists keeps
its mode; nothing here changes the mode of an existing file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import grp
import logging
import os
import pwd
import stat

from ..errors import QueuePermissionError
from .layout import Layout

log = logging.getLogger(__name__)

# fchmod on a filesystem without modes (vfat, some FUSE and CIFS mounts): nothing to set.
_NO_MODES = (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EROFS)


def _exactly(fd: int, path: str, mode: int) -> None:
    if os.fstat(fd).st_mode & 0o777 != mode:
        try:
            os.fchmod(fd, mode)
        except OSError as exc:
            if exc.errno not in _NO_MODES:
                raise
            log.debug("%s: cannot set mode %#o: %s", path, mode, exc)


def open_file(path: str, flags: int, mode: int) -> int:
    """Open ``path`` with ``flags``; with ``os.O_CREAT`` in them a file that does not
    exist is created with exactly ``mode`` (an existing one keeps its own).

    Raises QueuePermissionError naming the file, its mode and owner if this process
    may not open it, FileExistsError for ``O_EXCL`` and an existing file, other
    OSErrors as they come.
    """
    try:
        if not flags & os.O_CREAT:
            return os.open(path, flags)
        if flags & os.O_EXCL:
            fd = os.open(path, flags, mode)
            _setup(fd, path, mode)
            return fd
        while True:
            try:
                fd = os.open(path, flags | os.O_EXCL, mode)
            except FileExistsError:
                try:
                    return os.open(path, flags & ~os.O_CREAT)
                except FileNotFoundError:
                    continue  # removed between the two calls: create it after all
            _setup(fd, path, mode)
            return fd
    except PermissionError as exc:
        raise denied(path, exc) from exc


def _setup(fd: int, path: str, mode: int) -> None:
    try:
        _exactly(fd, path, mode)
    except BaseException:
        os.close(fd)
        raise


def read_fd(path: str) -> int:
    """``os.open(path, O_RDONLY)``.

    Raises QueuePermissionError as :func:`open_file` does, FileNotFoundError and other
    OSErrors as they come.
    """
    return open_file(path, os.O_RDONLY, 0)


def make_dirs(path: str, mode: int) -> None:
    """Create directory ``path`` and any missing parents, each with exactly ``mode``;
    directories that exist keep theirs.

    Raises QueuePermissionError naming the directory that may not be entered or
    written, other OSErrors as they come.
    """
    try:
        if os.path.isdir(path):
            return
        parent = os.path.dirname(os.path.abspath(path))
        if parent != path and not os.path.isdir(parent):
            make_dirs(parent, mode)
        try:
            os.mkdir(path, mode)
        except FileExistsError:
            if os.path.isdir(path):
                return  # made meanwhile by someone else: theirs
            raise
        st = os.stat(path).st_mode
        if st & 0o777 != mode:
            try:
                # The set-group-ID bit a directory inherits from its parent stays: files
                # made in it keep getting the shared group.
                os.chmod(path, mode | (st & stat.S_ISGID))
            except OSError as exc:
                if exc.errno not in _NO_MODES:
                    raise
    except PermissionError as exc:
        raise denied(path, exc) from exc


def check_dir(path: str, need: int = os.R_OK | os.W_OK | os.X_OK) -> None:
    """Raise QueuePermissionError if directory ``path`` exists but this process may not
    do ``need`` in it (a queue opened to write needs to list, enter and write it; a
    reader to list and enter); nothing if it does not exist."""
    try:
        os.stat(path)
    except FileNotFoundError:
        return
    except PermissionError as exc:
        raise denied(path, exc) from exc
    if not os.access(path, need, effective_ids=_EFFECTIVE):
        raise denied(path, PermissionError(errno.EACCES, os.strerror(errno.EACCES), path))


_EFFECTIVE = os.access in os.supports_effective_ids


def queue_modes(layout: Layout) -> Layout:
    """``layout`` with the modes of the queue's existing files, for a writer that was
    given none (the CLI's repair, Spark's sink): the mode of its meta file, else its
    lock file, and of its directory; the defaults (0o600, 0o700) where there is none.
    The owner keeps read and write (and search). A few stats, no directory listing."""
    file_mode, dir_mode = layout.file_mode, layout.dir_mode
    for path in (layout.meta_path, layout.lock_path):
        try:
            file_mode = (os.stat(path).st_mode & 0o777) | 0o600
            break
        except OSError:
            continue
    with contextlib.suppress(OSError):
        dir_mode = (os.stat(layout.directory).st_mode & 0o777) | 0o700
    return dataclasses.replace(layout, file_mode=file_mode, dir_mode=dir_mode)


def _name(lookup: str, ident: int) -> str:
    try:
        if lookup == "user":
            return pwd.getpwuid(ident).pw_name
        return grp.getgrgid(ident).gr_name
    except KeyError:
        return str(ident)


def as_queue_error(exc: PermissionError, where: str) -> QueuePermissionError:
    """``exc`` as a QueuePermissionError (itself if it is one already), naming its file,
    or ``where`` if it names none."""
    if isinstance(exc, QueuePermissionError):
        return exc
    return denied(exc.filename if isinstance(exc.filename, str) else where, exc)


def denied(path: str, exc: PermissionError) -> QueuePermissionError:
    """The error for ``exc``, raised opening ``path``: the file's mode and owner, or,
    where the file cannot be seen, those of the nearest directory that can."""
    seen = path
    while True:
        try:
            st = os.stat(seen)
            break
        except OSError:
            up = os.path.dirname(os.path.abspath(seen))
            if up == seen:
                st = None
                break
            seen = up
    me = (f"this process runs as {_name('user', os.geteuid())} (uid {os.geteuid()}, "
          f"groups {sorted(set(os.getgroups()) | {os.getegid()})})")
    hint = ("to share a queue between users, give them one group and open it with "
            "file_mode=0o660, dir_mode=0o770")
    if st is None:
        return QueuePermissionError(path, None, None, None,
                                    f"permission denied: {path}: {me}; {hint}")
    where = "" if seen == path else f"its directory {seen} has "
    mode = st.st_mode & 0o7777
    detail = (f"permission denied: {path}: {where}mode {mode:#o}, owner "
              f"{_name('user', st.st_uid)}:{_name('group', st.st_gid)} "
              f"(uid {st.st_uid}, gid {st.st_gid}); {me}; {hint}")
    return QueuePermissionError(path, mode, st.st_uid, st.st_gid, detail)
