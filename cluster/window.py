"""What a bench cell's window measured (``cluster.bench`` runs the cell): its requests as they
streamed (``Request``), the cell's state while it runs (``CellState``), and the record summed
from them (``summarise``): tokens inside the window, time to first token and between tokens,
each prompt's greedy fingerprint, and acceptance from the spec-decode counters at the window's
edges, else over the whole cell, else from llama-server's ``timings``.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from cluster import metrics
from knobs.records import NONDETERMINISTIC, CellResultRecord, CellSpec
from knobs.spec import clipped

#: How many failed requests' words a cell's record keeps (its ``error_samples``).
ERROR_SAMPLES = 3


@dataclass
class Request:
    """One streaming request of a cell: when it started, its chunks' times and token counts,
    its text, and llama-server's draft counts."""

    prompt_id: str
    start: float
    first: float | None = None
    end: float | None = None
    chunks: list[tuple[float, int]] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    finished: bool = False
    tokens: int = 0
    #: the chunks' token counts are one per chunk, the stream carrying no running usage (an
    #: engine without vLLM's ``continuous_usage_stats``: a chunk of a speculative step may
    #: hold several tokens); the request's final usage, when it comes, settles them
    #: (``spread_final_usage``), else the cell's tokens per chunk scale them (``summarise``)
    estimated: bool = False
    #: the final usage settled one-per-chunk counts: ``spread`` when it said more tokens than
    #: chunks (its total spread over them), else they were right
    settled: bool = False
    spread: bool = False
    drafted: int | None = None  # llama-server's timings.draft_n
    accepted: int | None = None  # … and timings.draft_n_accepted


@dataclass
class CellState:
    """A cell while it runs: its window's edges, its requests and failures, and what a
    cold or quiet engine's wait waits on."""

    cell: CellSpec
    url: str
    model: str
    t0: float
    w0: float
    w1: float
    requests: list[Request] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    counter: int = 0
    #: the greedy probe, run to completion after the window (its text only is evidence)
    probes: list[Request] = field(default_factory=list)
    #: set at every token and every failure: what a cold or quiet engine's wait waits on
    news: asyncio.Event = field(default_factory=asyncio.Event)
    #: when the last token came (0.0 before the first): what a silence is timed from
    last_token: float = 0.0
    #: how much later than its warm-up the window opened (a cold or quiet engine's token)
    extended_s: float = 0.0
    #: requests sent again after no answer on a kept-alive connection (not failures)
    retried: int = 0
    #: failures that were the connection's (reset, cut mid-stream, refused, timed out), with
    #: no error the engine answered: a network's blip or an engine gone, not a bad answer
    lost: int = 0
    #: why the cell is failed though its window has tokens: the engine stopped sending them
    #: and sent none by the cell's deadline (a hung engine, ``cluster.silence``)
    hung: str | None = None

    def failed(self, why: str) -> None:
        self.errors.append(why)
        self.news.set()


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0–100) with linear interpolation; 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


Scrapes = tuple[dict[str, float] | None, dict[str, float] | None]


