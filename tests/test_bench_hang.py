"""An engine that stops answering while a cell measures it (a GPU hang, its process stopped):
the cell fails by its own deadline, in one line that says so, and measures no fraction of the
config's throughput. Before, the cell waited out the streams' ten-minute read timeouts at its
greedy probe and at each scrape, with no line on screen, or kept the tokens of the window's
first second as the config's measurement."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cluster import silence
from cluster.bench import cold_start_limit_s
from cluster.window import CellState, Request
from knobs.records import CellSpec
from tests.twin_fixtures import TwinNodes, running_nodes, serve_argv

REPO = Path(__file__).resolve().parent.parent

# a bench client in a process of its own: the test reads its lines as they come, and a client
# that waits past the cell's deadline is one the test can end
CLIENT = """
import sys
from cluster.bench import run_cell
from cluster.errors import BenchError
from knobs.records import CellSpec
cell = CellSpec.model_validate_json(sys.argv[2])
try:
    record = run_cell(
        sys.argv[1],
        "glm53",
        cell,
        on_progress=lambda m: print(m, flush=True),
        hang_after_s=float(sys.argv[3]),
    )
except BenchError as e:
    print(f"FAILED {e}", flush=True)
    sys.exit(3)
print(f"MEASURED {record.output_throughput:.1f} tok/s", flush=True)
"""


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[TwinNodes]:
    with running_nodes(tmp_path) as started:
        yield started


def test_an_engine_that_stops_answering_mid_window_fails_its_cell_by_the_cells_deadline(
    nodes: TwinNodes,
) -> None:
    """The head engine is stopped (SIGSTOP, as a hung GPU or a stopped host leaves it: its
    connections open, nothing answered) a second into the window. The cell
    waits for the next token as long as it waits for a cold engine's (the profile's
    ``bench.hang_after_s``, 5 s here, or five times the cell, 21.5 s, not the default
    minute), then fails with the engine's silence as its evidence, naming the setting; the
    window's first tokens are not a measurement."""
    cell = CellSpec(
        name="hang", category="code", concurrency=2, max_tokens=128, warmup_s=0.3, duration_s=4.0
    )
    engine, url = nodes.head(serve_argv(), TWIN_LANDSCAPE="vllm-dflash2-tp4")
    limit = cold_start_limit_s(cell, 5.0)
    lines: list[str] = []
    stopped = False

    def stop_the_engine(line: str, _child: subprocess.Popen[str]) -> None:
        nonlocal stopped
        if line.startswith("hang: measuring") and not stopped:
            time.sleep(1.0)  # when the fault starts, not a wait for an event
            engine.signal(signal.SIGSTOP)
            stopped = True

    try:
        # the cell's own deadline, and a margin for its scrapes' bounded waits: a client
        # still waiting then is ended, and the test fails
        code = _client(url, cell, limit + 45, lines, stop_the_engine, deadline_s=5.0)
    finally:
        engine.signal(signal.SIGCONT)
    assert code != -signal.SIGKILL, f"the client still waited {limit + 45:.0f}s on: {lines}"
    assert code == 3, lines
    failed = lines[-1]
    assert failed.startswith("FAILED cell hang at "), lines
    # the window had tokens: the line says when they stopped, and that none came after
    assert "stopped sending tokens" in failed, failed
    at = float(failed.split("stopped sending tokens ")[1].split("s into")[0])
    assert 0.5 <= at <= 2.5, failed
    # and what the stall watches saw (the client's own, the engine's counter, which a stopped
    # engine cannot answer), so that a hung engine can be told from a starved host
    seen = "(hung, or its host stopped; bench.hang_after_s sets the wait); the stall watch saw"
    assert f"{seen} the client stalled " in failed, failed
    client = float(failed.split("the client stalled ")[1].split("s of the cell's")[0])
    assert client < 5.0, failed  # its host did not hold the client for the silence
    assert "; the engine's counters did not answer after it" in failed, failed
    after = float(failed.split("sent none in the ")[1].split("s after")[0])
    assert after <= limit + 5, failed  # the deadline given, not the minute
    assert "bench.hang_after_s sets the wait" in failed, failed
    assert any("no token for the window's last" in x for x in lines), lines
    assert not any(x.startswith("MEASURED") for x in lines), lines
    assert not any("greedy probe" in x for x in lines), lines
    assert os.path.exists(f"/proc/{engine.proc.pid}"), "the engine died: the test tested nothing"


