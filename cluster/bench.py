"""Bench cells against an OpenAI-compatible endpoint (vLLM, llama.cpp's llama-server or the
twin) and its ``/metrics``.

A cell keeps ``concurrency`` greedy streaming requests in flight (a new one starts the moment
one finishes) for a warm-up and then a measurement window. Throughput counts the tokens that
arrive inside the window (a request straddling an edge contributes only its tokens inside);
per-chunk token counts come from vLLM's ``continuous_usage_stats`` (llama-server streams one
chunk per token); a server that sends usage only at a request's end (a chunk of a speculative
step may hold several tokens) has its total spread over the request's chunks, and requests the
window cut before their end scaled by the cell's tokens per chunk (``cluster.window``).
Accepted tokens per step come from the deltas of the spec-decode counters scraped at both
window edges (``cluster.metrics``; llama-server adds a request's counts when
the request finishes). Where a server has no such counters, the acceptance rate
comes from the ``timings`` (``draft_n``, ``draft_n_accepted``) that llama-server puts in the
last chunk of each request. Requests still in flight when the window closes are cancelled.

Every failure is a ``BenchError`` (``cluster.errors``) carrying the URL and the evidence; no
httpx exception escapes. What the window measured is summed into the cell's record by
``cluster.window``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import threading
from collections.abc import Callable, Sequence
from typing import Any

import httpx

from cluster import cutoff, metrics, prompts, signals, stall
from cluster.errors import BenchError, describe
from cluster.window import CellState, Request, Scrapes, spread_final_usage, summarise
from knobs.records import CellResultRecord, CellSpec, NodeClockRecord
from knobs.spec import clipped

DEFAULT_SMOKE_PROMPT = "The capital of France is"

#: the least a cell waits past its warm-up for a cold engine's first token (seconds)
COLD_START_MIN_S = 60.0


async def _scrape_models(client: httpx.AsyncClient, base_url: str) -> None:
    # the cell itself reports an unreachable endpoint
    with contextlib.suppress(httpx.HTTPError):
        await client.get(base_url.rstrip("/") + "/v1/models", timeout=metrics.SCRAPE_TIMEOUT_S)


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


# ---- the cell -----------------------------------------------------------------------------------
async def _one(client: httpx.AsyncClient, state: CellState, *, probe: bool = False) -> None:
    """One streamed greedy request of the cell's next prompt (``probe``: of its first prompt,
    recorded apart from the measurement)."""
    cell = state.cell
    index = 0 if probe else state.counter
    prompt = prompts.build_prompt(cell.category, cell.context_tokens, index)
    loop = asyncio.get_running_loop()
    req = Request(prompt_id=prompt.id, start=loop.time())
    if probe:
        state.probes.append(req)
    else:
        state.counter += 1
        state.requests.append(req)
    body = {
        "model": state.model,
        "prompt": prompt.text,
        "max_tokens": cell.max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    for attempt in (1, 2):
        answered = False
        try:
            async with client.stream("POST", state.url, json=body) as response:
                answered = True
                if response.status_code != 200:
                    detail = clipped((await response.aread()).decode(errors="replace"), 300)
                    state.failed(f"HTTP {response.status_code}: {detail}")
                    req.end = loop.time()
                    return
                await _read_stream(response, state, req)
            req.end = loop.time()
            return
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as e:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                # the window closed under this request: the cancellation's side effects
                # (a stream cut mid-chunk) are the client's doing, not a failed request
                raise asyncio.CancelledError from e
            if attempt == 1 and not answered and isinstance(e, httpx.TransportError):
                # no answer at all on a kept-alive connection the server had just closed:
                # the request never reached the engine, and is sent once more
                state.retried += 1
                continue
            if isinstance(e, httpx.TransportError):
                state.lost += 1
            state.failed(describe(e))
            req.end = loop.time()
            return


async def _read_stream(response: httpx.Response, state: CellState, req: Request) -> None:
    """A 200 response's server-sent events into ``req``: tokens per chunk and when."""
    loop = asyncio.get_running_loop()
    async for line in response.aiter_lines():
        if not line.startswith("data: "):
            continue
        data = line[6:]
        if data == "[DONE]":
            continue  # read the body to its end so the connection goes back to the pool
        now = loop.time()
        chunk = json.loads(data)
        timings = chunk.get("timings")
        if isinstance(timings, dict) and "draft_n" in timings:
            req.drafted = int(timings["draft_n"])
            req.accepted = int(timings.get("draft_n_accepted", 0))
        choices = chunk.get("choices") or []
        usage = chunk.get("usage")
        if not choices:
            if usage:
                total = int(usage.get("completion_tokens", 0))
                spread_final_usage(req, total)
                req.tokens = max(req.tokens, total)
            continue
        choice = choices[0]
        piece = choice.get("text")
        if piece is None:
            piece = (choice.get("delta") or {}).get("content") or ""
        running = usage is not None and "completion_tokens" in usage
        if running and not req.estimated:
            total = int(usage["completion_tokens"])
            count = total - req.tokens
        else:  # no running usage: one token a chunk until the final usage says more
            count = 1 if piece else 0
            total = req.tokens + count
            req.estimated = req.estimated or count > 0
        req.tokens = total
        if count > 0:
            if req.first is None:
                req.first = now
            req.chunks.append((now, count))
            state.news.set()
        if running and req.estimated:  # usage on the last chunk only: spread it
            spread_final_usage(req, int(usage["completion_tokens"]))
            req.tokens = max(req.tokens, int(usage["completion_tokens"]))
        req.text.append(piece)
        if choice.get("finish_reason"):
            req.finished = True


