"""An engine stopped in a window's last second (a ``kill -STOP``, a debugger's breakpoint) is
looked at as one stopped in its middle: the window ends at the engine's next token, with the
cell's stop look going on and its counters read after it (``cluster.silence.past_the_end``).
Before, the window's end cut the silence before it was a second long: the look and the streams
ended with the window, the engine's stall counter was read before the engine counted its held
deliveries, and the window was kept short (816 against about 1150 tok/s) with no stall.

A real HTTP engine stub that stops (holds every stream) at a point of the window's last
second, as read from the window's opening scrape: 0.8 s before its end, inside its last second
and short of half of it however late (under 0.8 s) the stub reads that scrape. Its stop ends at
the fault's length, or once the cell's probe has found it stopped (a person's ``kill -CONT``)."""

from __future__ import annotations

import contextlib
import http.server
import json
import threading
import time
from collections.abc import Iterator

import pytest

from cluster.bench import run_cell
from cluster.errors import NodeError
from cluster.stall import ENGINE_STALL_METRIC
from knobs.records import CellResultRecord, CellSpec

#: the cell: a window long enough that a stop 0.8 s before its end is under half of it
CELL = CellSpec(
    name="code-end", category="code", concurrency=2, max_tokens=40, warmup_s=0.3, duration_s=3.0
)
#: how long before the window's end (as the stub reads it) the stub stops
BEFORE_END_S = 0.8


class _Stub:
    """The engine's state: when it stops (set at the window's opening scrape), whether it is
    stopped, and the seconds it held its deliveries (counted once it goes on, as the twin's
    scheduler counts its late wake-ups)."""

    def __init__(self, hold_s: float) -> None:
        self.hold_s = hold_s  # the stop's length, unless the probe's look ends it first
        self.lock = threading.Lock()
        self.posts = 0
        self.stop_at: float | None = None
        self.held_since: float | None = None
        self.went_on = threading.Event()
        self.stall_s = 0.0

    def gate(self) -> None:
        """Before each chunk: held while the engine is stopped."""
        with self.lock:
            due = self.stop_at is not None and time.monotonic() >= self.stop_at
            if due and self.held_since is None and not self.went_on.is_set():
                self.held_since = time.monotonic()
            holding = self.held_since is not None and not self.went_on.is_set()
        if holding:
            self.went_on.wait(self.hold_s)
            self.go_on()

    def go_on(self) -> None:
        with self.lock:
            if self.held_since is not None and not self.went_on.is_set():
                self.stall_s += time.monotonic() - self.held_since
                self.went_on.set()

    def stopped_now(self) -> bool:
        with self.lock:
            return self.held_since is not None and not self.went_on.is_set()


def _handler(stub: _Stub) -> type[http.server.BaseHTTPRequestHandler]:
    class Engine(http.server.BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            if self.path == "/metrics":
                with stub.lock:
                    if stub.posts and stub.stop_at is None:  # the window's opening scrape
                        stub.stop_at = time.monotonic() + CELL.duration_s - BEFORE_END_S
                    stall = stub.stall_s
                body = f"{ENGINE_STALL_METRIC} {stall}\n".encode()
            else:
                body = b'{"data": [{"id": "glm53"}]}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:
            raw = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with stub.lock:
                stub.posts += 1
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            self.close_connection = True  # the body ends with the connection
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # window closed
                for i in range(1, raw["max_tokens"] + 1):
                    stub.gate()
                    reason = "length" if i == raw["max_tokens"] else None
                    event = {
                        "choices": [{"text": " ab", "finish_reason": reason}],
                        "usage": {"completion_tokens": i},
                    }
                    self.wfile.write(b"data: " + json.dumps(event).encode() + b"\n\n")
                    self.wfile.flush()
                    time.sleep(0.01)  # the engine's pace, not a synchronisation
                self.wfile.write(b"data: [DONE]\n\n")

    return Engine


@pytest.fixture
def served() -> Iterator[tuple[_Stub, str]]:
    stub = _Stub(hold_s=0.0)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(stub))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield stub, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        stub.go_on()
        server.shutdown()
        server.server_close()


def _measured(url: str, probe: object = None) -> tuple[CellResultRecord, list[str]]:
    said: list[str] = []
    record = run_cell(url, "glm53", CELL, on_progress=said.append, probe=probe)  # type: ignore[arg-type]
    return record, said


def test_an_engine_stopped_in_the_windows_last_second_is_found_and_measured_again(
    served: tuple[_Stub, str],
) -> None:
    """The engine stops 0.8 s before the window's end, for up to 20 s: the window's end waits
    for its next token, the look finds it stopped a second into its silence, and the
    measurement is dropped as the node's. Before, the look ended with the window: the probe
    was never asked, and the short window was kept as measured."""
    stub, url = served
    stub.hold_s = 20.0
    looks: list[str] = []

    def probe(why: str) -> NodeError | None:
        if not stub.stopped_now():
            return None
        looks.append(why)
        stub.go_on()  # found: a person's kill -CONT
        return NodeError(
            f"bench cell {CELL.name} failed: {why}; node-1's engine was found stopped on "
            "127.0.0.1: pid 4242 (stub) stopped by a signal",
            failure_class="engine_stopped",
            rank=1,
            host="127.0.0.1",
        )

    record, said = _measured(url, probe)
    # the look was made while the engine was stopped, and said as the node's
    assert looks, f"the stopped engine was never looked at: {said}"
    found = [line for line in said if "engine was found stopped" in line]
    assert found and "measuring again (2/3)" in found[0], said
    # the record says which of its dropped measurements were the node's
    assert record.measured_again >= 1 and record.engine_found_stopped == 1, record


def test_a_stop_across_the_windows_end_shorter_than_the_look_is_counted_as_a_stall(
    served: tuple[_Stub, str],
) -> None:
    """With nothing to look at (``orchestrate bench``), the engine stops 0.8 s before the
    window's end for 2 s: its counter, read after its next token, holds the held deliveries,
    and the window is measured again as stalled. Before, it was read at the window's end,
    before the engine counted them: the short window was kept with no stall."""
    stub, url = served
    stub.hold_s = 2.0
    record, said = _measured(url)
    stalled = [line for line in said if ": stalled " in line and "engine " in line]
    assert stalled, f"the stop across the window's end was counted as no stall: {said}"
    assert any("before the window's end; waiting up to" in line for line in said), said
    engine_s = float(stalled[0].split("engine ")[1].split("s")[0])
    assert engine_s >= 1.5, stalled
    assert record.measured_again >= 1 and record.engine_stall_s < engine_s, record
    assert record.engine_found_stopped == 0, record  # nothing looked: no stop found
