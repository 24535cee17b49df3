"""Multi-node rendezvous over TCP: rank 0 listens on ``--master-port``, headless ranks connect.

The protocol is one JSON object per line. A worker sends ``hello`` (its rank, the group size,
the fingerprint of its command line, its clocks, its cluster's rendezvous token); the head
answers ``welcome`` or ``reject`` and, on a clean shutdown, ``shutdown``. A worker whose token
is not the head's (another cluster's, issue #17) is refused without failing the head, which
keeps waiting for its own. Both sides keep the connection for the engine's life: a connection
that drops is a dead rank, as an NCCL failure would be.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from orchestrator.errors import OrchestrateError


class RendezvousError(OrchestrateError):
    """The group did not form: a rank missing after the timeout, or a rank that does not fit."""

    exit_code = 6

    def __init__(self, message: str, *, missing: tuple[int, ...] = ()) -> None:
        super().__init__(message)
        self.missing = missing


#: How often a worker tells its head it is there, and how long a rank may be silent before the
#: head's steps wait for it: a tensor-parallel step is a collective, which waits on its slowest
#: rank, so a worker stopped (SIGSTOP, a suspended host) holds every token (``Head.silent``).
#: Five seconds: far above what a loaded 2-core machine keeps an idle process off the CPU.
BEAT_S = 0.2
SILENT_S = 5.0
#: A watch that went this long without looking at its rank's connection (it reads every half
#: second) was itself kept off the CPU: the rank's beats waited unread, and what looked like
#: the rank's silence was this host's. Said in the engine's log; it holds nothing.
STARVED_S = 1.0

#: Why a head refuses a worker whose rendezvous token is not its own (issue #17).
FOREIGN_REASON = "rendezvous token does not match: this master serves another cluster"


@dataclass(frozen=True)
class Member:
    """A worker that joined: its rank, clocks and address."""

    rank: int
    matmul_rate: float
    sm_clock_mhz: float
    peer: str


def _send(sock: socket.socket, message: dict[str, Any]) -> None:
    sock.sendall((json.dumps(message) + "\n").encode())


class _Lines:
    """Reads newline-terminated JSON messages from a socket with a timeout per poll."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""

    def read(self, timeout: float) -> dict[str, Any] | None:
        """The next message; ``{}`` on timeout; ``None`` at end of stream.

        Raises:
            ValueError: a line that is not a JSON object.
        """
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                return {}
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(4096)
            except TimeoutError:
                return {}
            except OSError:
                return None
            if not data:
                return None
            self.buffer += data
        line, self.buffer = self.buffer.split(b"\n", 1)
        message = json.loads(line)
        if not isinstance(message, dict):
            raise ValueError("not a JSON object")
        return message


