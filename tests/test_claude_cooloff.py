"""A dead API costs a night one deadline, not one per proposal: after a proposal failed for
the API's reasons (timed out, unavailable, overloaded, a malformed response), the next
proposals leave it alone for a cool-off (5 min, doubled after each failure past one, at most
1 h), the fallback proposes and says so in the failure's class; past the cool-off the API is
asked again, and an answer ends it. The model's own refusals start none. A gateway's
malformed reply is the API's fault, not the model's refusal. A 429 still answered when the
SDK's retries (or the deadline) ran out starts one too, at least as long as its
``retry-after``. A new process goes on with the cool-off the ledger's proposals recorded. The
real SDK talks to the local Messages API server; the cool-off reads a clock the test moves (no
sleeps)."""

from __future__ import annotations

from datetime import UTC, datetime

from agents import ClaudeOptions, ClaudeProposer, OptunaProposer, ProposalContext, proposed_by
from agents.llm_cooloff import COOL_OFF_FIRST_S, COOL_OFF_MAX_S, api_failures
from agents.llm_fallback import Fallbacks, fallback_class, fallback_line
from agents.proposal import Proposal
from knobs.records import LlmUsage
from tests.fixtures.messages_api import (
    MessagesApi,
    Reply,
    hang,
    malformed,
    overloaded,
    text_only,
    tool_use,
)
from tests.test_claude_proposer import context, good

#: 2026-12-07 09:12:00 UTC
START = 1_796_634_720.0
PAST = "Claude API timed out (no answer within the 0.5s deadline of a proposal)"
HTML = b"<html><body><h1>502 Bad Gateway</h1></body></html>"


class Clock:
    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> float:
        return self.now


def claude(api: MessagesApi, clock: Clock, **options: float) -> ClaudeProposer:
    proposer = ClaudeProposer(
        ClaudeOptions(**{"api_retries": 0, "api_timeout_s": 30.0, **options}),
        fallback=OptunaProposer(seed=0),
        base_url=api.url,
    )
    proposer.cool_off.clock = clock
    return proposer


def asked(
    api: MessagesApi, proposer: ClaudeProposer, seen: ProposalContext | None = None
) -> tuple[Proposal, bool]:
    """The proposal, and whether the API was asked for it."""
    before = len(api.requests)
    made = proposer.propose(context() if seen is None else seen)
    return made, len(api.requests) > before


def slow_down(retry_after: str) -> Reply:
    """A 429 whose ``retry-after`` asks for ``retry_after`` seconds."""
    return Reply(
        status=429, error=("rate_limit_error", "slow down"), headers=(("retry-after", retry_after),)
    )


def test_a_timed_out_api_is_left_alone_for_its_cool_off_then_asked_again(
    messages_api: MessagesApi,
) -> None:
    messages_api.script(hang(120), hang(120), tool_use(good()), tool_use(good()))
    clock = Clock()
    proposer = claude(messages_api, clock, api_deadline_s=0.5)
    try:
        made, was_asked = asked(messages_api, proposer)
        assert was_asked and made.notes["llm_fallback"] == PAST
        # the next proposals, within 5 minutes: Optuna's, the API not asked, said in its class
        clock.now = START + COOL_OFF_FIRST_S - 1
        made, was_asked = asked(messages_api, proposer)
        assert not was_asked
        reason = made.notes["llm_fallback"]
        assert reason == (
            "Claude API not asked: failing since 09:12 UTC (timed out); asked again from 09:17 UTC"
        )
        assert made.source == "optuna (fallback from claude)"
        assert made.notes["llm_requests"] == "0"
        assert fallback_line(made.source, made.notes) == (
            f"claude fell back to optuna (timed out): {reason}"
        )
        counted = Fallbacks.of([(made.source, made.notes)])
        assert counted.words() == "1 of 1 proposals fell back to optuna: timed out ×1"
        # past it, asked again: it fails again, so the next cool-off is twice as long
        clock.now = START + COOL_OFF_FIRST_S
        made, was_asked = asked(messages_api, proposer)
        assert was_asked and made.notes["llm_fallback"] == PAST
        clock.now += 2 * COOL_OFF_FIRST_S - 1
        made, was_asked = asked(messages_api, proposer)
        assert not was_asked
        assert made.notes["llm_fallback"].endswith("(timed out); asked again from 09:27 UTC")
        # it answers: Claude proposes, and the next proposal asks it at once
        clock.now += 1
        made, was_asked = asked(messages_api, proposer)
        assert was_asked and made.source == "claude"
        made, was_asked = asked(messages_api, proposer)
        assert was_asked and made.source == "claude"
        assert messages_api.remaining == 0
    finally:
        proposer.close()


