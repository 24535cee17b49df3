"""An engine's ``/metrics``: Prometheus text parsed, scraped, and read for what a bench cell
needs: the spec-decode counters' deltas (vLLM's ``vllm:spec_decode_*`` or llama-server's
``llamacpp:spec_decode_*``, the same names under another prefix) and the gauges of requests
still in flight (vLLM's, llama-server's, SGLang's: a cell drains them before the next starts).
SGLang publishes its acceptance as a gauge of mean accept length, not counters: a cell on it
has no acceptance of its own."""

from __future__ import annotations

import asyncio
import re

import httpx

from cluster.errors import BenchError, describe

#: Metric-name prefixes of the engines whose spec-decode counters the bench reads, in the order
#: they are tried: ``PREFIX + "spec_decode_num_drafts"`` and its siblings.
SPEC_PREFIXES = ("vllm:", "llamacpp:")
#: Gauges of requests an engine is still working on, per engine: a cell drains them to zero.
BUSY_GAUGES = (
    ("vllm:num_requests_running", "vllm:num_requests_waiting"),
    ("llamacpp:requests_processing", "llamacpp:requests_deferred"),
    ("sglang:num_running_reqs", "sglang:num_queue_reqs"),
)
#: How long a cell waits for one answer to a scrape (seconds): an engine answers ``/metrics``
#: in milliseconds, and one that stopped answering must not hold the cell for the streams'
#: read timeout at each of its scrapes.
SCRAPE_TIMEOUT_S = 10.0

_SERIES = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)(\s+\S+)?$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text as a dict.

    Keys are series, ``name{k="v",…}`` with labels sorted, and, for every metric name, the bare
    name holding the sum of its series (so ``vllm:spec_decode_num_drafts_total`` works whether
    or not the server adds labels). Comments and malformed lines are skipped.
    """
    out: dict[str, float] = {}
    sums: dict[str, float] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = _SERIES.match(line)
        if not match:
            continue
        name, _, labels, raw = match.group(1), match.group(2), match.group(3), match.group(4)
        try:
            value = float(raw)
        except ValueError:
            continue
        if labels:
            pairs = sorted(_LABEL.findall(labels))
            key = name + "{" + ",".join(f'{k}="{v}"' for k, v in pairs) + "}"
            out[key] = out.get(key, 0.0) + value
        sums[name] = sums.get(name, 0.0) + value
    out.update(sums)
    return out


def _counter(metrics: dict[str, float], name: str) -> float | None:
    for candidate in (name + "_total", name):
        if candidate in metrics:
            return metrics[candidate]
    return None


def _per_position(metrics: dict[str, float], name: str) -> dict[int, float]:
    out: dict[int, float] = {}
    for base in (name + "_total", name):
        for key, value in metrics.items():
            if key.startswith(base + "{"):
                match = re.search(r'position="(\d+)"', key)
                if match:
                    pos = int(match.group(1))
                    out[pos] = out.get(pos, 0.0) + value
        if out:
            return out
    return out


def busy_requests(metrics: dict[str, float]) -> float | None:
    """Requests the engine is running or holding back (vLLM's running + waiting gauges,
    llama-server's processing + deferred, SGLang's running + queued), or None for a server with
    none of them."""
    for running, waiting in BUSY_GAUGES:
        if running in metrics:
            return metrics[running] + metrics.get(waiting, 0.0)
    return None


def spec_prefix(metrics: dict[str, float]) -> str | None:
    """The prefix (``vllm:``, ``llamacpp:``) under which ``metrics`` has spec-decode counters."""
    for prefix in SPEC_PREFIXES:
        if _counter(metrics, prefix + "spec_decode_num_drafts") is not None:
            return prefix
    return None


def scrape_metrics(base_url: str, timeout: float = 10.0) -> dict[str, float]:
    """``GET /metrics`` parsed by ``parse_metrics``.

    Raises:
        BenchError: the endpoint cannot be reached or does not answer 200.
    """
    url = base_url.rstrip("/") + "/metrics"
    try:
        with httpx.Client(timeout=timeout, trust_env=False) as client:
            response = client.get(url)
    except httpx.HTTPError as e:
        raise BenchError(
            f"cannot scrape {url}: {describe(e)}", url=url, evidence=describe(e)
        ) from e
    if response.status_code != 200:
        raise BenchError(
            f"{url} answered {response.status_code}",
            url=url,
            status=response.status_code,
            evidence=response.text[-500:],
        )
    return parse_metrics(response.text)


async def scrape(client: httpx.AsyncClient, url: str) -> dict[str, float] | None:
    """``url`` (an engine's ``/metrics``) parsed, or None where it did not answer 200 within
    ``SCRAPE_TIMEOUT_S`` (an engine that stopped answering holds no cell for long)."""
    try:
        response = await client.get(url, timeout=SCRAPE_TIMEOUT_S)
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    return parse_metrics(response.text)


async def drain(client: httpx.AsyncClient, metrics_url: str, limit: float = 2.0) -> None:
    """Wait (up to ``limit`` seconds) until the engine has dropped the cancelled requests, so
    the next cell starts on an idle engine; a server without the gauges is not waited for."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit
    while loop.time() < deadline:
        metrics = await scrape(client, metrics_url)
        busy = None if metrics is None else busy_requests(metrics)
        if busy is None or busy == 0:
            return
        await asyncio.sleep(0.01)


def spec_acceptance(
    before: dict[str, float] | None, after: dict[str, float] | None
) -> tuple[float | None, float | None, tuple[float, ...]]:
    """Accepted tokens per verify step (1 + accepted / verify steps), the acceptance rate
    (accepted / drafted) and the per-position acceptance, from the spec-decode counters'
    deltas between two scrapes (vLLM's or llama-server's); Nones where nothing was drafted
    or the server has no such counters."""
    if before is None or after is None:
        return None, None, ()
    prefix = spec_prefix(after)
    if prefix is None:
        return None, None, ()
    drafts = delta(before, after, prefix + "spec_decode_num_drafts")
    drafted = delta(before, after, prefix + "spec_decode_num_draft_tokens")
    acc = delta(before, after, prefix + "spec_decode_num_accepted_tokens")
    if not drafts or drafts <= 0 or acc is None:
        return None, None, ()
    p0 = _per_position(before, prefix + "spec_decode_num_accepted_tokens_per_pos")
    p1 = _per_position(after, prefix + "spec_decode_num_accepted_tokens_per_pos")
    positions = tuple((p1[i] - p0.get(i, 0.0)) / drafts for i in sorted(p1))
    return 1.0 + acc / drafts, (acc / drafted if drafted else None), positions


def delta(before: dict[str, float], after: dict[str, float], name: str) -> float | None:
    """The counter ``name``'s increase from ``before`` to ``after``; None where either lacks it."""
    a, b = _counter(before, name), _counter(after, name)
    if a is None or b is None:
        return None
    return b - a