def spread_final_usage(req: Request, total: int) -> None:
    """A request whose stream counted one token per chunk, given its final usage ``total``:
    the total spread over its chunks in order (each a whole number, summing to it), so the
    window counts the tokens each chunk carried, not one per chunk (a total no larger than the
    chunks leaves them: one token a chunk, as llama-server streams)."""
    if not req.estimated or not req.chunks:
        return
    size = len(req.chunks)
    if total > sum(n for _, n in req.chunks):
        req.chunks = [
            (t, (i + 1) * total // size - i * total // size) for i, (t, _) in enumerate(req.chunks)
        ]
        req.tokens, req.spread = total, True
    req.estimated, req.settled = False, True


def _window_tokens(requests: Sequence[Request], w0: float, w1: float) -> int:
    """The tokens that arrived inside the window. A request still counted one token per chunk
    (cut at the window's edge before its final usage came) is scaled by the tokens per chunk
    of the cell's requests that final usages settled (none: one per chunk)."""
    inside = [(r, sum(n for t, n in r.chunks if w0 <= t < w1)) for r in requests]
    settled = [r for r in requests if r.settled]
    chunks = sum(len(r.chunks) for r in settled)
    per_chunk = sum(n for r in settled for _, n in r.chunks) / chunks if chunks else 1.0
    exact = sum(n for r, n in inside if not r.estimated)
    guessed = sum(n for r, n in inside if r.estimated)
    return exact + round(guessed * per_chunk)


def summarise(
    state: CellState, window: Scrapes, whole: Scrapes
) -> tuple[CellResultRecord, dict[str, Any]]:
    """The cell's record from its requests; acceptance from the spec-decode counters over the
    window, else (a slow engine that published no draft inside it) over the whole cell,
    warm-up and greedy probe included: acceptance is the config's, not the window's."""
    cell, w0, w1 = state.cell, state.w0, state.w1
    duration = w1 - w0
    tokens = _window_tokens(state.requests, w0, w1)
    started_in = [r for r in state.requests if w0 <= r.start < w1 and r.first is not None]
    ttft_pool = started_in or [
        r for r in state.requests if r.first is not None and w0 <= r.first < w1
    ]
    ttft_pool = ttft_pool or [r for r in state.requests if r.first is not None]
    ttfts = [((r.first or r.start) - r.start) * 1000.0 for r in ttft_pool]
    itls: list[float] = []
    for r in state.requests:
        for (a, _), (b, _) in zip(r.chunks, r.chunks[1:], strict=False):
            if w0 <= b < w1:
                itls.append((b - a) * 1000.0)
    done_in = [r for r in state.requests if r.finished and r.end is not None and w0 <= r.end < w1]
    decoding = [r for r in (done_in or state.requests) if len(r.chunks) >= 2]
    rates = [
        (r.tokens - r.chunks[0][1]) / (r.chunks[-1][0] - r.chunks[0][0])
        for r in decoding
        if r.chunks[-1][0] > r.chunks[0][0]
    ]
    busy = 0.0
    for r in state.requests:
        end = r.end if r.end is not None else w1
        busy += max(0.0, min(end, w1) - max(r.start, w0))
    fingerprints: dict[str, str] = {}
    for r in [*state.requests, *state.probes]:
        if not r.finished:
            continue
        digest = hashlib.sha256("".join(r.text).encode()).hexdigest()
        seen = fingerprints.setdefault(r.prompt_id, digest)
        if seen != digest:
            # greedy decoding must repeat itself; keep the evidence that it did not
            fingerprints[f"{r.prompt_id}{NONDETERMINISTIC}"] = digest
    accepted, rate, positions = metrics.spec_acceptance(*window)
    if accepted is None:
        accepted, rate, positions = metrics.spec_acceptance(*whole)
    if rate is None:
        rate = timings_acceptance(done_in)
    record = CellResultRecord(
        cell=cell.name,
        category=cell.category,
        concurrency=cell.concurrency,
        context_tokens=cell.context_tokens,
        duration=duration,
        completed=len(done_in),
        errors=len(state.errors),
        error_samples=tuple(clipped(e, 300) for e in state.errors[:ERROR_SAMPLES]),
        total_output_tokens=tokens,
        output_throughput=tokens / duration if duration > 0 else 0.0,
        per_request_throughput=sum(rates) / len(rates) if rates else 0.0,
        mean_ttft_ms=sum(ttfts) / len(ttfts) if ttfts else 0.0,
        median_ttft_ms=percentile(ttfts, 50),
        p90_ttft_ms=percentile(ttfts, 90),
        p99_ttft_ms=percentile(ttfts, 99),
        median_itl_ms=percentile(itls, 50),
        effective_concurrency=busy / duration if duration > 0 else 0.0,
        accepted_per_step=accepted,
        acceptance_rate=rate,
        per_position_acceptance=positions,
        fingerprints=fingerprints,
    )
    evidence: dict[str, Any] = {"errors": state.errors[:20], "requests": len(state.requests)}
    if state.extended_s > 0:
        evidence["warmup_extended_s"] = round(state.extended_s, 3)
    if state.retried:
        evidence["retried"] = state.retried
    if state.lost:
        evidence["connection_lost"] = state.lost
    if any(r.spread for r in state.requests):
        # no running usage in a stream whose chunks held several tokens: the final usages said
        evidence["tokens_from_final_usage"] = sum(r.spread for r in state.requests)
    return record, evidence


def timings_acceptance(requests: Sequence[Request]) -> float | None:
    """Accepted / drafted tokens summed over the ``timings`` of ``requests`` (llama-server's
    ``draft_n`` and ``draft_n_accepted``), or None where none of them drafted."""
    drafted = sum(r.drafted or 0 for r in requests)
    accepted = sum(r.accepted or 0 for r in requests)
    return accepted / drafted if drafted > 0 else None
