"""A bench cell's window on a silent engine (``cluster.bench`` runs the cell and sets its
deadline, ``cold_start_limit_s`` past the warm-up): when the window opens, and what a window
with no token in it, or none in its last half, waits for.

An engine that compiles on first use answers its first request late: the window opens at its
first token, not at the warm-up's end. A window that closed with no token and no failure (a
decode path compiled after the first token, a host that kept the engine off the CPU) opens
again at the next token. A window whose tokens stopped for its last half waits for the next
one; with none by the deadline the engine is hung (``CellState.hung``). Any window with tokens
ends at the engine's next token after them (``past_the_end``), so a silence across its end is
measured (a stopped engine looked at, its held deliveries counted) rather than cut. The
streams go on all the while; a failure ends every wait (it is the cell's evidence), and so does
the deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Callable, Sequence

from cluster import metrics, stall
from cluster.bench_spec import HANG_SETTING
from cluster.window import CellState, Scrapes
from knobs.records import NodeClockRecord

#: how long a window's end waits, saying nothing, for the engine's next token after a gap
#: shorter than half the window (``past_the_end``): far above a running engine's step
QUIET_S = 1.0


async def cold_start(state: CellState, deadline: float, say: Callable[[str], None]) -> None:
    """The window opens at the warm-up's end, or, on an engine that has sent neither a token
    nor a failure by then, at its first token: a backend that compiles on first use answers
    its first request late, and a window spent waiting for it would measure the compile, not
    the config. A failure ends the wait, and so does the ``deadline``: the window is then the
    one the cell had (failures are its evidence, as on a warm engine)."""
    if not state.news.is_set():
        await _reopen_at_token(state, deadline, say, "no token after the warm-up", "first")


def last_inside(state: CellState) -> float | None:
    """When the window's last token came; None where no token came in it."""
    inside = [t for r in state.requests for t, _ in r.chunks if state.w0 <= t < state.w1]
    return max(inside) if inside else None


def fell_silent(state: CellState) -> float | None:
    """When the window's tokens stopped for its last half or more, with no failure anywhere:
    the time of its last token (an engine that stopped answering mid-window, or one that
    paused to compile a path it met late); else None."""
    if state.errors:
        return None
    last = last_inside(state)
    if last is None or state.w1 - last < state.cell.duration_s / 2:
        return None
    return last


async def past_the_end(state: CellState, deadline: float, say: Callable[[str], None]) -> None:
    """A window with tokens in it ends at the engine's next token after its last one: a
    silence across the window's end is measured, not cut. An engine stopped in the window's
    last second (a ``kill -STOP``, a debugger) left it short of its last tokens, read as
    measured with no stall: the cell's streams and its stop look (``cluster.stopped``) ended
    with the window, before the silence was a second long, and the engine's stall counter was
    read before the engine, continued, counted its held deliveries. The wait goes on with the
    streams and the look, so a stop that outlasts the look is found, and the counters read
    after it (``cluster.bench``) hold a shorter one. A window that fell silent for its last
    half says so at once (``fell_silent``); a shorter gap waits ``QUIET_S`` before it says
    anything: a running engine's next token is a step away. With no token by the ``deadline``
    the engine is hung (``after_silence``)."""
    last = last_inside(state)
    if last is None:
        return
    await after_silence(
        state, last, deadline, say, quiet_s=0.0 if fell_silent(state) is not None else QUIET_S
    )


async def after_silence(
    state: CellState,
    last: float,
    deadline: float,
    say: Callable[[str], None],
    *,
    quiet_s: float = 0.0,
) -> None:
    """A window that fell silent (``fell_silent``, at ``last``) waits, with the streams going
    on, up to the cell's ``deadline`` for the engine's next token or failure: either ends the
    wait and the window stands as measured (the silence was the config's, or a stall of a host
    that its stall accounting measures), and so does a token that came after ``last`` before
    the wait began (the window's end passed while a host was stalled); with neither by the
    deadline the engine is hung (``CellState.hung``): a cell that stopped measuring then would
    report a fraction of the config's throughput as its measurement. The first ``quiet_s``
    seconds of the wait say nothing (``past_the_end``)."""
    if any(t > last for r in state.requests for t, _ in r.chunks):
        return  # tokens came after the window's end (a host that stalled across it): not silent
    state.news.clear()
    loop = asyncio.get_running_loop()
    if quiet_s > 0:
        quiet_until = min(deadline, loop.time() + quiet_s)
        if await _wait_for_token(state, quiet_until, None) is not None or state.errors:
            return
        why = f"no token since {state.w1 - last:.1f}s before the window's end"
    else:
        why = f"no token for the window's last {state.w1 - last:.0f}s"
    if await _wait_for_token(state, deadline, (say, why, "next")) is not None or state.errors:
        return
    state.hung = (
        f"the engine stopped sending tokens {last - state.w0:.1f}s into the "
        f"{state.cell.duration_s:g}s window and sent none in the "
        f"{loop.time() - last:.0f}s "
        f"after (hung, or its host stopped; {HANG_SETTING} sets the wait)"
    )


