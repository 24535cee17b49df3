"""The round's baseline: the profile's champion as configured (``champion:``), booted and
measured when the cluster has no champion yet, and what its boot failing means.

A baseline that fails for the infrastructure's reasons (a node unreachable, a port another
process holds) is ``faults``'s, as any boot's: booted again after the backoff, then the round
stops (exit 5) with the baseline undecided, for the same command to resume. A baseline whose
failure is the config's and counts (``policy.config_failure``: it reproduced) is the profile's:
the user's own production config does not boot here, and no change can be judged against a
champion that has no measurement. Its ``crash`` verdict is recorded (results.tsv, MLflow and
the report have it) but bars nothing (``history``: a baseline moves no knob), the round stops
with one line saying what failed and what to fix in the profile (``BaselineFailed``, exit 3,
as a bad profile), and stays open: once ``champion:`` (or the launcher) is fixed, the same
command resumes it, and its next baseline is the champion as the profile says it then.
"""

from __future__ import annotations

from knobs.config import Config
from knobs.spec import as_text
from knobs.vocabulary import Kind, State, Status
from ledger import ExperimentRecord, Ledger
from orchestrator.errors import OrchestrateError
from orchestrator.profile import Profile


class BaselineFailed(OrchestrateError):
    """The champion as configured (the profile's ``champion:``) failed its boots for the
    config's own reasons: the profile's to fix, nothing to compare against. The round stops
    (exit 3, a bad profile), nothing barred, for the same command to resume once fixed."""

    exit_code = 3

    def __init__(self, message: str, *, experiment: int, failure_class: str) -> None:
        super().__init__(message)
        self.experiment = experiment
        self.failure_class = failure_class


def baseline_failed(
    profile: Profile, e: ExperimentRecord, round_id: int, failure_class: str, reason: str
) -> BaselineFailed:
    """The stop for baseline ``e`` of round ``round_id``, whose crash verdict says ``reason``
    (``policy.config_failure``'s: how often, the classes, the last boot's evidence)."""
    hint = knob_hint(profile, e.config, failure_class)
    return BaselineFailed(
        f"the profile's champion does not boot as configured: the baseline (experiment "
        f"#{e.id}) failed for the config's own reason ({failure_class}: {reason})"
        + ("" if hint is None else f"; {hint}")
        + f"; nothing was barred: fix champion: (or launcher:) in profile {profile.name} and "
        f"run the same command again to resume round {round_id}",
        experiment=e.id,
        failure_class=failure_class,
    )


def knob_hint(profile: Profile, config: Config, failure_class: str) -> str | None:
    """Which of the champion's values the failure points at: those of the knobs that declare
    ``failure_class`` monotone (``KnobSpec.monotone_failures``: ``kv_capacity`` below a memory
    fraction), with the side that may boot; ``None`` where no knob declares it."""
    said = []
    for spec in profile.space.knobs:
        side = spec.monotone_failures.get(failure_class)
        if side is None or spec.name not in config:
            continue
        way = "smaller" if side == "above" else "larger"
        said.append(f"a {way} {spec.name} than {as_text(config[spec.name])}")
    if not said:
        return None
    return f"{' or '.join(said)} may boot (its knob declares {failure_class} monotone)"


def crashed_baseline(ledger: Ledger, cluster: str) -> ExperimentRecord | None:
    """The cluster's last baseline, where its verdict is a crash and no champion came after
    it (``orchestrate status``: why there is no champion yet); else ``None``."""
    if ledger.champion(cluster) is not None:
        return None
    baselines = [e for e in ledger.experiments(cluster=cluster) if e.kind == Kind.BASELINE]
    if not baselines:
        return None
    last = baselines[-1]
    if last.state != State.DECIDED or last.status != Status.CRASH:
        return None
    return last
