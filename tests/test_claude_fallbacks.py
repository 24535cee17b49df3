"""What a person sees of Claude's fallbacks and of the secrets in its words: a real
``orchestrate`` on the twin, the real SDK talking to the local Messages API server. A round
the API rate-limited, or whose proposals were refused, says so on its line, in ``status``
(and ``--json``) and in the report; a key the model repeats is stored, listed and shown
redacted; redaction keeps the parenthesis it closes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from agents import ClaudeOptions, ClaudeProposer, OptunaProposer
from agents.llm_fallback import Fallbacks, fallback_class
from ledger import Ledger
from ledger.redact import Redactor
from tests.fixtures.cli import orchestrate
from tests.fixtures.messages_api import (
    TEST_KEY,
    MessagesApi,
    Reply,
    malformed,
    overloaded,
    rate_limited,
    text_only,
    tool_use,
)
from tests.fixtures.profiles import fast_profile, small_fast_profile
from tests.test_claude_proposer import context
from tests.test_claude_proposer import good as good_change
from tests.test_claude_round import good


@pytest.fixture
def workdir(cli_workdir: Path) -> Path:
    return cli_workdir


RATE_LIMITED = (
    "claude fell back to optuna (rate limited): Claude API unavailable (HTTP 429 "
    "rate_limit_error: Number of request tokens has exceeded your limit) after 2 attempts; "
    "retry-after 0.001s"
)
REFUSED = (
    "claude fell back to optuna (refused): 2 of 2 proposals refused (last: the reply called "
    "no tool (stop_reason 'end_turn'))"
)
SUMMARY = "2 of 3 proposals fell back to optuna: rate limited ×1, refused ×1"


def test_a_round_says_each_fallback_and_why_and_stores_no_key_the_model_wrote(
    workdir: Path, messages_api: MessagesApi
) -> None:
    # the round's three proposals are what is checked, not its boots
    small_fast_profile(
        workdir, proposer={"kind": "claude", "claude": {"api_retries": 1, "max_tries": 2}}
    )
    messages_api.script(
        # experiment 1: Claude's, its words repeating the key
        tool_use(
            good(
                hypothesis=f"K=5 wins (x-api-key: {TEST_KEY})",
                risk=f"low; the key is {TEST_KEY}",
            )
        ),
        # experiment 2: an unknown knob, then a text-only refusal
        tool_use(good(knob="max_num_seqs")),
        text_only("I would rather not choose."),
        # experiment 3: rate limited past the SDK's retry (it starts a cool-off: last)
        rate_limited(),
        rate_limited(),
    )
    result = orchestrate(workdir, "round", "--budget", "3", "--profile", "profile.yaml")
    assert result.returncode == 0, result.stderr
    assert messages_api.remaining == 0
    lines = [line.strip() for line in result.stdout.splitlines()]
    said = [line for line in lines if "fell back" in line]
    assert said == [REFUSED, RATE_LIMITED], result.stdout

    status = orchestrate(workdir, "status", "--profile", "profile.yaml")
    assert status.returncode == 0, status.stderr
    assert f"round 1: {SUMMARY}" in status.stdout.splitlines()
    data = json.loads(orchestrate(workdir, "status", "--profile", "profile.yaml", "--json").stdout)
    assert data["llm_fallbacks"] == {
        "round": 1,
        "asked": 3,
        "fell_back": 2,
        "by_class": {"rate limited": 1, "refused": 1},
        "words": SUMMARY,
    }
    report = orchestrate(workdir, "report", "--profile", "profile.yaml")
    assert report.returncode == 0, report.stderr
    page = (workdir / "reports" / "round-1" / "report.html").read_text()
    assert SUMMARY in page

    # the model's words are stored, listed and shown redacted
    listed = orchestrate(workdir, "proposals", "list", "--all", "--profile", "profile.yaml")
    assert listed.returncode == 0, listed.stderr
    assert "K=5 wins (x-api-key: ***)" in listed.stdout
    ledger = Ledger(os.environ["ORCHESTRATE_LEDGER"])
    try:
        claude_made = ledger.proposals()[0]
    finally:
        ledger.close()
    assert claude_made.source == "claude"
    assert (claude_made.hypothesis, claude_made.risk) == (
        "K=5 wins (x-api-key: ***)",
        "low; the key is ***",
    )
    assert TEST_KEY.encode() not in (workdir / "orchestrate.db").read_bytes()
    assert TEST_KEY not in listed.stdout + result.stdout + status.stdout


def test_a_refused_key_keeps_its_parenthesis_in_status(
    workdir: Path, messages_api: MessagesApi
) -> None:
    fast_profile(workdir, proposer={"kind": "claude", "claude": {"api_retries": 0}})
    messages_api.script(
        Reply(status=401, error=("authentication_error", f"invalid x-api-key: {TEST_KEY}"))
    )
    result = orchestrate(workdir, "round", "--budget", "1", "--profile", "profile.yaml")
    assert result.returncode == 7, result.stderr
    status = orchestrate(workdir, "status", "--profile", "profile.yaml")
    assert status.returncode == 0, status.stderr
    assert (
        "Claude API refused the request (HTTP 401 authentication_error: invalid x-api-key: ***); "
        "model claude-sonnet-4-6"
    ) in status.stdout
    assert TEST_KEY not in status.stdout


def test_redaction_keeps_a_closing_parenthesis_and_masks_a_secret_with_one_whole() -> None:
    redactor = Redactor(["s3cr3t)value-from-env"])
    said = {
        # the parenthesis closes one opened before the name: kept
        "(HTTP 401: x-api-key: abc123); model m": "(HTTP 401: x-api-key: ***); model m",
        "(token=abc123)": "(token=***)",
        "f(--api-key abc123) then": "f(--api-key ***) then",
        # a secret with ``)`` in it: masked whole, nothing of it left
        "password=ab)cd": "password=***",
        "password=abc)": "password=***",
        "(token: ab)cd) and": "(token: ***) and",
        "(password=a(b)c)": "(password=***)",
        "the env's s3cr3t)value-from-env here": "the env's *** here",
    }
    assert {text: redactor.text(text) for text in said} == said


def test_each_way_claude_fails_has_its_class(messages_api: MessagesApi) -> None:
    messages_api.script(
        overloaded(),
        overloaded(),
        rate_limited(),
        rate_limited(),
        malformed(),
        malformed(),
        tool_use(good_change(value=99), also=[good_change()]),
        tool_use(good_change(value=99)),
        text_only("no"),
        text_only("no"),
    )
    proposer = ClaudeProposer(
        ClaudeOptions(api_retries=1, api_timeout_s=5.0, max_tries=2),
        fallback=OptunaProposer(seed=0),
        base_url=messages_api.url,
    )
    hours = iter(range(0, 10 * 3600, 3600))
    proposer.cool_off.clock = lambda: float(next(hours))  # each one past the last's cool-off
    made = [proposer.propose(context()) for _ in range(5)]
    assert messages_api.remaining == 0
    reasons = [p.notes["llm_fallback"] for p in made]
    assert [fallback_class(r) for r in reasons] == [
        "overloaded",
        "rate limited",
        "malformed response",
        "refused",
        "refused",
    ]
    assert fallback_class("Claude API timed out (60s per request) after 3 attempts") == "timed out"
    assert fallback_class("LLM spend cap reached: $1.0000 of $1.00 this round") == "spend cap"
    assert fallback_class("a reason of another release") == "other"
    counted = Fallbacks.of((p.source, p.notes) for p in made)
    assert counted.words() == (
        "5 of 5 proposals fell back to optuna: refused ×2, malformed response ×1, "
        "overloaded ×1, rate limited ×1"
    )
