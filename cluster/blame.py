"""Whose fault a failed boot is: the failure class a node's log names, and which node to blame
when one rank's death takes the others with it (issue #4). ``Deployer`` asks it when an engine
is found dead; the class it gives decides whether the round charges the configuration (an OOM,
a KV-capacity refusal) or the infrastructure (a port in use, a worker that never joined).
"""

from __future__ import annotations

import re
import signal
from collections.abc import Callable, Collection, Sequence

from cluster.errors import DeployError, tail
from cluster.gates import GateSpec
from cluster.inventory import ClusterSpec, NodeSpec
from knobs.spec import clipped
from knobs.vocabulary import INFRASTRUCTURE, FailureClass

#: A filesystem with less free than this (KiB), or than a hundredth of its size, is full: an
#: engine that failed on it with a log that names no cause failed of the disk
DISK_FULL_KIB = 256 * 1024


class Blame:
    """Reads the nodes' logs and liveness to name a failed boot's class and its node."""

    def __init__(
        self,
        cluster: ClusterSpec,
        gates: GateSpec,
        *,
        log_of: Callable[[NodeSpec], str],
        alive: Callable[[NodeSpec], bool],
        disk_free: Callable[[NodeSpec], tuple[int, int] | None] | None = None,
        stopped_of: Callable[[NodeSpec], str | None] | None = None,
        killed_of: Callable[[NodeSpec], signal.Signals | None] | None = None,
    ) -> None:
        self.cluster = cluster
        self.gates = gates
        self._log_of = log_of
        self._alive = alive
        #: a node's workdir's filesystem: KiB available and KiB in all, or None where unknown
        self._disk_free = disk_free
        #: a node's engine process found stopped, in words (``engine_process.stopped``)
        self._stopped_of = stopped_of
        #: the signal a node's dead engine died of, sent from outside (``engine_process``)
        self._killed_of = killed_of

    def classify(self, log: str) -> FailureClass | None:
        """The failure class a log's lines name, if any (the profile's failure patterns)."""
        for cls, patterns in self.gates.failure_patterns.items():
            if any(re.search(p, log, re.IGNORECASE) for p in patterns):
                return cls
        return None

    def died(self, node: NodeSpec, what: str, *, default: FailureClass = "start") -> DeployError:
        """``node``'s engine exited (``what``: when): the class its log names and the line
        that names it, else ``default``, with the log's tail as evidence."""
        log = self._log_of(node)
        named = self.classify(log)
        failure = named or default
        message = f"{node.name}: engine exited {what}"
        if named is None:
            killed = self.killed(node, message, log)
            if killed is not None:
                return killed
        if named is None and default not in INFRASTRUCTURE:
            full = self.full_disk(node, message, log)
            if full is not None:
                return full
        line = "" if named is None else self._line(log, named)
        if failure == "port_in_use":
            # the port as the line names it (host:port, "port: N", uvicorn's ('host', N)),
            # after a log prefix's time stamp and source ("… [api_server.py:1930]")
            start = line.find("]") + 1
            port = re.search(r"(?:[\w.\]]:|\bport:? |', )(\d{2,5})\b", line[start:])
            taken = f"port {port.group(1)}" if port else "a port it binds"
            message = f"{node.name}: {taken} on {node.host} is in use, engine exited {what}: {line}"
        elif line:
            # the line that names it (a GPU's fault, an OOM, a KV cache too small): the stop's
            # line and the verdict's reason say what the log said
            message = f"{message}: {line}"
        return DeployError(
            message,
            failure_class=failure,
            rank=node.rank,
            host=node.host,
            log_tail=tail(log, 25),
        )

    def hung(self, node: NodeSpec, message: str, failure: FailureClass) -> DeployError:
        """A boot that timed out on ``node`` (``message``: its ready line or the head's /health
        never came, or its log stopped; ``failure``: the class a timeout is): the
        infrastructure's class a node's log names instead, if one does (an engine that logged
        a full disk, a port clash or a worker gone and hung there), on that node."""
        named = self.named(message, node, INFRASTRUCTURE) or self.stopped(message)
        if named is not None:
            return named
        log = self._log_of(node)
        full = None if self.classify(log) is not None else self.full_disk(node, message, log)
        return full or DeployError(
            message, failure_class=failure, rank=node.rank, host=node.host, log_tail=tail(log, 25)
        )

    def stopped(self, message: str) -> DeployError | None:
        """``engine_stopped`` on the first node (the head, then the workers from the last rank)
        whose engine has a process found stopped as a boot hung or a cell failed
        (``message``), or whose container is paused: a SIGSTOP, a ``docker pause``, a
        suspended host or a debugger holds it, and a tensor-parallel group waits on its
        slowest rank, so the head stops answering for it. No config stops its own engine: the
        node's, never the config's. None when none is."""
        if self._stopped_of is None:
            return None
        for node in [self.cluster.head, *self.cluster.workers_desc]:
            found = self._stopped_of(node)
            if found is not None:
                return DeployError(
                    f"{message}; {node.name}'s engine was found stopped on {node.host}: "
                    f"{found} (a SIGSTOP, a `docker pause`, a suspended host or a debugger, never "
                    "the config)",
                    failure_class="engine_stopped",
                    rank=node.rank,
                    host=node.host,
                )
        return None

    def killed(self, node: NodeSpec, message: str, log: str) -> DeployError | None:
        """``engine_killed`` on ``node`` when its engine (``message``: it exited) died of a
        SIGTERM, SIGINT, SIGHUP or SIGQUIT that orchestrate did not send: a person's kill, a
        service manager, a host shutting down. None otherwise (SIGKILL stays the config's
        unless the log names it: the OOM killer sends it too)."""
        sig = self._killed_of(node) if self._killed_of is not None else None
        if sig is None:
            return None
        return DeployError(
            f"{message}: killed by {sig.name} from outside on {node.host} (orchestrate did not "
            "send it: a person's kill, a service manager, a host shutting down), never the "
            "config",
            failure_class="engine_killed",
            rank=node.rank,
            host=node.host,
            log_tail=tail(log, 25),
        )

    def full_disk(self, node: NodeSpec, message: str, log: str) -> DeployError | None:
        """``disk_full`` on ``node`` when its workdir's filesystem is full (``DISK_FULL``) as
        its engine failed with nothing in its log to say why: an engine that filled the disk
        cannot write the line that would say so, and its log is then empty or stops short. A
        failure with such a log on a disk with room stays the config's (None)."""
        room = self._disk_free(node) if self._disk_free is not None else None
        if room is None:
            return None
        available, size = room
        if available >= min(DISK_FULL_KIB, size / 100):
            return None
        return DeployError(
            f"{message}, its log naming no cause, and {node.host}:{node.workdir} is on a full "
            f"disk ({available} KiB free of {size}): the node's, however the config filled it",
            failure_class="disk_full",
            rank=node.rank,
            host=node.host,
            log_tail=tail(log, 25),
        )

    def named(
        self,
        message: str,
        first: NodeSpec,
        classes: Collection[FailureClass],
        *,
        log_of: Callable[[NodeSpec], str] | None = None,
    ) -> DeployError | None:
        """The first of ``classes`` a node's log names (``first``'s log read first, then the
        others' in rank order; ``log_of``: what of a node's log to read, else all of it), as
        that node's failure: ``message`` and the line that names it; ``None`` when no log names
        one."""
        read = log_of or self._log_of
        for other in [first, *(n for n in self.cluster.nodes if n != first)]:
            log = read(other)
            cls = self.classify(log)
            if cls is not None and cls in classes:
                return DeployError(
                    f"{message}; {other.name}'s log says: {self._line(log, cls)}",
                    failure_class=cls,
                    rank=other.rank,
                    host=other.host,
                    log_tail=tail(log, 25),
                )
        return None

    def _line(self, log: str, cls: FailureClass) -> str:
        """The first line of ``log`` that names ``cls`` (its failure patterns), in at most 300
        characters, cut at a word (``clipped``): the words a failure's message quotes."""
        return clipped(_first_line(log, self.gates.failure_patterns.get(cls, ())), 300)

    def lost(
        self,
        found: NodeSpec,
        what: str = "before /health was 200",
        *,
        default: FailureClass = "start",
    ) -> DeployError:
        """Who failed, once an engine is found dead (``what``: while the head booted, or while
        a cell was measured).

        When one rank dies the others follow (a head whose worker left, workers whose head
        left), so the first corpse found is not necessarily the culprit. In order: a head
        whose log names its own failure (OOM, …); a worker whose log names one; a dead worker
        that did not exit because the head went away (``worker_follows_head``: the worker
        itself was lost, the node's doing, as a worker killed or its node gone); the head,
        with ``default`` where its log names nothing.
        """
        head = self.cluster.head
        dead = [n for n in [head, *self.cluster.workers_desc] if n == found or not self._alive(n)]
        logs = {n.rank: self._log_of(n) for n in dead}
        for node in dead:
            if self.classify(logs[node.rank]) not in (None, "worker_missing"):
                return self.died(node, what, default=default)
        for node in dead:
            follows = any(re.search(p, logs[node.rank]) for p in self.gates.worker_follows_head)
            if node.rank != 0 and not follows:
                return self.died(node, what, default="worker_missing")
        if head in dead:
            return self.died(head, what, default=default)
        return self.died(found, what, default="worker_missing")


def _first_line(text: str, patterns: Sequence[str]) -> str:
    """The first line of ``text`` any of ``patterns`` finds (case aside), stripped."""
    for line in text.splitlines():
        if any(re.search(p, line, re.IGNORECASE) for p in patterns):
            return line.strip()
    return ""
