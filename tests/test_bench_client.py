"""The bench client against the twin (issues #2 and #3): measurements match the ground truth,
noise spreads as the landscape says, failures are ``BenchError``s with their evidence."""

from __future__ import annotations

import contextlib
import http.server
import json
import math
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import ClassVar

import pytest

from cluster import prompts, stall
from cluster.bench import run_cell, smoke
from cluster.errors import BenchError
from cluster.metrics import scrape_metrics
from cluster.stall import stalled
from cluster.twin import noise, text
from cluster.twin.landscape import load_landscape
from cluster.twin.physics import window_tokens
from knobs.records import CellResultRecord, CellSpec, NodeClockRecord
from tests.twin_fixtures import (
    HostWait,
    TwinNodes,
    free_port,
    running_nodes,
    serve_argv,
    write_landscape,
)

# the client is checked against the twin's ground truth within 1 %: on a machine the rest of
# the suite leaves alone (`make test` runs these after the others, one at a time). Beside the
# suite's three workers a concurrency-8 cell read 2.9 % low with no stall of 15 ms in it; on a
# CI machine that something else kept busy (or a CPU quota throttled) the windows the stall
# watch let pass read 1.3 % low. So the tolerance is 1 % plus what the host can have taken
# from the window (`HostWait`: the record's stall, and the kernel's waits for a CPU that the
# stall watch cannot see, at the window's two edges): 1 % where nothing waited, at most 2.5 %
# for a clean 2-s window on a busy machine.
pytestmark = pytest.mark.solo

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[TwinNodes]:
    """Twin engines for one test, all stopped at its end."""
    with running_nodes(tmp_path) as started:
        yield started


