"""The twin's performance model and ground truth (issue #3): landscapes as data, the equations'
effects, the trap, the optimum, the noise draws, the shared prompts."""

from __future__ import annotations

import json
import math
import random
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from cluster import prompts
from cluster.simulated import SimulatedTestbed
from cluster.twin import noise, text
from cluster.twin.landscape import Landscape, load_landscape, shipped
from knobs.catalog import catalog
from knobs.errors import ProfileError
from knobs.records import CellSpec
from tests.twin_fixtures import write_landscape

CHAMPION = {  # card 002's v5 champion
    "num_speculative_tokens": 7,
    "max_num_batched_tokens": 7168,
    "cuda_graphs": False,
    "drafter_adapter_rank": 64,
    "kv_cache_dtype": "fp8_e4m3",
    "gpu_memory_utilization": 0.85,
}
CARD_000 = (0.750, 0.555, 0.415, 0.316, 0.244, 0.193, 0.153)


@pytest.fixture(scope="module")
def tp4() -> Landscape:
    return load_landscape("vllm-dflash2-tp4")


def test_the_three_seed_stacks_ship_and_validate() -> None:
    # and the benchmark's landscapes unlike them (tests/test_landscapes.py)
    assert {"exl3-tp4", "sm121-2node", "vllm-dflash2-tp4"} <= set(shipped())
    for name in shipped():
        landscape = load_landscape(name)
        assert landscape.name == name
        assert [c.name for c in landscape.cells()] == [
            "code-c1",
            "prose-c8",
            "structured-c4",
            "agentic-c4-8k",
        ]
        assert landscape.knob_space().names == [k.name for k in catalog("vllm-dflash2")]
        assert (landscape.run_to_run, landscape.boot_to_boot) == (0.02, 0.05)


def test_accepted_per_step_is_one_plus_the_sum_of_positions(tmp_path: Path) -> None:
    flat = {c: list(CARD_000) for c in prompts.CATEGORIES}
    landscape = load_landscape(write_landscape(tmp_path, acceptance={"positions": flat}))
    cell = CellSpec(name="c", category="prose", concurrency=1)
    truth = landscape.truth(CHAMPION, cell)
    assert truth.per_position == CARD_000
    assert truth.accepted_per_step == pytest.approx(1 + sum(CARD_000)) == pytest.approx(3.626)
    k3 = landscape.truth({**CHAMPION, "num_speculative_tokens": 3}, cell)
    assert k3.accepted_per_step == pytest.approx(1 + 0.750 + 0.555 + 0.415)
    assert k3.acceptance_rate == pytest.approx((0.750 + 0.555 + 0.415) / 3)


def test_a_bigger_adapter_may_accept_more_and_draft_slower(tmp_path: Path) -> None:
    """``decode.adapter_rank_draft`` scales the drafter's share of a step by the adapter's
    rank: rank 128 accepts 7 % more per position and drafts 16 % slower, so its acceptance
    counters rise while its step lengthens by the drafter's share of it alone; ranks it does
    not name draft as before."""
    landscape = load_landscape(
        write_landscape(
            tmp_path,
            acceptance={"adapter_rank": {0: 1.0, 16: 1.0, 32: 1.0, 64: 1.0, 128: 1.07}},
            decode={"adapter_rank_draft": {128: 1.16}},
        )
    )
    plain = load_landscape("vllm-dflash2-tp4")
    cell = CellSpec(name="c", category="code", concurrency=1)
    big = {**CHAMPION, "drafter_adapter_rank": 128}
    before, after = landscape.truth(CHAMPION, cell), landscape.truth(big, cell)
    assert after.accepted_per_step > before.accepted_per_step
    assert before.step_s == plain.truth(CHAMPION, cell).step_s  # rank 64: not named
    d = landscape.decode
    k = 7  # the champion's K
    drafter_ms = d.draft_ms + d.draft_step_ms * k + d.draft_token_ms * k
    kv = d.kv_cache_dtype[str(CHAMPION["kv_cache_dtype"])].step  # the whole step's factor
    slower = 0.16 * drafter_ms * kv / 1000.0 / landscape.time_scale.run
    assert after.step_s - before.step_s == pytest.approx(slower)


