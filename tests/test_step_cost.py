"""The draft length's verdict null (``orchestrator.step_cost``): its counters' shift less the
step cost this cluster's K changes taught; the law's ``γ`` and its error learned from the
ledger, on constructed changes and a real SQLite ledger."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from agents.draft_model import GAMMA_PRIOR
from knobs import KnobSpace, catalog
from knobs.spec import EffectPrior
from knobs.vocabulary import Kind, Status
from ledger import Ledger, VerdictRecord
from orchestrator.noise import NoiseModel
from orchestrator.priors import MEASURING
from orchestrator.profile_sections import VerdictSpec
from orchestrator.step_cost import (
    LAW_HOLDS,
    MODEL_ERROR,
    DraftChange,
    draft_changes,
    fit,
    law_null,
    step_cost,
)
from orchestrator.verdict import Evidence, assess
from tests.fixtures.cli import orchestrate
from tests.fixtures.profiles import twin_profile_data, write_profile
from tests.fixtures.rounds import a_round
from tests.test_verdict_acceptance import cell

STACK_GAMMA = 0.25  # a stack whose draft tokens cost far more than the prior's 0.07


def law(base: int, value: int, gamma: float = STACK_GAMMA) -> float:
    return float(step_cost(gamma, base, value))


def test_the_step_cost_is_learned_from_the_k_changes_measured() -> None:
    """Three K changes, under two champions, each measured beyond its counters by exactly the
    law at γ 0.25 (one boot a side): the posterior's γ is the stack's, not the prior's, and the
    null of K 7 → 3 is the counters' shift less that stack's step cost, to a few percent."""
    changes = [
        DraftChange(base, value, -law(base, value), 0.07)
        for base, value in ((7, 4), (7, 5), (4, 2))
    ]
    posterior = fit(changes)
    assert posterior.gamma == pytest.approx(STACK_GAMMA, abs=0.08)
    assert abs(posterior.gamma - GAMMA_PRIOR) > 0.1
    shift = math.log(0.85)  # the counters: K=3 accepts 15 % fewer tokens per step than K=7
    null = law_null((shift, 0.004), 7, 3, changes)
    assert null is not None
    assert null[0] == pytest.approx(shift - law(7, 3), abs=0.03)
    assert abs(null[0] - (shift - law(7, 3, GAMMA_PRIOR))) > 0.15  # the prior's law is far
    assert null[1] < 0.08  # three boots of γ: still as wide as a boot or so
    assert law_null((shift, 0.004), 7, 3, []) is None  # nothing measured: no law to offer
    assert law_null((shift, 0.004), 7, 7, changes) is None


def test_the_laws_error_is_learned_from_its_residuals() -> None:
    """Twelve K changes the law describes exactly leave its error at the prior's; twelve that
    scatter ±10 % around it (a stack whose step is not linear in K) teach an error of several
    percent, and the null widens with it."""
    pairs = [(7, 4), (7, 5), (4, 2), (5, 3), (2, 4), (3, 6)] * 2
    exact = [DraftChange(b, v, -law(b, v), 0.035) for b, v in pairs]
    scattered = [
        DraftChange(b, v, -law(b, v) + (0.1 if i % 2 else -0.1), 0.035)
        for i, (b, v) in enumerate(pairs)
    ]
    assert fit(exact).error < 2 * MODEL_ERROR
    assert fit(scattered).error > 0.06
    tight, wide = (law_null((0.0, 0.004), 7, 3, c) for c in (exact, scattered))
    assert tight is not None and wide is not None and wide[1] > 3 * tight[1]


SPEC = VerdictSpec()
NOISE = NoiseModel(boot_cv=0.05, run_cv=0.02, boot_dof=0, run_dof=0)
K_PRIOR = EffectPrior(p_null=0.05, effect_pct=15.0)


def _evidence(reading: list[float], null: tuple[float, float] | None) -> Evidence:
    return Evidence(
        candidate=reading,
        champion=[100.0, 104.0, 96.0],
        confirmations=max(0, len(reading) - 2),
        candidate_cells=[cell("code", reading[-1], 3.0)],
        champion_cells=[cell("code", 100.0, 3.0)],
        acceptance=null,
        null_from="draft law",
        counters=(math.log(0.8), 0.004),
        held=7,
    )


def test_a_k_change_the_law_explains_is_kept_where_its_throughput_alone_is_undecided() -> None:
    """K 7 → 4: its counters less the learned step cost say +10 % ± 1.5 %; three boots read
    +6 % at 5 % boot noise. Judged on throughput alone, with K's own prior, the verdict wants
    more boots; with the law as its null, the reading is what the law predicts: kept. The
    record names the law's shift apart from the counters' own."""
    reading = [106.0, 110.0, 102.0]
    alone = assess(SPEC, _evidence(reading, None), NOISE, K_PRIOR)
    assert alone.status != Status.KEEP
    prior = EffectPrior(p_null=LAW_HOLDS, effect_pct=15.0)
    null = (math.log(1.10), 0.015)
    judged = assess(SPEC, _evidence(reading, null), NOISE, prior)
    assert judged.status == Status.KEEP, judged.reason
    assert judged.stats["law_shift"] == pytest.approx(math.log(1.10))
    assert "acceptance_shift" not in judged.stats  # the priors' "beyond" reads the counters' null
    assert judged.stats["counters_shift"] == pytest.approx(math.log(0.8))
    assert judged.stats["from_value"] == 7
    assert "counters less the step cost say +10.0%" in judged.reason
    # a reading the law cannot explain (−12 %) is not kept on the law's word
    denied = assess(SPEC, _evidence([88.0, 90.0, 86.0], null), NOISE, prior)
    assert denied.status == Status.DISCARD, denied.reason


def _ledger_with_k_changes(path: Path, cluster: str) -> int:
    """A SQLite ledger at ``path`` whose cluster ``cluster`` decided one K change with its
    counters and the K it changed from recorded, one of an older release (none recorded), one
    undecided, and a change of another knob with counters: the champion's K, returned."""
    space = KnobSpace(knobs=catalog("vllm-dflash2"))
    ledger = Ledger(f"sqlite:///{path}")
    with ledger:
        rnd = a_round(ledger, cluster)
        base = space.default_config()
        held = base.as_dict()[KNOB]
        assert isinstance(held, int)
        recorded = {"g": 0.05, "se": 0.07, "counters_shift": -0.1, "counters_se": 0.004}
        recorded.update(boot_cv=0.05, champion_boots=2)
        cases: list[tuple[str, int, dict[str, object] | None]] = [
            (KNOB, held - 2, {**recorded, "from_value": held}),
            (KNOB, held - 1, {"g": 0.02, "se": 0.07}),  # an older release's verdict
            (KNOB, held - 3, None),  # not decided yet
            ("max_num_batched_tokens", 4096, {**recorded, "from_value": 8192}),
        ]
        for name, value, stats in cases:
            e = ledger.add_experiment(
                cluster=cluster,
                round_id=rnd.id,
                kind=Kind.CANDIDATE,
                config=base.apply(space.change(base, name, value)),
                champion_key=base.key,
                champion_objective=100.0,
                knob=name,
                value=value,
            )
            if stats is not None:
                ledger.decide(
                    e.id,
                    verdict=VerdictRecord(
                        status=Status.DISCARD, rule="posterior", reason="r", stats=stats
                    ),
                    objective=100.0,
                    delta_pct=0.0,
                    accept_len=None,
                )
    return held