# per shipped landscape: a valid configuration (command line, and the same as knobs)
CONFIGS = {
    "vllm-dflash2-tp4": (
        {"eager": True, "k": 7},
        {"cuda_graphs": False, "num_speculative_tokens": 7},
    ),
    "sm121-2node": ({"eager": False, "k": 7}, {"cuda_graphs": True, "num_speculative_tokens": 7}),
    "exl3-tp4": ({"eager": False, "k": 2}, {"cuda_graphs": True, "num_speculative_tokens": 2}),
}
BASE = {
    "max_num_batched_tokens": 7168,
    "drafter_adapter_rank": 64,
    "kv_cache_dtype": "fp8_e4m3",
    "gpu_memory_utilization": 0.85,
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_noise_free_measurements_match_the_ground_truth(nodes: TwinNodes, name: str) -> None:
    landscape = load_landscape(name)
    flags, knobs = CONFIGS[name]
    engine, url = nodes.head(serve_argv(**flags), TWIN_LANDSCAPE=name)  # type: ignore[arg-type]
    for cell in landscape.cells():
        truth = landscape.truth({**BASE, **knobs}, cell)
        assert truth.valid
        with HostWait(engine.proc.pid) as host:
            got = run_cell(url, "glm53", cell)
        rel = host.tolerance(0.01, got)
        assert got.output_throughput == pytest.approx(truth.output_tok_s, rel=rel), (
            cell.name,
            stalled(got),
            host.waited_s,
        )
        assert got.accepted_per_step == pytest.approx(truth.accepted_per_step, rel=0.01), cell.name
        assert got.per_position_acceptance == pytest.approx(truth.per_position, abs=0.01)
        assert got.acceptance_rate == pytest.approx(truth.acceptance_rate, rel=0.01)
        assert got.errors == 0 and got.duration == pytest.approx(cell.duration_s, abs=0.01)
        assert got.effective_concurrency == pytest.approx(cell.concurrency, rel=0.03)
        assert got.completed > 0 and got.fingerprints
        assert all(
            key.startswith(f"{cell.category}/") and len(v) == 64
            for key, v in got.fingerprints.items()
        )
        assert 0 < got.median_ttft_ms <= got.p90_ttft_ms <= got.p99_ttft_ms


def test_requests_straddling_the_window_count_only_inside(nodes: TwinNodes) -> None:
    landscape = load_landscape("vllm-dflash2-tp4")
    engine, url = nodes.head(serve_argv())
    # each request lasts longer than the window (about 3.7 s): none completes inside it; a
    # 2-s window, not 0.5: at 1 % a 0.5-s window had 5 ms of slack, and a loaded CI machine's
    # scheduling moved more tokens than that across its edges (it read 2382 for 2152)
    cell = CellSpec(
        name="long", category="code", concurrency=2, max_tokens=4000, warmup_s=0.3, duration_s=2.0
    )
    truth = landscape.truth({**BASE, **CONFIGS["vllm-dflash2-tp4"][1]}, cell)
    with HostWait(engine.proc.pid) as host:
        got = run_cell(url, "glm53", cell)
    rel = host.tolerance(0.01, got)
    # none finished inside: the first prompt was run to completion after the window, so the
    # cell still carries a greedy fingerprint, the twin's greedy text of that prompt
    first = prompts.build_prompt("code", 0, 0)
    expected = text.fingerprint(text.greedy_text(first.text, 4000, trap=False))
    assert got.completed == 0 and got.fingerprints == {first.id: expected}
    assert got.output_throughput == pytest.approx(truth.output_tok_s, rel=rel), host.waited_s
    assert got.total_output_tokens == pytest.approx(truth.output_tok_s * 2.0, rel=rel)


#: what a cold engine does after boot (the twin's ``prefill`` fields), and what the cell says
COLD = {
    # its first token comes after the whole of a short cell's warm-up and window (vLLM's CPU
    # backend compiling its batch shapes on first use, on a loaded host)
    "cold_first_s": "no token after the warm-up",
    # its first token comes, then nothing for longer than the window, and nothing fails (its
    # decode path compiled on first use: CI's "measured nothing: no token arrived in the
    # window" on vLLM's CPU build)
    "cold_decode_s": "no token in the window",
}


@pytest.mark.parametrize("cold", list(COLD))
def test_a_cold_engine_window_opens_at_its_token(
    nodes: TwinNodes, tmp_path: Path, cold: str
) -> None:
    """A cold engine's silence is no measurement of the config: the window opens at its token
    and measures the config, where it used to measure nothing; warm, the next cell on the same
    boot waits for nothing."""
    wait = 32.0  # real seconds, 2 twin seconds at this landscape's run scale of 16
    path = write_landscape(tmp_path, prefill={cold: wait})
    landscape = load_landscape(path)
    assert getattr(landscape.engine_model(landscape.settings({})), cold) == pytest.approx(2.0)
    cell = CellSpec(
        name="cold", category="code", concurrency=2, max_tokens=128, warmup_s=0.3, duration_s=0.5
    )
    truth = landscape.truth({**BASE, **CONFIGS["vllm-dflash2-tp4"][1]}, cell)
    engine, url = nodes.head(serve_argv(), TWIN_LANDSCAPE=str(path))
    for warm in (False, True):
        progress: list[str] = []
        with HostWait(engine.proc.pid) as host:
            got = run_cell(url, "glm53", cell, on_progress=progress.append)
        waited = any(COLD[cold] in line for line in progress)
        assert waited != warm, progress
        assert got.duration == pytest.approx(cell.duration_s, abs=0.01) and got.errors == 0
        rel = host.tolerance(0.03, got)
        assert got.output_throughput == pytest.approx(truth.output_tok_s, rel=rel), host.waited_s


# a bench client in a process of its own, so that the test can stop it as a busy host would
CLIENT = """
import os
import sys
from cluster.bench import run_cell
from tests.twin_fixtures import run_delay_s
from knobs.records import CellSpec
cell = CellSpec.model_validate_json(sys.argv[2])
record = run_cell(sys.argv[1], "glm53", cell, on_progress=lambda m: print(m, flush=True))
print(f"WAITED {run_delay_s(os.getpid())}", flush=True)
print("RESULT " + record.model_dump_json(), flush=True)
"""


@pytest.mark.parametrize("stopped", ["client", "engine"])
def test_a_cell_whose_host_stalled_is_measured_again(nodes: TwinNodes, stopped: str) -> None:
    """A client, or an engine, kept off the CPU for half the window (stopped, as a busy host or
    a VM's stolen time would keep it) moves tokens across the window's edges; that is its
    host's doing, not the config's: the cell is measured again, and the record says how long
    the kept one stalled and how many measurements were dropped. The client sees its own stall;
    the twin's scheduler counts its own late wake-ups in /metrics."""
    name = "vllm-dflash2-tp4"
    flags, knobs = CONFIGS[name]
    cell = CellSpec(
        name="stalled", category="code", concurrency=2, max_tokens=128, warmup_s=0.3, duration_s=2.0
    )
    truth = load_landscape(name).truth({**BASE, **knobs}, cell)
    engine, url = nodes.head(serve_argv(**flags), TWIN_LANDSCAPE=name)  # type: ignore[arg-type]
    lines: list[str] = []
    stops = 0
    with (
        HostWait(engine.proc.pid) as host,
        subprocess.Popen(
            [sys.executable, "-c", CLIENT, url, cell.model_dump_json()],
            cwd=REPO,
            stdout=subprocess.PIPE,
            text=True,
        ) as child,
    ):
        assert child.stdout is not None
        victim = child.pid if stopped == "client" else engine.proc.pid
        for line in child.stdout:
            lines.append(line.rstrip("\n"))
            if not stops and "measuring" in line:
                # the window is open: one host is stopped for a second of its two
                os.kill(victim, signal.SIGSTOP)
                time.sleep(1.0)  # how long the fault lasts, not a wait for something to happen
                os.kill(victim, signal.SIGCONT)
                stops += 1
        assert child.wait(timeout=60) == 0 and stops == 1, lines
    result = CellResultRecord.model_validate_json(lines[-1].removeprefix("RESULT "))
    said = [line for line in lines if "a busy host" in line]
    # the stopped measurement was dropped, and the line says whose host stalled it and how long
    assert said and "measuring again (2/3)" in said[0], lines
    assert float(said[0].split(f"{stopped} ")[1].split("s")[0]) >= 0.9, said
    # on an idle machine the next one is clean; a busy host (a CI machine's was) may disturb it
    # too, and it is dropped in turn, at most ATTEMPTS in all: the least stalled one is kept
    assert result.measured_again == min(len(said), stall.ATTEMPTS - 1), lines
    kept = stalled(result)
    # the kept one is not the stopped one, and the least stalled of all (the lines say each
    # measurement's stall to 0.01 s; a busy host may stall every one, a clean-clone run here once
    # kept 0.59 s after the stopped 1.09 s, just past the 0.5 s margin this test used to ask)
    stalls = [float(line.split("stalled ")[1].split("s")[0]) for line in said]
    assert kept < stalls[0], (kept, said)
    assert len(said) < stall.ATTEMPTS or kept <= min(stalls) + 0.005, (kept, said)
    if len(said) == 1:
        assert not stall.disturbed(kept, result.duration), result
    # the child's own waits, and the engine's (both over every measurement the client took)
    host.waited_s += float(next(x for x in lines if x.startswith("WAITED ")).split()[1])
    rel = host.tolerance(0.01, result)
    assert result.output_throughput == pytest.approx(truth.output_tok_s, rel=rel), (kept, host)


def test_noise_spreads_as_the_landscape_says(nodes: TwinNodes, tmp_path: Path) -> None:
    """Run to run within a boot, boot to boot across boots: each measurement equals the truth
    times the draws for its (seed, boot, run), and the draws spread as the landscape says."""
    path = write_landscape(tmp_path, noise={"stuck_clock_probability": 0.0})
    landscape = load_landscape(path)
    knobs = {**BASE, **CONFIGS["vllm-dflash2-tp4"][1]}
    # two streams, not eight: what is checked is the noise model's draws, and a client with
    # fewer streams to read is not the one starved on a loaded machine (eight read 2 % low there)
    cell = CellSpec(
        name="s", category="prose", concurrency=2, max_tokens=128, warmup_s=0.1, duration_s=2.0
    )
    truth = landscape.truth(knobs, cell)
    seed = 11
    n = landscape.noise
    env = {
        "TWIN_LANDSCAPE": str(path),
        "TWIN_NOISE": "1",
        "TWIN_SEED": str(seed),
        "TWIN_NODE_DIR": str(tmp_path / "node"),
    }

    model = landscape.engine_model(landscape.settings(knobs))
    tokens = prompts.prompt_tokens(0)

    def expected(boot: int, run: int) -> float:
        """The engine's noise-free window count at this boot's and run's drawn speed."""
        speed, acceptance = noise.run_factors(seed, boot, run, n.run_to_run, n.acceptance)
        speed *= noise.boot_factor(seed, boot, n.boot_to_boot)
        accepted = 1 + sum(min(1.0, p * acceptance) for p in truth.per_position)
        prefill = model.prefill_s(tokens) / speed
        step = model.step_s(cell.concurrency, cell.concurrency * tokens) / speed
        return (
            window_tokens(prefill, step, accepted, cell)[0] / cell.duration_s / truth.output_tok_s
        )

    ratios: list[float] = []
    head, url = nodes.head(serve_argv(), **env)
    run = 0
    for _ in range(6):
        with HostWait(head.proc.pid) as host:
            measured = run_cell(url, "glm53", cell)
        # a measurement the client's host stalled was taken again: each was one of the twin's runs
        run += 1 + measured.measured_again
        got = measured.output_throughput / truth.output_tok_s
        rel = host.tolerance(0.015, measured)
        assert got == pytest.approx(expected(1, run), rel=rel), (run, host.waited_s)
        ratios.append(got / noise.boot_factor(seed, 1, n.boot_to_boot))
    head.stop()
    across: list[float] = []
    for boot in range(2, 6):
        head, url = nodes.head(serve_argv(), **env)
        with HostWait(head.proc.pid) as host:
            measured = run_cell(url, "glm53", cell)
        got = measured.output_throughput / truth.output_tok_s
        run = 1 + measured.measured_again
        rel = host.tolerance(0.015, measured)
        assert got == pytest.approx(expected(boot, run), rel=rel), (boot, host.waited_s)
        across.append(got)
        head.stop()
    # the spreads themselves, against chi-square bounds (99 %) for these few draws
    within = statistics.stdev(math.log(r) for r in ratios)
    assert 0.35 * n.run_to_run <= within <= 1.75 * n.run_to_run
    total = math.hypot(n.run_to_run, n.boot_to_boot)
    assert 0.25 * total <= statistics.stdev(math.log(r) for r in across) <= 2.0 * total


def test_clocks_are_read_before_and_after_and_the_worse_kept(nodes: TwinNodes) -> None:
    _, url = nodes.head(serve_argv())
    readings = iter(
        [
            [
                NodeClockRecord(rank=0, sm_clock_mhz=2418, matmul_rate=1.0),
                NodeClockRecord(rank=1, sm_clock_mhz=1813, matmul_rate=0.75),
            ],
            [
                NodeClockRecord(rank=0, sm_clock_mhz=1900, matmul_rate=0.8),
                NodeClockRecord(rank=1, sm_clock_mhz=2418, matmul_rate=1.0),
            ],
        ]
    )
    progress: list[str] = []
    cell = CellSpec(
        name="tiny", category="prose", concurrency=2, max_tokens=16, warmup_s=0.1, duration_s=0.3
    )
    got = run_cell(url, "glm53", cell, clocks=lambda: next(readings), on_progress=progress.append)
    assert [(c.rank, c.matmul_rate) for c in got.clocks] == [(0, 0.8), (1, 0.75)]
    # the last line is the rate, or on a busy host what the stall watch made of the window
    assert progress[0].startswith("tiny:") and any("tok/s" in line for line in progress)


def test_failures_are_bench_errors_with_evidence(nodes: TwinNodes) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    cell = CellSpec(
        name="dead", category="code", concurrency=1, max_tokens=8, warmup_s=0.05, duration_s=0.1
    )
    with pytest.raises(BenchError) as err:
        run_cell(dead, "glm53", cell)
    assert err.value.url.startswith(dead) and "ConnectError" in err.value.evidence
    assert err.value.exit_code == 6
    with pytest.raises(BenchError, match="smoke generation"):
        smoke(dead, "glm53")
    with pytest.raises(BenchError, match="cannot scrape"):
        scrape_metrics(dead)
    _, url = nodes.head(serve_argv())
    with pytest.raises(BenchError) as wrong:
        smoke(url, "not-the-model")
    assert wrong.value.status == 404 and "does not exist" in wrong.value.evidence
    with pytest.raises(BenchError) as every:
        run_cell(url, "not-the-model", cell)
    assert "HTTP 404" in str(every.value)


def _stream_headers(handler: http.server.BaseHTTPRequestHandler) -> bytes:
    """The status line and headers of a 200 streamed completion sent on ``handler``; its
    body (``_completion_stream``), for the handler to write whole or cut."""
    body = _completion_stream()
    handler.send_response(200)
    handler.send_header("Content-Type", "text/event-stream")
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    return body


def _completion_stream() -> bytes:
    """A streamed completion of three tokens, as an OpenAI-style server sends it."""
    events = [
        {"choices": [{"text": "x", "finish_reason": None}], "usage": {"completion_tokens": i}}
        for i in (1, 2, 3)
    ]
    last = {"text": "", "finish_reason": "length"}
    events.append({"choices": [last], "usage": {"completion_tokens": 3}})
    body = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
    return body + b"data: [DONE]\n\n"


def _cell_served_by(
    handler: type[http.server.BaseHTTPRequestHandler],
    cell: CellSpec,
    on_progress: Callable[[str], None] | None = None,
) -> CellResultRecord:
    """``cell`` measured against a local HTTP server whose requests ``handler`` answers."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        return run_cell(url, "glm53", cell, on_progress=on_progress)
    finally:
        server.shutdown()
        server.server_close()


class _ClosingEngine(http.server.BaseHTTPRequestHandler):
    """An OpenAI-style completions server that closes a kept-alive connection instead of
    answering its second completion, the first time it sees that request (what a server's
    keep-alive limit does to a client that sends on the connection as it closes)."""

    protocol_version = "HTTP/1.1"
    lock = threading.Lock()
    dropped: ClassVar[set[bytes]] = set()
    served = 0

    def setup(self) -> None:
        super().setup()
        self.posts = 0

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        body = b'{"data": [{"id": "glm53"}]}' if self.path == "/v1/models" else b""
        self.send_response(200 if body else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers["Content-Length"]))
        self.posts += 1
        with self.lock:
            drop = self.posts > 1 and raw not in self.dropped
            if drop:
                self.dropped.add(raw)
            else:
                type(self).served += 1
        if drop:
            self.close_connection = True  # no status line, no headers: the socket closes
            return
        self.wfile.write(_stream_headers(self))


def test_a_request_the_server_closed_on_unanswered_is_sent_again_not_failed() -> None:
    """A kept-alive connection closed under a request that got no answer at all: the request
    never reached the engine, and is sent once more; the cell records no failure (before, such
    a request failed the cell, and the errors guardrail discarded a +58 % config on a GPU)."""
    cell = CellSpec(
        name="keepalive", category="code", concurrency=2, max_tokens=3, warmup_s=0.1, duration_s=0.5
    )
    got = _cell_served_by(_ClosingEngine, cell)
    assert _ClosingEngine.dropped, "the server closed no connection: the test tested nothing"
    assert got.errors == 0 and got.error_samples == (), got.error_samples
    assert got.completed > 0 and got.total_output_tokens > 0


class _CuttingEngine(http.server.BaseHTTPRequestHandler):
    """An OpenAI-style completions server that answers the completions ``fails`` names (by
    their number, from 1, over the server's life) with a failure: ``"cut"`` starts the stream
    and cuts its connection mid-body (a network's blip, an engine's process gone), ``"500"``
    answers an HTTP error (the engine's own word)."""

    protocol_version = "HTTP/1.1"
    lock = threading.Lock()
    fails: ClassVar[Callable[[int], str | None]] = staticmethod(lambda n: None)
    posts = 0

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        with self.lock:
            type(self).posts += 1
            fail = type(self).fails(type(self).posts)
        if fail == "500":
            body = b'{"error": "internal"}'
            self.send_response(500)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        body = _stream_headers(self)
        if fail == "cut":
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        self.wfile.write(body)


def _cell_against(fails: Callable[[int], str | None]) -> tuple[CellResultRecord, list[str]]:
    _CuttingEngine.fails = staticmethod(fails)
    _CuttingEngine.posts = 0
    said: list[str] = []
    cell = CellSpec(
        name="cut", category="code", concurrency=2, max_tokens=3, warmup_s=0.1, duration_s=0.5
    )
    return _cell_served_by(_CuttingEngine, cell, said.append), said


@pytest.mark.parametrize(
    ("fails", "errors", "measured_again"),
    [
        # a blip: two streams cut early in the first window, none after
        (lambda n: "cut" if n in (3, 4) else None, 0, 1),
        # a connection that fails all night long: measured once more, its failures stand
        (lambda n: "cut" if n % 5 == 0 else None, "RemoteProtocolError", 1),
        # the engine's own error is the config's evidence: not measured again. It recurs, so
        # that a window a loaded host stalled (measured again, the least stalled kept) holds
        # it too: a 500 in the first window alone is lost with that window, which is right
        (lambda n: "500" if n % 6 == 3 else None, "HTTP 500", 0),
    ],
    ids=["blip", "every-fifth", "engine-error"],
)
def test_a_window_whose_failures_all_lost_their_connection_is_measured_once_more(
    fails: Callable[[int], str | None], errors: int | str, measured_again: int
) -> None:
    """A network's blip between the controller and the head cuts a few streams: before, their
    failures stood and the errors guardrail discarded the change on its first boot. Now a
    window whose every failure was the connection's is measured once more, and the window
    with fewer failures kept; failures that recur, or that the engine answered, stand."""
    got, said = _cell_against(fails)
    # a window a loaded host stalled is measured again too (said as a stall): those are not
    # this test's, and a CI machine's load must not read as a connection's measurement
    stalls = sum(": stalled " in line and ", measuring again" in line for line in said)
    assert got.measured_again - stalls == measured_again, said
    assert got.completed > 0
    if isinstance(errors, str):  # failures that stand: each of them the one kind
        assert got.errors > 0, said
        assert got.error_samples and all(errors in s for s in got.error_samples), got
    else:
        assert got.errors == errors, got.error_samples
    assert any("lost their connection" in line for line in said) == (measured_again == 1)


class _SteppingEngine(http.server.BaseHTTPRequestHandler):
    """An OpenAI-style completions server that streams a speculative engine's steps: each
    chunk carries ``PER_CHUNK`` tokens, paced ``STEP_S`` apart, ``CHUNKS`` of them. With
    ``running`` every chunk has the running usage (vLLM's ``continuous_usage_stats``); without
    it only the last, usage-only event has the total (an engine that does not honour it)."""

    CHUNKS, PER_CHUNK, STEP_S = 10, 4, 0.01
    running: ClassVar[bool] = True

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        self.close_connection = True  # the body ends with the connection
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the window closed
            self._steps()

    def _steps(self) -> None:
        total = 0
        for i in range(self.CHUNKS):
            total += self.PER_CHUNK
            reason = "length" if i == self.CHUNKS - 1 else None
            event: dict[str, object] = {
                "choices": [{"text": " ab" * self.PER_CHUNK, "finish_reason": reason}]
            }
            if type(self).running:
                event["usage"] = {"completion_tokens": total}
            self.wfile.write(b"data: " + json.dumps(event).encode() + b"\n\n")
            self.wfile.flush()
            time.sleep(self.STEP_S)  # the engine's pace, not a synchronisation
        final = {"choices": [], "usage": {"completion_tokens": total}}
        self.wfile.write(b"data: " + json.dumps(final).encode() + b"\n\ndata: [DONE]\n\n")


def _stepping_cell(running: bool) -> CellResultRecord:
    _SteppingEngine.running = running
    cell = CellSpec(
        name="steps", category="code", concurrency=2, max_tokens=40, warmup_s=0.1, duration_s=1.0
    )
    return _cell_served_by(_SteppingEngine, cell)


def test_an_engine_without_running_usage_is_counted_by_its_final_usage() -> None:
    """A speculative engine's chunk holds several tokens. Where the stream carries no running
    usage, counting one token a chunk measured a quarter of the throughput here (and every
    verdict would have held speculation against itself); the final usage's total, spread over
    the request's chunks, measures what the running usage does."""
    with_running = _stepping_cell(running=True)
    final_only = _stepping_cell(running=False)
    assert with_running.completed > 0 and final_only.completed > 0
    # one token a chunk would be a quarter
    ratio = final_only.output_throughput / with_running.output_throughput
    assert 0.75 < ratio < 1.33, (final_only, with_running)