def test_categories_rank_as_card_004_says(tp4: Landscape) -> None:
    accepted = {
        c: tp4.truth(CHAMPION, CellSpec(name="x", category=c, concurrency=1)).accepted_per_step
        for c in prompts.CATEGORIES
    }
    assert accepted["prose"] < accepted["agentic"] < accepted["code"] < accepted["structured"]
    assert accepted["structured"] > 6 and accepted["prose"] < 2.5


def test_stack_specific_effects(tp4: Landscape) -> None:
    exl3, sm121 = load_landscape("exl3-tp4"), load_landscape("sm121-2node")
    code1 = tp4.cells()[0]
    # CUDA graphs: -10..20 % on card 002's stack (away from the trap's K), +11..13 % on card 001's
    for k, cell in [(5, code1), (5, tp4.cells()[1])]:
        eager = tp4.truth({**CHAMPION, "num_speculative_tokens": k}, cell).steady_tok_s
        graphs = tp4.truth(
            {**CHAMPION, "num_speculative_tokens": k, "cuda_graphs": True}, cell
        ).steady_tok_s
        assert 0.80 <= graphs / eager <= 0.90
    eager = exl3.truth({**CHAMPION, "num_speculative_tokens": 2}, code1).steady_tok_s
    graphs = exl3.truth(
        {**CHAMPION, "num_speculative_tokens": 2, "cuda_graphs": True}, code1
    ).steady_tok_s
    assert 1.11 <= graphs / eager <= 1.14
    # card 001: K=2 is the best draft length single-stream on EXL3 (K1..K7 swept)
    by_k = {}
    for k in range(1, 8):
        truth = exl3.truth({**CHAMPION, "num_speculative_tokens": k, "cuda_graphs": True}, code1)
        if truth.valid:  # K=3 with graphs is the trap
            by_k[k] = truth.steady_tok_s
    assert max(by_k, key=lambda k: by_k[k]) == 2 and 3 not in by_k
    assert 29 <= by_k[2] / exl3.time_scale.run <= 34  # 31.7 tok/s single-stream (card 001)
    # the 8k-prefill cliff below MNBT 7168 (card 002), and nothing of it at short context
    agentic = tp4.cells()[3]
    assert (
        tp4.truth({**CHAMPION, "max_num_batched_tokens": 6656}, agentic).steady_tok_s
        < 0.6 * tp4.truth(CHAMPION, agentic).steady_tok_s
    )
    assert tp4.truth({**CHAMPION, "max_num_batched_tokens": 6656}, code1) == tp4.truth(
        CHAMPION, code1
    )
    # MNBT above 7168 costs decode under concurrency, not single-stream
    prose8 = tp4.cells()[1]
    assert (
        tp4.truth({**CHAMPION, "max_num_batched_tokens": 16384}, prose8).steady_tok_s
        < tp4.truth(CHAMPION, prose8).steady_tok_s
    )
    # the adapter rank has no served effect (card 002's proxy-eval trap)
    for rank in (0, 16, 32, 128):
        for cell in tp4.cells():
            assert (
                tp4.truth({**CHAMPION, "drafter_adapter_rank": rank}, cell).output_tok_s
                == tp4.truth(CHAMPION, cell).output_tok_s
            )
    # K must be 7 on the SM121 stack: anything else wedges the boot
    assert sm121.truth(CHAMPION, code1).boots
    for k in range(1, 7):
        truth = sm121.truth({**CHAMPION, "num_speculative_tokens": k}, code1)
        assert truth.wedges and not truth.boots and "num_speculative_tokens" in truth.reason
        assert sm121.objective({**CHAMPION, "num_speculative_tokens": k}) is None


def test_memory_utilisation_oom_and_kv_capacity(tp4: Landscape) -> None:
    cell = tp4.cells()[0]
    for memory in (0.89, 0.9, 0.95):
        truth = tp4.truth({**CHAMPION, "gpu_memory_utilization": memory}, cell)
        assert truth.ooms and truth.output_tok_s == 0
        assert tp4.objective({**CHAMPION, "gpu_memory_utilization": memory}) is None
    assert tp4.truth({**CHAMPION, "gpu_memory_utilization": 0.88}, cell).boots
    # a BF16 KV cache needs more memory for the same max_model_len than FP8
    assert tp4.truth({**CHAMPION, "gpu_memory_utilization": 0.75}, cell).boots
    low_bf16 = tp4.truth(
        {**CHAMPION, "gpu_memory_utilization": 0.75, "kv_cache_dtype": "auto"}, cell
    )
    assert low_bf16.status == "kv_capacity"


