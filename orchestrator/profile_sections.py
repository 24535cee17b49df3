"""The sections of a profile that set the loop's policies, each a frozen model whose defaults
are orchestrate's: what the loop maximises (``ObjectiveSpec``), how a candidate is judged
against the champion (``VerdictSpec``, with ``NoiseSpec``, the noise expected before the
ledger teaches better), who proposes (``ProposerSpec``) and the veto gate (``ApproveSpec``).
The one home of these settings and their defaults; ``orchestrator.profile`` joins them into a
``Profile``, and the verdict (``orchestrator.verdict``) and the round's policies
(``orchestrator.policy``) take ``VerdictSpec`` from here.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from agents import ClaudeOptions
from knobs.spec import Value
from orchestrator.profile_names import ApproveMode, ProposerKind


class ObjectiveSpec(BaseModel):
    """What the loop maximises: a cell metric summed over the profile's cells."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    metric: Literal["output_throughput"] = "output_throughput"
    aggregate: Literal["sum"] = "sum"


class NoiseSpec(BaseModel):
    """The noise the profile expects before the ledger has taught the model better."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    run_to_run: float = Field(default=0.02, gt=0, le=1, description="relative sd of one cell run")
    boot_to_boot: float = Field(default=0.05, gt=0, le=1, description="relative sd across boots")
    prior_weight: float = Field(
        default=8.0, ge=0, description="degrees of freedom the prior counts for"
    )


class VerdictSpec(BaseModel):
    """How a candidate is judged against the champion.

    ``sequential`` (default): Bayesian, with a spike-and-slab prior on the change's effect
    (a share ``prior_null`` of changes do nothing, the rest are spread ``prior_effect_pct``),
    boots added while undecided, and a keep only after a confirmation boot with the champion
    re-measured. ``threshold``: the common practice — keep if one run beats the champion by
    more than ``threshold_pct`` (kept for comparison; it keeps noise).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    policy: Literal["sequential", "threshold"] = "sequential"
    threshold_pct: float = Field(
        default=2.0, ge=0, le=100, description="threshold policy: keep above this gain"
    )
    confidence: float = Field(
        default=0.95, gt=0.5, lt=1, description="keep when P(gain > 0) reaches this"
    )
    equivalence_pct: float = Field(
        default=1.0, ge=0, le=50, description="gains below this are not worth a new champion"
    )
    futility: float = Field(
        default=0.25, gt=0, lt=1, description="discard when P(gain > equivalence) falls below"
    )
    prior_null: float = Field(
        default=0.5, ge=0, lt=1, description="share of changes that do nothing (the spike)"
    )
    prior_effect_pct: float = Field(
        default=15.0, gt=0, le=100, description="spread of a change's effect (the slab)"
    )
    knob_priors: bool = Field(
        default=True,
        description="judge a one-knob change with its knob's effect_prior where its spec "
        "declares one (CUDA graphs and K always do something; adapter rank rarely does)",
    )
    pool_values: bool = Field(
        default=True,
        description="judge a value of an ordered knob (K, MNBT) together with the other values "
        "of the knob measured against the same champion (off: on its own boots alone)",
    )
    second_looks: int = Field(
        default=2,
        ge=0,
        le=5,
        description="a change the verdict stopped at its boot cap or on futility while it still "
        "promises second_look_gain_pct may be looked at again this many times under one "
        "champion; its earlier boots count in the next verdict",
    )
    second_look_gain_pct: float = Field(
        default=2.0,
        gt=0,
        le=50,
        description="what a change must still promise (E[max(0, gain)] under its posterior) to "
        "be looked at again",
    )
    max_boots: int = Field(
        default=3, ge=1, le=20, description="candidate boots before inconclusive"
    )
    confirm_boots: int = Field(default=1, ge=0, le=10)
    predictive_futility: float = Field(
        default=0.1,
        ge=0,
        lt=1,
        description="discard when the chance that the boots left reach a keep falls below this",
    )
    balance_boots: bool = Field(
        default=True,
        description="while undecided, boot the champion rather than the candidate when it has "
        "fewer boots (every comparison shares its error; its boots serve every later verdict)",
    )
    reboot_slow_clocks: bool = Field(
        default=True,
        description="a boot with a node's clocks off measured the node, not the config: set it "
        "aside and boot the config again (off: the verdict rules it invalid at once); either "
        "way, a run of clocks off that chance at the cluster's rate does not explain (four in a "
        "row or more) stops the round",
    )
    busy_host_stop: int = Field(
        default=3,
        ge=1,
        le=100,
        description="this many changes in a row that a busy host left undecided, every "
        "measurement of which it disturbed (its stalls may have moved the objective more than "
        "2 %: the host's reading, not the change's), stop the round with exit 5, nothing "
        "barred, for the same command to resume once the host is quiet (a change decided all "
        "the same neither counts nor ends the row)",
    )
    noise: NoiseSpec = NoiseSpec()
    max_error_rate: float = Field(default=0.0, ge=0, le=1)
    check_greedy: bool = Field(
        default=True,
        description="invalid when greedy outputs differ from the champion's (off only to "
        "reproduce loops that do not check)",
    )
    ttft_p90_regression_pct: float | None = Field(
        default=50.0, ge=0, description="a guardrail: discard if any cell's TTFT p90 grows more"
    )
    ttft_p90_min_increase_ms: float = Field(
        default=50.0,
        ge=0,
        description="the TTFT guardrail ignores growth smaller than this many milliseconds (on a "
        "fast engine 25 -> 63 ms is +150% and nothing a user feels; one boot's scheduling luck)",
    )
    drift_every: int = Field(
        default=12, ge=1, description="re-measure the champion after this many decided experiments"
    )
    champion_boots: int = Field(
        default=3,
        ge=1,
        le=10,
        description="re-measure the champion after each decided experiment until it has this "
        "many boots (every comparison shares its error)",
    )
    drift_max_age_s: float | None = Field(
        default=None, gt=0, description="…or when its last measurement is older than this"
    )
    confirm_drift: bool = Field(
        default=True,
        description="a re-measurement that flags a drift is followed by one more boot of the "
        "champion, and its level re-based only when that boot confirms the drift (off only to "
        "reproduce the loop before issue #18, which re-based on the flagged boot alone)",
    )
    keep_boots_sigmas: float | None = Field(
        default=1.5,
        gt=0,
        description="a kept change's boots were chosen for reading high: when the new "
        "champion's first boot of its own reads this many standard errors below them, they "
        "leave its level (recorded as an event) and it is measured afresh (null: they stay)",
    )
    infra_retries: int = Field(
        default=6,
        ge=0,
        le=10,
        description="a boot that failed for the infrastructure's reasons (a node unreachable, "
        "auth, an upload, a worker missing from the rendezvous) is taken again this many times "
        "before the round stops with exit 5, the experiment left undecided (the default rides "
        "out a node's reboot: about 25 minutes of waits)",
    )
    infra_backoff_s: float = Field(
        default=30.0,
        ge=0,
        le=3600,
        description="the wait before the first such retry; it doubles for each next one, up "
        "to 10 minutes a wait",
    )


class ProposerSpec(BaseModel):
    """Who proposes, with its settings."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: ProposerKind = "optuna"
    seed: int = 0
    sweep: tuple[dict[str, Value], ...] | None = None
    #: The Claude and hybrid proposers' settings: model, max_tries, max_usd_per_round (the
    #: LLM spend cap of a round), brief (a markdown file; relative to the profile), API
    #: retries and timeout, prices. See ``agents.ClaudeOptions``.
    claude: ClaudeOptions = ClaudeOptions()


class ApproveSpec(BaseModel):
    """The veto gate."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    mode: ApproveMode = "auto"
    #: queue: how long a proposal waits for a person (None: for ever) …
    timeout_s: float | None = Field(default=None, gt=0)
    #: … and what the timeout decides.
    on_timeout: Literal["veto", "approve"] = "veto"
    #: queue: timeout vetoes in a row after which the round pauses (nobody is deciding).
    max_timeouts: int = Field(default=3, ge=1, le=1000)