KNOB = "num_speculative_tokens"


def test_the_ledger_teaches_the_law_only_what_its_verdicts_recorded(tmp_path: Path) -> None:
    """K changes decided with their counters and the K they changed from recorded teach the
    law; a verdict of an older release (no counters recorded), an undecided one and a change
    of another knob do not. ``orchestrate status`` shows the step cost in force."""
    assert KnobSpace(knobs=catalog("vllm-dflash2")).spec(KNOB).role == "draft_tokens"
    held = _ledger_with_k_changes(tmp_path / "ledger.db", "c")
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        changes = draft_changes(ledger, ledger.experiments(cluster="c"), KNOB, MEASURING)
    assert [(c.base, c.value) for c in changes] == [(held, held - 2)]
    assert changes[0].residual == pytest.approx(0.15)
    assert changes[0].se == pytest.approx(math.hypot(0.07, 0.004))
    assert changes[0].shared == pytest.approx(0.05**2 / 2)


def test_status_shows_the_step_cost_in_force(tmp_path: Path) -> None:
    """``orchestrate status`` on a ledger with one K change measured with its counters: the
    step cost the verdict subtracts, fitted to it, in the JSON and on screen."""
    data = twin_profile_data()
    profile = write_profile(tmp_path, data)
    _ledger_with_k_changes(tmp_path / "orchestrate.db", data["cluster"]["name"])
    env = {**os.environ, "ORCHESTRATE_LEDGER": f"sqlite:///{tmp_path}/orchestrate.db"}
    shown = orchestrate(tmp_path, "status", "--profile", str(profile), "--json", env=env)
    assert shown.returncode == 0, shown.stderr
    step = json.loads(shown.stdout)["step_cost"]
    assert step["knob"] == KNOB and step["n"] == 1
    assert step["gamma"] > 0 and step["gamma_sd"] > 0 and step["error"] > 0
    plain = orchestrate(tmp_path, "status", "--profile", str(profile), env=env)
    assert plain.returncode == 0, plain.stderr
    said = " ".join(plain.stdout.split())
    assert f"step cost of {KNOB} (its verdicts' null): γ {step['gamma']:.3f}" in said
    assert "from 1 K change(s) measured with their counters" in said


def test_a_round_judges_k_with_the_law_where_it_has_no_neighbours(tmp_path: Path) -> None:
    """K 6, 5 and 4 from the default champion (K 7) on the simulated stack whose best K is far
    from the card's (seed 19: K 6 stopped for want of boots, open for a second look, K 5 kept):
    K 6, the first, is judged as any change and records its counters and the K it changed
    from; K 5 has K 6 beside it under the same champion and is judged with it (pooling), not
    the law; K 4, the first K change under K 5, has no neighbour and is judged with the law
    fitted to K 6 and 5: its null is its counters less the step cost."""
    from tests.test_pooling import sweep_round

    judged, verdicts = sweep_round(tmp_path, "num_speculative_tokens", (6, 5, 4), seed=19)
    assert [e.value for e in judged] == [6, 5, 4]
    assert [e.status for e in judged][:2] == [Status.INCONCLUSIVE, Status.KEEP]
    assert "open for a second look" in judged[0].description
    first, second, third = verdicts
    assert first is not None and "law_shift" not in first.stats, first
    assert first.stats["from_value"] == 7
    assert isinstance(first.stats["counters_shift"], float)
    assert first.stats["counters_shift"] < 0  # six draft tokens accept fewer than seven
    assert second is not None and second.stats["pooled_values"] == 1, second
    assert "law_shift" not in second.stats
    assert third is not None and isinstance(third.stats["law_shift"], float), third
    assert third.stats["from_value"] == 5 and "pooled_values" not in third.stats
    assert "counters less the step cost say" in third.reason
