"""The ledger's connection: opening (and creating or upgrading) it, or opening it only to read,
and one transaction per method: every method commits before it returns, so a process killed at
any point leaves the ledger at the last completed state change."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, Self, TypeVar

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import (
    ArgumentError,
    DBAPIError,
    IntegrityError,
    OperationalError,
    SQLAlchemyError,
)
from sqlalchemy.orm import ORMExecuteState, Session, sessionmaker

from cluster.signals import held
from knobs.vocabulary import EventKind
from ledger.disk import (
    READ_ONLY_FS,
    file_missing,
    folder_missing,
    folder_unwritable,
    went_read_only,
)
from ledger.errors import LedgerError, LedgerNotReady, NotInLedger
from ledger.fence import WROTE, Fence
from ledger.libpq import connect_args
from ledger.models import Base, EventRow, utcnow
from ledger.records import VerdictRecord
from ledger.schema import NewerSchema, Upgrade
from ledger.schema import current as current_revision
from ledger.schema import head as schema_head
from ledger.schema import prepare as prepare_schema

T = TypeVar("T")


class LedgerBase:
    """The connection to the SQL ledger at ``url`` (SQLite or PostgreSQL), created on first use,
    and its one-transaction sessions; the tables' methods are in the mixins ``Ledger`` joins."""

    def __init__(self, url: str, *, read_only: bool = False, rehearse: bool = False) -> None:
        """Open (and if needed create or upgrade) the ledger; ``read_only``: open it as it is,
        to read, creating and upgrading nothing (a command that promises to touch nothing);
        ``rehearse``: upgrade it inside one transaction that ``close`` rolls back, every
        session a savepoint of it (PostgreSQL's DDL is transactional: an older ledger read as
        the next command that writes would see it, and left as it was).

        Raises:
            LedgerError: a malformed URL, an unreachable server, a schema written by a newer
                orchestrate, or a SQLite file that could not be copied aside before an upgrade.
            LedgerNotReady: ``read_only``, and there is no ledger there yet, or it is at an
                older schema.
        """
        try:
            parsed = make_url(url)
        except ArgumentError as e:
            raise LedgerError(
                f"ledger URL {url!r} is not a database URL (e.g. sqlite:///orchestrate.db)",
                url=url,
            ) from e
        self.url = parsed.render_as_string(hide_password=True)
        if parsed.get_backend_name() == "postgres":
            # libpq's and Heroku's spelling, which SQLAlchemy does not know ("Can't load
            # plugin: sqlalchemy.dialects:postgres")
            raise LedgerError(
                f"ledger URL {self.url!r}: SQLAlchemy does not know postgres://; write "
                "postgresql+psycopg://… (the PostgreSQL driver orchestrate installs)",
                url=self.url,
            )
        sqlite = parsed.get_backend_name() == "sqlite"
        # the SQLite file, asked about when a write fails (``went_read_only``)
        self._database = parsed.database if sqlite else None
        if read_only and sqlite and file_missing(parsed.database):
            # connecting would create it
            raise LedgerNotReady(f"no ledger yet at {self.url}", url=self.url)
        if sqlite and (not parsed.database or parsed.database == ":memory:"):
            # a ledger in memory is gone when the command ends, with everything it recorded
            raise LedgerError(
                f"ledger URL {url!r} is a SQLite database in memory, lost when the command "
                "ends: name a file (sqlite:///orchestrate.db)",
                url=url,
            )
        folder = folder_missing(parsed.database) if sqlite else None
        if folder is not None:
            # SQLite says only "unable to open database file"
            raise LedgerError(
                f"ledger {self.url}: the folder {folder} does not exist; create it, or set "
                "ORCHESTRATE_LEDGER (or the profile's ledger_url) to a file in one that does",
                url=self.url,
                # as SQLite's own "unable to open database file" is (a mount that went away)
                unreachable=True,
            )
        writes = sqlite and not read_only and not rehearse
        refused = folder_unwritable(parsed.database) if writes else None
        if refused is not None:
            # SQLite says only "unable to open database file" (or "a readonly database")
            raise LedgerError(
                f"ledger {self.url}: the folder {refused[0]} cannot be written ({refused[1]}), "
                "and SQLite writes the ledger and its journal there: make the folder writable, "
                "or set ORCHESTRATE_LEDGER (or the profile's ledger_url) to a file in a "
                "writable folder (sqlite:////abs/path/orchestrate.db)",
                url=self.url,
                read_only=refused[1] == READ_ONLY_FS,
            )
        try:
            if sqlite:
                # a person approving from another terminal writes while the round waits
                self._engine: Engine = create_engine(url, connect_args={"timeout": 30})
                event.listen(self._engine, "connect", _sqlite_pragmas)
            else:
                self._engine = create_engine(
                    url, pool_pre_ping=True, connect_args=connect_args(parsed)
                )
        except (SQLAlchemyError, ImportError) as e:
            raise LedgerError(f"cannot open ledger {self.url}: {e}", url=self.url) from e
        self._sessions = _watched(sessionmaker(self._engine, expire_on_commit=False))
        self._held: Connection | None = None
        # the lease this ledger's writes are fenced with (``fence``), if any
        self._fence: Fence | None = None
        # a verdict is written once, with its experiment's decision, and never changed: read
        # once (a loop reads every verdict of the cluster at each step, night after night)
        self._verdicts: dict[int, VerdictRecord] = {}
        try:
            if rehearse:
                self._rehearse()
            elif read_only:
                self._check()
            else:
                self._create()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Release the connection pool (a rehearsal's transaction rolled back first)."""
        held, self._held = self._held, None
        try:
            if held is not None:
                # a connection already lost took its transaction with it: nothing to undo
                with suppress(SQLAlchemyError):
                    held.rollback()
                held.close()
        finally:
            self._engine.dispose()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def fence(self, cluster: str | None, holder: str = "") -> None:
        """Fence every write from now on with ``holder``'s lease on ``cluster``
        (``ledger.fence``): it commits only while the lease still names ``holder``, else it
        rolls back and raises ``LeaseLost``. ``None``: unfenced again (the lease's own
        methods, and a ledger that holds no lease, never are)."""
        self._fence = None if cluster is None else Fence(cluster, holder)

    def check_fence(self) -> None:
        """Whether the fenced lease still names its holder, asked now (one small query); nothing
        when unfenced.

        Raises:
            LeaseLost: the lease is another's now, or gone.
            LedgerError: the ledger did not answer.
        """
        fence = self._fence
        if fence is None:
            return
        with self._session(fenced=False) as s:
            fence.check(s, self.url)

    @contextmanager
    def _session(self, *, fenced: bool = True) -> Iterator[Session]:
        """One transaction; committed when the block ends. A transaction that wrote commits
        only after the fence's check (``fence``) in it passed, unless ``fenced`` is off (the
        lease's own methods). Its commit, rollback and close are never cut by a signal
        (``cluster.signals.held``: delivered as they end): a Ctrl-C or SIGTERM that landed
        inside SQLAlchemy's commit left the session half-committed, its rollback refused (a
        traceback, exit 1) or its SQLite write lock held, so that the stop the command then
        recorded waited 30 s for the lock and was lost, twice."""
        session = self._sessions()
        fence = self._fence if fenced else None
        try:
            yield session
            with held():
                if fence is not None:
                    session.flush()
                    if session.info.get(WROTE):
                        fence.check(session, self.url)
                session.commit()
                if fence is not None and session.info.get(WROTE):
                    fence.last_write = utcnow()
        except SQLAlchemyError as e:
            # a lost connection took its transaction with it
            with held(), suppress(SQLAlchemyError):
                session.rollback()
            detail = str(e).splitlines()[0]
            read_only = self._read_only(e)
            if read_only is not None:
                raise LedgerError(
                    self._said_read_only(detail, *read_only), url=self.url, read_only=True
                ) from e
            if _SQLITE_FULL in detail.lower():
                detail += "; the disk of the ledger's file is full: free space there"
            if refused_connection(e):
                detail += (
                    "; the server answered and refused this connection: check the user, "
                    "password and database the ledger URL names"
                )
            raise LedgerError(
                f"ledger {self.url}: {detail}", url=self.url, unreachable=did_not_answer(e)
            ) from e
        except BaseException:
            with held():
                session.rollback()
            raise
        finally:
            with held(), suppress(SQLAlchemyError):
                session.close()

    def _read_only(self, e: SQLAlchemyError) -> tuple[Path, Path] | None:
        """The ledger file's folder and mount point, where ``e`` is SQLite failing to write
        because its filesystem went read-only (``went_read_only``)."""
        if self._database is None or not isinstance(e, OperationalError):
            return None
        text = str(e.orig).lower()
        if not any(words in text for words in _SQLITE_NOT_WRITTEN):
            return None
        return went_read_only(self._database)

    def _said_read_only(self, detail: str, folder: Path, mount: Path) -> str:
        """A ledger whose filesystem went read-only, in one line: what, where, what to do."""
        return (
            f"ledger {self.url}: the filesystem at {mount} went read-only under it ({detail}), "
            "and that does not heal by itself (a filesystem is remounted read-only on a disk "
            f"error): check the disk and remount it read-write (mount -o remount,rw {mount}), "
            f"or copy the ledger out of {folder} to a writable disk and set "
            "ORCHESTRATE_LEDGER (or the profile's ledger_url) to the copy; the same command "
            "then resumes the round from the last step the ledger recorded"
        )

    def _create(self) -> None:
        # the schema lock (ledger/schema.py) keeps openers of this orchestrate from racing; an
        # older one creating the same new ledger takes none, so a lost race on CREATE TABLE or
        # the schema row is retried. Each lost race means another process created one more
        # table or the row, which cannot be lost on again, so one attempt per table and one
        # for the row (and one to find them all) always suffice
        self.upgraded: Upgrade | None = None
        attempts = len(Base.metadata.tables) + 2
        for attempt in range(attempts):
            try:
                self._create_once()
                return
            except LedgerError as e:
                lost_race = isinstance(e.__cause__, IntegrityError) or "already exists" in e.message
                if attempt == attempts - 1 or not lost_race:
                    raise

    def _create_once(self) -> None:
        with self._session() as s:
            try:
                upgrade = prepare_schema(s.connection())
            except NewerSchema as e:
                raise self._newer(e) from e
            except OSError as e:
                raise LedgerError(
                    f"cannot copy ledger {self.url} aside before upgrading it: {e}", url=self.url
                ) from e
            if upgrade is not None:
                backup = None if upgrade.backup is None else str(upgrade.backup)
                s.add(
                    EventRow(
                        cluster="*",
                        kind=str(EventKind.LEDGER_UPGRADED),
                        subject=upgrade.to_revision,
                        detail={"from": upgrade.from_revision, "backup": backup},
                        reason=upgrade.line(),
                    )
                )
        self.upgraded = upgrade

    def _rehearse(self) -> None:
        """The upgrade, on one connection in a transaction left open for ``close`` to roll
        back; every session joins it as a savepoint, so what they read is the upgraded ledger
        and nothing they or the upgrade did is committed."""
        self.upgraded = None
        try:
            conn = self._engine.connect()
            self._held = conn
            conn.begin()
            prepare_schema(conn)
        except NewerSchema as e:
            raise self._newer(e) from e
        except SQLAlchemyError as e:
            detail = str(e).splitlines()[0]
            raise LedgerError(f"ledger {self.url}: {detail}", url=self.url) from e
        self._sessions = _watched(
            sessionmaker(
                bind=conn, expire_on_commit=False, join_transaction_mode="create_savepoint"
            )
        )

    def _check(self) -> None:
        """A ledger opened to read is at this orchestrate's schema (read, nothing written)."""
        self.upgraded = None
        with self._session() as s:
            try:
                found = current_revision(s.connection())
            except NewerSchema as e:
                raise self._newer(e) from e
        if found is None:
            raise LedgerNotReady(f"no ledger yet at {self.url}", url=self.url)
        if found != schema_head():
            raise LedgerNotReady(
                f"ledger {self.url} is at schema {found}, older than this orchestrate's "
                f"{schema_head()}: the next command that writes to it upgrades it",
                url=self.url,
                found=found,
            )

    def _newer(self, e: NewerSchema) -> LedgerError:
        return LedgerError(
            f"ledger {self.url} is at {e.found}, newer than this orchestrate knows "
            f"(revision {e.head}): upgrade orchestrate, or use a new ledger URL",
            url=self.url,
        )

    def _get(self, s: Session, cls: type[T], key: object, *, lock: bool = False) -> T:
        row = s.get(cls, key, with_for_update=lock)
        if row is None:
            name = getattr(cls, "__tablename__", cls.__name__)
            raise NotInLedger(f"no {name} {key} in ledger {self.url}", url=self.url)
        return row


def server_identity(url: str) -> str | None:
    """What names a ledger server's database whatever the driver, password or options:
    ``backend://user@host:port/database`` (``None``: a SQLite file, or not a database URL)."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        return None
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        return None
    # a socket folder or an address given as an option names the server too
    where = {k: v for k, v in parsed.query.items() if k in ("host", "hostaddr", "port")}
    named = parsed.set(drivername=backend, password=None, query=where)
    return named.render_as_string(hide_password=False)


def ledger_identity(url: str) -> str:
    """What names a ledger whatever the driver, password or options: its server's database
    (``server_identity``), or ``sqlite:///`` and its file's absolute path (a relative path
    taken from this process's folder); ``url`` itself where it is not a database URL."""
    named = server_identity(url)
    if named is not None:
        return named
    try:
        database = make_url(url).database
    except ArgumentError:
        return url
    if not database or database == ":memory:" or database.startswith("file:"):
        return url
    return f"sqlite:///{Path(database).absolute()}"


def _watched(sessions: sessionmaker[Session]) -> sessionmaker[Session]:
    """``sessions``, each of which notes in its ``info`` whether its transaction wrote (a flush,
    or an INSERT, UPDATE or DELETE statement): what the fence checks (``LedgerBase.fence``)."""

    def flushed(session: Session, _context: object) -> None:
        session.info[WROTE] = True

    def executed(state: ORMExecuteState) -> None:
        if state.is_insert or state.is_update or state.is_delete:
            state.session.info[WROTE] = True

    event.listen(sessions, "after_flush", flushed)
    event.listen(sessions, "do_orm_execute", executed)
    return sessions


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


#: SQLite's words for a database it cannot reach for now (locked past the busy timeout by
#: another writer, its file or disk unreadable, its disk full: a night's logs or a download
#: filled it, and a rotation or a cleanup frees it); its other operational errors are refusals
#: ("no such table").
_SQLITE_FULL = "database or disk is full"
#: SQLite's words for a write it could not make, which a read-only filesystem says too: its
#: journal not created, a connection opened read-only, a page not written.
_SQLITE_NOT_WRITTEN = (
    "unable to open database file",
    "attempt to write a readonly database",
    "disk i/o error",
)
_SQLITE_AWAY = (
    "database is locked",
    "unable to open database file",
    "disk i/o error",
    _SQLITE_FULL,
)


#: A PostgreSQL server's words (and libpq's) as it answers a new connection and refuses it: a
#: user, password or database the URL names wrongly, which waiting never cures. Its other
#: refusals at connect (starting up, shutting down, too many clients) are waited out, as is
#: this text from a server that speaks another language: a wait is the lesser mistake.
_PG_REFUSED = (
    "does not exist",
    "password authentication failed",
    "no pg_hba.conf entry",
)


def refused_connection(e: SQLAlchemyError) -> bool:
    """Whether ``e`` says a database server answered a new connection and refused it for good
    (a wrong user, password or database)."""
    if not isinstance(e, OperationalError) or type(e.orig).__module__.startswith("sqlite3"):
        return False
    text = str(e.orig)
    if "fe_sendauth" in text:  # libpq's own: the server asked for a password, the URL has none
        return True
    return "FATAL" in text and any(words in text for words in _PG_REFUSED)


def did_not_answer(e: SQLAlchemyError) -> bool:
    """Whether ``e`` says the database did not answer (waiting may cure it)."""
    if not isinstance(e, DBAPIError) or refused_connection(e):
        return False
    if e.connection_invalidated:
        return True
    if not isinstance(e, OperationalError):
        return False
    if type(e.orig).__module__.startswith("sqlite3"):
        return any(words in str(e.orig).lower() for words in _SQLITE_AWAY)
    return True  # a server's operational error: refused, terminated, timed out
