"""The ledger servers this machine has reached: the evidence a round's command weighs a ledger
that does not answer by (``outages.waiting_for_ledger``), as a silent MLflow is weighed by the
ledger's rounds (``outages.mlflow_reached``).

A ledger server this user's commands opened before, silent as a round's command starts, is away
for a while (PostgreSQL restarting as a timer starts the night) and is waited for; one never
reached from here is taken for a URL that names nothing (a wrong host, port or address) and
refused at once, while the person who typed it is still there to read why.

Kept in ``~/.cache/orchestrate/ledgers-reached`` (``$ORCHESTRATE_CACHE/ledgers-reached`` where
that is set: a test's own folder), one ledger a line: its URL without password,
driver or options (a SQLite file is never recorded: it is refused at once whatever). The file
is a hint, never the record: one that cannot be read or written only costs the wait.
"""

from __future__ import annotations

import os
from contextlib import suppress
from pathlib import Path

from ledger import server_identity

#: The file's name in ``~/.cache/orchestrate``.
FILE = "ledgers-reached"


def ledger_reached(url: str) -> bool:
    """Whether a command of this user on this machine opened the ledger server at ``url``."""
    key = server_identity(url)
    path = _path()
    if key is None or path is None:
        return False
    try:
        return key in path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return False


def remember_ledger(url: str) -> None:
    """Record that the ledger server at ``url`` answered (nothing for a SQLite file, and
    nothing when the cache folder cannot be written)."""
    key = server_identity(url)
    path = _path()
    if key is None or path is None or ledger_reached(url):
        return
    with suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8") as f:
            f.write(key + "\n")


def _path() -> Path | None:
    if folder := os.environ.get("ORCHESTRATE_CACHE"):
        return Path(folder) / FILE
    try:
        return Path.home() / ".cache" / "orchestrate" / FILE
    except RuntimeError:  # no home folder to be found
        return None
