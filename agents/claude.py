"""The Claude proposer: one knob change chosen by Claude through the Messages API's tool use.

One ``propose_change`` tool whose input schema is generated from the knob space (the knob
names as an enum, each knob's value domain as a branch of ``value``), forced with
``tool_choice`` and, where the API offers it, ``strict``. Claude sees a research brief and a
digest of the ledger (``agents.digest``), never the raw ledger.

Everything the model returns is untrusted. The knob and value pass ``KnobSpace.change`` (a
finite domain: nothing else can get through) and ``ProposalContext.refusal`` (decided,
known-bad, vetoed) before a ``Proposal`` exists; the free text (hypothesis, risk, cost) is
cleaned of control characters, cut to length, and only ever stored and shown as data. A
refused proposal goes back to the model as a tool error carrying the reason, up to
``max_tries`` times; then, or when the API stays unavailable after the SDK's retries, or when
the round's LLM spend cap is reached, the proposal comes from the fallback proposer (Optuna)
and its notes say why (``llm_fallback``).

Token usage and cost of every proposal are in its notes (``llm_*`` keys, see ``llm_notes``).
The API key is read by the SDK from the environment and never copied anywhere by this module.
"""

from __future__ import annotations

import contextlib
import json
import os
import unicodedata
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from agents.context import ProposalContext
from agents.digest import digest
from agents.proposal import ONE_EXPERIMENT, Proposal, ProposalExhausted, Proposer
from knobs.config import Change
from knobs.errors import KnobError
from knobs.records import LlmUsage
from knobs.space import KnobSpace
from orchestrator.errors import OrchestrateError, UsageError

if TYPE_CHECKING:  # the SDK takes seconds to import: only a Claude proposer pays for it
    import anthropic
from knobs.spec import KnobSpec, Value, printable

T = TypeVar("T")

#: The tool Claude must call.
TOOL = "propose_change"

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

#: Where the objective is expected to move.
DIRECTIONS = ("higher", "lower", "unchanged")
#: Longest free text kept from the model, per field.
MAX_TEXT = 600
#: Longest brief sent to the model.
MAX_BRIEF = 20_000
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
    #: Seconds one HTTP request may take.
    api_timeout_s: float = Field(default=60.0, gt=0, le=3600)
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
        rejections=_clip(rejected, 2000) if rejections else None,
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
    return _clip(" ".join(kept.split()), limit)


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _scrub(text: str) -> str:
    """``text`` with any configured credential replaced (defence in depth for messages)."""
    for name in KEY_VARIABLES:
        secret = os.environ.get(name, "")
        if len(secret) >= 8:
            text = text.replace(secret, "***")
    return text


# ---- the tool schemas ---------------------------------------------------------------------------
#: Enumerate a numeric domain in the schema up to this many values (else type and range only).
MAX_ENUM = 128


def value_schema(spec: KnobSpec) -> dict[str, Any]:
    """The JSON schema of one knob's values (an ``enum`` of its finite domain where short)."""
    values = spec.domain()
    schema: dict[str, Any]
    if spec.type == "bool":
        schema = {"type": "boolean"}
    elif spec.type in ("int", "float"):
        kind = "integer" if spec.type == "int" else "number"
        schema = {"type": kind, "enum": values} if len(values) <= MAX_ENUM else {"type": kind}
    else:
        kinds = {_json_type(v) for v in values}
        schema = {"type": kinds.pop(), "enum": values} if len(kinds) == 1 else {"enum": values}
    schema["description"] = f"{spec.name}: {spec.describe_domain()}"
    return schema


def _json_type(value: Value) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    return "string"


#: The fields every proposal tool takes besides the change itself.
EFFECT_PROPERTIES: dict[str, Any] = {
    "hypothesis": {
        "type": "string",
        "description": "Why this change should move the objective, citing the evidence in "
        "the digest (one to three sentences).",
    },
    "expected_direction": {
        "type": "string",
        "enum": list(DIRECTIONS),
        "description": "Where the objective should move against the champion.",
    },
    "expected_size_pct": {
        "type": "number",
        "description": "How far, in percent of the champion's objective (e.g. 3.5).",
    },
    "risk": {
        "type": "string",
        "description": "What could go wrong (a boot that fails, out of memory, wrong greedy "
        "outputs, a gain lost in noise) and how likely it is.",
    },
    "estimated_cost": {
        "type": "string",
        "description": "What the experiment costs: boots, bench time, and any risk of a long "
        "failed boot.",
    },
}


