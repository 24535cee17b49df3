"""A proposal (one knob change and the reasoning behind it) and the protocol of its authors."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict

from agents.context import ProposalContext
from agents.coupled import COUPLED_NOTE, CoupledMove
from knobs.config import Change
from knobs.spec import as_text
from orchestrator.errors import OrchestrateError

#: What a proposal's estimated cost says when the proposer knows nothing more specific: every
#: change redeploys the cluster and measures the profile's cells once.
ONE_EXPERIMENT = "1 boot (all nodes, workers first) + 1 pass of the profile's bench cells"

#: Which way the objective improves.
Direction = Literal["maximize", "minimize"]


def versus(pct: float, direction: Direction) -> str:
    """An objective change of ``pct`` % against the champion, in words."""
    if abs(pct) < 0.5:
        return "about the same as the champion"
    if (pct > 0) == (direction == "maximize"):
        return "better than the champion"
    return "worse than the champion"


class Proposal(BaseModel):
    """One knob change for the champion (or a coupled move: ``Change.enabling``), with what
    its author expects and why."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    change: Change
    #: Who proposed it: "optuna", "sweep", "claude", "person", "optuna (fallback from claude)" …
    source: str
    hypothesis: str
    #: Direction and size, in words.
    expected_effect: str
    risk: str
    #: e.g. "1 boot + 4 cells".
    estimated_cost: str
    notes: dict[str, str] = {}


def coupled_proposal(context: ProposalContext, move: CoupledMove, source: str) -> Proposal:
    """The proposal of an open coupled move (``agents.coupled``): both knobs, and the failure
    it answers in its hypothesis and its ``coupled`` note."""
    change = move.change
    assert change.enabling is not None
    prior = context.prior(change.knob)
    effect = (
        f"unknown: {change.knob}={as_text(change.new)} never booted here; judged with "
        f"{change.knob}'s prior"
        + ("" if prior is None else f" ({1 - prior.p_null:.0%} of its changes matter, ")
        + ("" if prior is None else f"spread {prior.effect_pct:g}%)")
    )
    return Proposal(
        change=change,
        source=source,
        hypothesis=f"{change.describe()}: a coupled move. {move.why()}.",
        expected_effect=effect,
        risk=f"{change.enabling.knob}={as_text(change.enabling.new)} may not be enough: if the "
        f"pair fails again, the pair's region is barred; {context.risk_of(change)}",
        estimated_cost=ONE_EXPERIMENT,
        notes={
            "sampler": "coupled",
            COUPLED_NOTE: move.why(),
            "coupled_experiment": str(move.experiment),
            "coupled_failure": move.failure_class,
        },
    )


def open_coupled(context: ProposalContext, source: str) -> Proposal | None:
    """The proposal of the oldest coupled move open under this champion, or ``None``.

    Every proposer that chooses for itself (Optuna with first looks, Claude, the hybrid) takes
    it before its own choice: it is the one way to run a value whose boot failed for a cause
    another knob declares, a one-knob proposer cannot name it (the model's tool takes one
    knob), and it is tried once per champion. A person may still veto it."""
    moves = context.coupled_moves()
    return coupled_proposal(context, moves[0], source) if moves else None


@runtime_checkable
class Proposer(Protocol):
    """Suggests the next one-knob change. Must be deterministic given the context.

    ``propose`` raises ``ProposalExhausted`` when no allowed change is left; any other
    ``OrchestrateError`` it raises is the proposer's own (an LLM API error, say).
    """

    name: str

    def propose(self, context: ProposalContext) -> Proposal:
        """The next proposal for ``context.champion``.

        Raises:
            ProposalExhausted: no allowed one-knob change remains for this proposer.
        """
        ...


def proposed_by(proposer: Proposer, context: ProposalContext) -> str:
    """Who makes ``proposer``'s next proposal for ``context``, for the round's line: its name,
    or what a proposer that hands it to another says (an LLM proposer whose API cools off:
    ``LLMProposer.proposing``)."""
    said = getattr(proposer, "proposing", None)
    return str(said(context)) if callable(said) else proposer.name


class ProposalExhausted(OrchestrateError):
    """No allowed one-knob change remains: the round ends early, this is not a failure.

    Carries the proposer's name, how many candidates it considered, the refusals of those
    counted by kind (``invalid``, ``decided``, ``known-bad``, and for a sweep ``done``), and how
    many allowed one-knob changes are left outside its candidates (0 when it considered every
    neighbour; a finished sweep list may leave some).
    """

    exit_code = 1

    def __init__(
        self,
        message: str,
        *,
        proposer: str,
        considered: int,
        left: int = 0,
        refusals: Mapping[str, int] | None = None,
    ) -> None:
        super().__init__(message)
        self.proposer = proposer
        self.considered = considered
        self.left = left
        self.refusals = dict(refusals or {})

    @classmethod
    def after(
        cls,
        proposer: str,
        considered: int,
        refusals: Mapping[str, int],
        *,
        what: str,
        left: int = 0,
    ) -> ProposalExhausted:
        """The error for ``proposer`` having refused all ``considered`` candidates of ``what``,
        with ``left`` allowed one-knob changes outside them."""
        why = ", ".join(f"{n} {kind}" for kind, n in sorted(refusals.items())) or "none refused"
        message = (
            f"{proposer}: no allowed one-knob change is left among {considered} {what} ({why})"
        )
        if left:
            message += f"; {left} other allowed one-knob changes remain outside it"
        return cls(message, proposer=proposer, considered=considered, left=left, refusals=refusals)
