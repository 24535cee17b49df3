"""What the LLM proposers share: their errors, options and prices, the usage and cost notes
of a proposal, and the cleaning of untrusted text."""

from __future__ import annotations

import os
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, model_validator

from knobs.records import LlmUsage
from orchestrator.errors import OrchestrateError

#: The model when the profile names none: a current Claude model with a published price.
DEFAULT_MODEL = "claude-sonnet-4-6"

#: List prices in USD per million tokens (input, output), from Anthropic's pricing page.
#: A model not listed here needs ``input_usd_per_mtok`` and ``output_usd_per_mtok``.
PRICES: dict[str, tuple[float, float]] = {
    "claude-opus-4-6": (5.0, 25.0),
    "claude-opus-4-5": (5.0, 25.0),
    "claude-opus-4-1": (15.0, 75.0),
    "claude-sonnet-4-6": (3.0, 15.0),
    "claude-sonnet-4-5": (3.0, 15.0),
    "claude-haiku-4-5": (1.0, 5.0),
}
#: Prompt-cache writes and reads, as multiples of the input price.
CACHE_WRITE_FACTOR = 1.25
CACHE_READ_FACTOR = 0.1


#: Longest free text kept from the model, per field.
MAX_TEXT = 600
#: Environment variables the SDK takes a credential from.
KEY_VARIABLES = ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN")


# ---- errors -------------------------------------------------------------------------------------
class LLMError(OrchestrateError):
    """The LLM API refused the request for a reason a retry cannot fix (a bad key, an unknown
    model, a request it rejects), or no credential is configured.

    Carries the model, the HTTP status and the API's error type when there is one. The message
    never contains a credential.
    """

    exit_code = 7

    def __init__(
        self,
        message: str,
        *,
        model: str | None = None,
        status: int | None = None,
        error_type: str | None = None,
    ) -> None:
        super().__init__(_scrub(message))
        self.model = model
        self.status = status
        self.error_type = error_type


class MissingApiKey(LLMError):
    """An LLM proposer was asked for and no API key is set."""


