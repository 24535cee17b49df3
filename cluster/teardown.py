"""Teardown: every node's engine stopped, head first then ranks 1…N-1 (the reverse of the start
order), each confirmed gone before the next, the profile's stop hook run first where it has one.

It owns the stop's order and its promise: a node that fails does not keep the others running
(every node is tried, each node's outcome and error kept), the fence is asked right before each
node's stop goes out, and once begun no signal cuts the teardown short. ``Deployer.stop_all``,
``Deployer.teardown`` and ``Deployer.stop_each`` run it.
"""

from __future__ import annotations

from collections.abc import Mapping

from cluster.errors import NodeError
from cluster.gates import GateSpec
from cluster.inventory import NodeSpec
from cluster.launcher import fill, journaled, marked, placeholders, stop_command
from cluster.nodes import Nodes
from cluster.transport import check


def stop_each(
    nodes: Nodes, gates: GateSpec, runtime: Mapping[str, str]
) -> tuple[dict[int, str], list[NodeError]]:
    """Stop every node: rank → ``absent``/``stopped``/``killed``, or ``unreachable: …``/
    ``failed: …`` for a node that could not be stopped, and every node's error.

    Raises:
        Whatever the fence raises, right before a node's stop would go out: that node and the
            ones after it are left as they are (they are another's now).
    """
    # The connections are opened on every node at once: TCP, key exchange and
    # authentication are the slow part and have no order. The stops then run one at a
    # time, head first, each confirmed gone before the next: the reverse of the start
    # order, as the seeds' launchers stop. A headless rank whose head is gone exits on its
    # own, while a worker stopped under a live head makes the head die of NCCL errors
    # first, with logs that blame the wrong node. Over warm connections a stop that finds
    # nothing costs one round trip, so stopping at once would save little and lose the
    # order the nodes' journals show (0, 1, …, N-1). Once begun, no signal cuts it short.
    with nodes.unbroken():
        return _stop_reached(nodes, gates, runtime)


def _stop_reached(
    nodes: Nodes, gates: GateSpec, runtime: Mapping[str, str]
) -> tuple[dict[int, str], list[NodeError]]:
    reached = nodes.reach()
    outcomes: dict[int, str] = {}
    errors: list[NodeError] = []
    for node in sorted(nodes.cluster.nodes, key=lambda n: n.rank):
        unreachable = reached[node.rank]
        if unreachable is not None:
            outcomes[node.rank] = f"unreachable: {unreachable.message}"
            errors.append(unreachable)
            continue
        nodes.progress(f"stopping {node.name}")
        try:
            outcomes[node.rank] = _stop(nodes, gates, runtime, node)
        except NodeError as e:
            outcomes[node.rank] = f"failed: {e.message}"
            errors.append(e)
    return outcomes, errors


def _stop(nodes: Nodes, gates: GateSpec, runtime: Mapping[str, str], node: NodeSpec) -> str:
    grace = gates.stop_grace_s
    transport = nodes.transport(node)
    if gates.stop_hook is not None:
        values = placeholders(nodes.cluster, node, runtime)
        hook = [fill(t, values, f"stop hook of {node.name}") for t in gates.stop_hook]
        nodes.fence()
        transport.run(journaled(node, marked(node, hook), "stop-hook"), timeout=grace + 60)
    stop = journaled(node, stop_command(node, grace), "stop")
    nodes.fence()
    result = transport.run(stop, timeout=grace + 30)
    check(result, node, "stopping the engine")
    lines = result.stdout.strip().splitlines()
    return lines[-1] if lines else ""
