"""The twin engine as a process (issue #3): vLLM's command line and HTTP surface, multi-node
semantics, boot failures, the trap, stuck clocks. Real processes, real HTTP on 127.0.0.1."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from cluster.bench import smoke
from cluster.errors import BenchError
from cluster.metrics import busy_requests, parse_metrics, scrape_metrics
from cluster.prompts import build_prompt
from cluster.twin import MASK_EMBEDDING_LINE, models_dir, node
from cluster.twin.landscape import load_landscape
from cluster.twin.rendezvous import SILENT_S
from cluster.twin.serve import rendezvous_window
from tests.twin_fixtures import (
    HEAD_READY_LINE,
    WORKER_READY_LINE,
    TwinNodes,
    free_port,
    health,
    running_nodes,
    serve_argv,
    write_landscape,
)

TWIN = [sys.executable, "-m", "cluster.twin"]


def run_twin(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*TWIN, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, **(env or {})},
    )


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[TwinNodes]:
    """Twin engines for one test, all stopped at its end."""
    with running_nodes(tmp_path) as started:
        yield started


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["/m", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
        (["/m", "--speculative-config", "{not json"], "argument --speculative-config"),
        (
            ["/m", "--speculative-config", '{"method": "dflash", "num_speculative_tokens": 0}'],
            "num_speculative_tokens",
        ),
        (["/m", "--gpu-memory-utilization", "lots"], "argument --gpu-memory-utilization"),
        (["/m", "--kv-cache-dtype", "int3"], "argument --kv-cache-dtype: invalid choice"),
        (["/m", "--nnodes", "2", "--node-rank", "2"], "argument --node-rank"),
        ([], "the following arguments are required: model"),
    ],
)
def test_malformed_command_lines_fail_like_argparse(argv: list[str], message: str) -> None:
    result = run_twin("serve", *argv)
    assert result.returncode == 2
    assert result.stderr.startswith("usage: vllm serve")
    assert message in result.stderr
    assert result.stdout == ""


def test_boot_health_models_completions_metrics_and_sigterm(nodes: TwinNodes) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    # boot at the landscape's own pace so the loading phase lasts long enough to look at
    head = nodes.start(serve_argv(port=port), name="head", TWIN_BOOT_SCALE="500")
    head.wait_for(r"Started server process")
    assert health(url) == 503
    models = httpx.get(url + "/v1/models", trust_env=False).json()
    assert models["data"][0]["id"] == "glm53" and models["data"][0]["max_model_len"] == 262144
    early = httpx.post(
        url + "/v1/completions", json={"model": "glm53", "prompt": "x"}, trust_env=False
    )
    assert early.status_code == 503
    head.wait_for(HEAD_READY_LINE)
    assert health(url) == 200
    for line in (
        "node_rank=0",
        MASK_EMBEDDING_LINE.replace("\\", ""),
        "Cudagraph is disabled under eager mode",
    ):
        assert line.split("(")[0] in head.log

    text = smoke(url, "glm53", "The capital of France is", 8)
    assert len(text.split()) == 8 and text == smoke(url, "glm53", "The capital of France is", 8)
    # streaming chat, usage at the end, and the same greedy text as the completion
    prompt = build_prompt("code", 0, 2).text
    body = {
        "model": "glm53",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": 20,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    pieces, usage = [], None
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, trust_env=False) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    for line in lines[:-1]:
        chunk = json.loads(line.removeprefix("data: "))
        assert chunk["object"] == "chat.completion.chunk"
        if chunk["choices"]:
            pieces.append(chunk["choices"][0]["delta"].get("content", ""))
        else:
            usage = chunk["usage"]
    assert usage == {"prompt_tokens": 64, "total_tokens": 84, "completion_tokens": 20}
    assert "".join(pieces) == smoke(url, "glm53", prompt, 20)

    wrong = httpx.post(
        url + "/v1/completions", json={"model": "gpt-4", "prompt": "x"}, trust_env=False
    )
    assert wrong.status_code == 404 and "does not exist" in wrong.json()["error"]["message"]
    metrics = scrape_metrics(url)
    for name in (
        "vllm:spec_decode_num_drafts_total",
        "vllm:spec_decode_num_draft_tokens_total",
        "vllm:spec_decode_num_accepted_tokens_total",
        "vllm:num_requests_running",
        "vllm:generation_tokens_total",
    ):
        assert name in metrics, name
    assert (
        metrics["vllm:spec_decode_num_draft_tokens_total"]
        == 7 * metrics["vllm:spec_decode_num_drafts_total"]
        > 0
    )
    per_pos = [
        metrics[
            f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="glm53",position="{i}"}}'
        ]
        for i in range(7)
    ]
    assert sum(per_pos) == metrics["vllm:spec_decode_num_accepted_tokens_total"]
    assert metrics["vllm:generation_tokens_total"] == 8 + 8 + 20 + 20

    start = time.monotonic()
    head.signal(signal.SIGTERM)
    # shut down cleanly, then dead of the signal, as uvicorn re-raises what it captured: a
    # parent that waits on the engine can tell a kill from a crash (cluster.engine_process)
    assert head.wait_exit(timeout=5) == -signal.SIGTERM
    assert time.monotonic() - start < 1.0
    assert "Shutting down" in head.log


def test_a_head_started_before_its_workers_fails(nodes: TwinNodes) -> None:
    landscape = load_landscape("vllm-dflash2-tp4")  # at its own boot pace, as the demo runs
    scale = str(landscape.time_scale.boot)

    def rank(r: int, master: int) -> list[str]:
        flags = (
            "--nnodes",
            "2",
            "--node-rank",
            str(r),
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(master),
            "--tensor-parallel-size",
            "2",
        )
        if r:
            return serve_argv(extra=(*flags, "--headless"))
        return serve_argv(port=free_port(), extra=flags)

    # workers started after the head: refused when they come up, however soon that is. The
    # head waits 10 s here, not the demo's 1 s: a worker's interpreter may take more than a
    # second to start on a loaded machine, and the head would time out instead (the case below)
    patient = str(landscape.boot.rendezvous_timeout_s / 10.0)
    early = free_port()
    head = nodes.start(rank(0, early), name="head", TWIN_BOOT_SCALE=patient)
    head.wait_for(r"Started server process")
    late = nodes.start(rank(1, early), name="late", TWIN_BOOT_SCALE=patient)
    assert head.wait_exit() == 1
    head.wait_for(
        r"ERROR .*node rank 1 was started .*s after rank 0; headless ranks must be up "
        r"before rank 0 starts; start every headless rank before rank 0"
    )
    assert "Application startup complete" not in head.log
    assert late.wait_exit() == 1
    late.wait_for(r"rejected this rank")
    # no worker at all: the head gives up after its rendezvous window
    lonely = nodes.start(rank(0, free_port()), name="lonely", TWIN_BOOT_SCALE=scale)
    assert lonely.wait_exit() == 1
    window = f"{rendezvous_window(landscape):.2f}"
    lonely.wait_for(rf"ERROR .*timed out after {window}s waiting for node rank\(s\) 1 to join ")


def test_two_nodes_workers_first_and_the_group_dies_together(
    nodes: TwinNodes, tmp_path: Path
) -> None:
    master, port = free_port(), free_port()
    common = (
        "--nnodes",
        "2",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(master),
        "--tensor-parallel-size",
        "2",
        "--distributed-executor-backend",
        "mp",
    )
    # the worker's node comes up with stuck clocks: the whole TP group runs at its pace
    node.save(tmp_path / "worker", node.NodeState(stuck=True, stuck_rate=0.75))
    worker = nodes.start(
        serve_argv(extra=(*common, "--node-rank", "1", "--headless")), name="worker"
    )
    ready = worker.wait_for(WORKER_READY_LINE)
    assert ready.groups() == ("1", "127.0.0.1", str(master))
    head = nodes.start(serve_argv(port=port, extra=(*common, "--node-rank", "0")), name="head")
    head.wait_for(HEAD_READY_LINE)
    assert health(f"http://127.0.0.1:{port}") == 200
    assert "node_rank=1" in worker.log and "node_rank=0" in head.log
    head.wait_for(r"Node rank 1 joined .*matmul_rate=0\.750")
    head.wait_for(r"Slowest node runs at matmul_rate=0\.750")
    # a worker that dies takes the head with it, as an NCCL failure would
    worker.signal(signal.SIGKILL)
    assert head.wait_exit(timeout=10) != 0
    head.wait_for(r"ERROR .*NCCL error.*lost node rank 1")


def test_a_stopped_worker_holds_the_groups_tokens_until_it_is_continued(
    nodes: TwinNodes,
) -> None:
    """A tensor-parallel step is a collective: a worker stopped (SIGSTOP, a suspended host)
    holds every token of the group, and the head says so as vLLM does ("No available shared
    memory broadcast block found …"); continued, the group serves again. Nothing dies."""
    head, worker, url = nodes.group()
    worker.signal(signal.SIGSTOP)
    try:
        head.wait_for(
            rf"WARNING .*No available shared memory broadcast block found in {SILENT_S:g} "
            r"seconds.*\(node rank 1 has not answered\)",
            timeout=SILENT_S + 15,
        )
        with pytest.raises(BenchError):
            smoke(url, "glm53", timeout=2)
    finally:
        worker.signal(signal.SIGCONT)
    assert smoke(url, "glm53", timeout=30).strip()
    assert head.proc.poll() is None and worker.proc.poll() is None


def test_workers_exit_when_the_head_goes_away(nodes: TwinNodes) -> None:
    master, port = free_port(), free_port()
    common = (
        "--nnodes",
        "3",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(master),
        "--tensor-parallel-size",
        "3",
    )
    workers = [
        nodes.start(serve_argv(extra=(*common, "--node-rank", str(r), "--headless")), name=f"w{r}")
        for r in (2, 1)
    ]
    for w in workers:
        w.wait_for(WORKER_READY_LINE)
    head = nodes.start(serve_argv(port=port, extra=(*common, "--node-rank", "0")), name="head")
    head.wait_for(HEAD_READY_LINE)
    head.signal(signal.SIGKILL)
    for w in workers:
        assert w.wait_exit(timeout=10) == 1
        w.wait_for(r"lost the connection to master")


def test_mask_embedding_line_iff_the_file_is_there(nodes: TwinNodes, tmp_path: Path) -> None:
    bare = tmp_path / "dflash2-r64-nomask"
    shutil.copytree(models_dir() / "dflash2-r64", bare)
    (bare / "mask_embedding.pt").unlink()
    with_mask, _ = nodes.head(serve_argv())
    without, url = nodes.head(serve_argv(drafter=bare))
    with_mask.wait_for(
        r"Loaded DFlash mask embedding for mask_token_id 154856 from mask_embedding\.pt"
    )
    assert "mask embedding" not in without.log
    assert "from " + str(bare) in without.log and health(url) == 200


def test_memory_utilisation_090_fails_out_of_memory(nodes: TwinNodes) -> None:
    oom = nodes.start(serve_argv(port=free_port(), memory=0.9), name="oom")
    assert oom.wait_exit() == 1
    oom.wait_for(r"ERROR .*torch\.OutOfMemoryError: CUDA out of memory")
    assert "Application startup complete" not in oom.log


def test_k_other_than_7_never_becomes_healthy_on_sm121(nodes: TwinNodes) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    landscape = load_landscape("sm121-2node")
    scale = 1200
    wedged = nodes.start(
        serve_argv(port=port, k=5),
        name="wedged",
        TWIN_LANDSCAPE="sm121-2node",
        TWIN_BOOT_SCALE=str(scale),
    )
    healthy = nodes.start(
        serve_argv(port=free_port(), k=7),
        name="healthy",
        TWIN_LANDSCAPE="sm121-2node",
        TWIN_BOOT_SCALE=str(scale),
    )
    healthy.wait_for(HEAD_READY_LINE)
    wedged.wait_for(r"Cudagraph is disabled under eager mode")
    # three times the longest boot the landscape knows: a wedge stays up, silent and unhealthy
    longest = (
        3
        * sum(
            getattr(landscape.boot, f)
            for f in ("load_s", "compile_s", "kv_profile_s", "graph_capture_s")
        )
        / scale
    )
    with pytest.raises(subprocess.TimeoutExpired):
        wedged.proc.wait(timeout=longest)
    assert health(url) == 503
    assert "Application startup complete" not in wedged.log and "ERROR" not in wedged.log


def test_the_trap_changes_greedy_output_and_nothing_else_does(nodes: TwinNodes) -> None:
    prompt = build_prompt("prose", 0, 3).text
    _, champion = nodes.head(serve_argv())
    _, trap = nodes.head(serve_argv(eager=False))  # CUDA graphs at K=7
    _, other = nodes.head(
        serve_argv(k=5, eager=False, drafter="dflash2-stock", kv="auto", mnbt=4096)
    )
    texts = {
        name: smoke(url, "glm53", prompt, 32)
        for name, url in [("champion", champion), ("trap", trap), ("other", other)]
    }
    assert texts["champion"] == texts["other"]
    assert texts["trap"] != texts["champion"]
    trap_metrics = scrape_metrics(trap)
    drafts = trap_metrics["vllm:spec_decode_num_drafts_total"]
    assert (
        trap_metrics[
            'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="glm53",position="0"}'
        ]
        == drafts
        > 0
    )


def test_stuck_clocks_are_visible_to_the_query_until_a_power_cycle(
    nodes: TwinNodes, tmp_path: Path
) -> None:
    stuck = write_landscape(tmp_path, noise={"stuck_clock_probability": 1.0})
    env = {"TWIN_NODE_DIR": str(tmp_path / "n0")}
    healthy = json.loads(run_twin("clocks", env=env).stdout)
    assert healthy["matmul_rate"] == 1.0 and healthy["sm_clock_mhz"] > 2000
    head, _ = nodes.head(serve_argv(), TWIN_LANDSCAPE=str(stuck), TWIN_NOISE="1", **env)
    head.wait_for(r"WARNING .*SM clock .* below nominal")
    head.stop()
    for _ in range(2):  # it stays stuck across queries and engine restarts
        reading = run_twin("clocks", env=env)
        assert reading.returncode == 0
        assert json.loads(reading.stdout)["matmul_rate"] == pytest.approx(0.75)
    cycled = run_twin("power-cycle", env=env)
    assert cycled.returncode == 0 and json.loads(cycled.stdout)["was_stuck"] is True
    assert json.loads(run_twin("clocks", env=env).stdout) == healthy


def test_metrics_parser_reads_vllm_exposition() -> None:
    text = (
        "# HELP vllm:spec_decode_num_drafts Number of spec decoding drafts.\n"
        "# TYPE vllm:spec_decode_num_drafts counter\n"
        'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0\n'
        'vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} 5.0\n'
        "vllm:spec_decode_num_accepted_tokens_per_pos_total"
        '{model_name="m",position="1",engine="0"} 3\n'
        "process_start_time_seconds 1.7e9\n"
        "garbage line\n"
    )
    metrics = parse_metrics(text)
    assert metrics["vllm:spec_decode_num_drafts_total"] == 15.0
    assert metrics['vllm:spec_decode_num_drafts_total{engine="1",model_name="m"}'] == 5.0
    assert (
        metrics[
            'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"}'
        ]
        == 3
    )
    assert metrics["process_start_time_seconds"] == 1.7e9


def test_sglangs_request_gauges_are_what_a_cell_drains() -> None:
    """SGLang's gauges of running and queued requests (labelled by model) count as busy, as
    vLLM's and llama-server's do: a cell waits for them to drain before the next starts."""
    text = (
        "# TYPE sglang:num_running_reqs gauge\n"
        'sglang:num_running_reqs{model_name="llama70b"} 3.0\n'
        "# TYPE sglang:num_queue_reqs gauge\n"
        'sglang:num_queue_reqs{model_name="llama70b"} 2.0\n'
    )
    assert busy_requests(parse_metrics(text)) == 5.0
    assert busy_requests(parse_metrics("sglang:token_usage 0.2\n")) is None


def test_a_rank_with_another_command_line_fails_the_group(nodes: TwinNodes) -> None:
    master = free_port()
    common = (
        "--nnodes",
        "2",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(master),
        "--tensor-parallel-size",
        "2",
    )
    worker = nodes.start(
        serve_argv(k=5, extra=(*common, "--node-rank", "1", "--headless")), name="worker"
    )
    worker.wait_for(WORKER_READY_LINE)
    head = nodes.start(
        serve_argv(port=free_port(), extra=(*common, "--node-rank", "0")), name="head"
    )
    assert head.wait_exit() == 1
    head.wait_for(r"ERROR .*node rank 1 was started with another configuration than rank 0")
    assert worker.wait_exit() == 1
    worker.wait_for(r"rejected this rank")