async def _stream_forever(
    client: httpx.AsyncClient, state: CellState, stop: threading.Event | None
) -> None:
    loop = asyncio.get_running_loop()
    # between requests, the cutoff: a stream stopped sends nothing more
    while loop.time() < state.w1 and not (stop is not None and stop.is_set()):
        errors = len(state.errors)
        await _one(client, state)
        if len(state.errors) > errors:
            await asyncio.sleep(0.05)  # a failing endpoint must not be hammered in a tight loop


async def _greedy_probe(
    client: httpx.AsyncClient, state: CellState, say: Callable[[str], None]
) -> None:
    """The cell's first prompt run to completion after the window, when no request for it
    finished inside: every cell then carries that prompt's greedy fingerprint, on every config
    alike, so a greedy check always has something to compare (a slow engine finishes nothing
    in a short window). Its timing is not part of the measurement, and a failed probe is not a
    failed cell: the verdict sees a cell without the fingerprint."""
    cell = state.cell
    first = prompts.build_prompt(cell.category, cell.context_tokens, 0).id
    if any(r.finished and r.prompt_id == first for r in state.requests):
        return
    say(f"{cell.name}: greedy probe ({first}, {cell.max_tokens} tokens)")
    errors, lost = len(state.errors), state.lost
    await _one(client, state, probe=True)
    del state.errors[errors:]
    state.lost = lost


def cold_start_limit_s(cell: CellSpec) -> float:
    """How long past its warm-up a cell waits, in all, for a cold or quiet engine's tokens."""
    return max(COLD_START_MIN_S, 5.0 * (cell.warmup_s + cell.duration_s))


async def _cold_start(state: CellState, deadline: float, say: Callable[[str], None]) -> None:
    """The window opens at the warm-up's end, or, on an engine that has sent neither a token
    nor a failure by then, at its first token: a backend that compiles on first use answers
    its first request late, and a window spent waiting for it would measure the compile, not
    the config. A failure ends the wait, and so does the ``deadline``: the window is then the
    one the cell had (failures are its evidence, as on a warm engine)."""
    if not state.news.is_set():
        await _reopen_at_token(state, deadline, say, "no token after the warm-up", "first")


def _fell_silent(state: CellState) -> float | None:
    """When the window's tokens stopped for its last half or more, with no failure anywhere:
    the time of its last token (an engine that stopped answering mid-window, or one that
    paused to compile a path it met late); else None."""
    if state.errors:
        return None
    inside = [t for r in state.requests for t, _ in r.chunks if state.w0 <= t < state.w1]
    if not inside or state.w1 - max(inside) < state.cell.duration_s / 2:
        return None
    return max(inside)


async def _after_silence(
    state: CellState, last: float, deadline: float, say: Callable[[str], None]
) -> None:
    """A window that fell silent (``_fell_silent``, at ``last``) waits, with the streams going
    on, up to the cell's ``deadline`` for the engine's next token or failure: either ends the
    wait and the window stands as measured (the silence was the config's); with neither by the
    deadline the engine is hung (``CellState.hung``): a cell that stopped measuring then would
    report a fraction of the config's throughput as its measurement."""
    state.news.clear()
    why = f"no token for the window's last {state.w1 - last:.0f}s"
    if await _wait_for_token(state, deadline, say, why, "next") is not None or state.errors:
        return
    state.hung = (
        f"the engine stopped sending tokens {last - state.w0:.1f}s into the "
        f"{state.cell.duration_s:g}s window and sent none in the "
        f"{asyncio.get_running_loop().time() - last:.0f}s "
        "after (hung, or its host stopped)"
    )


