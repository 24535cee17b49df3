"""The head's HTTP surface: the part of vLLM's OpenAI server the orchestrator uses.

``/health`` (503 until the boot is done), ``/v1/models`` (answers from the start, as vLLM's
does while loading), ``/version``, ``/metrics`` (``cluster.twin.metrics``), and
``/v1/completions`` / ``/v1/chat/completions``, streamed as SSE or whole (their wire format:
``cluster.twin.completions``). This module owns the connection: HTTP/1.1 keep-alive, the
chunks handed over as the engine delivers them, and a client gone mid-stream aborting its
request. Generation is always greedy (the twin has one text per prompt) and always runs to
``max_tokens`` (finish reason ``length``).
"""

from __future__ import annotations

import json
import queue
import select
import socket
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from cluster.twin import text
from cluster.twin.completions import (
    ROLE_CHOICE,
    BadRequest,
    delta_payload,
    parse_request,
    sse,
    stream_end,
    stream_ids,
    usage_of,
    whole_payload,
)
from cluster.twin.engine import Chunk, Engine, Request
from cluster.twin.log import EngineLog
from cluster.twin.metrics import metrics_text

VLLM_VERSION = "0.11.1"


@dataclass
class ServerState:
    """What the handlers need; ``engine`` is set when the boot completes."""

    served_model_name: str
    model_path: str
    max_model_len: int
    k: int
    engine: Engine | None = None
    created: int = 0
    #: where each completion request is logged, as vLLM logs them with --enable-log-requests
    requests_log: EngineLog | None = None

    @property
    def ready(self) -> bool:
        """Whether the boot is complete (``/health`` answers 200)."""
        return self.engine is not None


class Handler(BaseHTTPRequestHandler):
    """One connection; HTTP/1.1 keep-alive, chunked SSE for streams."""

    protocol_version = "HTTP/1.1"
    server_version = "uvicorn"
    sys_version = ""

    @property
    def state(self) -> ServerState:
        server = self.server
        assert isinstance(server, TwinHTTPServer)
        return server.state

    def setup(self) -> None:
        super().setup()
        self.opened_at = time.monotonic()  # the engine's clock
        # SSE chunks are small writes; Nagle + delayed ACK would hold them for 40 ms
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: Any) -> None:
        return  # vLLM logs requests only with --enable-log-requests

    # ---- plumbing --------------------------------------------------------------------------
    def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, payload: object) -> None:
        self._send(status, json.dumps(payload).encode())

    def _error(self, status: int, message: str, kind: str) -> None:
        self._json(
            status, {"error": {"message": message, "type": kind, "param": None, "code": status}}
        )

    def _client_gone(self) -> bool:
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            if not readable:
                return False
            return bool(self.connection.recv(1, socket.MSG_PEEK) == b"")
        except OSError:
            return True

    # ---- GET -------------------------------------------------------------------------------
    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        state = self.state
        if path == "/health":
            self._send(200 if state.ready else 503, b"")
        elif path == "/v1/models":
            self._json(
                200,
                {
                    "object": "list",
                    "data": [
                        {
                            "id": state.served_model_name,
                            "object": "model",
                            "created": state.created,
                            "owned_by": "vllm",
                            "root": state.model_path,
                            "parent": None,
                            "max_model_len": state.max_model_len,
                        }
                    ],
                },
            )
        elif path == "/version":
            self._json(200, {"version": VLLM_VERSION})
        elif path == "/metrics":
            counters = state.engine.snapshot() if state.engine is not None else None
            self._send(
                200,
                metrics_text(state, counters).encode(),
                "text/plain; version=0.0.4; charset=utf-8",
            )
        else:
            self._error(404, f"Not Found: {path}", "NotFoundError")

    # ---- POST ------------------------------------------------------------------------------
    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if path not in ("/v1/completions", "/v1/chat/completions"):
            self._error(404, f"Not Found: {path}", "NotFoundError")
            return
        engine = self.state.engine
        if engine is None:
            self._error(503, "The server is still starting up.", "ServiceUnavailableError")
            return
        try:
            body = json.loads(raw or b"{}")
            if not isinstance(body, dict):
                raise BadRequest("the request body must be a JSON object")
            chat = path == "/v1/chat/completions"
            prompt, max_tokens = parse_request(self.state, body, chat)
        except json.JSONDecodeError as e:
            self._error(400, f"invalid JSON body: {e.msg}", "BadRequestError")
            return
        except BadRequest as e:
            self._error(e.status, str(e), e.kind)
            return
        if self.state.requests_log is not None:
            self.state.requests_log.info(
                "logger.py:39",
                f"Received request: prompt: {prompt[:80]!r}, params: max_tokens={max_tokens}",
            )
        req = engine.submit(prompt, max_tokens, opened_at=self.opened_at)
        opts = body.get("stream_options") or {}
        if body.get("stream"):
            self._stream(
                engine,
                req,
                chat,
                bool(opts.get("include_usage")),
                bool(opts.get("continuous_usage_stats")),
            )
        else:
            self._whole(engine, req, chat)

    def _next(self, engine: Engine, req: Request) -> list[Chunk] | None:
        """The chunks ready for ``req`` (waiting for one); ``None`` when the client went away."""
        while True:
            try:
                first = req.out.get(timeout=0.01)
                break
            except queue.Empty:  # check on the client, then keep waiting
                if self._client_gone():
                    engine.abort(req)
                    return None
        chunks = [first]
        while not chunks[-1].finished:
            try:
                chunks.append(req.out.get_nowait())
            except queue.Empty:
                break
        return chunks

    def _stream(
        self, engine: Engine, req: Request, chat: bool, usage: bool, continuous: bool
    ) -> None:
        ids = stream_ids(self.state.served_model_name, chat=chat)
        self._start_sse()
        try:
            if chat:
                self.wfile.write(sse(ids.payload([ROLE_CHOICE])))
            while True:
                chunks = self._next(engine, req)
                if chunks is None:
                    return
                last = chunks[-1]
                out = sse(delta_payload(ids, chunks, req, chat=chat, continuous=continuous))
                if self._client_gone():
                    engine.abort(req)
                    self.close_connection = True
                    return
                if last.finished:
                    out += stream_end(ids, req, last.total, usage=usage)
                self.wfile.write(out)
                if last.finished:
                    return
        except OSError:
            engine.abort(req)
            self.close_connection = True

    def _start_sse(self) -> None:
        """A 200 with chunked ``text/event-stream`` headers (the events follow)."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def _whole(self, engine: Engine, req: Request, chat: bool) -> None:
        state = self.state
        tokens: list[str] = []
        total = 0
        while True:
            chunks = self._next(engine, req)
            if chunks is None:
                self.close_connection = True
                return
            for c in chunks:
                tokens.extend(c.tokens)
                total = c.total
            if chunks[-1].finished:
                break
        payload = whole_payload(
            state.served_model_name, text.join(tokens), usage_of(req, total), chat=chat
        )
        try:
            self._json(200, payload)
        except OSError:
            self.close_connection = True


class TwinHTTPServer(ThreadingHTTPServer):
    """A threading HTTP server carrying the shared ``ServerState``."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], state: ServerState) -> None:
        self.state = state
        super().__init__(address, Handler)


def start_server(
    host: str, port: int, state: ServerState
) -> tuple[TwinHTTPServer, threading.Thread]:
    """Bind and serve in a daemon thread.

    Raises:
        OSError: the address cannot be bound (e.g. the port is taken).
    """
    server = TwinHTTPServer((host, port), state)
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="twin-http", daemon=True
    )
    thread.start()
    return server, thread
