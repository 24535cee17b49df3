"""What a node's engine process was found doing, read on the node: stopped. That is the node's
doing, never the config's: no config stops its own engine (SIGSTOP, a suspended host, a
debugger holding it).

``cluster.blame`` asks it when a boot or a cell fails; ``cluster.launcher`` writes the pid file
it reads by.
"""

from __future__ import annotations

import re

from cluster.errors import NodeError
from cluster.inventory import NodeSpec
from cluster.launcher import stopped_command
from cluster.transport import Transport
from knobs.spec import clipped

_STOPPED = re.compile(r"^(\d+) ([Tt]) (.*)$")
_STATES = {"T": "stopped by a signal", "t": "held by a debugger"}


def stopped(transport: Transport, node: NodeSpec) -> str | None:
    """The first process of ``node``'s engine group found stopped, in words (``pid 812
    (python3) stopped by a signal``); None when none is, when there is no engine, or when the
    node cannot be asked."""
    try:
        result = transport.run(stopped_command(node), timeout=30)
    except NodeError:
        return None
    found = _STOPPED.match(result.stdout.strip().splitlines()[-1] if result.stdout.strip() else "")
    if result.returncode != 0 or found is None:
        return None
    pid, state, name = found.groups()
    name = clipped("".join(ch for ch in name if ch.isprintable()), 40)
    return f"pid {pid} ({name}) {_STATES[state]}"