class Head:
    """Rank 0's side: accept ``nnodes - 1`` workers, then watch their connections."""

    def __init__(
        self,
        host: str,
        port: int,
        nnodes: int,
        fingerprint: str,
        started_at: float,
        *,
        token: str = "",
    ) -> None:
        self.nnodes = nnodes
        self.fingerprint = fingerprint
        self.started_at = started_at
        self.token = token
        #: called with (peer, rank) for a worker of another cluster, refused (issue #17)
        self.on_foreign: Callable[[str, object], None] | None = None
        self.members: dict[int, Member] = {}
        self._conns: dict[int, socket.socket] = {}
        #: by rank, when each member was last heard from
        self._heard: dict[int, float] = {}
        self._closing = False
        self.lost: int | None = None
        self.on_lost: Callable[[int], None] | None = None
        #: called with a rank once it has been silent for ``SILENT_S`` (the steps wait for it)
        self.on_silent: Callable[[int], None] | None = None
        #: called with a rank, seconds, and whether a beat of it was waiting, when its watch
        #: was kept off the CPU that long (``STARVED_S``): beats read late hold nothing
        self.on_starved: Callable[[int, float, bool], None] | None = None
        #: the ranks whose watch found them silent (``SILENT_S``), which the steps wait for
        self._silent: set[int] = set()
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.listener.bind((host, port))
        except OSError:
            self.listener.close()
            raise
        self.listener.listen(64)

    @property
    def address(self) -> str:
        """``host:port`` the head listens on."""
        host, port = self.listener.getsockname()[:2]
        return f"{host}:{port}"

    def wait(self, timeout: float, stopped: Callable[[], bool]) -> list[Member]:
        """Accept workers until every rank ``1..nnodes-1`` has joined.

        Raises:
            RendezvousError: a rank is still missing at ``timeout`` (seconds), or a worker
                does not fit the group (rank out of range or taken, other size, other config).
        """
        deadline = time.monotonic() + timeout
        want = set(range(1, self.nnodes))
        while want - set(self.members):
            if stopped():
                return list(self.members.values())
            left = deadline - time.monotonic()
            if left <= 0:
                missing = tuple(sorted(want - set(self.members)))
                raise RendezvousError(
                    f"timed out after {timeout:.2f}s waiting for node rank(s) "
                    f"{', '.join(map(str, missing))} to join at {self.address}",
                    missing=missing,
                )
            self.listener.settimeout(min(left, 0.05))
            try:
                conn, peer = self.listener.accept()
            except TimeoutError:
                continue
            self._admit(conn, f"{peer[0]}:{peer[1]}", deadline)
        for rank, conn in self._conns.items():
            threading.Thread(
                target=self._watch, args=(rank, conn), name=f"rank-{rank}", daemon=True
            ).start()
        return sorted(self.members.values(), key=lambda m: m.rank)

    def _admit(self, conn: socket.socket, peer: str, deadline: float) -> None:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            hello = _Lines(conn).read(max(0.5, deadline - time.monotonic()))
        except ValueError:
            hello = None
        if not hello or hello.get("type") != "hello":
            conn.close()
            return
        rank = hello.get("rank")
        if hello.get("token", "") != self.token:
            # another cluster's worker (same ports, same machine): refused, and it does not
            # fail this group, whose own workers may still come
            with contextlib.suppress(OSError):
                _send(conn, {"type": "reject", "reason": FOREIGN_REASON})
            conn.close()
            if self.on_foreign is not None:
                self.on_foreign(peer, rank)
            return
        problem: str | None = None
        if not isinstance(rank, int) or not 1 <= rank < self.nnodes:
            problem = f"node rank {rank!r} is not in 1..{self.nnodes - 1}"
        elif rank in self.members:
            problem = f"node rank {rank} joined twice (from {self.members[rank].peer} and {peer})"
        elif hello.get("nnodes") != self.nnodes:
            problem = (
                f"node rank {rank} was started with --nnodes {hello.get('nnodes')}, "
                f"rank 0 with {self.nnodes}"
            )
        elif hello.get("fingerprint") != self.fingerprint:
            problem = (
                f"node rank {rank} was started with another configuration than rank 0 "
                "(every rank must run the same command line)"
            )
        late = False
        started = hello.get("started_at")
        if problem is None and isinstance(started, int | float) and started > self.started_at:
            late = True
            problem = (
                f"node rank {rank} was started {started - self.started_at:.2f}s after rank 0; "
                "headless ranks must be up before rank 0 starts"
            )
        if problem is not None or not isinstance(rank, int):
            problem = problem or "malformed hello"
            with contextlib.suppress(OSError):
                _send(conn, {"type": "reject", "reason": problem})
            conn.close()
            raise RendezvousError(
                problem, missing=(rank,) if late and isinstance(rank, int) else ()
            )
        _send(conn, {"type": "welcome"})
        self._conns[rank] = conn
        self._heard[rank] = time.monotonic()
        self.members[rank] = Member(
            rank=rank,
            matmul_rate=float(hello.get("matmul_rate", 1.0)),
            sm_clock_mhz=float(hello.get("sm_clock_mhz", 0.0)),
            peer=peer,
        )

    def _watch(self, rank: int, conn: socket.socket) -> None:
        lines = _Lines(conn)
        looked = time.monotonic()
        while not self._closing:
            try:
                message = lines.read(0.5)
            except ValueError:
                message = None
            now = time.monotonic()
            if now - looked > 0.5 + STARVED_S and self.on_starved is not None:
                # this thread was kept off the CPU: the rank's beats waited unread, and the
                # time since the rank was last heard is this host's, not the rank's
                self.on_starved(rank, now - looked - 0.5, bool(message))
            looked = now
            if message:
                self._heard[rank] = now
                self._silent.discard(rank)
            elif (
                message is not None
                and rank not in self._silent
                and now - self._heard[rank] > SILENT_S
            ):
                # said before the steps wait for it: a hold the log does not say is none
                if self.on_silent is not None:
                    self.on_silent(rank)
                self._silent.add(rank)
            if message is None:
                if not self._closing and self.lost is None:
                    self.lost = rank
                    if self.on_lost is not None:
                        self.on_lost(rank)
                return

    def silent(self) -> bool:
        """Whether a member's watch found it unheard for ``SILENT_S`` (and said so): its engine
        is stopped, and the group's steps wait for it. A rank the watch has not looked at
        since (this host kept the watch off the CPU: its beats wait unread) holds nothing."""
        return bool(self._silent)

    def shutdown(self, *, notify: bool = True) -> None:
        """Close the connections; with ``notify`` tell every worker to exit cleanly first.

        Without ``notify`` (rank 0 is dying) the workers just see their connection drop.
        """
        self._closing = True
        for conn in self._conns.values():
            if notify:
                with contextlib.suppress(OSError):
                    _send(conn, {"type": "shutdown"})
            with contextlib.suppress(OSError):
                conn.close()
        with contextlib.suppress(OSError):
            self.listener.close()