def test_a_cell_whose_client_stalled_across_the_windows_end_is_measured_not_hung(
    nodes: TwinNodes,
) -> None:
    """The bench client is stopped (as a busy host keeps it off the CPU) early in the window
    and goes on a second after the window's end. Meanwhile the engine finished the requests
    it had: the client reads their last tokens after the window's end, and a stream stops
    between requests once the window has ended. Before, the cell then waited for a next token
    that no stream would ever ask for, and after a minute filed a healthy engine as hung
    (review 51-7: a twin on a loaded host, every process alive, its boot the config's
    `bench_failed`). Now the tokens read after the silence end the wait, and the streams go
    on while a cell waits: the cell is measured, the client's stall measured again."""
    cell = CellSpec(
        name="late", category="code", concurrency=2, max_tokens=24, warmup_s=0.3, duration_s=2.0
    )
    _, url = nodes.head(serve_argv(), TWIN_LANDSCAPE="vllm-dflash2-tp4")
    lines: list[str] = []
    stopped = False

    def stop_the_client(line: str, child: subprocess.Popen[str]) -> None:
        nonlocal stopped
        if line.startswith("late: measuring") and not stopped:
            stopped = True
            # the fault's place and length, not a wait for an event: the client stopped
            # in the window's first half, resumed a second after its end
            time.sleep(0.4)
            child.send_signal(signal.SIGSTOP)
            time.sleep(cell.duration_s + 0.6)
            child.send_signal(signal.SIGCONT)

    # far less than the cell's minute-long deadline: a client still waiting is ended
    code = _client(url, cell, 30, lines, stop_the_client)
    assert stopped, lines
    assert code != -signal.SIGKILL, f"the client still waited 30s on: {lines}"
    assert code == 0, lines
    assert lines[-1].startswith("MEASURED"), lines
    assert not any("stopped sending tokens" in x for x in lines), lines


def _client(
    url: str,
    cell: CellSpec,
    kill_after_s: float,
    lines: list[str],
    on_line: Callable[[str, subprocess.Popen[str]], None],
    deadline_s: float = 60.0,
) -> int:
    """The bench client measuring ``cell`` against ``url`` in a process of its own: each line
    it prints appended to ``lines`` and given to ``on_line`` (where a test puts its fault),
    the process killed if it still runs after ``kill_after_s``; its exit status.
    ``deadline_s``: the client's token deadline (``bench.hang_after_s``)."""
    with subprocess.Popen(
        [sys.executable, "-c", CLIENT, url, cell.model_dump_json(), str(deadline_s)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    ) as child:
        assert child.stdout is not None
        timer = threading.Timer(kill_after_s, child.kill)
        timer.start()
        try:
            for line in child.stdout:
                lines.append(line.rstrip("\n"))
                on_line(line, child)
            return child.wait()
        finally:
            timer.cancel()
            child.send_signal(signal.SIGCONT)


def test_tokens_read_after_a_silent_windows_end_but_before_its_wait_end_the_wait() -> None:
    """A window whose tokens stopped in its first half, and whose streams read more tokens
    after its end (a client stalled across it reads them late), has an engine that is not
    silent: the wait ends at once and nothing is hung. Before, only tokens after the wait began
    counted, and a cell whose streams had all ended waited its whole deadline for one."""

    async def after() -> CellState:
        loop = asyncio.get_running_loop()
        now = loop.time()
        cell = CellSpec(name="c", category="code", concurrency=1, warmup_s=0.3, duration_s=2.0)
        state = CellState(cell=cell, url="u", model="m", t0=now - 3.0, w0=now - 2.5, w1=now - 0.5)
        # a token 0.3s into the window, the rest of its request read 0.2s after the window
        state.requests.append(Request(prompt_id="p", start=now - 2.6, chunks=[(now - 2.2, 1)]))
        state.requests[0].chunks.append((now - 0.3, 23))
        last = silence.fell_silent(state)
        assert last == now - 2.2
        await silence.after_silence(state, last, now + 2.0, lambda _m: None)
        return state

    state = asyncio.run(after())
    assert state.hung is None
