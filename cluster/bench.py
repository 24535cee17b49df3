"""Bench cells against an OpenAI-compatible endpoint (vLLM, llama.cpp's llama-server or the
twin) and its ``/metrics``.

A cell keeps ``concurrency`` greedy streaming requests in flight (``cluster.streams``: a new
one starts the moment one finishes) for a warm-up and then a measurement window. Throughput
counts the tokens that arrive inside the window (a request straddling an edge contributes only
its tokens inside); requests the window cut before their end are scaled by the cell's tokens
per chunk (``cluster.window``). A window on a silent engine opens at its first token, or waits
for its next one, up to the cell's deadline (``cluster.silence``, ``cold_start_limit_s``: at
least the profile's ``bench.hang_after_s``, ``cluster.bench_spec``).
Accepted tokens per step come from the deltas of the spec-decode counters scraped at both
window edges (``cluster.metrics``; llama-server adds a request's counts when the request
finishes), else from the requests' own ``timings``. Requests still in flight when the window
closes are cancelled. A window disturbed by a stalled host (``cluster.stall``) or by lost
connections is measured again; a cell stops where it stands at its cutoff (``cluster.cutoff``).

Every failure is a ``BenchError`` (``cluster.errors``) carrying the URL and the evidence; no
httpx exception escapes. What the window measured is summed into the cell's record by
``cluster.window``.
"""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Callable, Sequence
from typing import Any

import httpx

from cluster import cutoff, metrics, prompts, signals, silence, stall, stopped, streams
from cluster.bench_spec import HANG_AFTER_S, HANG_SETTING
from cluster.errors import BenchError, NodeError, describe
from cluster.window import CellState, Scrapes, summarise
from knobs.records import CellResultRecord, CellSpec, NodeClockRecord
from knobs.spec import clipped
from orchestrator.errors import OrchestrateError

DEFAULT_SMOKE_PROMPT = "The capital of France is"


# ---- one greedy generation ---------------------------------------------------------------------
def smoke(
    base_url: str,
    model: str,
    prompt: str = DEFAULT_SMOKE_PROMPT,
    max_tokens: int = 16,
    timeout: float = 120.0,
) -> str:
    """One greedy, non-streaming completion; its text.

    Raises:
        BenchError: unreachable, timed out, a non-200 answer, a malformed body, or empty text.
    """
    url = base_url.rstrip("/") + "/v1/completions"
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    try:
        with httpx.Client(timeout=timeout, trust_env=False) as client:
            response = client.post(url, json=body)
    except httpx.HTTPError as e:
        raise BenchError(
            f"smoke generation at {url} failed: {describe(e)}", url=url, evidence=describe(e)
        ) from e
    if response.status_code != 200:
        raise BenchError(
            f"smoke generation at {url} answered {response.status_code}: "
            f"{clipped(response.text, 200)}",
            url=url,
            status=response.status_code,
            evidence=response.text[-1000:],
        )
    try:
        text = response.json()["choices"][0]["text"]
    except (ValueError, KeyError, IndexError, TypeError):
        raise BenchError(
            f"smoke generation at {url} returned a malformed body",
            url=url,
            status=200,
            evidence=response.text[-1000:],
        ) from None
    if not isinstance(text, str) or not text.strip():
        raise BenchError(
            f"smoke generation at {url} returned no text",
            url=url,
            status=200,
            evidence=response.text[-1000:],
        )
    return text


# ---- the cell ----------------------------------------------------------------------------------
def cold_start_limit_s(cell: CellSpec, least_s: float = HANG_AFTER_S) -> float:
    """How long past its warm-up a cell waits, in all, for a cold or quiet engine's tokens:
    ``least_s`` (the profile's ``bench.hang_after_s``), or five times the cell's warm-up
    and window where that is longer."""
    return max(least_s, 5.0 * (cell.warmup_s + cell.duration_s))