def tool_schema(properties: Mapping[str, Any]) -> dict[str, Any]:
    """An object schema over ``properties`` plus the effect fields, all required, no others
    (the shape the API's strict mode asks for)."""
    merged = {**properties, **EFFECT_PROPERTIES}
    return {
        "type": "object",
        "properties": merged,
        "required": list(merged),
        "additionalProperties": False,
    }


def change_tool(space: KnobSpace, *, strict: bool) -> dict[str, Any]:
    """The ``propose_change`` tool for ``space``: ``knob`` is an enum of the knob names,
    ``value`` one branch per knob domain."""
    branches: list[dict[str, Any]] = []
    seen: dict[str, dict[str, Any]] = {}
    for spec in space.knobs:
        schema = value_schema(spec)
        shape = json.dumps({k: v for k, v in schema.items() if k != "description"}, sort_keys=True)
        if shape in seen:  # two knobs with the same domain share a branch
            seen[shape]["description"] += "; " + schema["description"]
            continue
        seen[shape] = schema
        branches.append(schema)
    properties = {
        "knob": {
            "type": "string",
            "enum": space.names,
            "description": "The one knob to change from the champion's value.",
        },
        "value": {
            "anyOf": branches,
            "description": "The knob's new value: one of that knob's domain (the branch "
            "named after the knob).",
        },
    }
    tool: dict[str, Any] = {
        "name": TOOL,
        "description": "Propose the next experiment: exactly one knob of the champion "
        "configuration set to one new value of its domain, with the hypothesis behind it, "
        "the expected effect on the objective, the risk and the cost.",
        "input_schema": tool_schema(properties),
    }
    if strict:
        tool["strict"] = True
    return tool


# ---- validation of what the model proposed ------------------------------------------------------
@dataclass(frozen=True)
class Effect:
    """The reasoning fields of a proposal, cleaned."""

    hypothesis: str
    direction: str
    size_pct: float
    risk: str
    estimated_cost: str

    def notes(self) -> dict[str, str]:
        """``expected_direction`` and ``expected_size_pct`` for the proposal's notes."""
        return {"expected_direction": self.direction, "expected_size_pct": f"{self.size_pct:g}"}

    def expected(self) -> str:
        """``higher by about 3.5%`` and the like."""
        if self.direction == "unchanged":
            return f"unchanged (within about {self.size_pct:g}%)"
        return f"objective {self.direction} by about {self.size_pct:g}%"


def read_effect(data: Mapping[str, object]) -> Effect | str:
    """The effect fields of a tool input, or why they are not acceptable."""
    hypothesis = clean_text(data.get("hypothesis"))
    risk = clean_text(data.get("risk"))
    cost = clean_text(data.get("estimated_cost"), 300)
    direction = data.get("expected_direction")
    size = data.get("expected_size_pct")
    if not hypothesis:
        return "hypothesis must be a non-empty string"
    if not risk:
        return "risk must be a non-empty string"
    if direction not in DIRECTIONS:
        return f"expected_direction {printable(direction)} is not one of {', '.join(DIRECTIONS)}"
    if (
        isinstance(size, bool)
        or not isinstance(size, int | float)
        or not (0 <= float(size) <= 1000)
    ):
        return f"expected_size_pct {printable(size)} is not a number from 0 to 1000"
    return Effect(hypothesis, str(direction), float(size), risk, cost or ONE_EXPERIMENT)


