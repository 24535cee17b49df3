"""The Claude proposer, with the real ``anthropic`` SDK talking to a local Messages API server
(``tests/fixtures/messages_api.py``) that returns scripted answers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agents import (
    METRIC_NOTES,
    TAG_NOTES,
    ClaudeOptions,
    ClaudeProposer,
    HistoryEntry,
    KnownBad,
    LLMError,
    MissingApiKey,
    OptunaProposer,
    Proposal,
    ProposalContext,
    ProposalExhausted,
    make_proposer,
)
from agents.llm import DEFAULT_MODEL, PRICES, clean_text
from cluster.launcher import render_node
from knobs import Change, Config, ForbiddenCombination, KnobSpace, catalog
from orchestrator.profile import load_profile
from orchestrator.settings import runtime_placeholders
from tests.fixtures.messages_api import (
    TEST_KEY,
    MessagesApi,
    Reply,
    hang,
    malformed,
    overloaded,
    rate_limited,
    text_only,
    tool_use,
)
from tests.fixtures.profiles import twin_profile_data, write_profile

SPACE = KnobSpace(
    knobs=catalog("vllm-dflash2"),
    forbidden=(
        ForbiddenCombination(
            when={"cuda_graphs": True, "num_speculative_tokens": 7},
            reason="batch-descriptor collision",
        ),
    ),
)
CHAMPION = SPACE.default_config()
#: (1000 input tokens × $3 + 100 output tokens × $15) per million: one scripted reply.
ONE_REPLY_USD = 0.0045


def context(
    *,
    history: tuple[HistoryEntry, ...] = (),
    known_bad: tuple[KnownBad, ...] = (),
    decided: frozenset[str] = frozenset(),
    spent: float = 0.0,
    budget_left: int = 4,
) -> ProposalContext:
    return ProposalContext(
        space=SPACE,
        champion=CHAMPION,
        champion_objective=1000.0,
        history=history,
        known_bad=known_bad,
        decided_keys=decided,
        budget_left=budget_left,
        seed=0,
        llm_spend_usd=spent,
    )


def good(**fields: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "knob": "num_speculative_tokens",
        "value": 5,
        "hypothesis": "K=7 drafts past the acceptance cliff; K=5 should verify fewer rejects.",
        "expected_direction": "higher",
        "expected_size_pct": 3.5,
        "risk": "low: K=5 booted on sibling stacks",
        "estimated_cost": "1 boot + 1 bench pass",
    }
    data.update(fields)
    return data


def claude(api: MessagesApi, tmp_path: Path | None = None, **options: Any) -> ClaudeProposer:
    options.setdefault("api_retries", 1)
    options.setdefault("api_timeout_s", 5.0)
    return ClaudeProposer(
        ClaudeOptions(**options), fallback=OptunaProposer(seed=0), base_url=api.url
    )


def test_a_good_proposal_is_the_change_with_its_cost_in_the_notes(
    messages_api: MessagesApi,
) -> None:
    messages_api.script(tool_use(good()))
    proposal = claude(messages_api).propose(context())
    assert proposal.change == Change(knob="num_speculative_tokens", old=7, new=5)
    assert proposal.source == "claude"
    assert proposal.hypothesis == good()["hypothesis"]
    assert proposal.expected_effect == "objective higher by about 3.5%"
    assert proposal.risk == "low: K=5 booted on sibling stacks"
    assert proposal.estimated_cost == "1 boot + 1 bench pass"
    assert PRICES[DEFAULT_MODEL] == (3.0, 15.0)
    assert proposal.notes == {
        "expected_direction": "higher",
        "expected_size_pct": "3.5",
        "llm_model": DEFAULT_MODEL,
        "llm_requests": "1",
        "llm_api_retries": "0",
        "llm_input_tokens": "1000",
        "llm_output_tokens": "100",
        "llm_cache_read_tokens": "0",
        "llm_cache_write_tokens": "0",
        "llm_cost_usd": f"{ONE_REPLY_USD:.6f}",
        "llm_round_spend_usd": f"{ONE_REPLY_USD:.6f}",
        "llm_tries": "1",
        "llm_rejected": "0",
    }
    [request] = messages_api.requests
    assert request.path == "/v1/messages"
    body = request.body
    assert body is not None
    assert body["model"] == DEFAULT_MODEL
    assert body["tool_choice"] == {
        "type": "tool",
        "name": "propose_change",
        "disable_parallel_tool_use": True,
    }
    [tool] = body["tools"]
    assert tool["name"] == "propose_change" and tool["strict"] is True
    schema = tool["input_schema"]
    assert schema["additionalProperties"] is False
    assert sorted(schema["required"]) == sorted(schema["properties"])
    assert schema["properties"]["knob"]["enum"] == SPACE.names
    branches = {b["description"].split(":")[0]: b for b in schema["properties"]["value"]["anyOf"]}
    assert branches["num_speculative_tokens"]["enum"] == [1, 2, 3, 4, 5, 6, 7]
    assert branches["kv_cache_dtype"] == {
        "type": "string",
        "enum": ["auto", "fp8_e4m3", "fp8_e5m2"],
        "description": "kv_cache_dtype: one of auto, fp8_e4m3, fp8_e5m2",
    }
    assert branches["cuda_graphs"]["type"] == "boolean"
    assert len(branches["gpu_memory_utilization"]["enum"]) == 26


def _history() -> tuple[HistoryEntry, ...]:
    def entry(
        n: int, knob: str | None, value: Any, status: str, delta: float | None, **kw: Any
    ) -> HistoryEntry:
        config = CHAMPION.as_dict() if knob is None else {**CHAMPION.as_dict(), knob: value}
        return HistoryEntry(
            experiment=n,
            config=config,
            knob=knob,
            value=value,
            status=status,
            objective=None if delta is None else 1000 * (1 + delta / 100),
            delta_pct=delta,
            champion_key=CHAMPION.key,
            **kw,
        )

    return (
        entry(1, None, None, "keep", 0.0),
        entry(2, "max_num_batched_tokens", 8192, "discard", -1.0),
        entry(3, "max_num_batched_tokens", 8192, "inconclusive", 2.0),
        entry(4, "gpu_memory_utilization", 0.9, "crash", None, failure_class="oom"),
        entry(5, "kv_cache_dtype", "auto", "vetoed", None),
    )


def test_the_model_sees_the_brief_and_a_digest_not_the_ledger(
    messages_api: MessagesApi, tmp_path: Path
) -> None:
    brief = tmp_path / "brief.md"
    brief.write_text("Focus on K first; our head node has 10% less memory.\n")
    history = _history()
    known_bad = (
        KnownBad(when={"gpu_memory_utilization": 0.9}, reason="oom", source="crash"),
        KnownBad(
            when={"kv_cache_dtype": "auto"},
            reason="auto KV doubles memory on our head node",
            source="veto",
        ),
    )
    messages_api.script(tool_use(good()), tool_use(good(value=4)))
    proposer = claude(messages_api, max_usd_per_round=1.0, brief=str(brief))
    proposer.propose(context(history=history, known_bad=known_bad, spent=0.25))
    prompt = messages_api.requests[0].body["messages"][0]["content"]  # type: ignore[index]
    for line in (
        "Focus on K first; our head node has 10% less memory.",
        "4 experiments left in this round",
        "LLM spend this round so far: $0.2500 of a $1.00 cap.",
        "objective 1000.0 (higher is better)",
        "- num_speculative_tokens [7]: an integer from 1 to 7 — K: draft tokens proposed per "
        "verify step; prior in force: 5% of its changes do nothing, the rest ±15.0% (K sets "
        "the accepted tokens per step",
        "; allowed now: 1, 2, 3, 4, 5, 6",
        "- cuda_graphs=true, num_speculative_tokens=7: batch-descriptor collision",
        "- max_num_batched_tokens: 8192: discard×1, inconclusive×1 delta +0.5% ± 2.1 (n=2)",
        "- gpu_memory_utilization: 0.9: crash×1 [oom]",
        "- kv_cache_dtype=auto: auto KV doubles memory on our head node",
        "- gpu_memory_utilization=0.9 (crash: oom)",
        "- cuda_graphs: never changed",
        "- experiment #4 gpu_memory_utilization=0.9: crash [oom]",
    ):
        assert line in prompt, line
    assert "\t" not in prompt  # no raw TSV
    # the brief is read again before every proposal: a person may edit it mid-round
    brief.write_text("Now try MNBT.\n")
    proposer.propose(context(history=history, known_bad=known_bad, spent=0.25))
    later = messages_api.requests[1].body["messages"][0]["content"]  # type: ignore[index]
    assert "Now try MNBT." in later and "Focus on K first" not in later


VETOED = KnownBad(when={"num_speculative_tokens": 3}, reason="K=3 wedges rank 2", source="veto")
CRASHED = KnownBad(when={"num_speculative_tokens": 6}, reason="boot_timeout", source="crash")


@pytest.mark.parametrize(
    ("reply", "reason"),
    [
        (tool_use(good(knob="num_spec_tokens")), "unknown knob 'num_spec_tokens'; known knobs: "),
        (tool_use(good(value=9)), "knob num_speculative_tokens: 9 is not an integer from 1 to 7"),
        (
            tool_use(good(knob="max_num_batched_tokens", value=7000)),
            "knob max_num_batched_tokens: 7000 is not an integer from 2048 to 16384 in steps "
            "of 512",
        ),
        (tool_use(good(value=7)), "knob num_speculative_tokens: 7 is already the champion's"),
        (
            tool_use(good(knob="cuda_graphs", value=True)),
            "forbidden combination cuda_graphs=true, num_speculative_tokens=7: batch-descriptor",
        ),
        (
            tool_use(good(value=4)),
            "num_speculative_tokens 7 → 4 was already decided under this champion",
        ),
        (tool_use(good(value=3)), "enters a known-bad region: num_speculative_tokens=3 (veto: K=3"),
        (
            tool_use(good(value=6)),
            "known-bad region: num_speculative_tokens=6 (crash: boot_timeout",
        ),
        (tool_use(good(cuda_graphs=True)), "exactly one knob per proposal"),
        (tool_use(good(knob=["num_speculative_tokens", "cuda_graphs"])), "exactly one knob per"),
        (
            tool_use(good(value=2), also=[good(knob="max_num_batched_tokens", value=8192)]),
            "2 tool calls in one reply; exactly one knob per proposal",
        ),
        (tool_use(good(extra="x")), "unexpected fields 'extra'"),
        (tool_use({k: v for k, v in good().items() if k != "risk"}), "missing fields: risk"),
        (tool_use(good(expected_direction="sideways")), "expected_direction 'sideways' is not"),
        (tool_use(good(expected_size_pct="big")), "expected_size_pct 'big' is not a number"),
        (tool_use(good(hypothesis="  \n\t ")), "hypothesis must be a non-empty string"),
        (tool_use('{"knob": "num_speculative_tokens", "value": 5'), "must be a JSON object"),
        (tool_use(good(), name="run_shell"), "there is no tool 'run_shell'; call propose_change"),
    ],
)
def test_a_refused_proposal_goes_back_to_the_model_with_the_reason(
    messages_api: MessagesApi, reply: Reply, reason: str
) -> None:
    decided = frozenset({CHAMPION.apply(Change(knob="num_speculative_tokens", old=7, new=4)).key})
    messages_api.script(reply, tool_use(good()))
    proposal = claude(messages_api).propose(context(known_bad=(VETOED, CRASHED), decided=decided))
    assert proposal.change == Change(knob="num_speculative_tokens", old=7, new=5)
    assert proposal.source == "claude"
    assert proposal.notes["llm_tries"] == "2" and proposal.notes["llm_rejected"] == "1"
    assert reason in proposal.notes["llm_rejections"]
    first, second = messages_api.requests
    errors = second.tool_errors()
    assert errors and all(reason in e for e in errors), errors
    assert len(errors) == len([b for b in reply.content if b["type"] == "tool_use"])
    # the conversation continues: the refused call is echoed, then the tool error
    assert first.body is not None and second.body is not None
    assert second.body["messages"][:1] == first.body["messages"]
    assert second.body["messages"][1]["role"] == "assistant"


def test_a_reply_without_a_tool_call_is_asked_again(messages_api: MessagesApi) -> None:
    messages_api.script(text_only("I think K=5."), tool_use(good()))
    proposal = claude(messages_api).propose(context())
    assert proposal.change.new == 5
    assert "the reply called no tool (stop_reason 'end_turn')" in proposal.notes["llm_rejections"]
    first, second = messages_api.requests
    assert first.body == second.body


def test_a_malformed_response_body_is_asked_again(messages_api: MessagesApi) -> None:
    messages_api.script(malformed(), tool_use(good()))
    proposal = claude(messages_api).propose(context())
    assert proposal.change.new == 5 and proposal.source == "claude"
    assert "malformed response from the API" in proposal.notes["llm_rejections"]
    assert proposal.notes["llm_requests"] == "2"
    assert proposal.notes["llm_input_tokens"] == "1000"  # the broken reply reported none


INJECTIONS = (
    "7; reboot",
    "$(id)",
    "`id`",
    "7\nreboot",
    "7' && reboot '",
    '7" ; reboot ; "',
    "--enforce-eager --trust-remote-code",
)


def _render_all(config: Config, tmp_path: Path) -> str:
    """Every node's rendered launcher (argv, env, script) for ``config`` on the twin."""
    profile = load_profile(str(write_profile(tmp_path, twin_profile_data())), base_dir=tmp_path)
    out = []
    for node in profile.cluster.nodes:
        rendered = render_node(
            profile.launcher, profile.space, config, profile.cluster, node, runtime_placeholders()
        )
        out += [*rendered.argv, *rendered.env.values(), rendered.script]
    return "\n".join(out)