async def run_cell_async(
    base_url: str,
    model: str,
    cell: CellSpec,
    *,
    on_progress: Callable[[str], None] | None = None,
    on_notice: Callable[[str], None] | None = None,
    stop: threading.Event | None = None,
    probe: stopped.Probe | None = None,
    found: list[NodeError] | None = None,
    hang_after_s: float = HANG_AFTER_S,
) -> tuple[CellResultRecord, dict[str, Any]]:
    """The measurement of ``run_cell`` without the clocks; also returns raw evidence. While
    the engine is silent, ``probe`` looks for an engine stopped (``cluster.stopped``): what it
    finds is appended to ``found``.

    Raises:
        OwnershipLost: ``stop`` was set (``cluster.cutoff``): the cell's streams are closed.
        BenchError: no token arrived in the window and requests failed (the evidence is the
            first failure), or no token arrived in one within ``cold_start_limit_s`` past the
            warm-up (at least ``hang_after_s``; a window that closes quiet, with no
            failure, waits for the next token).
    """
    say = on_progress or (lambda _m: None)
    url = base_url.rstrip("/") + "/v1/completions"
    loop = asyncio.get_running_loop()
    watch = stall.StallWatch()
    earlier = len(found) if found is not None else 0  # what earlier measurements found
    with watch:
        state, scrapes = await cutoff.unless_stopped(
            stop,
            cell.name,
            _measure(
                base_url,
                model,
                cell,
                say,
                on_notice or say,
                stop,
                cold_start_limit_s(cell, hang_after_s),
                probe,
                found,
            ),
        )
    record, evidence = summarise(state, *scrapes)
    seen = found[earlier] if found is not None and len(found) > earlier else None
    if record.total_output_tokens == 0:
        waited = loop.time() - state.w1
        first = (
            state.errors[0]
            if state.errors
            else "no token arrived in the window"
            + (
                f", nor in the {waited:.0f}s the cell waited after it "
                f"({HANG_SETTING} sets the wait)"
                if waited >= 1
                else ""
            )
            # what the stall watches saw: a silent engine told from a starved host
            + f"; {silence.stalls_seen(watch, state, scrapes[1], loop.time())}"
        )
        raise BenchError(
            f"cell {cell.name} at {url} measured nothing: {first}",
            url=url,
            evidence="\n".join(state.errors[:5]) or first,
            stopped=seen,
            hung=not state.errors,
        )
    if state.hung is not None:
        hung = f"{state.hung}; {silence.stalls_seen(watch, state, scrapes[1], loop.time())}"
        raise BenchError(
            f"cell {cell.name} at {url}: {hung}", url=url, evidence=hung, stopped=seen, hung=True
        )
    client_stalled = watch.stalled_s(state.w0, min(state.w1, loop.time()))
    (_, after), (opening, _) = scrapes
    engine_stalled = metrics.delta(opening or {}, after or {}, stall.ENGINE_STALL_METRIC) or 0.0
    record = record.model_copy(
        update={
            "client_stall_s": round(client_stalled, 4),
            "engine_stall_s": round(engine_stalled, 4),
        }
    )
    say(f"{cell.name}: {record.output_throughput:.1f} tok/s")
    return record, evidence


async def _measure(
    base_url: str,
    model: str,
    cell: CellSpec,
    say: Callable[[str], None],
    notice: Callable[[str], None],
    stop: threading.Event | None,
    limit_s: float,
    probe: stopped.Probe | None = None,
    found: list[NodeError] | None = None,
) -> tuple[CellState, tuple[Scrapes, Scrapes]]:
    """The cell's requests, and its counters at the window's edges and at the cell's (``say``:
    its progress; ``notice``: why it waits past its window; ``limit_s``: how long past its
    warm-up it waits for a token, ``cold_start_limit_s``; ``probe``: asked, while the engine
    is silent, whether an engine is stopped, into ``found``)."""
    url = base_url.rstrip("/") + "/v1/completions"
    metrics_url = base_url.rstrip("/") + "/metrics"
    limits = httpx.Limits(
        max_connections=cell.concurrency + 4, max_keepalive_connections=cell.concurrency + 4
    )
    # a stream waits for its next token as long as the cell waits for any (``cold_start_limit_s``)
    timeout = httpx.Timeout(30.0, read=cell.warmup_s + limit_s)
    loop = asyncio.get_running_loop()
    async with httpx.AsyncClient(limits=limits, timeout=timeout, trust_env=False) as client:
        # build the prompts and open the connections first: the cell starts when the requests
        # can leave at once
        for i in range(len(prompts.base_prompts(cell.category))):
            prompts.build_prompt(cell.category, cell.context_tokens, i)
        await asyncio.gather(*(streams.warm(client, base_url) for _ in range(cell.concurrency)))
        # the whole cell's counters too: a slow engine may publish no draft inside the window
        opening = await metrics.scrape(client, metrics_url)
        t0 = loop.time()
        state = CellState(
            cell=cell,
            url=url,
            model=model,
            t0=t0,
            w0=t0 + cell.warmup_s,
            w1=t0 + cell.warmup_s + cell.duration_s,
        )
        say(f"{cell.name}: {cell.concurrency} streams, warm-up {cell.warmup_s:g}s")
        workers = [
            streams.retrieved(asyncio.create_task(streams.forever(client, state, stop)))
            for _ in range(cell.concurrency)
        ]
        looks: list[asyncio.Task[None]] = []  # while the streams ask, and only then
        if probe is not None and found is not None:
            looks.append(streams.retrieved(asyncio.create_task(stopped.watch(state, probe, found))))
        deadline = math.inf

        async def counters() -> dict[str, float] | None:
            # nothing measured by the cell's deadline: the engine's counters say nothing of a
            # window it never served, and one that does not answer held each scrape its 10 s
            # (a stopped head's cell failed 30 s past its deadline, the line said 90 s waited)
            if loop.time() >= deadline and not silence.measured_any(state):
                return None
            return await metrics.scrape(client, metrics_url)

        try:
            await asyncio.sleep(max(0.0, state.w0 - loop.time()))
            deadline = loop.time() + limit_s
            await silence.cold_start(state, deadline, notice)
            while True:
                before = await counters()
                say(f"{cell.name}: measuring {cell.duration_s:g}s")
                await asyncio.sleep(max(0.0, state.w1 - loop.time()))
                measured = silence.measured_any(state)
                if not measured:
                    after = await counters()
                # a stream whose request ended after the window's end stopped there: it goes
                # on again, or a wait for the engine's next token waits for a request no
                # stream sends (a host that stalled across the window's end ends every
                # request at once after it: review 51-7)
                workers = [
                    streams.retrieved(asyncio.create_task(streams.forever(client, state, stop)))
                    if w.done()
                    else w
                    for w in workers
                ]
                if measured:
                    # the window ends at the engine's next token, the stop look going on, and
                    # its counters are read after that token: a silence across its end is
                    # measured, not cut (``silence.past_the_end``)
                    await silence.past_the_end(state, deadline, notice)
                    after = await counters() if state.hung is None else None
                    break
                if not silence.went_quiet(state):
                    break
                if not await silence.after_quiet(state, deadline, notice):
                    break
        finally:
            for w in [*workers, *looks]:
                w.cancel()
            await asyncio.gather(*workers, *looks, return_exceptions=True)
        if state.hung is None and silence.measured_any(state):  # a silent engine answers no probe
            await streams.greedy_probe(client, state, say)
            await metrics.drain(client, metrics_url)
        closing = await counters()
    return state, ((before, after), (opening, closing))


