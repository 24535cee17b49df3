"""What a node's engine process was found doing, read on the node: stopped, or dead of a signal
that orchestrate did not send. Either is the node's doing, never the config's: no config stops
its own engine (SIGSTOP, a suspended host, a debugger holding it), and no config sends its
engine the SIGTERM of a person's ``kill``, a service manager or a host shutting down.

``cluster.blame`` asks these when a boot or a cell fails; ``cluster.launcher`` writes what they
read (the pid file, the wrapper's exit status, the mark of our own stop).
"""

from __future__ import annotations

import re
import signal

from cluster.errors import NodeError
from cluster.inventory import NodeSpec
from cluster.launcher import EXIT, PIDFILE, STOPPING, stopped_command
from cluster.transport import Transport
from knobs.spec import clipped

#: Signals an engine dies of only when someone sends them: a person (Ctrl-C, ``kill``), a
#: service manager, a host shutting down. SIGKILL is not among them: the kernel's OOM killer
#: sends it too, for the config's memory.
OUTSIDE_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT})

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


def killed_by(transport: Transport, node: NodeSpec) -> signal.Signals | None:
    """The signal ``node``'s engine died of when it is one of ``OUTSIDE_SIGNALS`` and not ours:
    its wrapper's exit status (``EXIT``) is 128 + the signal, for the engine the pid file names,
    and our own stop did not mark it (``STOPPING``). None otherwise: an engine of an older
    release (no status file), a crash, an exit of its own, a SIGKILL (the OOM killer's as
    much as a person's), a node that cannot be read."""
    try:
        pidfile, status, ours = (
            transport.read_text(f"{node.workdir}/{name}", max_bytes=256)
            for name in (PIDFILE, EXIT, STOPPING)
        )
    except NodeError:
        return None
    return outside_signal(pidfile, status, ours)


def outside_signal(pidfile: str, status: str, ours: str) -> signal.Signals | None:
    """``killed_by`` on the three files' text (see there)."""
    pid = pidfile.split()[:1]
    fields = status.split()
    if not pid or len(fields) != 2 or fields[0] != pid[0] or not fields[1].isdigit():
        return None
    if ours.split()[:1] == pid:
        return None
    code = int(fields[1])
    if code <= 128:
        return None
    try:
        sig = signal.Signals(code - 128)
    except ValueError:
        return None
    return sig if sig in OUTSIDE_SIGNALS else None