def test_trap_is_the_fastest_configuration_and_invalid(tp4: Landscape) -> None:
    trap = {**CHAMPION, "cuda_graphs": True}
    truth = tp4.truth(trap, tp4.cells()[0])
    assert truth.invalid and truth.boots and not truth.valid
    assert truth.per_position[0] == 1.0
    best = tp4.optimum()
    assert best["fastest_invalid"]["objective"] > best["objective"] * 1.1
    cell = tp4.cells()[0]
    prompt = prompts.build_prompt(cell.category, 0, 0).text
    assert text.greedy_text(prompt, 64, trap=True) != text.greedy_text(prompt, 64)
    assert (
        text.greedy_text(prompt, 16)
        == text.greedy_text(prompt, 64)[: len(text.greedy_text(prompt, 16))]
    )


def test_optimum_is_best_valid_and_consistent(tp4: Landscape) -> None:
    best = tp4.optimum()
    config = best["config"]
    assert tp4.objective(config) == pytest.approx(best["objective"])
    assert sum(c["output_tok_s"] for c in best["cells"]) == pytest.approx(best["objective"])
    assert all(tp4.truth(config, c).valid for c in tp4.cells())
    # the champion is near the top but not at it; one knob away there is better
    assert best["default"]["objective"] < best["objective"]
    rng = random.Random(7)
    space = tp4.knob_space()
    for _ in range(300):  # no random valid configuration beats it
        values = {k.name: rng.choice(k.domain()) for k in space.knobs}
        objective = tp4.objective(values)
        if objective is not None and not tp4.truth(values, tp4.cells()[0]).invalid:
            assert objective <= best["objective"] * (1 + 1e-9)
    assert best["counts"]["configs"] == math.prod(len(k.domain()) for k in space.knobs)


def test_optimum_cli_prints_ground_truth_json(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "cluster.twin", "optimum", "--landscape", "sm121-2node"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["landscape"] == "sm121-2node"
    assert data["config"]["num_speculative_tokens"] == 7
    assert [c["cell"] for c in data["cells"]] == [
        "code-c1",
        "prose-c8",
        "structured-c4",
        "agentic-c4-8k",
    ]
    assert data["objective"] == pytest.approx(
        load_landscape("sm121-2node").objective(data["config"])
    )
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "cluster.twin",
            "optimum",
            "--landscape",
            str(tmp_path / "nope.yaml"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert bad.returncode == 3 and bad.stdout == ""
    assert bad.stderr.startswith("Error: landscape ") and bad.stderr.count("\n") == 1


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.pop("decode"), "decode: Field required"),
        (lambda d: d["acceptance"]["positions"].update(code=[0.5, 0.9]), "acceptance cannot rise"),
        (
            lambda d: d["traps"].append({"when": {"cuda_graph": True}, "reason": "x"}),
            "unknown knob 'cuda_graph'",
        ),
        (lambda d: d["noise"].update(run_to_run=-0.1), "noise.run_to_run"),
        (
            lambda d: d["decode"].update(adapter_rank_draft={128: 0}),
            "decode.adapter_rank_draft.128",
        ),
    ],
)
def test_bad_landscapes_are_one_clear_line(tmp_path: Path, mutate: object, message: str) -> None:
    import yaml

    data = yaml.safe_load(
        (Path(__file__).parents[1] / "cluster/twin/landscapes/vllm-dflash2-tp4.yaml").read_text()
    )
    mutate(data)  # type: ignore[operator]
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ProfileError) as err:
        load_landscape(path)
    assert message in str(err.value) and "\n" not in str(err.value)
    assert str(path) in str(err.value)
    (tmp_path / "broken.yaml").write_text("name: [unclosed")
    with pytest.raises(ProfileError, match="cannot read YAML at line"):
        load_landscape(tmp_path / "broken.yaml")


