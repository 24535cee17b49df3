"""One owner per cluster: the ledger's lease (one orchestrator per ledger and cluster; a killed
one is replaced) and, whatever the ledger, a claim on every node (``cluster.claims``, issue
#17), held together by ``Ownership``."""

from __future__ import annotations

import os
import re
import socket
import threading
import uuid
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import asdict
from datetime import UTC, datetime
from types import TracebackType

from cluster.claim_holder import Holder, Seen
from cluster.claims import NodeClaims
from cluster.connect import open_transport
from cluster.errors import (
    ClaimLost,
    NodeError,
    NodeUnreachable,
    OwnershipLost,
    WorkdirUnwritable,
)
from cluster.inventory import ClusterSpec, NodeSpec
from knobs.vocabulary import EventKind
from ledger import EventRecord, LeaseLost, LeaseRecord, Ledger, LedgerError
from orchestrator.timestamps import utc_minute

#: What a round that lost the cluster is told to do, whatever it was doing.
UNDECIDED = (
    "the experiment left undecided: run the same command to resume once the cluster is yours again"
)
#: A claim lost with no breaker in this ledger: whose doing it was, as far as anyone can say.
UNRECORDED = (
    "nobody recorded breaking it (no `orchestrate cluster down|up --force` of this ledger): a "
    "person, a cleanup job or an orchestrator of another ledger changed the node's "
    "claim; the node's, not the config's"
)
#: A boot cut short by a claim lost with no breaker: nobody recorded stopping its engines.
LEFT_UP = (
    "; it did not stop its engines (a node it no longer holds is not touched): `orchestrate "
    "cluster down` stops any left once the cluster is yours"
)


#: A boot cut short by a claim lost with no breaker, whose engines the round stopped itself.
STOPPED_STARTED = (
    "; it stopped the engines this boot started ({stopped}), each checked by its process group "
    "and start time, so nothing of whoever holds the node now was touched; `orchestrate "
    "cluster down` stops any left once the cluster is yours"
)


