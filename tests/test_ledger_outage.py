"""A ledger that does not answer for a while (a PostgreSQL restart at night) is not the night's
end. It loses no lease: the renewal fails, is tried again, and the ledger decides when it
answers (as a node's claim is renewed when the node answers again); only a lease the ledger
says is another's is lost. And a round whose step finds it away waits and resumes from the
last committed step, as the same command would after a kill. The outage is real: the test's
PostgreSQL database refuses connections (``ALLOW_CONNECTIONS false``) and the ledger's own are
ended (``pg_terminate_backend``), then it takes them again; the testbed is scripted (the real
loop, ledger and verdict run unchanged)."""

from __future__ import annotations

import io
import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from rich.console import Console
from sqlalchemy.engine import make_url

from agents import SweepProposer
from cluster.errors import OwnershipLost
from knobs.config import Config
from knobs.vocabulary import EventKind, RoundStatus, State
from ledger import LeaseLost, Ledger, LedgerError
from orchestrator.approval import ApprovalGate
from orchestrator.display import RoundDisplay
from orchestrator.lease import ClusterLease
from orchestrator.outages import through_ledger_outages, waiting_for_ledger
from orchestrator.round import RoundOptions, RoundReport, RoundRunner
from orchestrator.testbed import NullSink
from tests.fixtures.cli import orchestrate, said_until
from tests.fixtures.partition import BOUNDS, FarPostgres, connections_made
from tests.test_round_policy import ScriptedTestbed, profile


def _admin(url: str) -> psycopg.Connection[tuple[object, ...]]:
    """A connection to the server's maintenance database as the test database's owner."""
    u = make_url(url)
    return psycopg.connect(
        host=u.host,
        port=u.port,
        user=u.username,
        password=u.password,
        dbname="postgres",
        autocommit=True,
    )


def take_away(url: str) -> None:
    """The ledger's database refuses every connection, and its open ones are ended."""
    name = make_url(url).database or ""
    with _admin(url) as admin:
        admin.execute(
            sql.SQL("ALTER DATABASE {} WITH ALLOW_CONNECTIONS false").format(sql.Identifier(name))
        )
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,)
        )


def bring_back(url: str) -> None:
    """The ledger's database takes connections again."""
    name = make_url(url).database or ""
    with _admin(url) as admin:
        admin.execute(
            sql.SQL("ALTER DATABASE {} WITH ALLOW_CONNECTIONS true").format(sql.Identifier(name))
        )


@contextmanager
def ledger_away(url: str) -> Iterator[None]:
    take_away(url)
    try:
        yield
    finally:
        bring_back(url)


def test_a_ledger_away_for_a_while_loses_no_lease(pg_url: str) -> None:
    with Ledger(pg_url) as ledger, ClusterLease(ledger, "spark", ttl_s=120.0) as lease:
        with ledger_away(pg_url):
            # the ledger does not answer: the renewal fails, and the lease is not lost
            with pytest.raises(LedgerError):
                ledger.lease("spark")
            lease.check()
            assert lease.lost is None
            # a write, fenced by the lease (``ledger.fence``): the ledger away, not the lease
            # lost: waited out as every write is
            with pytest.raises(LedgerError) as away:
                ledger.add_event("spark", EventKind.KNOWN_BAD_CLEARED, subject="1", detail={})
            assert away.value.unreachable and not isinstance(away.value, LeaseLost)
        # back: renewed, and still this holder's; its writes go on
        before = ledger.lease("spark")
        assert before is not None and before.holder == lease.holder
        ledger.add_event("spark", EventKind.KNOWN_BAD_CLEARED, subject="1", detail={})
        lease.check()
        after = ledger.lease("spark")
        assert after is not None and after.expires_at > before.expires_at


def test_a_lease_the_ledger_gives_to_another_is_lost(pg_url: str) -> None:
    with Ledger(pg_url) as ledger, ClusterLease(ledger, "spark", ttl_s=120.0) as lease:
        # another orchestrator took it (as after an expiry): the ledger says so
        libpq = make_url(pg_url).set(drivername="postgresql")
        with psycopg.connect(libpq.render_as_string(hide_password=False)) as conn:
            conn.execute("UPDATE lease SET holder = 'another:1:x' WHERE cluster = 'spark'")
        with pytest.raises(OwnershipLost, match=r"lost cluster spark to another:1:x "):
            lease.check()


