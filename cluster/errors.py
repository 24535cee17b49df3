"""Deploy, node and bench failures. Each carries its evidence (a node's, a failure class for the
ledger; a bench request's, its URL and status)."""

from __future__ import annotations

import re
from typing import ClassVar

from knobs.vocabulary import FailureClass
from orchestrator.errors import OrchestrateError


class NodeError(OrchestrateError):
    """A node operation failed. ``failure_class`` says how; the rest is the evidence."""

    exit_code: ClassVar[int] = 6

    def __init__(
        self,
        message: str,
        *,
        failure_class: FailureClass,
        rank: int | None = None,
        host: str | None = None,
        command: str | None = None,
        returncode: int | None = None,
        stderr_tail: str = "",
        log_tail: str = "",
    ) -> None:
        super().__init__(message)
        self.failure_class: FailureClass = failure_class
        self.rank = rank
        self.host = host
        self.command = command
        self.returncode = returncode
        self.stderr_tail = stderr_tail
        self.log_tail = log_tail

    def evidence(self) -> str:
        """Everything known about the failure, for the ledger and MLflow."""
        parts = [self.message]
        if self.rank is not None:
            parts.append(f"node rank {self.rank} ({self.host})")
        if self.command:
            parts.append(f"command: {self.command}")
        if self.returncode is not None:
            parts.append(f"exit code: {self.returncode}")
        if self.stderr_tail:
            parts.append("stderr:\n" + self.stderr_tail)
        if self.log_tail:
            parts.append("log tail:\n" + self.log_tail)
        return "\n".join(parts)


class NodeUnreachable(NodeError):
    """The node cannot be reached or refuses us (network, auth, host key): exit 5."""

    exit_code = 5


class WorkdirUnwritable(NodeError):
    """A node's workdir refuses writes (a read-only file system, a folder of another user's):
    the node answered, and waiting for it does not help (exit 6)."""

    exit_code = 6


class DeployError(NodeError):
    """A boot failed: start, rendezvous, health, smoke, gates or clocks."""

    exit_code = 6


class OwnershipError(OrchestrateError):
    """Another orchestrator owns the cluster, or this one lost it (issue #17): exit 8."""

    exit_code = 8


class ClaimHeld(OwnershipError):
    """A node is claimed by another orchestrator, or serves a foreign engine on our ports;
    carries the node and who holds it."""

    def __init__(self, message: str, *, rank: int, host: str, holder: str) -> None:
        super().__init__(message)
        self.rank = rank
        self.host = host
        self.holder = holder


class OwnershipLost(OwnershipError):
    """This orchestrator's ledger lease or a node's claim was lost while it ran: the round
    stops at its next safe point, the experiment left undecided."""


class ClaimLost(OwnershipLost):
    """A node's claim was lost while this orchestrator ran (another took it, or it is gone),
    its ledger lease still its own: carries the node, who holds the claim now (``holder``,
    None when nobody does), who broke it where the ledger says (``by``, in words), and what
    was lost said without where the round stopped (``said``)."""

    def __init__(
        self,
        message: str,
        *,
        rank: int,
        host: str,
        holder: str | None,
        by: str | None = None,
        said: str | None = None,
    ) -> None:
        super().__init__(message)
        self.rank = rank
        self.host = host
        self.holder = holder
        self.by = by
        self.said = message if said is None else said


class BenchError(OrchestrateError):
    """A bench request or scrape failed: carries the URL, the HTTP status if any, the evidence."""

    exit_code: ClassVar[int] = 6

    def __init__(
        self,
        message: str,
        *,
        url: str,
        status: int | None = None,
        evidence: str = "",
        stopped: NodeError | None = None,
        hung: bool = False,
    ) -> None:
        super().__init__(message)
        self.url = url
        self.status = status
        self.evidence = evidence
        #: an engine the cell found stopped while it was silent (``cluster.stopped``): the
        #: node's fault, though its process may have been continued since
        self.stopped = stopped
        #: the engine went silent (no token by the cell's deadline), rather than failing
        #: requests: the error carries what the stall watches saw (``cluster.bench``)
        self.hung = hung


def of_node(name: str, text: str, what: str = "") -> str:
    """``text`` (a node's error, or its state) as one line of node ``name``, which names the
    node once, first: ``node-2: text``; a text that begins with the node already (an SSH
    error's ``node-2 (root@host:22): connect: …``) as it is; with ``what`` (``unreachable``,
    ``not claimed``), ``node-2: unreachable (root@host:22): connect: …``. The one place a
    node's line is prefixed (``cluster check|status|down|up``)."""
    own = re.match(rf"{re.escape(name)}(?: \(([^()]*)\))?: (.*)\Z", text, re.DOTALL)
    if not what:
        return text if own else f"{name}: {text}"
    if own is None:
        return f"{name}: {what}: {text}"
    where, rest = own.groups()
    return f"{name}: {what}{f' ({where})' if where else ''}: {rest}"


def describe(e: BaseException) -> str:
    """An exception in a few words: its type and, where it has one, its message."""
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


def tail(text: str, lines: int = 30) -> str:
    """The last ``lines`` lines of ``text``."""
    return "\n".join(text.splitlines()[-lines:])