# ---- options ------------------------------------------------------------------------------------
class ClaudeOptions(BaseModel):
    """The options of the ``claude`` proposer (``proposer.claude`` in a profile)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str = Field(default=DEFAULT_MODEL, pattern=r"^[A-Za-z0-9._:@/-]{1,128}$")
    #: Proposals the model may make (each refused one goes back as a tool error) before the
    #: fallback proposer takes over.
    max_tries: int = Field(default=3, ge=1, le=10)
    #: The most USD of LLM calls in one round; reached, the fallback proposer takes over.
    max_usd_per_round: float | None = Field(default=None, gt=0)
    #: The research brief (a markdown file a person edits), re-read before every proposal.
    brief: str | None = None
    max_tokens: int = Field(default=1024, ge=64, le=32_000)
    #: Retries of the SDK (with exponential backoff, honouring ``retry-after``) on 408, 409,
    #: 429, 5xx (529 overloaded included), timeouts and connection errors.
    api_retries: int = Field(default=2, ge=0, le=10)
    #: Seconds one HTTP request may stay silent (the SDK's timeout: it bounds each wait for
    #: bytes, not a request, and each retry waits again).
    api_timeout_s: float = Field(default=60.0, gt=0, le=3600)
    #: Seconds one proposal may wait on the API in all (every request, the SDK's retries and
    #: their backoff together); past it the fallback proposer takes over ("timed out").
    api_deadline_s: float = Field(default=180.0, gt=0, le=3600)
    #: Ask the API to enforce the tool's input schema (structured outputs).
    strict_tools: bool = True
    input_usd_per_mtok: float | None = Field(default=None, ge=0)
    output_usd_per_mtok: float | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _priced(self) -> ClaudeOptions:
        given = (self.input_usd_per_mtok, self.output_usd_per_mtok)
        if None in given and self.model not in PRICES:
            raise ValueError(
                f"no list price known for model {self.model!r}: set input_usd_per_mtok and "
                f"output_usd_per_mtok (known: {', '.join(sorted(PRICES))})"
            )
        return self

    def prices(self) -> tuple[float, float]:
        """USD per million input and output tokens."""
        listed = PRICES.get(self.model, (0.0, 0.0))
        return (
            listed[0] if self.input_usd_per_mtok is None else self.input_usd_per_mtok,
            listed[1] if self.output_usd_per_mtok is None else self.output_usd_per_mtok,
        )


# ---- usage and notes ----------------------------------------------------------------------------
@dataclass
class Usage:
    """Tokens and requests of the calls made for one proposal."""

    requests: int = 0
    api_retries: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0

    def add(self, usage: object) -> None:
        """Add an SDK ``Usage`` (missing fields count as zero)."""
        self.input_tokens += _count(getattr(usage, "input_tokens", 0))
        self.output_tokens += _count(getattr(usage, "output_tokens", 0))
        self.cache_read_tokens += _count(getattr(usage, "cache_read_input_tokens", 0))
        self.cache_write_tokens += _count(getattr(usage, "cache_creation_input_tokens", 0))

    def cost(self, prices: tuple[float, float]) -> float:
        """USD at ``prices`` (input, output per million tokens)."""
        inp, out = prices
        return (
            self.input_tokens * inp
            + self.cache_write_tokens * inp * CACHE_WRITE_FACTOR
            + self.cache_read_tokens * inp * CACHE_READ_FACTOR
            + self.output_tokens * out
        ) / 1e6


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


#: Notes of an LLM proposal that are numbers (log them as metrics) …
METRIC_NOTES: tuple[str, ...] = (
    "llm_requests",
    "llm_api_retries",
    "llm_input_tokens",
    "llm_output_tokens",
    "llm_cache_read_tokens",
    "llm_cache_write_tokens",
    "llm_cost_usd",
    "llm_round_spend_usd",
    "llm_tries",
    "llm_rejected",
    "llm_cap_usd",
    "expected_size_pct",
)
#: … and those that are words (log them as tags), each present only when it applies.
TAG_NOTES: tuple[str, ...] = (
    "llm_model",
    "llm_fallback",
    "llm_rejections",
    "expected_direction",
    "direction",
    "value_by",
)


def llm_notes(
    options: ClaudeOptions,
    usage: Usage,
    *,
    tries: int,
    rejections: Sequence[str],
    spent_before: float,
    fallback: str | None,
) -> dict[str, str]:
    """The notes an LLM proposal carries (all values are strings; numbers parse as floats).

    ``llm_model``, ``llm_requests`` (HTTP requests that got an answer or gave up),
    ``llm_api_retries`` (the SDK's retries), ``llm_input_tokens``, ``llm_output_tokens``,
    ``llm_cache_read_tokens``, ``llm_cache_write_tokens``, ``llm_cost_usd`` (this proposal),
    ``llm_round_spend_usd`` (the round so far, this proposal included), ``llm_tries``
    (proposals the model made), ``llm_rejected`` (how many were refused), and when there are
    any, ``llm_rejections`` (the reasons) and ``llm_cap_usd``; ``llm_fallback`` (why another
    proposer made the proposal) only on a fallback.
    """
    cost = usage.cost(options.prices())
    rejected = " | ".join(f"{i}: {r}" for i, r in enumerate(rejections, start=1))
    return LlmUsage(
        model=options.model,
        requests=usage.requests,
        api_retries=usage.api_retries,
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
        cache_read_tokens=usage.cache_read_tokens,
        cache_write_tokens=usage.cache_write_tokens,
        cost_usd=cost,
        round_spend_usd=spent_before + cost,
        tries=tries,
        rejected=len(rejections),
        rejections=clip(rejected, 2000) if rejections else None,
        cap_usd=options.max_usd_per_round,
        fallback=fallback,
    ).to_notes()


def round_spend(usages: Iterable[LlmUsage | None]) -> float:
    """USD spent on LLM calls by the proposals whose usage is given; what the orchestrator
    puts in ``ProposalContext.llm_spend_usd``."""
    return sum(u.cost_usd for u in usages if u is not None and u.cost_usd > 0)


# ---- untrusted text -----------------------------------------------------------------------------
def clean_text(raw: object, limit: int = MAX_TEXT) -> str | None:
    """``raw`` as one line of printable text (control and format characters become spaces,
    runs of whitespace one space), at most ``limit`` characters; ``None`` if not a string."""
    if not isinstance(raw, str):
        return None
    kept = "".join(" " if unicodedata.category(ch)[0] == "C" else ch for ch in raw)
    return clip(" ".join(kept.split()), limit)


def clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _scrub(text: str) -> str:
    """``text`` with any configured credential replaced (defence in depth for messages)."""
    for name in KEY_VARIABLES:
        secret = os.environ.get(name, "")
        if len(secret) >= 8:
            text = text.replace(secret, "***")
    return text
