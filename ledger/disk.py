"""A SQLite ledger's file and its folder on disk: a folder that is not there or cannot be
written (said before SQLite says only "unable to open database file"), and a filesystem that
went read-only under a ledger in use (``went_read_only``)."""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

#: Why a folder cannot be written, where its filesystem is mounted read-only.
READ_ONLY_FS = "a read-only file system"


def file_missing(database: str | None) -> bool:
    """Whether a SQLite URL's database is a file that is not there (not in memory)."""
    return bool(database) and database != ":memory:" and not Path(str(database)).exists()


def folder_missing(database: str | None) -> Path | None:
    """The folder a SQLite URL's database file would be in, when that folder is not there
    (``None`` for a database in memory or named by a ``file:`` URI)."""
    folder = _folder(database)
    return None if folder is None or folder.is_dir() else folder


def folder_unwritable(database: str | None) -> tuple[Path, str] | None:
    """The folder of a SQLite URL's database file, and why, when this process cannot write
    there (a read-only file system, a folder of another user's); ``None`` where it can, where
    the folder is not there (``folder_missing`` says so) or for a database in memory or named
    by a ``file:`` URI."""
    folder = _folder(database)
    if folder is None or not folder.is_dir() or os.access(folder, os.W_OK):
        return None
    if os.statvfs(folder).f_flag & os.ST_RDONLY:
        return folder, READ_ONLY_FS
    return folder, "permission denied"


def went_read_only(database: str | None) -> tuple[Path, Path] | None:
    """The folder of a SQLite URL's database file and the mount point of its filesystem, when
    that filesystem takes no write now (``EROFS``): remounted read-only under a ledger in use
    (ext4's ``errors=remount-ro`` after a disk error, an operator's ``mount -o remount,ro``).
    SQLite then says "unable to open database file" (its journal cannot be created) or
    "attempt to write a readonly database" (a connection opened since), and neither heals by
    itself. Asked by creating (and removing) a file there: since Linux 6.6 a filesystem ext4
    made read-only on an error still reads as writable to ``statvfs`` and ``access``.
    ``None``: it takes writes, or the database is in memory or named by a ``file:`` URI."""
    folder = _folder(database)
    if folder is None or not folder.is_dir():
        return None
    try:
        fd, probe = tempfile.mkstemp(prefix=".orchestrate-probe-", dir=folder)
    except OSError as e:
        return (folder, _mount_point(folder)) if e.errno == errno.EROFS else None
    os.close(fd)
    os.unlink(probe)
    return None


def _folder(database: str | None) -> Path | None:
    if not database or database == ":memory:" or database.startswith("file:"):
        return None
    return Path(database).absolute().parent


def _mount_point(folder: Path) -> Path:
    """The mount point of the filesystem ``folder`` is on."""
    at = folder
    while not os.path.ismount(at) and at.parent != at:
        at = at.parent
    return at
