"""The head's ``/metrics``: Prometheus text under vLLM v1's names, read from the engine's counters.

The one home of what the twin exposes to a scraper: the scheduler's gauges, the token and
request counters (``_total``), the speculative-decoding counters when the engine drafts, and
the twin's own stall counter that a bench cell reads as its engine host's stall.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cluster.stall import ENGINE_STALL_METRIC
from cluster.twin.engine import Counters

if TYPE_CHECKING:
    from cluster.twin.server import ServerState


#: One Prometheus metric: name, type, help text, and its samples (extra labels, value).
_Metric = tuple[str, str, str, list[tuple[str, float]]]


def metrics_text(state: ServerState, counters: Counters | None) -> str:
    """``/metrics`` in Prometheus text format, vLLM v1 names (counters end in ``_total``)."""
    c = counters or Counters(per_position=[0] * state.k)
    labels = f'engine="0",model_name="{state.served_model_name}"'
    metrics = _engine_metrics(c) + (_spec_decode_metrics(c) if state.k > 0 else [])
    lines = [line for metric in metrics for line in _metric_lines(labels, *metric)]
    return "\n".join(lines) + "\n"


def _metric_lines(
    labels: str, name: str, kind: str, help_text: str, samples: list[tuple[str, float]]
) -> list[str]:
    """One metric's ``# HELP`` and ``# TYPE`` lines and its samples."""
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
    suffix = "_total" if kind == "counter" else ""
    for extra, value in samples:
        lab = labels + ("," + extra if extra else "")
        lines.append(f"{name}{suffix}{{{lab}}} {float(value)}")
    return lines


def _engine_metrics(c: Counters) -> list[_Metric]:
    """The scheduler's gauges and the token and request counters."""
    return [
        (
            "vllm:num_requests_running",
            "gauge",
            "Number of requests in model execution batches.",
            [("", c.running)],
        ),
        (
            "vllm:num_requests_waiting",
            "gauge",
            "Number of requests waiting to be processed.",
            [("", c.waiting)],
        ),
        (
            "vllm:kv_cache_usage_perc",
            "gauge",
            "KV-cache usage. 1 means 100 percent usage.",
            [("", min(1.0, (c.running + c.waiting) / 64.0))],
        ),
        (
            "vllm:prompt_tokens",
            "counter",
            "Number of prefill tokens processed.",
            [("", c.prompt_tokens)],
        ),
        (
            "vllm:generation_tokens",
            "counter",
            "Number of generation tokens processed.",
            [("", c.generation_tokens)],
        ),
        (
            "vllm:request_success",
            "counter",
            "Count of successfully processed requests.",
            [('finished_reason="length"', c.requests_ok)],
        ),
        (
            "vllm:num_preemptions",
            "counter",
            "Cumulative number of preemption from the engine.",
            [("", 0)],
        ),
        (
            # the twin's own, not vLLM's: a bench cell reads it as the engine host's stall
            # (cluster.bench: such a cell is measured again, as for a stalled client)
            ENGINE_STALL_METRIC,
            "counter",
            "Seconds the twin's scheduler woke later than a delivery was due (its host was busy).",
            [("", c.stall_s)],
        ),
    ]


def _spec_decode_metrics(c: Counters) -> list[_Metric]:
    """The speculative-decoding counters (only when the engine drafts, k > 0)."""
    return [
        (
            "vllm:spec_decode_num_drafts",
            "counter",
            "Number of spec decoding drafts.",
            [("", c.drafts)],
        ),
        (
            "vllm:spec_decode_num_draft_tokens",
            "counter",
            "Number of draft tokens.",
            [("", c.draft_tokens)],
        ),
        (
            "vllm:spec_decode_num_accepted_tokens",
            "counter",
            "Number of accepted tokens.",
            [("", c.accepted)],
        ),
        (
            "vllm:spec_decode_num_accepted_tokens_per_pos",
            "counter",
            "Accepted tokens per draft position.",
            [(f'position="{i}"', v) for i, v in enumerate(c.per_position)],
        ),
    ]
