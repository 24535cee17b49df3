"""A ledger that does not answer for a while loses no lease: the renewal fails, is tried again,
and the ledger decides when it answers (as a node's claim is renewed when the node answers
again). Only a lease the ledger says is another's is lost. The outage is real: the test's
PostgreSQL database refuses connections (``ALLOW_CONNECTIONS false``) and the ledger's own are
ended (``pg_terminate_backend``), then it takes them again."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest
from psycopg import sql
from sqlalchemy.engine import make_url

from cluster.errors import OwnershipLost
from ledger import Ledger, LedgerError
from orchestrator.lease import ClusterLease


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


@contextmanager
def ledger_away(url: str) -> Iterator[None]:
    """The ledger's database refuses every connection, and its open ones are ended."""
    name = make_url(url).database or ""
    with _admin(url) as admin:
        admin.execute(
            sql.SQL("ALTER DATABASE {} WITH ALLOW_CONNECTIONS false").format(sql.Identifier(name))
        )
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,)
        )
        try:
            yield
        finally:
            admin.execute(
                sql.SQL("ALTER DATABASE {} WITH ALLOW_CONNECTIONS true").format(
                    sql.Identifier(name)
                )
            )


def test_a_ledger_away_for_a_while_loses_no_lease(pg_url: str) -> None:
    with Ledger(pg_url) as ledger, ClusterLease(ledger, "spark", ttl_s=120.0) as lease:
        with ledger_away(pg_url):
            # the ledger does not answer: the renewal fails, and the lease is not lost
            with pytest.raises(LedgerError):
                ledger.lease("spark")
            lease.check()
            assert lease.lost is None
        # back: renewed, and still this holder's
        before = ledger.lease("spark")
        assert before is not None and before.holder == lease.holder
        lease.check()
        after = ledger.lease("spark")
        assert after is not None and after.expires_at > before.expires_at


def test_a_lease_the_ledger_gives_to_another_is_lost(pg_url: str) -> None:
    with Ledger(pg_url) as ledger, ClusterLease(ledger, "spark", ttl_s=120.0) as lease:
        # another orchestrator took it (as after an expiry): the ledger says so
        libpq = make_url(pg_url).set(drivername="postgresql")
        with psycopg.connect(libpq.render_as_string(hide_password=False)) as conn:
            conn.execute("UPDATE lease SET holder = 'another:1:x' WHERE cluster = 'spark'")
        with pytest.raises(OwnershipLost, match="lost the ledger's lease on cluster spark"):
            lease.check()
