"""What a connection to a PostgreSQL server is made with: libpq's bounds on a server that does
not answer, for the ledger's connections and for MLflow's when its store is PostgreSQL too.

Left to itself libpq waits for ever, twice over. A connection being made to an address that
takes it and never answers (a blackholed address, a host half down) waited 130 s under psycopg
and for ever under libpq. A query on an open connection whose server went away (a network
partition, its host gone: no reset ever comes) waits for the kernel's retransmissions of what
it sent, about 15 minutes, and for ever where everything it sent was acknowledged before the
server fell silent (a reply awaited, or a pooled connection idle). With the bounds below the
first is an error within 10 s, the second within about 30 s: the ledger's ``LedgerError``
(``unreachable``) that a round waits out as an outage (``orchestrator.faults``), or MLflow's
``MlflowSinkError`` that a round goes on without.

The URL's own query (``?connect_timeout=60``, ``?keepalives=0``) and libpq's environment
(``PGCONNECT_TIMEOUT``; libpq reads no variable for the others) win over these.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

#: The seconds one connection may take to be made (libpq's ``connect_timeout``).
CONNECT_TIMEOUT_S: Final = 10

#: libpq's settings for an open connection whose server falls silent: TCP keepalives sent after
#: 10 s with nothing heard, then every 5 s, and what the client sent (a query, a keepalive)
#: left unacknowledged for 30 s (``tcp_user_timeout``, in milliseconds) ends the connection.
#: A server that is only slow (a long query, a lock awaited) acknowledges them all and is
#: waited for as long as it takes.
SILENT_SERVER: Final[Mapping[str, int]] = MappingProxyType(
    {
        "keepalives": 1,
        "keepalives_idle": 10,
        "keepalives_interval": 5,
        "keepalives_count": 4,
        "tcp_user_timeout": 30_000,
    }
)

#: The PostgreSQL drivers that pass these to libpq.
_LIBPQ_DRIVERS: Final = frozenset({"psycopg", "psycopg2", "psycopg2cffi"})

#: The settings libpq also reads from the environment, and the variable it reads each from.
_ENVIRONMENT: Final = MappingProxyType({"connect_timeout": "PGCONNECT_TIMEOUT"})


def connect_args(url: URL) -> dict[str, object]:
    """What a connection to the server at ``url`` is made with: ``CONNECT_TIMEOUT_S`` and
    ``SILENT_SERVER``, each unless the URL's query or libpq's environment sets it (nothing for
    another database or driver)."""
    if url.get_backend_name() != "postgresql" or url.get_driver_name() not in _LIBPQ_DRIVERS:
        return {}
    bounds = {"connect_timeout": CONNECT_TIMEOUT_S, **SILENT_SERVER}
    environment = {name for name, variable in _ENVIRONMENT.items() if variable in os.environ}
    return {
        name: value
        for name, value in bounds.items()
        if name not in url.query and name not in environment
    }


def bounded_uri(uri: str) -> str:
    """``uri`` with ``connect_args`` in its query, for a library that opens the database itself
    and takes no connect arguments (MLflow's tracking store); another URI as it is."""
    try:
        url = make_url(uri)
    except ArgumentError:  # not a database URL: the library says so in its own words
        return uri
    added = connect_args(url)
    if not added:
        return uri
    bounded = url.update_query_dict({name: str(value) for name, value in added.items()})
    return bounded.render_as_string(hide_password=False)