CHANGES = [{"num_speculative_tokens": k} for k in (5, 6, 2)]


class AwayAt(ScriptedTestbed):
    """K=5 serves 130 tok/s, the rest 100; the ledger goes away as boot ``at`` comes up."""

    def __init__(self, url: str, at: int) -> None:
        super().__init__(lambda c, n: 130.0 if c["num_speculative_tokens"] == 5 else 100.0)
        self.url = url
        self.at = at

    def deploy(self, config: Config) -> dict[int, str]:
        launchers = super().deploy(config)
        if len(self.boots) == self.at:
            take_away(self.url)  # the boot is up; recording it finds the ledger gone
        return launchers


def _through_outages(
    ledger: Ledger,
    testbed: ScriptedTestbed,
    said: io.StringIO,
    wait: Callable[[float], None],
    back: Callable[[], None],
) -> RoundReport:
    """``_round`` through the ledger's outages as the command runs it (each wait ``wait``),
    the ledger brought ``back`` whatever happens."""
    try:
        return through_ledger_outages(
            lambda: _round(ledger, testbed, said),
            note=lambda line: print(line, file=said),
            sleep=wait,
        )
    finally:
        back()


def _round(ledger: Ledger, testbed: ScriptedTestbed, said: io.StringIO) -> RoundReport:
    return RoundRunner(
        profile(),
        ledger,
        NullSink(),
        testbed,
        SweepProposer(CHANGES),
        ApprovalGate(ledger, "auto"),
        RoundDisplay(Console(file=said, width=400)),
        sleep=lambda _s: None,
    ).run(RoundOptions(budget=len(CHANGES), proposer="sweep", approve="auto"))


def test_a_round_waits_out_a_ledger_away_and_resumes_from_it(pg_url: str) -> None:
    waits: list[float] = []

    def wait(seconds: float) -> None:
        waits.append(seconds)
        if len(waits) == 2:  # away through the first wait and the first resume's start
            bring_back(pg_url)

    said = io.StringIO()
    testbed = AwayAt(pg_url, at=4)
    with Ledger(pg_url) as ledger:
        report = _through_outages(ledger, testbed, said, wait, lambda: bring_back(pg_url))
        assert waits == [10.0, 30.0]
        assert said.getvalue().count("the ledger did not answer") == 2
        # resumed to the budget: every experiment decided once, none a crash
        assert report.resumed and report.stopped_by == "budget"
        assert ledger.round(report.round.id).status == RoundStatus.DONE
        experiments = ledger.experiments()
        candidates = [e for e in experiments if e.kind == "candidate"]
        assert [e.value for e in candidates] == [5, 6, 2]
        assert all(e.state == State.DECIDED for e in experiments)
        assert not [e for e in experiments if e.status == "crash"]
        assert candidates[0].status == "keep"