def test_the_cool_off_doubles_up_to_an_hour(messages_api: MessagesApi) -> None:
    gaps = [300.0, 600.0, 1200.0, 2400.0, 3600.0, 3600.0]
    assert (gaps[0], gaps[-1]) == (COOL_OFF_FIRST_S, COOL_OFF_MAX_S)
    messages_api.script(*[overloaded() for _ in gaps])
    clock = Clock()
    proposer = claude(messages_api, clock)
    try:
        for gap in gaps:
            made, was_asked = asked(messages_api, proposer)
            assert was_asked and fallback_class(made.notes["llm_fallback"]) == "overloaded"
            clock.now += gap - 1
            made, was_asked = asked(messages_api, proposer)
            assert not was_asked, gap
            assert fallback_class(made.notes["llm_fallback"]) == "overloaded"
            clock.now += 1
        assert messages_api.remaining == 0
    finally:
        proposer.close()


def test_the_models_refusals_start_no_cool_off(messages_api: MessagesApi) -> None:
    messages_api.script(text_only("no"), text_only("no"), tool_use(good()))
    proposer = claude(messages_api, Clock(), max_tries=2)
    try:
        made, _ = asked(messages_api, proposer)
        assert fallback_class(made.notes["llm_fallback"]) == "refused"
        made, was_asked = asked(messages_api, proposer)
        assert was_asked and made.source == "claude"
    finally:
        proposer.close()


def test_a_gateways_malformed_reply_is_the_apis_fault_not_the_models(
    messages_api: MessagesApi,
) -> None:
    messages_api.script(malformed(), malformed(HTML))
    proposer = claude(messages_api, Clock(), max_tries=2)
    try:
        made, _ = asked(messages_api, proposer)
        reason = made.notes["llm_fallback"]
        assert reason.startswith("Claude API sent a malformed response (2 of 2 replies; last: ")
        assert fallback_class(reason) == "malformed response"
        # an API's fault: it is left alone for a while too
        made, was_asked = asked(messages_api, proposer)
        assert not was_asked and fallback_class(made.notes["llm_fallback"]) == "malformed response"
    finally:
        proposer.close()
    # a ledger of a release before this one said it as the model's refusal
    older = "2 of 2 proposals refused (last: malformed response from the API (Expecting value))"
    assert fallback_class(older) == "malformed response"


def recorded(at: float, fallback: str | None) -> tuple[datetime, LlmUsage | None]:
    """A proposal as the ledger has it: when it was recorded, and its LLM usage."""
    return datetime.fromtimestamp(at, UTC), LlmUsage(model="claude-sonnet-4-6", fallback=fallback)


