"""Issue #8: the llama.cpp GPU profile and the bench client against a server that speaks like
llama-server (no GPU here: tests/fixtures/llama_server.py serves llama-server's routes, its
``/metrics`` names, its ``timings`` and its boot-log lines over real HTTP)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError

from cluster.bench import run_cell
from cluster.launcher import render_node
from cluster.metrics import busy_requests, parse_metrics, spec_acceptance
from knobs.records import CellSpec
from knobs.spec import KnobSpec, RenderSpec
from orchestrator.engines import LLAMA_MODEL_ENV, LLAMA_SERVER_ENV, llamacpp_placeholders
from orchestrator.errors import UsageError
from orchestrator.profile import Profile, load_profile
from orchestrator.settings import runtime_placeholders
from tests.fixtures.wait import wait_until
from tests.twin_fixtures import free_port

REPO = Path(__file__).resolve().parent.parent
FAKE = REPO / "tests" / "fixtures" / "llama_server.py"
PROFILE = "llamacpp-gpu-smollm2"
SERVER = "/opt/llama.cpp/build/bin/llama-server"
MODEL = "/models/SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture
def profile(monkeypatch: pytest.MonkeyPatch) -> Profile:
    monkeypatch.setenv(LLAMA_SERVER_ENV, SERVER)
    monkeypatch.setenv(LLAMA_MODEL_ENV, MODEL)
    return load_profile(PROFILE)


def rendered(profile: Profile, **changes: object) -> tuple[list[str], dict[str, str]]:
    config = profile.space.config({**profile.initial_champion().as_dict(), **changes})
    launcher = render_node(
        profile.launcher,
        profile.space,
        config,
        profile.cluster,
        profile.cluster.head,
        runtime_placeholders(),
    )
    return list(launcher.argv), launcher.env


# ---- the profile --------------------------------------------------------------------------------
def test_the_champion_renders_the_exact_llama_server_command_line(profile: Profile) -> None:
    argv, env = rendered(profile)
    assert argv == [
        SERVER, "-m", MODEL, "--alias", "smollm2", "--host", "127.0.0.1", "--port", "28280",
        "-ngl", "99", "-c", "8192", "--metrics", "--no-webui", "--seed", "0",
        "--spec-type", "ngram-simple", "--spec-ngram-simple-size-m", "48",
        "-b", "2048", "-ub", "512", "-np", "16", "--cache-ram", "8192",
    ]  # fmt: skip
    # CUDA graphs on: llama.cpp reads any value of the variable as "off", so it is absent
    assert env == {"CUDA_VISIBLE_DEVICES": "0"}


def test_each_neighbour_changes_exactly_its_own_flag(profile: Profile) -> None:
    base, _ = rendered(profile)
    _, env = rendered(profile, cuda_graphs=False)
    assert env["GGML_CUDA_DISABLE_GRAPHS"] == "1"
    argv, _ = rendered(profile, spec_type="none")
    assert argv[argv.index("--spec-type") + 1] == "none"
    argv, _ = rendered(profile, draft_max=16)
    assert argv[argv.index("--spec-ngram-simple-size-m") + 1] == "16"
    argv, _ = rendered(profile, parallel=8, batch=512, ubatch=64, cache_ram=0)
    assert argv[argv.index("-np") + 1] == "8"
    assert argv[argv.index("-b") + 1] == "512"
    assert argv[argv.index("-ub") + 1] == "64"
    assert argv[argv.index("--cache-ram") + 1] == "0"
    argv, _ = rendered(profile, kv_unified=True)
    assert argv == [*base[:-2], "--kv-unified", *base[-2:]]  # knob order: before --cache-ram
    # every neighbour of the champion renders (no placeholder or value left unfilled)
    for change in profile.space.neighbours(profile.initial_champion()):
        argv, _ = rendered(profile, **{change.knob: change.new})
        assert not any("{" in token for token in argv), change


def test_draft_lengths_that_silently_disable_ngram_simple_are_refused(profile: Profile) -> None:
    # K below the n-gram size (12) never drafts: the H200 round measured K=4 and 8 as "off"
    spec = profile.space.spec("draft_max")
    assert min(int(v) for v in spec.domain()) >= 12
    with pytest.raises(Exception, match="draft_max"):
        profile.space.change(profile.initial_champion(), "draft_max", 8)


def test_the_gates_match_llama_server_lines_and_greedy_check_is_off_with_reason() -> None:
    profile = load_profile(PROFILE)
    log = FAKE.read_text()
    assert "load_model: loading model '" in log and "listening on http://" in log
    assert not profile.verdict.check_greedy
    assert profile.gates.must_not_log


def test_the_binary_and_model_come_from_the_environment_or_the_engines_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(LLAMA_SERVER_ENV, raising=False)
    monkeypatch.delenv(LLAMA_MODEL_ENV, raising=False)
    values = llamacpp_placeholders(tmp_path)
    assert values == {
        "llama_server": str(tmp_path / "llama.cpp" / "bin" / "llama-server"),
        "llama_model": str(tmp_path / "llama.cpp" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"),
    }
    monkeypatch.setenv(LLAMA_SERVER_ENV, "/home/me/llama.cpp/build/bin/llama-server")
    assert runtime_placeholders()["llama_server"] == "/home/me/llama.cpp/build/bin/llama-server"
    for bad in ("llama-server", "/opt/x; rm -rf /", "/opt/$(id)/llama-server", "/opt/../etc/x"):
        monkeypatch.setenv(LLAMA_SERVER_ENV, bad)
        with pytest.raises(UsageError, match=LLAMA_SERVER_ENV):
            llamacpp_placeholders(tmp_path)


def test_a_switch_sets_its_environment_only_on_its_side() -> None:
    spec = KnobSpec(
        name="cuda_graphs",
        type="bool",
        default=True,
        render=RenderSpec(kind="switch", env_when_false={"GGML_CUDA_DISABLE_GRAPHS": "1"}),
    )
    from knobs.space import KnobSpace

    space = KnobSpace(knobs=(spec,))
    assert space.render(space.config({"cuda_graphs": True})).env == {}
    assert space.render(space.config({"cuda_graphs": False})).env == {
        "GGML_CUDA_DISABLE_GRAPHS": "1"
    }
    with pytest.raises(ValidationError, match="belong to render kind 'switch'"):
        RenderSpec(kind="flag", flag="-x", env_when_true={"A": "1"})
    with pytest.raises(ValidationError, match="not an environment variable name"):
        RenderSpec(kind="switch", env_when_true={"lower-case": "1"})
    with pytest.raises(ValidationError, match="characters a launcher cannot take"):
        RenderSpec(kind="switch", env_when_true={"A": "1; reboot"})


# ---- /metrics as llama-server writes it -----------------------------------------------------
#: The shape of llama-server b11434's /metrics (tools/server/server-task.cpp, to_metrics).
LLAMACPP_METRICS = """\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed, excluding cached tokens
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total {prompt}
# TYPE llamacpp:spec_decode_num_draft_tokens_total counter
llamacpp:spec_decode_num_draft_tokens_total {drafted}
# TYPE llamacpp:spec_decode_num_accepted_tokens_total counter
llamacpp:spec_decode_num_accepted_tokens_total {accepted}
# TYPE llamacpp:spec_decode_num_drafts_total counter
llamacpp:spec_decode_num_drafts_total {steps}
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing {busy}
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 1
# HELP llamacpp:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position
# TYPE llamacpp:spec_decode_num_accepted_tokens_per_pos_total counter
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{{position="0"}} {p0}
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{{position="1"}} {p1}
"""


def test_llamacpp_counters_give_acceptance_as_vllm_counters_do() -> None:
    before = parse_metrics(
        LLAMACPP_METRICS.format(prompt=10, drafted=100, accepted=60, steps=40, busy=3, p0=35, p1=25)
    )
    after = parse_metrics(
        LLAMACPP_METRICS.format(prompt=90, drafted=500, accepted=360, steps=140, busy=0, p0=125,
                                p1=85)
    )  # fmt: skip
    accepted, rate, positions = spec_acceptance(before, after)
    assert accepted == pytest.approx(1 + 300 / 100)
    assert rate == pytest.approx(300 / 400)
    assert positions == pytest.approx((0.90, 0.60))
    assert busy_requests(before) == 4.0  # processing + deferred
    assert busy_requests(after) == 1.0
    assert spec_acceptance(before, None) == (None, None, ())
    assert busy_requests({"other:metric": 1.0}) is None


# ---- the bench client against a server that speaks like llama-server -------------------------
def start_fake(
    tmp_path: Path, *args: str, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    with (tmp_path / f"fake-{port}.log").open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, str(FAKE), "-m", MODEL, "--alias", "smollm2", "--port", str(port),
             *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        assert proc.poll() is None, (tmp_path / f"fake-{port}.log").read_text()
        try:
            return httpx.get(url + "/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until("the fake llama-server's /health", healthy, 30, interval=0.05)
    except TimeoutError:
        proc.kill()
        raise
    return proc, url


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        proc.terminate()
        proc.wait(timeout=10)


CELL = CellSpec(name="code-c1", category="code", concurrency=1, max_tokens=64, warmup_s=0.3,
                duration_s=1.0)  # fmt: skip


def test_acceptance_comes_from_llamacpp_metrics(
    tmp_path: Path, servers: list[subprocess.Popen[bytes]]
) -> None:
    proc, url = start_fake(tmp_path, "--metrics", "--spec-type", "ngram-simple")
    servers.append(proc)
    record = run_cell(url, "smollm2", CELL)
    assert record.output_throughput > 0 and record.errors == 0
    # the fake accepts 2 of 4 drafted tokens a step: 64 tokens in 22 steps, 42 accepted
    assert record.accepted_per_step == pytest.approx(1 + 42 / 22)
    assert record.acceptance_rate == pytest.approx(42 / 88)
    assert record.per_position_acceptance == pytest.approx((1.0, 1.0, 0.0, 0.0))


def test_without_metrics_the_acceptance_rate_comes_from_the_timings(
    tmp_path: Path, servers: list[subprocess.Popen[bytes]]
) -> None:
    proc, url = start_fake(tmp_path, "--spec-type", "ngram-simple")
    servers.append(proc)
    assert httpx.get(url + "/metrics").status_code == 501
    record = run_cell(url, "smollm2", CELL)
    assert record.completed > 0
    assert record.accepted_per_step is None  # timings carry no verify steps
    assert record.acceptance_rate == pytest.approx(42 / 88)


def test_no_speculation_reports_no_acceptance(
    tmp_path: Path, servers: list[subprocess.Popen[bytes]]
) -> None:
    proc, url = start_fake(tmp_path, "--metrics")
    servers.append(proc)
    record = run_cell(url, "smollm2", CELL)
    assert record.output_throughput > 0
    assert record.accepted_per_step is None and record.acceptance_rate is None


def test_the_profile_boots_through_its_gates_on_a_server_that_logs_like_llama_server(
    tmp_path: Path,
) -> None:
    wrapper = tmp_path / "llama-server"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} {FAKE} "$@"\n')
    wrapper.chmod(0o755)
    env = {
        **os.environ,
        LLAMA_SERVER_ENV: str(wrapper),
        LLAMA_MODEL_ENV: MODEL,
        "PYTHONPATH": str(REPO),
    }

    def orchestrate(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "orchestrator", *args, "--profile", PROFILE],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    try:
        up = orchestrate("cluster", "up")
        assert up.returncode == 0, up.stdout + up.stderr
        log = (tmp_path / ".orchestrate" / "llamacpp-gpu" / "node-0" / "engine.log").read_text()
        assert "speculative type ngram-simple" in log
        assert "CUDA graphs disabled" not in log
    finally:
        down = orchestrate("cluster", "down")
    assert down.returncode == 0, down.stdout + down.stderr
