"""The profiles of the real stacks (seed cards 000, 001, 002) cannot boot here: no Spark, no
GPU, no docker. What they render can be checked, as text, and by running the rendered launcher
with a ``docker`` that only records what it was given."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from cluster.connect import open_transport
from cluster.launcher import (
    fill,
    journaled,
    memory_command,
    placeholders,
    render_node,
    start_command,
    stop_command,
)
from cluster.ssh import SshTransport
from knobs.errors import KnobError
from orchestrator.profile import Profile, load_profile
from orchestrator.profile_names import embedded_profiles
from orchestrator.settings import runtime_placeholders

REAL = ["vllm-dflash2-tp4", "sm121-2node", "exl3-tp4"]

DOCKER = (
    "docker run --rm --name {name} --network host --ipc host --gpus all "
    "-v /models:/models:ro {mounts}-e VLLM_HOST_IP -e NCCL_SOCKET_IFNAME -e GLOO_SOCKET_IFNAME "
    "-e VLLM_ENGINE_READY_TIMEOUT_S --entrypoint vllm {image} serve "
)
MULTINODE = (
    "--nnodes {n} --node-rank {rank} --master-addr 192.168.100.11 --master-port 29520 "
    "--distributed-executor-backend mp "
)
HEAD = "--host 0.0.0.0 --port 8000 "
WORKER = "--headless "

#: profile → (rank → the exact command line its launcher execs for the champion)
GOLDEN: dict[str, dict[int, str]] = {
    # card 002, v5: --enforce-eager, MNBT 7168, DFlash K=7 with the card's drafter, KV fp8_e4m3
    "vllm-dflash2-tp4": {
        rank: DOCKER.format(name="glm53-tp4", mounts="", image="vllm-glm53-sm121:v5")
        + "/models/GLM-5.3-Flash --served-model-name glm53 --tensor-parallel-size 4 "
        + MULTINODE.format(n=4, rank=rank)
        + "--block-size 64 --max-model-len 262144 --no-enable-prefix-caching "
        "--moe-backend marlin "
        + (HEAD if rank == 0 else WORKER)
        + "--max-num-batched-tokens 7168 --enforce-eager --kv-cache-dtype fp8_e4m3 "
        "--gpu-memory-utilization 0.85 --speculative-config "
        """'{"method":"dflash","num_speculative_tokens":7,"""
        """"model":"/models/GLM-5.3-Flash-DFlash2-TP4-Spark"}'"""
        for rank in (0, 1, 2, 3)
    },
    # card 000: its serve line, TP2 over two nodes, the -F drafter bind-mounted, K=7
    "sm121-2node": {
        rank: DOCKER.format(
            name="glm53-tp2",
            mounts="-v /models/GLM-5.3-Flash-DFlash2-F:/models/GLM-5.3-Flash-DFlash2-F:ro ",
            image="canada-quant/vllm-glm53-flash-sm121:latest",
        )
        + "/models/glm53-flash-w4a16-mtp --served-model-name glm53 --tensor-parallel-size 2 "
        "--enable-expert-parallel "
        + MULTINODE.format(n=2, rank=rank)
        + "--block-size 64 --no-enable-prefix-caching "
        + (HEAD if rank == 0 else WORKER)
        + "--max-num-batched-tokens 8192 --kv-cache-dtype auto --gpu-memory-utilization 0.85 "
        """--speculative-config '{"method":"dflash","num_speculative_tokens":7,"""
        """"model":"/models/GLM-5.3-Flash-DFlash2-F"}'"""
        for rank in (0, 1)
    },
    # card 001: the EXL3 fork, K=2, CUDA graphs on (no --enforce-eager), the TR3-v3 drafter
    "exl3-tp4": {
        rank: DOCKER.format(name="glm53-exl3-tp4", mounts="", image="vllm-exl3-sm121:tr3")
        + "/models/GLM-5.3-Flash-EXL3-TR3 --served-model-name glm53 --quantization exl3 "
        "--tensor-parallel-size 4 "
        + MULTINODE.format(n=4, rank=rank)
        + "--max-model-len 262144 --no-enable-prefix-caching "
        + (HEAD if rank == 0 else WORKER)
        + "--max-num-batched-tokens 8192 --kv-cache-dtype auto --gpu-memory-utilization 0.85 "
        """--speculative-config '{"method":"dflash","num_speculative_tokens":2,"""
        """"model":"/models/GLM-5.3-Flash-DFlash2-TR3-v3"}'"""
        for rank in (0, 1, 2, 3)
    },
}


def launchers(profile: Profile, **changes: object) -> dict[int, str]:
    """rank → rendered launcher script of the champion (with ``changes`` applied)."""
    config = profile.initial_champion()
    for knob, value in changes.items():
        config = config.apply(profile.space.change(config, knob, value))
    return {
        n.rank: render_node(
            profile.launcher, profile.space, config, profile.cluster, n, runtime_placeholders()
        ).script
        for n in profile.cluster.nodes
    }


def exec_line(script: str) -> str:
    """The command the script execs, as one shell line."""
    body = script[script.index("\nexec ") + len("\nexec ") :]
    return body.replace(" \\\n  ", " ").strip()


def test_the_real_profiles_ship_with_the_package() -> None:
    assert set(REAL) <= set(embedded_profiles())


