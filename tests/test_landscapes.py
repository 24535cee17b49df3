"""The benchmark's landscapes unlike the seed cards (issue #18): each holds the structure its
top comment and docs/benchmarks.md describe, so a benchmark result on it means what it says."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
import yaml

from cluster.twin.landscape import Landscape, load_landscape, shipped
from knobs.catalog import catalog

SEED_STACKS = ("vllm-dflash2-tp4", "sm121-2node", "exl3-tp4")
NEW = ("flat-knobs-matter", "far-k", "trap-elsewhere", "flat")
#: The draft length the seed cards' TP4 DFlash2 stack runs (card 002's champion, the
#: catalog's default): far-k's best K must be far from it.
CARD_K = 7
#: The knobs the shipped landscapes put their greedy-output trap on (CUDA graphs with one K).
SHIPPED_TRAP_KNOBS = {"cuda_graphs", "num_speculative_tokens"}

_OPTIMA: dict[str, dict[str, Any]] = {}


def optimum(name: str) -> dict[str, Any]:
    """``optimum()`` of a shipped landscape, computed once for the module (it scores the
    whole knob space)."""
    if name not in _OPTIMA:
        _OPTIMA[name] = load_landscape(name).optimum()
    return _OPTIMA[name]


def default() -> dict[str, Any]:
    return {k.name: k.default for k in catalog("vllm-dflash2")}


def effects(land: Landscape, knob: str, base: dict[str, Any]) -> dict[Any, float]:
    """Every other bootable value of ``knob`` against ``base``: the noise-free objective
    change, %."""
    here = land.objective(base)
    assert here is not None
    spec = next(k for k in land.knob_space().knobs if k.name == knob)
    out = {}
    for value in spec.domain():
        if value == base[knob]:
            continue
        there = land.objective({**base, knob: value})
        if there is not None:
            out[value] = 100 * (there / here - 1)
    return out


def test_every_shipped_landscape_loads_on_the_catalog_with_default_noise() -> None:
    assert set(SEED_STACKS) | set(NEW) == set(shipped())
    for name in shipped():
        land = load_landscape(name)
        assert land.name == name
        assert land.knob_space().names == [k.name for k in catalog("vllm-dflash2")]
        assert (land.run_to_run, land.boot_to_boot, land.acceptance_noise) == (0.02, 0.05, 0.004)


@pytest.mark.parametrize("name", NEW)
def test_new_landscapes_have_a_valid_optimum_above_the_default(name: str) -> None:
    best = optimum(name)
    land = load_landscape(name)
    objective = land.objective(best["config"])
    assert objective is not None and best["objective"] == objective > 0
    assert all(not land.truth(best["config"], c).invalid for c in land.cells())
    assert best["default"]["objective"] <= best["objective"]


def test_flat_every_one_knob_change_is_under_one_percent() -> None:
    land = load_landscape("flat")
    for knob in land.knob_space().names:
        moved = effects(land, knob, default())
        assert moved and all(abs(e) < 1.0 for e in moved.values()), (knob, moved)
    assert optimum("flat")["objective"] < 1.01 * optimum("flat")["default"]["objective"]


def test_far_k_best_k_is_far_from_the_cards_and_the_curve_has_one_peak() -> None:
    best_k = optimum("far-k")["config"]["num_speculative_tokens"]
    assert abs(best_k - CARD_K) >= 3
    by_k = effects(load_landscape("far-k"), "num_speculative_tokens", default())
    ks = sorted(by_k)
    peak = max(ks, key=lambda k: by_k[k])
    assert peak == best_k
    assert all(by_k[a] < by_k[b] for a, b in itertools.pairwise(ks) if b <= peak)
    assert all(by_k[a] > by_k[b] for a, b in itertools.pairwise(ks) if a >= peak)


def test_trap_elsewhere_traps_on_its_declared_knob_next_to_a_real_gain() -> None:
    land = load_landscape("trap-elsewhere")
    assert all(
        set(t.when) <= SHIPPED_TRAP_KNOBS for s in SEED_STACKS for t in load_landscape(s).traps
    )
    assert [set(t.when) for t in land.traps] == [{"drafter_adapter_rank", "kv_cache_dtype"}]
    trap = optimum("trap-elsewhere")["fastest_invalid"]["config"]
    assert (trap["drafter_adapter_rank"], trap["kv_cache_dtype"]) == (128, "fp8_e5m2")

    def invalid(config: dict[str, Any]) -> bool:
        return any(land.truth(config, c).invalid for c in land.cells())

    # the region is the declared knob's value: moving it leaves the trap, moving K or graphs not
    assert all(not invalid({**trap, "drafter_adapter_rank": r}) for r in (0, 16, 32, 64))
    assert all(invalid({**trap, "num_speculative_tokens": k}) for k in range(1, 8))
    assert invalid({**trap, "cuda_graphs": not trap["cuda_graphs"]})
    # the real gain: rank 128 from the default, and the optimum one KV change from the trap
    assert 5.0 < effects(land, "drafter_adapter_rank", default())[128] < 12.0
    assert optimum("trap-elsewhere")["config"] == {**trap, "kv_cache_dtype": "auto"}


def test_flat_knobs_matter_moves_mnbt_and_rank_not_k_or_graphs() -> None:
    land = load_landscape("flat-knobs-matter")
    base = default()
    assert 8.0 <= max(effects(land, "max_num_batched_tokens", base).values()) <= 12.0
    assert 8.0 <= max(effects(land, "drafter_adapter_rank", base).values()) <= 12.0
    assert max(effects(land, "num_speculative_tokens", base).values()) < 0  # K=7 is best
    assert abs(effects(land, "cuda_graphs", base)[True]) < 1.0
    best = optimum("flat-knobs-matter")["config"]
    assert (best["num_speculative_tokens"], best["drafter_adapter_rank"]) == (7, 128)
    assert best["max_num_batched_tokens"] != base["max_num_batched_tokens"]


def test_holdout_drafter_adapter_counters_mislead() -> None:
    """``bench/landscapes/holdout-drafter.yaml``, written to check the verdict where the
    acceptance counters mislead: rank 128 accepts more per step and loses, rank 0 accepts less
    and gains (a bigger adapter drafts slower), so a verdict that took the counters at their
    word would keep the loss and discard the gain."""
    path = Path(__file__).parent.parent / "bench" / "landscapes" / "holdout-drafter.yaml"
    land = Landscape.model_validate(yaml.safe_load(path.read_text()))
    base = default()
    rank = effects(land, "drafter_adapter_rank", base)
    cells = land.cells()

    def accepted(config: dict[str, Any]) -> float:
        return sum(land.truth(config, c).accepted_per_step for c in cells)

    assert accepted({**base, "drafter_adapter_rank": 128}) > accepted(base)
    assert -3.0 < rank[128] < 0.0
    assert accepted({**base, "drafter_adapter_rank": 0}) < accepted(base)
    assert rank[0] > 3.0
    assert effects(land, "cuda_graphs", base)[True] > 4.0