@pytest.mark.parametrize("bad", INJECTIONS)
def test_shell_syntax_in_any_field_never_reaches_a_launcher(
    messages_api: MessagesApi, tmp_path: Path, bad: str
) -> None:
    messages_api.script(
        tool_use(good(knob=bad)),
        tool_use(good(value=bad)),
        tool_use(good(knob="kv_cache_dtype", value=bad)),
        tool_use(good(expected_direction=bad)),
        tool_use(good(expected_size_pct=bad)),
        # valid knob and value; every free-text field carries the payload: stored as data
        tool_use(good(hypothesis=bad, risk=bad, estimated_cost=bad)),
    )
    proposer = claude(messages_api, max_tries=6)
    proposal = proposer.propose(context())
    assert proposal.source == "claude"
    assert proposal.change == Change(knob="num_speculative_tokens", old=7, new=5)
    assert proposal.notes["llm_rejected"] == "5"
    for request in messages_api.requests[1:]:
        [error] = request.tool_errors()
        assert error.startswith("refused: ")
    cleaned = clean_text(bad)
    assert proposal.hypothesis == proposal.risk == proposal.estimated_cost == cleaned
    assert "\n" not in proposal.hypothesis
    launchers = _render_all(CHAMPION.apply(proposal.change), tmp_path)
    for fragment in ("reboot", "$(id)", "`id`", "trust-remote-code"):
        assert fragment not in launchers
    assert '"num_speculative_tokens":5' in launchers