def one_knob_problem(data: object, space: KnobSpace, fields: Sequence[str]) -> str | None:
    """Why a tool input is not one change of one knob (``None`` if its shape is right)."""
    if not isinstance(data, dict):
        return (
            f"the input must be a JSON object with the fields {', '.join(fields)}, "
            f"not {printable(data)}"
        )
    knob = data.get("knob")
    extra = sorted(str(k) for k in data if k not in fields)
    if isinstance(knob, list | dict) or any(k in space.names for k in extra):
        return (
            "exactly one knob per proposal: an experiment changes one knob so that its effect "
            "can be measured; propose the most promising one alone"
        )
    if extra:
        return f"unexpected fields {', '.join(printable(k) for k in extra)}; the fields are " + (
            ", ".join(fields)
        )
    missing = [f for f in fields if f not in data]
    if missing:
        return f"missing fields: {', '.join(missing)}"
    return None


def change_of(context: ProposalContext, data: Mapping[str, object]) -> Change | str:
    """The validated change a tool input names, or why it may not run now."""
    try:
        change = context.space.change(context.champion, data.get("knob"), data.get("value"))
    except KnobError as e:
        return e.message
    refused = context.refusal(change)
    if refused is not None:
        return refused.reason
    return change


# ---- the conversation ---------------------------------------------------------------------------
@dataclass(frozen=True)
class ToolCall:
    """One ``tool_use`` block of a reply."""

    id: str
    name: str
    input: object


@dataclass(frozen=True)
class Failure:
    """A call that gave no reply: ``again`` (a malformed reply: worth another try) or not
    (the API stayed unavailable through the SDK's retries: give up)."""

    reason: str
    again: bool = False


@dataclass
class Outcome(Generic[T]):
    """How a tool conversation ended: a value, or why not (``fallback``)."""

    value: T | None
    usage: Usage = field(default_factory=Usage)
    tries: int = 0
    rejections: list[str] = field(default_factory=list)
    fallback: str | None = None