def test_a_ledgers_connections_have_libpqs_bounds_on_a_silent_server_and_the_users_own_win(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each connection to a PostgreSQL ledger is made with libpq's bounds on a server that
    falls silent (keepalives, ``tcp_user_timeout``) and on one that never answers
    (``connect_timeout``), read back from the live connections; a bound the URL sets, or
    libpq's environment, is the user's."""
    monkeypatch.delenv("PGCONNECT_TIMEOUT", raising=False)
    made: list[dict[str, str]] = []
    with connections_made(made), Ledger(pg_url) as ledger:
        ledger.rounds("c")
    assert made and all({k: c[k] for k in BOUNDS} == BOUNDS for c in made), made
    made.clear()
    monkeypatch.setenv("PGCONNECT_TIMEOUT", "7")
    own = make_url(pg_url).update_query_dict({"tcp_user_timeout": "5000", "keepalives_idle": "60"})
    with connections_made(made), Ledger(own.render_as_string(False)) as ledger:
        ledger.rounds("c")
    users = {"connect_timeout": "7", "tcp_user_timeout": "5000", "keepalives_idle": "60"}
    assert made and all({k: c[k] for k in BOUNDS} == {**BOUNDS, **users} for c in made), made


class CutAt(ScriptedTestbed):
    """K=5 serves 130 tok/s, the rest 100; the link to the ledger's server is cut as boot
    ``at`` comes up (``cut_at``: when)."""

    def __init__(self, far: FarPostgres, at: int) -> None:
        super().__init__(lambda c, n: 130.0 if c["num_speculative_tokens"] == 5 else 100.0)
        self.far = far
        self.at = at
        self.cut_at = 0.0

    def deploy(self, config: Config) -> dict[int, str]:
        launchers = super().deploy(config)
        if len(self.boots) == self.at:
            self.far.cut()  # the boot is up; recording it finds the ledger's host gone
            self.cut_at = time.monotonic()
        return launchers


@pytest.mark.timeout(300)
def test_a_ledger_server_cut_off_mid_round_is_an_outage_within_a_minute(
    far_postgres: FarPostgres,
) -> None:
    """A network partition mid-round (the ledger's host gone: its packets dropped, no reset
    ever comes) on an open connection: the round's next ledger call fails within about a
    minute as the ledger not answering, and the round waits and resumes from the ledger when
    the link is back. Before, libpq waited on the connection for the kernel's retransmissions,
    about 15 minutes (for ever on one that awaited a reply)."""
    waits: list[float] = []

    def wait(_seconds: float) -> None:
        waits.append(time.monotonic())
        far_postgres.mend()

    said = io.StringIO()
    testbed = CutAt(far_postgres, at=4)
    with Ledger(far_postgres.url) as ledger:
        report = _through_outages(ledger, testbed, said, wait, far_postgres.mend)
        assert len(waits) == 1, said.getvalue()
        assert waits[0] - testbed.cut_at < 75.0, said.getvalue()
        assert said.getvalue().count("the ledger did not answer") == 1
        assert report.resumed and report.stopped_by == "budget"
        assert ledger.round(report.round.id).status == RoundStatus.DONE
        experiments = ledger.experiments()
        assert [e.value for e in experiments if e.kind == "candidate"] == [5, 6, 2]
        assert not [e for e in experiments if e.status == "crash"]


def test_a_ledger_away_past_the_last_wait_stops_the_round_for_the_same_command(
    pg_url: str,
) -> None:
    waits: list[float] = []
    said = io.StringIO()
    with Ledger(pg_url) as ledger:
        try:
            with pytest.raises(LedgerError) as away:
                through_ledger_outages(
                    lambda: _round(ledger, AwayAt(pg_url, at=2), said),
                    note=lambda line: print(line, file=said),
                    sleep=waits.append,
                    waits=(1.0, 2.0),
                )
        finally:
            bring_back(pg_url)
        assert away.value.unreachable
        assert waits == [1.0, 2.0]
        # the same command, later, resumes the round to its budget
        report = _round(ledger, ScriptedTestbed(lambda c, n: 100.0), io.StringIO())
        assert report.resumed and ledger.round(report.round.id).status == RoundStatus.DONE


def test_a_round_command_waits_for_a_ledger_server_that_does_not_answer_yet(
    pg_url: str, tmp_path: Path
) -> None:
    """A ledger server that does not answer as a round's command opens it (PostgreSQL
    restarting as a timer starts the night) is waited for on the ledger's schedule, and the
    ledger then opens; a SQLite file that cannot be opened (a wrong path) is refused at once,
    as is a ledger that refuses (not an outage)."""
    said: list[str] = []
    waits: list[float] = []

    def wait(seconds: float) -> None:
        waits.append(seconds)
        if len(waits) == 2:
            bring_back(pg_url)

    take_away(pg_url)
    try:
        opened = waiting_for_ledger(
            lambda: Ledger(pg_url), url=pg_url, reached_before=True, note=said.append, sleep=wait
        )
    finally:
        bring_back(pg_url)
    with opened as ledger:
        assert ledger.rounds("c") == []
    assert waits == [10.0, 30.0]
    assert len(said) == 2 and all(line.startswith("the ledger did not answer") for line in said)

    nowhere = f"sqlite:///{tmp_path}/no-such-folder/orchestrate.db"
    with pytest.raises(LedgerError) as wrong_path:
        waiting_for_ledger(
            lambda: Ledger(nowhere),
            url=nowhere,
            reached_before=True,
            note=said.append,
            sleep=wait,
        )
    assert wrong_path.value.unreachable, "SQLite's own word for it is an outage's"
    refusing = pg_url.replace("postgresql+psycopg", "postgresql+nosuchdriver")
    with pytest.raises(LedgerError) as refused:
        waiting_for_ledger(
            lambda: Ledger(refusing),
            url=refusing,
            reached_before=True,
            note=said.append,
            sleep=wait,
        )
    assert not refused.value.unreachable
    assert waits == [10.0, 30.0], "neither is waited for"


@pytest.mark.parametrize("wrong", ["database", "username"])
def test_a_ledger_server_that_refuses_the_urls_user_or_database_is_refused_at_once(
    pg_url: str, wrong: str
) -> None:
    """A server that answers and refuses the URL's database or user (a typo in the ledger
    URL) is not an outage: the command ends at once, in one line saying what to check, where
    it would otherwise wait half an hour and lose the night."""
    right = make_url(pg_url)
    named = (
        right.set(database="no_such_name")
        if wrong == "database"
        else right.set(username="no_such_name")
    )
    url = named.render_as_string(hide_password=False)
    said: list[str] = []
    waits: list[float] = []
    with pytest.raises(LedgerError) as refused:
        waiting_for_ledger(
            lambda: Ledger(url),
            url=url,
            reached_before=True,
            note=said.append,
            sleep=waits.append,
        )
    assert not refused.value.unreachable
    assert waits == [] and said == []
    message = refused.value.message
    assert "no_such_name" in message and "\n" not in message
    assert message.endswith("check the user, password and database the ledger URL names")


def test_a_ledger_server_never_reached_is_said_in_seconds_one_reached_before_is_waited_for(
    pg_url: str, tmp_path: Path
) -> None:
    """A ledger URL that names nothing (a refused port; an address that takes the connection
    and never answers, as a blackholed server) on a machine that never reached it: a round's
    command says so in one line within seconds (it waited out the outage schedule, about 29
    minutes, each try of a silent address 130 s more), and any command's try of a silent
    address is bounded (libpq's connect_timeout). The same machine, once it reached a ledger,
    waits for it when it does not answer a round's start: a night a timer starts while
    PostgreSQL restarts is not lost."""
    ledgers = Path(__file__).parent / "fixtures" / "ledgers"
    profile = str(ledgers / "schema4.profile.yaml")
    home = tmp_path / "home"  # where this machine's commands remember the ledgers they reached
    home.mkdir()
    env = {**os.environ, "HOME": str(home), "ORCHESTRATE_CACHE": str(home / "cache")}
    env.pop("PGCONNECT_TIMEOUT", None)
    with socket.socket() as refused, socket.socket() as silent:
        refused.bind(("127.0.0.1", 0))
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)
        for port in (refused.getsockname()[1], silent.getsockname()[1]):
            url = f"postgresql+psycopg://orchestrate@127.0.0.1:{port}/orchestrate"
            nowhere = {**env, "ORCHESTRATE_LEDGER": url}
            for command in (["round", "--budget", "1"], ["status"]):
                started = time.monotonic()
                said = orchestrate(
                    tmp_path, *command, "--profile", profile, env=nowhere, timeout=90
                )
                took = time.monotonic() - started
                assert said.returncode == 4, said.stderr
                errors = [line for line in said.stderr.splitlines() if line.startswith("Error:")]
                assert len(errors) == 1 and f"127.0.0.1:{port}" in errors[0], said.stderr
                assert "did not answer" not in said.stdout + said.stderr
                if command[0] == "round":
                    assert "this machine has never reached this ledger" in errors[0], errors
                    assert "check the ledger URL (ORCHESTRATE_LEDGER" in errors[0], errors
                assert took < 45.0, (port, command, took)

    reached = {**env, "ORCHESTRATE_LEDGER": pg_url}
    first = orchestrate(tmp_path, "status", "--profile", profile, env=reached)
    # the server answered, though it holds no ledger yet: reached, and waited for from now on
    assert first.returncode == 4 and "Error: no ledger yet at " in first.stderr, first.stderr
    take_away(pg_url)
    try:
        lines = said_until(
            tmp_path,
            *("round", "--budget", "1", "--profile", profile),
            words="the ledger did not answer",
            env=reached,
        )
    finally:
        bring_back(pg_url)
    assert "waiting 10s before trying again" in " ".join(" ".join(lines).split()), lines