def test_429_then_success_is_retried_by_the_sdk(messages_api: MessagesApi) -> None:
    messages_api.script(rate_limited(), tool_use(good()))
    proposal = claude(messages_api, api_retries=2).propose(context())
    assert proposal.source == "claude"
    assert proposal.notes["llm_api_retries"] == "1"
    assert proposal.notes["llm_requests"] == "1"
    first, second = messages_api.requests
    assert first.body == second.body
    assert second.headers["x-stainless-retry-count"] == "1"


def test_529_until_give_up_falls_back_to_optuna_and_says_why(messages_api: MessagesApi) -> None:
    messages_api.script(overloaded(), overloaded(), overloaded())
    ctx = context()
    proposal = claude(messages_api, api_retries=2).propose(ctx)
    assert len(messages_api.requests) == 3 and messages_api.remaining == 0
    assert proposal.source == "optuna (fallback from claude)"
    assert ctx.allowed(proposal.change) is None
    assert proposal.notes["llm_fallback"] == (
        "Claude API unavailable (HTTP 529 overloaded_error: Overloaded) after 3 attempts"
    )
    assert proposal.notes["llm_api_retries"] == "2"
    assert proposal.notes["llm_cost_usd"] == "0.000000"
    assert "sampler" in proposal.notes  # the Optuna proposer's own notes are kept


