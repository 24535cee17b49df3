"""Teardown: every node's engine stopped, head first then ranks 1…N-1 (the reverse of the start
order), each confirmed gone before the next, the profile's stop hook run first where it has one.

It owns the stop's order and its promise: a node that fails does not keep the others running
(every node is tried, each node's outcome and error kept), the fence is asked right before each
node's stop goes out, and once begun no signal cuts the teardown short. ``Deployer.stop_all``,
``Deployer.teardown`` and ``Deployer.stop_each`` run it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from cluster.engine_process import CONTAINER_NAME, container_stop_command
from cluster.errors import NodeError, NodeUnreachable, of_node
from cluster.gates import GateSpec
from cluster.inventory import NodeSpec
from cluster.launcher import (
    fill,
    journaled,
    marked,
    placeholders,
    stop_command,
    stop_started_command,
)
from cluster.nodes import Nodes
from cluster.transport import check, failed
from knobs.spec import clipped

#: The container a node's engine runs in, if its launcher names one (``container_of``).
ContainerOf = Callable[[NodeSpec], str | None]


def stop_each(
    nodes: Nodes,
    gates: GateSpec,
    runtime: Mapping[str, str],
    container_of: ContainerOf = lambda _node: None,
) -> tuple[dict[int, str], list[NodeError]]:
    """Stop every node: rank → ``stopped``/``killed``, ``exited with the head``/``exited …
    before this stop`` (its engine had exited: ``exited``), ``absent`` (none there), or
    ``unreachable: …``/``failed: …`` for a node that could not be stopped, and every node's
    error (``said`` puts an outcome in a line). A node whose engine runs in a container
    (``container_of``) is not stopped until the container runtime says that container is
    down: one that outlived its launcher's process group is stopped through the runtime,
    and said so (``stopped: container NAME outlived …``), never ``stopped`` while it serves.

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
        return _stop_reached(nodes, gates, runtime, container_of)


def _stop_reached(
    nodes: Nodes, gates: GateSpec, runtime: Mapping[str, str], container_of: ContainerOf
) -> tuple[dict[int, str], list[NodeError]]:
    reached = nodes.reach()
    outcomes: dict[int, str] = {}
    errors: list[NodeError] = []
    head_stopped: float | None = None  # when the head's stop went out, if it found an engine
    for node in sorted(nodes.cluster.nodes, key=lambda n: n.rank):
        unreachable = reached[node.rank]
        if unreachable is not None:
            outcomes[node.rank] = f"unreachable: {unreachable.message}"
            errors.append(unreachable)
            continue
        nodes.progress(f"stopping {node.name}")
        sent = time.monotonic()
        try:
            how, escaped = _stop(nodes, gates, runtime, node)
            how = _container_down(nodes, gates, node, container_of(node), how)
        except NodeError as e:
            outcomes[node.rank] = f"failed: {e.message}"
            errors.append(e)
            continue
        if node.rank == 0 and how.startswith(("stopped", "killed")):
            head_stopped = sent
        since = None if head_stopped is None else time.monotonic() - head_stopped
        outcomes[node.rank] = (_exited(how, since) if how.startswith("exited") else how) + escaped
    return outcomes, errors


def stop_started(
    nodes: Nodes,
    gates: GateSpec,
    started: Mapping[int, tuple[int, str]],
    container_of: ContainerOf = lambda _node: None,
) -> dict[int, str]:
    """Stop exactly the engines of ``started`` (by rank, the process group and start time each
    start recorded: ``Boot.started``), head first, whatever the nodes' pid files say now: a
    round that lost a node's claim to nobody it knows of stops what it started and nothing
    else (``launcher.stop_started_command``): an engine of whoever holds the node now is
    another process group, never signalled. By rank: ``stopped``/``killed``, ``already gone``
    (it had exited, a worker with its head, or its pid is another's now), or ``unreachable:
    …``/``failed: …``. A container is never stopped by its name, which another holder's
    launcher gives its own container too. A node's error is its outcome, never raised.

    Raises:
        Whatever the fence raises, before any stop goes out: nothing is stopped.
    """
    nodes.fence()
    outcomes: dict[int, str] = {}
    with nodes.unbroken():
        for node in sorted(nodes.cluster.nodes, key=lambda n: n.rank):
            if node.rank not in started:
                continue
            pid, born = started[node.rank]
            stop = journaled(
                node, stop_started_command(node, pid, born, gates.stop_grace_s), "stop"
            )
            try:
                result = nodes.transport(node).run(stop, timeout=gates.stop_grace_s + 30)
                check(result, node, "stopping the engine it started")
            except NodeError as e:
                what = "unreachable" if isinstance(e, NodeUnreachable) else "failed"
                outcomes[node.rank] = f"{what}: {e.message}"
                continue
            lines = result.stdout.strip().splitlines()
            how = lines[-1] if lines else ""
            if how == "gone":  # a worker exits as its head stops; its pid may be another's now
                how = "already gone"
            container = container_of(node)
            if container is not None and how != "already gone":
                how += f" (its container {container} is not stopped by name: it may be another's)"
            outcomes[node.rank] = how
    return outcomes


