"""Who decided, as the ledger records a person's decision: ``user@host``.

A proposal approved, edited or vetoed (at the prompt or with ``orchestrate proposals``), a
known-bad region cleared, an undecided experiment vetoed: each is recorded with the login and
the machine of the person who did it, so that on a ledger a team shares (PostgreSQL, a night on
call) the record says whose veto bars a value. The queue's timeout (``approval.TIMEOUT_BY``)
and the profile (``closures.CLOSED_BY``) decide under names of their own.
"""

from __future__ import annotations

import getpass
import socket

#: ``ProposalRecord.decided_by`` holds 64 characters; `` (edited)`` must fit after the name.
_ROOM = 64 - len(" (edited)")


def person() -> str:
    """``user@host`` of this process, cut to what the ledger's column holds."""
    try:
        user = getpass.getuser()
    except (OSError, KeyError):  # no login name and no passwd entry (a bare container)
        user = "person"
    host = socket.gethostname() or "localhost"
    return f"{user}@{host}"[:_ROOM]


def edited_by() -> str:
    """Who approved a proposal with another value than the one proposed."""
    return f"{person()} (edited)"