class ToolConversation:
    """Asks the model to call one tool, feeding refusals back as tool errors.

    The SDK retries 408/409/429/5xx (529 included), timeouts and connection errors with
    exponential backoff (``api_retries`` times, honouring ``retry-after``); past that the
    conversation gives up with a ``fallback`` reason rather than failing the round. An error a
    retry cannot fix (401, 403, 404, 400 …) raises ``LLMError``.
    """

    def __init__(
        self,
        client: anthropic.Anthropic,
        options: ClaudeOptions,
        tool: dict[str, Any],
        system: str,
    ) -> None:
        self.client = client
        self.options = options
        self.tool = tool
        self.system = system

    def run(
        self,
        prompt: str,
        validate: Callable[[object], T | str],
        *,
        spent_before: float,
    ) -> Outcome[T]:
        """Up to ``max_tries`` proposals; the first that ``validate`` accepts.

        ``validate`` gets a tool call's input and returns the accepted value or the reason it
        is refused (sent back to the model as the tool's error).

        Raises:
            LLMError: the API refused the request for a reason a retry cannot fix.
        """
        outcome: Outcome[T] = Outcome(value=None)
        name = self.tool["name"]
        messages: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
        cap = self.options.max_usd_per_round
        prices = self.options.prices()
        while outcome.tries < self.options.max_tries:
            spent = spent_before + outcome.usage.cost(prices)
            if cap is not None and spent >= cap:
                outcome.fallback = f"LLM spend cap reached: ${spent:.4f} of ${cap:.2f} this round"
                return outcome
            outcome.tries += 1
            reply = self._call(messages, outcome)
            if isinstance(reply, Failure):
                if reply.again:
                    outcome.rejections.append(reply.reason)
                    continue
                outcome.fallback = reply.reason
                return outcome
            content, stop_reason = reply
            calls = [_tool_call(block) for block in content if _kind(block) == "tool_use"]
            if not calls:
                outcome.rejections.append(
                    f"the reply called no tool (stop_reason {printable(stop_reason)})"
                )
                continue
            reason = self._judge(calls, validate, outcome)
            if reason is None:
                return outcome
            outcome.rejections.append(reason)
            messages.append({"role": "assistant", "content": [_echo(b) for b in content]})
            messages.append(
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": call.id,
                            "is_error": True,
                            "content": f"refused: {reason}. Call {name} again with a "
                            "different proposal.",
                        }
                        for call in calls
                    ],
                }
            )
        last = outcome.rejections[-1] if outcome.rejections else "none"
        outcome.fallback = (
            f"{len(outcome.rejections)} of {outcome.tries} proposals refused (last: {last})"
        )
        return outcome

    def _judge(
        self, calls: list[ToolCall], validate: Callable[[object], T | str], outcome: Outcome[T]
    ) -> str | None:
        if len(calls) > 1:
            return (
                f"{len(calls)} tool calls in one reply; exactly one knob per proposal: call "
                f"{self.tool['name']} once"
            )
        call = calls[0]
        if call.name != self.tool["name"]:
            return f"there is no tool {printable(call.name)}; call {self.tool['name']}"
        verdict = validate(call.input)
        if isinstance(verdict, str):
            return verdict
        outcome.value = verdict
        return None

    def _call(
        self, messages: list[dict[str, Any]], outcome: Outcome[T]
    ) -> tuple[list[object], object] | Failure:
        """The reply's content blocks and stop reason, or why there is none.

        Raises:
            LLMError: the API refused the request for a reason a retry cannot fix.
        """
        usage = outcome.usage
        usage.requests += 1
        # the SDK retried transient failures before giving up (at most this many attempts)
        attempts = self.options.api_retries + 1
        request: dict[str, Any] = {
            "model": self.options.model,
            "max_tokens": self.options.max_tokens,
            "system": self.system,
            "messages": messages,
            "tools": [self.tool],
            "tool_choice": {
                "type": "tool",
                "name": self.tool["name"],
                "disable_parallel_tool_use": True,
            },
        }
        import anthropic  # lazy: see the TYPE_CHECKING import

        try:
            raw = self.client.messages.with_raw_response.create(**request)
            usage.api_retries += raw.retries_taken
            message = raw.parse()
        except anthropic.APIStatusError as e:
            status = e.status_code
            error_type, detail = _error_of(e.body)
            what = f"HTTP {status} {error_type}: {detail}"
            if status in (408, 409, 429) or status >= 500:
                usage.api_retries += self.options.api_retries
                return Failure(f"Claude API unavailable ({what}) after {attempts} attempts")
            raise LLMError(
                f"Claude API refused the request ({what}); model {self.options.model}",
                model=self.options.model,
                status=status,
                error_type=error_type,
            ) from e
        except anthropic.APITimeoutError:
            usage.api_retries += self.options.api_retries
            return Failure(
                f"Claude API timed out ({self.options.api_timeout_s:g}s per request) "
                f"after {attempts} attempts"
            )
        except anthropic.APIConnectionError as e:
            usage.api_retries += self.options.api_retries
            return Failure(
                f"Claude API unreachable ({_first_line(str(e))}) after {attempts} attempts"
            )
        except (ValueError, anthropic.APIResponseValidationError) as e:
            return Failure(f"malformed response from the API ({_first_line(str(e))})", again=True)
        usage.add(getattr(message, "usage", None))
        content = getattr(message, "content", None)
        if not isinstance(content, list):
            return Failure("malformed response from the API (no content list)", again=True)
        return content, getattr(message, "stop_reason", None)


def _kind(block: object) -> object:
    return getattr(block, "type", None)


def _tool_call(block: object) -> ToolCall:
    return ToolCall(
        id=str(getattr(block, "id", "")),
        name=str(getattr(block, "name", "")),
        input=getattr(block, "input", None),
    )


def _echo(block: object) -> dict[str, Any]:
    """A reply's content block as it goes back in the conversation."""
    if _kind(block) == "tool_use":
        call = _tool_call(block)
        return {
            "type": "tool_use",
            "id": call.id,
            "name": call.name,
            "input": call.input if isinstance(call.input, dict) else {},
        }
    text = getattr(block, "text", "")
    return {"type": "text", "text": text if isinstance(text, str) and text else "(no text)"}


def _error_of(body: object) -> tuple[str, str]:
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        return (
            clean_text(error.get("type"), 60) or "error",
            clean_text(error.get("message"), 200) or "",
        )
    return "error", clean_text(str(body), 200) or ""


def _first_line(text: str) -> str:
    return clean_text(text.splitlines()[0] if text else "", 200) or type(text).__name__


