"""``orchestrate known-bad list`` under a profile changed since a region was barred: the region
is the experiment's config fitted to the profile of now (``evolution``), and the list says how
the experiment ran otherwise (the review's C: a region named `omp_threads=2`, a knob that did
not exist then, and left out the `kv_cache_dtype` it ran, unmarked)."""

from __future__ import annotations

from pathlib import Path

from agents import SweepProposer
from ledger import Ledger
from orchestrator.cli.known_bad import _as_json, _row
from orchestrator.known_bad import barred_regions
from orchestrator.profile import Profile
from tests.test_profile_evolution import profile_data
from tests.test_profile_evolution_under_way import K, round_of, with_foo


def test_a_region_barred_before_the_profile_changed_says_how_it_ran(tmp_path: Path) -> None:
    # K=4's greedy texts differ: invalid, a region of its whole config (foo 5 with it)
    round_of(
        tmp_path,
        with_foo(),
        1,
        SweepProposer([{K: 4}]),
        text=lambda config: "other" if config[K] == 4 else "same",
    )
    then = Profile.model_validate(with_foo())
    now = Profile.model_validate(profile_data())  # foo dropped since
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        [same] = barred_regions(then, ledger)
        [fitted] = barred_regions(now, ledger)
    assert same.region.source == "invalid" and same.as_it_ran == "", same
    assert "foo" not in fitted.region.region(), fitted.region.region()
    assert fitted.as_it_ran == "fitted to the profile of now; it ran foo=5", fitted.as_it_ran
    assert _row(fitted)[2].endswith(" (fitted to the profile of now; it ran foo=5)"), _row(fitted)
    assert _as_json(fitted)["as_it_ran"] == fitted.as_it_ran