def _process_gone(lease: LeaseRecord) -> bool:
    """A lease is stale when its holder ran on this host and that process no longer exists."""
    if lease.hostname != socket.gethostname():
        return False
    try:
        os.kill(lease.pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def held(lease: LeaseRecord | None) -> bool:
    """Whether ``lease`` is held now: not expired, and its holder not a process of this host
    that is gone (a round killed a moment ago leaves its lease unexpired)."""
    if lease is None:
        return False
    return lease.expires_at > datetime.now(UTC) and not _process_gone(lease)


def state(lease: LeaseRecord, now: datetime | None = None) -> str:
    """``lease`` at ``now`` (default: now), in one word: ``held`` (``held``); ``gone`` (its
    holder ran on this host and is gone); ``suspended`` (expired while its holder, a process
    of this host, still exists: stopped, Ctrl-Z or a laptop asleep, and not renewing it); or
    ``expired`` (another host's holder, which this host cannot see)."""
    if _process_gone(lease):
        return "gone"
    if lease.expires_at > (now or datetime.now(UTC)):
        return "held"
    return "suspended" if lease.hostname == socket.gethostname() else "expired"


class ClusterLease:
    """Holds a cluster's lease while in a ``with`` block, renewing it in the background.

    The lease is lost only when the ledger says it is another's or gone (``LeaseLost``). A
    ledger that does not answer for a while (a PostgreSQL restart at night) loses nothing: the
    renewal is tried again, and the ledger decides when it answers, as a node's claim is
    renewed when the node answers again (``cluster.claims``). Another orchestrator cannot
    take over meanwhile: the lease's row is still this holder's until it expires, and the
    claims on the nodes are renewed over SSH all along.

    While held, every write the ledger makes is fenced with it (``Ledger.fence``): a process
    suspended past its lease while another took the cluster over writes nothing more on
    waking (``LeaseLost``), whatever it was doing.
    """

    def __init__(
        self,
        ledger: Ledger,
        cluster: str,
        *,
        ttl_s: float = 120.0,
        gone: threading.Event | None = None,
    ) -> None:
        self.ledger = ledger
        self.cluster = cluster
        self.ttl_s = ttl_s
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.lost: LeaseLost | None = None
        #: set the moment the ledger says the lease is another's or gone, from whichever
        #: thread learns it (the renewal's, on waking): a bench cell stops at it
        self.gone = gone or threading.Event()

    def __enter__(self) -> ClusterLease:
        """Take the lease.

        Raises:
            LeaseHeld: another live orchestrator holds it.
        """
        self.ledger.acquire_lease(
            self.cluster,
            holder=self.holder,
            hostname=socket.gethostname(),
            pid=os.getpid(),
            ttl_s=self.ttl_s,
            stale=_process_gone,
        )
        self.ledger.fence(self.cluster, self.holder)
        self._thread = threading.Thread(target=self._renew, name="lease", daemon=True)
        self._thread.start()
        return self

    def check(self) -> None:
        """Renew the lease now (a safe point of the round).

        Raises:
            OwnershipLost: the ledger says the lease is another's, or gone.
        """
        if self.lost is None:
            self._renew_once()
        if self.lost is not None:
            # the ledger's line: who took it over, when, and that nothing more was written
            raise OwnershipLost(self.lost.message)

    def _renew(self) -> None:
        while not self._stop.wait(self.ttl_s / 3):
            self._renew_once()
            if self.lost is not None:
                return

    def _renew_once(self) -> None:
        """Renew the lease; ``lost`` when the ledger says it is another's or gone."""
        try:
            self.ledger.renew_lease(self.cluster, holder=self.holder, ttl_s=self.ttl_s)
        except LeaseLost as e:
            self.lost = e
            self.gone.set()
        except LedgerError:
            pass  # the ledger did not answer: still this holder's, renewed when it answers

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.ledger.fence(None)
        try:
            self.ledger.release_lease(self.cluster, holder=self.holder)
        except LedgerError:
            if exc is None:
                raise


def still_leased(ledger: Ledger) -> None:
    """The lease ``ledger``'s writes are fenced with still names this process, asked now (one
    small query; nothing when it holds none): asked before each cell, and by the deployer right
    before each node's stop or launch command goes out (its ``fence``), so that a process woken
    after another took the cluster over touches none of that one's engines. A ledger that does
    not answer says nothing here: every write is fenced itself, and waits the outage out as it
    would.

    Raises:
        LeaseLost: the lease is another's now, or gone (exit 8, the line of ``ledger.fence``).
    """
    try:
        ledger.check_fence()
    except LeaseLost:
        raise
    except LedgerError as e:
        if not e.unreachable:
            raise


def hidden_password(url: str) -> str:
    """``url`` with its password as ``***``: what a claim on a node may show of a ledger."""
    return re.sub(r"(://[^/@:]*:)[^/@]*@", r"\1***@", url)


class Ownership:
    """The ledger's lease (with ``lease``) and a claim on every node of ``cluster``, held while
    in a ``with`` block (issue #17). ``check()`` is the round's safe point; a claim broken with
    ``force`` is recorded in the ledger (``EventKind.CLAIM_BROKEN``)."""

    def __init__(
        self,
        cluster: ClusterSpec,
        *,
        what: str,
        ledger_url: str,
        ledger: Callable[[], Ledger],
        lease: bool = True,
        force: bool = False,
        note: Callable[[str], None] | None = None,
        skip_unreachable: bool = False,
        ttl_s: float = 120.0,
        gone: threading.Event | None = None,
    ) -> None:
        self.cluster = cluster
        self.holder = Holder.this_process(what, cluster.name, hidden_password(ledger_url))
        self._ledger = ledger
        self._lease_wanted = lease
        self.force = force
        self._note = note or (lambda _line: None)
        self.skip_unreachable = skip_unreachable
        self.ttl_s = ttl_s
        #: set when the lease is found another's (``ClusterLease.gone``) or a node's claim
        #: another's or gone (``NodeClaims.gone``): the one cutoff a bench cell stops at
        self.gone = gone or threading.Event()
        self.lease: ClusterLease | None = None
        self.claims: NodeClaims | None = None
        #: the holders whose claims this one broke (``force``)
        self.broken: list[Holder] = []
        self._stack = ExitStack()

    def __enter__(self) -> Ownership:
        """Take the ledger's lease, then claim every node (own connections to each).

        Raises:
            LeaseHeld: another live orchestrator of the same ledger holds the cluster.
            ClaimHeld: a node is claimed by another live orchestrator, whatever its ledger.
            NodeError: a node could not be reached to claim it.
        """
        with ExitStack() as stack:
            if self._lease_wanted:
                lease = ClusterLease(
                    self._ledger(), self.cluster.name, ttl_s=self.ttl_s, gone=self.gone
                )
                self.lease = stack.enter_context(lease)
            transports = {n.rank: open_transport(n, self.cluster.ssh) for n in self.cluster.nodes}
            for transport in transports.values():
                stack.callback(transport.close)
            claims = NodeClaims(
                self.cluster,
                transports,
                self.holder,
                ttl_s=self.ttl_s,
                force=self.force,
                note=self._note,
                broken=self._record,
                skip_unreachable=self.skip_unreachable,
                gone=self.gone,
            )
            try:
                self.claims = stack.enter_context(claims)
            except WorkdirUnwritable:
                raise  # the node answered: no waiting for it fixes its folder
            except NodeError as err:
                # the infrastructure's fault, before anything ran: said as such (exit 5)
                raise NodeUnreachable(
                    f"node {err.rank} ({err.host}): {err.failure_class} when claiming it, "
                    f"before anything started: {err.message}; run the same command again once "
                    "the node is back",
                    failure_class=err.failure_class,
                    rank=err.rank,
                    host=err.host,
                ) from err
            self._stack = stack.pop_all()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stack.__exit__(exc_type, exc, tb)

    def check(self) -> None:
        """Renew the lease and every claim now: the round's safe point (before each boot, and
        before a boot's teardown).

        Raises:
            OwnershipLost: one of them was lost; nothing of this round runs on the nodes now
                (a cell under way stopped at ``gone``). The lease lost is said as the ledger
                says it (taken over: the round goes on under the one that took it); a claim
                lost names the node and who holds it now.
        """
        if self.lease is not None:
            self.lease.check()
        try:
            if self.claims is not None:
                self.claims.check()
        except ClaimLost as e:
            by = self._broken_by()
            said = f"{e.message}: {by or UNRECORDED}"
            raise ClaimLost(
                f"{said}; stopped before the next boot, {UNDECIDED}",
                rank=e.rank,
                host=e.host,
                holder=e.holder,
                by=by,
                said=said,
            ) from e

    def _broken_by(self) -> str | None:
        """Who broke this holder's claims, as the ledger recorded it (``cluster down|up
        --force`` of the same ledger), in words; None where it did not (another ledger's, a
        claim removed by hand) or the ledger does not answer now."""
        try:
            events = self._ledger().events(self.cluster.name, EventKind.CLAIM_BROKEN)
        except LedgerError:
            return None
        for event in reversed(events):
            old = event.detail.get("holder")
            if isinstance(old, dict) and old.get("id") == self.holder.id:
                return breaker(event)
        return None

    def broke(self, lease: LeaseRecord | None) -> Holder | None:
        """The holder whose claims this one broke that holds ``lease`` (the same process:
        host and pid), if any: the round whose engines this command stops."""
        if lease is None:
            return None
        return next(
            (h for h in self.broken if (h.hostname, h.pid) == (lease.hostname, lease.pid)),
            None,
        )

    def _record(self, node: NodeSpec, seen: Seen, why: str) -> None:
        old = asdict(seen.holder) if seen.holder is not None else {}
        if seen.holder is not None:
            self.broken.append(seen.holder)
        self._ledger().add_event(
            self.cluster.name,
            EventKind.CLAIM_BROKEN,
            subject=f"node {node.rank} {node.host}",
            detail={"holder": old, "expires_in_s": seen.left_s, "by": asdict(self.holder)},
            reason=why,
            actor=f"{self.holder.user}@{self.holder.hostname} ({self.holder.what})",
        )
        self._note(f"{node.name}: broke the claim of {seen.describe()} ({why}); recorded")


def forced(what: str, user: str, hostname: str, pid: int) -> str:
    """A command that broke claims by force, in words: ```orchestrate cluster down --force`
    (user@host, pid N)``."""
    return f"`orchestrate {what} --force` ({user}@{hostname}, pid {pid})"


def breaker(event: EventRecord) -> str:
    """Who broke a claim (a ``claim-broken`` event) and when, in words; an event of an older
    release, which did not record the breaker's pid, names it as it was recorded."""
    by = event.detail.get("by")
    if isinstance(by, dict):
        pid = by.get("pid")
        who = forced(
            str(by.get("what", "?")),
            str(by.get("user", "?")),
            str(by.get("hostname", "?")),
            pid if isinstance(pid, int) else -1,
        )
    else:
        who = f"{event.actor} with --force"
    return f"{who} broke it at {utc_minute(event.created_at)}"


def lost_at(lost: ClaimLost, where: str, *, closed: bool, stopped: str | None = None) -> ClaimLost:
    """``lost`` said where the round was when it learned it (``where``: ``mid-boot, during
    cell 1 of 3 (…) of experiment #4``), whether it closed its boot (``closed``), and, a claim
    nobody recorded breaking, what became of the engines the boot started (``stopped``:
    ``node-0: stopped, …``; None: nothing stopped)."""
    boot = "; its boot is closed in the ledger" if closed else ""
    if lost.by is None:
        boot += LEFT_UP if not stopped else STOPPED_STARTED.format(stopped=stopped)
    return ClaimLost(
        f"{lost.said}; stopped {where}{boot}: {UNDECIDED}",
        rank=lost.rank,
        host=lost.host,
        holder=lost.holder,
        by=lost.by,
        said=lost.said,
    )