def _worse(
    before: Sequence[NodeClockRecord], after: Sequence[NodeClockRecord]
) -> tuple[NodeClockRecord, ...]:
    by_rank: dict[int, NodeClockRecord] = {}
    for rec in [*before, *after]:
        seen = by_rank.get(rec.rank)
        if seen is None or rec.matmul_rate < seen.matmul_rate:
            by_rank[rec.rank] = rec
    return tuple(by_rank[r] for r in sorted(by_rank))


def run_cell(
    base_url: str,
    model: str,
    cell: CellSpec,
    *,
    clocks: Callable[[], Sequence[NodeClockRecord]] | None = None,
    on_progress: Callable[[str], None] | None = None,
    on_notice: Callable[[str], None] | None = None,
    stop: threading.Event | None = None,
    probe: stopped.Probe | None = None,
    hang_after_s: float = HANG_AFTER_S,
) -> CellResultRecord:
    """Measure one cell (warm-up, then the window) and return what it measured.

    A measurement whose client or engine was stalled (``cluster.stall``: its host kept it off
    the CPU) for more than a small part of the window is taken again, up to ``stall.ATTEMPTS``
    in all, as is, once, one whose every failed request lost its connection (a network's
    blip); the record keeps the one with the fewest requests that lost their connection, then
    the least stalled, how long each host stalled it and how many measurements were dropped.
    ``clocks`` is called before and after the cell; the record keeps each rank's worse
    reading. ``on_progress`` gets each step's line; ``on_notice`` (else ``on_progress``) the
    lines that say why the cell waits past its window or measures again: a round shows these
    (an engine silent for minutes is otherwise a screen that says nothing). Runs its own event
    loop (call it from synchronous code). ``stop`` (``cluster.cutoff``) set stops the cell
    where it stands: no request more, its streams closed, nothing measured again. A Ctrl-C
    ends the cell as it stands, its loop closed whole (``signals.run_whole``). ``probe`` is
    asked, while the engine is silent, whether an engine is stopped (``cluster.stopped``): a
    measurement in which one was is measured again, never kept, and said as the node's.
    ``hang_after_s`` (the profile's ``bench.hang_after_s``): how long, at least, the cell
    waits past its warm-up for a silent engine's token (``cold_start_limit_s``).

    Raises:
        BenchError: the cell measured nothing (the endpoint is down or every request failed),
            or its engine stopped sending tokens mid-window and sent none by its deadline
            (``hung``: with what the stall watches saw, and the nodes' clocks after it).
        NodeError: ``probe``'s error (``engine_stopped``): an engine was found stopped in
            every measurement.
        OwnershipLost: ``stop`` was set before the cell ended.
        Whatever ``clocks`` raises.
    """
    cutoff.check(stop, cell.name)
    first = list(clocks()) if clocks is not None else []
    try:
        record = _measured_undisturbed(
            base_url, model, cell, on_progress, on_notice, stop, probe, hang_after_s
        )
    except BenchError as e:
        if not e.hung or clocks is None:
            raise
        try:
            after = silence.clocks_words(_worse(first, list(clocks())))
        except OrchestrateError as unread:
            after = f"not read ({unread})"
        raise BenchError(
            f"{e.message}; the nodes' clocks around it: {after}",
            url=e.url,
            status=e.status,
            evidence=f"{e.evidence}; the nodes' clocks around it: {after}",
            stopped=e.stopped,
            hung=True,
        ) from e
    cutoff.check(stop, cell.name)
    last = list(clocks()) if clocks is not None else []
    if first or last:
        record = record.model_copy(update={"clocks": _worse(first, last)})
    return record


