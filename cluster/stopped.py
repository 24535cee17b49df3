"""Whether an engine was stopped while a bench cell measured it: a stopped process, told from a
busy host.

An engine process stopped mid-cell (a person's ``kill -STOP``, a suspended host, a debugger)
holds its tensor-parallel group: the head sends no token while it is stopped, and once it is
continued the gap reads as a stall, the engine's scheduler counting its late deliveries
(``stall.ENGINE_STALL_METRIC``) as a busy host's. It is neither the config's nor a busy host's.
The process's state (``T``: stopped, ``t``: held by a debugger) is the evidence, and it is
there only while the process is stopped: so the cell looks while its engine is silent. With no
token for ``LOOK_AFTER_S`` while its streams ask, ``watch`` asks every node for its engine
group's state (``Probe``: the node's own transport, ``launcher.stopped_command``, as a failed
cell's check does), and again at each doubling of the silence. A measurement in which an engine
was found stopped is no measurement (``cluster.bench`` measures it again and keeps another,
and says it as the node's). The window's end waits for the engine's next token with the look
going on (``silence.past_the_end``), so a stop begun in the window's last second is looked at
as one begun in its middle. A stop that silenced the engine for less than ``LOOK_AFTER_S`` is
not seen: it leaves a stall (the engine's counter, read after the silence, holds its held
deliveries), said as a busy host's or a stopped process's (``STALLED``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from cluster.errors import NodeError
from cluster.window import CellState

#: seconds with no token, while the cell's streams ask, before the nodes are looked at: far
#: above an engine's step or a loaded host's scheduling delay (tens of milliseconds), and a
#: long cell's silence is looked at again at each doubling of it
LOOK_AFTER_S = 1.0
#: what a stall is said to be where the look found no engine stopped: a stop shorter than the
#: look (or one it did not overlap) cannot be told from a busy host by what the cell has
STALLED = f"a busy host, or a process stopped for less than the {LOOK_AFTER_S:g}s look"
#: … and where no look was made (``orchestrate bench``: no node to ask)
UNLOOKED = "a busy host, or a stopped process"
#: how often a silence the look found nothing in is checked for its next token (seconds)
_POLL_S = 0.1

#: Asked with the words of a silence (``cell code-c4: no token for 1s``): the error of the
#: first node whose engine has a process found stopped now (class ``engine_stopped``, its
#: message naming the node, its host and the process), else None. Blocking: run in a thread.
Probe = Callable[[str], NodeError | None]


async def watch(state: CellState, probe: Probe, found: list[NodeError]) -> None:
    """Runs beside the cell's streams until cancelled: at each silence of ``LOOK_AFTER_S``
    (and each doubling of it), asks ``probe`` whether an engine is stopped; the first error it
    gives is appended to ``found``, and the watch ends there."""
    loop = asyncio.get_running_loop()
    since = state.t0  # the silence began at the last token, or the cell's start
    look = LOOK_AFTER_S
    while True:
        last = max(since, state.last_token)
        if last > since:  # a token: a new silence starts there
            since, look = last, LOOK_AFTER_S
        silent = loop.time() - since
        if silent < look:
            await asyncio.sleep(min(_POLL_S, look - silent))
            continue
        why = f"cell {state.cell.name}: no token for {silent:.0f}s"
        error = await asyncio.to_thread(probe, why)
        if error is not None:
            found.append(error)
            return
        look *= 2


def measuring_again(error: NodeError, cell: str, attempt: int, attempts: int) -> str:
    """The line of a measurement in which ``error`` found an engine stopped: the node's,
    neither the config's nor a busy host's, and measured again (``attempt`` of ``attempts``)."""
    return (
        f"{cell}: {found(error)}: its measurement is neither the config's nor a busy host's; "
        f"measuring again ({attempt}/{attempts})"
    )


def found(error: NodeError) -> str:
    """What ``error`` found, from its node on: ``node-1's engine was found stopped on …``."""
    text = error.message
    at = text.find("; ")
    return text[at + 2 :] if at >= 0 else text
