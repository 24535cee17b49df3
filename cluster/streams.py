"""A bench cell's streams (``cluster.bench`` runs the cell): greedy streaming requests of the
cell's prompts against an OpenAI-compatible endpoint, each read chunk by chunk into the cell's
state (``cluster.window``), a new one sent the moment one ends.

Per-chunk token counts come from vLLM's ``continuous_usage_stats`` (llama-server streams one
chunk per token); a server that sends usage only at a request's end (a chunk of a speculative
step may hold several tokens) has its total spread over the request's chunks. Where a server
has no spec-decode counters, the acceptance rate comes from the ``timings`` (``draft_n``,
``draft_n_accepted``) that llama-server puts in the last chunk of each request. A request's
failure is the cell's evidence (``CellState.failed``); no httpx exception escapes. A stream
stops between requests at the cell's cutoff (``cluster.cutoff``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Callable

import httpx

from cluster import metrics, prompts
from cluster.errors import describe
from cluster.window import CellState, Request, spread_final_usage
from knobs.spec import clipped


async def warm(client: httpx.AsyncClient, base_url: str) -> None:
    """One connection opened to the endpoint (its model list asked for), so that the cell's
    requests can leave at once; a failure says nothing: the cell itself reports an unreachable
    endpoint."""
    with contextlib.suppress(httpx.HTTPError):
        await client.get(base_url.rstrip("/") + "/v1/models", timeout=metrics.SCRAPE_TIMEOUT_S)


async def send(client: httpx.AsyncClient, state: CellState, *, probe: bool = False) -> None:
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
            state.last_token = now
            state.news.set()
        if running and req.estimated:  # usage on the last chunk only: spread it
            spread_final_usage(req, int(usage["completion_tokens"]))
            req.tokens = max(req.tokens, int(usage["completion_tokens"]))
        req.text.append(piece)
        if choice.get("finish_reason"):
            req.finished = True


async def forever(
    client: httpx.AsyncClient, state: CellState, stop: threading.Event | None
) -> None:
    """One of the cell's streams: a request after another until the window closes (``state.w1``)
    or the cutoff ``stop`` is set."""
    loop = asyncio.get_running_loop()
    # between requests, the cutoff: a stream stopped sends nothing more
    while loop.time() < state.w1 and not (stop is not None and stop.is_set()):
        errors = len(state.errors)
        await send(client, state)
        if len(state.errors) > errors:
            await asyncio.sleep(0.05)  # a failing endpoint must not be hammered in a tight loop


async def greedy_probe(
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
    await send(client, state, probe=True)
    del state.errors[errors:]
    state.lost = lost


def retrieved(task: asyncio.Task[None]) -> asyncio.Task[None]:
    """``task``, whose exception counts as seen once it ends: a stream's own failures are
    the cell's evidence already, and an interrupt (Ctrl-C, SIGTERM) that landed in it is
    the command's, raised where the loop runs; asyncio would log either, as a task's
    exception nobody retrieved, once the interrupt left the loop."""
    task.add_done_callback(lambda t: t.cancelled() or t.exception())
    return task
