"""The cluster's nodes as one deployer drives them: each node's transport, a step run on every
node at once, what a node is asked (reached, its engine log, its engine alive, its disk), and
the hooks the driving process is given (its progress line, the fence, the unbroken block).

It owns how per-node steps run together: at once, the first error in rank order raised (or
each node's ``NodeError`` kept as its result), or one node at a time for the baseline of
``bench/deploy.py``. ``cluster.deploy``, ``cluster.readiness`` and ``cluster.teardown`` drive
through it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from typing import TypeVar

from cluster import engine_process
from cluster.blame import Blame
from cluster.errors import NodeError
from cluster.gates import GateSpec
from cluster.inventory import ClusterSpec, NodeSpec
from cluster.launcher import LOG, alive_command
from cluster.transport import Transport, check

T = TypeVar("T")

Progress = Callable[[str], None]
#: Called right before a command that stops or starts an engine (or replaces its launcher)
#: goes out to a node: raises when the cluster is no longer this process's to drive.
Fence = Callable[[], None]
#: A block no signal may cut short: a teardown under way finishes (``orchestrator.interrupts``).
Unbroken = Callable[[], AbstractContextManager[object]]


class Nodes:
    """One cluster's nodes through their transports, with the driving process's hooks."""

    def __init__(
        self,
        cluster: ClusterSpec,
        transports: Mapping[int, Transport],
        *,
        progress: Progress | None = None,
        fence: Fence | None = None,
        unbroken: Unbroken | None = None,
        parallel: bool = True,
    ) -> None:
        self.cluster = cluster
        self.transports = dict(transports)
        #: the progress line (the round's phase line); ``quiet`` silences it for a while
        self.progress: Progress = progress or _silent
        # asked as close to each stop and launch as the code gets: a process suspended after a
        # node's progress line and woken after another took the cluster over must not stop or
        # start that node under the new owner (issue #17)
        self.fence: Fence = fence or _open
        # a teardown that has begun finishes: cut short by a signal, it leaves engines running
        self.unbroken: Unbroken = unbroken or contextlib.nullcontext
        # False runs every per-node step one node at a time (the baseline of bench/deploy.py)
        self.parallel = parallel

    def transport(self, node: NodeSpec) -> Transport:
        """``node``'s transport."""
        return self.transports[node.rank]

    @contextlib.contextmanager
    def quiet(self) -> Iterator[None]:
        """A block during which the progress shows nothing (it may be what failed)."""
        progress, self.progress = self.progress, _silent
        try:
            yield
        finally:
            self.progress = progress

    def on_every(self, nodes: Sequence[NodeSpec], fn: Callable[[NodeSpec], T]) -> list[T]:
        """``fn`` on every node at once; the first error (in rank order) is raised."""
        if not self.parallel:
            return [fn(n) for n in nodes]
        with ThreadPoolExecutor(max_workers=max(1, len(nodes))) as pool:
            futures = [pool.submit(fn, n) for n in nodes]
            return [f.result() for f in futures]

    def each(self, nodes: Sequence[NodeSpec], fn: Callable[[NodeSpec], T]) -> list[T | NodeError]:
        """``fn`` on every node at once; a node's ``NodeError`` is its result, not raised."""

        def settled(node: NodeSpec) -> T | NodeError:
            try:
                return fn(node)
            except NodeError as e:
                return e

        return self.on_every(nodes, settled)

    def close(self) -> None:
        """Close every node's transport (SSH connections)."""
        for transport in self.transports.values():
            transport.close()

    def reach(self) -> dict[int, NodeError | None]:
        """Open every node's connection at once and run ``true`` on it: rank → its error, or
        None when it answered. Connections stay open for what follows."""
        nodes = sorted(self.cluster.nodes, key=lambda n: n.rank)
        results = self.each(
            nodes,
            lambda n: check(self.transport(n).run(["true"], timeout=60), n, "reaching the node"),
        )
        return {
            n.rank: r if isinstance(r, NodeError) else None
            for n, r in zip(nodes, results, strict=True)
        }

    def log_of(self, node: NodeSpec, max_bytes: int = 2_000_000) -> str:
        """The engine log of ``node`` ('' if none)."""
        return self.transport(node).read_text(f"{node.workdir}/{LOG}", max_bytes=max_bytes)

    def logs(self, skip: Mapping[int, str] | None = None) -> dict[int, str]:
        """Every node's engine log, by rank, read at once (a node that cannot be read gives
        its error; ``skip`` maps ranks known to be unreachable to why, not tried again)."""
        skip = skip or {}
        nodes = sorted((n for n in self.cluster.nodes if n.rank not in skip), key=lambda n: n.rank)
        out = {rank: f"<log unavailable: {why}>" for rank, why in skip.items()}
        for n, r in zip(nodes, self.each(nodes, self.log_of), strict=True):
            out[n.rank] = f"<log unavailable: {r}>" if isinstance(r, NodeError) else r
        return dict(sorted(out.items()))

    def alive(self, node: NodeSpec) -> bool:
        """Whether the node's engine process group is alive."""
        return self.transport(node).run(alive_command(node), timeout=30).returncode == 0

    def disk_free(self, node: NodeSpec) -> tuple[int, int] | None:
        """KiB free and KiB in all on the filesystem of ``node``'s workdir (``df -P``); None
        where the node cannot be asked or its ``df`` prints something else."""
        try:
            result = self.transport(node).run(["df", "-Pk", "--", node.workdir], timeout=30)
        except NodeError:
            return None
        fields = result.stdout.strip().splitlines()[-1].split() if result.stdout.strip() else []
        if result.returncode != 0 or len(fields) < 4 or not all(f.isdigit() for f in fields[1:4]):
            return None
        return int(fields[3]), int(fields[1])

    def blamer(
        self,
        gates: GateSpec,
        log_of: Callable[[NodeSpec], str],
        container_of: Callable[[NodeSpec], str | None] = lambda _node: None,
    ) -> Blame:
        """A ``Blame`` that reads each node's log with ``log_of`` and asks the node the rest;
        ``container_of``: the container a node's engine runs in, if its launcher names one
        (``engine_process.container_of``), whose runtime is asked too."""
        return Blame(
            self.cluster,
            gates,
            log_of=log_of,
            alive=self.alive,
            disk_free=self.disk_free,
            stopped_of=lambda n: engine_process.stopped(self.transport(n), n, container_of(n)),
            killed_of=lambda n: engine_process.killed_by(self.transport(n), n, container_of(n)),
        )


def _silent(message: str) -> None:
    """A progress that shows nothing."""


def _open() -> None:
    """A fence that lets every command through (a deployer that holds no lease)."""