def went_quiet(state: CellState) -> bool:
    """The window closed with no token in it and no failure anywhere: an engine that is
    alive and silent (a decode path compiled on first use after the first token, a host that
    kept it off the CPU), not a measurement of the config and not a failed one."""
    if state.errors:
        return False
    return not any(state.w0 <= t < state.w1 for r in state.requests for t, _ in r.chunks)


async def after_quiet(state: CellState, deadline: float, say: Callable[[str], None]) -> bool:
    """A quiet window (``went_quiet``) waits, up to the ``deadline``, for the engine's next
    token, and re-opens at it (True); on a failure or at the deadline the window stays the
    quiet one (False), and the cell measured nothing."""
    if asyncio.get_running_loop().time() >= deadline:
        return False
    state.news.clear()
    return await _reopen_at_token(state, deadline, say, "no token in the window", "next")


async def _reopen_at_token(
    state: CellState, deadline: float, say: Callable[[str], None], why: str, which: str
) -> bool:
    """Waits, with the streams going on, for a token or a failure until the ``deadline``; at a
    token the window opens there, for the cell's duration (True); at a failure or the deadline
    the window stays as planned (False)."""
    since = await _wait_for_token(state, deadline, (say, why, which))
    if since is None:
        return False  # a failure ended the wait (it is the cell's evidence), or the deadline
    now = asyncio.get_running_loop().time()
    state.extended_s += now - since
    state.w0, state.w1 = now, now + state.cell.duration_s
    return True


async def _wait_for_token(
    state: CellState,
    deadline: float,
    said: tuple[Callable[[str], None], str, str] | None,
) -> float | None:
    """Says why the cell waits (``said``: where to, why, and which token it waits for;
    None: nothing), then waits, with the streams going on, for a token or a failure until the
    ``deadline``: when it began, if a token came; None at a failure or the deadline. The
    window stays as planned."""
    loop = asyncio.get_running_loop()
    since, planned = loop.time(), state.w1
    if said is not None:
        say, why, which = said
        say(
            f"{state.cell.name}: {why}; waiting up to {max(0.0, deadline - since):.0f}s "
            f"for the {which}"
        )
    state.w1 = math.inf  # the streams go on while the engine is silent
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(state.news.wait(), timeout=max(0.0, deadline - since))
    state.w1 = planned
    return since if any(t >= since for r in state.requests for t, _ in r.chunks) else None


def measured_any(state: CellState) -> bool:
    """A token arrived inside the window (a silent engine answers no greedy probe)."""
    return any(state.w0 <= t < state.w1 for r in state.requests for t, _ in r.chunks)


def stalls_seen(watch: stall.StallWatch, state: CellState, whole: Scrapes, now: float) -> str:
    """What the stall watches saw of a cell that hung (from its first request to ``now``):
    the client's own, and the engine's counter (``whole``: its scrapes at the cell's edges),
    so that a hung engine can be told from a host that kept one of them off the CPU."""
    client = watch.stalled_s(state.t0, now)
    opening, closing = whole
    engine = (
        metrics.delta(opening or {}, closing or {}, stall.ENGINE_STALL_METRIC)
        if opening is not None and closing is not None
        else None
    )
    said = (
        "the engine's counters did not answer after it"
        if closing is None
        else "the engine counts no stalls of its own"
        if engine is None
        else f"the engine's own stall count {engine:.2f}s"
    )
    span = now - state.t0
    return f"the stall watch saw the client stalled {client:.2f}s of the cell's {span:.0f}s; {said}"


def clocks_words(clocks: Sequence[NodeClockRecord]) -> str:
    """The nodes' clocks as a failed cell's evidence: each rank's matmul rate and SM clock."""
    return ", ".join(
        f"rank {c.rank} matmul rate {c.matmul_rate:.2f} at {c.sm_clock_mhz:.0f} MHz" for c in clocks
    )
