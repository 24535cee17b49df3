"""Ports chosen per cluster (issue #17): ``port: auto`` in a profile's cluster section.

Two clusters on one machine (two twin demos in two directories) must not share the head's
HTTP port or its rendezvous port. With ``port: auto`` the pair is derived from the cluster's
identity (its name and every node's address and absolute workdir) as ``(P, P + 1)`` with P
even in 20000–29998. When the head runs on this machine the pair is also checked: if
something listens on either port the next pair is taken, and the choice is written to
``cluster.ports`` in the head's workdir, so every later command (a resume, ``bench``,
``cluster down``) finds the same pair even while this cluster's own engine holds it. Delete
that file to choose again. For a head reached over SSH the derived pair is used as it is
(the round's port check refuses a taken one with a line). The file is written by the deploy
that starts the engines (``keep_ports``), never by loading the profile: a command that only
reads (``status``, ``cluster status``, ``report``) leaves the folder as it found it.
"""

from __future__ import annotations

import contextlib
import hashlib
import socket
from collections.abc import Iterator
from pathlib import Path

from cluster.inventory import ClusterSpec

#: The file, in the head's workdir, that keeps the pair chosen for ``port: auto``.
PORTS_FILE = "cluster.ports"
LOW = 20000
PAIRS = 5000


def candidates(cluster: ClusterSpec) -> Iterator[tuple[int, int]]:
    """Every pair in the order ``port: auto`` tries them, the cluster's own first."""
    start = int(hashlib.sha256(cluster.identity().encode()).hexdigest(), 16) % PAIRS
    for i in range(PAIRS):
        port = LOW + 2 * ((start + i) % PAIRS)
        yield port, port + 1


def _free(host: str, port: int) -> bool:
    """Nothing listens on ``host:port`` (bound as an engine binds: SO_REUSEADDR)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _kept(path: Path) -> tuple[int, int] | None:
    try:
        words = path.read_text().split()
    except OSError:
        return None
    if len(words) == 2 and all(w.isdigit() and 1 <= int(w) <= 65535 for w in words):
        return int(words[0]), int(words[1])
    return None


def resolve_auto_ports(cluster: ClusterSpec) -> ClusterSpec:
    """``cluster`` with its ports chosen when it says ``port: auto`` (else as it is)."""
    if not cluster.auto_ports:
        return cluster
    head = cluster.head
    pair = next(candidates(cluster))
    if head.transport == "local":
        path = Path(head.workdir) / PORTS_FILE
        kept = _kept(path)
        if kept is not None:
            pair = kept
        else:
            pair = next(
                (
                    p
                    for p in candidates(cluster)
                    if _free(head.host, p[0]) and _free(head.host, p[1])
                ),
                pair,
            )
    return cluster.model_copy(update={"port": pair[0], "master_port": pair[1]})


def keep_ports(cluster: ClusterSpec) -> None:
    """Write the pair ``cluster`` runs on to its ``cluster.ports`` (a ``port: auto`` cluster
    whose head is local, where none is kept yet), before its engines take the pair: later
    commands then find it while those engines hold it."""
    head = cluster.head
    if not cluster.auto_ports or head.transport != "local":
        return
    path = Path(head.workdir) / PORTS_FILE
    if _kept(path) is not None:
        return
    with contextlib.suppress(OSError):  # unwritable: the same choice is made next time
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{cluster.port} {cluster.master_port}\n")