@pytest.mark.parametrize("name", REAL)
def test_each_rank_renders_the_cards_command_line(name: str) -> None:
    profile = load_profile(name)
    scripts = launchers(profile)
    assert set(scripts) == set(GOLDEN[name])
    for rank, script in scripts.items():
        assert exec_line(script) == GOLDEN[name][rank], (name, rank)
        node = profile.cluster.by_rank(rank)
        assert f"export VLLM_HOST_IP={node.host}\n" in script
        assert "export NCCL_SOCKET_IFNAME=enP7s7\n" in script
        assert "export GLOO_SOCKET_IFNAME=enP7s7\n" in script
        assert "export VLLM_ENGINE_READY_TIMEOUT_S=3600\n" in script
        assert f"cd {node.workdir}\n" in script
        assert not re.search(r"\{[a-z_]+\}", script), "a placeholder was left unfilled"
        check = subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True)
        assert check.returncode == 0, check.stderr


@pytest.mark.parametrize("name", REAL)
def test_docker_receives_exactly_the_rendered_words_and_environment(
    name: str, tmp_path: Path
) -> None:
    """Run the head's and the last worker's launcher with a ``docker`` that records its argv
    and the environment it would pass into the container (``-e NAME``)."""
    profile = load_profile(name)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "docker"
    fake.write_text(
        "#!/usr/bin/env python3\n"
        "import json, os, sys\n"
        "names = [a for p, a in zip(sys.argv, sys.argv[1:]) if p == '-e']\n"
        "print(json.dumps({'argv': sys.argv[1:], 'env': {k: os.environ.get(k) for k in names}}))\n"
    )
    fake.chmod(0o755)
    last = max(n.rank for n in profile.cluster.nodes)
    for rank, script in launchers(profile).items():
        if rank not in (0, last):
            continue
        node = profile.cluster.by_rank(rank)
        local = script.replace(f"cd {node.workdir}\n", f"cd {tmp_path}\n")
        done = subprocess.run(
            ["bash", "-c", local],
            env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"},
            capture_output=True,
            text=True,
            check=True,
        )
        seen = json.loads(done.stdout)
        assert seen["argv"] == shlex.split(GOLDEN[name][rank])[1:]
        assert seen["env"] == {
            "VLLM_HOST_IP": node.host,
            "NCCL_SOCKET_IFNAME": "enP7s7",
            "GLOO_SOCKET_IFNAME": "enP7s7",
            "VLLM_ENGINE_READY_TIMEOUT_S": "3600",
        }
        spec = json.loads(seen["argv"][seen["argv"].index("--speculative-config") + 1])
        assert spec["method"] == "dflash"


def test_v5_knobs_render_as_the_card_describes() -> None:
    profile = load_profile("vllm-dflash2-tp4")
    graphs = exec_line(launchers(profile, cuda_graphs=True)[0])
    assert "--enforce-eager" not in graphs
    vendor = exec_line(launchers(profile, drafter_adapter_rank=0)[2])
    assert '"model":"/models/GLM-5.3-Flash-DFlash2"}' in vendor
    k3 = exec_line(launchers(profile, num_speculative_tokens=3)[1])
    assert '"num_speculative_tokens":3' in k3


def test_card_000_fixes_k_at_7_and_card_001_starts_at_k_2() -> None:
    sm121 = load_profile("sm121-2node")
    with pytest.raises(KnobError):
        sm121.space.change(sm121.initial_champion(), "num_speculative_tokens", 5)
    assert sm121.initial_champion()["num_speculative_tokens"] == 7
    exl3 = load_profile("exl3-tp4")
    assert exl3.initial_champion()["num_speculative_tokens"] == 2
    assert exl3.initial_champion()["cuda_graphs"] is True


@pytest.mark.parametrize("name", REAL)
def test_gates_stops_and_ssh_of_the_real_profiles(name: str) -> None:
    profile = load_profile(name)
    gates = profile.gates
    assert profile.restore_champion is True
    assert profile.approve.mode == "ask"
    head = profile.cluster.head
    values = placeholders(profile.cluster, head, runtime_placeholders())
    container = head.vars["container"]
    # every rank runs the same container name (DOMAIN: a boot-log gate people use)
    assert {n.vars["container"] for n in profile.cluster.nodes} == {container}
    assert gates.stop_hook is not None
    hook = [fill(t, values, "stop hook") for t in gates.stop_hook]
    assert hook[:2] == ["bash", "-c"]
    assert hook[2].startswith(f"docker stop -t 30 '{container}' ")
    assert "drop_caches" in hook[2]
    assert gates.interface is not None and fill(gates.interface, values, "iface") == "enP7s7"
    assert gates.clocks_command is not None
    clocks = [fill(t, values, "clocks") for t in gates.clocks_command]
    docker = ["docker", "run", "--rm", "--gpus", "all", "--entrypoint", "python3"]
    assert clocks[:8] == [*docker, head.vars["image"]]
    assert clocks[-1].endswith("matmul_rate=r/100)))")
    compile(clocks[-1].replace(";", "\n"), "clocks", "exec")
    if name != "exl3-tp4":
        assert any("mask_token_id 154856" in p for p in gates.must_log)
    assert gates.boot_timeout_s >= 900 and gates.poll_s >= 20
    # the SSH side: aliases from ~/.ssh/config, strict keys, nothing connected by loading
    for node in profile.cluster.nodes:
        assert node.transport == "ssh" and node.ssh is not None
        assert node.ssh.host == f"spark-{node.rank + 1}"
        transport = open_transport(node, profile.cluster.ssh)
        assert isinstance(transport, SshTransport) and transport.connections == 0
    # what the deployer sends a node to start and stop it, quoted for its shell
    start = journaled(head, start_command(head), "start")
    assert start[:2] == ["bash", "-c"] and shlex.quote(head.workdir) in start[2]
    stop = journaled(head, stop_command(head, gates.stop_grace_s), "stop")
    assert "kill -TERM" in stop[2] and "engine.events" in stop[2]
    assert memory_command(5, 512, 300)[2].count("seq 61") == 1