def _exited(how: str, since_head: float | None) -> str:
    """A stop's ``exited AGE`` (or ``exited``) in words: ``exited with the head`` where it
    exited after the head's stop went out (``since_head`` seconds ago, by this process's
    clock; AGE is by the node's, whole seconds, so one more is allowed), else ``exited …
    before this stop``: on its own, or with a head that had itself exited."""
    age = how.removeprefix("exited").strip()
    if not age.lstrip("-").isdigit():
        return "exited before this stop"
    seconds = max(0, int(age))
    if since_head is not None and seconds <= since_head + 1:
        return "exited with the head"
    return f"exited {_span(seconds)} before this stop"


def _span(seconds: int) -> str:
    """``seconds`` in words: ``42s``, ``7m 05s``, ``3h 12m``, ``2d 4h``."""
    minutes, hours, days = seconds // 60, seconds // 3600, seconds // 86400
    if seconds < 60:
        return f"{seconds}s"
    if hours < 1:
        return f"{minutes}m {seconds % 60:02d}s"
    if days < 1:
        return f"{hours}h {minutes % 60:02d}m"
    return f"{days}d {hours % 24}h"


#: What a stop's outcome tells the person reading ``cluster down`` (or the teardown of a
#: failed ``cluster up``), where its word alone would not.
_WORDS = {
    "absent": "absent (no engine of ours there)",
    "exited with the head": "exited with the head (the head's stop ended it)",
}


def said(name: str, how: str) -> str:
    """Node ``name``'s teardown outcome ``how`` (``stop_each``) as one line that names the node
    once: ``node-1: exited with the head (the head's stop ended it)``, ``node-1: unreachable
    (root@host:22): connect: …``."""
    for what in ("unreachable", "failed"):
        if how.startswith(f"{what}: "):
            return of_node(name, how.removeprefix(f"{what}: "), what)
    words = _WORDS.get(how)
    if words is None and how.startswith("exited "):
        words = f"{how} (nothing left to stop)"
    return of_node(name, words or how)


def _stop(
    nodes: Nodes, gates: GateSpec, runtime: Mapping[str, str], node: NodeSpec
) -> tuple[str, str]:
    """``node``'s engine stopped: the stop's outcome, and in words the processes of its start
    that had escaped its process group (a daemon, a double fork), which the stop found by their
    mark and stopped too (``launcher.stop_command``; '' where none)."""
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
    escaped = [line.split(" ", 2) for line in lines[:-1] if line.startswith("escaped ")]
    said = "".join(
        f"; pid {words[1]} ({clipped(''.join(c for c in words[2] if c.isprintable()), 40)}) of "
        "its engine had escaped the launcher's process group and still ran: stopped too"
        for words in escaped
        if len(words) == 3
    )
    return (lines[-1] if lines else ""), said


def _container_down(
    nodes: Nodes, gates: GateSpec, node: NodeSpec, container: str | None, how: str
) -> str:
    """``how`` once ``container`` (``node``'s engine's, if any) is down too: a container
    that outlived its launcher's stop (``docker run -d``; a client that did not pass the
    SIGTERM on) still serves and holds the GPUs, so it is stopped through the runtime and
    said so, or the node's stop fails.

    Raises:
        NodeError: the container is still up after ``docker stop`` (with the runtime's words).
    """
    if container is None or not CONTAINER_NAME.match(container):
        return how
    nodes.fence()
    result = nodes.transport(node).run(
        container_stop_command(container, gates.stop_grace_s), timeout=gates.stop_grace_s + 60
    )
    last = (result.stdout.strip().splitlines() or [""])[-1]
    if result.returncode != 0 or last not in ("gone", "stopped"):
        raise failed(
            result,
            node,
            f"{node.name} ({node.host}): its engine's container {container} is still up after "
            f"the stop ({last or 'the runtime did not say'}): stop it on the node (`docker "
            f"stop {container}`)",
        )
    if last == "gone":
        return how
    return (
        f"stopped: its container {container} outlived its launcher's stop ({how}) and was "
        "still up; stopped with `docker stop`"
    )
