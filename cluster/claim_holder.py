"""Who holds a node's claim (``cluster.claims``), as written to the node and read back: the
holder (``Holder``: what holds it, the cluster, the ledger URL with its password hidden, user,
host and pid: never a secret), the claim as seen (``Seen``: its holder and the seconds left on
the node's clock), and when a claim is stale and may be taken over (``Seen.stale``: expired on
the node's clock, its holder's process on this machine gone, or never finished).
"""

from __future__ import annotations

import getpass
import json
import os
import re
import socket
import uuid
from dataclasses import asdict, dataclass

_PRINTABLE = re.compile(r"[^\x20-\x7e]")


def printable(value: object, limit: int = 200) -> str:
    """A value read from a node, fit to print on one line (it may be anyone's)."""
    return _PRINTABLE.sub("?", str(value))[:limit]


@dataclass(frozen=True)
class Holder:
    """Who holds (or wants) a claim: what is shown to whoever is refused."""

    id: str
    what: str
    cluster: str
    ledger: str
    user: str
    hostname: str
    pid: int

    @classmethod
    def this_process(cls, what: str, cluster: str, ledger: str) -> Holder:
        """This process as a holder; ``ledger`` must already have its password hidden."""
        try:
            user = getpass.getuser()
        except (KeyError, OSError):  # no USER and no passwd entry (a bare container)
            user = "?"
        return cls(
            id=uuid.uuid4().hex,
            what=what,
            cluster=cluster,
            ledger=ledger,
            user=user,
            hostname=socket.gethostname(),
            pid=os.getpid(),
        )

    def to_json(self) -> str:
        """One line of printable ASCII (what goes into the remote command)."""
        return json.dumps(asdict(self), ensure_ascii=True, sort_keys=True)

    @classmethod
    def parse(cls, text: str, holder_id: str) -> Holder:
        """A holder read from a node; whatever is missing or malformed reads as ``?``."""
        try:
            data = json.loads(text)
        except ValueError:
            data = {}
        if not isinstance(data, dict):
            data = {}
        pid = data.get("pid")
        return cls(
            id=holder_id,
            what=printable(data.get("what", "?")),
            cluster=printable(data.get("cluster", "?")),
            ledger=printable(data.get("ledger", "?")),
            user=printable(data.get("user", "?")),
            hostname=printable(data.get("hostname", "?")),
            pid=pid if isinstance(pid, int) and not isinstance(pid, bool) else -1,
        )

    def describe(self) -> str:
        """``round of cluster C by user@host (pid N), ledger URL``."""
        return (
            f"{self.what} of cluster {self.cluster} by {self.user}@{self.hostname} "
            f"(pid {self.pid}), ledger {self.ledger}"
        )

    def gone(self) -> bool:
        """It ran on this machine and that process no longer exists."""
        if self.hostname != socket.gethostname() or self.pid <= 0:
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False


@dataclass(frozen=True)
class Seen:
    """A node's claim as read: its holder (None while it is being made) and the seconds left
    before it expires on the node's clock (None when unreadable)."""

    holder: Holder | None
    left_s: int | None

    def describe(self) -> str:
        """Who holds it, and for how long yet."""
        if self.holder is None:
            return "a claim being made (no holder yet)"
        if self.left_s is None:
            return self.holder.describe()
        if self.left_s <= 0:
            return f"{self.holder.describe()}, expired {-self.left_s}s ago"
        return f"{self.holder.describe()}, expires in {self.left_s}s unless renewed"

    def stale(self) -> str | None:
        """Why this claim may be taken over, or None while it is live."""
        if self.holder is None:
            return "it was never finished"
        if self.left_s is not None and self.left_s <= 0:
            return f"it expired {-self.left_s}s ago on the node's clock"
        if self.holder.gone():
            return f"its process {self.holder.pid} on this machine is gone"
        return None


def same_process(a: Holder, b: Holder) -> bool:
    """``a`` and ``b`` name the same process (whatever their ids)."""
    return (a.what, a.cluster, a.user, a.hostname, a.pid) == (
        b.what,
        b.cluster,
        b.user,
        b.hostname,
        b.pid,
    )