def _went_quiet(state: CellState) -> bool:
    """The window closed with no token in it and no failure anywhere: an engine that is
    alive and silent (a decode path compiled on first use after the first token, a host that
    kept it off the CPU), not a measurement of the config and not a failed one."""
    if state.errors:
        return False
    return not any(state.w0 <= t < state.w1 for r in state.requests for t, _ in r.chunks)


async def _after_quiet(state: CellState, deadline: float, say: Callable[[str], None]) -> bool:
    """A quiet window (``_went_quiet``) waits, up to the ``deadline``, for the engine's next
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
    since = await _wait_for_token(state, deadline, say, why, which)
    if since is None:
        return False  # a failure ended the wait (it is the cell's evidence), or the deadline
    now = asyncio.get_running_loop().time()
    state.extended_s += now - since
    state.w0, state.w1 = now, now + state.cell.duration_s
    return True


async def _wait_for_token(
    state: CellState, deadline: float, say: Callable[[str], None], why: str, which: str
) -> float | None:
    """Says ``why`` the cell waits, then waits, with the streams going on, for a token or a
    failure until the ``deadline``: when it began, if a token came; None at a failure or the
    deadline. The window stays as planned."""
    loop = asyncio.get_running_loop()
    since, planned = loop.time(), state.w1
    say(
        f"{state.cell.name}: {why}; waiting up to {max(0.0, deadline - since):.0f}s for the {which}"
    )
    state.w1 = math.inf  # the streams go on while the engine is silent
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(state.news.wait(), timeout=max(0.0, deadline - since))
    state.w1 = planned
    return since if any(t >= since for r in state.requests for t, _ in r.chunks) else None


async def run_cell_async(
    base_url: str,
    model: str,
    cell: CellSpec,
    *,
    on_progress: Callable[[str], None] | None = None,
    on_notice: Callable[[str], None] | None = None,
    stop: threading.Event | None = None,
) -> tuple[CellResultRecord, dict[str, Any]]:
    """The measurement of ``run_cell`` without the clocks; also returns raw evidence.

    Raises:
        OwnershipLost: ``stop`` was set (``cluster.cutoff``): the cell's streams are closed.
        BenchError: no token arrived in the window and requests failed (the evidence is the
            first failure), or no token arrived in one within ``cold_start_limit_s`` past the
            warm-up (a window that closes quiet, with no failure, waits for the next token).
    """
    say = on_progress or (lambda _m: None)
    url = base_url.rstrip("/") + "/v1/completions"
    loop = asyncio.get_running_loop()
    watch = stall.StallWatch()
    with watch:
        state, scrapes = await cutoff.unless_stopped(
            stop, cell.name, _measure(base_url, model, cell, say, on_notice or say, stop)
        )
    record, evidence = summarise(state, *scrapes)
    if record.total_output_tokens == 0:
        waited = loop.time() - state.w1
        first = (
            state.errors[0]
            if state.errors
            else "no token arrived in the window"
            + (f", nor in the {waited:.0f}s the cell waited after it" if waited >= 1 else "")
        )
        raise BenchError(
            f"cell {cell.name} at {url} measured nothing: {first}",
            url=url,
            evidence="\n".join(state.errors[:5]) or first,
        )
    if state.hung is not None:
        raise BenchError(f"cell {cell.name} at {url}: {state.hung}", url=url, evidence=state.hung)
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
    stop: threading.Event | None = None,
) -> tuple[CellState, tuple[Scrapes, Scrapes]]:
    """The cell's requests, and its counters at the window's edges and at the cell's (``say``:
    its progress; ``notice``: why it waits past its window)."""
    url = base_url.rstrip("/") + "/v1/completions"
    metrics_url = base_url.rstrip("/") + "/metrics"
    limits = httpx.Limits(
        max_connections=cell.concurrency + 4, max_keepalive_connections=cell.concurrency + 4
    )
    # a stream waits for its next token as long as the cell waits for any (``cold_start_limit_s``)
    timeout = httpx.Timeout(30.0, read=cell.warmup_s + cold_start_limit_s(cell))
    loop = asyncio.get_running_loop()
    async with httpx.AsyncClient(limits=limits, timeout=timeout, trust_env=False) as client:
        # build the prompts and open the connections first: the cell starts when the requests
        # can leave at once
        for i in range(len(prompts.base_prompts(cell.category))):
            prompts.build_prompt(cell.category, cell.context_tokens, i)
        await asyncio.gather(*(_scrape_models(client, base_url) for _ in range(cell.concurrency)))
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
            _retrieved(asyncio.create_task(_stream_forever(client, state, stop)))
            for _ in range(cell.concurrency)
        ]
        try:
            await asyncio.sleep(max(0.0, state.w0 - loop.time()))
            deadline = loop.time() + cold_start_limit_s(cell)
            await _cold_start(state, deadline, notice)
            while True:
                before = await metrics.scrape(client, metrics_url)
                say(f"{cell.name}: measuring {cell.duration_s:g}s")
                await asyncio.sleep(max(0.0, state.w1 - loop.time()))
                after = await metrics.scrape(client, metrics_url)
                last = _fell_silent(state)
                if last is not None:
                    await _after_silence(state, last, deadline, notice)
                    break
                if not _went_quiet(state):
                    break
                # a stream whose request ended after the window stopped: it goes on again
                workers = [
                    _retrieved(asyncio.create_task(_stream_forever(client, state, stop)))
                    if w.done()
                    else w
                    for w in workers
                ]
                if not await _after_quiet(state, deadline, notice):
                    break
        finally:
            for w in workers:
                w.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
        if state.hung is None and _measured_any(state):  # a silent engine answers no probe
            await _greedy_probe(client, state, say)
            await metrics.drain(client, metrics_url)
        closing = await metrics.scrape(client, metrics_url)
    return state, ((before, after), (opening, closing))


def _retrieved(task: asyncio.Task[None]) -> asyncio.Task[None]:
    """``task``, whose exception counts as seen once it ends: a stream's own failures are
    the cell's evidence already, and an interrupt (Ctrl-C, SIGTERM) that landed in it is
    the command's, raised where the loop runs; asyncio would log either, as a task's
    exception nobody retrieved, once the interrupt left the loop."""
    task.add_done_callback(lambda t: t.cancelled() or t.exception())
    return task


def _measured_any(state: CellState) -> bool:
    return any(state.w0 <= t < state.w1 for r in state.requests for t, _ in r.chunks)


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
    ends the cell as it stands, its loop closed whole (``signals.run_whole``).

    Raises:
        BenchError: the cell measured nothing (the endpoint is down or every request failed),
            or its engine stopped sending tokens mid-window and sent none by its deadline.
        OwnershipLost: ``stop`` was set before the cell ended.
        Whatever ``clocks`` raises.
    """
    cutoff.check(stop, cell.name)
    first = list(clocks()) if clocks is not None else []
    record = _measured_undisturbed(base_url, model, cell, on_progress, on_notice, stop)
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
) -> CellResultRecord:
    """The cell measured until a window is not disturbed by a stall of its client's or its
    engine's host (``cluster.stall``), at most ``stall.ATTEMPTS`` times; the one with the
    fewest requests that lost their connection, then the least stalled.

    A window whose every failure was the connection's (``CellState.lost``: reset, cut mid-stream,
    timed out; none an error the engine answered) is measured once more: a blip of the network
    between the controller and the head is not the config's. An engine gone fails the next
    window outright (``BenchError``); one that drops connections for its config drops them
    again, and that window's failures stand."""
    say = on_notice or on_progress or (lambda _m: None)  # its lines say why it measures again
    kept: CellResultRecord | None = None
    kept_key = (0, 0.0)
    reconnected = False
    for attempt in range(1, stall.ATTEMPTS + 1):
        cutoff.check(stop, cell.name)  # a cell stopped is measured no more
        record, evidence = signals.run_whole(
            lambda: run_cell_async(
                base_url, model, cell, on_progress=on_progress, on_notice=on_notice, stop=stop
            )
        )
        lost = int(evidence.get("connection_lost", 0))
        # the fewest requests lost with their connection, then the least stalled: an error
        # the engine answered is the config's evidence, and never what a window is kept for
        key = (lost, stalled(record))
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
        if not stall.disturbed(stalled(record), record.duration):
            break
        again = attempt < stall.ATTEMPTS
        say(
            f"{cell.name}: stalled {stalled(record):.2f}s around the {record.duration:g}s "
            f"window (client {record.client_stall_s:.2f}s, engine {record.engine_stall_s:.2f}s:"
            " a busy host), "
            + (
                f"measuring again ({attempt + 1}/{stall.ATTEMPTS})"
                if again
                else "kept the least stalled"
            )
        )
    assert kept is not None
    return kept.model_copy(update={"measured_again": attempt - 1})


def stalled(record: CellResultRecord) -> float:
    """Seconds the cell's window was disturbed by its hosts: the client's and the engine's."""
    return record.client_stall_s + record.engine_stall_s