def join(
    host: str,
    port: int,
    hello: dict[str, Any],
    timeout: float,
    stopped: Callable[[], bool],
) -> socket.socket | None:
    """Connect to the head, retrying until ``timeout``; ``None`` when stopped meanwhile.

    Raises:
        RendezvousError: the head did not answer in time, or it rejected this rank.
    """
    deadline = time.monotonic() + timeout
    while True:
        if stopped():
            return None
        try:
            sock = socket.create_connection((host, port), timeout=0.5)
        except OSError:
            if time.monotonic() >= deadline:
                raise RendezvousError(
                    f"timed out after {timeout:.2f}s waiting for master {host}:{port}"
                ) from None
            time.sleep(0.01)
            continue
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            _send(sock, {"type": "hello", **hello})
            reply = _Lines(sock).read(max(1.0, deadline - time.monotonic()))
        except (OSError, ValueError):
            reply = None
        if reply and reply.get("type") == "welcome":
            return sock
        sock.close()
        if reply and reply.get("type") == "reject":
            raise RendezvousError(f"master {host}:{port} rejected this rank: {reply.get('reason')}")
        if time.monotonic() >= deadline:
            raise RendezvousError(
                f"timed out after {timeout:.2f}s waiting for master {host}:{port}"
            )
        time.sleep(0.01)


def follow(sock: socket.socket, stopped: Callable[[], bool]) -> str:
    """Hold a worker's connection until the head says ``shutdown``, goes away, or we stop,
    telling the head every ``BEAT_S`` that this rank is there.

    Returns ``"shutdown"``, ``"lost"`` or ``"stopped"``.
    """
    lines = _Lines(sock)
    beat = 0.0
    while not stopped():
        if time.monotonic() >= beat:
            beat = time.monotonic() + BEAT_S
            try:
                _send(sock, {"type": "beat"})
            except OSError:
                return "lost"
        try:
            message = lines.read(0.05)
        except ValueError:
            return "lost"
        if message is None:
            return "lost"
        if message.get("type") == "shutdown":
            return "shutdown"
    return "stopped"