def test_sample_spreads_as_the_landscape_says(tp4: Landscape) -> None:
    cell = tp4.cells()[1]
    truth = tp4.truth(CHAMPION, cell).output_tok_s
    rng = random.Random(1234)
    one_boot = [tp4.sample(CHAMPION, cell, rng).output_throughput / truth for _ in range(2000)]  # type: ignore[union-attr]
    spread = statistics.stdev(math.log(x) for x in one_boot)
    # run-to-run 2 % plus the acceptance noise (0.4 % on accepted draft tokens)
    assert 0.019 <= spread <= 0.023
    boots = []
    for _ in range(2000):
        factor = tp4.draw_boot_factor(rng)
        boots.append(tp4.sample(CHAMPION, cell, rng, boot_factor=factor).output_throughput / truth)  # type: ignore[union-attr]
    assert 0.050 <= statistics.stdev(math.log(x) for x in boots) <= 0.058
    assert 0.99 <= statistics.median(boots) <= 1.01
    record = tp4.sample(CHAMPION, cell, random.Random(1))
    assert record is not None and record.cell == cell.name and record.fingerprints
    trap = tp4.sample({**CHAMPION, "cuda_graphs": True}, cell, random.Random(1))
    assert trap is not None and trap.fingerprints.keys() == record.fingerprints.keys()
    assert all(trap.fingerprints[k] != record.fingerprints[k] for k in record.fingerprints)
    assert tp4.sample({**CHAMPION, "gpu_memory_utilization": 0.9}, cell, rng) is None


def test_noise_draws_are_reproducible() -> None:
    assert (
        noise.boot_factor(3, 2, 0.05)
        == noise.boot_factor(3, 2, 0.05)
        != noise.boot_factor(3, 3, 0.05)
    )
    assert noise.run_factors(3, 2, 1, 0.02, 0.004) != noise.run_factors(3, 2, 2, 0.02, 0.004)
    assert noise.boot_factor(3, 2, 0.0) == 1.0
    draws = [noise.boot_factor(0, b, 0.05) for b in range(4000)]
    assert 0.048 <= statistics.stdev(math.log(x) for x in draws) <= 0.052
    stuck = sum(noise.stuck_at_boot(0, r, b, 0.02) for r in range(4) for b in range(2500))
    assert 150 <= stuck <= 250  # 2 % of 10 000 node boots


def test_shared_prompts_round_trip() -> None:
    for category in prompts.CATEGORIES:
        for context in (0, 8192):
            for i in range(len(prompts.base_prompts(category))):
                p = prompts.build_prompt(category, context, i)
                assert prompts.count_tokens(p.text) == p.tokens == prompts.prompt_tokens(context)
                assert prompts.classify(p.text) == (category, i)
    assert (
        prompts.build_prompt("code", 0, 9).id == prompts.build_prompt("code", 0, 1).id == "code/1+0"
    )
    assert prompts.classify("The capital of France is") == ("prose", None)


def test_the_simulated_cluster_has_the_landscapes_stuck_clocks() -> None:
    """The research benchmark's cluster draws the landscape's stuck clocks: a boot with a node
    stuck reports that node's clocks and runs the whole group at its pace; the share of such
    boots is what the landscape's per-node probability implies (1 - (1 - p)^nodes)."""
    base = load_landscape("vllm-dflash2-tp4")
    quiet = base.without_noise()
    config = quiet.knob_space().default_config()
    cell = quiet.cells()[0]
    truth = quiet.truth(config.as_dict(), cell).output_tok_s

    always = quiet.model_copy(
        update={"noise": quiet.noise.model_copy(update={"stuck_clock_probability": 1.0})}
    )
    testbed = SimulatedTestbed(always, seed=3)
    testbed.deploy(config)
    record = testbed.bench(cell)
    rate = always.noise.stuck_clock_rate
    assert [c.matmul_rate for c in record.clocks] == [rate] * always.topology.nnodes
    assert math.isclose(record.output_throughput, truth * rate, rel_tol=1e-9)

    testbed = SimulatedTestbed(quiet, seed=3)
    testbed.deploy(config)
    record = testbed.bench(cell)
    assert [c.matmul_rate for c in record.clocks] == [1.0] * quiet.topology.nnodes
    assert math.isclose(record.output_throughput, truth, rel_tol=1e-9)

    testbed = SimulatedTestbed(base, seed=3)
    boots = 4000
    for _ in range(boots):
        testbed.deploy(config)
    expected = 1 - (1 - base.noise.stuck_clock_probability) ** base.topology.nnodes
    assert expected > 0.05
    assert abs(testbed.stuck_boots / boots - expected) < 4 * math.sqrt(expected / boots)
