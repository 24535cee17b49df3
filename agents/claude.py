"""The Claude proposer: one knob change chosen by Claude through the Messages API's tool use.

One ``propose_change`` tool whose input schema is generated from the knob space (the knob
names as an enum, each knob's value domain as a branch of ``value``), forced with
``tool_choice`` and, where the API offers it, ``strict``. Claude sees a research brief and a
digest of the ledger (``agents.digest``), never the raw ledger.

Everything the model returns is untrusted. The knob and value pass ``KnobSpace.change`` (a
finite domain: nothing else can get through) and ``ProposalContext.refusal`` (decided,
known-bad, vetoed) before a ``Proposal`` exists; the free text (hypothesis, risk, cost) is
cleaned of control characters, cut to length, and only ever stored (redacted, by the ledger)
and shown as data. A
refused proposal goes back to the model as a tool error carrying the reason, up to
``max_tries`` times; then, or when the API stays unavailable after the SDK's retries, or gives
no answer within the proposal's deadline (``api_deadline_s``), or when the round's LLM spend
cap is reached, the proposal comes from the fallback proposer (Optuna) and its notes say why
(``llm_fallback``; classified by ``agents.llm_fallback``). After a failure of the API's (not
the model's), or a 429 still answered when the SDK's retries or the deadline ran out, the next
proposals leave it alone for a cool-off (``agents.llm_cooloff``), which a new process resumes
from the failures the ledger recorded (``ProposalContext.api_failures``).

Token usage and cost of every proposal are in its notes (``llm_*`` keys, see ``llm_notes``).
The API key is read by the SDK from the environment and never copied anywhere by this module."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from agents.context import ProposalContext
from agents.digest import digest
from agents.llm import KEY_VARIABLES, ClaudeOptions, MissingApiKey, clip, llm_notes
from agents.llm_conversation import LastAnswer, Outcome, ToolConversation
from agents.llm_cooloff import CoolOff
from agents.llm_tool import (
    EFFECT_PROPERTIES,
    TOOL,
    change_of,
    change_tool,
    one_knob_problem,
    read_effect,
)
from agents.proposal import Proposal, ProposalExhausted, Proposer, open_coupled
from orchestrator.errors import UsageError

if TYPE_CHECKING:  # the SDK takes seconds to import: only a Claude proposer pays for it
    import anthropic


T = TypeVar("T")

#: Longest brief sent to the model.
MAX_BRIEF = 20_000


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
    ) -> None:
        """``base_url`` defaults to ``$ANTHROPIC_BASE_URL``, then Anthropic's API; the key
        comes from ``$ANTHROPIC_API_KEY`` (or ``$ANTHROPIC_AUTH_TOKEN``), read by the SDK.

        Raises:
            MissingApiKey: neither variable is set.
            UsageError: the brief file cannot be read.
        """
        require_api_key(self.name)
        self.options = options
        self.fallback = fallback
        self._base_url = base_url
        self.client = self._open()
        self._brief = Brief(options.brief)
        self._spent = 0.0
        #: the API's failures across proposals, resumed from the context's on the first
        #: (``clock`` may be set before it)
        self.cool_off = CoolOff()

    def _open(self) -> anthropic.Anthropic:
        """A client, with a ``LastAnswer`` of its own (one a closed client's abandoned call
        may still write to is never read again)."""
        import anthropic  # lazy: see the TYPE_CHECKING import

        self._last_answer = LastAnswer()
        return anthropic.Anthropic(
            base_url=self._base_url,
            max_retries=self.options.api_retries,
            timeout=self.options.api_timeout_s,
            # the SDK's defaults (limits, redirects, keep-alive), and the last answer seen
            http_client=anthropic.DefaultHttpxClient(event_hooks={"response": [self._last_answer]}),
        )

    def close(self) -> None:
        """Close the API client's connections."""
        self.client.close()

    def proposing(self, context: ProposalContext) -> str:
        """Who makes the next proposal, for the round's line: this proposer, or its fallback
        while the API cools off (``agents.proposal.proposed_by``)."""
        self.cool_off.resume(context.api_failures)
        again = self.cool_off.until()
        if again is None or context.coupled_moves():
            return self.name
        return f"{self.fallback.name}: {self.name} leaves the API alone until {again}"

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
        self.cool_off.resume(context.api_failures)  # a new process: what the ledger recorded
        cooling = self.cool_off.skip()
        if cooling is not None:  # the API failed lately: the fallback proposes, unasked
            return Outcome(value=None, fallback=cooling), spent
        if self.client.is_closed():  # a conversation past its deadline closed it under its call
            self.client = self._open()
        prompt = user_prompt(context, self._brief.text(context), self.options, spent)
        conversation = ToolConversation(self.client, self.options, tool, system, self._last_answer)
        outcome = conversation.run(prompt, validate, spent_before=spent)
        self._spent = spent + outcome.usage.cost(self.options.prices())
        self.cool_off.learn(outcome.fallback)
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
        coupled = open_coupled(context, self.name)  # before any call: see ``open_coupled``
        if coupled is not None:
            return coupled
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
            return clip(context.brief, MAX_BRIEF)
        if self.path is not None:
            with contextlib.suppress(OSError):
                self._last = self._read(self.path)
        return self._last

    @staticmethod
    def _read(path: Path) -> str:
        return clip(path.read_text(encoding="utf-8", errors="replace"), MAX_BRIEF)