def test_a_new_process_goes_on_with_the_cool_off_the_ledger_recorded(
    messages_api: MessagesApi,
) -> None:
    busy = "Claude API unavailable (HTTP 529 overloaded_error: Overloaded) after 1 attempts"
    cooling = (
        "Claude API not asked: failing since 09:12 UTC (timed out); asked again from 09:17 UTC"
    )
    failures = api_failures(
        [
            recorded(START - 7200, PAST),  # ended by the answer after it
            recorded(START - 3600, None),  # the model proposed
            (datetime.fromtimestamp(START - 60, UTC), None),  # Optuna's own: no LLM asked
            recorded(START, PAST),
            recorded(START + 60, cooling),  # not asked: neither starts nor ends one
            recorded(START + 300, PAST),
            recorded(START + 400, "LLM spend cap reached: $1.0000 of $1.00 this round"),
            recorded(START + 900, busy),
        ]
    )
    assert [f.at.timestamp() for f in failures] == [START, START + 300, START + 900]
    # the next process: the third failure in a row left the API alone for 20 minutes
    messages_api.script(tool_use(good()))
    clock = Clock()
    clock.now = START + 900 + 4 * COOL_OFF_FIRST_S - 1
    proposer = claude(messages_api, clock)
    seen = context().model_copy(update={"api_failures": failures})
    try:
        # the round's line names who really proposes
        assert proposed_by(proposer, seen) == "optuna: claude leaves the API alone until 09:47 UTC"
        made, was_asked = asked(messages_api, proposer, seen)
        assert not was_asked and made.source == "optuna (fallback from claude)"
        assert made.notes["llm_fallback"] == (
            "Claude API not asked: failing since 09:12 UTC (overloaded); asked again from 09:47 UTC"
        )
        clock.now += 1
        assert proposed_by(proposer, seen) == "claude"
        made, was_asked = asked(messages_api, proposer, seen)
        assert was_asked and made.source == "claude"
    finally:
        proposer.close()


def test_a_429_past_the_sdks_retries_cools_off_for_its_retry_after(
    messages_api: MessagesApi,
) -> None:
    messages_api.script(slow_down("1800"), tool_use(good()))
    clock = Clock()
    proposer = claude(messages_api, clock)
    try:
        made, was_asked = asked(messages_api, proposer)
        reason = made.notes["llm_fallback"]
        assert was_asked and reason == (
            "Claude API unavailable (HTTP 429 rate_limit_error: slow down) after 1 attempts; "
            "retry-after 1800s"
        )
        assert fallback_class(reason) == "rate limited"
        # past the 5 minutes another failure would cool off, within the 30 it asked for
        clock.now = START + COOL_OFF_FIRST_S
        made, was_asked = asked(messages_api, proposer)
        assert not was_asked
        reason = made.notes["llm_fallback"]
        assert reason == (
            "Claude API not asked: failing since 09:12 UTC (rate limited); asked again from "
            "09:42 UTC, as its retry-after 1800s asked"
        )
        assert fallback_line(made.source, made.notes) == (
            f"claude fell back to optuna (rate limited): {reason}"
        )
        clock.now = START + 1800
        made, was_asked = asked(messages_api, proposer)
        assert was_asked and made.source == "claude"
    finally:
        proposer.close()


def test_a_429_whose_wait_outlasts_the_deadline_cools_off_for_its_retry_after(
    messages_api: MessagesApi,
) -> None:
    # the SDK obeys the 10-minute retry-after (its own retry, after the 429): the deadline
    # ends the proposal first
    messages_api.script(slow_down("600"))
    clock = Clock()
    proposer = claude(messages_api, clock, api_retries=2, api_deadline_s=2.0)
    try:
        made, was_asked = asked(messages_api, proposer)
        reason = made.notes["llm_fallback"]
        assert was_asked and reason == (
            "Claude API timed out (no answer within the 2s deadline of a proposal); the last "
            "answer was HTTP 429, retry-after 600s"
        )
        assert fallback_class(reason) == "rate limited"
        clock.now = START + 600 - 1
        made, was_asked = asked(messages_api, proposer)
        assert not was_asked
        assert made.notes["llm_fallback"].endswith(
            "(rate limited); asked again from 09:22 UTC, as its retry-after 600s asked"
        )
    finally:
        proposer.close()
