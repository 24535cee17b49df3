"""Preflight: the gates every node passes before an engine starts on it (issue #4): its address
on the cluster interface, free memory settled, clocks healthy; a node with stuck clocks is
power-cycled when the profile can. ``Deployer.preflight`` runs it before every boot.

A gate that fails is a ``DeployError`` naming the node (``preflight_failed``, ``clocks_stuck``):
the infrastructure's fault, found before the configuration under test has run (a class of
``INFRASTRUCTURE``: retried, then the round stops; it bars nothing).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol, TypeVar

from cluster.errors import DeployError, NodeError, tail
from cluster.gates import GateSpec
from cluster.inventory import ClusterSpec, NodeSpec
from cluster.launcher import fill, memory_command, placeholders
from cluster.transport import Transport, check
from knobs.records import NodeClockRecord

T = TypeVar("T")


class OnEvery(Protocol):
    """Runs ``fn`` on every node (at once, or one at a time); its results in order, the first
    error raised (``Deployer``'s)."""

    def __call__(self, nodes: Sequence[NodeSpec], fn: Callable[[NodeSpec], T]) -> list[T]: ...


class Preflight:
    """The preflight gates of one cluster, over its nodes' transports."""

    def __init__(
        self,
        cluster: ClusterSpec,
        gates: GateSpec,
        transports: Mapping[int, Transport],
        runtime: Mapping[str, str],
        *,
        on_every: OnEvery,
        progress: Callable[[str], None],
    ) -> None:
        self.cluster = cluster
        self.gates = gates
        self.transports = transports
        self.runtime = runtime
        self._on_every = on_every
        self._progress = progress

    def run(self) -> list[NodeClockRecord]:
        """Gates on every node at once: the node's address on the cluster interface, free
        memory settled, clocks; a stuck node is power-cycled when the profile can.

        Raises:
            DeployError: preflight_failed (interface, memory) or clocks_stuck (with the node and
                its rate).
            NodeError: a node could not be reached or a query failed.
        """
        self._progress("preflight: interface, memory and clocks on every node")
        nodes = sorted(self.cluster.nodes, key=lambda n: n.rank)

        def gates(node: NodeSpec) -> NodeClockRecord | None:
            self._node_gates(node)
            return None if self.gates.clocks_command is None else self.clock_of(node)

        # one pass per node, all nodes at once: no barrier between the gates of a node
        clocks = [c for c in self._on_every(nodes, gates) if c is not None]
        stuck = [c for c in clocks if c.matmul_rate < self.gates.min_matmul_rate]
        if stuck and self.gates.recover_command is not None:
            for record in stuck:
                node = self.cluster.by_rank(record.rank)
                self._progress(f"preflight: power-cycling {node.name} (clocks stuck)")
                values = placeholders(self.cluster, node, self.runtime)
                argv = [
                    fill(t, values, f"recover of {node.name}") for t in self.gates.recover_command
                ]
                check(self.transports[node.rank].run(argv, timeout=600), node, "the power cycle")
            clocks = self.clocks()
            stuck = [c for c in clocks if c.matmul_rate < self.gates.min_matmul_rate]
        if stuck:
            first = stuck[0]
            node = self.cluster.by_rank(first.rank)
            raise DeployError(
                f"{node.name}: clocks stuck (matmul rate {first.matmul_rate:.2f} < "
                f"{self.gates.min_matmul_rate:.2f}, sm clock {first.sm_clock_mhz:.0f} MHz)",
                failure_class="clocks_stuck",
                rank=node.rank,
                host=node.host,
            )
        return clocks

    def clocks(self) -> list[NodeClockRecord]:
        """Every node's clocks, read in parallel (empty when the profile has no clocks query).

        Raises:
            NodeError: the query failed or printed something unreadable.
        """
        if self.gates.clocks_command is None:
            return []
        return self._on_every(self.cluster.nodes, self.clock_of)

    def clock_of(self, node: NodeSpec) -> NodeClockRecord:
        """One node's clocks query.

        Raises:
            NodeError: the query failed or printed something unreadable.
        """
        command = self.gates.clocks_command
        assert command is not None
        values = placeholders(self.cluster, node, self.runtime)
        argv = [fill(t, values, f"clocks query of {node.name}") for t in command]
        result = check(self.transports[node.rank].run(argv, timeout=60), node, "the clocks query")
        try:
            data = json.loads(result.stdout.strip().splitlines()[-1])
            return NodeClockRecord(
                rank=node.rank,
                sm_clock_mhz=float(data["sm_clock_mhz"]),
                matmul_rate=float(data["matmul_rate"]),
            )
        except (ValueError, KeyError, IndexError, TypeError) as e:
            raise NodeError(
                f"{node.name}: the clocks query printed {tail(result.stdout, 2)!r}, "
                "expected JSON with sm_clock_mhz and matmul_rate",
                failure_class="preflight_failed",
                rank=node.rank,
                host=node.host,
                command=result.command,
            ) from e

    def _node_gates(self, node: NodeSpec) -> None:
        """The interface and memory gates of one node."""
        if self.gates.interface is not None:
            self._interface(node, self.gates.interface)
        if self.gates.memory_settle_s is not None:
            self._memory(node, self.gates.memory_settle_s)

    def _interface(self, node: NodeSpec, template: str) -> None:
        """The node's address is on the cluster interface (a wrong rank or cable shows here)."""
        values = placeholders(self.cluster, node, self.runtime)
        iface = fill(template, values, f"interface of {node.name}")
        result = self.transports[node.rank].run(
            ["ip", "-o", "addr", "show", "dev", iface], timeout=30
        )
        if result.returncode != 0:
            raise DeployError(
                f"{node.name}: interface {iface} does not exist: {tail(result.stderr, 1)}",
                failure_class="preflight_failed",
                rank=node.rank,
                host=node.host,
                command=result.command,
            )
        addresses = re.findall(r"\binet6? ([0-9A-Fa-f.:]+)/\d+", result.stdout)
        if node.host not in addresses:
            raise DeployError(
                f"{node.name}: {node.host} is not on {iface} (which has "
                f"{', '.join(addresses) or 'no address'}): wrong rank, or wrong interface?",
                failure_class="preflight_failed",
                rank=node.rank,
                host=node.host,
                command=result.command,
            )

    def _memory(self, node: NodeSpec, settle_s: float) -> None:
        """Free memory has settled (the last engine's pages returned) and, if the profile asks,
        enough of it is free."""
        g = self.gates
        argv = memory_command(settle_s, g.memory_settle_mib, g.memory_settle_timeout_s)
        result = self.transports[node.rank].run(argv, timeout=g.memory_settle_timeout_s + 30)
        words = result.stdout.split()
        free_mib = int(words[-1]) / 1024 if words and words[-1].isdigit() else 0.0
        if result.returncode != 0:
            raise DeployError(
                f"{node.name}: free memory still changing by more than "
                f"{g.memory_settle_mib:g} MiB per {settle_s:g}s "
                f"after {g.memory_settle_timeout_s:g}s ({free_mib:.0f} MiB free)",
                failure_class="preflight_failed",
                rank=node.rank,
                host=node.host,
                returncode=result.returncode,
            )
        if g.min_free_mib is not None and free_mib < g.min_free_mib:
            raise DeployError(
                f"{node.name}: only {free_mib:.0f} MiB free after settling "
                f"(the gate wants {g.min_free_mib:g})",
                failure_class="preflight_failed",
                rank=node.rank,
                host=node.host,
            )