def test_a_timeout_is_retried_then_given_up(messages_api: MessagesApi) -> None:
    messages_api.script(hang(30), tool_use(good()))
    proposal = claude(messages_api, api_timeout_s=0.3, api_retries=1).propose(context())
    assert proposal.source == "claude" and proposal.notes["llm_api_retries"] == "1"
    messages_api.script(hang(30), hang(30))
    proposal = claude(messages_api, api_timeout_s=0.3, api_retries=1).propose(context())
    assert proposal.source == "optuna (fallback from claude)"
    assert proposal.notes["llm_fallback"] == (
        "Claude API timed out (0.3s per request) after 2 attempts"
    )


def test_after_max_tries_refused_the_round_falls_back(messages_api: MessagesApi) -> None:
    messages_api.script(tool_use(good(value=9)), tool_use(good(value="$(id)")))
    proposal = claude(messages_api, max_tries=2).propose(context())
    assert proposal.source == "optuna (fallback from claude)"
    notes = proposal.notes
    assert notes["llm_fallback"].startswith("2 of 2 proposals refused (last: knob num_spec")
    assert (notes["llm_tries"], notes["llm_rejected"]) == ("2", "2")
    assert (notes["llm_input_tokens"], notes["llm_output_tokens"]) == ("2000", "200")
    assert notes["llm_cost_usd"] == f"{2 * ONE_REPLY_USD:.6f}"


