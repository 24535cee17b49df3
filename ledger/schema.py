"""The ledger's schema: the Alembic revisions of ``ledger/migrations``, applied on open.

A new database gets the newest schema (``create_all`` of the models, stamped with the newest
revision; a test checks that the revisions build the same schema). A database of an older
revision is upgraded in place, a SQLite file copied aside first. A database written before the
revisions existed has a ``schema_version`` row of 1 and no ``alembic_version`` table: it is
revision 0001. A revision this orchestrate does not know was written by a newer one: refused.

``alembic_version`` is the truth; the ``schema_version`` row follows it (``SCHEMA_VERSION``)
so that an older orchestrate, which reads only that row, refuses the upgraded ledger.

Openers take one lock before they look (SQLite: ``BEGIN IMMEDIATE``; PostgreSQL: an advisory
transaction lock), so two processes opening an old ledger at once never both upgrade it, and
two creating a new one never race on ``CREATE TABLE``.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import zlib
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from pathlib import Path

from alembic.config import Config
from alembic.operations import Operations
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, delete, insert, inspect, select, text

from ledger.models import SCHEMA_VERSION, Base, SchemaRow

MIGRATIONS = Path(__file__).with_name("migrations")
#: the revision of a ledger that has only the ``schema_version`` row of 1
LEGACY_REVISION = "0001"
# copies the files named as arguments: source, destination, source, destination...
_COPY = """
import shutil, sys
names = sys.argv[1:]
for i in range(0, len(names), 2):
    shutil.copyfile(names[i], names[i + 1])
"""
# one advisory lock key per PostgreSQL database for every orchestrate that opens a ledger on it
_PG_LOCK_KEY = zlib.crc32(b"orchestrate ledger schema")


class NewerSchema(Exception):
    """The database was written by a newer orchestrate; carries what it found."""

    def __init__(self, found: str, head: str) -> None:
        super().__init__(f"{found}, newer than this orchestrate knows (revision {head})")
        self.found = found
        self.head = head


@dataclass(frozen=True)
class Upgrade:
    """An upgrade done on open: from which revision, to which, and where the old file went."""

    from_revision: str
    to_revision: str
    backup: Path | None

    def line(self) -> str:
        """One line for a person: what was upgraded and where the copy is."""
        copy = f"; the old file is at {self.backup}" if self.backup else ""
        return f"upgraded the ledger's schema {self.from_revision} → {self.to_revision}{copy}"


@cache
def scripts() -> ScriptDirectory:
    """The revisions shipped with this orchestrate (read once per process)."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    return ScriptDirectory.from_config(config)


def head() -> str:
    """The newest revision."""
    newest = scripts().get_current_head()
    assert newest is not None, f"no revisions in {MIGRATIONS}"
    return newest


def prepare(conn: Connection) -> Upgrade | None:
    """Create the schema on a new database, or upgrade an older one in place; ``conn`` is in
    a transaction the caller commits (the upgrade is rolled back with it).

    Returns the upgrade done, if any.

    Raises:
        NewerSchema: a revision (or schema version) this orchestrate does not know.
        sqlalchemy.exc.SQLAlchemyError: the database refused a statement.
        OSError: the SQLite file could not be copied aside.
    """
    script, newest = scripts(), head()
    # the common case, without taking the lock. Unlocked, the two reads of ``_revision`` may
    # straddle another opener's commit of a new ledger (no ``alembic_version`` yet, then its
    # ``schema_version`` row): whatever they say is checked again under the lock
    with contextlib.suppress(NewerSchema):
        if _revision(conn) == newest:
            return None
    _lock(conn)
    found = _revision(conn)
    if found == newest:  # another process got there first
        return None
    if found is None:
        _create(conn, script, newest)
        return None
    if found not in {s.revision for s in script.walk_revisions()}:
        raise NewerSchema(f"schema revision {found}", newest)
    backup = _copy_aside(conn, found)
    _upgrade(conn, script, found, newest)
    return Upgrade(from_revision=found, to_revision=newest, backup=backup)


def current(conn: Connection) -> str | None:
    """The database's revision, read without writing (None: no ledger in it yet).

    Raises:
        NewerSchema: a schema version this orchestrate does not know.
    """
    return _revision(conn)


def _revision(conn: Connection) -> str | None:
    """The database's revision: ``alembic_version``'s, else 0001 for a ``schema_version``
    row of 1, else None (a new database).

    Raises:
        NewerSchema: a ``schema_version`` row other than 1 and no ``alembic_version``.
    """
    found = MigrationContext.configure(conn).get_current_revision()
    if found is not None or not inspect(conn).has_table(SchemaRow.__tablename__):
        return found
    version = conn.execute(select(SchemaRow.version).where(SchemaRow.id == 1)).scalar()
    # no row: the first release was killed between its CREATE TABLEs and the row
    if version in (None, 1):
        return LEGACY_REVISION
    raise NewerSchema(f"schema version {version}", head())


def _lock(conn: Connection) -> None:
    # held until the caller's transaction ends, so whoever waited sees the finished schema
    if conn.dialect.name == "sqlite":
        conn.exec_driver_sql("BEGIN IMMEDIATE")
    elif conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_LOCK_KEY})


def _create(conn: Connection, script: ScriptDirectory, newest: str) -> None:
    Base.metadata.create_all(conn)
    MigrationContext.configure(conn).stamp(script, newest)
    _write_version(conn)


def _upgrade(conn: Connection, script: ScriptDirectory, found: str, newest: str) -> None:
    context = MigrationContext.configure(conn)
    # from the newest down to (not including) ``found``
    steps = list(script.iterate_revisions(newest, found))
    with Operations.context(context):
        for step in reversed(steps):
            step.module.upgrade()
    context.stamp(script, newest)
    _write_version(conn)


def _write_version(conn: Connection) -> None:
    conn.execute(delete(SchemaRow))
    conn.execute(insert(SchemaRow).values(id=1, version=SCHEMA_VERSION))


def _copy_aside(conn: Connection, found: str) -> Path | None:
    """Copy a SQLite file before it is upgraded; None for PostgreSQL or an in-memory database.

    The caller holds ``BEGIN IMMEDIATE`` and has written nothing, so no process can change
    the file while it is copied: the copy is the file byte for byte (and its ``-wal`` file,
    whose committed pages the file may lack, if the database was switched to WAL).

    Raises:
        OSError: the copy failed.
    """
    database = conn.engine.url.database
    if conn.dialect.name != "sqlite" or not database or database == ":memory:":
        return None
    source = Path(database)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    backup = source.with_name(f"{source.name}.schema-{found}-{stamp}.bak")
    files = [str(source), str(backup)]
    wal = source.with_name(source.name + "-wal")
    if wal.exists():
        files += [str(wal), str(backup.with_name(backup.name + "-wal"))]
    # in another process: closing any descriptor of the file drops every POSIX lock this
    # process holds on it, the write lock included, and another opener would then upgrade too
    done = subprocess.run(
        [sys.executable, "-c", _COPY, *files], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise OSError(f"copying {source} to {backup} failed: {done.stderr.strip()[-500:]}")
    return backup
