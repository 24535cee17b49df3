"""One forced tool call with the Messages API, retried with the refusal's reason as a tool
error: the calls, their usage, and what failed."""

from __future__ import annotations

import email.utils
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar
from urllib.parse import urlsplit

from agents.llm import ClaudeOptions, LLMError, Usage, clean_text
from agents.llm_deadline import Deadline, DeadlinePassed
from agents.llm_fallback import retry_after_words
from knobs.spec import printable

if TYPE_CHECKING:  # the SDK takes seconds to import: only a Claude proposer pays for it
    import anthropic
    import httpx2

T = TypeVar("T")

#: How a reply that is no Messages API reply (not JSON, an HTML page) is said.
MALFORMED = "malformed response from the API"


# ---- the conversation ---------------------------------------------------------------------------
class LastAnswer:
    """The last HTTP answer to a client's requests, the SDK's retries included (an event hook
    of its HTTP client): a proposal whose deadline passed while the SDK waited out a 429's
    ``retry-after`` says so, and the cool-off lasts at least that wait
    (``agents.llm_cooloff``)."""

    def __init__(self) -> None:
        self.status: int | None = None
        self.retry_after_s: float | None = None

    def clear(self) -> None:
        self.status, self.retry_after_s = None, None

    def __call__(self, response: httpx2.Response) -> None:
        self.status = response.status_code
        self.retry_after_s = retry_after(response.headers)

    def words(self) -> str:
        """``; the last answer was HTTP 429, retry-after 60s`` after a 429, else ``""``."""
        if self.status != 429:
            return ""
        wait = "" if self.retry_after_s is None else f", {retry_after_words(self.retry_after_s)}"
        return f"; the last answer was HTTP 429{wait}"


def retry_after(headers: Mapping[str, str]) -> float | None:
    """The seconds an answer's ``retry-after-ms`` or ``retry-after`` (seconds, or an HTTP
    date) asks the client to wait, as the SDK reads them; ``None`` for none (or none left)."""
    for name, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        try:
            seconds = float(headers.get(name) or "") / scale
        except ValueError:
            continue
        return seconds if seconds > 0 else None
    date = email.utils.parsedate_tz(headers.get("retry-after") or "")
    if date is None:
        return None
    seconds = email.utils.mktime_tz(date) - time.time()
    return seconds if seconds > 0 else None


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
    conversation gives up with a ``fallback`` reason rather than failing the round. The whole
    conversation waits on the API at most ``api_deadline_s`` (``agents.llm_deadline``): a
    server that never answers, or trickles its answer, ends it with a ``fallback`` reason too,
    and the client is closed (the proposer opens another for its next proposal). An error a
    retry cannot fix (401, 403, 404, 400 …) raises ``LLMError``.
    """

    def __init__(
        self,
        client: anthropic.Anthropic,
        options: ClaudeOptions,
        tool: dict[str, Any],
        system: str,
        last: LastAnswer | None = None,
    ) -> None:
        """``last``: the client's ``LastAnswer`` hook, when it has one."""
        self.client = client
        self.options = options
        self.tool = tool
        self.system = system
        self.last = LastAnswer() if last is None else last

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
        deadline = Deadline(self.options.api_deadline_s)
        cap = self.options.max_usd_per_round
        prices = self.options.prices()
        while outcome.tries < self.options.max_tries:
            spent = spent_before + outcome.usage.cost(prices)
            if cap is not None and spent >= cap:
                outcome.fallback = f"LLM spend cap reached: ${spent:.4f} of ${cap:.2f} this round"
                return outcome
            outcome.tries += 1
            reply = self._call(messages, outcome, deadline)
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
        if last.startswith(MALFORMED):  # the API's (or a gateway's) fault, not the model's
            bad = sum(r.startswith(MALFORMED) for r in outcome.rejections)
            outcome.fallback = (
                f"Claude API sent a malformed response ({bad} of {outcome.tries} replies; "
                f"last: {last.removeprefix(MALFORMED).strip()})"
            )
            return outcome
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
        self, messages: list[dict[str, Any]], outcome: Outcome[T], deadline: Deadline
    ) -> tuple[list[object], object] | Failure:
        """The reply's content blocks and stop reason, or why there is none.

        Raises:
            LLMError: the API refused the request for a reason a retry cannot fix.
        """
        usage = outcome.usage
        if deadline.left() <= 0:  # spent by the tries before: ask no more
            return Failure(_past(deadline))
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

        def create() -> tuple[int, object]:
            raw = self.client.messages.with_raw_response.create(**request)
            return raw.retries_taken, raw.parse()

        self.last.clear()
        try:
            retries, message = deadline.run(create, abandon=self.client.close)
            usage.api_retries += retries
        except DeadlinePassed:
            return Failure(_past(deadline) + self.last.words())
        except anthropic.APIStatusError as e:
            status = e.status_code
            error_type, detail = _error_of(e.body)
            what = f"HTTP {status} {error_type}: {detail}"
            if status in (408, 409, 429) or status >= 500:
                usage.api_retries += self.options.api_retries
                wait = retry_after(e.response.headers) if status == 429 else None
                return Failure(
                    f"Claude API unavailable ({what}) after {attempts} attempts"
                    + ("" if wait is None else f"; {retry_after_words(wait)}")
                )
            raise LLMError(
                f"Claude API refused the request ({what}); model {self.options.model}, "
                f"at {_endpoint(self.client.base_url)}: {_what_to_do(status)}",
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
            return Failure(f"{MALFORMED} ({_first_line(str(e))})", again=True)
        usage.add(getattr(message, "usage", None))
        content = getattr(message, "content", None)
        if not isinstance(content, list):
            return Failure(f"{MALFORMED} (no content list)", again=True)
        return content, getattr(message, "stop_reason", None)


def _past(deadline: Deadline) -> str:
    return (
        f"Claude API timed out (no answer within the {deadline.seconds:g}s deadline of a proposal)"
    )


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


def _endpoint(url: object) -> str:
    """The API's address as a person checks it (``ANTHROPIC_BASE_URL``, a proxy): scheme,
    host and path, never a user or password in it."""
    parts = urlsplit(str(url))
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}{parts.path}".rstrip("/")


def _what_to_do(status: int) -> str:
    """What a person does about a refusal a retry cannot fix (HTTP ``status``); the round stops
    before a boot, and the same command resumes it."""
    fix = {
        401: "check ANTHROPIC_API_KEY, a key this endpoint takes (and ANTHROPIC_BASE_URL)",
        403: "the key may not use this model or endpoint: check ANTHROPIC_API_KEY",
        404: "check the model name (proposer.claude.model) and ANTHROPIC_BASE_URL",
    }.get(status, "check the model and ANTHROPIC_BASE_URL")
    return f"{fix}, or use --proposer optuna; the same command then resumes the round"