def test_the_spend_cap_stops_calls_and_falls_back(messages_api: MessagesApi) -> None:
    # already over the cap (a resumed round: the spend comes from the ledger): no call at all
    proposal = claude(messages_api, max_usd_per_round=0.01).propose(context(spent=0.012))
    assert messages_api.requests == []
    assert proposal.source == "optuna (fallback from claude)"
    assert proposal.notes["llm_fallback"] == ("LLM spend cap reached: $0.0120 of $0.01 this round")
    # reached during the conversation: the third try is not paid for
    messages_api.script(*(tool_use(good(value=9)) for _ in range(3)))
    proposal = claude(messages_api, max_usd_per_round=0.005).propose(context())
    assert len(messages_api.requests) == 2 and messages_api.remaining == 1
    assert proposal.notes["llm_fallback"].startswith("LLM spend cap reached: $0.0090 of $0.01")
    assert proposal.notes["llm_round_spend_usd"] == f"{2 * ONE_REPLY_USD:.6f}"


def test_the_cap_counts_this_process_spend_when_the_context_has_none(
    messages_api: MessagesApi,
) -> None:
    messages_api.script(tool_use(good()), tool_use(good(value=4)))
    proposer = claude(messages_api, max_usd_per_round=0.006)
    assert proposer.propose(context()).source == "claude"
    assert proposer.propose(context()).notes["llm_round_spend_usd"] == "0.009000"
    third = proposer.propose(context())
    assert third.source == "optuna (fallback from claude)"
    assert len(messages_api.requests) == 2


def test_an_error_a_retry_cannot_fix_is_an_llm_error_without_the_key(
    messages_api: MessagesApi,
) -> None:
    messages_api.script(
        Reply(status=401, error=("authentication_error", f"invalid x-api-key {TEST_KEY}"))
    )
    with pytest.raises(LLMError) as caught:
        claude(messages_api).propose(context())
    assert caught.value.exit_code == 7
    assert caught.value.status == 401
    # where it was refused and what to do: a key refused by a proxy's endpoint is the
    # usual 401 of a key that works elsewhere
    assert str(caught.value) == (
        "Claude API refused the request (HTTP 401 authentication_error: invalid x-api-key "
        f"***); model {DEFAULT_MODEL}, at {messages_api.url.rstrip('/')}: check "
        "ANTHROPIC_API_KEY, a key this endpoint takes (and ANTHROPIC_BASE_URL), or use "
        "--proposer optuna; the same command then resumes the round"
    )
    assert TEST_KEY not in repr(caught.value.args)


def test_no_call_is_paid_for_when_nothing_is_allowed(messages_api: MessagesApi) -> None:
    everything = frozenset(CHAMPION.apply(c).key for c in SPACE.neighbours(CHAMPION))
    with pytest.raises(ProposalExhausted):
        claude(messages_api).propose(context(decided=everything))
    assert messages_api.requests == []


def test_without_a_key_the_claude_proposers_refuse_to_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_AUTH_TOKEN", raising=False)
    for kind in ("claude", "hybrid"):
        with pytest.raises(MissingApiKey) as caught:
            make_proposer(kind, seed=0, options={})
        assert caught.value.exit_code == 7
        assert str(caught.value) == (
            f"--proposer {kind} needs an Anthropic API key: set ANTHROPIC_API_KEY "
            "(or use --proposer optuna)"
        )


def test_the_request_carries_the_key_only_in_its_header(messages_api: MessagesApi) -> None:
    messages_api.script(tool_use(good()))
    proposal = claude(messages_api).propose(context())
    [request] = messages_api.requests
    headers = request.headers
    assert TEST_KEY in (headers.get("x-api-key", "") + headers.get("authorization", ""))
    assert TEST_KEY not in json.dumps(request.body)
    assert TEST_KEY not in proposal.model_dump_json()


def test_a_model_without_a_known_price_needs_one() -> None:
    with pytest.raises(ValueError, match="no list price known for model 'claude-next'"):
        ClaudeOptions(model="claude-next")
    priced = ClaudeOptions(model="claude-next", input_usd_per_mtok=2, output_usd_per_mtok=10)
    assert priced.prices() == (2.0, 10.0)


def test_proposals_are_pydantic_records(messages_api: MessagesApi) -> None:
    messages_api.script(tool_use(good()))
    proposal = claude(messages_api).propose(context())
    assert Proposal.model_validate_json(proposal.model_dump_json()) == proposal


def test_the_notes_split_into_metrics_and_tags(messages_api: MessagesApi) -> None:
    messages_api.script(tool_use(good(value=9)), tool_use(good()))
    notes = claude(messages_api, max_usd_per_round=1.0).propose(context()).notes
    assert set(notes) <= set(METRIC_NOTES) | set(TAG_NOTES)
    for key in METRIC_NOTES:
        if key in notes:
            float(notes[key])
