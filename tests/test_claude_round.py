"""``orchestrate round --proposer claude`` end to end: a real ``orchestrate`` process on the
four-node twin, the real SDK inside it talking to the local Messages API server through
``$ANTHROPIC_BASE_URL``. Shell syntax from the model never runs and never reaches a launcher;
the key never reaches the ledger, MLflow, the artifacts or the output; a fallback is recorded."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from ledger import Ledger
from tests.fixtures.cli import orchestrate
from tests.fixtures.messages_api import TEST_KEY, MessagesApi, overloaded, tool_use
from tests.fixtures.mlflow_store import MlflowStore
from tests.fixtures.profiles import fast_profile


@pytest.fixture
def workdir(cli_workdir: Path) -> Path:
    return cli_workdir


def good(**fields: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "knob": "num_speculative_tokens",
        "value": 5,
        "hypothesis": "K=5 drafts fewer rejected tokens.",
        "expected_direction": "higher",
        "expected_size_pct": 3.0,
        "risk": "low",
        "estimated_cost": "1 boot",
    }
    data.update(fields)
    return data


def test_a_claude_round_refuses_injections_records_cost_and_falls_back(
    workdir: Path, messages_api: MessagesApi, mlflow_store: MlflowStore
) -> None:
    canary = workdir / "pwned"
    payloads = [f"$(touch {canary})", f"`touch {canary}`", f"7; touch {canary}", f"'\n{canary}"]
    (workdir / "brief.md").write_text("Try K before anything else.\n")
    fast_profile(
        workdir,
        proposer={
            "kind": "claude",
            "claude": {"brief": "brief.md", "api_retries": 1, "max_tries": 3},
        },
    )
    messages_api.script(
        # experiment 1: two refused proposals, then a valid one whose free text is hostile
        tool_use(good(knob=f"num_speculative_tokens; touch {canary}")),
        tool_use(good(value=payloads[0])),
        tool_use(good(hypothesis=payloads[1], risk=payloads[2], estimated_cost=payloads[3])),
        # experiment 2: the API stays overloaded past the SDK's retries
        overloaded(),
        overloaded(),
    )
    result = orchestrate(workdir, "round", "--budget", "2", "--profile", "profile.yaml", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert [e["kind"] for e in report["experiments"]] == ["baseline", "candidate", "candidate"]
    assert messages_api.remaining == 0 and len(messages_api.requests) == 5

    # the model saw the brief, then each refusal as a tool error
    first, second, third = messages_api.requests[:3]
    assert "Try K before anything else." in first.texts()
    assert "unknown knob 'num_speculative_tokens; touch" in second.tool_errors()[0]
    [error] = third.tool_errors()
    assert "knob num_speculative_tokens: '$(touch " in error
    assert error.endswith(
        "is not an integer from 1 to 7. Call propose_change again with a different proposal."
    )

    ledger = Ledger(os.environ["ORCHESTRATE_LEDGER"])
    try:
        claude_made, fallback = ledger.proposals()
    finally:
        ledger.close()
    assert (claude_made.source, claude_made.knob, claude_made.new_value) == (
        "claude",
        "num_speculative_tokens",
        5,
    )
    assert claude_made.hypothesis == f"`touch {canary}`"  # stored as data
    assert claude_made.estimated_cost == f"' {canary}"  # the newline is gone
    notes = claude_made.notes
    assert (notes["llm_tries"], notes["llm_rejected"], notes["llm_requests"]) == ("3", "2", "3")
    assert notes["llm_cost_usd"] == "0.013500"
    assert fallback.source == "optuna (fallback from claude)"
    assert fallback.notes["llm_fallback"] == (
        "Claude API unavailable (HTTP 529 overloaded_error: Overloaded) after 2 attempts"
    )
    assert fallback.notes["llm_round_spend_usd"] == "0.013500"

    # nothing the model wrote ran, or reached a launcher
    assert not canary.exists()
    stores = (workdir, mlflow_store.db_path.parent)
    launchers = [p.read_text() for d in stores for p in d.rglob("*.sh")]
    # the nodes' last, every boot's in MLflow, and the champion's on the round's parent run
    assert len(launchers) == 4 + 4 * 3 + 4
    for text in launchers:
        assert "touch" not in text and str(canary) not in text

    # the key is nowhere but in the requests' headers: not the ledger, MLflow, logs, output
    files = [p for d in stores for p in d.rglob("*") if p.is_file()]
    assert any(p.name == "orchestrate.db" for p in files)
    assert any(p.name == "mlflow.db" for p in files)
    for path in files:
        assert TEST_KEY.encode() not in path.read_bytes(), path
    assert TEST_KEY not in result.stdout + result.stderr


def test_claude_without_a_key_is_one_line_and_exit_7(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_AUTH_TOKEN", raising=False)
    fast_profile(workdir)
    result = orchestrate(workdir, "round", "--proposer", "claude", "--profile", "profile.yaml")
    assert result.returncode == 7
    assert result.stderr == (
        "Error: --proposer claude needs an Anthropic API key: set ANTHROPIC_API_KEY "
        "(or use --proposer optuna)\n"
    )
    assert result.stdout == ""
    assert not (workdir / "orchestrate.db").exists()


def test_a_bad_claude_setting_is_a_profile_error(workdir: Path) -> None:
    bad = fast_profile(workdir, proposer={"kind": "claude", "claude": {"brief": "missing.md"}})
    bad = bad.rename(workdir / "bad.yaml")
    result = orchestrate(workdir, "round", "--profile", "bad.yaml")
    assert result.returncode == 3
    assert result.stderr.startswith("Error: profile bad.yaml: proposer.claude.brief: no such file")
    assert result.stderr.count("\n") == 1
