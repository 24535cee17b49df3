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

``ensure_ports_free`` is the boot's check that nothing foreign listens on the pair once this
cluster's own engines are stopped.
"""

from __future__ import annotations

import contextlib
import hashlib
import shlex
import socket
from collections.abc import Iterator
from pathlib import Path

from cluster.errors import DeployError
from cluster.inventory import ClusterSpec
from cluster.transport import Transport, check

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


def _other_ports(cluster: ClusterSpec) -> str:
    """How this cluster gets other ports: a ``port: auto`` one chose its pair once and keeps
    it (``cluster.ports`` in a local head's workdir), so naming ``port: auto`` again is no
    advice for it."""
    if not cluster.auto_ports:
        return "give this cluster other ports (cluster.port and cluster.master_port, or port: auto)"
    if cluster.head.transport == "local":
        kept = Path(cluster.head.workdir) / PORTS_FILE
        return f"delete {kept} so that port: auto chooses a free pair again"
    return (
        "give this cluster ports of its own (cluster.port and cluster.master_port): port: auto "
        "derives the pair from the cluster's name and nodes, and cannot check a head it "
        "reaches over SSH"
    )


def ensure_ports_free(cluster: ClusterSpec, head: Transport) -> None:
    """Once this cluster's own engines are stopped, nothing may listen on the head's port or
    master port: whatever does is a foreign engine (another orchestrator's, another cluster's
    on the same machine) or another program, and a boot now would meet it. That is the
    host's fault, never the config's (class ``port_in_use``: retried, then the round stops).

    Raises:
        DeployError: a port is taken (class ``port_in_use``; names the node and the port).
        NodeError: the check could not run on the head.
    """
    node = cluster.head
    host = shlex.quote(node.host)
    body = (
        f"for p in {int(cluster.port)} {int(cluster.master_port)}; do "
        f'(exec 3<>"/dev/tcp/"{host}"/$p") 2>/dev/null && echo "$p"; done; exit 0'
    )
    result = check(head.run(["bash", "-c", body], timeout=30), node, "checking the ports")
    busy = [int(w) for w in result.stdout.split() if w.isdigit()]
    if busy:
        raise DeployError(
            f"{node.name}: port {busy[0]} on {node.host} is in use by something that is not "
            "this cluster's engine (its own were just stopped): another orchestrator's engine, "
            f"or another program; free it, or {_other_ports(cluster)}",
            failure_class="port_in_use",
            rank=node.rank,
            host=node.host,
        )