# ---- the proposer -------------------------------------------------------------------------------
SYSTEM = """\
You choose the next experiment of an autoresearch loop that tunes an LLM-serving cluster \
(one engine process per node, tensor-parallel over several machines, speculative decoding).

One experiment changes exactly ONE knob of the champion configuration to one new value. The \
orchestrator deploys it to every node (workers first, head last), checks the boot (health, a \
greedy smoke generation, boot-log lines, GPU clocks), measures the bench cells, and judges it \
against the champion with a noise-aware rule: keep (a real gain, confirmed), discard, \
inconclusive (within noise), crash (did not boot or measure), invalid (fast but wrong: greedy \
outputs changed). A kept change becomes the new champion.

Rules:
- Call the propose_change tool exactly once, with one knob and one value from that knob's domain.
- Never propose a configuration listed as decided, vetoed or known-bad; never cross a hard \
constraint. A person's veto reason is an instruction.
- Single runs are noisy (several percent); prefer changes with a plausible mechanism and a \
large expected effect over ones that can only win by noise. Do not repeat dead ends.
- Boots are expensive and can fail; weigh the risk.
- If the orchestrator refuses a proposal it tells you why in the tool result: fix that and \
propose again.
"""


class LLMProposer:
    """What the Claude and hybrid proposers share: the client, the options, the brief, the
    fallback proposer, and the spend of the round.

    Not a pure function of the context: the model is not deterministic. The spend already
    made in the round comes from ``context.llm_spend_usd`` (filled from the ledger, so a
    resumed round honours the cap) or, if larger, from what this process has spent.
    """

    name = "llm"

    def __init__(
        self,
        options: ClaudeOptions,
        *,
        fallback: Proposer,
        base_url: str | None = None,
        client: anthropic.Anthropic | None = None,
    ) -> None:
        """``base_url`` defaults to ``$ANTHROPIC_BASE_URL``, then Anthropic's API; the key
        comes from ``$ANTHROPIC_API_KEY`` (or ``$ANTHROPIC_AUTH_TOKEN``), read by the SDK.

        Raises:
            MissingApiKey: no client is given and neither variable is set.
            UsageError: the brief file cannot be read.
        """
        if client is None:
            import anthropic  # lazy: see the TYPE_CHECKING import

            require_api_key(self.name)
            client = anthropic.Anthropic(
                base_url=base_url,
                max_retries=options.api_retries,
                timeout=options.api_timeout_s,
            )
        self.options = options
        self.fallback = fallback
        self.client = client
        self._brief = Brief(options.brief)
        self._spent = 0.0

    def close(self) -> None:
        """Close the API client's connections."""
        self.client.close()

    def _converse(
        self,
        context: ProposalContext,
        tool: dict[str, Any],
        system: str,
        validate: Callable[[object], T | str],
    ) -> tuple[Outcome[T], float]:
        """The conversation's outcome and the round's spend before it.

        Raises:
            ProposalExhausted: no allowed one-knob change is left (checked before any call).
            LLMError: the API refused the request for a reason a retry cannot fix.
        """
        exhausted(self.name, context)
        spent = max(context.llm_spend_usd, self._spent)
        prompt = user_prompt(context, self._brief.text(context), self.options, spent)
        conversation = ToolConversation(self.client, self.options, tool, system)
        outcome = conversation.run(prompt, validate, spent_before=spent)
        self._spent = spent + outcome.usage.cost(self.options.prices())
        return outcome, spent

    def _finish(
        self, context: ProposalContext, outcome: Outcome[Proposal], spent: float
    ) -> Proposal:
        """The outcome's proposal with the LLM notes, or the fallback's proposal with them.

        Raises:
            ProposalExhausted: the fallback has nothing left to propose.
        """
        notes = llm_notes(
            self.options,
            outcome.usage,
            tries=outcome.tries,
            rejections=outcome.rejections,
            spent_before=spent,
            fallback=None if outcome.value is not None else outcome.fallback or "no proposal",
        )
        if outcome.value is not None:
            return outcome.value.model_copy(update={"notes": {**outcome.value.notes, **notes}})
        made = self.fallback.propose(context)
        return made.model_copy(
            update={
                "source": f"{made.source} (fallback from {self.name})",
                "notes": {**made.notes, **notes},
            }
        )


