"""An API that hangs costs a proposal ``api_deadline_s`` at most: a server that accepts and
never answers, or trickles its answer a byte at a time (never silent for as long as the SDK's
timeout), ends in a fallback classed "timed out" at the deadline, said on the round's line,
in ``status`` and the report; the abandoned call ends, the next proposals leave the API alone
for its cool-off (saying so), and then ask again.
The real SDK talks to the local Messages API server (``tests/fixtures/messages_api.py``)."""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path

import pytest

from agents import ClaudeOptions, ClaudeProposer, OptunaProposer
from agents.llm_cooloff import COOL_OFF_FIRST_S
from agents.llm_fallback import fallback_class
from tests.fixtures.cli import orchestrate
from tests.fixtures.messages_api import MessagesApi, hang, tool_use, trickle
from tests.fixtures.profiles import fast_profile
from tests.test_claude_proposer import context, good

#: What a proposal past a half-second deadline says.
PAST = "Claude API timed out (no answer within the 0.5s deadline of a proposal)"
#: Far below the SDK's own bound in these tests (30s per silence, or never for a trickle).
BOUND_S = 15.0


def claude(api: MessagesApi, **options: float) -> ClaudeProposer:
    return ClaudeProposer(
        ClaudeOptions(**{"api_retries": 2, "api_timeout_s": 30.0, **options}),
        fallback=OptunaProposer(seed=0),
        base_url=api.url,
    )


def timed(proposer: ClaudeProposer) -> tuple[dict[str, str], float, str]:
    started = time.monotonic()
    proposal = proposer.propose(context())
    return proposal.notes, time.monotonic() - started, proposal.source


def callers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "llm-api-call"]


def test_a_server_that_never_answers_costs_the_deadline_then_claude_is_asked_again(
    messages_api: MessagesApi,
) -> None:
    messages_api.script(hang(120), tool_use(good()))
    proposer = claude(messages_api, api_deadline_s=0.5)
    try:
        notes, took, source = timed(proposer)
        assert source == "optuna (fallback from claude)"
        assert notes["llm_fallback"] == PAST
        assert fallback_class(notes["llm_fallback"]) == "timed out"
        assert took < BOUND_S, f"waited {took:.1f}s past a 0.5s deadline"
        assert notes["llm_requests"] == "1"
        # past the cool-off, the next proposal asks Claude again, on a client of its own
        proposer.cool_off.clock = lambda: time.time() + COOL_OFF_FIRST_S
        notes, _, source = timed(proposer)
        assert source == "claude" and notes["llm_requests"] == "1"
        assert messages_api.remaining == 0
    finally:
        proposer.close()


def test_an_answer_that_trickles_in_is_cut_at_the_deadline_and_its_call_ends(
    messages_api: MessagesApi,
) -> None:
    # a byte every 50ms: the SDK's 30s timeout never fires; the trickle lasts a minute
    messages_api.script(trickle(60, every_s=0.05))
    proposer = claude(messages_api, api_deadline_s=0.5)
    before = callers()
    try:
        notes, took, source = timed(proposer)
        assert source == "optuna (fallback from claude)"
        assert notes["llm_fallback"] == PAST
        assert took < BOUND_S, f"waited {took:.1f}s past a 0.5s deadline"
        # the abandoned call ends while the server still trickles: its client was closed
        abandoned = [t for t in callers() if t not in before]
        assert len(abandoned) == 1
        abandoned[0].join(BOUND_S)
        assert not abandoned[0].is_alive()
    finally:
        proposer.close()


def test_the_deadline_spans_the_tries_of_one_proposal(messages_api: MessagesApi) -> None:
    # a refused proposal, then a silence: the second request gets what is left
    messages_api.script(tool_use(good(value=9)), hang(120))
    proposer = claude(messages_api, api_deadline_s=0.5, max_tries=3)
    try:
        notes, took, _ = timed(proposer)
        assert notes["llm_fallback"] == PAST
        assert (notes["llm_tries"], notes["llm_rejected"], notes["llm_requests"]) == ("2", "1", "2")
        assert took < BOUND_S
    finally:
        proposer.close()


@pytest.fixture
def workdir(cli_workdir: Path) -> Path:
    return cli_workdir


def test_a_round_says_the_timed_out_fallback_on_its_line_in_status_and_the_report(
    workdir: Path, messages_api: MessagesApi
) -> None:
    claude_settings = {"api_retries": 2, "api_timeout_s": 30, "api_deadline_s": 0.5}
    fast_profile(workdir, proposer={"kind": "claude", "claude": claude_settings})
    messages_api.script(hang(120))
    result = orchestrate(workdir, "round", "--budget", "2", "--profile", "profile.yaml")
    assert result.returncode == 0, result.stderr
    said = [line.strip() for line in result.stdout.splitlines() if "fell back" in line]
    assert said[0] == f"claude fell back to optuna (timed out): {PAST}", result.stdout
    # the second proposal, minutes later at most, leaves the API alone and says so
    assert re.fullmatch(
        r"claude fell back to optuna \(timed out\): Claude API not asked: failing since "
        r"\d\d:\d\d UTC \(timed out\); asked again from \d\d:\d\d UTC",
        said[1],
    ), result.stdout
    assert len(said) == 2 and len(messages_api.requests) == 1
    summary = "2 of 2 proposals fell back to optuna: timed out ×2"
    status = orchestrate(workdir, "status", "--profile", "profile.yaml")
    assert f"round 1: {summary}" in status.stdout.splitlines(), status.stdout
    data = json.loads(orchestrate(workdir, "status", "--profile", "profile.yaml", "--json").stdout)
    assert data["llm_fallbacks"]["by_class"] == {"timed out": 2}
    report = orchestrate(workdir, "report", "--profile", "profile.yaml")
    assert report.returncode == 0, report.stderr
    assert summary in (workdir / "reports" / "round-1" / "report.html").read_text()
