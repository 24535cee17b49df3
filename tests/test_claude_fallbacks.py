"""Redaction keeps the parenthesis a masked value closes: what ``status`` says of a round a
401 stopped (a real ``orchestrate`` on the twin, the real SDK talking to the local Messages
API server), and the redactor on texts where a secret itself holds a ``)``."""

from __future__ import annotations

from pathlib import Path

import pytest

from ledger.redact import Redactor
from tests.fixtures.cli import orchestrate
from tests.fixtures.messages_api import TEST_KEY, MessagesApi, Reply
from tests.fixtures.profiles import fast_profile


@pytest.fixture
def workdir(cli_workdir: Path) -> Path:
    return cli_workdir


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