class ClaudeProposer(LLMProposer):
    """Claude proposes the change through forced tool use; the fallback proposer (Optuna)
    takes over when Claude's proposals keep being refused, the API stays unavailable, or the
    round's LLM spend cap is reached."""

    name = "claude"

    def propose(self, context: ProposalContext) -> Proposal:
        """Claude's proposal, or the fallback's with the reason in ``llm_fallback``.

        Raises:
            ProposalExhausted: no allowed one-knob change is left (checked before any call).
            LLMError: the API refused the request for a reason a retry cannot fix.
        """
        tool = change_tool(context.space, strict=self.options.strict_tools)

        def validate(data: object) -> Proposal | str:
            return self._proposal(context, data)

        outcome, spent = self._converse(context, tool, SYSTEM, validate)
        return self._finish(context, outcome, spent)

    def _proposal(self, context: ProposalContext, data: object) -> Proposal | str:
        fields = ("knob", "value", *EFFECT_PROPERTIES)
        problem = one_knob_problem(data, context.space, fields)
        if problem is not None:
            return problem
        assert isinstance(data, dict)
        change = change_of(context, data)
        if isinstance(change, str):
            return change
        effect = read_effect(data)
        if isinstance(effect, str):
            return effect
        return Proposal(
            change=change,
            source=self.name,
            hypothesis=effect.hypothesis,
            expected_effect=effect.expected(),
            risk=effect.risk,
            estimated_cost=effect.estimated_cost,
            notes=effect.notes(),
        )


def exhausted(name: str, context: ProposalContext) -> None:
    """Raises:
    ProposalExhausted: no allowed one-knob change is left (so no call is paid for).
    """
    if not context.candidates():
        neighbours = context.space.neighbours(context.champion)
        raise ProposalExhausted.after(
            name, len(neighbours), context.refusals(neighbours), what="neighbours"
        )


def require_api_key(kind: str) -> None:
    """Raises:
    MissingApiKey: neither ``ANTHROPIC_API_KEY`` nor ``ANTHROPIC_AUTH_TOKEN`` is set.
    """
    if not any(os.environ.get(name, "").strip() for name in KEY_VARIABLES):
        raise MissingApiKey(
            f"--proposer {kind} needs an Anthropic API key: set ANTHROPIC_API_KEY "
            "(or use --proposer optuna)"
        )


def user_prompt(context: ProposalContext, brief: str, options: ClaudeOptions, spent: float) -> str:
    """The first user message: the research brief and the digest of the ledger."""
    cap = options.max_usd_per_round
    spend = f"LLM spend this round so far: ${spent:.4f}" + (
        f" of a ${cap:.2f} cap." if cap is not None else " (no cap)."
    )
    return (
        "# Research brief (written by the person running the search)\n\n"
        f"{brief.strip() or '(none)'}\n\n"
        "# Where the search stands\n\n"
        f"{digest(context, extra=[spend])}\n"
        f"Call {TOOL} with the next experiment."
    )


class Brief:
    """The research brief file, re-read before every proposal (a person may edit it while a
    round runs); the last text read stands in if the file becomes unreadable."""

    def __init__(self, path: str | None) -> None:
        """Raises:
        UsageError: the file cannot be read now.
        """
        self.path = None if path is None else Path(path)
        self._last = ""
        if self.path is not None:
            try:
                self._last = self._read(self.path)
            except OSError as e:
                raise UsageError(f"research brief {path}: {e.strerror or e}") from e

    def text(self, context: ProposalContext) -> str:
        """The brief: ``context.brief`` when the orchestrator gives one, else the file."""
        if context.brief.strip():
            return _clip(context.brief, MAX_BRIEF)
        if self.path is not None:
            with contextlib.suppress(OSError):
                self._last = self._read(self.path)
        return self._last

    @staticmethod
    def _read(path: Path) -> str:
        return _clip(path.read_text(encoding="utf-8", errors="replace"), MAX_BRIEF)
