"""The decided history as an in-memory Optuna study, the one ``OptunaProposer`` asks.

How history becomes trials:

- a measured entry (keep, discard or inconclusive, with an objective) is a COMPLETE trial with
  that objective; so is the champion's own measurement when no history entry carries it;
- a config that failed on its own (a crash of the config's class, an invalid output) is an
  infeasible trial: PRUNED, with a violated constraint and no objective. TPE puts infeasible
  trials in its "bad" density (Optuna's constrained TPE), so it learns where configs fail
  without a fake objective on the surface: the memory fraction that OOMed at 0.90 and 0.92
  steers its draws away from 0.91 as well, where before it walked down one OOM at a time
  (docs/benchmarks-history.md, "TPE learns where configs fail"). A crash another knob explains
  (the KV dtype's ``kv_capacity``, which a larger memory fraction cures) is infeasible too: the
  pair's way out is the coupled move (``agents.coupled``), not TPE, and keeping it out of TPE's
  model cost a boot failure a run on ``sm121-2node`` (tried). The values themselves are barred
  exactly through ``known_bad``; this only shapes where TPE looks next;
- a crash of the infrastructure's (a node unreachable, stuck clocks: ``INFRASTRUCTURE``) and a
  veto are FAIL trials, which TPE ignores: the first says nothing of the config, the second is a
  person's judgement, not a measurement. Keeping them in the study as FAIL, rather than dropping
  them, keeps the study a full mirror of the decided history (one trial per experiment, in
  order), which an RDB-backed study shared between clusters will want;
- an entry whose config no longer fits the space (the profile added or removed a knob) is
  skipped and counted in the proposal's notes;
- an entry with a value outside its knob's domain now (the profile narrowed it: K to 1–4 after
  K=5 and 7 ran) stays a trial, without that knob's param: TPE learns the other knobs from it,
  and its study's distributions are the profile's, so no value outside the domain is ever
  asked (nor is the study broken: a categorical Optuna cannot narrow under its trials). Before,
  the whole entry was skipped, and a champion outside the narrowed domain left TPE almost no
  trial: back to random draws. Counted in the proposal's notes too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.trial import TrialState, create_trial

from agents.context import HistoryEntry, ProposalContext
from knobs.config import Config
from knobs.errors import KnobError
from knobs.space import KnobSpace
from knobs.spec import Value, printable
from knobs.vocabulary import INFRASTRUCTURE, Status


def infeasible(entry: HistoryEntry) -> bool:
    """A config that failed for its own reasons: it crashed (not for the infrastructure's) or
    its outputs were wrong."""
    if entry.status == Status.CRASH:
        return entry.failure_class not in INFRASTRUCTURE
    return entry.status == Status.INVALID


def distributions(space: KnobSpace) -> dict[str, BaseDistribution]:
    """One Optuna distribution per knob: int → Int, float → Float (both stepped), else categorical.

    ``high`` is the last value of the knob's domain, so Optuna never has to adjust it.
    """
    out: dict[str, BaseDistribution] = {}
    for spec in space.knobs:
        values = spec.domain()
        if spec.type == "int":
            step = int(spec.step or 1)
            out[spec.name] = IntDistribution(int(values[0]), int(values[-1]), step=step)
        elif spec.type == "float":
            assert spec.step is not None
            out[spec.name] = FloatDistribution(
                float(values[0]), float(values[-1]), step=float(spec.step)
            )
        else:
            out[spec.name] = CategoricalDistribution(values)
    return out


def study_of(
    context: ProposalContext,
    dists: dict[str, BaseDistribution],
    *,
    seed: int,
    n_startup: int,
    direction: Literal["maximize", "minimize"],
) -> tuple[optuna.Study, History]:
    """The context's history as an in-memory study over ``dists`` (the space's): one trial an
    entry (see the module), then the champion's measurement where no entry carries it; and
    what it made of the history."""
    sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=n_startup)
    study = optuna.create_study(direction=direction, sampler=sampler)
    read = History()
    measured: set[str] = set()
    for entry in context.history:
        params = read.fitted(context.space, entry.config)
        if params is None:
            continue
        of = {k: dists[k] for k in params}
        if entry.measured:
            measured.add(Config(entry.config).key)
            trial = create_trial(params=params, distributions=of, value=entry.objective)
        elif infeasible(entry):
            trial = create_trial(
                state=TrialState.PRUNED,
                params=params,
                distributions=of,
                constraints={"config_failed": 1.0},
            )
        else:
            trial = create_trial(state=TrialState.FAIL, params=params, distributions=of)
        study.add_trial(trial)
    champion = read.fitted(context.space, context.champion)
    objective = context.champion_objective
    if champion and objective is not None and context.champion.key not in measured:
        # the champion's measurement, when the history does not carry it (a fresh ledger)
        of = {k: dists[k] for k in champion}
        study.add_trial(create_trial(params=champion, distributions=of, value=objective))
    return study, read


@dataclass
class History:
    """What ``study_of`` made of the history: the entries it skipped (their knobs
    are not the space's) and the values it left out of their trials (outside the domain now)."""

    skipped: int = 0
    #: each knob's values left out, as text
    left_out: dict[str, set[str]] = field(default_factory=dict)

    def fitted(self, space: KnobSpace, config: Mapping[str, object]) -> dict[str, Value] | None:
        """``config``'s params of the space's domains (a value outside its knob's domain left
        out, and said); ``None``: its knobs are not the space's (skipped, and counted)."""
        if set(config) != set(space.names):
            self.skipped += 1
            return None
        params: dict[str, Value] = {}
        for spec in space.knobs:
            try:
                params[spec.name] = spec.parse(config[spec.name])
            except KnobError:
                self.left_out.setdefault(spec.name, set()).add(printable(config[spec.name]))
        return params

    def notes(self) -> dict[str, str]:
        """What the proposal's notes say of it."""
        out = {}
        if self.skipped:
            out["skipped_history"] = f"{self.skipped} entries no longer fit the knob space"
        if self.left_out:
            values = "; ".join(
                f"{k}={', '.join(sorted(v))}" for k, v in sorted(self.left_out.items())
            )
            out["outside_domain"] = (
                f"values outside their knob's domain now, left out of TPE's model (each "
                f"config's other knobs kept): {values}"
            )
        return out


def as_params(space: KnobSpace, config: Mapping[str, object]) -> dict[str, Value] | None:
    """``config`` as typed values of the space's domains (TPE's floats rounded onto the grid),
    or ``None`` when it does not assign exactly the space's knobs or a value is outside."""
    if set(config) != set(space.names):
        return None
    try:
        return {spec.name: spec.parse(config[spec.name]) for spec in space.knobs}
    except KnobError:
        return None