def _measured_undisturbed(
    base_url: str,
    model: str,
    cell: CellSpec,
    on_progress: Callable[[str], None] | None,
    on_notice: Callable[[str], None] | None = None,
    stop: threading.Event | None = None,
    probe: stopped.Probe | None = None,
    hang_after_s: float = HANG_AFTER_S,
) -> CellResultRecord:
    """The cell measured until a window is not disturbed by a stall of its client's or its
    engine's host (``cluster.stall``), at most ``stall.ATTEMPTS`` times; the one with the
    fewest requests that lost their connection, then the least stalled. A measurement in
    which ``probe`` found an engine stopped (``cluster.stopped``) is measured again and never
    kept: its gap is neither the config's nor a busy host's; found in every one, the node's
    error is raised.

    A window whose every failure was the connection's (``CellState.lost``: reset, cut mid-stream,
    timed out; none an error the engine answered) is measured once more: a blip of the network
    between the controller and the head is not the config's. An engine gone fails the next
    window outright (``BenchError``); one that drops connections for its config drops them
    again, and that window's failures stand."""
    say = on_notice or on_progress or (lambda _m: None)  # its lines say why it measures again
    kept: CellResultRecord | None = None
    kept_key = (0, 0.0)
    reconnected = False
    found: list[NodeError] = []
    stopped_in = 0  # measurements in which an engine was found stopped
    for attempt in range(1, stall.ATTEMPTS + 1):
        cutoff.check(stop, cell.name)  # a cell stopped is measured no more
        seen = len(found)
        record, evidence = signals.run_whole(
            lambda: run_cell_async(
                base_url,
                model,
                cell,
                on_progress=on_progress,
                on_notice=on_notice,
                stop=stop,
                probe=probe,
                found=found,
                hang_after_s=hang_after_s,
            )
        )
        if len(found) > seen:  # an engine stopped: the node's, whatever the window read
            stopped_in += 1
            if attempt < stall.ATTEMPTS:
                say(stopped.measuring_again(found[-1], cell.name, attempt + 1, stall.ATTEMPTS))
            continue
        lost = int(evidence.get("connection_lost", 0))
        # the fewest requests lost with their connection, then the least stalled: an error
        # the engine answered is the config's evidence, and never what a window is kept for
        key = (lost, stall.stalled(record))
        if kept is None or key < kept_key:
            kept, kept_key = record, key
        if record.errors and lost == record.errors and not reconnected:
            reconnected = True
            if attempt < stall.ATTEMPTS:
                say(
                    f"{cell.name}: {lost} request(s) lost their connection "
                    f"({record.error_samples[0] if record.error_samples else 'no answer'}): "
                    f"measuring again ({attempt + 1}/{stall.ATTEMPTS})"
                )
                continue
        if not stall.disturbed(stall.stalled(record), record.duration):
            break
        again = attempt < stall.ATTEMPTS
        say(
            f"{cell.name}: stalled {stall.stalled(record):.2f}s around the {record.duration:g}s "
            f"window (client {record.client_stall_s:.2f}s, engine {record.engine_stall_s:.2f}s: "
            f"{stopped.STALLED if probe is not None else stopped.UNLOOKED}), "
            + (
                f"measuring again ({attempt + 1}/{stall.ATTEMPTS})"
                if again
                else "kept the least stalled"
            )
        )
    if kept is None:  # an engine was found stopped in every measurement
        raise found[-1]
    return kept.model_copy(
        update={"measured_again": attempt - 1, "engine_found_stopped": stopped_in}
    )
